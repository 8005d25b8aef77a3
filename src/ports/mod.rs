//! Ports: the traits through which the engine touches the world.
//!
//! Each port has an in-memory implementation in the `stead-testkit` crate
//! (`testkit/`, used by the tests and the simulation, never shipped) and a
//! real adapter behind the `io` feature.
//! Adapters are thin: they translate, they add no policy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;

pub mod tenancy;
pub use tenancy::{
    NewToken, QuotaCharge, QuotaExceeded, QuotaUsage, Revocation, TeamQuota, Tenancy, Token,
    TokenRole,
};

pub use crate::core::errors::{
    ErrorKind, NotifyError, PolicyError, PortFailure, PortName, ProbeError, ProvisionError,
    StoreError, TrafficError,
};
pub use crate::core::event_log::{Event, EventFilter, LoggedEvent};
use crate::core::fleet::{
    Instance, InstanceId, InstanceState, ListedInstance, NewTask, RolloutState, Task, TaskId,
};
use crate::core::hash::FastMap;
pub use crate::core::hosts::{HostReservation, HOSTS_PER_CLAIM_MAX};
use crate::core::spec::{ReadinessProbe, ServiceSpec};
use crate::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, ContainerStatus, GenerationKey, Health,
    Inhibition, InstanceName, Observation, RuntimeError, ServiceName, Timestamp,
};

/// How one reading of the database's clock agreed with the clock's last
/// anchor (T2, #41).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchored {
    /// The first reading: nothing to compare it with yet.
    First,
    /// Where the last anchor and the monotonic time since put it.
    Steady,
    /// Ahead of where the last anchor put it by as much as the host's wall
    /// clock says the monotonic clock missed: this process stood still (a
    /// suspend, a paused VM) while the world went on. Taken at once: the
    /// database's clock is right, this process's view was behind.
    StoodStill(jiff::SignedDuration),
    /// Off by more than [`CLOCK_JUMP_MAX`] from where the last anchor put
    /// it, and not because this process stood still: the database's clock
    /// stepped (`+` ahead). Not taken until a reading a minute or more
    /// later agrees with it; until then the last anchor stays, so a step
    /// that is stepped back within the minute moves nothing.
    Jumped(jiff::SignedDuration),
}

/// How far a reading of the database's clock may stray from where the last
/// anchor and the monotonic clock put it before it counts as a jump. Each
/// anchor is off by at most half its round trip (at most half a second),
/// and the monotonic clock's rate error is a few parts per million: five
/// seconds is no noise.
pub const CLOCK_JUMP_MAX: Duration = Duration::from_secs(5);

/// The source of `now` for the engine. The core never reads it itself.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
    /// The monotonic clock local trust windows are measured on (T2). It
    /// never steps, but it stands still while the host is suspended or its
    /// VM paused: [`Clock::host_now`] is the second opinion.
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
    /// The host's own wall clock, never anchored to anything: it may step
    /// (both ways), but it keeps running while the monotonic clock stands
    /// still, so a trust window ends when either clock says so.
    fn host_now(&self) -> Timestamp {
        self.now()
    }
    /// Whether nothing is in doubt: false while a reading of the
    /// database's clock that stepped away from this clock's reckoning is
    /// neither stepped back nor believed (#41). No local trust holds
    /// meanwhile, so the process acts on nothing until the next reading.
    fn settled(&self) -> bool {
        true
    }
    /// Anchors a clock that follows the database's (T2) to `database_now`,
    /// read over a round trip of `round_trip`, and says how the reading
    /// agreed with the last. Other clocks ignore it.
    fn anchor(&self, _database_now: Timestamp, _round_trip: Duration) -> Anchored {
        Anchored::Steady
    }
    /// Whether this clock wants anchoring (again).
    fn wants_anchor(&self) -> bool {
        false
    }
    /// Whether `now` agrees with the database's clock: a clock that
    /// follows it has been anchored at least once. Until then nothing that
    /// compares times across processes may be decided by it (T2).
    fn follows_database(&self) -> bool {
        true
    }
}

/// A container the runtime manages on stead's behalf (it carries stead's
/// labels). One `list_managed` call answers a whole steady-state pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedContainer {
    pub id: ContainerId,
    pub instance: InstanceName,
    pub service: ServiceName,
    pub status: ContainerStatus,
    pub started_at: Option<Timestamp>,
}

/// What happened to a managed container, as the runtime's event stream says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeEventAction {
    /// A new execution began (including a native restart).
    Start,
    /// The process exited (crash, kill, stop).
    Die,
    /// The healthcheck verdict changed.
    HealthStatus(Health),
    /// The container was removed.
    Destroy,
}

impl RuntimeEventAction {
    /// Whether the event can change what recovery would do now, so the
    /// instance deserves a pass before the next tick.
    pub fn wakes_recovery(self) -> bool {
        matches!(self, Self::Die | Self::HealthStatus(_) | Self::Destroy)
    }
}

