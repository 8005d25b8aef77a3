//! The checks of what a container runs with: environment, secrets, mounts,
//! resources, labels and networks.

use std::collections::BTreeMap;

use super::raw::{RawSecret, RawService, RawVolume};
use super::{
    sample_parameters, CatalogError, Checker, Parameter, ARG_LEN_MAX, IMAGE_LEN_MAX,
    VERSION_LEN_MAX,
};
use crate::grants::{
    is_capability_name, is_joinable_network, is_reserved_env, joinable_network_rule,
    reserved_env_reason, Grant,
};
use crate::limits::MIB;
use crate::names;
use crate::release::{render, ReleaseParams};
use crate::spec::{Mount, MountSource, RunSpec, SecretEnv, SecretSource};

/// Most plain or secret environment variables of one service.
pub const ENV_MAX: usize = 128;
/// Longest environment variable name, and the longest plain value.
pub(crate) const ENV_NAME_LEN_MAX: usize = 256;
pub(crate) const ENV_VALUE_LEN_MAX: usize = 32 * 1024;
/// Most mounts, extra labels and extra networks of one service.
pub(crate) const MOUNTS_MAX: usize = 32;
pub(crate) const LABELS_MAX: usize = 64;
pub(crate) const NETWORKS_MAX: usize = 8;
/// Most capabilities one service adds back.
pub(crate) const CAP_ADD_MAX: usize = 16;
/// The bounds of `memory_mb` and `cpus`.
pub(crate) const MEMORY_MB_MIN: i64 = 6;
pub(crate) const MEMORY_MB_MAX: i64 = 1 << 20;
pub(crate) const CPUS_MIN: f64 = 0.01;
pub(crate) const CPUS_MAX: f64 = 1024.0;
/// Longest path (mount target, host path, secret file).
pub(crate) const PATH_LEN_MAX: usize = 1024;
/// The label prefix stead's own labels use; the catalog may not set it.
pub(crate) const RESERVED_LABEL_PREFIX: &str = "stead.";

pub(crate) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && name.len() <= ENV_NAME_LEN_MAX
}

/// A runtime object name as Docker accepts it: `[a-zA-Z0-9][a-zA-Z0-9_.-]*`.
fn is_object_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && name.len() <= names::LABEL_LEN_MAX
}

/// An absolute path with no empty, `.` or `..` component (so a prefix
/// check on it means what it says).
pub(crate) fn is_clean_absolute(path: &str) -> bool {
    path.len() <= PATH_LEN_MAX
        && !path.chars().any(char::is_control)
        && path.strip_prefix('/').is_some_and(|rest| {
            rest.is_empty() || rest.split('/').all(|c| !matches!(c, "" | "." | ".."))
        })
}

