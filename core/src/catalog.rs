//! The catalog: which service types exist, at which version, and what their
//! services look like. Read from a TOML file whose *contents* the caller
//! passes in (reading the file is I/O and lives in `crate::config`), validated
//! once here, and turned into [`ServiceSpec`]s. The catalog is a config
//! format, which is why this one core module uses serde.
//!
//! Every error names the file, the field (as a dotted path such as
//! `types.wiki.services[0].ports[1]`) and the offending value.
//!
//! What of the host a service may reach (bind mounts, secret files, the
//! daemon's variables) is not the catalog's to say: the operator grants it
//! in `stead.toml` ([`Grants`]), passed in, and a catalog asking for more
//! is refused naming the field and the missing grant.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use super::domains::{DomainTemplate, DOMAINS_PER_SERVICE_MAX};
use super::fleet::RolloutState;
use super::grants::{is_reserved_env, reserved_env_reason, Grant, Grants};
use super::limits::MIB;
use super::names;
use super::release::{render, HelmChart, Provisioning, ReleaseParams, HELM_NAMESPACE_DEFAULT};
use super::spec::{
    Healthcheck, Mount, MountSource, ReadinessProbe, RunSpec, SecretEnv, SecretSource, ServiceSpec,
    UpdateStrategy,
};
use super::toml_error;
use super::types::ServiceName;

/// Largest catalog file accepted, in bytes.
pub const CATALOG_LEN_MAX: usize = 1 << 20;
/// Most service types in one catalog.
pub const SERVICE_TYPES_MAX: usize = 256;
/// Most services in one service type.
pub const SERVICES_MAX: usize = 32;
/// Most published ports of one service.
pub const PORTS_MAX: usize = 32;
/// Most arguments in one command vector, and the longest argument.
pub const ARGS_MAX: usize = 64;
pub const ARG_LEN_MAX: usize = 1024;
/// Longest image reference and version string.
pub const IMAGE_LEN_MAX: usize = 256;
pub const VERSION_LEN_MAX: usize = 64;
/// Longest service-type or service name: a DNS label, since both end up in
/// release and container names.
pub const NAME_LEN_MAX: usize = names::LABEL_LEN_MAX;
/// How long an upgrade bakes unless the type says (#40): long enough for
/// a version that crashes under its first real traffic to show it.
const BAKE_MS_DEFAULT: i64 = 300_000;
/// Longest any configured duration (grace, probe timeout or interval) may be.
pub const DURATION_MS_MAX: i64 = 3_600_000;
/// Most probe attempts or healthcheck retries.
pub const ATTEMPTS_MAX: i64 = 1000;

const STOP_GRACE_MS_DEFAULT: i64 = 10_000;
const HEALTHCHECK_INTERVAL_MS_DEFAULT: i64 = 10_000;
const HEALTHCHECK_TIMEOUT_MS_DEFAULT: i64 = 5_000;
const HEALTHCHECK_RETRIES_DEFAULT: i64 = 3;
const PROBE_TIMEOUT_MS_DEFAULT: i64 = 2_000;
const PROBE_INTERVAL_MS_DEFAULT: i64 = 1_000;
const PROBE_ATTEMPTS_MAX_DEFAULT: i64 = 30;
/// A log line may take a while: a database replays its journal before it
/// says it accepts connections.
const LOG_PROBE_TIMEOUT_MS_DEFAULT: i64 = 60_000;
/// Longest pattern of a log readiness probe. A log reader keeps this many
/// bytes of a line across the pieces it reads, so it is kept small.
pub const LOG_PATTERN_LEN_MAX: usize = 256;

/// One service type of the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub service_type: String,
    /// The version every instance of this type should run.
    pub version: String,
    /// A security release: its upgrades ignore maintenance windows.
    pub security: bool,
    /// The rollout switch as the catalog file sets it. The store's rollout
    /// table can halt a type too; either one halting wins.
    pub rollout: RolloutState,
    /// How long an upgraded instance bakes (#40): its predecessors are
    /// kept, stopped, and a successor that fails in this time is reverted
    /// and the type halted. Zero retires predecessors as soon as their
    /// successors serve.
    pub bake: Duration,
    /// Docker containers recovered by stead, or a Helm chart recovered by
    /// Kubernetes (`core::release`).
    pub provisioning: Provisioning,
    /// The containers of a Docker type; a Helm type has none (its chart
    /// says what runs).
    pub services: Vec<ServiceSpec>,
    /// Per-instance parameters: given at `instance create --set NAME=VALUE`
    /// and read by templates as `{param.NAME}`. A parameter without a
    /// default must be given.
    pub parameters: BTreeMap<String, Parameter>,
    /// The digest of what the type's instances run (`provisioning`,
    /// `services`, `parameters`): an instance that recorded another one is
    /// upgraded even when the version did not change. Computed when the
    /// catalog is built ([`CatalogEntry::digest`]).
    pub spec_digest: String,
}

/// One declared parameter of a service type.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Parameter {
    /// Used when an instance does not give the parameter; none makes it
    /// required.
    pub default: Option<String>,
}

/// Longest parameter name and value.
pub(crate) const PARAMETER_NAME_LEN_MAX: usize = 64;
pub(crate) const PARAMETER_VALUE_LEN_MAX: usize = 1024;
/// Most parameters of one service type.
pub(crate) const PARAMETERS_MAX: usize = 64;

/// Why an instance's parameters do not fit its type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("parameter {name}: {reason}")]
pub struct ParameterError {
    pub name: String,
    pub reason: String,
}

/// A parameter value as templates may use it: bounded, one line, no
/// control characters.
pub(crate) fn check_parameter_value(name: &str, value: &str) -> Result<(), ParameterError> {
    if value.len() > PARAMETER_VALUE_LEN_MAX || value.chars().any(char::is_control) {
        return Err(ParameterError {
            name: name.to_owned(),
            reason: format!(
                "the value must be at most {PARAMETER_VALUE_LEN_MAX} bytes without control characters"
            ),
        });
    }
    Ok(())
}

impl CatalogEntry {
    /// The digest of what the type's instances run: its provisioning, its
    /// services and its parameters (not the version, the security flag or
    /// the rollout switch, which say when, not what).
    pub fn digest(&self) -> String {
        super::spec::digest_of(&(&self.provisioning, &self.services, &self.parameters))
    }

