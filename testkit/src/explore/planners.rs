//! The control loop's four planners (docs/rules.md C5–C8), explored
//! exhaustively over small worlds: one or two instances, their tasks, the
//! releases, the catalog and the rollout switch, and `now` landing on the
//! instants where the rules turn (a lease's exact expiry and the second
//! after it, a TTL's exact instant, a window's opening minute).
//!
//! A run builds a world from a [`WorldSeed`] (the seeds of
//! `testkit/src/planners.rs`, which the property tests and the fuzzer
//! draw at random), then ticks it [`TICKS`] times as the engine does:
//! the four checks planned on one snapshot (`plan_tick`) and applied as the
//! store would (`apply_as_store`, [`World::tick`]). Between two ticks a
//! worker may claim, finish or fail a task, and time passes: a tick
//! interval, or a jump to one of the world's interesting instants.
//!
//! - **Setup** (free): one instance or two, `max_in_flight` 1 or 2.
//! - **Faults** (counted against the depth; the first option is the plain
//!   world): every departure from a plain world of ready, own-team wiki
//!   instances one version behind the catalog, with no TTL, no window and
//!   no task, every release listed and a 300 s lease: the other team, the
//!   db type, a version at or ahead of the catalog's, another state, an
//!   operator's stop, a TTL
//!   after, at or before `now`, a window open, opening in a minute, closed
//!   or unparsable, a task queued, running (locked 60 s or 1000 s ago, or
//!   without `locked_at`), done or failed, of any kind (its kind is a setup
//!   choice), a security release, the rollout halted (by the store or the
//!   catalog) or pinned by an undo, a release missing or the listing
//!   failed, a lease of 60 s (a task locked 60 s ago is at its exact
//!   expiry) or 59 s (past it); between ticks, a worker's step and a jump
//!   in time.
//!
//! Safety after every tick, exact ([`check_tick`]), with the rule texts of
//! docs/rules.md and the simulation's checker: C6 (no lease broken before
//! it expired, every expired one returned), C7 (an instance past its TTL
//! sent to deletion at the first tick at or after its instant, never
//! before; every deleting instance has its deprovision), C8 (the fleet-wide
//! limit filled exactly, own team first then type, name and id, only
//! inside the window unless urgent, due at once, nothing for a halted type,
//! a plan independent of the rows' order), S9 (one active task per
//! instance and kind, none refused by the store); and the testkit's own
//! properties of the planners (`check_*`) on the world each tick planned.

use std::collections::BTreeSet;
use std::time::Duration;

use stead::core::broken::Mutant;
use stead::core::catalog::CatalogEntry;
use stead::core::fleet::{
    add, Instance, InstanceState, RolloutState, Task, TaskKind, TaskState, CANCELLED_BY_DELETION,
};
use stead::core::plan::{Decision, Plan};
use stead::core::release::DOCKER_RELEASE_NAMESPACE;
use stead::core::types::Timestamp;
use stead::core::window::{next_run_after, Window};

use super::Chooser;
use crate::planners::{
    check_idempotent, check_in_flight_limit, check_no_duplicate_active_tasks, check_plan_shape,
    entry, plan_tick, InstanceSeed, World, WorldSeed, LEASES_S, TEAMS, TYPES, VERSIONS, WINDOWS,
};

/// Ticks per run: two intervals for a worker and time to act between.
pub const TICKS: usize = 3;
/// Time between two ticks when it passes as usual (the default
/// `control.tick_interval_s`).
const TICK: Duration = Duration::from_secs(60);

