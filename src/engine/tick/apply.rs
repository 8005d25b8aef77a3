//! Carrying out a check's decisions through the store, under the
//! lease's fence: the one place a tick writes, and it decides nothing.

use std::time::Duration;

use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::{InstanceId, InstanceState, NewTask, RolloutState};
use crate::core::plan::{task_lease, Decision, Notice, Snapshot};
use crate::core::types::Timestamp;
use crate::ports::{LeaseGrant, NotifyError, StoreError};

use super::{Check, Reconciler, TickOutcome};

/// Bound on one courtesy notification.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// The store's refusals of one check's decisions, in order; a fenced or
/// unavailable store ends the check at its first refusal.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub(super) struct ApplyFailed {
    check: Check,
    errors: Vec<StoreError>,
}

impl ApplyFailed {
    /// Each refusal named by its check, as the tick's failure lists it.
    fn describe(&self) -> String {
        let each: Vec<String> = self
            .errors
            .iter()
            .map(|e| format!("{}: {e}", self.check.as_str()))
            .collect();
        each.join("; ")
    }
}

impl Reconciler {
    /// Carries out decisions through the store; never decides anything.
    pub(super) async fn apply(
        &self,
        check: Check,
        decisions: &[Decision],
        fence: &LeaseGrant,
        out: &mut TickOutcome,
        snapshot: &Snapshot<'_>,
    ) -> Result<(), ApplyFailed> {
        let store = &self.ports.store;
        let now = self.ports.clock.now();
        let mut errors = Vec::new();
        let mut lease_reset = false;
        let halted_since = self.halted_since(decisions, snapshot).await;
        for decision in decisions {
            let result = match decision {
                Decision::Enqueue(task) if halted_since.contains(&task.instance) => {
                    tracing::info!(
                        instance = %instance_name(snapshot, task.instance),
                        "upgrade not queued: its type's rollout halted during this tick (C8)"
                    );
                    Ok(())
                }
                Decision::Enqueue(task) => {
                    self.enqueue(check, task, fence, out, snapshot, now).await
                }
                Decision::Expire {
                    instance,
                    from,
                    task,
                } => {
                    self.expire(*instance, *from, task, fence, out, snapshot, now)
                        .await
                }
                Decision::RequeueExpiredLease { .. } if lease_reset => Ok(()),
                Decision::RequeueExpiredLease { .. } => {
                    lease_reset = true;
                    store
                        .reset_expired_leases(now, task_lease(&self.config), Some(fence))
                        .await
                        .map(|n| tracing::warn!(tasks_freed = n, "expired leases requeued"))
                }
                Decision::Notify(notice) => {
                    self.notify(notice, out).await;
                    Ok(())
                }
                Decision::HaltRollout {
                    service_type,
                    reason,
                } => {
                    self.halt_rollout(service_type, reason, fence, snapshot, now)
                        .await
                }
            };
            if result.is_ok() {
                metrics::counter!("stead_decisions_total", "decision" => decision.label())
                    .increment(1);
            }
            if let Err(e) = result {
                let stop = matches!(e, StoreError::Fenced { .. } | StoreError::Unavailable(_));
                errors.push(e);
                if stop {
                    break;
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApplyFailed { check, errors })
        }
    }

    /// Queues a planned task (drift's reprovision, version drift's
    /// upgrade), recording the event in the same transaction.
    async fn enqueue(
        &self,
        check: Check,
        task: &NewTask,
        fence: &LeaseGrant,
        out: &mut TickOutcome,
        snapshot: &Snapshot<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let store = &self.ports.store;
        let instance = instance_name(snapshot, task.instance);
        let when = if task.run_after > now {
            format!(", due {}", task.run_after)
        } else {
            String::new()
        };
        let (kind, rule) = match check {
            Check::Drift => (EventKind::Drift, "C5"),
            Check::VersionDrift => (EventKind::Enqueue, "C8"),
            _ => (EventKind::Enqueue, check.as_str()),
        };
        // Recorded in the enqueue's own transaction (#42).
        let event = self.stamped_about(
            &instance,
            Event::new(
                kind,
                now,
                rule,
                format!("queued {} of {instance}{when}: {}", task.kind, task.reason),
            )
            .traced(task.traceparent.as_deref()),
        );
        let queued = match &event {
            Some(event) => store.enqueue_recorded(task, now, Some(fence), event).await,
            None => store.enqueue(task, now, Some(fence)).await,
        };
        queued.map(|id| {
            if let Some(id) = id {
                out.tasks_enqueued += 1;
                tracing::info!(
                    instance = %instance,
                    task = id,
                    "queued task {id} {} of {instance}{when}: {}",
                    task.kind,
                    task.reason
                );
            }
        })
    }

    /// Expires an instance (C7): `deleting`, its deprovision queued and
    /// its other queued tasks cancelled in one transaction.
    #[allow(clippy::too_many_arguments)]
    async fn expire(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        fence: &LeaseGrant,
        out: &mut TickOutcome,
        snapshot: &Snapshot<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let store = &self.ports.store;
        let instance = instance_name(snapshot, id);
        // Recorded in the expiry's own transaction (#42).
        let event = self.stamped_about(
            &instance,
            Event::new(
                EventKind::TtlExpiry,
                now,
                "C7",
                format!(
                    "deleting {instance}: deprovision queued, its other queued \
                     tasks cancelled: {}",
                    task.reason
                ),
            )
            .traced(task.traceparent.as_deref()),
        );
        let expired = match &event {
            Some(event) => {
                store
                    .expire_instance_recorded(id, from, task, now, Some(fence), event)
                    .await
            }
            None => {
                store
                    .expire_instance(id, from, task, now, Some(fence))
                    .await
            }
        };
        expired.map(|expired| {
            if let Some(expired) = expired {
                out.tasks_enqueued += 1;
                tracing::info!(
                    instance = %instance,
                    task = expired.task,
                    "deleting {instance}: deprovision queued as task {}, {} queued \
                     task(s) cancelled: {}",
                    expired.task,
                    expired.cancelled.len(),
                    task.reason
                );
            }
        })
    }

    /// Sends a courtesy notification, bounded; a failure is a warning.
    async fn notify(&self, notice: &Notice, out: &mut TickOutcome) {
        // A courtesy: a failure never aborts the sweep (C5).
        let sent = tokio::time::timeout(
            NOTIFY_TIMEOUT,
            self.ports.notifier.notify(notice.event, &notice.message),
        )
        .await
        .unwrap_or_else(|_| Err(NotifyError("timed out".to_owned())));
        if let Err(e) = sent {
            out.warnings.push(format!("notify {}: {e}", notice.event));
        }
    }

    /// Halts a service type's rollout (C8), recording why.
    async fn halt_rollout(
        &self,
        service_type: &str,
        reason: &str,
        fence: &LeaseGrant,
        snapshot: &Snapshot<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let store = &self.ports.store;
        store
            .set_rollout(service_type, RolloutState::Halted, reason, now, Some(fence))
            .await
            .map(|()| {
                tracing::warn!(
                    service_type = %service_type,
                    "rollout of {service_type} halted (C8): {reason}"
                );
                self.emit(
                    Event::new(
                        EventKind::Halt,
                        now,
                        "C8",
                        format!("rollout of {service_type} halted: {reason}"),
                    )
                    .traced(snapshot.traceparent.as_deref()),
                );
            })
    }
}

/// How the tick names the instance with id `id`: its name when the
/// snapshot knows it, else its id.
fn instance_name(snapshot: &Snapshot<'_>, id: i64) -> String {
    snapshot
        .instances
        .iter()
        .find(|i| i.id == id)
        .map_or_else(|| format!("instance {id}"), |i| i.name.to_string())
}
