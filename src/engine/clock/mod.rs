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
//!
//! This file holds `AnchoredClock`; `check.rs` the anchoring a loop asks
//! for and what it says of the clock, `trust.rs` how long a grant is
//! trusted locally.

mod check;
#[cfg(test)]
mod tests;
mod trust;

pub use check::{anchor, ClockCheck};
pub use trust::{Sent, Trust};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::broken::Armed;
use crate::core::fleet::add;
use crate::core::types::Timestamp;
use crate::ports::{Anchored, Clock, CLOCK_JUMP_MAX};

/// How old an anchor may grow before the loops anchor again. The monotonic
/// clock's rate error over this is far below anything stead times.
pub const ANCHOR_AGE_MAX: Duration = Duration::from_secs(60);

/// The longest round trip an anchor is taken from. An anchor is placed at
/// the round trip's midpoint, so it is off by up to half the round trip: a
/// process paused while the database's answer was on its way (a stopped
/// VM, a long GC) would otherwise run minutes ahead of every other.
pub const ANCHOR_ROUND_TRIP_MAX: Duration = Duration::from_secs(1);

/// How long a step of the database's clock must last before this clock
/// follows it: a step stepped back within it moves nothing here.
pub const STEP_BELIEVED_AFTER: Duration = Duration::from_secs(60);

/// A clock anchored to the database's.
pub struct AnchoredClock {
    /// The host's wall clock, used only before the first anchoring, and
    /// the monotonic clock.
    host: Arc<dyn Clock>,
    anchors: Mutex<Anchors>,
    /// The mutation exercise's switch; always empty in the daemon.
    broken: Armed,
}

#[derive(Clone, Copy, Debug, Default)]
struct Anchors {
    /// What `now` is measured from.
    current: Option<Anchor>,
    /// A reading that stepped away from `current`, not yet believed.
    step: Option<Anchor>,
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    database: Timestamp,
    local: Instant,
    /// The host's wall clock at the same moment, so that an anchor's age
    /// counts time the monotonic clock stood still.
    host: Timestamp,
}

impl Anchor {
    /// Where this anchor puts the database's clock at local instant `local`.
    fn at(&self, local: Instant) -> Timestamp {
        add(self.database, local.saturating_duration_since(self.local))
    }

    /// How far `reading` is from where this anchor puts it.
    fn off(&self, reading: &Anchor) -> jiff::SignedDuration {
        reading.database.duration_since(self.at(reading.local))
    }
}

fn within_noise(off: jiff::SignedDuration) -> bool {
    off.unsigned_abs() <= CLOCK_JUMP_MAX
}

impl AnchoredClock {
    pub fn new(host: Arc<dyn Clock>) -> Self {
        Self {
            host,
            anchors: Mutex::new(Anchors::default()),
            broken: Armed::default(),
        }
    }

    /// The same clock with a rule broken on purpose (the simulation's
    /// mutation exercise).
    pub fn with_broken(self, broken: Armed) -> Self {
        Self { broken, ..self }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Anchors> {
        self.anchors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How `reading` compares with the anchors, and which anchor `now`
    /// follows afterwards.
    fn judge(&self, anchors: &mut Anchors, reading: Anchor) -> Anchored {
        let Some(last) = anchors.current else {
            anchors.current = Some(reading);
            return Anchored::First;
        };
        let off = last.off(&reading);
        if within_noise(off) || crate::broken!(self.broken, IgnoreClockJump) {
            *anchors = Anchors {
                current: Some(reading),
                step: None,
            };
            return if within_noise(off) {
                Anchored::Steady
            } else {
                Anchored::Jumped(off)
            };
        }
        // What the monotonic clock missed by the host's wall clock's
        // account (a skew of the host cancels out).
        let host_elapsed = reading.host.duration_since(last.host);
        let monotonic_elapsed =
            jiff::SignedDuration::try_from(reading.local.saturating_duration_since(last.local))
                .unwrap_or_default();
        let missed = host_elapsed - monotonic_elapsed;
        if off.is_positive() && within_noise(off - missed) {
            *anchors = Anchors {
                current: Some(reading),
                step: None,
            };
            return Anchored::StoodStill(off);
        }
        let believed = anchors.step.is_some_and(|step| {
            within_noise(step.off(&reading))
                && reading.local.saturating_duration_since(step.local) >= STEP_BELIEVED_AFTER
        });
        if believed {
            *anchors = Anchors {
                current: Some(reading),
                step: None,
            };
        } else if !anchors
            .step
            .is_some_and(|step| within_noise(step.off(&reading)))
        {
            anchors.step = Some(reading);
        }
        Anchored::Jumped(off)
    }
}

impl Clock for AnchoredClock {
    fn now(&self) -> Timestamp {
        match self.lock().current {
            Some(a) => a.at(self.host.monotonic()),
            None => self.host.now(),
        }
    }

    fn monotonic(&self) -> Instant {
        self.host.monotonic()
    }

    fn host_now(&self) -> Timestamp {
        if crate::broken!(self.broken, TrustMonotonicOnly) {
            // The bug this stands for: taking the anchored `now` (which
            // moves only with the monotonic clock) for the host's.
            return self.now();
        }
        self.host.now()
    }

    /// The answer is placed at the round trip's midpoint and judged
    /// against where the last anchor puts that moment.
    fn anchor(&self, database_now: Timestamp, round_trip: Duration) -> Anchored {
        let reading = Anchor {
            database: database_now,
            local: self.host.monotonic() - round_trip / 2,
            host: self.host_now(),
        };
        let mut anchors = self.lock();
        self.judge(&mut anchors, reading)
    }

    /// Old by either clock: after a suspend the monotonic age is short,
    /// the host's is not.
    fn wants_anchor(&self) -> bool {
        // Copied out first: `host_now` may read this clock's own `now`.
        let current = self.lock().current;
        current.is_none_or(|a| {
            let monotonic = self.host.monotonic().saturating_duration_since(a.local);
            let host = self.host_now().duration_since(a.host);
            monotonic >= ANCHOR_AGE_MAX || host.unsigned_abs() >= ANCHOR_AGE_MAX
        })
    }

    fn follows_database(&self) -> bool {
        self.lock().current.is_some()
    }

    /// Not while a step is in doubt, nor once the host's wall clock says
    /// more time passed since the anchor than the monotonic clock does:
    /// this process stood still (a suspend), so `now` lags the world until
    /// the next reading, and nothing may be decided or done by it.
    fn settled(&self) -> bool {
        let anchors = *self.lock();
        if anchors.step.is_some() {
            return false;
        }
        anchors.current.is_none_or(|a| {
            let host = self.host_now().duration_since(a.host);
            let monotonic = jiff::SignedDuration::try_from(
                self.host.monotonic().saturating_duration_since(a.local),
            )
            .unwrap_or_default();
            host - monotonic <= jiff::SignedDuration::try_from(CLOCK_JUMP_MAX).unwrap_or_default()
        })
    }
}
