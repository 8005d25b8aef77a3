//! C7: expired instances are deleted.

use super::{ttl_expires, Decision, Plan, Planner};
use crate::fleet::{InstanceState, TaskKind};

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
        // The mutation exercise's late expiry judges the TTL three minutes
        // in the past.
        let judged_at = if crate::broken!(snapshot.config.broken, ExpireLate) {
            snapshot.now - jiff::SignedDuration::from_secs(180)
        } else {
            snapshot.now
        };
        for instance in &snapshot.instances {
            if !ttl_expires(instance, judged_at, self.active_kinds(instance.id)) {
                continue;
            }
            let reason = match (instance.state, instance.expires_at) {
                (InstanceState::Deleting, _) => "deleting without a deprovision task".to_owned(),
                (_, Some(at)) => format!("ttl: expired at {at}"),
                (_, None) => continue,
            };
            plan.decisions.push(Decision::Expire {
                instance: instance.id,
                from: instance.state,
                task: self.new_task(TaskKind::Deprovision, instance.id, snapshot.now, reason),
            });
        }
        plan
    }
}
