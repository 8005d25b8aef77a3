//! Where the CLI writes. Standard output is for results (tables, JSON,
//! what a command did); a reader that goes away early (`| head -1`,
//! `| grep -q`) ends the command quietly with success, as Unix tools do,
//! instead of a panic on a broken pipe. Standard error is for diagnostics
//! and is written best-effort.

use std::io::Write;
use std::process::ExitCode;

use stead::daemon::DaemonError;
use stead::ops::OpsError;
use stead::ports::{ErrorKind, PortFailure, StoreError};

/// Exit statuses, documented in `docs/operations.md` ("Exit codes").
pub const EXIT_OK: u8 = 0;
/// The command failed: bad config or catalog, unreachable store, refused
/// operation, unknown name, a failed check.
pub const EXIT_FAILURE: u8 = 1;
/// The command line itself was wrong (clap's own usage errors), or the
/// request it makes is (a bad name, TTL, window or version).
pub const EXIT_USAGE: u8 = 2;
/// No such instance or service.
pub const EXIT_NOT_FOUND: u8 = 3;
/// What exists contradicts the request (a name taken, an instance being
/// deleted, a change that raced another).
pub const EXIT_CONFLICT: u8 = 4;
/// The instance stayed locked by a pass or a task; nothing changed, run
/// the command again.
pub const EXIT_BUSY: u8 = 5;
/// The database did not answer; nothing changed, run the command again.
pub const EXIT_UNAVAILABLE: u8 = 6;
/// The database has no stead schema, or an older one: run `stead migrate`.
pub const EXIT_NO_SCHEMA: u8 = 7;
/// `stead backup` or `stead restore` on a Postgres database: its own tools
/// (`pg_dump`, `pg_restore`) do that.
pub const EXIT_USE_POSTGRES_TOOLS: u8 = 8;

/// A failed command: what to say on standard error and the exit status.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub code: u8,
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        Self {
            message,
            code: EXIT_FAILURE,
        }
    }
}

impl From<OpsError> for CliError {
    fn from(error: OpsError) -> Self {
        let code = match &error {
            OpsError::Invalid(_) => EXIT_USAGE,
            OpsError::Busy(_) => EXIT_BUSY,
            _ => exit_code_of(error.kind()),
        };
        Self {
            message: error.to_string(),
            code,
        }
    }
}

impl From<DaemonError> for CliError {
    /// A daemon that cannot be set up is a failure (1), except a database
    /// without the schema, which says what to run.
    fn from(error: DaemonError) -> Self {
        let code = match &error {
            DaemonError::NoSchema { .. } => EXIT_NO_SCHEMA,
            _ => EXIT_FAILURE,
        };
        Self {
            message: error.to_string(),
            code,
        }
    }
}

impl From<StoreError> for CliError {
    fn from(error: StoreError) -> Self {
        Self {
            code: exit_code_of(error.kind()),
            message: error.to_string(),
        }
    }
}

impl From<stead::store::sql::backup::BackupError> for CliError {
    fn from(error: stead::store::sql::backup::BackupError) -> Self {
        use stead::store::sql::backup::BackupError;
        let code = match &error {
            BackupError::UsePostgresTools { .. } => EXIT_USE_POSTGRES_TOOLS,
            BackupError::Exists(_) | BackupError::TargetExists(_) | BackupError::InUse { .. } => {
                EXIT_CONFLICT
            }
            BackupError::Store(e) => exit_code_of(e.kind()),
            BackupError::NotStead { .. } | BackupError::Io { .. } => EXIT_FAILURE,
        };
        Self {
            message: error.to_string(),
            code,
        }
    }
}

/// The exit status of a failure of this kind.
fn exit_code_of(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::NotFound => EXIT_NOT_FOUND,
        ErrorKind::Conflict => EXIT_CONFLICT,
        ErrorKind::Unavailable | ErrorKind::Transient => EXIT_UNAVAILABLE,
        ErrorKind::Refused
        | ErrorKind::Fenced
        | ErrorKind::BadRow
        | ErrorKind::NotReady
        | ErrorKind::Failed => EXIT_FAILURE,
    }
}

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
pub fn say_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::from(format!("cannot serialise: {e}")))?;
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
