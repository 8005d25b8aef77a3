//! Maintenance windows: when an upgrade of an instance may start.
//!
//! The language is one line of up to three whitespace-separated tokens:
//!
//! ```text
//! DAYS START-END [ZONE]
//! sun 03:00-05:00
//! mon-fri 22:00-02:00 Europe/Paris
//! sat,sun 01:30-04:00 America/New_York
//! daily 02:00-03:00
//! ```
//!
//! - `DAYS` is a comma-separated list of days (`mon` … `sun`, any case) and
//!   ranges (`mon-fri`; a range may wrap, `fri-mon` is fri, sat, sun, mon).
//!   `daily` means every day. The days name the local day on which a window
//!   *opens*: `fri 22:00-02:00` runs from Friday 22:00 to Saturday 02:00.
//! - `START-END` are local wall-clock times `HH:MM`. An end earlier than the
//!   start crosses midnight. Start and end must differ.
//! - `ZONE` is an IANA time-zone name from the tz database bundled into the
//!   binary (never the host's, so every machine agrees). UTC when absent.
//!
//! Daylight-saving transitions are resolved by one rule: a window opens (and
//! closes) at the first instant at which the local clock shows its start (or
//! end) time or later. A start inside a spring-forward gap therefore opens the
//! window the moment the gap ends; a start inside a fall-back fold opens it at
//! the first of the two occurrences. A window lying entirely inside a gap does
//! not happen that day.
//!
//! Everything is bounded: the spec's length ([`WINDOW_SPEC_LEN_MAX`]) and the
//! number of days [`next_run_after`] looks at ([`SEARCH_DAYS_BEFORE`],
//! [`SEARCH_DAYS_AFTER`]).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use jiff::{Timestamp, ToSpan};

/// Longest window spec accepted, in bytes. The longest sensible spec (every
/// day listed, two times, a long zone name) is well under half of it.
pub const WINDOW_SPEC_LEN_MAX: usize = 128;

/// How many local days before `now`'s local day are searched for a window
/// that is still open. One would do for a window crossing midnight; two
/// leaves room for zones whose offset moves by a day (Pacific/Apia, 2011).
pub(crate) const SEARCH_DAYS_BEFORE: i64 = 2;

/// How many local days after `now`'s local day are searched for the next
/// opening. Every day of the set recurs within 7 days; 15 covers a window
/// whose one weekly occurrence vanished into a DST gap or a skipped day.
pub const SEARCH_DAYS_AFTER: i64 = 15;

/// Names of the days in Monday-first order, as the language spells them.
const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// A non-empty set of weekdays; bit 0 is Monday, bit 6 is Sunday.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DaySet(u8);

impl DaySet {
    /// Every day of the week.
    pub const ALL: DaySet = DaySet(0b111_1111);

    /// Builds a set from a bit mask (bit 0 = Monday). `None` when the mask is
    /// empty or has bits beyond Sunday.
    pub fn from_mask(mask: u8) -> Option<DaySet> {
        (mask != 0 && mask & !Self::ALL.0 == 0).then_some(DaySet(mask))
    }

    pub fn mask(self) -> u8 {
        self.0
    }

    /// Whether the set holds the weekday at `monday_zero_offset` (0 = Monday).
    fn has(self, monday_zero_offset: usize) -> bool {
        self.0 & (1 << monday_zero_offset) != 0
    }

    pub fn contains(self, day: jiff::civil::Weekday) -> bool {
        self.has(day.to_monday_zero_offset() as usize)
    }
}

impl fmt::Display for DaySet {
    /// Canonical form: runs of three or more consecutive days (Monday
    /// first, no wrapping) as `a-b`, everything else as single days.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut day = 0;
        while day < 7 {
            if !self.has(day) {
                day += 1;
                continue;
            }
            let mut last = day;
            while last + 1 < 7 && self.has(last + 1) {
                last += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if last - day >= 2 {
                write!(f, "{}-{}", DAY_NAMES[day], DAY_NAMES[last])?;
                day = last + 1;
            } else {
                f.write_str(DAY_NAMES[day])?;
                day += 1;
            }
        }
        Ok(())
    }
}

/// A local wall-clock time with minute precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClockTime {
    hour: u8,
    minute: u8,
}

impl ClockTime {
    /// `None` unless `hour < 24` and `minute < 60`.
    pub fn new(hour: u8, minute: u8) -> Option<ClockTime> {
        (hour < 24 && minute < 60).then_some(ClockTime { hour, minute })
    }

    pub fn hour(self) -> u8 {
        self.hour
    }

    pub fn minute(self) -> u8 {
        self.minute
    }