/// The explored types (both in the catalog) and their catalog versions.
const EXPLORED_TYPES: [&str; 2] = ["wiki", "db"];
/// Per type: a version behind the catalog's, the catalog's, one ahead.
const WIKI_VERSIONS: [&str; 3] = ["1.0", "1.1", "3.0"];
const DB_VERSIONS: [&str; 3] = ["1.1", "2.0", "3.0"];
/// The version an undo pins wiki to.
const PINNED_VERSION: &str = "1.0";
const STATES: [InstanceState; 6] = [
    InstanceState::Ready,
    InstanceState::Upgrading,
    InstanceState::Failed,
    InstanceState::Provisioning,
    InstanceState::Deleting,
    InstanceState::Deleted,
];
/// TTL relative to `now`: none, after, at, before.
const TTLS: [Option<i8>; 4] = [None, Some(60), Some(0), Some(-1)];
/// Windows: none, open at `now`, opening a minute later, closed (opens in
/// days), unparsable.
const EXPLORED_WINDOWS: [Option<&str>; 5] = [
    None,
    Some("daily 00:00-23:59 Europe/Paris"),
    Some("daily 12:01-13:00"),
    Some("sun 03:00-05:00"),
    Some("not a window"),
];
/// A seed's task codes (see [`InstanceSeed::tasks`]): none, queued,
/// running locked 60 s ago, running locked 1000 s ago, done, failed,
/// running without `locked_at`.
const TASK_CODES: usize = 7;
/// Task kinds, the upgrade first.
const KINDS: [TaskKind; 4] = [
    TaskKind::Upgrade,
    TaskKind::Reprovision,
    TaskKind::Deprovision,
    TaskKind::Provision,
];
/// Leases: plain, exactly at a 60 s-old lock's expiry, just past it.
const LEASES: [u64; 3] = [300, 60, 59];

fn index<T: PartialEq + Copy>(items: &[T], item: T) -> u8 {
    let n = items
        .iter()
        .position(|x| *x == item)
        .expect("the explorer's values are among the seeds'");
    u8::try_from(n).expect("small")
}

/// One instance's seed, each attribute a choice, and whether an operator
/// stopped it (its intent, which the seeds leave running).
fn instance_seed(ch: &mut Chooser) -> (InstanceSeed, bool) {
    let team = ch.choose(2);
    let service_type = EXPLORED_TYPES[ch.choose(2)];
    let versions = if service_type == "wiki" {
        WIKI_VERSIONS
    } else {
        DB_VERSIONS
    };
    let version = versions[ch.choose(3)];
    let state = STATES[ch.choose(STATES.len())];
    let expires_s = TTLS[ch.choose(TTLS.len())];
    let stopped = ch.choose(2) == 1;
    let window = EXPLORED_WINDOWS[ch.choose(EXPLORED_WINDOWS.len())];
    let code = ch.choose(TASK_CODES);
    let mut tasks = [0; 4];
    if code != 0 {
        let kind = KINDS[ch.setup(KINDS.len())];
        tasks[index(&TaskKind::ALL, kind) as usize] = code as u8;
    }
    let seed = InstanceSeed {
        team: team as u8,
        service_type: index(&TYPES, service_type),
        version: index(&VERSIONS, version),
        state: index(&InstanceState::ALL, state),
        expires_s,
        window: index(&WINDOWS, window),
        tasks,
    };
    (seed, stopped)
}

/// The world a run starts from.
fn world(ch: &mut Chooser, broken: Option<Mutant>) -> World {
    let count = 1 + ch.setup(2);
    let max_in_flight = ch.setup(2) as u8;
    let security = ch.choose(2) == 1;
    // Wiki's rollout: active, halted by the store's switch, halted by the
    // catalog file, or halted and pinned by an undo.
    let rollout = ch.choose(4);
    // Releases: every instance's listed, the first one's missing, or the
    // listing failed.
    let releases = ch.choose(3);
    let lease = LEASES[ch.choose(LEASES.len())];
    // Bakes (#55): only undone instances', also the first instance's, or
    // the markers unread.
    let bakes = ch.choose(3);
    let (instances, stopped): (Vec<InstanceSeed>, Vec<bool>) =
        (0..count).map(|_| instance_seed(ch)).unzip();
    let seed = WorldSeed {
        now_min: 0,
        releases: match releases {
            0 => Some((1..=count as u8).map(|n| (n, false)).collect()),
            1 => Some((2..=count as u8).map(|n| (n, false)).collect()),
            _ => None,
        },
        instances,
        halted: (rollout == 1 || rollout == 3, false),
        // Bit 0: wiki is a security release; bit 1: db is not one; bit 2:
        // the catalog halts wiki.
        catalog: u8::from(security) | 0b10 | (u8::from(rollout == 2) << 2),
        max_in_flight,
        lease: index(&LEASES_S, lease),
    };
    let mut world = seed.build();
    assert_eq!(world.config.own_team, TEAMS[0], "team 0 is the own team");
    if rollout == 3 {
        world.pins.insert(
            "wiki".to_owned(),
            entry("wiki", PINNED_VERSION, false, false),
        );
    }
    for (instance, stopped) in world.instances.iter_mut().zip(stopped) {
        instance.stopped = stopped;
    }
    world.baking = match bakes {
        0 => Some(world.undos.clone()),
        1 => Some(world.undos.iter().copied().chain([1]).collect()),
        _ => None,
    };
    world.config.broken = broken;
    world
}