/// One event about one managed container: a hint that this instance should
/// get an immediate targeted pass. The periodic level-triggered pass stays the
/// safety net; a lost event costs at most one interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEvent {
    pub instance: InstanceName,
    pub service: ServiceName,
    pub container: ContainerId,
    pub action: RuntimeEventAction,
}

/// The runtime's event stream (T7), a hint that wakes recovery early.
#[async_trait]
pub trait RuntimeEvents: Send + Sync {
    /// Subscribes to events from `since` on, replayed where the runtime
    /// keeps them (Docker keeps its last 256 events, so a long gap is
    /// not fully replayed: the periodic pass covers it).
    async fn subscribe(&self, since: Timestamp)
        -> Result<Box<dyn EventSubscription>, RuntimeError>;
}

/// One subscription to the event stream.
#[async_trait]
pub trait EventSubscription: Send {
    /// The next event; `None` once the stream ended (the connection to the
    /// runtime dropped), after which the caller subscribes again.
    async fn next_event(&mut self) -> Option<Result<RuntimeEvent, RuntimeError>>;
}

/// What the provisioner needs to create one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateContainer {
    pub instance: InstanceName,
    /// The instance's row id: its named volumes carry it, so an instance
    /// that reuses a deleted one's name never mounts the earlier data.
    pub instance_id: crate::core::fleet::InstanceId,
    pub spec: ServiceSpec,
    /// The spec's plain environment rendered for this instance
    /// (`RunSpec::render_env`); secrets are the runtime's to resolve.
    pub env: Vec<(String, String)>,
    /// Distinguishes an upgrade's successor from its predecessor; part of
    /// the deterministic container name.
    pub revision: String,
}

/// Containers: inspect, start, stop and read the exact IDs ACTIVE names.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Called once before every full recovery pass. A runtime that serves
    /// reads from a cache checks it here against one list call; an error
    /// is reported with the pass, which then carries on.
    async fn begin_pass(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn inspect(&self, id: &ContainerId) -> Result<Observation, RuntimeError>;
    async fn start(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// Stops the container of the generation `key` names. It must carry
    /// stead's labels for `key.instance` and `key.service`; one that does
    /// not is refused with an error naming what its labels say, and left
    /// alone.
    async fn stop(&self, key: &GenerationKey, grace: Duration) -> Result<(), RuntimeError>;
    async fn restart(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError>;
    async fn health(&self, id: &ContainerId) -> Result<Health, RuntimeError>;
    async fn binds(&self, id: &ContainerId) -> Result<Binds, RuntimeError>;
    /// The last `lines` lines the container printed, stdout and stderr,
    /// across its executions, each cut short if long: the evidence a
    /// revert tells (#55). Read-only.
    async fn last_lines(&self, id: &ContainerId, lines: usize)
        -> Result<Vec<String>, RuntimeError>;
    /// Every container carrying stead's labels, in one call.
    async fn list_managed(&self) -> Result<Vec<ManagedContainer>, RuntimeError>;
    /// Creates (and starts) a container; idempotent on its deterministic name.
    async fn create(&self, request: &CreateContainer) -> Result<ContainerId, RuntimeError>;
    /// Removes the container of the generation `key` names, checked as
    /// [`Runtime::stop`] checks it. Not-found counts as removed.
    async fn remove(&self, key: &GenerationKey) -> Result<(), RuntimeError>;
    /// Removes every named volume created for the instance with row id
    /// `instance_id` (and only those: a volume kept from an earlier
    /// instance of the same name is that one's data); returns their names.
    /// Run after its containers are gone.
    async fn purge_volumes(
        &self,
        instance: &InstanceName,
        instance_id: crate::core::fleet::InstanceId,
    ) -> Result<Vec<String>, RuntimeError>;
    /// Every event of the runtime's stream is shown to the runtime too, so a
    /// runtime that caches reads can drop what the event made stale.
    fn event_seen(&self, _event: &RuntimeEvent) {}
    /// Whether the event stream is followed right now; a runtime that
    /// caches reads may trust its cache only while it is.
    fn events_followed(&self, _followed: bool) {}
}

/// One verified route: the service's backends and the execution they were
/// verified for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub service: ServiceKey,
    pub container: ContainerId,
    pub binds: Binds,
    /// The execution whose readiness vouches for these binds.
    pub verified_started_at: Option<Timestamp>,
    /// Public host names from the catalog's `domains`, rendered for this
    /// instance (#43); a traffic plane without HTTPS ignores them.
    pub public_hosts: Vec<String>,
}

pub use crate::core::types::ServiceKey;

/// A route as the traffic plane holds it, read back (T5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRoute {
    pub service: ServiceKey,
    /// The loopback host port it dials.
    pub port: u16,
}

/// What making sure of the traffic plane found (T5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlaneCheck {
    /// As configured.
    Present,
    /// It had lost stead's part (a proxy restarted without its saved
    /// config) and it was recreated, without routes.
    Recreated,
    /// It listened elsewhere than configured; corrected.
    Corrected { was: String },
}

