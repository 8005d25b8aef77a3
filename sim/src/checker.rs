//! The invariant checker. It is the ports' [`Observer`]: every effect is
//! checked at the instant it happens, against the simulation's ground truth:
//! ACTIVE and the inhibitions as the store holds them (the store reports
//! each write, whoever made it: an operator or a worker's upgrade), and what
//! operators made true (intent, deploys, foreign releases).
//!
//! The budget rule (S6) is checked against an independent model of the
//! delay ladder, never against the engine's own budget.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use madsim::task::NodeId;
use stead::core::fleet::{add, Instance, InstanceState, TaskKind, TaskState};
use stead::core::memory::RecoveryMemory;
use stead::core::names;
use stead::core::plan::ControlConfig;
use stead::core::policy::RecoveryPolicy;
use stead::core::types::{
    Binds, ContainerId, ContainerStatus, Health, InstanceName, ServiceKey, ServiceName, Timestamp,
};
use stead::engine::lease::ProcessIdentity;
use stead::engine::tick::Check;
use stead::ports::{Clock, Route};
use stead_testkit::ports::MemoryProvisioner;
use stead_testkit::ports::{Effect, Observer, Op};
use stead_testkit::store::MemoryStore;

use crate::topology::Role;
use crate::world::VersionScheme;
use stead::core::catalog::Catalog;

/// Effects kept for the failure trace (override: `STEAD_SIM_TRACE`).
const TRACE_LEN_DEFAULT: usize = 40;

/// How far a process's anchored clock may be from the database's: the
/// tolerance, stated once, of every exact timing check. A clock anchored
/// over a round trip is off by at most half of it; the simulated store
/// answers at once, so a second is generous.
pub const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// How late after its bake window a revert may still come: the pass that
/// decides it began before the window ended (one tick).
const REVERT_SLACK: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

fn trace_len_max() -> usize {
    std::env::var("STEAD_SIM_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TRACE_LEN_DEFAULT)
}

/// The ground truth the checks compare against. The recovery pass never
/// changes it; workers change ACTIVE and markers only through the store.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    /// ACTIVE: service → container.
    pub active: BTreeMap<ServiceKey, ContainerId>,
    pub stopped: BTreeSet<InstanceName>,
    /// Generations under a durable hold.
    pub inhibited: BTreeSet<ContainerId>,
    /// Retirement-pending containers → their service.
    pub markers: BTreeMap<ContainerId, ServiceKey>,
    /// Successors a revert took a service away from → until when they are
    /// kept, stopped, as the evidence of what failed (#55).
    pub kept: BTreeMap<ContainerId, Timestamp>,
    /// Containers the operators created (deploys); never the engine.
    pub operator_created: BTreeSet<ContainerId>,
    /// Candidates a worker created for an upgrade or a reprovision: a
    /// failed upgrade may remove one that never became ACTIVE.
    pub worker_created: BTreeSet<ContainerId>,
    /// Service types whose rollout is halted, and since when.
    pub halted_since: BTreeMap<String, Timestamp>,
    /// Instances in `deleting` or `deleted`: a deprovision may remove their
    /// containers and uninstall their release.
    pub deleting: BTreeSet<InstanceName>,
    /// Releases some other tool installed; never ours to delete (S8).
    pub foreign_releases: BTreeSet<String>,
    /// Generations of services the catalog dropped, held while an upgrade
    /// retires them: the upgrade may stop and remove them.
    pub dropping: BTreeSet<ContainerId>,
    /// The service of every container ever created.
    pub service_of: BTreeMap<ContainerId, ServiceKey>,
    /// Services whose spec publishes no port (a worker, a database reached
    /// on the instance network): verified, never routed.
    pub portless: BTreeSet<ServiceName>,
    /// Services replaced `stop-first` (#40): never two of their
    /// containers up at once (V1).
    pub stop_first: BTreeSet<ServiceName>,
    /// An operator's `rollout undo --to` (#40): the version the Docker
    /// type is pinned to, and the instances a task already held when it
    /// was pinned (their task read the rollout before the pin: it may
    /// finish what it began). Lifted by a resume.
    pub pin: Option<Pin>,
    /// The last pin lifted, and when: a worker's move toward it that read
    /// the rollout before the lift may finish what it began, for as long
    /// as its task lease lasts.
    pub lifted_pin: Option<(Pin, Timestamp)>,
}

/// An undo's pin as the checker knows it.
#[derive(Clone, Debug)]
pub struct Pin {
    pub version: String,
    /// Instances a task held across the pin.
    pub began: BTreeSet<InstanceName>,
    /// The services the pinned version lists: moving back to it retires
    /// the others, as a catalog that dropped them does.
    pub services: BTreeSet<ServiceName>,
}

impl Truth {
    /// Whether the version the type runs now (the pin's, else the
    /// catalog's) leaves `service` out.
    fn pin_leaves_out(&self, service: &ServiceName) -> bool {
        self.pin
            .as_ref()
            .is_some_and(|p| !p.services.contains(service))
    }
    /// Whether `id`, ACTIVE for `key`, is meant to run: its instance is
    /// neither stopped nor being deleted, and no durable hold is on it.
    pub fn meant_to_run(&self, key: &ServiceKey, id: &ContainerId) -> bool {
        !self.stopped.contains(&key.instance)
            && !self.deleting.contains(&key.instance)
            && !self.inhibited.contains(id)
    }
}

#[derive(Debug, Default)]
struct Streak {
    interventions: Vec<Timestamp>,
    /// Since when the container has been up without a crash.
    up_since: Option<Timestamp>,
    /// It once stayed up a whole stable window since the last intervention.
    reset_earned: bool,
}

/// What a process's tick did, as the checker judges it.
pub struct Ticked<'a> {
    pub leader: bool,
    /// Its reading of the database's clock was one nothing vouched for: it
    /// expired and requeued nothing (#41).
    pub clock_unverified: bool,
    /// When the tick began (true time).
    pub began: Timestamp,
    pub failed: &'a [Check],
    /// The instances its recovery pass drove.
    pub recovered: &'a BTreeSet<InstanceName>,
    /// The recovery's memory after the tick.
    pub memory: &'a RecoveryMemory,
}

/// Who made an effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actor {
    /// The workload model or the operators.
    World,
    /// A process's recovery pass.
    Recovery,
    /// A process's task worker.
    Worker,
    /// A process, but under no lock of its own (T3 reports it).
    Unknown,
}

/// One running stead process, as the checker knows it.
#[derive(Clone, Debug)]
struct Process {
    /// `<identity>#<incarnation>`: lease holder, prefix of its actors.
    holder: String,
    identity: String,
    role: Role,
    /// Its first tick is due to find it leader (L7): its identity held the
    /// lease when it started.
    leader_expected: bool,
    ticked: bool,
}

#[derive(Debug, Default)]
struct State {
    truth: Truth,
    /// When each process's node made its latest effect: a process frozen
    /// between two of its writes (a VM pause) makes the second one late.
    last_effect_of: BTreeMap<NodeId, Timestamp>,
    /// How long each node's host stood suspended in all: its anchored
    /// clock lags by up to that much until it reads the database's again
    /// (#41), so what it stamps (a task's end) may be that much early.
    stood_still: BTreeMap<NodeId, jiff::SignedDuration>,
    probe_passed: BTreeSet<(ContainerId, Option<Timestamp>)>,
    /// Binds some execution of a container answered readiness on.
    ready_binds: BTreeSet<(ContainerId, Binds)>,
    /// Services whose last withdrawal failed, by the process that tried:
    /// its memory holds the pending withdrawal (R6); another process's
    /// verified publication is not blocked by it.
    withdraw_failed: BTreeSet<(ServiceKey, String)>,
    routes: BTreeMap<ServiceKey, Route>,
    /// Containers up now, as the runtime's effects and the world's crashes
    /// and native restarts tell (V1).
    up: BTreeSet<ContainerId>,
    /// Crash-loop budget model per generation and per acting process: each
    /// process (incarnation) has its own budget in memory (R10, R17).
    streaks: BTreeMap<(ContainerId, String), Streak>,
    processes: BTreeMap<NodeId, Process>,
    /// Container → the service it was created for (T6: names injective).
    created_for: BTreeMap<ContainerId, ServiceKey>,
    /// Route id → the service it routes.
    route_ids: BTreeMap<String, ServiceKey>,
    /// Public host name → the instance first served under it, until that
    /// instance is deleted (N1, #54).
    host_servers: BTreeMap<String, InstanceName>,
    /// The state an instance was in when a worker took its lock: a handler
    /// that found it deleting must not build anything for it (T4).
    state_when_locked: BTreeMap<(InstanceName, String), InstanceState>,
    /// When a holder other than the recovery pass last released each
    /// instance's lock.
    released_by_others: BTreeMap<InstanceName, Timestamp>,
    /// The store is down on purpose: a failed lease take-over is no news.
    store_outage: bool,
    /// How far the database's clock is stepped now, in milliseconds (#41).
    database_offset_ms: i64,
    /// When the database's clock last stepped back to true time.
    database_settled_at: Option<Timestamp>,
    /// When the step in force now began.
    database_stepped_at: Option<Timestamp>,
    /// When each process's tick in progress (or last) began.
    tick_began: BTreeMap<NodeId, Timestamp>,
    /// An instance row does not decode now (the world garbled it).
    rows_garbled: bool,
    /// When the last garbled row was mended.
    rows_mended_at: Option<Timestamp>,
    /// The orphan gauge as the last leader's tick that ran drift left it
    /// (`None`: never set).
    orphans_reported: Option<Option<f64>>,
    /// When each instance last changed state.
    state_changed_at: BTreeMap<InstanceName, Timestamp>,
    /// The catalog's version of the fleet's type, and when it last changed.
    catalog_version: u32,
    /// The service the catalog's current version no longer lists.
    catalog_dropped: Option<stead::core::types::ServiceName>,
    /// Each catalog version published, with the service it no longer
    /// lists (D1).
    dropped_by_version: BTreeMap<u32, Option<stead::core::types::ServiceName>>,
    catalog_changed_at: Option<Timestamp>,
    /// Whether the catalog's current version is a security release (C8:
    /// its upgrades wait for no window).
    catalog_security: bool,
    /// Each catalog type's spec digest: an instance at the catalog's
    /// version that records another is behind (C8).
    catalog_digests: BTreeMap<String, String>,
    /// When each release was last installed or uninstalled.
    release_changed_at: BTreeMap<String, Timestamp>,
    /// When any release last appeared or went (ours, by hand, foreign).
    releases_moved_at: Option<Timestamp>,
    /// When each release was missing: since when (by hand or by a
    /// deprovision) and, once installed again, until when (C5). Every
    /// interval is kept: the queue is looked at after the fact.
    release_missing: BTreeMap<String, Vec<(Timestamp, Option<Timestamp>)>>,
    /// Per release, when one of its containers was removed by hand and,
    /// once created again, until when (#40: drift reprovisions that too).
    container_missing: BTreeMap<String, Vec<(ContainerId, Timestamp, Option<Timestamp>)>>,
    /// When the rollout switch last moved.
    rollout_changed_at: Option<Timestamp>,
    /// When ACTIVE stopped naming a container (a switch, a removal), for
    /// R16: a pass may remember what ACTIVE named while it ran.
    active_until: BTreeMap<ContainerId, Timestamp>,
    /// When each container's `retirement-pending` marker was cleared: R16
    /// lets a pass remember a marked generation (#40) until then.
    marker_cleared_at: BTreeMap<ContainerId, Timestamp>,
    /// The simulated second of the last effect, and how many effects
    /// happened within it (a livelock guard, L0).
    effects_at: (i64, u64),
    /// When ACTIVE last came to name each service's container.
    active_since: BTreeMap<ServiceKey, Timestamp>,
    /// Containers made unhealthy on purpose in the calm after the run:
    /// their restart for health is judged exactly (L11).
    health_watched: BTreeSet<ContainerId>,
    /// When each process's last tick ended: its next tick's snapshot is
    /// younger.
    tick_ended: BTreeMap<NodeId, Timestamp>,
    /// Per process: the deleted or gone instances its memory named after
    /// its last leader's tick (R16).
    gone_remembered: BTreeMap<String, BTreeSet<InstanceName>>,
    /// Consecutive unhealthy health reads of a container by one process
    /// incarnation since its last other answer or intervention (R12).
    unhealthy_reads: BTreeMap<(ContainerId, String), u32>,
    /// Starts a recovery pass asked for and the runtime refused, by
    /// process incarnation, until the pass's next call on the container
    /// shows which way R11 went.
    refused_starts: BTreeMap<(ContainerId, String), StartFollowUp>,
    /// What each process incarnation's last inspection of a container
    /// found (`None`: not found), for S5's final inspection.
    last_inspected: BTreeMap<(ContainerId, String), Option<(ContainerStatus, Option<Timestamp>)>>,
    ticks: u64,
    violations: Vec<String>,
    checks: BTreeMap<&'static str, u64>,
    trace: VecDeque<String>,
    trace_hash: u64,
    effects: u64,
    tasks_seen: BTreeSet<i64>,
    /// Each queued task's `run_after` at the last look: a retry moves it.
    run_after_seen: BTreeMap<i64, Timestamp>,
}

/// Where a recovery pass stands after the runtime refused its start of a
/// container (R11): the inspection that follows tells whether the
/// runtime's own restart got there first. If it did, nothing is charged
/// and the new execution is verified like a started one, its health read
/// first; if not, the failed start is charged and the service's pass ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartFollowUp {
    /// Refused; the inspection is next.
    Refused,
    /// The inspection was asked; no answer seen yet (an error answer
    /// leaves it here: the start then counts as failed).
    Inspecting,
    /// Found running or coming up: the runtime won the race.
    FoundUp,
    /// Found down or gone: the start failed.
    FoundDown,
}

