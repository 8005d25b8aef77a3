//! The invariant checker. It is the ports' [`Observer`]: every effect is
//! checked at the instant it happens, against the simulation's ground truth:
//! ACTIVE and the inhibitions as the store holds them (the store reports
//! each write, whoever made it: an operator or a worker's upgrade), and what
//! operators made true (intent, deploys, foreign releases).
//!
//! The budget rule (S6) is checked against an independent model of the
//! delay ladder, never against the engine's own budget.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stead::core::fleet::{add, InstanceState};
use stead::core::policy::RecoveryPolicy;
use stead::core::types::{Binds, ContainerId, InstanceName, ServiceKey, Timestamp};
use stead::ports::memory::{Effect, Observer};
use stead::ports::{Clock, Route};

/// Effects kept for the failure trace (override: `STEAD_SIM_TRACE`).
const TRACE_LEN_DEFAULT: usize = 40;

fn trace_len_max() -> usize {
    std::env::var("STEAD_SIM_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TRACE_LEN_DEFAULT)
}

/// The ground truth the checks compare against. The recovery pass never
/// changes it; workers change ACTIVE and markers only through the store.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    /// ACTIVE: service → container.
    pub active: BTreeMap<ServiceKey, ContainerId>,
    pub stopped: BTreeSet<InstanceName>,
    /// Generations under a durable hold.
    pub inhibited: BTreeSet<ContainerId>,
    /// Retirement-pending containers → their service.
    pub markers: BTreeMap<ContainerId, ServiceKey>,
    /// Containers the operators created (deploys); never the engine.
    pub operator_created: BTreeSet<ContainerId>,
    /// Candidates a worker created for an upgrade or a reprovision: a
    /// failed upgrade may remove one that never became ACTIVE.
    pub worker_created: BTreeSet<ContainerId>,
    /// Workers are handling tasks: creating containers is their job.
    pub workers_running: bool,
    /// Service types whose rollout is halted, and since when.
    pub halted_since: BTreeMap<String, Timestamp>,
    /// Instances in `deleting` or `deleted`: a deprovision may remove their
    /// containers and uninstall their release.
    pub deleting: BTreeSet<InstanceName>,
    /// Releases some other tool installed; never ours to delete (S8).
    pub foreign_releases: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct Streak {
    interventions: Vec<Timestamp>,
    /// Since when the container has been up without a crash.
    up_since: Option<Timestamp>,
    /// It once stayed up a whole stable window since the last intervention.
    reset_earned: bool,
}

#[derive(Debug, Default)]
struct State {
    truth: Truth,
    probe_passed: BTreeSet<(ContainerId, Option<Timestamp>)>,
    /// Binds some execution of a container answered readiness on.
    ready_binds: BTreeSet<(ContainerId, Binds)>,
    withdraw_failed: BTreeSet<ServiceKey>,
    routes: BTreeMap<ServiceKey, Route>,
    streaks: BTreeMap<ContainerId, Streak>,
    violations: Vec<String>,
    checks: BTreeMap<&'static str, u64>,
    trace: VecDeque<String>,
    trace_hash: u64,
    effects: u64,
    tasks_seen: BTreeSet<i64>,
}

/// Checks S1–S8 on every effect; collects violations rather than panicking
/// so the runner can print the seed, the invariant and the trace.
pub struct Checker {
    clock: Arc<dyn Clock>,
    policy: RecoveryPolicy,
    state: Mutex<State>,
}

impl Checker {
    pub fn new(clock: Arc<dyn Clock>, policy: RecoveryPolicy) -> Self {
        Self {
            clock,
            policy,
            state: Mutex::new(State::default()),
        }
    }

    /// Operators change the truth through this, under the instance lock.
    pub fn truth<R>(&self, f: impl FnOnce(&mut Truth) -> R) -> R {
        f(&mut self.lock().truth)
    }

    pub fn truth_snapshot(&self) -> Truth {
        self.lock().truth.clone()
    }

    /// The daemon died: its volatile memory (budgets, pending withdrawals)
    /// is gone by design (R17), so the budget model re-arms too.
    pub fn daemon_restarted(&self) {
        let mut s = self.lock();
        s.streaks.clear();
        s.withdraw_failed.clear();
    }

    /// The engine was told a container is gone (R7): it forgets the
    /// generation's budget, so the model does too.
    pub fn generation_forgotten(&self, id: &ContainerId) {
        self.lock().streaks.remove(id);
    }

    /// Stopped intent forgets the instance's memory (R4).
    pub fn instance_stopped(&self, instance: &InstanceName) {
        let mut s = self.lock();
        let ids: Vec<ContainerId> = s
            .truth
            .active
            .iter()
            .filter(|(key, _)| &key.instance == instance)
            .map(|(_, id)| id.clone())
            .collect();
        for id in &ids {
            s.streaks.remove(id);
        }
    }

    /// The workload model reports a container going down (crash).
    pub fn container_went_down(&self, id: &ContainerId) {
        let now = self.clock.now();
        let window = self.policy.stable_window;
        let mut s = self.lock();
        if let Some(streak) = s.streaks.get_mut(id) {
            if streak.up_since.is_some_and(|up| add(up, window) <= now) {
                streak.reset_earned = true;
            }
            streak.up_since = None;
        }
    }

    /// The runtime brought a container up by itself (native restart).
    pub fn container_came_up(&self, id: &ContainerId) {
        let now = self.clock.now();
        let mut s = self.lock();
        if let Some(streak) = s.streaks.get_mut(id) {
            streak.up_since.get_or_insert(now);
        }
    }

    /// A check made outside an effect (the queue, after each tick).
    pub fn check_external(
        &self,
        invariant: &'static str,
        ok: bool,
        detail: impl FnOnce() -> String,
    ) {
        self.lock().check(invariant, ok, detail);
    }

    pub fn set_workers_running(&self, running: bool) {
        self.lock().truth.workers_running = running;
    }

    /// S10: a task once in the queue never disappears from it. Returns the
    /// ids not seen at the last look.
    pub fn tasks_seen(&self, ids: &[i64]) -> BTreeSet<i64> {
        let mut s = self.lock();
        let now: BTreeSet<i64> = ids.iter().copied().collect();
        let lost: Vec<i64> = s.tasks_seen.difference(&now).copied().collect();
        s.check("S10 no task lost", lost.is_empty(), || {
            format!("tasks {lost:?} vanished")
        });
        let new = now.difference(&s.tasks_seen).copied().collect();
        s.tasks_seen = now;
        new
    }

    /// A violation found outside an effect (the liveness checks).
    pub fn record_violation(&self, violation: String) {
        self.lock().violations.push(violation);
    }

    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    pub fn checks(&self) -> BTreeMap<&'static str, u64> {
        self.lock().checks.clone()
    }

    pub fn trace(&self) -> Vec<String> {
        self.lock().trace.iter().cloned().collect()
    }

    pub fn trace_hash(&self) -> u64 {
        self.lock().trace_hash
    }

    pub fn effects(&self) -> u64 {
        self.lock().effects
    }

    pub fn routes(&self) -> BTreeMap<ServiceKey, Route> {
        self.lock().routes.clone()
    }

    pub fn withdraw_failed(&self) -> BTreeSet<ServiceKey> {
        self.lock().withdraw_failed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("checker poisoned")
    }
}

