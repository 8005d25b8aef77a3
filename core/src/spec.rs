//! What a service should look like: the catalog's description of one
//! workload, as the provisioner creates it and the probes verify it.
//! Plain data; loading and validation live in `core::catalog`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::domains::{DomainTemplate, ServiceHosts};
use super::release::{render, ReleaseParams, TemplateError};
use super::types::ServiceName;

/// How to decide a backend is ready to take traffic.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ReadinessProbe {
    /// No probe: readiness is assumed once the container runs.
    None,
    /// An HTTP GET on the bind of `port` must answer 2xx or 3xx.
    Http {
        port: u16,
        path: String,
        timeout: Duration,
        interval: Duration,
        attempts_max: u32,
    },
    /// A TCP connect to the bind of `port` must succeed.
    Tcp {
        port: u16,
        timeout: Duration,
        interval: Duration,
        attempts_max: u32,
    },
    /// A line containing `pattern` (a plain substring) must appear in the
    /// logs (stdout or stderr) of the probed execution, within `timeout`.
    /// Lines of the container's earlier executions never count.
    Log { pattern: String, timeout: Duration },
}

/// A container-level healthcheck, run by the runtime itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Healthcheck {
    /// Argument vector run inside the container (never a shell string).
    pub command: Vec<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub retries: u32,
}

/// One workload of a catalog service type.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServiceSpec {
    pub name: ServiceName,
    pub image: String,
    /// Command override (argument vector); empty keeps the image's default.
    pub command: Vec<String>,
    /// Container ports published on loopback ephemeral host ports.
    pub ports: Vec<u16>,
    pub healthcheck: Option<Healthcheck>,
    pub readiness: ReadinessProbe,
    pub stop_grace: Duration,
    /// How an upgrade replaces the container. Not part of the digest: it
    /// says how to move between revisions, not what a revision runs, so
    /// changing it alone upgrades nothing.
    #[serde(skip)]
    pub update: UpdateStrategy,
    /// Public host names served over HTTPS when the daemon's `[caddy.tls]`
    /// is on (#43). Not part of the digest either: where a service is
    /// published changes no container.
    #[serde(skip)]
    pub domains: Vec<DomainTemplate>,
    /// `tenant_domains = true` (#54): also served under the host names its
    /// instance's creator gave (`instance create --domain`), each within
    /// the team's `domain_suffixes`. At most one service of a type.
    #[serde(skip)]
    pub tenant_domains: bool,
    /// Environment, secrets, storage, limits and networks (boxed: most
    /// specs are copied far more often than this is read).
    pub run: Box<RunSpec>,
}

/// How an upgrade replaces a service's container (#40).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UpdateStrategy {
    /// The successor starts, is verified and serves before the
    /// predecessor stops: no gap, but for a moment two containers run on
    /// the service's volumes.
    #[default]
    Overlap,
    /// The predecessor is withdrawn and stopped before the successor is
    /// created: a gap, but never two containers on one data directory
    /// (the catalog's default for a service with a named volume).
    StopFirst,
}

impl UpdateStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overlap => "overlap",
            Self::StopFirst => "stop-first",
        }
    }
}

/// How a service runs beyond its image and command: what a real
/// application needs (environment, secrets, storage, limits, networks).
/// Everything here is the catalog's; the runtime applies it at creation.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunSpec {
    /// Plain environment. Values are templates (`core::release::render`),
    /// rendered per instance by [`RunSpec::render_env`].
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are secrets: resolved by the
    /// runtime when it creates the container, never stored or shown.
    pub secrets: Vec<SecretEnv>,
    pub mounts: Vec<Mount>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU limit in billionths of a CPU (`1.5` CPUs is 1.5e9).
    pub nano_cpus: Option<u64>,
    /// `user` or `user:group`, as the runtime takes it; `None` keeps the
    /// image's.
    pub user: Option<String>,
    /// Entrypoint override (argument vector); empty keeps the image's.
    pub entrypoint: Vec<String>,
    /// Extra labels; stead's own (`stead.*`) are refused by the catalog.
    pub labels: BTreeMap<String, String>,
    /// Existing networks to join besides the instance's own network, each
    /// granted by `[grants] networks`.
    pub networks: Vec<String>,
    /// Capabilities added back to the runtime's set after `[docker]
    /// cap_drop` (each granted by `[grants] capabilities`). Left out of the
    /// digest when empty, so a type that adds none keeps the digest it had
    /// before the field existed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
    /// Whether the container joins its instance's own network, where the
    /// instance's services reach each other by service name. Set for every
    /// service of a type with more than one (a lone service has no peer,
    /// and each network takes one of the runtime's address pools).
    pub instance_network: bool,
}

/// One secret environment variable and where its value comes from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SecretEnv {
    /// The variable's name inside the container.
    pub env: String,
    pub source: SecretSource,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum SecretSource {
    /// The contents of a file on the daemon's host (one trailing newline
    /// dropped, as `echo secret > file` writes one).
    File(String),
    /// A variable of the daemon's own environment.
    DaemonEnv(String),
}

impl SecretSource {
    /// Where the value comes from, for errors (never the value).
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => format!("file {path:?}"),
            Self::DaemonEnv(name) => format!("the daemon's environment variable {name}"),
        }
    }
}

/// Storage mounted into a container.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Mount {
    pub source: MountSource,
    /// Absolute path inside the container.
    pub target: String,
    pub read_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum MountSource {
    /// A named volume of this instance and service, created on first use
    /// and kept across upgrades, reprovisions and recoveries; removed only
    /// by `stead instance delete --purge-volumes`.
    Volume(String),
    /// A host path, allowed only under a prefix the catalog lists.
    HostPath(String),
}

impl ServiceSpec {
    /// Its public host names as the catalog gives them (#43, #54).
    pub fn hosts(&self) -> ServiceHosts {
        ServiceHosts {
            templates: self.domains.clone(),
            takes_given: self.tenant_domains,
        }
    }

    /// A digest of everything the catalog says about the service: two
    /// specs share it exactly when they are equal.
    pub fn digest(&self) -> String {
        digest_of(self)
    }

    /// The revision a container of this spec runs at `version`: a change
    /// of the spec (not only of the version) gives the successor another
    /// revision, so an upgrade replaces it (C11).
    pub fn revision(&self, version: &str) -> String {
        format!("{version}.{}", &self.digest()[..REVISION_DIGEST_LEN])
    }
}

/// Hex digits of a spec's digest a revision carries: 32 bits, for a
/// handful of specs per service, never compared across services.
pub(crate) const REVISION_DIGEST_LEN: usize = 8;

/// SHA-256 of the value's JSON form, in hex. The JSON of these types is
/// canonical: fields in declaration order, maps in key order.
pub(crate) fn digest_of(value: &impl serde::Serialize) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(value).expect("catalog data always serialises");
    sha2::Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl RunSpec {
    /// The plain environment rendered for one instance, in name order.
    pub fn render_env(
        &self,
        service: &ServiceName,
        params: &ReleaseParams,
    ) -> Result<Vec<(String, String)>, TemplateError> {
        self.env
            .iter()
            .map(|(name, template)| {
                let field = format!("services.{service}.env.{name}");
                Ok((name.clone(), render(&field, template, params)?))
            })
            .collect()
    }

    /// The named volumes this service mounts.
    pub fn volumes(&self) -> impl Iterator<Item = &str> {
        self.mounts.iter().filter_map(|m| match &m.source {
            MountSource::Volume(name) => Some(name.as_str()),
            MountSource::HostPath(_) => None,
        })
    }
}
