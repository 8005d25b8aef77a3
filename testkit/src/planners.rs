//! Random control-loop worlds and the properties of the four planners
//! (docs/rules.md C5–C8) over them.
//!
//! Shared, without duplication, by the cargo-fuzz target `planners`
//! (re-exported by `fuzz/src/lib.rs`) and by the property tests of
//! `tests/control_plan.rs` (as `stead_testkit::…`). Seeds are plain numbers so
//! that proptest strategies and `arbitrary` can both produce them; every
//! number maps onto a valid world by taking it modulo a small domain (a few
//! teams, service types, versions and window specs, times near `now`), so
//! that most worlds collide on something worth planning.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use stead::core::catalog::{Catalog, CatalogEntry};
use stead::core::fleet::{
    add, Instance, InstanceId, InstanceState, NewTask, Release, RolloutState, Task, TaskId,
    TaskKind, TaskState, CANCELLED_BY_DELETION,
};
use stead::core::plan::{ControlConfig, Decision, Plan, Planner, Report, Snapshot};
use stead::core::types::{InstanceName, Timestamp};

// Each check on its own, as the tests judge them; the engine runs all four
// on one `Planner` a tick, so these live with the tests, not in the core.

/// C5 on its own; see [`Planner::drift`].
pub fn plan_drift(snapshot: &Snapshot<'_>) -> Plan {
    Planner::new(snapshot).drift()
}

/// C6 on its own; see [`Planner::lease_expiry`].
pub fn plan_lease_expiry(snapshot: &Snapshot<'_>) -> Plan {
    Planner::new(snapshot).lease_expiry()
}

/// C7 on its own; see [`Planner::ttl`].
pub fn plan_ttl(snapshot: &Snapshot<'_>) -> Plan {
    Planner::new(snapshot).ttl()
}

/// C8 on its own; see [`Planner::version_drift`].
pub fn plan_version_drift(snapshot: &Snapshot<'_>) -> Plan {
    Planner::new(snapshot).version_drift()
}

/// The whole tick's plan: the four checks in the engine's order (drift,
/// lease expiry, TTL, version drift), each on the same snapshot, as the
/// engine runs them one by one.
pub fn plan_tick(snapshot: &Snapshot<'_>) -> Plan {
    let mut plan = Plan::default();
    for planner in [plan_drift, plan_lease_expiry, plan_ttl, plan_version_drift] {
        let part = planner(snapshot);
        plan.decisions.extend(part.decisions);
        plan.reports.extend(part.reports);
    }
    plan
}

/// Applies decisions to `snapshot` the way the store would, including its
/// refusals (a second active task of one kind, a failed compare-and-set).
/// Pure: the scenario tests and the planners' properties use it to check
/// that planning is idempotent. The engine carries decisions out through
/// the real store, and the simulation judges what reaches it (S9, C6, C7);
/// so this stand-in lives with the tests, not in the core.
pub fn apply_as_store(snapshot: &mut Snapshot<'_>, decisions: &[Decision]) {
    let mut next_id = snapshot.tasks.iter().map(|t| t.id).max().unwrap_or(0) + 1;
    for decision in decisions {
        match decision {
            Decision::Enqueue(task) => {
                if push_task(snapshot, task, next_id) {
                    next_id += 1;
                }
            }
            Decision::Expire {
                instance,
                from,
                task,
            } => {
                let Some(index) = snapshot.instances.iter().position(|i| i.id == *instance) else {
                    continue;
                };
                let state = snapshot.instances[index].state;
                if state != *from || !from.can_become(InstanceState::Deleting) {
                    continue;
                }
                if push_task(snapshot, task, next_id) {
                    next_id += 1;
                    snapshot.instances[index].state = InstanceState::Deleting;
                    snapshot.instances[index].updated_at = snapshot.now;
                    cancel_for_deletion(snapshot, *instance);
                }
            }
            Decision::RequeueExpiredLease { task, .. } => {
                if let Some(t) = snapshot.tasks.iter_mut().find(|t| t.id == *task) {
                    if t.state.can_become(TaskState::Queued) {
                        t.state = TaskState::Queued;
                        t.locked_by = None;
                        t.locked_at = None;
                        t.updated_at = snapshot.now;
                    }
                }
            }
            Decision::Notify(_) => {}
            Decision::HaltRollout { service_type, .. } => {
                snapshot
                    .rollouts
                    .insert(service_type.clone(), RolloutState::Halted);
            }
        }
    }
}

