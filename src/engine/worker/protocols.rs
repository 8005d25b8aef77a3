//! The protocols of the task kinds: each drives the core's machine
//! (`core::provision`, `core::upgrade`) through the ports and moves the
//! instance along its lifecycle.

use std::collections::BTreeMap;

use crate::core::bake::baking;
use crate::core::catalog::CatalogEntry;
use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::fleet::{settle_state, Instance, InstanceState};
use crate::core::machine::Machine;
use crate::core::provision::{
    Deprovision, DeprovisionInput, Provision, ProvisionInput, WorkAnswer, WorkCommand,
};
use crate::core::release::{Provisioning, ReleaseParams, ReleaseSpec, ReleaseTarget};
use crate::core::spec::{ReadinessProbe, ServiceSpec};
use crate::core::types::{ContainerId, RuntimeError, ServiceName};
use crate::core::undo::{Undo, UndoAnswer, UndoCommand, UndoInput, Undone};
use crate::core::upgrade::{Upgrade, UpgradeAnswer, UpgradeCommand, UpgradeInput};
use crate::ports::CreateContainer;

use super::Worker;
use crate::engine::drive::{drive, Performer};

/// What an upgrade task does with the entry it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UpgradeMode {
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
    /// The instance's catalog entry as the catalog is now (it may be
    /// reloaded between tasks, never within one).
    ///
    /// A type missing is not permanent: a process with the newer catalog
    /// may have queued the task before this worker reloaded its own.
    pub(super) fn entry(&self, instance: &Instance) -> Result<CatalogEntry, TaskError> {
        self.catalog
            .current()
            .get(&instance.service_type)
            .cloned()
            .ok_or_else(|| {
                let message = format!(
                    "service type {:?} is not in the catalog",
                    instance.service_type
                );
                TaskError::new(
                    &instance.name,
                    "read its catalog entry",
                    Cause::verdict(ErrorKind::NotFound, message),
                )
            })
    }

    /// Install-or-upgrade on the deterministic release name, then one
    /// container per service and ACTIVE naming it (`core::provision`).
    pub(super) async fn provision(
        &self,
        instance: &Instance,
        entry: CatalogEntry,
        pinned: bool,
    ) -> Result<(), TaskError> {
        let name = &instance.name;
        let active = self
            .ports
            .store
            .load_active(name)
            .await
            .map_err(|e| TaskError::new(name, "load ACTIVE", e))?;
        let parameters = entry.parameters_of(&instance.parameters);
        // Made from this worker's catalog, so of its version: the machine
        // refuses one behind the instance's, and records one ahead.
        let params = ReleaseParams {
            parameters: &parameters,
            ..ReleaseParams::of(instance, &entry.version)
        };
        let release = entry
            .provisioning
            .spec_of(&params, false)
            .map_err(|e| TaskError::new(name, "render the release", e))?;
        let (containers, inhibitions) = if entry.provisioning == Provisioning::Docker {
            (
                self.containers_of(instance).await?,
                self.ports
                    .store
                    .load_inhibitions(name)
                    .await
                    .map_err(|e| TaskError::new(name, "load the inhibitions", e))?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let mut provision = Provision::new(ProvisionInput {
            containers,
            inhibitions,
            instance: instance.name.clone(),
            version: entry.version.clone(),
            spec_digest: entry.spec_digest.clone(),
            recorded_version: instance.version.clone(),
            recorded_digest: instance.spec_digest.clone(),
            release,
            services: entry.services,
            active,
            pinned,
        });
        self.drive_task(instance, &parameters, &mut provision).await;
        provision.into_report()?;
        self.move_to(instance, Provision::SETTLES_AT).await
    }

    /// Overlap replacement per service: create the successor, verify it,
    /// mark the predecessor retirement-pending and switch ACTIVE. The
    /// recovery pass, the one owner of publication, then routes the
    /// successor (it honours a pending withdrawal first, R6, which a worker
    /// cannot see) and retires the predecessor once the successor serves;
    /// until then the predecessor keeps serving, so there is no gap. A
    /// failure removes the candidate and leaves ACTIVE alone.
    pub(super) async fn upgrade(
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
        let params = ReleaseParams {
            parameters: &parameters,
            ..ReleaseParams::of(instance, &entry.version)
        };
        let release = match &entry.provisioning {
            Provisioning::Docker => None,
            Provisioning::Helm(chart) => Some(
                chart
                    .release_of(&params, true)
                    .map_err(|e| TaskError::new(name, "render the release", e))?,
            ),
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
        // A Helm release upgraded by this task bakes afterwards (#40): not
        // a pinned move back, nor a halted type's tidy-up.
        let baking = release
            .as_ref()
            .filter(|_| mode == UpgradeMode::Rollout && !entry.bake.is_zero())
            .map(|release| {
                let target = ReleaseSpec::Helm(release.clone()).target();
                (target, release.chart_version.clone())
            });
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
            metrics::counter!("stead_reverts_total", "cause" => "upgrade").increment(1);
            tracing::warn!(
                instance = %instance.name,
                version = %instance.version,
                "upgrade failed after switching some services: they were put back on their \
                 predecessors (an upgrade is all or nothing per instance)"
            );
            // The event log (#42).
            let reverted = crate::core::event_log::Event::new(
                crate::core::event_log::EventKind::Revert,
                p.clock.now(),
                "C11",
                "upgrade failed after switching some services: they were put back on their \
                 predecessors",
            );
            self.events.emit(reverted.instance(&instance.name));
        }
        let skipped = upgrade.skipped_stopped() || upgrade.skipped_older_catalog();
        upgrade.into_report().map_err(|(_, e)| e)?;
        match baking.filter(|_| !skipped) {
            Some((release, chart_version)) => {
                self.bake_release(instance, release, chart_version, entry.bake)
                    .await
            }
            None => Ok(()),
        }
    }

    /// The instance's containers the runtime lists, as (service, container).
    async fn containers_of(
        &self,
        instance: &Instance,
    ) -> Result<Vec<(ServiceName, ContainerId)>, TaskError> {
        Ok(self
            .ports
            .runtime
            .list_managed()
            .await
            .map_err(|e| TaskError::new(&instance.name, "list its containers", e))?
            .into_iter()
            .filter(|c| c.instance == instance.name)
            .map(|c| (c.service, c.id))
            .collect())
    }

    /// Withdraw, stop and remove every container of the instance, release
    /// its claims, uninstall the release, mark it deleted
    /// (`core::provision`).
    pub(super) async fn deprovision(&self, instance: &Instance) -> Result<(), TaskError> {
        let p = &self.ports;
        let name = &instance.name;
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
        let release = self.release_target(instance)?;
        let mut deprovision = Deprovision::new(DeprovisionInput {
            instance: name.clone(),
            release,
            active,
            inhibitions,
            stop_grace_default: self.config.stop_grace_default,
            purge_volumes: instance.purge_volumes,
        });
        self.drive_task(instance, &BTreeMap::new(), &mut deprovision)
            .await;
        deprovision.into_report()?;
        self.move_to(instance, Deprovision::SETTLES_AT).await
    }

    /// Where the instance's release lives, by its type's provisioner. A
    /// type gone from the catalog was Docker's or Helm's, and stead cannot
    /// tell which: its containers are removed as a Docker release's, and
    /// the log says a Helm release, if it had one, is left installed.
    fn release_target(&self, instance: &Instance) -> Result<ReleaseTarget, TaskError> {
        let provisioning = match self.entry(instance) {
            Ok(entry) => entry.provisioning,
            Err(e) => {
                tracing::warn!(
                    instance = %instance.name,
                    "{e}: deprovisioned as a Docker release; a Helm release of it, if any, \
                     is left installed (keep a type in the catalog until its instances are deleted)"
                );
                Provisioning::Docker
            }
        };
        provisioning
            .target_of(&ReleaseParams::of(instance, &instance.version))
            .map_err(|e| TaskError::new(&instance.name, "name the release", e))
    }

    /// Moves the instance along its lifecycle, compare-and-set on its
    /// current state. Re-reads it so a retried handler is idempotent.
    async fn move_to(&self, instance: &Instance, to: InstanceState) -> Result<(), TaskError> {
        let p = &self.ports;
        let name = &instance.name;
        let step = format!("move the instance to {to}");
        let fail = |cause: Cause| TaskError::new(name, step.as_str(), cause);
        let current = p
            .store
            .instance_by_id(instance.id)
            .await
            .map_err(|e| fail(e.into()))?
            .ok_or_else(|| fail(Cause::verdict(ErrorKind::NotFound, "the instance vanished")))?;
        let Some(from) = settle_state(current.state, to).map_err(|e| fail(e.into()))? else {
            return Ok(());
        };
        let now = p.clock.now();
        self.allowed(name)?;
        let id = instance.id;
        let moved = self
            .write_locked(crate::ports::LockedWrite::State { id, from, to, now })
            .await
            .map_err(|e| fail(e.into()))?;
        if moved {
            Ok(())
        } else {
            Err(fail(Cause::verdict(
                ErrorKind::Conflict,
                "the instance changed state concurrently",
            )))
        }
    }

    pub(super) async fn create(
        &self,
        instance: &Instance,
        parameters: &BTreeMap<String, String>,
        spec: &ServiceSpec,
        version: &str,
        revision: &str,
    ) -> Result<ContainerId, RuntimeError> {
        let params = ReleaseParams {
            parameters,
            ..ReleaseParams::of(instance, version)
        };
        let env = spec
            .run
            .render_env(&spec.name, &params)
            .map_err(|e| RuntimeError::Refused(format!("{}: {e}", instance.name)))?;
        self.ports
            .runtime
            .create(&CreateContainer {
                instance: instance.name.clone(),
                instance_id: instance.id,
                spec: spec.clone(),
                env,
                revision: revision.to_owned(),
            })
            .await
    }
}

/// Performs a task's commands through the worker's ports.
struct TaskSteps<'a> {
    worker: &'a Worker,
    instance: &'a Instance,
    /// The instance's parameters under the entry the task works toward,
    /// which its containers' templates read.
    parameters: &'a BTreeMap<String, String>,
}

