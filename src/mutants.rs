//! Deliberately broken rules, for proving that the simulation's checker
//! catches them (the "mutation exercise" of `docs/simulation.md`).
//!
//! Each [`Mutant`] names one rule the engine must never break. With the
//! `mutants` feature off (every real build), [`active`] is a constant
//! `false` and the hooks compile away. With it on (only the simulation's
//! build enables it), a test arms one mutant for the current thread with
//! [`armed`], runs seeds, and asserts that the matching invariant fires.
//!
//! The pure core never reads this switch: the simulation's setup reads
//! [`armed_now`] and hands the mutant to the core as data
//! (`RecoveryPolicy::broken`). The engine, the in-memory ports and store
//! read it here, thread-locally; madsim runs a whole seed on the thread
//! that calls `block_on`, so a seed sees exactly the mutant its test armed.

pub use crate::core::broken::Mutant;

#[cfg(feature = "mutants")]
mod armed_state {
    use std::cell::Cell;

    use super::Mutant;

    std::thread_local! {
        pub static ARMED: Cell<Option<Mutant>> = const { Cell::new(None) };
    }
}

/// Whether `mutant` is armed on this thread. Always `false` without the
/// `mutants` feature.
#[inline(always)]
pub fn active(mutant: Mutant) -> bool {
    #[cfg(feature = "mutants")]
    {
        armed_state::ARMED.with(|a| a.get() == Some(mutant))
    }
    #[cfg(not(feature = "mutants"))]
    {
        let _ = mutant;
        false
    }
}

/// The mutant armed on this thread, if any: what a test's setup passes to
/// the core as data (`RecoveryPolicy::broken`). Always `None` without the
/// `mutants` feature.
pub fn armed_now() -> Option<Mutant> {
    #[cfg(feature = "mutants")]
    {
        armed_state::ARMED.with(|a| a.get())
    }
    #[cfg(not(feature = "mutants"))]
    {
        None
    }
}

/// Runs `f` with `mutant` armed on this thread, then disarms it.
#[cfg(feature = "mutants")]
pub fn armed<R>(mutant: Mutant, f: impl FnOnce() -> R) -> R {
    struct Disarm;
    impl Drop for Disarm {
        fn drop(&mut self) {
            armed_state::ARMED.with(|a| a.set(None));
        }
    }
    armed_state::ARMED.with(|a| a.set(Some(mutant)));
    let _disarm = Disarm;
    f()
}
