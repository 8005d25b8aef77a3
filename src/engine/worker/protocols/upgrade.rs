//! Upgrades and undos: the `core::upgrade` machine (a rollout, a tidy of
//! a halted type, a move to a pinned version) and `core::undo`, driven
//! through the ports.

use std::collections::BTreeMap;

use crate::core::bake::baking;
use crate::core::catalog::CatalogEntry;
use crate::core::errors::TaskError;
use crate::core::fleet::Instance;
use crate::core::machine::Machine;
use crate::core::release::{HelmRelease, Provisioning};
use crate::core::spec::ReadinessProbe;
use crate::core::undo::{Undo, UndoInput, Undone};
use crate::core::upgrade::{Upgrade, UpgradeInput};

use crate::engine::worker::bake::HelmBaking;
use crate::engine::worker::Worker;

/// What an upgrade task does with the entry it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine::worker) enum UpgradeMode {
    /// The rollout: to the catalog's version, never back.
    Rollout,
    /// The type is halted: nothing is upgraded; what an interrupted
    /// upgrade left behind is tidied (`UpgradeInput::halted`).
    Tidy,
    /// To the version an operator's undo pinned the type to, older ones
    /// included (`UpgradeInput::pinned`).
    Pinned,
}

impl Worker {
    /// Overlap replacement per service: create the successor, verify it,
    /// mark the predecessor retirement-pending and switch ACTIVE. The
    /// recovery pass, the one owner of publication, then routes the
    /// successor (it honours a pending withdrawal first, R6, which a worker
    /// cannot see) and retires the predecessor once the successor serves;
    /// until then the predecessor keeps serving, so there is no gap. A
    /// failure removes the candidate and leaves ACTIVE alone.
    pub(in crate::engine::worker) async fn upgrade(
        &self,
        instance: &Instance,
        entry: CatalogEntry,
        mode: UpgradeMode,
    ) -> Result<(), TaskError> {
        let p = &self.ports;
        let name = &instance.name;
        let halted = mode == UpgradeMode::Tidy;
        let active = p
            .store
            .load_active(name)
            .await
            .map_err(|e| TaskError::new(name, "load ACTIVE", e))?;
        // A Helm type is upgraded by Helm, atomically, to the chart of the
        // catalog's version; a Docker type service by service.
        let parameters = entry.parameters_of(&instance.parameters);
        let release = match &entry.provisioning {
            Provisioning::Docker => None,
            Provisioning::Helm(chart) => {
                Some(Self::rendered(instance, &entry, &parameters, |params| {
                    chart.release_of(params, true)
                })?)
            }
        };
        let inhibitions = p
            .store
            .load_inhibitions(name)
            .await
            .map_err(|e| TaskError::new(name, "load the inhibitions", e))?;
        // Every container of the instance the runtime has, so a dropped
        // service's leftovers (a predecessor, a crashed upgrade's
        // candidate) go with it.
        let containers = if release.is_none() {
            self.containers_of(instance).await?
        } else {
            Vec::new()
        };
        let baking = match HelmBaking::after(release.as_ref(), mode == UpgradeMode::Rollout, &entry)
        {
            Some(baking) => Some(baking.back_to(self.recorded_release(instance).await?)),
            None => None,
        };
        let mut upgrade = Upgrade::new(UpgradeInput {
            release,
            inhibitions,
            containers,
            spec_digest: entry.spec_digest.clone(),
            recorded_spec_digest: instance.spec_digest.clone(),
            bake: entry.bake,
            halted,
            pinned: mode == UpgradeMode::Pinned,
            broken: self.config.broken,
            stop_grace_default: self.config.stop_grace_default,
            instance: instance.name.clone(),
            stopped: instance.stopped,
            state: instance.state,
            version: entry.version.clone(),
            recorded_version: instance.version.clone(),
            services: entry.services.clone(),
            active,
        });
        if upgrade.skipped_stopped() {
            tracing::info!(instance = %instance.name, "upgrade skipped: instance is stopped");
        }
        if upgrade.skipped_older_catalog() {
            tracing::warn!(
                instance = %instance.name,
                instance_version = %instance.version,
                catalog_version = %entry.version,
                "upgrade skipped: this worker's catalog is older than the instance's version \
                 (reload it); nothing downgraded, version drift plans it again"
            );
        }
        self.drive_task(instance, &parameters, &mut upgrade).await;
        if upgrade.reverted() {
            self.log_upgrade_revert(instance);
        }
        let skipped = upgrade.skipped_stopped() || upgrade.skipped_older_catalog();
        upgrade.into_report().map_err(|(_, e)| e)?;
        match baking.filter(|_| !skipped) {
            Some(baking) => self.bake_release(instance, baking).await,
            None => Ok(()),
        }
    }

