//! The whole-fleet pass: the runtime's listing begun, the traffic plane
//! read, the fleet planned (`core::pass::plan_fleet_pass`), stale routes
//! withdrawn, and the instances recovered in batches, two pipelined.

use crate::core::pass::plan_fleet_pass;

use super::{PassOutcome, RecoverError, Recoverer};

/// How long a batch taken ahead (while the one before it was driven) may
/// wait before it is driven; longer, and it is released and taken again,
/// so its passes get their whole deadline under locks taken just before.
const PREFETCH_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl Recoverer {
    /// One pass over every instance. Never fails as a whole: errors are
    /// aggregated per instance so one never hides another.
    pub async fn pass(&self) -> PassOutcome {
        self.pass_traced(None).await
    }

    /// [`Recoverer::pass`] as part of the tick traced by `traceparent`:
    /// the events it logs carry its trace id, so one pass's events group.
    pub async fn pass_traced(&self, traceparent: Option<&str>) -> PassOutcome {
        let mut outcome = PassOutcome::default();
        let began = tokio::time::timeout(self.policy.instance_deadline, async {
            self.ports.runtime.begin_pass().await
        })
        .await;
        match began {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome.errors.push(RecoverError::RuntimeList(e).counted()),
            Err(_) => outcome.errors.push(RecoverError::Deadline {
                what: "runtime list".to_owned(),
            }),
        }
        // The routes are read before the instances are listed: an instance
        // created in between is listed, so its fresh route is never taken
        // for a gone instance's.
        let mut held = self.read_traffic_plane(&mut outcome).await;
        let mut rows = match self.ports.store.list_for_recovery().await {
            Ok(rows) => rows,
            Err(e) => {
                outcome
                    .errors
                    .push(RecoverError::ListInstances(e).counted());
                return outcome;
            }
        };
        let bad_rows = !rows.bad.is_empty();
        {
            let helm = self.helm_types.lock().expect("helm types poisoned");
            rows.rows.retain(|i| !helm.contains(&i.service_type));
        }
        outcome.errors.extend(
            rows.bad
                .into_iter()
                .map(|e| RecoverError::SkippedRow(e).counted()),
        );
        let plan = plan_fleet_pass(held.as_ref(), rows.rows, bad_rows);
        for gone in &plan.withdraw {
            self.withdraw_stale(gone, &mut outcome.errors).await;
        }
        {
            let mut memory = self.memory.lock().expect("memory poisoned");
            for name in &plan.forget {
                memory.forget_instance(name);
            }
        }
        // A pipeline of two: the next batch's locks are taken and its rows
        // loaded while this batch's instances are driven, so the store's
        // round trips and the passes overlap; at most `instances_at_once`
        // instances are driven at a time.
        let mut batches = plan.recover.chunks(self.policy.instances_at_once.max(1));
        // Gathered in listing order, as the outcome keeps them.
        let mut instances = Vec::with_capacity(plan.recover.len());
        let mut current = match batches.next() {
            Some(batch) => Some((batch, self.take_batch(batch).await)),
            None => None,
        };
        while let Some((batch, mut taken)) = current.take() {
            if taken.is_stale(PREFETCH_FRESH) {
                // The batch before took long (a slow runtime): these locks
                // were taken too long ago to drive under; take them again.
                taken.release().await;
                taken = self.take_batch(batch).await;
            }
            let next = batches.next();
            let (results, next_taken) = tokio::join!(
                self.finish_batch(batch, taken, held.as_mut(), traceparent),
                async {
                    match next {
                        Some(next) => Some((next, self.take_batch(next).await)),
                        None => None,
                    }
                }
            );
            current = next_taken;
            if results.iter().any(|(_, r)| r.skipped_no_lease) {
                // The lease is lost: nothing more may be done this pass.
                outcome.errors.push(RecoverError::LeaseLost);
                if let Some((_, taken)) = current.take() {
                    taken.release().await;
                }
                break;
            }
            let busy = results.iter().filter(|(_, r)| r.skipped_busy).count();
            if busy > 0 {
                metrics::counter!("stead_recovery_busy_skips_total", "by" => "pass")
                    .increment(busy as u64);
            }
            instances.extend(results);
        }
        outcome.instances = instances;
        outcome
    }
}