    fn to_civil(self) -> Time {
        // Both fields were range-checked on construction, so this cannot
        // fail; `Time::MIN` keeps the function total regardless.
        Time::new(self.hour as i8, self.minute as i8, 0, 0).unwrap_or(Time::MIN)
    }
}

impl fmt::Display for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour, self.minute)
    }
}

/// A named IANA zone. Compared by name: two lookups of one name are equal.
#[derive(Clone, Debug)]
struct Zone {
    name: String,
    tz: TimeZone,
}

/// A parsed maintenance window. Build one with [`Window::parse`] (or
/// `str::parse`); `Display` prints the canonical spec, which parses back to
/// an equal window.
#[derive(Clone, Debug)]
pub struct Window {
    days: DaySet,
    start: ClockTime,
    end: ClockTime,
    /// `None` is UTC.
    zone: Option<Zone>,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        self.days == other.days
            && self.start == other.start
            && self.end == other.end
            && self.zone_name() == other.zone_name()
    }
}

impl Eq for Window {}

/// Why a window spec was rejected. Every variant that concerns a token names
/// it and its 1-based column, so the message points at the mistake.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("window spec is empty; expected e.g. \"sun 03:00-05:00\"")]
    Empty,
    #[error("window spec is {len} bytes long; at most {max} are allowed", max = WINDOW_SPEC_LEN_MAX)]
    TooLong { len: usize },
    #[error("bad token {token:?} at column {column} of the window spec: {reason}")]
    BadToken {
        token: String,
        column: usize,
        reason: String,
    },
    #[error("window spec ends at column {column}: expected {expected}")]
    Missing {
        column: usize,
        expected: &'static str,
    },
}

/// Tokens longer than this are cut in error messages so that a hostile
/// spec cannot make a huge log line (the spec itself is bounded too).
const ERROR_TOKEN_LEN_MAX: usize = 40;

fn bad(token: &str, column: usize, reason: impl Into<String>) -> WindowError {
    WindowError::BadToken {
        token: token.chars().take(ERROR_TOKEN_LEN_MAX).collect(),
        column,
        reason: reason.into(),
    }
}

/// One whitespace-separated word and its 1-based character column.
struct Token<'a> {
    text: &'a str,
    column: usize,
}

fn tokens(spec: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut start: Option<(usize, usize)> = None;
    for (column0, (byte, ch)) in spec.char_indices().enumerate() {
        match (ch.is_whitespace(), start) {
            (false, None) => start = Some((byte, column0 + 1)),
            (true, Some((from, column))) => {
                out.push(Token {
                    text: &spec[from..byte],
                    column,
                });
                start = None;
            }
            _ => {}
        }
    }
    if let Some((from, column)) = start {
        out.push(Token {
            text: &spec[from..],
            column,
        });
    }
    out
}

const DAY_EXPECTED: &str =
    "expected a day (mon, tue, wed, thu, fri, sat, sun), a range like mon-fri, or daily";

fn parse_day(word: &str, column: usize) -> Result<usize, WindowError> {
    DAY_NAMES
        .iter()
        .position(|name| name.eq_ignore_ascii_case(word))
        .ok_or_else(|| bad(word, column, DAY_EXPECTED))
}

fn parse_days(token: &Token<'_>) -> Result<DaySet, WindowError> {
    if token.text.eq_ignore_ascii_case("daily") {
        return Ok(DaySet::ALL);
    }
    let mut mask = 0u8;
    // Columns of the items inside the token, so an error points at the
    // offending day rather than at the start of the whole list.
    let mut column = token.column;
    for item in token.text.split(',') {
        if item.is_empty() {
            return Err(bad(token.text, column, "empty day in the list"));
        }
        match item.split_once('-') {
            None => mask |= 1 << parse_day(item, column)?,
            Some((from, to)) => {
                let first = parse_day(from, column)?;
                let last = parse_day(to, column + from.chars().count() + 1)?;
                // A range walks forward and may wrap past Sunday; the loop
                // is bounded by the week's length.
                let mut day = first;
                for _ in 0..7 {
                    mask |= 1 << day;
                    if day == last {
                        break;
                    }
                    day = (day + 1) % 7;
                }
            }
        }
        column += item.chars().count() + 1;
    }
    // Every item set at least one bit, so the mask is non-empty.
    DaySet::from_mask(mask).ok_or_else(|| bad(token.text, token.column, DAY_EXPECTED))
}

