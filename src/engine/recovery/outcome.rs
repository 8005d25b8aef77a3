//! What a pass reports: per instance, and aggregated.

use std::collections::BTreeMap;

use crate::core::recovery::Report;
use crate::core::types::InstanceName;

/// What one instance's recovery did.
#[derive(Debug, Default)]
pub struct InstanceOutcome {
    pub reports: Vec<Report>,
    pub retired: Vec<String>,
    pub errors: Vec<String>,
    pub skipped_busy: bool,
    /// Not attempted: this process no longer holds the reconciler lease
    /// (T2), so it must not act.
    pub skipped_no_lease: bool,
}

/// What one whole pass did, aggregated (R2).
#[derive(Debug, Default)]
pub struct PassOutcome {
    pub instances: BTreeMap<InstanceName, InstanceOutcome>,
    /// Errors not tied to one instance (listing failed, bad rows).
    pub errors: Vec<String>,
}

impl InstanceOutcome {
    pub(super) fn failed(error: String) -> Self {
        Self {
            errors: vec![error],
            ..Default::default()
        }
    }
}

impl PassOutcome {
    pub fn error_count(&self) -> usize {
        self.errors.len()
            + self
                .instances
                .values()
                .map(|i| i.errors.len())
                .sum::<usize>()
    }
}
