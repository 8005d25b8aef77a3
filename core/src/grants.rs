//! What the operator lets a catalog give a container: host directories a
//! service may bind-mount, directories its secret files may be read from,
//! daemon environment variables a secret may take, existing runtime
//! networks a service may join and Linux capabilities it may add back
//! (every container drops `NET_RAW` and whatever else `[docker] cap_drop`
//! names); and, from `[limits]`, the most memory it may give one
//! ([`ContainerLimits`]). For Helm types (#54, [`helm`]): the charts a
//! catalog may install, the prefix every namespace they render begins
//! with, and the Pod Security level of the namespaces stead creates.
//!
//! Whoever edits the catalog decides what runs; whoever writes `stead.toml`
//! decides what of the host those containers may reach. A catalog asking
//! for more than these grants is refused when it is loaded
//! ([`Catalog::from_toml`](super::catalog::Catalog::from_toml)), naming the
//! catalog's field and the grant it lacks. The daemon's config validates
//! each entry once, through [`Grants::new`], and passes the value in; this
//! module reads nothing itself.

use std::collections::BTreeSet;

use super::catalog::{is_clean_absolute, is_env_name, quote};
use super::limits::ContainerLimits;

mod helm;

pub use helm::{chart_reference_rule, literal_head, PodSecurity, CHART_REFERENCE_LEN_MAX};

/// Most entries in each grant list.
pub const GRANT_ENTRIES_MAX: usize = 64;

/// The prefix of every variable stead itself reads (`STEAD_DATABASE_URL`,
/// `STEAD_CONFIG`, every config override).
pub(crate) const RESERVED_ENV_PREFIX: &str = "STEAD_";
/// Variables stead uses besides its own prefix: the kubeconfig helm is
/// given. Never passable to a container, whatever `stead.toml` says.
pub(crate) const RESERVED_ENV_NAMES: &[&str] = &["KUBECONFIG"];

/// Whether `name` is a variable stead itself uses, which no container may
/// take.
pub fn is_reserved_env(name: &str) -> bool {
    name.starts_with(RESERVED_ENV_PREFIX) || RESERVED_ENV_NAMES.contains(&name)
}

/// Why a reserved variable is refused, wherever it is asked for.
pub(crate) fn reserved_env_reason() -> String {
    format!(
        "is a variable stead itself uses ({RESERVED_ENV_PREFIX}* and {} are never passed to a \
         container)",
        RESERVED_ENV_NAMES.join(", ")
    )
}

/// Which grant a catalog field needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// `volumes.host_path` lies under one of `host_path_prefixes`.
    HostPath,
    /// A secret's `file` lies inside one of `secret_dirs`.
    SecretFile,
    /// A secret's `from_env` is one of `env_passthrough`.
    DaemonEnv,
    /// An extra network the service joins is one of `networks`, by its
    /// exact name (never an ID or an ID's prefix, which would name another
    /// instance's network).
    Network,
    /// A capability the service adds back is one of `capabilities`.
    Capability,
    /// A Helm type's chart is one of `helm_charts`, or lies under one of
    /// its prefixes.
    HelmChart,
    /// A Helm type's namespace begins with `helm_namespace_prefix`, in
    /// every rendering.
    HelmNamespace,
}

impl Grant {
    /// The key under `[grants]` in `stead.toml`.
    pub fn key(self) -> &'static str {
        match self {
            Grant::HostPath => "host_path_prefixes",
            Grant::SecretFile => "secret_dirs",
            Grant::DaemonEnv => "env_passthrough",
            Grant::Network => "networks",
            Grant::Capability => "capabilities",
            Grant::HelmChart => "helm_charts",
            Grant::HelmNamespace => "helm_namespace_prefix",
        }
    }
}

/// A bad entry of a grant list: `field` is relative to `[grants]`
/// (`host_path_prefixes[0]`), `value` as errors quote it (a name or path
/// in quotes, a count bare); the daemon's config names the file or the
/// variable it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct GrantError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

