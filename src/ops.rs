//! Operator commands. They write intent and rows — instances, tasks,
//! inhibitions, rollout switches — and never touch containers: the daemon's
//! loops act on what these rows say. Each returns what it did, so the CLI
//! can say so. The read side (`stead status`, listings) is in
//! `daemon::status`. They are plain store calls under the instance lock,
//! so the simulation runs the very same commands.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::core::bake::baking;
use crate::core::catalog::{Catalog, CatalogEntry};
use crate::core::fleet::add;
use crate::core::fleet::{
    Instance, InstanceId, InstanceState, NewTask, RolloutState, Task, TaskId, TaskKind, TaskState,
    CANCELLED_BY_HALT, CANCELLED_BY_OPERATOR,
};
use crate::core::types::{
    ContainerId, Inhibition, InhibitionReason, InstanceName, RevertTo, ServiceName, Timestamp,
};
use crate::ports::{ErrorKind, NewInstance, PortFailure, Store, StoreError, TypeVersion};

mod tenancy;
pub use tenancy::{Scope, TokenRequest, TOKEN_PREFIX};

/// How long an undone upgrade's way back is kept at least, for the
/// recovery pass that takes it (it runs every tick).
pub const UNDO_WINDOW_MIN: Duration = Duration::from_secs(300);

/// The reason of the upgrade task `stead rollout undo` queues: the halted
/// type's task carries the undo out, and upgrades nothing.
pub use crate::core::plan::UNDO_REASON;

/// The reason `inhibit` records when none is given.
pub const OPERATOR_HOLD: &str = "operator-hold";
/// Shortest TTL `stead instance create --ttl-s` accepts: an instance that
/// expires before it could be provisioned and verified helps nobody.
pub const TTL_CLI_MIN: Duration = Duration::from_secs(60);
/// Longest TTL: ten years, well inside the timestamps' range.
pub const TTL_MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What an operator command needs.
pub struct Ops<'a> {
    pub store: &'a dyn Store,
    /// The catalog as it is when the command runs.
    pub catalog: Arc<Catalog>,
    pub now: Timestamp,
    /// Trace ids and the lock holder's nonce: drawn from the OS by the
    /// CLI, from the seed by the simulation.
    rng: std::sync::Mutex<rand_chacha::ChaCha8Rng>,
    /// Each team's quotas (`[teams.NAME]`); none unless [`Ops::with_quotas`].
    quotas: Arc<BTreeMap<String, crate::ports::TeamQuota>>,
    /// What a service without its own memory limit counts against a quota.
    memory_bytes_default: u64,
    /// Whose instances the command sees (#54); the fleet unless
    /// [`Ops::scoped`].
    scope: Scope,
    /// The rule the mutation exercise broke, if any (nothing without the
    /// feature `mutation-exercise`); see [`Ops::armed`].
    broken: crate::core::broken::Armed,
}

/// What `stead rollout undo` did.
#[derive(Debug, Default)]
pub struct Undo {
    /// The type's queued upgrades it cancelled (halting the rollout).
    pub cancelled: Vec<TaskId>,
    /// Each instance put back, with its services.
    pub reverted: Vec<(InstanceName, Vec<ServiceName>)>,
    /// Instances of the type with no upgrade baking (with `--to`: already
    /// at the version): nothing to put back.
    pub not_baking: Vec<InstanceName>,
    /// The version the type was pinned to (`--to`, or a Helm type's
    /// previous version).
    pub pinned: Option<String>,
    /// With `--to`: instances not at the version, which the reconciler
    /// moves there (version drift toward the pin, within `max_in_flight`).
    pub moving: Vec<InstanceName>,
    /// Instances whose lock a pass or a task held too long: not looked at;
    /// the command run again finds them.
    pub busy: Vec<InstanceName>,
}

/// What an undo did to one instance.
enum PutBack {
    /// Its baking services, asked for their way back.
    Reverted(Vec<ServiceName>),
    /// Not at the pinned version: the reconciler moves it there.
    Moving,
    /// Nothing to do.
    Already,
}

/// `stead instance create`.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    pub name: String,
    pub service_type: String,
    pub team: String,
    /// Must be the catalog's version of the type when given: an instance is
    /// provisioned from the catalog's spec, which exists at that version only.
    pub version: Option<String>,
    pub ttl: Option<Duration>,
    pub maintenance_window: Option<String>,
    /// A live instance of that name and type is success, not an error (the
    /// quickstart runs any number of times).
    pub exists_ok: bool,
    /// `--set NAME=VALUE`: the type's declared parameters.
    pub parameters: BTreeMap<String, String>,
    /// `--domain HOST`: public host names for the type's service that
    /// takes them, each within the team's `domain_suffixes` (#54).
    pub domains: Vec<String>,
}

