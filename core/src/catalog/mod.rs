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

use super::fleet::RolloutState;
use super::grants::{Grant, Grants};
use super::names;
use super::release::Provisioning;
use super::spec::ServiceSpec;
use super::toml_error;

mod changes;
mod check;
mod hazards;
mod probes;
mod raw;
mod run;

pub use changes::CatalogChange;
pub use hazards::{reload_hazards, ReloadHazard};
use raw::RawCatalog;
pub use run::ENV_MAX;
pub(crate) use run::{is_clean_absolute, is_env_name, MEMORY_MB_MAX, MEMORY_MB_MIN};

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

    /// This catalog with the grants its recorded versions are read back
    /// against ([`Catalog::recorded_entry`]): for a catalog built from
    /// entries whose Helm type needs them (the simulation's).
    pub fn with_grants(self, grants: Grants) -> Catalog {
        Catalog { grants, ..self }
    }

    /// This catalog with each type's own table as a catalog file gives it
    /// (`sources`: type to table; [`Catalog::source_of`]), for a catalog
    /// built from entries that the daemon should record as it records a
    /// file's (the simulation's). Each source must read back through
    /// [`Catalog::from_toml`] to the very entry; the caller checks that.
    pub fn with_sources(self, sources: BTreeMap<String, String>) -> Catalog {
        Catalog { sources, ..self }
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
        Grant::HelmChart => "neither one of nor under any of",
        Grant::HelmNamespace => {
            "does not begin, before any placeholder, with the namespace prefix of"
        }
        Grant::DaemonEnv | Grant::Network | Grant::Capability => "not one of",
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
