//! Names (DESIGN §10, T6: names are injective).
//!
//! Instance and service names are DNS labels, and this module is the one
//! home of that rule: the catalog, operator commands, the Helm adapter, the
//! SQL rows and the Docker labels read back check names through it. Every
//! name stead derives from an (instance, service) pair is an encoding no
//! two pairs share:
//!
//! - Caddy route ids are `stead.<instance>.<service>` and hosts
//!   `<service>.<instance>.<suffix>` (`adapters::caddy`);
//! - container names are [`container_name`]: `stead.<instance>.<service>.<revision>`;
//! - release names are the instance name itself.
//!
//! All of them rest on one fact: a DNS label never contains a `.`, so the
//! dots between the parts cannot be confused with anything inside a part.
//! The earlier `-` separator could: instance `a-api` with service `web` and
//! instance `a` with service `api-web` shared `stead-a-api-web`.

use super::types::{InstanceName, ServiceKey, ServiceName};

/// Longest DNS label (RFC 1123).
pub(crate) const LABEL_LEN_MAX: usize = 63;
/// Longest instance name: it is also the instance's release name, and Helm
/// refuses release names longer than 53 characters.
pub const INSTANCE_NAME_LEN_MAX: usize = 53;
/// Longest revision a container name carries (a catalog version).
pub(crate) const REVISION_LEN_MAX: usize = 64;
/// Prefix of every container name stead gives.
pub const CONTAINER_NAME_PREFIX: &str = "stead";
/// Longest container name [`container_name`] returns: every part at its
/// bound and every revision byte escaped. Docker and Podman set no limit
/// of their own (dockerd 20.10 accepts 2,000 characters); the bound is ours.
pub(crate) const CONTAINER_NAME_LEN_MAX: usize = CONTAINER_NAME_PREFIX.len()
    + 1
    + INSTANCE_NAME_LEN_MAX
    + 1
    + LABEL_LEN_MAX
    + 1
    + ESCAPED_BYTE_LEN * REVISION_LEN_MAX;

/// An escaped revision byte: `_` and two hex digits.
const ESCAPED_BYTE_LEN: usize = 3;
/// Longest value quoted back in a [`NameError`].
const ERROR_VALUE_LEN_MAX: usize = 80;

const _: () = assert!(INSTANCE_NAME_LEN_MAX <= LABEL_LEN_MAX);
const _: () = assert!(super::catalog::VERSION_LEN_MAX <= REVISION_LEN_MAX);

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
    #[error(
        "must be a container ID or name: 1 to {len_max} of A-Z, a-z, 0-9, '_', '.' and '-', \
         beginning with a letter or digit"
    )]
    ContainerRef { len_max: usize },
    #[error("must be 1 to {len_max} bytes")]
    Length { len_max: usize },
    #[error(
        "must be a DNS name: labels of 1 to {label_len_max} of a-z, 0-9 and '-' \
         (beginning and ending with a letter or digit) joined by '.', at most {len_max} bytes"
    )]
    DnsName {
        label_len_max: usize,
        len_max: usize,
    },
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

/// Longest DNS name (RFC 1035, without the root's final dot).
pub(crate) const DNS_NAME_LEN_MAX: usize = 253;

/// The rule for host names stead serves (#43): dot-separated DNS labels,
/// lowercase, at most [`DNS_NAME_LEN_MAX`] bytes. No wildcard, no final dot.
pub fn check_dns_name(field: &str, value: &str) -> Result<(), NameError> {
    let valid = (1..=DNS_NAME_LEN_MAX).contains(&value.len())
        && value.split('.').all(|label| is_label(label, LABEL_LEN_MAX));
    if valid {
        Ok(())
    } else {
        let rule = NameRule::DnsName {
            label_len_max: LABEL_LEN_MAX,
            len_max: DNS_NAME_LEN_MAX,
        };
        Err(NameError::new(field, value, rule))
    }
}

/// The rule for instance names (and so release names): a DNS label of at
/// most [`INSTANCE_NAME_LEN_MAX`] bytes.
pub fn check_instance_name(field: &str, value: &str) -> Result<(), NameError> {
    check_label(field, value, INSTANCE_NAME_LEN_MAX)
}

/// The deterministic name of a service's container at one revision:
/// `stead.<instance>.<service>.<revision>`, injective in all three.
///
/// Instance and service are DNS labels, so the first three dots are the
/// separators and everything after the third is the revision. The revision
/// (a catalog version, any text) keeps `A-Z`, `a-z`, `0-9`, `.` and `-`,
/// which Docker names allow; every other byte of it, `_` included, becomes
/// `_` and two lowercase hex digits. Each `_` starts exactly one escape, so
/// distinct revisions give distinct names, and the result matches Docker's
/// `[a-zA-Z0-9][a-zA-Z0-9_.-]+`.
pub fn container_name(
    instance: &InstanceName,
    service: &ServiceName,
    revision: &str,
) -> Result<String, NameError> {
    check_instance_name("instance", instance.as_str())?;
    check_dns_label("service", service.as_str())?;
    if !(1..=REVISION_LEN_MAX).contains(&revision.len()) {
        let rule = NameRule::Length {
            len_max: REVISION_LEN_MAX,
        };
        return Err(NameError::new("revision", revision, rule));
    }
    let mut name = format!("{CONTAINER_NAME_PREFIX}.{instance}.{service}.");
    for byte in revision.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-') {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("_{byte:02x}"));
        }
    }
    assert!(name.len() <= CONTAINER_NAME_LEN_MAX, "{name}");
    Ok(name)
}

/// Prefix of every route id stead writes.
pub const ROUTE_ID_PREFIX: &str = "stead.";

