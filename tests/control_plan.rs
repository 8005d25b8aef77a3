//! The four control-loop checks (docs/rules.md C5–C8) as pure planners: one
//! scenario per behaviour, then properties over random snapshots (shared
//! with the `planners` fuzz target through `stead-testkit`).

use stead_testkit::planners;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use jiff::Timestamp;
use proptest::prelude::*;
use stead::core::catalog::{Catalog, CatalogEntry};
use stead::core::fleet::{
    Instance, InstanceState, RetryDecision, RolloutState, Task, TaskKind, TaskState,
};
use stead::core::grants::Grants;
use stead::core::plan::{
    halt_after_failed_upgrade, is_behind, is_older, upgrade_retry, ControlConfig, Decision, Level,
    Plan, Report, Snapshot, UpgradeRetry,
};
use stead::core::types::{InstanceName, ServiceName};
use stead::ports::Release;

use planners::{
    apply_as_store, check_forecast, check_idempotent, check_in_flight_limit,
    check_no_duplicate_active_tasks, check_plan_shape, plan_drift, plan_lease_expiry, plan_tick,
    plan_ttl, plan_version_drift, InstanceSeed, World, WorldSeed,
};

const NOW: &str = "2026-11-30T12:00:00Z"; // a Monday

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn at(offset_s: i64) -> Timestamp {
    now() + jiff::SignedDuration::from_secs(offset_s)
}

fn instance(id: i64, team: &str, service_type: &str, version: &str) -> Instance {
    Instance {
        domains: Vec::new(),
        spec_digest: None,
        parameters: Default::default(),
        purge_volumes: false,
        id,
        name: InstanceName::new(format!("i{id}")),
        team: team.to_owned(),
        service_type: service_type.to_owned(),
        version: version.to_owned(),
        state: InstanceState::Ready,
        stopped: false,
        expires_at: None,
        maintenance_window: None,
        created_at: at(-86_400),
        updated_at: at(-86_400),
    }
}

fn task(id: i64, kind: TaskKind, instance: i64, state: TaskState) -> Task {
    Task {
        id,
        kind,
        instance,
        state,
        run_after: at(-600),
        locked_by: (state == TaskState::Running).then(|| "worker-1".to_owned()),
        locked_at: (state == TaskState::Running).then(|| at(-60)),
        attempts: 1,
        reason: "test".to_owned(),
        last_error: None,
        traceparent: None,
        created_at: at(-600),
        updated_at: at(-600),
    }
}

fn entry(service_type: &str, version: &str, security: bool) -> CatalogEntry {
    CatalogEntry {
        spec_digest: String::new(),
        parameters: Default::default(),
        service_type: service_type.to_owned(),
        version: version.to_owned(),
        security,
        rollout: RolloutState::Active,
        bake: std::time::Duration::ZERO,
        provisioning: stead::core::release::Provisioning::Docker,
        services: Vec::new(),
    }
}

fn config(max_in_flight: u32) -> ControlConfig {
    ControlConfig {
        max_in_flight,
        ..ControlConfig::default()
    }
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A snapshot whose every instance has its release, unless changed.
fn snapshot<'a>(
    instances: Vec<Instance>,
    tasks: Vec<Task>,
    catalog: &'a Catalog,
    config: &'a ControlConfig,
) -> Snapshot<'a> {
    let releases = instances
        .iter()
        .map(|i| Release {
            name: i.name.to_string(),
            namespace: stead::core::release::DOCKER_RELEASE_NAMESPACE.to_owned(),
        })
        .collect();
    Snapshot {
        now: now(),
        instances,
        unreadable_instances: 0,
        tasks,
        releases: Some(releases),
        catalog,
        rollouts: BTreeMap::new(),
        config,
        traceparent: Some(TRACEPARENT.to_owned()),
        lost_services: BTreeMap::new(),
        pins: Default::default(),
        undos: Default::default(),
        baking: Some(Default::default()),
    }
}

/// Renders a plan one line per decision or report, instances by name and
/// instants relative to `NOW`, so expectations read like a log.
fn render(plan: &Plan, snapshot: &Snapshot<'_>) -> String {
    let name = |id: i64| {
        snapshot
            .instances
            .iter()
            .find(|i| i.id == id)
            .map_or(format!("#{id}"), |i| i.name.to_string())
    };
    let when = |ts: Timestamp| {
        let delta = ts.duration_since(now()).as_secs();
        if delta == 0 {
            "now".to_owned()
        } else {
            format!("now{delta:+}s")
        }
    };
    let mut out = String::new();
    for decision in &plan.decisions {
        match decision {
            Decision::Enqueue(t) => {
                assert_eq!(t.traceparent.as_deref(), Some(TRACEPARENT));
                writeln!(
                    out,
                    "enqueue {} {} at {}: {}",
                    t.kind,
                    name(t.instance),
                    when(t.run_after),
                    t.reason
                )
            }
            Decision::Expire {
                instance,
                from,
                task,
            } => writeln!(
                out,
                "expire {} from {from} with {}: {}",
                name(*instance),
                task.kind,
                task.reason
            ),
            Decision::RequeueExpiredLease { task, attempts, .. } => {
                writeln!(out, "requeue task {task} attempts {attempts}")
            }
            Decision::Notify(n) => writeln!(
                out,
                "notify {} {} team {}",
                n.event,
                name(n.instance),
                n.team
            ),
            Decision::HaltRollout { service_type, .. } => writeln!(out, "halt {service_type}"),
        }
        .unwrap();
    }
    for report in &plan.reports {
        let level = match report.level() {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
        };
        match report {
            Report::OrphanRelease { name, namespace } => {
                writeln!(out, "{level}: orphan release {namespace}/{name}")
            }
            Report::BadWindow { name, error, .. } => {
                writeln!(out, "{level}: bad window of {name}: {error}")
            }
            Report::WaitsForWindow { name, opens_at, .. } => {
                writeln!(
                    out,
                    "{level}: {name} waits for its window at {}",
                    when(*opens_at)
                )
            }
            Report::RunningWithoutLease { task } => {
                writeln!(out, "{level}: running task {task} without lease")
            }
            Report::OrphansWithheld { unreadable } => {
                writeln!(
                    out,
                    "{level}: orphans withheld, {unreadable} unreadable rows"
                )
            }
            Report::BadRelease { name, error, .. } => {
                writeln!(out, "{level}: release of {name} cannot be located: {error}")
            }
            Report::UnknownServiceType {
                instance,
                service_type,
            } => writeln!(
                out,
                "{level}: {} has unknown type {service_type}",
                name(*instance)
            ),
        }
        .unwrap();
    }
    out
}

