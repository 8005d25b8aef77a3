//! Planned upgrades that meet a rollout halted during the tick (C8).

use std::collections::BTreeSet;

use crate::core::fleet::{InstanceId, NewTask, RolloutState, TaskKind};
use crate::core::plan::{Decision, Snapshot};

use super::Reconciler;

impl Reconciler {
    /// The instances whose planned upgrades meet a rollout halted since the
    /// tick's snapshot was read: the recovery pass runs beside the
    /// planners and halts a type when a successor fails while baking, and
    /// no upgrade of a halted type is queued (C8; the fifty-instance day's
    /// seed 8 found two queued half a second after such a halt). A switch
    /// that cannot be read now stands as the snapshot read it.
    pub(super) async fn halted_since(
        &self,
        decisions: &[Decision],
        snapshot: &Snapshot<'_>,
    ) -> BTreeSet<InstanceId> {
        let upgrades: Vec<&NewTask> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Enqueue(task) if task.kind == TaskKind::Upgrade => Some(task),
                _ => None,
            })
            .collect();
        if upgrades.is_empty() {
            return Default::default();
        }
        let Ok(records) = self.ports.store.rollout_records().await else {
            return Default::default();
        };
        let newly_halted = |service_type: &str| {
            records.iter().any(|r| {
                r.service_type == service_type
                    && r.state == RolloutState::Halted
                    && snapshot.rollouts.get(service_type) != Some(&RolloutState::Halted)
            })
        };
        upgrades
            .iter()
            .filter(|task| {
                snapshot
                    .instances
                    .iter()
                    .find(|i| i.id == task.instance)
                    .is_some_and(|i| newly_halted(&i.service_type))
            })
            .map(|task| task.instance)
            .collect()
    }
}
