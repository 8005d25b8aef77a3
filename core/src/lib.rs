//! The pure, deterministic heart of stead.
//!
//! Contract: nothing in this module performs I/O, reads a clock, sleeps,
//! spawns, or draws from a global random number generator. Time is always an
//! argument (`now: Timestamp`), randomness always a seeded generator. The same
//! code therefore runs unchanged in the daemon, in the madsim simulation, under
//! proptest and under cargo-fuzz. Being its own crate (`stead-core`), it can
//! reach nothing it does not depend on, and `tests/core_purity.rs` holds its
//! dependency tree to a reviewed list and its source free of the standard
//! library's I/O, clocks and printing.
//!
//! Its API is what the engine, the daemon, the test kit, the simulation and
//! the fuzzers use: an item only the core itself uses is `pub(crate)` (its
//! bounds, its parsing helpers, its plans' internals), so what is `pub`
//! here is a promise to those callers.

pub mod bake;
pub mod broken;
pub mod budget;
pub mod catalog;
pub mod domains;
pub mod errors;
pub mod event_log;
pub mod fleet;
pub mod grants;
pub mod hash;
pub mod helm_bake;
pub mod hosts;
pub mod judge;
pub mod limits;
pub mod machine;
pub mod memory;
pub mod names;
pub mod pass;
pub mod plan;
pub mod policy;
pub mod provision;
pub mod record;
pub mod recovery;
pub mod release;
pub mod retire;
pub mod spec;
pub mod succession;
pub mod toml_error;
pub mod traffic;
pub mod types;
pub mod undo;
pub mod upgrade;
pub mod verify;
pub mod webhook;
pub mod window;
