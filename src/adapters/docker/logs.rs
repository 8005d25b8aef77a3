//! Log readiness: waiting for a line in the logs of exactly one execution.
//!
//! Docker keeps a container's logs across restarts, so "the logs" hold
//! every execution's lines. One execution's lines are told apart by their
//! timestamps (`timestamps=true`): Docker stamps a line when it reads it
//! from the container's pipe, and it drains the previous execution's pipes
//! before it records that execution's `FinishedAt`, which a running
//! container still reports until it exits again. So the lines stamped
//! after the previous `FinishedAt` are this execution's, and every earlier
//! one is not. `StartedAt` is no such boundary: it is recorded after the
//! process began, and a line printed at once is stamped up to some
//! milliseconds before it (measured with Docker 20.10).
//!
//! Podman's compatible API stamps lines in whole seconds, which only ever
//! moves a stamp earlier: an earlier execution's line still never counts,
//! but a line printed within the second the previous execution finished
//! is dropped with them (the probe then times out, on the safe side).
//!
//! Reading is bounded: the logs are followed as a stream of messages, each
//! searched where it lies; what is kept between messages is at most the
//! pattern's length less one byte per stream, so that a pattern cut in two
//! by Docker's 16 KiB pieces of a long line is still found. No line is
//! ever gathered whole. Containers run without a TTY (stead never asks for
//! one), so every message comes framed and stamped on its own.

use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::LogsOptions;
use futures_util::StreamExt;

use super::{detail, DockerRuntime, DOCKER_ZERO_TIME_PREFIX};
use crate::core::catalog::LOG_PATTERN_LEN_MAX;
use crate::core::types::{ContainerId, RuntimeError, Timestamp};
use crate::ports::{ProbeError, ProbeTarget};

/// How many times a log stream that ended while its execution still runs
/// (the connection to dockerd dropped) is followed again, within the
/// probe's timeout.
const LOG_FOLLOWS_MAX: u32 = 10;
/// The pause before following again.
const LOG_REFOLLOW_PAUSE: Duration = Duration::from_millis(200);
/// Longest timestamp prefix Docker writes (`2006-01-02T15:04:05.000000000Z`
/// and a space, with room for an offset); a message without a space
/// within it carries no timestamp.
const TIMESTAMP_PREFIX_LEN_MAX: usize = 40;

/// Longest line [`DockerRuntime::tail_lines`] returns, in bytes: a revert's
/// evidence is read by people, in an event of bounded size.
pub(crate) const EVIDENCE_LINE_LEN_MAX: usize = 240;

impl DockerRuntime {
    /// The last `lines` lines `id` printed (stdout and stderr, across its
    /// executions, as `docker logs --tail` gives them), each cut to
    /// [`EVIDENCE_LINE_LEN_MAX`] bytes. Reads at most `lines` messages:
    /// Docker cuts a long line into 16 KiB pieces, each a message.
    pub(crate) async fn tail_lines(
        &self,
        id: &ContainerId,
        lines: usize,
    ) -> Result<Vec<String>, RuntimeError> {
        let options = LogsOptions {
            follow: false,
            stdout: true,
            stderr: true,
            timestamps: false,
            tail: lines.to_string(),
            ..LogsOptions::default()
        };
        let mut stream = self.api().logs(id.as_str(), Some(options));
        let mut out: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        while let Some(message) = stream.next().await {
            let bytes = match message {
                Ok(LogOutput::StdOut { message } | LogOutput::StdErr { message })
                | Ok(LogOutput::Console { message }) => message,
                Ok(LogOutput::StdIn { .. }) => continue,
                Err(e) => return Err(super::not_found_or_transient("logs", id.as_str(), e)),
            };
            for line in String::from_utf8_lossy(&bytes).lines() {
                if out.len() == lines {
                    out.pop_front();
                }
                out.push_back(cut(line.trim_end(), EVIDENCE_LINE_LEN_MAX));
            }
        }
        Ok(out.into())
    }

    /// Waits up to `timeout` for a line containing `pattern` in the logs
    /// of `target`'s execution, and fails if the container runs another
    /// execution (or none) when it starts or when the line is found.
    pub async fn log_line_appeared(
        &self,
        target: &ProbeTarget,
        pattern: &str,
        timeout: Duration,
    ) -> Result<(), ProbeError> {
        let id = &target.container;
        let Some(started_at) = target.started_at else {
            return Err(ProbeError::NotReady(format!(
                "container {id}: the runtime reported no start, so its execution's log lines \
                 cannot be told from an earlier one's"
            )));
        };
        if pattern.is_empty() || pattern.len() > LOG_PATTERN_LEN_MAX {
            return Err(ProbeError::Misconfigured(format!(
                "log probe pattern {pattern:?} must be 1 to {LOG_PATTERN_LEN_MAX} bytes"
            )));
        }
        match tokio::time::timeout(timeout, self.follow_logs(id, started_at, pattern)).await {
            Ok(result) => result,
            Err(_) => Err(ProbeError::NotReady(format!(
                "container {id}: timed out after {} s waiting for a log line containing \
                 {pattern:?} from its execution started at {started_at}",
                timeout.as_secs_f64()
            ))),
        }
    }

