//! A flight recording of instance passes (issue #44): what one pass was
//! handed and answered, enough to hand the same machine the same things
//! again (`stead replay`). Data and words only: the engine writes it
//! (`engine::flight`) and replays it (`engine::replay`).
//!
//! One [`RecordedPass`] is one JSON line. Each line carries its policy, so
//! a ring that drops its oldest lines never loses a header.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::bake::RevertStep;
use super::errors::StoreError;
use super::fleet::IllegalTransition;
use super::machine::Abandon;
use super::memory::InstanceMemory;
use super::pass::{InstanceAnswer, InstanceCommand, PassInput};
use super::policy::RecoveryPolicy;
use super::recovery::Command;

/// The version of the line format; a reader refuses any other.
pub const FORMAT: u32 = 1;

/// One instance pass, whole.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecordedPass {
    /// [`FORMAT`].
    pub format: u32,
    /// The policy the pass ran under.
    pub policy: RecoveryPolicy,
    /// Everything the machine was built from, with the `now` it was
    /// built with.
    pub input: PassInput,
    /// Every command performed, in order, with its answer and the instant
    /// handed with it.
    pub steps: Vec<RecordedStep>,
    /// Why the driver gave up before the machine finished, if it did.
    pub abandoned: Option<Abandon>,
    /// The memory the pass left.
    pub after: InstanceMemory,
}

/// One command, as the machine saw it answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedStep {
    pub command: InstanceCommand,
    pub answer: InstanceAnswer,
    /// The `now` the machine was handed with the answer.
    pub now: Timestamp,
}

/// A `&'static str` of an error (a table, a field, a lifecycle's state)
/// read back from a recording: a handful per recording, and a replay reads
/// one file and exits, so each is leaked.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// [`StoreError`] as a recording holds it, its names owned.
#[derive(Deserialize)]
enum StoreErrorLine {
    Unavailable(String),
    BadRow {
        table: String,
        id: String,
        field: String,
        value: String,
    },
    Conflict(String),
    Fenced {
        epoch: i64,
    },
    LockLost {
        instance: crate::fleet::InstanceId,
        holder: String,
    },
    NotFound(String),
}

impl<'de> Deserialize<'de> for StoreError {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match StoreErrorLine::deserialize(deserializer)? {
            StoreErrorLine::Unavailable(m) => Self::Unavailable(m),
            StoreErrorLine::BadRow {
                table,
                id,
                field,
                value,
            } => Self::BadRow {
                table: leak(table),
                id,
                field: leak(field),
                value,
            },
            StoreErrorLine::Conflict(m) => Self::Conflict(m),
            StoreErrorLine::Fenced { epoch } => Self::Fenced { epoch },
            StoreErrorLine::LockLost { instance, holder } => Self::LockLost { instance, holder },
            StoreErrorLine::NotFound(m) => Self::NotFound(m),
        })
    }
}

/// [`IllegalTransition`] as a recording holds it.
#[derive(Deserialize)]
struct IllegalTransitionLine {
    lifecycle: String,
    from: String,
    to: String,
}

impl<'de> Deserialize<'de> for IllegalTransition {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let line = IllegalTransitionLine::deserialize(deserializer)?;
        Ok(Self {
            lifecycle: leak(line.lifecycle),
            from: leak(line.from),
            to: leak(line.to),
        })
    }
}

