//! One instance's recovery: the lease ensured, the instance lock tried
//! (R3, T3), the instance loaded under it, and `InstancePass` driven
//! through the ports with the lease and lock checked before every outside
//! effect (T2) and the deadline on the monotonic clock.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::core::errors::PortFailure;
use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::{Instance, InstanceId, ListedInstance};
use crate::core::memory::InstanceMemory;
use crate::core::pass::{
    is_recovered, Abandon, InstanceAnswer, InstanceCommand, InstancePass, PassInput,
};
use crate::core::policy::INSTANCE_LEASE_SLACK;
use crate::core::recovery::Why;
use crate::core::traffic::{FleetRoutes, HeldRoutes};
use crate::core::types::InstanceName;
use crate::engine::clock::Trust;
use crate::engine::drive::{drive, Performer};
use crate::engine::locks::{InstanceGuard, InstanceLocks};
use crate::engine::{count_port_failure, time_until};
use crate::ports::{LeaseGrant, LoadedInstance, LoadedInstances};

use super::log::{log_budget, record_metrics, StepLog};
use super::{InstanceOutcome, RecoverError, Recoverer, WatchedPass, WatchedStep};

/// What entitles one instance's recovery to act: the reconciler lease
/// (its fence goes with every write) and the instance's lock, each trusted
/// only until it could have passed to another process.
pub(super) struct Mandate {
    fence: LeaseGrant,
    lock_until: Trust,
}

impl Recoverer {
    /// Whether an outside effect may be issued now: both the lease and the
    /// instance lock are still trusted (a process paused past either must
    /// not act on resuming, T2, T3).
    pub(super) fn may_act(&self, mandate: &Mandate) -> bool {
        // The grant trusted now must be the one this pass's writes are
        // fenced with: a lease taken again since (it ran out, by a clock
        // that stepped, and this process took it anew) has a new epoch,
        // and a pass still holding the old fence would act outside while
        // every write it makes is refused (#41).
        let same_grant = self
            .lease
            .current()
            .is_some_and(|grant| grant.epoch == mandate.fence.epoch);
        same_grant && mandate.lock_until.holds(self.locks.clock())
    }

    /// Recovers one instance under its lock, its deadline and the lease
    /// (a targeted pass: a runtime event, T7), under a trace of its own
    /// when targeted passes are traced.
    pub async fn recover_instance(&self, instance: &Instance) -> InstanceOutcome {
        let batch = [ListedInstance::from(instance)];
        let taken = self.take_batch(&batch).await;
        let traceparent = self.targeted_traceparent();
        let outcome = self
            .finish_batch(&batch, taken, None, traceparent.as_deref())
            .await
            .pop()
            .map_or_else(InstanceOutcome::default, |(_, outcome)| outcome);
        if outcome.skipped_busy {
            metrics::counter!("stead_recovery_busy_skips_total", "by" => "wakeup").increment(1);
        }
        outcome
    }