/// What a worker may do between two ticks: claim the first queued task
/// that is due, or finish or fail the first running one.
#[derive(Clone, Copy, Debug)]
enum Work {
    Claim(usize),
    Finish(usize),
    Fail(usize),
}

fn work_on_offer(world: &World) -> Vec<Work> {
    let mut offer = Vec::new();
    if let Some(n) = world
        .tasks
        .iter()
        .position(|t| t.state == TaskState::Queued && t.run_after <= world.now)
    {
        offer.push(Work::Claim(n));
    }
    if let Some(n) = world
        .tasks
        .iter()
        .position(|t| t.state == TaskState::Running)
    {
        offer.push(Work::Finish(n));
        offer.push(Work::Fail(n));
    }
    offer
}

/// A worker's step, as the worker and the store carry it out.
fn work(world: &mut World, step: Work) {
    let now = world.now;
    match step {
        Work::Claim(n) => {
            let t = &mut world.tasks[n];
            t.state = TaskState::Running;
            t.locked_by = Some("worker-2".to_owned());
            t.locked_at = Some(now);
            t.attempts += 1;
            t.updated_at = now;
        }
        Work::Finish(n) | Work::Fail(n) => {
            let done = matches!(step, Work::Finish(_));
            let t = &mut world.tasks[n];
            t.state = if done {
                TaskState::Done
            } else {
                TaskState::Failed
            };
            t.locked_by = None;
            t.updated_at = now;
            let (kind, id) = (t.kind, t.instance);
            let target = {
                let i = world.instances.iter().find(|i| i.id == id).expect("known");
                target(world, &i.service_type).map(|(e, _)| e.version.clone())
            };
            let i = world
                .instances
                .iter_mut()
                .find(|i| i.id == id)
                .expect("known");
            match (kind, done) {
                (TaskKind::Upgrade, true) => {
                    if let Some(version) = target {
                        i.version = version;
                    }
                    i.state = InstanceState::Ready;
                }
                // C8: a failed upgrade halts its type's rollout.
                (TaskKind::Upgrade, false) => {
                    let service_type = i.service_type.clone();
                    world.rollouts.insert(service_type, RolloutState::Halted);
                }
                (TaskKind::Deprovision, true) => i.state = InstanceState::Deleted,
                (TaskKind::Provision | TaskKind::Reprovision, true)
                    if i.state != InstanceState::Deleting =>
                {
                    i.state = InstanceState::Ready
                }
                _ => {}
            }
            i.updated_at = now;
        }
    }
}

/// The instants after `now` where a rule turns: each running task's
/// lease expiry and the second after it, each TTL, each window's next
/// opening.
fn interesting_instants(world: &World) -> BTreeSet<Timestamp> {
    let now = world.now;
    let mut instants = BTreeSet::new();
    for t in world.tasks.iter().filter(|t| t.state == TaskState::Running) {
        if let Some(at) = t.locked_at {
            let expiry = add(at, world.config.lease);
            instants.insert(expiry);
            instants.insert(add(expiry, Duration::from_secs(1)));
        }
    }
    for i in &world.instances {
        instants.extend(i.expires_at);
        if let Some(Ok(window)) = i.maintenance_window.as_deref().map(Window::parse) {
            instants.insert(next_run_after(&window, now));
        }
    }
    instants.retain(|at| *at > now && *at != add(now, TICK));
    instants
}

