//! The crash-loop budget judged exactly, pass by pass, through the chaos
//! (R9–R14, issue #15 item 1).
//!
//! The engine tells a [`PassJudge`] of every instance pass it drives: the
//! memory it started from, each command with its answer and the instant
//! the machine was handed, and the memory it left. The judge follows each
//! service's steps with its own reading of docs/rules.md (the testkit's
//! [`BudgetModel`], written from the rules' text, does the arithmetic) and
//! holds the engine to it at three points:
//!
//! - a generation found down is started in that very pass exactly when the
//!   budget allows it (after charging an unconfirmed attempt), and held
//!   otherwise: never late, never early;
//! - an unhealthy generation is restarted exactly when its streak reaches
//!   the threshold and the budget allows, and otherwise verified on;
//! - the budget the pass leaves (failures, next attempt, the pending
//!   attempt, the stability and unhealthy streaks) is the rule's, and the
//!   next pass of the same process starts from exactly that.
//!
//! Together these make every start and restart of a generation happen at
//! the first pass the rule allows it, with the ladder, the charges and the
//! five stable minutes followed through every fault the world injects.
//! What the steps cannot tell (the service a pass was cut short in the
//! middle of) is left unjudged rather than guessed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use stead::core::budget::BudgetEntry;
use stead::core::pass::{InstanceAnswer, InstanceCommand};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{Command, Outcome};
use stead::core::types::{
    ActiveService, Binds, ContainerStatus, GenerationKey, Health, InhibitionReason, Intent,
    Observation, RuntimeError, ServiceKey, Timestamp,
};
use stead::engine::recovery::{PassWatcher, WatchedPass, WatchedStep};
use stead_testkit::model::BudgetModel;

use crate::checker::Checker;

/// The invariants this judge checks, as the summary counts them.
pub const FOUND_DOWN: &str = "R10 a down generation is started exactly when the budget allows";
pub const AT_THRESHOLD: &str =
    "R12 an unhealthy generation is restarted exactly at the threshold the budget allows";
pub const LEFT: &str = "R10 the budget a pass leaves is the rule's";
pub const KEPT: &str = "R10 the next pass starts from the budget the last one left";
pub const REPLAYED: &str =
    "X1 a pass recorded by the flight recorder replays with the same decisions";
pub const RULES_KEPT: &str = "X2 every pass keeps the rules of the core's judge";

/// One process incarnation's judge: its memory lives and dies with it.
pub struct PassJudge {
    checker: Arc<Checker>,
    policy: RecoveryPolicy,
    /// What each generation's last pass left, in this incarnation.
    left: Mutex<BTreeMap<GenerationKey, Option<BudgetEntry>>>,
}

impl PassJudge {
    pub fn new(checker: Arc<Checker>, policy: RecoveryPolicy) -> Self {
        Self {
            checker,
            policy,
            left: Mutex::new(BTreeMap::new()),
        }
    }
}

impl PassWatcher for PassJudge {
    fn passed(&self, pass: &WatchedPass<'_>) {
        self.replay(pass);
        self.judge_budgets(pass);
    }
}

impl PassJudge {
    /// #44: the pass as the flight recorder would record it, replayed
    /// (`stead replay`'s own code) and judged by the core's judge: the
    /// replay must decide the same, through every fault of the world, and
    /// the pass must keep the rules the property tests, the fuzzers and
    /// the explorer hold the machines to.
    fn replay(&self, pass: &WatchedPass<'_>) {
        let record = stead::engine::flight::record_of(pass);
        let (divergence, broken) = stead::engine::replay::replay_one(1, &record);
        self.checker.judged(REPLAYED, divergence.is_none(), || {
            format!("{} (recorded {record:?})", divergence.expect("diverged"))
        });
        self.checker.judged(RULES_KEPT, broken.is_none(), || {
            let steps: Vec<String> = record
                .steps
                .iter()
                .enumerate()
                .map(|(at, s)| {
                    let command = stead::core::record::Described(&s.command);
                    format!("{}. {} {command} -> {:?}", at + 1, s.now, s.answer)
                })
                .collect();
            format!(
                "{} (began {}, abandoned {:?}; steps:\n{})",
                broken.expect("broken"),
                record.input.now,
                record.abandoned,
                steps.join("\n")
            )
        });
    }

