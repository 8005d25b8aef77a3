//! Budget decisions as operators read them (R10): one info line per
//! decision naming the failed attempt, the container's exit code and the
//! next attempt, and an event for a delay.

use crate::core::event_log::{Event, EventKind};
use crate::core::recovery::{Report, Verdict};
use crate::core::types::{whole_seconds, Exit, GenerationKey, Timestamp};

use super::StepLog;

/// One info line per budget decision (R10): a pass that charged the
/// budget a failure, or that reports a delay this daemon had not logged
/// (the pass that set it, or one after this daemon's memory began). It
/// names the service, the failed attempt, how the container's execution
/// ended (its exit code) or what else failed, and when the next attempt
/// runs. A pass that only finds the service still delayed logs nothing:
/// the delay was logged when it began. A delay is also an event.
pub(in crate::engine::recovery) fn log_budget(report: &Report, log: &StepLog<'_>, now: Timestamp) {
    let Some(decision) = BudgetDecision::of(report, log, now) else {
        return;
    };
    let key = &report.key;
    let message = decision.sentence(key);
    let next_attempt = decision.next_attempt.map(|t| t.to_string());
    tracing::info!(
        instance = key.instance.as_str(),
        service = key.service.as_str(),
        attempt = decision.failures,
        exit_code = decision.exit.map(|e| e.code),
        next_attempt = next_attempt.as_deref(),
        "{message} (budget, R10)"
    );
    if let Some(until) = decision.next_attempt {
        log.emit(
            Event::new(EventKind::CrashLoopDelay, now, "R10", message)
                .instance(&key.instance)
                .service(&key.service)
                .container(&key.container)
                .until(until),
        );
    }
}

/// What one budget decision says: the pure part of [`log_budget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BudgetDecision {
    /// Consecutive failures charged, this pass's included: the attempt
    /// that failed last.
    pub(super) failures: u32,
    /// How many of them this pass charged (0: a delay newly seen).
    pub(super) charged: u32,
    /// How the container's last execution this pass saw ended.
    pub(super) exit: Option<Exit>,
    /// What else the recovery reported failing (a readiness error), when
    /// no exit explains it.
    pub(super) error: Option<String>,
    /// No attempt before this instant; `None`: the next attempt is not
    /// delayed.
    pub(super) next_attempt: Option<Timestamp>,
}

impl BudgetDecision {
    fn of(report: &Report, log: &StepLog<'_>, now: Timestamp) -> Option<Self> {
        let budget = report.memory.generation.budget.as_ref();
        let failures = budget.map_or(0, |b| b.failures);
        let next_attempt = budget.and_then(|b| b.next_attempt).filter(|t| *t > now);
        let before = log.before(&report.key);
        let charged = failures.saturating_sub(before.failures);
        let delayed = matches!(report.verdict, Verdict::Delayed { .. } | Verdict::Failed);
        let new_delay = delayed && next_attempt.is_some() && next_attempt != before.next_attempt;
        if charged == 0 && !new_delay {
            return None;
        }
        Some(Self {
            failures,
            charged,
            exit: report.exit,
            error: report.errors.first().map(ToString::to_string),
            next_attempt,
        })
    }

    /// `crash loop: demo/http attempt 4 failed (exited with code 3 at …);
    /// backoff until …`.
    pub(super) fn sentence(&self, key: &GenerationKey) -> String {
        let what = match self.charged {
            0 => format!("{} failure(s) in a row", self.failures),
            1 => format!("attempt {} failed", self.failures),
            n => format!(
                "attempts {} to {} failed",
                self.failures.saturating_sub(n - 1),
                self.failures
            ),
        };
        // The exit code first: a readiness probe of a container that
        // already exited only says that nothing answered.
        let how = match (&self.exit, &self.error) {
            (Some(exit), Some(error)) => format!(" ({exit}; {error})"),
            (Some(exit), None) => format!(" ({exit})"),
            (None, Some(error)) => format!(" ({error})"),
            (None, None) => String::new(),
        };
        let next = match self.next_attempt {
            Some(until) => format!("backoff until {}", whole_seconds(until)),
            None => "next attempt now".to_owned(),
        };
        format!(
            "crash loop: {}/{} {what}{how}; {next}",
            key.instance, key.service
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::types::{ContainerId, InstanceName, ServiceName};

    fn check(decision: BudgetDecision, expect: &str) {
        let key = GenerationKey {
            instance: InstanceName::new("demo"),
            service: ServiceName::new("http"),
            container: ContainerId::new("c0ffee"),
        };
        assert_eq!(decision.sentence(&key), expect);
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_budget_decision_names_the_attempt_the_exit_code_and_the_next_attempt() {
        let exit = Exit {
            code: 3,
            finished_at: Some(at("2026-12-05T10:00:00.25Z")),
        };
        let decision = BudgetDecision {
            failures: 4,
            charged: 1,
            exit: Some(exit),
            error: None,
            next_attempt: Some(at("2026-12-05T10:02:00.4Z")),
        };
        check(
            decision.clone(),
            "crash loop: demo/http attempt 4 failed (exited with code 3 at \
             2026-12-05T10:00:00Z); backoff until 2026-12-05T10:02:00Z",
        );
        check(
            BudgetDecision {
                charged: 2,
                error: Some("readiness failed: connect refused".into()),
                next_attempt: None,
                ..decision.clone()
            },
            "crash loop: demo/http attempts 3 to 4 failed (exited with code 3 at \
             2026-12-05T10:00:00Z; readiness failed: connect refused); next attempt now",
        );
        check(
            BudgetDecision {
                charged: 0,
                exit: None,
                ..decision
            },
            "crash loop: demo/http 4 failure(s) in a row; backoff until 2026-12-05T10:02:00Z",
        );
    }
}
