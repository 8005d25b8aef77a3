//! The four control-loop planners over a fleet of 10,000 instances and
//! 10,000 active tasks. Target (issue 3): the whole tick's planning under
//! 20 ms on the project's 2-core machine.
//!
//! `forecast` is `stead plan`'s (#55): version drift run round after round
//! over the same fleet until the rollout ends or its horizon; its cost is
//! read against `version_drift`'s, one planning, in the same run.
//!
//! Run: `cargo bench --bench planners`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use jiff::{SignedDuration, Timestamp};
use stead::core::catalog::{Catalog, CatalogEntry};
use stead::core::fleet::{Instance, InstanceState, RolloutState, Task, TaskKind, TaskState};
use stead::core::plan::{forecast, ControlConfig, Plan, Planner, Snapshot};
use stead::core::types::InstanceName;
use stead::ports::Release;

const INSTANCES: i64 = 10_000;
const TASKS: i64 = 10_000;
const TYPES: [&str; 5] = ["wiki", "db", "queue", "cache", "search"];
const TEAMS: [&str; 4] = ["platform", "acme", "globex", "initech"];
const WINDOWS: [Option<&str>; 5] = [
    None,
    Some("sun 03:00-05:00"),
    Some("mon-fri 22:00-02:00 Europe/Paris"),
    Some("sat,sun 01:30-04:00 America/New_York"),
    Some("not a window"),
];

fn fleet(now: Timestamp) -> (Vec<Instance>, Vec<Task>, Vec<Release>) {
    let ago = |s: i64| now - SignedDuration::from_secs(s);
    let mut instances = Vec::new();
    let mut releases = Vec::new();
    for id in 1..=INSTANCES {
        let n = id as usize;
        let name = format!("tenant-{id:05}");
        // One instance in a hundred lost its release; one in a hundred is
        // past its TTL; a seventh run an old version. The moduli differ so
        // that every combination of team, type and window occurs.
        if n % 100 != 7 {
            releases.push(Release {
                name: name.clone(),
                namespace: stead::core::release::DOCKER_RELEASE_NAMESPACE.into(),
            });
        }
        instances.push(Instance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            purge_volumes: false,
            id,
            name: InstanceName::new(name),
            team: TEAMS[n % TEAMS.len()].into(),
            service_type: TYPES[n % TYPES.len()].into(),
            version: if n.is_multiple_of(7) {
                "1.0.0"
            } else {
                "1.1.0"
            }
            .into(),
            state: if n % 50 == 3 {
                InstanceState::Provisioning
            } else {
                InstanceState::Ready
            },
            stopped: false,
            expires_at: (n % 100 == 11).then(|| ago(60)),
            maintenance_window: WINDOWS[(n / 3) % WINDOWS.len()].map(str::to_owned),
            created_at: ago(86_400),
            updated_at: ago(86_400),
        });
    }
    // A few orphans.
    for n in 0..20 {
        releases.push(Release {
            name: format!("stray-{n}"),
            namespace: "stead".into(),
        });
    }
    // Ten thousand active tasks, at most one per (instance, kind): each
    // instance in the first half gets a provision-type task and a
    // deprovision-type task, a tenth of the running ones past their lease.
    let kinds = [TaskKind::Reprovision, TaskKind::Deprovision];
    let tasks = (0..TASKS)
        .map(|j| {
            let running = j % 3 == 0;
            let locked_at = if j % 30 == 0 { ago(3_600) } else { ago(30) };
            Task {
                id: j + 1,
                kind: kinds[(j % 2) as usize],
                instance: j / 2 + 1,
                state: if running {
                    TaskState::Running
                } else {
                    TaskState::Queued
                },
                run_after: ago(600),
                locked_by: running.then(|| format!("worker-{}", j % 8)),
                locked_at: running.then_some(locked_at),
                attempts: (j % 4) as u32,
                reason: "bench".into(),
                last_error: None,
                traceparent: None,
                created_at: ago(600),
                updated_at: ago(600),
            }
        })
        .collect();
    (instances, tasks, releases)
}

fn planners(c: &mut Criterion) {
    let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
    let catalog = Catalog::from_entries(TYPES.iter().enumerate().map(|(i, t)| CatalogEntry {
        spec_digest: String::new(),
        parameters: Default::default(),
        service_type: (*t).into(),
        version: "1.1.0".into(),
        security: i == 4,
        rollout: if i == 3 {
            RolloutState::Halted
        } else {
            RolloutState::Active
        },
        bake: std::time::Duration::ZERO,
        provisioning: stead::core::release::Provisioning::Docker,
        services: Vec::new(),
    }));
    let config = ControlConfig {
        max_in_flight: 1000,
        ..ControlConfig::default()
    };
    let (instances, tasks, releases) = fleet(now);
    let snapshot = Snapshot {
        now,
        instances,
        unreadable_instances: 0,
        tasks,
        releases: Some(releases),
        catalog: &catalog,
        rollouts: BTreeMap::from([("db".to_owned(), RolloutState::Active)]),
        config: &config,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        lost_services: Default::default(),
        pins: Default::default(),
        undos: Default::default(),
        baking: Some(Default::default()),
    };
    let plan = tick_all_four(&snapshot);
    println!(
        "fleet: {INSTANCES} instances, {TASKS} tasks; one tick plans {} decisions and {} reports",
        plan.decisions.len(),
        plan.reports.len()
    );

    let mut group = c.benchmark_group("planners_10k");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("tick_all_four", |b| {
        b.iter(|| tick_all_four(black_box(&snapshot)))
    });
    group.bench_function("index_and_lease_expiry", |b| {
        b.iter(|| {
            Planner::new(black_box(&snapshot))
                .lease_expiry()
                .decisions
                .len()
        })
    });
    let planner = Planner::new(&snapshot);
    group.bench_function("drift", |b| b.iter(|| black_box(&planner).drift()));
    group.bench_function("lease_expiry", |b| {
        b.iter(|| black_box(&planner).lease_expiry())
    });
    group.bench_function("ttl", |b| b.iter(|| black_box(&planner).ttl()));
    group.bench_function("version_drift", |b| {
        b.iter(|| black_box(&planner).version_drift())
    });
    let horizon = Duration::from_secs(35 * 86_400);
    let told = forecast(&snapshot, horizon);
    println!(
        "forecast: {} rounds start {} upgrades; {} instances left",
        told.rounds.len(),
        told.rounds.iter().map(|r| r.upgrades.len()).sum::<usize>(),
        told.left.len()
    );
    group.bench_function("forecast", |b| {
        b.iter(|| forecast(black_box(&snapshot), horizon))
    });
    group.finish();
}

criterion_group!(benches, planners);
criterion_main!(benches);

/// A tick's four planners over one indexed snapshot, as the engine runs
/// them.
fn tick_all_four(snapshot: &Snapshot<'_>) -> Plan {
    let planner = Planner::new(snapshot);
    let mut plan = Plan::default();
    for part in [
        planner.drift(),
        planner.lease_expiry(),
        planner.ttl(),
        planner.version_drift(),
    ] {
        plan.decisions.extend(part.decisions);
        plan.reports.extend(part.reports);
    }
    plan
}
