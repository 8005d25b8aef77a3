//! The fuzz targets' shared helpers: the reference models and safety
//! checkers of `stead-testkit` (`testkit/`), which the property tests use
//! too. They live there, outside `src/`, so that test-only code never
//! ships in the `stead` crate, and exist once.

pub use stead_testkit::{machine, model, pass, planners, upgrade};