/// The operator's grants, validated. Nothing is granted by default: no
/// host path, no Helm chart; the namespaces stead creates enforce the
/// `restricted` Pod Security Standard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Clean absolute directories other than `/`, each ending in '/'.
    host_path_prefixes: Vec<String>,
    /// Clean absolute directories other than `/`, each ending in '/'.
    secret_dirs: Vec<String>,
    /// Variable names, none of them stead's own.
    env_passthrough: BTreeSet<String>,
    /// Network names ([`is_joinable_network`]).
    networks: BTreeSet<String>,
    /// Capability names without `CAP_` ([`is_capability_name`]).
    capabilities: BTreeSet<String>,
    /// The operator's container limits: the catalog's `memory_mb` may not
    /// exceed their maximum.
    limits: ContainerLimits,
    /// Chart references ([`chart_reference_rule`]), a prefix ending in
    /// '/'.
    helm_charts: Vec<String>,
    /// Set whenever `helm_charts` is not empty.
    helm_namespace_prefix: Option<String>,
    helm_pod_security: PodSecurity,
}

impl Grants {
    /// Validates each list: at most [`GRANT_ENTRIES_MAX`] entries;
    /// directories clean, absolute and not `/` (a prefix check on them
    /// then means what it says); variable names well formed and never
    /// stead's own ([`is_reserved_env`]).
    pub fn new(
        host_path_prefixes: &[String],
        secret_dirs: &[String],
        env_passthrough: &[String],
    ) -> Result<Grants, GrantError> {
        let host_path_prefixes = directories(Grant::HostPath, host_path_prefixes)?;
        let secret_dirs = directories(Grant::SecretFile, secret_dirs)?;
        bounded(Grant::DaemonEnv, env_passthrough.len())?;
        for (i, name) in env_passthrough.iter().enumerate() {
            let reason = if !is_env_name(name) {
                "must be an environment variable's name (a letter or '_', then letters, digits \
                 or '_')"
                    .to_owned()
            } else if is_reserved_env(name) {
                reserved_env_reason()
            } else {
                continue;
            };
            return Err(GrantError {
                field: format!("{}[{i}]", Grant::DaemonEnv.key()),
                value: quote(name),
                reason,
            });
        }
        Ok(Grants {
            host_path_prefixes,
            secret_dirs,
            env_passthrough: env_passthrough.iter().cloned().collect(),
            networks: BTreeSet::new(),
            capabilities: BTreeSet::new(),
            limits: ContainerLimits::default(),
            helm_charts: Vec::new(),
            helm_namespace_prefix: None,
            helm_pod_security: PodSecurity::default(),
        })
    }

    /// These grants with the charts a Helm type may install and the
    /// prefix of every namespace it renders. Charts need a prefix: a Helm
    /// type installs into namespaces of the operator's choosing or not at
    /// all.
    pub fn with_helm(
        self,
        charts: &[String],
        namespace_prefix: Option<&str>,
    ) -> Result<Grants, GrantError> {
        bounded(Grant::HelmChart, charts.len())?;
        for (i, entry) in charts.iter().enumerate() {
            let reason = helm::chart_grant_rule(entry)
                .or_else(|| charts[..i].contains(entry).then(|| "listed twice".into()));
            if let Some(reason) = reason {
                return Err(GrantError {
                    field: format!("{}[{i}]", Grant::HelmChart.key()),
                    value: quote(entry),
                    reason,
                });
            }
        }
        if let Some(reason) = namespace_prefix.and_then(helm::namespace_prefix_rule) {
            return Err(GrantError {
                field: Grant::HelmNamespace.key().to_owned(),
                value: quote(namespace_prefix.unwrap_or_default()),
                reason,
            });
        }
        if !charts.is_empty() && namespace_prefix.is_none() {
            return Err(GrantError {
                field: Grant::HelmNamespace.key().to_owned(),
                value: "missing".to_owned(),
                reason: format!(
                    "required when {} grants a chart: every namespace a Helm type renders must \
                     begin with it (e.g. \"tenant-\")",
                    Grant::HelmChart.key()
                ),
            });
        }
        Ok(Grants {
            helm_charts: charts.to_vec(),
            helm_namespace_prefix: namespace_prefix.map(str::to_owned),
            ..self
        })
    }

    /// These grants with the Pod Security level of the namespaces stead
    /// creates for Helm releases.
    pub fn with_helm_pod_security(self, helm_pod_security: PodSecurity) -> Grants {
        Grants {
            helm_pod_security,
            ..self
        }
    }