    async fn follow_logs(
        &self,
        id: &ContainerId,
        started_at: Timestamp,
        pattern: &str,
    ) -> Result<(), ProbeError> {
        let after = self.execution_boundary(id, started_at).await?;
        let options = LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: since_secs(after),
            ..LogsOptions::default()
        };
        for _ in 0..LOG_FOLLOWS_MAX {
            // Following again reads from the boundary again: lines already
            // searched are searched again, which changes no answer.
            let mut scanner = LineScanner::new(pattern.as_bytes(), after);
            let mut stream = self.api().logs(id.as_str(), Some(options.clone()));
            while let Some(message) = stream.next().await {
                let found = match message {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                        scanner.scan(Source::Stdout, &message)
                    }
                    Ok(LogOutput::StdErr { message }) => scanner.scan(Source::Stderr, &message),
                    Ok(LogOutput::StdIn { .. }) => false,
                    Err(e) => {
                        return Err(ProbeError::Unreachable(format!(
                            "docker logs {id}: {}",
                            detail(&e)
                        )))
                    }
                };
                if found {
                    // The line is this execution's only if no other began
                    // since the boundary was read.
                    self.execution_boundary(id, started_at).await?;
                    return Ok(());
                }
            }
            // The stream ends when the execution does, or when the
            // connection drops; only the latter is worth another follow.
            self.execution_boundary(id, started_at).await?;
            tokio::time::sleep(LOG_REFOLLOW_PAUSE).await;
        }
        Err(ProbeError::Unreachable(format!(
            "docker logs {id}: the log stream ended {LOG_FOLLOWS_MAX} times while the \
             execution started at {started_at} kept running"
        )))
    }

    /// Checks that `id` runs the execution that started at `started_at`,
    /// and returns the instant after which its log lines are that
    /// execution's: the previous execution's finish, or `None` when there
    /// was none.
    async fn execution_boundary(
        &self,
        id: &ContainerId,
        started_at: Timestamp,
    ) -> Result<Option<Timestamp>, ProbeError> {
        let response = self.inspect_raw(id).await.map_err(|e| match e {
            RuntimeError::NotFound => ProbeError::NotReady(format!("container {id} is gone")),
            other => ProbeError::Unreachable(format!("inspect container {id}: {other}")),
        })?;
        execution_boundary_of(id, started_at, &response)
    }
}

/// The boundary of [`DockerRuntime::execution_boundary`] from one inspect.
fn execution_boundary_of(
    id: &ContainerId,
    started_at: Timestamp,
    response: &ContainerInspectResponse,
) -> Result<Option<Timestamp>, ProbeError> {
    let state = response.state.as_ref().ok_or_else(|| {
        ProbeError::Unreachable(format!("inspect of container {id} returned no State"))
    })?;
    let current = super::parse_started_at(id, state.started_at.as_deref())
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    if current != Some(started_at) {
        return Err(ProbeError::NotReady(format!(
            "container {id} restarted: it runs the execution started at {} instead of the \
             probed one, started at {started_at}",
            current.map_or_else(|| "(never)".to_owned(), |t| t.to_string())
        )));
    }
    if state.running != Some(true) {
        return Err(ProbeError::NotReady(format!(
            "container {id}: its execution started at {started_at} ended before its line \
             appeared"
        )));
    }
    let finished_at = parse_finished_at(id, state.finished_at.as_deref())?;
    // A finish after this start would be Docker contradicting itself; the
    // start is then the only safe boundary (it may drop a line printed at
    // once, never admit an earlier execution's).
    Ok(finished_at.map(|finished| finished.min(started_at)))
}

/// `State.FinishedAt`: Docker's zero time (never finished) and an absent
/// value are `None`.
fn parse_finished_at(
    id: &ContainerId,
    value: Option<&str>,
) -> Result<Option<Timestamp>, ProbeError> {
    let Some(value) = value.filter(|v| !v.is_empty() && !v.starts_with(DOCKER_ZERO_TIME_PREFIX))
    else {
        return Ok(None);
    };
    value.parse::<Timestamp>().map(Some).map_err(|e| {
        ProbeError::Unreachable(format!(
            "container {id}: State.FinishedAt = {value:?} is not a timestamp: {e}"
        ))
    })
}

