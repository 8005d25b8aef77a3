//! The one contract every sans-IO machine of the core keeps (quinn-proto's
//! `poll_*`/`handle_*` split): a service's recovery, an instance's pass, an
//! upgrade, a provision and a deprovision.
//!
//! ```text
//! while let Some(command) = machine.poll_command() {     // one outstanding
//!     if command.is_effect() && !trusted { machine.abandon(Abandon::MandateLost); continue }
//!     machine.handle(perform(command), now);            // every answer with its `now`
//! }   // or, while it waits: sleep until poll_timeout(), then handle_timeout(now)
//! machine.into_report()
//! ```
//!
//! The engine has one driver for all of them (`engine::drive`); a test, a
//! property harness or a fuzzer drives them the same way with answers of
//! its own choosing.

use super::errors::{ErrorKind, PortName};
use super::types::Timestamp;

/// Why a machine is told to stop before it is done. It fails closed: what
/// it asked for and was never answered counts as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Abandon {
    /// The deadline passed (an instance's recovery deadline).
    Deadline,
    /// The lease or the instance lock is no longer trusted (T2, T3).
    MandateLost,
}

impl Abandon {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Deadline => "deadline exceeded",
            Self::MandateLost => "lease or instance lock no longer trusted; left for later",
        }
    }
}

/// A command a machine asks its driver to perform.
pub trait MachineCommand {
    /// Whether it changes the world outside the process (the workload, the
    /// traffic plane, the database): the lease and the instance lock must
    /// be trusted right before it is issued. Reads are not.
    fn is_effect(&self) -> bool;
}

/// The answer to a machine's command.
pub trait MachineAnswer {
    /// The port and kind of the failure it reports, if any: the driver
    /// counts every one (`stead_port_errors_total`).
    fn port_failure(&self) -> Option<(PortName, ErrorKind)>;
}

/// A sans-IO state machine. See the module docs.
pub trait Machine {
    type Command: MachineCommand;
    type Answer: MachineAnswer;
    type Report;

    /// The next command, or `None` while the machine waits
    /// ([`Self::poll_timeout`]) or once it is done. At most one command is
    /// outstanding: polling again before its answer is a bug, and panics.
    fn poll_command(&mut self) -> Option<Self::Command>;

    /// Feeds the answer to the outstanding command, with the time it came.
    fn handle(&mut self, answer: Self::Answer, now: Timestamp);

    /// While waiting with no command to issue: when to look again.
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }

    /// The instant [`Self::poll_timeout`] named has come.
    fn handle_timeout(&mut self, now: Timestamp) {
        let _ = now;
    }

    /// Stops issuing effects, for `why`. What the machine still asks for
    /// afterwards is no effect (a lifecycle state put back), if anything.
    fn abandon(&mut self, why: Abandon);

    /// What the machine did. Call once it is done.
    fn into_report(self) -> Self::Report;
}