    /// Whether a Helm type may install `chart`: a well-formed reference
    /// ([`chart_reference_rule`]) equal to a granted one or under a
    /// granted prefix.
    pub fn allows_helm_chart(&self, chart: &str) -> bool {
        chart_reference_rule(chart).is_none()
            && self
                .helm_charts
                .iter()
                .any(|entry| helm::chart_grant_matches(entry, chart))
    }

    /// The prefix every namespace of a Helm type begins with; `None`
    /// grants no namespace at all.
    pub fn helm_namespace_prefix(&self) -> Option<&str> {
        self.helm_namespace_prefix.as_deref()
    }

    /// The Pod Security level the namespaces of Helm releases enforce.
    pub fn helm_pod_security(&self) -> PodSecurity {
        self.helm_pod_security
    }

    /// These grants with the networks a catalog's `networks` may name.
    /// Each must be a network name stead does not own itself
    /// ([`is_joinable_network`]).
    pub fn with_networks(self, networks: &[String]) -> Result<Grants, GrantError> {
        let networks = names_checked(Grant::Network, networks, |name| {
            (!is_joinable_network(name)).then(joinable_network_rule)
        })?;
        Ok(Grants { networks, ..self })
    }

    /// These grants with the capabilities a catalog's `cap_add` may name.
    pub fn with_capabilities(self, capabilities: &[String]) -> Result<Grants, GrantError> {
        let capabilities = names_checked(Grant::Capability, capabilities, |name| {
            (!is_capability_name(name)).then(|| {
                format!(
                    "must be a capability's name as the runtime takes it: upper-case letters \
                     and '_', no CAP_ prefix, at most {CAPABILITY_LEN_MAX} bytes (e.g. NET_RAW)"
                )
            })
        })?;
        Ok(Grants {
            capabilities,
            ..self
        })
    }

    /// These grants with the operator's container limits in place of the
    /// defaults.
    pub fn with_limits(self, limits: ContainerLimits) -> Grants {
        Grants { limits, ..self }
    }

    /// The container limits a catalog is checked against.
    pub fn limits(&self) -> &ContainerLimits {
        &self.limits
    }

    /// Whether `path` (clean and absolute) is a granted directory or lies
    /// under one.
    pub fn allows_host_path(&self, path: &str) -> bool {
        is_clean_absolute(path)
            && self
                .host_path_prefixes
                .iter()
                .any(|prefix| format!("{path}/").starts_with(prefix.as_str()))
    }

    /// Whether `path` (clean and absolute) lies inside a granted secret
    /// directory.
    pub fn allows_secret_file(&self, path: &str) -> bool {
        is_clean_absolute(path)
            && self
                .secret_dirs
                .iter()
                .any(|dir| path.starts_with(dir.as_str()))
    }

    /// Whether a service may join the existing network `name`.
    pub fn allows_network(&self, name: &str) -> bool {
        self.networks.contains(name)
    }

    /// Whether a service may add the capability `name` back.
    pub fn allows_capability(&self, name: &str) -> bool {
        self.capabilities.contains(name)
    }

    /// Whether a secret may take the daemon's variable `name`.
    pub fn passes_env(&self, name: &str) -> bool {
        !is_reserved_env(name) && self.env_passthrough.contains(name)
    }

    /// What `grant` lists, for an error message: directories with their
    /// trailing '/', variables by name.
    pub fn granted(&self, grant: Grant) -> Vec<String> {
        match grant {
            Grant::HostPath => self.host_path_prefixes.clone(),
            Grant::SecretFile => self.secret_dirs.clone(),
            Grant::DaemonEnv => self.env_passthrough.iter().cloned().collect(),
            Grant::Network => self.networks.iter().cloned().collect(),
            Grant::Capability => self.capabilities.iter().cloned().collect(),
            Grant::HelmChart => self.helm_charts.clone(),
            Grant::HelmNamespace => self.helm_namespace_prefix.iter().map(quote).collect(),
        }
    }
}

/// The capabilities every container drops unless `[docker] cap_drop`
/// says otherwise: without `NET_RAW` a container cannot forge packets on
/// its bridge (ARP spoofing its neighbours' traffic).
pub const CAP_DROP_DEFAULT: &[&str] = &["NET_RAW"];

/// Where a service without peers runs (`[docker] isolation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// On one shared network with inter-container traffic off, checked
    /// on the engine.
    #[default]
    Shared,
    /// On the engine's default network, where containers reach each other:
    /// for an engine that cannot wall them (Podman 4's compatible API),
    /// chosen knowingly.
    Off,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Off => "off",
        }
    }
}

