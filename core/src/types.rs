//! Domain types of the recovery pass: who a workload is, what the runtime
//! says about it, and what the database says it should be.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use jiff::Timestamp;

// Names are shared, immutable strings: a pass copies keys into commands,
// reports and memory thousands of times, and a copy is a reference count,
// not an allocation (issue #14).

/// The name of one tenant's deployment; also its release name.
#[derive(Clone, Debug)]
pub struct InstanceName(Arc<str>);

/// The name of one workload inside an instance (`web`, `worker`).
#[derive(Clone, Debug)]
pub struct ServiceName(Arc<str>);

/// The runtime's ID of one exact container.
#[derive(Clone, Debug)]
pub struct ContainerId(Arc<str>);

macro_rules! string_newtype {
    ($t:ident) => {
        impl $t {
            pub fn new(s: impl Into<String>) -> Self {
                Self(Arc::from(s.into()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// The empty name, which sorts before every other: the start
            /// of a range of keys that begin with something else. Shared,
            /// so a range lookup allocates nothing.
            pub fn least() -> Self {
                static LEAST: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
                Self(LEAST.get_or_init(|| Arc::from("")).clone())
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        /// As its name: a catalog spec's digest (`core::spec::digest_of`)
        /// reads a service's, a flight recording (`core::record`) all.
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map(Self::new)
            }
        }
        impl From<&str> for $t {
            fn from(s: &str) -> Self {
                Self(Arc::from(s))
            }
        }
        // By content, as the strings compare; a copy of the same name (the
        // common case: keys are copied from one another) is told equal by
        // its pointer, without reading the bytes.
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
            }
        }
        impl Eq for $t {}
        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state)
            }
        }
        impl Ord for $t {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    std::cmp::Ordering::Equal
                } else {
                    self.0.cmp(&other.0)
                }
            }
        }
        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
    };
}
string_newtype!(InstanceName);
string_newtype!(ServiceName);
string_newtype!(ContainerId);

/// One generation: recovery memory is keyed by the exact container that
/// serves (or served) a service, so a replaced container never inherits its
/// predecessor's crash history.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct GenerationKey {
    pub instance: InstanceName,
    pub service: ServiceName,
    pub container: ContainerId,
}

/// (instance, service): the unit of traffic publication.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub instance: InstanceName,
    pub service: ServiceName,
}

/// As `instance.service` (both are DNS labels, which never hold a dot:
/// `core::names`), so a map keyed by services is a JSON object (a flight
/// recording's routes, `core::record`).
impl serde::Serialize for ServiceKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{}.{}", self.instance, self.service))
    }
}

impl<'de> serde::Deserialize<'de> for ServiceKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = String::deserialize(deserializer)?;
        match key.split_once('.') {
            Some((instance, service)) => Ok(Self {
                instance: InstanceName::from(instance),
                service: ServiceName::from(service),
            }),
            None => Err(serde::de::Error::invalid_value(
                serde::de::Unexpected::Str(&key),
                &"a service key `instance.service`",
            )),
        }
    }
}

/// Container port → loopback host port, read from the exact container.
/// Probes and traffic dial these, never container IPs.
pub type Binds = BTreeMap<u16, u16>;

/// What one readiness probe vouches for: one execution of one container
/// and the binds read from it. A restart is a new execution the probe
/// does not vouch for, so the machine that will publish the result names
/// the execution it inspected, and the probe never guesses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    pub container: ContainerId,
    /// When the probed execution started; `None` when the runtime reported
    /// no start, which a probe that reads the execution's logs refuses.
    pub started_at: Option<Timestamp>,
    pub binds: Binds,
}

/// What the runtime says a container is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ContainerStatus {
    Running,
    /// Transitional: the runtime is restarting it right now.
    Restarting,
    /// Transitional: starting up.
    Starting,
    Created,
    Exited,
    Dead,
    Stopped,
    Paused,
    /// Anything the runtime reported that stead does not recognise, or an
    /// empty status. Refused, never acted on.
    Unknown,
}

