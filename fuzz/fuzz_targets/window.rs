//! `window`: maintenance-window specs into `Window::parse`, then parsed
//! windows and instants into `try_next_run_after` / `next_run_after`.
//!
//! Most inputs are built from valid parts (days, `HH:MM-HH:MM`, a zone from
//! a fixed list that includes zones with daylight saving and Lord Howe's
//! half-hour shift), the rest are raw strings. Asserted:
//!
//! - parsing never panics; an error names a column inside the spec;
//! - a parsed window displays canonically: `parse(display(w)) == w` and
//!   displays identically;
//! - for an instant in a sane range, `try_next_run_after(now)` is `Some(r)`
//!   with `r >= now`, `contains(r)`, `r == now` exactly when
//!   `contains(now)`, no instant of `[now, r)` inside the window (sampled),
//!   and `r` within the search horizon; `next_run_after` agrees;
//! - near the ends of representable time nothing panics, and `None` happens
//!   only within the search horizon of `Timestamp::MAX` (the documented
//!   contract).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead::core::types::Timestamp;
use stead::core::window::{
    next_run_after, Window, WindowError, SEARCH_DAYS_AFTER, WINDOW_SPEC_LEN_MAX,
};

/// Zones the built specs draw from: UTC spelled out, zones with a one-hour
/// DST shift in both hemispheres, a half-hour shift, a zone that skipped a
/// whole day, fixed non-hour offsets, and case variants the parser
/// canonicalises.
const ZONES: [&str; 14] = [
    "UTC",
    "Europe/Berlin",
    "Europe/Paris",
    "America/New_York",
    "America/Sao_Paulo",
    "America/St_Johns",
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "europe/london",
    "Etc/GMT+12",
];

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// 1900-01-01T00:00:00Z and 2200-01-01T00:00:00Z: the instants checked
/// against the full contract.
const SANE_S_MIN: i64 = -2_208_988_800;
const SANE_S_MAX: i64 = 7_258_118_400;

/// How many instants of `[now, r)` are probed for containment.
const PROBES_MAX: usize = 4;

const SECONDS_PER_DAY: i64 = 86_400;

/// Instants of daylight-saving transitions (UTC seconds) of the zones
/// above, so that the edges DST creates are common inputs.
const TRANSITIONS_S: [i64; 11] = [
    1_774_746_000, // 2026-03-29T01:00:00Z Berlin, Paris spring forward
    1_792_890_000, // 2026-10-25T01:00:00Z Berlin, Paris fall back
    1_772_953_200, // 2026-03-08T07:00:00Z New York spring forward
    1_793_512_800, // 2026-11-01T06:00:00Z New York fall back
    1_772_947_800, // 2026-03-08T05:30:00Z St John's spring forward
    1_775_314_800, // 2026-04-04T15:00:00Z Lord Howe back half an hour
    1_791_041_400, // 2026-10-03T15:30:00Z Lord Howe forward half an hour
    1_791_043_200, // 2026-10-03T16:00:00Z Sydney spring forward
    1_790_431_200, // 2026-09-26T14:00:00Z Chatham spring forward
    1_550_368_800, // 2019-02-17T02:00:00Z Sao Paulo's last fall back
    1_325_239_200, // 2011-12-30T10:00:00Z Apia skips a whole day
];

#[derive(Debug)]
enum Instant {
    /// Whole minutes in the sane range: lands exactly on openings and
    /// closings, the edges most likely to be wrong.
    Minute(i64),
    /// Any nanosecond of the sane range.
    Any(i64, u32),
    /// Whole minutes within a few days of a DST transition.
    NearTransition(usize, i32),
    /// Seconds from the far end of representable time.
    NearMax(u32),
    /// Seconds from the near end of representable time.
    NearMin(u32),
}