/// Longest capability name (the longest Linux has is 18 bytes).
pub const CAPABILITY_LEN_MAX: usize = 32;

/// A capability as Docker's `CapAdd`/`CapDrop` take it: `NET_RAW`, never
/// `CAP_NET_RAW` (one spelling, so a grant and a request compare equal).
pub fn is_capability_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= CAPABILITY_LEN_MAX
        && !name.starts_with("CAP_")
        && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// The prefix of every network stead creates itself: the instance
/// networks `stead.<instance>` and the shared `stead_isolated`.
pub const STEAD_NETWORK_PREFIX: &str = "stead";

/// Whether a catalog may be granted the network `name`: a runtime object
/// name that is none of the host's special networks and none of stead's
/// own (an instance network would put a service beside another
/// instance's).
pub fn is_joinable_network(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && name.len() <= super::names::LABEL_LEN_MAX
        && !matches!(name, "host" | "none" | "bridge" | "default")
        && !name.starts_with(STEAD_NETWORK_PREFIX)
}

/// Why a network is not joinable, wherever it is asked for.
pub(crate) fn joinable_network_rule() -> String {
    format!(
        "must be an existing network's name (letters, digits, '_', '.', '-'; at most {} bytes), \
         not host, none, bridge or default, and not one of stead's own \
         ({STEAD_NETWORK_PREFIX}*: every instance has its own)",
        super::names::LABEL_LEN_MAX
    )
}

/// A list of names: bounded, each passing `refuse` (which says why not),
/// each once.
fn names_checked(
    grant: Grant,
    raw: &[String],
    refuse: impl Fn(&str) -> Option<String>,
) -> Result<BTreeSet<String>, GrantError> {
    bounded(grant, raw.len())?;
    let mut names = BTreeSet::new();
    for (i, name) in raw.iter().enumerate() {
        let reason = refuse(name).or_else(|| names.contains(name).then(|| "listed twice".into()));
        if let Some(reason) = reason {
            return Err(GrantError {
                field: format!("{}[{i}]", grant.key()),
                value: quote(name),
                reason,
            });
        }
        names.insert(name.clone());
    }
    Ok(names)
}

fn bounded(grant: Grant, len: usize) -> Result<(), GrantError> {
    if len > GRANT_ENTRIES_MAX {
        return Err(GrantError {
            field: grant.key().to_owned(),
            value: quote(len),
            reason: format!("at most {GRANT_ENTRIES_MAX} entries"),
        });
    }
    Ok(())
}