/// The data-driven check: `plan` of `snapshot` renders as `expect`.
fn check(plan: Plan, snapshot: &Snapshot<'_>, expect: &str) {
    let actual = render(&plan, snapshot);
    let expect: String = expect
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(actual, expect, "\nactual:\n{actual}");
}

/// Applies `plan` and asserts that planning again decides nothing.
fn assert_idempotent(snapshot: &mut Snapshot<'_>, plan: &Plan, planner: fn(&Snapshot<'_>) -> Plan) {
    apply_as_store(snapshot, &plan.decisions);
    let again = planner(snapshot);
    assert!(
        again.decisions.is_empty(),
        "second plan: {:?}",
        again.decisions
    );
}

// --- C5 drift --------------------------------------------------------------

#[test]
fn drift_reprovisions_a_ready_instance_whose_release_is_gone_and_notifies() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1"), instance(2, "b", "wiki", "1")],
        vec![],
        &catalog,
        &config,
    );
    snap.releases.as_mut().unwrap().retain(|r| r.name != "i2");
    let plan = plan_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue reprovision i2 at now: drift: release i2 missing from namespace docker
         notify drift.release_missing i2 team b",
    );
    assert_idempotent(&mut snap, &plan, plan_drift);
}

/// #40: a multi-service instance that lost one container (removed by
/// hand, lost with a disk) was never repaired: its other containers make
/// its release look live, and recovery never recreates.
#[test]
fn drift_reprovisions_a_ready_instance_whose_container_the_pass_found_gone() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1"), instance(2, "b", "wiki", "1")],
        vec![],
        &catalog,
        &config,
    );
    snap.lost_services.insert(
        InstanceName::new("i2"),
        [ServiceName::new("db")].into_iter().collect(),
    );
    let plan = plan_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue reprovision i2 at now: drift: the container of db is gone (removed by hand?); the rest of release i2 is live
         notify drift.container_missing i2 team b",
    );
    assert_idempotent(&mut snap, &plan, plan_drift);
}

#[test]
fn drift_does_not_reprovision_while_one_is_queued_or_running() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    for state in [TaskState::Queued, TaskState::Running] {
        let mut snap = snapshot(
            vec![instance(1, "a", "wiki", "1")],
            vec![task(7, TaskKind::Reprovision, 1, state)],
            &catalog,
            &config,
        );
        snap.releases = Some(vec![]);
        check(plan_drift(&snap), &snap, "");
    }
}

#[test]
fn drift_ignores_instances_that_are_not_ready() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut instances = Vec::new();
    for (id, state) in (1..).zip(InstanceState::ALL) {
        let mut i = instance(id, "a", "wiki", "1");
        i.state = state;
        instances.push(i);
    }
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    snap.releases = Some(vec![]);
    check(
        plan_drift(&snap),
        &snap,
        "enqueue reprovision i2 at now: drift: release i2 missing from namespace docker
         notify drift.release_missing i2 team a",
    );
}

#[test]
fn orphan_releases_are_reported_every_tick_and_never_deleted() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut deleted = instance(2, "a", "wiki", "1");
    deleted.state = InstanceState::Deleted;
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1"), deleted],
        vec![],
        &catalog,
        &config,
    );
    let releases = snap.releases.as_mut().unwrap();
    releases.push(Release {
        name: "stranger".into(),
        namespace: "stead".into(),
    });
    releases.push(Release {
        name: "i1".into(),
        namespace: "other-team".into(),
    });
    let expect = "error: orphan release other-team/i1
                  error: orphan release docker/i2
                  error: orphan release stead/stranger";
    let plan = plan_drift(&snap);
    check(plan.clone(), &snap, expect);
    // A second tick over the same world reports them again, and no plan
    // ever contains a decision about an orphan.
    apply_as_store(&mut snap, &plan.decisions);
    check(plan_drift(&snap), &snap, expect);
}

/// An instance row that does not decode still owns its release: while one
/// is unreadable, no release is called an orphan (an operator told to remove
/// a live tenant's release by hand would take it down), and drift goes on
/// repairing the instances it can read (one tenant's bad row stops no one).
#[test]
fn no_release_is_an_orphan_while_an_instance_row_is_unreadable() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    // i1 reads; i2's row does not decode, so it is not listed, and its
    // live release looks like nobody's.
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1")],
        vec![],
        &catalog,
        &config,
    );
    snap.releases = Some(vec![Release {
        name: "i2".into(),
        namespace: "docker".into(),
    }]);
    check(
        plan_drift(&snap),
        &snap,
        "enqueue reprovision i1 at now: drift: release i1 missing from namespace docker
         notify drift.release_missing i1 team a
         error: orphan release docker/i2",
    );
    snap.unreadable_instances = 1;
    check(
        plan_drift(&snap),
        &snap,
        "enqueue reprovision i1 at now: drift: release i1 missing from namespace docker
         notify drift.release_missing i1 team a
         warn: orphans withheld, 1 unreadable rows",
    );
}

#[test]
fn drift_locates_a_helm_release_in_its_rendered_namespace_and_owns_any_release_of_an_unknown_type()
{
    use stead::core::release::{HelmChart, Provisioning};
    let mut search = entry("search", "1", false);
    search.provisioning = Provisioning::Helm(HelmChart {
        chart: "c/search".into(),
        chart_version: "1".into(),
        namespace: "t-{team}".into(),
        namespace_prefix: "t-".into(),
        values: serde_json::json!({}),
    });
    let catalog = Catalog::from_entries([entry("wiki", "1", false), search]);
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![
            instance(1, "a", "search", "1"),
            instance(2, "b", "search", "1"),
            // A type the catalog no longer lists: where its release lives
            // is unknown, so none is missing and any of its name is its.
            instance(3, "c", "gone", "1"),
        ],
        vec![],
        &catalog,
        &config,
    );
    snap.releases = Some(vec![
        Release {
            name: "i1".into(),
            namespace: "t-a".into(),
        },
        // i2's release in the Docker namespace is not where its type puts it.
        Release {
            name: "i2".into(),
            namespace: "docker".into(),
        },
        Release {
            name: "i3".into(),
            namespace: "anywhere".into(),
        },
    ]);
    check(
        plan_drift(&snap),
        &snap,
        "enqueue reprovision i2 at now: drift: release i2 missing from namespace t-b
         notify drift.release_missing i2 team b
         error: orphan release docker/i2",
    );
}

