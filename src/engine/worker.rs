//! Workers (C11): claim due tasks with a lease, keep the lease alive while
//! working, run idempotent handlers, and finish with done, retry (bounded,
//! with backoff) or failed. Handlers hold the instance lock, so the
//! recovery pass skips an instance while a worker mutates it (R3).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::core::catalog::CatalogEntry;
use crate::core::fleet::{Instance, InstanceState, RetryDecision, Task, TaskKind, TaskRetryPolicy};
use crate::core::plan::halt_after_failed_upgrade;
use crate::core::policy::LEASE_MARGIN;
use crate::core::provision::{
    Deprovision, DeprovisionInput, Provision, ProvisionInput, WorkAnswer, WorkCommand,
};
use crate::core::spec::ServiceSpec;
use crate::core::types::{ContainerId, RuntimeError};
use crate::core::upgrade::{
    Upgrade, UpgradeAnswer, UpgradeCommand, UpgradeInput, UPGRADE_RETRY_INTERVAL,
};
use crate::mutants::{self, Mutant};
use crate::ports::CreateContainer;

use super::locks::InstanceLocks;
use super::{Ports, SharedCatalog};

/// Longest a handler waits for a new container to report `running`.
/// A handler runs within its task lease; its instance lock outlives that by
/// this much, so the lock never lapses under a live handler.
const INSTANCE_LOCK_SLACK: Duration = Duration::from_secs(5);

/// How a worker behaves.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Recorded as `locked_by`; unique per worker.
    pub id: String,
    /// Task lease; renewed every third of it while a handler runs.
    pub lease: Duration,
    pub retry: TaskRetryPolicy,
    /// Pause when no task is due.
    pub idle_poll: Duration,
    /// Stop grace of a deprovisioned container that names none of its own
    /// (the recovery policy's `stop_grace_default`).
    pub stop_grace_default: Duration,
}

/// What one claimed task came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEnd {
    Done,
    Retried(String),
    Failed(String),
    /// The lease was lost mid-task; another worker owns it now.
    LeaseLost,
}

impl TaskEnd {
    /// The `outcome` label of `stead_tasks_total`.
    pub fn label(&self) -> &'static str {
        match self {
            TaskEnd::Done => "done",
            TaskEnd::Retried(_) => "retried",
            TaskEnd::Failed(_) => "failed",
            TaskEnd::LeaseLost => "lease_lost",
        }
    }

    pub const LABELS: [&'static str; 4] = ["done", "retried", "failed", "lease_lost"];
}

/// One line per finished task, naming it and its instance; failures at
/// warn with the error's message.
fn log_end(task: &Task, instance: &str, end: &TaskEnd) {
    let what = format!("task {} {} of {instance}", task.id, task.kind);
    match end {
        TaskEnd::Done => tracing::info!(instance, outcome = "done", "{what} done"),
        TaskEnd::Retried(e) => {
            tracing::warn!(
                instance,
                outcome = "retried",
                "{what} failed, will retry: {e}"
            )
        }
        TaskEnd::Failed(e) => tracing::warn!(
            instance,
            outcome = "failed",
            "{what} failed after {} attempts, giving up: {e}",
            task.attempts
        ),
        TaskEnd::LeaseLost => tracing::warn!(
            instance,
            outcome = "lease_lost",
            "{what}: lease lost mid-task; another worker owns it now"
        ),
    }
}

pub struct Worker {
    ports: Ports,
    catalog: SharedCatalog,
    config: WorkerConfig,
    locks: Arc<InstanceLocks>,
    /// Until when the lease of the task in hand is trusted (T2): a worker
    /// paused past it (a stopped VM, a long GC) must not act on resuming,
    /// since the task may be another worker's by then. Set at claim,
    /// moved on by each renewal, checked before every effect.
    trusted_until: std::sync::Mutex<Option<Instant>>,
    /// Until when the instance lock of the task in hand is trusted (T3).
    lock_trusted_until: std::sync::Mutex<Option<Instant>>,
}

/// The part of a task lease a worker never trusts: a quarter of it, at
/// most [`LEASE_MARGIN`], so even the shortest lease leaves room to work
/// between renewals (every third of it).
fn task_lease_margin(lease: Duration) -> Duration {
    (lease / 4).min(LEASE_MARGIN)
}