    /// Checks the parameters an instance is created with: every one
    /// declared, every required one given, every value usable.
    pub fn check_parameters(&self, given: &BTreeMap<String, String>) -> Result<(), ParameterError> {
        for (name, value) in given {
            if !self.parameters.contains_key(name) {
                let declared: Vec<&str> = self.parameters.keys().map(String::as_str).collect();
                return Err(ParameterError {
                    name: name.clone(),
                    reason: format!(
                        "service type {} declares no such parameter (declared: {})",
                        self.service_type,
                        if declared.is_empty() {
                            "none".to_owned()
                        } else {
                            declared.join(", ")
                        }
                    ),
                });
            }
            check_parameter_value(name, value)?;
        }
        for (name, parameter) in &self.parameters {
            if parameter.default.is_none() && !given.contains_key(name) {
                return Err(ParameterError {
                    name: name.clone(),
                    reason: format!(
                        "required by service type {} (give it with --set {name}=VALUE)",
                        self.service_type
                    ),
                });
            }
        }
        Ok(())
    }

    /// An instance's parameters with the catalog's defaults filled in, as
    /// templates read them. A parameter declared after the instance was
    /// created takes its default; one the catalog no longer declares is
    /// left out.
    pub fn parameters_of(&self, given: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        self.parameters
            .iter()
            .filter_map(|(name, parameter)| {
                given
                    .get(name)
                    .or(parameter.default.as_ref())
                    .map(|value| (name.clone(), value.clone()))
            })
            .collect()
    }

    /// Whether stead runs and recovers this type's containers itself.
    pub fn is_docker(&self) -> bool {
        self.provisioning == Provisioning::Docker
    }
}

/// A validated catalog, keyed by service type (iterated in name order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    entries: BTreeMap<String, CatalogEntry>,
    /// Each type's own table as a catalog of that one type, as the file
    /// gave it (#40: the daemon records each version it loads, for
    /// `rollout undo --to`). Empty for a catalog built from entries.
    sources: BTreeMap<String, String>,
    /// The grants it was validated against: a recorded version is read
    /// back against the same ones ([`Catalog::recorded_entry`]).
    grants: Grants,
}

impl Catalog {
    /// Builds a catalog from entries already known to be valid (tests, the
    /// simulation). Files go through [`Catalog::from_toml`].
    pub fn from_entries(entries: impl IntoIterator<Item = CatalogEntry>) -> Catalog {
        Catalog {
            entries: entries
                .into_iter()
                .map(|mut e| {
                    e.spec_digest = e.digest();
                    (e.service_type.clone(), e)
                })
                .collect(),
            sources: BTreeMap::new(),
            grants: Grants::default(),
        }
    }

    /// A version of `service_type` as the daemon recorded it when it
    /// loaded it (`source`, [`Catalog::source_of`]), read back through
    /// the catalog's parser and this catalog's grants: a grant withdrawn
    /// since is not regained by going back.
    pub fn recorded_entry(
        &self,
        service_type: &str,
        version: &str,
        source: &str,
    ) -> Result<CatalogEntry, CatalogError> {
        let file = format!("the recorded version {version} of type {service_type}");
        let catalog = Catalog::from_toml(source, &file, &self.grants)?;
        catalog
            .get(service_type)
            .filter(|entry| entry.version == version)
            .cloned()
            .ok_or_else(|| CatalogError::Read {
                file,
                reason: format!("it does not define version {version} of type {service_type}"),
            })
    }

    /// `service_type`'s definition as a catalog of that one type, which
    /// [`Catalog::from_toml`] reads back to the same entry (`None` for a
    /// catalog built from entries).
    pub fn source_of(&self, service_type: &str) -> Option<&str> {
        self.sources.get(service_type).map(String::as_str)
    }

    pub fn get(&self, service_type: &str) -> Option<&CatalogEntry> {
        self.entries.get(service_type)
    }

    /// Entries in service-type order.
    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.values()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The types Kubernetes runs and recovers (Helm types): the recovery
    /// pass leaves their instances alone.
    pub fn helm_types(&self) -> BTreeSet<String> {
        self.entries()
            .filter(|e| !e.is_docker())
            .map(|e| e.service_type.clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Parses and validates a catalog against the operator's `grants`: a
    /// host path, secret file or daemon variable they do not grant is
    /// refused. `file` only labels errors.
    pub fn from_toml(contents: &str, file: &str, grants: &Grants) -> Result<Catalog, CatalogError> {
        if contents.len() > CATALOG_LEN_MAX {
            return Err(CatalogError::TooLarge {
                file: file.to_owned(),
                len: contents.len(),
            });
        }
        let raw: RawCatalog = toml::from_str(contents).map_err(|e| CatalogError::Syntax {
            file: file.to_owned(),
            message: toml_error::describe(&e, contents),
        })?;
        let check = Checker {
            file,
            contents,
            grants,
        };
        if raw.host_path_prefixes.is_some() {
            return Err(check.invalid(
                "host_path_prefixes",
                "set",
                "has moved to stead.toml: the operator grants bind-mount directories in \
                 [grants] host_path_prefixes; remove it from the catalog",
            ));
        }
        if raw.types.len() > SERVICE_TYPES_MAX {
            return Err(check.invalid(
                "types",
                raw.types.len(),
                format!("at most {SERVICE_TYPES_MAX} service types"),
            ));
        }
        let mut entries = BTreeMap::new();
        for (name, raw_type) in raw.types {
            let mut entry = check.service_type(&name, raw_type)?;
            entry.spec_digest = entry.digest();
            entries.insert(name, entry);
        }
        check.shared_domains(&entries)?;
        let sources = type_sources(contents);
        Ok(Catalog {
            entries,
            sources,
            grants: grants.clone(),
        })
    }
}

/// Each type's table of a catalog that parsed, written back as a catalog
/// of that one type. TOML's own data model round-trips every value the
/// catalog reads, so the one-type catalog parses to the same entry.
fn type_sources(contents: &str) -> BTreeMap<String, String> {
    let Ok(mut table) = toml::from_str::<toml::Table>(contents) else {
        return BTreeMap::new();
    };
    let Some(toml::Value::Table(types)) = table.remove("types") else {
        return BTreeMap::new();
    };
    types
        .into_iter()
        .filter_map(|(name, definition)| {
            let one = toml::Table::from_iter([(
                "types".to_owned(),
                toml::Value::Table(toml::Table::from_iter([(name.clone(), definition)])),
            )]);
            toml::to_string(&one).ok().map(|source| (name, source))
        })
        .collect()
}

/// How a service type differs between two catalogs (a reload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogChange {
    Added {
        service_type: String,
        version: String,
    },
    Removed {
        service_type: String,
    },
    /// A new version: version drift plans its upgrades (C8).
    Version {
        service_type: String,
        from: String,
        to: String,
    },
    /// The spec changed but the version did not: rolled out as an upgrade
    /// to instances that recorded the old spec's digest.
    SpecWithoutVersion {
        service_type: String,
        version: String,
    },
    /// A type moved between Docker and Helm: its existing instances keep
    /// the release they were installed as until they are reprovisioned.
    Provisioner {
        service_type: String,
        from: &'static str,
        to: &'static str,
    },
    /// `security`, `rollout` or `bake_ms` changed.
    Settings {
        service_type: String,
    },
}

impl std::fmt::Display for CatalogChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Added {
                service_type,
                version,
            } => write!(f, "{service_type} added at version {version}"),
            Self::Removed { service_type } => write!(
                f,
                "{service_type} removed (its instances are no longer granted, R11)"
            ),
            Self::Version {
                service_type,
                from,
                to,
            } => write!(f, "{service_type} {from} -> {to}"),
            Self::SpecWithoutVersion {
                service_type,
                version,
            } => write!(
                f,
                "{service_type} spec changed at the same version {version} \
                 (rolled out as an upgrade, within the windows and max_in_flight)"
            ),
            Self::Settings { service_type } => {
                write!(
                    f,
                    "{service_type} security, rollout or bake setting changed"
                )
            }
            Self::Provisioner {
                service_type,
                from,
                to,
            } => write!(
                f,
                "{service_type} moved from {from} to {to} (existing instances keep \
                 their {from} release; delete and recreate them to move them)"
            ),
        }
    }
}

