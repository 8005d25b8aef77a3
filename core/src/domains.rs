//! Public host names of a service (#43): the catalog's `domains` templates.
//!
//! A service may be served over HTTPS under host names of its own, written
//! in the catalog as templates such as `"shop.example.com"` or
//! `"{instance}.example.com"`. A placeholder (`{instance}`, `{service}`)
//! must be a whole label, so every instance and service name (DNS labels,
//! `names`) renders a template into a DNS name: a template is checked once,
//! at load, against the longest names there can be, and rendering cannot
//! fail afterwards.
//!
//! What a template cannot rule out is two instances claiming one host (a
//! literal name in a type with two instances): the host is reserved for
//! the first instance whose publish claims it until that instance is
//! deleted, and every other instance's publish is refused that host
//! (`hosts.rs`, #54). The traffic plane refuses a second claim too while
//! the first route exists (`adapters::caddy`).

use super::names::{self, check_dns_name, NameRule, INSTANCE_NAME_LEN_MAX, LABEL_LEN_MAX};
use super::types::{InstanceName, ServiceName};

/// Most host names one service may be given by the catalog, and most an
/// instance's creator may give it.
pub const DOMAINS_PER_SERVICE_MAX: usize = 16;

const INSTANCE: &str = "{instance}";
const SERVICE: &str = "{service}";

/// Why a domain template was refused (the catalog names the field).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    #[error(
        "label {label:?}: a placeholder ({{instance}} or {{service}}) must be a whole label, \
         and no other is known"
    )]
    Placeholder { label: String },
    #[error("{0}")]
    NotDnsName(NameRule),
    #[error("rendered with the longest instance and service names: {0}")]
    RenderedNotDnsName(NameRule),
}

/// A checked domain template.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DomainTemplate(String);

impl DomainTemplate {
    /// Checks `text`: DNS labels and whole-label placeholders, a DNS name
    /// once rendered with the longest names.
    pub fn parse(text: &str) -> Result<Self, DomainError> {
        for label in text.split('.') {
            let placeholder = label == INSTANCE || label == SERVICE;
            if !placeholder && (label.contains('{') || label.contains('}')) {
                return Err(DomainError::Placeholder {
                    label: label.to_owned(),
                });
            }
        }
        let template = Self(text.to_owned());
        let longest = template.render_str(
            &"a".repeat(INSTANCE_NAME_LEN_MAX),
            &"a".repeat(LABEL_LEN_MAX),
        );
        check_dns_name("domain", &longest).map_err(|e| {
            if longest == text {
                DomainError::NotDnsName(e.rule)
            } else {
                DomainError::RenderedNotDnsName(e.rule)
            }
        })?;
        Ok(template)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether every instance renders this template to the same name.
    pub(crate) fn is_literal(&self) -> bool {
        !self.0.split('.').any(|label| label == INSTANCE)
    }

    /// Whether every service renders this template to the same name.
    pub(crate) fn names_no_service(&self) -> bool {
        !self.0.split('.').any(|label| label == SERVICE)
    }

    /// The host name of `service` of `instance`. Instance and service names
    /// are DNS labels (checked where they are read), so this is a DNS name
    /// ([`DomainTemplate::parse`] checked the longest ones).
    pub fn render(&self, instance: &InstanceName, service: &ServiceName) -> String {
        let rendered = self.render_str(instance.as_str(), service.as_str());
        debug_assert!(
            names::check_instance_name("instance", instance.as_str()).is_err()
                || names::check_dns_label("service", service.as_str()).is_err()
                || check_dns_name("domain", &rendered).is_ok(),
            "a checked template rendered {rendered:?}"
        );
        rendered
    }

    fn render_str(&self, instance: &str, service: &str) -> String {
        self.0
            .split('.')
            .map(|label| match label {
                INSTANCE => instance,
                SERVICE => service,
                other => other,
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// The public host names of one service of a type: the catalog's
/// templates and, where the catalog says `tenant_domains = true`, the
/// host names each instance's creator gave at create (#54).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceHosts {
    pub templates: Vec<DomainTemplate>,
    pub takes_given: bool,
}

impl ServiceHosts {
    /// Whether no instance of the service has any public host name.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty() && !self.takes_given
    }

    /// The host names `service` of `instance` is served under: each
    /// template rendered, then the ones its creator gave (`given`).
    pub fn render(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        given: &[String],
    ) -> Vec<String> {
        let given = if self.takes_given { given } else { &[] };
        self.templates
            .iter()
            .map(|t| t.render(instance, service))
            .chain(given.iter().cloned())
            .collect()
    }
}

/// Why a host name given at create was refused; `index` is its place in
/// the request's list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GivenDomainError {
    #[error("domains: {count} host names given, at most {DOMAINS_PER_SERVICE_MAX}")]
    TooMany { count: usize },
    #[error("domains[{index}] = {host:?}: {rule}")]
    NotDnsName {
        index: usize,
        host: String,
        rule: NameRule,
    },
    #[error("domains[{index}] = {host:?}: given twice")]
    Duplicate { index: usize, host: String },
    #[error(
        "domains[{index}] = {host:?}: not under a domain team {team:?} may use (teams.{team}.\
         domain_suffixes: {allowed})"
    )]
    NotAllowed {
        index: usize,
        host: String,
        team: String,
        allowed: String,
    },
}

