//! Helpers shared by the fuzz targets and, through `#[path]`, by the
//! property tests: the reference budget model and the recovery-machine
//! safety checker (`tests/recovery_properties.rs`), and the control-loop
//! world generator and planner properties (`tests/control_plan.rs`). They
//! live here, outside `src/`, so that test-only code never ships in the
//! `stead` crate, and exist once.

pub mod machine;
pub mod model;
pub mod pass;
pub mod planners;
pub mod upgrade;
