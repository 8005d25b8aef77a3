//! The maintenance-window language: scenarios across DST gaps and folds,
//! malformed input, and the properties of `next_run_after`.

use jiff::Timestamp;
use proptest::prelude::*;
use stead::core::window::{next_run_after, DaySet, Window, WINDOW_SPEC_LEN_MAX};

fn ts(text: &str) -> Timestamp {
    text.parse().expect("test timestamp")
}

/// Data-driven check: `spec` evaluated at `now` gives `expect`, the next
/// run as an RFC 3339 instant.
fn check_next(spec: &str, now: &str, expect: &str) {
    let window = Window::parse(spec).expect("test spec parses");
    let actual = next_run_after(&window, ts(now));
    assert_eq!(actual, ts(expect), "{spec} at {now}");
}

#[test]
fn inside_a_window_runs_now() {
    // 2026-11-29 is a Sunday.
    check_next(
        "sun 03:00-05:00",
        "2026-11-29T04:00:00Z",
        "2026-11-29T04:00:00Z",
    );
    check_next(
        "sun 03:00-05:00",
        "2026-11-29T03:00:00Z",
        "2026-11-29T03:00:00Z",
    );
}

#[test]
fn the_end_of_a_window_is_outside_it() {
    check_next(
        "sun 03:00-05:00",
        "2026-11-29T05:00:00Z",
        "2026-12-06T03:00:00Z",
    );
}

#[test]
fn before_a_window_waits_for_its_start() {
    check_next(
        "sun 03:00-05:00",
        "2026-11-28T12:00:00Z",
        "2026-11-29T03:00:00Z",
    );
}

#[test]
fn a_window_crossing_midnight_is_open_the_next_morning() {
    // Friday 2026-11-27 22:00 Paris (UTC+1) opens a window that is still
    // open on Saturday at 01:00 local, though Saturday is not in the set.
    check_next(
        "mon-fri 22:00-02:00 Europe/Paris",
        "2026-11-28T00:30:00Z",
        "2026-11-28T00:30:00Z",
    );
    // After it closes, the next opening is Monday 22:00 local.
    check_next(
        "mon-fri 22:00-02:00 Europe/Paris",
        "2026-11-28T01:00:00Z",
        "2026-11-30T21:00:00Z",
    );
}

#[test]
fn a_start_inside_a_dst_gap_opens_when_the_gap_ends() {
    // Paris springs forward on 2026-03-29: 02:00 CET jumps to 03:00 CEST
    // (01:00Z). 02:30 does not exist that day, so the window opens at the
    // jump and closes at 03:10 CEST (01:10Z).
    check_next(
        "sun 02:30-03:10 Europe/Paris",
        "2026-03-29T00:00:00Z",
        "2026-03-29T01:00:00Z",
    );
    check_next(
        "sun 02:30-03:10 Europe/Paris",
        "2026-03-29T01:05:00Z",
        "2026-03-29T01:05:00Z",
    );
}

#[test]
fn a_window_wholly_inside_a_dst_gap_skips_that_day() {
    // 02:10-02:50 never shows on Paris clocks on 2026-03-29; the next
    // opening is a week later, at 02:10 CEST (00:10Z).
    check_next(
        "sun 02:10-02:50 Europe/Paris",
        "2026-03-29T00:00:00Z",
        "2026-04-05T00:10:00Z",
    );
}

#[test]
fn a_start_inside_a_dst_fold_opens_at_the_first_occurrence() {
    // New York falls back on 2026-11-01: 02:00 EDT becomes 01:00 EST, so
    // 01:30 happens twice; the window opens at the first (05:30Z) and
    // stays open through the repeated hour until 02:00 EST (07:00Z).
    check_next(
        "sun 01:30-02:00 America/New_York",
        "2026-11-01T00:00:00Z",
        "2026-11-01T05:30:00Z",
    );
    let window = Window::parse("sun 01:30-02:00 America/New_York").unwrap();
    assert!(window.contains(ts("2026-11-01T06:45:00Z")));
    assert!(!window.contains(ts("2026-11-01T07:00:00Z")));
}