/// Checks the host names `team` gives an instance at create: DNS names,
/// none twice, each equal to or under one of `suffixes` (whole labels:
/// `acme.example` allows `shop.acme.example`, never `evilacme.example`).
/// A team with no suffixes may give none.
pub fn check_given_domains(
    team: &str,
    given: &[String],
    suffixes: &[String],
) -> Result<(), GivenDomainError> {
    if given.len() > DOMAINS_PER_SERVICE_MAX {
        return Err(GivenDomainError::TooMany { count: given.len() });
    }
    for (index, host) in given.iter().enumerate() {
        check_dns_name("domain", host).map_err(|e| GivenDomainError::NotDnsName {
            index,
            host: host.clone(),
            rule: e.rule,
        })?;
        if given[..index].contains(host) {
            return Err(GivenDomainError::Duplicate {
                index,
                host: host.clone(),
            });
        }
        if !suffixes.iter().any(|suffix| is_under(host, suffix)) {
            let allowed = if suffixes.is_empty() {
                "none".to_owned()
            } else {
                suffixes.join(", ")
            };
            return Err(GivenDomainError::NotAllowed {
                index,
                host: host.clone(),
                team: team.to_owned(),
                allowed,
            });
        }
    }
    Ok(())
}

/// Whether `host` is `suffix` or a name under it, by whole labels.
pub fn is_under(host: &str, suffix: &str) -> bool {
    host == suffix
        || host
            .strip_suffix(suffix)
            .is_some_and(|rest| rest.ends_with('.'))
}

impl std::fmt::Display for DomainTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, accepted: bool) {
        assert_eq!(DomainTemplate::parse(text).is_ok(), accepted, "{text}");
    }

    #[test]
    fn templates_are_dns_names_with_whole_label_placeholders() {
        for good in [
            "shop.example.com",
            "{instance}.example.com",
            "{service}.{instance}.apps.example.net",
            "localhost",
        ] {
            check(good, true);
        }
        for bad in [
            "",
            "Shop.example.com",
            "shop..example.com",
            "shop.example.com.",
            "*.example.com",
            "-shop.example.com",
            "shop_1.example.com",
            "{instance}-shop.example.com",
            "{team}.example.com",
            "{instance.example.com",
            "https://shop.example.com",
        ] {
            check(bad, false);
        }
        // 246 bytes as written, but rendered with a 53-byte instance and a
        // 63-byte service name longer than any DNS name may be.
        let label = "a".repeat(60);
        let long = format!("{{instance}}.{{service}}.{label}.{label}.{label}.com");
        check(&long, false);
    }

    #[test]
    fn a_given_domain_must_lie_under_a_suffix_by_whole_labels() {
        let suffixes = ["acme.example".to_owned()];
        let given = |hosts: &[&str]| {
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            check_given_domains("acme", &hosts, &suffixes)
        };
        assert_eq!(given(&["shop.acme.example", "acme.example"]), Ok(()));
        for refused in [
            "evilacme.example",
            "acme.example.evil",
            "example",
            "shop.other.example",
        ] {
            assert!(
                matches!(given(&[refused]), Err(GivenDomainError::NotAllowed { .. })),
                "{refused}"
            );
        }
        let error = given(&["shop.acme.example", "Shop.acme.example"]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with(r#"domains[1] = "Shop.acme.example": must be"#),
            "{error}"
        );
        let error = given(&["a.acme.example", "a.acme.example"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"domains[1] = "a.acme.example": given twice"#
        );
        let error = check_given_domains("solo", &["a.acme.example".into()], &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"domains[0] = "a.acme.example": not under a domain team "solo" may use (teams.solo.domain_suffixes: none)"#
        );
        let many: Vec<String> = (0..=DOMAINS_PER_SERVICE_MAX)
            .map(|i| format!("h{i}.acme.example"))
            .collect();
        assert!(matches!(
            check_given_domains("acme", &many, &suffixes),
            Err(GivenDomainError::TooMany { .. })
        ));
    }

    #[test]
    fn given_domains_follow_the_templates_only_where_the_service_takes_them() {
        let templates = vec![DomainTemplate::parse("{instance}.example.com").unwrap()];
        let given = ["shop.acme.example".to_owned()];
        let mut hosts = ServiceHosts {
            templates,
            takes_given: false,
        };
        let (instance, service) = (InstanceName::new("shop"), ServiceName::new("web"));
        assert_eq!(
            hosts.render(&instance, &service, &given),
            ["shop.example.com"]
        );
        hosts.takes_given = true;
        assert_eq!(
            hosts.render(&instance, &service, &given),
            ["shop.example.com", "shop.acme.example"]
        );
    }

    #[test]
    fn rendering_fills_each_placeholder_label() {
        let template = DomainTemplate::parse("{service}.{instance}.example.com").unwrap();
        assert_eq!(
            template.render(&"shop".into(), &"web".into()),
            "web.shop.example.com"
        );
        assert!(!template.is_literal() && !template.names_no_service());
        let literal = DomainTemplate::parse("shop.example.com").unwrap();
        assert!(literal.is_literal() && literal.names_no_service());
    }
}
