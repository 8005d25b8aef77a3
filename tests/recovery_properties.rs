//! Property tests of the pure core (docs/rules.md R10, R13, R14 and S1–S7).
//!
//! The reference budget model and the recovery-machine checker live in
//! `stead-testkit` (`testkit/src/`) and are shared with the cargo-fuzz
//! targets, so proptest and the fuzzers assert exactly the same properties
//! and the test-only code never ships in the `stead` crate.

use stead_testkit::machine;
use stead_testkit::model;

use std::time::Duration;

use proptest::prelude::*;
use stead::core::errors::TrafficError;
use stead::core::recovery::{Command, Verdict};
use stead::core::types::{ContainerId, ContainerStatus, Health, RuntimeError, ServiceName};
use stead_testkit::world::World;

use machine::{run_and_check, CaseSeed, EntrySeed, OutcomeSeed};
use model::{check_budget_against_model, policy_from_bytes, BudgetModel, BudgetOp};

const CASES_BUDGET: u32 = 2_000;
const CASES_MACHINE: u32 = 4_000;
const CASES_WORLD: u32 = 300;

fn budget_op() -> impl Strategy<Value = BudgetOp> {
    (any::<u8>(), any::<u16>()).prop_map(|(kind, amount)| BudgetOp::from_bytes(kind, amount))
}

fn entry_seed() -> impl Strategy<Value = EntrySeed> {
    (
        any::<u8>(),
        proptest::option::of(-900i16..900),
        proptest::option::of(-900i16..900),
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(
            |(failures, next_attempt_s, stable_since_s, unhealthy_streak, attempt_pending)| {
                EntrySeed {
                    failures,
                    next_attempt_s,
                    stable_since_s,
                    unhealthy_streak,
                    attempt_pending,
                }
            },
        )
}

fn case_seed() -> impl Strategy<Value = CaseSeed> {
    (
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        prop::bool::weighted(0.2),
        proptest::option::of(entry_seed()),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(
            |(stopped, inhibited, ab, av, mv, wp, budget, free, threshold, proxy)| CaseSeed {
                stopped,
                inhibited,
                active_binds: ab,
                active_verified: av,
                memory_verified: mv,
                withdrawal_pending: wp,
                budget,
                free_attempts: free,
                unhealthy_threshold: threshold,
                proxy,
            },
        )
}

fn outcome_seed() -> impl Strategy<Value = OutcomeSeed> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        0u16..30_000,
    )
        .prop_map(
            |(choice, status, execution, health, binds, took_ms)| OutcomeSeed {
                choice,
                status,
                execution,
                health,
                binds,
                took_ms,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_BUDGET))]

    /// R10/R14: `allow`, `next_attempt`, `failures` and the pending flag of
    /// `Budget` agree with the reference model after every operation.
    #[test]
    fn the_budget_agrees_with_the_reference_model(
        free in any::<u8>(),
        delays in prop::collection::vec(any::<u16>(), 1..6),
        window in any::<u16>(),
        ops in prop::collection::vec(budget_op(), 0..80),
    ) {
        let policy = policy_from_bytes(free, &delays, window);
        check_budget_against_model(&policy, machine::base(), &ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_MACHINE))]

    /// The machine fed arbitrary outcomes keeps every safety property the
    /// checker in `testkit/src/machine.rs` asserts (exact identity, budget,
    /// fail-closed withdrawal, readiness before binds and publication,
    /// termination within the bound, no command after the report).
    #[test]
    fn the_machine_is_safe_under_arbitrary_outcomes(
        case in case_seed(),
        outcomes in prop::collection::vec(outcome_seed(), 0..30),
    ) {
        let case = case.build();
        run_and_check(&case, &outcomes);
    }
}

/// What happens to the world before one pass.
#[derive(Clone, Debug)]
struct PassPlan {
    crash: bool,
    native_restart: bool,
    health: Health,
    ready: bool,
    exits_after_start: bool,
    health_after_start: Health,
    withdraw_fault: bool,
    publish_fault: bool,
    start_fault: bool,
    restart_fault: bool,
    advance_s: u64,
}

