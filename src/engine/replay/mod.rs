//! `stead replay` (issue #44): a flight recording (`core::record`) run
//! again through the same machine ([`InstancePass`]) and the same driver
//! ([`drive`]), the recorded answers and instants in place of the ports
//! and the clock. Deterministic: nothing here waits, and the first command
//! the machine decides otherwise than it did stops the replay.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::FutureExt;

use crate::core::machine::{Abandon, MachineCommand};
use crate::core::pass::{InstanceAnswer, InstanceCommand, InstancePass, InstanceReport};
use crate::core::record::{RecordedPass, RecordedStep, FORMAT};
use crate::core::types::Timestamp;
use crate::ports::Clock;

use super::drive::{drive, Performer};

mod divergence;
mod judged;

pub use divergence::{Diverged, Divergence};
pub use judged::Broken;

/// What a replay found.
#[derive(Debug)]
pub struct Replayed {
    /// Passes replayed whole with the same decisions.
    pub passes: usize,
    /// Steps those passes took.
    pub steps: usize,
    /// The first place the replayed machine decided otherwise, if any.
    pub divergence: Option<Divergence>,
    /// The first rule each recorded pass broke, in order, up to the
    /// divergence's pass.
    pub broken: Vec<Broken>,
}

/// A recording that cannot be read: its line and what is wrong there.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct BadRecording {
    pub line: usize,
    pub problem: String,
}

/// Reads every line of `recording` (blank lines skipped) and replays it.
pub fn replay(recording: &str) -> Result<Replayed, BadRecording> {
    let passes = recording
        .lines()
        .enumerate()
        .filter(|(_, text)| !text.trim().is_empty())
        .map(|(at, text)| read_line(at + 1, text).map(|pass| (at + 1, pass)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut replayed = Replayed {
        passes: 0,
        steps: 0,
        divergence: None,
        broken: Vec::new(),
    };
    for (line, pass) in &passes {
        // A recording the machine cannot take (an ACTIVE or memory that
        // contradicts itself, written by hand) is bad input, not a crash.
        let (divergence, broken) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay_one(*line, pass)))
                .map_err(|panic| BadRecording {
                    line: *line,
                    problem: format!(
                        "the machine cannot run this pass: {}",
                        panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("it stopped")
                    ),
                })?;
        replayed.broken.extend(broken);
        if divergence.is_some() {
            replayed.divergence = divergence;
            return Ok(replayed);
        }
        replayed.passes += 1;
        replayed.steps += pass.steps.len();
    }
    Ok(replayed)
}

/// Replays the recorded pass on line `line` and judges it: where the
/// replay parted from it, if it did, and the first rule it broke, if any.
/// The simulation runs every pass of its worlds through this.
pub fn replay_one(line: usize, pass: &RecordedPass) -> (Option<Divergence>, Option<Broken>) {
    let replayed = replay_pass(pass);
    let broken = judged::judge(line, pass, replayed.as_ref().ok());
    let divergence = replayed.err().map(|parted| {
        let (step, what) = *parted;
        Divergence {
            pass: line,
            instance: pass.input.instance.clone(),
            step: step + 1,
            what,
        }
    });
    (divergence, broken)
}

/// One line, or what is wrong with it, naming the field.
pub fn read_line(line: usize, text: &str) -> Result<RecordedPass, BadRecording> {
    let bad = |problem: String| BadRecording { line, problem };
    let deserializer = &mut serde_json::Deserializer::from_str(text);
    let pass: RecordedPass = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => bad(e.into_inner().to_string()),
            _ => bad(format!("{path}: {}", e.into_inner())),
        }
    })?;
    if pass.format != FORMAT {
        return Err(bad(format!(
            "format = {}: this stead reads format {FORMAT}",
            pass.format
        )));
    }
    let pass = RecordedPass {
        policy: pass
            .policy
            .validated()
            .map_err(|e| bad(format!("policy: {e}")))?,
        ..pass
    };
    if let Some(at) = pass
        .steps
        .iter()
        .position(|s| !s.answer.answers(&s.command))
    {
        return Err(bad(format!(
            "steps[{at}].answer: {:?} does not answer {:?}",
            pass.steps[at].answer, pass.steps[at].command
        )));
    }
    Ok(pass)
}