fn instance_of(truth: &Truth, id: &ContainerId) -> Option<ServiceKey> {
    truth
        .active
        .iter()
        .find(|(_, c)| *c == id)
        .map(|(k, _)| k.clone())
}

impl State {
    fn check(&mut self, invariant: &'static str, ok: bool, detail: impl FnOnce() -> String) {
        *self.checks.entry(invariant).or_default() += 1;
        if !ok {
            self.violations.push(format!("{invariant}: {}", detail()));
        }
    }

    fn record(&mut self, now: Timestamp, effect: &Effect) {
        let line = format!("{now} {effect:?}");
        // FNV-1a over the trace: equal hashes for equal runs.
        for b in line.as_bytes() {
            self.trace_hash ^= u64::from(*b);
            self.trace_hash = self.trace_hash.wrapping_mul(0x100_0000_01b3);
        }
        self.effects += 1;
        if self.trace.len() >= trace_len_max() {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }
}

impl Observer for Checker {
    fn effect(&self, effect: &Effect) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.record(now, effect);
        match effect {
            Effect::Started { id } | Effect::Restarted { id } => {
                let service = instance_of(&s.truth, id);
                s.check("S1 start only ACTIVE", service.is_some(), || {
                    format!("{id} is not named by ACTIVE")
                });
                if let Some(service) = service {
                    let stopped = s.truth.stopped.contains(&service.instance);
                    s.check("S3 stopped never started", !stopped, || {
                        format!("{id} of stopped {}", service.instance)
                    });
                }
                let inhibited = s.truth.inhibited.contains(id);
                s.check("S4 inhibited never started", !inhibited, || {
                    format!("{id} is inhibited")
                });
                // A start or restart begins a new, unverified execution, so
                // traffic must already be withdrawn from it (R8, R12).
                let routed = s.routes.values().find(|r| &r.container == id).cloned();
                s.check(
                    "S2 never routed to an unverified execution",
                    routed.is_none(),
                    || {
                        format!(
                            "{id} started while {:?} still routes to it",
                            routed.map(|r| r.service)
                        )
                    },
                );
                self.check_budget(&mut s, id, now);
            }
            Effect::Created { id, .. } => {
                let by_operator = s.truth.operator_created.contains(id);
                let by_worker = s.truth.workers_running;
                if by_worker {
                    s.truth.worker_created.insert(id.clone());
                }
                s.check("S1 never creates", by_operator || by_worker, || {
                    format!("{id} created outside a deploy or a task")
                });
            }
            Effect::Removed { id } => {
                let marker = s.truth.markers.contains_key(id);
                let owner = instance_of(&s.truth, id);
                let deprovisioned = owner
                    .as_ref()
                    .is_some_and(|k| s.truth.deleting.contains(&k.instance));
                let candidate = s.truth.worker_created.contains(id) && s.truth.workers_running;
                let ok = deprovisioned || (owner.is_none() && (marker || candidate));
                s.check("S1 never removes ACTIVE", ok, || {
                    format!("{id} removed but it is neither a retirement marker nor deprovisioned")
                });
            }
            Effect::Uninstalled { release } => {
                let ours = s.truth.deleting.iter().any(|i| i.as_str() == release);
                let foreign = s.truth.foreign_releases.contains(release);
                s.check("S8 orphans never deleted", ours && !foreign, || {
                    format!("release {release} uninstalled but no deprovision owns it")
                });
            }
            Effect::Stopped { id } => {
                // The first destructive step of a retirement: by now the
                // successor must serve (verified and routed), unless the
                // instance is stopped or the service left ACTIVE (R15).
                if let Some(service) = s.truth.markers.get(id).cloned() {
                    if instance_of(&s.truth, id).is_none() {
                        // A stopped or deleting instance retires every
                        // marker: nothing of it may run (R4).
                        let stopped = s.truth.stopped.contains(&service.instance)
                            || s.truth.deleting.contains(&service.instance);
                        let ok = stopped
                            || match s.truth.active.get(&service) {
                                None => true,
                                Some(successor) => s.routes.get(&service).is_some_and(|r| {
                                    &r.container == successor
                                        && s.probe_passed
                                            .contains(&(successor.clone(), r.verified_started_at))
                                }),
                            };
                        s.check("S5 retire after successor serves", ok, || {
                            format!("{id} retired before its successor was verified and routed")
                        });
                    }
                }
            }
            Effect::Published { route } => {
                let key = &route.service;
                let active = s.truth.active.get(key) == Some(&route.container);
                s.check("S2 publish only ACTIVE", active, || {
                    format!("{key:?} published to non-ACTIVE {}", route.container)
                });
                let verified = s
                    .probe_passed
                    .contains(&(route.container.clone(), route.verified_started_at));
                s.check("S2 publish only verified", verified, || {
                    format!(
                        "{key:?} published {} execution {:?} never passed readiness",
                        route.container, route.verified_started_at
                    )
                });
                let blocked = s.withdraw_failed.contains(key);
                s.check("S2 withdraw retried before publish", !blocked, || {
                    format!("{key:?} published while its last withdrawal failed")
                });
                let stopped = s.truth.stopped.contains(&key.instance);
                s.check("S3 stopped never published", !stopped, || {
                    format!("{key:?} published while stopped")
                });
                s.routes.insert(key.clone(), route.clone());
            }
            Effect::Withdrawn { service } => {
                s.withdraw_failed.remove(service);
                s.routes.remove(service);
            }
            Effect::WithdrawFailed { service } => {
                s.withdraw_failed.insert(service.clone());
            }
            Effect::ProbePassed {
                id,
                started_at,
                binds,
            } => {
                s.probe_passed.insert((id.clone(), *started_at));
                s.ready_binds.insert((id.clone(), binds.clone()));
            }
            Effect::BindsSaved { id, binds } => {
                let ready = s.ready_binds.contains(&(id.clone(), binds.clone()));
                s.check("S7 binds saved only after readiness", ready, || {
                    format!("{id} binds {binds:?} reached ACTIVE before readiness passed on them")
                });
            }
            Effect::Installed { .. } => {}
            // The store's writes keep the truth of ACTIVE and of the
            // inhibitions, whoever made them (operators or workers).
            Effect::ActiveSaved { service, container } => {
                s.truth.active.insert(service.clone(), container.clone());
            }
            Effect::ActiveRemoved { service } => {
                s.truth.active.remove(service);
            }
            Effect::InhibitionSaved {
                service,
                container,
                retirement,
            } => {
                if *retirement {
                    s.truth.markers.insert(container.clone(), service.clone());
                } else {
                    s.truth.inhibited.insert(container.clone());
                }
            }
            Effect::RolloutSet {
                service_type,
                halted,
            } => {
                if *halted {
                    s.truth
                        .halted_since
                        .entry(service_type.clone())
                        .or_insert(now);
                } else {
                    s.truth.halted_since.remove(service_type);
                }
            }
            Effect::InstanceState { instance, state } => {
                if matches!(state, InstanceState::Deleting | InstanceState::Deleted) {
                    s.truth.deleting.insert(instance.clone());
                }
            }
            // Checked by the topology invariants (at most one process
            // changes an instance at a time).
            Effect::InstanceLocked { .. } | Effect::InstanceUnlocked { .. } => {}
            // The proxy forgot a route by itself: nothing routes there now.
            Effect::RouteLost { service } => {
                s.routes.remove(service);
            }
            Effect::InhibitionCleared { container, .. } => {
                s.truth.markers.remove(container);
                s.truth.inhibited.remove(container);
            }
        }
    }
}