/// Health the multi-pass world reports. `Unhealthy` is left out here: its
/// restart path depends on the unhealthy streak and on charging an
/// unconfirmed restart at the threshold, which this pass-level model does
/// not mirror. That path is covered by the machine property above (every
/// outcome, including unhealthy, against the safety properties), by the
/// scenario tests of R12 and by the `recovery_machine` fuzz target.
fn health() -> impl Strategy<Value = Health> {
    prop_oneof![
        4 => Just(Health::Healthy),
        1 => Just(Health::Starting),
        1 => Just(Health::None),
    ]
}

fn pass_plan() -> impl Strategy<Value = PassPlan> {
    (
        (
            prop::bool::weighted(0.4),
            prop::bool::weighted(0.1),
            health(),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.3),
            health(),
        ),
        (
            prop::bool::weighted(0.05),
            prop::bool::weighted(0.05),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
            prop_oneof![Just(5u64), Just(30), Just(60), 0u64..400],
        ),
    )
        .prop_map(
            |((crash, native_restart, health, ready, exits, has), faults)| {
                let (withdraw_fault, publish_fault, start_fault, restart_fault, advance_s) = faults;
                PassPlan {
                    crash,
                    native_restart,
                    health,
                    ready,
                    exits_after_start: exits,
                    health_after_start: has,
                    withdraw_fault,
                    publish_fault,
                    start_fault,
                    restart_fault,
                    advance_s,
                }
            },
        )
}

fn has(log: &[stead_testkit::world::Performed], pred: impl Fn(&Command) -> bool) -> usize {
    log.iter().filter(|p| pred(&p.command)).count()
}

/// Runs one planned pass and checks it against the budget model `budget`.
fn checked_pass(w: &mut World, budget: &mut BudgetModel, plan: &PassPlan) {
    let id = ContainerId::new("c1");
    let web = ServiceName::new("web");
    w.advance(Duration::from_secs(plan.advance_s));
    if plan.crash {
        w.crash("c1");
    }
    if plan.native_restart {
        // A new execution: whatever ran before was not continuously stable
        // (R14), so the machine restarts the streak when it sees it.
        budget.unstable();
        w.native_restart("c1");
    }
    {
        let c = w.container("c1");
        c.health = plan.health;
        c.ready = plan.ready;
        c.status_after_start = if plan.exits_after_start {
            ContainerStatus::Exited
        } else {
            ContainerStatus::Running
        };
        c.health_after_start = plan.health_after_start;
    }
    let fault = |what: &str| RuntimeError::Transient(what.into());
    if plan.withdraw_fault {
        w.faults
            .withdraw
            .push_back(TrafficError::Unreachable("proxy 500".into()));
    }
    if plan.publish_fault {
        w.faults
            .publish
            .push_back(TrafficError::Rejected("proxy 500".into()));
    }
    if plan.start_fault {
        w.faults.start.push_back(fault("oci error"));
    }
    if plan.restart_fault {
        w.faults.restart.push_back(fault("oci error"));
    }
    let found_down = w.containers[&id].status.is_down();
    let (starts_queued, restarts_queued) = (w.faults.start.len(), w.faults.restart.len());
    let (log_before, ready_before) = (w.log.len(), w.probed_ready.len());
    let now = w.now;
    let policy = w.policy.clone();

    let reports = w.pass();

    let log = &w.log[log_before..];
    let started = has(log, |c| matches!(c, Command::Start));
    let restarted = has(log, |c| matches!(c, Command::Restart { .. }));
    let probes = has(log, |c| matches!(c, Command::ProbeReadiness { .. }));
    let start_faults_used = starts_queued - w.faults.start.len();
    let restart_faults_used = restarts_queued - w.faults.restart.len();
    let verdict = &reports[0].verdict;
    // R9/R10: a down generation is started iff the model allows it.
    if found_down && (started > 0 || matches!(verdict, Verdict::Delayed { .. })) {
        let allowed = budget.found_down(&policy, now);
        budget.unstable();
        assert_eq!(allowed, started > 0, "S6: start decision at {now}");
    }
    assert!(started <= 1 && restarted <= 1 && probes <= 1);
    if started > 0 {
        if start_faults_used > 0 {
            budget.failure(&policy, now);
        } else {
            budget.attempt();
        }
    }
    if restarted > 0 {
        assert!(budget.allow(now), "S6: restart at {now} beyond the budget");
        let failed = restart_faults_used > 0 || start_faults_used > started;
        if failed {
            budget.failure(&policy, now);
        } else {
            budget.attempt();
        }
    }
    if probes > 0 && w.probed_ready.len() == ready_before {
        budget.failure(&policy, now);
    }
    if matches!(verdict, Verdict::Verified { .. }) {
        let read = w.containers[&id].health;
        if restarted == 0 && matches!(read, Health::Healthy | Health::None) {
            budget.stable(&policy, now);
        } else {
            budget.unstable();
        }
    } else {
        budget.unstable();
    }
    // The machine's remembered budget agrees with the model.
    let remembered = BudgetModel::from_entry(reports[0].memory.generation.budget.as_ref());
    assert_eq!(remembered.allow(now), budget.allow(now), "allow at {now}");
    assert_eq!(remembered.next_attempt(), budget.next_attempt());
    assert_eq!(remembered.failures(), budget.failures(), "failures");
    // S2: a route always carries an execution that passed readiness.
    if let Some(route) = w.routes.get(&web) {
        assert!(
            w.probed_ready
                .contains(&(route.container.clone(), route.started_at)),
            "S2: route to {:?}/{:?} never probed ready",
            route.container,
            route.started_at
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_WORLD))]

    /// Many passes over a world with random crashes, health, readiness and
    /// faults: every start and restart is within the reference budget, and
    /// every route carries an execution probed ready.
    #[test]
    fn passes_over_a_faulty_world_stay_within_the_budget_and_route_only_ready_executions(
        plans in prop::collection::vec(pass_plan(), 1..60),
    ) {
        let mut w = World::new().with_service("web", "c1", 30001);
        let mut budget = BudgetModel::default();
        for plan in &plans {
            checked_pass(&mut w, &mut budget, plan);
        }
    }
}