impl Catalog {
    /// What changed from `old` to `self`, in service-type order.
    pub fn changes_from(&self, old: &Catalog) -> Vec<CatalogChange> {
        let mut changes = Vec::new();
        for old_entry in old.entries() {
            if self.get(&old_entry.service_type).is_none() {
                changes.push(CatalogChange::Removed {
                    service_type: old_entry.service_type.clone(),
                });
            }
        }
        for entry in self.entries() {
            let service_type = entry.service_type.clone();
            let Some(before) = old.get(&entry.service_type) else {
                changes.push(CatalogChange::Added {
                    service_type,
                    version: entry.version.clone(),
                });
                continue;
            };
            if before.provisioning.word() != entry.provisioning.word() {
                changes.push(CatalogChange::Provisioner {
                    service_type,
                    from: before.provisioning.word(),
                    to: entry.provisioning.word(),
                });
            } else if before.version != entry.version {
                changes.push(CatalogChange::Version {
                    service_type,
                    from: before.version.clone(),
                    to: entry.version.clone(),
                });
            } else if before.services != entry.services || before.provisioning != entry.provisioning
            {
                changes.push(CatalogChange::SpecWithoutVersion {
                    service_type,
                    version: entry.version.clone(),
                });
            } else if (before.security, before.rollout, before.bake)
                != (entry.security, entry.rollout, entry.bake)
            {
                changes.push(CatalogChange::Settings { service_type });
            }
        }
        changes.sort_by(|a, b| change_type(a).cmp(change_type(b)));
        changes
    }
}

fn change_type(change: &CatalogChange) -> &str {
    match change {
        CatalogChange::Added { service_type, .. }
        | CatalogChange::Removed { service_type }
        | CatalogChange::Version { service_type, .. }
        | CatalogChange::SpecWithoutVersion { service_type, .. }
        | CatalogChange::Provisioner { service_type, .. }
        | CatalogChange::Settings { service_type } => service_type,
    }
}

/// A change of a reload that would silently damage instances already
/// running: refused unless the operator forces it (`stead reload --force`).
/// Each names the type and the old and new values; only a type with live
/// (not deleted) instances has hazards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadHazard {
    /// The type is gone while instances of it live: they lose their grant
    /// (R11) and stead no longer knows where their releases are.
    TypeDropped { service_type: String },
    /// The type moved between Docker and Helm: its instances keep the
    /// release they were installed as, which nothing then recovers.
    ProvisionerMoved {
        service_type: String,
        from: &'static str,
        to: &'static str,
    },
    /// Services were removed *and* added at once, most likely a rename:
    /// every instance would start the added service on empty volumes.
    ServicesRenamed {
        service_type: String,
        removed: Vec<String>,
        added: Vec<String>,
    },
    /// A named volume a service mounted is gone from it (renamed, most
    /// likely): every instance would start that service on an empty
    /// volume. `to` is the named volume now mounted at the same path.
    VolumeRenamed {
        service_type: String,
        service: String,
        path: String,
        from: String,
        to: Option<String>,
    },
}

impl std::fmt::Display for ReloadHazard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TypeDropped { service_type } => write!(
                f,
                "types.{service_type}: removed while it has live instances (they would lose \
                 their grant; delete them first)"
            ),
            Self::ProvisionerMoved {
                service_type,
                from,
                to,
            } => write!(
                f,
                "types.{service_type}: provisioner {from} -> {to} while it has live instances \
                 (they keep their {from} release, which nothing would recover)"
            ),
            Self::ServicesRenamed {
                service_type,
                removed,
                added,
            } => write!(
                f,
                "types.{service_type}.services: {} -> {} while it has live instances (a \
                 rename: every instance would start {} on empty volumes)",
                removed.join(", "),
                added.join(", "),
                added.join(", ")
            ),
            Self::VolumeRenamed {
                service_type,
                service,
                path,
                from,
                to,
            } => write!(
                f,
                "types.{service_type}.services.{service}.volumes: named volume {from} -> {} \
                 at {path} while it has live instances (every instance would lose the data \
                 in {from})",
                to.as_deref().unwrap_or("none")
            ),
        }
    }
}