#[test]
fn drift_plans_nothing_when_releases_could_not_be_listed() {
    let catalog = Catalog::default();
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1")],
        vec![],
        &catalog,
        &config,
    );
    snap.releases = None;
    check(plan_drift(&snap), &snap, "");
}

// --- C6 lease expiry -------------------------------------------------------

#[test]
fn lease_is_never_broken_early() {
    let catalog = Catalog::default();
    let config = ControlConfig::default(); // lease 300 s
    let mut on_the_edge = task(1, TaskKind::Provision, 1, TaskState::Running);
    on_the_edge.locked_at = Some(at(-300));
    let mut young = task(2, TaskKind::Upgrade, 2, TaskState::Running);
    young.locked_at = Some(at(-299));
    let mut queued = task(3, TaskKind::Upgrade, 3, TaskState::Queued);
    queued.locked_at = Some(at(-10_000));
    let snap = snapshot(vec![], vec![on_the_edge, young, queued], &catalog, &config);
    check(plan_lease_expiry(&snap), &snap, "");
}

#[test]
fn an_expired_lease_goes_back_to_the_queue_with_its_attempts() {
    let catalog = Catalog::default();
    let config = ControlConfig::default();
    let mut expired = task(1, TaskKind::Provision, 1, TaskState::Running);
    let lease_s = config.lease.as_secs() as i64;
    expired.locked_at = Some(at(-(lease_s + 1)));
    expired.attempts = 3;
    let mut unlocked = task(2, TaskKind::Upgrade, 2, TaskState::Running);
    unlocked.locked_at = None;
    let mut snap = snapshot(vec![], vec![expired, unlocked], &catalog, &config);
    let plan = plan_lease_expiry(&snap);
    check(
        plan.clone(),
        &snap,
        "requeue task 1 attempts 3
         requeue task 2 attempts 1
         warn: running task 2 without lease",
    );
    assert_idempotent(&mut snap, &plan, plan_lease_expiry);
    assert_eq!(snap.tasks[0].state, TaskState::Queued);
    assert_eq!(snap.tasks[0].attempts, 3);
    assert_eq!(snap.tasks[0].locked_by, None);
}

// --- C7 TTL ----------------------------------------------------------------

#[test]
fn ttl_deletes_expired_instances_once() {
    let catalog = Catalog::default();
    let config = ControlConfig::default();
    let mut expired = instance(1, "a", "wiki", "1");
    expired.expires_at = Some(at(0));
    let mut later = instance(2, "a", "wiki", "1");
    later.expires_at = Some(at(1));
    let mut failed = instance(3, "a", "wiki", "1");
    failed.state = InstanceState::Failed;
    failed.expires_at = Some(at(-5));
    let mut snap = snapshot(vec![expired, later, failed], vec![], &catalog, &config);
    let plan = plan_ttl(&snap);
    check(
        plan.clone(),
        &snap,
        "expire i1 from ready with deprovision: ttl: expired at 2026-11-30T12:00:00Z
         expire i3 from failed with deprovision: ttl: expired at 2026-11-30T11:59:55Z",
    );
    assert_idempotent(&mut snap, &plan, plan_ttl);
    assert_eq!(snap.instances[0].state, InstanceState::Deleting);
}

#[test]
fn ttl_never_enqueues_a_second_deprovision_while_one_is_active() {
    let catalog = Catalog::default();
    let config = ControlConfig::default();
    let mut deleting = instance(1, "a", "wiki", "1");
    deleting.state = InstanceState::Deleting;
    deleting.expires_at = Some(at(-3600));
    let mut expired = instance(2, "a", "wiki", "1");
    expired.expires_at = Some(at(-3600));
    for state in [TaskState::Queued, TaskState::Running] {
        let tasks = vec![
            task(1, TaskKind::Deprovision, 1, state),
            task(2, TaskKind::Deprovision, 2, state),
        ];
        let snap = snapshot(
            vec![deleting.clone(), expired.clone()],
            tasks,
            &catalog,
            &config,
        );
        check(plan_ttl(&snap), &snap, "");
    }
}

#[test]
fn a_deleting_instance_without_a_deprovision_gets_one() {
    let catalog = Catalog::default();
    let config = ControlConfig::default();
    let mut deleting = instance(1, "a", "wiki", "1");
    deleting.state = InstanceState::Deleting;
    let mut snap = snapshot(
        vec![deleting],
        vec![task(1, TaskKind::Deprovision, 1, TaskState::Failed)],
        &catalog,
        &config,
    );
    let plan = plan_ttl(&snap);
    check(
        plan.clone(),
        &snap,
        "expire i1 from deleting with deprovision: deleting without a deprovision task",
    );
    assert_idempotent(&mut snap, &plan, plan_ttl);
}

// --- C8 version drift ------------------------------------------------------

fn rollout_world() -> (Catalog, Vec<Instance>) {
    let catalog =
        Catalog::from_entries([entry("wiki", "1.4.0", false), entry("db", "2.0.0", false)]);
    let instances = vec![
        instance(1, "acme", "wiki", "1.3.0"),
        instance(2, "platform", "wiki", "1.3.0"),
        instance(3, "zeta", "db", "1.9.9"),
        instance(4, "platform", "db", "1.0.0"),
        instance(5, "acme", "wiki", "1.4.0"),  // up to date
        instance(6, "acme", "wiki", "1.10.0"), // ahead: never downgraded
        // Up to date, so db's current wave has room for two (#55).
        instance(7, "zeta", "db", "2.0.0"),
    ];
    (catalog, instances)
}

