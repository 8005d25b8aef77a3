//! C6: tasks whose worker died go back to the queue.

use super::{Decision, Plan, Planner, Report};
use crate::core::fleet::{add, TaskState};

impl Planner<'_, '_> {
    /// A running task whose lease ran out — `now` strictly later than
    /// `locked_at + lease` — goes back to `queued` with its attempts kept.
    /// Never earlier: a lease broken early hands a live provision to a
    /// second worker. A running task without `locked_at` has no lease to
    /// break; it is requeued and reported, since nothing else would ever
    /// free it.
    pub fn lease_expiry(&self) -> Plan {
        let snapshot = self.snapshot;
        let lease = snapshot.config.lease;
        let mut plan = Plan::default();
        for task in &snapshot.tasks {
            if task.state != TaskState::Running {
                continue;
            }
            match task.locked_at {
                Some(locked_at) if snapshot.now <= add(locked_at, lease) => continue,
                Some(_) => {}
                None => plan
                    .reports
                    .push(Report::RunningWithoutLease { task: task.id }),
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
