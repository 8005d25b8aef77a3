//! The reference model of the crash-loop budget (`stead::core::judge::
//! budget_model`, written from the text of docs/rules.md R10, R12 and R14
//! alone, never calling `Budget`), and a checker that runs a sequence of
//! operations against both and demands they agree.
//!
//! Shared, without duplication, by the cargo-fuzz target `budget`
//! (re-exported by `fuzz/src/lib.rs`) and by `tests/recovery_properties.rs`;
//! it depends on nothing but `stead` and std.

use std::time::Duration;

use stead::core::budget::Budget;
use stead::core::policy::RecoveryPolicy;
use stead::core::types::Timestamp;

pub use stead::core::judge::budget_model::{later, BudgetModel};

/// One step of a budget's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetOp {
    /// Time passes (seconds).
    Advance(u32),
    Failure,
    ChargeUnconfirmed,
    /// The crash-loop rule as the machine applies it.
    FoundDown,
    Attempt,
    Stable,
    Unstable,
    Unhealthy,
    ClearUnhealthy,
    Forget,
}

impl BudgetOp {
    /// Maps any byte pair onto an operation (for fuzzers and strategies).
    pub fn from_bytes(kind: u8, amount: u16) -> Self {
        match kind % 10 {
            0 => Self::Advance(u32::from(amount) % 1200),
            1 => Self::Failure,
            2 => Self::ChargeUnconfirmed,
            3 => Self::FoundDown,
            4 => Self::Attempt,
            5 => Self::Stable,
            6 => Self::Unstable,
            7 => Self::Unhealthy,
            8 => Self::ClearUnhealthy,
            _ => Self::Forget,
        }
    }
}

/// A valid policy drawn from a few bytes: 1–4 free attempts, 1–5
/// non-decreasing delays of 1 s – 20 min, a stable window of 1 s – 10 min.
pub fn policy_from_bytes(free: u8, delays: &[u16], window_s: u16) -> RecoveryPolicy {
    let mut ladder: Vec<Duration> = delays
        .iter()
        .take(5)
        .map(|&s| Duration::from_secs(1 + u64::from(s) % 1200))
        .collect();
    if ladder.is_empty() {
        ladder.push(Duration::from_secs(60));
    }
    ladder.sort();
    RecoveryPolicy {
        free_attempts: 1 + u32::from(free) % 4,
        delays: ladder,
        stable_window: Duration::from_secs(1 + u64::from(window_s) % 600),
        ..RecoveryPolicy::default()
    }
    .validated()
    .expect("policy_from_bytes builds valid policies")
}

/// Runs `ops` against `Budget` and the model from `start`; panics, naming
/// the step, at the first disagreement in `allow`, `next_attempt`,
/// `failures` or `attempt_pending`, or anywhere in the entry remembered.
pub fn check_budget_against_model(policy: &RecoveryPolicy, start: Timestamp, ops: &[BudgetOp]) {
    let mut budget = Budget::default();
    let mut model = BudgetModel::default();
    let mut now = start;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            BudgetOp::Advance(secs) => now = later(now, Duration::from_secs(u64::from(secs))),
            BudgetOp::Failure => {
                budget.record_failure(policy, now);
                model.failure(policy, now);
            }
            BudgetOp::ChargeUnconfirmed => {
                budget.charge_unconfirmed_attempt(policy, now);
                model.charge_unconfirmed(policy, now);
            }
            BudgetOp::FoundDown => {
                if budget.allow(now) && budget.attempt_pending() {
                    budget.charge_unconfirmed_attempt(policy, now);
                }
                model.found_down(policy, now);
            }
            BudgetOp::Attempt => {
                budget.mark_attempt();
                model.attempt();
            }
            BudgetOp::Stable => {
                budget.observe_stable(policy, now);
                model.stable(policy, now);
            }
            BudgetOp::Unstable => {
                budget.invalidate_stable();
                model.unstable();
            }
            BudgetOp::Unhealthy => {
                budget.observe_unhealthy();
                model.unhealthy();
            }
            BudgetOp::ClearUnhealthy => {
                budget.clear_unhealthy();
                model.clear_unhealthy();
            }
            BudgetOp::Forget => {
                budget.forget();
                model.forget();
            }
        }
        let context = || format!("step {step} ({op:?}) at {now}, ops {ops:?}");
        assert_eq!(budget.allow(now), model.allow(now), "allow, {}", context());
        assert_eq!(
            budget.next_attempt(),
            model.next_attempt(),
            "next_attempt, {}",
            context()
        );
        assert_eq!(
            budget.failures(),
            model.failures(),
            "failures, {}",
            context()
        );
        assert_eq!(
            budget.attempt_pending(),
            model.attempt_pending(),
            "attempt_pending, {}",
            context()
        );
        assert_eq!(
            budget.clone().into_entry(),
            model.entry(),
            "the entry, {}",
            context()
        );
    }
}