/// #55: a type's rollout starts with one instance and widens (1, 2, 4,
/// …) only as instances reach the version and their bakes end: a baking
/// instance holds its slot of `max_in_flight` and keeps its type's next
/// wave waiting, so a version that fails its bake reaches one instance.
#[test]
fn a_rollout_goes_in_waves_each_held_by_the_bakes_before_it() {
    let catalog = Catalog::from_entries([entry("wiki", "2.0", false)]);
    let config = config(10);
    let instances: Vec<Instance> = (1..=8)
        .map(|id| instance(id, "acme", "wiki", "1.0"))
        .collect();
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    // Nothing on 2.0 yet: the first wave is one instance.
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i1 at now: version drift: 1.0 -> 2.0",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
    // Its upgrade switched and finished: it bakes, and holds the wave.
    snap.tasks.clear();
    snap.instances[0].version = "2.0".into();
    snap.baking = Some([1].into_iter().collect());
    check(plan_version_drift(&snap), &snap, "");
    // Its bake ended well: the next wave is two.
    snap.baking = Some(Default::default());
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i2 at now: version drift: 1.0 -> 2.0
         enqueue upgrade i3 at now: version drift: 1.0 -> 2.0",
    );
    // Both baking: nothing more, though eight slots are free.
    for i in &mut snap.instances[1..3] {
        i.version = "2.0".into();
    }
    snap.baking = Some([2, 3].into_iter().collect());
    check(plan_version_drift(&snap), &snap, "");
    // One of them done: two on 2.0 past their bake allow three in
    // flight, one of which still bakes.
    snap.baking = Some([3].into_iter().collect());
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0 -> 2.0
         enqueue upgrade i5 at now: version drift: 1.0 -> 2.0",
    );
    // All three done: four at once.
    snap.baking = Some(Default::default());
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0 -> 2.0
         enqueue upgrade i5 at now: version drift: 1.0 -> 2.0
         enqueue upgrade i6 at now: version drift: 1.0 -> 2.0
         enqueue upgrade i7 at now: version drift: 1.0 -> 2.0",
    );
    // A newer version moves a baking instance on in the slot and the wave
    // its bake holds; the others (i1 done at 2.0 included) wait for 3.0's
    // waves: none is on 3.0 yet, and two are in flight.
    let catalog3 = Catalog::from_entries([entry("wiki", "3.0", false)]);
    let mut moved = snapshot(snap.instances.clone(), vec![], &catalog3, &config);
    moved.baking = Some([2, 3].into_iter().collect());
    check(
        plan_version_drift(&moved),
        &moved,
        "enqueue upgrade i2 at now: version drift: 2.0 -> 3.0
         enqueue upgrade i3 at now: version drift: 2.0 -> 3.0",
    );
    // Markers that could not be read this tick start nothing: an unknown
    // bake is not a free slot.
    snap.baking = None;
    check(plan_version_drift(&snap), &snap, "");
}

/// #55: a bake holds a slot of the fleet-wide `max_in_flight` too, across
/// types, and an operator's undo of a baking instance takes over the
/// slot its bake holds instead of waiting for another.
#[test]
fn a_bake_holds_a_slot_of_the_fleet_and_its_undo_takes_it_over() {
    let catalog = Catalog::from_entries([entry("wiki", "2.0", false), entry("db", "3.0", false)]);
    let config = config(1);
    let instances = vec![
        instance(1, "acme", "wiki", "2.0"),
        instance(2, "acme", "db", "2.0"),
        instance(3, "acme", "db", "3.0"),
    ];
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    snap.baking = Some([1].into_iter().collect());
    check(plan_version_drift(&snap), &snap, "");
    snap.baking = Some(Default::default());
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i2 at now: version drift: 2.0 -> 3.0",
    );
    // wiki halted and its baking instance undone: the undo's task goes at
    // once, in the slot the bake held; db still waits.
    snap.baking = Some([1].into_iter().collect());
    snap.rollouts.insert("wiki".into(), RolloutState::Halted);
    snap.undos = [1].into_iter().collect();
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i1 at now: operator: rollout undo",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
}

#[test]
fn own_team_upgrades_first_then_a_deterministic_order() {
    let (catalog, instances) = rollout_world();
    let config = config(3);
    let snap = snapshot(instances.clone(), vec![], &catalog, &config);
    let expect = "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
                  enqueue upgrade i2 at now: version drift: 1.3.0 -> 1.4.0
                  enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0";
    check(plan_version_drift(&snap), &snap, expect);
    // The order does not depend on the order the store returned rows in.
    let mut reversed = instances;
    reversed.reverse();
    let snap = snapshot(reversed, vec![], &catalog, &config);
    check(plan_version_drift(&snap), &snap, expect);
}

/// T4 meets C8 (found by the `planners` fuzz target,
/// `fuzz/regressions/planners/an-expiry-frees-its-upgrade-slot`): an expiry
/// cancels its instance's queued upgrade in the same transaction, so the
/// slot that upgrade held is free in the same plan; counting it would fill
/// it only on the next plan, and planning would not be idempotent.
#[test]
fn an_expiry_frees_the_upgrade_slot_its_cancelled_upgrade_held() {
    let (catalog, mut instances) = rollout_world();
    instances[0].expires_at = Some(at(-1));
    let config = config(1);
    let queued = task(7, TaskKind::Upgrade, 1, TaskState::Queued);
    let mut snap = snapshot(instances, vec![queued], &catalog, &config);
    let plan = plan_tick(&snap);
    check(
        plan.clone(),
        &snap,
        "expire i1 from ready with deprovision: ttl: expired at 2026-11-30T11:59:59Z
         enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0",
    );
    assert_idempotent(&mut snap, &plan, plan_tick);
    let cancelled = snap.tasks.iter().find(|t| t.id == 7).unwrap();
    assert_eq!(cancelled.state, TaskState::Failed);
}

/// The same through C6 (`fuzz/regressions/planners/an-expiry-frees-the-slot-of-an-upgrade-whose-lease-ran-out`):
/// a running upgrade whose lease ran out is queued again by this tick, and
/// then cancelled by the same tick's expiry.
#[test]
fn an_expiry_frees_the_slot_of_an_upgrade_whose_lease_ran_out() {
    let (catalog, mut instances) = rollout_world();
    instances[0].expires_at = Some(at(-1));
    let config = config(1);
    let mut stale = task(7, TaskKind::Upgrade, 1, TaskState::Running);
    stale.locked_at = Some(at(-(config.lease.as_secs() as i64) - 1));
    let mut snap = snapshot(instances, vec![stale], &catalog, &config);
    let plan = plan_tick(&snap);
    check(
        plan.clone(),
        &snap,
        "requeue task 7 attempts 1
         expire i1 from ready with deprovision: ttl: expired at 2026-11-30T11:59:59Z
         enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0",
    );
    assert_idempotent(&mut snap, &plan, plan_tick);
}

#[test]
fn in_flight_limit_counts_queued_and_running_upgrades_fleet_wide() {
    let (catalog, instances) = rollout_world();
    let config = config(3);
    // One queued upgrade of a wiki and one running upgrade of a db leave a
    // single slot for the whole fleet.
    let tasks = vec![
        task(1, TaskKind::Upgrade, 2, TaskState::Queued),
        task(2, TaskKind::Upgrade, 3, TaskState::Running),
        task(3, TaskKind::Upgrade, 1, TaskState::Done),
    ];
    let mut snap = snapshot(instances, tasks, &catalog, &config);
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
}

