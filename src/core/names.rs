//! Names (DESIGN §10, T6: names are injective).
//!
//! Instance and service names are DNS labels, and this module is the one
//! home of that rule: the catalog, operator commands and the Helm adapter
//! check names through it. Every name stead derives from
//! an (instance, service) pair is an encoding no two pairs share:
//!
//! - Caddy route ids are `stead.<instance>.<service>` and hosts
//!   `<service>.<instance>.<suffix>` (`adapters::caddy`);
//! - release names are the instance name itself.
//!
//! All of them rest on one fact: a DNS label never contains a `.`, so the
//! dots between the parts cannot be confused with anything inside a part.
//! The earlier `-` separator could: instance `a-api` with service `web` and
//! instance `a` with service `api-web` shared `stead-a-api-web`.

/// Longest DNS label (RFC 1123).
pub const LABEL_LEN_MAX: usize = 63;
/// Longest instance name: it is also the instance's release name, and Helm
/// refuses release names longer than 53 characters.
pub const INSTANCE_NAME_LEN_MAX: usize = 53;
/// Longest value quoted back in a [`NameError`].
const ERROR_VALUE_LEN_MAX: usize = 80;

const _: () = assert!(INSTANCE_NAME_LEN_MAX <= LABEL_LEN_MAX);

/// A name that breaks its rule. Names the field and quotes the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value:?}: {rule}")]
pub struct NameError {
    pub field: String,
    /// The value, cut to a length fit for an error message.
    pub value: String,
    pub rule: NameRule,
}

/// The rule a [`NameError`] says was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameRule {
    #[error(
        "must be a DNS label: 1 to {len_max} of a-z, 0-9 and '-', \
         beginning and ending with a letter or digit"
    )]
    DnsLabel { len_max: usize },
}

impl NameError {
    fn new(field: &str, value: &str, rule: NameRule) -> Self {
        Self {
            field: field.to_owned(),
            value: value.chars().take(ERROR_VALUE_LEN_MAX).collect(),
            rule,
        }
    }
}

/// Whether `value` is a DNS label of at most `len_max` bytes: `a-z`, `0-9`
/// and `-`, neither first nor last a `-`.
fn is_label(value: &str, len_max: usize) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=len_max).contains(&value.len())
        && value.chars().all(|c| alphanumeric(c) || c == '-')
        && value.starts_with(alphanumeric)
        && value.ends_with(alphanumeric)
}

fn check_label(field: &str, value: &str, len_max: usize) -> Result<(), NameError> {
    if is_label(value, len_max) {
        Ok(())
    } else {
        Err(NameError::new(field, value, NameRule::DnsLabel { len_max }))
    }
}

/// The rule for service names, service types and namespaces: a DNS label.
pub fn check_dns_label(field: &str, value: &str) -> Result<(), NameError> {
    check_label(field, value, LABEL_LEN_MAX)
}

/// The rule for instance names (and so release names): a DNS label of at
/// most [`INSTANCE_NAME_LEN_MAX`] bytes.
pub fn check_instance_name(field: &str, value: &str) -> Result<(), NameError> {
    check_label(field, value, INSTANCE_NAME_LEN_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(value: &str, is_dns_label: bool, is_instance_name: bool) {
        assert_eq!(
            check_dns_label("f", value).is_ok(),
            is_dns_label,
            "dns label {value:?}"
        );
        assert_eq!(
            check_instance_name("f", value).is_ok(),
            is_instance_name,
            "instance name {value:?}"
        );
    }

    #[test]
    fn names_are_dns_labels_and_instance_names_fit_a_release_name() {
        let long_label = "a".repeat(LABEL_LEN_MAX);
        let long_instance = "a".repeat(INSTANCE_NAME_LEN_MAX);
        for (value, is_dns_label, is_instance_name) in [
            ("web", true, true),
            ("a-api", true, true),
            ("1st", true, true),
            ("a1-b2", true, true),
            (long_instance.as_str(), true, true),
            (long_label.as_str(), true, false),
            ("", false, false),
            ("-web", false, false),
            ("web-", false, false),
            ("Web", false, false),
            ("a_b", false, false),
            ("a.b", false, false),
            ("x/../../config#", false, false),
            ("caf\u{e9}", false, false),
        ] {
            check(value, is_dns_label, is_instance_name);
        }
        check(&format!("{long_label}a"), false, false);
    }

    #[test]
    fn a_bad_name_is_an_error_naming_field_and_value() {
        let error = check_instance_name("instances.name", "x/../../config#").unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("instances.name = \"x/../../config#\": must be a DNS label"),
            "{message}"
        );
        assert!(
            message.contains(&INSTANCE_NAME_LEN_MAX.to_string()),
            "{message}"
        );
    }
}
