//! The engine's clock, anchored to the database's (T2).
//!
//! Every time-based decision (budgets, TTLs, windows, task leases) compares
//! times written by different processes, possibly on different hosts. A
//! host whose wall clock is skewed or jumps would expire a TTL or break a
//! task lease early, or retry a crash loop early. So the engine's `now` is
//! the database's clock read at the last anchoring plus the local monotonic
//! time since: a jump of the host's wall clock changes nothing, a skewed
//! host agrees with the database, and between anchorings only the monotonic
//! clock's rate matters. Until the first anchoring (the database never
//! answered yet) it is the host's wall clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::fleet::add;
use crate::core::types::Timestamp;
use crate::ports::{Clock, Store, StoreError};

/// How old an anchor may grow before the loops anchor again. The monotonic
/// clock's rate error over this is far below anything stead times.
pub const ANCHOR_AGE_MAX: Duration = Duration::from_secs(60);

/// The longest round trip an anchor is taken from. An anchor is placed at
/// the round trip's midpoint, so it is off by up to half the round trip: a
/// process paused while the database's answer was on its way (a stopped
/// VM, a long GC) would otherwise run minutes ahead of every other.
pub const ANCHOR_ROUND_TRIP_MAX: Duration = Duration::from_secs(1);

/// A clock anchored to the database's.
pub struct AnchoredClock {
    /// The host's wall clock, used only before the first anchoring.
    host: Arc<dyn Clock>,
    anchor: Mutex<Option<Anchor>>,
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    database: Timestamp,
    local: Instant,
}

impl AnchoredClock {
    pub fn new(host: Arc<dyn Clock>) -> Self {
        Self {
            host,
            anchor: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Anchor>> {
        self.anchor.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for AnchoredClock {
    fn now(&self) -> Timestamp {
        match *self.lock() {
            Some(a) => add(
                a.database,
                Instant::now().saturating_duration_since(a.local),
            ),
            None => self.host.now(),
        }
    }

    /// The answer is anchored at the round trip's midpoint.
    fn anchor(&self, database_now: Timestamp, round_trip: Duration) {
        let local = Instant::now() - round_trip / 2;
        *self.lock() = Some(Anchor {
            database: database_now,
            local,
        });
    }

    fn wants_anchor(&self) -> bool {
        self.lock()
            .is_none_or(|a| Instant::now().saturating_duration_since(a.local) >= ANCHOR_AGE_MAX)
    }

    fn follows_database(&self) -> bool {
        self.lock().is_some()
    }
}

/// Reads the database's clock and anchors `clock` to it, when it follows
/// the database's and its anchor is missing or old. A failed read keeps the
/// old anchor and says so. Returns whether `clock` now agrees with the
/// database: false only for a clock never anchored (a process that has not
/// reached the database since it started), whose `now` is its host's and
/// must not time anything another process reads.
pub async fn anchor(clock: &dyn Clock, store: &dyn Store) -> bool {
    if !clock.wants_anchor() {
        return clock.follows_database();
    }
    let sent = Instant::now();
    let answer = store.database_now().await;
    take_anchor(clock, answer, sent.elapsed())
}

/// Anchors `clock` to the database's answer read over `round_trip`, unless
/// the read failed or took too long to place it; returns whether `clock`
/// agrees with the database now.
fn take_anchor(
    clock: &dyn Clock,
    answer: Result<Timestamp, StoreError>,
    round_trip: Duration,
) -> bool {
    match answer {
        Ok(database_now) if round_trip <= ANCHOR_ROUND_TRIP_MAX => {
            clock.anchor(database_now, round_trip);
        }
        Ok(_) => tracing::warn!(
            round_trip_ms = round_trip.as_millis() as u64,
            "the database's clock answered after {round_trip:?}, too late to anchor to; \
             keeping the last anchor"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the database's clock; keeping the last anchor")
        }
    }
    clock.follows_database()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host clock an hour ahead of the database's.
    struct Ahead;

    impl Clock for Ahead {
        fn now(&self) -> Timestamp {
            database_now() + jiff::SignedDuration::from_hours(1)
        }
    }

    fn database_now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid")
    }

    fn off_by(clock: &AnchoredClock) -> jiff::SignedDuration {
        clock.now().duration_since(database_now()).abs()
    }

    #[test]
    fn a_clock_never_anchored_does_not_follow_the_database() {
        let clock = AnchoredClock::new(Arc::new(Ahead));
        assert!(!clock.follows_database());
        assert!(clock.wants_anchor());
        let unavailable = Err(StoreError::Unavailable("down".into()));
        assert!(!take_anchor(&clock, unavailable, Duration::from_millis(5)));
        assert!(
            off_by(&clock) >= jiff::SignedDuration::from_mins(59),
            "the host's"
        );
    }

    #[test]
    fn an_answer_that_took_too_long_to_place_is_not_anchored_to() {
        // Paused for ten seconds while the answer was on its way: anchored
        // at the midpoint, the clock would run five seconds ahead.
        let clock = AnchoredClock::new(Arc::new(Ahead));
        let late = ANCHOR_ROUND_TRIP_MAX + Duration::from_secs(9);
        assert!(!take_anchor(&clock, Ok(database_now()), late));
        assert!(clock.wants_anchor(), "tried again at the next tick");
        assert!(take_anchor(
            &clock,
            Ok(database_now()),
            Duration::from_millis(20)
        ));
        assert!(clock.follows_database());
        assert!(
            off_by(&clock) < jiff::SignedDuration::from_millis(100),
            "within half the round trip: {:?}",
            off_by(&clock)
        );
        let late_again = take_anchor(&clock, Ok(database_now()), late);
        assert!(late_again, "a late answer keeps the last anchor");
    }
}
