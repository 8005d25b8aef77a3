//! Releases: what an instance is installed as, by whom, and where.
//!
//! The provisioner is a property of the service type (the catalog's
//! `provisioner`), not of the daemon, so one daemon runs both kinds:
//!
//! - **Docker**: the release *is* the instance's labelled containers.
//!   stead creates them from the catalog's services, and the recovery pass
//!   keeps them running and publishes them through Caddy.
//! - **Helm**: the release is a chart installed into a Kubernetes
//!   namespace. Kubernetes keeps its pods running. stead only installs,
//!   upgrades and uninstalls it, and checks that it still exists (drift,
//!   C5).
//!
//! This module turns a catalog entry and an instance into the release the
//! provisioner is asked for. It renders the entry's templates (namespace,
//! values) with the instance's parameters. The rendering is pure and
//! deterministic, so drift and the workers always agree on where an
//! instance's release lives.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use super::fleet::{Instance, Release};
use super::names;

/// The namespace the Docker provisioner reports its releases in (Docker has
/// none of its own).
pub const DOCKER_RELEASE_NAMESPACE: &str = "docker";

/// The default namespace template of a Helm type: one namespace per
/// instance, created with the release.
pub(crate) const HELM_NAMESPACE_DEFAULT: &str = "{instance}";

/// The names a template may use, each written `{name}`, besides
/// `{param.NAME}` for the type's declared parameters. Write `{{` and `}}`
/// for literal braces.
pub(crate) const PLACEHOLDERS: [&str; 4] = ["instance", "team", "service_type", "version"];

/// How a service type's instances are provisioned.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Provisioning {
    /// Labelled containers on the local Docker engine, recovered by stead.
    Docker,
    /// A Helm chart in Kubernetes, recovered by Kubernetes.
    Helm(HelmChart),
}

impl Provisioning {
    /// The catalog's word for it.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Helm(_) => "helm",
        }
    }
}

/// A Helm type's chart and templates, as the catalog gives them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HelmChart {
    /// `repo/chart`, a path or an OCI reference.
    pub chart: String,
    /// The chart version installed for this catalog version.
    pub chart_version: String,
    /// Namespace template (a DNS label once rendered).
    pub namespace: String,
    /// What every rendered namespace must begin with: the operator's
    /// `[grants] helm_namespace_prefix` the catalog was loaded with
    /// (empty for a chart built in code). Not part of the type's digest:
    /// the namespace template, which must begin with it, is.
    #[serde(skip)]
    pub namespace_prefix: String,
    /// Values template: a JSON object whose string values may hold
    /// placeholders. Keys are taken literally.
    pub values: Value,
}

/// No parameters: for templates rendered without an instance's (samples,
/// tests).
pub static NO_PARAMETERS: BTreeMap<String, String> = BTreeMap::new();

/// The instance-specific values a template may use.
#[derive(Clone, Copy, Debug)]
pub struct ReleaseParams<'a> {
    pub instance: &'a str,
    pub team: &'a str,
    pub service_type: &'a str,
    pub version: &'a str,
    /// The instance's parameters with the catalog's defaults filled in
    /// (`CatalogEntry::parameters_of`), read as `{param.NAME}`.
    pub parameters: &'a BTreeMap<String, String>,
}

impl<'a> ReleaseParams<'a> {
    /// An instance's parameters, at `version` (the catalog's, for an
    /// upgrade).
    pub fn of(instance: &'a Instance, version: &'a str) -> Self {
        Self {
            instance: instance.name.as_str(),
            team: &instance.team,
            service_type: &instance.service_type,
            version,
            parameters: &instance.parameters,
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        if let Some(parameter) = name.strip_prefix("param.") {
            return self.parameters.get(parameter).map(String::as_str);
        }
        match name {
            "instance" => Some(self.instance),
            "team" => Some(self.team),
            "service_type" => Some(self.service_type),
            "version" => Some(self.version),
            _ => None,
        }
    }
}

/// Which kind of release, for the provisioner to route on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReleaseKind {
    Docker,
    Helm,
}

/// A release to uninstall or ask about: its kind and where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseTarget {
    pub kind: ReleaseKind,
    pub release: Release,
}

/// What a worker asks the provisioner to install or upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseSpec {
    /// The instance's containers, which the worker creates itself from the
    /// catalog's services: nothing to install beyond them.
    Docker {
        name: String,
    },
    Helm(HelmRelease),
}

/// One `helm upgrade --install`, fully rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmRelease {
    pub name: String,
    pub namespace: String,
    pub chart: String,
    pub chart_version: String,
    /// Rendered values (a JSON object), handed to helm as a values file.
    pub values: Value,
    /// Roll back inside Helm if the upgrade fails (`--atomic`): version
    /// drift's upgrades; a first provision has nothing to roll back to.
    pub atomic: bool,
}

impl ReleaseSpec {
    pub fn target(&self) -> ReleaseTarget {
        match self {
            Self::Docker { name } => ReleaseTarget {
                kind: ReleaseKind::Docker,
                release: Release {
                    name: name.clone(),
                    namespace: DOCKER_RELEASE_NAMESPACE.to_owned(),
                },
            },
            Self::Helm(helm) => ReleaseTarget {
                kind: ReleaseKind::Helm,
                release: Release {
                    name: helm.name.clone(),
                    namespace: helm.namespace.clone(),
                },
            },
        }
    }
}