// --- Regressions found by these properties ---------------------------------

fn settled() -> World {
    let mut w = World::new().with_service("web", "c1", 30001);
    let reports = w.pass();
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
    w.advance(Duration::from_secs(60));
    w
}

#[test]
fn a_crash_inside_the_stable_window_restarts_the_window() {
    let mut w = settled();
    // One charged failure gives the generation a history.
    w.faults
        .binds
        .push_back(RuntimeError::Transient("x".into()));
    w.native_restart("c1");
    w.pass();
    w.advance(Duration::from_secs(60));
    w.pass(); // verified and stable: the streak starts
    w.advance(Duration::from_secs(240));
    w.crash("c1");
    let reports = w.pass(); // found down, started, verified healthy
    assert!(reports[0].intervened);
    w.advance(Duration::from_secs(61));
    let reports = w.pass();
    // Only 61 s of stability since the crash: the history must survive.
    let failures = reports[0]
        .memory
        .generation
        .budget
        .as_ref()
        .map(|b| b.failures);
    assert_eq!(failures, Some(1), "R14: a crash breaks the stable streak");
}

/// Guards the properties against vacuity: the generators reach every
/// verdict, interventions and publications, so the checks above run on the
/// paths that matter.
#[test]
fn the_generators_reach_every_verdict_and_intervention() {
    let mut state: u64 = 0x5eed;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u8
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10_000 {
        let case = CaseSeed {
            stopped: next() % 10 == 0,
            inhibited: next() % 10 == 0,
            active_binds: next(),
            active_verified: next(),
            memory_verified: next(),
            withdrawal_pending: next() % 5 == 0,
            budget: (next() % 2 == 0).then(|| EntrySeed {
                failures: next(),
                next_attempt_s: (next() % 2 == 0).then(|| i16::from(next()) - 128),
                stable_since_s: None,
                unhealthy_streak: next(),
                attempt_pending: next() % 2 == 0,
            }),
            free_attempts: next(),
            unhealthy_threshold: next(),
            proxy: next(),
        };
        let outcomes: Vec<OutcomeSeed> = (0..24)
            .map(|_| OutcomeSeed {
                choice: next(),
                status: next(),
                execution: next(),
                health: next(),
                binds: next(),
                took_ms: u16::from(next()) * 100,
            })
            .collect();
        let report = run_and_check(&case.build(), &outcomes);
        let verdict = match report.verdict {
            Verdict::Verified {
                published: true, ..
            } => "verified and published",
            Verdict::Verified { .. } => "verified",
            Verdict::Transitional => "transitional",
            Verdict::Delayed { .. } => "delayed",
            Verdict::Gone => "gone",
            Verdict::Inhibited => "inhibited",
            Verdict::Stopped => "stopped",
            Verdict::Failed => "failed",
        };
        seen.insert(verdict);
        if report.intervened {
            seen.insert("intervened");
        }
        if report.intervened && matches!(report.verdict, Verdict::Verified { .. }) {
            seen.insert("intervened and verified");
        }
    }
    let expected = [
        "delayed",
        "failed",
        "gone",
        "inhibited",
        "intervened",
        "intervened and verified",
        "stopped",
        "transitional",
        "verified",
        "verified and published",
    ];
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), expected);
}

