//! The flight recorder (issue #44): a [`PassWatcher`] that turns every
//! instance pass into one line of `core::record` and hands it to a sink
//! (the daemon's: a ring of lines per instance, `daemon::flight`). It
//! never makes a pass wait or fail: a line it cannot make or hand over is
//! a WARN and `stead_flight_recorder_dropped_total`, and the pass goes on.

use crate::core::pass::PassInput;
use crate::core::record::{RecordedPass, RecordedStep, FORMAT};
use crate::core::types::InstanceName;

use super::recovery::{PassWatcher, WatchedPass};

/// Where the recorder's lines go. `offer` must not block: a sink that
/// cannot take a line now returns it refused.
pub trait FlightSink: Send + Sync {
    /// Takes `line` (one JSON line, no newline) of `instance`'s pass, or
    /// says why not.
    fn offer(&self, instance: &InstanceName, line: String) -> Result<(), NotRecorded>;
}

/// Why a pass was not recorded (the pass itself went on).
#[derive(Debug, thiserror::Error)]
pub enum NotRecorded {
    #[error("{0} lines already wait for the disk")]
    QueueFull(usize),
    #[error("the recorder's writer has stopped")]
    WriterStopped,
    #[error("the pass could not be written as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl<S: FlightSink + ?Sized> FlightSink for std::sync::Arc<S> {
    fn offer(&self, instance: &InstanceName, line: String) -> Result<(), NotRecorded> {
        (**self).offer(instance, line)
    }
}

/// Records each pass it is told of into its sink.
pub struct FlightRecorder<S> {
    sink: S,
}

impl<S: FlightSink> FlightRecorder<S> {
    pub fn new(sink: S) -> Self {
        Self { sink }
    }
}

/// One watched pass as a recording holds it: everything its machine was
/// built from and handed.
pub fn record_of(pass: &WatchedPass<'_>) -> RecordedPass {
    RecordedPass {
        format: FORMAT,
        policy: pass.policy.clone(),
        input: PassInput {
            instance: pass.instance.clone(),
            intent: pass.intent,
            active: pass.active.clone(),
            inhibitions: pass.inhibitions.to_vec(),
            held: pass.held.cloned(),
            memory: pass.before.clone(),
            service_type: pass.service_type.to_owned(),
            now: pass.began,
        },
        steps: pass
            .steps
            .iter()
            .map(|s| RecordedStep {
                command: s.command.clone(),
                answer: s.answer.clone(),
                now: s.now,
            })
            .collect(),
        abandoned: pass.abandoned,
        after: pass.after.clone(),
    }
}

impl<S: FlightSink> PassWatcher for FlightRecorder<S> {
    fn passed(&self, pass: &WatchedPass<'_>) {
        let refused = serde_json::to_string(&record_of(pass))
            .map_err(NotRecorded::from)
            .and_then(|line| self.sink.offer(pass.instance, line));
        if let Err(why) = refused {
            metrics::counter!("stead_flight_recorder_dropped_total").increment(1);
            tracing::warn!(
                instance = %pass.instance,
                "the flight recorder dropped a pass ({why}); the pass itself went on"
            );
        }
    }
}
