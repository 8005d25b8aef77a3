//! The per-service recovery machine (R4–R14), sans-IO.
//!
//! The machine never performs anything. The caller drives it:
//!
//! 1. [`ServiceRecovery::poll_command`] yields the next [`Command`] (or
//!    `None` when the machine is finished);
//! 2. the caller performs that command through a port and feeds the result
//!    back with [`ServiceRecovery::handle`], passing the current `now`;
//! 3. repeat until `poll_command` returns `None`, then take the
//!    [`Report`] with [`ServiceRecovery::into_report`].
//!
//! If the caller gives up (the per-instance deadline passed), it calls
//! [`ServiceRecovery::abandon`] instead, which fails closed.
//!
//! The same machine is driven by the async engine, by the synchronous test
//! driver in `tests/`, and by a fuzzer feeding it arbitrary outcomes.
//!
//! The room's parts: [`command`] (what the machine asks for and what the
//! caller answers), [`report`] (what it leaves behind: verdict, errors,
//! memory, and why it asked), `phase` (where it is, each stage carrying the
//! data that means something there) and `machine` ([`ServiceRecovery`]'s
//! transitions).

mod command;
mod machine;
mod phase;
mod report;

pub(crate) use command::outcome_answers;
pub use command::{Command, Outcome};
pub use machine::ServiceRecovery;
pub use report::{RecoveryError, Report, Verdict, Why};

use jiff::Timestamp;

use super::budget::BudgetEntry;
use super::types::{ActiveService, Binds, GenerationKey, Intent};

/// Hard bound on the commands one service recovery may issue. The longest
/// path is about a dozen; anything near this bound is a bug.
pub const COMMANDS_PER_RECOVERY_MAX: u32 = 24;

/// Everything the recovery pass remembers about one generation between
/// passes. Volatile by design (R17), except `verified_started_at`, which
/// the engine also persists.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GenerationMemory {
    pub budget: Option<BudgetEntry>,
    /// The last execution this daemon verified and routed.
    pub verified_started_at: Option<Timestamp>,
}

impl GenerationMemory {
    pub fn is_empty(&self) -> bool {
        self.budget.is_none() && self.verified_started_at.is_none()
    }
}

/// Memory of one service as handed to (and returned by) a recovery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceMemory {
    pub generation: GenerationMemory,
    /// A previous withdrawal failed and was not yet retried with success
    /// (R6). Keyed by service, not generation.
    pub withdrawal_pending: bool,
}

/// The inputs of one service's recovery.
#[derive(Clone, Debug)]
pub struct ServiceInput {
    pub key: GenerationKey,
    /// ACTIVE as loaded at the start of the pass.
    pub active: ActiveService,
    pub intent: Intent,
    /// A durable inhibition (any reason but `retirement-pending`) on this
    /// exact generation, by reason.
    pub inhibition: Option<String>,
    pub memory: ServiceMemory,
    /// What the traffic plane holds for this service, read back at the
    /// start of the pass (T5).
    pub proxy: ProxyView,
}

/// The traffic plane's route of one service, as read back from the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyView {
    /// Not read (a targeted pass) or the read failed: trust memory (R17).
    #[default]
    Unknown,
    /// The proxy holds no route for the service.
    Absent,
    /// The proxy routes the service to this loopback host port.
    Dials(u16),
}

impl ProxyView {
    /// T5: whether the proxy provably does not route the service to
    /// `binds` (absent, or to another port). Such a route is republished
    /// after verifying the execution, as a restarted daemon does (R17):
    /// an idempotent upsert, never a new probe of an unchanged execution.
    /// A service without binds (no ports: a worker, a database reached on
    /// the instance network) is never routed, so nothing can contradict it.
    pub fn contradicts(self, binds: &Binds) -> bool {
        match self {
            _ if binds.is_empty() => false,
            ProxyView::Unknown => false,
            ProxyView::Absent => true,
            ProxyView::Dials(port) => binds.values().next() != Some(&port),
        }
    }
}
