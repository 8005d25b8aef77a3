//! Anchoring the engine's clock to a reading of the database's, and how
//! far it can be trusted after (`ClockCheck`).

use std::time::Duration;

use crate::core::types::Timestamp;
use crate::ports::{Anchored, Clock, Store, StoreError};

use super::ANCHOR_ROUND_TRIP_MAX;

/// How far the engine's clock can be trusted after [`anchor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockCheck {
    /// Never anchored: this process has not reached the database since it
    /// started, and its `now` is its host's, which must not time anything
    /// another process reads.
    Unanchored,
    /// Anchored, and agreeing with the reading before (or not read again).
    Steady,
    /// Anchored, but by a reading nothing vouches for: the first one, or
    /// one that jumped. Nothing that breaks another's claim by time (a
    /// TTL expiry, a task requeue, a lease takeover) is decided on it
    /// (#41): a jump that is stepped back by the next reading harms no one.
    Unverified(Anchored),
}

impl ClockCheck {
    /// Whether `now` agrees with the database at all.
    pub fn follows_database(self) -> bool {
        !matches!(self, ClockCheck::Unanchored)
    }
}

/// Reads the database's clock and anchors `clock` to it, when it follows
/// the database's and its anchor is missing or old (or always, with
/// `always`: the reconciler's ticks compare every reading with the last).
/// A failed read keeps the old anchor and says so.
pub async fn anchor(clock: &dyn Clock, store: &dyn Store, always: bool) -> ClockCheck {
    if !always && !clock.wants_anchor() {
        return settled(clock);
    }
    let sent = clock.monotonic();
    let answer = store.database_now().await;
    let round_trip = clock.monotonic().saturating_duration_since(sent);
    take_anchor(clock, answer, round_trip)
}

fn settled(clock: &dyn Clock) -> ClockCheck {
    if clock.follows_database() {
        ClockCheck::Steady
    } else {
        ClockCheck::Unanchored
    }
}

/// Anchors `clock` to the database's answer read over `round_trip`, unless
/// the read failed or took too long to place it.
pub(super) fn take_anchor(
    clock: &dyn Clock,
    answer: Result<Timestamp, StoreError>,
    round_trip: Duration,
) -> ClockCheck {
    match answer {
        Ok(database_now) if round_trip <= ANCHOR_ROUND_TRIP_MAX => {
            match clock.anchor(database_now, round_trip) {
                Anchored::Steady => return ClockCheck::Steady,
                other => return ClockCheck::Unverified(other),
            }
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
    settled(clock)
}
