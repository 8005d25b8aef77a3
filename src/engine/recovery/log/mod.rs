//! What the pass tells operators: one info line per intervention with the
//! machine's reason, one per budget decision with the container's exit
//! code and the next attempt, counters.

mod budget;
mod revert;

pub(super) use budget::log_budget;
pub(super) use revert::{last_lines, log_revert};

use std::sync::{Arc, Mutex};

use crate::core::event_log::{rule_of, Event, EventKind};
use crate::core::memory::RecoveryMemory;
use crate::core::pass::{InstanceAnswer, InstanceCommand};
use crate::core::recovery::{Command, Outcome, Report, Verdict, Why};
use crate::core::types::{ContainerStatus, GenerationKey, Timestamp};
use crate::engine::event_log::EventSink;

/// Counts a batch's reports: tallied here and added once per label, not
/// once per service (with a recorder installed, each increment looks its
/// counter up in the registry; issue #14).
pub(super) fn record_metrics<'r>(reports: impl Iterator<Item = &'r Report>) {
    let mut verdicts = [0u64; Verdict::LABELS.len()];
    let (mut recoveries, mut start_races) = (0u64, 0u64);
    for report in reports {
        let label = report.verdict.label();
        // Every label is one of LABELS (a core test holds them to it).
        if let Some(at) = Verdict::LABELS.iter().position(|l| *l == label) {
            verdicts[at] += 1;
        }
        recoveries += u64::from(report.intervened);
        start_races += u64::from(report.start_race_lost);
    }
    for (label, count) in Verdict::LABELS.iter().zip(verdicts) {
        if count > 0 {
            metrics::counter!("stead_recovery_verdicts_total", "verdict" => *label)
                .increment(count);
        }
    }
    if recoveries > 0 {
        metrics::counter!("stead_recoveries_total").increment(recoveries);
    }
    if start_races > 0 {
        metrics::counter!("stead_recovery_start_races_total").increment(start_races);
    }
}

/// What the log of one instance's pass needs to say what each step meant.
pub(super) struct StepLog<'a> {
    /// The recovery's memory, which holds the instance's memory from
    /// before the pass until the pass ends (its lock keeps every other
    /// pass of the instance out): read only for a step that is logged,
    /// never copied by a steady pass.
    before: &'a Mutex<RecoveryMemory>,
    /// The status the last inspection of a service found, with the
    /// generation it was of. One slot is enough: an instance's services
    /// are recovered one after another, so a start always follows the
    /// inspection of its own generation (a map here cost a steady pass a
    /// key copy and an insert per service, issue #14).
    last_status: Option<(Arc<GenerationKey>, ContainerStatus)>,
    /// Where each intervention is logged durably too (#42).
    events: &'a EventSink,
    /// The traceparent of the tick this pass is part of, if any.
    trace: Option<&'a str>,
    /// The mutation exercise's broken rule, if any.
    broken: crate::core::broken::Armed,
}

impl<'a> StepLog<'a> {
    pub(super) fn new(
        before: &'a Mutex<RecoveryMemory>,
        events: &'a EventSink,
        trace: Option<&'a str>,
        broken: crate::core::broken::Armed,
    ) -> Self {
        Self {
            before,
            last_status: None,
            events,
            trace,
            broken,
        }
    }

    /// Logs `event` durably, as part of this pass's trace.
    fn emit(&self, event: Event) {
        self.events.emit(event.traced(self.trace));
    }

    pub(super) fn before(&self, key: &GenerationKey) -> Before {
        let memory = self.before.lock().expect("memory poisoned");
        let memory = memory.service(key);
        let budget = memory.generation.budget.as_ref();
        Before {
            routed: memory.generation.verified_started_at.is_some(),
            next_attempt: budget.and_then(|b| b.next_attempt),
            failures: budget.map_or(0, |b| b.failures),
        }
    }

