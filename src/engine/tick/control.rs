//! The control checks (C5–C8): one snapshot of the store, the planners
//! run over it under the lease, each check's plan carried out in turn.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::catalog::{Catalog, CatalogEntry};
use crate::core::fleet::{Instance, InstanceId, InstanceState, RolloutState, Task, TaskKind};
use crate::core::plan::{Plan, Planner, Snapshot};
use crate::core::policy::PLANNERS_LEASE_NEED;
use crate::ports::{LeaseGrant, StoreError, WaysBack};

use super::{Check, Reconciler, TickOutcome};

impl Reconciler {
    /// The four control checks (C5-C8) over one snapshot, under the lease;
    /// on a clock nothing vouches for, neither TTL expiry (C7) nor task
    /// requeue (C6).
    pub(super) async fn control_checks(
        &self,
        traceparent: String,
        verified: bool,
        out: &mut TickOutcome,
    ) {
        // One catalog for the whole tick, even if it is reloaded meanwhile.
        let catalog = self.catalog.current();
        match self.snapshot(&catalog, traceparent).await {
            Err(e) => {
                for check in &Check::ALL[1..] {
                    out.failed.push((*check, format!("snapshot: {e}")));
                }
            }
            Ok((snapshot, releases_error)) => {
                // The planners' writes are quick; the lease must outlast them.
                match self
                    .recoverer
                    .lease()
                    .ensure(self.ports.store.as_ref(), PLANNERS_LEASE_NEED)
                    .await
                {
                    Some(fence) => {
                        self.record_type_versions(&catalog, snapshot.now, &fence)
                            .await;
                        self.run_planners(&snapshot, releases_error, &fence, verified, out)
                            .await
                    }
                    None => {
                        for check in &Check::ALL[1..] {
                            out.failed
                                .push((*check, "reconciler lease lost".to_owned()));
                        }
                    }
                }
            }
        }
    }