/// The checker's own reading of the statuses in which the runtime's
/// restart is under way or done (R11's "Docker's own restart won").
fn up_or_coming_up(status: ContainerStatus) -> bool {
    matches!(
        status,
        ContainerStatus::Running | ContainerStatus::Restarting | ContainerStatus::Starting
    )
}

/// Checks S1–S8 on every effect; collects violations rather than panicking
/// so the runner can print the seed, the invariant and the trace.
pub struct Checker {
    clock: Arc<dyn Clock>,
    policy: RecoveryPolicy,
    /// The task lease workers hold (C6).
    task_lease: Duration,
    /// How long after a step of the database's clock grants may be off
    /// by it: the longest lease (task or reconciler) and a tick.
    database_settles: Duration,
    /// C8: upgrades queued or running across the fleet, at most.
    max_in_flight: usize,
    /// C8: the team whose instances upgrade first.
    own_team: String,
    /// How the seed spells versions: the counter behind each is the truth.
    versions: VersionScheme,
    state: Mutex<State>,
    /// The database: leases, instance locks and tasks as they stand.
    store: OnceLock<Arc<MemoryStore>>,
    provisioner: OnceLock<Arc<MemoryProvisioner>>,
    /// The engine's gauges, as an operator's dashboard shows them.
    gauges: OnceLock<stead_testkit::metrics::Tally>,
    /// The recovery interventions the event log must record (E1, #42).
    pub events: crate::events::EventLedger,
}

impl Checker {
    pub fn new(
        clock: Arc<dyn Clock>,
        policy: RecoveryPolicy,
        control: &ControlConfig,
        versions: VersionScheme,
    ) -> Self {
        let reconciler_lease = stead::core::policy::reconciler_lease_ttl(
            control.tick_interval,
            policy.instance_deadline,
        );
        let database_settles = control.lease.max(reconciler_lease) + control.tick_interval;
        Self {
            versions,
            clock,
            policy,
            task_lease: control.lease,
            database_settles,
            max_in_flight: control.max_in_flight as usize,
            own_team: control.own_team.clone(),
            state: Mutex::new(State {
                catalog_version: 1,
                catalog_dropped: None,
                ..State::default()
            }),
            store: OnceLock::new(),
            provisioner: OnceLock::new(),
            gauges: OnceLock::new(),
            events: Default::default(),
        }
    }

    /// The releases that exist, for C8's model of which instances may be
    /// upgraded (drift repairs a missing one first).
    pub fn watch_provisioner(&self, provisioner: Arc<MemoryProvisioner>) {
        let _ = self.provisioner.set(provisioner);
    }

    /// The catalog the run starts with.
    pub fn catalog_published(&self, catalog: &Catalog) {
        let mut s = self.lock();
        Self::learn_catalog(&mut s, catalog);
    }

    fn learn_catalog(s: &mut State, catalog: &Catalog) {
        s.catalog_security = catalog.entries().any(|e| e.security);
        s.catalog_digests = catalog
            .entries()
            .map(|e| (e.service_type.clone(), e.spec_digest.clone()))
            .collect();
    }