    fn judge_budgets(&self, pass: &WatchedPass<'_>) {
        let services: Vec<_> = pass.active.services.iter().collect();
        // Cut short: the service in hand when it was (the last with a
        // step) has an unknown end; the ones after it were abandoned
        // before they began (all of them, if none had a step).
        let in_hand = pass.abandoned.map(|_| {
            services
                .iter()
                .rposition(|(name, _)| steps_of(pass, name).next().is_some())
        });
        // R16: what the pass pruned (generations ACTIVE no longer names)
        // is forgotten; a container re-created under the same ID later is
        // a new generation with no history. A kept one (#40) keeps its
        // budget but not its unhealthy streak, which was the execution's
        // that ran before it left ACTIVE (R12).
        self.left
            .lock()
            .expect("judge poisoned")
            .retain(|key, left| {
                if key.instance != *pass.instance
                    || pass
                        .active
                        .services
                        .get(&key.service)
                        .is_some_and(|r| r.container == key.container)
                {
                    return true;
                }
                if let Some(budget) = left {
                    budget.unhealthy_streak = 0;
                }
                !pass.after.service(key).generation.is_empty()
            });
        for (at, (name, record)) in services.iter().enumerate() {
            let key = GenerationKey {
                instance: pass.instance.clone(),
                service: (*name).clone(),
                container: record.container.clone(),
            };
            let before = pass.before.service(&key).generation;
            let after = pass.after.service(&key).generation.budget;
            {
                let mut left = self.left.lock().expect("judge poisoned");
                if let Some(last) = left.remove(&key) {
                    self.checker.judged(KEPT, last == before.budget, || {
                        format!(
                            "{key:?}: the pass began from {:?}, the last one left {last:?}",
                            before.budget
                        )
                    });
                }
                left.insert(key.clone(), after.clone());
            }
            // T5, R17: the route is known to be up only if this daemon
            // verified it and the proxy, where it was read back, agrees.
            let service_key = ServiceKey {
                instance: pass.instance.clone(),
                service: (*name).clone(),
            };
            let contradicted = pass.held.is_some_and(|held| {
                held.get(&service_key)
                    .is_none_or(|port| record.binds.values().next() != Some(port))
            });
            let mut service = Service::new(
                &self.policy,
                &key,
                record,
                before.budget.as_ref(),
                before.verified_started_at,
                before.verified_started_at.is_none() || contradicted,
            );
            let inhibited = pass.inhibitions.iter().any(|i| {
                i.service == **name
                    && i.container == record.container
                    && i.reason != InhibitionReason::RetirementPending
            });
            let cut = match in_hand {
                None => Cut::No,
                Some(Some(hand)) if at == hand => Cut::InHand,
                Some(Some(hand)) if at < hand => Cut::No,
                Some(_) => Cut::BeforeItBegan,
            };
            let expected = if pass.intent == Intent::Stopped {
                // R4: stopped intent forgets the service's memory.
                Some(None)
            } else if cut == Cut::BeforeItBegan {
                // Given up before its first step: not a stable outcome.
                service.budget.unstable();
                Some(service.budget.entry())
            } else if inhibited {
                // R5: never started; its budget untouched (unless given
                // up on before its withdrawal, which the steps cannot
                // tell).
                (cut == Cut::No).then(|| service.budget.entry())
            } else {
                let steps: Vec<&WatchedStep> = steps_of(pass, name).collect();
                let known = service.follow(&steps, &self.checker);
                (known && cut == Cut::No).then(|| service.budget.entry())
            };
            if let Some(expected) = expected {
                self.checker.judged(LEFT, expected == after, || {
                    let steps: Vec<String> = steps_of(pass, name)
                        .map(|s| format!("{} {:?}", s.now, s.answer))
                        .collect();
                    format!(
                        "{key:?}: the pass left {after:?}, the rule {expected:?} (started from {:?}; intent {:?}, inhibited {inhibited}, abandoned {:?}; steps {steps:#?})",
                        before.budget, pass.intent, pass.abandoned
                    )
                });
            }
        }
    }
}

