//! The protocols of the task kinds: each drives the core's machine
//! (`core::provision`, `core::upgrade`) through the ports and moves the
//! instance along its lifecycle. This file holds what they share (the
//! catalog entry, the containers listed, the lifecycle move, a container
//! created, the machine driven); `provision.rs` and `upgrade.rs` the
//! protocols.

mod provision;
mod upgrade;

pub(super) use upgrade::UpgradeMode;

use std::collections::BTreeMap;

use crate::core::catalog::CatalogEntry;
use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::fleet::{settle_state, Instance, InstanceState};
use crate::core::machine::Machine;
use crate::core::provision::{Deprovision, Provision, WorkAnswer, WorkCommand};
use crate::core::release::ReleaseParams;
use crate::core::spec::ServiceSpec;
use crate::core::types::{ContainerId, RuntimeError, ServiceName};
use crate::core::undo::{Undo, UndoAnswer, UndoCommand};
use crate::core::upgrade::{Upgrade, UpgradeAnswer, UpgradeCommand};
use crate::ports::CreateContainer;

use super::Worker;
use crate::engine::drive::{drive, Performer};

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

    /// `render` handed `instance`'s release with its `parameters` at
    /// `entry`'s version (this worker's catalog: the machines refuse one
    /// behind the instance's and record one ahead), its failure named.
    fn rendered<T, E: Into<Cause>>(
        instance: &Instance,
        entry: &CatalogEntry,
        parameters: &BTreeMap<String, String>,
        render: impl FnOnce(&ReleaseParams<'_>) -> Result<T, E>,
    ) -> Result<T, TaskError> {
        let params = ReleaseParams {
            parameters,
            ..ReleaseParams::of(instance, &entry.version)
        };
        render(&params).map_err(|e| TaskError::new(&instance.name, "render the release", e))
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