/// Between two ticks: perhaps a worker's step, then time passes.
fn between(ch: &mut Chooser, world: &mut World) {
    let offer = work_on_offer(world);
    let pick = ch.choose(offer.len() + 1);
    if pick > 0 {
        let step = offer[pick - 1];
        work(world, step);
        ch.step(|| format!("a worker: {step:?} ({:?})", world.tasks[task_of(step)]));
    }
    let mut times = vec![add(world.now, TICK)];
    times.extend(interesting_instants(world));
    let then = times[ch.choose(times.len())];
    ch.step(|| format!("time passes to {then}"));
    world.now = then;
}

fn task_of(step: Work) -> usize {
    match step {
        Work::Claim(n) | Work::Finish(n) | Work::Fail(n) => n,
    }
}

/// One run: a world, then [`TICKS`] ticks, every rule checked after each.
pub fn run(ch: &mut Chooser, broken: Option<Mutant>) {
    let mut world = world(ch, broken);
    ch.step(|| {
        format!(
            "a world at {}: max_in_flight {}, lease {:?}, catalog {:?}, rollouts {:?}, pins {:?}, releases {:?}, baking {:?}",
            world.now,
            world.config.max_in_flight,
            world.config.lease,
            world
                .catalog
                .entries()
                .map(|e| (&e.service_type, &e.version, e.security, e.rollout))
                .collect::<Vec<_>>(),
            world.rollouts,
            world.pins.keys().collect::<Vec<_>>(),
            world.releases.as_ref().map(|r| r.iter().map(|r| &r.name).collect::<Vec<_>>()),
            world.baking,
        )
    });
    for i in &world.instances {
        ch.step(|| {
            format!(
                "{} (id {}): team {}, {} {}, {}{}, expires {:?}, window {:?}",
                i.name,
                i.id,
                i.team,
                i.service_type,
                i.version,
                i.state,
                if i.stopped { " (stopped)" } else { "" },
                i.expires_at,
                i.maintenance_window
            )
        });
    }
    for t in &world.tasks {
        ch.step(|| describe(t));
    }
    for tick in 0..TICKS {
        if tick > 0 {
            between(ch, &mut world);
        }
        let before = world.clone();
        let plan = world.tick();
        ch.step(|| format!("tick at {}: {:?}", before.now, plan.decisions));
        check_tick(&before, &plan, &world);
        check_no_duplicate_active_tasks(&before);
        check_in_flight_limit(&before);
        check_idempotent(&before);
        check_plan_shape(&before);
        ch.state(&(&world.now, &world.instances, &world.tasks, &world.rollouts));
    }
}

fn describe(t: &Task) -> String {
    format!(
        "task {} {} of instance {}: {} (locked at {:?}, due {})",
        t.id, t.kind, t.instance, t.state, t.locked_at, t.run_after
    )
}

/// What `service_type` rolls toward in `world`: an undo's pin, else the
/// catalog's entry unless the rollout is halted (by the store's switch or
/// the catalog file). `true` when pinned.
fn target<'w>(world: &'w World, service_type: &str) -> Option<(&'w CatalogEntry, bool)> {
    if let Some(pin) = world.pins.get(service_type) {
        return Some((pin, true));
    }
    let entry = world.catalog.get(service_type)?;
    let halted = entry.rollout == RolloutState::Halted
        || world.rollouts.get(service_type) == Some(&RolloutState::Halted);
    (!halted).then_some((entry, false))
}

/// The rule's "newer": numbers separated by dots, compared number by
/// number; a version not of that shape is behind whenever it differs.
fn behind(version: &str, catalog: &str) -> bool {
    let numbers = |v: &str| -> Option<Vec<u64>> { v.split('.').map(|n| n.parse().ok()).collect() };
    match (numbers(version), numbers(catalog)) {
        (Some(mut a), Some(mut b)) => {
            let len = a.len().max(b.len());
            a.resize(len, 0);
            b.resize(len, 0);
            a < b
        }
        _ => version != catalog,
    }
}

fn active(world: &World, instance: i64) -> bool {
    world
        .tasks
        .iter()
        .any(|t| t.instance == instance && t.state.is_active())
}

