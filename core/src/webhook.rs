//! Webhook delivery from the event log (#42) as pure decisions: which
//! event a webhook is sent next, when its cursor may move past events it
//! does not want or past a gap in the ids, and how long to wait after a
//! failure.
//!
//! Delivery is at least once and in id order: a webhook's cursor (the id
//! of the last event it was sent, or passed over, stored in the database)
//! moves only after a receiver acknowledged, so a daemon killed between a
//! delivery and the cursor's write sends that event again; a receiver
//! dedupes by the event id every body carries. An undelivered event holds
//! back every later one.
//!
//! Ids ascend in write order, but a reader may see a later id before an
//! earlier one: on Postgres an identity is drawn when a row is inserted and
//! becomes visible when its transaction commits. A gap after the cursor is
//! therefore waited for, a grace at most, before the cursor may pass it (a
//! gap that lasts is a rolled-back insert or pruned events): the daemon
//! gives the store's call timeout, which bounds every transaction that
//! writes an event, plus [`EVENT_GAP_MARGIN`].
//! Nothing here reads a clock: `now` is an argument.

use std::time::Duration;

use crate::event_log::{EventKind, LoggedEvent};
use crate::types::Timestamp;

/// Most webhooks one daemon delivers to.
pub const WEBHOOKS_MAX: usize = 16;
/// The per-request timeout unless `webhooks[].timeout_ms` says otherwise,
/// and its bounds.
pub const WEBHOOK_TIMEOUT_MS_DEFAULT: u64 = 5_000;
pub const WEBHOOK_TIMEOUT_MS_MIN: u64 = 100;
pub const WEBHOOK_TIMEOUT_MS_MAX: u64 = 60_000;
/// The first pause after a failed delivery; each further failure of the
/// same event doubles it, up to [`WEBHOOK_BACKOFF_MAX`].
pub const WEBHOOK_BACKOFF_BASE: Duration = Duration::from_secs(1);
pub const WEBHOOK_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// What a gap's grace adds to the longest a store call may hold a
/// transaction open.
pub const EVENT_GAP_MARGIN: Duration = Duration::from_secs(5);
const _: () = assert!(WEBHOOK_TIMEOUT_MS_MIN <= WEBHOOK_TIMEOUT_MS_DEFAULT);
const _: () = assert!(WEBHOOK_TIMEOUT_MS_DEFAULT <= WEBHOOK_TIMEOUT_MS_MAX);
const _: () = assert!(WEBHOOK_BACKOFF_BASE.as_millis() <= WEBHOOK_BACKOFF_MAX.as_millis());

/// What a webhook is sent unless its `kinds` say otherwise: what an
/// operator is paged for, not every intervention. In [`EventKind::ALL`]
/// order, as a configured list is kept.
pub const DEFAULT_KINDS: [EventKind; 7] = [
    EventKind::Revert,
    EventKind::Halt,
    EventKind::CrashLoopDelay,
    EventKind::LeaseTaken,
    EventKind::LeaseLost,
    EventKind::TaskFailed,
    EventKind::OrphanRelease,
];

/// The body a webhook is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookFormat {
    /// stead's own: the event as `stead events --json` prints it.
    Stead,
    /// The body Alertmanager sends its webhook receivers (version 4), so a
    /// receiver written for Alertmanager takes it as it is.
    Alertmanager,
}

impl WebhookFormat {
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "stead" => Some(Self::Stead),
            "alertmanager" => Some(Self::Alertmanager),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stead => "stead",
            Self::Alertmanager => "alertmanager",
        }
    }
}

/// The pause before the next attempt at an event that failed
/// `failures` times in a row (at least once): doubling from `base`, at
/// most `max`.
pub fn backoff_after(failures: u32, base: Duration, max: Duration) -> Duration {
    assert!(failures >= 1, "a backoff follows a failure");
    let doublings = (failures - 1).min(31);
    base.saturating_mul(1 << doublings).min(max)
}

/// What a webhook's sequencer says to do with the events read after its
/// cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// Send this event; once acknowledged, move the cursor to its id
    /// ([`Sequencer::delivered`]), past the unwanted events before it.
    Deliver(&'a LoggedEvent),
    /// No event read is wanted: move the cursor to this id without
    /// sending anything.
    PassOver { to: i64 },
    /// The id after the cursor is missing: read again by `until`, when the
    /// cursor may pass it.
    AwaitGap { until: Timestamp },
    /// Nothing after the cursor.
    Idle,
}