/// Where a pass that was given up stood for one service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Not given up while this service's recovery ran.
    No,
    /// In hand when the pass was given up: its end is unknown.
    InHand,
    /// Given up before this service's recovery began.
    BeforeItBegan,
}

fn steps_of<'p>(
    pass: &'p WatchedPass<'_>,
    service: &'p stead::core::types::ServiceName,
) -> impl Iterator<Item = &'p WatchedStep> + 'p {
    pass.steps.iter().filter(move |step| {
        matches!(&step.command, InstanceCommand::Service { key, .. } if key.service == *service)
    })
}

/// Where the rules say a service's recovery stands, as its steps unfold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// A withdrawal left pending by an earlier pass, retried first (R6).
    RetryWithdrawal,
    FirstInspect,
    /// A fresh or down execution is withdrawn before anything else (R8).
    FailClosed,
    /// Down and allowed: the policy check before the start (R11).
    PolicyForStart,
    Start,
    /// The start was refused: the re-inspection decides (R11).
    AfterRefusedStart,
    InspectStarted,
    Health,
    /// Unhealthy at the threshold and allowed: the restart's policy check.
    PolicyForRestart,
    WithdrawBeforeRestart,
    Restart,
    InspectRestarted,
    /// Reading binds, probing, re-inspecting, reloading, persisting,
    /// recording and publishing: a failure of any is charged (R13).
    Verifying,
    /// Confirmed gone (R7): claims released, traffic withdrawn, forgotten.
    Gone,
    /// The service's recovery ended; at most a withdrawal follows.
    Ended,
}

struct Service<'a> {
    policy: &'a RecoveryPolicy,
    key: &'a GenerationKey,
    record: &'a ActiveService,
    budget: BudgetModel,
    /// The execution this daemon (or ACTIVE's durable record) vouches for.
    verified: Option<Timestamp>,
    at: At,
    /// When the first inspection answered: what a stable verdict vouches
    /// for (R14).
    observed_at: Option<Timestamp>,
    observed: Option<Observation>,
    withdrawn: bool,
    stable: bool,
    published: bool,
    /// This daemon cannot vouch that the route is up (R17, T5).
    route_unknown: bool,
    /// The execution verified is new: fresh, started or restarted.
    new_execution: bool,
    /// What the binds read answered.
    binds: Option<Binds>,
    /// The machine took a step the rules do not have where the judge
    /// stands (already reported): what it leaves is not judged again.
    unsure: bool,
}

impl<'a> Service<'a> {
    fn new(
        policy: &'a RecoveryPolicy,
        key: &'a GenerationKey,
        record: &'a ActiveService,
        entry: Option<&BudgetEntry>,
        remembered: Option<Timestamp>,
        route_unknown: bool,
    ) -> Self {
        Self {
            policy,
            key,
            record,
            budget: BudgetModel::from_entry(entry),
            verified: remembered.or(record.verified_started_at),
            at: At::FirstInspect,
            observed_at: None,
            observed: None,
            withdrawn: false,
            stable: false,
            published: false,
            route_unknown,
            new_execution: false,
            binds: None,
            unsure: false,
        }
    }

    /// R13: whether the verified execution must be (re)published. A
    /// service whose binds read answered none has nothing to route: it is
    /// verified and never published (the proxy refuses a route without an
    /// upstream).
    fn needs_publication(&self) -> bool {
        if self.binds.as_ref().is_some_and(Binds::is_empty) {
            return false;
        }
        self.new_execution
            || self.route_unknown
            || self.binds.as_ref().is_none_or(|b| *b != self.record.binds)
    }

