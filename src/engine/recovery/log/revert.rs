//! What a revert after a failed bake tells operators (#40, #55): why, in
//! the runtime's words; which services went back; and the failed
//! successors' last log lines, read before anything retires them, so the
//! cause of a bad release is in the event, the webhook and the log even
//! once its container is gone.

use std::time::Duration;

use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::Instance;
use crate::core::types::{ContainerId, ServiceName, Timestamp};
use crate::engine::event_log::EventSink;
use crate::ports::Runtime;

/// Lines read of each failed successor.
const EVIDENCE_LINES: usize = 20;
/// Bytes of those lines the revert event carries, the latest first kept:
/// the event's message is bounded, and its ending is what counts.
const EVIDENCE_EVENT_BYTES: usize = 600;
/// How long reading a successor's lines may take: the pass is done, and a
/// hung runtime must not hold the instance.
const EVIDENCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Each failed successor's last lines, oldest first; a read that fails
/// or times out says so in place of its lines.
pub(in crate::engine::recovery) async fn last_lines(
    runtime: &dyn Runtime,
    successors: &[(ServiceName, ContainerId)],
) -> Vec<(ServiceName, Vec<String>)> {
    let mut out = Vec::with_capacity(successors.len());
    for (service, container) in successors {
        let read = tokio::time::timeout(
            EVIDENCE_TIMEOUT,
            runtime.last_lines(container, EVIDENCE_LINES),
        )
        .await;
        let lines = match read {
            Ok(Ok(lines)) => lines,
            Ok(Err(e)) => vec![format!("(its logs could not be read: {e})")],
            Err(_) => vec![format!(
                "(its logs could not be read within {} s)",
                EVIDENCE_TIMEOUT.as_secs()
            )],
        };
        out.push((service.clone(), lines));
    }
    out
}

/// The revert's warning, `revert` and `halt` events and counter.
pub(in crate::engine::recovery) fn log_revert(
    events: &EventSink,
    instance: &Instance,
    why: &str,
    evidence: &[(ServiceName, Vec<String>)],
    now: Timestamp,
    trace: Option<&str>,
) {
    metrics::counter!("stead_reverts_total", "cause" => "bake").increment(1);
    let names: Vec<&str> = evidence.iter().map(|(s, _)| s.as_str()).collect();
    let full: Vec<String> = evidence
        .iter()
        .map(|(service, lines)| format!("{service}: {}", lines.join(" | ")))
        .collect();
    tracing::warn!(
        instance = %instance.name,
        service_type = %instance.service_type,
        services = ?names,
        last_lines = ?full,
        "a successor failed while baking: reverted to the predecessors and halted \
         the type's rollout ({why}); the failed successors are kept, stopped, for an \
         hour (docker logs, docker inspect); `stead rollout resume` once the version \
         is fixed"
    );
    events.emit(
        Event::new(
            EventKind::Revert,
            now,
            "bake",
            format!(
                "a successor failed while baking ({why}): reverted {} to the predecessors; \
                 the failed ones are kept, stopped, for an hour{}",
                names.join(", "),
                tail_text(evidence)
            ),
        )
        .instance(&instance.name)
        .traced(trace),
    );
    events.emit(
        Event::new(
            EventKind::Halt,
            now,
            "bake",
            format!(
                "halted the rollout of {} after a failed bake; `stead rollout resume` \
                 once the version is fixed",
                instance.service_type
            ),
        )
        .instance(&instance.name)
        .traced(trace),
    );
}

/// `; last lines of web: a | b | c`, the latest lines kept within
/// [`EVIDENCE_EVENT_BYTES`]; empty when nothing was printed.
fn tail_text(evidence: &[(ServiceName, Vec<String>)]) -> String {
    let share = EVIDENCE_EVENT_BYTES / evidence.len().max(1);
    let mut out = String::new();
    for (service, lines) in evidence.iter().filter(|(_, lines)| !lines.is_empty()) {
        let mut kept: Vec<&str> = Vec::new();
        let mut used = 0;
        for line in lines.iter().rev() {
            used += line.len() + 3;
            if used > share && !kept.is_empty() {
                break;
            }
            kept.push(line);
        }
        kept.reverse();
        out.push_str(&format!("; last lines of {service}: {}", kept.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_keeps_the_latest_lines_within_its_share() {
        let lines: Vec<String> = (0..50)
            .map(|n| format!("line {n:02} {}", "x".repeat(40)))
            .collect();
        let text = tail_text(&[(ServiceName::new("web"), lines)]);
        assert!(text.starts_with("; last lines of web: "), "{text}");
        assert!(
            text.ends_with(&format!("line 49 {}", "x".repeat(40))),
            "{text}"
        );
        assert!(!text.contains("line 00"), "{text}");
        assert!(text.len() <= EVIDENCE_EVENT_BYTES + 64, "{}", text.len());
        assert_eq!(tail_text(&[(ServiceName::new("web"), Vec::new())]), "");
    }
}