/// C8's "may be upgraded", apart from the window and the limit: ready,
/// running intent, not expired, away from its type's target (behind the
/// catalog, or anywhere but an undo's pin), no task of its own in flight,
/// and its release there when the listing answered (C5 first).
fn may_upgrade(world: &World, i: &Instance) -> bool {
    may_undo(world, i) || may_drift(world, i)
}

/// C8: an operator's undo asked of a ready, live instance with no task
/// yet is carried out by an upgrade task, its type halted or not.
fn may_undo(world: &World, i: &Instance) -> bool {
    world.undos.contains(&i.id)
        && i.state == InstanceState::Ready
        && i.expires_at.is_none_or(|at| at > world.now)
        && !active(world, i.id)
}

/// C8's version drift proper.
fn may_drift(world: &World, i: &Instance) -> bool {
    let away = target(world, &i.service_type).is_some_and(|(entry, pinned)| {
        if pinned {
            i.version != entry.version
        } else {
            behind(&i.version, &entry.version)
        }
    });
    i.state == InstanceState::Ready
        && !i.stopped
        && i.expires_at.is_none_or(|at| at > world.now)
        && away
        && !active(world, i.id)
        && world.releases.as_ref().is_none_or(|live| {
            live.iter()
                .any(|r| r.name == i.name.as_str() && r.namespace == DOCKER_RELEASE_NAMESPACE)
        })
}

/// C8: an upgrade may be queued now: a security release or a move to a
/// pin waits for no window; otherwise none, or one that parses and is open.
fn window_allows(world: &World, i: &Instance) -> bool {
    let urgent = world.undos.contains(&i.id)
        || target(world, &i.service_type).is_some_and(|(e, pinned)| e.security || pinned);
    urgent
        || i.maintenance_window
            .as_deref()
            .is_none_or(|spec| Window::parse(spec).is_ok_and(|window| window.contains(world.now)))
}

/// C8's order: undos first, then the own team, then type, name and id.
fn order(world: &World, i: &Instance) -> (bool, bool, String, String, i64) {
    (
        !world.undos.contains(&i.id),
        i.team != world.config.own_team,
        i.service_type.clone(),
        i.name.to_string(),
        i.id,
    )
}

/// The instances that hold a slot of `max_in_flight`: an upgrade queued or
/// running, or a successor baking (#55).
fn upgrades_in_flight(world: &World) -> BTreeSet<i64> {
    world
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Upgrade && t.state.is_active())
        .map(|t| t.instance)
        .chain(world.baking.iter().flatten().copied())
        .collect()
}

/// #55's waves: a drift toward the catalog's version may start while the
/// type has fewer instances in flight than one more than those already
/// on the version (ready, running, neither upgrading nor baking). A move
/// to a pin and an undo wait for no wave.
fn wave_has_room(world: &World, i: &Instance) -> bool {
    if may_undo(world, i) {
        return true;
    }
    let Some((entry, pinned)) = target(world, &i.service_type) else {
        return false;
    };
    if pinned {
        return true;
    }
    let in_flight = upgrades_in_flight(world);
    let of_type = world
        .instances
        .iter()
        .filter(|o| o.service_type == i.service_type);
    let flying = of_type
        .clone()
        .filter(|o| in_flight.contains(&o.id))
        .count();
    let done = of_type
        .filter(|o| {
            !in_flight.contains(&o.id)
                && o.state == InstanceState::Ready
                && !o.stopped
                && !behind(&o.version, &entry.version)
        })
        .count();
    flying < done + 1
}