/// T4, as the store applies it with an expiry: the instance's queued
/// tasks but its deprovision are cancelled.
fn cancel_for_deletion(snapshot: &mut Snapshot<'_>, instance: InstanceId) {
    let now = snapshot.now;
    for t in snapshot.tasks.iter_mut() {
        if t.instance == instance && t.cancelled_by_deletion() {
            t.state = TaskState::Failed;
            t.last_error = Some(CANCELLED_BY_DELETION.to_owned());
            t.updated_at = now;
        }
    }
}

/// Inserts a queued task unless one of the same (instance, kind) is
/// active, as the database's partial unique index does.
fn push_task(snapshot: &mut Snapshot<'_>, task: &NewTask, id: TaskId) -> bool {
    let taken = snapshot
        .tasks
        .iter()
        .any(|t| t.instance == task.instance && t.kind == task.kind && t.state.is_active());
    if taken {
        return false;
    }
    snapshot.tasks.push(Task {
        id,
        kind: task.kind,
        instance: task.instance,
        state: TaskState::Queued,
        run_after: task.run_after,
        locked_by: None,
        locked_at: None,
        attempts: 0,
        reason: task.reason.clone(),
        last_error: None,
        traceparent: task.traceparent.clone(),
        created_at: snapshot.now,
        updated_at: snapshot.now,
    });
    true
}

/// Most instances in one world; the proptest generator stays below it.
pub const INSTANCES_MAX: usize = 24;
/// Most live releases in one world.
pub const RELEASES_MAX: usize = 30;

pub const TEAMS: [&str; 3] = ["platform", "acme", "zeta"];
/// `ghost` is in no catalog.
pub const TYPES: [&str; 3] = ["wiki", "db", "ghost"];
/// `3.0` is ahead of every catalog version.
pub const VERSIONS: [&str; 8] = ["1.0", "1.1", "2.0", "x", "v1.1", "1.10", "2.0.0-rc1", "3.0"];
/// The last one opens a minute after [`base`] (UTC): the explorer's
/// window whose opening minute a tick can land on.
pub const WINDOWS: [Option<&str>; 8] = [
    None,
    Some("sun 03:00-05:00"),
    Some("not a window"),
    Some("daily 00:00-23:59 Europe/Paris"),
    Some("mon-fri 22:00-02:00 America/New_York"),
    Some("daily 02:00-02:30 Australia/Lord_Howe"),
    Some("sat 25:00-26:00"),
    Some("daily 12:01-13:00"),
];
/// Task leases in seconds; running tasks were locked 60 s or 1000 s ago,
/// so some leases end exactly at `now`.
pub const LEASES_S: [u64; 5] = [300, 59, 60, 999, 1000];
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A Friday, two days before Europe's spring-forward night.
pub fn base() -> Timestamp {
    Timestamp::from_second(1_774_526_400).expect("valid") // 2026-03-26T12:00:00Z
}

fn at(now: Timestamp, offset_s: i64) -> Timestamp {
    now + jiff::SignedDuration::from_secs(offset_s)
}

/// One instance and its tasks.
#[derive(Clone, Debug)]
pub struct InstanceSeed {
    pub team: u8,
    pub service_type: u8,
    pub version: u8,
    pub state: u8,
    /// `expires_at` relative to `now`, in seconds.
    pub expires_s: Option<i8>,
    pub window: u8,
    /// Per task kind: 0 none, 1 queued, 2 running (locked 60 s ago), 3
    /// running (locked 1000 s ago), 4 done, 5 failed, 6 running without
    /// `locked_at` (a row another tool wrote).
    pub tasks: [u8; 4],
}

