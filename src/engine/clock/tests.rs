//! The anchored clock's unit tests: steps, suspends, slow answers and
//! trust, on a host clock the test moves.

use super::check::take_anchor;
use super::*;
use crate::ports::StoreError;

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
