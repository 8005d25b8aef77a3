//! The switch that arms one deliberately broken rule, for proving that the
//! simulation's checker catches it (the "mutation exercise" of
//! `docs/simulation.md`).
//!
//! Each [`Mutant`] names one rule stead must never break. A test arms one
//! for the current thread with [`armed`] and runs seeds; the simulation's
//! setup reads [`armed_now`] and hands it, as data, to what it builds: the
//! pure core and the engine through `RecoveryPolicy::broken`, the worker
//! through `WorkerConfig::broken`. Only the fakes of this crate (the
//! in-memory store and runtime) read the switch itself, since they are
//! test support. madsim runs a whole seed on the thread that calls
//! `block_on`, so a seed sees exactly the mutant its test armed.
//!
//! Nothing here ships: the `stead` crate holds only the names
//! (`stead::core::broken`).

use std::cell::Cell;

pub use stead::core::broken::Mutant;

std::thread_local! {
    static ARMED: Cell<Option<Mutant>> = const { Cell::new(None) };
}

/// Whether `mutant` is armed on this thread.
#[inline]
pub fn active(mutant: Mutant) -> bool {
    ARMED.with(|a| a.get() == Some(mutant))
}

/// The mutant armed on this thread, if any: what a test's setup passes on
/// as data.
pub fn armed_now() -> Option<Mutant> {
    ARMED.with(Cell::get)
}

/// Runs `f` with `mutant` armed on this thread, then disarms it (also when
/// `f` panics).
pub fn armed<R>(mutant: Mutant, f: impl FnOnce() -> R) -> R {
    struct Disarm;
    impl Drop for Disarm {
        fn drop(&mut self) {
            ARMED.with(|a| a.set(None));
        }
    }
    ARMED.with(|a| a.set(Some(mutant)));
    let _disarm = Disarm;
    f()
}
