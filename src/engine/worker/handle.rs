//! Running one task's handler: the instance lock taken (waiting, bounded by
//! the task lease), the instance re-read under it, and a task for a
//! deleting or deleted instance refused (T4).

use crate::core::catalog::CatalogEntry;
use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::fleet::{Instance, RolloutState, Task, TaskKind};
use crate::core::policy::WORKER_LOCK_SLACK;

use super::protocols::UpgradeMode;
use super::Worker;
use crate::engine::locks::LockError;

impl Worker {
    /// Runs the task's handler under the instance's lock, shared with
    /// recovery and operator commands across processes (T3). The instance
    /// is read under the lock, so what the handler sees is what it acts on.
    ///
    /// The whole of it, waiting for the lock included, is bounded by the
    /// task lease: past it, another worker may own the task, and a hung
    /// runtime or provisioner call must not hold this worker, nor the
    /// instance lock, forever.
    pub(super) async fn handle(&self, task: &Task) -> Result<(), TaskError> {
        let began = tokio::time::Instant::now();
        // Until the row is read under the lock, the instance is its id.
        let subject = format!("instance {}", task.instance);
        let guard = self
            .locks
            .lock(
                task.instance,
                &self.config.id,
                self.config.lease + WORKER_LOCK_SLACK,
                self.config.lease,
            )
            .await
            .map_err(|e| {
                let cause = match e {
                    LockError::Store(e) => Cause::Store(e),
                    busy @ LockError::Busy { .. } => {
                        Cause::verdict(ErrorKind::Conflict, busy.to_string())
                    }
                };
                TaskError::new(&subject, "lock the instance", cause)
            })?;
        *self
            .lock_trusted_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(guard.trusted_until());
        *self.held_lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard.grant());
        let remaining = self.config.lease.saturating_sub(began.elapsed());
        let result = tokio::time::timeout(remaining, self.handle_locked(task))
            .await
            .unwrap_or_else(|_| {
                let message = format!("handler exceeded its {:?} lease", self.config.lease);
                Err(TaskError::new(
                    &subject,
                    "run the task",
                    Cause::verdict(ErrorKind::Transient, message),
                ))
            });
        *self
            .lock_trusted_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        *self.held_lock.lock().unwrap_or_else(|e| e.into_inner()) = None;
        guard.release().await;
        result
    }

    /// `instance`'s type's rollout as it stands now: halted in the catalog
    /// file or by the switch in the store (a halt after the task was
    /// queued must stop it before it changes anything), and the version an
    /// operator's undo pinned it to, if any.
    async fn rollout_of(&self, instance: &Instance) -> Result<Rollout, TaskError> {
        let in_catalog = self
            .catalog
            .current()
            .get(&instance.service_type)
            .is_some_and(|entry| entry.rollout == RolloutState::Halted);
        let record = self
            .ports
            .store
            .rollout_records()
            .await
            .map_err(|e| TaskError::new(&instance.name, "read the rollout switches", e))?
            .into_iter()
            .find(|r| r.service_type == instance.service_type);
        let halted_here = record
            .as_ref()
            .is_some_and(|r| r.state == RolloutState::Halted);
        let pinned = record.and_then(|r| r.pinned).filter(|_| halted_here);
        Ok(Rollout {
            halted: in_catalog || halted_here,
            pinned: pinned.filter(|_| !crate::broken!(self.config.broken, IgnoreUndoPin)),
        })
    }

    /// The entry `instance`'s tasks work toward: the catalog's, or while
    /// an operator's undo pins the type (`rollout undo --to`), the pinned
    /// version as the daemon recorded it, read through today's grants.
    async fn target_entry(
        &self,
        instance: &Instance,
        pinned: Option<&str>,
    ) -> Result<CatalogEntry, TaskError> {
        self.recorded_or_catalog(instance, pinned, None).await
    }

    /// `version` as recorded (its definition with `spec_digest` when that
    /// was recorded), or with none the catalog's entry.
    async fn recorded_or_catalog(
        &self,
        instance: &Instance,
        pinned: Option<&str>,
        spec_digest: Option<&str>,
    ) -> Result<CatalogEntry, TaskError> {
        let Some(version) = pinned else {
            return self.entry(instance);
        };
        let step = format!("read version {version} of its type, which an undo pinned");
        let catalog = self.catalog.current();
        crate::store::recorded_entry(
            self.ports.store.as_ref(),
            &catalog,
            &instance.service_type,
            version,
            spec_digest,
        )
        .await
        .map_err(|e| {
            use crate::store::RecordedVersionError as Recorded;
            let cause = match e {
                Recorded::Store(e) => Cause::from(e),
                e @ Recorded::NotRecorded { .. } => {
                    Cause::verdict(ErrorKind::NotFound, e.to_string())
                }
                Recorded::Invalid(e) => Cause::verdict(ErrorKind::Refused, e.to_string()),
            };
            TaskError::new(&instance.name, step.as_str(), cause)
        })
    }

    /// What a halted type's reprovision puts back: the version the
    /// instance records, as the daemon recorded it, not the catalog's. The
    /// catalog's would upgrade a halted type, to the very version its
    /// rollout halted on (simulation seed 494: a Helm release its bake had
    /// rolled back, then uninstalled by hand, came back at the broken
    /// version). `None`, said at warn, for a version never recorded: the
    /// caller decides what then.
    pub(in crate::engine::worker) async fn held_entry(
        &self,
        instance: &Instance,
    ) -> Result<Option<CatalogEntry>, TaskError> {
        let held = self
            .recorded_or_catalog(
                instance,
                Some(&instance.version),
                instance.spec_digest.as_deref(),
            )
            .await;
        match held {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                tracing::warn!(
                    instance = %instance.name,
                    version = %instance.version,
                    error = %e,
                    "the rollout is halted but the instance's version was never recorded: \
                     it cannot be put back as it was"
                );
                Ok(None)
            }
            held => held.map(Some),
        }
    }

    /// A halted Helm type's release is put back at the version its
    /// instance records, if it runs another (`helm rollback`, nothing when
    /// it is there already): an upgrade or a bake interrupted after `helm
    /// upgrade` leaves it at the halted version (the fifty-instance day's
    /// seed 2: a bake recorded the old version again, its rollback failed,
    /// and the retry found the type halted and tidied nothing). A Docker
    /// type's services are tidied by the upgrade's sweep.
    async fn hold_helm_release(&self, instance: &Instance) -> Result<(), TaskError> {
        if !matches!(
            self.entry(instance)?.provisioning,
            crate::core::release::Provisioning::Helm(_)
        ) {
            return Ok(());
        }
        match self.held_entry(instance).await? {
            Some(held) => self.upgrade(instance, held, UpgradeMode::Pinned).await,
            None => Ok(()),
        }
    }

    async fn handle_locked(&self, task: &Task) -> Result<(), TaskError> {
        let subject = format!("instance {}", task.instance);
        let read = |cause: Cause| TaskError::new(&subject, "read the instance", cause);
        let instance = self
            .ports
            .store
            .instance_by_id(task.instance)
            .await
            .map_err(|e| read(e.into()))?
            .ok_or_else(|| read(Cause::verdict(ErrorKind::NotFound, "it does not exist")))?;
        if !task.kind.applies_to(instance.state)
            && !crate::broken!(self.config.broken, ReviveDeletedInstance)
        {
            tracing::info!(
                instance = %instance.name,
                state = %instance.state,
                kind = task.kind.as_str(),
                "task not run: the instance is deleting or deleted (T4)"
            );
            return Ok(());
        }
        let rollout = self.rollout_of(&instance).await?;
        let halted = task.kind == TaskKind::Upgrade && rollout.halted;
        if halted && rollout.pinned.is_none() {
            // C8: a halt stops what is waiting too. The upgrade was queued
            // (or claimed) before the halt; once the rollout resumes, the
            // planner plans it again. What an interrupted upgrade left
            // behind is tidied all the same (`UpgradeInput::halted`).
            tracing::info!(
                instance = %instance.name,
                service_type = %instance.service_type,
                "upgrade not run: the rollout of {} is halted (C8)",
                instance.service_type
            );
        }
        match task.kind {
            // While pinned, what is provisioned is the pinned version too.
            TaskKind::Provision | TaskKind::Reprovision => {
                let entry = match rollout.pinned.as_deref() {
                    None if task.kind == TaskKind::Reprovision && rollout.halted => {
                        match self.held_entry(&instance).await? {
                            Some(held) => held,
                            None => self.entry(&instance)?,
                        }
                    }
                    pinned => self.target_entry(&instance, pinned).await?,
                };
                self.provision(&instance, entry, rollout.pinned.is_some())
                    .await
            }
            // A halted type's upgrade task also carries out an operator's
            // undo of the instance, if one was asked for: the way back of
            // a baking upgrade first, then the move to a pinned version.
            TaskKind::Upgrade if halted => {
                self.upgrade(&instance, self.entry(&instance)?, UpgradeMode::Tidy)
                    .await?;
                self.undo(&instance).await?;
                let Some(version) = rollout.pinned.as_deref() else {
                    return self.hold_helm_release(&instance).await;
                };
                let entry = self.target_entry(&instance, Some(version)).await?;
                // Re-read: the undo may have moved its version.
                let instance = self
                    .ports
                    .store
                    .instance_by_id(instance.id)
                    .await
                    .map_err(|e| read(e.into()))?
                    .ok_or_else(|| {
                        read(Cause::verdict(ErrorKind::NotFound, "it does not exist"))
                    })?;
                self.upgrade(&instance, entry, UpgradeMode::Pinned).await
            }
            TaskKind::Upgrade => {
                self.upgrade(&instance, self.entry(&instance)?, UpgradeMode::Rollout)
                    .await
            }
            TaskKind::Deprovision => self.deprovision(&instance).await,
        }
    }
}

/// A type's rollout as a task reads it.
struct Rollout {
    halted: bool,
    /// Set only while the store's switch halts the type.
    pinned: Option<String>,
}
