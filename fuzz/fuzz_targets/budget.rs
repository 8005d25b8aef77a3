//! `budget`: arbitrary operations (time advances, failures, unconfirmed
//! charges, the crash-loop rule, attempts, stable and unstable
//! observations, unhealthy streaks, forgets) under an arbitrary valid
//! policy, run against `Budget` and the reference model of docs/rules.md
//! R10/R14; any disagreement in `allow`, `next_attempt`, `failures` or the
//! pending flag is a crash.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use stead_fuzz::machine::base;
use stead_fuzz::model::{check_budget_against_model, policy_from_bytes, BudgetOp};

/// Most operations one input may run; keeps every execution short.
const OPS_MAX: usize = 256;

#[derive(Arbitrary, Debug)]
struct Input {
    free_attempts: u8,
    delays: Vec<u16>,
    stable_window_s: u16,
    ops: Vec<(u8, u16)>,
}

fuzz_target!(|input: Input| {
    let policy = policy_from_bytes(input.free_attempts, &input.delays, input.stable_window_s);
    let ops: Vec<BudgetOp> = input
        .ops
        .iter()
        .take(OPS_MAX)
        .map(|&(kind, amount)| BudgetOp::from_bytes(kind, amount))
        .collect();
    check_budget_against_model(&policy, base(), &ops);
});
