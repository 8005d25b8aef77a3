//! How long a grant timed by the database's clock (a lease, a lock) is
//! trusted locally (T2), by the monotonic and the host's wall clock.

use std::time::Duration;

use tokio::time::Instant;

use crate::core::fleet::add;
use crate::core::types::Timestamp;
use crate::ports::Clock;

/// The instant a request that earns trust (a lease, a lock) was sent, on
/// both of the host's clocks.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    monotonic: Instant,
    host: Timestamp,
}

impl Sent {
    pub fn now(clock: &dyn Clock) -> Self {
        Self {
            monotonic: clock.monotonic(),
            host: clock.host_now(),
        }
    }
}

/// Until when a grant timed by the database's clock (a lease, a lock) is
/// trusted locally (T2): its length less a margin from the moment its
/// request was sent, by the monotonic clock *and* by the host's wall
/// clock. The monotonic clock cannot be stepped, but it stands still
/// while the host is suspended or its VM paused; the wall clock keeps
/// going then. A step of the wall clock can only end the trust early,
/// which costs a renewal.
#[derive(Clone, Copy, Debug)]
pub struct Trust {
    monotonic: Instant,
    host: Timestamp,
}

impl Trust {
    /// Trust for `length` from `sent`.
    pub fn from(sent: Sent, length: Duration) -> Self {
        Self {
            monotonic: sent.monotonic + length,
            host: add(sent.host, length),
        }
    }

    /// Whether the trust lasts at least `need` more, by both clocks (and
    /// the clock is not in doubt about the database's).
    pub fn lasts(&self, clock: &dyn Clock, need: Duration) -> bool {
        clock.settled()
            && clock.monotonic() + need <= self.monotonic
            && add(clock.host_now(), need) <= self.host
    }

    /// Whether it is trusted right now.
    pub fn holds(&self, clock: &dyn Clock) -> bool {
        clock.settled() && clock.monotonic() < self.monotonic && clock.host_now() < self.host
    }

    /// The monotonic instant it ends by, at the latest (for deadlines).
    pub fn monotonic_end(&self) -> Instant {
        self.monotonic
    }
}
