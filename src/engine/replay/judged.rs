//! The rules judged over a recording (issue #44): each recorded pass's
//! decisions held to the core's judge (`core::judge`, the checks the
//! property tests, the fuzzers and the exhaustive explorer run), so a
//! recording of a daemon that broke a rule is reported at the step that
//! broke it, with the rule's name, whatever the replay decides.

use std::fmt;

use crate::core::judge::{Breach, PassJudge};
use crate::core::pass::{InstanceCommand, InstanceReport};
use crate::core::record::{Described, RecordedPass};
use crate::core::types::InstanceName;

/// A rule a recorded pass broke.
#[derive(Debug)]
pub struct Broken {
    /// The pass: its line in the recording, from 1.
    pub pass: usize,
    pub instance: InstanceName,
    /// The step that broke it, from 1, with its command; `None`: the pass
    /// as it ended (what it should have done by then).
    pub step: Option<(usize, InstanceCommand)>,
    pub breach: Breach,
}

/// Judges the recorded pass on line `line`: every step as recorded, then,
/// when the replay ran it to the same end (`report`), the pass as it
/// ended.
pub(super) fn judge(
    line: usize,
    recorded: &RecordedPass,
    report: Option<&InstanceReport>,
) -> Option<Broken> {
    let broken = |step, breach| Broken {
        pass: line,
        instance: recorded.input.instance.clone(),
        step,
        breach,
    };
    let mut judge = PassJudge::new(&recorded.policy, &recorded.input);
    for (at, step) in recorded.steps.iter().enumerate() {
        if let Err(breach) = judge.decided(&step.command) {
            return Some(broken(Some((at + 1, step.command.clone())), breach));
        }
        judge.answered(&step.command, &step.answer, step.now);
    }
    let report = report?;
    let abandoned = recorded.abandoned.is_some();
    judge
        .finished(report, abandoned)
        .err()
        .map(|breach| broken(None, breach))
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (pass, instance, breach) = (self.pass, &self.instance, &self.breach);
        match &self.step {
            Some((step, command)) => write!(
                f,
                "pass {pass} (instance {instance}), step {step}: recorded `{}` breaks {breach}",
                Described(command)
            ),
            None => write!(
                f,
                "pass {pass} (instance {instance}), as it ended: breaks {breach}"
            ),
        }
    }
}