/// #40, `rollout undo --to`: a halted type pinned to a version moves
/// every instance of it that runs another one there, older or newer,
/// within `max_in_flight`, in the usual order and waiting for no window;
/// an instance already at the pin is left alone; an unpinned halted type
/// beside it still moves nothing.
#[test]
fn a_pinned_type_moves_its_instances_to_the_pin_whatever_their_version() {
    let (catalog, mut instances) = rollout_world();
    instances[4].maintenance_window = Some("sun 02:00-03:00".into());
    let config = config(3);
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    snap.rollouts.insert("wiki".into(), RolloutState::Halted);
    snap.rollouts.insert("db".into(), RolloutState::Halted);
    snap.pins
        .insert("wiki".into(), entry("wiki", "1.3.0", false));
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i5 at now: rollout undo --to 1.3.0: 1.4.0 -> 1.3.0
         enqueue upgrade i6 at now: rollout undo --to 1.3.0: 1.10.0 -> 1.3.0",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
}

/// An operator's undo (`rollout undo` of a baking upgrade) is carried
/// out by an upgrade task the leader enqueues within `max_in_flight`,
/// ahead of any version drift, now whatever the window: never one more
/// than the limit (simulation seed 124 found the CLI's own enqueue making
/// three upgrades in flight against a limit of two). An instance with an
/// upgrade task already has its undo carried out by it.
#[test]
fn an_undo_takes_an_upgrade_slot_first_and_never_one_past_the_limit() {
    let (catalog, mut instances) = rollout_world();
    instances[4].maintenance_window = Some("sun 02:00-03:00".into());
    let config = config(2);
    let tasks = vec![task(1, TaskKind::Upgrade, 2, TaskState::Queued)];
    let mut snap = snapshot(instances, tasks, &catalog, &config);
    snap.rollouts.insert("wiki".into(), RolloutState::Halted);
    snap.undos = [2, 5, 6].into_iter().collect();
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i5 at now: operator: rollout undo",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
    // With the wiki's undo done, a free slot goes to the db's drift.
    snap.undos.clear();
    snap.tasks.retain(|t| t.id == 1);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0",
    );
}

#[test]
fn halted_rollout_yields_nothing() {
    let (mut catalog, instances) = rollout_world();
    let config = config(10);
    let mut snap = snapshot(instances.clone(), vec![], &catalog, &config);
    snap.rollouts.insert("wiki".into(), RolloutState::Halted);
    snap.rollouts.insert("db".into(), RolloutState::Active);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0",
    );
    // The catalog file can halt a type too.
    catalog = Catalog::from_entries(catalog.entries().cloned().map(|mut e| {
        e.rollout = RolloutState::Halted;
        e
    }));
    let snap = snapshot(instances, vec![], &catalog, &config);
    check(plan_version_drift(&snap), &snap, "");
}

#[test]
fn a_failed_upgrade_halts_its_rollout() {
    let (catalog, instances) = rollout_world();
    let config = config(10);
    let mut failed = task(9, TaskKind::Upgrade, 2, TaskState::Running);
    failed.attempts = 5;
    failed.last_error = Some("image missing".into());
    let wiki = &instances[1];
    assert_eq!(
        halt_after_failed_upgrade(&failed, wiki, RetryDecision::RetryAt(at(60))),
        None
    );
    let mut provision = failed.clone();
    provision.kind = TaskKind::Provision;
    assert_eq!(
        halt_after_failed_upgrade(&provision, wiki, RetryDecision::Fail),
        None
    );
    let halt = halt_after_failed_upgrade(&failed, wiki, RetryDecision::Fail).unwrap();
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    apply_as_store(&mut snap, &[halt]);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0",
    );
}

#[test]
fn a_change_of_spec_at_the_same_version_is_an_upgrade_like_any_other() {
    let (catalog, mut instances) = rollout_world();
    let current = catalog.get("wiki").unwrap().spec_digest.clone();
    assert_eq!(current.len(), 64, "a SHA-256 in hex: {current}");
    // i5 runs wiki's catalog version with another spec; i6 is ahead of the
    // catalog (never downgraded, whatever its spec); i7 runs the catalog's
    // spec; i8 is a row from before digests were recorded.
    instances[4].spec_digest = Some("0".repeat(64));
    instances[5].spec_digest = Some("0".repeat(64));
    let mut same = instance(7, "acme", "wiki", "1.4.0");
    same.spec_digest = Some(current);
    instances.push(same);
    instances.push(instance(8, "acme", "wiki", "1.4.0"));
    instances[4].maintenance_window = Some("sun 03:00-05:00".into());
    let config = config(10);
    let snap = snapshot(instances, vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i2 at now: version drift: 1.3.0 -> 1.4.0
         enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0
         enqueue upgrade i1 at now: version drift: 1.3.0 -> 1.4.0
         info: i5 waits for its window at now+486000s",
    );
}

#[test]
fn a_spec_digest_changes_with_the_spec_and_only_with_it() {
    let text = "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"http\"\nimage = \"x:1\"\nenv = { A = \"1\" }\n";
    let digest = |text: &str| {
        Catalog::from_toml(text, "catalog.toml", &Grants::default())
            .unwrap()
            .get("web")
            .unwrap()
            .spec_digest
            .clone()
    };
    let revision = |text: &str| {
        Catalog::from_toml(text, "catalog.toml", &Grants::default())
            .unwrap()
            .get("web")
            .unwrap()
            .services[0]
            .revision("1")
    };
    assert_eq!(digest(text), digest(text), "deterministic");
    assert_eq!(
        digest(text),
        digest(&text.replace("version = \"1\"", "version = \"2\"")),
        "the version is not the spec"
    );
    assert_eq!(
        digest(text),
        digest(
            &format!("{text}security = false\n")
                .replace(
                    "[[types.web.services]]",
                    "security = true\n[[types.web.services]]"
                )
                .replace("security = false\n", "")
        ),
        "nor the security flag"
    );
    assert_ne!(
        digest(text),
        digest(&text.replace("A = \"1\"", "A = \"2\"")),
        "an env value is"
    );
    assert_ne!(
        digest(text),
        digest(&text.replace("x:1", "x:2")),
        "an image is"
    );
    assert_ne!(revision(text), revision(&text.replace("x:1", "x:2")));
    assert!(revision(text).starts_with("1."), "{}", revision(text));
}