    /// A batch's first half: the lease ensured, the instances' locks
    /// taken (busy ones skipped, R3) and their rows loaded under them, in
    /// one round trip where the store can. The store's round trips per
    /// pass grow with the number of batches, not of instances (issue #14).
    pub(super) async fn take_batch(&self, batch: &[ListedInstance]) -> Taken {
        let each = |f: &dyn Fn(&ListedInstance) -> InstanceOutcome| {
            Taken::Settled(batch.iter().map(|i| (i.name.clone(), f(i))).collect())
        };
        let Some(fence) = self.fence().await else {
            return each(&|_| InstanceOutcome {
                skipped_no_lease: true,
                ..Default::default()
            });
        };
        let lock_ttl = self.policy.instance_deadline + INSTANCE_LEASE_SLACK;
        let ids: Vec<InstanceId> = batch.iter().map(|i| i.id).collect();
        // The locks and the rows under them in one round trip (where the
        // store can), bounded like every other call of the pass. The
        // deadline runs from before the request, as the locks' trust does.
        // Should it pass with the locks taken, they are this recovery's own
        // (taken again by its next pass) and expire for everyone else.
        let taken_at = Instant::now();
        let deadline = taken_at + self.policy.instance_deadline;
        let taken = within(
            deadline,
            self.locks
                .try_lock_and_load_batch(&ids, &self.lock_holder, lock_ttl),
        )
        .await;
        let (guards, loaded) = match taken {
            Ok(Ok(taken)) => taken,
            Ok(Err(e)) => {
                // One failed call, counted once, however many instances
                // of the batch it leaves untaken.
                let (port, kind) = e.failure();
                count_port_failure(port, kind);
                return each(&|i| {
                    InstanceOutcome::failed(RecoverError::Lock {
                        instance: i.name.clone(),
                        source: e.clone(),
                    })
                });
            }
            Err(_) => {
                return each(&|i| {
                    InstanceOutcome::failed(RecoverError::Deadline {
                        what: format!("{}: lock and load", i.name),
                    })
                })
            }
        };
        let locked: BTreeMap<InstanceId, Trust> = guards
            .iter()
            .map(|g| (g.instance(), g.trusted_until()))
            .collect();
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                let (port, kind) = e.failure();
                count_port_failure(port, kind);
                InstanceLocks::release_all(guards).await;
                return each(&|i| {
                    if locked.contains_key(&i.id) {
                        InstanceOutcome::failed(RecoverError::Load {
                            instance: i.name.clone(),
                            source: e.clone(),
                        })
                    } else {
                        busy()
                    }
                });
            }
        };
        Taken::Ready(TakenBatch {
            fence,
            guards,
            locked,
            loaded,
            taken_at,
        })
    }

    /// A batch's second half: each locked instance's pass driven
    /// concurrently under its own deadline (services of one instance stay
    /// in order), then the locks released in one round trip.
    pub(super) async fn finish_batch(
        &self,
        batch: &[ListedInstance],
        taken: Taken,
        mut held: Option<&mut FleetRoutes>,
        trace: Option<&str>,
    ) -> Vec<(InstanceName, InstanceOutcome)> {
        let TakenBatch {
            fence,
            guards,
            locked,
            mut loaded,
            taken_at,
        } = match taken {
            Taken::Settled(outcomes) => return outcomes,
            Taken::Ready(taken) => taken,
        };
        // Measured from the locks, as their trust is.
        let deadline = taken_at + self.policy.instance_deadline;
        if let Some(queue) = self.wake.get() {
            // One scheduler: a wake-up that came due by this load is
            // served by this recovery, so no worker repeats it. Done before
            // the drives, whose own requests for later wake-ups must stay.
            let at = Instant::now();
            for instance in batch.iter().filter(|i| loaded.contains_key(&i.id)) {
                queue.served(&instance.name, at);
            }
        }
        // Each driven instance's memory is copied out for the batch under
        // one lock, and put back the same way once the batch is done: a
        // tight loop of lookups into a large map overlaps their cache
        // misses (issue #14). Nothing else reads an instance's memory
        // while its lock is held but the log (the memory from before the
        // pass) and the operators' views.
        let passes: Vec<_> = {
            let memory = self.memory.lock().expect("memory poisoned");
            batch
                .iter()
                .map(|instance| {
                    let lock_until = locked.get(&instance.id).copied();
                    let row = loaded.remove(&instance.id);
                    // Only for the instances `pass_of` drives.
                    let remembered = match &row {
                        Some(Ok(row))
                            if lock_until.is_some() && is_recovered(row.instance.state) =>
                        {
                            memory.of_instance(&row.instance.name)
                        }
                        _ => InstanceMemory::default(),
                    };
                    let slot = Slot {
                        name: instance.name.clone(),
                        lock_until,
                        row,
                        remembered,
                        routes: held.as_deref_mut().map(|held| held.take(&instance.name)),
                    };
                    self.pass_of(slot, fence.clone(), deadline, trace)
                })
                .collect()
        };
        let driven = join_all(passes).await;
        let outcomes: Vec<(InstanceName, InstanceOutcome)> = {
            let mut memory = self.memory.lock().expect("memory poisoned");
            driven
                .into_iter()
                .map(|(name, outcome, left)| {
                    if let Some(left) = left {
                        memory.replace_instance(&name, left);
                    }
                    (name, outcome)
                })
                .collect()
        };
        InstanceLocks::release_all(guards).await;
        record_metrics(outcomes.iter().flat_map(|(_, o)| &o.reports));
        outcomes
    }

    /// One instance's part of a batch: driven if it was locked and
    /// loaded, else settled; with the memory its pass left, if driven.
    async fn pass_of(
        &self,
        slot: Slot,
        fence: LeaseGrant,
        deadline: Instant,
        trace: Option<&str>,
    ) -> (InstanceName, InstanceOutcome, Option<InstanceMemory>) {
        let Slot {
            name,
            lock_until,
            row,
            remembered,
            routes,
        } = slot;
        let outcome = match (lock_until, row) {
            (None, _) => busy(),
            // Gone since the listing (its name freed): nothing to do.
            (Some(_), None) => InstanceOutcome::default(),
            (Some(_), Some(Err(source))) => InstanceOutcome::failed(
                RecoverError::Load {
                    instance: name.clone(),
                    source,
                }
                .counted(),
            ),
            // Deleted since it was listed (or since the event
            // that asked for it): nothing of it is recovered, and
            // what was remembered of it goes (R4).
            (Some(_), Some(Ok(row))) if !is_recovered(row.instance.state) => {
                self.memory
                    .lock()
                    .expect("memory poisoned")
                    .forget_instance(&row.instance.name);
                InstanceOutcome::default()
            }
            (Some(lock_until), Some(Ok(row))) => {
                let mandate = Mandate { fence, lock_until };
                // Boxed: a drive's state is a few kilobytes, and
                // every instance's future is moved several times
                // into the batch's join; boxed, only the driven
                // ones pay for it, once.
                let (outcome, left) =
                    Box::pin(self.drive(row, remembered, &mandate, routes, deadline, trace)).await;
                return (name, outcome, Some(left));
            }
        };
        (name, outcome, None)
    }

    /// Drives one loaded instance's pass through the ports.
    async fn drive(
        &self,
        row: LoadedInstance,
        memory: InstanceMemory,
        mandate: &Mandate,
        held: Option<HeldRoutes>,
        deadline: Instant,
        trace: Option<&str>,
    ) -> (InstanceOutcome, InstanceMemory) {
        let LoadedInstance {
            instance,
            active,
            inhibitions,
        } = row;
        // What a watcher is told of the pass; only gathered for one.
        let watcher = self.watcher.get();
        let watched = watcher.map(|_| {
            let held = held.clone();
            (active.clone(), inhibitions.clone(), held, memory.clone())
        });
        let input = PassInput {
            instance: instance.name.clone(),
            intent: instance.intent(),
            active,
            inhibitions,
            held,
            memory,
            service_type: instance.service_type.clone(),
            now: self.ports.clock.now(),
        };
        let began_at = self.ports.clock.now();
        let mut pass = InstancePass::new(&self.policy, input);
        let mut steps = PassSteps {
            recoverer: self,
            instance: &instance,
            fence: &mandate.fence,
            log: StepLog::new(&self.memory, self.events(), trace, self.policy.broken),
            why: None,
            watched: watcher.map(|_| Vec::new()),
        };
        let careless = crate::broken!(self.policy.broken, ActOnExpiredLease);
        // One timer for the whole instance, not one per command: the
        // deadline is measured on the monotonic clock, and when it passes
        // the command in flight is dropped and the machine told.
        let driven = within(
            deadline,
            drive(&mut pass, &mut steps, self.ports.clock.as_ref(), || {
                careless || self.may_act(mandate)
            }),
        )
        .await;
        let abandoned = match driven {
            Ok(abandoned) => abandoned,
            Err(_) => {
                pass.abandon(Abandon::Deadline);
                Some(Abandon::Deadline)
            }
        };
        let PassSteps {
            log,
            watched: performed,
            ..
        } = steps;
        let steps = performed.unwrap_or_default();
        let report = pass.into_report();
        if let (Some(watcher), Some((active, inhibitions, held, before))) = (watcher, &watched) {
            watcher.passed(&WatchedPass {
                instance: &instance.name,
                intent: instance.intent(),
                active,
                inhibitions,
                held: held.as_ref(),
                before,
                steps: &steps,
                abandoned,
                after: &report.memory,
            });
        }
        if let (Some(at), Some(queue)) = (report.wake_at(), self.wake.get()) {
            // The machine's instant, on the monotonic clock, a little after
            // so the budget surely allows it by then.
            let wait = time_until(at, self.ports.clock.now());
            queue.wake(&instance.name, Instant::now() + wait + WAKE_SLACK);
        }
        let now = self.ports.clock.now();
        for service in &report.reports {
            log_budget(service, &log, now);
        }
        metrics::counter!("stead_retirements_total").increment(report.retired.len() as u64);
        let events = self.events();
        for container in &report.retired {
            tracing::info!(
                instance = %instance.name,
                %container,
                "retired a superseded container: its successor serves (R15)"
            );
            events.emit(
                Event::new(
                    EventKind::Retire,
                    now,
                    "R15",
                    format!("retired superseded container {container}: its successor serves"),
                )
                .instance(&instance.name)
                .container(container)
                .traced(trace),
            );
        }
        if let Some((why, services)) = &report.reverted {
            metrics::counter!("stead_reverts_total", "cause" => "bake").increment(1);
            tracing::warn!(
                instance = %instance.name,
                service_type = %instance.service_type,
                services = ?services,
                "a successor failed while baking: reverted to the predecessors and halted \
                 the type's rollout ({why}); `stead rollout resume` once the version is fixed"
            );
            let names: Vec<&str> = services.iter().map(|s| s.as_str()).collect();
            events.emit(
                Event::new(
                    EventKind::Revert,
                    now,
                    "bake",
                    format!(
                        "a successor failed while baking ({why}): reverted {} to the \
                         predecessors",
                        names.join(", ")
                    ),
                )
                .instance(&instance.name)
                .traced(trace),
            );
            events.emit(
                Event::new(
                    EventKind::Halt,
                    now,
                    "bake",
                    format!(
                        "halted the rollout of {} after a failed bake; `stead rollout resume` \
                         once the version is fixed",
                        instance.service_type
                    ),
                )
                .instance(&instance.name)
                .traced(trace),
            );
        }
        let outcome = InstanceOutcome {
            reports: report.reports,
            retired: report.retired.iter().map(ToString::to_string).collect(),
            errors: report.errors.into_iter().map(RecoverError::from).collect(),
            driven: true,
            began_at: Some(began_at),
            ..Default::default()
        };
        (outcome, report.memory)
    }
}