#[test]
fn a_zone_that_skipped_a_whole_day_still_finds_the_next_window() {
    // Samoa skipped Friday 2011-12-30 entirely.
    let window = Window::parse("fri 10:00-11:00 Pacific/Apia").unwrap();
    let now = ts("2011-12-29T00:00:00Z");
    let next = next_run_after(&window, now);
    assert!(next > now && window.contains(next));
}

#[test]
fn malformed_specs_are_rejected_with_the_token_named() {
    let cases = [
        ("sun", "column 4"),
        ("sun 3-5", "\"3\" at column 5"),
        ("sunday 03:00-05:00", "\"sunday\""),
        ("mon,,tue 03:00-05:00", "empty day"),
        ("mon 03:00-05:00 UTC extra", "\"extra\""),
        ("mon 03:60-05:00", "\"03:60\""),
        ("mon 0300-0500", "\"0300\" at column 5"),
        ("mon 03:00-05:00 Not/AZone", "\"Not/AZone\""),
        ("mon-xyz 03:00-05:00", "\"xyz\" at column 5"),
        ("   ", "empty"),
        ("mon 03:00:00-05:00", "03:00:00"),
        ("mon 03:0-05:00", "\"03:0\""),
        ("mon +3:00-05:00", "\"+3:00\""),
    ];
    for (spec, needle) in cases {
        let error = Window::parse(spec).expect_err(spec).to_string();
        assert!(error.contains(needle), "{spec:?}: {error}");
    }
    let long = "mon ".repeat(WINDOW_SPEC_LEN_MAX);
    let error = Window::parse(&long).unwrap_err().to_string();
    assert!(error.contains("at most"), "{error}");
}

/// Zones with DST rules of every shape: none, an hour, half an hour,
/// southern hemisphere, transitions at midnight, and a skipped day.
const ZONES: [&str; 9] = [
    "",
    " Europe/Paris",
    " America/New_York",
    " Australia/Lord_Howe",
    " America/Sao_Paulo",
    " Asia/Kolkata",
    " Pacific/Apia",
    " America/Santiago",
    " Europe/Dublin",
];

fn window_strategy() -> impl Strategy<Value = Window> {
    (1u8..=127, 0u32..1440, 1u32..1440, 0usize..ZONES.len()).prop_map(
        |(mask, start_min, length_min, zone)| {
            let end_min = (start_min + length_min) % 1440;
            let days = DaySet::from_mask(mask).expect("non-empty mask");
            let spec = format!(
                "{days} {:02}:{:02}-{:02}:{:02}{}",
                start_min / 60,
                start_min % 60,
                end_min / 60,
                end_min % 60,
                ZONES[zone]
            );
            Window::parse(&spec).expect("generated spec parses")
        },
    )
}

fn instant_strategy() -> impl Strategy<Value = Timestamp> {
    // 1990 to 2060, at second precision, covering many DST rule changes.
    (631_152_000i64..2_840_140_800).prop_map(|s| Timestamp::from_second(s).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn next_run_is_never_before_now(window in window_strategy(), now in instant_strategy()) {
        prop_assert!(next_run_after(&window, now) >= now);
    }

    #[test]
    fn next_run_is_now_exactly_when_now_is_inside(
        window in window_strategy(),
        now in instant_strategy(),
    ) {
        prop_assert_eq!(next_run_after(&window, now) == now, window.contains(now));
    }

    #[test]
    fn next_run_is_always_inside_the_window(
        window in window_strategy(),
        now in instant_strategy(),
    ) {
        let next = next_run_after(&window, now);
        prop_assert!(window.contains(next), "{} at {} gave {}", window, now, next);
    }

    #[test]
    fn parse_of_display_is_the_identity(window in window_strategy()) {
        let text = window.to_string();
        prop_assert_eq!(Window::parse(&text), Ok(window));
    }

    #[test]
    fn the_parser_never_panics(spec in "\\PC{0,80}") {
        let _ = Window::parse(&spec);
    }

    #[test]
    fn near_misses_of_valid_specs_never_panic(
        spec in "[a-zA-Z,\\- ]{0,12}[0-9:\\-]{0,12}( [A-Za-z/_]{0,20})?",
    ) {
        if let Ok(window) = Window::parse(&spec) {
            prop_assert_eq!(Window::parse(&window.to_string()), Ok(window));
        }
    }
}