impl Worker {
    pub fn new(
        ports: Ports,
        catalog: impl Into<SharedCatalog>,
        config: WorkerConfig,
        locks: Arc<InstanceLocks>,
    ) -> Self {
        Self {
            ports,
            catalog: catalog.into(),
            config,
            locks,
            trusted_until: std::sync::Mutex::new(None),
            lock_trusted_until: std::sync::Mutex::new(None),
        }
    }

    /// `Ok` while the lease of the task in hand and its instance's lock
    /// are both trusted.
    fn allowed(&self) -> Result<(), String> {
        let now = Instant::now();
        let trusted = |until: &std::sync::Mutex<Option<Instant>>| {
            until
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|until| now < until)
        };
        let trusted = trusted(&self.trusted_until) && trusted(&self.lock_trusted_until);
        if trusted || mutants::active(Mutant::ActOnExpiredLease) {
            Ok(())
        } else {
            Err("the task lease is no longer trusted; stopping before acting".to_owned())
        }
    }

    /// The lease, asked for at `sent`, is trusted for its length less the
    /// margin from then.
    fn trust_lease_from(&self, sent: Instant) {
        let until = sent + (self.config.lease - task_lease_margin(self.config.lease));
        *self.trusted_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
    }

    /// Claims and runs tasks until `stop`; a running handler is allowed to
    /// finish (its own calls are bounded), then the loop exits.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.work_once().await {
                Some(_) => continue,
                None => {
                    tokio::select! {
                        // In order, not at random: the simulation must replay exactly.
                        biased;
                        _ = tokio::time::sleep(self.config.idle_poll) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }

    /// Claims one due task and runs it. `None` when nothing was due (or the
    /// store is down).
    pub async fn work_once(&self) -> Option<(Task, TaskEnd)> {
        super::clock::anchor(self.ports.clock.as_ref(), self.ports.store.as_ref()).await;
        let now = self.ports.clock.now();
        let sent = Instant::now();
        let claimed = match self.ports.store.claim(&self.config.id, now, 1).await {
            Ok(tasks) => tasks,
            Err(e) => {
                tracing::warn!(error = %e, "claim failed");
                return None;
            }
        };
        let task = claimed.into_iter().next()?;
        self.trust_lease_from(sent);
        let span = tracing::info_span!(
            "task",
            id = task.id,
            kind = task.kind.as_str(),
            traceparent = task.traceparent.as_deref().unwrap_or("")
        );
        let _entered = span.enter();
        // The instance's name, for the line below; the handler reads the
        // instance again under its lock.
        let instance = match self.ports.store.instance_by_id(task.instance).await {
            Ok(Some(i)) => i.name.to_string(),
            _ => format!("instance {}", task.instance),
        };
        tracing::info!(
            instance = %instance,
            attempt = task.attempts,
            "task {} {} of {instance} started (attempt {}): {}",
            task.id, task.kind, task.attempts, task.reason
        );
        let end = self.run_task(&task).await;
        *self.trusted_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        log_end(&task, &instance, &end);
        metrics::counter!("stead_tasks_total", "kind" => task.kind.as_str(), "outcome" => end.label())
            .increment(1);
        Some((task, end))
    }

    async fn run_task(&self, task: &Task) -> TaskEnd {
        let work = self.handle(task);
        let keep_lease = self.keep_lease(task);
        let result = tokio::select! {
            // In order, not at random: the simulation must replay exactly.
            biased;
            r = work => r,
            _ = keep_lease => return TaskEnd::LeaseLost,
        };
        let now = self.ports.clock.now();
        let store = &self.ports.store;
        match result {
            Ok(()) => {
                let _ = store.complete(task.id, &self.config.id, now).await;
                TaskEnd::Done
            }
            Err(error) => match self.config.retry.after_failure(task.attempts, now) {
                RetryDecision::RetryAt(at) => {
                    let _ = store.retry(task.id, &self.config.id, at, &error, now).await;
                    TaskEnd::Retried(error)
                }
                RetryDecision::Fail => {
                    let _ = store.fail(task.id, &self.config.id, &error, now).await;
                    self.after_final_failure(task, &error).await;
                    TaskEnd::Failed(error)
                }
            },
        }
    }

    /// Renews the lease every third of it; returns only if it was lost.
    async fn keep_lease(&self, task: &Task) {
        loop {
            tokio::time::sleep(self.config.lease / 3).await;
            let now = self.ports.clock.now();
            let sent = Instant::now();
            match self
                .ports
                .store
                .extend_lease(task.id, &self.config.id, now)
                .await
            {
                Ok(true) => self.trust_lease_from(sent),
                Ok(false) => return,
                // A store blip is not a lost lease; try again next time.
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
        }
    }

    /// A failed upgrade halts its service type's rollout, so a bad
    /// version stops after one tenant (C8).
    async fn after_final_failure(&self, task: &Task, error: &str) {
        let Ok(Some(instance)) = self.ports.store.instance_by_id(task.instance).await else {
            return;
        };
        let mut failed = task.clone();
        failed.last_error = Some(error.to_owned());
        if let Some(crate::core::plan::Decision::HaltRollout {
            service_type,
            reason,
        }) = halt_after_failed_upgrade(&failed, &instance, RetryDecision::Fail)
        {
            let now = self.ports.clock.now();
            let halted = self
                .ports
                .store
                .set_rollout(
                    &service_type,
                    crate::core::fleet::RolloutState::Halted,
                    &reason,
                    now,
                    None,
                )
                .await;
            match halted {
                Ok(()) => tracing::warn!(
                    service_type = %service_type,
                    "rollout of {service_type} halted (C8): {reason}; resume with `stead rollout resume {service_type}`"
                ),
                Err(e) => tracing::error!(
                    service_type = %service_type,
                    "rollout of {service_type} should halt ({reason}) but the store refused: {e}"
                ),
            }
        }
    }

    /// Runs the task's handler under the instance's lock, shared with
    /// recovery and operator commands across processes (T3). The instance
    /// is read under the lock, so what the handler sees is what it acts on.
    ///
    /// The whole of it, waiting for the lock included, is bounded by the
    /// task lease: past it, another worker may own the task, and a hung
    /// runtime or provisioner call must not hold this worker, nor the
    /// instance lock, forever.
    async fn handle(&self, task: &Task) -> Result<(), String> {
        let began = tokio::time::Instant::now();
        let guard = self
            .locks
            .lock(
                task.instance,
                &self.config.id,
                self.config.lease + INSTANCE_LOCK_SLACK,
                self.config.lease,
            )
            .await
            .map_err(|e| e.to_string())?;
        *self
            .lock_trusted_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(guard.trusted_until());
        let remaining = self.config.lease.saturating_sub(began.elapsed());
        let result = tokio::time::timeout(remaining, self.handle_locked(task))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "handler exceeded its {:?} lease",
                    self.config.lease
                ))
            });
        *self
            .lock_trusted_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        guard.release().await;
        result
    }

    async fn handle_locked(&self, task: &Task) -> Result<(), String> {
        let instance = self
            .ports
            .store
            .instance_by_id(task.instance)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("instance {} does not exist", task.instance))?;
        if !task.kind.applies_to(instance.state) && !mutants::active(Mutant::ReviveDeletedInstance)
        {
            tracing::info!(
                instance = %instance.name,
                state = %instance.state,
                kind = task.kind.as_str(),
                "task not run: the instance is deleting or deleted (T4)"
            );
            return Ok(());
        }
        match task.kind {
            TaskKind::Provision | TaskKind::Reprovision => self.provision(&instance).await,
            TaskKind::Upgrade => self.upgrade(&instance).await,
            TaskKind::Deprovision => self.deprovision(&instance).await,
        }
    }

    /// The instance's catalog entry as the catalog is now (it may be
    /// reloaded between tasks, never within one).
    fn entry(&self, instance: &Instance) -> Result<CatalogEntry, String> {
        self.catalog
            .current()
            .get(&instance.service_type)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "service type {:?} of {} is not in the catalog",
                    instance.service_type, instance.name
                )
            })
    }

    /// Install-or-upgrade on the deterministic release name, then one
    /// container per service and ACTIVE naming it (`core::provision`).
    async fn provision(&self, instance: &Instance) -> Result<(), String> {
        let entry = self.entry(instance)?;
        let active = self
            .ports
            .store
            .load_active(&instance.name)
            .await
            .map_err(|e| e.to_string())?;
        let mut provision = Provision::new(ProvisionInput {
            instance: instance.name.clone(),
            version: instance.version.clone(),
            services: entry.services,
            active,
        });
        while let Some(command) = provision.poll_command() {
            if command.is_effect() {
                if let Err(e) = self.allowed() {
                    provision.abandon(e);
                    continue;
                }
            }
            provision.handle(self.perform_work(instance, command).await);
        }
        provision.into_result()?;
        self.move_to(instance, InstanceState::Ready).await
    }

    /// Performs one step of provisioning or deprovisioning. No decisions.
    async fn perform_work(&self, instance: &Instance, command: WorkCommand) -> WorkAnswer {
        let p = &self.ports;
        let name = &instance.name;
        let done = |r: Result<(), String>| WorkAnswer::Done(r);
        match command {
            WorkCommand::Install { version } => done(
                p.provisioner
                    .install_or_upgrade(name.as_str(), &version)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            WorkCommand::Uninstall => done(
                p.provisioner
                    .uninstall(name.as_str())
                    .await
                    .map_err(|e| e.to_string()),
            ),
            WorkCommand::Inspect(id) => WorkAnswer::Inspected(p.runtime.inspect(&id).await),
            WorkCommand::Create { spec, revision } => {
                WorkAnswer::Created(self.create(instance, &spec, &revision).await)
            }
            WorkCommand::SaveActive { service, record } => done(
                p.store
                    .save_active_service(name, &service, &record)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            WorkCommand::Withdraw(key) => {
                done(p.traffic.withdraw(&key).await.map_err(|e| e.to_string()))
            }
            WorkCommand::Stop { generation, grace } => {
                WorkAnswer::Stopped(p.runtime.stop(&generation, grace).await)
            }
            WorkCommand::Remove(generation) => {
                WorkAnswer::Removed(p.runtime.remove(&generation).await)
            }
            WorkCommand::ReleaseClaims(container) => done(
                p.store
                    .release_claims(name, &container, None)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            WorkCommand::RemoveActive(service) => done(
                p.store
                    .remove_active_service(name, &service)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            WorkCommand::ClearInhibition(marker) => done(
                p.store
                    .clear_inhibition(name, &marker.service, &marker.container, None)
                    .await
                    .map_err(|e| e.to_string()),
            ),
        }
    }

    async fn create(
        &self,
        instance: &Instance,
        spec: &ServiceSpec,
        revision: &str,
    ) -> Result<ContainerId, RuntimeError> {
        self.ports
            .runtime
            .create(&CreateContainer {
                instance: instance.name.clone(),
                spec: spec.clone(),
                revision: revision.to_owned(),
            })
            .await
    }

    /// Overlap replacement per service: create the successor, verify it,
    /// mark the predecessor retirement-pending and switch ACTIVE. The
    /// recovery pass, the one owner of publication, then routes the
    /// successor (it honours a pending withdrawal first, R6, which a worker
    /// cannot see) and retires the predecessor once the successor serves;
    /// until then the predecessor keeps serving, so there is no gap. A
    /// failure removes the candidate and leaves ACTIVE alone.
    async fn upgrade(&self, instance: &Instance) -> Result<(), String> {
        let p = &self.ports;
        let entry = self.entry(instance)?;
        if instance.stopped {
            // Stopped after the task was planned: an overlap replacement
            // would start and publish what must stay down (S3). Done for
            // now; version drift plans the upgrade again once it is started.
            tracing::info!(instance = %instance.name, "upgrade skipped: instance is stopped");
            return Ok(());
        }
        if instance.state == InstanceState::Ready {
            self.move_to(instance, InstanceState::Upgrading).await?;
        }
        let result = self.replace_services(instance, &entry).await;
        let now = p.clock.now();
        if result.is_ok() {
            self.allowed()?;
            p.store
                .set_instance_version(instance.id, &entry.version, now)
                .await
                .map_err(|e| e.to_string())?;
        }
        // Either way the instance serves: the new version, or the old one
        // untouched.
        let _ = p
            .store
            .set_instance_state(
                instance.id,
                InstanceState::Upgrading,
                InstanceState::Ready,
                now,
            )
            .await;
        result
    }

    async fn replace_services(
        &self,
        instance: &Instance,
        entry: &CatalogEntry,
    ) -> Result<(), String> {
        let p = &self.ports;
        let active = p
            .store
            .load_active(&instance.name)
            .await
            .map_err(|e| e.to_string())?;
        let mut upgrade = Upgrade::new(UpgradeInput {
            instance: instance.name.clone(),
            version: entry.version.clone(),
            services: entry.services.clone(),
            active,
        });
        loop {
            if let Some(command) = upgrade.poll_command() {
                if command.is_effect() {
                    if let Err(e) = self.allowed() {
                        upgrade.abandon(e);
                        continue;
                    }
                }
                let answer = self.perform_upgrade(instance, command).await;
                upgrade.handle(answer, p.clock.now());
            } else if upgrade.poll_timeout().is_some() {
                // The successor is not running yet: look again shortly.
                tokio::time::sleep(UPGRADE_RETRY_INTERVAL).await;
                upgrade.handle_timeout(p.clock.now());
            } else {
                break;
            }
        }
        upgrade.into_result().map(|_| ()).map_err(|(_, e)| e)
    }

    /// Performs one step of an upgrade through the ports. No decisions.
    async fn perform_upgrade(&self, instance: &Instance, command: UpgradeCommand) -> UpgradeAnswer {
        let p = &self.ports;
        match command {
            UpgradeCommand::Create { spec, revision } => {
                UpgradeAnswer::Created(self.create(instance, &spec, &revision).await)
            }
            UpgradeCommand::Inspect(id) => UpgradeAnswer::Inspected(p.runtime.inspect(&id).await),
            UpgradeCommand::ReadBinds(id) => UpgradeAnswer::Binds(p.runtime.binds(&id).await),
            UpgradeCommand::Probe { readiness, binds } => {
                UpgradeAnswer::Probed(p.probe.ready(&readiness, &binds).await)
            }
            UpgradeCommand::RemoveCandidate(generation) => {
                UpgradeAnswer::Removed(p.runtime.remove(&generation).await)
            }
            UpgradeCommand::SaveMarker(marker) => UpgradeAnswer::MarkerSaved(
                p.store
                    .save_inhibition(&instance.name, &marker)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            UpgradeCommand::SaveActive { service, record } => UpgradeAnswer::ActiveSaved(
                p.store
                    .save_active_service(&instance.name, &service, &record)
                    .await
                    .map_err(|e| e.to_string()),
            ),
        }
    }

    /// Withdraw, stop and remove every container of the instance, release
    /// its claims, uninstall the release, mark it deleted
    /// (`core::provision`).
    async fn deprovision(&self, instance: &Instance) -> Result<(), String> {
        let p = &self.ports;
        let name = &instance.name;
        let active = p.store.load_active(name).await.map_err(|e| e.to_string())?;
        let inhibitions = p
            .store
            .load_inhibitions(name)
            .await
            .map_err(|e| e.to_string())?;
        let mut deprovision = Deprovision::new(DeprovisionInput {
            instance: name.clone(),
            active,
            inhibitions,
            stop_grace_default: self.config.stop_grace_default,
        });
        while let Some(command) = deprovision.poll_command() {
            if command.is_effect() {
                if let Err(e) = self.allowed() {
                    deprovision.abandon(e);
                    continue;
                }
            }
            deprovision.handle(self.perform_work(instance, command).await);
        }
        deprovision.into_result()?;
        self.move_to(instance, InstanceState::Deleted).await
    }

    /// Moves the instance along its lifecycle, compare-and-set on its
    /// current state. Re-reads it so a retried handler is idempotent.
    async fn move_to(&self, instance: &Instance, to: InstanceState) -> Result<(), String> {
        let p = &self.ports;
        let current = p
            .store
            .instance_by_id(instance.id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("instance {} vanished", instance.name))?;
        if current.state == to {
            return Ok(());
        }
        if !current.state.can_become(to) {
            return Err(format!(
                "instance {} cannot go from {} to {to}",
                instance.name, current.state
            ));
        }
        let now = p.clock.now();
        self.allowed()?;
        let moved = p
            .store
            .set_instance_state(instance.id, current.state, to, now)
            .await
            .map_err(|e| e.to_string())?;
        if moved {
            Ok(())
        } else {
            Err(format!(
                "instance {} changed state concurrently",
                instance.name
            ))
        }
    }
}