/// Publication of verified backends. The plane is reconciled, not
/// remembered (T5): every pass makes sure of it and reads its routes back.
#[async_trait]
pub trait Traffic: Send + Sync {
    /// Upserts the route of one service. Reported successful only when the
    /// proxy confirmed it.
    async fn publish(&self, route: &Route) -> Result<(), TrafficError>;
    /// Removes the route of one service. Not-found counts as withdrawn.
    async fn withdraw(&self, service: &ServiceKey) -> Result<(), TrafficError>;
    /// Makes sure stead's part of the plane exists as configured.
    async fn ensure(&self) -> Result<PlaneCheck, TrafficError> {
        Ok(PlaneCheck::Present)
    }
    /// Every route of stead's the plane holds now, in one call. A route
    /// whose name does not decode into a service is left out.
    async fn held_routes(&self) -> Result<Vec<HeldRoute>, TrafficError>;
}

pub use crate::core::fleet::Release;
pub use crate::core::helm_bake::ReleaseHealth;
pub use crate::core::release::{HelmRelease, ReleaseKind, ReleaseSpec, ReleaseTarget};

/// Releases: install-or-upgrade on a deterministic name, uninstall, list.
/// One provisioner serves every kind of release (`ReleaseKind`); the
/// daemon's routes each call to Docker or Helm.
#[async_trait]
pub trait Provisioner: Send + Sync {
    /// Idempotent: installing an installed release upgrades it in place.
    async fn install_or_upgrade(&self, release: &ReleaseSpec) -> Result<(), ProvisionError>;
    /// Idempotent: a release that is already gone counts as uninstalled.
    async fn uninstall(&self, release: &ReleaseTarget) -> Result<(), ProvisionError>;
    /// Every live release in every state (pending ones included: they
    /// exist), keyed by (name, namespace), with no cap on their number.
    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError>;
    /// Moves a release back to `release`'s chart version (`rollout undo
    /// --to` of a Helm type): to the newest revision of its history at
    /// that version (`helm rollback`, which restores that revision's
    /// values too), or, with none there, by an upgrade to it. A provisioner
    /// that keeps no history upgrades.
    async fn roll_back(&self, release: &HelmRelease) -> Result<(), ProvisionError> {
        self.install_or_upgrade(&ReleaseSpec::Helm(release.clone()))
            .await
    }
    /// A baking release's health (#40, `core::helm_bake`): its status, and
    /// with `tests` the chart's own tests (`helm test`). A provisioner that
    /// keeps no account of its releases (Docker) finds every one healthy.
    async fn check_release(
        &self,
        _release: &ReleaseTarget,
        _tests: bool,
    ) -> Result<ReleaseHealth, ProvisionError> {
        Ok(ReleaseHealth::Healthy)
    }
    /// Moves a release back from `bad_chart_version`, which went bad while
    /// baking, to `back_to`, the release of the version its instance
    /// records: as [`Provisioner::roll_back`] does, or, when the bad
    /// upgrade kept the chart version and changed only its values, by an
    /// upgrade to `back_to` (the newest revision at that chart is the bad
    /// one). Without `back_to` (a version never recorded): to the newest
    /// revision at another chart version (`helm rollback REV`), or the
    /// previous one when there is none. A provisioner with no history
    /// refuses.
    async fn roll_back_from(
        &self,
        release: &ReleaseTarget,
        _bad_chart_version: &str,
        _back_to: Option<&HelmRelease>,
    ) -> Result<(), ProvisionError> {
        Err(ProvisionError::Refused(format!(
            "release {} in {} has no revision history to roll back through",
            release.release.name, release.release.namespace
        )))
    }
    /// The provisioner's own account of one release (`helm status`), for
    /// `stead status`; `None` when it keeps none (Docker) or does not know
    /// the release.
    async fn status(
        &self,
        _release: &ReleaseTarget,
    ) -> Result<Option<ReleaseStatus>, ProvisionError> {
        Ok(None)
    }
}

/// What a provisioner says of one release.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReleaseStatus {
    /// The provisioner's word: `deployed`, `failed`, `pending-upgrade`, ...
    pub status: String,
    pub revision: u64,
    /// The chart and its version, as `chart-1.2.3`.
    pub chart: String,
    /// Helm's description of the last operation ("Upgrade complete").
    pub description: String,
}

pub use crate::core::types::ProbeTarget;

/// Readiness of one execution's backends.
#[async_trait]
pub trait Probe: Send + Sync {
    /// Whether `target`'s execution is ready as `probe` says: its binds
    /// answer, or a line appeared in that execution's own logs (never in
    /// an earlier execution's). A probe that finds the container running
    /// another execution fails.
    async fn ready(&self, probe: &ReadinessProbe, target: &ProbeTarget) -> Result<(), ProbeError>;
}

/// Bind and device grants; checked before any runtime mutation (R11).
#[async_trait]
pub trait Policy: Send + Sync {
    async fn check(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
    ) -> Result<(), PolicyError>;
}

