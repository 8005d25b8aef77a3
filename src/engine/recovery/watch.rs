//! A window onto each instance's pass for whoever judges the engine from
//! outside (the simulation's checker): what the pass started from, every
//! command with the answer and the instant the machine was given, and what
//! it left. Data only; nothing here decides, and an engine nobody watches
//! builds none of it.

use jiff::Timestamp;

use crate::core::memory::InstanceMemory;
use crate::core::pass::{Abandon, InstanceAnswer, InstanceCommand};
use crate::core::policy::RecoveryPolicy;
use crate::core::traffic::HeldRoutes;
use crate::core::types::{ActiveRecord, Inhibition, InstanceName, Intent};

/// One command of a pass, as the machine saw it answered.
#[derive(Clone, Debug)]
pub struct WatchedStep {
    pub command: InstanceCommand,
    pub answer: InstanceAnswer,
    /// The `now` the machine was handed with the answer.
    pub now: Timestamp,
}

/// One instance's pass, whole.
#[derive(Debug)]
pub struct WatchedPass<'a> {
    /// The policy the pass ran under.
    pub policy: &'a RecoveryPolicy,
    pub instance: &'a InstanceName,
    pub intent: Intent,
    /// The instance's type (`PassInput::service_type`).
    pub service_type: &'a str,
    /// The `now` the pass's machine was built with (`PassInput::now`).
    pub began: Timestamp,
    /// ACTIVE as the pass loaded it under the instance lock.
    pub active: &'a ActiveRecord,
    pub inhibitions: &'a [Inhibition],
    /// The instance's routes as the whole pass read them back (T5); `None`
    /// for a targeted pass or when the read failed.
    pub held: Option<&'a HeldRoutes>,
    /// The instance's memory the pass started from.
    pub before: &'a InstanceMemory,
    pub steps: &'a [WatchedStep],
    /// Why the pass gave up before its machine finished, if it did: the
    /// command in flight then has no step.
    pub abandoned: Option<Abandon>,
    /// The memory the pass left for the next one.
    pub after: &'a InstanceMemory,
}

/// Told of every instance pass a [`super::Recoverer`] drives, as it ends
/// (before its memory is stored and its lock released).
pub trait PassWatcher: Send + Sync {
    fn passed(&self, pass: &WatchedPass<'_>);
}
