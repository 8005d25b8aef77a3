//! Where the CLI writes. Standard output is for results (tables, JSON,
//! what a command did); a reader that goes away early (`| head -1`,
//! `| grep -q`) ends the command quietly with success, as Unix tools do,
//! instead of a panic on a broken pipe. Standard error is for diagnostics
//! and is written best-effort.

use std::io::Write;
use std::process::ExitCode;

/// Exit statuses, documented in `docs/operations.md` ("Exit codes").
pub const EXIT_OK: u8 = 0;
/// The command failed: bad config or catalog, unreachable store, refused
/// operation, unknown name, a failed check.
pub const EXIT_FAILURE: u8 = 1;
/// The command line itself was wrong (clap's own usage errors).
pub const EXIT_USAGE: u8 = 2;

/// Writes `text` to standard output, adding a final newline if missing.
/// A closed pipe exits the process with success at once: whoever read the
/// output has what they wanted.
pub fn say(text: impl AsRef<str>) {
    let text = text.as_ref();
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                out.write_all(b"\n")
            }
        })
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(i32::from(EXIT_OK));
        }
        complain(&format!("cannot write to standard output: {e}"));
        std::process::exit(i32::from(EXIT_FAILURE));
    }
}

/// `value` as pretty JSON on standard output.
pub fn say_json(value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| format!("cannot serialise: {e}"))?;
    say(text);
    Ok(())
}

/// A diagnostic on standard error, `stead: ` first; never fails.
pub fn complain(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "stead: {text}");
}

pub fn exit(code: u8) -> ExitCode {
    ExitCode::from(code)
}