/// A template that cannot be rendered, naming it and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{field} = {value:?}: {reason}")]
pub struct TemplateError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

/// Renders `{placeholder}`s with `params`; `{{` and `}}` are literal braces.
pub fn render(
    field: &str,
    template: &str,
    params: &ReleaseParams,
) -> Result<String, TemplateError> {
    let error = |reason: String| TemplateError {
        field: field.to_owned(),
        value: template.to_owned(),
        reason,
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if let Some(open) = tail.strip_prefix('{') {
            let Some(close) = open.find('}') else {
                return Err(error(
                    "a '{' is not closed (write {{ for a literal brace)".into(),
                ));
            };
            let name = &open[..close];
            let value = params.get(name).ok_or_else(|| {
                error(format!(
                    "unknown placeholder {{{name}}}; known: {}",
                    PLACEHOLDERS
                        .iter()
                        .map(|p| format!("{{{p}}}"))
                        .chain(params.parameters.keys().map(|p| format!("{{param.{p}}}")))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            out.push_str(value);
            rest = &open[close + 1..];
        } else {
            return Err(error(
                "a '}' has no '{' (write }} for a literal brace)".into(),
            ));
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Renders every string of a values template, naming a bad one by its
/// dotted path under `field`.
pub(crate) fn render_values(
    field: &str,
    values: &Value,
    params: &ReleaseParams,
) -> Result<Value, TemplateError> {
    Ok(match values {
        Value::String(s) => Value::String(render(field, s, params)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| render_values(&format!("{field}[{i}]"), v, params))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        render_values(&format!("{field}.{k}"), v, params)?,
                    ))
                })
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// Whether `namespace` is one of Kubernetes' own (`default`, `kube-*`),
/// which a tenant's release must never be installed into: its objects sit
/// beside the cluster's, and an uninstall there could remove theirs.
pub(crate) fn is_system_namespace(namespace: &str) -> bool {
    namespace == "default" || namespace.starts_with("kube-")
}

impl HelmChart {
    /// The namespace an instance's release lives in.
    pub fn namespace_of(&self, params: &ReleaseParams) -> Result<String, TemplateError> {
        let namespace = render("namespace", &self.namespace, params)?;
        let refused = |rule: &dyn std::fmt::Display| TemplateError {
            field: "namespace".into(),
            value: namespace.clone(),
            reason: format!(
                "rendered from {:?} for {}: {rule}",
                self.namespace, params.instance
            ),
        };
        names::check_dns_label("namespace", &namespace).map_err(|e| refused(&e.rule))?;
        if is_system_namespace(&namespace) {
            return Err(refused(
                &"a Kubernetes system namespace (default, kube-*) is never a tenant's",
            ));
        }
        if !namespace.starts_with(&self.namespace_prefix) {
            return Err(refused(&format_args!(
                "does not begin with {:?}, the namespace prefix [grants] helm_namespace_prefix \
                 gives Helm types",
                self.namespace_prefix
            )));
        }
        Ok(namespace)
    }

    /// The whole release of one instance.
    pub fn release_of(
        &self,
        params: &ReleaseParams,
        atomic: bool,
    ) -> Result<HelmRelease, TemplateError> {
        Ok(HelmRelease {
            name: params.instance.to_owned(),
            namespace: self.namespace_of(params)?,
            chart: self.chart.clone(),
            chart_version: self.chart_version.clone(),
            values: render_values("values", &self.values, params)?,
            atomic,
        })
    }
}

impl Provisioning {
    /// Which provisioner installs this type's releases.
    pub fn kind(&self) -> ReleaseKind {
        match self {
            Self::Docker => ReleaseKind::Docker,
            Self::Helm(_) => ReleaseKind::Helm,
        }
    }

    /// The namespace an instance's release lives in: Docker's fixed one
    /// (borrowed: drift asks this of every instance every tick), or a Helm
    /// type's rendered template.
    pub fn namespace_of(&self, params: &ReleaseParams) -> Result<Cow<'static, str>, TemplateError> {
        match self {
            Self::Docker => Ok(Cow::Borrowed(DOCKER_RELEASE_NAMESPACE)),
            Self::Helm(chart) => chart.namespace_of(params).map(Cow::Owned),
        }
    }

    /// Where an instance's release lives, to uninstall or ask about it.
    pub fn target_of(&self, params: &ReleaseParams) -> Result<ReleaseTarget, TemplateError> {
        Ok(ReleaseTarget {
            kind: self.kind(),
            release: Release {
                name: params.instance.to_owned(),
                namespace: self.namespace_of(params)?.into_owned(),
            },
        })
    }

    /// What to install for an instance.
    pub fn spec_of(
        &self,
        params: &ReleaseParams,
        atomic: bool,
    ) -> Result<ReleaseSpec, TemplateError> {
        Ok(match self {
            Self::Docker => ReleaseSpec::Docker {
                name: params.instance.to_owned(),
            },
            Self::Helm(chart) => ReleaseSpec::Helm(chart.release_of(params, atomic)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ReleaseParams<'static> {
        ReleaseParams {
            instance: "shop-1",
            team: "blue",
            service_type: "shop",
            version: "2.0.0",
            parameters: &NO_PARAMETERS,
        }
    }

    #[test]
    fn templates_render_placeholders_and_literal_braces() {
        let p = params();
        assert_eq!(render("f", "{instance}", &p).unwrap(), "shop-1");
        assert_eq!(
            render("f", "{team}-{service_type}@{version}", &p).unwrap(),
            "blue-shop@2.0.0"
        );
        assert_eq!(render("f", "{{x}} {instance}", &p).unwrap(), "{x} shop-1");
        assert_eq!(render("f", "plain", &p).unwrap(), "plain");
    }

    #[test]
    fn bad_templates_name_the_field_value_and_reason() {
        let p = params();
        let e = render("types.a.helm.namespace", "{tenant}", &p).unwrap_err();
        assert_eq!(e.field, "types.a.helm.namespace");
        assert!(e.reason.contains("unknown placeholder {tenant}"), "{e}");
        assert!(render("f", "{instance", &p)
            .unwrap_err()
            .reason
            .contains("not closed"));
        assert!(render("f", "a}b", &p)
            .unwrap_err()
            .reason
            .contains("no '{'"));
    }

    #[test]
    fn values_render_every_string_and_name_the_path_of_a_bad_one() {
        let values = serde_json::json!({
            "host": "{instance}.example.org",
            "replicas": 2,
            "labels": ["{team}", true],
        });
        let out = render_values("values", &values, &params()).unwrap();
        assert_eq!(
            out,
            serde_json::json!({
                "host": "shop-1.example.org",
                "replicas": 2,
                "labels": ["blue", true],
            })
        );
        let bad = serde_json::json!({"a": {"b": ["ok", "{nope}"]}});
        let e = render_values("values", &bad, &params()).unwrap_err();
        assert_eq!(e.field, "values.a.b[1]");
    }

    #[test]
    fn a_team_cannot_render_a_release_into_a_system_namespace() {
        let chart = HelmChart {
            chart: "c".into(),
            chart_version: "1".into(),
            namespace: "{team}".into(),
            namespace_prefix: String::new(),
            values: serde_json::json!({}),
        };
        for team in ["default", "kube-system", "kube-public"] {
            let params = ReleaseParams { team, ..params() };
            let e = chart.namespace_of(&params).unwrap_err();
            assert_eq!(e.value, team);
            assert!(e.reason.contains("system namespace"), "{e}");
        }
        assert_eq!(chart.namespace_of(&params()).unwrap(), "blue");
    }

    #[test]
    fn a_rendered_namespace_must_be_a_dns_label() {
        let chart = HelmChart {
            chart: "c".into(),
            chart_version: "1".into(),
            namespace: "Tenant_{instance}".into(),
            namespace_prefix: String::new(),
            values: serde_json::json!({}),
        };
        let e = chart.namespace_of(&params()).unwrap_err();
        assert_eq!(e.value, "Tenant_shop-1");
        let chart = HelmChart {
            namespace: HELM_NAMESPACE_DEFAULT.into(),
            ..chart
        };
        assert_eq!(chart.namespace_of(&params()).unwrap(), "shop-1");
    }

    #[test]
    fn a_namespace_without_the_granted_prefix_is_refused_at_render() {
        let chart = HelmChart {
            chart: "c".into(),
            chart_version: "1".into(),
            namespace: "{team}-shop".into(),
            namespace_prefix: "blue-".into(),
            values: serde_json::json!({}),
        };
        assert_eq!(chart.namespace_of(&params()).unwrap(), "blue-shop");
        let red = ReleaseParams {
            team: "red",
            ..params()
        };
        let e = chart.namespace_of(&red).unwrap_err();
        assert_eq!(e.value, "red-shop");
        assert!(e.reason.contains("helm_namespace_prefix"), "{e}");
        assert!(chart.release_of(&red, false).is_err());
    }

    #[test]
    fn docker_and_helm_targets_live_where_their_provisioners_list_them() {
        let docker = Provisioning::Docker.target_of(&params()).unwrap();
        assert_eq!(docker.kind, ReleaseKind::Docker);
        assert_eq!(docker.release.namespace, DOCKER_RELEASE_NAMESPACE);
        let helm = Provisioning::Helm(HelmChart {
            chart: "charts/shop".into(),
            chart_version: "2.0.0".into(),
            namespace: "t-{team}".into(),
            namespace_prefix: "t-".into(),
            values: serde_json::json!({}),
        });
        let target = helm.target_of(&params()).unwrap();
        assert_eq!(target.release.namespace, "t-blue");
        let ReleaseSpec::Helm(spec) = helm.spec_of(&params(), true).unwrap() else {
            panic!("a helm type installs a helm release");
        };
        assert!(spec.atomic);
        assert_eq!(ReleaseSpec::Helm(spec).target(), target);
    }
}
