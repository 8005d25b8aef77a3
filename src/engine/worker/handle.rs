//! Running one task's handler: the instance lock taken (waiting, bounded by
//! the task lease), the instance re-read under it, and a task for a
//! deleting or deleted instance refused (T4).

use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::fleet::{Instance, RolloutState, Task, TaskKind};
use crate::core::policy::WORKER_LOCK_SLACK;

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
        guard.release().await;
        result
    }

    /// Whether `instance`'s type's rollout is halted, in the catalog file
    /// or by the switch in the store, read now: a halt after the task was
    /// queued must stop it before it changes anything.
    async fn rollout_halted(&self, instance: &Instance) -> Result<bool, TaskError> {
        let in_catalog = self
            .catalog
            .current()
            .get(&instance.service_type)
            .is_some_and(|entry| entry.rollout == RolloutState::Halted);
        if in_catalog {
            return Ok(true);
        }
        let switches = self
            .ports
            .store
            .rollouts()
            .await
            .map_err(|e| TaskError::new(&instance.name, "read the rollout switches", e))?;
        Ok(switches.get(&instance.service_type) == Some(&RolloutState::Halted))
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
        let halted = task.kind == TaskKind::Upgrade && self.rollout_halted(&instance).await?;
        if halted {
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
            TaskKind::Provision | TaskKind::Reprovision => self.provision(&instance).await,
            TaskKind::Upgrade => self.upgrade(&instance, halted).await,
            TaskKind::Deprovision => self.deprovision(&instance).await,
        }
    }
}