#[derive(Clone, Debug)]
pub struct WorldSeed {
    /// Minutes after [`base`].
    pub now_min: u16,
    pub instances: Vec<InstanceSeed>,
    /// Live releases as (instance number, in a foreign namespace); `None`
    /// when listing them failed.
    pub releases: Option<Vec<(u8, bool)>>,
    /// The store's rollout switches of wiki and db.
    pub halted: (bool, bool),
    /// Bits: wiki is a security release, db is *not* one, the catalog file
    /// halts wiki, it halts db, wiki's version is 1.10 rather than 1.1.
    pub catalog: u8,
    pub max_in_flight: u8,
    pub lease: u8,
}

/// A world the planners can look at: everything a [`Snapshot`] borrows.
#[derive(Clone, Debug)]
pub struct World {
    pub now: Timestamp,
    pub instances: Vec<Instance>,
    pub tasks: Vec<Task>,
    pub releases: Option<Vec<Release>>,
    pub catalog: Catalog,
    pub rollouts: BTreeMap<String, RolloutState>,
    /// Operators' undo pins (`rollout undo --to`), per halted type.
    pub pins: BTreeMap<String, CatalogEntry>,
    /// Instances whose markers ask for an operator's undo.
    pub undos: BTreeSet<InstanceId>,
    /// Instances whose successors bake; `None`: unread.
    pub baking: Option<BTreeSet<InstanceId>>,
    pub config: ControlConfig,
}

fn pick<T: Copy>(items: &[T], n: u8) -> T {
    items[usize::from(n) % items.len()]
}

/// A catalog entry of a Docker type with no services, for the seeds.
pub fn entry(service_type: &str, version: &str, security: bool, halted: bool) -> CatalogEntry {
    CatalogEntry {
        spec_digest: String::new(),
        parameters: Default::default(),
        service_type: service_type.to_owned(),
        version: version.to_owned(),
        security,
        rollout: if halted {
            RolloutState::Halted
        } else {
            RolloutState::Active
        },
        bake: std::time::Duration::ZERO,
        provisioning: stead::core::release::Provisioning::Docker,
        services: Vec::new(),
    }
}

fn task(id: i64, kind: TaskKind, instance: i64, code: u8, now: Timestamp) -> Option<Task> {
    let (state, locked_at) = match code % 7 {
        0 => return None,
        1 => (TaskState::Queued, None),
        2 => (TaskState::Running, Some(at(now, -60))),
        3 => (TaskState::Running, Some(at(now, -1000))),
        4 => (TaskState::Done, None),
        5 => (TaskState::Failed, None),
        _ => (TaskState::Running, None),
    };
    Some(Task {
        id,
        kind,
        instance,
        state,
        run_after: at(now, -600),
        locked_by: (state == TaskState::Running).then(|| "worker-1".to_owned()),
        locked_at,
        attempts: 1,
        reason: "seed".to_owned(),
        last_error: None,
        traceparent: None,
        created_at: at(now, -600),
        updated_at: at(now, -600),
    })
}