/// A command in words, as an operator reads a replay's divergence.
pub struct Described<'a>(pub &'a InstanceCommand);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            InstanceCommand::Service { key, command } => {
                write!(
                    f,
                    "{} of service {} (container {})",
                    Words(command),
                    key.service,
                    key.container
                )
            }
            InstanceCommand::InspectSuccessor(c) => write!(f, "inspect successor container {c}"),
            InstanceCommand::InspectPredecessor(c) => {
                write!(f, "inspect baking predecessor container {c}")
            }
            InstanceCommand::ReadRoutes => f.write_str("read the proxy's routes back"),
            InstanceCommand::StopPredecessor { generation, grace } => write!(
                f,
                "stop predecessor {} of service {} (grace {grace:?})",
                generation.container, generation.service
            ),
            InstanceCommand::RemovePredecessor(g) => {
                write!(
                    f,
                    "remove predecessor {} of service {}",
                    g.container, g.service
                )
            }
            InstanceCommand::ReleaseClaims(g) => {
                write!(
                    f,
                    "release the claims of {} of service {}",
                    g.container, g.service
                )
            }
            InstanceCommand::ClearMarker(g) => write!(
                f,
                "clear the retirement marker of {} of service {}",
                g.container, g.service
            ),
            InstanceCommand::WithdrawStale(key) => {
                write!(f, "withdraw the stale route of service {}", key.service)
            }
            InstanceCommand::Revert { service_type, step } => {
                write!(f, "revert ({service_type}): {}", RevertWords(step))
            }
        }
    }
}

struct Words<'a>(&'a Command);

impl fmt::Display for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Command::Withdraw => f.write_str("withdraw the route"),
            Command::Inspect => f.write_str("inspect"),
            Command::ReleaseClaims => f.write_str("release the bind claims"),
            Command::CheckPolicy => f.write_str("check the grants"),
            Command::Start => f.write_str("start"),
            Command::Restart { grace } => write!(f, "restart (grace {grace:?})"),
            Command::Stop { grace } => write!(f, "stop (grace {grace:?})"),
            Command::ReadHealth => f.write_str("read the health"),
            Command::ReadBinds => f.write_str("read the binds"),
            Command::ProbeReadiness { binds, started_at } => {
                write!(
                    f,
                    "probe readiness on {binds:?} of execution {}",
                    At(started_at)
                )
            }
            Command::ReloadActive => f.write_str("reload ACTIVE"),
            Command::PersistBinds { binds, revision } => {
                write!(f, "persist binds {binds:?} at revision {revision}")
            }
            Command::Publish { binds, started_at } => {
                write!(
                    f,
                    "publish the route to {binds:?} for execution {}",
                    At(started_at)
                )
            }
            Command::RecordExecution { started_at } => {
                write!(f, "record verified execution {started_at}")
            }
        }
    }
}

struct RevertWords<'a>(&'a RevertStep);

impl fmt::Display for RevertWords<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RevertStep::HaltRollout { reason } => write!(f, "halt the rollout ({reason})"),
            RevertStep::SaveMarker(marker) => {
                write!(
                    f,
                    "save the marker of {} of service {}",
                    marker.container, marker.service
                )
            }
            RevertStep::StopSuccessor { generation, .. } => write!(
                f,
                "stop successor {} of service {}",
                generation.container, generation.service
            ),
            RevertStep::RestoreActive { service, record } => write!(
                f,
                "make {} ACTIVE again for service {service}",
                record.container
            ),
            RevertStep::RestoreVersion { version, .. } => {
                write!(f, "restore version {version}")
            }
        }
    }
}

struct At<'a>(&'a Option<Timestamp>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(at) => write!(f, "{at}"),
            None => f.write_str("(no start)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::InstanceAnswer;
    use crate::recovery::Outcome;
    use crate::types::{GenerationKey, RuntimeError};
    use std::sync::Arc;

    #[test]
    fn a_step_reads_back_as_it_was_written() {
        let key = Arc::new(GenerationKey {
            instance: "acme".into(),
            service: "web".into(),
            container: "c1".into(),
        });
        let step = RecordedStep {
            command: InstanceCommand::Service {
                key,
                command: Command::Start,
            },
            answer: InstanceAnswer::Service(Outcome::Started(Err(RuntimeError::Conflict(
                "busy".into(),
            )))),
            now: Timestamp::UNIX_EPOCH,
        };
        let line = serde_json::to_string(&step).unwrap();
        let back: RecordedStep = serde_json::from_str(&line).unwrap();
        assert_eq!(back, step);
        assert_eq!(
            Described(&back.command).to_string(),
            "start of service web (container c1)"
        );
    }
}
