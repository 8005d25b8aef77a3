//! How a task ends: done, retried with backoff, or failed (and a failed
//! upgrade halts its type's rollout, C11); one log line per end.

use crate::core::errors::TaskError;
use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::{Instance, InstanceState, RetryDecision, Task, TaskKind};
use crate::core::plan::halt_after_failed_upgrade;
use crate::core::types::Timestamp;

use super::Worker;

/// What one claimed task came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEnd {
    Done,
    /// Failed with a kind that may pass; queued again after a backoff.
    Retried(TaskError),
    /// Failed for good: out of attempts, or of a permanent kind.
    Failed(TaskError),
    /// An upgrade failed with attempts left, its retry outside the
    /// instance's window: the task ended (no slot held, no halt) and
    /// version drift queues the upgrade again once the window opens at
    /// this instant (#55).
    Deferred(TaskError, Timestamp),
    /// The lease was lost mid-task; another worker owns it now.
    LeaseLost,
}

impl TaskEnd {
    /// The `outcome` label of `stead_tasks_total`.
    pub fn label(&self) -> &'static str {
        match self {
            TaskEnd::Done => "done",
            TaskEnd::Retried(_) => "retried",
            TaskEnd::Failed(_) => "failed",
            TaskEnd::Deferred(..) => "deferred",
            TaskEnd::LeaseLost => "lease_lost",
        }
    }

    pub const LABELS: [&'static str; 5] = ["done", "retried", "failed", "deferred", "lease_lost"];
}

/// One line per finished task, naming it and its instance; failures at
/// warn with the error's message.
pub(super) fn log_end(task: &Task, instance: &str, end: &TaskEnd) {
    let what = format!("task {} {} of {instance}", task.id, task.kind);
    match end {
        TaskEnd::Done => tracing::info!(instance, outcome = "done", "{what} done"),
        TaskEnd::Retried(e) => {
            tracing::warn!(
                instance,
                outcome = "retried",
                error_kind = %e.kind(),
                "{what} failed, will retry: {e}"
            )
        }
        TaskEnd::Failed(e) => tracing::warn!(
            instance,
            outcome = "failed",
            error_kind = %e.kind(),
            "{what} failed after {} attempts, giving up: {e}",
            task.attempts
        ),
        TaskEnd::Deferred(e, opens_at) => tracing::warn!(
            instance,
            outcome = "deferred",
            error_kind = %e.kind(),
            "{what} failed: {e}; its window closes before the retry, so the task ends and \
             the upgrade is queued again when the window next opens ({opens_at})"
        ),
        TaskEnd::LeaseLost => tracing::warn!(
            instance,
            outcome = "lease_lost",
            "{what}: lease lost mid-task; another worker owns it now"
        ),
    }
}

/// What a task's end writes to the event log (#42); nothing for a lost
/// lease (the worker that owns it now tells its end).
pub(super) fn end_event(
    task: &Task,
    instance: &str,
    end: &TaskEnd,
    now: crate::core::types::Timestamp,
) -> Option<Event> {
    let what = format!("task {} {} of {instance}", task.id, task.kind);
    let (kind, message) = match end {
        TaskEnd::Done => (EventKind::TaskDone, format!("{what} done")),
        TaskEnd::Retried(e) => (
            EventKind::TaskRetry,
            format!("{what} failed, will retry: {e}"),
        ),
        TaskEnd::Failed(e) => (
            EventKind::TaskFailed,
            format!(
                "{what} failed after {} attempts, giving up: {e}",
                task.attempts
            ),
        ),
        TaskEnd::Deferred(e, opens_at) => (
            EventKind::TaskRetry,
            format!(
                "{what} failed: {e}; its window closes before the retry, so the task ends and \
                 the upgrade is queued again when the window next opens ({opens_at})"
            ),
        ),
        TaskEnd::LeaseLost => return None,
    };
    let event = Event::new(kind, now, "C11", message).traced(task.traceparent.as_deref());
    Some(
        match crate::core::names::check_instance_name("instance", instance) {
            Ok(()) => event.instance(&crate::core::types::InstanceName::new(instance)),
            Err(_) => event,
        },
    )
}

