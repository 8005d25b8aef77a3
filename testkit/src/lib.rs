//! Test support for stead. Nothing here ships: the `stead` crate depends on
//! none of it, and the tests, benches, simulation and fuzzers depend on it.
//!
//! - [`ports`] and [`store`]: deterministic in-memory implementations of
//!   every port, with fault and observer hooks for the simulation; the
//!   store is also the model the SQL stores are differentially tested
//!   against.
//! - [`world`]: a synchronous fake world that drives the core's instance
//!   pass machine for scenario and property tests.
//! - [`machine`], [`model`], [`pass`], [`upgrade`], [`planners`]: reference
//!   models and safety checkers shared by the property tests and the
//!   cargo-fuzz targets. Their inputs are plain numbers, so proptest and
//!   `arbitrary` can both produce them.
//! - [`explore`]: the exhaustive bounded explorer of the recovery, the
//!   pass, the upgrade and the Helm bake (`tests/exhaustive.rs`), over the
//!   same checkers.
//! - [`fleet`]: steady fleets for the scale benchmark and round-trip tests.
//! - [`mutants`]: the switch that arms one deliberately broken rule.

pub mod explore;
pub mod fleet;
pub mod machine;
pub mod metrics;
pub mod model;
pub mod mutants;
pub mod pass;
pub mod planners;
pub mod ports;
pub mod store;
pub mod upgrade;
pub mod world;