impl WorldSeed {
    pub fn build(&self) -> World {
        let now = at(base(), i64::from(self.now_min) * 60);
        let mut instances = Vec::new();
        let mut tasks = Vec::new();
        for (n, seed) in self.instances.iter().take(INSTANCES_MAX).enumerate() {
            let id = n as i64 + 1;
            instances.push(Instance {
                domains: Vec::new(),
                spec_digest: None,
                parameters: Default::default(),
                purge_volumes: false,
                id,
                name: InstanceName::new(format!("i{id}")),
                team: pick(&TEAMS, seed.team).to_owned(),
                service_type: pick(&TYPES, seed.service_type).to_owned(),
                version: pick(&VERSIONS, seed.version).to_owned(),
                state: pick(&InstanceState::ALL, seed.state),
                stopped: false,
                expires_at: seed.expires_s.map(|s| at(now, i64::from(s))),
                maintenance_window: pick(&WINDOWS, seed.window).map(str::to_owned),
                created_at: at(now, -86_400),
                updated_at: at(now, -86_400),
            });
            for (kind, &code) in TaskKind::ALL.into_iter().zip(&seed.tasks) {
                tasks.extend(task(tasks.len() as i64 + 1, kind, id, code, now));
            }
        }
        let releases = self.releases.as_ref().map(|live| {
            live.iter()
                .take(RELEASES_MAX)
                .map(|&(n, foreign)| Release {
                    name: format!("i{}", n % 32),
                    namespace: if foreign {
                        "other-team"
                    } else {
                        stead::core::release::DOCKER_RELEASE_NAMESPACE
                    }
                    .to_owned(),
                })
                .collect()
        });
        let bit = |b: u8| self.catalog & (1 << b) != 0;
        let wiki_version = if bit(4) { "1.10" } else { "1.1" };
        let catalog = Catalog::from_entries([
            entry("wiki", wiki_version, bit(0), bit(2)),
            entry("db", "2.0", !bit(1), bit(3)),
        ]);
        let mut rollouts = BTreeMap::new();
        if self.halted.0 {
            rollouts.insert("wiki".to_owned(), RolloutState::Halted);
        }
        if self.halted.1 {
            rollouts.insert("db".to_owned(), RolloutState::Halted);
        }
        let lease = Duration::from_secs(pick(&LEASES_S, self.lease));
        let config = ControlConfig {
            max_in_flight: u32::from(self.max_in_flight % 4) + 1,
            lease,
            provisioner_timeout: lease - Duration::from_secs(1),
            ..ControlConfig::default()
        };
        assert_eq!(config.validate(), Ok(()), "the seed builds a valid config");
        // Every other ready instance of a halted type has an operator's
        // undo asked of it, so the seeds put undos against the fleet limit.
        let halted = |service_type: &str| {
            rollouts.get(service_type) == Some(&RolloutState::Halted)
                || catalog
                    .get(service_type)
                    .is_some_and(|e| e.rollout == RolloutState::Halted)
        };
        let undos = instances
            .iter()
            .filter(|i| i.id % 2 == 0 && i.state == InstanceState::Ready && halted(&i.service_type))
            .map(|i| i.id)
            .collect::<BTreeSet<_>>();
        // Every third ready instance bakes, and so does every one with an
        // undo asked (its marker is a baking one); one world in eleven
        // could not read the markers.
        let baking = (self.now_min % 11 != 5).then(|| {
            instances
                .iter()
                .filter(|i| i.state == InstanceState::Ready && i.id % 3 == 0)
                .map(|i| i.id)
                .chain(undos.iter().copied())
                .collect()
        });
        World {
            now,
            instances,
            tasks,
            releases,
            catalog,
            rollouts,
            pins: BTreeMap::new(),
            undos,
            baking,
            config,
        }
    }
}

impl World {
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            now: self.now,
            instances: self.instances.clone(),
            unreadable_instances: 0,
            tasks: self.tasks.clone(),
            releases: self.releases.clone(),
            catalog: &self.catalog,
            rollouts: self.rollouts.clone(),
            config: &self.config,
            traceparent: Some(TRACEPARENT.to_owned()),
            lost_services: Default::default(),
            pins: self.pins.clone(),
            undos: self.undos.clone(),
            baking: self.baking.clone(),
        }
    }

    /// One tick: the four checks planned on this world, their decisions
    /// applied as the store would ([`apply_as_store`]); returns the plan.
    pub fn tick(&mut self) -> Plan {
        let mut snapshot = self.snapshot();
        let plan = plan_tick(&snapshot);
        apply_as_store(&mut snapshot, &plan.decisions);
        let Snapshot {
            instances,
            tasks,
            rollouts,
            ..
        } = snapshot;
        self.instances = instances;
        self.tasks = tasks;
        self.rollouts = rollouts;
        plan
    }
}