fn parse_clock(text: &str, column: usize) -> Result<ClockTime, WindowError> {
    const EXPECTED: &str = "expected a time HH:MM between 00:00 and 23:59";
    let (hour, minute) = text
        .split_once(':')
        .ok_or_else(|| bad(text, column, EXPECTED))?;
    let digits = |s: &str, len_max: usize| {
        !s.is_empty() && s.len() <= len_max && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(hour, 2) || minute.len() != 2 || !digits(minute, 2) {
        return Err(bad(text, column, EXPECTED));
    }
    // Both parts are one or two ASCII digits, so they fit in a u8.
    let hour: u8 = hour.parse().map_err(|_| bad(text, column, EXPECTED))?;
    let minute: u8 = minute.parse().map_err(|_| bad(text, column, EXPECTED))?;
    ClockTime::new(hour, minute).ok_or_else(|| bad(text, column, EXPECTED))
}

fn parse_times(token: &Token<'_>) -> Result<(ClockTime, ClockTime), WindowError> {
    let (start, end) = token.text.split_once('-').ok_or_else(|| {
        bad(
            token.text,
            token.column,
            "expected a time range START-END like 03:00-05:00",
        )
    })?;
    let start_clock = parse_clock(start, token.column)?;
    let end_clock = parse_clock(end, token.column + start.chars().count() + 1)?;
    if start_clock == end_clock {
        return Err(bad(
            token.text,
            token.column,
            "start and end are equal; a window must have a length",
        ));
    }
    Ok((start_clock, end_clock))
}

/// The tz database compiled into the binary. Looked up once; reading it
/// performs no I/O, so the core stays pure and every host agrees.
fn tz_database() -> &'static TimeZoneDatabase {
    static DATABASE: OnceLock<TimeZoneDatabase> = OnceLock::new();
    DATABASE.get_or_init(TimeZoneDatabase::bundled)
}

fn parse_zone(token: &Token<'_>) -> Result<Option<Zone>, WindowError> {
    let tz = tz_database().get(token.text).map_err(|_| {
        bad(
            token.text,
            token.column,
            "expected an IANA time-zone name like Europe/Paris (or UTC)",
        )
    })?;
    let name = tz.iana_name().unwrap_or(token.text).to_owned();
    if name == "UTC" {
        // UTC is the default; storing it as `None` keeps one spelling per
        // window, which is what makes parse ∘ display the identity.
        return Ok(None);
    }
    Ok(Some(Zone { name, tz }))
}

impl Window {
    /// Parses a window spec (see the module documentation for the language).
    pub fn parse(spec: &str) -> Result<Window, WindowError> {
        if spec.len() > WINDOW_SPEC_LEN_MAX {
            return Err(WindowError::TooLong { len: spec.len() });
        }
        let words = tokens(spec);
        let end_column = spec.chars().count() + 1;
        let days_token = words.first().ok_or(WindowError::Empty)?;
        let days = parse_days(days_token)?;
        let times_token = words.get(1).ok_or(WindowError::Missing {
            column: end_column,
            expected: "a time range START-END like 03:00-05:00 after the days",
        })?;
        let (start, end) = parse_times(times_token)?;
        let zone = match words.get(2) {
            Some(token) => parse_zone(token)?,
            None => None,
        };
        if let Some(extra) = words.get(3) {
            return Err(bad(
                extra.text,
                extra.column,
                "unexpected token; a window is DAYS START-END [ZONE]",
            ));
        }
        Ok(Window {
            days,
            start,
            end,
            zone,
        })
    }

    pub fn days(&self) -> DaySet {
        self.days
    }

    pub fn start(&self) -> ClockTime {
        self.start
    }

    pub fn end(&self) -> ClockTime {
        self.end
    }

    /// The IANA zone name, `None` for UTC.
    pub(crate) fn zone_name(&self) -> Option<&str> {
        self.zone.as_ref().map(|z| z.name.as_str())
    }

    fn time_zone(&self) -> &TimeZone {
        match &self.zone {
            Some(zone) => &zone.tz,
            None => &UTC,
        }
    }

    /// Whether the window crosses local midnight.
    pub(crate) fn crosses_midnight(&self) -> bool {
        self.end < self.start
    }

    /// The occurrence that opens on local date `date`, as a half-open
    /// interval `[open, close)`. `None` when `date` is not one of the
    /// window's days, when the occurrence vanished into a DST gap, or at the
    /// edges of representable time.
    fn occurrence(&self, date: Date) -> Option<(Timestamp, Timestamp)> {
        if !self.days.contains(date.weekday()) {
            return None;
        }
        let tz = self.time_zone();
        let open = first_instant_showing(tz, date.to_datetime(self.start.to_civil()))?;
        let close_date = if self.crosses_midnight() {
            date.tomorrow().ok()?
        } else {
            date
        };
        let close = first_instant_showing(tz, close_date.to_datetime(self.end.to_civil()))?;
        (close > open).then_some((open, close))
    }