    /// A successful withdrawal: nothing of the service is vouched for.
    fn withdrew(&mut self) {
        self.withdrawn = true;
        self.route_unknown = true;
    }

    /// Follows the steps of one service's recovery, judging its two
    /// budget decisions. Returns whether the budget it leaves is known
    /// (the steps ran to the recovery's end and nothing was ambiguous).
    fn follow(&mut self, steps: &[&WatchedStep], checker: &Checker) -> bool {
        let mut steps = steps.iter().peekable();
        if matches!(
            steps.peek().map(|s| &s.command),
            Some(InstanceCommand::Service {
                command: Command::Withdraw,
                ..
            })
        ) {
            self.at = At::RetryWithdrawal;
        }
        while let Some(step) = steps.next() {
            let (InstanceCommand::Service { command, .. }, InstanceAnswer::Service(outcome)) =
                (&step.command, &step.answer)
            else {
                continue;
            };
            let next = steps.peek().map(|s| match &s.command {
                InstanceCommand::Service { command, .. } => command.clone(),
                _ => unreachable!("filtered to the service's steps"),
            });
            self.step(command, outcome, step.now, next.as_ref(), checker);
        }
        !self.unsure && self.at == At::Ended
    }

    fn end(&mut self) {
        self.at = At::Ended;
    }

    /// A failure charged, then withdrawn (R13).
    fn charge(&mut self, now: Timestamp) {
        self.budget.failure(self.policy, now);
        self.end();
    }

    fn unstable_end(&mut self) {
        self.budget.unstable();
        self.end();
    }

