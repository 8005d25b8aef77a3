//! C7: expired instances are deleted.

use super::{is_expired, Decision, Plan, Planner};
use crate::core::fleet::{InstanceState, TaskKind};

impl Planner<'_, '_> {
    /// An instance past `expires_at` moves to `deleting` with one
    /// `deprovision` task, in one compare-and-set transaction; never a
    /// second while one is queued or running. An instance already
    /// `deleting` without a deprovision task (a crash between the API's
    /// state change and its insert, or a deprovision that gave up) gets one
    /// too, so every deleting instance eventually reaches `deleted`.
    pub fn ttl(&self) -> Plan {
        let snapshot = self.snapshot;
        let mut plan = Plan::default();
        for instance in &snapshot.instances {
            let reason = match instance.state {
                InstanceState::Deleted => continue,
                InstanceState::Deleting => "deleting without a deprovision task".to_owned(),
                _ if is_expired(instance, snapshot.now) => match instance.expires_at {
                    Some(at) => format!("ttl: expired at {at}"),
                    None => continue,
                },
                _ => continue,
            };
            if self.active_kinds(instance.id).has(TaskKind::Deprovision) {
                continue;
            }
            plan.decisions.push(Decision::Expire {
                instance: instance.id,
                from: instance.state,
                task: self.new_task(TaskKind::Deprovision, instance.id, snapshot.now, reason),
            });
        }
        plan
    }
}