fn active_pairs(snapshot: &Snapshot<'_>) -> Vec<(i64, TaskKind)> {
    snapshot
        .tasks
        .iter()
        .filter(|t| t.state.is_active())
        .map(|t| (t.instance, t.kind))
        .collect()
}

/// The instances an upgrade is queued or running for, or that bake.
fn upgrades_in_flight(snapshot: &Snapshot<'_>) -> BTreeSet<InstanceId> {
    snapshot
        .tasks
        .iter()
        .filter(|t| t.state.is_active() && t.kind == TaskKind::Upgrade)
        .map(|t| t.instance)
        .chain(snapshot.baking.iter().flatten().copied())
        .collect()
}

/// Whether `service_type`'s rollout is halted with no undo's pin to move
/// its instances to.
fn halted(snapshot: &Snapshot<'_>, service_type: &str) -> bool {
    let halted = snapshot.rollouts.get(service_type) == Some(&RolloutState::Halted)
        || snapshot
            .catalog
            .get(service_type)
            .is_some_and(|e| e.rollout == RolloutState::Halted);
    halted && !snapshot.pins.contains_key(service_type)
}

/// The store never has to refuse an insert (no planner proposes a second
/// active task of one kind for an instance), and after applying the plan
/// no instance has two.
pub fn check_no_duplicate_active_tasks(world: &World) {
    let mut snapshot = world.snapshot();
    let plan = plan_tick(&snapshot);
    let inserts = plan
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Enqueue(_) | Decision::Expire { .. }))
        .count();
    let before = snapshot.tasks.len();
    apply_as_store(&mut snapshot, &plan.decisions);
    assert_eq!(
        snapshot.tasks.len() - before,
        inserts,
        "the store refused an insert of {:?}",
        plan.decisions
    );
    let pairs = active_pairs(&snapshot);
    let unique: BTreeSet<_> = pairs.iter().collect();
    assert_eq!(
        unique.len(),
        pairs.len(),
        "two active tasks of one kind: {pairs:?}"
    );
}

/// At most `max_in_flight` upgrades are queued or running after the plan,
/// counting those already there; none is added at or over the limit, and
/// none for a halted service type.
pub fn check_in_flight_limit(world: &World) {
    let mut snapshot = world.snapshot();
    let in_flight = upgrades_in_flight(&snapshot).len();
    let plan = plan_tick(&snapshot);
    apply_as_store(&mut snapshot, &plan.decisions);
    let limit = world.config.max_in_flight as usize;
    let after = upgrades_in_flight(&snapshot).len();
    assert!(
        after <= limit.max(in_flight),
        "{after} upgrades in flight, limit {limit}"
    );
    if in_flight >= limit {
        // A TTL expiry in the same plan may cancel a queued upgrade (T4), so
        // the count may drop; it never grows.
        assert!(after <= in_flight, "an upgrade was added at the limit");
    }
    for decision in &plan.decisions {
        if let Decision::Enqueue(t) = decision {
            if t.kind == TaskKind::Upgrade {
                let i = world
                    .instances
                    .iter()
                    .find(|i| i.id == t.instance)
                    .expect("known");
                // An operator's undo is carried out by an upgrade task of
                // the halted type.
                let undo =
                    t.reason == stead::core::plan::UNDO_REASON && world.undos.contains(&t.instance);
                assert!(
                    undo || !halted(&snapshot, &i.service_type),
                    "upgrade of halted {}",
                    i.service_type
                );
                assert!(
                    world.baking.is_some(),
                    "upgrade of {} while which instances bake was unknown",
                    i.name
                );
            }
        }
    }
    check_waves(world, &plan);
}