    /// Reads what the planners need. Listing releases may fail on its own:
    /// drift then plans nothing, the other checks go on (C3). Also what
    /// `stead plan` forecasts from, with the catalog it judges.
    pub(crate) async fn snapshot<'c>(
        &'c self,
        catalog: &'c Catalog,
        traceparent: String,
    ) -> Result<(Snapshot<'c>, Option<String>), StoreError> {
        let store = &self.ports.store;
        let instances = store.list_instances().await?;
        let tasks = store.active_tasks().await?;
        let records = store.rollout_records().await?;
        let rollouts = records
            .iter()
            .map(|r| (r.service_type.clone(), r.state))
            .collect();
        let pins = self.pins(catalog, &records).await;
        let halted: BTreeSet<&str> = records
            .iter()
            .filter(|r| r.state == RolloutState::Halted)
            .map(|r| r.service_type.as_str())
            .chain(
                catalog
                    .entries()
                    .filter(|e| e.rollout == RolloutState::Halted)
                    .map(|e| e.service_type.as_str()),
            )
            .collect();
        // When the rows were read, at the store's precision: the planners
        // judge them at this instant. Taken after the release listing
        // (which may take the provisioner's whole timeout) a task's row
        // would be judged at a moment it no longer described: its lease
        // run out though its worker had renewed or finished it since, and
        // a planner at a finer `now` than the store applies its decision
        // with sees a lease run out a fraction of a microsecond early. The
        // simulation's C6 check found both (a sweep that freed nothing).
        let now = crate::store::normalize_timestamp(self.ports.clock.now());
        // Read after the tasks: an upgrade that switched and finished
        // between the two reads wrote its marker before its task ended,
        // so its bake is seen here if its task was not seen there.
        let ways_back = self.ways_back(now).await;
        let undos = match &ways_back {
            Some(ways) => self.undos(&ways.undone, &instances.rows, &tasks.rows, &halted),
            None => BTreeSet::new(),
        };
        self.log_bad_rows(instances.bad.iter().chain(tasks.bad.iter()));
        // Bounded like every outside call: a hung provisioner must not hang
        // the tick (found by the simulation).
        let listed = tokio::time::timeout(
            self.config.provisioner_timeout,
            self.ports.provisioner.list_releases(),
        )
        .await;
        let (releases, releases_error) = match listed {
            Ok(Ok(r)) => (Some(r), None),
            Ok(Err(e)) => (None, Some(e.to_string())),
            Err(_) => (None, Some("timed out".to_owned())),
        };
        Ok((
            Snapshot {
                now,
                unreadable_instances: instances.bad.len(),
                instances: instances.rows,
                tasks: tasks.rows,
                releases,
                catalog,
                rollouts,
                config: &self.config,
                traceparent: Some(traceparent),
                lost_services: self.recently_lost(now),
                pins,
                undos,
                baking: ways_back.map(|ways| ways.baking),
            },
            releases_error,
        ))
    }

    /// The upgrade markers' ways back at `now`: which instances bake, and
    /// which an operator asked to undo. Unread (said at warn), `None`: the
    /// tick starts no upgrade and no undo (should no undo's task come,
    /// the recovery pass reverts the instance itself,
    /// `core::bake::UNDO_TASK_GRACE`).
    async fn ways_back(&self, now: crate::core::types::Timestamp) -> Option<WaysBack> {
        match self.ports.store.ways_back(now).await {
            Ok(ways) => Some(ways),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "could not read which instances bake or wait on an operator's undo; no \
                     upgrade starts this tick, read again next tick"
                );
                None
            }
        }
    }

    /// The ready instances of halted types whose baking markers ask for
    /// an undo (`rollout undo`) and that have no upgrade task to carry it
    /// out.
    fn undos(
        &self,
        asked: &BTreeSet<InstanceId>,
        instances: &[Instance],
        tasks: &[Task],
        halted: &BTreeSet<&str>,
    ) -> BTreeSet<InstanceId> {
        if halted.is_empty() || asked.is_empty() {
            return BTreeSet::new();
        }
        let upgrading: BTreeSet<InstanceId> = tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Upgrade && t.state.is_active())
            .map(|t| t.instance)
            .collect();
        instances
            .iter()
            .filter(|i| {
                asked.contains(&i.id)
                    && i.state == InstanceState::Ready
                    && halted.contains(i.service_type.as_str())
                    && !upgrading.contains(&i.id)
            })
            .map(|i| i.id)
            .collect()
    }

    /// The entries undos pinned halted types to (`rollout undo --to`), as
    /// the daemon recorded them, read through this catalog's grants. A pin
    /// that cannot be read moves nothing, and says why.
    async fn pins(
        &self,
        catalog: &Catalog,
        records: &[crate::ports::RolloutRecord],
    ) -> BTreeMap<String, CatalogEntry> {
        let mut pins = BTreeMap::new();
        for record in records.iter().filter(|r| r.state == RolloutState::Halted) {
            let Some(version) = &record.pinned else {
                continue;
            };
            if catalog.get(&record.service_type).is_none() {
                continue;
            }
            let entry = crate::store::recorded_entry(
                self.ports.store.as_ref(),
                catalog,
                &record.service_type,
                version,
                None,
            )
            .await;
            match entry {
                Ok(entry) => {
                    pins.insert(record.service_type.clone(), entry);
                }
                Err(why) => tracing::error!(
                    service_type = %record.service_type,
                    version = %version,
                    "the type is pinned to a version that cannot be read this tick ({why}); \
                     nothing moves to it: `stead rollout resume` lifts the pin"
                ),
            }
        }
        pins
    }

    async fn run_planners(
        &self,
        snapshot: &Snapshot<'_>,
        releases_error: Option<String>,
        fence: &LeaseGrant,
        verified: bool,
        out: &mut TickOutcome,
    ) {
        // The snapshot's indexes are built once for the four planners;
        // each check is carried out before the next is planned.
        let planner = Planner::new(snapshot);
        match &releases_error {
            Some(e) => out
                .failed
                .push((Check::Drift, format!("list releases: {e}"))),
            None => {
                let plan = planner.drift();
                self.carry_out(Check::Drift, plan, snapshot, fence, out)
                    .await;
            }
        }
        // Both break another's claim by the clock: a reading that jumped
        // would requeue live tasks and expire every instance at once.
        if !verified {
            // Version drift counts the upgrade slots this tick's expiries
            // free (`Planner::new`), and times windows by the same clock:
            // with neither expiry run, it would fill slots still held (the
            // fifty-instance day's seed 2: four upgrades in flight against
            // a limit of three).
            return;
        }
        let plan = planner.lease_expiry();
        self.carry_out(Check::LeaseExpiry, plan, snapshot, fence, out)
            .await;
        let failed = out.failed.len();
        let plan = planner.ttl();
        self.carry_out(Check::Ttl, plan, snapshot, fence, out).await;
        if out.failed.len() > failed {
            // The same: an expiry not carried out freed no slot.
            out.failed.push((
                Check::VersionDrift,
                "skipped: the TTL check failed, and the slots its expiries free are not free"
                    .to_owned(),
            ));
            return;
        }
        let plan = planner.version_drift();
        self.carry_out(Check::VersionDrift, plan, snapshot, fence, out)
            .await;
    }

    /// Logs one check's reports and carries out its decisions; a failure
    /// fails that check alone (C3).
    async fn carry_out(
        &self,
        check: Check,
        plan: Plan,
        snapshot: &Snapshot<'_>,
        fence: &LeaseGrant,
        out: &mut TickOutcome,
    ) {
        self.log_reports(check, &plan.reports);
        if let Err(e) = self
            .apply(check, &plan.decisions, fence, out, snapshot)
            .await
        {
            out.failed.push((check, e.to_string()));
        }
    }
}