/// The changes from `old` to `new` that would damage live instances: those
/// of the types in `live_types` (types with instances not deleted). In
/// service-type order, then service, then volume. Removing a service alone
/// (retired on upgrade) or adding one alone is no hazard.
pub fn reload_hazards(
    old: &Catalog,
    new: &Catalog,
    live_types: &BTreeSet<String>,
) -> Vec<ReloadHazard> {
    let mut hazards = Vec::new();
    for service_type in live_types {
        let Some(before) = old.get(service_type) else {
            // Not in the running catalog: nothing of it runs that a
            // reload could break.
            continue;
        };
        let Some(after) = new.get(service_type) else {
            hazards.push(ReloadHazard::TypeDropped {
                service_type: service_type.clone(),
            });
            continue;
        };
        if before.provisioning.word() != after.provisioning.word() {
            hazards.push(ReloadHazard::ProvisionerMoved {
                service_type: service_type.clone(),
                from: before.provisioning.word(),
                to: after.provisioning.word(),
            });
            continue;
        }
        service_hazards(before, after, &mut hazards);
    }
    hazards
}

/// The hazards between two versions of one type on the same provisioner.
fn service_hazards(before: &CatalogEntry, after: &CatalogEntry, hazards: &mut Vec<ReloadHazard>) {
    let names = |entry: &CatalogEntry| -> BTreeSet<String> {
        entry
            .services
            .iter()
            .map(|s| s.name.as_str().to_owned())
            .collect()
    };
    let (names_before, names_after) = (names(before), names(after));
    let removed: Vec<String> = names_before.difference(&names_after).cloned().collect();
    let added: Vec<String> = names_after.difference(&names_before).cloned().collect();
    if !removed.is_empty() && !added.is_empty() {
        hazards.push(ReloadHazard::ServicesRenamed {
            service_type: before.service_type.clone(),
            removed,
            added,
        });
    }
    for service in &before.services {
        let Some(kept) = after.services.iter().find(|s| s.name == service.name) else {
            continue;
        };
        for (from, path) in named_volumes(service) {
            if named_volumes(kept).any(|(name, _)| name == from) {
                continue;
            }
            let to = named_volumes(kept)
                .find(|(_, at)| *at == path)
                .map(|(name, _)| name.to_owned());
            hazards.push(ReloadHazard::VolumeRenamed {
                service_type: before.service_type.clone(),
                service: service.name.as_str().to_owned(),
                path: path.to_owned(),
                from: from.to_owned(),
                to,
            });
        }
    }
}

/// A service's named volumes with their mount paths, in catalog order.
fn named_volumes(service: &ServiceSpec) -> impl Iterator<Item = (&str, &str)> {
    service.run.mounts.iter().filter_map(|m| match &m.source {
        MountSource::Volume(name) => Some((name.as_str(), m.target.as_str())),
        MountSource::HostPath(_) => None,
    })
}

