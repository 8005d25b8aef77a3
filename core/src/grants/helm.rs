//! What the operator lets a Helm type install, and where (#54): the charts
//! a catalog may name (`[grants] helm_charts`), the prefix every namespace
//! a Helm type renders must begin with (`helm_namespace_prefix`) and the
//! Pod Security level stead's namespaces enforce (`helm_pod_security`).
//!
//! A chart grant is either an exact chart reference (`bitnami/postgresql`,
//! `oci://registry.example/charts/shop`) or, ending in '/', a prefix every
//! chart under it matches (`oci://registry.example/charts/`,
//! `https://charts.example/`, `/srv/charts/`). A prefix matches only what
//! lies under it: `oci://registry.example/charts/` does not grant
//! `oci://registry.example/charts-evil/x`. Chart references with '.',
//! '..' or empty segments, or with characters a URL could smuggle a
//! different path in (`%`, `?`, `#`, `\`), are refused outright, so a
//! prefix check on them means what it says.

use super::super::catalog::is_clean_absolute;
use super::super::names::LABEL_LEN_MAX;

/// Longest chart reference, in a grant or a catalog.
pub const CHART_REFERENCE_LEN_MAX: usize = 256;

/// The namespace prefix no grant may give: every namespace under it is
/// one of Kubernetes' own.
const SYSTEM_NAMESPACE_PREFIX: &str = "kube-";

/// The Pod Security Standard a namespace stead creates for a Helm release
/// enforces (the `pod-security.kubernetes.io/enforce` label, warned and
/// audited at the same level).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSecurity {
    /// The hardened standard: no root, no privilege escalation, dropped
    /// capabilities, a seccomp profile.
    #[default]
    Restricted,
    /// Prevents known privilege escalations, no more.
    Baseline,
    /// Unrestricted: a release's pods may do anything the node allows.
    /// Only ever by the operator's explicit grant.
    Privileged,
}

impl PodSecurity {
    /// The label's value, as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restricted => "restricted",
            Self::Baseline => "baseline",
            Self::Privileged => "privileged",
        }
    }

    pub fn parse(word: &str) -> Option<PodSecurity> {
        [Self::Restricted, Self::Baseline, Self::Privileged]
            .into_iter()
            .find(|level| level.as_str() == word)
    }

    /// The labels a namespace at this level carries: enforced, and warned
    /// and audited alike, each against the latest version of the standard.
    pub fn namespace_labels(self) -> [(&'static str, &'static str); 6] {
        let level = self.as_str();
        [
            ("pod-security.kubernetes.io/enforce", level),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/warn", level),
            ("pod-security.kubernetes.io/warn-version", "latest"),
            ("pod-security.kubernetes.io/audit", level),
            ("pod-security.kubernetes.io/audit-version", "latest"),
        ]
    }
}

/// Why `chart` is not a chart reference stead passes to helm, if it is
/// not: a local chart must be a clean absolute path; a repository chart
/// (`repo/chart`) or URL (`oci://…`, `https://…`) must have no '.', '..'
/// or empty segment and none of `%`, `?`, `#`, `\`, whitespace or control
/// characters.
pub fn chart_reference_rule(chart: &str) -> Option<String> {
    if chart.is_empty()
        || chart.len() > CHART_REFERENCE_LEN_MAX
        || chart.starts_with('-')
        || chart
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '%' | '?' | '#' | '\\'))
    {
        return Some(format!(
            "must be 1 to {CHART_REFERENCE_LEN_MAX} bytes, not start with '-', and hold no \
             whitespace, control characters, '%', '?', '#' or '\\'"
        ));
    }
    if chart.starts_with('/') || chart.starts_with('.') {
        return (!is_clean_absolute(chart)).then(|| {
            "a local chart must be a clean absolute path (no relative path, no '.', '..' or \
             empty component)"
                .to_owned()
        });
    }
    let path = match chart.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() => rest,
        Some(_) => return Some("a URL needs a scheme before '://'".to_owned()),
        None => chart,
    };
    path.split('/')
        .any(|segment| matches!(segment, "" | "." | ".."))
        .then(|| "must have no '.', '..' or empty path segment".to_owned())
}

/// Why `entry` is not a chart grant, if it is not: an exact chart
/// reference, or one followed by '/' (a prefix), never `/` alone nor a
/// bare scheme.
pub(super) fn chart_grant_rule(entry: &str) -> Option<String> {
    let body = entry.strip_suffix('/').unwrap_or(entry);
    if body.is_empty() || body.ends_with(":/") {
        return Some(
            "must name a repository, registry path or directory, not / or a bare scheme (e.g. \
             oci://registry.example/charts/)"
                .to_owned(),
        );
    }
    chart_reference_rule(body)
}

/// Whether the chart grant `entry` (validated) grants `chart`: equal to
/// it, or, for a prefix ending in '/', with `chart` lying under it.
pub(super) fn chart_grant_matches(entry: &str, chart: &str) -> bool {
    if entry.ends_with('/') {
        chart.len() > entry.len() && chart.starts_with(entry)
    } else {
        chart == entry
    }
}