impl Checker {
    /// S6: an independent model of the ladder. Within one streak of
    /// interventions on a generation, the k-th (k > free attempts) must
    /// follow the previous one by at least the ladder's delay. A streak
    /// resets when the generation ran crash-free for a stable window, or
    /// the daemon restarted (both re-arm the engine's budget too).
    fn check_budget(&self, s: &mut State, id: &ContainerId, now: Timestamp) {
        let free = self.policy.free_attempts as usize;
        let delays = self.policy.delays.clone();
        let window = self.policy.stable_window;
        let streak = s.streaks.entry(id.clone()).or_default();
        let stayed_up = streak.up_since.is_some_and(|up| add(up, window) <= now);
        if streak.reset_earned || stayed_up {
            streak.interventions.clear();
        }
        streak.reset_earned = false;
        streak.interventions.push(now);
        streak.up_since = Some(now);
        let k = streak.interventions.len();
        let gap_ok = if k > free {
            let need = delays[(k - 1 - free).min(delays.len() - 1)];
            let gap = now.duration_since(streak.interventions[k - 2]);
            gap >= jiff::SignedDuration::try_from(need).unwrap_or(jiff::SignedDuration::MAX)
        } else {
            true
        };
        let detail = format!("{id}: intervention #{k} at {now} too soon after the previous one");
        s.check("S6 budget", gap_ok, || detail);
    }
}

/// Upper bound of the budget's cap, used by the liveness deadline.
pub fn ladder_cap(policy: &RecoveryPolicy) -> Duration {
    *policy.delays.last().expect("validated policy has delays")
}
