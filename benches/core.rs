//! Benchmarks of the pure core (docs/benchmarks.md: a steady-state decision for
//! one healthy service costs well under a microsecond).
//!
//! Run: `cargo bench --bench core`. Each benchmark runs one service's whole
//! recovery: build the machine, answer every command it yields with a
//! canned outcome, take the report. `baseline/clone_input` clones the input
//! alone, so the machine's own cost can be read as a ratio over it; the
//! ratios are printed at the end.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use stead::core::budget::BudgetEntry;
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{
    Command, GenerationMemory, Outcome, ProxyView, Report, ServiceInput, ServiceMemory,
    ServiceRecovery, Verdict,
};
use stead::core::types::{
    ActiveService, Binds, ContainerId, ContainerStatus, GenerationKey, Health, InstanceName,
    Intent, Observation, ServiceName, Timestamp,
};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("valid")
}

const NOW_S: i64 = 1_800_000_000;
const EXECUTION_S: i64 = NOW_S - 3_600;
const RESTARTED_S: i64 = NOW_S - 1;

fn input(memory: ServiceMemory) -> ServiceInput {
    let container =
        ContainerId::new("4f3c2a1b0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b");
    ServiceInput {
        key: GenerationKey {
            instance: InstanceName::new("acme-shop"),
            service: ServiceName::new("web"),
            container: container.clone(),
        },
        active: ActiveService {
            container,
            effective_revision: "sha256:7d1c0f".into(),
            binds: Binds::from([(8080, 30001), (9090, 30002)]),
            stop_grace: Some(Duration::from_secs(10)),
            verified_started_at: Some(at(EXECUTION_S)),
        },
        intent: Intent::Running,
        inhibition: None,
        proxy: ProxyView::Unknown,
        memory,
    }
}

/// A healthy service whose current execution this daemon already verified.
fn steady_input() -> ServiceInput {
    input(ServiceMemory {
        generation: GenerationMemory {
            budget: None,
            verified_started_at: Some(at(EXECUTION_S)),
        },
        withdrawal_pending: false,
    })
}

/// A crash-looping service: found down with an unconfirmed attempt, after
/// `failures` charged failures.
fn crash_loop_input(failures: u32) -> ServiceInput {
    input(ServiceMemory {
        generation: GenerationMemory {
            budget: Some(BudgetEntry {
                failures,
                next_attempt: None,
                stable_since: None,
                unhealthy_streak: 0,
                attempt_pending: true,
            }),
            verified_started_at: Some(at(EXECUTION_S)),
        },
        withdrawal_pending: false,
    })
}

/// Runs one recovery to its report, answering with `respond`.
fn recover(
    policy: &RecoveryPolicy,
    input: ServiceInput,
    mut respond: impl FnMut(&Command, u32) -> Outcome,
) -> Report {
    let now = at(NOW_S);
    let mut machine = ServiceRecovery::new(policy, input);
    let mut inspections = 0;
    while let Some(command) = machine.poll_command() {
        if command == Command::Inspect {
            inspections += 1;
        }
        let outcome = respond(&command, inspections);
        machine.handle(outcome, now);
    }
    machine.into_report()
}

/// The world answering the steady state: running, same execution, healthy,
/// same binds, ACTIVE unchanged.
fn steady_world(active: &ActiveService) -> impl FnMut(&Command, u32) -> Outcome + '_ {
    move |command, _| match command {
        Command::Inspect => Outcome::Inspected(Ok(Observation {
            status: ContainerStatus::Running,
            started_at: Some(at(EXECUTION_S)),
            exit: None,
        })),
        Command::ReadHealth => Outcome::Health(Ok(Health::Healthy)),
        Command::ReadBinds => Outcome::Binds(Ok(active.binds.clone())),
        Command::ReloadActive => Outcome::ActiveReloaded(Ok(Some(active.clone()))),
        other => panic!("steady state issued {other:?}"),
    }
}