/// The id of a service's route in the traffic plane:
/// `stead.<instance>.<service>`, injective since neither name holds a dot.
pub fn route_id(service: &ServiceKey) -> String {
    format!("{ROUTE_ID_PREFIX}{}.{}", service.instance, service.service)
}

/// The service a route id names; `None` for an id stead did not write or
/// whose names are not DNS labels (T6: names read back are checked before
/// use).
pub fn service_of_route_id(route_id: &str) -> Option<ServiceKey> {
    let rest = route_id.strip_prefix(ROUTE_ID_PREFIX)?;
    let (instance, service) = rest.split_once('.')?;
    let valid = check_instance_name("instance", instance).is_ok()
        && check_dns_label("service", service).is_ok();
    valid.then(|| ServiceKey {
        instance: instance.into(),
        service: service.into(),
    })
}

/// Whether `value` can name a container to the runtime: a Docker ID (64 hex
/// digits) or a name [`container_name`] gives, or any other Docker name.
/// Such a value is one URL path segment that is never `.` or `..`, so it
/// cannot reach another endpoint of the runtime's API.
pub fn check_container_ref(field: &str, value: &str) -> Result<(), NameError> {
    let valid = (1..=CONTAINER_NAME_LEN_MAX).contains(&value.len())
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        let rule = NameRule::ContainerRef {
            len_max: CONTAINER_NAME_LEN_MAX,
        };
        Err(NameError::new(field, value, rule))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

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

    fn name(instance: &str, service: &str, revision: &str) -> Result<String, NameError> {
        container_name(&instance.into(), &service.into(), revision)
    }

    #[test]
    fn container_names_of_dashed_pairs_that_used_to_collide_differ() {
        let a = name("a-api", "web", "r1").unwrap();
        let b = name("a", "api-web", "r1").unwrap();
        assert_eq!(a, "stead.a-api.web.r1");
        assert_eq!(b, "stead.a.api-web.r1");
        assert_ne!(a, b);
        // The revision is no escape hatch: its dots come after the third.
        assert_ne!(
            name("a", "b", "c.d").unwrap(),
            name("a-b", "c", "d").unwrap()
        );
    }

    #[test]
    fn revisions_keep_docker_safe_bytes_and_escape_the_rest() {
        for (revision, encoded) in [
            ("1.2.3", "1.2.3"),
            ("v2-RC1", "v2-RC1"),
            ("1_2", "1_5f2"),
            ("1+build/7", "1_2bbuild_2f7"),
            ("caf\u{e9}", "caf_c3_a9"),
            ("../x", ".._2fx"),
        ] {
            assert_eq!(
                name("shop", "web", revision).unwrap(),
                format!("stead.shop.web.{encoded}"),
                "{revision:?}"
            );
        }
    }

    #[test]
    fn container_names_refuse_bad_parts_naming_them() {
        for (instance, service, revision, field) in [
            ("shop/../x", "web", "r1", "instance"),
            ("shop", "we.b", "r1", "service"),
            ("shop", "web", "", "revision"),
            ("shop", "web", &"9".repeat(REVISION_LEN_MAX + 1), "revision"),
        ] {
            let message = name(instance, service, revision).unwrap_err().to_string();
            assert!(message.starts_with(&format!("{field} = ")), "{message}");
        }
    }

    #[test]
    fn the_longest_container_name_is_within_its_bound_and_a_docker_name() {
        let longest = name(
            &"a".repeat(INSTANCE_NAME_LEN_MAX),
            &"b".repeat(LABEL_LEN_MAX),
            &"/".repeat(REVISION_LEN_MAX),
        )
        .unwrap();
        assert_eq!(longest.len(), CONTAINER_NAME_LEN_MAX);
        check_container_ref("name", &longest).unwrap();
    }

    #[test]
    fn container_refs_are_ids_or_names_never_paths() {
        for ok in ["4f0c", &"f".repeat(64), "stead.shop.web.1_2b2"] {
            check_container_ref("c", ok).unwrap();
        }
        for bad in ["", ".", "..", "../images", "a/b", "a b", "-a", "a?b", "a#b"] {
            assert!(check_container_ref("c", bad).is_err(), "{bad:?}");
        }
    }

    /// The inverse of [`container_name`]: that it exists proves the
    /// encoding injective.
    fn parse(name: &str) -> (String, String, String) {
        let rest = name.strip_prefix("stead.").expect("prefix");
        let mut parts = rest.splitn(3, '.');
        let instance = parts.next().expect("instance").to_owned();
        let service = parts.next().expect("service").to_owned();
        let encoded = parts.next().expect("revision").as_bytes();
        let mut revision = Vec::new();
        let mut i = 0;
        while i < encoded.len() {
            if encoded[i] == b'_' {
                let hex = std::str::from_utf8(&encoded[i + 1..i + 3]).expect("ascii");
                revision.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 3;
            } else {
                revision.push(encoded[i]);
                i += 1;
            }
        }
        let revision = String::from_utf8(revision).expect("utf-8");
        (instance, service, revision)
    }

    proptest! {
        #[test]
        fn container_names_decode_back_to_their_parts(
            instance in "[a-z0-9]([a-z0-9-]{0,51}[a-z0-9])?",
            service in "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
            revision in "\\PC{1,16}",
        ) {
            prop_assume!(revision.len() <= REVISION_LEN_MAX);
            let encoded = name(&instance, &service, &revision).unwrap();
            prop_assert!(check_container_ref("name", &encoded).is_ok(), "{}", encoded);
            prop_assert_eq!(parse(&encoded), (instance, service, revision));
        }
    }
}