/// What `create` did.
#[derive(Clone, Debug)]
pub struct Created {
    pub instance: Instance,
    /// The provision task; `None` when the instance already existed.
    pub task: Option<TaskId>,
}

/// What `delete` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Moved to `deleting` with a deprovision task; queued tasks cancelled.
    Started {
        task: TaskId,
        cancelled: Vec<TaskId>,
    },
    AlreadyDeleting,
    AlreadyDeleted,
}

/// What `retry` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// A failed (or stuck) provision queued again; the instance is
    /// `provisioning`.
    Provisioning { task: TaskId },
    /// A ready instance's release checked and whatever of it vanished
    /// created again (a `reprovision`).
    Reprovisioning { task: TaskId },
    /// A task of that kind was already queued or running: nothing changed.
    AlreadyQueued { kind: TaskKind },
}

/// What `cancel_task` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskCancel {
    /// The task was queued and is now cancelled (as it was before).
    Cancelled(Task),
    /// The task had already finished (done, failed or cancelled): nothing
    /// changed.
    AlreadyOver(Task),
}

/// Checks an instance name: a DNS label that starts with a letter (one
/// rule, `core::names`, T6).
pub fn check_instance_name(name: &str) -> Result<(), OpsError> {
    crate::core::names::check_instance_name("instance name", name)
        .map_err(|e| OpsError::Invalid(e.to_string()))
}

/// Why an operator command did nothing, by what the operator can do about
/// it: the CLI gives each kind its own exit code (`docs/operations.md`).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The request itself is wrong: a bad name, TTL, window or version, an
    /// unknown service type. Fix the command.
    #[error("{0}")]
    Invalid(String),
    /// No such instance or service.
    #[error("{0}")]
    NotFound(String),
    /// What exists contradicts the request: the name is taken, the
    /// instance is being deleted.
    #[error("{0}")]
    Conflict(String),
    /// The instance stayed locked by a pass or a task; nothing changed, run
    /// the command again.
    #[error("{0}")]
    Busy(String),
    /// The store failed; its kind says whether to retry.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OpsError {
    /// What kind of failure this is, in the ports' vocabulary.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Invalid(_) => ErrorKind::Refused,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Conflict(_) => ErrorKind::Conflict,
            Self::Busy(_) => ErrorKind::Transient,
            Self::Store(e) => e.kind(),
        }
    }
}

/// The answer of every command that names an instance which does not
/// exist: not found, naming it.
pub fn no_such_instance(name: &str) -> OpsError {
    OpsError::NotFound(format!(
        "no instance named {name:?} (see `stead instance list --all`)"
    ))
}

/// How long an operator command waits for an instance a pass or a task
/// holds (T3) before it gives up and says so.
pub const OPERATOR_LOCK_WAIT: Duration = Duration::from_secs(30);
/// How long an operator's instance lock lives if the command dies holding
/// it: its work is a few statements.
const OPERATOR_LOCK_TTL: Duration = Duration::from_secs(30);
/// Pause between tries while the instance is busy.
const OPERATOR_LOCK_RETRY: Duration = Duration::from_millis(200);

/// An operator command's hold on an instance's lock (T3): the same row a
/// daemon's passes and workers take, so a command never interleaves its
/// writes with an upgrade's or a recovery's. Released by [`Ops::unlock`];
/// one lost with a crashed command expires by the database's clock.
struct OperatorLock {
    instance: crate::core::fleet::InstanceId,
    holder: String,
}

impl<'a> Ops<'a> {
    pub fn new(store: &'a dyn Store, catalog: Arc<Catalog>, now: Timestamp, seed: u64) -> Self {
        use rand::SeedableRng;
        Self {
            store,
            catalog,
            now,
            rng: std::sync::Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)),
            quotas: Arc::default(),
            memory_bytes_default: crate::core::limits::ContainerLimits::default()
                .memory_bytes_default,
            scope: Scope::Fleet,
            broken: Default::default(),
        }
    }

    fn random(&self) -> u64 {
        use rand::Rng;
        self.rng.lock().unwrap_or_else(|e| e.into_inner()).random()
    }

    /// The trace an operator's command starts: its tasks carry it, so a
    /// worker's spans join the command's trace as the tick's tasks join the
    /// tick's. Logged at debug, so a worker's lines can be matched to it.
    fn traceparent(&self) -> String {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let traceparent = crate::engine::tick::new_traceparent(&mut *rng);
        tracing::debug!(%traceparent, "operator command");
        traceparent
    }
}

