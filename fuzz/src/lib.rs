//! Helpers shared by the fuzz targets and, through `#[path]`, by
//! `tests/recovery_properties.rs`: the reference budget model and the
//! recovery-machine safety checker. They live here, outside `src/`, so that
//! test-only code never ships in the `stead` crate, and exist once.

pub mod machine;
pub mod model;