/// Courtesy notifications (drift). A failure never aborts a sweep.
#[async_trait]
pub trait Notifier: Send + Sync {
    async fn notify(&self, event: &str, message: &str) -> Result<(), NotifyError>;
}

/// Proof of holding the reconciler lease; fenced writes carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    pub holder: String,
    pub epoch: i64,
    pub expires_at: Timestamp,
}

/// Proof of holding an instance's lock (T3): a worker's writes to the
/// instance carry it ([`Store::write_under_lock`]). The holder names the
/// worker and its process's incarnation, so it is this lock's alone: a
/// lock that expired or went to another holder no longer matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockGrant {
    pub instance: InstanceId,
    pub holder: String,
}

/// A write a worker makes to the instance whose lock it holds
/// ([`Store::write_under_lock`]): each is the store method of the same
/// name, with the same meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockedWrite<'a> {
    /// [`Store::set_instance_state`]: compare-and-set.
    State {
        id: InstanceId,
        from: InstanceState,
        to: InstanceState,
        now: Timestamp,
    },
    /// [`Store::set_instance_version`].
    Version {
        id: InstanceId,
        version: &'a str,
        now: Timestamp,
    },
    /// [`Store::set_instance_spec_digest`].
    SpecDigest {
        id: InstanceId,
        digest: &'a str,
        now: Timestamp,
    },
    /// [`Store::save_active_service`].
    SaveActive {
        instance: &'a InstanceName,
        service: &'a ServiceName,
        active: &'a ActiveService,
    },
    /// [`Store::remove_active_service`].
    RemoveActive {
        instance: &'a InstanceName,
        service: &'a ServiceName,
    },
    /// [`Store::release_claims`], unfenced by the reconciler lease.
    ReleaseClaims {
        instance: &'a InstanceName,
        container: &'a ContainerId,
    },
    /// [`Store::save_inhibition`].
    SaveInhibition {
        instance: &'a InstanceName,
        inhibition: &'a Inhibition,
    },
    /// [`Store::clear_inhibition`], unfenced by the reconciler lease.
    ClearInhibition {
        instance: &'a InstanceName,
        service: &'a ServiceName,
        container: &'a ContainerId,
    },
}

/// An instance to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewInstance {
    pub name: InstanceName,
    pub team: String,
    pub service_type: String,
    pub version: String,
    pub expires_at: Option<Timestamp>,
    pub maintenance_window: Option<String>,
    /// Checked against the catalog's declared parameters by the caller.
    pub parameters: BTreeMap<String, String>,
    /// Public host names given at create, checked by the caller against
    /// the team's `domain_suffixes` (#54).
    pub domains: Vec<String>,
    /// The catalog type's spec digest it is created at.
    pub spec_digest: Option<String>,
}

/// What [`Store::expire_instance`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    /// The deprovision task it inserted.
    pub task: TaskId,
    /// The queued tasks it cancelled, in id order.
    pub cancelled: Vec<TaskId>,
}

/// A service type's rollout switch as the store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRecord {
    pub service_type: String,
    pub state: RolloutState,
    /// Who or what set it, and why (an operator's `--reason`, or the failed
    /// upgrade that halted it).
    pub reason: String,
    pub updated_at: Timestamp,
    /// The version an operator's `rollout undo --to` pinned the halted
    /// type to: its instances are moved to it, and new ones made at it,
    /// until the switch changes again (a resume, or any halt).
    pub pinned: Option<String>,
}

/// One version of a service type as the catalog defined it when the daemon
/// loaded it (#40), kept so that `rollout undo --to` can move a type back
/// to a version the catalog no longer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeVersion {
    pub service_type: String,
    pub version: String,
    pub spec_digest: String,
    /// The type's own catalog table, as a catalog of that one type
    /// (`core::catalog::Catalog::source_of`).
    pub source: String,
    /// When the version was first recorded: the history's order.
    pub recorded_at: Timestamp,
}

/// Rows that failed to parse are reported beside the rows that did, so one
/// tenant's bad data never hides the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rows<T> {
    pub rows: Vec<T>,
    pub bad: Vec<StoreError>,
}

/// How a worker finishes a task ([`Store::finish_task_recorded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskFinish<'a> {
    Done,
    /// Queued again, due at `run_after`, with its error.
    Retry {
        run_after: Timestamp,
        error: &'a str,
    },
    /// Failed for good, with its error.
    Fail {
        error: &'a str,
    },
}

/// One instance as a recovery pass reads it under its lock: intent, ACTIVE
/// and inhibitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedInstance {
    pub instance: Instance,
    pub active: ActiveRecord,
    pub inhibitions: Vec<Inhibition>,
}

/// What [`Store::load_instances`] found: per instance that still exists,
/// its rows, or the error its own rows gave (one tenant's bad row never
/// hides the others).
///
/// Hashed, not ordered: the pass takes each instance's rows out by id, and
/// rows of a few hundred bytes would be shifted inside an ordered map's
/// nodes on every removal.
pub type LoadedInstances = FastMap<InstanceId, Result<LoadedInstance, StoreError>>;