/// #55: a type's rollout goes in waves. Where a plan starts upgrades of a
/// type toward its catalog version, the type has no more in flight after
/// it than one more than its instances already there (ready, running, at
/// the catalog's version and spec, neither upgrading nor baking). A
/// baking instance moving on in its own slot starts no wave.
fn check_waves(world: &World, plan: &Plan) {
    let mut snapshot = world.snapshot();
    apply_as_store(&mut snapshot, &plan.decisions);
    let in_flight_before = upgrades_in_flight(&world.snapshot());
    let in_flight_after = upgrades_in_flight(&snapshot);
    let started: BTreeSet<&str> = plan
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Enqueue(t)
                if t.kind == TaskKind::Upgrade
                    && !in_flight_before.contains(&t.instance)
                    && !t.reason.starts_with(stead::core::plan::UNDO_REASON)
                    && !t.reason.starts_with(stead::core::plan::PINNED_REASON) =>
            {
                world.instances.iter().find(|i| i.id == t.instance)
            }
            _ => None,
        })
        .map(|i| i.service_type.as_str())
        .collect();
    for service_type in started {
        let entry = world
            .catalog
            .get(service_type)
            .expect("an upgraded type is in the catalog");
        let of_type = world
            .instances
            .iter()
            .filter(|i| i.service_type == service_type);
        let at_target = |i: &&Instance| {
            i.state == InstanceState::Ready
                && !i.stopped
                && !stead::core::plan::is_behind(&i.version, &entry.version)
                && (i.version != entry.version
                    || i.spec_digest
                        .as_deref()
                        .is_none_or(|d| d == entry.spec_digest))
        };
        let done = of_type
            .clone()
            .filter(|i| !in_flight_before.contains(&i.id))
            .filter(at_target)
            .count();
        let flying = of_type.filter(|i| in_flight_after.contains(&i.id)).count();
        assert!(
            flying <= done + 1,
            "{flying} upgrades of {service_type} in flight with {done} done: a wave wider than \
             the bakes before it allow"
        );
    }
}

/// Planning again on a snapshot that contains the plan's effects decides
/// nothing (the module's idempotence contract).
pub fn check_idempotent(world: &World) {
    let mut snapshot = world.snapshot();
    let plan = plan_tick(&snapshot);
    apply_as_store(&mut snapshot, &plan.decisions);
    let again = plan_tick(&snapshot);
    assert!(
        again.decisions.is_empty(),
        "second plan: {:?}",
        again.decisions
    );
}

/// The tick is the four checks in order, and every decision is well
/// formed: it names a known instance or running task, an enqueued task
/// carries the tick's trace context and never runs before `now`, a lease is
/// requeued only once it has run out, and an unparsable window is reported
/// rather than scheduled.
pub fn check_plan_shape(world: &World) {
    let snapshot = world.snapshot();
    let plan = plan_tick(&snapshot);
    let mut parts = Plan::default();
    for part in [
        plan_drift(&snapshot),
        plan_lease_expiry(&snapshot),
        plan_ttl(&snapshot),
        plan_version_drift(&snapshot),
    ] {
        parts.decisions.extend(part.decisions);
        parts.reports.extend(part.reports);
    }
    assert_eq!(plan, parts, "the tick is not the four checks in order");
    let instance = |id: i64| {
        world
            .instances
            .iter()
            .find(|i| i.id == id)
            .unwrap_or_else(|| panic!("decision about unknown instance {id}"))
    };
    for decision in &plan.decisions {
        match decision {
            Decision::Enqueue(t) | Decision::Expire { task: t, .. } => {
                instance(t.instance);
                assert_eq!(t.traceparent.as_deref(), Some(TRACEPARENT));
                assert!(t.run_after >= world.now, "{t:?} runs before now");
            }
            Decision::RequeueExpiredLease { task, .. } => {
                let t = world
                    .tasks
                    .iter()
                    .find(|t| t.id == *task)
                    .expect("known task");
                assert_eq!(t.state, TaskState::Running);
                if let Some(locked_at) = t.locked_at {
                    assert!(
                        world.now > add(locked_at, world.config.lease),
                        "lease broken early"
                    );
                }
            }
            Decision::Notify(n) => assert_eq!(instance(n.instance).team, n.team),
            Decision::HaltRollout { .. } => panic!("planners never halt a rollout"),
        }
        if let Decision::Expire {
            instance: id, from, ..
        } = decision
        {
            assert_eq!(instance(*id).state, *from);
        }
    }
    for report in &plan.reports {
        if let Report::BadWindow { instance: id, .. } = report {
            let spec = instance(*id)
                .maintenance_window
                .as_deref()
                .expect("has a window");
            assert!(stead::core::window::Window::parse(spec).is_err());
        }
    }
}