impl Ops<'_> {
    /// Takes `instance`'s lock, waiting at most [`OPERATOR_LOCK_WAIT`].
    async fn lock(&self, instance: &Instance) -> Result<OperatorLock, OpsError> {
        // Unique per command run, across hosts: the pid alone could repeat
        // on another machine, and the same holder string renews a lock.
        let holder = format!("operator:{}#{:016x}", std::process::id(), self.random());
        let began = tokio::time::Instant::now();
        loop {
            let locked = self
                .store
                .try_lock_instances(&[instance.id], &holder, OPERATOR_LOCK_TTL)
                .await
                .map_err(OpsError::from)?;
            if locked.contains(&instance.id) {
                return Ok(OperatorLock {
                    instance: instance.id,
                    holder,
                });
            }
            if began.elapsed() + OPERATOR_LOCK_RETRY > OPERATOR_LOCK_WAIT {
                return Err(OpsError::Busy(format!(
                    "{} is busy: a recovery pass or a task held its lock for {} s; \
                     nothing was changed, run the command again",
                    instance.name,
                    OPERATOR_LOCK_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(OPERATOR_LOCK_RETRY).await;
        }
    }

    async fn unlock(&self, lock: OperatorLock) {
        if let Err(e) = self
            .store
            .unlock_instances(&[lock.instance], &lock.holder)
            .await
        {
            tracing::warn!(instance = lock.instance, error = %e,
                "operator's instance lock not released; it expires in {} s",
                OPERATOR_LOCK_TTL.as_secs());
        }
    }

    /// Runs `change` on `name`'s instance, re-read under its lock (T3, T4:
    /// what the command decides on is what the lock protects).
    async fn under_lock<T>(
        &self,
        name: &str,
        change: impl AsyncFnOnce(&Instance) -> Result<T, OpsError>,
    ) -> Result<T, OpsError> {
        let seen = self.find(name).await?;
        let lock = self.lock(&seen).await?;
        let result = match self.find(name).await {
            Ok(instance) => change(&instance).await,
            Err(e) => Err(e),
        };
        self.unlock(lock).await;
        result
    }
}

impl Ops<'_> {
    /// The instance holding `name`: the live one, or the deleted one whose
    /// name was not reused yet.
    /// Another team's instance is not found for a scoped command (#54): it
    /// learns nothing, not even that the name exists.
    pub async fn find(&self, name: &str) -> Result<Instance, OpsError> {
        self.store
            .instance(&InstanceName::new(name))
            .await
            .map_err(OpsError::from)?
            .filter(|instance| {
                self.scope.sees(&instance.team) || crate::broken!(self.broken, IgnoreTeamScope)
            })
            .ok_or_else(|| no_such_instance(name))
    }

    /// Writes the instance row and its provision task.
    pub async fn create(&self, request: &CreateRequest) -> Result<Created, OpsError> {
        check_instance_name(&request.name)?;
        // A team names things too (`{team}` in a Helm namespace or values):
        // the same DNS-label rule as every name (T6).
        crate::core::names::check_dns_label("--team", &request.team)
            .map_err(|e| OpsError::Invalid(e.to_string()))?;
        self.scope.check_team(&request.team)?;
        if self.catalog.get(&request.service_type).is_none() {
            let known: Vec<&str> = self
                .catalog
                .entries()
                .map(|e| e.service_type.as_str())
                .collect();
            return Err(OpsError::Invalid(format!(
                "service type {:?} is not in the catalog (known: {})",
                request.service_type,
                known.join(", ")
            )));
        }
        // While an undo pins the type, new instances are made at the
        // pinned version too: the one its instances are moved back to.
        let (entry, pinned) = &self.current_entry(&request.service_type).await?;
        if let Some(version) = request.version.as_deref() {
            if version != entry.version {
                let has = if *pinned {
                    "the pin (rollout undo --to) holds"
                } else {
                    "the catalog has"
                };
                return Err(OpsError::Invalid(format!(
                    "--version {version:?}: {has} {} at version {:?} only; an instance is \
                     created at its type's current version (leave --version out)",
                    entry.service_type, entry.version
                )));
            }
        }
        entry
            .check_parameters(&request.parameters)
            .map_err(|e| OpsError::Invalid(format!("--set: {e}")))?;
        if let Some(window) = &request.maintenance_window {
            crate::core::window::Window::parse(window)
                .map_err(|e| OpsError::Invalid(format!("--window {window:?}: {e}")))?;
        }
        let expires_at = self.expiry(request.ttl)?;
        self.check_given_domains(request, entry).await?;
        if let Some(existing) = self.existing(request).await? {
            return Ok(Created {
                instance: existing,
                task: None,
            });
        }
        let new = NewInstance {
            name: InstanceName::new(&request.name),
            team: request.team.clone(),
            service_type: request.service_type.clone(),
            version: entry.version.clone(),
            expires_at,
            maintenance_window: request.maintenance_window.clone(),
            parameters: request.parameters.clone(),
            domains: request.domains.clone(),
            spec_digest: Some(entry.spec_digest.clone()),
        };
        let instance = self.create_within_quota(&new, entry).await?;
        let task = self
            .enqueue(&instance, TaskKind::Provision, "operator: instance create")
            .await?;
        Ok(Created { instance, task })
    }

    fn expiry(&self, ttl: Option<Duration>) -> Result<Option<Timestamp>, OpsError> {
        let Some(ttl) = ttl else {
            return Ok(None);
        };
        if ttl.is_zero() || ttl > TTL_MAX {
            return Err(OpsError::Invalid(format!(
                "ttl {} s: must be between 1 s and {} s",
                ttl.as_secs(),
                TTL_MAX.as_secs()
            )));
        }
        let invalid = |e: jiff::Error| OpsError::Invalid(format!("ttl: {e}"));
        let ttl = jiff::SignedDuration::try_from(ttl).map_err(invalid)?;
        self.now.checked_add(ttl).map(Some).map_err(invalid)
    }

    /// A live instance holding the requested name: `Ok(Some)` when
    /// `exists_ok` and it matches the request, an error naming it
    /// otherwise. A deleted one does not count (its name is reused).
    async fn existing(&self, request: &CreateRequest) -> Result<Option<Instance>, OpsError> {
        let found = self
            .store
            .instance(&InstanceName::new(&request.name))
            .await
            .map_err(OpsError::from)?;
        let Some(existing) = found.filter(|i| i.state != InstanceState::Deleted) else {
            return Ok(None);
        };
        let name = &request.name;
        if !self.scope.sees(&existing.team) {
            // Names are one namespace across teams (T6); another team's
            // instance is named as taken and nothing more (#54).
            return Err(OpsError::Conflict(format!(
                "the instance name {name} is taken; choose another name"
            )));
        }
        if existing.state == InstanceState::Deleting {
            return Err(OpsError::Conflict(format!(
                "{name} is being deleted; its name is free once its deprovision has run \
                 (a running daemon does that; `stead run --once` does it now)"
            )));
        }
        if !request.exists_ok {
            return Err(OpsError::Conflict(format!(
                "an instance named {name} already exists ({} {}, {}); pass --exists-ok to \
                 accept it, or choose another name",
                existing.service_type, existing.version, existing.state
            )));
        }
        if existing.service_type != request.service_type {
            return Err(OpsError::Conflict(format!(
                "an instance named {name} already exists with service type {:?}, not {:?}; \
                 choose another name for the new one, or delete this one first \
                 (`stead instance delete {name}`)",
                existing.service_type, request.service_type
            )));
        }
        Ok(Some(existing))
    }

    async fn enqueue(
        &self,
        instance: &Instance,
        kind: TaskKind,
        reason: &str,
    ) -> Result<Option<TaskId>, OpsError> {
        let task = NewTask {
            kind,
            instance: instance.id,
            run_after: self.now,
            reason: reason.to_owned(),
            traceparent: Some(self.traceparent()),
        };
        self.store
            .enqueue(&task, self.now, None)
            .await
            .map_err(OpsError::from)
    }

    /// Sets the stopped intent; the recovery pass stops (or starts) the
    /// containers and rebuilds publication. Returns whether it changed.
    pub async fn set_stopped(&self, name: &str, stopped: bool) -> Result<bool, OpsError> {
        self.under_lock(name, async |instance| {
            self.set_stopped_locked(instance, stopped).await
        })
        .await
    }

    async fn set_stopped_locked(
        &self,
        instance: &Instance,
        stopped: bool,
    ) -> Result<bool, OpsError> {
        let name = &instance.name;
        if matches!(
            instance.state,
            InstanceState::Deleting | InstanceState::Deleted
        ) {
            return Err(OpsError::Conflict(format!(
                "{name} is {}; its intent no longer matters",
                instance.state
            )));
        }
        if self
            .catalog
            .get(&instance.service_type)
            .is_some_and(|entry| !entry.is_docker())
        {
            return Err(OpsError::Invalid(format!(
                "{name} is of the Helm type {}: Kubernetes runs its pods, and stead has no \
                 containers of it to stop or start (scale it through its chart's values)",
                instance.service_type
            )));
        }
        if instance.stopped == stopped {
            return Ok(false);
        }
        self.store
            .set_instance_stopped(instance.id, stopped, self.now)
            .await
            .map_err(OpsError::from)?;
        Ok(true)
    }

    /// `stead instance retry NAME`: a `failed` instance (a provision that
    /// ran out of attempts) is provisioned again: back to `provisioning`
    /// with a new provision task. A ready one is reprovisioned: its
    /// release installed or upgraded in place and whatever of it vanished
    /// created again. Safe to run twice: a provision or reprovision already
    /// queued or running is left alone and named.
    pub async fn retry(&self, name: &str) -> Result<Retry, OpsError> {
        self.under_lock(name, async |instance| self.retry_locked(instance).await)
            .await
    }

    async fn retry_locked(&self, instance: &Instance) -> Result<Retry, OpsError> {
        let name = &instance.name;
        let kind = match instance.state {
            InstanceState::Failed | InstanceState::Provisioning => TaskKind::Provision,
            InstanceState::Ready => TaskKind::Reprovision,
            InstanceState::Upgrading => {
                return Err(OpsError::Conflict(format!(
                    "{name} is upgrading; its upgrade task retries or fails on its own \
                     (`stead task list`)"
                )))
            }
            InstanceState::Deleting | InstanceState::Deleted => {
                return Err(OpsError::Conflict(format!(
                    "{name} is {}; there is nothing to retry",
                    instance.state
                )))
            }
        };
        if instance.state == InstanceState::Failed
            && !self
                .store
                .set_instance_state(
                    instance.id,
                    InstanceState::Failed,
                    InstanceState::Provisioning,
                    self.now,
                )
                .await
                .map_err(OpsError::from)?
        {
            return Err(OpsError::Busy(format!(
                "{name} changed state meanwhile; run the command again"
            )));
        }
        let task = NewTask {
            kind,
            instance: instance.id,
            run_after: self.now,
            reason: "operator: instance retry".into(),
            traceparent: Some(self.traceparent()),
        };
        // The queue holds at most one active task per (instance, kind): an
        // insert it refuses means one is there already.
        match self
            .store
            .enqueue(&task, self.now, None)
            .await
            .map_err(OpsError::from)?
        {
            Some(task) if kind == TaskKind::Provision => Ok(Retry::Provisioning { task }),
            Some(task) => Ok(Retry::Reprovisioning { task }),
            None => Ok(Retry::AlreadyQueued { kind }),
        }
    }

    /// Moves the instance to `deleting` with a deprovision task and cancels
    /// its queued tasks, in one transaction (the same path TTL expiry
    /// takes, T4).
    /// With `purge_volumes`, the deprovision removes the instance's named
    /// volumes too (asked again while it is still being deleted, it still
    /// does); without, they are kept.
    pub async fn delete(&self, name: &str, purge_volumes: bool) -> Result<Deletion, OpsError> {
        self.under_lock(name, async |instance| {
            self.delete_locked(instance, purge_volumes).await
        })
        .await
    }

    /// The named volumes the catalog declares for the instance's type, as
    /// `service/volume`: what a plain delete keeps.
    pub fn declared_volumes(&self, instance: &Instance) -> Vec<String> {
        self.catalog
            .get(&instance.service_type)
            .map(|entry| {
                entry
                    .services
                    .iter()
                    .flat_map(|s| s.run.volumes().map(move |v| format!("{}/{v}", s.name)))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn delete_locked(
        &self,
        instance: &Instance,
        purge_volumes: bool,
    ) -> Result<Deletion, OpsError> {
        let name = &instance.name;
        match instance.state {
            InstanceState::Deleting => {
                // Its deprovision is queued or running and reads the flag
                // when it removes the volumes: asked now, it still purges.
                if purge_volumes {
                    self.store
                        .set_purge_volumes(instance.id, self.now)
                        .await
                        .map_err(OpsError::from)?;
                }
                return Ok(Deletion::AlreadyDeleting);
            }
            InstanceState::Deleted => return Ok(Deletion::AlreadyDeleted),
            _ => {}
        }
        let task = NewTask {
            kind: TaskKind::Deprovision,
            instance: instance.id,
            run_after: self.now,
            reason: "operator: instance delete".into(),
            traceparent: Some(self.traceparent()),
        };
        // The purge is recorded in the deletion's own transaction: a
        // deletion refused here must not leave a purge behind for a later
        // plain delete or TTL expiry to carry out (#41).
        let expiring = if purge_volumes {
            self.store
                .expire_instance_purging(instance.id, instance.state, &task, self.now)
                .await
        } else {
            self.store
                .expire_instance(instance.id, instance.state, &task, self.now, None)
                .await
        };
        let expired = expiring.map_err(OpsError::from)?.ok_or_else(|| {
            OpsError::Conflict(format!(
                "{name} changed state meanwhile, or a deprovision is already queued; retry"
            ))
        })?;
        Ok(Deletion::Started {
            task: expired.task,
            cancelled: expired.cancelled,
        })
    }

    /// Records a hold on the generation ACTIVE names for `service` now;
    /// returns that generation's container.
    pub async fn inhibit(
        &self,
        name: &str,
        service: &str,
        reason: &str,
    ) -> Result<ContainerId, OpsError> {
        if reason == InhibitionReason::RETIREMENT_PENDING
            || reason == InhibitionReason::SERVICE_DROPPED
        {
            return Err(OpsError::Invalid(format!(
                "--reason {reason:?} is reserved for upgrades"
            )));
        }
        self.under_lock(name, async |instance| {
            self.inhibit_locked(instance, service, reason).await
        })
        .await
    }

    async fn inhibit_locked(
        &self,
        instance: &Instance,
        service: &str,
        reason: &str,
    ) -> Result<ContainerId, OpsError> {
        let name = &instance.name;
        let active = self
            .store
            .load_active(&instance.name)
            .await
            .map_err(OpsError::from)?;
        let service_name = ServiceName::new(service);
        let record = active.services.get(&service_name).ok_or_else(|| {
            let known: Vec<&str> = active.services.keys().map(ServiceName::as_str).collect();
            OpsError::NotFound(format!(
                "{name} has no active service {service:?} (active: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        })?;
        let inhibition = Inhibition {
            service: service_name,
            container: record.container.clone(),
            reason: InhibitionReason::parse(reason),
            operation: "operator".into(),
            created_at: self.now,
            stop_grace: record.stop_grace,
            revert_to: None,
        };
        self.store
            .save_inhibition(&instance.name, &inhibition)
            .await
            .map_err(OpsError::from)?;
        Ok(record.container.clone())
    }

    /// Clears every hold (not retirement markers) on `service`; returns how
    /// many.
    pub async fn release(&self, name: &str, service: &str) -> Result<u32, OpsError> {
        self.under_lock(name, async |instance| {
            self.release_locked(instance, service).await
        })
        .await
    }

    async fn release_locked(&self, instance: &Instance, service: &str) -> Result<u32, OpsError> {
        let mut n = 0;
        for inhibition in self
            .store
            .load_inhibitions(&instance.name)
            .await
            .map_err(OpsError::from)?
        {
            if inhibition.service.as_str() == service
                && inhibition.reason != InhibitionReason::RetirementPending
            {
                self.store
                    .clear_inhibition(
                        &instance.name,
                        &inhibition.service,
                        &inhibition.container,
                        None,
                    )
                    .await
                    .map_err(OpsError::from)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sets a type's rollout switch; returns the state it had before and,
    /// for a halt, the queued upgrades of the type it cancelled (C8: a halt
    /// stops what is waiting, not only what is planned next; a running
    /// upgrade finishes, and its worker checks the switch before it
    /// starts). Safe to run twice.
    pub async fn set_rollout(
        &self,
        service_type: &str,
        state: RolloutState,
        reason: &str,
    ) -> Result<(RolloutState, Vec<TaskId>), OpsError> {
        self.scope.check_fleet("a rollout's switch")?;
        if self.catalog.get(service_type).is_none() {
            return Err(OpsError::Invalid(format!(
                "service type {service_type:?} is not in the catalog"
            )));
        }
        let before = self
            .store
            .rollouts()
            .await
            .map_err(OpsError::from)?
            .get(service_type)
            .copied()
            .unwrap_or(RolloutState::Active);
        self.store
            .set_rollout(service_type, state, reason, self.now, None)
            .await
            .map_err(OpsError::from)?;
        let cancelled = if state == RolloutState::Halted {
            self.store
                .cancel_queued_upgrades(service_type, CANCELLED_BY_HALT, self.now)
                .await
                .map_err(OpsError::from)?
        } else {
            Vec::new()
        };
        Ok((before, cancelled))
    }

    /// `stead rollout undo TYPE` (#40): halts the type's rollout (its
    /// queued upgrades cancelled), then asks, on the markers of every
    /// instance of it whose upgrade still bakes (each under its lock), for
    /// the way back, and queues the instance an upgrade task: the halted
    /// type's task carries the undo out (`core::undo`), starting and
    /// verifying each predecessor while its successor still serves, then
    /// switching ACTIVE back, so the route moves without a gap. An
    /// instance whose bake window ended has no way back: its predecessors
    /// are gone. Safe to run twice: nothing is asked twice.
    ///
    /// A Helm type does not bake (Helm's `--atomic --wait` is its check):
    /// its undo is `--to` the version recorded before the catalog's, which
    /// rolls each release back with `helm rollback`.
    pub async fn undo_rollout(&self, service_type: &str) -> Result<Undo, OpsError> {
        if let Some(entry) = self.catalog.get(service_type).filter(|e| !e.is_docker()) {
            let recorded = self
                .store
                .type_versions(service_type)
                .await
                .map_err(OpsError::from)?;
            let current_at = recorded
                .iter()
                .find(|r| r.version == entry.version)
                .map(|r| r.recorded_at);
            let previous = recorded.iter().rev().find(|r| {
                r.version != entry.version && current_at.is_none_or(|at| r.recorded_at < at)
            });
            let Some(previous) = previous else {
                return Err(OpsError::NotFound(format!(
                    "{service_type} is a Helm type, whose undo goes back to the version recorded \
                     before the catalog's {}: none is recorded (`stead rollout versions \
                     {service_type}`)",
                    entry.version
                )));
            };
            return self
                .undo_rollout_to(service_type, &previous.version.clone())
                .await;
        }
        let (_, cancelled) = self
            .set_rollout(service_type, RolloutState::Halted, "operator: rollout undo")
            .await?;
        self.put_back(service_type, cancelled, None).await
    }

    /// `stead rollout undo TYPE --to VERSION` (#40): halts the type and
    /// pins it to `version`, a version its daemon recorded when it loaded
    /// it (`stead rollout versions TYPE`), read back through today's
    /// grants. An instance whose baking upgrade goes back to `version` is
    /// put back without a gap as by `undo`; every other instance not at
    /// it is moved there by the reconciler, as a rollout toward the pin
    /// (within `max_in_flight`, waiting for no window), through the usual
    /// replacement (overlap or stop-first, and a bake of its own). New
    /// instances are made at it too. `rollout resume` lifts the pin, and
    /// the rollout then moves the type to the catalog's version again: fix
    /// the catalog first. Safe to run twice.
    pub async fn undo_rollout_to(
        &self,
        service_type: &str,
        version: &str,
    ) -> Result<Undo, OpsError> {
        if self.catalog.get(service_type).is_none() {
            return Err(OpsError::Invalid(format!(
                "service type {service_type:?} is not in the catalog"
            )));
        }
        let entry = self.recorded_entry(service_type, version).await?;
        let pinned = Some(version.to_owned());
        self.store
            .pin_rollout(
                service_type,
                version,
                &format!("operator: rollout undo --to {version}"),
                self.now,
            )
            .await
            .map_err(OpsError::from)?;
        let cancelled = self
            .store
            .cancel_queued_upgrades(service_type, CANCELLED_BY_HALT, self.now)
            .await
            .map_err(OpsError::from)?;
        let undo = self.put_back(service_type, cancelled, Some(&entry)).await?;
        Ok(Undo { pinned, ..undo })
    }

    /// `stead rollout versions TYPE`: the versions of a type its daemon
    /// recorded, oldest first.
    pub async fn type_versions(&self, service_type: &str) -> Result<Vec<TypeVersion>, OpsError> {
        if self.catalog.get(service_type).is_none() {
            return Err(OpsError::Invalid(format!(
                "service type {service_type:?} is not in the catalog"
            )));
        }
        self.store
            .type_versions(service_type)
            .await
            .map_err(OpsError::from)
    }

    /// The recorded `version` of `service_type`, as its catalog entry.
    async fn recorded_entry(
        &self,
        service_type: &str,
        version: &str,
    ) -> Result<CatalogEntry, OpsError> {
        use crate::store::RecordedVersionError as Recorded;
        crate::store::recorded_entry(self.store, &self.catalog, service_type, version, None)
            .await
            .map_err(|e| match e {
                Recorded::Store(e) => OpsError::from(e),
                e @ Recorded::NotRecorded { .. } => OpsError::NotFound(e.to_string()),
                Recorded::Invalid(e) => OpsError::Invalid(format!("--to {version}: {e}")),
            })
    }

    /// The entry `service_type`'s instances work toward: the catalog's, or
    /// the pinned version's while an undo pins the type (and `true`).
    async fn current_entry(&self, service_type: &str) -> Result<(CatalogEntry, bool), OpsError> {
        let pinned = self
            .store
            .rollout_records()
            .await
            .map_err(OpsError::from)?
            .into_iter()
            .find(|r| r.service_type == service_type && r.state == RolloutState::Halted)
            .and_then(|r| r.pinned);
        match pinned {
            Some(version) => Ok((self.recorded_entry(service_type, &version).await?, true)),
            None => self
                .catalog
                .get(service_type)
                .cloned()
                .map(|entry| (entry, false))
                .ok_or_else(|| {
                    OpsError::Invalid(format!(
                        "service type {service_type:?} is not in the catalog"
                    ))
                }),
        }
    }

    /// Puts every live instance of `service_type` back: each baking
    /// upgrade by its way back, and with `to`, every other instance not at
    /// it by an upgrade task toward it.
    async fn put_back(
        &self,
        service_type: &str,
        cancelled: Vec<TaskId>,
        to: Option<&CatalogEntry>,
    ) -> Result<Undo, OpsError> {
        let instances = self.store.list_instances().await.map_err(OpsError::from)?;
        let mut undo = Undo {
            cancelled,
            ..Undo::default()
        };
        for instance in instances.rows.iter().filter(|i| {
            i.service_type == service_type
                && !matches!(i.state, InstanceState::Deleting | InstanceState::Deleted)
        }) {
            let reverted = self
                .under_lock(instance.name.as_str(), async |instance| {
                    self.undo_locked(instance, to).await
                })
                .await;
            match reverted {
                Ok(PutBack::Reverted(services)) => {
                    undo.reverted.push((instance.name.clone(), services))
                }
                Ok(PutBack::Moving) => undo.moving.push(instance.name.clone()),
                Ok(PutBack::Already) => undo.not_baking.push(instance.name.clone()),
                // One instance a long task holds does not keep the others
                // on the failed version: named, to run the command again.
                Err(OpsError::Busy(_)) => undo.busy.push(instance.name.clone()),
                Err(e) => return Err(e),
            }
        }
        Ok(undo)
    }

    async fn undo_locked(
        &self,
        instance: &Instance,
        to: Option<&CatalogEntry>,
    ) -> Result<PutBack, OpsError> {
        let name = &instance.name;
        let active = self.store.load_active(name).await.map_err(OpsError::from)?;
        let inhibitions = self
            .store
            .load_inhibitions(name)
            .await
            .map_err(OpsError::from)?;
        // With `--to`, a baking upgrade's way back serves only when it
        // leads there.
        let services: Vec<ServiceName> = baking(&inhibitions, &active, self.now)
            .filter(|(_, back, _)| to.is_none_or(|entry| back.version == entry.version))
            .map(|(marker, _, _)| marker.service.clone())
            .collect();
        if services.is_empty() {
            let Some(entry) = to else {
                return Ok(PutBack::Already);
            };
            if instance.version == entry.version
                && instance.spec_digest.as_deref() == Some(entry.spec_digest.as_str())
            {
                return Ok(PutBack::Already);
            }
            // Moved by the reconciler's version drift toward the pin,
            // within the fleet's `max_in_flight`, as any rollout.
            return Ok(PutBack::Moving);
        }
        // The undo is a worker's (it starts and verifies the predecessors
        // while their successors serve, `core::undo`), by an upgrade task
        // of the halted type: the markers ask for it, and the leader's
        // version drift enqueues that task within the fleet's
        // `max_in_flight` (an enqueue here would exceed it: simulation seed
        // 124, three upgrades in flight). Their window is kept open until
        // then, or the pass would retire the predecessors and lose the way
        // back; should no worker come, the pass reverts them itself after
        // a while (`core::bake::UNDO_TASK_GRACE`).
        for (marker, back, _) in baking(&inhibitions, &active, self.now) {
            if back.undone {
                continue;
            }
            let asked = Inhibition {
                created_at: self.now,
                revert_to: Some(RevertTo {
                    undone: true,
                    until: back.until.max(add(self.now, UNDO_WINDOW_MIN)),
                    ..back.clone()
                }),
                ..marker.clone()
            };
            self.store
                .save_inhibition(name, &asked)
                .await
                .map_err(OpsError::from)?;
        }
        Ok(PutBack::Reverted(services))
    }

    /// Whether an interrupted upgrade left the instance `upgrading`.
    async fn left_upgrading(&self, id: InstanceId) -> Result<bool, OpsError> {
        Ok(self
            .store
            .instance_by_id(id)
            .await
            .map_err(OpsError::from)?
            .is_some_and(|i| i.state == InstanceState::Upgrading))
    }

    /// `stead task cancel ID`: cancels a queued task (it becomes failed,
    /// its error saying an operator cancelled it). A running task is
    /// refused: it finishes, retries or fails on its own, and an upgrade
    /// never stops half way. Cancelling a task already cancelled, or one
    /// that finished, changes nothing and says so.
    pub async fn cancel_task(&self, id: TaskId) -> Result<TaskCancel, OpsError> {
        let Some(task) = self.store.task(id).await.map_err(OpsError::from)? else {
            return Err(OpsError::NotFound(format!("no task {id}")));
        };
        match task.state {
            TaskState::Running => Err(OpsError::Conflict(format!(
                "task {id} ({} of instance {}) is running, locked by {}: a running task is \
                 never interrupted; it finishes, retries or fails on its own",
                task.kind,
                task.instance,
                task.locked_by.as_deref().unwrap_or("nobody")
            ))),
            TaskState::Queued
                if task.kind == TaskKind::Upgrade && self.left_upgrading(task.instance).await? =>
            {
                Err(OpsError::Conflict(format!(
                    "task {id} finishes off an upgrade of instance {} that was interrupted \
                     (it is still upgrading): it is never cancelled. To stop the upgrade, \
                     `stead rollout halt TYPE`: the task then only tidies up",
                    task.instance
                )))
            }
            TaskState::Queued => {
                if self
                    .store
                    .cancel_queued_task(id, CANCELLED_BY_OPERATOR, self.now)
                    .await
                    .map_err(OpsError::from)?
                {
                    Ok(TaskCancel::Cancelled(task))
                } else {
                    Err(OpsError::Busy(format!(
                        "task {id} was claimed by a worker just now; run the command again to see it"
                    )))
                }
            }
            TaskState::Done | TaskState::Failed => Ok(TaskCancel::AlreadyOver(task)),
        }
    }
}
