//! [`ServiceRecovery`]: the transitions of one service's recovery. Each
//! answer consumes the phase it answers and yields the next one.

mod publish;

use jiff::Timestamp;

use super::command::{outcome_answers, Command, Outcome};
use super::phase::{Checked, Intervention, Observed, Phase, Route, Traffic, Verifying};
use super::report::{RecoveryError, Report, Verdict, Why};
use super::{GenerationMemory, ServiceInput, ServiceMemory, COMMANDS_PER_RECOVERY_MAX};
use crate::budget::Budget;
use crate::errors::{PolicyError, TrafficError};
use crate::machine::{Abandon, Machine};
use crate::policy::RecoveryPolicy;
use crate::types::{
    ActiveService, ContainerStatus, GenerationKey, Health, Intent, Observation, RuntimeError,
};

/// The recovery of one service for one pass. See the module docs for the
/// call order.
#[derive(Debug)]
pub struct ServiceRecovery<'p> {
    policy: &'p RecoveryPolicy,
    key: GenerationKey,
    active: ActiveService,
    budget: Budget,
    /// The last execution verified and routed, as far as this pass knows
    /// (memory, else ACTIVE's durable record; R17).
    verified_started_at: Option<Timestamp>,
    route: Route,
    traffic: Traffic,
    intervention: Intervention,
    phase: Phase,
    /// The command yielded by `poll_command` and not yet answered.
    outstanding: Option<Command>,
    commands_issued: u32,
    errors: Vec<RecoveryError>,
    /// The last exit an inspection reported (a down execution's).
    exit: Option<crate::types::Exit>,
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
        let phase = match (intent, inhibition, memory.withdrawal_pending) {
            (Intent::Stopped, _, _) => Phase::StoppedWithdraw,
            (Intent::Running, Some(reason), _) => Phase::WithdrawInhibited { reason },
            (Intent::Running, None, true) => Phase::RetryPendingWithdrawal,
            (Intent::Running, None, false) => Phase::Inspect,
        };
        let mut budget = Budget::from_entry(memory.generation.budget);
        // R17: a restarted daemon has no memory, but the durable record of
        // the last verified execution proves which executions did not change.
        // When this daemon does not itself know the route is up (it just
        // started, or it withdrew the service since), it republishes even an
        // unchanged execution: an idempotent upsert, never a blink.
        let route = if memory.generation.verified_started_at.is_none()
            || proxy.contradicts(&active.binds)
        {
            Route::Unvouched
        } else {
            Route::Vouched
        };
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
            budget,
            verified_started_at,
            route,
            traffic: if memory.withdrawal_pending {
                Traffic::WithdrawalPending
            } else {
                Traffic::Untouched
            },
            intervention: Intervention::None,
            phase,
            outstanding: None,
            commands_issued: 0,
            errors: Vec::new(),
            exit: None,
        }
    }

    pub fn key(&self) -> &GenerationKey {
        &self.key
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done(_))
    }

    /// Why the outstanding (or next) command is asked for.
    pub fn why(&self) -> Why {
        match &self.phase {
            Phase::WithdrawInhibited { .. } => Why::Inhibited,
            Phase::RetryPendingWithdrawal => Why::RetryWithdrawal,
            Phase::ReleaseGoneClaims | Phase::WithdrawGone => Why::Gone,
            Phase::WithdrawUnverified(_) => Why::FailClosed,
            Phase::CheckPolicyForStart
            | Phase::Start
            | Phase::InspectAfterFailedStart { .. }
            | Phase::InspectStarted => Why::Down,
            Phase::CheckPolicyForRestart
            | Phase::WithdrawBeforeRestart
            | Phase::Restart
            | Phase::InspectRestarted => Why::Unhealthy,
            Phase::WithdrawAfterFailure => Why::VerificationFailed,
            Phase::StoppedWithdraw | Phase::StoppedInspect | Phase::StoppedStop => Why::Stopped,
            Phase::Publish(v) | Phase::RecordExecution(v) | Phase::RecordAfterPublish(v)
                if v.exec.new =>
            {
                Why::NewExecution
            }
            Phase::Publish(v) | Phase::RecordExecution(v) | Phase::RecordAfterPublish(v)
                if v.binds != self.active.binds =>
            {
                Why::BindsChanged
            }
            Phase::Publish(_) | Phase::RecordExecution(_) | Phase::RecordAfterPublish(_) => {
                Why::RouteUnvouched
            }
            Phase::Inspect
            | Phase::ReadHealth(_)
            | Phase::ReadBinds(_)
            | Phase::Probe(_)
            | Phase::Reinspect(_)
            | Phase::ReloadActive(_)
            | Phase::PersistBinds(_)
            | Phase::Done(_) => Why::Observe,
        }
    }

    /// The next command to perform, or `None` once finished. Asking again
    /// before the last command was answered is a bug in the driver.
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
        self.debug_assert_may_issue(&cmd);
        self.outstanding = Some(cmd.clone());
        Some(cmd)
    }

    /// The rules a command must never break, checked where it is issued
    /// (in debug builds: the tests and the simulation). A rule the
    /// mutation exercise broke on purpose is left to the simulation's
    /// checker, which must be the one to catch it.
    fn debug_assert_may_issue(&self, cmd: &Command) {
        if !cfg!(debug_assertions) {
            return;
        }
        let key = &self.key;
        if cmd.mutates_workload() && !matches!(cmd, Command::Stop { .. }) {
            // R8/R12: a workload is started or restarted only once its
            // traffic was withdrawn this pass.
            debug_assert!(
                self.traffic == Traffic::Withdrawn
                    || crate::broken!(self.policy.broken, SkipWithdrawBeforeStart),
                "{cmd:?} of {key:?} while its traffic is {:?}",
                self.traffic
            );
        }
        if let (Command::Publish { .. }, Phase::Publish(v)) = (cmd, &self.phase) {
            // R6: never routed while a withdrawal is pending.
            debug_assert_ne!(self.traffic, Traffic::WithdrawalPending);
            // S11: routed only once durably recorded.
            debug_assert!(
                !self.needs_record(v) || crate::broken!(self.policy.broken, PublishBeforeRecord),
                "publishing {key:?} before recording its execution"
            );
        }
    }

    fn command_for_phase(&self) -> Option<Command> {
        let grace = self
            .active
            .stop_grace
            .unwrap_or(self.policy.stop_grace_default);
        Some(match &self.phase {
            Phase::WithdrawInhibited { .. }
            | Phase::RetryPendingWithdrawal
            | Phase::WithdrawGone
            | Phase::WithdrawUnverified(_)
            | Phase::WithdrawBeforeRestart
            | Phase::WithdrawAfterFailure
            | Phase::StoppedWithdraw => Command::Withdraw,
            Phase::Inspect
            | Phase::InspectAfterFailedStart { .. }
            | Phase::InspectStarted
            | Phase::InspectRestarted
            | Phase::Reinspect(_)
            | Phase::StoppedInspect => Command::Inspect,
            Phase::ReleaseGoneClaims => Command::ReleaseClaims,
            Phase::CheckPolicyForStart | Phase::CheckPolicyForRestart => Command::CheckPolicy,
            Phase::Start => Command::Start,
            Phase::Restart => Command::Restart { grace },
            Phase::StoppedStop => Command::Stop { grace },
            Phase::ReadHealth(_) => Command::ReadHealth,
            Phase::ReadBinds(_) => Command::ReadBinds,
            Phase::Probe(v) => Command::ProbeReadiness {
                binds: v.binds.clone(),
                started_at: v.started_at(),
            },
            Phase::ReloadActive(_) => Command::ReloadActive,
            Phase::PersistBinds(v) => Command::PersistBinds {
                binds: v.binds.clone(),
                revision: self.active.effective_revision.clone(),
            },
            Phase::Publish(v) => Command::Publish {
                binds: v.binds.clone(),
                started_at: v.started_at(),
            },
            Phase::RecordExecution(v) | Phase::RecordAfterPublish(v) => Command::RecordExecution {
                started_at: v.started_at().expect("only recorded when known"),
            },
            Phase::Done(_) => return None,
        })
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
        let phase = std::mem::replace(&mut self.phase, Phase::Done(Verdict::Failed));
        self.phase = self.step(phase, outcome, now);
    }

    /// The phase after `phase`'s command was answered with `outcome`.
    fn step(&mut self, phase: Phase, outcome: Outcome, now: Timestamp) -> Phase {
        match (phase, outcome) {
            (phase, Outcome::Withdrawn(result)) => self.on_withdrawn(phase, result, now),
            (phase, Outcome::Inspected(result)) => {
                if let Ok(Observation {
                    exit: Some(exit), ..
                }) = &result
                {
                    self.exit = Some(*exit);
                }
                self.on_inspected(phase, result, now)
            }
            (Phase::ReleaseGoneClaims, Outcome::ClaimsReleased(result)) => {
                if let Err(e) = result {
                    self.errors.push(RecoveryError::ReleaseClaimsFailed(e));
                }
                Phase::WithdrawGone
            }
            (phase, Outcome::PolicyChecked(result)) => self.on_policy(phase, result),
            (Phase::Start, Outcome::Started(result)) => self.on_started(result),
            (Phase::Restart, Outcome::Restarted(result)) => self.on_restarted(result, now),
            (Phase::StoppedStop, Outcome::Stopped(result)) => {
                match result {
                    Ok(()) | Err(RuntimeError::NotFound) => {}
                    Err(e) => self.errors.push(RecoveryError::StopFailed(e)),
                }
                Phase::Done(Verdict::Stopped)
            }
            (Phase::ReadHealth(exec), Outcome::Health(result)) => self.on_health(exec, result, now),
            (Phase::ReadBinds(checked), Outcome::Binds(result)) => match result {
                Ok(binds) => {
                    let v = Verifying {
                        exec: checked.exec,
                        stable: checked.stable,
                        binds,
                    };
                    let probe = !crate::broken!(self.policy.broken, PublishBeforeReadiness);
                    if v.exec.new && probe {
                        Phase::Probe(v)
                    } else {
                        Phase::Reinspect(v)
                    }
                }
                Err(e) => self.verification_failed(RecoveryError::BindsFailed(e), now),
            },
            (Phase::Probe(v), Outcome::Readiness(result)) => match result {
                Ok(()) => Phase::Reinspect(v),
                Err(e) => self.verification_failed(RecoveryError::NotReady(e), now),
            },
            (phase, outcome) => self.on_verified(phase, outcome, now),
        }
    }

    fn on_withdrawn(
        &mut self,
        phase: Phase,
        result: Result<(), TrafficError>,
        now: Timestamp,
    ) -> Phase {
        let ok = result.is_ok();
        match result {
            Ok(()) => {
                self.traffic = Traffic::Withdrawn;
                // The route is gone: nothing is verified-and-routed any more.
                self.verified_started_at = None;
                self.route = Route::Unvouched;
            }
            Err(e) => {
                self.traffic = Traffic::WithdrawalPending;
                self.errors.push(RecoveryError::WithdrawFailed(e));
            }
        }
        match phase {
            Phase::WithdrawInhibited { reason } => {
                self.errors.insert(0, RecoveryError::Inhibited { reason });
                Phase::Done(Verdict::Inhibited)
            }
            Phase::RetryPendingWithdrawal if ok => Phase::Inspect,
            Phase::WithdrawUnverified(exec) if ok => self.after_fail_closed(exec, now),
            Phase::WithdrawBeforeRestart if ok => Phase::Restart,
            Phase::RetryPendingWithdrawal
            | Phase::WithdrawUnverified(_)
            | Phase::WithdrawBeforeRestart => {
                // R6/R8: nothing else happens to this service this pass.
                self.budget.invalidate_stable();
                Phase::Done(Verdict::Failed)
            }
            Phase::WithdrawGone => {
                self.budget.forget();
                self.verified_started_at = None;
                Phase::Done(Verdict::Gone)
            }
            Phase::WithdrawAfterFailure => Phase::Done(Verdict::Failed),
            Phase::StoppedWithdraw => Phase::StoppedInspect,
            other => unreachable!("withdraw answered in phase {other:?}"),
        }
    }

    fn on_inspected(
        &mut self,
        phase: Phase,
        result: Result<Observation, RuntimeError>,
        now: Timestamp,
    ) -> Phase {
        match phase {
            Phase::Inspect => match result {
                Err(RuntimeError::NotFound) => {
                    self.errors.push(RecoveryError::Gone);
                    Phase::ReleaseGoneClaims
                }
                Err(e) => {
                    // R7: a transient error changes neither workload nor
                    // traffic.
                    self.errors.push(RecoveryError::InspectFailed(e));
                    self.budget.invalidate_stable();
                    Phase::Done(Verdict::Failed)
                }
                Ok(obs) => self.on_first_observation(obs, now),
            },
            Phase::InspectAfterFailedStart { error } => self.on_start_explained(error, result, now),
            Phase::InspectStarted | Phase::InspectRestarted => match result {
                Ok(obs) => {
                    // The execution to verify is the one seen now: a stable
                    // verdict vouches for it from here, never from the
                    // first inspect of the down one (a process frozen
                    // between the two saw nothing of the frozen minutes).
                    let exec = Observed {
                        obs,
                        at: now,
                        new: true,
                    };
                    if matches!(phase, Phase::InspectStarted) {
                        Phase::ReadHealth(exec)
                    } else {
                        Phase::ReadBinds(Checked {
                            exec,
                            stable: false,
                        })
                    }
                }
                Err(e) => {
                    // The intervention stays pending; a generation found down
                    // next pass is charged then.
                    self.errors.push(RecoveryError::InspectFailed(e));
                    self.budget.invalidate_stable();
                    self.withdraw_after_failure()
                }
            },
            Phase::Reinspect(v) => {
                let same = matches!(&result, Ok(obs)
                    if obs.started_at == v.exec.obs.started_at
                        && obs.status == ContainerStatus::Running);
                if same && self.writes_pending(&v) {
                    Phase::ReloadActive(v)
                } else if same {
                    // Nothing to persist, publish or record: ACTIVE, read
                    // under the instance lock this pass, needs no fresh
                    // read (a steady service costs the store nothing).
                    self.finish_verified(v, false)
                } else {
                    let err = match result {
                        Err(e) => RecoveryError::InspectFailed(e),
                        Ok(_) => RecoveryError::ExecutionChanged,
                    };
                    self.verification_failed(err, now)
                }
            }
            Phase::StoppedInspect => match result {
                Err(RuntimeError::NotFound) => Phase::Done(Verdict::Stopped),
                Err(e) => {
                    self.errors.push(RecoveryError::InspectFailed(e));
                    Phase::Done(Verdict::Stopped)
                }
                Ok(obs)
                    if obs.status == ContainerStatus::Running || obs.status.is_transitional() =>
                {
                    Phase::StoppedStop
                }
                Ok(_) => Phase::Done(Verdict::Stopped),
            },
            other => unreachable!("inspect answered in phase {other:?}"),
        }
    }

    /// R11: the inspection after a failed start. If the runtime's own
    /// restart won the race, nothing is charged, the start counts as done,
    /// and its `error` was no error.
    fn on_start_explained(
        &mut self,
        error: RuntimeError,
        result: Result<Observation, RuntimeError>,
        now: Timestamp,
    ) -> Phase {
        match result {
            Ok(obs) if obs.status == ContainerStatus::Running || obs.status.is_transitional() => {
                self.intervention = Intervention::StartRaceLost;
                self.budget.clear_unhealthy();
                Phase::ReadHealth(Observed {
                    obs,
                    at: now,
                    new: true,
                })
            }
            other => {
                self.errors.push(RecoveryError::StartFailed(error));
                if let Err(e) = other {
                    self.errors.push(RecoveryError::InspectFailed(e));
                }
                self.budget.record_failure(self.policy, now);
                Phase::Done(Verdict::Failed)
            }
        }
    }

    /// R8: classify the first observation and fail closed before touching
    /// the workload.
    fn on_first_observation(&mut self, obs: Observation, now: Timestamp) -> Phase {
        let fresh = obs.started_at.is_none() || obs.started_at != self.verified_started_at;
        let unverified = obs.status != ContainerStatus::Running && !obs.status.is_transitional();
        if fresh {
            // A new execution since the last verified one: whatever ran in
            // between was not continuously stable (R14), and its health
            // streak belongs to the old execution.
            self.budget.clear_unhealthy();
            self.budget.invalidate_stable();
        }
        let exec = Observed {
            obs,
            at: now,
            new: fresh,
        };
        let skip_withdrawal = crate::broken!(self.policy.broken, SkipWithdrawBeforeStart);
        if (fresh || unverified) && self.traffic != Traffic::Withdrawn && !skip_withdrawal {
            Phase::WithdrawUnverified(exec)
        } else {
            self.after_fail_closed(exec, now)
        }
    }

    /// R9: drive by status once nothing unverified is routable.
    fn after_fail_closed(&mut self, exec: Observed, now: Timestamp) -> Phase {
        let status = exec.obs.status;
        if status == ContainerStatus::Running {
            return Phase::ReadHealth(exec);
        }
        if status.is_transitional() {
            self.budget.invalidate_stable();
            return Phase::Done(Verdict::Transitional);
        }
        if status.is_refused() {
            self.errors.push(RecoveryError::RefusedStatus(status));
            self.budget.invalidate_stable();
            return Phase::Done(Verdict::Failed);
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
            return Phase::Done(Verdict::Delayed {
                next_attempt: self.budget.next_attempt(),
            });
        }
        Phase::CheckPolicyForStart
    }

    fn on_policy(&mut self, phase: Phase, result: Result<(), PolicyError>) -> Phase {
        match (phase, result) {
            (Phase::CheckPolicyForStart, Ok(())) => Phase::Start,
            (Phase::CheckPolicyForRestart, Ok(())) => {
                if self.traffic == Traffic::Withdrawn
                    || crate::broken!(self.policy.broken, SkipWithdrawBeforeStart)
                {
                    Phase::Restart
                } else {
                    Phase::WithdrawBeforeRestart
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
                self.withdraw_after_failure()
            }
            (other, Ok(())) => unreachable!("policy answered in phase {other:?}"),
        }
    }

    fn on_started(&mut self, result: Result<(), RuntimeError>) -> Phase {
        match result {
            Ok(()) => {
                self.budget.mark_attempt();
                // A new execution: the old one's unhealthy reads are not
                // its streak (R12), as after a restart.
                self.budget.clear_unhealthy();
                self.intervene();
                Phase::InspectStarted
            }
            Err(RuntimeError::NotFound) => {
                self.errors.push(RecoveryError::Gone);
                self.budget.forget();
                self.verified_started_at = None;
                Phase::Done(Verdict::Gone)
            }
            Err(error) => Phase::InspectAfterFailedStart { error },
        }
    }

    fn on_restarted(&mut self, result: Result<(), RuntimeError>, now: Timestamp) -> Phase {
        match result {
            Ok(()) => {
                self.budget.mark_attempt();
                self.budget.clear_unhealthy();
                self.intervene();
                Phase::InspectRestarted
            }
            Err(e) => {
                self.budget.record_failure(self.policy, now);
                self.errors.push(RecoveryError::RestartFailed(e));
                Phase::Done(Verdict::Failed)
            }
        }
    }

    /// This pass started or restarted the workload (a start that lost the
    /// race to the runtime stays told apart).
    fn intervene(&mut self) {
        if self.intervention == Intervention::None {
            self.intervention = Intervention::Intervened;
        }
    }

    /// R12.
    fn on_health(
        &mut self,
        exec: Observed,
        result: Result<Health, RuntimeError>,
        now: Timestamp,
    ) -> Phase {
        let stable = match result {
            // A read error is neither unhealthy nor stable.
            Err(_) => false,
            // No healthcheck: never restart for health; observation counts.
            Ok(Health::None) => true,
            Ok(Health::Starting) => {
                self.budget.clear_unhealthy();
                false
            }
            Ok(Health::Healthy) => {
                self.budget.clear_unhealthy();
                true
            }
            Ok(Health::Unhealthy) => {
                if self.restart_for_health(now) {
                    return Phase::CheckPolicyForRestart;
                }
                false
            }
        };
        Phase::ReadBinds(Checked { exec, stable })
    }

    /// R12: one more unhealthy read; whether the streak reached the
    /// threshold and the budget allows a restart.
    fn restart_for_health(&mut self, now: Timestamp) -> bool {
        let streak = self.budget.observe_unhealthy();
        let early = u32::from(crate::broken!(self.policy.broken, RestartBeforeThreshold));
        if streak + early < self.policy.unhealthy_threshold {
            return false;
        }
        // Unhealthy again at the threshold while an earlier restart is
        // unconfirmed: that restart failed. Charged like a crash loop,
        // so a never-healthy workload cannot be restarted forever.
        if self.budget.allow(now) && self.budget.attempt_pending() {
            self.budget.charge_unconfirmed_attempt(self.policy, now);
        }
        self.budget.allow(now)
    }

    /// A verification step failed: charge, withdraw, finish (R13).
    fn verification_failed(&mut self, err: RecoveryError, now: Timestamp) -> Phase {
        self.errors.push(err);
        self.budget.record_failure(self.policy, now);
        self.withdraw_after_failure()
    }

    /// Withdraw, then finish as failed; traffic already withdrawn this pass
    /// (and nothing published since) needs no second withdrawal.
    fn withdraw_after_failure(&self) -> Phase {
        if self.traffic == Traffic::Withdrawn {
            Phase::Done(Verdict::Failed)
        } else {
            Phase::WithdrawAfterFailure
        }
    }

    /// Gives up for `why`, failing closed: an unanswered withdrawal is
    /// assumed to have failed. The report is then ready.
    pub fn abandon(&mut self, why: Abandon) {
        let why = match why {
            Abandon::Deadline => RecoveryError::DeadlineExceeded,
            Abandon::MandateLost => RecoveryError::MandateLost,
        };
        if matches!(self.outstanding.take(), Some(Command::Withdraw)) {
            self.traffic = Traffic::WithdrawalPending;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Done(Verdict::Failed));
        if let Phase::InspectAfterFailedStart { error } = phase {
            // Abandoned before the re-inspection could explain it: the
            // start failed as far as anyone knows.
            self.errors.push(RecoveryError::StartFailed(error));
        }
        self.budget.invalidate_stable();
        self.errors.push(why);
    }

    /// The report of a finished machine.
    pub fn into_report(self) -> Report {
        assert!(self.outstanding.is_none());
        let Phase::Done(verdict) = self.phase else {
            panic!("report taken before the machine finished");
        };
        if matches!(verdict, Verdict::Verified { .. }) {
            // Verified means nothing failed to withdraw and, if published,
            // this daemon vouches for the route.
            debug_assert_ne!(self.traffic, Traffic::WithdrawalPending);
        }
        if matches!(
            verdict,
            Verdict::Verified {
                published: true,
                ..
            }
        ) {
            debug_assert_eq!(self.route, Route::Vouched);
        }
        Report {
            key: self.key,
            verdict,
            errors: self.errors,
            memory: ServiceMemory {
                generation: GenerationMemory {
                    budget: self.budget.into_entry(),
                    // Memory vouches only for what this daemon knows to be
                    // routed; a durable record alone is not enough.
                    verified_started_at: match self.route {
                        Route::Vouched => self.verified_started_at,
                        Route::Unvouched => None,
                    },
                },
                withdrawal_pending: self.traffic == Traffic::WithdrawalPending,
            },
            intervened: self.intervention != Intervention::None,
            start_race_lost: self.intervention == Intervention::StartRaceLost,
            exit: self.exit,
        }
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