#[test]
fn an_upgrade_waits_for_the_maintenance_window() {
    let (catalog, mut instances) = rollout_world();
    let config = config(10);
    instances[1].maintenance_window = Some("sun 03:00-05:00".into()); // i2
    instances[3].maintenance_window = Some("mon 11:00-13:00 UTC".into()); // i4: open now
    instances[2].maintenance_window = Some("tue 01:00-02:00 Europe/Paris".into()); // i3
    let snap = snapshot(instances, vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i1 at now: version drift: 1.3.0 -> 1.4.0
         info: i2 waits for its window at now+486000s
         info: i3 waits for its window at now+43200s",
    );
}

/// #40: an upgrade used to park in the queue until its window opened,
/// holding its instance's task slot and one of `max_in_flight`'s (default
/// one): a weekly window blocked every other upgrade of the fleet, security
/// releases included, for a week. A closed window now holds nothing.
#[test]
fn an_upgrade_waiting_for_its_window_holds_no_in_flight_slot() {
    let (catalog, mut instances) = rollout_world();
    let config = config(1);
    // i4 and i2 come first (own team) but their windows are closed.
    instances[3].maintenance_window = Some("sun 03:00-05:00".into()); // i4
    instances[1].maintenance_window = Some("sun 03:00-05:00".into()); // i2
    let snap = snapshot(instances, vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0
         info: i4 waits for its window at now+486000s
         info: i2 waits for its window at now+486000s",
    );
}

#[test]
fn a_security_release_bypasses_the_window() {
    let catalog = Catalog::from_entries([entry("wiki", "1.4.1", true)]);
    let config = config(10);
    let mut i = instance(1, "acme", "wiki", "1.4.0");
    i.maintenance_window = Some("sun 03:00-05:00".into());
    let mut broken = instance(2, "acme", "wiki", "1.4.0");
    broken.maintenance_window = Some("whenever".into());
    // One instance already on the release lets its wave take two (#55).
    let done = instance(3, "acme", "wiki", "1.4.1");
    let snap = snapshot(vec![i, broken, done], vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i1 at now: version drift: 1.4.0 -> 1.4.1 (security)
         enqueue upgrade i2 at now: version drift: 1.4.0 -> 1.4.1 (security)",
    );
}

#[test]
fn one_bad_window_does_not_stop_the_others() {
    let (catalog, mut instances) = rollout_world();
    let config = config(1);
    // i4 comes first (own team, db) but its window is broken: it is
    // reported and i2 takes the one slot.
    instances[3].maintenance_window = Some("mon 25:00-26:00".into());
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    let plan = plan_version_drift(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue upgrade i2 at now: version drift: 1.3.0 -> 1.4.0
         warn: bad window of i4: bad token \"25:00\" at column 5 of the window spec: expected a time HH:MM between 00:00 and 23:59",
    );
    assert_idempotent(&mut snap, &plan, plan_version_drift);
}

#[test]
fn busy_expired_or_releaseless_instances_are_not_upgraded() {
    let (catalog, mut instances) = rollout_world();
    let config = config(10);
    instances[0].expires_at = Some(at(-1)); // i1 expired
    instances[1].state = InstanceState::Upgrading; // i2 not ready
    let mut snap = snapshot(
        instances,
        vec![task(1, TaskKind::Reprovision, 3, TaskState::Queued)],
        &catalog,
        &config,
    );
    snap.releases.as_mut().unwrap().retain(|r| r.name != "i4");
    snap.instances.push(instance(7, "acme", "mystery", "1"));
    // One of an unknown type that is not ready (being deleted) says nothing.
    let mut leaving = instance(8, "acme", "mystery", "1");
    leaving.state = InstanceState::Deleting;
    snap.instances.push(leaving);
    check(
        plan_version_drift(&snap),
        &snap,
        "warn: i7 has unknown type mystery",
    );
}

#[test]
fn a_stopped_instance_is_upgraded_only_once_started_again() {
    let (catalog, mut instances) = rollout_world();
    let config = config(10);
    instances[2].stopped = true; // i3
    let snap = snapshot(instances.clone(), vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i2 at now: version drift: 1.3.0 -> 1.4.0
         enqueue upgrade i1 at now: version drift: 1.3.0 -> 1.4.0",
    );
    instances[2].stopped = false;
    let snap = snapshot(instances, vec![], &catalog, &config);
    check(
        plan_version_drift(&snap),
        &snap,
        "enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i2 at now: version drift: 1.3.0 -> 1.4.0
         enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0
         enqueue upgrade i1 at now: version drift: 1.3.0 -> 1.4.0",
    );
}

#[test]
fn numeric_versions_compare_numerically() {
    assert!(is_behind("1.9.0", "1.10.0"));
    assert!(!is_behind("1.10.0", "1.9.0"));
    assert!(!is_behind("v2.0", "2.0.0"));
    assert!(is_behind("2.0.0-rc1", "2.0.0"));
    assert!(!is_behind("same", "same"));
    // Past eight components a version is an opaque string: behind
    // whenever it differs, never by number.
    let nine = "1.2.3.4.5.6.7.8.9";
    assert!(!is_behind(nine, nine));
    assert!(is_behind("1.2.3.4.5.6.7.8.10", nine), "differs, so behind");
    assert!(
        is_behind("1..2", "1.0.2"),
        "an empty component is not a zero"
    );
}

/// A failed upgrade's retry runs only inside the window, as its first run
/// did (found by the 50-instance world's seed 38: an upgrade planned a
/// minute before its window closed failed, and its backoff retried it
/// after). One whose backoff ends outside the window is deferred, not
/// parked: the task ends and version drift queues it in the next opening
/// (#55).
#[test]
fn an_upgrade_retry_outside_the_window_is_deferred_unless_security() {
    let t = |s: &str| s.parse::<Timestamp>().unwrap();
    let mut i = instance(1, "t", "wiki", "1");
    i.maintenance_window = Some("daily 02:00-03:00".into());
    let inside = t("2026-03-02T02:59:19Z");
    let after = t("2026-03-02T03:00:19Z");
    let next_opening = t("2026-03-03T02:00:00Z");
    assert_eq!(upgrade_retry(inside, &i, false), UpgradeRetry::At(inside));
    assert_eq!(
        upgrade_retry(after, &i, false),
        UpgradeRetry::Deferred {
            opens_at: next_opening
        }
    );
    assert_eq!(
        upgrade_retry(after, &i, true),
        UpgradeRetry::At(after),
        "security"
    );
    i.maintenance_window = None;
    assert_eq!(
        upgrade_retry(after, &i, false),
        UpgradeRetry::At(after),
        "no window"
    );
    i.maintenance_window = Some("someday".into());
    assert_eq!(
        upgrade_retry(after, &i, false),
        UpgradeRetry::At(after),
        "a bad spec is the planner's to report"
    );
}