    fn step(
        &mut self,
        command: &Command,
        outcome: &Outcome,
        now: Timestamp,
        next: Option<&Command>,
        checker: &Checker,
    ) {
        match (self.at, outcome) {
            (At::Ended, _) => {}
            (At::RetryWithdrawal, Outcome::Withdrawn(r)) => match r {
                Ok(()) => {
                    // Withdrawn, nothing is vouched for any more: the
                    // execution found next is a fresh one (R8).
                    self.verified = None;
                    self.withdrew();
                    self.at = At::FirstInspect;
                }
                Err(_) => self.unstable_end(),
            },
            (At::FirstInspect, Outcome::Inspected(r)) => match r {
                Err(RuntimeError::NotFound) => self.at = At::Gone,
                Err(_) => self.unstable_end(),
                Ok(obs) => {
                    self.observed_at = Some(now);
                    let fresh = obs.started_at.is_none() || obs.started_at != self.verified;
                    self.new_execution = fresh;
                    if fresh {
                        // R12, R14: a new execution's streaks are its own.
                        self.budget.clear_unhealthy();
                        self.budget.unstable();
                    }
                    self.observed = Some(obs.clone());
                    let unverified =
                        obs.status != ContainerStatus::Running && !obs.status.is_transitional();
                    if (fresh || unverified) && !self.withdrawn {
                        self.at = At::FailClosed;
                    } else {
                        self.by_status(now, next, checker);
                    }
                }
            },
            (At::FailClosed, Outcome::Withdrawn(r)) => match r {
                Ok(()) => {
                    self.withdrew();
                    self.by_status(now, next, checker);
                }
                Err(_) => self.unstable_end(),
            },
            (At::PolicyForStart, Outcome::PolicyChecked(r)) => match r {
                Ok(()) => self.at = At::Start,
                Err(_) => self.unstable_end(),
            },
            (At::Start, Outcome::Started(r)) => match r {
                Ok(()) => {
                    self.budget.attempt();
                    self.budget.clear_unhealthy();
                    self.new_execution = true;
                    self.at = At::InspectStarted;
                }
                Err(RuntimeError::NotFound) => {
                    self.budget.forget();
                    self.end();
                }
                Err(_) => self.at = At::AfterRefusedStart,
            },
            (At::AfterRefusedStart, Outcome::Inspected(r)) => match r {
                Ok(obs)
                    if obs.status == ContainerStatus::Running || obs.status.is_transitional() =>
                {
                    // R11: the runtime's own restart won: nothing charged,
                    // and it counts as the start.
                    self.budget.clear_unhealthy();
                    self.new_execution = true;
                    self.observed_at = Some(now);
                    self.observed = Some(obs.clone());
                    self.at = At::Health;
                }
                _ => self.charge(now),
            },
            (At::InspectStarted, Outcome::Inspected(r)) => match r {
                Ok(obs) => {
                    // R14: stable from the started execution's first sight.
                    self.observed_at = Some(now);
                    self.observed = Some(obs.clone());
                    self.at = At::Health;
                }
                Err(_) => self.unstable_end(),
            },
            (At::Health, Outcome::Health(r)) => self.on_health(r, now, next, checker),
            (At::PolicyForRestart, Outcome::PolicyChecked(r)) => match r {
                Ok(()) if self.withdrawn => self.at = At::Restart,
                Ok(()) => self.at = At::WithdrawBeforeRestart,
                Err(_) => self.unstable_end(),
            },
            (At::WithdrawBeforeRestart, Outcome::Withdrawn(r)) => match r {
                Ok(()) => {
                    self.withdrew();
                    self.at = At::Restart;
                }
                Err(_) => self.unstable_end(),
            },
            (At::Restart, Outcome::Restarted(r)) => match r {
                Ok(()) => {
                    self.budget.attempt();
                    self.budget.clear_unhealthy();
                    self.stable = false;
                    self.new_execution = true;
                    self.at = At::InspectRestarted;
                }
                Err(_) => self.charge(now),
            },
            (At::InspectRestarted, Outcome::Inspected(r)) => match r {
                Ok(obs) => {
                    self.observed_at = Some(now);
                    self.observed = Some(obs.clone());
                    self.at = At::Verifying;
                }
                Err(_) => self.unstable_end(),
            },
            (At::Verifying, _) => self.verifying(command, outcome, now, next, checker),
            (At::Gone, Outcome::Withdrawn(_)) => {
                self.budget.forget();
                self.end();
            }
            (At::Gone, Outcome::ClaimsReleased(_)) => {}
            (at, outcome) => checker.judged(LEFT, false, || {
                format!(
                    "{:?}: {outcome:?} answered where the rules stand at {at:?}",
                    self.key
                )
            }),
        }
    }

    /// R9 after fail-closed: drive by the first observation's status.
    fn by_status(&mut self, now: Timestamp, next: Option<&Command>, checker: &Checker) {
        let status = self.observed.as_ref().expect("observed").status;
        if status == ContainerStatus::Running {
            self.at = At::Health;
        } else if status.is_transitional() || status.is_refused() {
            self.unstable_end();
        } else {
            // R10: found down again with an attempt unconfirmed is a crash
            // loop: charged first, then the budget asked.
            let allowed = self.budget.found_down(self.policy, now);
            self.budget.unstable();
            self.decided(
                FOUND_DOWN,
                allowed,
                next,
                Some(Command::CheckPolicy),
                checker,
            );
            if allowed {
                self.at = At::PolicyForStart;
            } else {
                self.end();
            }
        }
    }

