//! The per-service recovery machine (R4–R14), sans-IO.
//!
//! The machine never performs anything. The caller drives it:
//!
//! 1. [`ServiceRecovery::poll_command`] yields the next [`Command`] (or
//!    `None` when the machine is finished);
//! 2. the caller performs that command through a port and feeds the result
//!    back with [`ServiceRecovery::handle`], passing the current `now`;
//! 3. repeat until `poll_command` returns `None`, then take the
//!    [`Report`] with [`ServiceRecovery::into_report`].
//!
//! If the caller gives up (the per-instance deadline passed), it calls
//! [`ServiceRecovery::abandon`] instead, which fails closed.
//!
//! The same machine is driven by the async engine, by the synchronous test
//! driver in `tests/`, and by a fuzzer feeding it arbitrary outcomes.

use std::time::Duration;

use jiff::Timestamp;

use super::budget::{Budget, BudgetEntry};
use super::errors::{
    failure_of, ErrorKind, PolicyError, PortName, ProbeError, StoreError, TrafficError,
};
use super::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use super::policy::RecoveryPolicy;
use super::types::{
    ActiveService, Binds, ContainerStatus, GenerationKey, Health, Intent, Observation, RuntimeError,
};

/// Hard bound on the commands one service recovery may issue. The longest
/// path is about a dozen; anything near this bound is a bug.
pub const COMMANDS_PER_RECOVERY_MAX: u32 = 24;

/// Everything the recovery pass remembers about one generation between
/// passes. Volatile by design (R17), except `verified_started_at`, which
/// the engine also persists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenerationMemory {
    pub budget: Option<BudgetEntry>,
    /// The last execution this daemon verified and routed.
    pub verified_started_at: Option<Timestamp>,
}

impl GenerationMemory {
    pub fn is_empty(&self) -> bool {
        self.budget.is_none() && self.verified_started_at.is_none()
    }
}

/// Memory of one service as handed to (and returned by) a recovery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceMemory {
    pub generation: GenerationMemory,
    /// A previous withdrawal failed and was not yet retried with success
    /// (R6). Keyed by service, not generation.
    pub withdrawal_pending: bool,
}

/// The inputs of one service's recovery.
#[derive(Clone, Debug)]
pub struct ServiceInput {
    pub key: GenerationKey,
    /// ACTIVE as loaded at the start of the pass.
    pub active: ActiveService,
    pub intent: Intent,
    /// A durable inhibition (any reason but `retirement-pending`) on this
    /// exact generation, by reason.
    pub inhibition: Option<String>,
    pub memory: ServiceMemory,
    /// What the traffic plane holds for this service, read back at the
    /// start of the pass (T5).
    pub proxy: ProxyView,
}

/// The traffic plane's route of one service, as read back from the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyView {
    /// Not read (a targeted pass) or the read failed: trust memory (R17).
    #[default]
    Unknown,
    /// The proxy holds no route for the service.
    Absent,
    /// The proxy routes the service to this loopback host port.
    Dials(u16),
}

impl ProxyView {
    /// T5: whether the proxy provably does not route the service to
    /// `binds` (absent, or to another port). Such a route is republished
    /// after verifying the execution, as a restarted daemon does (R17):
    /// an idempotent upsert, never a new probe of an unchanged execution.
    /// A service without binds (no ports: a worker, a database reached on
    /// the instance network) is never routed, so nothing can contradict it.
    pub fn contradicts(self, binds: &Binds) -> bool {
        match self {
            _ if binds.is_empty() => false,
            ProxyView::Unknown => false,
            ProxyView::Absent => true,
            ProxyView::Dials(port) => binds.values().next() != Some(&port),
        }
    }
}

/// One effect the caller must perform on the machine's exact generation.
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Where the machine is; each state but `Done` owns exactly one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    WithdrawInhibited,
    RetryPendingWithdrawal,
    Inspect,
    ReleaseGoneClaims,
    WithdrawGone,
    WithdrawUnverified,
    CheckPolicyForStart,
    Start,
    InspectAfterFailedStart,
    InspectStarted,
    ReadHealth,
    CheckPolicyForRestart,
    WithdrawBeforeRestart,
    Restart,
    InspectRestarted,
    ReadBinds,
    Probe,
    Reinspect,
    ReloadActive,
    PersistBinds,
    Publish,
    RecordExecution,
    /// Withdraw after a failed verification, then finish as failed.
    WithdrawAfterFailure,
    // Stopped intent (R4).
    StoppedWithdraw,
    StoppedInspect,
    StoppedStop,
    Done,
}