    /// Operators published catalog `version` of the fleet's types (a new
    /// version or a new spec at the same one); `dropped` is the service it
    /// no longer lists.
    pub fn catalog_bumped(
        &self,
        version: u32,
        dropped: Option<stead::core::types::ServiceName>,
        catalog: &Catalog,
    ) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.catalog_version = version;
        Self::learn_catalog(&mut s, catalog);
        s.catalog_changed_at = Some(now);
        s.dropped_by_version.insert(version, dropped.clone());
        s.catalog_dropped = dropped;
    }

    /// Another tool installed release `name`: never ours to delete (S8).
    pub fn foreign_release_appeared(&self, name: &str) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.truth.foreign_releases.insert(name.to_owned());
        s.releases_moved_at = Some(now);
    }

    /// The engine's gauges: the orphan count drift reports (C5).
    pub fn watch_gauges(&self, tally: stead_testkit::metrics::Tally) {
        let _ = self.gauges.set(tally);
    }

    pub fn watch_store(&self, store: Arc<MemoryStore>) {
        let _ = self.store.set(store);
    }

    fn store(&self) -> &MemoryStore {
        self.store.get().expect("the checker watches the store")
    }

    /// The execution of `successor` that serves `service` now, if any: the
    /// one the proxy routes to it, or, for a service without ports (never
    /// routed), the one ACTIVE durably records as verified.
    fn serving_execution(
        &self,
        s: &State,
        service: &ServiceKey,
        successor: &ContainerId,
    ) -> Option<Option<Timestamp>> {
        if s.truth.portless.contains(&service.service) {
            let recorded = self.store().active_now(service)?;
            (&recorded.container == successor && recorded.verified_started_at.is_some())
                .then_some(recorded.verified_started_at)
        } else {
            let route = s.routes.get(service)?;
            (&route.container == successor).then_some(route.verified_started_at)
        }
    }

    /// A process (re)started on `node`. If its identity holds the
    /// reconciler lease, its first tick must find it leader (L7, T1).
    pub fn process_started(&self, node: NodeId, identity: &ProcessIdentity, role: Role) {
        let held = self
            .store
            .get()
            .and_then(|s| s.lease_now())
            .filter(|g| g.expires_at > self.clock.now())
            // Its own earlier incarnation at its site, which it takes the
            // lease back from at once; a twin's (another site) it waits out.
            .is_some_and(|g| {
                stead::core::succession::succession(&g.holder, &identity.holder())
                    == stead::core::succession::Succession::Predecessor
            });
        self.events.started(node, &identity.holder());
        self.lock().processes.insert(
            node,
            Process {
                holder: identity.holder(),
                identity: identity.identity.clone(),
                role,
                leader_expected: role.reconciles() && held,
                ticked: false,
            },
        );
    }

    /// A process finished a tick that began at `began` (true time), as
    /// leader or not, with these checks failed. A leader's successful TTL
    /// and lease-expiry checks are held to the rule exactly: whatever was
    /// due when the tick began is done by its end (C6, C7); and its
    /// recovery's memory is held to R16.
    pub fn ticked(&self, node: NodeId, holder: &str, tick: Ticked<'_>) {
        let Ticked {
            leader,
            clock_unverified,
            began,
            failed,
            ..
        } = tick;
        let garbled = {
            let mut s = self.lock();
            let since = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
            let garbled = s.rows_garbled || s.rows_mended_at.is_some_and(|at| at >= since);
            if garbled {
                // R16's "two passes in a row" starts over after it.
                s.gone_remembered.remove(holder);
            }
            garbled
        };
        // Judged in every leader's tick, a garbled row's included: a
        // release whose instance row does not decode is no orphan. Not in
        // a tick whose clock reading nothing vouched for: while a step of
        // the database's clock is in doubt, the leader renews its lease
        // and runs no check at all (seed 445: a foreign release appeared
        // before such a tick, which reported nothing new).
        if leader && !clock_unverified && !failed.contains(&Check::Drift) {
            self.check_orphans_reported(began, garbled);
        }
        if leader {
            self.check_stepped_tick_noticed(node, began, clock_unverified);
        }
        if leader && !garbled && !clock_unverified {
            self.check_due_work_done(began, failed);
            if !failed.contains(&Check::VersionDrift) {
                self.check_rollout(began);
                self.check_unknown_types_reported(began);
                // A failed drift check may mean the releases could not be
                // listed: the planner then upgrades without knowing them.
                if !failed.contains(&Check::Drift) {
                    self.check_upgrades_have_releases(began);
                }
            }
            if !failed.contains(&Check::Recovery) {
                self.check_memory_pruned(holder, &tick);
            }
        }
        self.check_helm_releases();
        let now = self.clock.now();
        let mut s = self.lock();
        s.ticks += 1;
        s.tick_ended.insert(node, now);
        let outage = s.store_outage;
        let Some(p) = s.processes.get_mut(&node) else {
            return;
        };
        if p.holder != holder || p.ticked {
            return;
        }
        p.ticked = true;
        let expected = p.leader_expected && !outage;
        let identity = p.identity.clone();
        s.check(
            "L7 a restarted daemon reconciles at once",
            !expected || leader,
            || format!("{holder} restarted holding its identity's lease but its first tick was not a leader's ({identity})"),
        );
    }

    /// R16 exactly, after a leader's tick whose recovery pass listed the
    /// fleet: the memory names only generations ACTIVE named at some
    /// moment of the tick for the instances the pass drove (each pruned
    /// against the ACTIVE it loaded under its lock), and nothing of an
    /// instance that was deleted, or gone from the store, before the tick
    /// began (the pass forgets those). A memory that is never pruned is a
    /// leak no other invariant sees.
    fn check_memory_pruned(&self, holder: &str, tick: &Ticked<'_>) {
        let since = tick.began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let instances: BTreeMap<InstanceName, Instance> = self
            .store()
            .all_instances()
            .into_iter()
            .map(|i| (i.name.clone(), i))
            .collect();
        let mut s = self.lock();
        for key in tick.memory.generation_keys() {
            if !tick.recovered.contains(&key.instance) {
                continue;
            }
            let service = ServiceKey {
                instance: key.instance.clone(),
                service: key.service.clone(),
            };
            let named_now = s.truth.active.get(&service) == Some(&key.container);
            let named_lately = s
                .active_until
                .get(&key.container)
                .is_some_and(|until| *until >= since);
            // A marked generation's history is kept (#40): a revert or a
            // retried upgrade may make it ACTIVE again, its budget going on.
            let marked = s
                .marker_cleared_at
                .get(&key.container)
                .is_some_and(|at| *at >= since)
                || self.store().inhibitions_now(&key.instance).iter().any(|m| {
                    m.container == key.container
                        && m.reason == stead::core::types::InhibitionReason::RetirementPending
                });
            s.check(
                "R16 memory pruned to ACTIVE's generations",
                named_now || named_lately || marked,
                || {
                    format!(
                        "{}/{} remembers {} after a pass drove it, though ACTIVE named it at no moment \
                         of the tick (began {since}) and no marker named it",
                        key.instance, key.service, key.container
                    )
                },
            );
        }
        // A drive that loaded the instance before its deletion (a targeted
        // pass of a process paused mid-drive) may write its memory back
        // after the tick's pass forgot it: the next pass forgets it again.
        // So only what two consecutive passes left behind is a leak.
        let mut gone_now = BTreeSet::new();
        for name in tick.memory.instance_names() {
            let gone = match instances.get(name) {
                None => true,
                Some(i) => i.state == InstanceState::Deleted,
            };
            let settled = s.state_changed_at.get(name).is_none_or(|at| *at < since);
            if gone && settled {
                gone_now.insert(name.clone());
            }
        }
        let before = s
            .gone_remembered
            .insert(holder.to_owned(), gone_now.clone())
            .unwrap_or_default();
        // Judged for every instance deleted before the tick (one the
        // memory never named passes), and any name the memory keeps that
        // the store has no row for.
        let deleted = instances
            .values()
            .filter(|i| i.state == InstanceState::Deleted)
            .map(|i| &i.name)
            .filter(|name| s.state_changed_at.get(*name).is_none_or(|at| *at < since));
        let judged: BTreeSet<InstanceName> = deleted.chain(&gone_now).cloned().collect();
        for name in judged {
            let kept = gone_now.contains(&name) && before.contains(&name);
            s.check(
                "R16 a deleted instance's memory is forgotten",
                !kept,
                || format!("{name}: remembered after two passes that listed it deleted or gone"),
            );
        }
    }

    /// H2: a ready instance of the Helm type records exactly the version
    /// its release runs. The worker upgrades the release through the
    /// provisioner before it records the version (a version drift that
    /// never reaches Helm records a version nothing runs), and a provision
    /// records the version it installed when the catalog moved between the
    /// instance's creation and its provisioning (seed 780 of 501-2500 found
    /// a worker with an older catalog installing it under a newer name).
    fn check_helm_releases(&self) {
        let Some(provisioner) = self.provisioner.get() else {
            return;
        };
        let versions = provisioner.release_versions();
        let store = self.store();
        // A task in flight (a reprovision of a ready instance between its
        // install and its record) may leave the release ahead for a while;
        // never behind, and never once it is done.
        let in_flight: BTreeSet<_> = store
            .all_tasks()
            .into_iter()
            .filter(|t| t.state.is_active())
            .map(|t| t.instance)
            .collect();
        let behind: Vec<String> = store
            .all_instances()
            .into_iter()
            .filter(|i| crate::world::is_helm_instance(i.name.as_str()))
            .filter(|i| i.state == InstanceState::Ready)
            .filter_map(|i| {
                let release = self.version_number(versions.get(i.name.as_str())?);
                let recorded = self.version_number(&i.version);
                let wrong =
                    release < recorded || (release != recorded && !in_flight.contains(&i.id));
                wrong.then(|| format!("{} at {} but its release at {release}", i.name, i.version))
            })
            .collect();
        let mut s = self.lock();
        s.check(
            "H2 a Helm instance's version is its release's",
            behind.is_empty(),
            || behind.join("; "),
        );
    }

    /// C7 and C6 exactly: an instance past its TTL when a leader's
    /// successful tick began is deleting by the tick's end (unless its state
    /// moved meanwhile, which makes the planner's compare-and-set miss it
    /// once); a task whose lease had run out is back in the queue.
    fn check_due_work_done(&self, began: Timestamp, failed: &[Check]) {
        let due = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let instances = (!failed.contains(&Check::Ttl)).then(|| self.store().all_instances());
        let tasks = (!failed.contains(&Check::LeaseExpiry)).then(|| self.store().all_tasks());
        let mut s = self.lock();
        for i in instances.unwrap_or_default() {
            let Some(expires_at) = i.expires_at else {
                continue;
            };
            let settled = s.state_changed_at.get(&i.name).is_none_or(|at| *at < began);
            let live = !matches!(i.state, InstanceState::Deleting | InstanceState::Deleted);
            let late = live && settled && expires_at <= due;
            s.check("C7 expired within one tick of its TTL", !late, || {
                format!(
                    "{} expired at {expires_at} but is still {} after a leader's tick began at {began}",
                    i.name, i.state
                )
            });
        }
        let lease = jiff::SignedDuration::try_from(self.task_lease).expect("fits");
        for t in tasks.unwrap_or_default() {
            let overdue =
                t.state == TaskState::Running && t.locked_at.is_some_and(|at| at + lease <= due);
            s.check("C6 lease broken within one tick of expiry", !overdue, || {
                format!(
                    "task {} still running on a lease taken at {:?} after a leader's tick began at {began}",
                    t.id, t.locked_at
                )
            });
        }
    }

    /// C8 exactly, after a leader's successful tick: the fleet-wide limit is
    /// never left unused while an instance that may be upgraded waits, and
    /// an upgrade enqueued this tick never jumps one that sorts before it
    /// (own team first, then type, name, id). "May be upgraded" is the
    /// checker's own model of the rule: ready, running intent, not expired,
    /// behind the catalog, no task of its own in flight, its release there,
    /// and the rollout not halted. Only instances, tasks, releases and the
    /// catalog that did not move since the tick began are judged: the
    /// planner saw a snapshot, not the end of its tick.
    fn check_rollout(&self, began: Timestamp) {
        let Some(provisioner) = self.provisioner.get() else {
            return;
        };
        let settled_before = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let instances = self.store().all_instances();
        let tasks = self.store().all_tasks();
        let releases: BTreeSet<String> = provisioner.release_names().into_iter().collect();
        let mut s = self.lock();
        let moved = |at: Option<&Timestamp>| at.is_some_and(|at| *at >= settled_before);
        if moved(s.catalog_changed_at.as_ref())
            || moved(s.rollout_changed_at.as_ref())
            || !s.truth.halted_since.is_empty()
        {
            return;
        }
        let in_flight = |id: i64| {
            tasks.iter().any(|t| {
                t.instance == id && matches!(t.state, TaskState::Queued | TaskState::Running)
            })
        };
        let touched = |id: i64| {
            tasks
                .iter()
                .any(|t| t.instance == id && t.updated_at >= settled_before)
        };
        let target = s.catalog_version;
        let target_version = self.versions.render(target);
        let digests = s.catalog_digests.clone();
        // The reference rule (C8): only a type the catalog lists has a
        // version to be behind; a numeric version is behind a greater one,
        // any other behind whatever differs; at the catalog's version, a
        // recorded spec digest other than the catalog's is behind too.
        let behind = |i: &Instance| {
            let Some(digest) = digests.get(&i.service_type) else {
                return false;
            };
            let version_behind = if self.versions.ordered() {
                self.versions.number(&i.version).is_some_and(|v| v < target)
            } else {
                i.version != target_version
            };
            let spec_behind =
                i.version == target_version && i.spec_digest.as_ref().is_some_and(|d| d != digest);
            version_behind || spec_behind
        };
        // C8: only while its window is open (or it has none, or the
        // release is a security one) is an instance's upgrade enqueued;
        // judged only well inside or outside a window, never at its edge.
        let security = s.catalog_security;
        let window_open = |i: &Instance| {
            security
                || i.maintenance_window.as_deref().is_none_or(|spec| {
                    stead::core::window::Window::parse(spec).is_ok_and(|w| {
                        let tolerance = jiff::SignedDuration::from_secs(60);
                        w.contains(began - tolerance) && w.contains(began + tolerance)
                    })
                })
        };
        // #55: a bake holds its instance's slot, and a type's wave has
        // room while it has fewer in flight than one more than its
        // instances done (at the catalog's version, in flight by no
        // reckoning). A bake counts wherever the planner may have seen it.
        let baking = self.store().baking_at(
            settled_before - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits"),
        );
        let flying = |i: &Instance| baking.contains(&i.id) || in_flight(i.id) || touched(i.id);
        let mut waves: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for i in &instances {
            let (done, up) = waves.entry(i.service_type.as_str()).or_default();
            if flying(i) {
                *up += 1;
            } else if i.state == InstanceState::Ready && !i.stopped && !behind(i) {
                *done += 1;
            }
        }
        let wave_has_room = |i: &Instance| {
            waves
                .get(i.service_type.as_str())
                .is_some_and(|(done, up)| *up < done + 1)
        };
        let waiting: Vec<_> = instances
            .iter()
            .filter(|i| {
                i.state == InstanceState::Ready
                    && !baking.contains(&i.id)
                    && wave_has_room(i)
                    && window_open(i)
                    && !i.stopped
                    && i.expires_at.is_none_or(|at| at > began)
                    && behind(i)
                    && !in_flight(i.id)
                    && !touched(i.id)
                    && i.updated_at < settled_before
                    && releases.contains(i.name.as_str())
                    && !moved(s.release_changed_at.get(i.name.as_str()))
            })
            .collect();
        // In flight as the planner may have seen it: one that ended during
        // the tick (done, failed, cancelled by a deletion) still counted.
        let upgrades = tasks
            .iter()
            .filter(|t| {
                t.kind == TaskKind::Upgrade
                    && (matches!(t.state, TaskState::Queued | TaskState::Running)
                        || t.updated_at >= settled_before)
            })
            .map(|t| t.instance)
            .chain(baking.iter().copied())
            .collect::<BTreeSet<_>>()
            .len();
        let own = self.own_team.as_str();
        let order = |i: &Instance| (i.team != own, i.service_type.clone(), i.name.clone(), i.id);
        let first = waiting.iter().map(|i| order(i)).min();
        s.check(
            "C8 max_in_flight not left unused while instances wait",
            upgrades >= self.max_in_flight || waiting.is_empty(),
            || {
                format!(
                    "{upgrades} of {} upgrades in flight after a tick began at {began} while {:?} waited",
                    self.max_in_flight,
                    waiting.iter().map(|i| i.name.to_string()).collect::<Vec<_>>()
                )
            },
        );
        for t in tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Upgrade && t.created_at >= settled_before)
        {
            let Some(chosen) = instances.iter().find(|i| i.id == t.instance) else {
                continue;
            };
            // Only an instance behind the catalog is upgraded (the sim's
            // catalog changes a spec only with its version).
            let settled = chosen.updated_at < settled_before;
            s.check(
                "C8 upgrades only what is behind the catalog",
                !settled || behind(chosen),
                || {
                    format!(
                        "upgrade {} of {} enqueued though it runs {}, the catalog's {target}",
                        t.id, chosen.name, chosen.version
                    )
                },
            );
            // Its reason says which drift it is, for the operator who reads
            // the queue.
            let why = if chosen.version == target_version {
                "spec drift"
            } else {
                "version drift"
            };
            s.check(
                "C8 an upgrade's reason names its drift",
                !settled || t.reason.starts_with(why),
                || {
                    format!(
                        "upgrade {} of {} at {} (catalog {target_version}) says {:?}",
                        t.id, chosen.name, chosen.version, t.reason
                    )
                },
            );
            // A baking instance moves on in the slot its bake holds (#55).
            let own_slot = baking.contains(&chosen.id);
            let jumped = !own_slot && first.as_ref().is_some_and(|f| *f < order(chosen));
            s.check("C8 upgrades in order, own team first", !jumped, || {
                format!(
                    "upgrade {} of {} (team {}) enqueued while {:?} waited ahead of it",
                    t.id, chosen.name, chosen.team, first
                )
            });
        }
    }

    /// C5 before C8: an upgrade enqueued in a leader's tick that listed the
    /// releases was planned for an instance whose release existed. One
    /// missing all through the tick is drift's to reprovision first; an
    /// upgrade racing the reprovision helps nobody.
    fn check_upgrades_have_releases(&self, began: Timestamp) {
        let settled_before = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let names: BTreeMap<i64, InstanceName> = self
            .store()
            .all_instances()
            .into_iter()
            .map(|i| (i.id, i.name))
            .collect();
        let tasks = self.store().all_tasks();
        let mut s = self.lock();
        for t in tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Upgrade && t.created_at >= settled_before)
        {
            let Some(name) = names.get(&t.instance) else {
                continue;
            };
            let missing_throughout = s.release_missing.get(name.as_str()).is_some_and(|spans| {
                spans.iter().any(|(from, until)| {
                    *from <= settled_before
                        && until.is_none_or(|u| u >= add(t.created_at, CLOCK_TOLERANCE))
                })
            });
            s.check(
                "C5 no upgrade while the release is missing",
                !missing_throughout,
                || {
                    format!(
                        "upgrade {} of {name} enqueued at {} while its release was missing",
                        t.id, t.created_at
                    )
                },
            );
        }
    }

    /// C5's other half, exactly: after a leader's tick whose drift check
    /// succeeded, the orphan releases it reports (the `stead_orphan_releases`
    /// gauge an operator watches) are exactly the live releases no
    /// undeleted instance names, judged when no instance and no release
    /// moved since the tick began (the planner saw a snapshot).
    ///
    /// In a tick that met an instance row that does not decode, drift may
    /// withhold its judgement (the gauge then keeps its value from the
    /// leader's tick before); it must never count the hidden instance's
    /// release as an orphan.
    fn check_orphans_reported(&self, began: Timestamp, garbled: bool) {
        let (Some(provisioner), Some(gauges)) = (self.provisioner.get(), self.gauges.get()) else {
            return;
        };
        let settled_before = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let instances = self.store().all_instances();
        let releases = provisioner.release_names();
        // Unset after a leader's tick that ran drift only if drift has
        // withheld its judgement ever since the daemon started.
        let gauge = gauges.gauge("stead_orphan_releases");
        let reported = gauge.unwrap_or(0.0);
        let mut s = self.lock();
        let moved = instances.iter().any(|i| i.updated_at >= settled_before)
            || s.releases_moved_at.is_some_and(|at| at >= settled_before);
        let before = s.orphans_reported.replace(gauge);
        drop(s);
        if moved {
            return;
        }
        let named: BTreeSet<&str> = instances
            .iter()
            .filter(|i| i.state != InstanceState::Deleted)
            .map(|i| i.name.as_str())
            .collect();
        let orphans: Vec<&String> = releases
            .iter()
            .filter(|r| !named.contains(r.as_str()))
            .collect();
        let exact = reported == orphans.len() as f64;
        let withheld = garbled && before.is_none_or(|b| b == gauge);
        let mut s = self.lock();
        s.check(
            "C5 orphan releases reported exactly",
            exact || withheld,
            || format!("drift reported {reported} orphan releases (before: {before:?}) after a tick began at {began}; the orphans are {orphans:?}"),
        );
    }

    /// C8's report, exactly: after a leader's tick whose version-drift
    /// check succeeded, the instances it reports of a type the catalog
    /// does not list (the `stead_unknown_type_instances` gauge) are exactly
    /// the ready ones, judged when no instance moved since the tick began.
    fn check_unknown_types_reported(&self, began: Timestamp) {
        let Some(gauges) = self.gauges.get() else {
            return;
        };
        let settled_before = began - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
        let instances = self.store().all_instances();
        if instances.iter().any(|i| i.updated_at >= settled_before) {
            return;
        }
        let Some(reported) = gauges.gauge("stead_unknown_type_instances") else {
            return;
        };
        let mut s = self.lock();
        let unknown: Vec<&str> = instances
            .iter()
            .filter(|i| {
                i.state == InstanceState::Ready && !s.catalog_digests.contains_key(&i.service_type)
            })
            .map(|i| i.name.as_str())
            .collect();
        s.check(
            "C8 unknown service types reported exactly",
            reported == unknown.len() as f64,
            || format!("version drift reported {reported} instances of unknown types after a tick began at {began}; they are {unknown:?}"),
        );
    }

    /// When the catalog last changed (a bump restarts every process, but
    /// a tick racing the restart may still plan with the old file).
    pub fn catalog_changed_at(&self) -> Option<Timestamp> {
        self.lock().catalog_changed_at
    }

    /// The world garbled an instance row (`true`) or mended it: while one
    /// does not decode, the planners and the pass do not see that
    /// instance, so the exact checks of what a tick must have done are not
    /// judged for a tick that met one. T3 still is: a pass that takes a
    /// live instance it could not read for a gone one, and withdraws its
    /// routes, acts without that instance's lock.
    pub fn set_rows_garbled(&self, garbled: bool) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.rows_garbled = garbled;
        if !garbled {
            s.rows_mended_at = Some(now);
        }
    }

    pub fn set_store_outage(&self, outage: bool) {
        self.lock().store_outage = outage;
    }

    /// The database's clock stepped to `offset_ms` from true time (0:
    /// back to it).
    pub fn database_clock_stepped(&self, offset_ms: i64) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.database_offset_ms = offset_ms;
        if offset_ms == 0 {
            s.database_settled_at = Some(now);
            s.database_stepped_at = None;
        } else {
            s.database_stepped_at = Some(now);
        }
    }

    /// J1 (#41), its premise: a leader's tick that began while the
    /// database's clock was stepped, the step lasting still as it ends,
    /// read the stepped clock, and must say its reading was unverified
    /// (the rest of J1 holds its decisions to that).
    fn check_stepped_tick_noticed(&self, node: NodeId, began: Timestamp, unverified: bool) {
        let mut s = self.lock();
        if s.store_outage {
            return;
        }
        let Some(stepped) = s.database_stepped_at else {
            return;
        };
        if stepped > began {
            return;
        }
        let offset = s.database_offset_ms;
        s.check(
            "J1 nothing expired or requeued on a stepped database clock",
            unverified,
            || format!("{node:?}'s tick from {began} read the database's clock stepped by {offset} ms and took it as verified"),
        );
    }

    /// A process's reconciler began a tick at `began` (true time).
    pub fn tick_began(&self, node: NodeId, began: Timestamp) {
        self.lock().tick_began.insert(node, began);
    }

    /// J1 (#41): a tick whose reading of the database's clock found it
    /// stepped (the step began before the tick and lasts still) breaks no
    /// one's claim by time: it expires no TTL and requeues no task.
    fn check_not_decided_on_a_step(s: &mut State, node: NodeId, what: &str) {
        let began = s.tick_began.get(&node).copied();
        let stepped = s
            .database_stepped_at
            .zip(began)
            .is_some_and(|(stepped, began)| stepped <= began);
        let offset = s.database_offset_ms;
        s.check(
            "J1 nothing expired or requeued on a stepped database clock",
            !stepped,
            || format!("{what} in a tick that began at {began:?}, the database's clock stepped by {offset} ms since before it"),
        );
    }

    /// Whether a lease or lock written by the database's clock may be off
    /// by a step now: while one lasts, and for the longest lease after
    /// (a grant renewed while the clock stood back is short by the step).
    /// Meanwhile T2 and T3 are judged on the holder alone: whether the
    /// process acting is the one the database names, not when the grant
    /// ends by a clock that stepped. (The rules that break another's
    /// claim by time, C6, C7 and takeovers, are judged by true time.)
    fn database_clock_unsettled(&self, s: &State, now: Timestamp) -> bool {
        s.database_offset_ms != 0
            || s.database_settled_at
                .is_some_and(|at| now < add(at, self.database_settles))
    }

    /// Operators change the truth through this, under the instance lock.
    pub fn truth<R>(&self, f: impl FnOnce(&mut Truth) -> R) -> R {
        f(&mut self.lock().truth)
    }

    /// A judgement made away from the effects (the tenants' N2 and N3, a
    /// start's N4): counted under `invariant`, a violation unless `ok`.
    pub fn judge(&self, invariant: &'static str, ok: bool, detail: impl FnOnce() -> String) {
        self.lock().check(invariant, ok, detail);
    }

    /// Counts a case an invariant is about, so a run shows it happens.
    pub fn count_case(&self, case: &'static str) {
        *self.lock().checks.entry(case).or_default() += 1;
    }

    pub fn truth_snapshot(&self) -> Truth {
        self.lock().truth.clone()
    }

    /// Whether a holder other than the recovery pass (a worker, an
    /// operator's command) held the instance's lock at any moment since
    /// `since`: the pass skips a busy instance (R3), so what it has to
    /// restore there waits until the lock is free.
    pub fn locked_by_others_since(&self, instance: &InstanceName, since: Timestamp) -> bool {
        let s = self.lock();
        s.state_when_locked
            .keys()
            .any(|(locked, holder)| locked == instance && !is_recovery(holder))
            || s.released_by_others
                .get(instance)
                .is_some_and(|at| *at >= since)
    }

    /// When ACTIVE came to name the container it names for `key` now.
    pub fn active_since(&self, key: &ServiceKey) -> Option<Timestamp> {
        self.lock().active_since.get(key).copied()
    }

    /// `node`'s host stood suspended for `d` (its monotonic clock missed it).
    pub fn suspended(&self, node: NodeId, d: jiff::SignedDuration) {
        *self.lock().stood_still.entry(node).or_default() += d;
    }

    /// An operator ran `helm uninstall` by hand: the release is missing
    /// from now until something installs it again.
    pub fn release_removed_by_hand(&self, release: &str, now: Timestamp) {
        self.lock().release_went_missing(release, now);
    }

    /// C5 exactly: a reprovision is enqueued only for an instance whose
    /// release was missing when the tick that planned it read the
    /// releases (a drift that cannot find releases that exist would
    /// reprovision every tick).
    pub fn check_reprovision(&self, release: &str, created_at: Timestamp, tick: Duration) {
        let mut s = self.lock();
        let listed_after =
            created_at - jiff::SignedDuration::try_from(tick + CLOCK_TOLERANCE).expect("fits");
        let missing = s.release_missing.get(release).is_some_and(|intervals| {
            intervals.iter().any(|(from, until)| {
                *from <= add(created_at, CLOCK_TOLERANCE) && until.is_none_or(|u| u >= listed_after)
            })
        });
        // A container removed by hand is known to drift from the pass
        // before the planning tick: up to two ticks late.
        let seen_after =
            created_at - jiff::SignedDuration::try_from(tick * 2 + CLOCK_TOLERANCE).expect("fits");
        let lost = s.container_missing.get(release).is_some_and(|intervals| {
            intervals.iter().any(|(_, from, until)| {
                *from <= add(created_at, CLOCK_TOLERANCE) && until.is_none_or(|u| u >= seen_after)
            })
        });
        let missing = missing || lost;
        s.check("C5 reprovision only a missing release", missing, || {
            format!("reprovision of {release} enqueued at {created_at} while its release existed")
        });
    }

    /// An operator removed `id`, a container of `release`, by hand: drift
    /// may reprovision the release until it is created again (#40).
    pub fn container_removed_by_hand(&self, release: &str, id: &ContainerId) {
        let now = self.clock.now();
        self.events.removed(id, now);
        let mut s = self.lock();
        s.up.remove(id);
        s.container_missing
            .entry(release.to_owned())
            .or_default()
            .push((id.clone(), now, None));
    }

    /// A start of `id` was answered not-found though the container is there
    /// (an injected fault): the pass reports it gone (R11), and drift may
    /// reprovision its release once for it (#40).
    pub fn container_reported_gone(&self, id: &ContainerId) {
        let Some(release) = id.as_str().split('.').nth(1) else {
            return;
        };
        let now = self.clock.now();
        self.lock()
            .container_missing
            .entry(release.to_owned())
            .or_default()
            .push((id.clone(), now, Some(now)));
    }

    /// The engine was told a container is gone (R7): it forgets the
    /// generation's budget, so the model does too.
    pub fn generation_forgotten(&self, id: &ContainerId) {
        self.lock().streaks.retain(|(c, _), _| c != id);
    }

    /// Stopped intent forgets the instance's memory (R4).
    pub fn instance_stopped(&self, instance: &InstanceName) {
        let mut s = self.lock();
        let ids: Vec<ContainerId> = s
            .truth
            .active
            .iter()
            .filter(|(key, _)| &key.instance == instance)
            .map(|(_, id)| id.clone())
            .collect();
        s.streaks.retain(|(c, _), _| !ids.contains(c));
    }

    /// The workload model reports a container going down (crash).
    /// Whether an instance of `service_type` has a baking marker (#40).
    fn bakes_in_type(&self, service_type: &str, now: Timestamp) -> bool {
        self.store()
            .all_instances()
            .into_iter()
            .filter(|i| i.service_type == service_type)
            .any(|i| {
                self.store()
                    .inhibitions_now(&i.name)
                    .iter()
                    .any(|m| m.bakes_at(now - REVERT_SLACK).is_some())
            })
    }

    /// #40, at a write of ACTIVE by the recovery pass that names a
    /// predecessor whose marker carries the way back (a revert): it
    /// happens inside the bake window (B1: after it, the predecessor may
    /// be retired), and the type was halted before anything is put back
    /// (B2), so version drift cannot upgrade the instance straight back to
    /// the failed version. (A worker putting back what its failed upgrade
    /// switched holds the instance's lock all along, so the predecessor is
    /// there whatever the window; it fails its task and halts after: C8.)
    fn check_revert(
        &self,
        s: &mut State,
        service: &ServiceKey,
        container: &ContainerId,
        now: Timestamp,
    ) {
        let markers = self.store().inhibitions_now(&service.instance);
        let Some(back) = markers
            .iter()
            .find(|m| m.service == service.service && &m.container == container)
            .and_then(|m| m.revert_to.as_ref())
        else {
            return;
        };
        let by_pass = self
            .store()
            .instance_lock_of(&service.instance)
            .is_some_and(|(holder, _)| holder.ends_with("/recovery"));
        if by_pass {
            s.check(
                "B1 a revert happens inside the bake window",
                now <= back.until + REVERT_SLACK,
                || {
                    format!(
                        "{service:?} put back on {container} at {now}, its bake ended {}",
                        back.until
                    )
                },
            );
            let service_type = self
                .store()
                .instance_now(&service.instance)
                .map(|i| i.service_type)
                .unwrap_or_default();
            let halted = s.truth.halted_since.contains_key(&service_type);
            s.check("B2 a revert halts its type first", halted, || {
                format!(
                    "{service:?} put back on {container} at {now} while {service_type} is not halted"
                )
            });
        }
    }

    pub fn container_went_down(&self, id: &ContainerId) {
        let now = self.clock.now();
        let window = self.policy.stable_window;
        let mut s = self.lock();
        s.up.remove(id);
        for ((c, _), streak) in s.streaks.iter_mut() {
            if c != id {
                continue;
            }
            if streak.up_since.is_some_and(|up| add(up, window) <= now) {
                streak.reset_earned = true;
            }
            streak.up_since = None;
        }
    }

    /// The runtime brought a container up by itself (native restart).
    /// Whether `id` is what ACTIVE names for a service whose predecessor
    /// waits under a retirement marker: the window in which a retirement
    /// must confirm the very execution it verified (S5).
    pub fn succeeds_a_marker(&self, id: &ContainerId) -> bool {
        let s = self.lock();
        s.truth
            .markers
            .values()
            .any(|service| s.truth.active.get(service) == Some(id))
    }

    pub fn container_came_up(&self, id: &ContainerId) {
        let now = self.clock.now();
        let mut s = self.lock();
        came_up(&mut s, id);
        for ((c, _), streak) in s.streaks.iter_mut() {
            if c == id {
                streak.up_since.get_or_insert(now);
            }
        }
    }

    /// The container `holder` intervened on most often in one streak,
    /// among those `eligible` accepts, if that streak reached the ladder
    /// (more interventions than the free attempts): the generation whose
    /// budget most surely holds history in that process's memory.
    pub fn most_recovered_by(
        &self,
        holder: &str,
        eligible: impl Fn(&ContainerId) -> bool,
    ) -> Option<ContainerId> {
        let free = self.policy.free_attempts as usize;
        let s = self.lock();
        s.streaks
            .iter()
            .filter(|((id, h), streak)| {
                h == holder && streak.interventions.len() > free && eligible(id)
            })
            .max_by_key(|((id, _), streak)| {
                (streak.interventions.len(), std::cmp::Reverse(id.clone()))
            })
            .map(|((id, _), _)| id.clone())
    }

    /// Judges `id`'s restart for health exactly from now on (L11), or no
    /// longer.
    pub fn watch_health(&self, id: &ContainerId, watched: bool) {
        let mut s = self.lock();
        if watched {
            s.health_watched.insert(id.clone());
        } else {
            s.health_watched.remove(id);
        }
    }

    /// A check made outside an effect (the queue, after each tick).
    pub fn check_external(
        &self,
        invariant: &'static str,
        ok: bool,
        detail: impl FnOnce() -> String,
    ) {
        self.lock().check(invariant, ok, detail);
    }

    /// S10: a task once in the queue never disappears from it. Returns the
    /// ids not seen at the last look.
    pub fn tasks_seen(&self, ids: &[i64]) -> BTreeSet<i64> {
        let mut s = self.lock();
        let now: BTreeSet<i64> = ids.iter().copied().collect();
        let lost: Vec<i64> = s.tasks_seen.difference(&now).copied().collect();
        s.check("S10 no task lost", lost.is_empty(), || {
            format!("tasks {lost:?} vanished")
        });
        let new = now.difference(&s.tasks_seen).copied().collect();
        s.tasks_seen = now;
        new
    }

    /// The queued tasks, of `(id, run_after)`, whose `run_after` moved since
    /// the last look (a retry's backoff): S9 judges a retried upgrade's
    /// new time against its window as it judged the planned one.
    pub fn run_after_moved(&self, queued: &[(i64, Timestamp)]) -> BTreeSet<i64> {
        let mut s = self.lock();
        let moved = queued
            .iter()
            .filter(|(id, at)| s.run_after_seen.get(id).is_some_and(|seen| seen != at))
            .map(|(id, _)| *id)
            .collect();
        s.run_after_seen = queued.iter().copied().collect();
        moved
    }

    /// A violation found outside an effect (the liveness checks).
    /// An invariant judged outside the effect stream (the pass judge).
    pub fn judged(&self, invariant: &'static str, ok: bool, detail: impl FnOnce() -> String) {
        self.lock().check(invariant, ok, detail);
    }

    /// `invariant` held `n` times (judged elsewhere, in bulk).
    pub fn judged_times(&self, invariant: &'static str, n: u64) {
        if n > 0 {
            *self.lock().checks.entry(invariant).or_default() += n;
        }
    }

    pub fn record_violation(&self, violation: String) {
        self.lock().violations.push(violation);
    }

    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    pub fn checks(&self) -> BTreeMap<&'static str, u64> {
        self.lock().checks.clone()
    }

    pub fn trace(&self) -> Vec<String> {
        self.lock().trace.iter().cloned().collect()
    }

    pub fn trace_hash(&self) -> u64 {
        self.lock().trace_hash
    }

    pub fn effects(&self) -> u64 {
        self.lock().effects
    }

    /// Ticks every process ran, leader or not.
    pub fn ticks(&self) -> u64 {
        self.lock().ticks
    }

    pub fn routes(&self) -> BTreeMap<ServiceKey, Route> {
        self.lock().routes.clone()
    }

    /// Services whose last withdrawal failed, by the process that holds
    /// the reconciler lease now: its memory owes the retry (R6, L4). A
    /// standby's pending withdrawal is retried the moment it leads, before
    /// it publishes anything (S2 checks that). A deleted instance owes
    /// nothing: its deprovision withdrew every route, and the pass forgets
    /// it.
    pub fn withdraw_failed(&self) -> BTreeSet<ServiceKey> {
        let leader = self.store().lease_now().map(|g| g.holder);
        let s = self.lock();
        s.withdraw_failed
            .iter()
            // A service that left ACTIVE (a version dropped it) is no
            // longer the pending withdrawal's business: its memory is
            // pruned (R16) and its route is a stale one, withdrawn as such
            // (L8 judges that it is gone). Seed 401 found this, with two
            // upgrades in flight: another process's worker retired the
            // service while the leader's withdrawal was pending.
            .filter(|(key, holder)| {
                Some(holder) == leader.as_ref()
                    && !s.truth.deleting.contains(&key.instance)
                    && s.truth.active.contains_key(key)
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("checker poisoned")
    }
}

impl State {
    /// A release is missing from `now` (a missing one stays missing).
    fn release_went_missing(&mut self, release: &str, now: Timestamp) {
        self.releases_moved_at = Some(now);
        let intervals = self.release_missing.entry(release.to_owned()).or_default();
        if intervals.last().is_none_or(|(_, until)| until.is_some()) {
            intervals.push((now, None));
        }
    }
}

fn instance_of(truth: &Truth, id: &ContainerId) -> Option<ServiceKey> {
    truth
        .active
        .iter()
        .find(|(_, c)| *c == id)
        .map(|(k, _)| k.clone())
}

impl State {
    fn check(&mut self, invariant: &'static str, ok: bool, detail: impl FnOnce() -> String) {
        *self.checks.entry(invariant).or_default() += 1;
        if !ok {
            self.violations.push(format!("{invariant}: {}", detail()));
        }
    }

    fn record(&mut self, now: Timestamp, effect: &Effect) {
        let line = format!("{now} {effect:?}");
        // FNV-1a over the trace: equal hashes for equal runs.
        for b in line.as_bytes() {
            self.trace_hash ^= u64::from(*b);
            self.trace_hash = self.trace_hash.wrapping_mul(0x100_0000_01b3);
        }
        self.effects += 1;
        if self.trace.len() >= trace_len_max() {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
        // A loop of effects that never lets simulated time move (each
        // effect waking the next at once) would spin the seed forever
        // rather than fail it (seed 336: a stop's event woke a pass that
        // stopped again). Fail it, naming what loops.
        let second = now.as_second();
        if self.effects_at.0 == second {
            self.effects_at.1 += 1;
        } else {
            self.effects_at = (second, 1);
        }
        assert!(
            self.effects_at.1 <= EFFECTS_IN_ONE_SECOND_MAX,
            "L0 simulated time advances: {} effects within the second of {now}; the last: {:?}",
            self.effects_at.1,
            self.trace.iter().rev().take(8).collect::<Vec<_>>()
        );
    }
}

/// More effects than this within one simulated second is a livelock: the
/// busiest real second (every instance of a seed passed at once, with an
/// event storm) makes a few thousand.
const EFFECTS_IN_ONE_SECOND_MAX: u64 = 100_000;

/// The instance a container belongs to, from its name (`stead.<instance>.
/// <service>.<revision>`, as the in-memory runtime names containers) when
/// the checker never saw it created.
fn instance_of_container(s: &State, id: &ContainerId) -> Option<InstanceName> {
    if let Some(key) = s.created_for.get(id) {
        return Some(key.instance.clone());
    }
    id.as_str()
        .strip_prefix("stead.")
        .and_then(|rest| rest.split('.').next())
        .map(InstanceName::new)
}

/// #40 V1: a `stop-first` service never has two containers up at once
/// (two processes on one data directory), whoever brought the second up:
/// an upgrade's candidate, a revert's predecessor, a native restart.
fn came_up(s: &mut State, id: &ContainerId) {
    s.up.insert(id.clone());
    let Some(key) = s.truth.service_of.get(id).cloned() else {
        return;
    };
    if !s.truth.stop_first.contains(&key.service) {
        return;
    }
    let others: Vec<&ContainerId> =
        s.up.iter()
            .filter(|c| *c != id && s.truth.service_of.get(*c) == Some(&key))
            .collect();
    let detail = format!("{id} of {key:?} came up while {others:?} were up");
    let alone = others.is_empty();
    s.check(
        "V1 a stop-first service never runs two containers at once",
        alone,
        || detail,
    );
}

/// The instance an effect changes, if it changes one's workload or traffic.
fn instance_of_effect(s: &State, effect: &Effect) -> Option<InstanceName> {
    match effect {
        Effect::Started { id }
        | Effect::Restarted { id }
        | Effect::Stopped { id }
        | Effect::Removed { id } => instance_of_container(s, id),
        Effect::Created { instance, .. } => Some(instance.clone()),
        Effect::Published { route } => Some(route.service.instance.clone()),
        Effect::Withdrawn { service } | Effect::WithdrawFailed { service } => {
            Some(service.instance.clone())
        }
        _ => None,
    }
}

impl Checker {
    /// T3: a stead process changes an instance only while it holds the
    /// instance's lock in the store (its in-process actors share it).
    fn check_instance_lock(&self, s: &mut State, process: &Process, effect: &Effect) {
        let Some(instance) = instance_of_effect(s, effect) else {
            return;
        };
        let store = self.store();
        let live = store
            .instance_now(&instance)
            .is_some_and(|i| i.state != InstanceState::Deleted);
        if !live {
            // A route of a gone instance is withdrawn without a lock: no
            // other process can be changing an instance that is gone.
            return;
        }
        let now = store.now();
        let unsettled = self.database_clock_unsettled(s, self.clock.now());
        let lock = store.instance_lock_of(&instance);
        let mine = lock.as_ref().is_some_and(|(holder, expires)| {
            holder.starts_with(&format!("{}/", process.holder)) && (unsettled || *expires > now)
        });
        s.check("T3 one process changes an instance at a time", mine, || {
            format!(
                "{} changed {instance} ({effect:?}) while its lock was {lock:?}",
                process.holder
            )
        });
    }

    /// The runtime refused a start (an injected error, or its own restart
    /// getting there first): followed when a recovery pass asked for it.
    pub fn start_refused(&self, id: &ContainerId) {
        let node = madsim::plugin::node();
        let mut s = self.lock();
        let Some(process) = s.processes.get(&node).cloned() else {
            return;
        };
        let by_recovery = instance_of_container(&s, id)
            .and_then(|instance| self.store().instance_lock_of(&instance))
            .is_some_and(|(holder, _)| holder == format!("{}/recovery", process.holder));
        if by_recovery {
            s.refused_starts
                .insert((id.clone(), process.holder), StartFollowUp::Refused);
        }
    }

    /// R11, exact: after a refused start and the inspection that follows
    /// it, the pass's next call on the container says which way it went.
    /// Found up, the runtime's restart is taken as the start (nothing
    /// charged) and verified: its health is read next. Found down (or not
    /// read), the start failed (charged) and the service's pass ends: no
    /// health read of it follows in that pass. Judged by the calls asked
    /// for, so an answer the faults spoil judges the same.
    fn follow_refused_start(&self, op: Op, subject: &str) {
        let on_container = matches!(
            op,
            Op::Inspect | Op::Start | Op::Stop | Op::Restart | Op::Health | Op::Binds | Op::Remove
        );
        if !on_container {
            return;
        }
        let node = madsim::plugin::node();
        let mut s = self.lock();
        let Some(holder) = s.processes.get(&node).map(|p| p.holder.clone()) else {
            return;
        };
        let key = (ContainerId::new(subject), holder);
        let Some(stage) = s.refused_starts.get(&key).copied() else {
            return;
        };
        match (stage, op) {
            (StartFollowUp::Refused, Op::Inspect) => {
                s.refused_starts.insert(key, StartFollowUp::Inspecting);
            }
            // Not the machine's follow-up (the pass was cut short): unjudged.
            (StartFollowUp::Refused, _) => {
                s.refused_starts.remove(&key);
            }
            (StartFollowUp::FoundUp, op) => {
                s.refused_starts.remove(&key);
                s.check(
                    "R11 a start the runtime's own restart answered is not charged",
                    op == Op::Health,
                    || format!("{}: found up after its refused start, then {op:?} instead of its health read", key.0),
                );
            }
            (StartFollowUp::Inspecting | StartFollowUp::FoundDown, op) => {
                s.refused_starts.remove(&key);
                s.check(
                    "R11 a refused start that left the container down is charged",
                    op != Op::Health,
                    || format!("{}: found down after its refused start, then its health read in the same pass", key.0),
                );
            }
        }
    }

    /// T2: an outside effect is attempted only while the acting process
    /// holds the lease it acts under, by the database's clock: the
    /// reconciler lease for recovery, the task's lease for a worker. Called
    /// by the fault injector the instant a port is asked to act.
    pub fn attempt(&self, op: Op, subject: &str) {
        self.follow_refused_start(op, subject);
        let outside = matches!(
            op,
            Op::Start
                | Op::Stop
                | Op::Restart
                | Op::Create
                | Op::Remove
                | Op::Publish
                | Op::Withdraw
                | Op::Install
                | Op::Uninstall
        );
        if !outside {
            return;
        }
        let node = madsim::plugin::node();
        let mut s = self.lock();
        let Some(process) = s.processes.get(&node).cloned() else {
            return;
        };
        let instance = match op {
            Op::Publish | Op::Withdraw => subject.split('/').next().map(InstanceName::new),
            Op::Install | Op::Uninstall => Some(InstanceName::new(subject)),
            _ => instance_of_container(&s, &ContainerId::new(subject)),
        };
        let store = self.store();
        let now = store.now();
        let unsettled = self.database_clock_unsettled(&s, self.clock.now());
        let lock = instance.as_ref().and_then(|i| store.instance_lock_of(i));
        let actor = lock.as_ref().and_then(|(holder, _)| {
            holder
                .strip_prefix(&format!("{}/", process.holder))
                .map(str::to_owned)
        });
        let (under, ok) = match actor.as_deref() {
            Some(worker) if worker != "recovery" => {
                let worker_id = format!("{}/{worker}", process.holder);
                let held = store.all_tasks().iter().any(|t| {
                    t.state == TaskState::Running
                        && t.locked_by.as_deref() == Some(worker_id.as_str())
                        && (unsettled
                            || t.locked_at.is_some_and(|at| add(at, self.task_lease) > now))
                });
                ("its task lease", held)
            }
            Some(_) => (
                "the reconciler lease",
                self.holds_lease(&process, now, unsettled),
            ),
            // Not under this process's lock: T3 judges the effect itself;
            // a reconciler's stale-route withdrawal still needs the lease.
            None if process.role.reconciles() && matches!(op, Op::Withdraw) => (
                "the reconciler lease",
                self.holds_lease(&process, now, unsettled),
            ),
            None => return,
        };
        s.check("T2 no effect after the lease", ok, || {
            format!(
                "{} attempted {op:?} on {subject} at {now} without {under}",
                process.holder
            )
        });
    }

    /// T2 for the store (#55): a write of ACTIVE or of a marker that the
    /// recovery pass makes (a bake's revert) carries the reconciler lease's
    /// fence. The revert once wrote them unfenced, so a reconciler that
    /// lost its lease mid-revert could overwrite what the next leader
    /// wrote; nothing judged the store's writes, only the ports' effects,
    /// and a lease lost in the middle of a revert is too rare a world for
    /// the consequence to show in the seeds CI runs.
    fn check_recovery_write_under_lease(&self, s: &mut State, process: &Process, effect: &Effect) {
        let (service, under_lease) = match effect {
            Effect::ActiveSaved {
                service,
                under_lease,
                ..
            }
            | Effect::InhibitionSaved {
                service,
                under_lease,
                ..
            } => (service, *under_lease),
            _ => return,
        };
        let store = self.store();
        let Some((holder, _)) = store.instance_lock_of(&service.instance) else {
            return;
        };
        if holder != format!("{}/recovery", process.holder) {
            return;
        }
        // T2 in DESIGN's words: every store write the reconciler makes
        // carries the fence token, so a write made after the lease is
        // refused by the store itself. Judged on every write, not only on
        // the rare one a lost lease would have refused.
        s.check(
            "T2 every store write of recovery carries the fence",
            under_lease,
            || {
                format!(
                    "{} wrote {effect:?} at {} without the reconciler lease's fence",
                    process.holder,
                    store.now()
                )
            },
        );
    }

    /// Whether `process` holds the reconciler lease at `now` by the
    /// database's clock; on an `unsettled` clock, whether it is the holder
    /// the database names.
    fn holds_lease(&self, process: &Process, now: Timestamp, unsettled: bool) -> bool {
        self.store()
            .lease_now()
            .is_some_and(|g| g.holder == process.holder && (unsettled || g.expires_at > now))
    }

    /// T4: a task handler that found its instance deleting (under the
    /// lock it holds now) builds nothing for it; only a deprovision acts on
    /// a deleting instance. (A handler already running when a TTL expired
    /// the instance, which takes no lock, may finish: deprovision follows.)
    fn check_handler_respects_deletion(&self, s: &mut State, process: &Process, effect: &Effect) {
        let instance = match effect {
            Effect::Created { instance, .. } => instance.clone(),
            Effect::ActiveSaved { service, .. } => service.instance.clone(),
            // A release is named after its instance (a Helm type's has no
            // container: installing it is what building means).
            Effect::Installed { release } => InstanceName::new(release.clone()),
            _ => return,
        };
        let Some((holder, _)) = self.store().instance_lock_of(&instance) else {
            return;
        };
        if !holder.starts_with(&format!("{}/w", process.holder)) {
            return;
        }
        let found = s
            .state_when_locked
            .get(&(instance.clone(), holder.clone()))
            .copied();
        let deleting = matches!(
            found,
            Some(InstanceState::Deleting | InstanceState::Deleted)
        );
        let deprovision = self.store().all_tasks().iter().any(|t| {
            t.state == TaskState::Running
                && t.locked_by.as_deref() == Some(holder.as_str())
                && t.kind == stead::core::fleet::TaskKind::Deprovision
        });
        s.check("T4 deleted stays deleted", !deleting || deprovision, || {
            format!("{holder} found {instance} {found:?} and still built for it: {effect:?}")
        });
    }

    /// T4 and T6 on the store's and runtime's writes.
    fn check_names_and_deletion(&self, s: &mut State, effect: &Effect) {
        match effect {
            Effect::Created {
                id,
                instance,
                service,
            } => {
                let key = ServiceKey {
                    instance: instance.clone(),
                    service: service.clone(),
                };
                let deleted = self.is_deleted(instance);
                s.check("T4 deleted stays deleted", !deleted, || {
                    format!("{id} created for deleted {instance}")
                });
                let now = self.clock.now();
                if let Some(intervals) = s.container_missing.get_mut(instance.as_str()) {
                    for (missing, _, until) in intervals.iter_mut() {
                        if missing == id && until.is_none() {
                            *until = Some(now);
                        }
                    }
                }
                let previous = s.created_for.insert(id.clone(), key.clone());
                s.check(
                    "T6 no two services share a container name",
                    previous.as_ref().is_none_or(|p| *p == key),
                    || format!("{id} named for {key:?} and for {previous:?}"),
                );
            }
            Effect::Installed { release } => {
                let name = InstanceName::new(release.clone());
                let deleted = self.is_deleted(&name);
                s.check("T4 deleted stays deleted", !deleted, || {
                    format!("release {release} installed for a deleted instance")
                });
                // H3: a worker installs its own catalog's version; one
                // whose catalog is behind the instance's must refuse, not
                // put an older chart under a newer version's name (or
                // downgrade a live release). Only versions stead can order
                // have a "behind" (`build-3` and `build-4` are only
                // different, and the worker's catalog is the authority:
                // seed 74 created an instance at `build-4` between a bump
                // and the daemons' reload).
                let helm = crate::world::is_helm_instance(release) && self.versions.ordered();
                if let (true, Some(recorded), Some(installed)) = (
                    helm,
                    self.store().instance_now(&name).map(|i| i.version),
                    self.provisioner
                        .get()
                        .and_then(|p| p.release_versions().remove(release)),
                ) {
                    s.check(
                        "H3 a release is never installed behind its instance's version",
                        self.version_number(&installed) >= self.version_number(&recorded),
                        || {
                            format!(
                                "{release} installed at {installed}, its instance at {recorded}"
                            )
                        },
                    );
                }
            }
            Effect::ActiveSaved {
                service, container, ..
            } => {
                let deleted = self.is_deleted(&service.instance);
                s.check("T4 deleted stays deleted", !deleted, || {
                    format!("ACTIVE written for deleted {}", service.instance)
                });
                let owner = s.created_for.get(container).cloned();
                s.check(
                    "T6 no two services share a container name",
                    owner.as_ref().is_none_or(|o| o == service),
                    || format!("ACTIVE of {service:?} names {container}, created for {owner:?}"),
                );
                self.check_revert(s, service, container, self.clock.now());
            }
            Effect::Published { route } => {
                if let Some(started_at) = route.verified_started_at {
                    let recorded = self.store().active_now(&route.service);
                    let durable = recorded.as_ref().is_some_and(|a| {
                        a.container == route.container
                            && a.verified_started_at
                                == stead::store::normalize_execution_start(started_at)
                    });
                    s.check("S11 routed only once durably verified", durable, || {
                        format!(
                            "{:?} published {} at {started_at} while ACTIVE records {:?}: \
                             a restart now would withdraw it (R17)",
                            route.service,
                            route.container,
                            recorded.map(|a| (a.container, a.verified_started_at))
                        )
                    });
                }
                self.check_public_hosts(s, route);
                let id = names::route_id(&route.service);
                let previous = s.route_ids.insert(id.clone(), route.service.clone());
                s.check(
                    "T6 no two services share a route id",
                    previous.as_ref().is_none_or(|p| *p == route.service),
                    || format!("route id {id} of {:?} and of {previous:?}", route.service),
                );
            }
            _ => {}
        }
    }

    /// Who in a process made an effect: the actor holding the lock of the
    /// effect's instance for that process.
    fn actor_of(&self, s: &State, process: Option<&Process>, effect: &Effect) -> Actor {
        let Some(process) = process else {
            return Actor::World;
        };
        let Some(instance) = instance_of_effect(s, effect) else {
            return Actor::Unknown;
        };
        let Some((holder, _)) = self.store().instance_lock_of(&instance) else {
            return Actor::Unknown;
        };
        match holder.strip_prefix(&format!("{}/", process.holder)) {
            Some("recovery") => Actor::Recovery,
            Some(w) if w.starts_with('w') => Actor::Worker,
            _ => Actor::Unknown,
        }
    }

    /// E1: tells the event ledger of a recovery pass's effect that the
    /// event log records.
    fn note_intervention(&self, s: &State, writer: &str, effect: &Effect, now: Timestamp) {
        use stead::core::event_log::EventKind;
        let service_of = |id: &ContainerId| {
            s.truth
                .service_of
                .get(id)
                .cloned()
                .or_else(|| instance_of(&s.truth, id))
        };
        let (kind, service, container, exact) = match effect {
            Effect::Started { id } => (EventKind::Start, service_of(id), Some(id), true),
            Effect::Restarted { id } => (EventKind::Restart, service_of(id), Some(id), true),
            Effect::Stopped { id } => {
                // For stop intent (R4): the container ACTIVE names, of a
                // stopped instance. A retirement's or a revert's stop is
                // recorded as its Retire or Revert row.
                let for_intent = instance_of(&s.truth, id)
                    .is_some_and(|k| s.truth.stopped.contains(&k.instance))
                    && !s.truth.markers.contains_key(id);
                (EventKind::Stop, service_of(id), Some(id), for_intent)
            }
            Effect::Published { route } => (
                EventKind::Publish,
                Some(route.service.clone()),
                Some(&route.container),
                true,
            ),
            Effect::Withdrawn { service } => {
                (EventKind::Withdraw, Some(service.clone()), None, false)
            }
            _ => return,
        };
        let Some(service) = service else {
            return;
        };
        self.events.intervened(
            writer,
            kind,
            &service.instance,
            &service.service,
            container,
            exact,
            now,
        );
    }

    /// N1 (#54): once an instance was served under a public host name, no
    /// other instance is published under it while the first is not
    /// deleted, whatever happened to the first one's route meanwhile.
    fn check_public_hosts(&self, s: &mut State, route: &Route) {
        let claimant = &route.service.instance;
        // The case N1 is about, counted so a run shows it happens: a
        // contender for a host published while the host's holder had no
        // route (crashed, stopped, replaced stop-first).
        let service = &route.service.service;
        for template in crate::world::domains_of(service) {
            let host = template.render(claimant, service);
            let contended = s.host_servers.get(&host).is_some_and(|holder| {
                holder != claimant
                    && !s.routes.contains_key(&ServiceKey {
                        instance: holder.clone(),
                        service: service.clone(),
                    })
            });
            if contended {
                *s.checks
                    .entry("N1 case: a contender published while the holder's route was withdrawn")
                    .or_default() += 1;
            }
        }
        for host in &route.public_hosts {
            let holder = s.host_servers.get(host).cloned();
            let moved = holder
                .as_ref()
                .is_some_and(|h| h != claimant && !self.is_deleted(h));
            s.check(
                "N1 a public host name never moves from one live instance to another",
                !moved,
                || {
                    format!(
                        "{claimant}/{} published under {host}, which {} was served under \
                         and holds until it is deleted",
                        route.service.service,
                        holder.as_ref().map_or("?", |h| h.as_str())
                    )
                },
            );
            if !moved {
                s.host_servers.insert(host.clone(), claimant.clone());
            }
        }
    }

    fn is_deleted(&self, instance: &InstanceName) -> bool {
        self.store()
            .instance_now(instance)
            .is_some_and(|i| i.state == InstanceState::Deleted)
    }
}

/// Whether a lock holder is a recovery pass (`<process>/recovery`).
fn is_recovery(holder: &str) -> bool {
    holder.ends_with("/recovery")
}

impl Checker {
    /// A simulated catalog version as the counter behind it (anything
    /// else counts as 0).
    fn version_number(&self, v: &str) -> u32 {
        self.versions.number(v).unwrap_or(0)
    }
}

impl Observer for Checker {
    fn effect(&self, effect: &Effect) {
        let now = self.clock.now();
        let actor = madsim::plugin::node();
        let node = actor;
        let mut s = self.lock();
        s.record(now, effect);
        let process = s.processes.get(&actor).cloned();
        if let Some(process) = &process {
            self.check_instance_lock(&mut s, process, effect);
            self.check_handler_respects_deletion(&mut s, process, effect);
            self.check_recovery_write_under_lease(&mut s, process, effect);
        }
        let actor = self.actor_of(&s, process.as_ref(), effect);
        if let (Actor::Recovery, Some(process)) = (actor, &process) {
            self.note_intervention(&s, &process.holder, effect, now);
        }
        if let Effect::Removed { id } = effect {
            self.events.removed(id, now);
        }
        self.check_names_and_deletion(&mut s, effect);
        let by_process = process.is_some();
        let holder = process
            .as_ref()
            .map_or_else(|| "world".to_owned(), |p| p.holder.clone());
        let previous_effect_at = if by_process {
            s.last_effect_of.insert(node, now)
        } else {
            None
        };
        match effect {
            Effect::Started { id } | Effect::Restarted { id } => {
                came_up(&mut s, id);
                let service = instance_of(&s.truth, id);
                // An operator's undo (#40) has a worker start a kept
                // predecessor, still under its marker, and verify it
                // before ACTIVE names it again: as an upgrade creates its
                // candidate. Nothing else starts what ACTIVE does not name.
                let undoing = actor == Actor::Worker && s.truth.markers.contains_key(id);
                let undo_start = undoing && service.is_none();
                s.check("S1 start only ACTIVE", service.is_some() || undoing, || {
                    format!("{id} is not named by ACTIVE")
                });
                if let Some(service) = service {
                    let stopped = s.truth.stopped.contains(&service.instance);
                    s.check("S3 stopped never started", !stopped, || {
                        format!("{id} of stopped {}", service.instance)
                    });
                }
                let inhibited = s.truth.inhibited.contains(id);
                s.check("S4 inhibited never started", !inhibited, || {
                    format!("{id} is inhibited")
                });
                // A start or restart begins a new, unverified execution, so
                // traffic must already be withdrawn from it (R8, R12).
                let routed = s.routes.values().find(|r| &r.container == id).cloned();
                s.check(
                    "S2 never routed to an unverified execution",
                    routed.is_none(),
                    || {
                        format!(
                            "{id} started while {:?} still routes to it",
                            routed.map(|r| r.service)
                        )
                    },
                );
                if undo_start {
                    // An operator's undo starts a kept predecessor once, on
                    // the operator's word: not a recovery, so no charge to
                    // the pass's budget (R10), which goes on judging the
                    // pass's own starts of it. It is up, for every streak.
                    for ((c, _), streak) in s.streaks.iter_mut() {
                        if c == id {
                            streak.up_since.get_or_insert(now);
                        }
                    }
                } else {
                    self.check_budget(&mut s, id, &holder, now);
                }
                let reads = s
                    .unhealthy_reads
                    .remove(&(id.clone(), holder.clone()))
                    .unwrap_or(0);
                if matches!(effect, Effect::Restarted { .. }) {
                    // The engine's own count resets more often (a fresh
                    // execution, a lost memory), never less: it can only
                    // be at or below this one.
                    let threshold = self.policy.unhealthy_threshold;
                    s.check("S12 restart for health only at the threshold", reads >= threshold, || {
                        format!("{id} restarted after {reads} consecutive unhealthy reads (threshold {threshold})")
                    });
                }
            }
            Effect::Created {
                id,
                instance,
                service,
            } => {
                s.truth.service_of.insert(
                    id.clone(),
                    ServiceKey {
                        instance: instance.clone(),
                        service: service.clone(),
                    },
                );
                s.check(
                    "H1 no container for an instance of a Helm type",
                    !crate::world::is_helm_instance(instance.as_str()),
                    || format!("{id} created for {instance}, which Kubernetes runs"),
                );
                let by_operator = s.truth.operator_created.contains(id);
                let by_worker = actor == Actor::Worker;
                if by_worker {
                    s.truth.worker_created.insert(id.clone());
                }
                // U1 (#40): under an undo's pin, what a worker makes for
                // the type (a move back, a provision, a reprovision) is of
                // the pinned version.
                if let Some(Pin {
                    version: pinned,
                    began,
                    ..
                }) = s.truth.pin.clone()
                {
                    if by_worker
                        && !crate::world::is_helm_instance(instance.as_str())
                        && !began.contains(instance)
                    {
                        let made = crate::world::version_of_container(id.as_str()).to_owned();
                        s.check(
                            "U1 under a pin a worker makes only the pinned version",
                            made == pinned,
                            || format!("{id} created for {instance} at {made} while pinned to {pinned}"),
                        );
                    }
                }
                s.check("S1 never creates", by_operator || by_worker, || {
                    format!("{id} created outside a deploy or a task")
                });
                // The in-memory runtime starts what it creates.
                came_up(&mut s, id);
            }
            Effect::Removed { id } => {
                s.up.remove(id);
                let marker = s.truth.markers.contains_key(id);
                let owner = instance_of(&s.truth, id);
                let deprovisioned = owner
                    .as_ref()
                    .is_some_and(|k| s.truth.deleting.contains(&k.instance));
                let candidate = s.truth.worker_created.contains(id) && actor == Actor::Worker;
                // An upgrade retiring a service its version dropped removes
                // it while ACTIVE still names it, under its hold.
                // Or any other generation of such a service (a leftover
                // candidate, a predecessor), once it left ACTIVE.
                let of_dropped = s.truth.service_of.get(id).is_some_and(|k| {
                    (s.catalog_dropped.as_ref() == Some(&k.service)
                        || s.truth.pin_leaves_out(&k.service))
                        && !s.truth.active.contains_key(k)
                });
                let dropping =
                    (s.truth.dropping.contains(id) || of_dropped) && actor == Actor::Worker;
                // An upgrade sweeps a kept service's stray generations:
                // neither ACTIVE's nor under a durable record (an operator's
                // half-made deploy, an interrupted upgrade's candidate, #40).
                let stray = actor == Actor::Worker
                    && !s.truth.inhibited.contains(id)
                    && s.truth.service_of.contains_key(id);
                let ok = deprovisioned
                    || dropping
                    || (owner.is_none() && (marker || candidate || stray));
                s.check("S1 never removes ACTIVE", ok, || {
                    format!("{id} removed but it is neither a retirement marker nor deprovisioned")
                });
                // #55: a successor a revert took away is the evidence of
                // what failed; recovery keeps it, stopped, for its hour
                // (a deprovision, a worker's, may take it sooner). Judged
                // by the process's clock, which may run ahead of this one
                // by up to the tolerance (seed 394 of 500 removed one at
                // its hour's very end).
                let kept = s
                    .truth
                    .kept
                    .remove(id)
                    .filter(|until| add(now, CLOCK_TOLERANCE) < *until);
                s.check(
                    "B3 a reverted successor is kept for its hour",
                    kept.is_none() || actor != Actor::Recovery,
                    || format!("{id} removed by recovery, though kept until {kept:?}"),
                );
            }
            Effect::RolledBack { release, from, bad } => {
                s.check(
                    "H4 a Helm release is rolled back only off a version that went bad",
                    *bad,
                    || format!("release {release} rolled back from chart {from}, whose tests pass"),
                );
            }
            Effect::Uninstalled { release } => {
                s.release_changed_at.insert(release.clone(), now);
                s.release_went_missing(release, now);
                let ours = s.truth.deleting.iter().any(|i| i.as_str() == release);
                let foreign = s.truth.foreign_releases.contains(release);
                s.check("S8 orphans never deleted", ours && !foreign, || {
                    format!("release {release} uninstalled but no deprovision owns it")
                });
            }
            Effect::Stopped { id } => {
                s.up.remove(id);
                // A service the new version drops leaves the proxy before
                // its container stops (#44: a route left behind dials a
                // container that is gone).
                if s.truth.dropping.contains(id) {
                    let routed = s.routes.values().find(|r| &r.container == id).cloned();
                    s.check(
                        "D2 a dropped service's route goes before its container",
                        routed.is_none(),
                        || {
                            format!(
                                "{id} of a dropped service stopped while {:?} still routes to it",
                                routed.map(|r| r.service)
                            )
                        },
                    );
                }
                // The first destructive step of a retirement: by now the
                // successor must serve (verified and routed), unless the
                // instance is stopped or the service left ACTIVE (R15).
                if let Some(service) = s.truth.markers.get(id).cloned() {
                    if instance_of(&s.truth, id).is_none() {
                        // A stopped or deleting instance retires every
                        // marker: nothing of it may run (R4).
                        let stopped = s.truth.stopped.contains(&service.instance)
                            || s.truth.deleting.contains(&service.instance);
                        let ok = stopped
                            || match s.truth.active.get(&service) {
                                None => true,
                                Some(successor) => {
                                    self.serving_execution(&s, &service, successor).is_some_and(
                                        |at| s.probe_passed.contains(&(successor.clone(), at)),
                                    )
                                }
                            };
                        s.check("S5 retire after successor serves", ok, || {
                            format!("{id} retired before its successor was verified and routed")
                        });
                        // Exactly: the retiring pass's last look at the
                        // successor (its final inspection) found it
                        // running the execution the proxy routes to.
                        let successor = s.truth.active.get(&service).cloned();
                        if let (false, Actor::Recovery, Some(successor)) =
                            (stopped, actor, successor)
                        {
                            let seen = s
                                .last_inspected
                                .get(&(successor.clone(), holder.clone()))
                                .copied()
                                .flatten();
                            let routed = self.serving_execution(&s, &service, &successor).flatten();
                            let confirmed = seen.is_some_and(|(status, started_at)| {
                                status == ContainerStatus::Running
                                    && started_at.is_some()
                                    && started_at == routed
                            });
                            s.check(
                                "S5 retire only after the successor's final inspection",
                                confirmed,
                                || {
                                    format!(
                                        "{id} retired by {holder} though its last inspection of {successor} found {seen:?}, not the routed execution {routed:?}"
                                    )
                                },
                            );
                        }
                    }
                }
            }
            Effect::Published { route } => {
                let key = &route.service;
                s.check(
                    "H1 no route for an instance of a Helm type",
                    !crate::world::is_helm_instance(key.instance.as_str()),
                    || format!("{key:?} published, but Kubernetes runs it"),
                );
                let active = s.truth.active.get(key) == Some(&route.container);
                s.check("S2 publish only ACTIVE", active, || {
                    format!("{key:?} published to non-ACTIVE {}", route.container)
                });
                let verified = s
                    .probe_passed
                    .contains(&(route.container.clone(), route.verified_started_at));
                s.check("S2 publish only verified", verified, || {
                    format!(
                        "{key:?} published {} execution {:?} never passed readiness",
                        route.container, route.verified_started_at
                    )
                });
                let blocked = s.withdraw_failed.contains(&(key.clone(), holder.clone()));
                s.check("S2 withdraw retried before publish", !blocked, || {
                    format!("{key:?} published while its last withdrawal failed")
                });
                let stopped = s.truth.stopped.contains(&key.instance);
                s.check("S3 stopped never published", !stopped, || {
                    format!("{key:?} published while stopped")
                });
                s.routes.insert(key.clone(), route.clone());
            }
            Effect::Withdrawn { service } => {
                s.withdraw_failed.remove(&(service.clone(), holder.clone()));
                s.routes.remove(service);
            }
            // R6 is the recovery pass's: a pending withdrawal it keeps in
            // memory. A worker's failed withdrawal (a `stop-first`
            // replacement's, a dropped service's retirement) is its task's
            // to handle, and no pass ever learns of it.
            Effect::WithdrawFailed { service } => {
                if actor != Actor::Worker {
                    s.withdraw_failed.insert((service.clone(), holder.clone()));
                }
            }
            Effect::ProbePassed {
                id,
                started_at,
                binds,
            } => {
                s.probe_passed.insert((id.clone(), *started_at));
                s.ready_binds.insert((id.clone(), binds.clone()));
            }
            Effect::BindsSaved { id, binds } => {
                let ready = s.ready_binds.contains(&(id.clone(), binds.clone()));
                s.check("S7 binds saved only after readiness", ready, || {
                    format!("{id} binds {binds:?} reached ACTIVE before readiness passed on them")
                });
            }
            Effect::Installed { release } => {
                s.release_changed_at.insert(release.clone(), now);
                s.releases_moved_at = Some(now);
                if let Some((_, until)) = s
                    .release_missing
                    .get_mut(release)
                    .and_then(|intervals| intervals.last_mut())
                {
                    until.get_or_insert(now);
                }
            }
            // The store's writes keep the truth of ACTIVE and of the
            // inhibitions, whoever made them (operators or workers).
            Effect::ActiveSaved {
                service, container, ..
            } => {
                let before = s.truth.active.insert(service.clone(), container.clone());
                if before.as_ref() != Some(container) {
                    s.active_since.insert(service.clone(), now);
                    if let Some(before) = before {
                        s.active_until.insert(before, now);
                    }
                }
                s.active_until.remove(container);
            }
            Effect::ActiveRemoved { service } => {
                if let Some(before) = s.truth.active.remove(service) {
                    s.active_until.insert(before, now);
                }
            }
            Effect::InhibitionSaved {
                service,
                container,
                retirement,
                dropped,
                kept_until,
                ..
            } => {
                if *dropped {
                    // A move toward a pin lifted since it began (its task
                    // read the rollout first) may finish, within its lease.
                    let lifted_leaves_out = s.truth.lifted_pin.as_ref().is_some_and(|(pin, at)| {
                        !pin.services.contains(&service.service) && now <= add(*at, self.task_lease)
                    });
                    let listed = s.catalog_dropped.as_ref() != Some(&service.service)
                        && !s.truth.pin_leaves_out(&service.service)
                        && !lifted_leaves_out;
                    s.check(
                        "S1 a service is retired only when the catalog dropped it",
                        !listed,
                        || format!("{service:?} held as dropped, but the catalog lists it"),
                    );
                    // Exactly: the drop is the last step of an upgrade
                    // whose every kept service switched, so each runs a
                    // version that no longer lists the dropped one (#44:
                    // a failed upgrade touches nothing of the old).
                    let still_listed: Vec<ContainerId> = s
                        .truth
                        .active
                        .iter()
                        .filter(|(k, _)| {
                            k.instance == service.instance && k.service != service.service
                        })
                        .filter(|(_, c)| {
                            let version = self
                                .versions
                                .number(crate::world::version_of_container(c.as_str()))
                                .unwrap_or(1);
                            s.dropped_by_version
                                .get(&version)
                                .cloned()
                                .flatten()
                                .as_ref()
                                != Some(&service.service)
                        })
                        .map(|(_, c)| c.clone())
                        .collect();
                    s.check(
                        "D1 a service is dropped only once the new version serves",
                        still_listed.is_empty(),
                        || {
                            format!(
                                "{service:?} held as dropped while {still_listed:?} run a version that lists it"
                            )
                        },
                    );
                    s.truth.dropping.insert(container.clone());
                }
                // One record per generation: a marker replaces a hold (a
                // `stop-first` upgrade's, once it switched; an operator's),
                // and a hold replaces a marker.
                match kept_until {
                    Some(until) => s.truth.kept.insert(container.clone(), *until),
                    None => s.truth.kept.remove(container),
                };
                if *retirement {
                    s.truth.inhibited.remove(container);
                    s.truth.markers.insert(container.clone(), service.clone());
                } else {
                    s.truth.markers.remove(container);
                    s.truth.inhibited.insert(container.clone());
                }
            }
            Effect::RolloutSet {
                service_type,
                halted,
            } => {
                s.rollout_changed_at = Some(now);
                if *halted {
                    s.truth
                        .halted_since
                        .entry(service_type.clone())
                        .or_insert(now);
                } else {
                    s.truth.halted_since.remove(service_type);
                }
                // Any change of the switch lifts an undo's pin (a pin
                // comes right after, as `RolloutPinned`).
                if service_type == crate::world::SERVICE_TYPE {
                    if let Some(pin) = s.truth.pin.take() {
                        s.truth.lifted_pin = Some((pin, now));
                    }
                }
                if *halted && by_process {
                    // C8: a process halts a rollout only when an upgrade of
                    // that type has just failed for good (the worker fails
                    // the task, then halts).
                    let types: BTreeMap<i64, String> = self
                        .store()
                        .all_instances()
                        .into_iter()
                        .map(|i| (i.id, i.service_type))
                        .collect();
                    // Within 30 s, or since the process's previous effect:
                    // a process frozen between failing the task and
                    // halting halts late, and rightly.
                    // A process whose host was suspended stamps the task's
                    // end with its lagging clock (fifty-instance seed 2:
                    // five minutes early), so that much earlier counts too.
                    let lag = s.stood_still.get(&node).copied().unwrap_or_default();
                    let lately = previous_effect_at
                        .map_or(now, |at| at.min(now))
                        .min(now - jiff::SignedDuration::from_secs(30))
                        - lag;
                    // #40: or a successor of the type failed while it
                    // baked, and the pass reverting it halts first.
                    let baking = self.bakes_in_type(service_type, now);
                    let failed_upgrade = baking
                        || self.store().all_tasks().into_iter().any(|t| {
                            t.kind == TaskKind::Upgrade
                                && t.state == TaskState::Failed
                                && t.last_error.as_deref()
                                    != Some(stead::core::fleet::CANCELLED_BY_DELETION)
                                && t.updated_at >= lately
                                && types.get(&t.instance) == Some(service_type)
                        });
                    s.check(
                        "C8 a rollout halts only after an upgrade failed for good",
                        failed_upgrade,
                        || {
                            let upgrades: Vec<_> = self
                                .store()
                                .all_tasks()
                                .into_iter()
                                .filter(|t| t.kind == TaskKind::Upgrade)
                                .map(|t| (t.id, t.instance, t.state, t.updated_at, t.last_error))
                                .collect();
                            format!(
                                "{holder} halted the rollout of {service_type} though no upgrade of it had just failed \
                                 (since {lately}; its previous effect at {previous_effect_at:?}; upgrades: {upgrades:?})"
                            )
                        },
                    );
                }
            }
            Effect::InstanceState { instance, state } => {
                s.state_changed_at.insert(instance.clone(), now);
                let expiring = *state == InstanceState::Deleting
                    && by_process
                    && !s.truth.deleting.contains(instance);
                if expiring {
                    // Only the TTL check moves a live instance to deleting
                    // from inside stead; operators delete from outside.
                    let expires_at = self
                        .store()
                        .instance_now(instance)
                        .and_then(|i| i.expires_at);
                    Self::check_not_decided_on_a_step(&mut s, node, &format!("{instance} expired"));
                    let soon = add(now, CLOCK_TOLERANCE);
                    let due = expires_at.is_some_and(|at| at <= soon);
                    s.check("C7 never expired before its TTL", due, || {
                        format!("{instance} expired at {now}, its TTL is {expires_at:?}")
                    });
                }
                if matches!(state, InstanceState::Deleting | InstanceState::Deleted) {
                    s.truth.deleting.insert(instance.clone());
                }
                if *state == InstanceState::Deleted {
                    // Its hosts are free: a new instance of the same name
                    // is a stranger to them (N1).
                    s.host_servers.retain(|_, holder| holder != instance);
                }
            }
            // Checked by the topology invariants (at most one process
            // changes an instance at a time).
            Effect::InstanceLocked { instance, holder } => {
                if let Some(state) = self.store().instance_now(instance).map(|i| i.state) {
                    s.state_when_locked
                        .insert((instance.clone(), holder.clone()), state);
                }
            }
            Effect::InstanceUnlocked { instance, holder } => {
                s.state_when_locked
                    .remove(&(instance.clone(), holder.clone()));
                if !is_recovery(holder) {
                    s.released_by_others.insert(instance.clone(), now);
                }
            }
            // The proxy forgot a route by itself: nothing routes there now.
            Effect::RouteLost { service } => {
                s.routes.remove(service);
            }
            Effect::Inspected { id, seen } => {
                if by_process {
                    s.last_inspected.insert((id.clone(), holder.clone()), *seen);
                    let key = (id.clone(), holder.clone());
                    if s.refused_starts.get(&key) == Some(&StartFollowUp::Inspecting) {
                        let up = seen.is_some_and(|(status, _)| up_or_coming_up(status));
                        let found = if up {
                            StartFollowUp::FoundUp
                        } else {
                            StartFollowUp::FoundDown
                        };
                        s.refused_starts.insert(key, found);
                    }
                }
            }
            Effect::HealthRead { id, health } => {
                if by_process {
                    let reads = s
                        .unhealthy_reads
                        .entry((id.clone(), holder.clone()))
                        .or_default();
                    *reads = if *health == Health::Unhealthy {
                        *reads + 1
                    } else {
                        0
                    };
                    let reads = *reads;
                    if s.health_watched.contains(id) {
                        // The threshold-th read restarts in the same pass
                        // (budget reset, no fault): no read comes after it.
                        let threshold = self.policy.unhealthy_threshold;
                        s.check(
                            "L11 an unhealthy container is restarted at the threshold",
                            reads <= threshold,
                            || format!("{id} read unhealthy {reads} times in a row by {holder} and not restarted at the threshold ({threshold})"),
                        );
                    }
                }
            }
            Effect::Enqueue {
                instance,
                kind,
                fenced: true,
                refused_for,
            } => {
                // A planner's decision, judged against what its snapshot
                // held: the tick began after this process's previous one
                // ended, and a task created before then was in it (a task
                // once done or failed never becomes active again).
                let planned_after = s.tick_ended.get(&node).copied();
                let duplicate = refused_for.filter(|(_, created)| {
                    planned_after.is_some_and(|after| add(*created, CLOCK_TOLERANCE) < after)
                });
                s.check("S9 a planner never decides a duplicate task", duplicate.is_none(), || {
                    format!(
                        "{kind} of instance {instance} decided while task {:?} of that kind was active before the tick",
                        duplicate
                    )
                });
            }
            Effect::Enqueue { .. } => {}
            Effect::TaskReclaimed {
                task,
                holder: worker,
            } => {
                // T1: a restarted identity takes back only what its own
                // earlier incarnations held, and only once they are gone:
                // never a live process's task, never another identity's.
                let incarnation = worker.split('/').next().unwrap_or_default();
                let own = process.as_ref().is_some_and(|p| {
                    incarnation.starts_with(&format!("{}#", p.identity)) && incarnation != p.holder
                });
                let live = s.processes.values().any(|p| p.holder == incarnation);
                s.check(
                    "T1 only a gone incarnation's tasks are taken back early",
                    own && !live,
                    || format!("task {task} of {worker} requeued by {holder} (own identity: {own}, its holder live: {live})"),
                );
            }
            // U2 (#40): a move toward an undo's pin that a worker finished
            // leaves its instance at the pinned version, while the pin
            // holds (a resume may come first: the task then rolls out), the
            // task did not run across the pin's landing, and the instance
            // is meant to run (a stopped one is skipped).
            Effect::TaskDone {
                instance, reason, ..
            } => {
                let to = reason
                    .strip_prefix(stead::core::plan::PINNED_REASON)
                    .and_then(|rest| rest.trim_start().split(':').next())
                    .unwrap_or_default();
                let held = !to.is_empty() && s.truth.pin.as_ref().is_some_and(|p| p.version == to);
                let row = self
                    .store()
                    .all_instances()
                    .into_iter()
                    .find(|i| i.id == *instance);
                // A task that ran across the pin read the rollout before
                // it: a halt that lifted the pin meanwhile had it tidy and
                // end (fifty-instance seed 2: a re-pin landed while the
                // attempt ran, and U2 judged the tidy as the move).
                let across = |name: &InstanceName| {
                    s.truth.pin.as_ref().is_some_and(|p| p.began.contains(name))
                };
                if let Some(row) = row.filter(|r| {
                    held && !across(&r.name)
                        && !r.stopped
                        && !matches!(r.state, InstanceState::Deleting | InstanceState::Deleted)
                }) {
                    s.check(
                        "U2 a move toward a pin ends at the pinned version",
                        row.version == to,
                        || {
                            format!(
                                "{} moved toward {to} ends at {} ({reason})",
                                row.name, row.version
                            )
                        },
                    );
                }
            }
            // An undo's pin (#40), learnt from the store as it lands: an
            // operator's command may fail or be cut short after it. Tasks
            // running now read the rollout before it: U1 leaves what they
            // make to them.
            Effect::RolloutPinned {
                service_type,
                version,
            } if service_type == crate::world::SERVICE_TYPE => {
                let store = self.store();
                let services = store
                    .rollout_now(service_type)
                    .and_then(|(_, recorded)| recorded)
                    .and_then(|recorded| {
                        stead::core::catalog::Catalog::default()
                            .with_grants(crate::run::sim_grants())
                            .recorded_entry(service_type, version, &recorded.source)
                            .ok()
                    })
                    .map(|entry| entry.services.into_iter().map(|s| s.name).collect())
                    .unwrap_or_default();
                let names: BTreeMap<i64, InstanceName> = store
                    .all_instances()
                    .into_iter()
                    .map(|i| (i.id, i.name))
                    .collect();
                let began = store
                    .all_tasks()
                    .into_iter()
                    .filter(|t| t.state == TaskState::Running)
                    .filter_map(|t| names.get(&t.instance).cloned())
                    .collect();
                s.truth.pin = Some(Pin {
                    version: version.clone(),
                    began,
                    services,
                });
            }
            // The world pins only the Docker type.
            Effect::RolloutPinned { .. } => {}
            Effect::LeaseTakenByTwin {
                holder,
                from,
                from_expires_at,
                at,
            } => {
                // T1 (#41): two live processes of one identity (a copied
                // `state_dir`) never both lead. With T2 (every effect under
                // the lease the database names, unexpired), a lease that
                // passes between twins only once its grant ran out leaves
                // one of them acting at a time. Both instants are the
                // database's clock, as the store decided by it.
                let expired = from_expires_at.is_none_or(|e| e <= *at);
                s.check(
                    "T1 a live twin's lease is never taken over",
                    expired,
                    || {
                        format!(
                            "{holder} took the reconciler lease at {at} from its twin {from}, \
                         whose grant ran until {from_expires_at:?}"
                        )
                    },
                );
            }
            Effect::LeaseBroken { task, locked_at } => {
                Self::check_not_decided_on_a_step(&mut s, node, &format!("task {task} requeued"));
                let expiry = add(*locked_at, self.task_lease);
                let due = expiry <= add(now, CLOCK_TOLERANCE);
                s.check("C6 never broken before the lease expires", due, || {
                    format!("task {task}'s lease, taken at {locked_at}, broken at {now} before {expiry}")
                });
            }
            Effect::LeaseSweep {
                now: planned,
                freed,
            } => {
                // C6's planner sweeps only when a lease it saw had run out.
                // Had one, and had nothing moved since it looked, the
                // sweep (the same rule at the same `now`) would free it.
                let since =
                    *planned - jiff::SignedDuration::try_from(CLOCK_TOLERANCE).expect("fits");
                let moved = self
                    .store()
                    .all_tasks()
                    .iter()
                    .any(|t| t.updated_at >= since);
                s.check(
                    "C6 a lease sweep only when a lease ran out",
                    *freed > 0 || moved,
                    || {
                        format!(
                            "the leader swept for expired leases at {planned} though no running task's lease had run out"
                        )
                    },
                );
            }
            Effect::TaskRetried {
                task,
                instance,
                kind: TaskKind::Upgrade,
                run_after,
            } => {
                // C8: a failed upgrade runs again, like its first run, only
                // inside its instance's maintenance window (unless the
                // catalog is a security release), however its backoff falls.
                let window = self
                    .store()
                    .all_instances()
                    .into_iter()
                    .find(|i| i.id == *instance)
                    .and_then(|i| i.maintenance_window);
                if let (Some(spec), false) = (window, s.catalog_security) {
                    let inside = stead::core::window::Window::parse(&spec)
                        .is_ok_and(|window| window.contains(*run_after));
                    s.check("C8 a retried upgrade waits for its window", inside, || {
                        format!(
                            "upgrade task {task} of instance {instance} retried at {now} to run at {run_after}, outside {spec:?}"
                        )
                    });
                }
            }
            Effect::TaskRetried { .. } => {}
            Effect::InhibitionCleared { container, .. } => {
                s.truth.markers.remove(container);
                s.marker_cleared_at.insert(container.clone(), now);
                s.truth.inhibited.remove(container);
                s.truth.dropping.remove(container);
            }
        }
    }
}

impl Checker {
    /// S6: an independent model of the ladder. Within one streak of
    /// interventions on a generation, the k-th (k > free attempts) must
    /// follow the previous one by at least the ladder's delay. A streak
    /// resets when the generation ran crash-free for a stable window, or
    /// the daemon restarted (both re-arm the engine's budget too).
    fn check_budget(&self, s: &mut State, id: &ContainerId, holder: &str, now: Timestamp) {
        let free = self.policy.free_attempts as usize;
        let delays = self.policy.delays.clone();
        let window = self.policy.stable_window;
        // Another process's start brings the container up for every
        // process's streak: if it then stays up for the stable window, a
        // process that leads again later sees it stable and resets too.
        for ((c, h), streak) in s.streaks.iter_mut() {
            if c == id && h != holder {
                streak.up_since.get_or_insert(now);
            }
        }
        let streak = s
            .streaks
            .entry((id.clone(), holder.to_owned()))
            .or_default();
        let stayed_up = streak.up_since.is_some_and(|up| add(up, window) <= now);
        if streak.reset_earned || stayed_up {
            streak.interventions.clear();
        }
        streak.reset_earned = false;
        streak.interventions.push(now);
        streak.up_since = Some(now);
        let k = streak.interventions.len();
        let gap_ok = if k > free {
            let need = delays[(k - 1 - free).min(delays.len() - 1)];
            let gap = now.duration_since(streak.interventions[k - 2]);
            gap >= jiff::SignedDuration::try_from(need).unwrap_or(jiff::SignedDuration::MAX)
        } else {
            true
        };
        let detail = format!("{id}: intervention #{k} at {now} too soon after the previous one");
        s.check("S6 budget", gap_ok, || detail);
    }
}

/// Upper bound of the budget's cap, used by the liveness deadline.
pub fn ladder_cap(policy: &RecoveryPolicy) -> Duration {
    *policy.delays.last().expect("validated policy has delays")
}
