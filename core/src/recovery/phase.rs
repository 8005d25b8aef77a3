//! Where the recovery machine is. Each stage carries the data that means
//! something there, so no combination of loose flags can be invalid: a
//! failed start's error exists only while the re-inspection decides whether
//! it was one (R11), an execution's stability only once its health was read
//! (R14), its binds only once they were read (R13), the inhibition's reason
//! only while the inhibited generation is withdrawn (R5).
//!
//! Three facts outlive any one stage and stay on the machine: what the pass
//! did to the route ([`Traffic`]), to the workload ([`Intervention`]), and
//! whether this daemon can vouch the route is up ([`Route`]).

use jiff::Timestamp;

use super::Verdict;
use crate::types::{Binds, Observation, RuntimeError};

/// An execution inspected this pass: the one a verification vouches for.
#[derive(Clone, Debug)]
pub(super) struct Observed {
    pub(super) obs: Observation,
    /// When the inspect that saw it answered: the instant a stable verdict
    /// vouches for (R14), never a later one.
    pub(super) at: Timestamp,
    /// Started or restarted by this pass, or not the execution last
    /// verified (fresh): it proves readiness before it is routed (R13).
    pub(super) new: bool,
}

/// An execution whose health was read (or, after a restart, not yet
/// trusted): whether it counts as continuously stable (R14).
#[derive(Clone, Debug)]
pub(super) struct Checked {
    pub(super) exec: Observed,
    pub(super) stable: bool,
}

/// An execution whose binds were read: everything its verification,
/// persistence, record and publication need.
#[derive(Clone, Debug)]
pub(super) struct Verifying {
    pub(super) exec: Observed,
    pub(super) stable: bool,
    pub(super) binds: Binds,
}

impl Verifying {
    pub(super) fn started_at(&self) -> Option<Timestamp> {
        self.exec.obs.started_at
    }
}

/// Where the machine is; each stage but `Done` owns exactly one command.
#[derive(Clone, Debug)]
pub(super) enum Phase {
    /// R5: the generation is durably inhibited for `reason`.
    WithdrawInhibited {
        reason: String,
    },
    /// R6.
    RetryPendingWithdrawal,
    Inspect,
    /// R7: the container is gone.
    ReleaseGoneClaims,
    WithdrawGone,
    /// R8: a fresh or down execution, withdrawn before anything else.
    WithdrawUnverified(Observed),
    // R9/R10: a down container is started.
    CheckPolicyForStart,
    Start,
    /// The start failed with `error`; the re-inspection tells whether the
    /// runtime's own restart won the race (then it was no error, R11).
    InspectAfterFailedStart {
        error: RuntimeError,
    },
    InspectStarted,
    ReadHealth(Observed),
    // R12: unhealthy past the threshold.
    CheckPolicyForRestart,
    WithdrawBeforeRestart,
    Restart,
    InspectRestarted,
    // R13: verification.
    ReadBinds(Checked),
    Probe(Verifying),
    Reinspect(Verifying),
    ReloadActive(Verifying),
    PersistBinds(Verifying),
    Publish(Verifying),
    /// S11: recorded before it is published.
    RecordExecution(Verifying),
    /// Published, then recorded: only with `PublishBeforeRecord` broken on
    /// purpose.
    RecordAfterPublish(Verifying),
    /// Withdraw after a failed verification, then finish as failed.
    WithdrawAfterFailure,
    // Stopped intent (R4).
    StoppedWithdraw,
    StoppedInspect,
    StoppedStop,
    Done(Verdict),
}

/// What this pass did to the service's route (R6, R8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Traffic {
    /// Not withdrawn this pass, and no withdrawal pending.
    Untouched,
    /// A withdrawal failed, this pass or an earlier one, and was not yet
    /// retried with success: carried to the next pass.
    WithdrawalPending,
    /// Withdrawn with success this pass: a later failure of this pass
    /// needs no second withdrawal, and a start or restart may follow.
    Withdrawn,
}

/// What this pass did to the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Intervention {
    None,
    /// Started or restarted it.
    Intervened,
    /// Its start lost the race to the runtime's own restart, which counted
    /// as the start (R11); a restart may have followed.
    StartRaceLost,
}

/// Whether this daemon can vouch that the service's route is up (R17, T5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    Vouched,
    /// It just started, withdrew the route since, or the proxy contradicts
    /// it: even an unchanged execution is published again.
    Unvouched,
}
