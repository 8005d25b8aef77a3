//! Reading the event log (#42): `stead events` and `stead timeline`. What
//! a line says, the JSON object a script reads, `--since` parsed, and one
//! instance's history grouped by pass. Not to be confused with
//! `daemon::events`, which follows Docker's events.

use std::time::Duration;

use serde::Serialize;

use crate::core::event_log::LoggedEvent;
use crate::core::types::Timestamp;

use super::human::span;

/// Longest `--since` accepted: the longest retention there is.
pub const SINCE_MAX: Duration = Duration::from_secs(3650 * 24 * 3600);
/// Events without a trace id belong to one pass while each follows the
/// one before within this (a wake-up's pass, a worker's task).
pub const UNTRACED_PASS_GAP: Duration = Duration::from_secs(2);

/// Why a `--since` was refused: the flag, the value and what it should be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--since {value:?}: {reason} (a whole number and a unit: 30s, 10m, 2h or 7d, at most 3650d)"
)]
pub struct SinceError {
    pub value: String,
    pub reason: &'static str,
}

/// `--since`: `30s`, `10m`, `2h`, `7d`.
pub fn parse_since(text: &str) -> Result<Duration, SinceError> {
    let error = |reason| SinceError {
        value: text.chars().take(32).collect(),
        reason,
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| error("no unit"))?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| error("not a whole number"))?;
    let unit_s: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        _ => return Err(error("unknown unit")),
    };
    let seconds = n.checked_mul(unit_s).ok_or_else(|| error("too long"))?;
    if seconds == 0 {
        return Err(error("must be more than zero"));
    }
    let since = Duration::from_secs(seconds);
    if since > SINCE_MAX {
        return Err(error("too long"));
    }
    Ok(since)
}

/// One event as `--json` prints it: one object per line.
#[derive(Clone, Debug, Serialize)]
pub struct EventView {
    pub id: i64,
    pub at: String,
    pub kind: &'static str,
    pub instance: Option<String>,
    pub service: Option<String>,
    pub container: Option<String>,
    pub reason: String,
    pub message: String,
    pub until: Option<String>,
    pub task: Option<i64>,
    pub trace_id: Option<String>,
    pub writer: String,
    /// The team of the instance it is about (#54); absent for events
    /// about no instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl From<&LoggedEvent> for EventView {
    fn from(logged: &LoggedEvent) -> Self {
        let e = &logged.event;
        Self {
            id: logged.id,
            at: e.at.to_string(),
            kind: e.kind.as_str(),
            instance: e.instance.as_ref().map(ToString::to_string),
            service: e.service.as_ref().map(ToString::to_string),
            container: e.container.as_ref().map(ToString::to_string),
            reason: e.reason.clone(),
            message: e.message.clone(),
            until: e.until.map(|t| t.to_string()),
            task: e.task,
            trace_id: e.trace_id.clone(),
            writer: e.writer.clone(),
            team: e.team.clone(),
        }
    }
}

/// What an event is about: `instance/service`, `instance`, or `-`.
fn subject(logged: &LoggedEvent) -> String {
    let e = &logged.event;
    match (&e.instance, &e.service) {
        (Some(i), Some(s)) => format!("{i}/{s}"),
        (Some(i), None) => i.to_string(),
        (None, _) => "-".to_owned(),
    }
}

/// One event as `stead events` prints it: time, kind, subject, rule, and
/// the sentence.
pub fn render_event(logged: &LoggedEvent) -> String {
    let e = &logged.event;
    format!(
        "{}  {:<16}  {}  {}  {}{}",
        e.at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"),
        e.kind.as_str(),
        subject(logged),
        e.reason,
        e.message,
        task_note(logged)
    )
}

/// ` (task N)` for an event about a task, else nothing.
fn task_note(logged: &LoggedEvent) -> String {
    logged
        .event
        .task
        .map(|t| format!(" (task {t})"))
        .unwrap_or_default()
}

/// Whether `next` belongs to the same pass as `last`: the same trace id,
/// or neither traced and close together.
fn same_pass(last: &LoggedEvent, next: &LoggedEvent) -> bool {
    match (&last.event.trace_id, &next.event.trace_id) {
        (Some(a), Some(b)) => a == b,
        (None, None) => {
            let gap = next.event.at.duration_since(last.event.at);
            gap.is_positive() && gap.unsigned_abs() <= UNTRACED_PASS_GAP || gap.is_zero()
        }
        _ => false,
    }
}

