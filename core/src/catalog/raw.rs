//! The catalog file as written: what serde reads before it is checked.
//!
//! Numbers are read as i64 so that a negative or huge value reaches the
//! validator, which names field and value, instead of failing inside serde.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCatalog {
    /// Moved to `stead.toml`'s `[grants]`: read, of any type, only to say so.
    pub(super) host_path_prefixes: Option<toml::Value>,
    #[serde(default)]
    pub(super) types: BTreeMap<String, RawType>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawType {
    pub(super) version: String,
    #[serde(default)]
    pub(super) security: bool,
    pub(super) rollout: Option<String>,
    pub(super) bake_ms: Option<i64>,
    /// `docker` (the default) or `helm`.
    pub(super) provisioner: Option<String>,
    pub(super) helm: Option<RawHelm>,
    #[serde(default)]
    pub(super) parameters: BTreeMap<String, RawParameter>,
    #[serde(default)]
    pub(super) services: Vec<RawService>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawParameter {
    pub(super) default: Option<String>,
    /// For operators reading the catalog; stead does not use it.
    #[allow(dead_code)]
    pub(super) description: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHelm {
    pub(super) chart: String,
    pub(super) chart_version: Option<String>,
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) values: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawService {
    pub(super) name: String,
    pub(super) image: String,
    #[serde(default)]
    pub(super) command: Vec<String>,
    #[serde(default)]
    pub(super) ports: Vec<i64>,
    pub(super) healthcheck: Option<RawHealthcheck>,
    pub(super) readiness: Option<RawReadiness>,
    pub(super) stop_grace_ms: Option<i64>,
    pub(super) update: Option<String>,
    #[serde(default)]
    pub(super) entrypoint: Vec<String>,
    pub(super) user: Option<String>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) secrets: Vec<RawSecret>,
    #[serde(default)]
    pub(super) volumes: Vec<RawVolume>,
    pub(super) memory_mb: Option<i64>,
    pub(super) cpus: Option<f64>,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) networks: Vec<String>,
    #[serde(default)]
    pub(super) cap_add: Vec<String>,
    #[serde(default)]
    pub(super) domains: Vec<String>,
    #[serde(default)]
    pub(super) tenant_domains: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    pub(super) env: String,
    pub(super) file: Option<String>,
    pub(super) from_env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVolume {
    pub(super) name: Option<String>,
    pub(super) host_path: Option<String>,
    pub(super) path: String,
    #[serde(default)]
    pub(super) read_only: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealthcheck {
    pub(super) command: Vec<String>,
    pub(super) interval_ms: Option<i64>,
    pub(super) timeout_ms: Option<i64>,
    pub(super) retries: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReadiness {
    pub(super) kind: String,
    pub(super) port: Option<i64>,
    pub(super) path: Option<String>,
    /// Kind `log` only: the substring a line must contain.
    pub(super) pattern: Option<String>,
    pub(super) timeout_ms: Option<i64>,
    pub(super) interval_ms: Option<i64>,
    pub(super) attempts_max: Option<i64>,
}
