//! What the recovery machine asks for ([`Command`]) and what the caller
//! answers ([`Outcome`]).

use std::time::Duration;

use jiff::Timestamp;

use crate::errors::{
    failure_of, ErrorKind, PolicyError, PortName, ProbeError, StoreError, TrafficError,
};
use crate::machine::{MachineAnswer, MachineCommand};
use crate::types::{ActiveService, Binds, Health, Observation, RuntimeError};

/// One effect the caller must perform on the machine's exact generation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Command {
    /// Remove the service's route from the traffic plane.
    Withdraw,
    /// Inspect the exact container.
    Inspect,
    /// Release the bind claims of the (gone) container.
    ReleaseClaims,
    /// Check that bind and device grants still hold (R11).
    CheckPolicy,
    Start,
    Restart {
        grace: Duration,
    },
    Stop {
        grace: Duration,
    },
    ReadHealth,
    ReadBinds,
    /// Probe the readiness of execution `started_at` (the one inspected
    /// this pass) on `binds`.
    ProbeReadiness {
        binds: Binds,
        started_at: Option<Timestamp>,
    },
    /// Load ACTIVE for this service again.
    ReloadActive,
    /// Write binds to ACTIVE, only if the generation (container and
    /// `revision`) is unchanged.
    PersistBinds {
        binds: Binds,
        revision: String,
    },
    /// Route the service to `binds`, vouched for by execution `started_at`.
    Publish {
        binds: Binds,
        started_at: Option<Timestamp>,
    },
    /// Durably remember the verified execution (R17).
    RecordExecution {
        started_at: Timestamp,
    },
}

impl Command {
    /// Whether the command changes the workload itself.
    pub fn mutates_workload(&self) -> bool {
        matches!(self, Self::Start | Self::Restart { .. } | Self::Stop { .. })
    }

    /// Whether the command changes the world outside the database: the
    /// workload or the traffic plane. Such an effect cannot carry a fence,
    /// so it is issued only while the lease is trusted right now (T2);
    /// database writes carry the fence instead.
    pub fn is_outside_effect(&self) -> bool {
        self.mutates_workload() || matches!(self, Self::Withdraw | Self::Publish { .. })
    }
}

/// The result of performing a [`Command`]. Each variant answers exactly one
/// command kind; feeding the wrong one is a bug in the driver.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    Withdrawn(Result<(), TrafficError>),
    Inspected(Result<Observation, RuntimeError>),
    ClaimsReleased(Result<(), StoreError>),
    PolicyChecked(Result<(), PolicyError>),
    Started(Result<(), RuntimeError>),
    Restarted(Result<(), RuntimeError>),
    Stopped(Result<(), RuntimeError>),
    Health(Result<Health, RuntimeError>),
    Binds(Result<Binds, RuntimeError>),
    Readiness(Result<(), ProbeError>),
    /// `Ok(None)`: ACTIVE no longer has this service.
    ActiveReloaded(Result<Option<ActiveService>, StoreError>),
    /// `Ok(false)`: the generation changed underneath.
    BindsPersisted(Result<bool, StoreError>),
    Published(Result<(), TrafficError>),
    ExecutionRecorded(Result<(), StoreError>),
}

impl Outcome {
    /// The port and kind of the failure this outcome reports, if any.
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Withdrawn(r) | Self::Published(r) => failure_of(r),
            Self::Inspected(r) => failure_of(r),
            Self::Started(r) | Self::Restarted(r) | Self::Stopped(r) => failure_of(r),
            Self::Health(r) => failure_of(r),
            Self::Binds(r) => failure_of(r),
            Self::ClaimsReleased(r) | Self::ExecutionRecorded(r) => failure_of(r),
            Self::PolicyChecked(r) => failure_of(r),
            Self::Readiness(r) => failure_of(r),
            Self::ActiveReloaded(r) => failure_of(r),
            Self::BindsPersisted(r) => failure_of(r),
        }
    }
}

pub(crate) fn outcome_answers(outcome: &Outcome, cmd: &Command) -> bool {
    matches!(
        (outcome, cmd),
        (Outcome::Withdrawn(_), Command::Withdraw)
            | (Outcome::Inspected(_), Command::Inspect)
            | (Outcome::ClaimsReleased(_), Command::ReleaseClaims)
            | (Outcome::PolicyChecked(_), Command::CheckPolicy)
            | (Outcome::Started(_), Command::Start)
            | (Outcome::Restarted(_), Command::Restart { .. })
            | (Outcome::Stopped(_), Command::Stop { .. })
            | (Outcome::Health(_), Command::ReadHealth)
            | (Outcome::Binds(_), Command::ReadBinds)
            | (Outcome::Readiness(_), Command::ProbeReadiness { .. })
            | (Outcome::ActiveReloaded(_), Command::ReloadActive)
            | (Outcome::BindsPersisted(_), Command::PersistBinds { .. })
            | (Outcome::Published(_), Command::Publish { .. })
            | (
                Outcome::ExecutionRecorded(_),
                Command::RecordExecution { .. }
            )
    )
}

impl MachineCommand for Command {
    fn is_effect(&self) -> bool {
        self.is_outside_effect()
    }
}

impl MachineAnswer for Outcome {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        Outcome::port_failure(self)
    }
}