    /// The local dates whose occurrences can contain or follow `now`, in
    /// increasing order. Bounded by the search constants.
    fn candidate_dates(&self, now: Timestamp) -> impl Iterator<Item = Date> {
        let today = self.time_zone().to_datetime(now).date();
        (-SEARCH_DAYS_BEFORE..=SEARCH_DAYS_AFTER)
            .filter_map(move |offset| today.checked_add(offset.days()).ok())
    }

    /// Whether `now` lies inside an occurrence of the window.
    pub fn contains(&self, now: Timestamp) -> bool {
        self.candidate_dates(now)
            .filter_map(|date| self.occurrence(date))
            .any(|(open, close)| open <= now && now < close)
    }

    /// `Some(now)` when `now` is inside the window, else the next opening.
    /// `None` only at the far end of representable time, where no opening
    /// can be computed.
    pub fn try_next_run_after(&self, now: Timestamp) -> Option<Timestamp> {
        // Occurrences come in increasing order and their openings are
        // monotone, so the first one opening after `now` is the answer
        // unless an earlier one still contains `now`.
        for (open, close) in self
            .candidate_dates(now)
            .filter_map(|date| self.occurrence(date))
        {
            if open <= now && now < close {
                return Some(now);
            }
            if open > now {
                return Some(open);
            }
        }
        None
    }
}

static UTC: TimeZone = TimeZone::UTC;

/// The first instant at which the local clock of `tz` shows `local` or a
/// later time: `local` itself when it exists, its first occurrence inside a
/// fold, and the end of the gap when the clock jumps over it.
fn first_instant_showing(tz: &TimeZone, local: DateTime) -> Option<Timestamp> {
    match tz.to_ambiguous_timestamp(local).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(local).ok(),
        // `before` is the offset in force before the transition; in a fold
        // it yields the earlier of the two instants.
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(local).ok(),
        AmbiguousOffset::Gap { before, after } => {
            // Read with the later offset, `local` names an instant just
            // before the jump; the next transition after it is the jump.
            let before_jump = after.to_timestamp(local).ok()?;
            let latest = before.to_timestamp(local).ok()?;
            let jump = tz
                .following(before_jump)
                .next()
                .map(|transition| transition.timestamp())
                .unwrap_or(latest);
            Some(jump.min(latest))
        }
    }
}

/// When an upgrade may run: `now` if it is inside the window, else the next
/// opening. Saturates at [`Timestamp::MAX`] at the far end of representable
/// time (year 9999), the only place no opening can be computed.
pub fn next_run_after(window: &Window, now: Timestamp) -> Timestamp {
    window.try_next_run_after(now).unwrap_or(Timestamp::MAX)
}

impl FromStr for Window {
    type Err = WindowError;

    fn from_str(spec: &str) -> Result<Window, WindowError> {
        Window::parse(spec)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}-{}", self.days, self.start, self.end)?;
        if let Some(zone) = &self.zone {
            write!(f, " {}", zone.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: &str, expect: &str) {
        let actual = match Window::parse(spec) {
            Ok(window) => window.to_string(),
            Err(error) => format!("error: {error}"),
        };
        assert_eq!(actual, expect, "spec {spec:?}");
    }

    #[test]
    fn canonical_forms() {
        check("sun 03:00-05:00", "sun 03:00-05:00");
        check(
            "MON-fri 22:00-02:00 europe/paris",
            "mon-fri 22:00-02:00 Europe/Paris",
        );
        check("fri-mon 1:05-2:00", "mon,fri-sun 01:05-02:00");
        check("daily 02:00-03:00 UTC", "mon-sun 02:00-03:00");
        check("sat,sun,mon 00:00-23:59", "mon,sat,sun 00:00-23:59");
    }

    #[test]
    fn errors_point_at_the_token() {
        check(
            "",
            "error: window spec is empty; expected e.g. \"sun 03:00-05:00\"",
        );
        check(
            "mon,tue,wex 03:00-04:00",
            "error: bad token \"wex\" at column 9 of the window spec: expected a day (mon, tue, wed, thu, fri, sat, sun), a range like mon-fri, or daily",
        );
        check(
            "mon 03:00-24:00",
            "error: bad token \"24:00\" at column 11 of the window spec: expected a time HH:MM between 00:00 and 23:59",
        );
        check(
            "mon 03:00-03:00",
            "error: bad token \"03:00-03:00\" at column 5 of the window spec: start and end are equal; a window must have a length",
        );
        check(
            "mon 03:00-04:00 Mars/Olympus",
            "error: bad token \"Mars/Olympus\" at column 17 of the window spec: expected an IANA time-zone name like Europe/Paris (or UTC)",
        );
        check(
            "mon",
            "error: window spec ends at column 4: expected a time range START-END like 03:00-05:00 after the days",
        );
    }
}
