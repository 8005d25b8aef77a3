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
use crate::ports::{Clock, Store};

/// How old an anchor may grow before the loops anchor again. The monotonic
/// clock's rate error over this is far below anything stead times.
pub const ANCHOR_AGE_MAX: Duration = Duration::from_secs(60);

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
}

/// Reads the database's clock and anchors `clock` to it, when it follows
/// the database's and its anchor is missing or old. A failed read keeps the
/// old anchor and says so.
pub async fn anchor(clock: &dyn Clock, store: &dyn Store) {
    if !clock.wants_anchor() {
        return;
    }
    let sent = Instant::now();
    match store.database_now().await {
        Ok(database_now) => clock.anchor(database_now, sent.elapsed()),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the database's clock; keeping the last anchor")
        }
    }
}