/// The instances whose upgrade markers carry a way back (`RevertTo`), as
/// [`Store::ways_back`] reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaysBack {
    /// A successor still bakes (`Inhibition::bakes_at`): the instance
    /// holds a slot of `max_in_flight` (#55). A marker that does not
    /// decode is left out of both sets (the instance's own pass reports
    /// it): one instance's bad row must not hold the fleet's rollout.
    pub baking: BTreeSet<InstanceId>,
    /// An operator asked to take the way back (`rollout undo`,
    /// `RevertTo::undone`).
    pub undone: BTreeSet<InstanceId>,
}

/// Durable state and the task queue; tokens and quotas too ([`Tenancy`]).
#[async_trait]
pub trait Store: Tenancy + Send + Sync {
    // --- instances -------------------------------------------------------
    /// Inserts an instance in `provisioning`. A name is taken while an
    /// instance that is not `deleted` holds it ([`StoreError::Conflict`]);
    /// the row of a deleted instance is kept (its history, `instance list
    /// --all`) until its name is reused, when it is removed with its
    /// finished tasks in the same transaction as the insert. A deleted
    /// instance that still has a queued or running task keeps its name.
    async fn create_instance(
        &self,
        new: &NewInstance,
        now: Timestamp,
    ) -> Result<Instance, StoreError>;
    async fn instance(&self, name: &InstanceName) -> Result<Option<Instance>, StoreError>;
    async fn instance_by_id(&self, id: InstanceId) -> Result<Option<Instance>, StoreError>;
    async fn list_instances(&self) -> Result<Rows<Instance>, StoreError>;
    /// The service types that have instances not `deleted`, in name
    /// order: what a catalog reload must not break
    /// (`core::catalog::reload_hazards`). Read from the type column alone,
    /// so a row that does not otherwise decode still counts.
    async fn live_service_types(&self) -> Result<BTreeSet<String>, StoreError>;
    /// Every instance as a whole recovery pass lists it, by id: only what
    /// the pass plans by, so the listing of a large fleet reads and copies
    /// a few words per instance; each instance's whole row is read under
    /// its lock ([`Store::load_instances`]). A row whose listed fields do
    /// not decode is reported in [`Rows::bad`].
    async fn list_for_recovery(&self) -> Result<Rows<ListedInstance>, StoreError>;
    /// Compare-and-set; `Ok(false)` when the state was not `from`.
    async fn set_instance_state(
        &self,
        id: InstanceId,
        from: InstanceState,
        to: InstanceState,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    async fn set_instance_stopped(
        &self,
        id: InstanceId,
        stopped: bool,
        now: Timestamp,
    ) -> Result<(), StoreError>;
    /// Records the digest of the catalog spec the instance now runs.
    async fn set_instance_spec_digest(
        &self,
        id: InstanceId,
        digest: &str,
        now: Timestamp,
    ) -> Result<(), StoreError>;
    /// Records that the instance's deprovision removes its named volumes
    /// too (`instance delete --purge-volumes`). Idempotent.
    async fn set_purge_volumes(&self, id: InstanceId, now: Timestamp) -> Result<(), StoreError>;
    async fn set_instance_version(
        &self,
        id: InstanceId,
        version: &str,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// `write` (the store method of the same name), made only while
    /// `lock` is still held: the lock row names its holder and has not
    /// expired by the database's clock, checked in the write's own
    /// transaction so the lock cannot change hands in between. Otherwise
    /// [`StoreError::LockLost`] and nothing changes: a worker paused past
    /// its lock never overwrites what the lock's next holder wrote (T3).
    /// `Ok(false)` only from a [`LockedWrite::State`] whose state was not
    /// `from`; every other write answers as its method does.
    async fn write_under_lock(
        &self,
        lock: &LockGrant,
        write: LockedWrite<'_>,
    ) -> Result<bool, StoreError>;

    /// `write`, made only while the reconciler `lease` is current by the
    /// database's clock, checked in the write's own transaction (T2);
    /// otherwise [`StoreError::LeaseLost`] and nothing changes. The
    /// recovery pass's own instance writes (a bake's revert) go through
    /// it, so a reconciler that lost its lease never overwrites what the
    /// next leader wrote.
    async fn write_under_lease(
        &self,
        lease: &LeaseGrant,
        write: LockedWrite<'_>,
    ) -> Result<bool, StoreError>;

    // --- ACTIVE ----------------------------------------------------------
    async fn load_active(&self, instance: &InstanceName) -> Result<ActiveRecord, StoreError>;
    async fn save_active_service(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        active: &ActiveService,
    ) -> Result<(), StoreError>;
    async fn remove_active_service(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
    ) -> Result<(), StoreError>;
    /// Writes binds only if ACTIVE still names `container` at `revision`;
    /// `Ok(false)` when the generation changed. With a fence, only while
    /// that reconciler lease is current (T2), as for every write below that
    /// takes one.
    async fn persist_binds(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        revision: &str,
        binds: &Binds,
        fence: Option<&LeaseGrant>,
    ) -> Result<bool, StoreError>;
    /// Records the last verified execution of the generation (R17).
    async fn record_verified_execution(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        started_at: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError>;
    /// Releases the bind claims of a gone container (clears its binds).
    async fn release_claims(
        &self,
        instance: &InstanceName,
        container: &ContainerId,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError>;

    /// Intent, ACTIVE and inhibitions of every instance of `ids` that
    /// exists, in a constant number of queries whatever the batch's size: a
    /// pass reads the batch of instances it just locked at once, so its
    /// round trips do not grow with the fleet's (issue #14).
    async fn load_instances(&self, ids: &[InstanceId]) -> Result<LoadedInstances, StoreError>;

    // --- inhibitions -----------------------------------------------------
    async fn load_inhibitions(
        &self,
        instance: &InstanceName,
    ) -> Result<Vec<Inhibition>, StoreError>;
    /// What the upgrades' markers with a way back say at `now`, in one
    /// read for the whole fleet ([`WaysBack`]): the tick's version drift
    /// counts the bakes in flight and gives undos their tasks.
    async fn ways_back(&self, now: Timestamp) -> Result<WaysBack, StoreError>;
    /// Replaces any record with the same (instance, service, container).
    async fn save_inhibition(
        &self,
        instance: &InstanceName,
        inhibition: &Inhibition,
    ) -> Result<(), StoreError>;
    /// Idempotent.
    async fn clear_inhibition(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError>;

    // --- tasks -----------------------------------------------------------
    /// `Ok(None)` when a queued-or-running task of the same (instance, kind)
    /// exists (enforced by the database). With a fence, the insert happens
    /// only while that reconciler lease is current.
    async fn enqueue(
        &self,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Option<TaskId>, StoreError>;
    /// Claims up to `limit` due tasks (`run_after <= now`), oldest first.
    async fn claim(
        &self,
        worker: &str,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError>;
    /// `Ok(false)` when the worker no longer holds the task.
    async fn extend_lease(
        &self,
        id: TaskId,
        worker: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    async fn complete(&self, id: TaskId, worker: &str, now: Timestamp) -> Result<bool, StoreError>;
    async fn retry(
        &self,
        id: TaskId,
        worker: &str,
        run_after: Timestamp,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    async fn fail(
        &self,
        id: TaskId,
        worker: &str,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    /// Running tasks whose `locked_at` is older than `lease` go back to
    /// queued, attempts kept. Returns how many.
    async fn reset_expired_leases(
        &self,
        now: Timestamp,
        lease: Duration,
        fence: Option<&LeaseGrant>,
    ) -> Result<u64, StoreError>;
    /// Queued and running tasks (what the planners need).
    async fn active_tasks(&self) -> Result<Rows<Task>, StoreError>;
    async fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError>;
    /// Cancels task `id` if it is queued: it becomes `failed` with
    /// `reason` as its error (see [`crate::core::fleet::CANCELLED`]).
    /// `Ok(false)` when it is not queued (running, finished, or no such
    /// task); a running task is never interrupted.
    async fn cancel_queued_task(
        &self,
        id: TaskId,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    /// Cancels every queued upgrade of an instance of `service_type` (a
    /// halted rollout, C8) that has not begun. One that has (a retry
    /// waiting) runs once more, halted: it tidies what its attempts left
    /// (a candidate, a Helm release upgraded but not yet baked, put back
    /// at the version the instance records). Returns their ids, in order.
    async fn cancel_queued_upgrades(
        &self,
        service_type: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError>;
    /// Deletion, by TTL (C7) or by an operator: compare-and-set the state
    /// to `deleting`, insert one deprovision task and cancel the instance's
    /// other queued tasks (T4, [`Task::cancelled_by_deletion`]), in one
    /// transaction. `Ok(None)` if either the CAS failed or a deprovision is
    /// already active; then nothing changed.
    ///
    /// [`Task::cancelled_by_deletion`]: crate::core::fleet::Task::cancelled_by_deletion
    async fn expire_instance(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Option<Expired>, StoreError>;
    /// An operator's `instance delete --purge-volumes`: what
    /// [`Store::expire_instance`] does (unfenced), and in the same
    /// transaction what [`Store::set_purge_volumes`] does. A deletion that
    /// does not happen (`Ok(None)`) leaves no purge behind that a later
    /// plain delete or TTL expiry would carry out.
    async fn expire_instance_purging(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
    ) -> Result<Option<Expired>, StoreError>;
    /// Tasks newest first, at most `limit`: the queued and running ones, and
    /// with `include_finished` the done and failed ones too (`stead task
    /// list`).
    async fn tasks(&self, include_finished: bool, limit: u32) -> Result<Rows<Task>, StoreError>;

    // --- gauges ----------------------------------------------------------
    async fn queue_depth(&self) -> Result<u64, StoreError>;
    async fn instance_counts(&self) -> Result<BTreeMap<InstanceState, u64>, StoreError>;

    // --- rollouts --------------------------------------------------------
    async fn rollouts(&self) -> Result<BTreeMap<String, RolloutState>, StoreError>;
    /// Every rollout switch with why and when it was last set, in
    /// service-type order (`stead status`).
    async fn rollout_records(&self) -> Result<Vec<RolloutRecord>, StoreError>;
    async fn set_rollout(
        &self,
        service_type: &str,
        state: RolloutState,
        reason: &str,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError>;

    /// Halts `service_type` and pins it to `version` (`rollout undo --to`);
    /// any `set_rollout` lifts the pin.
    async fn pin_rollout(
        &self,
        service_type: &str,
        version: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    // --- type versions (#40) ---------------------------------------------
    /// Records a version of a type as the loaded catalog defines it, once
    /// per (type, version, spec digest): a definition recorded before is
    /// never rewritten (`Ok(false)`), so a catalog that changes a version
    /// in place adds a definition beside it. With a fence, only while that
    /// reconciler lease is current (the daemon records only as leader).
    async fn record_type_version(
        &self,
        recorded: &TypeVersion,
        fence: Option<&LeaseGrant>,
    ) -> Result<bool, StoreError>;
    /// The recorded definitions of `service_type`, oldest first (a
    /// version changed in place has one per spec digest).
    async fn type_versions(&self, service_type: &str) -> Result<Vec<TypeVersion>, StoreError>;

    // --- public host names (#54) -----------------------------------------
    /// Claims `hosts` (at most [`HOSTS_PER_CLAIM_MAX`]) for `service` of
    /// `instance`: each host no live instance holds is reserved for it (a
    /// host held by a deleted instance is taken over), in one transaction,
    /// so two instances racing for a host never both hold it. Answers the
    /// reservations of `hosts` that live instances hold after the claim,
    /// in host order: the claimant's own, and the holders of the others
    /// (`core::hosts::grant_hosts` decides from it). An instance that is
    /// not live reserves nothing. A reservation lasts until its instance
    /// is deleted: its row goes when the instance's row does (`ON DELETE
    /// CASCADE`), and a deleted holder's host is free before that. With
    /// a fence, only while that reconciler lease is current (T2).
    async fn reserve_hosts(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        hosts: &[String],
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Vec<HostReservation>, StoreError>;
    /// Every reservation a live instance holds, in host order.
    async fn host_reservations(&self) -> Result<Vec<HostReservation>, StoreError>;

    // --- time ------------------------------------------------------------
    /// The database's clock (T2). Leases and instance locks are timed by it
    /// inside the store; the engine anchors its own clock to it, so a skewed
    /// or jumping host clock can neither take a lease early, keep one late,
    /// nor expire a TTL or a task lease early.
    async fn database_now(&self) -> Result<Timestamp, StoreError>;

    // --- the reconciler singleton (C2, T1) -------------------------------
    /// Takes or renews the lease, timed by the database's clock. `Ok(None)`
    /// while another holder's lease is unexpired. Each change of holder
    /// increments the epoch; a new incarnation of the same identity at the
    /// same site (`<identity>#<site>.<nonce>`, T1) takes it back at once,
    /// one at another site (a twin: a copied `state_dir`) waits for expiry
    /// (`core::succession::succession`).
    async fn acquire_reconciler_lease(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseGrant>, StoreError>;
    async fn release_reconciler_lease(&self, grant: &LeaseGrant) -> Result<(), StoreError>;

    // --- instance locks across processes (T3) ----------------------------
    /// Takes (or, for the same holder, renews) the lock of each instance
    /// whose lock is free, expired or already `holder`'s, for `ttl` by the
    /// database's clock, in one statement. Returns the instances locked;
    /// unknown instances are skipped.
    async fn try_lock_instances(
        &self,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<InstanceId>, StoreError>;
    /// [`Store::try_lock_instances`] and [`Store::load_instances`] of the
    /// instances locked, as one round trip where the backend can: a pass
    /// takes each batch this way. The rows are read under the locks.
    /// `Err`: the locks were not taken. `Ok((locked, Err(_)))`: they were,
    /// but the rows were not read; the caller releases them.
    async fn try_lock_and_load(
        &self,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<(Vec<InstanceId>, Result<LoadedInstances, StoreError>), StoreError> {
        let locked = self.try_lock_instances(instances, holder, ttl).await?;
        let loaded = if locked.is_empty() {
            Ok(LoadedInstances::default())
        } else {
            self.load_instances(&locked).await
        };
        Ok((locked, loaded))
    }
    /// Releases `holder`'s locks of these instances; others' are untouched.
    async fn unlock_instances(
        &self,
        instances: &[InstanceId],
        holder: &str,
    ) -> Result<(), StoreError>;
    /// Releases every instance lock whose holder starts with `prefix` (a
    /// restarted daemon's `ProcessIdentity::predecessors_prefix`: its
    /// earlier incarnations at its site are gone). Returns how many.
    async fn clear_instance_locks_of(&self, prefix: &str) -> Result<u64, StoreError>;
    /// T1: running tasks whose worker starts with `prefix` (a restarted
    /// daemon's `ProcessIdentity::predecessors_prefix`: its earlier
    /// incarnations at its site are gone, and with them the workers that
    /// held them) go back to queued at once, attempts
    /// kept, instead of waiting out their lease (C6). Returns their ids.
    async fn requeue_tasks_of(
        &self,
        prefix: &str,
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError>;
    /// Who holds the lease and until when, as recorded (the expiry may have
    /// passed); `None` when nobody took it or it was released. For logs and
    /// status only: it grants nothing.
    async fn reconciler_lease(&self) -> Result<Option<LeaseGrant>, StoreError>;

    // --- the event log (#42) ---------------------------------------------
    /// Appends `events` in order, in one transaction: all or none. Their
    /// ids ascend in the order given.
    async fn append_events(&self, events: &[Event]) -> Result<(), StoreError>;
    /// The events `filter` admits, at most its limit, in id order: the
    /// newest ones, or with `after_id` the oldest after it. A row that
    /// does not decode is reported in [`Rows::bad`].
    async fn events(&self, filter: &EventFilter) -> Result<Rows<LoggedEvent>, StoreError>;
    /// Deletes at most `batch_max` of the oldest events written before
    /// `before`, and says how many: retention prunes in bounded batches so
    /// no statement holds the table long.
    async fn prune_events(&self, before: Timestamp, batch_max: u32) -> Result<u64, StoreError>;
    /// Deletes the type versions recorded before `before` (#54: the
    /// history `rollout undo --to` reads is kept as long as the event
    /// log), and says how many. Never one a live instance runs, one a
    /// rollout is pinned to, or the newest of its type.
    async fn prune_type_versions(&self, before: Timestamp) -> Result<u64, StoreError>;
    /// Deletes at most `batch_max` of the oldest finished (done or
    /// failed) tasks last changed before `before`, and says how many; a
    /// queued or running task is never deleted.
    async fn prune_finished_tasks(
        &self,
        before: Timestamp,
        batch_max: u32,
    ) -> Result<u64, StoreError>;
    /// The id of the last event webhook `webhook` was sent or passed
    /// over (#42); `None` before its cursor was first set.
    async fn webhook_cursor(&self, webhook: &str) -> Result<Option<i64>, StoreError>;
    /// Compare-and-set of a webhook's cursor: moves it from `from` (`None`:
    /// creates it) to `to`, recording `now`. `Ok(false)` when it was not
    /// `from` (another process moved it), and then nothing changed: a
    /// cursor never moves backwards under a process that read it late.
    async fn advance_webhook_cursor(
        &self,
        webhook: &str,
        from: Option<i64>,
        to: i64,
        now: Timestamp,
    ) -> Result<bool, StoreError>;
    /// [`Store::enqueue`], recording `event` (its `task` set to the new
    /// task's id) in the same transaction when a task was inserted: both
    /// or neither. The default is not atomic; the SQL stores are.
    async fn enqueue_recorded(
        &self,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
        event: &Event,
    ) -> Result<Option<TaskId>, StoreError> {
        let id = self.enqueue(task, now, fence).await?;
        if let Some(id) = id {
            self.append_events(&[event.clone().task(id)]).await?;
        }
        Ok(id)
    }
    /// [`Store::complete`], [`Store::retry`] or [`Store::fail`] as
    /// `finish` says, recording `event` (its `task` set to `id`) in the same
    /// transaction when the worker still held the task: both or neither.
    /// The default is not atomic; the SQL stores are.
    async fn finish_task_recorded(
        &self,
        id: TaskId,
        worker: &str,
        finish: TaskFinish<'_>,
        now: Timestamp,
        event: &Event,
    ) -> Result<bool, StoreError> {
        let held = match finish {
            TaskFinish::Done => self.complete(id, worker, now).await?,
            TaskFinish::Retry { run_after, error } => {
                self.retry(id, worker, run_after, error, now).await?
            }
            TaskFinish::Fail { error } => self.fail(id, worker, error, now).await?,
        };
        if held {
            self.append_events(&[event.clone().task(id)]).await?;
        }
        Ok(held)
    }
    /// [`Store::expire_instance`], recording `event` (its `task` set to
    /// the deprovision's id) in the same transaction when the instance
    /// was expired. The default is not atomic; the SQL stores are.
    async fn expire_instance_recorded(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
        event: &Event,
    ) -> Result<Option<Expired>, StoreError> {
        let expired = self.expire_instance(id, from, task, now, fence).await?;
        if let Some(expired) = &expired {
            self.append_events(&[event.clone().task(expired.task)])
                .await?;
        }
        Ok(expired)
    }
}