impl ContainerStatus {
    /// Parses the runtime's status word. Unrecognised words are `Unknown`
    /// rather than an error: the recovery pass refuses to act on them.
    pub fn parse(word: &str) -> Self {
        match word {
            "running" => Self::Running,
            "restarting" => Self::Restarting,
            "starting" => Self::Starting,
            "created" => Self::Created,
            "exited" => Self::Exited,
            "dead" => Self::Dead,
            "stopped" => Self::Stopped,
            "paused" => Self::Paused,
            _ => Self::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Restarting => "restarting",
            Self::Starting => "starting",
            Self::Created => "created",
            Self::Exited => "exited",
            Self::Dead => "dead",
            Self::Stopped => "stopped",
            Self::Paused => "paused",
            Self::Unknown => "unknown",
        }
    }

    /// `restarting` and `starting` are observed and retried, never acted on,
    /// and keep their traffic.
    pub fn is_transitional(self) -> bool {
        matches!(self, Self::Restarting | Self::Starting)
    }

    /// States in which a running-intent container is started (R9).
    pub fn is_down(self) -> bool {
        matches!(
            self,
            Self::Created | Self::Exited | Self::Dead | Self::Stopped
        )
    }

    /// States that are refused without touching the workload (R9).
    pub fn is_refused(self) -> bool {
        matches!(self, Self::Paused | Self::Unknown)
    }
}

impl fmt::Display for ContainerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One inspection of the exact container.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Observation {
    pub status: ContainerStatus,
    /// Start of the current execution. A native runtime restart changes it.
    /// `None` when the runtime never started it.
    pub started_at: Option<Timestamp>,
    /// How the last execution ended, while the container is down; `None`
    /// while it runs or when it never ran. Reported to operators only:
    /// no decision reads it.
    pub exit: Option<Exit>,
}

/// `at` without its fraction of a second, as people read a time.
pub fn whole_seconds(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// How a container's last execution ended, as the runtime says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exit {
    /// The process's exit code (Docker's `State.ExitCode`: 137 when killed,
    /// 143 when terminated).
    pub code: i64,
    /// When it ended (`State.FinishedAt`); `None` when the runtime does
    /// not say.
    pub finished_at: Option<Timestamp>,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exited with code {}", self.code)?;
        match self.finished_at {
            Some(at) => write!(f, " at {}", whole_seconds(at)),
            None => Ok(()),
        }
    }
}

/// Why an inspection (or a mutation) of a container did not answer. Its
/// kind is `core::errors::ErrorKind` through `PortFailure`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum RuntimeError {
    /// The runtime confirmed the container does not exist.
    #[error("container not found")]
    NotFound,
    /// The runtime is busy with the container already (Docker's 409: a
    /// start or removal already in progress). Changes nothing.
    #[error("runtime conflict: {0}")]
    Conflict(String),
    /// Refused for what was asked: the container is not the generation's
    /// (T6), its image cannot be pulled (missing, or access denied), or the
    /// runtime's answer is unusable. Asking again fails alike.
    #[error("runtime refused: {0}")]
    Refused(String),
    /// Anything else: a timeout, a 500, a refused connection. Changes nothing.
    #[error("runtime error: {0}")]
    Transient(String),
}

/// A container's healthcheck verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Health {
    /// The container has no healthcheck: never restart it for health.
    None,
    Starting,
    Healthy,
    Unhealthy,
}

/// Durable reason a generation must not be started.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum InhibitionReason {
    /// The special marker: this superseded container waits to be retired.
    RetirementPending,
    /// Any other reason (`operator-hold`, `failed-deploy`, …): never start.
    Hold(String),
}

impl InhibitionReason {
    pub const RETIREMENT_PENDING: &'static str = "retirement-pending";
    /// The hold an upgrade puts on a service its new version dropped,
    /// while it retires it.
    pub const SERVICE_DROPPED: &'static str = "service-dropped";
    /// The hold a `stop-first` upgrade puts on the predecessor it stops
    /// (#40): across a crash, nothing starts it beside a candidate the
    /// upgrade may have left running. The next upgrade of the instance
    /// (or its tidy-up when the rollout is halted) removes such candidates
    /// first, then clears the hold.
    pub const STOP_FIRST: &'static str = "stop-first";