/// Where a pass parted from its recording: the step's index, and how.
type Parted = Box<(usize, Diverged)>;

/// Runs one recorded pass again: its report, or the step index and how
/// it parted.
fn replay_pass(recorded: &RecordedPass) -> Result<InstanceReport, Parted> {
    let at = AtomicUsize::new(0);
    let mut machine = InstancePass::new(&recorded.policy, recorded.input.clone());
    let mut performer = Answers {
        steps: &recorded.steps,
        at: &at,
        deadline: recorded.abandoned == Some(Abandon::Deadline),
        parted: None,
    };
    let clock = Instants {
        steps: &recorded.steps,
        at: &at,
        began: recorded.input.now,
    };
    let lost = recorded.abandoned == Some(Abandon::MandateLost);
    // An effect is issued while the mandate held: when the recording goes
    // on with one here. Otherwise the recorded driver was refused here,
    // if it lost its mandate; if not, the machine parts from it (below).
    let trusted = || match recorded.steps.get(at.load(Ordering::Relaxed)) {
        Some(step) => step.command.is_effect() || !lost,
        None => !lost,
    };
    // Nothing waits: the performer answers at once or, past where the
    // recording went, never (the pass ends there).
    let driven = drive(&mut machine, &mut performer, &clock, trusted).now_or_never();
    let step = at.load(Ordering::Relaxed);
    let abandoned = match (driven, performer.parted) {
        (_, Some(parted)) => return Err(Box::new((step, parted))),
        (Some(abandoned), None) => abandoned,
        // Pending with no parting: a machine that waits (an instance
        // pass never does); the deadline the recording ended on.
        (None, None) => {
            machine.abandon(Abandon::Deadline);
            Some(Abandon::Deadline)
        }
    };
    if let Some(rest) = recorded.steps.get(step) {
        let recorded = rest.command.clone();
        return Err(Box::new((step, Diverged::Finished { recorded })));
    }
    if abandoned != recorded.abandoned {
        let (recorded, replayed) = (recorded.abandoned, abandoned);
        return Err(Box::new((step, Diverged::Abandoned { recorded, replayed })));
    }
    let report = machine.into_report();
    if report.memory != recorded.after {
        return Err(Box::new((
            step,
            Diverged::Memory {
                recorded: Box::new(recorded.after.clone()),
                replayed: Box::new(report.memory),
            },
        )));
    }
    Ok(report)
}

/// Answers each command from the recording, while the machine asks for
/// what was recorded.
struct Answers<'r> {
    steps: &'r [RecordedStep],
    at: &'r AtomicUsize,
    /// The recorded pass ended on its deadline.
    deadline: bool,
    parted: Option<Diverged>,
}

impl Performer<InstancePass<'_>> for Answers<'_> {
    async fn perform(&mut self, _: &InstancePass<'_>, command: &InstanceCommand) -> InstanceAnswer {
        match self.steps.get(self.at.load(Ordering::Relaxed)) {
            Some(step) if step.command == *command => return step.answer.clone(),
            Some(step) => {
                self.parted = Some(Diverged::Command {
                    recorded: step.command.clone(),
                    decided: command.clone(),
                });
            }
            // The recorded pass ran out of time on a command in flight
            // here (no step was recorded for it): the same is left
            // unanswered. Otherwise the machine asks for more than it did.
            None if self.deadline => {}
            None => {
                self.parted = Some(Diverged::Extra {
                    decided: command.clone(),
                });
            }
        }
        std::future::pending().await
    }

    fn performed(&mut self, _: InstanceCommand, _: &InstanceAnswer, _: Timestamp) {
        self.at.fetch_add(1, Ordering::Relaxed);
    }
}

/// The recorded instants: the one handed with each answer.
struct Instants<'r> {
    steps: &'r [RecordedStep],
    at: &'r AtomicUsize,
    began: Timestamp,
}

impl Clock for Instants<'_> {
    fn now(&self) -> Timestamp {
        self.steps
            .get(self.at.load(Ordering::Relaxed))
            .map_or(self.began, |step| step.now)
    }
}