impl Worker {
    /// A failed upgrade halts its service type's rollout, so a bad
    /// version stops after one tenant (C8). A failed provision leaves its
    /// instance `failed`, not `provisioning` forever: `stead status` shows
    /// it, and `stead instance retry` provisions it again.
    pub(super) async fn after_final_failure(&self, task: &Task, error: &TaskError) {
        let Ok(Some(instance)) = self.ports.store.instance_by_id(task.instance).await else {
            return;
        };
        if task.kind == TaskKind::Provision && instance.state == InstanceState::Provisioning {
            self.mark_provision_failed(&instance, error).await;
            return;
        }
        let mut failed = task.clone();
        failed.last_error = Some(error.to_string());
        let decision = halt_after_failed_upgrade(&failed, &instance, RetryDecision::Fail);
        if let Some(
            decision @ crate::core::plan::Decision::HaltRollout {
                service_type,
                reason,
            },
        ) = &decision
        {
            self.halt_rollout(task, &instance, decision, service_type, reason)
                .await;
        }
    }

    /// Moves an instance whose provision ran out of attempts from
    /// `provisioning` to `failed`.
    async fn mark_provision_failed(&self, instance: &Instance, error: &TaskError) {
        let now = self.ports.clock.now();
        match self
            .ports
            .store
            .set_instance_state(
                instance.id,
                InstanceState::Provisioning,
                InstanceState::Failed,
                now,
            )
            .await
        {
            Ok(true) => tracing::warn!(
                instance = %instance.name,
                "instance {} failed: its provision ran out of attempts ({error}); \
                 `stead instance retry {}` provisions it again",
                instance.name,
                instance.name
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                instance = %instance.name,
                "could not mark {} failed after its provision ran out of attempts: {e}",
                instance.name
            ),
        }
    }

    /// Halts `service_type`'s rollout after a failed upgrade (C8), and
    /// cancels the upgrades queued behind it.
    async fn halt_rollout(
        &self,
        task: &Task,
        instance: &Instance,
        decision: &crate::core::plan::Decision,
        service_type: &str,
        reason: &str,
    ) {
        let now = self.ports.clock.now();
        let halted = self
            .ports
            .store
            .set_rollout(
                service_type,
                crate::core::fleet::RolloutState::Halted,
                reason,
                now,
                None,
            )
            .await;
        match halted {
            Ok(()) => {
                // A halt stops what is waiting too (C8).
                self.cancel_waiting_upgrades(service_type, now).await;
                metrics::counter!("stead_decisions_total", "decision" => decision.label())
                    .increment(1);
                self.events.emit(
                    Event::new(
                        EventKind::Halt,
                        now,
                        "C8",
                        format!("rollout of {service_type} halted: {reason}"),
                    )
                    .instance(&instance.name)
                    .traced(task.traceparent.as_deref()),
                );
                tracing::warn!(
                service_type = %service_type,
                "rollout of {service_type} halted (C8): {reason}; resume with `stead rollout resume {service_type}`"
                )
            }
            Err(e) => tracing::error!(
                service_type = %service_type,
                "rollout of {service_type} should halt ({reason}) but the store refused: {e}"
            ),
        }
    }

    /// Cancels the upgrades of `service_type` still queued once its
    /// rollout is halted; workers also check the switch before starting.
    async fn cancel_waiting_upgrades(&self, service_type: &str, now: Timestamp) {
        match self
            .ports
            .store
            .cancel_queued_upgrades(service_type, crate::core::fleet::CANCELLED_BY_HALT, now)
            .await
        {
            Ok(cancelled) if !cancelled.is_empty() => {
                tracing::warn!(
                    service_type = %service_type,
                    cancelled = ?cancelled,
                    "cancelled the queued upgrades of {service_type}'s halted rollout"
                );
                self.events.emit(Event::new(
                    EventKind::Cancel,
                    now,
                    "C8",
                    format!(
                        "cancelled the queued upgrades {cancelled:?} of \
                         {service_type}'s halted rollout"
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                service_type = %service_type,
                "could not cancel the queued upgrades of {service_type} ({e}); \
                 workers check the switch before they start one"
            ),
        }
    }
}
