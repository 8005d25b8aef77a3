//! C6: tasks whose worker died go back to the queue.

use std::time::Duration;

use super::{ControlConfig, Decision, Plan, Planner, Report};
use crate::fleet::{add, Task, TaskState};
use crate::types::Timestamp;

/// Whether C6 puts `task` back in the queue at `now`: it is running and its
/// lease ran out (or it has none to run out).
pub(super) fn lease_ran_out(task: &Task, now: Timestamp, lease: Duration) -> bool {
    task.state == TaskState::Running && task.locked_at.is_none_or(|at| now > add(at, lease))
}

/// The lease C6 breaks tasks at: the configured one (half of it when the
/// mutation exercise breaks the rule).
pub fn task_lease(config: &ControlConfig) -> Duration {
    if crate::broken!(config.broken, BreakTaskLeaseEarly) {
        config.lease / 2
    } else {
        config.lease
    }
}

impl Planner<'_, '_> {
    /// A running task whose lease ran out — `now` strictly later than
    /// `locked_at + lease` — goes back to `queued` with its attempts kept.
    /// Never earlier: a lease broken early hands a live provision to a
    /// second worker. A running task without `locked_at` has no lease to
    /// break; it is requeued and reported, since nothing else would ever
    /// free it.
    pub fn lease_expiry(&self) -> Plan {
        let snapshot = self.snapshot;
        let lease = task_lease(snapshot.config);
        let mut plan = Plan::default();
        for task in &snapshot.tasks {
            if !lease_ran_out(task, snapshot.now, lease) {
                continue;
            }
            if task.locked_at.is_none() {
                plan.reports
                    .push(Report::RunningWithoutLease { task: task.id });
            }
            plan.decisions.push(Decision::RequeueExpiredLease {
                task: task.id,
                locked_by: task.locked_by.clone(),
                locked_at: task.locked_at,
                attempts: task.attempts,
            });
        }
        plan
    }
}
