//! Verifying one execution of a container before it may serve, for a
//! container no recovery pass has published: wait (bounded, by timeouts,
//! not sleeps) until it runs, read its binds, probe its readiness on them,
//! then inspect it again to make sure the execution that passed is still
//! the one running (R13's order). An upgrade verifies its successors so;
//! an undo the predecessors it starts again.
//!
//! A part of a machine, not a machine of its own: its owner issues the
//! commands it names, under its own vocabulary, and feeds the answers back.

use std::time::Duration;

use jiff::Timestamp;

use super::errors::{Cause, ErrorKind, ProbeError};
use super::spec::ReadinessProbe;
use super::types::{Binds, ContainerId, ContainerStatus, Observation, ProbeTarget, RuntimeError};

/// How long a container may take to report running.
pub(crate) const RUNNING_WAIT_MAX: Duration = Duration::from_secs(60);
/// The pause between inspections of a container that is not running yet.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// What a verification asks its owner to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Inspect(ContainerId),
    ReadBinds(ContainerId),
    /// Probe the readiness of the execution seen running, on the binds
    /// read from it.
    Probe {
        readiness: ReadinessProbe,
        target: ProbeTarget,
    },
    /// Nothing until [`RETRY_INTERVAL`] has passed
    /// ([`Verification::waited`]).
    Wait,
}

/// Where a verification stands after an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    Going,
    /// This execution, on these binds, is verified.
    Verified {
        started_at: Timestamp,
        binds: Binds,
    },
    /// It failed: the container is not ready (or was not at some point).
    Failed(Cause),
}

#[derive(Clone, Debug)]
enum Stage {
    WaitRunning { tries: u32 },
    Retry { tries: u32 },
    ReadBinds { started_at: Timestamp },
    Probe { started_at: Timestamp, binds: Binds },
    Confirm { started_at: Timestamp, binds: Binds },
}

/// One container's verification. `noun` names it in failures ("candidate",
/// "predecessor").
#[derive(Clone, Debug)]
pub(crate) struct Verification {
    container: ContainerId,
    readiness: ReadinessProbe,
    noun: &'static str,
    stage: Stage,
}

impl Verification {
    pub fn new(container: ContainerId, readiness: ReadinessProbe, noun: &'static str) -> Self {
        Self {
            container,
            readiness,
            noun,
            stage: Stage::WaitRunning { tries: 0 },
        }
    }

    pub fn container(&self) -> &ContainerId {
        &self.container
    }

    fn tries_max() -> u32 {
        (RUNNING_WAIT_MAX.as_millis() / RETRY_INTERVAL.as_millis()) as u32
    }

    /// What to do next.
    pub fn check(&self) -> Check {
        let container = self.container.clone();
        match &self.stage {
            Stage::WaitRunning { .. } | Stage::Confirm { .. } => Check::Inspect(container),
            Stage::Retry { .. } => Check::Wait,
            Stage::ReadBinds { .. } => Check::ReadBinds(container),
            Stage::Probe { started_at, binds } => Check::Probe {
                readiness: self.readiness.clone(),
                target: ProbeTarget {
                    container,
                    started_at: Some(*started_at),
                    binds: binds.clone(),
                },
            },
        }
    }

    /// [`Check::Wait`] is over: inspect it again.
    pub fn waited(&mut self) {
        if let Stage::Retry { tries } = self.stage {
            self.stage = Stage::WaitRunning { tries };
        }
    }

    pub fn inspected(&mut self, inspected: Result<Observation, RuntimeError>) -> Progress {
        match (&self.stage, inspected) {
            (Stage::WaitRunning { tries }, inspected) => {
                let tries = *tries;
                match inspected {
                    Ok(obs) if obs.status == ContainerStatus::Running => match obs.started_at {
                        Some(started_at) => {
                            self.stage = Stage::ReadBinds { started_at };
                            Progress::Going
                        }
                        None => self.retry_or_fail(tries),
                    },
                    Ok(obs) if obs.status.is_down() => {
                        self.failed(format!("{} is {}", self.noun, obs.status))
                    }
                    Err(RuntimeError::NotFound) => self.failed(format!("{} vanished", self.noun)),
                    Ok(_) | Err(_) => self.retry_or_fail(tries),
                }
            }
            (Stage::Confirm { started_at, binds }, inspected) => match inspected {
                Ok(obs)
                    if obs.status == ContainerStatus::Running
                        && obs.started_at == Some(*started_at) =>
                {
                    Progress::Verified {
                        started_at: *started_at,
                        binds: binds.clone(),
                    }
                }
                _ => self.failed(format!("{} restarted during verification", self.noun)),
            },
            (stage, _) => panic!("an inspection answered at {stage:?}"),
        }
    }

    pub fn binds(&mut self, read: Result<Binds, RuntimeError>) -> Progress {
        let Stage::ReadBinds { started_at } = self.stage else {
            panic!("binds answered at {:?}", self.stage)
        };
        match read {
            Ok(binds) => {
                self.stage = Stage::Probe { started_at, binds };
                Progress::Going
            }
            Err(e) => Progress::Failed(e.into()),
        }
    }

    pub fn probed(&mut self, result: Result<(), ProbeError>) -> Progress {
        let Stage::Probe { started_at, binds } = &self.stage else {
            panic!("a probe answered at {:?}", self.stage)
        };
        match result {
            Ok(()) => {
                self.stage = Stage::Confirm {
                    started_at: *started_at,
                    binds: binds.clone(),
                };
                Progress::Going
            }
            Err(error) => Progress::Failed(error.into()),
        }
    }

    /// Looks again at a container not yet running, or gives up on it once
    /// it has had [`RUNNING_WAIT_MAX`].
    fn retry_or_fail(&mut self, tries: u32) -> Progress {
        if tries + 1 >= Self::tries_max() {
            self.failed(format!("{} never reported running", self.noun))
        } else {
            self.stage = Stage::Retry { tries: tries + 1 };
            Progress::Going
        }
    }

    fn failed(&self, message: String) -> Progress {
        Progress::Failed(not_ready(message))
    }
}

/// A container that did not come up: it may on another attempt (a slow
/// start, a dependency not up yet), so the kind is not a permanent one.
pub fn not_ready(message: impl Into<String>) -> Cause {
    Cause::verdict(ErrorKind::NotReady, message)
}