impl Checker<'_> {
    pub(super) fn run(
        &self,
        at: &str,
        raw: &RawService,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<RunSpec, CatalogError> {
        self.argv(&format!("{at}.entrypoint"), &raw.entrypoint, false)?;
        if let Some(user) = &raw.user {
            let ok = !user.is_empty()
                && user.len() <= VERSION_LEN_MAX
                && user.split(':').count() <= 2
                && user.split(':').all(is_object_name);
            if !ok {
                return Err(self.invalid(
                    format!("{at}.user"),
                    user,
                    "must be a user or user:group (letters, digits, '_', '.', '-')",
                ));
            }
        }
        if raw.env.len() + raw.secrets.len() > ENV_MAX {
            return Err(self.invalid(
                format!("{at}.env"),
                raw.env.len() + raw.secrets.len(),
                format!("at most {ENV_MAX} environment variables, plain and secret together"),
            ));
        }
        self.env(at, raw, parameters)?;
        let secrets = self.secrets(at, raw)?;
        let mounts = self.mounts(at, &raw.volumes)?;
        let memory_bytes = self.memory_bytes(at, raw.memory_mb)?;
        let nano_cpus = self.nano_cpus(at, raw.cpus)?;
        self.labels(at, &raw.labels)?;
        self.networks(at, &raw.networks)?;
        self.cap_add(at, &raw.cap_add)?;
        Ok(RunSpec {
            env: raw.env.clone(),
            secrets,
            mounts,
            memory_bytes,
            nano_cpus,
            user: raw.user.clone(),
            entrypoint: raw.entrypoint.clone(),
            labels: raw.labels.clone(),
            networks: raw.networks.clone(),
            cap_add: raw.cap_add.clone(),
            instance_network: false,
        })
    }

    /// The plain environment: names, sizes, and templates that render.
    pub(super) fn env(
        &self,
        at: &str,
        raw: &RawService,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<(), CatalogError> {
        let sample_parameters = sample_parameters(parameters);
        let sample = ReleaseParams {
            instance: "i",
            team: "t",
            service_type: "s",
            version: "v",
            parameters: &sample_parameters,
        };
        for (name, value) in &raw.env {
            let field = format!("{at}.env.{name}");
            if !is_env_name(name) {
                return Err(self.invalid(
                    field,
                    name,
                    "an environment variable's name is a letter or '_', then letters, digits or '_'",
                ));
            }
            if value.len() > ENV_VALUE_LEN_MAX || value.contains('\0') {
                return Err(self.invalid(
                    field,
                    value,
                    format!("at most {ENV_VALUE_LEN_MAX} bytes, no NUL"),
                ));
            }
            render(&field, value, &sample).map_err(|e| self.invalid(field, value, e.reason))?;
        }
        Ok(())
    }

    /// The secret environment: names not set twice, and their sources.
    pub(super) fn secrets(
        &self,
        at: &str,
        raw: &RawService,
    ) -> Result<Vec<SecretEnv>, CatalogError> {
        let mut secrets = Vec::with_capacity(raw.secrets.len());
        for (i, secret) in raw.secrets.iter().enumerate() {
            let field = format!("{at}.secrets[{i}]");
            if !is_env_name(&secret.env) {
                return Err(self.invalid(
                    format!("{field}.env"),
                    &secret.env,
                    "an environment variable's name is a letter or '_', then letters, digits or '_'",
                ));
            }
            if raw.env.contains_key(&secret.env)
                || secrets.iter().any(|s: &SecretEnv| s.env == secret.env)
            {
                return Err(self.invalid(
                    format!("{field}.env"),
                    &secret.env,
                    "this variable is already set (by env or another secret)",
                ));
            }
            let source = self.secret_source(&field, secret)?;
            secrets.push(SecretEnv {
                env: secret.env.clone(),
                source,
            });
        }
        Ok(secrets)
    }

    /// `memory_mb` in bytes, within the bounds and the operator's limit.
    pub(super) fn memory_bytes(
        &self,
        at: &str,
        memory_mb: Option<i64>,
    ) -> Result<Option<u64>, CatalogError> {
        Ok(match memory_mb {
            None => None,
            Some(mb) if (MEMORY_MB_MIN..=MEMORY_MB_MAX).contains(&mb) => {
                let bytes = mb.unsigned_abs() * MIB;
                let max_bytes = self.grants.limits().memory_bytes_max;
                if bytes > max_bytes {
                    return Err(self.invalid(
                        format!("{at}.memory_mb"),
                        mb,
                        format!(
                            "more than limits.memory_max_mb = {} in stead.toml (the operator \
                             raises it there)",
                            max_bytes / MIB
                        ),
                    ));
                }
                Some(bytes)
            }
            Some(mb) => {
                return Err(self.invalid(
                    format!("{at}.memory_mb"),
                    mb,
                    format!("must be between {MEMORY_MB_MIN} and {MEMORY_MB_MAX} (Docker refuses less than 6 MB)"),
                ))
            }
        })
    }

    /// `cpus` in billionths of a CPU, within the bounds.
    pub(super) fn nano_cpus(
        &self,
        at: &str,
        cpus: Option<f64>,
    ) -> Result<Option<u64>, CatalogError> {
        Ok(match cpus {
            None => None,
            Some(cpus) if (CPUS_MIN..=CPUS_MAX).contains(&cpus) => {
                // In range, so the product is a positive integer-sized float.
                Some((cpus * 1e9).round() as u64)
            }
            Some(cpus) => {
                return Err(self.invalid(
                    format!("{at}.cpus"),
                    cpus,
                    format!("must be between {CPUS_MIN} and {CPUS_MAX}"),
                ))
            }
        })
    }

    /// Extra labels: not stead's own, and of a sane size.
    pub(super) fn labels(
        &self,
        at: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        if labels.len() > LABELS_MAX {
            return Err(self.invalid(
                format!("{at}.labels"),
                labels.len(),
                format!("at most {LABELS_MAX} labels"),
            ));
        }
        for (key, value) in labels {
            let field = format!("{at}.labels.{key}");
            if key.starts_with(RESERVED_LABEL_PREFIX) {
                return Err(self.invalid(
                    field,
                    key,
                    "labels starting with \"stead.\" are stead's own",
                ));
            }
            if key.is_empty()
                || key.len() > IMAGE_LEN_MAX
                || key.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(self.invalid(
                    field,
                    key,
                    "a label key is 1 to 256 bytes without whitespace",
                ));
            }
            if value.len() > ARG_LEN_MAX || value.chars().any(char::is_control) {
                return Err(self.invalid(
                    field,
                    value,
                    format!(
                        "a label value is at most {ARG_LEN_MAX} bytes without control characters"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Extra networks: each granted by name in `[grants] networks` (so
    /// never the host's, stead's own or another instance's), each once.
    pub(super) fn networks(&self, at: &str, networks: &[String]) -> Result<(), CatalogError> {
        if networks.len() > NETWORKS_MAX {
            return Err(self.invalid(
                format!("{at}.networks"),
                networks.len(),
                format!("at most {NETWORKS_MAX} networks"),
            ));
        }
        for (i, network) in networks.iter().enumerate() {
            let field = format!("{at}.networks[{i}]");
            if !is_joinable_network(network) {
                return Err(self.invalid(field, network, joinable_network_rule()));
            }
            if networks[..i].contains(network) {
                return Err(self.invalid(field, network, "duplicate network"));
            }
            if !self.grants.allows_network(network) {
                return Err(self.not_granted(field, network, Grant::Network));
            }
        }
        Ok(())
    }

    /// Capabilities added back: each granted in `[grants] capabilities`,
    /// each once.
    pub(super) fn cap_add(&self, at: &str, capabilities: &[String]) -> Result<(), CatalogError> {
        if capabilities.len() > CAP_ADD_MAX {
            return Err(self.invalid(
                format!("{at}.cap_add"),
                capabilities.len(),
                format!("at most {CAP_ADD_MAX} capabilities"),
            ));
        }
        for (i, capability) in capabilities.iter().enumerate() {
            let field = format!("{at}.cap_add[{i}]");
            if !is_capability_name(capability) {
                return Err(self.invalid(
                    field,
                    capability,
                    "must be a capability's name as the runtime takes it (e.g. NET_RAW, no CAP_ \
                     prefix)",
                ));
            }
            if capabilities[..i].contains(capability) {
                return Err(self.invalid(field, capability, "duplicate capability"));
            }
            if !self.grants.allows_capability(capability) {
                return Err(self.not_granted(field, capability, Grant::Capability));
            }
        }
        Ok(())
    }

    /// Where a secret's value comes from: a file inside a granted secret
    /// directory, or a daemon variable the operator passes through (never
    /// one of stead's own).
    pub(super) fn secret_source(
        &self,
        field: &str,
        secret: &RawSecret,
    ) -> Result<SecretSource, CatalogError> {
        match (&secret.file, &secret.from_env) {
            (Some(path), None) if !is_clean_absolute(path) => Err(self.invalid(
                format!("{field}.file"),
                path,
                "must be an absolute path with no '.', '..' or empty component",
            )),
            (Some(path), None) if !self.grants.allows_secret_file(path) => {
                Err(self.not_granted(format!("{field}.file"), path, Grant::SecretFile))
            }
            (Some(path), None) => Ok(SecretSource::File(path.clone())),
            (None, Some(name)) if !is_env_name(name) => Err(self.invalid(
                format!("{field}.from_env"),
                name,
                "must be an environment variable's name",
            )),
            (None, Some(name)) if is_reserved_env(name) => {
                Err(self.invalid(format!("{field}.from_env"), name, reserved_env_reason()))
            }
            (None, Some(name)) if !self.grants.passes_env(name) => {
                Err(self.not_granted(format!("{field}.from_env"), name, Grant::DaemonEnv))
            }
            (None, Some(name)) => Ok(SecretSource::DaemonEnv(name.clone())),
            _ => Err(self.invalid(
                field,
                &secret.env,
                "a secret takes exactly one of `file` or `from_env`",
            )),
        }
    }

    pub(super) fn mounts(&self, at: &str, raw: &[RawVolume]) -> Result<Vec<Mount>, CatalogError> {
        if raw.len() > MOUNTS_MAX {
            return Err(self.invalid(
                format!("{at}.volumes"),
                raw.len(),
                format!("at most {MOUNTS_MAX} volumes"),
            ));
        }
        let mut mounts: Vec<Mount> = Vec::with_capacity(raw.len());
        for (i, volume) in raw.iter().enumerate() {
            let field = format!("{at}.volumes[{i}]");
            if !is_clean_absolute(&volume.path) || volume.path == "/" {
                return Err(self.invalid(
                    format!("{field}.path"),
                    &volume.path,
                    "must be an absolute path other than / with no '.', '..' or empty component",
                ));
            }
            if mounts.iter().any(|m| m.target == volume.path) {
                return Err(self.invalid(
                    format!("{field}.path"),
                    &volume.path,
                    "duplicate mount path",
                ));
            }
            let source = match (&volume.name, &volume.host_path) {
                (Some(name), None) => {
                    self.name(&format!("{field}.name"), name)?;
                    if mounts.iter().any(|m| m.source == MountSource::Volume(name.clone())) {
                        return Err(self.invalid(format!("{field}.name"), name, "duplicate volume name"));
                    }
                    MountSource::Volume(name.clone())
                }
                (None, Some(path)) if !is_clean_absolute(path) => {
                    return Err(self.invalid(
                        format!("{field}.host_path"),
                        path,
                        "must be an absolute path with no '.', '..' or empty component",
                    ))
                }
                (None, Some(path)) if !self.grants.allows_host_path(path) => {
                    return Err(self.not_granted(
                        format!("{field}.host_path"),
                        path,
                        Grant::HostPath,
                    ))
                }
                (None, Some(path)) => MountSource::HostPath(path.clone()),
                _ => {
                    return Err(self.invalid(
                        field,
                        &volume.path,
                        "a volume takes exactly one of `name` (a named volume) or `host_path` (a bind mount)",
                    ))
                }
            };
            mounts.push(Mount {
                source,
                target: volume.path.clone(),
                read_only: volume.read_only,
            });
        }
        Ok(mounts)
    }
}
