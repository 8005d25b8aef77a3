//! The madsim simulation of stead: the real engine and core against the
//! in-memory ports, a workload model, swarm faults, operators acting, and a
//! checker that asserts the invariants of docs/rules.md (S1–S11, L1–L5, N1–N4) at the instant every
//! effect happens (safety) and after the faults stop (liveness).
//!
//! One seed → one run. Every sub-seed is derived from it, so a failure
//! replays exactly with `STEAD_SIM_SEED=<seed> cargo sim`.
#![cfg(madsim)]

pub mod checker;
pub mod coverage;
pub mod events;
pub mod hazards;
pub mod judge;
pub mod run;
pub mod tenants;
pub mod topology;
pub mod world;

pub use run::{run_seed, SimConfig, SimOutcome};

/// Writes a report line straight to stderr. libtest captures `eprintln!`
/// of a passing test, and the runner's report (seeds, faults, invariants
/// checked, speed) is what `cargo sim` is run to see.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