/// Why `prefix` is not a namespace prefix, if it is not: the start of a
/// DNS label (lower-case letters, digits and '-', beginning with a letter
/// or digit), at most a label long, and not Kubernetes' own `kube-`.
pub(super) fn namespace_prefix_rule(prefix: &str) -> Option<String> {
    let well_formed = prefix.len() <= LABEL_LEN_MAX
        && prefix
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !well_formed {
        return Some(format!(
            "must be the start of a DNS label: 1 to {LABEL_LEN_MAX} bytes of a-z, 0-9 and '-', \
             beginning with a letter or digit (e.g. tenant-)"
        ));
    }
    prefix
        .starts_with(SYSTEM_NAMESPACE_PREFIX)
        .then(|| format!("{SYSTEM_NAMESPACE_PREFIX}* are Kubernetes' own namespaces"))
}

/// The literal text a template renders before its first placeholder
/// (`{{` and `}}` read as braces): what every rendering begins with.
pub fn literal_head(template: &str) -> String {
    let mut head = String::new();
    let mut rest = template;
    loop {
        if let Some(after) = rest.strip_prefix("{{") {
            head.push('{');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("}}") {
            head.push('}');
            rest = after;
        } else {
            match rest.chars().next() {
                None | Some('{') => return head,
                Some(c) => {
                    head.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_references_with_dot_segments_or_url_tricks_are_refused() {
        for chart in [
            "bitnami/postgresql",
            "oci://registry.example/charts/shop",
            "https://charts.example/shop-1.0.0.tgz",
            "/srv/charts/shop",
            "/srv/charts/shop-1.0.0.tgz",
        ] {
            assert_eq!(chart_reference_rule(chart), None, "{chart}");
        }
        for chart in [
            "",
            "-x",
            "./shop",
            "../shop",
            "charts/../evil",
            "/srv/charts/../evil",
            "/srv//charts",
            "oci://registry.example//charts",
            "oci://registry.example/charts/./x",
            "https://charts.example/%2e%2e/x",
            "https://charts.example/x?y",
            "https://charts.example/x#y",
            "://x",
            "a b",
        ] {
            assert!(chart_reference_rule(chart).is_some(), "{chart:?}");
        }
    }

    #[test]
    fn a_chart_prefix_grants_what_lies_under_it_and_not_its_neighbours() {
        let prefix = "oci://registry.example/charts/";
        assert!(chart_grant_matches(
            prefix,
            "oci://registry.example/charts/shop"
        ));
        assert!(!chart_grant_matches(
            prefix,
            "oci://registry.example/charts-evil/shop"
        ));
        assert!(!chart_grant_matches(
            prefix,
            "oci://registry.example/charts-evil"
        ));
        assert!(!chart_grant_matches(
            prefix,
            "oci://registry.example/charts/"
        ));
        assert!(!chart_grant_matches(
            prefix,
            "oci://registry.example/charts"
        ));
        let exact = "bitnami/postgresql";
        assert!(chart_grant_matches(exact, "bitnami/postgresql"));
        assert!(!chart_grant_matches(exact, "bitnami/postgresql-ha"));
        assert!(!chart_grant_matches(exact, "bitnami/postgresql/x"));
    }

    #[test]
    fn chart_grants_name_a_repository_path_or_directory() {
        for entry in [
            "bitnami/",
            "bitnami/postgresql",
            "oci://registry.example/charts/",
            "https://charts.example/",
            "/srv/charts/",
        ] {
            assert_eq!(chart_grant_rule(entry), None, "{entry}");
        }
        for entry in [
            "",
            "/",
            "oci://",
            "https://",
            "./charts/",
            "/srv/../x/",
            "a//",
        ] {
            assert!(chart_grant_rule(entry).is_some(), "{entry:?}");
        }
    }

    #[test]
    fn namespace_prefixes_are_the_start_of_a_dns_label_and_never_kubes() {
        for prefix in ["tenant-", "t", "shop1-", "0-"] {
            assert_eq!(namespace_prefix_rule(prefix), None, "{prefix}");
        }
        for prefix in ["", "-t", "Tenant-", "t_", "t.", "kube-", "kube-tenants-"] {
            assert!(namespace_prefix_rule(prefix).is_some(), "{prefix:?}");
        }
        assert!(namespace_prefix_rule(&"a".repeat(LABEL_LEN_MAX + 1)).is_some());
    }

    #[test]
    fn the_literal_head_stops_at_the_first_placeholder() {
        assert_eq!(literal_head("tenant-{instance}"), "tenant-");
        assert_eq!(literal_head("{instance}"), "");
        assert_eq!(literal_head("plain"), "plain");
        assert_eq!(literal_head("a{{b}}-{team}"), "a{b}-");
    }

    #[test]
    fn pod_security_levels_read_as_kubernetes_spells_them() {
        assert_eq!(PodSecurity::default(), PodSecurity::Restricted);
        for level in ["restricted", "baseline", "privileged"] {
            assert_eq!(PodSecurity::parse(level).unwrap().as_str(), level);
        }
        assert_eq!(PodSecurity::parse("Restricted"), None);
        let labels = PodSecurity::Baseline.namespace_labels();
        assert!(labels.contains(&("pod-security.kubernetes.io/enforce", "baseline")));
    }
}