/// Docker's `since` counts whole seconds: the second the boundary falls
/// in, whose earlier lines the scanner drops. Without a boundary (or one
/// Docker's 32-bit `since` cannot say) every line is read.
fn since_secs(after: Option<Timestamp>) -> i32 {
    after.map_or(0, |t| i32::try_from(t.as_second()).unwrap_or(0))
}

/// Which of the container's streams a message came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Stdout,
    Stderr,
}

/// The unfinished line of one stream.
#[derive(Debug, Default)]
struct OpenLine {
    /// Whether the line is the probed execution's.
    counts: bool,
    /// The line's last bytes, fewer than the pattern's, when the line goes
    /// on in the stream's next message; empty when no line is open.
    tail: Vec<u8>,
    open: bool,
}

/// Searches log messages, as Docker sends them with timestamps, for a line
/// containing a pattern, among the lines stamped after a boundary.
///
/// Each message is `<RFC 3339 timestamp> <text>`, its text ending in a
/// newline unless Docker cut a long line into pieces (of 16 KiB), the next
/// of which is the stream's next message. Memory held between messages is
/// bounded by the pattern's length, whatever the length of a line.
#[derive(Debug)]
struct LineScanner<'p> {
    pattern: &'p [u8],
    /// Lines stamped at or before it belong to an earlier execution; `None`
    /// when there was none.
    after: Option<Timestamp>,
    lines: [OpenLine; 2],
    /// The tail of an open line followed by the head of its next piece:
    /// where a pattern cut in two lies. At most twice the pattern's length.
    seam: Vec<u8>,
}

impl<'p> LineScanner<'p> {
    fn new(pattern: &'p [u8], after: Option<Timestamp>) -> Self {
        assert!(!pattern.is_empty(), "an empty pattern matches everything");
        Self {
            pattern,
            after,
            // Sized once: neither ever holds more (see `piece`).
            lines: [(); 2].map(|()| OpenLine {
                tail: Vec::with_capacity(2 * pattern.len()),
                ..OpenLine::default()
            }),
            seam: Vec::with_capacity(2 * pattern.len()),
        }
    }

    /// Searches one message of `source`; true once a counted line contains
    /// the pattern.
    fn scan(&mut self, source: Source, message: &[u8]) -> bool {
        let mut rest = message;
        // A message holds one line or one piece of one; several lines in
        // one message (each stamped) are searched one by one all the same.
        while !rest.is_empty() {
            let (stamp, text) = split_stamp(rest);
            let (piece, ended, next) = match text.iter().position(|b| *b == b'\n') {
                Some(i) => (&text[..i], true, &text[i + 1..]),
                None => (text, false, &text[text.len()..]),
            };
            if self.piece(source, stamp, piece, ended) {
                return true;
            }
            rest = next;
        }
        false
    }

    fn piece(
        &mut self,
        source: Source,
        stamp: Option<Timestamp>,
        piece: &[u8],
        ended: bool,
    ) -> bool {
        let keep = self.pattern.len() - 1;
        let line = &mut self.lines[source as usize];
        if !line.open {
            line.counts = match (self.after, stamp) {
                (None, _) => true,
                (Some(after), Some(stamp)) => stamp > after,
                // Unstamped, it may be an earlier execution's.
                (Some(_), None) => false,
            };
            line.tail.clear();
        }
        if line.counts {
            self.seam.clear();
            self.seam.extend_from_slice(&line.tail);
            self.seam.extend_from_slice(&piece[..piece.len().min(keep)]);
            if contains(&self.seam, self.pattern) || contains(piece, self.pattern) {
                return true;
            }
        }
        line.open = !ended;
        if ended {
            line.tail.clear();
        } else if piece.len() >= keep {
            line.tail.clear();
            line.tail.extend_from_slice(&piece[piece.len() - keep..]);
        } else {
            line.tail.extend_from_slice(piece);
            let excess = line.tail.len().saturating_sub(keep);
            line.tail.drain(..excess);
        }
        debug_assert!(line.tail.len() <= keep);
        false
    }
}