/// A generation with crash-loop history whose stability streak has just
/// started (verified and stable one pass ago).
fn settled_with_a_stable_streak() -> World {
    let mut w = settled();
    w.faults
        .binds
        .push_back(RuntimeError::Transient("x".into()));
    w.native_restart("c1");
    w.pass();
    w.advance(Duration::from_secs(60));
    w.pass(); // verified and stable: the streak starts
    w
}

/// The budget's failure count in the first report, if it keeps history.
fn failures(reports: &[stead::core::recovery::Report]) -> Option<u32> {
    reports[0]
        .memory
        .generation
        .budget
        .as_ref()
        .map(|b| b.failures)
}

#[test]
fn a_crash_the_runtime_recovers_from_by_itself_also_restarts_the_stable_window() {
    let mut w = settled_with_a_stable_streak();
    w.advance(Duration::from_secs(240));
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("already started".into()));
    w.faults.native_restart_races_start = true;
    let reports = w.pass(); // found down; the runtime's own restart wins
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
    w.advance(Duration::from_secs(61));
    let reports = w.pass();
    assert_eq!(
        failures(&reports),
        Some(1),
        "R14: a crash breaks the stable streak"
    );
}

#[test]
fn a_crash_and_native_restart_between_two_passes_restarts_the_stable_window() {
    // The same history as above, but the crash and the runtime's own
    // restart both fall between two passes: no pass sees it down, only a
    // new execution. Five stable minutes are five minutes of one execution
    // (R14), so the history must outlive the old execution's streak.
    let mut w = settled_with_a_stable_streak();
    w.advance(Duration::from_secs(240));
    w.native_restart("c1"); // died and came back unseen
    w.advance(Duration::from_secs(61));
    let reports = w.pass(); // 301 s into the old streak, a new execution
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
    let kept = failures(&reports);
    assert!(
        kept.is_some(),
        "R14: the old execution's streak ended with its crash; history kept"
    );
    w.advance(Duration::from_secs(299));
    assert_eq!(
        failures(&w.pass()),
        kept,
        "not yet five minutes of this execution"
    );
    w.advance(Duration::from_secs(1));
    assert_eq!(
        failures(&w.pass()),
        None,
        "five stable minutes of one execution"
    );
}

/// The machine refuses an outcome that does not answer its outstanding
/// command (a driver bug, or a fuzzer's nonsense) instead of acting on it:
/// a health read taken for an inspection would otherwise pass for one.
#[test]
fn an_outcome_that_answers_another_command_is_refused() {
    let case = CaseSeed::default().build();
    let mut machine = stead::core::recovery::ServiceRecovery::new(&case.policy, case.input);
    let command = machine.poll_command().expect("a first command");
    let wrong = match command {
        Command::ReadHealth => stead::core::recovery::Outcome::Binds(Ok(Default::default())),
        _ => stead::core::recovery::Outcome::Health(Ok(Health::Healthy)),
    };
    // A broken invariant is an assertion (STYLE.md): the refusal is a panic.
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        machine.handle(wrong, machine::base())
    }))
    .expect_err("the machine acted on an outcome that answers another command");
    let why = refused
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| refused.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(why.contains("does not answer"), "refused, but for: {why}");
}

/// One command outstanding at a time (`core::machine`): polling again
/// before the answer is a driver's bug, and the machine says so.
#[test]
fn polling_again_before_the_answer_is_refused() {
    let case = CaseSeed::default().build();
    let mut machine = stead::core::recovery::ServiceRecovery::new(&case.policy, case.input);
    machine.poll_command().expect("a first command");
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| machine.poll_command()))
        .expect_err("a second command while the first is outstanding");
    let why = refused
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| refused.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        why.contains("before the last command was answered"),
        "{why}"
    );
}