/// A duration for the eye: milliseconds under a second, else [`span`].
fn elapsed(from: Timestamp, to: Timestamp) -> String {
    let d = to.duration_since(from);
    if d.is_negative() {
        return "0 ms".to_owned();
    }
    let d = d.unsigned_abs();
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        span(d.as_secs())
    }
}

/// One instance's history as a timeline: one line per event, grouped by
/// pass (the events of one trace, or of one untraced burst), each line
/// with its time since the pass began, and between passes how long
/// nothing happened. `events` in id order.
pub fn render_timeline(instance: &str, events: &[LoggedEvent]) -> String {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return format!("no events of {instance}");
    };
    let mut out = format!(
        "{instance}: {} event(s) from {} to {} ({})\n",
        events.len(),
        first.event.at,
        last.event.at,
        elapsed(first.event.at, last.event.at)
    );
    let mut pass_began: Option<Timestamp> = None;
    let mut previous: Option<&LoggedEvent> = None;
    for logged in events {
        let e = &logged.event;
        let new_pass = previous.is_none_or(|p| !same_pass(p, logged));
        if new_pass {
            if let Some(p) = previous {
                out.push_str(&format!("   ... {} later\n", elapsed(p.event.at, e.at)));
            }
            let trace = e.trace_id.as_deref().map_or_else(
                || "untraced".to_owned(),
                |t| format!("trace {}", &t[..t.len().min(8)]),
            );
            out.push_str(&format!("pass at {} ({trace})\n", e.at));
            pass_began = Some(e.at);
        }
        let offset = elapsed(pass_began.unwrap_or(e.at), e.at);
        let service = e.service.as_ref().map_or("-", |s| s.as_str());
        let until = e.until.map(|u| format!(" (until {u})")).unwrap_or_default();
        out.push_str(&format!(
            "  +{offset:<8} {:<16} {service:<12} {:<5} {}{}{until}\n",
            e.kind.as_str(),
            e.reason,
            e.message,
            task_note(logged)
        ));
        previous = Some(logged);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event_log::{Event, EventKind};
    use crate::core::types::{InstanceName, ServiceName};

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn logged(id: i64, ms: i64, kind: EventKind, trace: Option<&str>) -> LoggedEvent {
        let mut event = Event::new(kind, at(ms), "R9", format!("{kind} happened"))
            .instance(&InstanceName::new("wiki1"))
            .service(&ServiceName::new("web"));
        event.trace_id = trace.map(str::to_owned);
        LoggedEvent { id, event }
    }

    #[test]
    fn since_takes_a_number_and_a_unit_and_names_a_bad_value() {
        for (text, seconds) in [("30s", 30), ("10m", 600), ("2h", 7200), ("7d", 604_800)] {
            assert_eq!(
                parse_since(text),
                Ok(Duration::from_secs(seconds)),
                "{text}"
            );
        }
        for (text, reason) in [
            ("10", "no unit"),
            ("m", "not a whole number"),
            ("-5m", "not a whole number"),
            ("10w", "unknown unit"),
            ("0s", "must be more than zero"),
            ("99999999999999999999d", "not a whole number"),
            ("4000d", "too long"),
        ] {
            let e = parse_since(text).unwrap_err();
            assert_eq!(e.reason, reason, "{text}");
            assert!(e.to_string().contains(&format!("{text:?}")), "{e}");
        }
    }

    #[test]
    fn a_timeline_groups_by_trace_and_by_untraced_bursts_with_the_time_between() {
        let events = [
            logged(1, 0, EventKind::Withdraw, Some("aaaaaaaa1111")),
            logged(2, 250, EventKind::Restart, Some("aaaaaaaa1111")),
            logged(3, 90_000, EventKind::Publish, Some("bbbbbbbb2222")),
            logged(4, 200_000, EventKind::Start, None),
            logged(5, 201_000, EventKind::Publish, None),
            logged(6, 300_000, EventKind::Stop, None),
        ];
        let text = render_timeline("wiki1", &events);
        let passes = text.matches("pass at ").count();
        assert_eq!(passes, 4, "{text}");
        assert!(text.contains("(trace aaaaaaaa)"), "{text}");
        assert!(text.contains("+250 ms"), "{text}");
        assert!(text.contains("... 1 min 29 s later"), "{text}");
        assert!(
            text.contains("+1 s "),
            "the untraced burst is one pass: {text}"
        );
        assert!(text.contains("... 1 min 39 s later"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("  +")).count(), 6);
        assert!(text.starts_with("wiki1: 6 event(s) from"), "{text}");
    }

    #[test]
    fn an_empty_timeline_says_so() {
        assert_eq!(render_timeline("wiki1", &[]), "no events of wiki1");
    }
}