/// A worker refuses to install its catalog's version over an instance's
/// only when that version is older for certain.
#[test]
fn only_numeric_versions_are_older() {
    assert!(is_older("1.9.0", "1.10.0"));
    assert!(is_older("v1", "2"));
    assert!(!is_older("1.10.0", "1.9.0"));
    assert!(!is_older("2", "2.0"), "equal");
    assert!(
        !is_older("blue", "green"),
        "not numeric: the catalog decides"
    );
    assert!(!is_older("green", "blue"));
    assert!(!is_older("2.0.0-rc1", "2.0.0"));
}

#[test]
fn the_whole_tick_plans_each_instance_once() {
    let (catalog, mut instances) = rollout_world();
    let config = config(10);
    instances[0].expires_at = Some(at(-1)); // i1: TTL, neither drift nor upgrade
    let mut snap = snapshot(instances, vec![], &catalog, &config);
    snap.releases
        .as_mut()
        .unwrap()
        .retain(|r| r.name != "i1" && r.name != "i2");
    let plan = plan_tick(&snap);
    check(
        plan.clone(),
        &snap,
        "enqueue reprovision i2 at now: drift: release i2 missing from namespace docker
         notify drift.release_missing i2 team platform
         expire i1 from ready with deprovision: ttl: expired at 2026-11-30T11:59:59Z
         enqueue upgrade i4 at now: version drift: 1.0.0 -> 2.0.0
         enqueue upgrade i3 at now: version drift: 1.9.9 -> 2.0.0",
    );
    assert_idempotent(&mut snap, &plan, plan_tick);
}

// --- config ----------------------------------------------------------------

#[test]
fn config_rejects_a_lease_not_longer_than_the_provisioner_timeout() {
    let bad = ControlConfig {
        lease: Duration::from_secs(240),
        ..ControlConfig::default()
    };
    let error = bad.validate().unwrap_err().to_string();
    assert!(
        error.starts_with("lease_s = 240s: must exceed provisioner_timeout_s"),
        "{error}"
    );
    let error =
        ControlConfig::from_toml("lease_s = 60\nprovisioner_timeout_s = 90\n", "control.toml")
            .unwrap_err()
            .to_string();
    assert!(error.starts_with("control.toml: lease_s = 60s"), "{error}");
}

#[test]
fn config_errors_name_the_field_and_value() {
    let cases = [
        (
            "max_in_flight = 0",
            "control.toml: max_in_flight = 0: must be between 1 and 1000",
        ),
        ("max_in_flight = 5000", "control.toml: max_in_flight = 5000"),
        ("max_in_flight = -1", "control.toml: max_in_flight = -1"),
        ("own_team = \"\"", "control.toml: own_team = \"\""),
        (
            "own_team = \"Ops Team\"",
            "control.toml: own_team = \"Ops Team\"",
        ),
        ("tick_interval_s = 0", "control.toml: tick_interval_s = 0ns"),
        (
            "lease_s = -5",
            "control.toml: lease_s = -5: must not be negative",
        ),
        (
            "own_team = \"x\"\nbogus = 1",
            "control.toml: line 2, column 1: bogus: unknown field `bogus`",
        ),
        (
            "namespace = \"x\"",
            "control.toml: namespace = \"x\": is no longer a setting",
        ),
    ];
    for (toml, expect) in cases {
        let error = ControlConfig::from_toml(toml, "control.toml")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(expect), "{toml:?}: {error}");
    }
    let ok = ControlConfig::from_toml("own_team = \"ops\"\nmax_in_flight = 4\n", "control.toml")
        .unwrap();
    assert_eq!((ok.own_team.as_str(), ok.max_in_flight), ("ops", 4));
    assert_eq!(ControlConfig::default().validate(), Ok(()));
}

/// A lone carriage return in the control config is explained, not reported
/// as a blank (found by the `config` fuzz target,
/// `fuzz/regressions/config/lone-carriage-return`, when toml 0.8 gave it no
/// message).
#[test]
fn a_control_lone_carriage_return_is_explained() {
    let error = ControlConfig::from_toml("\r", "control.toml")
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "control.toml: line 1, column 2: carriage return must be followed by newline, expected newline"
    );
}

// --- properties ------------------------------------------------------------
//
// The world generator and the properties live in `testkit/src/planners.rs`,
// shared with the `planners` fuzz target, so proptest and the fuzzer check
// the same things. The strategies draw the seed's plain numbers; every
// number maps onto a valid world.

const CASES: u32 = 256;

fn instance_seed() -> impl Strategy<Value = InstanceSeed> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        proptest::option::of(-100i8..100),
        any::<u8>(),
        any::<[u8; 4]>(),
    )
        .prop_map(
            |(team, service_type, version, state, expires_s, window, tasks)| InstanceSeed {
                team,
                service_type,
                version,
                state,
                expires_s,
                window,
                tasks,
            },
        )
}

