//! stead: a level-triggered reconciliation engine for self-hosted workloads.
//!
//! The crate is layered (see `docs/ARCHITECTURE.md`):
//!
//! - [`core`] is pure and deterministic: every decision is a function of its
//!   inputs and an explicit `now`. It knows nothing of async, clocks, Docker,
//!   SQL or logging.
//! - [`ports`] are the traits through which the engine touches the world, each
//!   with an in-memory implementation.
//! - [`engine`] is a thin async interpreter that drives the core over the ports.
//! - `adapters` (feature `io`) are the real implementations: SQLite/Postgres,
//!   Docker, Caddy, Helm, HTTP/TCP probes.

#[cfg(all(feature = "io", not(madsim)))]
pub mod adapters;
pub mod config;
pub mod core;
#[cfg(all(feature = "io", not(madsim)))]
pub mod daemon;
pub mod engine;
pub mod mutants;
pub mod ops;
pub mod ports;
pub mod store;
