//! What the CLI prints for people: relative times ("in 58 s", "3 min ago")
//! and aligned tables. Machine output (`--json`) keeps exact RFC 3339
//! timestamps; these are for the eye only.

use crate::core::types::Timestamp;

/// `t` relative to `now`, in the largest two units that matter:
/// `in 58 s`, `in 3 min 20 s`, `2 h 5 min ago`, `in 3 d 4 h`; `now` within
/// a second either way.
pub fn relative(t: Timestamp, now: Timestamp) -> String {
    let seconds = t.as_second() - now.as_second();
    if seconds == 0 {
        return "now".to_owned();
    }
    let span = span(seconds.unsigned_abs());
    if seconds > 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A duration of `seconds` in at most two units.
pub fn span(seconds: u64) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big} {big_unit}")
        } else {
            format!("{big} {big_unit} {small} {small_unit}")
        }
    };
    match seconds {
        s if s < MINUTE => format!("{s} s"),
        s if s < HOUR => two(s / MINUTE, "min", s % MINUTE, "s"),
        s if s < DAY => two(s / HOUR, "h", s % HOUR / MINUTE, "min"),
        s => two(s / DAY, "d", s % DAY / HOUR, "h"),
    }
}

/// Columns padded to their widest cell, two spaces apart, trailing spaces
/// trimmed; the first row is the header.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn times_read_as_a_person_would_say_them() {
        let now = at(0);
        for (offset, expect) in [
            (0, "now"),
            (58, "in 58 s"),
            (-58, "58 s ago"),
            (60, "in 1 min"),
            (200, "in 3 min 20 s"),
            (-7500, "2 h 5 min ago"),
            (3 * 86_400 + 4 * 3600 + 59, "in 3 d 4 h"),
        ] {
            assert_eq!(relative(at(offset), now), expect, "{offset}");
        }
    }

    #[test]
    fn a_table_aligns_its_columns_and_trims_line_ends() {
        let rows = vec![
            vec!["NAME".to_owned(), "STATE".to_owned()],
            vec!["a-long-name".to_owned(), "ready".to_owned()],
            vec!["b".to_owned(), String::new()],
        ];
        assert_eq!(table(&rows), "NAME         STATE\na-long-name  ready\nb\n");
    }
}