/// Performs an instance pass's commands, logging each step, and keeps them
/// for a watcher (the simulation's) when there is one.
struct PassSteps<'a> {
    recoverer: &'a Recoverer,
    instance: &'a Instance,
    fence: &'a LeaseGrant,
    log: StepLog<'a>,
    /// Why the command in flight was asked for.
    why: Option<Why>,
    watched: Option<Vec<WatchedStep>>,
}

impl Performer<InstancePass<'_>> for PassSteps<'_> {
    async fn perform(
        &mut self,
        pass: &InstancePass<'_>,
        command: &InstanceCommand,
    ) -> InstanceAnswer {
        self.why = pass.why();
        self.recoverer
            .perform(self.instance, command, self.fence)
            .await
    }

    fn performed(&mut self, command: InstanceCommand, answer: &InstanceAnswer) {
        let now = self.recoverer.ports.clock.now();
        self.log.step(&command, self.why.take(), answer, now);
        if let Some(steps) = &mut self.watched {
            steps.push(WatchedStep {
                command,
                answer: answer.clone(),
                now,
            });
        }
    }
}

/// How long after a delayed service's next attempt is allowed its wake-up
/// fires: enough that the clocks agree it is allowed by then.
const WAKE_SLACK: Duration = Duration::from_millis(10);