    /// Whether this is a `stop-first` upgrade's hold (stead's own, never
    /// an operator's).
    pub fn is_stop_first(&self) -> bool {
        matches!(self, Self::Hold(reason) if reason == Self::STOP_FIRST)
    }

    /// Whether this is a hold an upgrade of stead's puts on a generation
    /// while it replaces it (`stop-first`) or retires it (a dropped
    /// service), never an operator's. Found on a service the catalog lists,
    /// it is a leftover of an upgrade that did not finish (or of a catalog
    /// that dropped the service and listed it again): the next upgrade
    /// clears it, and never carries it forward as an operator's.
    pub(crate) fn is_upgrades(&self) -> bool {
        matches!(self, Self::Hold(reason)
            if reason == Self::STOP_FIRST || reason == Self::SERVICE_DROPPED)
    }

    pub fn parse(word: &str) -> Self {
        if word == Self::RETIREMENT_PENDING {
            Self::RetirementPending
        } else {
            Self::Hold(word.to_owned())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::RetirementPending => Self::RETIREMENT_PENDING,
            Self::Hold(reason) => reason,
        }
    }
}

/// A durable, generation-scoped record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inhibition {
    pub service: ServiceName,
    pub container: ContainerId,
    pub reason: InhibitionReason,
    /// The operation that wrote it (e.g. `upgrade`), for operators.
    pub operation: String,
    pub created_at: Timestamp,
    /// The grace to retire a `retirement-pending` container with.
    pub stop_grace: Option<Duration>,
    /// On an upgrade's `retirement-pending` marker: the way back while the
    /// successor bakes (#40). `None` on every other record, and on a
    /// marker that retires as soon as its successor serves.
    pub revert_to: Option<RevertTo>,
}

/// What a baking upgrade goes back to (#40). Written with the
/// predecessor's marker before ACTIVE switches, so a revert needs nothing
/// the upgrade knew but did not save: until `until`, the predecessor is
/// stopped but kept, and a failing successor is replaced by it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RevertTo {
    /// The predecessor's ACTIVE revision and verified binds.
    pub revision: String,
    pub binds: Binds,
    /// The instance's version and spec digest before the upgrade.
    pub version: String,
    pub spec_digest: Option<String>,
    /// The end of the bake window.
    pub until: Timestamp,
    /// The hold the predecessor carried (an operator's), which its marker
    /// replaced (one record per generation): a revert puts it back, so a
    /// held generation made ACTIVE again is still never started (R5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    /// The service is replaced `stop-first`: a revert stops the successor
    /// before ACTIVE names the predecessor again, so the two never run at
    /// once on the service's volumes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_first: bool,
    /// An operator asked for the way back (`stead rollout undo`): the
    /// next recovery pass reverts as if the successor had failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub undone: bool,
}

impl Inhibition {
    /// Whether this is an upgrade's marker whose successor still bakes at
    /// `now`: its predecessor is kept, stopped, to go back to.
    pub fn bakes_at(&self, now: Timestamp) -> Option<&RevertTo> {
        self.revert_to
            .as_ref()
            .filter(|r| self.reason == InhibitionReason::RetirementPending && now < r.until)
    }
}

/// The durable record of the generation one service serves now.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ActiveService {
    pub container: ContainerId,
    /// Changes whenever the spec or image of the generation changes.
    pub effective_revision: String,
    /// Verified backend binds; written only after readiness passed (R13).
    pub binds: Binds,
    /// Grace period for stopping this service.
    pub stop_grace: Option<Duration>,
    /// The last execution the daemon verified (R17), so a restarted daemon
    /// need not blink traffic for executions that provably did not change.
    pub verified_started_at: Option<Timestamp>,
}

/// ACTIVE for one instance: service name → serving generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ActiveRecord {
    pub services: BTreeMap<ServiceName, ActiveService>,
}

impl ActiveRecord {
    /// Whether ACTIVE names this container for any service.
    pub fn names_container(&self, container: &ContainerId) -> bool {
        self.services.values().any(|s| &s.container == container)
    }
}

/// What the operator wants for an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Intent {
    Running,
    Stopped,
}