/// Every rule of one tick, exactly: `before` is the world the tick
/// planned on, `after` the world once its plan was applied.
pub fn check_tick(before: &World, plan: &Plan, after: &World) {
    let now = before.now;
    let task_after = |id: i64| after.tasks.iter().find(|t| t.id == id).expect("kept");
    let instance_after = |id: i64| after.instances.iter().find(|i| i.id == id).expect("kept");

    // C6, exactly: a running task's lease runs out when `now` is past
    // `locked_at + lease` (a task without `locked_at` has none to wait for).
    for t in before
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Running)
    {
        let a = task_after(t.id);
        let expired = t
            .locked_at
            .is_none_or(|at| now > add(at, before.config.lease));
        if expired {
            let requeued =
                a.state == TaskState::Queued && a.locked_by.is_none() && a.attempts == t.attempts;
            // T4: requeued, then cancelled by its instance's expiry.
            let cancelled = a.state == TaskState::Failed
                && a.last_error.as_deref() == Some(CANCELLED_BY_DELETION);
            assert!(
                requeued || cancelled,
                "C6 every expired lease returned: {} at {now} is {} ({:?}) after the tick",
                describe(t),
                a.state,
                a.locked_by
            );
        } else {
            assert!(
                a.state == TaskState::Running && a.locked_at == t.locked_at,
                "C6 never broken before the lease expires: {} (lease {:?}) is {} after the tick at {now}",
                describe(t),
                before.config.lease,
                a.state
            );
        }
    }

    // C7, exactly: past its TTL (`now` at or after it), a live instance
    // moves to deleting with its deprovision in this very tick; before it,
    // never. One whose deprovision is already queued or running (a row
    // another tool wrote: stead enqueues a deprovision only with the move
    // to deleting) is being deleted already and is left alone.
    for i in &before.instances {
        let live = !matches!(i.state, InstanceState::Deleting | InstanceState::Deleted);
        if !live {
            continue;
        }
        let past = i.expires_at.is_some_and(|at| now >= at);
        let deprovisioning = before
            .tasks
            .iter()
            .any(|t| t.instance == i.id && t.kind == TaskKind::Deprovision && t.state.is_active());
        let a = instance_after(i.id);
        if past && !deprovisioning {
            assert!(
                a.state == InstanceState::Deleting,
                "C7 an instance past its TTL is sent to deletion at the first tick at or after it: \
                 {} expired at {:?}, still {} after the tick at {now}",
                i.name,
                i.expires_at,
                a.state
            );
        } else if !past {
            assert!(
                a.state == i.state,
                "C7 never expired before its TTL: {} (TTL {:?}) is {} after the tick at {now}",
                i.name,
                i.expires_at,
                a.state
            );
        }
    }
    for i in after
        .instances
        .iter()
        .filter(|i| i.state == InstanceState::Deleting)
    {
        let deprovision = after
            .tasks
            .iter()
            .any(|t| t.instance == i.id && t.kind == TaskKind::Deprovision && t.state.is_active());
        assert!(
            deprovision,
            "C7 every deleting instance has its deprovision: {} after the tick at {now}",
            i.name
        );
    }

    // S9: no planner decides a task the store refuses, and no instance has
    // two active tasks of one kind.
    let inserts = plan
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Enqueue(_) | Decision::Expire { .. }))
        .count();
    let new: Vec<&Task> = after
        .tasks
        .iter()
        .filter(|t| before.tasks.iter().all(|b| b.id != t.id))
        .collect();
    assert_eq!(
        new.len(),
        inserts,
        "S9 a planner never decides a duplicate task: {:?}",
        plan.decisions
    );
    let mut pairs = BTreeSet::new();
    for t in after.tasks.iter().filter(|t| t.state.is_active()) {
        assert!(
            pairs.insert((t.instance, t.kind)),
            "S9 one active task per instance and kind: instance {} has two {} tasks",
            t.instance,
            t.kind
        );
    }

    // C8, exactly.
    let limit = before.config.max_in_flight as usize;
    let flying_before = upgrades_in_flight(before);
    let in_flight = upgrades_in_flight(after).len();
    let upgrades: Vec<&Task> = new
        .iter()
        .copied()
        .filter(|t| t.kind == TaskKind::Upgrade)
        .collect();
    assert!(
        before.baking.is_some() || upgrades.is_empty(),
        "C8 no upgrade starts while which instances bake is unknown (#55): {upgrades:?}"
    );
    // An undo of a baking instance takes over the slot its bake holds.
    if upgrades
        .iter()
        .any(|t| !flying_before.contains(&t.instance))
    {
        assert!(
            in_flight <= limit,
            "C8 never over max_in_flight: {in_flight} upgrades in flight after the tick at {now}, limit {limit}"
        );
    }
    let waiting: Vec<&Instance> = after
        .instances
        .iter()
        .filter(|i| may_upgrade(after, i) && window_allows(after, i) && wave_has_room(after, i))
        .collect();
    assert!(
        in_flight >= limit || waiting.is_empty() || after.baking.is_none(),
        "C8 max_in_flight not left unused while instances wait: {in_flight} of {limit} upgrades \
         in flight after the tick at {now} while {:?} waited",
        waiting.iter().map(|i| i.name.as_str()).collect::<Vec<_>>()
    );
    for t in &upgrades {
        let i = before
            .instances
            .iter()
            .find(|i| i.id == t.instance)
            .expect("known");
        assert!(
            may_upgrade(before, i),
            "C8 only an instance that may be upgraded is: {} ({} {}, {}) at {now}",
            i.name,
            i.service_type,
            i.version,
            i.state
        );
        assert!(
            window_allows(before, i) && t.run_after == now,
            "S9 an upgrade is enqueued only inside its window, due at once: {} (window {:?}) \
             enqueued at {now} to run at {}",
            i.name,
            i.maintenance_window,
            t.run_after
        );
        // A baking instance moves on in the slot its bake holds (#55),
        // taking none from those waiting.
        let own_slot = flying_before.contains(&i.id);
        let ahead = waiting
            .iter()
            .find(|w| !own_slot && order(after, w) < order(before, i));
        assert!(
            ahead.is_none(),
            "C8 upgrades in order, own team first: {} (team {}) enqueued at {now} while {:?} waited ahead of it",
            i.name,
            i.team,
            ahead.map(|w| (w.name.as_str(), &w.team))
        );
    }

    // C8's "deterministic order": the same world with its rows listed the
    // other way round plans the same decisions.
    let mut reversed = before.clone();
    reversed.instances.reverse();
    reversed.tasks.reverse();
    let again = plan_tick(&reversed.snapshot());
    let key = |d: &Decision| format!("{d:?}");
    let mut a: Vec<String> = plan.decisions.iter().map(key).collect();
    let mut b: Vec<String> = again.decisions.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "C8 a deterministic order: the plan depends on the order the store lists its rows in"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use stead::core::fleet::NewTask;

    /// Two ready own-team wiki instances behind the catalog, one slot.
    fn plain() -> World {
        let instance = InstanceSeed {
            team: 0,
            service_type: index(&TYPES, "wiki"),
            version: index(&VERSIONS, "1.0"),
            state: index(&InstanceState::ALL, InstanceState::Ready),
            expires_s: None,
            window: index(&WINDOWS, None),
            tasks: [0; 4],
        };
        WorldSeed {
            now_min: 0,
            instances: vec![instance; 2],
            releases: Some(vec![(1, false), (2, false)]),
            halted: (false, false),
            catalog: 0b10,
            max_in_flight: 0,
            lease: 0,
        }
        .build()
    }

    #[test]
    fn the_plain_world_holds() {
        let before = plain();
        let mut after = before.clone();
        let plan = after.tick();
        assert_eq!(plan.decisions.len(), 1, "one upgrade, for one slot");
        check_tick(&before, &plan, &after);
    }

    #[test]
    #[should_panic(expected = "C8 never over max_in_flight")]
    fn an_upgrade_over_the_limit_is_judged() {
        let before = plain();
        let mut after = before.clone();
        let mut plan = after.tick();
        let second = Decision::Enqueue(NewTask {
            kind: TaskKind::Upgrade,
            instance: 2,
            run_after: before.now,
            reason: "over the limit".to_owned(),
            traceparent: None,
        });
        let mut snapshot = after.snapshot();
        crate::planners::apply_as_store(&mut snapshot, std::slice::from_ref(&second));
        let tasks = snapshot.tasks;
        after.tasks = tasks;
        plan.decisions.push(second);
        check_tick(&before, &plan, &after);
    }

    #[test]
    #[should_panic(expected = "C7 never expired before its TTL")]
    fn a_deletion_before_the_ttl_is_judged() {
        let mut before = plain();
        before.instances[0].expires_at = Some(add(before.now, Duration::from_secs(1)));
        let mut after = before.clone();
        let plan = after.tick();
        after.instances[0].state = InstanceState::Deleting;
        check_tick(&before, &plan, &after);
    }
}
