//! Exhaustive bounded checking of the core's machines (issue #44,
//! `docs/simulation.md`, "Exhaustive checking"): every sequence of port
//! answers with at most a bounded number of faults, explored by
//! `stead_testkit::explore`. Each test prints what it covered; a violation
//! fails with its counterexample, a numbered list of steps.
//!
//! `STEAD_EXPLORE_DEPTH=N` explores every machine with N faults per path
//! instead of the CI bound.

use stead::core::broken::Mutant;
use stead_testkit::explore::{self, depth_from_env, explore, Stats};

/// Faults per path at the CI bound, per machine.
const RECOVERY_DEPTH: usize = 2;
const PASS_DEPTH: usize = 2;

fn report(result: Result<Stats, Box<explore::Counterexample>>) {
    match result {
        Ok(stats) => println!("{stats}"),
        Err(counterexample) => panic!("{counterexample}"),
    }
}

#[test]
fn one_service_recovery_across_passes_holds_every_rule() {
    let depth = depth_from_env(RECOVERY_DEPTH);
    report(explore("recovery", depth, |ch| {
        explore::recovery::run(ch, None)
    }));
}

#[test]
fn one_instance_pass_with_a_pending_retirement_holds_every_rule() {
    let depth = depth_from_env(PASS_DEPTH);
    report(explore("instance pass", depth, |ch| {
        explore::pass::run(ch, None)
    }));
}

/// The mutants of the exercise that live in the recovery machine.
const RECOVERY_MUTANTS: [Mutant; 6] = [
    Mutant::SkipWithdrawBeforeStart,
    Mutant::PublishBeforeReadiness,
    Mutant::ForgetCrashLoopCharge,
    Mutant::PublishBeforeRecord,
    Mutant::PublishPortless,
    Mutant::RestartBeforeThreshold,
];

/// Finds `mutant` within `max_depth` faults with `run`, and prints at
/// which depth and what broke.
fn find(machine: &str, mutant: Mutant, max_depth: usize, run: impl Fn(&mut explore::Chooser)) {
    let name = format!("{machine} with {mutant:?}");
    let found = explore::shallowest(&name, max_depth, run)
        .unwrap_or_else(|| panic!("{name}: not found within {max_depth} faults"));
    let first = found.message.lines().next().unwrap_or_default();
    println!(
        "{mutant:?}: found by the {machine} explorer at depth {}: {first}",
        found.depth
    );
}

#[test]
fn every_recovery_mutant_is_found() {
    for mutant in RECOVERY_MUTANTS {
        find("recovery", mutant, RECOVERY_DEPTH, |ch| {
            explore::recovery::run(ch, Some(mutant))
        });
    }
}

/// The mutants of the exercise that live in the instance pass (its own
/// rules, and the retirement and revert rules it applies).
const PASS_MUTANTS: [Mutant; 4] = [
    Mutant::RetireBeforeSuccessorVerified,
    Mutant::StartNonActive,
    Mutant::ForgetProxyRoutes,
    Mutant::RevertWithoutHalt,
];

#[test]
fn every_pass_mutant_is_found() {
    for mutant in PASS_MUTANTS {
        find("instance pass", mutant, PASS_DEPTH, |ch| {
            explore::pass::run(ch, Some(mutant))
        });
    }
}