    /// R12.
    fn on_health(
        &mut self,
        read: &Result<Health, RuntimeError>,
        now: Timestamp,
        next: Option<&Command>,
        checker: &Checker,
    ) {
        self.at = At::Verifying;
        // R12 as its text reads: (stable, clears the streak) per answer.
        let (stable, clears) = match read {
            Err(_) => (false, false),
            Ok(Health::None) => (true, false),
            Ok(Health::Starting) => (false, true),
            Ok(Health::Healthy) => (true, true),
            Ok(Health::Unhealthy) => (false, false),
        };
        self.stable = stable;
        if clears {
            self.budget.clear_unhealthy();
        }
        if !matches!(read, Ok(Health::Unhealthy))
            || self.budget.unhealthy() < self.policy.unhealthy_threshold
        {
            return;
        }
        // At the threshold with a restart unconfirmed: that restart failed
        // (a never-healthy workload is a crash loop too).
        if self.budget.allow(now) && self.budget.attempt_pending() {
            self.budget.failure(self.policy, now);
        }
        let allowed = self.budget.allow(now);
        let then = if allowed {
            Command::CheckPolicy
        } else {
            Command::ReadBinds
        };
        self.decided(AT_THRESHOLD, allowed, next, Some(then), checker);
        if allowed {
            self.at = At::PolicyForRestart;
        }
    }

    /// Judges the command that follows a budget decision against the
    /// rule's `expected` one (`None`: nothing more of this service, a down
    /// generation held); unjudged when the pass was cut short there.
    fn decided(
        &self,
        invariant: &'static str,
        allowed: bool,
        next: Option<&Command>,
        expected: Option<Command>,
        checker: &Checker,
    ) {
        let ok = match (next, &expected) {
            // Nothing followed: a hold, or the pass cut short (the
            // caller's judgement of the budget left covers both).
            (None, _) => true,
            (Some(next), Some(expected)) => same_kind(next, expected),
            (Some(_), None) => false,
        };
        checker.judged(invariant, ok, || {
            format!(
                "{:?}: the budget {} ({:?}), and the pass then asked for {next:?} instead of {expected:?}",
                self.key,
                if allowed { "allowed an attempt" } else { "held it" },
                self.budget.entry(),
            )
        });
    }

    /// R13: a failed verification step is charged; a successful one leads
    /// on; the end of a verified recovery starts or continues the stable
    /// streak (R14).
    fn verifying(
        &mut self,
        command: &Command,
        outcome: &Outcome,
        now: Timestamp,
        next: Option<&Command>,
        checker: &Checker,
    ) {
        let observed = self.observed.clone().expect("observed");
        let ok = match outcome {
            Outcome::Binds(r) => {
                self.binds = r.as_ref().ok().cloned();
                r.is_ok()
            }
            Outcome::Readiness(r) => r.is_ok(),
            Outcome::Inspected(r) => matches!(r, Ok(obs)
                if obs.started_at == observed.started_at && obs.status == ContainerStatus::Running),
            Outcome::ActiveReloaded(r) => matches!(r, Ok(Some(current))
                if current.container == self.record.container
                    && current.effective_revision == self.record.effective_revision),
            Outcome::BindsPersisted(r) => matches!(r, Ok(true)),
            Outcome::Published(Err(_)) => {
                // The proxy failed, not the workload: not charged.
                self.unstable_end();
                return;
            }
            Outcome::Published(Ok(())) => {
                self.published = true;
                true
            }
            Outcome::ExecutionRecorded(Err(_)) if self.needs_publication() && !self.published => {
                // S11: never routed unrecorded; not charged, left withdrawn.
                self.unstable_end();
                return;
            }
            // An already-routed execution's record lags: verified anyway.
            Outcome::ExecutionRecorded(Err(_)) => true,
            Outcome::ExecutionRecorded(Ok(())) => true,
            Outcome::Withdrawn(_) => return,
            other => {
                // Not a verification step: the machine left the rules.
                self.unsure = true;
                checker.judged(LEFT, false, || {
                    format!(
                        "{:?}: {command:?} answered {other:?} while the rules stand verifying it",
                        self.key
                    )
                });
                return;
            }
        };
        if !ok {
            self.charge(now);
            return;
        }
        if next.is_none() {
            // The recovery ended verified (or was cut short, which the
            // caller leaves unjudged).
            if self.stable {
                self.budget
                    .stable(self.policy, self.observed_at.unwrap_or(now));
            } else {
                self.budget.unstable();
            }
            self.end();
        }
    }
}

fn same_kind(a: &Command, b: &Command) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}