    /// An upgrade that failed after switching some services put them back:
    /// a WARN line, a count and an event (#42).
    fn log_upgrade_revert(&self, instance: &Instance) {
        metrics::counter!("stead_reverts_total", "cause" => "upgrade").increment(1);
        tracing::warn!(
            instance = %instance.name,
            version = %instance.version,
            "upgrade failed after switching some services: they were put back on their \
             predecessors (an upgrade is all or nothing per instance)"
        );
        let reverted = crate::core::event_log::Event::new(
            crate::core::event_log::EventKind::Revert,
            self.ports.clock.now(),
            "C11",
            "upgrade failed after switching some services: they were put back on their \
             predecessors",
        );
        self.events.emit(reverted.instance(&instance.name));
    }

    /// The release of the version `instance` records, as the daemon
    /// recorded that version: what a bake's revert goes back to. `None`,
    /// said at warn, when it cannot be read back (never recorded, not a
    /// Helm version, refused by today's grants): the revert then goes back
    /// to the newest revision at another chart version.
    async fn recorded_release(
        &self,
        instance: &Instance,
    ) -> Result<Option<HelmRelease>, TaskError> {
        let entry = match self.held_entry(instance).await {
            Ok(entry) => entry,
            Err(e) if !e.is_permanent() => return Err(e),
            Err(e) => {
                tracing::warn!(
                    instance = %instance.name,
                    version = %instance.version,
                    error = %e,
                    "the version the instance records cannot be read back: a revert of its \
                     upgrade goes back to the newest revision at another chart version"
                );
                None
            }
        };
        let Some(entry) = entry else {
            return Ok(None);
        };
        let Provisioning::Helm(chart) = &entry.provisioning else {
            return Ok(None);
        };
        let parameters = entry.parameters_of(&instance.parameters);
        match Self::rendered(instance, &entry, &parameters, |p| chart.release_of(p, true)) {
            Ok(release) => Ok(Some(release)),
            Err(e) => {
                tracing::warn!(
                    instance = %instance.name,
                    version = %instance.version,
                    error = %e,
                    "the release of the version the instance records cannot be rendered: a \
                     revert of its upgrade goes back to the newest revision at another chart \
                     version"
                );
                Ok(None)
            }
        }
    }

    /// `stead rollout undo` of the instance (`core::undo`), when an
    /// operator asked for it on the markers of its baking upgrade: run by
    /// the type's upgrade task once the rollout is halted.
    pub(in crate::engine::worker) async fn undo(
        &self,
        instance: &Instance,
    ) -> Result<(), TaskError> {
        let p = &self.ports;
        let name = &instance.name;
        let entry = self.entry(instance)?;
        let active = p
            .store
            .load_active(name)
            .await
            .map_err(|e| TaskError::new(name, "load ACTIVE", e))?;
        let inhibitions = p
            .store
            .load_inhibitions(name)
            .await
            .map_err(|e| TaskError::new(name, "load the inhibitions", e))?;
        let services: Vec<Undone> = baking(&inhibitions, &active, p.clock.now())
            .filter(|(_, back, _)| back.undone)
            .map(|(marker, back, successor)| Undone {
                readiness: entry
                    .services
                    .iter()
                    .find(|spec| spec.name == marker.service)
                    .map_or(ReadinessProbe::None, |spec| spec.readiness.clone()),
                marker: marker.clone(),
                back: back.clone(),
                successor: successor.clone(),
            })
            .collect();
        if services.is_empty() {
            return Ok(());
        }
        let mut undo = Undo::new(UndoInput {
            instance: name.clone(),
            stopped: instance.stopped,
            services,
            stop_grace_default: self.config.stop_grace_default,
        });
        self.drive_task(instance, &BTreeMap::new(), &mut undo).await;
        let put_back = undo.into_report()?;
        metrics::counter!("stead_reverts_total", "cause" => "undo").increment(1);
        tracing::warn!(
            instance = %name,
            services = ?put_back,
            "rollout undone by an operator: the instance is back on its predecessors"
        );
        let undone = crate::core::event_log::Event::new(
            crate::core::event_log::EventKind::Revert,
            p.clock.now(),
            "#40 undo",
            format!(
                "rollout undone by an operator: back on the predecessors of {}",
                put_back
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        self.events.emit(undone.instance(name));
        Ok(())
    }
}