impl Instant {
    fn arbitrary(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let days_s = 40 * SECONDS_PER_DAY as u32;
        Ok(match u.int_in_range(0..=11)? {
            0..=3 => Instant::Minute(u.int_in_range(SANE_S_MIN..=SANE_S_MAX)?),
            4..=5 => Instant::Any(u.int_in_range(SANE_S_MIN..=SANE_S_MAX)?, u.arbitrary()?),
            6..=9 => Instant::NearTransition(
                u.choose_index(TRANSITIONS_S.len())?,
                u.int_in_range(-4 * 24 * 60..=4 * 24 * 60)?,
            ),
            10 => Instant::NearMax(u.int_in_range(0..=days_s)?),
            _ => Instant::NearMin(u.int_in_range(0..=days_s)?),
        })
    }

    fn timestamp(&self) -> Timestamp {
        let (s, ns) = match *self {
            Instant::Minute(s) => (s - s.rem_euclid(60), 0),
            Instant::Any(s, ns) => (s, ns % 1_000_000_000),
            Instant::NearTransition(i, minutes) => (TRANSITIONS_S[i] + i64::from(minutes) * 60, 0),
            Instant::NearMax(back) => (Timestamp::MAX.as_second() - i64::from(back), 0),
            Instant::NearMin(ahead) => (Timestamp::MIN.as_second() + i64::from(ahead) + 1, 0),
        };
        Timestamp::new(s, ns as i32).expect("within jiff's range by construction")
    }

    fn sane(&self) -> bool {
        !matches!(self, Instant::NearMax(_) | Instant::NearMin(_))
    }
}

/// One input: a spec and the instants to schedule it at.
///
/// An input whose first byte is printable ASCII is a raw spec: its first
/// line is the spec (so the committed seeds are readable specs, and
/// mutations of them are near-valid), the rest draws the instants. Any
/// other first byte builds the spec from valid parts.
#[derive(Debug)]
struct Input {
    spec: String,
    instants: Vec<Instant>,
    /// Fractions (of 2^16) of `[now, r)` probed for containment.
    probes: Vec<u16>,
}

fn days(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    if u.ratio(1, 8)? {
        return Ok(if u.arbitrary()? { "daily" } else { "DAILY" }.to_owned());
    }
    let items = u.int_in_range(1..=4)?;
    let mut out = Vec::with_capacity(items);
    for _ in 0..items {
        let first = *u.choose(&DAYS)?;
        if u.ratio(1, 3)? {
            out.push(format!("{first}-{}", u.choose(&DAYS)?));
        } else {
            out.push(first.to_owned());
        }
    }
    let mut text = out.join(",");
    if u.ratio(1, 10)? {
        text = text.to_ascii_uppercase();
    }
    Ok(text)
}

fn clock(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    // Mostly valid times, sometimes an hour or minute just out of range,
    // and sometimes the one-digit hour form.
    let hour: u8 = u.int_in_range(0..=24)?;
    let minute: u8 = *u.choose(&[0, 0, 15, 30, 30, 45, 59, 60])?;
    Ok(if hour < 10 && u.ratio(1, 4)? {
        format!("{hour}:{minute:02}")
    } else {
        format!("{hour:02}:{minute:02}")
    })
}

fn built_spec(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    let mut spec = format!("{} {}-{}", days(u)?, clock(u)?, clock(u)?);
    if u.ratio(2, 3)? {
        spec.push(' ');
        spec.push_str(u.choose(&ZONES)?);
    }
    if u.ratio(1, 20)? {
        spec.push_str(" extra");
    }
    Ok(spec)
}