    pub(super) fn step(
        &mut self,
        command: &InstanceCommand,
        why: Option<Why>,
        answer: &InstanceAnswer,
        now: Timestamp,
    ) {
        let (
            InstanceCommand::Service { key, command },
            InstanceAnswer::Service(outcome),
            Some(why),
        ) = (command, answer, why)
        else {
            return;
        };
        if why != Why::Observe {
            metrics::counter!("stead_recovery_steps_total", "reason" => why.label()).increment(1);
        }
        if let Outcome::Inspected(Ok(obs)) = outcome {
            match &mut self.last_status {
                Some((last, status)) if last == key => *status = obs.status,
                slot => *slot = Some((key.clone(), obs.status)),
            }
        }
        let last_status = self
            .last_status
            .as_ref()
            .filter(|(last, _)| last == key)
            .map(|(_, status)| *status);
        let mut logged = log_step(key, command, why, outcome, || self.before(key), last_status);
        if crate::broken!(self.broken, ForgetStartEvent)
            && matches!(logged, Some((EventKind::Start, _)))
        {
            logged = None;
        }
        if crate::broken!(self.broken, EventForFailedStart)
            && matches!(
                (command, outcome),
                (Command::Start, Outcome::Started(Err(_)))
            )
        {
            logged = Some((EventKind::Start, "started (but it failed)".to_owned()));
        }
        if let Some((kind, message)) = logged {
            self.emit(
                Event::new(kind, now, rule_of(why), message)
                    .instance(&key.instance)
                    .service(&key.service)
                    .container(&key.container),
            );
        }
    }
}

/// What the pass knew of a service before its recovery, for the log.
pub(super) struct Before {
    /// This daemon believed the service routed (it verified an execution).
    routed: bool,
    next_attempt: Option<crate::core::types::Timestamp>,
    /// Consecutive failures the budget had charged.
    failures: u32,
}

/// One info line per intervention (what, which service, why) and failure
/// counters by reason. A withdrawal of a route nobody was using (one that
/// only re-asserts stopped or inhibited intent, or a new container's first
/// fail-closed step) is not an intervention: it is logged at debug, so a
/// held service does not log every tick. Returns what an intervention
/// writes to the event log: its kind and its sentence.
fn log_step(
    key: &GenerationKey,
    command: &Command,
    why: Why,
    outcome: &Outcome,
    // Computed only for the steps that log it: a steady pass logs nothing.
    before: impl FnOnce() -> Before,
    last_status: Option<crate::core::types::ContainerStatus>,
) -> Option<(EventKind, String)> {
    let (instance, service) = (key.instance.as_str(), key.service.as_str());
    let container = short_id(key.container.as_str());
    let reason = why.label();
    match (command, outcome) {
        (Command::Withdraw, Outcome::Withdrawn(Ok(()))) => {
            // A route this daemon published, or one a failure is being
            // cleaned up after; a fresh container's first fail-closed
            // withdrawal removes nothing anyone used.
            let notable = before().routed
                || matches!(
                    why,
                    Why::Unhealthy | Why::VerificationFailed | Why::RetryWithdrawal
                );
            if notable {
                let message = format!("withdrew {instance}/{service}: {why}");
                tracing::info!(instance, service, container, reason, "{message}");
                Some((EventKind::Withdraw, message))
            } else {
                tracing::debug!(instance, service, reason, "withdrawal re-asserted: {why}");
                None
            }
        }
        (Command::Withdraw, Outcome::Withdrawn(Err(_))) => {
            metrics::counter!("stead_withdrawal_failures_total", "reason" => reason).increment(1);
            None
        }
        (Command::Start, Outcome::Started(Ok(()))) => {
            let was = last_status.map_or_else(|| "down".to_owned(), |s| s.to_string());
            let message = format!("started {instance}/{service}: the container was {was} (R9)");
            tracing::info!(instance, service, container, reason, "{message}");
            Some((EventKind::Start, message))
        }
        (Command::Restart { .. }, Outcome::Restarted(Ok(()))) => {
            let message = format!("restarted {instance}/{service}: {why}");
            tracing::info!(instance, service, container, reason, "{message}");
            Some((EventKind::Restart, message))
        }
        (Command::Stop { .. }, Outcome::Stopped(Ok(()))) => {
            let message = format!("stopped {instance}/{service}: {why}");
            tracing::info!(instance, service, container, reason, "{message}");
            Some((EventKind::Stop, message))
        }
        (Command::Publish { binds, .. }, Outcome::Published(Ok(()))) => {
            let binds: Vec<String> = binds
                .iter()
                .map(|(c, h)| format!("{c}->127.0.0.1:{h}"))
                .collect();
            let message = format!(
                "published {instance}/{service} ({}): {why}",
                binds.join(", ")
            );
            tracing::info!(instance, service, container, reason, "{message}");
            Some((EventKind::Publish, message))
        }
        (Command::Publish { .. }, Outcome::Published(Err(_))) => {
            metrics::counter!("stead_publication_failures_total", "reason" => reason).increment(1);
            None
        }
        _ => None,
    }
}

/// The first 12 characters of a container ID, as `docker ps` shows it.
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
