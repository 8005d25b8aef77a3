//! The pure, deterministic heart of stead.
//!
//! Contract: nothing in this module performs I/O, reads a clock, sleeps,
//! spawns, or draws from a global random number generator. Time is always an
//! argument (`now: Timestamp`), randomness always a seeded generator. The same
//! code therefore runs unchanged in the daemon, in the madsim simulation, under
//! proptest and under cargo-fuzz. `tests/core_purity.rs` fails the build's
//! tests if this module gains a forbidden dependency.

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
pub mod limits;
pub mod machine;
pub mod memory;
pub mod names;
pub mod pass;
pub mod plan;
pub mod policy;
pub mod provision;
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
