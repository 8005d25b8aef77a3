//! One instance's recovery: what entitles it to act (the lease and its
//! lock, T2, T3), a targeted recovery (T7), and one instance of a batch
//! settled or driven (`batch.rs` takes the batch, `instance_pass.rs`
//! drives the pass).

use tokio::time::Instant;

use crate::core::fleet::{Instance, ListedInstance};
use crate::core::memory::InstanceMemory;
use crate::core::pass::is_recovered;
use crate::core::types::InstanceName;
use crate::engine::clock::Trust;
use crate::ports::LeaseGrant;

use super::batch::Slot;
use super::{InstanceOutcome, RecoverError, Recoverer};

/// What entitles one instance's recovery to act: the reconciler lease
/// (its fence goes with every write) and the instance's lock, each trusted
/// only until it could have passed to another process.
pub(super) struct Mandate {
    pub(super) fence: LeaseGrant,
    pub(super) lock_until: Trust,
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

    /// One instance's part of a batch: driven if it was locked and
    /// loaded, else settled; with the memory its pass left, if driven.
    pub(super) async fn pass_of(
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
}

/// A busy instance's outcome: skipped, never waited on (R3).
pub(super) fn busy() -> InstanceOutcome {
    InstanceOutcome {
        skipped_busy: true,
        ..Default::default()
    }
}

/// Runs `future` until `deadline`. (madsim has no `timeout_at`, so both
/// builds use `timeout` with the remaining time.)
pub(super) async fn within<F: std::future::Future>(
    deadline: Instant,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(remaining, future).await
}