/// The recovery of one service for one pass. See the module docs for the
/// call order.
#[derive(Debug)]
pub struct ServiceRecovery<'p> {
    policy: &'p RecoveryPolicy,
    key: GenerationKey,
    active: ActiveService,
    inhibition: Option<String>,
    budget: Budget,
    verified_started_at: Option<Timestamp>,
    /// This daemon cannot vouch that the route is currently published.
    route_unknown: bool,
    withdrawal_pending: bool,
    phase: Phase,
    /// The command yielded by `poll_command` and not yet answered.
    outstanding: Option<Command>,
    commands_issued: u32,
    withdrawn_this_pass: bool,
    fresh: bool,
    /// When the first inspect of this pass answered: the instant a
    /// stable verdict vouches for.
    observed_at: Option<Timestamp>,
    started: bool,
    restarted: bool,
    /// A failed start's error, held until the re-inspection says whether
    /// the runtime's own restart won the race (then it is no error, R11).
    start_error: Option<RuntimeError>,
    /// This pass's start lost the race to the runtime's own restart,
    /// which counted as the start (R11).
    start_race_lost: bool,
    stable: bool,
    published: bool,
    /// The execution being verified.
    observed: Option<Observation>,
    binds: Binds,
    verdict: Verdict,
    errors: Vec<RecoveryError>,
}

impl<'p> ServiceRecovery<'p> {
    pub fn new(policy: &'p RecoveryPolicy, input: ServiceInput) -> Self {
        let ServiceInput {
            key,
            active,
            intent,
            inhibition,
            memory,
            proxy,
        } = input;
        assert_eq!(
            key.container, active.container,
            "key must name ACTIVE's container"
        );
        let phase = match (intent, &inhibition, memory.withdrawal_pending) {
            (Intent::Stopped, _, _) => Phase::StoppedWithdraw,
            (Intent::Running, Some(_), _) => Phase::WithdrawInhibited,
            (Intent::Running, None, true) => Phase::RetryPendingWithdrawal,
            (Intent::Running, None, false) => Phase::Inspect,
        };
        let mut budget = Budget::from_entry(memory.generation.budget);
        // R17: a restarted daemon has no memory, but the durable record of
        // the last verified execution proves which executions did not change.
        // When this daemon does not itself know the route is up (it just
        // started, or it withdrew the service since), it republishes even an
        // unchanged execution: an idempotent upsert, never a blink.
        let route_unknown =
            memory.generation.verified_started_at.is_none() || proxy.contradicts(&active.binds);
        let mut verified_started_at = memory
            .generation
            .verified_started_at
            .or(active.verified_started_at);
        if intent == Intent::Stopped {
            // Stopped intent forgets the service's memory (R4).
            budget.forget();
            verified_started_at = None;
        }
        Self {
            policy,
            key,
            active,
            inhibition,
            budget,
            verified_started_at,
            route_unknown,
            withdrawal_pending: memory.withdrawal_pending,
            phase,
            outstanding: None,
            commands_issued: 0,
            withdrawn_this_pass: false,
            fresh: false,
            observed_at: None,
            started: false,
            restarted: false,
            start_error: None,
            start_race_lost: false,
            stable: false,
            published: false,
            observed: None,
            binds: Binds::new(),
            verdict: Verdict::Failed,
            errors: Vec::new(),
        }
    }