fn directories(grant: Grant, raw: &[String]) -> Result<Vec<String>, GrantError> {
    bounded(grant, raw.len())?;
    raw.iter()
        .enumerate()
        .map(|(i, dir)| {
            if !is_clean_absolute(dir) || dir == "/" {
                return Err(GrantError {
                    field: format!("{}[{i}]", grant.key()),
                    value: quote(dir),
                    reason: "must be an absolute directory other than / with no '.', '..' or \
                             empty component"
                        .to_owned(),
                });
            }
            Ok(format!("{dir}/"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn nothing_is_granted_by_default() {
        let none = Grants::default();
        assert!(!none.allows_host_path("/srv/stead/x"));
        assert!(!none.allows_secret_file("/etc/stead/secrets/x"));
        assert!(!none.passes_env("NOTES_DB_PASSWORD"));
    }

    #[test]
    fn a_prefix_grants_itself_and_what_lies_under_it_not_its_neighbours() {
        let grants = Grants::new(&list(&["/srv/stead"]), &list(&["/etc/s"]), &[]).unwrap();
        assert!(grants.allows_host_path("/srv/stead"));
        assert!(grants.allows_host_path("/srv/stead/notes"));
        assert!(!grants.allows_host_path("/srv/steady"));
        assert!(!grants.allows_host_path("/srv/stead/../../etc"));
        assert!(grants.allows_secret_file("/etc/s/db"));
        assert!(!grants.allows_secret_file("/etc/s"));
        assert!(!grants.allows_secret_file("/etc/s/../shadow"));
        assert!(!grants.allows_secret_file("/etc/secrets"));
    }

    #[test]
    fn stead_own_variables_are_never_granted() {
        for name in ["STEAD_DATABASE_URL", "KUBECONFIG"] {
            let error = Grants::new(&[], &[], &list(&["OK", name])).unwrap_err();
            assert_eq!(error.field, "env_passthrough[1]");
            assert_eq!(error.value, format!("{name:?}"));
        }
    }

    #[test]
    fn networks_are_granted_by_exact_name_and_never_steads_own() {
        let grants = Grants::default()
            .with_networks(&list(&["shared-db"]))
            .unwrap();
        assert!(grants.allows_network("shared-db"));
        assert!(!grants.allows_network("shared"));
        assert!(!grants.allows_network("shared-db2"));
        for name in ["stead.notes", "stead_isolated", "host", "bridge", "a b", ""] {
            let error = Grants::default()
                .with_networks(&list(&["ok", name]))
                .unwrap_err();
            assert_eq!(error.field, "networks[1]", "{name}");
            assert_eq!(error.value, format!("{name:?}"));
        }
    }

    #[test]
    fn capabilities_are_granted_in_the_runtimes_spelling() {
        let grants = Grants::default()
            .with_capabilities(&list(&["NET_RAW"]))
            .unwrap();
        assert!(grants.allows_capability("NET_RAW"));
        assert!(!grants.allows_capability("NET_ADMIN"));
        for name in ["CAP_NET_RAW", "net_raw", "NET-RAW", "NET_RAW"] {
            let error = Grants::default()
                .with_capabilities(&list(&["NET_RAW", name]))
                .unwrap_err();
            assert_eq!(error.field, "capabilities[1]", "{name}");
        }
    }

    #[test]
    fn no_chart_is_granted_by_default_and_granted_charts_need_a_namespace_prefix() {
        assert!(!Grants::default().allows_helm_chart("bitnami/postgresql"));
        assert_eq!(Grants::default().helm_namespace_prefix(), None);
        assert_eq!(
            Grants::default().helm_pod_security(),
            PodSecurity::Restricted
        );
        let error = Grants::default()
            .with_helm(&list(&["bitnami/"]), None)
            .unwrap_err();
        assert_eq!(error.field, "helm_namespace_prefix");
        assert!(error.reason.contains("required"), "{error}");
        let grants = Grants::default()
            .with_helm(
                &list(&["oci://registry.example/charts/", "bitnami/postgresql"]),
                Some("tenant-"),
            )
            .unwrap();
        assert!(grants.allows_helm_chart("oci://registry.example/charts/shop"));
        assert!(!grants.allows_helm_chart("oci://registry.example/charts-evil/shop"));
        assert!(!grants.allows_helm_chart("oci://registry.example/charts/../evil/x"));
        assert!(grants.allows_helm_chart("bitnami/postgresql"));
        assert!(!grants.allows_helm_chart("bitnami/redis"));
        assert_eq!(grants.helm_namespace_prefix(), Some("tenant-"));
    }

    #[test]
    fn bad_helm_grants_name_their_entry() {
        let charts = |entries: &[&str]| Grants::default().with_helm(&list(entries), Some("t-"));
        for (entries, field) in [
            (&["ok/", "/"][..], "helm_charts[1]"),
            (&["ok/", "./charts/"][..], "helm_charts[1]"),
            (&["ok/", "oci://"][..], "helm_charts[1]"),
            (&["ok/", "ok/"][..], "helm_charts[1]"),
        ] {
            assert_eq!(charts(entries).unwrap_err().field, field, "{entries:?}");
        }
        for prefix in ["Tenant-", "kube-", "", "t_"] {
            let error = Grants::default()
                .with_helm(&list(&["ok/"]), Some(prefix))
                .unwrap_err();
            assert_eq!(error.field, "helm_namespace_prefix", "{prefix}");
            assert_eq!(error.value, format!("{prefix:?}"));
        }
    }

    #[test]
    fn root_and_unclean_directories_are_refused() {
        for dir in ["/", "relative", "/a/../b", "/a/", "/a//b"] {
            let error = Grants::new(&[], &list(&["/ok", dir]), &[]).unwrap_err();
            assert_eq!(error.field, "secret_dirs[1]", "{dir}");
        }
        let many: Vec<String> = (0..=GRANT_ENTRIES_MAX).map(|i| format!("/d{i}")).collect();
        let error = Grants::new(&many, &[], &[]).unwrap_err();
        assert_eq!(error.field, "host_path_prefixes");
    }
}
