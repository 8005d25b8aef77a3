//! What a tick reports: the checks it runs, each its own error boundary
//! (C3), and the outcome of one tick.

use crate::core::types::InstanceName;

/// The checks of one tick, in order. Each is its own error boundary (C3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    Recovery,
    Drift,
    LeaseExpiry,
    Ttl,
    VersionDrift,
}

impl Check {
    pub const ALL: [Check; 5] = [
        Check::Recovery,
        Check::Drift,
        Check::LeaseExpiry,
        Check::Ttl,
        Check::VersionDrift,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Check::Recovery => "recovery",
            Check::Drift => "drift",
            Check::LeaseExpiry => "lease_expiry",
            Check::Ttl => "ttl",
            Check::VersionDrift => "version_drift",
        }
    }
}

/// What one tick did.
#[derive(Debug, Default)]
pub struct TickOutcome {
    /// `false` when another replica holds the reconciler lease (C2): no
    /// check ran, only the heartbeat.
    pub leader: bool,
    /// Checks that failed, with why.
    pub failed: Vec<(Check, String)>,
    /// Errors inside checks that did not fail as a whole (one instance's
    /// recovery, a notification).
    pub warnings: Vec<String>,
    pub tasks_enqueued: u32,
    pub traceparent: String,
    /// Instances the recovery pass drove (loaded under their lock), in
    /// listing order: what the pass's memory now says of them was pruned
    /// this tick (R16).
    pub recovered: Vec<InstanceName>,
    /// The tick's reading of the database's clock was one nothing vouched
    /// for (a first reading, or a jump): it expired no TTL, requeued no
    /// task and took over no lease (#41).
    pub clock_unverified: bool,
}

impl TickOutcome {
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
}