fn world_strategy() -> impl Strategy<Value = World> {
    (
        any::<u16>(),
        proptest::collection::vec(instance_seed(), 0..planners::INSTANCES_MAX),
        proptest::option::of(proptest::collection::vec(
            (any::<u8>(), prop::bool::weighted(0.1)),
            0..planners::RELEASES_MAX,
        )),
        any::<(bool, bool)>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(
            |(now_min, instances, releases, halted, catalog, max_in_flight, lease)| {
                WorldSeed {
                    now_min,
                    instances,
                    releases,
                    halted,
                    catalog,
                    max_in_flight,
                    lease,
                }
                .build()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_snapshots_never_yield_two_active_tasks_of_one_kind(world in world_strategy()) {
        check_no_duplicate_active_tasks(&world);
    }

    #[test]
    fn random_snapshots_never_exceed_the_in_flight_limit(world in world_strategy()) {
        check_in_flight_limit(&world);
    }

    #[test]
    fn planning_twice_decides_nothing_new(world in world_strategy()) {
        check_idempotent(&world);
    }

    #[test]
    fn random_snapshots_yield_well_formed_decisions(world in world_strategy()) {
        check_plan_shape(&world);
    }

    #[test]
    fn a_forecast_agrees_with_the_planner_it_runs(world in world_strategy()) {
        check_forecast(&world);
    }
}

/// Operators read decisions by their metric label and reports by their
/// words; both are tables nothing else in the planners' tests looks at
/// (mutation testing found `label` and `Report`'s text replaceable).
#[test]
fn every_decision_kind_has_its_own_label() {
    use stead::core::plan::Notice;
    let task = |kind| new_task(1, kind);
    let decisions = [
        Decision::Enqueue(task(TaskKind::Provision)),
        Decision::Enqueue(task(TaskKind::Reprovision)),
        Decision::Enqueue(task(TaskKind::Upgrade)),
        Decision::Enqueue(task(TaskKind::Deprovision)),
        Decision::Expire {
            instance: 1,
            from: InstanceState::Ready,
            task: task(TaskKind::Deprovision),
        },
        Decision::RequeueExpiredLease {
            task: 1,
            locked_by: None,
            locked_at: None,
            attempts: 0,
        },
        Decision::Notify(Notice {
            event: "drift.release_missing",
            instance: 1,
            team: "t".into(),
            message: "m".into(),
        }),
        Decision::HaltRollout {
            service_type: "web".into(),
            reason: "r".into(),
        },
    ];
    let labels: Vec<&str> = decisions.iter().map(Decision::label).collect();
    assert_eq!(labels, Decision::LABELS, "one label per kind, as listed");
}

#[test]
fn every_report_names_what_and_where_at_its_level() {
    use stead::core::window::Window;
    let window_error = Window::parse("someday").expect_err("not a window");
    let cases = [
        (
            Report::OrphanRelease {
                name: "wiki9".into(),
                namespace: "tenants".into(),
            },
            vec!["wiki9", "tenants", "left alone"],
            Level::Error,
        ),
        (
            Report::BadWindow {
                instance: 7,
                name: InstanceName::new("wiki7"),
                window: "someday".into(),
                error: window_error,
            },
            vec!["wiki7", "\"someday\"", "skipped"],
            Level::Warn,
        ),
        (
            Report::OrphansWithheld { unreadable: 3 },
            vec!["orphan releases not judged", "3 instance row(s)", "bad row"],
            Level::Warn,
        ),
        (
            Report::RunningWithoutLease { task: 42 },
            vec!["task 42", "requeued"],
            Level::Warn,
        ),
        (
            Report::BadRelease {
                instance: 8,
                name: InstanceName::new("wiki8"),
                error: "namespace template".into(),
            },
            vec!["wiki8", "namespace template"],
            Level::Error,
        ),
        (
            Report::UnknownServiceType {
                instance: 9,
                service_type: "gone".into(),
            },
            vec!["instance 9", "\"gone\"", "never upgraded"],
            Level::Warn,
        ),
    ];
    for (report, words, level) in cases {
        let text = report.to_string();
        for word in words {
            assert!(
                text.contains(word),
                "{report:?} says {text:?}, not {word:?}"
            );
        }
        assert_eq!(report.level(), level, "{report:?}");
    }
}

/// A task to insert, due now.
fn new_task(instance: i64, kind: TaskKind) -> stead::core::fleet::NewTask {
    stead::core::fleet::NewTask {
        kind,
        instance,
        run_after: now(),
        reason: "test".into(),
        traceparent: None,
    }
}

/// `apply_as_store` stands in for the store in the idempotence checks: a
/// task it inserts gets an id no other task has, as the database's would
/// (a reused id would make a second plan see the wrong task).
#[test]
fn applied_enqueues_get_ids_no_task_has() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1"), instance(2, "b", "wiki", "1")],
        vec![
            task(3, TaskKind::Upgrade, 1, TaskState::Done),
            task(7, TaskKind::Reprovision, 1, TaskState::Running),
        ],
        &catalog,
        &config,
    );
    let enqueue = |instance, kind| Decision::Enqueue(new_task(instance, kind));
    apply_as_store(
        &mut snap,
        &[
            enqueue(2, TaskKind::Reprovision),
            enqueue(2, TaskKind::Upgrade),
        ],
    );
    let ids: Vec<i64> = snap.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, [3, 7, 8, 9], "after the largest id, one each");
}

/// An expiry applies as the store's compare-and-set does: only from the
/// state the planner saw, and its deprovision takes a fresh id too.
#[test]
fn applied_expiries_compare_and_set_and_take_fresh_ids() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    let mut snap = snapshot(
        vec![instance(1, "a", "wiki", "1"), instance(2, "b", "wiki", "1")],
        vec![task(7, TaskKind::Reprovision, 2, TaskState::Running)],
        &catalog,
        &config,
    );
    apply_as_store(
        &mut snap,
        &[
            // Seen `upgrading`, but it is `ready` now: the swap misses.
            Decision::Expire {
                instance: 2,
                from: InstanceState::Upgrading,
                task: new_task(2, TaskKind::Deprovision),
            },
            Decision::Expire {
                instance: 1,
                from: InstanceState::Ready,
                task: new_task(1, TaskKind::Deprovision),
            },
            Decision::Enqueue(new_task(2, TaskKind::Upgrade)),
        ],
    );
    let tasks: Vec<(i64, i64, TaskKind)> = snap
        .tasks
        .iter()
        .map(|t| (t.id, t.instance, t.kind))
        .collect();
    assert_eq!(
        tasks,
        [
            (7, 2, TaskKind::Reprovision),
            (8, 1, TaskKind::Deprovision),
            (9, 2, TaskKind::Upgrade)
        ]
    );
    let states: Vec<InstanceState> = snap.instances.iter().map(|i| i.state).collect();
    assert_eq!(states, [InstanceState::Deleting, InstanceState::Ready]);
}

/// #40, seed 215: a queued upgrade (a retry parked until its window opens
/// again, a day off) does not hold back the repair of a lost container;
/// a queued provisioning task does.
#[test]
fn drift_repairs_a_lost_container_beside_a_queued_upgrade() {
    let catalog = Catalog::from_entries([entry("wiki", "1", false)]);
    let config = ControlConfig::default();
    for (kind, repaired) in [
        (TaskKind::Upgrade, true),
        (TaskKind::Provision, false),
        (TaskKind::Reprovision, false),
    ] {
        let mut snap = snapshot(
            vec![instance(2, "b", "wiki", "1")],
            vec![task(1, kind, 2, TaskState::Queued)],
            &catalog,
            &config,
        );
        snap.lost_services.insert(
            InstanceName::new("i2"),
            [ServiceName::new("db")].into_iter().collect(),
        );
        let plan = plan_drift(&snap);
        let reprovisions = plan
            .decisions
            .iter()
            .filter(|d| matches!(d, Decision::Enqueue(t) if t.kind == TaskKind::Reprovision))
            .count();
        assert_eq!(
            reprovisions,
            usize::from(repaired),
            "beside a queued {kind:?}"
        );
    }
}
