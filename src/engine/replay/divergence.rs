//! What `stead replay` says when a replayed pass parts from its
//! recording: where, and the two commands in words.

use std::fmt;

use crate::core::machine::Abandon;
use crate::core::memory::InstanceMemory;
use crate::core::pass::InstanceCommand;
use crate::core::record::Described;
use crate::core::types::InstanceName;

/// Where a replayed pass first parted from its recording.
#[derive(Debug)]
pub struct Divergence {
    /// The pass: its line in the recording, from 1.
    pub pass: usize,
    pub instance: InstanceName,
    /// The step, from 1.
    pub step: usize,
    pub what: Diverged,
}

/// How the replayed pass parted from its recording.
#[derive(Debug)]
pub enum Diverged {
    /// The machine asked for another command than the recorded one.
    Command {
        recorded: InstanceCommand,
        decided: InstanceCommand,
    },
    /// The machine asked for a command after the recorded pass ended.
    Extra { decided: InstanceCommand },
    /// The machine finished where the recording goes on.
    Finished { recorded: InstanceCommand },
    /// The pass was abandoned otherwise than it was recorded.
    Abandoned {
        recorded: Option<Abandon>,
        replayed: Option<Abandon>,
    },
    /// Same steps, but the memory left differs.
    Memory {
        recorded: Box<InstanceMemory>,
        replayed: Box<InstanceMemory>,
    },
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (pass, step, instance) = (self.pass, self.step, &self.instance);
        write!(f, "pass {pass} (instance {instance}), step {step}: ")?;
        match &self.what {
            Diverged::Command { recorded, decided } => write!(
                f,
                "recorded `{}`, the replay decided `{}`",
                Described(recorded),
                Described(decided)
            ),
            Diverged::Extra { decided } => write!(
                f,
                "the recorded pass ended here, the replay decided `{}`",
                Described(decided)
            ),
            Diverged::Finished { recorded } => write!(
                f,
                "recorded `{}`, the replay decided nothing more",
                Described(recorded)
            ),
            Diverged::Abandoned { recorded, replayed } => write!(
                f,
                "recorded abandoned: {}, replayed abandoned: {}",
                Why(*recorded),
                Why(*replayed)
            ),
            Diverged::Memory { recorded, replayed } => write!(
                f,
                "the same steps left another memory: recorded {recorded:?}, replayed {replayed:?}"
            ),
        }
    }
}

struct Why(Option<Abandon>);

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.map_or("no", Abandon::describe))
    }
}