/// The world of a crash loop: exited at first, then the start succeeds and
/// the new execution verifies.
fn crash_world(active: &ActiveService) -> impl FnMut(&Command, u32) -> Outcome + '_ {
    move |command, inspections| match command {
        Command::Inspect if inspections == 1 => Outcome::Inspected(Ok(Observation {
            status: ContainerStatus::Exited,
            started_at: Some(at(EXECUTION_S)),
            exit: None,
        })),
        Command::Inspect => Outcome::Inspected(Ok(Observation {
            status: ContainerStatus::Running,
            started_at: Some(at(RESTARTED_S)),
            exit: None,
        })),
        Command::Withdraw => Outcome::Withdrawn(Ok(())),
        Command::CheckPolicy => Outcome::PolicyChecked(Ok(())),
        Command::Start => Outcome::Started(Ok(())),
        Command::ReadHealth => Outcome::Health(Ok(Health::Healthy)),
        Command::ReadBinds => Outcome::Binds(Ok(active.binds.clone())),
        Command::ProbeReadiness { .. } => Outcome::Readiness(Ok(())),
        Command::ReloadActive => Outcome::ActiveReloaded(Ok(Some(active.clone()))),
        Command::Publish { .. } => Outcome::Published(Ok(())),
        Command::RecordExecution { .. } => Outcome::ExecutionRecorded(Ok(())),
        other => panic!("crash loop issued {other:?}"),
    }
}

const IDS: [&str; 4] = [
    "baseline/clone_input",
    "recovery/steady_healthy_verified",
    "recovery/crash_loop_delayed",
    "recovery/crash_loop_start_and_verify",
];

fn benches(c: &mut Criterion) {
    let policy = RecoveryPolicy::default();
    let steady = steady_input();
    // The charge for the unconfirmed attempt is the fourth failure: delayed.
    let delayed = crash_loop_input(3);
    // The charge is the second failure: still a free attempt, so it starts.
    let allowed = crash_loop_input(1);
    let active = steady.active.clone();

    // Each scenario must do what its name says before it is timed.
    let report = recover(&policy, steady.clone(), steady_world(&active));
    assert!(matches!(
        report.verdict,
        Verdict::Verified {
            published: false,
            ..
        }
    ));
    let report = recover(&policy, delayed.clone(), crash_world(&active));
    assert!(
        matches!(report.verdict, Verdict::Delayed { .. }),
        "{report:?}"
    );
    let report = recover(&policy, allowed.clone(), crash_world(&active));
    assert!(report.intervened && matches!(report.verdict, Verdict::Verified { .. }));

    c.bench_function(IDS[0], |b| b.iter(|| black_box(black_box(&steady).clone())));
    c.bench_function(IDS[1], |b| {
        b.iter(|| recover(&policy, black_box(&steady).clone(), steady_world(&active)))
    });
    c.bench_function(IDS[2], |b| {
        b.iter(|| recover(&policy, black_box(&delayed).clone(), crash_world(&active)))
    });
    c.bench_function(IDS[3], |b| {
        b.iter(|| recover(&policy, black_box(&allowed).clone(), crash_world(&active)))
    });
}

/// Criterion's point estimate per iteration (the slope it prints, else the
/// mean), in nanoseconds.
fn mean_ns(id: &str) -> Option<f64> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = format!(
        "{target}/criterion/{}/new/estimates.json",
        id.replace('/', "_")
    );
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| json["mean"]["point_estimate"].as_f64())
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
    // `cargo test --all-targets` runs each benchmark once as a test; only a
    // real `cargo bench` run has fresh estimates to print.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let Some(baseline) = mean_ns(IDS[0]) else {
        return; // a filtered run measured no baseline
    };
    println!("\ntime per recovery, and ratio over cloning the input alone:");
    for id in IDS {
        if let Some(ns) = mean_ns(id) {
            println!("  {id:40} {ns:9.1} ns  {:5.1}x", ns / baseline);
        }
    }
}
