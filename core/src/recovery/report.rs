//! What one recovery leaves behind: its [`Verdict`], its [`RecoveryError`]s,
//! the [`Report`] that carries them, and [`Why`] it asked for a command.

use jiff::Timestamp;

use super::ServiceMemory;
use crate::errors::{PolicyError, ProbeError, StoreError, TrafficError};
use crate::types::{ContainerStatus, GenerationKey, RuntimeError};

/// Why a service is not (yet) verified this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Running, verified, and routed (`published` says whether this pass had
    /// to publish or the route was already right).
    Verified {
        started_at: Option<Timestamp>,
        published: bool,
    },
    /// Restarting or starting: observed, retried next pass.
    Transitional,
    /// Down, but the budget delays the next attempt.
    Delayed { next_attempt: Option<Timestamp> },
    /// The container is confirmed gone; no reconstruction.
    Gone,
    /// Durably inhibited; never started.
    Inhibited,
    /// Stopped intent enforced.
    Stopped,
    /// Something failed; see the report's errors.
    Failed,
}

impl Verdict {
    /// Every label [`Verdict::label`] gives, in declaration order.
    pub const LABELS: [&'static str; 8] = [
        "verified",
        "published",
        "transitional",
        "delayed",
        "gone",
        "inhibited",
        "stopped",
        "failed",
    ];

    /// A metric label: which way the recovery of one service went (a
    /// verified service that had to be published this pass is told apart
    /// from one whose route was already right).
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Verified {
                published: false, ..
            } => "verified",
            Verdict::Verified {
                published: true, ..
            } => "published",
            Verdict::Transitional => "transitional",
            Verdict::Delayed { .. } => "delayed",
            Verdict::Gone => "gone",
            Verdict::Inhibited => "inhibited",
            Verdict::Stopped => "stopped",
            Verdict::Failed => "failed",
        }
    }
}

/// Errors one recovery reports, in the order they happened. A failure of
/// a port carries that port's typed error as its source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error("recovery inhibited ({reason}); no start attempted")]
    Inhibited { reason: String },
    #[error("withdrawal failed: {0}")]
    WithdrawFailed(#[source] TrafficError),
    #[error("inspect failed: {0}")]
    InspectFailed(#[source] RuntimeError),
    #[error("container is gone; traffic withdrawn, no reconstruction")]
    Gone,
    #[error("releasing bind claims failed: {0}")]
    ReleaseClaimsFailed(#[source] StoreError),
    #[error("container is {0}; refusing to act on it")]
    RefusedStatus(ContainerStatus),
    #[error("bind or device policy revoked: {0}")]
    PolicyRevoked(#[source] PolicyError),
    #[error("start failed: {0}")]
    StartFailed(#[source] RuntimeError),
    #[error("restart of unhealthy container failed: {0}")]
    RestartFailed(#[source] RuntimeError),
    #[error("stop failed: {0}")]
    StopFailed(#[source] RuntimeError),
    #[error("reading binds failed: {0}")]
    BindsFailed(#[source] RuntimeError),
    #[error("readiness failed: {0}")]
    NotReady(#[source] ProbeError),
    #[error("execution changed during verification")]
    ExecutionChanged,
    #[error("ACTIVE generation changed during verification")]
    GenerationChanged,
    #[error("reloading ACTIVE failed: {0}")]
    ReloadFailed(#[source] StoreError),
    #[error("persisting binds failed: {0}")]
    PersistFailed(#[source] StoreError),
    #[error("publication failed: {0}")]
    PublishFailed(#[source] TrafficError),
    #[error("recording the verified execution failed: {0}")]
    RecordFailed(#[source] StoreError),
    #[error("recovery deadline exceeded")]
    DeadlineExceeded,
    #[error("the lease or the instance lock is no longer trusted; left for the next pass")]
    MandateLost,
}

/// What one service recovery did and what it leaves behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub key: GenerationKey,
    pub verdict: Verdict,
    pub errors: Vec<RecoveryError>,
    /// Memory to keep for the next pass.
    pub memory: ServiceMemory,
    /// Whether this pass started or restarted the workload.
    pub intervened: bool,
    /// This pass's start failed because the runtime's own restart got
    /// there first; nothing was charged and no error reported (R11).
    pub start_race_lost: bool,
    /// How the last execution this pass saw down ended, when the runtime
    /// said: what a person reads first about a crash (a bake's revert
    /// names it, #55).
    pub exit: Option<crate::types::Exit>,
}

/// Why the machine asks for its outstanding command: what an operator reads
/// in the log line of an intervention, and the `reason` label of failure
/// counters. Derived from where the machine is; it decides nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Why {
    /// R5: the generation is durably inhibited.
    Inhibited,
    /// R6: a previous withdrawal failed and is retried.
    RetryWithdrawal,
    /// R7: the container is gone.
    Gone,
    /// R8: a fresh execution or a down container, withdrawn before anything
    /// else is done to it.
    FailClosed,
    /// R9: the container is down and is started.
    Down,
    /// R12: unhealthy past the threshold; withdrawn, then restarted.
    Unhealthy,
    /// R13: verification failed; withdrawn.
    VerificationFailed,
    /// R4: stopped intent (or the instance is being deleted).
    Stopped,
    /// R13: published because the execution was started or restarted by
    /// this pass, is new, or this daemon cannot vouch for the route.
    NewExecution,
    /// R13: published because the verified binds changed.
    BindsChanged,
    /// R17, T5: published because this daemon cannot vouch the route is up
    /// (it just started, or withdrew it since), or the proxy lost it.
    RouteUnvouched,
    /// Reading and verifying: no intervention.
    Observe,
}

impl Why {
    pub const ALL: [Why; 12] = [
        Why::Inhibited,
        Why::RetryWithdrawal,
        Why::Gone,
        Why::FailClosed,
        Why::Down,
        Why::Unhealthy,
        Why::VerificationFailed,
        Why::Stopped,
        Why::NewExecution,
        Why::BindsChanged,
        Why::RouteUnvouched,
        Why::Observe,
    ];

    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            Why::Inhibited => "inhibited",
            Why::RetryWithdrawal => "retry",
            Why::Gone => "gone",
            Why::FailClosed => "fail_closed",
            Why::Down => "down",
            Why::Unhealthy => "unhealthy",
            Why::VerificationFailed => "verification_failed",
            Why::Stopped => "stopped",
            Why::NewExecution => "new_execution",
            Why::BindsChanged => "binds_changed",
            Why::RouteUnvouched => "route_unvouched",
            Why::Observe => "observe",
        }
    }

    /// The reason in words, with the rule that gives it.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Inhibited => "the generation is inhibited (R5)",
            Why::RetryWithdrawal => "retrying a withdrawal that failed (R6)",
            Why::Gone => "the container is gone, and is not recreated (R7)",
            Why::FailClosed => "a new or down execution is withdrawn before anything else (R8)",
            Why::Down => "the container was down (R9)",
            Why::Unhealthy => "unhealthy past the threshold (R12)",
            Why::VerificationFailed => "verification failed (R13)",
            Why::Stopped => "stopped intent, or the instance is being deleted (R4)",
            Why::NewExecution => "a new execution verified ready (R13)",
            Why::BindsChanged => "its verified binds changed (R13)",
            Why::RouteUnvouched => {
                "its route was not known to be up: this daemon restarted, or the proxy lost it \
                 (R17, T5)"
            }
            Why::Observe => "observing",
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}