/// A gap after the cursor, and when it was first seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gap {
    /// The first missing id.
    id: i64,
    seen_at: Timestamp,
}

/// One webhook's place in the event log. Call order: read the events
/// after [`Sequencer::cursor`] (ascending ids), ask [`Sequencer::next`],
/// act, and tell it what was acknowledged ([`Sequencer::delivered`]) or
/// passed over ([`Sequencer::passed_over`]) once the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequencer {
    cursor: i64,
    kinds: Vec<EventKind>,
    /// The teams whose instances' events are sent; empty: every event
    /// (#54).
    teams: Vec<String>,
    /// How long a gap after the cursor is waited for.
    gap_grace: Duration,
    gap: Option<Gap>,
}

impl Sequencer {
    /// A webhook sent the events of `kinds`, whose stored cursor is
    /// `cursor`, waiting at most `gap_grace` for a missing id.
    pub fn new(cursor: i64, kinds: &[EventKind], gap_grace: Duration) -> Self {
        assert!(!kinds.is_empty(), "a webhook wants at least one kind");
        Self {
            cursor,
            kinds: kinds.to_vec(),
            teams: Vec::new(),
            gap_grace,
            gap: None,
        }
    }

    /// This sequencer sending only the events about instances of `teams`
    /// (none: every event). An event about no instance has no team and is
    /// then passed over.
    pub fn for_teams(self, teams: &[String]) -> Self {
        Self {
            teams: teams.to_vec(),
            ..self
        }
    }

    /// The id of the last event sent or passed over.
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    pub fn wants(&self, kind: EventKind) -> bool {
        self.kinds.contains(&kind)
    }

    fn wants_team(&self, event: &super::event_log::Event) -> bool {
        self.teams.is_empty() || event.team.as_ref().is_some_and(|t| self.teams.contains(t))
    }

