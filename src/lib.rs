//! stead: a level-triggered reconciliation engine for self-hosted workloads.
//!
//! The crate is layered (see `docs/ARCHITECTURE.md`):
//!
//! - [`core`] is the `stead-core` crate (`core/`), pure and deterministic:
//!   every decision is a function of its inputs and an explicit `now`. It
//!   knows nothing of async, clocks, Docker, SQL or logging, and being its own
//!   crate it cannot: it depends on nothing that could.
//! - [`ports`] are the traits through which the engine touches the world;
//!   their in-memory implementations, the fake world and the simulation's
//!   broken-rule switch live in the `stead-testkit` crate (`testkit/`), so
//!   none of them ships.
//! - [`engine`] is a thin async interpreter that drives the core over the ports.
//! - `adapters` (feature `io`) are the real implementations: SQLite/Postgres,
//!   Docker, Caddy, Helm, HTTP/TCP probes.

#[cfg(all(feature = "io", not(madsim)))]
pub mod adapters;
pub mod config;
/// The pure core, re-exported so `stead::core::…` names it.
pub use stead_core as core;
/// The mutation exercise's check (`core::broken`), for the engine's rules.
pub use stead_core::broken;
#[cfg(all(feature = "io", not(madsim)))]
pub mod daemon;
pub mod engine;
pub mod ops;
pub mod ports;
pub mod store;
