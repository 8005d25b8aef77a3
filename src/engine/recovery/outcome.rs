//! What a pass reports: per instance, and aggregated.

use crate::core::errors::{ErrorKind, PortFailure, PortName};
use crate::core::pass::PassError;
use crate::core::recovery::Report;
use crate::core::types::{InstanceName, RuntimeError, ServiceKey};
use crate::ports::{StoreError, TrafficError};

/// One failure of a recovery pass, naming the instance (and service) it
/// concerns when it concerns one; a port's typed error is its source.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// Something in one instance's pass, as the core reported it.
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error("{instance}: lock: {source}")]
    Lock {
        instance: InstanceName,
        #[source]
        source: StoreError,
    },
    #[error("{instance}: load: {source}")]
    Load {
        instance: InstanceName,
        #[source]
        source: StoreError,
    },
    #[error("runtime list: {0}")]
    RuntimeList(#[source] RuntimeError),
    #[error("list instances: {0}")]
    ListInstances(#[source] StoreError),
    #[error("skipped row: {0}")]
    SkippedRow(#[source] StoreError),
    #[error("traffic plane: {0}")]
    TrafficPlane(#[source] TrafficError),
    #[error("read routes back: {0}")]
    ReadRoutes(#[source] TrafficError),
    #[error("{}/{}: withdraw stale route: {source}", .route.instance, .route.service)]
    WithdrawStale {
        route: ServiceKey,
        #[source]
        source: TrafficError,
    },
    /// A step that did not finish within the instance deadline.
    #[error("{what}: deadline exceeded")]
    Deadline { what: String },
    #[error("reconciler lease lost; pass stopped")]
    LeaseLost,
}

impl RecoverError {
    /// The port and kind of a failure the pass met in its own calls
    /// (listing, locks and loads, the traffic plane), if a port failed.
    /// `None` for an instance machine's errors: those are counted where
    /// the port answered the machine's command (`log::StepLog::step`).
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Pass(_) => None,
            Self::Lock { source: e, .. }
            | Self::Load { source: e, .. }
            | Self::ListInstances(e)
            | Self::SkippedRow(e) => Some(e.failure()),
            Self::RuntimeList(e) => Some(e.failure()),
            Self::TrafficPlane(e) | Self::ReadRoutes(e) | Self::WithdrawStale { source: e, .. } => {
                Some(e.failure())
            }
            Self::Deadline { .. } | Self::LeaseLost => None,
        }
    }

    /// This error, counted in `stead_port_errors_total` if a port failed
    /// underneath: called once where the pass first meets the failure, so
    /// a store that fails the pass's lock-and-load is as visible as one
    /// that fails a machine's write.
    pub(super) fn counted(self) -> Self {
        if let Some((port, kind)) = self.port_failure() {
            crate::engine::count_port_failure(port, kind);
        }
        self
    }
}

/// What one instance's recovery did.
#[derive(Debug, Default)]
pub struct InstanceOutcome {
    pub reports: Vec<Report>,
    pub retired: Vec<String>,
    pub errors: Vec<RecoverError>,
    /// Loaded under its lock and driven through its pass (to the end, to
    /// an error or to the deadline): its memory is now pruned against the
    /// ACTIVE it loaded (R16).
    pub driven: bool,
    /// When its driven pass began: nothing it reports was seen earlier.
    pub began_at: Option<crate::core::types::Timestamp>,
    pub skipped_busy: bool,
    /// Not attempted: this process no longer holds the reconciler lease
    /// (T2), so it must not act.
    pub skipped_no_lease: bool,
}

/// What one whole pass did, aggregated (R2).
#[derive(Debug, Default)]
pub struct PassOutcome {
    /// Each instance the pass took up, in listing order. Kept as listed:
    /// keying 100,000 outcomes by name cost a sort of the whole fleet per
    /// pass, and every reader walks them all (issue #14).
    pub instances: Vec<(InstanceName, InstanceOutcome)>,
    /// Errors not tied to one instance (listing failed, bad rows).
    pub errors: Vec<RecoverError>,
}

impl InstanceOutcome {
    pub(super) fn failed(error: RecoverError) -> Self {
        Self {
            errors: vec![error],
            ..Default::default()
        }
    }
}

impl PassOutcome {
    pub fn error_count(&self) -> usize {
        self.errors.len() + self.outcomes().map(|i| i.errors.len()).sum::<usize>()
    }

    /// Every instance's outcome, in listing order.
    pub fn outcomes(&self) -> impl Iterator<Item = &InstanceOutcome> + Clone {
        self.instances.iter().map(|(_, outcome)| outcome)
    }

    /// One instance's outcome, if the pass took it up (a linear search:
    /// for tests and one-off lookups, not per instance).
    pub fn instance(&self, name: &InstanceName) -> Option<&InstanceOutcome> {
        self.instances
            .iter()
            .find(|(listed, _)| listed == name)
            .map(|(_, outcome)| outcome)
    }
}
