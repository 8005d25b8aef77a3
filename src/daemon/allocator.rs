//! The daemon's allocator, tuned for a control loop (issue #14).
//!
//! The daemon allocates with mimalloc (`src/bin/stead/main.rs`). A pass
//! frees most of what it allocates, and the next pass allocates it again;
//! with mimalloc's default purge delay (one second) the memory freed in a
//! pass goes back to the kernel before the next pass asks for it, which
//! then takes every page as a fresh, zeroed fault. Over 100,000 instances
//! that was a tenth of a steady pass. Held for longer than a tick, the
//! memory is reused instead; a daemon whose fleet shrinks, or that sits
//! idle, still gives it back once the delay has passed.

use std::ffi::c_long;

/// mimalloc's `mi_option_purge_delay` (its `mi_option_e`, version 3).
/// libmimalloc-sys names only its stable options; the test below checks
/// that this index is the purge delay, by its documented default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long memory freed by the daemon stays with it before mimalloc
/// returns it to the kernel: longer than a tick (one second by default)
/// plus a pass.
pub const PURGE_DELAY_MS: c_long = 10_000;

/// The environment variables an operator sets to choose the delay
/// themselves (mimalloc reads them at load; `RESET_DELAY` is its old name).
const OPERATOR_SETTINGS: [&str; 2] = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"];

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`] unless the operator
/// chose one in the environment. Call once, first thing in `main`.
pub fn tune() {
    if OPERATOR_SETTINGS
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    {
        return;
    }
    // SAFETY: sets one integer in mimalloc's table of global options,
    // which every later purge reads; no memory is touched.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
}

/// The purge delay in force, in milliseconds.
pub fn purge_delay_ms() -> c_long {
    // SAFETY: reads one of mimalloc's global options.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the option's index: a mimalloc whose options moved would have
    /// this set some other option. 1,000 ms is version 3's documented
    /// default purge delay; no neighbouring option defaults to it.
    #[test]
    fn the_purge_delay_is_the_option_tuned_and_becomes_ten_seconds() {
        if OPERATOR_SETTINGS
            .iter()
            .all(|name| std::env::var_os(name).is_none())
        {
            assert_eq!(purge_delay_ms(), 1_000, "mimalloc v3's default purge delay");
        }
        tune();
        if OPERATOR_SETTINGS
            .iter()
            .all(|name| std::env::var_os(name).is_none())
        {
            assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        }
    }
}
