//! The event log (#42): one durable row per intervention or decision, so an
//! operator can ask afterwards what stead did to an instance and why.
//!
//! An [`Event`] is a value like every other decision of the core: the
//! engine builds it where it already reports an intervention (the recovery
//! pass's log, a worker's end, the tick's applied decisions, the lease, a
//! catalog reload) and hands it to a bounded sink, which the store writes
//! in batches. Nothing here reads a clock: `at` is the engine's `now`,
//! which follows the database's clock (T2).

use crate::fleet::{TaskId, UnknownWord};
use crate::recovery::Why;
use crate::types::{ContainerId, InstanceName, ServiceName, Timestamp};

/// Longest reason (a rule id such as `R12`, or a short word) an event keeps.
pub(crate) const EVENT_REASON_LEN_MAX: usize = 64;
/// Longest sentence an event keeps; a longer one is cut at a character
/// boundary (an error message quoted from a port may be long).
pub(crate) const EVENT_MESSAGE_LEN_MAX: usize = 1024;
/// Most events one read returns (`stead events`, `stead timeline`).
pub const EVENTS_READ_MAX: u32 = 10_000;

/// What happened. The names ([`EventKind::as_str`]) are stable: they are
/// stored, filtered on (`stead events --kind`) and read by scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// A down container was started (R9).
    Start,
    /// An unhealthy container was restarted (R12).
    Restart,
    /// A container was stopped (R4).
    Stop,
    /// A route was withdrawn (R5-R8, R12, R13).
    Withdraw,
    /// A route was published after readiness (R13).
    Publish,
    /// A superseded container was retired (R15).
    Retire,
    /// A baking upgrade was reverted to its predecessors (#40).
    Revert,
    /// A task was queued by a check (C5-C8).
    Enqueue,
    /// A queued task was cancelled.
    Cancel,
    /// A service type's rollout was halted (C8).
    Halt,
    /// An instance's TTL expired and its deletion was queued (C7).
    TtlExpiry,
    /// A check found drift and queued its repair (C5).
    Drift,
    /// The crash-loop budget holds a service down until its next attempt
    /// (R10).
    CrashLoopDelay,
    /// This process took the reconciler lease (C2).
    LeaseTaken,
    /// This process lost the reconciler lease (C2).
    LeaseLost,
    /// The catalog was reloaded.
    CatalogReload,
    /// A worker finished a task.
    TaskDone,
    /// A worker's task failed for good.
    TaskFailed,
    /// A worker's task failed and will be tried again.
    TaskRetry,
    /// Drift found a release no instance owns (C5); written when a tick
    /// first reports it, as it is first logged.
    OrphanRelease,
    /// A publish was refused a public host name another live instance
    /// holds (#54): the service is served without it.
    HostRefused,
    /// A change made through the tenant API, naming its token and team
    /// (#54).
    Api,
}

impl EventKind {
    pub const ALL: [EventKind; 22] = [
        EventKind::Start,
        EventKind::Restart,
        EventKind::Stop,
        EventKind::Withdraw,
        EventKind::Publish,
        EventKind::Retire,
        EventKind::Revert,
        EventKind::Enqueue,
        EventKind::Cancel,
        EventKind::Halt,
        EventKind::TtlExpiry,
        EventKind::Drift,
        EventKind::CrashLoopDelay,
        EventKind::LeaseTaken,
        EventKind::LeaseLost,
        EventKind::CatalogReload,
        EventKind::TaskDone,
        EventKind::TaskFailed,
        EventKind::TaskRetry,
        EventKind::OrphanRelease,
        EventKind::HostRefused,
        EventKind::Api,
    ];

    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Start => "start",
            EventKind::Restart => "restart",
            EventKind::Stop => "stop",
            EventKind::Withdraw => "withdraw",
            EventKind::Publish => "publish",
            EventKind::Retire => "retire",
            EventKind::Revert => "revert",
            EventKind::Enqueue => "enqueue",
            EventKind::Cancel => "cancel",
            EventKind::Halt => "halt",
            EventKind::TtlExpiry => "ttl_expiry",
            EventKind::Drift => "drift",
            EventKind::CrashLoopDelay => "crash_loop_delay",
            EventKind::LeaseTaken => "lease_taken",
            EventKind::LeaseLost => "lease_lost",
            EventKind::CatalogReload => "catalog_reload",
            EventKind::TaskDone => "task_done",
            EventKind::TaskFailed => "task_failed",
            EventKind::TaskRetry => "task_retry",
            EventKind::OrphanRelease => "orphan_release",
            EventKind::HostRefused => "host_refused",
            EventKind::Api => "api",
        }
    }

    pub fn parse(word: &str) -> Result<Self, UnknownWord> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == word)
            .ok_or_else(|| UnknownWord::new("event kind", word))
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// When, by the engine's clock (the database's, T2).
    pub at: Timestamp,
    pub kind: EventKind,
    pub instance: Option<InstanceName>,
    pub service: Option<ServiceName>,
    pub container: Option<ContainerId>,
    /// The rule applied (`R12`, `C7`), or a short word where no rule
    /// numbers the decision. At most [`EVENT_REASON_LEN_MAX`] bytes.
    pub reason: String,
    /// What happened, as one plain sentence. At most
    /// [`EVENT_MESSAGE_LEN_MAX`] bytes.
    pub message: String,
    /// The moment a delay ends (a crash-loop delay's next attempt).
    pub until: Option<Timestamp>,
    /// The task it is about (an enqueue's): set by the store, which
    /// writes the event in the transaction that inserts the task.
    pub task: Option<TaskId>,
    /// The W3C trace id of the tick or task that did it, if any: the
    /// events of one pass share it.
    pub trace_id: Option<String>,
    /// The process that wrote it (`<identity>#<incarnation>`, T1).
    pub writer: String,
    /// The team of the instance it is about, as the store found it when it
    /// wrote the event (#54); `None` for events about no instance. Set by
    /// the store, never by the writer.
    pub team: Option<String>,
}

