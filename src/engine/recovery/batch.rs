//! A batch of instances' recovery: their locks taken and rows loaded in
//! one round trip where the store can (R3, T3), then each locked
//! instance's pass driven concurrently and the locks released in one.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::core::errors::PortFailure;
use crate::core::fleet::{InstanceId, ListedInstance};
use crate::core::memory::InstanceMemory;
use crate::core::pass::is_recovered;
use crate::core::policy::INSTANCE_LEASE_SLACK;
use crate::core::traffic::{FleetRoutes, HeldRoutes};
use crate::core::types::InstanceName;
use crate::engine::clock::Trust;
use crate::engine::count_port_failure;
use crate::engine::locks::{InstanceGuard, InstanceLocks};
use crate::ports::{LeaseGrant, LoadedInstance, LoadedInstances};

use super::instance::{busy, within};
use super::log::record_metrics;
use super::{InstanceOutcome, RecoverError, Recoverer};

impl Recoverer {
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
}

/// One instance of a batch, as the batch hands it to its pass.
pub(super) struct Slot {
    pub(super) name: InstanceName,
    /// Until when its lock is trusted; `None`: busy (R3).
    pub(super) lock_until: Option<Trust>,
    /// What was loaded under the lock; `None`: gone since it was listed.
    pub(super) row: Option<Result<LoadedInstance, crate::ports::StoreError>>,
    /// Its memory from earlier passes.
    pub(super) remembered: InstanceMemory,
    /// Its routes as the whole pass read them back (T5); `None` for a
    /// targeted pass or when the read failed.
    pub(super) routes: Option<HeldRoutes>,
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