/// The message's timestamp, if it starts with one, and the text after it.
fn split_stamp(message: &[u8]) -> (Option<Timestamp>, &[u8]) {
    let head = &message[..message.len().min(TIMESTAMP_PREFIX_LEN_MAX)];
    let Some(space) = head.iter().position(|b| *b == b' ') else {
        return (None, message);
    };
    let stamp = std::str::from_utf8(&head[..space])
        .ok()
        .and_then(|s| s.parse::<Timestamp>().ok());
    match stamp {
        Some(stamp) => (Some(stamp), &message[space + 1..]),
        None => (None, message),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `text` cut to at most `max` bytes, on a character boundary, with `…`
/// when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64, nanos: i32) -> Timestamp {
        Timestamp::new(1_800_000_000 + second, nanos).unwrap()
    }

    fn stamped(t: Timestamp, text: &str) -> Vec<u8> {
        format!("{t} {text}").into_bytes()
    }

    #[test]
    fn a_line_stamped_after_the_boundary_counts_and_one_at_or_before_it_does_not() {
        let after = at(10, 500);
        let mut scanner = LineScanner::new(b"ready", Some(after));
        assert!(!scanner.scan(Source::Stdout, &stamped(at(10, 499), "ready\n")));
        assert!(!scanner.scan(Source::Stdout, &stamped(after, "ready\n")));
        assert!(!scanner.scan(Source::Stdout, b"ready, but unstamped\n"));
        assert!(scanner.scan(Source::Stderr, &stamped(at(10, 501), "now ready\n")));
    }

    #[test]
    fn without_a_boundary_every_line_counts() {
        let mut scanner = LineScanner::new(b"ready", None);
        assert!(scanner.scan(Source::Stdout, b"ready\n"));
    }

    #[test]
    fn a_pattern_cut_between_two_pieces_of_a_long_line_is_found() {
        let mut scanner = LineScanner::new(b"accepting connections", Some(at(0, 0)));
        let first = format!("{}accepting con", "x".repeat(16_384 - 13));
        assert!(!scanner.scan(Source::Stdout, &stamped(at(1, 0), &first)));
        // A message of the other stream in between changes nothing.
        assert!(!scanner.scan(Source::Stderr, &stamped(at(1, 1), "noise\n")));
        assert!(scanner.scan(Source::Stdout, &stamped(at(1, 2), "nections\n")));
    }

    #[test]
    fn a_pattern_cut_across_many_short_pieces_is_found() {
        let mut scanner = LineScanner::new(b"ready", None);
        for piece in ["r", "e", "a", "d"] {
            assert!(!scanner.scan(Source::Stdout, &stamped(at(1, 0), piece)));
        }
        assert!(scanner.scan(Source::Stdout, &stamped(at(1, 0), "y\n")));
    }

    #[test]
    fn lines_are_not_joined_across_their_end() {
        let mut scanner = LineScanner::new(b"ready", None);
        assert!(!scanner.scan(Source::Stdout, &stamped(at(1, 0), "rea\n")));
        assert!(!scanner.scan(Source::Stdout, &stamped(at(1, 0), "dy\n")));
    }

    #[test]
    fn the_pieces_of_an_earlier_executions_line_stay_uncounted() {
        // The line began before the boundary; its later pieces are
        // stamped after it but still belong to it.
        let mut scanner = LineScanner::new(b"ready", Some(at(5, 0)));
        assert!(!scanner.scan(Source::Stdout, &stamped(at(4, 0), "xxxx")));
        assert!(!scanner.scan(Source::Stdout, &stamped(at(6, 0), "ready\n")));
        assert!(scanner.scan(Source::Stdout, &stamped(at(6, 1), "ready\n")));
    }

    #[test]
    fn the_memory_kept_between_pieces_is_bounded_by_the_pattern() {
        let mut scanner = LineScanner::new(b"needle", None);
        let piece = stamped(at(1, 0), &"y".repeat(16_384));
        for _ in 0..64 {
            assert!(!scanner.scan(Source::Stdout, &piece));
        }
        assert!(scanner.lines[0].tail.len() < b"needle".len());
        assert!(scanner.seam.capacity() <= 2 * b"needle".len());
        assert!(scanner.lines[0].tail.capacity() <= 2 * b"needle".len());
    }

    #[test]
    fn several_stamped_lines_in_one_message_are_searched_one_by_one() {
        let mut scanner = LineScanner::new(b"ready", Some(at(5, 0)));
        let message = [
            stamped(at(4, 0), "ready\n"),
            stamped(at(6, 0), "starting\n"),
            stamped(at(7, 0), "ready\n"),
        ]
        .concat();
        assert!(scanner.scan(Source::Stdout, &message));
    }

    #[test]
    fn since_is_the_second_of_the_boundary() {
        assert_eq!(since_secs(None), 0);
        assert_eq!(since_secs(Some(at(3, 999_999_999))), 1_800_000_003);
    }
}