/// Why a catalog was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}: the catalog is {len} bytes; at most {max} are allowed", max = CATALOG_LEN_MAX)]
    TooLarge { file: String, len: usize },
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    /// `line` is where `field` is written, when it is written at all (a
    /// missing field has no line).
    #[error("{file}: {}{field} = {value}: {reason}", at_line(*line))]
    Invalid {
        file: String,
        line: Option<usize>,
        field: String,
        value: String,
        reason: String,
    },
    /// The catalog asks for a host path, secret file or daemon variable
    /// the operator's `[grants]` in `stead.toml` do not give; `granted` is
    /// what that grant lists.
    #[error("{file}: {}{field} = {value}: {}", at_line(*line), not_granted(*grant, granted))]
    NotGranted {
        file: String,
        line: Option<usize>,
        field: String,
        value: String,
        grant: Grant,
        granted: Vec<String>,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

fn not_granted(grant: Grant, granted: &[String]) -> String {
    let key = grant.key();
    let wanted = match grant {
        Grant::HostPath => "not under any of",
        Grant::SecretFile => "not inside any of",
        Grant::DaemonEnv => "not one of",
    };
    if granted.is_empty() {
        format!("not granted: grants.{key} in stead.toml is empty (the operator grants it there)")
    } else {
        format!(
            "{wanted} grants.{key} in stead.toml ({})",
            granted.join(", ")
        )
    }
}

// --- the file format ---------------------------------------------------------
//
// Numbers are read as i64 so that a negative or huge value reaches the
// validator, which names field and value, instead of failing inside serde.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    /// Moved to `stead.toml`'s `[grants]`: read, of any type, only to say so.
    host_path_prefixes: Option<toml::Value>,
    #[serde(default)]
    types: BTreeMap<String, RawType>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawType {
    version: String,
    #[serde(default)]
    security: bool,
    rollout: Option<String>,
    bake_ms: Option<i64>,
    /// `docker` (the default) or `helm`.
    provisioner: Option<String>,
    helm: Option<RawHelm>,
    #[serde(default)]
    parameters: BTreeMap<String, RawParameter>,
    #[serde(default)]
    services: Vec<RawService>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParameter {
    default: Option<String>,
    /// For operators reading the catalog; stead does not use it.
    #[allow(dead_code)]
    description: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHelm {
    chart: String,
    chart_version: Option<String>,
    namespace: Option<String>,
    #[serde(default)]
    values: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: String,
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    ports: Vec<i64>,
    healthcheck: Option<RawHealthcheck>,
    readiness: Option<RawReadiness>,
    stop_grace_ms: Option<i64>,
    update: Option<String>,
    #[serde(default)]
    entrypoint: Vec<String>,
    user: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    secrets: Vec<RawSecret>,
    #[serde(default)]
    volumes: Vec<RawVolume>,
    memory_mb: Option<i64>,
    cpus: Option<f64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    networks: Vec<String>,
    #[serde(default)]
    domains: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    env: String,
    file: Option<String>,
    from_env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVolume {
    name: Option<String>,
    host_path: Option<String>,
    path: String,
    #[serde(default)]
    read_only: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealthcheck {
    command: Vec<String>,
    interval_ms: Option<i64>,
    timeout_ms: Option<i64>,
    retries: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReadiness {
    kind: String,
    port: Option<i64>,
    path: Option<String>,
    /// Kind `log` only: the substring a line must contain.
    pattern: Option<String>,
    timeout_ms: Option<i64>,
    interval_ms: Option<i64>,
    attempts_max: Option<i64>,
}

// --- validation --------------------------------------------------------------

/// Longest value quoted back in an error message.
const ERROR_VALUE_LEN_MAX: usize = 80;

struct Checker<'a> {
    file: &'a str,
    /// The text, to say on which line a bad field is written.
    contents: &'a str,
    /// What the operator lets the catalog use.
    grants: &'a Grants,
}

/// Values standing in for an instance's when templates are checked: every
/// declared parameter, with its default or a placeholder value.
fn sample_parameters(parameters: &BTreeMap<String, Parameter>) -> BTreeMap<String, String> {
    parameters
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                p.default.clone().unwrap_or_else(|| "p".to_owned()),
            )
        })
        .collect()
}

/// `value` as an error quotes it: debug-formatted, at most
/// [`ERROR_VALUE_LEN_MAX`] characters.
pub(super) fn quote(value: impl std::fmt::Debug) -> String {
    let mut value = format!("{value:?}");
    if value.chars().count() > ERROR_VALUE_LEN_MAX {
        value = value.chars().take(ERROR_VALUE_LEN_MAX).collect::<String>() + "…";
    }
    value
}

impl Checker<'_> {
    fn invalid(
        &self,
        field: impl Into<String>,
        value: impl std::fmt::Debug,
        reason: impl Into<String>,
    ) -> CatalogError {
        let field = field.into();
        CatalogError::Invalid {
            file: self.file.to_owned(),
            line: toml_error::line_of(self.contents, &field),
            field,
            value: quote(value),
            reason: reason.into(),
        }
    }

    /// `value` of `field` needs `grant`, which the operator did not give.
    fn not_granted(&self, field: String, value: &str, grant: Grant) -> CatalogError {
        CatalogError::NotGranted {
            file: self.file.to_owned(),
            line: toml_error::line_of(self.contents, &field),
            field,
            value: quote(value),
            grant,
            granted: self.grants.granted(grant),
        }
    }

    fn name(&self, field: &str, value: &str) -> Result<(), CatalogError> {
        names::check_dns_label(field, value)
            .map_err(|e| self.invalid(field, value, e.rule.to_string()))
    }

    fn text(&self, field: &str, value: &str, len_max: usize) -> Result<(), CatalogError> {
        if value.is_empty() || value.len() > len_max || value.chars().any(char::is_whitespace) {
            return Err(self.invalid(
                field,
                value,
                format!("must be 1 to {len_max} bytes without whitespace"),
            ));
        }
        Ok(())
    }

    fn argv(&self, field: &str, args: &[String], required: bool) -> Result<(), CatalogError> {
        if required && args.is_empty() {
            return Err(self.invalid(field, args, "must name a program to run"));
        }
        if args.len() > ARGS_MAX {
            return Err(self.invalid(field, args.len(), format!("at most {ARGS_MAX} arguments")));
        }
        for (i, arg) in args.iter().enumerate() {
            if arg.len() > ARG_LEN_MAX {
                return Err(self.invalid(
                    format!("{field}[{i}]"),
                    arg,
                    format!("at most {ARG_LEN_MAX} bytes"),
                ));
            }
        }
        Ok(())
    }

    fn duration(
        &self,
        field: &str,
        value: Option<i64>,
        default_ms: i64,
        min_ms: i64,
    ) -> Result<Duration, CatalogError> {
        let ms = value.unwrap_or(default_ms);
        if !(min_ms..=DURATION_MS_MAX).contains(&ms) {
            return Err(self.invalid(
                field,
                ms,
                format!("must be between {min_ms} and {DURATION_MS_MAX} milliseconds"),
            ));
        }
        // The range check above makes the value non-negative.
        Ok(Duration::from_millis(ms.unsigned_abs()))
    }

    /// The first of `fields` (name, whether it is set) that is set, refused
    /// as `{at}.{name}` with `reason`.
    fn refuse_set(
        &self,
        at: &str,
        fields: &[(&str, bool)],
        reason: &str,
    ) -> Result<(), CatalogError> {
        match fields.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(self.invalid(format!("{at}.{field}"), "set", reason)),
            None => Ok(()),
        }
    }

    fn count(&self, field: &str, value: Option<i64>, default: i64) -> Result<u32, CatalogError> {
        let n = value.unwrap_or(default);
        if !(1..=ATTEMPTS_MAX).contains(&n) {
            return Err(self.invalid(field, n, format!("must be between 1 and {ATTEMPTS_MAX}")));
        }
        u32::try_from(n).map_err(|_| self.invalid(field, n, "out of range"))
    }

    fn port(&self, field: &str, value: i64) -> Result<u16, CatalogError> {
        u16::try_from(value)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| self.invalid(field, value, "must be a port between 1 and 65535"))
    }

    fn service_type(&self, name: &str, raw: RawType) -> Result<CatalogEntry, CatalogError> {
        let at = format!("types.{name}");
        self.name(&at, name)?;
        self.text(&format!("{at}.version"), &raw.version, VERSION_LEN_MAX)?;
        let rollout = match raw.rollout.as_deref() {
            None => RolloutState::Active,
            Some(word) => RolloutState::parse(word).map_err(|_| {
                self.invalid(
                    format!("{at}.rollout"),
                    word,
                    "must be \"active\" or \"halted\"",
                )
            })?,
        };
        let bake = self.duration(&format!("{at}.bake_ms"), raw.bake_ms, BAKE_MS_DEFAULT, 0)?;
        let parameters = self.parameters(&at, &raw.parameters)?;
        let provisioning = self.provisioning(&at, &raw, &parameters)?;
        if provisioning != Provisioning::Docker {
            if !raw.services.is_empty() {
                return Err(self.invalid(
                    format!("{at}.services"),
                    raw.services.len(),
                    "a helm type has no services: its chart says what runs",
                ));
            }
            return Ok(CatalogEntry {
                service_type: name.to_owned(),
                version: raw.version,
                security: raw.security,
                rollout,
                bake,
                provisioning,
                services: Vec::new(),
                parameters,
                spec_digest: String::new(),
            });
        }
        if raw.services.is_empty() || raw.services.len() > SERVICES_MAX {
            return Err(self.invalid(
                format!("{at}.services"),
                raw.services.len(),
                format!("a service type needs 1 to {SERVICES_MAX} services"),
            ));
        }
        let mut services: Vec<ServiceSpec> = Vec::with_capacity(raw.services.len());
        for (i, raw_service) in raw.services.into_iter().enumerate() {
            let service = self.service(&format!("{at}.services[{i}]"), raw_service, &parameters)?;
            if services.iter().any(|s| s.name == service.name) {
                return Err(self.invalid(
                    format!("{at}.services[{i}].name"),
                    service.name.as_str(),
                    "duplicate service name",
                ));
            }
            services.push(service);
        }
        let instance_network = services.len() > 1;
        for service in &mut services {
            service.run.instance_network = instance_network;
        }
        Ok(CatalogEntry {
            service_type: name.to_owned(),
            version: raw.version,
            security: raw.security,
            rollout,
            bake,
            provisioning,
            services,
            parameters,
            spec_digest: String::new(),
        })
    }

    fn parameters(
        &self,
        at: &str,
        raw: &BTreeMap<String, RawParameter>,
    ) -> Result<BTreeMap<String, Parameter>, CatalogError> {
        if raw.len() > PARAMETERS_MAX {
            return Err(self.invalid(
                format!("{at}.parameters"),
                raw.len(),
                format!("at most {PARAMETERS_MAX} parameters"),
            ));
        }
        raw.iter()
            .map(|(name, parameter)| {
                let field = format!("{at}.parameters.{name}");
                let mut chars = name.chars();
                let well_formed = matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
                    && chars.all(|c| c == '_' || c.is_ascii_lowercase() || c.is_ascii_digit())
                    && name.len() <= PARAMETER_NAME_LEN_MAX;
                if !well_formed {
                    return Err(self.invalid(
                        field,
                        name,
                        format!("a parameter's name is a-z, then a-z, 0-9 or '_', at most {PARAMETER_NAME_LEN_MAX} bytes"),
                    ));
                }
                if let Some(default) = &parameter.default {
                    check_parameter_value(name, default)
                        .map_err(|e| self.invalid(format!("{field}.default"), default, e.reason))?;
                }
                Ok((
                    name.clone(),
                    Parameter {
                        default: parameter.default.clone(),
                    },
                ))
            })
            .collect()
    }

    /// `provisioner` and, for a Helm type, its `helm` table.
    fn provisioning(
        &self,
        at: &str,
        raw: &RawType,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<Provisioning, CatalogError> {
        let word = raw.provisioner.as_deref().unwrap_or("docker");
        match (word, &raw.helm) {
            ("docker", None) => Ok(Provisioning::Docker),
            ("docker", Some(_)) => Err(self.invalid(
                format!("{at}.helm"),
                "set",
                "only a type with provisioner = \"helm\" takes a helm table",
            )),
            ("helm", None) => Err(self.invalid(
                format!("{at}.helm"),
                "missing",
                "a helm type needs a helm table with at least its chart",
            )),
            ("helm", Some(helm)) => {
                self.helm(&format!("{at}.helm"), helm, &raw.version, parameters)
            }
            (other, _) => Err(self.invalid(
                format!("{at}.provisioner"),
                other,
                "must be \"docker\" or \"helm\"",
            )),
        }
    }

    fn helm(
        &self,
        at: &str,
        raw: &RawHelm,
        version: &str,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<Provisioning, CatalogError> {
        let helm_arg = |field: String, value: &str, len_max: usize| {
            self.text(&field, value, len_max)?;
            if value.starts_with('-') || value.chars().any(char::is_control) {
                return Err(self.invalid(
                    field,
                    value,
                    "must not start with '-' (helm would read it as a flag)",
                ));
            }
            Ok(())
        };
        helm_arg(format!("{at}.chart"), &raw.chart, IMAGE_LEN_MAX)?;
        let chart_version = raw
            .chart_version
            .clone()
            .unwrap_or_else(|| version.to_owned());
        helm_arg(
            format!("{at}.chart_version"),
            &chart_version,
            VERSION_LEN_MAX,
        )?;
        let namespace = raw
            .namespace
            .clone()
            .unwrap_or_else(|| HELM_NAMESPACE_DEFAULT.to_owned());
        // Drift and status find a release by its namespace without the
        // instance's parameters at hand.
        if namespace.contains("{param.") {
            return Err(self.invalid(
                format!("{at}.namespace"),
                &namespace,
                "a namespace cannot use parameters (only values and env can)",
            ));
        }
        // An upgrade installs the new version where the old one lives: a
        // namespace that moved with the version would leave the old
        // release behind and install a second one.
        if namespace.contains("{version}") {
            return Err(self.invalid(
                format!("{at}.namespace"),
                &namespace,
                "a namespace cannot depend on {version}: an upgrade would install a second \
                 release instead of upgrading the first",
            ));
        }
        let values = serde_json::to_value(&raw.values).map_err(|e| {
            self.invalid(
                format!("{at}.values"),
                "…",
                format!("cannot be given to helm: {e}"),
            )
        })?;
        let chart = HelmChart {
            chart: raw.chart.clone(),
            chart_version,
            namespace,
            values,
        };
        // Rendered once for a sample instance: a bad placeholder, or a
        // namespace that can never be a DNS label, is the catalog's error,
        // not every provision's.
        let sample_parameters = sample_parameters(parameters);
        let sample = ReleaseParams {
            instance: "i",
            team: "t",
            service_type: "s",
            version: "v",
            parameters: &sample_parameters,
        };
        chart
            .release_of(&sample, false)
            .map_err(|e| self.invalid(format!("{at}.{}", e.field), &e.value, e.reason))?;
        Ok(Provisioning::Helm(chart))
    }

    fn service(
        &self,
        at: &str,
        raw: RawService,
        parameters: &BTreeMap<String, Parameter>,
    ) -> Result<ServiceSpec, CatalogError> {
        self.name(&format!("{at}.name"), &raw.name)?;
        let run = self.run(at, &raw, parameters)?;
        self.text(&format!("{at}.image"), &raw.image, IMAGE_LEN_MAX)?;
        self.argv(&format!("{at}.command"), &raw.command, false)?;
        if raw.ports.len() > PORTS_MAX {
            return Err(self.invalid(
                format!("{at}.ports"),
                raw.ports.len(),
                format!("at most {PORTS_MAX} ports"),
            ));
        }
        let mut ports = Vec::with_capacity(raw.ports.len());
        for (i, &value) in raw.ports.iter().enumerate() {
            let port = self.port(&format!("{at}.ports[{i}]"), value)?;
            if ports.contains(&port) {
                return Err(self.invalid(format!("{at}.ports[{i}]"), value, "duplicate port"));
            }
            ports.push(port);
        }
        let healthcheck = match raw.healthcheck {
            None => None,
            Some(raw) => Some(self.healthcheck(&format!("{at}.healthcheck"), raw)?),
        };
        let readiness = match raw.readiness {
            None => ReadinessProbe::None,
            Some(raw) => self.readiness(&format!("{at}.readiness"), raw, &ports)?,
        };
        let stop_grace = self.duration(
            &format!("{at}.stop_grace_ms"),
            raw.stop_grace_ms,
            STOP_GRACE_MS_DEFAULT,
            0,
        )?;
        let update = self.update(at, raw.update.as_deref(), &run)?;
        let domains = self.domains(at, &raw.domains)?;
        Ok(ServiceSpec {
            name: ServiceName::new(raw.name),
            image: raw.image,
            command: raw.command,
            ports,
            healthcheck,
            readiness,
            stop_grace,
            update,
            domains,
            run: Box::new(run),
        })
    }

    /// `domains` (#43): at most [`DOMAINS_PER_SERVICE_MAX`] templates, each
    /// a DNS name with whole-label placeholders, none twice.
    fn domains(&self, at: &str, raw: &[String]) -> Result<Vec<DomainTemplate>, CatalogError> {
        if raw.len() > DOMAINS_PER_SERVICE_MAX {
            return Err(self.invalid(
                format!("{at}.domains"),
                raw.len(),
                format!("at most {DOMAINS_PER_SERVICE_MAX} domains"),
            ));
        }
        let mut domains: Vec<DomainTemplate> = Vec::with_capacity(raw.len());
        for (j, text) in raw.iter().enumerate() {
            let field = format!("{at}.domains[{j}]");
            let template = DomainTemplate::parse(text)
                .map_err(|e| self.invalid(&field, text, e.to_string()))?;
            if domains.contains(&template) {
                return Err(self.invalid(&field, text, "duplicate domain"));
            }
            domains.push(template);
        }
        Ok(domains)
    }

    /// Host names two services would always both claim (#43): a template
    /// without `{service}` on two services of one type (one instance
    /// renders both alike), or one without any placeholder on two
    /// services anywhere. Claims only some instances make (a literal name
    /// in a type with two instances) are refused at publish.
    fn shared_domains(&self, entries: &BTreeMap<String, CatalogEntry>) -> Result<(), CatalogError> {
        let mut seen: BTreeMap<(Option<&str>, &DomainTemplate), String> = BTreeMap::new();
        for (name, entry) in entries {
            for (i, service) in entry.services.iter().enumerate() {
                for (j, template) in service.domains.iter().enumerate() {
                    if !template.names_no_service() {
                        continue;
                    }
                    let field = format!("types.{name}.services[{i}].domains[{j}]");
                    let scope = (!template.is_literal()).then_some(name.as_str());
                    if let Some(first) = seen.get(&(scope, template)) {
                        return Err(self.invalid(
                            field,
                            template.as_str(),
                            format!("{first} claims the same host name"),
                        ));
                    }
                    seen.insert((scope, template), field);
                }
            }
        }
        Ok(())
    }

    /// `update`: `"overlap"` or `"stop-first"`. A service with a named
    /// volume is stopped first unless overlap is asked for: most databases
    /// must never have two processes on one data directory, and many
    /// cannot tell (#40).
    fn update(
        &self,
        at: &str,
        raw: Option<&str>,
        run: &RunSpec,
    ) -> Result<UpdateStrategy, CatalogError> {
        match raw {
            None if run.volumes().next().is_some() => Ok(UpdateStrategy::StopFirst),
            None => Ok(UpdateStrategy::Overlap),
            Some("overlap") => Ok(UpdateStrategy::Overlap),
            Some("stop-first") => Ok(UpdateStrategy::StopFirst),
            Some(other) => Err(self.invalid(
                format!("{at}.update"),
                other,
                "must be \"overlap\" or \"stop-first\"",
            )),
        }
    }

    fn healthcheck(&self, at: &str, raw: RawHealthcheck) -> Result<Healthcheck, CatalogError> {
        self.argv(&format!("{at}.command"), &raw.command, true)?;
        Ok(Healthcheck {
            command: raw.command,
            interval: self.duration(
                &format!("{at}.interval_ms"),
                raw.interval_ms,
                HEALTHCHECK_INTERVAL_MS_DEFAULT,
                1,
            )?,
            timeout: self.duration(
                &format!("{at}.timeout_ms"),
                raw.timeout_ms,
                HEALTHCHECK_TIMEOUT_MS_DEFAULT,
                1,
            )?,
            retries: self.count(
                &format!("{at}.retries"),
                raw.retries,
                HEALTHCHECK_RETRIES_DEFAULT,
            )?,
        })
    }

    fn readiness(
        &self,
        at: &str,
        raw: RawReadiness,
        ports: &[u16],
    ) -> Result<ReadinessProbe, CatalogError> {
        if raw.kind == "none" {
            let stray = [
                ("port", raw.port.is_some()),
                ("path", raw.path.is_some()),
                ("pattern", raw.pattern.is_some()),
                ("timeout_ms", raw.timeout_ms.is_some()),
                ("interval_ms", raw.interval_ms.is_some()),
                ("attempts_max", raw.attempts_max.is_some()),
            ];
            self.refuse_set(
                at,
                &stray,
                "a readiness probe of kind \"none\" takes no other fields",
            )?;
            return Ok(ReadinessProbe::None);
        }
        if raw.kind == "log" {
            return self.log_readiness(at, raw);
        }
        if raw.kind != "http" && raw.kind != "tcp" {
            return Err(self.invalid(
                format!("{at}.kind"),
                &raw.kind,
                "must be \"http\", \"tcp\", \"log\" or \"none\"",
            ));
        }
        if let Some(pattern) = raw.pattern {
            return Err(self.invalid(
                format!("{at}.pattern"),
                pattern,
                "only a readiness probe of kind \"log\" takes a pattern",
            ));
        }
        let port_field = format!("{at}.port");
        let port_value = raw.port.ok_or_else(|| {
            self.invalid(&port_field, "missing", "an http or tcp probe needs a port")
        })?;
        let port = self.port(&port_field, port_value)?;
        if !ports.contains(&port) {
            return Err(self.invalid(
                &port_field,
                port_value,
                "the probe must dial one of the service's ports",
            ));
        }
        let timeout = self.duration(
            &format!("{at}.timeout_ms"),
            raw.timeout_ms,
            PROBE_TIMEOUT_MS_DEFAULT,
            1,
        )?;
        let interval = self.duration(
            &format!("{at}.interval_ms"),
            raw.interval_ms,
            PROBE_INTERVAL_MS_DEFAULT,
            1,
        )?;
        let attempts_max = self.count(
            &format!("{at}.attempts_max"),
            raw.attempts_max,
            PROBE_ATTEMPTS_MAX_DEFAULT,
        )?;
        if raw.kind == "tcp" {
            if let Some(path) = raw.path {
                return Err(self.invalid(format!("{at}.path"), path, "a tcp probe has no path"));
            }
            return Ok(ReadinessProbe::Tcp {
                port,
                timeout,
                interval,
                attempts_max,
            });
        }
        let path = raw.path.unwrap_or_else(|| "/".to_owned());
        if !path.starts_with('/')
            || path.len() > ARG_LEN_MAX
            || path.chars().any(char::is_whitespace)
        {
            return Err(self.invalid(
                format!("{at}.path"),
                path,
                "must start with '/' and contain no whitespace",
            ));
        }
        Ok(ReadinessProbe::Http {
            port,
            path,
            timeout,
            interval,
            attempts_max,
        })
    }

    /// Kind `log`: a pattern and a timeout, nothing to dial. The logs are
    /// followed, not polled, so there is no interval or attempt count.
    fn log_readiness(&self, at: &str, raw: RawReadiness) -> Result<ReadinessProbe, CatalogError> {
        let stray = [
            ("port", raw.port.is_some()),
            ("path", raw.path.is_some()),
            ("interval_ms", raw.interval_ms.is_some()),
            ("attempts_max", raw.attempts_max.is_some()),
        ];
        self.refuse_set(
            at,
            &stray,
            "a readiness probe of kind \"log\" takes only pattern and timeout_ms",
        )?;
        let field = format!("{at}.pattern");
        let pattern = raw.pattern.ok_or_else(|| {
            self.invalid(
                &field,
                "missing",
                "a log probe needs the text its line contains",
            )
        })?;
        if pattern.is_empty()
            || pattern.len() > LOG_PATTERN_LEN_MAX
            || pattern.contains(['\n', '\r'])
        {
            return Err(self.invalid(
                &field,
                pattern,
                format!("must be 1 to {LOG_PATTERN_LEN_MAX} bytes on one line"),
            ));
        }
        let timeout = self.duration(
            &format!("{at}.timeout_ms"),
            raw.timeout_ms,
            LOG_PROBE_TIMEOUT_MS_DEFAULT,
            1,
        )?;
        Ok(ReadinessProbe::Log { pattern, timeout })
    }
}

// --- what a service needs to run ---------------------------------------------

/// Most plain or secret environment variables of one service.
pub const ENV_MAX: usize = 128;
/// Longest environment variable name, and the longest plain value.
pub(crate) const ENV_NAME_LEN_MAX: usize = 256;
pub(crate) const ENV_VALUE_LEN_MAX: usize = 32 * 1024;
/// Most mounts, extra labels and extra networks of one service.
pub(crate) const MOUNTS_MAX: usize = 32;
pub(crate) const LABELS_MAX: usize = 64;
pub(crate) const NETWORKS_MAX: usize = 8;
/// The bounds of `memory_mb` and `cpus`.
pub(crate) const MEMORY_MB_MIN: i64 = 6;
pub(crate) const MEMORY_MB_MAX: i64 = 1 << 20;
pub(crate) const CPUS_MIN: f64 = 0.01;
pub(crate) const CPUS_MAX: f64 = 1024.0;
/// Longest path (mount target, host path, secret file).
pub(crate) const PATH_LEN_MAX: usize = 1024;
/// The label prefix stead's own labels use; the catalog may not set it.
pub(crate) const RESERVED_LABEL_PREFIX: &str = "stead.";

pub(super) fn is_env_name(name: &str) -> bool {
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
pub(super) fn is_clean_absolute(path: &str) -> bool {
    path.len() <= PATH_LEN_MAX
        && !path.chars().any(char::is_control)
        && path.strip_prefix('/').is_some_and(|rest| {
            rest.is_empty() || rest.split('/').all(|c| !matches!(c, "" | "." | ".."))
        })
}

impl Checker<'_> {
    fn run(
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
        let mounts = self.mounts(at, &raw.volumes)?;
        let memory_bytes = match raw.memory_mb {
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
        };
        let nano_cpus = match raw.cpus {
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
        };
        if raw.labels.len() > LABELS_MAX {
            return Err(self.invalid(
                format!("{at}.labels"),
                raw.labels.len(),
                format!("at most {LABELS_MAX} labels"),
            ));
        }
        for (key, value) in &raw.labels {
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
        if raw.networks.len() > NETWORKS_MAX {
            return Err(self.invalid(
                format!("{at}.networks"),
                raw.networks.len(),
                format!("at most {NETWORKS_MAX} networks"),
            ));
        }
        for (i, network) in raw.networks.iter().enumerate() {
            let field = format!("{at}.networks[{i}]");
            if !is_object_name(network) {
                return Err(self.invalid(
                    field,
                    network,
                    "must be a network name (letters, digits, '_', '.', '-')",
                ));
            }
            if matches!(network.as_str(), "host" | "none" | "bridge")
                || network.starts_with(RESERVED_LABEL_PREFIX)
            {
                return Err(self.invalid(
                    field,
                    network,
                    "host, none, bridge and stead.* networks cannot be joined (every instance has its own network)",
                ));
            }
            if raw.networks[..i].contains(network) {
                return Err(self.invalid(field, network, "duplicate network"));
            }
        }
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
            instance_network: false,
        })
    }

    /// Where a secret's value comes from: a file inside a granted secret
    /// directory, or a daemon variable the operator passes through (never
    /// one of stead's own).
    fn secret_source(&self, field: &str, secret: &RawSecret) -> Result<SecretSource, CatalogError> {
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

    fn mounts(&self, at: &str, raw: &[RawVolume]) -> Result<Vec<Mount>, CatalogError> {
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