    pub fn key(&self) -> &GenerationKey {
        &self.key
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Why the outstanding (or next) command is asked for.
    pub fn why(&self) -> Why {
        match self.phase {
            Phase::WithdrawInhibited => Why::Inhibited,
            Phase::RetryPendingWithdrawal => Why::RetryWithdrawal,
            Phase::ReleaseGoneClaims | Phase::WithdrawGone => Why::Gone,
            Phase::WithdrawUnverified => Why::FailClosed,
            Phase::CheckPolicyForStart
            | Phase::Start
            | Phase::InspectAfterFailedStart
            | Phase::InspectStarted => Why::Down,
            Phase::CheckPolicyForRestart
            | Phase::WithdrawBeforeRestart
            | Phase::Restart
            | Phase::InspectRestarted => Why::Unhealthy,
            Phase::WithdrawAfterFailure => Why::VerificationFailed,
            Phase::StoppedWithdraw | Phase::StoppedInspect | Phase::StoppedStop => Why::Stopped,
            Phase::Publish | Phase::RecordExecution if self.needs_readiness() => Why::NewExecution,
            Phase::Publish | Phase::RecordExecution if self.binds != self.active.binds => {
                Why::BindsChanged
            }
            Phase::Publish | Phase::RecordExecution => Why::RouteUnvouched,
            Phase::Inspect
            | Phase::ReadHealth
            | Phase::ReadBinds
            | Phase::Probe
            | Phase::Reinspect
            | Phase::ReloadActive
            | Phase::PersistBinds
            | Phase::Done => Why::Observe,
        }
    }

    /// The next command to perform, or `None` once finished. Calling it
    /// again without answering returns the same command.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        assert!(
            self.outstanding.is_none(),
            "poll_command before the last command was answered"
        );
        let cmd = self.command_for_phase()?;
        self.commands_issued += 1;
        assert!(
            self.commands_issued <= COMMANDS_PER_RECOVERY_MAX,
            "recovery of {:?} exceeded its command bound",
            self.key
        );
        self.outstanding = Some(cmd.clone());
        Some(cmd)
    }

    fn command_for_phase(&self) -> Option<Command> {
        let grace = self
            .active
            .stop_grace
            .unwrap_or(self.policy.stop_grace_default);
        Some(match self.phase {
            Phase::WithdrawInhibited
            | Phase::RetryPendingWithdrawal
            | Phase::WithdrawGone
            | Phase::WithdrawUnverified
            | Phase::WithdrawBeforeRestart
            | Phase::WithdrawAfterFailure
            | Phase::StoppedWithdraw => Command::Withdraw,
            Phase::Inspect
            | Phase::InspectAfterFailedStart
            | Phase::InspectStarted
            | Phase::InspectRestarted
            | Phase::Reinspect
            | Phase::StoppedInspect => Command::Inspect,
            Phase::ReleaseGoneClaims => Command::ReleaseClaims,
            Phase::CheckPolicyForStart | Phase::CheckPolicyForRestart => Command::CheckPolicy,
            Phase::Start => Command::Start,
            Phase::Restart => Command::Restart { grace },
            Phase::StoppedStop => Command::Stop { grace },
            Phase::ReadHealth => Command::ReadHealth,
            Phase::ReadBinds => Command::ReadBinds,
            Phase::Probe => Command::ProbeReadiness {
                binds: self.binds.clone(),
                started_at: self.observed_started_at(),
            },
            Phase::ReloadActive => Command::ReloadActive,
            Phase::PersistBinds => Command::PersistBinds {
                binds: self.binds.clone(),
                revision: self.active.effective_revision.clone(),
            },
            Phase::Publish => Command::Publish {
                binds: self.binds.clone(),
                started_at: self.observed_started_at(),
            },
            Phase::RecordExecution => Command::RecordExecution {
                started_at: self
                    .observed_started_at()
                    .expect("only recorded when known"),
            },
            Phase::Done => return None,
        })
    }

    fn observed_started_at(&self) -> Option<Timestamp> {
        self.observed.as_ref().and_then(|o| o.started_at)
    }

    /// Feeds the outcome of the outstanding command.
    pub fn handle(&mut self, outcome: Outcome, now: Timestamp) {
        let cmd = self
            .outstanding
            .take()
            .expect("handle called without an outstanding command");
        assert!(
            outcome_answers(&outcome, &cmd),
            "outcome {outcome:?} does not answer {cmd:?}"
        );
        match outcome {
            Outcome::Withdrawn(result) => self.on_withdrawn(result, now),
            Outcome::Inspected(result) => self.on_inspected(result, now),
            Outcome::ClaimsReleased(result) => {
                if let Err(e) = result {
                    self.errors.push(RecoveryError::ReleaseClaimsFailed(e));
                }
                self.phase = Phase::WithdrawGone;
            }
            Outcome::PolicyChecked(result) => self.on_policy(result),
            Outcome::Started(result) => self.on_started(result),
            Outcome::Restarted(result) => self.on_restarted(result, now),
            Outcome::Stopped(result) => {
                match result {
                    Ok(()) | Err(RuntimeError::NotFound) => {}
                    Err(e) => {
                        self.errors.push(RecoveryError::StopFailed(e));
                    }
                }
                self.finish_stopped();
            }
            Outcome::Health(result) => self.on_health(result, now),
            Outcome::Binds(result) => match result {
                Ok(binds) => {
                    self.binds = binds;
                    let probe = !crate::broken!(self.policy.broken, PublishBeforeReadiness);
                    self.phase = if self.needs_readiness() && probe {
                        Phase::Probe
                    } else {
                        Phase::Reinspect
                    };
                }
                Err(e) => self.verification_failed(RecoveryError::BindsFailed(e), now),
            },
            Outcome::Readiness(result) => match result {
                Ok(()) => self.phase = Phase::Reinspect,
                Err(e) => self.verification_failed(RecoveryError::NotReady(e), now),
            },
            Outcome::ActiveReloaded(result) => self.on_active_reloaded(result, now),
            Outcome::BindsPersisted(result) => match result {
                Ok(true) => self.decide_publication(now),
                Ok(false) => self.verification_failed(RecoveryError::GenerationChanged, now),
                Err(e) => self.verification_failed(RecoveryError::PersistFailed(e), now),
            },
            Outcome::Published(result) => match result {
                Ok(()) => {
                    self.published = true;
                    self.route_unknown = false;
                    if self.needs_record() {
                        // Only with the rule broken on purpose (S11).
                        self.phase = Phase::RecordExecution;
                    } else {
                        self.finish_verified(now);
                    }
                }
                Err(e) => {
                    // Not charged, not withdrawn: the workload is fine, the
                    // proxy is not. The next pass finds the route missing
                    // and publishes the recorded execution again (T5).
                    self.errors.push(RecoveryError::PublishFailed(e));
                    self.budget.invalidate_stable();
                    self.finish(Verdict::Failed);
                }
            },
            Outcome::ExecutionRecorded(result) => match result {
                Ok(()) => {
                    self.active.verified_started_at = self.observed_started_at();
                    if self.needs_publication() && !self.published {
                        self.phase = Phase::Publish;
                    } else {
                        self.finish_verified(now);
                    }
                }
                Err(e) if self.needs_publication() && !self.published => {
                    // S11: never routed before it is durably verified, so a
                    // restart at any instant cannot blink it. Left withdrawn;
                    // the next pass verifies and records again.
                    self.errors.push(RecoveryError::RecordFailed(e));
                    self.budget.invalidate_stable();
                    self.finish(Verdict::Failed);
                }
                Err(e) => {
                    self.errors.push(RecoveryError::RecordFailed(e));
                    self.finish_verified(now);
                }
            },
        }
    }

    fn needs_readiness(&self) -> bool {
        self.started || self.restarted || self.fresh
    }

    fn on_withdrawn(&mut self, result: Result<(), TrafficError>, now: Timestamp) {
        let ok = result.is_ok();
        match result {
            Ok(()) => {
                self.withdrawal_pending = false;
                self.withdrawn_this_pass = true;
                // The route is gone: nothing is verified-and-routed any more.
                self.verified_started_at = None;
                self.route_unknown = true;
            }
            Err(e) => {
                self.withdrawal_pending = true;
                self.errors.push(RecoveryError::WithdrawFailed(e));
            }
        }
        match self.phase {
            Phase::WithdrawInhibited => {
                let reason = self.inhibition.clone().unwrap_or_default();
                self.errors.insert(0, RecoveryError::Inhibited { reason });
                self.finish(Verdict::Inhibited);
            }
            Phase::RetryPendingWithdrawal | Phase::WithdrawUnverified => {
                if ok {
                    self.phase = if self.phase == Phase::RetryPendingWithdrawal {
                        Phase::Inspect
                    } else {
                        self.after_fail_closed(now)
                    };
                } else {
                    // R6/R8: nothing else happens to this service this pass.
                    self.budget.invalidate_stable();
                    self.finish(Verdict::Failed);
                }
            }
            Phase::WithdrawGone => {
                self.budget.forget();
                self.verified_started_at = None;
                self.finish(Verdict::Gone);
            }
            Phase::WithdrawBeforeRestart => {
                if ok {
                    self.phase = Phase::Restart;
                } else {
                    self.budget.invalidate_stable();
                    self.finish(Verdict::Failed);
                }
            }
            Phase::WithdrawAfterFailure => self.finish(Verdict::Failed),
            Phase::StoppedWithdraw => self.phase = Phase::StoppedInspect,
            other => unreachable!("withdraw answered in phase {other:?}"),
        }
    }

    fn on_inspected(&mut self, result: Result<Observation, RuntimeError>, now: Timestamp) {
        match self.phase {
            Phase::Inspect => match result {
                Err(RuntimeError::NotFound) => {
                    self.errors.push(RecoveryError::Gone);
                    self.phase = Phase::ReleaseGoneClaims;
                }
                Err(e) => {
                    // R7: a transient error changes neither workload nor
                    // traffic.
                    self.errors.push(RecoveryError::InspectFailed(e));
                    self.budget.invalidate_stable();
                    self.finish(Verdict::Failed);
                }
                Ok(obs) => self.on_first_observation(obs, now),
            },
            Phase::InspectAfterFailedStart => match result {
                Ok(obs)
                    if obs.status == ContainerStatus::Running || obs.status.is_transitional() =>
                {
                    // The runtime's own restart won the race: nothing is
                    // charged, the start counts as done, and its error was
                    // no error.
                    self.start_error = None;
                    self.start_race_lost = true;
                    self.budget.clear_unhealthy();
                    self.started = true;
                    self.observed_at = Some(now);
                    self.observed = Some(obs);
                    self.phase = Phase::ReadHealth;
                }
                other => {
                    self.report_start_error();
                    if let Err(e) = other {
                        self.errors.push(RecoveryError::InspectFailed(e));
                    }
                    self.budget.record_failure(self.policy, now);
                    self.finish(Verdict::Failed);
                }
            },
            Phase::InspectStarted | Phase::InspectRestarted => match result {
                Ok(obs) => {
                    // The execution to verify is the one seen now: a stable
                    // verdict vouches for it from here, never from the
                    // first inspect of the down one (a process frozen
                    // between the two saw nothing of the frozen minutes).
                    self.observed_at = Some(now);
                    self.observed = Some(obs);
                    self.phase = if self.phase == Phase::InspectStarted {
                        Phase::ReadHealth
                    } else {
                        Phase::ReadBinds
                    };
                }
                Err(e) => {
                    // The intervention stays pending; a generation found down
                    // next pass is charged then.
                    self.errors.push(RecoveryError::InspectFailed(e));
                    self.budget.invalidate_stable();
                    self.phase = Phase::WithdrawAfterFailure;
                    self.skip_redundant_withdraw();
                }
            },
            Phase::Reinspect => {
                let same = matches!(&result, Ok(obs)
                    if Some(obs.started_at) == self.observed.as_ref().map(|o| o.started_at)
                        && obs.status == ContainerStatus::Running);
                if same && self.writes_pending() {
                    self.phase = Phase::ReloadActive;
                } else if same {
                    // Nothing to persist, publish or record: ACTIVE, read
                    // under the instance lock this pass, needs no fresh
                    // read (a steady service costs the store nothing).
                    self.finish_verified(now);
                } else {
                    let err = match result {
                        Err(e) => RecoveryError::InspectFailed(e),
                        Ok(_) => RecoveryError::ExecutionChanged,
                    };
                    self.verification_failed(err, now);
                }
            }
            Phase::StoppedInspect => match result {
                Err(RuntimeError::NotFound) => self.finish_stopped(),
                Err(e) => {
                    self.errors.push(RecoveryError::InspectFailed(e));
                    self.finish_stopped();
                }
                Ok(obs)
                    if obs.status == ContainerStatus::Running || obs.status.is_transitional() =>
                {
                    self.phase = Phase::StoppedStop;
                }
                Ok(_) => self.finish_stopped(),
            },
            other => unreachable!("inspect answered in phase {other:?}"),
        }
    }

    /// R8: classify the first observation and fail closed before touching
    /// the workload.
    fn on_first_observation(&mut self, obs: Observation, now: Timestamp) {
        self.observed_at = Some(now);
        self.fresh = obs.started_at.is_none() || obs.started_at != self.verified_started_at;
        let unverified = obs.status != ContainerStatus::Running && !obs.status.is_transitional();
        if self.fresh {
            // A new execution since the last verified one: whatever ran in
            // between was not continuously stable (R14), and its health
            // streak belongs to the old execution.
            self.budget.clear_unhealthy();
            self.budget.invalidate_stable();
        }
        self.observed = Some(obs);
        let skip_withdrawal = crate::broken!(self.policy.broken, SkipWithdrawBeforeStart);
        if (self.fresh || unverified) && !self.withdrawn_this_pass && !skip_withdrawal {
            self.phase = Phase::WithdrawUnverified;
        } else {
            self.phase = self.after_fail_closed(now);
        }
    }

    /// R9: drive by status once nothing unverified is routable.
    fn after_fail_closed(&mut self, now: Timestamp) -> Phase {
        let status = self.observed.as_ref().expect("observed").status;
        if status == ContainerStatus::Running {
            return Phase::ReadHealth;
        }
        if status.is_transitional() {
            self.budget.invalidate_stable();
            self.finish(Verdict::Transitional);
            return Phase::Done;
        }
        if status.is_refused() {
            self.errors.push(RecoveryError::RefusedStatus(status));
            self.budget.invalidate_stable();
            self.finish(Verdict::Failed);
            return Phase::Done;
        }
        debug_assert!(status.is_down());
        self.phase_for_down(now)
    }

    /// R9/R10: a down container is started under the budget. One found
    /// down again while an earlier intervention is unconfirmed is a crash
    /// loop: charge it first, then ask the budget again.
    fn phase_for_down(&mut self, now: Timestamp) -> Phase {
        // Found down is not a stable observation: the streak starts over
        // (R14), even if the runtime's own restart later wins the race.
        self.budget.invalidate_stable();
        let charge = !crate::broken!(self.policy.broken, ForgetCrashLoopCharge);
        if self.budget.allow(now) && self.budget.attempt_pending() && charge {
            self.budget.charge_unconfirmed_attempt(self.policy, now);
        }
        if !self.budget.allow(now) {
            self.budget.invalidate_stable();
            self.finish(Verdict::Delayed {
                next_attempt: self.budget.next_attempt(),
            });
            return Phase::Done;
        }
        Phase::CheckPolicyForStart
    }

    fn on_policy(&mut self, result: Result<(), PolicyError>) {
        match (self.phase, result) {
            (Phase::CheckPolicyForStart, Ok(())) => self.phase = Phase::Start,
            (Phase::CheckPolicyForRestart, Ok(())) => {
                self.phase = Phase::WithdrawBeforeRestart;
                self.skip_redundant_withdraw_to(Phase::Restart);
                if crate::broken!(self.policy.broken, SkipWithdrawBeforeStart) {
                    self.phase = Phase::Restart;
                }
            }
            (phase, Err(e)) => {
                assert!(matches!(
                    phase,
                    Phase::CheckPolicyForStart | Phase::CheckPolicyForRestart
                ));
                // Fail closed before any runtime mutation (R11).
                self.errors.push(RecoveryError::PolicyRevoked(e));
                self.budget.invalidate_stable();
                self.phase = Phase::WithdrawAfterFailure;
                self.skip_redundant_withdraw();
            }
            (other, Ok(())) => unreachable!("policy answered in phase {other:?}"),
        }
    }

    fn on_started(&mut self, result: Result<(), RuntimeError>) {
        match result {
            Ok(()) => {
                self.budget.mark_attempt();
                // A new execution: the old one's unhealthy reads are not
                // its streak (R12), as after a restart.
                self.budget.clear_unhealthy();
                self.started = true;
                self.phase = Phase::InspectStarted;
            }
            Err(RuntimeError::NotFound) => {
                self.errors.push(RecoveryError::Gone);
                self.budget.forget();
                self.verified_started_at = None;
                self.finish(Verdict::Gone);
            }
            Err(e) => {
                self.start_error = Some(e);
                self.phase = Phase::InspectAfterFailedStart;
            }
        }
    }

    fn on_restarted(&mut self, result: Result<(), RuntimeError>, now: Timestamp) {
        match result {
            Ok(()) => {
                self.budget.mark_attempt();
                self.budget.clear_unhealthy();
                self.restarted = true;
                self.stable = false;
                self.phase = Phase::InspectRestarted;
            }
            Err(e) => {
                self.budget.record_failure(self.policy, now);
                self.errors.push(RecoveryError::RestartFailed(e));
                self.finish(Verdict::Failed);
            }
        }
    }

    /// R12.
    fn on_health(&mut self, result: Result<Health, RuntimeError>, now: Timestamp) {
        self.phase = Phase::ReadBinds;
        match result {
            // A read error is neither unhealthy nor stable.
            Err(_) => self.stable = false,
            // No healthcheck: never restart for health; observation counts.
            Ok(Health::None) => self.stable = true,
            Ok(Health::Starting) => {
                self.budget.clear_unhealthy();
                self.stable = false;
            }
            Ok(Health::Healthy) => {
                self.budget.clear_unhealthy();
                self.stable = true;
            }
            Ok(Health::Unhealthy) => {
                self.stable = false;
                let streak = self.budget.observe_unhealthy();
                let early = u32::from(crate::broken!(self.policy.broken, RestartBeforeThreshold));
                if streak + early < self.policy.unhealthy_threshold {
                    return;
                }
                // Unhealthy again at the threshold while an earlier restart is
                // unconfirmed: that restart failed. Charged like a crash loop,
                // so a never-healthy workload cannot be restarted forever.
                if self.budget.allow(now) && self.budget.attempt_pending() {
                    self.budget.charge_unconfirmed_attempt(self.policy, now);
                }
                if self.budget.allow(now) {
                    self.phase = Phase::CheckPolicyForRestart;
                }
            }
        }
    }

    fn on_active_reloaded(
        &mut self,
        result: Result<Option<ActiveService>, StoreError>,
        now: Timestamp,
    ) {
        match result {
            Ok(Some(current))
                if current.container == self.active.container
                    && current.effective_revision == self.active.effective_revision =>
            {
                if current.binds != self.binds {
                    self.phase = Phase::PersistBinds;
                } else {
                    self.decide_publication(now);
                }
            }
            Ok(_) => self.verification_failed(RecoveryError::GenerationChanged, now),
            Err(e) => self.verification_failed(RecoveryError::ReloadFailed(e), now),
        }
    }

    /// R13: publish if started, restarted, fresh, or the binds changed;
    /// S11: record the verified execution in ACTIVE first, so what is routed
    /// is always what a restarted daemon finds vouched for (R17) and a
    /// restart at any instant never blinks it.
    fn decide_publication(&mut self, now: Timestamp) {
        let record_first = !crate::broken!(self.policy.broken, PublishBeforeRecord);
        if self.needs_record() && (record_first || !self.needs_publication()) {
            self.phase = Phase::RecordExecution;
        } else if self.needs_publication() {
            self.phase = Phase::Publish;
        } else {
            self.finish_verified(now);
        }
    }

    /// Whether verifying this execution will write anything (binds, a
    /// route, the record): only then is ACTIVE read again first.
    fn writes_pending(&self) -> bool {
        self.needs_publication() || self.needs_record()
    }

    /// R13: whether the route must be (re)published: the execution was
    /// started, restarted or is fresh, this daemon cannot vouch for the
    /// route, or the binds changed. None of these changes between the
    /// decision and the publication, so it is asked, not stored. A service
    /// without binds has nothing to route: it is verified and never
    /// published (the proxy refuses a route without an upstream).
    fn needs_publication(&self) -> bool {
        (!self.binds.is_empty() || crate::broken!(self.policy.broken, PublishPortless))
            && (self.needs_readiness() || self.route_unknown || self.binds != self.active.binds)
    }

    /// Whether ACTIVE's durable record is not yet the execution verified.
    fn needs_record(&self) -> bool {
        let started_at = self.observed_started_at();
        started_at.is_some() && started_at != self.active.verified_started_at
    }

    fn finish_verified(&mut self, now: Timestamp) {
        self.verified_started_at = self.observed_started_at();
        if self.binds.is_empty() {
            // Nothing to route, so nothing this daemon cannot vouch for.
            self.route_unknown = false;
        }
        if self.stable {
            // Stable as of the observation, not of now: a process frozen
            // between its inspect and this answer saw nothing of the
            // frozen minutes, so they must not count as stable (R14).
            let observed_at = self.observed_at.unwrap_or(now);
            self.budget.observe_stable(self.policy, observed_at);
        } else {
            self.budget.invalidate_stable();
        }
        self.finish(Verdict::Verified {
            started_at: self.observed_started_at(),
            published: self.published,
        });
    }

    /// A verification step failed: charge, withdraw, finish (R13).
    fn verification_failed(&mut self, err: RecoveryError, now: Timestamp) {
        self.errors.push(err);
        self.budget.record_failure(self.policy, now);
        self.phase = Phase::WithdrawAfterFailure;
        self.skip_redundant_withdraw();
    }

    /// Traffic already withdrawn this pass (and nothing published since)
    /// needs no second withdrawal.
    fn skip_redundant_withdraw(&mut self) {
        if self.withdrawn_this_pass && !self.withdrawal_pending {
            self.finish(Verdict::Failed);
        }
    }

    fn skip_redundant_withdraw_to(&mut self, next: Phase) {
        if self.withdrawn_this_pass && !self.withdrawal_pending {
            self.phase = next;
        }
    }

    fn finish_stopped(&mut self) {
        self.finish(Verdict::Stopped);
    }

    fn report_start_error(&mut self) {
        if let Some(e) = self.start_error.take() {
            self.errors.push(RecoveryError::StartFailed(e));
        }
    }

    fn finish(&mut self, verdict: Verdict) {
        self.verdict = verdict;
        self.phase = Phase::Done;
    }

    /// Gives up for `why`, failing closed: an unanswered withdrawal is
    /// assumed to have failed. The report is then ready.
    pub fn abandon(&mut self, why: Abandon) {
        let why = match why {
            Abandon::Deadline => RecoveryError::DeadlineExceeded,
            Abandon::MandateLost => RecoveryError::MandateLost,
        };
        if matches!(self.outstanding.take(), Some(Command::Withdraw)) {
            self.withdrawal_pending = true;
        }
        // Abandoned before the re-inspection could explain it: the start
        // failed as far as anyone knows.
        self.report_start_error();
        self.budget.invalidate_stable();
        self.errors.push(why);
        self.verdict = Verdict::Failed;
        self.phase = Phase::Done;
    }

    /// The report of a finished machine.
    pub fn into_report(self) -> Report {
        assert!(self.is_done(), "report taken before the machine finished");
        assert!(self.outstanding.is_none());
        self.into_report_unchecked()
    }

    fn into_report_unchecked(self) -> Report {
        let intervened = self.started || self.restarted;
        Report {
            key: self.key,
            verdict: self.verdict,
            errors: self.errors,
            memory: ServiceMemory {
                generation: GenerationMemory {
                    budget: self.budget.into_entry(),
                    // Memory vouches only for what this daemon knows to be
                    // routed; a durable record alone is not enough.
                    verified_started_at: if self.route_unknown {
                        None
                    } else {
                        self.verified_started_at
                    },
                },
                withdrawal_pending: self.withdrawal_pending,
            },
            intervened,
            start_race_lost: self.start_race_lost,
        }
    }
}

fn outcome_answers(outcome: &Outcome, cmd: &Command) -> bool {
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

impl Machine for ServiceRecovery<'_> {
    type Command = Command;
    type Answer = Outcome;
    type Report = Report;

    fn poll_command(&mut self) -> Option<Command> {
        ServiceRecovery::poll_command(self)
    }

    fn handle(&mut self, answer: Outcome, now: Timestamp) {
        ServiceRecovery::handle(self, answer, now)
    }

    fn abandon(&mut self, why: Abandon) {
        ServiceRecovery::abandon(self, why)
    }

    fn into_report(self) -> Report {
        ServiceRecovery::into_report(self)
    }
}

impl MachineAnswer for Outcome {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        Outcome::port_failure(self)
    }
}