/// One instance of a batch, as the batch hands it to its pass.
struct Slot {
    name: InstanceName,
    /// Until when its lock is trusted; `None`: busy (R3).
    lock_until: Option<Trust>,
    /// What was loaded under the lock; `None`: gone since it was listed.
    row: Option<Result<LoadedInstance, crate::ports::StoreError>>,
    /// Its memory from earlier passes.
    remembered: InstanceMemory,
    /// Its routes as the whole pass read them back (T5); `None` for a
    /// targeted pass or when the read failed.
    routes: Option<HeldRoutes>,
}

/// A batch whose locks are taken and rows loaded, ready to drive; or one
/// settled without driving (no lease, the lock or the load failed).
pub(super) enum Taken {
    Ready(TakenBatch),
    Settled(Vec<(InstanceName, InstanceOutcome)>),
}

pub(super) struct TakenBatch {
    fence: LeaseGrant,
    guards: Vec<InstanceGuard>,
    /// The locked instances, each with when its lock stops being trusted.
    locked: BTreeMap<InstanceId, Trust>,
    loaded: LoadedInstances,
    /// When the locks were taken: the batch's deadline runs from then.
    taken_at: Instant,
}

impl Taken {
    /// Whether the batch was taken so long ago that it should be released
    /// and taken again before it is driven: its locks' trust and its
    /// deadline run from when they were taken, and its rows were read
    /// then.
    pub(super) fn is_stale(&self, fresh_for: Duration) -> bool {
        matches!(self, Taken::Ready(t) if t.taken_at.elapsed() > fresh_for)
    }

    /// Gives up a batch without driving it: its locks released.
    pub(super) async fn release(self) {
        if let Taken::Ready(taken) = self {
            InstanceLocks::release_all(taken.guards).await;
        }
    }
}

/// A busy instance's outcome: skipped, never waited on (R3).
fn busy() -> InstanceOutcome {
    InstanceOutcome {
        skipped_busy: true,
        ..Default::default()
    }
}

/// Runs `future` until `deadline`. (madsim has no `timeout_at`, so both
/// builds use `timeout` with the remaining time.)
async fn within<F: std::future::Future>(
    deadline: Instant,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(remaining, future).await
}