    /// What to do with `events`, the events read after the cursor in
    /// ascending id order, at `now`.
    #[must_use]
    pub fn next<'a>(&mut self, events: &'a [LoggedEvent], now: Timestamp) -> Next<'a> {
        let mut expected = self.cursor + 1;
        let mut passed_over = None;
        for logged in events {
            assert!(logged.id > self.cursor, "events are read after the cursor");
            if logged.id > expected {
                if let Some(to) = passed_over {
                    // Move up to the gap first; the gap is judged from there.
                    return Next::PassOver { to };
                }
                match self.gap_closed(expected, now) {
                    Ok(()) => {}
                    Err(until) => return Next::AwaitGap { until },
                }
            }
            if self.wants(logged.event.kind) && self.wants_team(&logged.event) {
                return Next::Deliver(logged);
            }
            passed_over = Some(logged.id);
            expected = logged.id + 1;
        }
        match passed_over {
            Some(to) => Next::PassOver { to },
            None => Next::Idle,
        }
    }

    /// Whether the gap starting at `id` has been waited for long enough;
    /// if not, until when it is waited for.
    fn gap_closed(&mut self, id: i64, now: Timestamp) -> Result<(), Timestamp> {
        let gap = match self.gap {
            Some(gap) if gap.id == id => gap,
            _ => {
                let gap = Gap { id, seen_at: now };
                self.gap = Some(gap);
                gap
            }
        };
        let until = gap
            .seen_at
            .checked_add(self.gap_grace)
            .unwrap_or(Timestamp::MAX);
        if now >= until {
            Ok(())
        } else {
            Err(until)
        }
    }

    /// The event `id` was acknowledged and the cursor stored at it.
    pub fn delivered(&mut self, id: i64) {
        self.move_to(id);
    }

    /// The cursor was stored at `to`, past events nobody wanted.
    pub fn passed_over(&mut self, to: i64) {
        self.move_to(to);
    }

    fn move_to(&mut self, id: i64) {
        assert!(id > self.cursor, "a cursor only moves forward");
        self.cursor = id;
        if self.gap.is_some_and(|gap| gap.id <= id) {
            self.gap = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_log::Event;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn logged(id: i64, kind: EventKind) -> LoggedEvent {
        LoggedEvent {
            id,
            event: Event::new(kind, at(0), "R10", "something"),
        }
    }

    const GRACE: Duration = Duration::from_secs(65);

    fn sequencer(cursor: i64) -> Sequencer {
        Sequencer::new(cursor, &[EventKind::CrashLoopDelay, EventKind::Halt], GRACE)
    }

    #[test]
    fn a_team_webhook_passes_over_other_teams_events_and_those_of_no_instance() {
        let of_team = |id: i64, team: Option<&str>| {
            let mut event = logged(id, EventKind::Halt);
            event.event.team = team.map(str::to_owned);
            event
        };
        let events = [
            of_team(1, Some("other")),
            of_team(2, None),
            of_team(3, Some("mine")),
        ];
        let mut only_mine = sequencer(0).for_teams(&["mine".to_owned()]);
        assert_eq!(only_mine.next(&events, at(0)), Next::Deliver(&events[2]));
        let mut everyone = sequencer(0);
        assert_eq!(everyone.next(&events, at(0)), Next::Deliver(&events[0]));
    }

    #[test]
    fn the_first_wanted_event_is_delivered_and_the_unwanted_before_it_passed_with_it() {
        let events = [
            logged(5, EventKind::Start),
            logged(6, EventKind::Halt),
            logged(7, EventKind::CrashLoopDelay),
        ];
        let mut s = sequencer(4);
        assert_eq!(s.next(&events, at(0)), Next::Deliver(&events[1]));
        s.delivered(6);
        assert_eq!(s.next(&events[2..], at(0)), Next::Deliver(&events[2]));
        s.delivered(7);
        assert_eq!(s.cursor(), 7);
        assert_eq!(s.next(&[], at(0)), Next::Idle);
    }

    #[test]
    fn events_nobody_wants_are_passed_over_without_a_delivery() {
        let events = [logged(1, EventKind::Start), logged(2, EventKind::Publish)];
        let mut s = sequencer(0);
        assert_eq!(s.next(&events, at(0)), Next::PassOver { to: 2 });
    }

    #[test]
    fn a_gap_after_the_cursor_is_waited_for_then_passed() {
        let events = [logged(8, EventKind::Halt)];
        let mut s = sequencer(6);
        let until = at(0).checked_add(GRACE).unwrap();
        assert_eq!(s.next(&events, at(0)), Next::AwaitGap { until });
        assert_eq!(s.next(&events, at(30)), Next::AwaitGap { until });
        let after = GRACE.as_secs() as i64;
        assert_eq!(s.next(&events, at(after)), Next::Deliver(&events[0]));
    }

    #[test]
    fn a_gap_that_fills_is_delivered_in_order() {
        let mut s = sequencer(6);
        let late = [logged(8, EventKind::Halt)];
        assert!(matches!(s.next(&late, at(0)), Next::AwaitGap { .. }));
        let filled = [
            logged(7, EventKind::CrashLoopDelay),
            logged(8, EventKind::Halt),
        ];
        assert_eq!(s.next(&filled, at(1)), Next::Deliver(&filled[0]));
        s.delivered(7);
        assert_eq!(s.next(&filled[1..], at(1)), Next::Deliver(&filled[1]));
    }

    #[test]
    fn unwanted_events_before_a_gap_are_passed_over_up_to_it() {
        let events = [logged(3, EventKind::Start), logged(5, EventKind::Halt)];
        let mut s = sequencer(2);
        assert_eq!(s.next(&events, at(0)), Next::PassOver { to: 3 });
        s.passed_over(3);
        assert!(matches!(s.next(&events[1..], at(0)), Next::AwaitGap { .. }));
    }

    #[test]
    fn the_backoff_doubles_from_its_base_up_to_its_cap() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        let delays: Vec<u64> = (1..=8)
            .map(|n| backoff_after(n, base, max).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff_after(u32::MAX, base, max), max);
    }

    #[test]
    fn every_default_kind_is_a_kind_with_a_stable_name() {
        for kind in DEFAULT_KINDS {
            assert_eq!(EventKind::parse(kind.as_str()), Ok(kind));
        }
        assert!(DEFAULT_KINDS.is_sorted(), "kept as a configured list is");
        assert_eq!(
            WebhookFormat::parse("alertmanager"),
            Some(WebhookFormat::Alertmanager)
        );
        assert_eq!(WebhookFormat::parse("slack"), None);
    }
}