/// `stead plan`'s forecast (#55) agrees with the planner it runs: its
/// first round, when it starts at `now`, is exactly the upgrades version
/// drift enqueues now (when the bakes are known); no instance is upgraded
/// twice or toward anything but its type's target; and every instance away
/// from its target at the start (of a known type, not in flight, not on
/// its way out) is either upgraded or left with a reason, never both.
pub fn check_forecast(world: &World) {
    let snapshot = world.snapshot();
    let forecast = stead::core::plan::forecast(&snapshot, Duration::from_secs(40 * 86_400));
    let name_of = |id: InstanceId| {
        world
            .instances
            .iter()
            .find(|i| i.id == id)
            .map(|i| i.name.clone())
            .expect("a known instance")
    };
    let now_upgrades: Vec<InstanceName> = plan_version_drift(&snapshot)
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Enqueue(t) if t.kind == TaskKind::Upgrade => Some(name_of(t.instance)),
            _ => None,
        })
        .collect();
    if world.baking.is_some() {
        let first: Vec<InstanceName> = forecast
            .rounds
            .first()
            .filter(|r| r.at == world.now)
            .map(|r| r.upgrades.iter().map(|u| u.name.clone()).collect())
            .unwrap_or_default();
        let mut expected = now_upgrades.clone();
        expected.sort();
        let mut got = first.clone();
        got.sort();
        // With nothing to start now, a round of the same instant may come
        // once what was in flight is settled.
        if !expected.is_empty() {
            assert_eq!(
                got, expected,
                "forecast's first round against version drift's"
            );
        }
    }
    let mut upgraded: BTreeSet<InstanceName> = BTreeSet::new();
    for round in &forecast.rounds {
        assert!(round.at >= world.now, "a round before now: {round:?}");
        for upgrade in &round.upgrades {
            assert!(
                upgraded.insert(upgrade.name.clone()),
                "{} upgraded twice: {forecast:?}",
                upgrade.name
            );
            let target = world
                .pins
                .get(&upgrade.service_type)
                .or_else(|| world.catalog.get(&upgrade.service_type))
                .expect("an upgrade of a known type");
            assert_eq!(upgrade.to, target.version, "{upgrade:?}");
        }
    }
    let left: BTreeSet<InstanceName> = forecast.left.iter().map(|l| l.name.clone()).collect();
    for instance in &world.instances {
        let busy = world.tasks.iter().any(|t| {
            t.instance == instance.id
                && t.state.is_active()
                && matches!(t.kind, TaskKind::Upgrade | TaskKind::Deprovision)
        }) || world.baking.iter().flatten().any(|id| *id == instance.id);
        let Some(target) = world
            .pins
            .get(&instance.service_type)
            .map(|pin| (pin, true))
            .or_else(|| {
                world
                    .catalog
                    .get(&instance.service_type)
                    .map(|e| (e, false))
            })
        else {
            continue;
        };
        let away = match target {
            (pin, true) => instance.version != pin.version,
            (entry, false) => {
                stead::core::plan::is_behind(&instance.version, &entry.version)
                    || stead::core::plan::spec_changed(instance, entry)
            }
        };
        let (moved, stays) = (
            upgraded.contains(&instance.name),
            left.contains(&instance.name),
        );
        assert!(
            !(moved && stays),
            "{} both upgraded and left",
            instance.name
        );
        if away && !busy {
            assert!(
                moved || stays,
                "{} is away from its target, yet neither upgraded nor left: {forecast:?}",
                instance.name
            );
        }
    }
}