impl Input {
    fn from_bytes(data: &[u8]) -> arbitrary::Result<Self> {
        let (spec, rest) = match data.first() {
            Some(b) if (0x20..0x7f).contains(b) => {
                let line_len = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
                let spec = String::from_utf8_lossy(&data[..line_len]).into_owned();
                (Some(spec), &data[(line_len + 1).min(data.len())..])
            }
            Some(_) => (None, &data[1..]),
            None => (None, data),
        };
        let mut u = Unstructured::new(rest);
        let spec = match spec {
            Some(spec) => spec,
            None => built_spec(&mut u)?,
        };
        let mut instants = Vec::new();
        for _ in 0..u.int_in_range(1..=4)? {
            instants.push(Instant::arbitrary(&mut u)?);
        }
        let probes = (0..PROBES_MAX)
            .map(|_| u.arbitrary())
            .collect::<arbitrary::Result<_>>()?;
        Ok(Input {
            spec,
            instants,
            probes,
        })
    }
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let len = u.len();
        Self::from_bytes(u.bytes(len)?)
    }

    fn arbitrary_take_rest(u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Self::from_bytes(u.take_rest())
    }
}

fn check_error(spec: &str, error: &WindowError) {
    let message = error.to_string();
    assert!(!message.is_empty());
    let columns = spec.chars().count() + 1;
    match error {
        WindowError::Empty => assert!(spec.trim().is_empty(), "{spec:?}: {message}"),
        WindowError::TooLong { len } => assert!(*len > WINDOW_SPEC_LEN_MAX),
        WindowError::BadToken { column, .. } | WindowError::Missing { column, .. } => {
            assert!((1..=columns).contains(column), "{spec:?}: {message}");
        }
    }
}

fn check_round_trip(window: &Window) {
    let shown = window.to_string();
    let again = Window::parse(&shown)
        .unwrap_or_else(|e| panic!("display {shown:?} of a parsed window does not parse: {e}"));
    assert_eq!(&again, window, "display {shown:?} parses to another window");
    assert_eq!(again.to_string(), shown, "display is not canonical");
}

fn check_schedule(window: &Window, instant: &Instant, probes: &[u16]) {
    let now = instant.timestamp();
    let result = window.try_next_run_after(now);
    let horizon = jiff::SignedDuration::from_secs((SEARCH_DAYS_AFTER + 2) * SECONDS_PER_DAY);
    let Some(at) = result else {
        // Documented: `None` only at the far end of representable time.
        assert!(!instant.sane(), "{window} at {now}: no next run");
        assert!(
            Timestamp::MAX.duration_since(now) <= horizon,
            "{window} at {now}: None far from the end of time"
        );
        assert_eq!(next_run_after(window, now), Timestamp::MAX);
        return;
    };
    assert_eq!(next_run_after(window, now), at);
    assert!(at >= now, "{window} at {now}: next run {at} is in the past");
    assert!(
        window.contains(at),
        "{window}: next run {at} (from {now}) is outside the window"
    );
    assert_eq!(
        window.contains(now),
        at == now,
        "{window} at {now}: next run {at} disagrees with contains(now)"
    );
    if !instant.sane() {
        return;
    }
    assert!(
        at.duration_since(now) <= horizon,
        "{window} at {now}: next run {at} lies beyond the search horizon"
    );
    // Nothing in [now, at) is inside the window, or `at` was not the next
    // opening. `at - 1ns` is the instant most likely to disagree.
    let gap = at.duration_since(now);
    if gap.is_zero() {
        return;
    }
    let last = at - jiff::SignedDuration::from_nanos(1);
    assert!(
        !window.contains(last),
        "{window} at {now}: {last} is inside, before the next run {at}"
    );
    for &probe in probes {
        let offset_ns = (gap.as_nanos() * i128::from(probe)) / (1i128 << 16);
        let t = now + jiff::SignedDuration::from_nanos(offset_ns as i64);
        assert!(
            !window.contains(t),
            "{window} at {now}: {t} is inside, before the next run {at}"
        );
    }
}

fuzz_target!(|input: Input| {
    let window = match Window::parse(&input.spec) {
        Ok(window) => window,
        Err(error) => return check_error(&input.spec, &error),
    };
    check_round_trip(&window);
    for instant in &input.instants {
        check_schedule(&window, instant, &input.probes);
    }
});