// Provision and Deprovision share one vocabulary of work; one impl each,
// since coherence cannot tell a blanket impl over that vocabulary apart
// from the other machines' impls once the machines live in another crate.
impl Performer<Provision> for TaskSteps<'_> {
    async fn perform(&mut self, _: &Provision, command: &WorkCommand) -> WorkAnswer {
        self.worker
            .perform_work(self.instance, self.parameters, command.clone())
            .await
    }
}

impl Performer<Deprovision> for TaskSteps<'_> {
    async fn perform(&mut self, _: &Deprovision, command: &WorkCommand) -> WorkAnswer {
        self.worker
            .perform_work(self.instance, self.parameters, command.clone())
            .await
    }
}

impl Performer<Upgrade> for TaskSteps<'_> {
    async fn perform(&mut self, _: &Upgrade, command: &UpgradeCommand) -> UpgradeAnswer {
        self.worker
            .perform_upgrade(self.instance, self.parameters, command.clone())
            .await
    }
}

impl Performer<Undo> for TaskSteps<'_> {
    async fn perform(&mut self, _: &Undo, command: &UndoCommand) -> UndoAnswer {
        self.worker.perform_undo(self.instance, command).await
    }
}

impl Worker {
    /// `stead rollout undo` of the instance (`core::undo`), when an
    /// operator asked for it on the markers of its baking upgrade: run by
    /// the type's upgrade task once the rollout is halted.
    pub(super) async fn undo(&self, instance: &Instance) -> Result<(), TaskError> {
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

    /// Drives a task's machine through the ports, every effect under the
    /// task lease and the instance lock (`engine::drive`).
    async fn drive_task<M>(
        &self,
        instance: &Instance,
        parameters: &BTreeMap<String, String>,
        machine: &mut M,
    ) where
        M: Machine,
        for<'a> TaskSteps<'a>: Performer<M>,
    {
        let mut steps = TaskSteps {
            worker: self,
            instance,
            parameters,
        };
        drive(machine, &mut steps, self.ports.clock.as_ref(), || {
            self.allowed(&instance.name).is_ok()
        })
        .await;
    }
}
