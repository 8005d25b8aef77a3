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

/// Most host names one service may be given.
pub(crate) const DOMAINS_PER_SERVICE_MAX: usize = 16;

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
