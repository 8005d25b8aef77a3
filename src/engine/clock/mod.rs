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

use crate::core::broken::Armed;
use crate::core::fleet::add;
use crate::core::types::Timestamp;
use crate::ports::{Anchored, Clock, Store, StoreError, CLOCK_JUMP_MAX};

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
fn take_anchor(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A host whose wall clock and monotonic clock the test moves: an
    /// hour ahead of the database's to begin with.
    struct Host {
        start: Instant,
        state: Mutex<(Timestamp, Duration)>,
    }

    impl Host {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                start: Instant::now(),
                state: Mutex::new((
                    database_now() + jiff::SignedDuration::from_hours(1),
                    Duration::ZERO,
                )),
            })
        }

        /// Time goes on for both clocks.
        fn pass(&self, d: Duration) {
            let mut state = self.state.lock().unwrap();
            state.0 = add(state.0, d);
            state.1 += d;
        }

        /// The host stands still (suspended, its VM paused) while the
        /// world goes on: the wall clock catches up on resuming, the
        /// monotonic clock does not.
        fn suspend(&self, d: Duration) {
            let mut state = self.state.lock().unwrap();
            state.0 = add(state.0, d);
        }
    }

    impl Clock for Host {
        fn now(&self) -> Timestamp {
            self.state.lock().unwrap().0
        }
        fn monotonic(&self) -> Instant {
            self.start + self.state.lock().unwrap().1
        }
    }

    fn database_now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid")
    }

    fn off_by(clock: &AnchoredClock) -> jiff::SignedDuration {
        clock.now().duration_since(database_now()).abs()
    }

    const QUICK: Duration = Duration::from_millis(20);

    #[test]
    fn a_clock_never_anchored_does_not_follow_the_database() {
        let clock = AnchoredClock::new(Host::new());
        assert!(!clock.follows_database());
        assert!(clock.wants_anchor());
        let unavailable = Err(StoreError::Unavailable("down".into()));
        assert_eq!(
            take_anchor(&clock, unavailable, QUICK),
            ClockCheck::Unanchored
        );
        assert!(
            off_by(&clock) >= jiff::SignedDuration::from_mins(59),
            "the host's"
        );
    }

    #[test]
    fn an_answer_that_took_too_long_to_place_is_not_anchored_to() {
        // Paused for ten seconds while the answer was on its way: anchored
        // at the midpoint, the clock would run five seconds ahead.
        let clock = AnchoredClock::new(Host::new());
        let late = ANCHOR_ROUND_TRIP_MAX + Duration::from_secs(9);
        assert_eq!(
            take_anchor(&clock, Ok(database_now()), late),
            ClockCheck::Unanchored
        );
        assert!(clock.wants_anchor(), "tried again at the next tick");
        assert_eq!(
            take_anchor(&clock, Ok(database_now()), QUICK),
            ClockCheck::Unverified(Anchored::First),
            "a first reading has nothing to vouch for it"
        );
        assert!(clock.follows_database());
        assert!(
            off_by(&clock) < jiff::SignedDuration::from_millis(100),
            "within half the round trip: {:?}",
            off_by(&clock)
        );
        let late_again = take_anchor(&clock, Ok(database_now()), late);
        assert_eq!(
            late_again,
            ClockCheck::Steady,
            "a late answer keeps the last anchor"
        );
    }

    #[test]
    fn a_step_of_the_database_clock_moves_nothing_until_a_reading_a_minute_later_agrees() {
        let host = Host::new();
        let clock = AnchoredClock::new(host.clone());
        take_anchor(&clock, Ok(database_now()), QUICK);
        host.pass(Duration::from_secs(60));
        let on_time = add(database_now(), Duration::from_secs(61));
        assert_eq!(
            take_anchor(&clock, Ok(on_time), QUICK),
            ClockCheck::Steady,
            "a second of drift"
        );
        // Stepped an hour ahead, and back within the minute: nothing moved.
        host.pass(Duration::from_secs(30));
        let hour = jiff::SignedDuration::from_hours(1);
        let stepped = add(on_time, Duration::from_secs(30 + 3600));
        assert_eq!(
            take_anchor(&clock, Ok(stepped), QUICK),
            ClockCheck::Unverified(Anchored::Jumped(hour))
        );
        let ours = clock.now();
        assert!(
            ours.duration_since(on_time).unsigned_abs() < Duration::from_secs(31),
            "kept its own reckoning: {ours}"
        );
        host.pass(Duration::from_secs(30));
        let back = add(on_time, Duration::from_secs(60));
        assert_eq!(
            take_anchor(&clock, Ok(back), QUICK),
            ClockCheck::Steady,
            "stepped back"
        );
        // Stepped back half an hour, and it lasts: believed a minute later.
        host.pass(Duration::from_secs(10));
        let behind = add(back, Duration::from_secs(10)) - jiff::SignedDuration::from_mins(30);
        assert_eq!(
            take_anchor(&clock, Ok(behind), QUICK),
            ClockCheck::Unverified(Anchored::Jumped(-jiff::SignedDuration::from_mins(30)))
        );
        host.pass(Duration::from_secs(61));
        let still_behind = add(behind, Duration::from_secs(61));
        assert_eq!(
            take_anchor(&clock, Ok(still_behind), QUICK),
            ClockCheck::Unverified(Anchored::Jumped(-jiff::SignedDuration::from_mins(30))),
            "the minute is up: followed, this once unverified"
        );
        assert_eq!(
            clock.now(),
            add(still_behind, QUICK / 2),
            "placed mid round trip"
        );
        host.pass(Duration::from_secs(60));
        let next = add(still_behind, Duration::from_secs(60));
        assert_eq!(take_anchor(&clock, Ok(next), QUICK), ClockCheck::Steady);
    }

    #[test]
    fn a_suspended_host_finds_its_anchor_old_and_the_database_ahead() {
        let host = Host::new();
        let clock = AnchoredClock::new(host.clone());
        take_anchor(&clock, Ok(database_now()), QUICK);
        host.pass(Duration::from_secs(10));
        assert!(!clock.wants_anchor() && clock.settled());
        host.suspend(Duration::from_secs(600));
        assert!(
            clock.wants_anchor(),
            "old by the wall clock, young by the monotonic one"
        );
        assert!(
            !clock.settled(),
            "its `now` lags the world until it reads the database's"
        );
        let resumed = add(database_now(), Duration::from_secs(610));
        assert_eq!(
            take_anchor(&clock, Ok(resumed), QUICK),
            ClockCheck::Unverified(Anchored::StoodStill(jiff::SignedDuration::from_secs(600))),
            "the database went on while this process stood still"
        );
        assert_eq!(
            clock.now(),
            add(resumed, QUICK / 2),
            "taken at once: the database's clock was right"
        );
        assert!(clock.settled(), "settled again by the reading");
    }

    #[test]
    fn trust_ends_when_either_clock_says_so() {
        let host = Host::new();
        let clock = AnchoredClock::new(host.clone());
        let trust = Trust::from(Sent::now(&clock), Duration::from_secs(30));
        assert!(trust.holds(&clock) && trust.lasts(&clock, Duration::from_secs(29)));
        assert!(!trust.lasts(&clock, Duration::from_secs(31)));
        host.suspend(Duration::from_secs(40));
        assert!(
            !trust.holds(&clock),
            "the monotonic clock stood still, the wall clock did not"
        );
        let trust = Trust::from(Sent::now(&clock), Duration::from_secs(30));
        host.pass(Duration::from_secs(31));
        assert!(!trust.holds(&clock), "by the monotonic clock");
    }
}