impl Event {
    /// An event of `kind` at `at`, about nothing in particular yet; the
    /// builder methods below say what it is about.
    pub fn new(kind: EventKind, at: Timestamp, reason: &str, message: impl Into<String>) -> Self {
        Self {
            at,
            kind,
            instance: None,
            service: None,
            container: None,
            reason: truncate(reason, EVENT_REASON_LEN_MAX),
            message: truncate(&message.into(), EVENT_MESSAGE_LEN_MAX),
            until: None,
            task: None,
            trace_id: None,
            writer: String::new(),
            team: None,
        }
    }

    pub fn instance(mut self, instance: &InstanceName) -> Self {
        self.instance = Some(instance.clone());
        self
    }

    pub fn service(mut self, service: &ServiceName) -> Self {
        self.service = Some(service.clone());
        self
    }

    pub fn container(mut self, container: &ContainerId) -> Self {
        self.container = Some(container.clone());
        self
    }

    pub fn task(mut self, task: TaskId) -> Self {
        self.task = Some(task);
        self
    }

    pub fn until(mut self, until: Timestamp) -> Self {
        self.until = Some(until);
        self
    }

    /// The trace id of a W3C `traceparent` (`00-<trace id>-<span>-<flags>`),
    /// or the text itself when it is not one.
    pub fn traced(mut self, traceparent: Option<&str>) -> Self {
        self.trace_id = traceparent.map(|t| trace_id_of(t).to_owned());
        self
    }
}

/// A logged event as read back, with its id (ascending in write order:
/// `stead events --follow` reads on after the last one it printed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedEvent {
    pub id: i64,
    pub event: Event,
}

/// Which events a read returns. Every filter is optional; at most `limit`
/// are returned, in id order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFilter {
    pub instance: Option<InstanceName>,
    /// Only events about instances of this team (#54).
    pub team: Option<String>,
    pub kind: Option<EventKind>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// Only events with a greater id (following the log). With it, the
    /// oldest `limit` such events are returned; without, the newest.
    pub after_id: Option<i64>,
    pub limit: u32,
}

impl Default for EventFilter {
    fn default() -> Self {
        Self {
            instance: None,
            team: None,
            kind: None,
            since: None,
            after_id: None,
            limit: 1000,
        }
    }
}

impl EventFilter {
    /// Whether `logged` passes every filter but the limit: the in-memory
    /// store's query, and the SQL stores' `WHERE` in words.
    pub fn admits(&self, logged: &LoggedEvent) -> bool {
        let event = &logged.event;
        self.instance
            .as_ref()
            .is_none_or(|i| event.instance.as_ref() == Some(i))
            && self
                .team
                .as_ref()
                .is_none_or(|t| event.team.as_ref() == Some(t))
            && self.kind.is_none_or(|k| event.kind == k)
            && self.since.is_none_or(|s| event.at >= s)
            && self.after_id.is_none_or(|a| logged.id > a)
    }
}

/// The rule a recovery step applied, as `docs/rules.md` numbers it.
pub fn rule_of(why: Why) -> &'static str {
    match why {
        Why::Inhibited => "R5",
        Why::RetryWithdrawal => "R6",
        Why::Gone => "R7",
        Why::FailClosed => "R8",
        Why::Down => "R9",
        Why::Unhealthy => "R12",
        Why::VerificationFailed | Why::NewExecution | Why::BindsChanged => "R13",
        Why::Stopped => "R4",
        Why::RouteUnvouched => "R17",
        Why::Observe => "observe",
    }
}

/// The trace id inside a W3C `traceparent`, or the whole text when it is
/// not shaped like one.
pub fn trace_id_of(traceparent: &str) -> &str {
    let mut parts = traceparent.split('-');
    match (parts.next(), parts.next()) {
        (Some(version), Some(trace)) if version.len() == 2 && trace.len() == 32 => trace,
        _ => traceparent,
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_stable_name() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.as_str()), Ok(kind));
        }
        assert!(EventKind::parse("reboot").is_err());
    }

    #[test]
    fn long_reasons_and_messages_are_cut_at_a_character_boundary() {
        let event = Event::new(
            EventKind::Start,
            Timestamp::UNIX_EPOCH,
            &"é".repeat(100),
            "ü".repeat(1000),
        );
        assert!(event.reason.len() <= EVENT_REASON_LEN_MAX);
        assert!(event.message.len() <= EVENT_MESSAGE_LEN_MAX);
        assert!(event.message.chars().all(|c| c == 'ü'));
    }

    #[test]
    fn the_trace_id_is_taken_out_of_a_traceparent() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(parent), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace_id_of("not-a-traceparent"), "not-a-traceparent");
    }
}
