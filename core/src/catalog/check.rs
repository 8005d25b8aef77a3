//! The checks of a service type: the basic fields, parameters, provisioning,
//! Helm, each service, domains and update strategy.

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawHelm, RawParameter, RawService, RawType};
use super::{
    check_parameter_value, quote, sample_parameters, CatalogEntry, CatalogError, Checker,
    Parameter, ARGS_MAX, ARG_LEN_MAX, ATTEMPTS_MAX, BAKE_MS_DEFAULT, DURATION_MS_MAX,
    IMAGE_LEN_MAX, PARAMETERS_MAX, PARAMETER_NAME_LEN_MAX, PORTS_MAX, SERVICES_MAX,
    STOP_GRACE_MS_DEFAULT, VERSION_LEN_MAX,
};
use crate::domains::{DomainTemplate, DOMAINS_PER_SERVICE_MAX};
use crate::fleet::RolloutState;
use crate::grants::{chart_reference_rule, literal_head, Grant};
use crate::names;
use crate::release::{HelmChart, Provisioning, ReleaseParams, HELM_NAMESPACE_DEFAULT};
use crate::spec::{ReadinessProbe, RunSpec, ServiceSpec, UpdateStrategy};
use crate::toml_error;
use crate::types::ServiceName;

impl Checker<'_> {
    pub(super) fn invalid(
        &self,
        field: impl Into<String>,
        value: impl std::fmt::Debug,
        reason: impl Into<String>,
    ) -> CatalogError {
        let field = field.into();
        CatalogError::Invalid {
            file: self.file.to_owned(),
            line: toml_error::line_of(self.contents, &field),
            field,
            value: quote(value),
            reason: reason.into(),
        }
    }

    /// `value` of `field` needs `grant`, which the operator did not give.
    pub(super) fn not_granted(&self, field: String, value: &str, grant: Grant) -> CatalogError {
        CatalogError::NotGranted {
            file: self.file.to_owned(),
            line: toml_error::line_of(self.contents, &field),
            field,
            value: quote(value),
            grant,
            granted: self.grants.granted(grant),
        }
    }

    pub(super) fn name(&self, field: &str, value: &str) -> Result<(), CatalogError> {
        names::check_dns_label(field, value)
            .map_err(|e| self.invalid(field, value, e.rule.to_string()))
    }

    pub(super) fn text(
        &self,
        field: &str,
        value: &str,
        len_max: usize,
    ) -> Result<(), CatalogError> {
        if value.is_empty() || value.len() > len_max || value.chars().any(char::is_whitespace) {
            return Err(self.invalid(
                field,
                value,
                format!("must be 1 to {len_max} bytes without whitespace"),
            ));
        }
        Ok(())
    }

    pub(super) fn argv(
        &self,
        field: &str,
        args: &[String],
        required: bool,
    ) -> Result<(), CatalogError> {
        if required && args.is_empty() {
            return Err(self.invalid(field, args, "must name a program to run"));
        }
        if args.len() > ARGS_MAX {
            return Err(self.invalid(field, args.len(), format!("at most {ARGS_MAX} arguments")));
        }
        for (i, arg) in args.iter().enumerate() {
            if arg.len() > ARG_LEN_MAX {
                return Err(self.invalid(
                    format!("{field}[{i}]"),
                    arg,
                    format!("at most {ARG_LEN_MAX} bytes"),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn duration(
        &self,
        field: &str,
        value: Option<i64>,
        default_ms: i64,
        min_ms: i64,
    ) -> Result<Duration, CatalogError> {
        let ms = value.unwrap_or(default_ms);
        if !(min_ms..=DURATION_MS_MAX).contains(&ms) {
            return Err(self.invalid(
                field,
                ms,
                format!("must be between {min_ms} and {DURATION_MS_MAX} milliseconds"),
            ));
        }
        // The range check above makes the value non-negative.
        Ok(Duration::from_millis(ms.unsigned_abs()))
    }

    /// The first of `fields` (name, whether it is set) that is set, refused
    /// as `{at}.{name}` with `reason`.
    pub(super) fn refuse_set(
        &self,
        at: &str,
        fields: &[(&str, bool)],
        reason: &str,
    ) -> Result<(), CatalogError> {
        match fields.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(self.invalid(format!("{at}.{field}"), "set", reason)),
            None => Ok(()),
        }
    }

    pub(super) fn count(
        &self,
        field: &str,
        value: Option<i64>,
        default: i64,
    ) -> Result<u32, CatalogError> {
        let n = value.unwrap_or(default);
        if !(1..=ATTEMPTS_MAX).contains(&n) {
            return Err(self.invalid(field, n, format!("must be between 1 and {ATTEMPTS_MAX}")));
        }
        u32::try_from(n).map_err(|_| self.invalid(field, n, "out of range"))
    }

    pub(super) fn port(&self, field: &str, value: i64) -> Result<u16, CatalogError> {
        u16::try_from(value)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| self.invalid(field, value, "must be a port between 1 and 65535"))
    }

    pub(super) fn service_type(
        &self,
        name: &str,
        raw: RawType,
    ) -> Result<CatalogEntry, CatalogError> {
        let at = format!("types.{name}");
        self.name(&at, name)?;
        self.text(&format!("{at}.version"), &raw.version, VERSION_LEN_MAX)?;
        let rollout = match raw.rollout.as_deref() {
            None => RolloutState::Active,
            Some(word) => RolloutState::parse(word).map_err(|_| {
                self.invalid(
                    format!("{at}.rollout"),
                    word,
                    "must be \"active\" or \"halted\"",
                )
            })?,
        };
        let bake = self.duration(&format!("{at}.bake_ms"), raw.bake_ms, BAKE_MS_DEFAULT, 0)?;
        let parameters = self.parameters(&at, &raw.parameters)?;
        let provisioning = self.provisioning(&at, &raw, &parameters)?;
        if provisioning != Provisioning::Docker {
            if !raw.services.is_empty() {
                return Err(self.invalid(
                    format!("{at}.services"),
                    raw.services.len(),
                    "a helm type has no services: its chart says what runs",
                ));
            }
            return Ok(CatalogEntry {
                service_type: name.to_owned(),
                version: raw.version,
                security: raw.security,
                rollout,
                bake,
                provisioning,
                services: Vec::new(),
                parameters,
                spec_digest: String::new(),
            });
        }
        if raw.services.is_empty() || raw.services.len() > SERVICES_MAX {
            return Err(self.invalid(
                format!("{at}.services"),
                raw.services.len(),
                format!("a service type needs 1 to {SERVICES_MAX} services"),
            ));
        }
        let mut services: Vec<ServiceSpec> = Vec::with_capacity(raw.services.len());
        for (i, raw_service) in raw.services.into_iter().enumerate() {
            let service = self.service(&format!("{at}.services[{i}]"), raw_service, &parameters)?;
            if services.iter().any(|s| s.name == service.name) {
                return Err(self.invalid(
                    format!("{at}.services[{i}].name"),
                    service.name.as_str(),
                    "duplicate service name",
                ));
            }
            // The host names given at create belong to one service, so a
            // create need not say which.
            if service.tenant_domains {
                if let Some(first) = services.iter().position(|s| s.tenant_domains) {
                    return Err(self.invalid(
                        format!("{at}.services[{i}].tenant_domains"),
                        true,
                        format!(
                            "{at}.services[{first}] takes the instance's given domains already; \
                             at most one service of a type does"
                        ),
                    ));
                }
            }
            services.push(service);
        }
        let instance_network = services.len() > 1;
        for service in &mut services {
            service.run.instance_network = instance_network;
        }
        Ok(CatalogEntry {
            service_type: name.to_owned(),
            version: raw.version,
            security: raw.security,
            rollout,
            bake,
            provisioning,
            services,
            parameters,
            spec_digest: String::new(),
        })
    }

    pub(super) fn parameters(
        &self,
        at: &str,
        raw: &BTreeMap<String, RawParameter>,
    ) -> Result<BTreeMap<String, Parameter>, CatalogError> {
        if raw.len() > PARAMETERS_MAX {
            return Err(self.invalid(
                format!("{at}.parameters"),
                raw.len(),
                format!("at most {PARAMETERS_MAX} parameters"),
            ));
        }
        raw.iter()
            .map(|(name, parameter)| {
                let field = format!("{at}.parameters.{name}");
                let mut chars = name.chars();
                let well_formed = matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
                    && chars.all(|c| c == '_' || c.is_ascii_lowercase() || c.is_ascii_digit())
                    && name.len() <= PARAMETER_NAME_LEN_MAX;
                if !well_formed {
                    return Err(self.invalid(
                        field,
                        name,
                        format!("a parameter's name is a-z, then a-z, 0-9 or '_', at most {PARAMETER_NAME_LEN_MAX} bytes"),
                    ));
                }
                if let Some(default) = &parameter.default {
                    check_parameter_value(name, default)
                        .map_err(|e| self.invalid(format!("{field}.default"), default, e.reason))?;
                }
                Ok((
                    name.clone(),
                    Parameter {
                        default: parameter.default.clone(),
                    },
                ))
            })
            .collect()
    }

    /// `provisioner` and, for a Helm type, its `helm` table.
    pub(super) fn provisioning(
        &self,
        at: &str,
        raw: &RawType,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<Provisioning, CatalogError> {
        let word = raw.provisioner.as_deref().unwrap_or("docker");
        match (word, &raw.helm) {
            ("docker", None) => Ok(Provisioning::Docker),
            ("docker", Some(_)) => Err(self.invalid(
                format!("{at}.helm"),
                "set",
                "only a type with provisioner = \"helm\" takes a helm table",
            )),
            ("helm", None) => Err(self.invalid(
                format!("{at}.helm"),
                "missing",
                "a helm type needs a helm table with at least its chart",
            )),
            ("helm", Some(helm)) => {
                self.helm(&format!("{at}.helm"), helm, &raw.version, parameters)
            }
            (other, _) => Err(self.invalid(
                format!("{at}.provisioner"),
                other,
                "must be \"docker\" or \"helm\"",
            )),
        }
    }

    pub(super) fn helm(
        &self,
        at: &str,
        raw: &RawHelm,
        version: &str,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<Provisioning, CatalogError> {
        let helm_arg = |field: String, value: &str, len_max: usize| {
            self.text(&field, value, len_max)?;
            if value.starts_with('-') || value.chars().any(char::is_control) {
                return Err(self.invalid(
                    field,
                    value,
                    "must not start with '-' (helm would read it as a flag)",
                ));
            }
            Ok(())
        };
        helm_arg(format!("{at}.chart"), &raw.chart, IMAGE_LEN_MAX)?;
        self.helm_chart(&format!("{at}.chart"), &raw.chart)?;
        let chart_version = raw
            .chart_version
            .clone()
            .unwrap_or_else(|| version.to_owned());
        helm_arg(
            format!("{at}.chart_version"),
            &chart_version,
            VERSION_LEN_MAX,
        )?;
        let namespace = raw
            .namespace
            .clone()
            .unwrap_or_else(|| HELM_NAMESPACE_DEFAULT.to_owned());
        // Drift and status find a release by its namespace without the
        // instance's parameters at hand.
        if namespace.contains("{param.") {
            return Err(self.invalid(
                format!("{at}.namespace"),
                &namespace,
                "a namespace cannot use parameters (only values and env can)",
            ));
        }
        // An upgrade installs the new version where the old one lives: a
        // namespace that moved with the version would leave the old
        // release behind and install a second one.
        if namespace.contains("{version}") {
            return Err(self.invalid(
                format!("{at}.namespace"),
                &namespace,
                "a namespace cannot depend on {version}: an upgrade would install a second \
                 release instead of upgrading the first",
            ));
        }
        let values = serde_json::to_value(&raw.values).map_err(|e| {
            self.invalid(
                format!("{at}.values"),
                "…",
                format!("cannot be given to helm: {e}"),
            )
        })?;
        let chart = HelmChart {
            chart: raw.chart.clone(),
            chart_version,
            namespace,
            // Set below, once the template is known to carry it.
            namespace_prefix: String::new(),
            values,
        };
        // Rendered once for a sample instance: a bad placeholder, or a
        // namespace that can never be a DNS label, is the catalog's error,
        // not every provision's.
        let sample_parameters = sample_parameters(parameters);
        let sample = ReleaseParams {
            instance: "i",
            team: "t",
            service_type: "s",
            version: "v",
            parameters: &sample_parameters,
        };
        chart
            .release_of(&sample, false)
            .map_err(|e| self.invalid(format!("{at}.{}", e.field), &e.value, e.reason))?;
        // The sample may carry the prefix by chance (a team named like
        // it); every rendering carries it only if the template begins with
        // it.
        self.helm_namespace(&format!("{at}.namespace"), &chart.namespace)?;
        Ok(Provisioning::Helm(HelmChart {
            namespace_prefix: self
                .grants
                .helm_namespace_prefix()
                .unwrap_or_default()
                .to_owned(),
            ..chart
        }))
    }

    /// A Helm type's chart: a well-formed reference the operator's
    /// `[grants] helm_charts` lists or covers.
    fn helm_chart(&self, field: &str, chart: &str) -> Result<(), CatalogError> {
        if let Some(rule) = chart_reference_rule(chart) {
            return Err(self.invalid(field, chart, rule));
        }
        if !self.grants.allows_helm_chart(chart) {
            return Err(self.not_granted(field.to_owned(), chart, Grant::HelmChart));
        }
        Ok(())
    }

    /// A Helm type's namespace template, which must begin with the
    /// operator's `[grants] helm_namespace_prefix` before any placeholder:
    /// then every rendering carries it, whatever the instance (and each
    /// rendering checks it again, `HelmChart::namespace_of`).
    fn helm_namespace(&self, field: &str, template: &str) -> Result<(), CatalogError> {
        match self.grants.helm_namespace_prefix() {
            Some(prefix) if literal_head(template).starts_with(prefix) => Ok(()),
            _ => Err(self.not_granted(field.to_owned(), template, Grant::HelmNamespace)),
        }
    }

    pub(super) fn service(
        &self,
        at: &str,
        raw: RawService,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<ServiceSpec, CatalogError> {
        self.name(&format!("{at}.name"), &raw.name)?;
        let run = self.run(at, &raw, parameters)?;
        self.text(&format!("{at}.image"), &raw.image, IMAGE_LEN_MAX)?;
        self.argv(&format!("{at}.command"), &raw.command, false)?;
        if raw.ports.len() > PORTS_MAX {
            return Err(self.invalid(
                format!("{at}.ports"),
                raw.ports.len(),
                format!("at most {PORTS_MAX} ports"),
            ));
        }
        let mut ports = Vec::with_capacity(raw.ports.len());
        for (i, &value) in raw.ports.iter().enumerate() {
            let port = self.port(&format!("{at}.ports[{i}]"), value)?;
            if ports.contains(&port) {
                return Err(self.invalid(format!("{at}.ports[{i}]"), value, "duplicate port"));
            }
            ports.push(port);
        }
        let healthcheck = match raw.healthcheck {
            None => None,
            Some(raw) => Some(self.healthcheck(&format!("{at}.healthcheck"), raw)?),
        };
        let readiness = match raw.readiness {
            None => ReadinessProbe::None,
            Some(raw) => self.readiness(&format!("{at}.readiness"), raw, &ports)?,
        };
        let stop_grace = self.duration(
            &format!("{at}.stop_grace_ms"),
            raw.stop_grace_ms,
            STOP_GRACE_MS_DEFAULT,
            0,
        )?;
        let update = self.update(at, raw.update.as_deref(), &run)?;
        let domains = self.domains(at, &raw.domains)?;
        Ok(ServiceSpec {
            name: ServiceName::new(raw.name),
            image: raw.image,
            command: raw.command,
            ports,
            healthcheck,
            readiness,
            stop_grace,
            update,
            domains,
            tenant_domains: raw.tenant_domains,
            run: Box::new(run),
        })
    }

    /// `domains` (#43): at most [`DOMAINS_PER_SERVICE_MAX`] templates, each
    /// a DNS name with whole-label placeholders, none twice.
    pub(super) fn domains(
        &self,
        at: &str,
        raw: &[String],
    ) -> Result<Vec<DomainTemplate>, CatalogError> {
        if raw.len() > DOMAINS_PER_SERVICE_MAX {
            return Err(self.invalid(
                format!("{at}.domains"),
                raw.len(),
                format!("at most {DOMAINS_PER_SERVICE_MAX} domains"),
            ));
        }
        let mut domains: Vec<DomainTemplate> = Vec::with_capacity(raw.len());
        for (j, text) in raw.iter().enumerate() {
            let field = format!("{at}.domains[{j}]");
            let template = DomainTemplate::parse(text)
                .map_err(|e| self.invalid(&field, text, e.to_string()))?;
            if domains.contains(&template) {
                return Err(self.invalid(&field, text, "duplicate domain"));
            }
            domains.push(template);
        }
        Ok(domains)
    }

    /// Host names two services would always both claim (#43): a template
    /// without `{service}` on two services of one type (one instance
    /// renders both alike), or one without any placeholder on two
    /// services anywhere. Claims only some instances make (a literal name
    /// in a type with two instances) are refused at publish.
    pub(super) fn shared_domains(
        &self,
        entries: &BTreeMap<String, CatalogEntry>,
    ) -> Result<(), CatalogError> {
        let mut seen: BTreeMap<(Option<&str>, &DomainTemplate), String> = BTreeMap::new();
        for (name, entry) in entries {
            for (i, service) in entry.services.iter().enumerate() {
                for (j, template) in service.domains.iter().enumerate() {
                    if !template.names_no_service() {
                        continue;
                    }
                    let field = format!("types.{name}.services[{i}].domains[{j}]");
                    let scope = (!template.is_literal()).then_some(name.as_str());
                    if let Some(first) = seen.get(&(scope, template)) {
                        return Err(self.invalid(
                            field,
                            template.as_str(),
                            format!("{first} claims the same host name"),
                        ));
                    }
                    seen.insert((scope, template), field);
                }
            }
        }
        Ok(())
    }

    /// `update`: `"overlap"` or `"stop-first"`. A service with a named
    /// volume is stopped first unless overlap is asked for: most databases
    /// must never have two processes on one data directory, and many
    /// cannot tell (#40).
    pub(super) fn update(
        &self,
        at: &str,
        raw: Option<&str>,
        run: &RunSpec,
    ) -> Result<UpdateStrategy, CatalogError> {
        match raw {
            None if run.volumes().next().is_some() => Ok(UpdateStrategy::StopFirst),
            None => Ok(UpdateStrategy::Overlap),
            Some("overlap") => Ok(UpdateStrategy::Overlap),
            Some("stop-first") => Ok(UpdateStrategy::StopFirst),
            Some(other) => Err(self.invalid(
                format!("{at}.update"),
                other,
                "must be \"overlap\" or \"stop-first\"",
            )),
        }
    }
}
