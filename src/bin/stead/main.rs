//! `stead`: the daemon and its operator CLI. Everything reusable lives in
//! `stead::daemon`; this file parses arguments, sets up logging and signals,
//! says what each command did, and maps results onto exit codes (0 success,
//! 1 failure, 2 a wrong command line, 3 to 7 by the kind of refusal; the
//! table is in `output.rs` and `docs/operations.md`, "Exit codes").

mod commands;
mod history;
mod output;
mod plan;
mod remote;
mod tokens;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use stead::core::event_log::{EventKind, EVENTS_READ_MAX};
use stead::daemon::telemetry::Telemetry;
use stead::daemon::{config, DaemonConfig, LogFormat};

use output::{complain, exit, say, EXIT_FAILURE, EXIT_OK, EXIT_USAGE};

/// mimalloc rather than glibc's malloc: a steady recovery pass allocates
/// and frees a few dozen small objects per instance, and over 10,000 to
/// 100,000 instances glibc's free lists (consolidation, unlinking) were a
/// fifth of the pass; with mimalloc the same pass takes 0.55-0.8 of the
/// time (`cargo bench --bench scale`, which runs under this allocator too;
/// docs/benchmarks.md, "Scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// stead keeps a fleet of self-hosted service instances matching what its
/// database says should exist: it recovers crashed and unhealthy containers
/// inside a crash-loop budget, publishes traffic (through Caddy) only to
/// backends it verified, and runs provisioning, upgrades and deletion as
/// durable tasks.
///
/// Configuration: one TOML file (--config, else $STEAD_CONFIG, else
/// /etc/stead/stead.toml; defaults when absent), each key overridable by
/// STEAD_<KEY> (dots become "__", e.g. STEAD_CONTROL__TICK_INTERVAL_S=5).
/// See docs/operations.md for every key, docs/rules.md for the rules
/// (R*, C*, T*) messages quote. Exit status: 0 success, 1 failure, 2 a
/// wrong command line or request, 3 no such instance, 4 a conflict, 5 the
/// instance stayed busy, 6 the database did not answer, 7 the database
/// needs `stead migrate`, 8 a backup or restore of Postgres (use pg_dump
/// and pg_restore).
#[derive(Parser)]
#[command(name = "stead", version, about, long_about, max_term_width = 100)]
struct Cli {
    /// The config file.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format; overrides the file's `log_format`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormatArg>,
    /// Run the instance commands through the tenant API at URL (e.g.
    /// https://stead-api.example.com) instead of on the database; the
    /// token comes from --token-file or $STEAD_TOKEN.
    #[arg(long, global = true, value_name = "URL", env = "STEAD_SERVER")]
    server: Option<String>,
    /// The file holding the API token for --server.
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RoleArg {
    /// The singleton reconciler: ticks, recovery, Docker events.
    Reconciler,
    /// Workers only, claiming from the shared queue.
    Worker,
    /// Both (the single-machine default).
    All,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon until SIGTERM or SIGINT; SIGHUP reloads the catalog.
    Run {
        #[arg(long, value_enum, default_value = "all")]
        role: RoleArg,
        /// One tick (and, with workers, the tasks then due), then exit.
        #[arg(long)]
        once: bool,
        /// Start even with a catalog that would damage live instances (a
        /// type dropped, a service or volume renamed), which a reload
        /// refuses without --force and a start refuses without this.
        #[arg(long)]
        force_catalog: bool,
    },
    /// Run one tick and exit; exit status 1 when a check failed.
    Tick,
    /// Apply the embedded database migrations (idempotent) and say which.
    Migrate,
    /// Copy the SQLite database to FILE, consistently, while the daemon
    /// runs (Postgres: use pg_dump; exit status 8).
    Backup {
        /// Where to write the copy; refused if it exists, unless --force.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Replace the SQLite database with the backup FILE, after checking it
    /// is a stead database this binary knows; refused while a daemon uses
    /// the database (stop it first). Postgres: use pg_restore (exit 8).
    Restore {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Replace the database when one exists.
        #[arg(long)]
        force: bool,
    },
    /// Show instances, services, generations, runtime state, conditions,
    /// publication, inhibitions, catalog versions and pending upgrades, as
    /// the configured database, the runtime and Caddy say.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// Ask the running daemon (its admin endpoint) instead, which adds
        /// the crash-loop budgets it keeps in memory and its loaded catalog.
        #[arg(long)]
        live: bool,
        /// Only this team's instances.
        #[arg(long, value_parser = parse_team)]
        team: Option<String>,
    },
    /// Validate the config and catalog files; exit status 1 on the first
    /// error. Also says whether the running daemon uses an older catalog.
    Check,
    /// Make the running daemon re-read its catalog (as SIGHUP does). A bad
    /// catalog is refused and the running one kept; so is one that would
    /// damage live instances (a type dropped or moved between Docker and
    /// Helm, a service or named volume renamed), unless forced.
    Reload {
        /// Apply a catalog that would damage live instances anyway.
        #[arg(long, conflicts_with = "plan")]
        force: bool,
        /// Only say what the reload would do, as `stead plan` does.
        #[arg(long)]
        plan: bool,
        /// With --plan: the plan as JSON.
        #[arg(long, requires = "plan")]
        json: bool,
    },
    /// What reloading the catalog file would do, changing nothing: what it
    /// changes, what a reload would refuse, and the rollout it starts,
    /// forecast by the daemon's own planners (which instances upgrade, in
    /// which waves, when their windows let them, which stop-first services
    /// go down and for how long at most). Exit status 1 when a reload would
    /// be refused.
    Plan {
        /// The plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write instance intent (never touches containers directly).
    #[command(subcommand)]
    Instance(InstanceCommand),
    /// Show the task queue.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Halt or resume a service type's rollout of new versions.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// The tenant API's tokens: create (shown once), list, revoke.
    #[command(subcommand)]
    Token(tokens::TokenCommand),
    /// The event log: what stead did and why (starts, restarts,
    /// publications, enqueues, TTL expiries, halts, leases, reloads), one
    /// line per event, oldest first, each naming the rule it applied.
    Events {
        /// Only the events of this instance.
        #[arg(long, value_parser = parse_instance_name)]
        instance: Option<String>,
        /// Only the events of this team's instances.
        #[arg(long, value_parser = parse_team)]
        team: Option<String>,
        /// Only events of this kind: start, restart, stop, withdraw,
        /// publish, retire, revert, enqueue, cancel, halt, ttl_expiry,
        /// drift, crash_loop_delay, lease_taken, lease_lost,
        /// catalog_reload, task_done, task_failed, task_retry,
        /// orphan_release, host_refused, api.
        #[arg(long, value_parser = parse_event_kind)]
        kind: Option<EventKind>,
        /// Only the events of the last DURATION, by the database's clock:
        /// 30s, 10m, 2h, 7d.
        #[arg(long, value_name = "DURATION", value_parser = parse_since)]
        since: Option<std::time::Duration>,
        /// At most this many events (the newest).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(EVENTS_READ_MAX)))]
        limit: u32,
        /// Keep printing events as they are written (the log is read
        /// every second) until interrupted.
        #[arg(long)]
        follow: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Re-run a flight recording (`[flight_recorder]`, one instance's
    /// file) through the same machine and driver, its recorded answers and
    /// instants in place of the ports and the clock, and say whether every
    /// pass decided the same. Exit status 0: the same decisions; 1: the
    /// first pass and step where the replay decided otherwise, printed;
    /// 2: the file cannot be read, or a line is not a recorded pass (the
    /// line and field named).
    Replay {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// One instance's recent history as a timeline: one line per event,
    /// grouped by pass, with the time between passes.
    Timeline {
        #[arg(value_parser = parse_instance_name)]
        name: String,
        /// Only the last DURATION: 30s, 10m, 2h, 7d.
        #[arg(long, value_name = "DURATION", value_parser = parse_since)]
        since: Option<std::time::Duration>,
        /// At most this many events (the newest).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=i64::from(EVENTS_READ_MAX)))]
        limit: u32,
    },
}

#[derive(Subcommand)]
pub enum InstanceCommand {
    /// Create an instance and queue its provisioning.
    Create {
        name: String,
        /// The catalog service type.
        #[arg(long = "type")]
        service_type: String,
        #[arg(long, default_value = "default")]
        team: String,
        /// Must equal the catalog's version of the type (the default).
        #[arg(long)]
        version: Option<String>,
        /// Time to live in seconds (at least 60); the instance is
        /// deprovisioned after it.
        #[arg(long, value_name = "SECONDS", value_parser = parse_ttl_s)]
        ttl_s: Option<u64>,
        /// Maintenance window, e.g. "sun 03:00-05:00 Europe/Paris".
        #[arg(long)]
        window: Option<String>,
        /// Succeed without change when a live instance of this name and
        /// type exists (for scripts that run more than once).
        #[arg(long)]
        exists_ok: bool,
        /// A parameter the service type declares, for its templates
        /// (`{param.NAME}`); repeat for several.
        #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_parameter)]
        parameters: Vec<(String, String)>,
        /// A public host name to serve the instance under, within a domain
        /// its team may use (`teams.NAME.domain_suffixes`), for the type's
        /// service with `tenant_domains`; repeat for several.
        #[arg(long = "domain", value_name = "HOST")]
        domains: Vec<String>,
    },
    /// Say in plain sentences what each service of an instance waits
    /// for: a crash-loop delay and its end, a hold, a maintenance window,
    /// a halted rollout, a readiness probe, its TTL. Read from what
    /// `stead status` reads.
    Why {
        #[arg(value_parser = parse_instance_name)]
        name: String,
        /// Ask the running daemon (its admin endpoint), which adds the
        /// crash-loop budgets it keeps in memory.
        #[arg(long)]
        live: bool,
    },
    /// Show one instance: its row, services and tasks.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List instances (deleted ones with --all).
    List {
        /// Include deleted instances.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
        /// Only this team's instances.
        #[arg(long, value_parser = parse_team)]
        team: Option<String>,
    },
    /// Set stopped intent: containers are stopped and unpublished, kept.
    Stop { name: String },
    /// Set running intent again.
    Start { name: String },
    /// Provision a failed instance again, or reprovision a ready one
    /// (whatever of its release vanished is created again). Safe to run
    /// twice.
    Retry { name: String },
    /// Deprovision: remove containers and the release, mark deleted. Its
    /// queued tasks are cancelled.
    Delete {
        name: String,
        /// Remove the instance's named volumes too (a plain delete keeps
        /// them, with their data).
        #[arg(long)]
        purge_volumes: bool,
    },
    /// Hold the current generation of a service: never start it.
    Inhibit {
        name: String,
        #[arg(long)]
        service: String,
        #[arg(long, default_value = stead::ops::OPERATOR_HOLD)]
        reason: String,
    },
    /// Release the holds on a service.
    Release {
        name: String,
        #[arg(long)]
        service: String,
    },
}

#[derive(Subcommand)]
pub enum TaskCommand {
    /// Queued and running tasks, newest first, with attempts and last
    /// errors (finished ones too with --all).
    List {
        /// Include done and failed (and cancelled) tasks.
        #[arg(long)]
        all: bool,
        /// At most this many tasks.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a queued task (it becomes failed, its error saying so). A
    /// running task is never interrupted. Safe to run twice.
    Cancel {
        /// The task's id (`stead task list`).
        id: i64,
    },
}

#[derive(Subcommand)]
pub enum RolloutCommand {
    /// Stop a service type's rollout: no upgrade of it is planned, its
    /// queued upgrades are cancelled, and a worker checks the switch
    /// before it starts one (a running upgrade finishes).
    Halt {
        service_type: String,
        #[arg(long, default_value = "operator")]
        reason: String,
    },
    /// Plan upgrades of a service type again.
    Resume { service_type: String },
    /// Undo a service type's rollout: halt it, and put every instance of
    /// it whose upgrade still bakes back on its kept predecessors (an
    /// upgrade task starts and verifies them while the new version serves,
    /// then the route moves). With `--to VERSION`, also pin the type to a
    /// version its daemon recorded (`stead rollout versions`): every other
    /// instance is moved to it by an upgrade task, and new instances are
    /// made at it, until `stead rollout resume`.
    Undo {
        service_type: String,
        /// A recorded version to move the whole type to, older ones
        /// included.
        #[arg(long, value_name = "VERSION")]
        to: Option<String>,
    },
    /// The versions of a service type its daemon recorded as it loaded
    /// them, oldest first: what `stead rollout undo --to` can go back to.
    Versions { service_type: String },
}

/// `--ttl-s`: whole seconds, at least [`stead::ops::TTL_CLI_MIN`].
/// `NAME=VALUE` of `--set`; the catalog checks the name and the value.
fn parse_parameter(text: &str) -> Result<(String, String), ArgError> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(ArgError::NotAParameter(text.to_owned())),
    }
}

/// An instance name as every command takes it (T6).
fn parse_instance_name(text: &str) -> Result<String, ArgError> {
    stead::core::names::check_instance_name("instance", text)
        .map(|()| text.to_owned())
        .map_err(|e| ArgError::NotAName(text.chars().take(64).collect(), e.to_string()))
}

/// `--team`: a team's name, a DNS label as every name (T6).
fn parse_team(text: &str) -> Result<String, ArgError> {
    stead::core::names::check_dns_label("--team", text)
        .map(|()| text.to_owned())
        .map_err(|e| ArgError::NotAName(text.chars().take(64).collect(), e.to_string()))
}

/// `--kind`: one of the event log's stable kind names.
fn parse_event_kind(text: &str) -> Result<EventKind, ArgError> {
    EventKind::parse(text).map_err(|_| ArgError::NotAnEventKind(text.chars().take(64).collect()))
}

/// `--since`: a whole number and a unit.
fn parse_since(text: &str) -> Result<std::time::Duration, stead::daemon::event_log::SinceError> {
    stead::daemon::event_log::parse_since(text)
}

/// Why clap refused a value; clap prints it after the flag's name.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("{0:?}: expected NAME=VALUE")]
    NotAParameter(String),
    #[error("{0:?}: not an instance name: {1}")]
    NotAName(String, String),
    #[error(
        "{0:?}: not an event kind (start, restart, stop, withdraw, publish, retire, revert, \
         enqueue, cancel, halt, ttl_expiry, drift, crash_loop_delay, lease_taken, lease_lost, \
         catalog_reload, task_done, task_failed, task_retry, orphan_release, host_refused, api)"
    )]
    NotAnEventKind(String),
    #[error("{0:?} is not a whole number of seconds")]
    NotSeconds(String),
    #[error(
        "{seconds} s: must be between {min} s and {max} s (an instance that expires before it \
         is provisioned helps nobody)"
    )]
    TtlOutOfRange { seconds: u64, min: u64, max: u64 },
}

fn parse_ttl_s(text: &str) -> Result<u64, ArgError> {
    use stead::ops::{TTL_CLI_MIN, TTL_MAX};
    let seconds: u64 = text
        .parse()
        .map_err(|_| ArgError::NotSeconds(text.to_owned()))?;
    let (min, max) = (TTL_CLI_MIN.as_secs(), TTL_MAX.as_secs());
    if !(min..=max).contains(&seconds) {
        return Err(ArgError::TtlOutOfRange { seconds, min, max });
    }
    Ok(seconds)
}

/// Everything stead creates (the SQLite database and its journal, backups,
/// flight recordings, the identity lock, and the directories they go in)
/// is its owner's alone: files 0600, directories 0700 (#54). The database
/// holds tokens' hashes and the fleet's intent; a recording holds every
/// pass's inputs. Set once, first, before any file is opened; the systemd
/// unit says `UMask=0077` too.
fn private_files() {
    // SAFETY: umask only swaps the process's file-mode mask; it cannot
    // fail and touches no memory. No other thread exists yet.
    unsafe {
        libc::umask(0o077);
    }
}

fn main() -> ExitCode {
    private_files();
    stead::daemon::allocator::tune();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(e),
    };
    let mut config = match config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            complain(&format!("config: {e}"));
            return exit(EXIT_FAILURE);
        }
    };
    if let Some(format) = cli.log_format {
        config.log_format = match format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        };
    }
    let daemon = cli.command.is_daemon();
    // Traces are the loops' (`run`, `tick`); other commands export none.
    let telemetry = match daemon.then(|| Telemetry::new(&config.telemetry)) {
        None | Some(Ok(None)) => None,
        Some(Ok(Some(telemetry))) => Some(telemetry),
        Some(Err(e)) => {
            complain(&format!("config: {e}"));
            return exit(EXIT_FAILURE);
        }
    };
    init_tracing(config.log_format, daemon, telemetry.as_ref());
    if let Some(telemetry) = &telemetry {
        tracing::info!(
            endpoint = telemetry.endpoint(),
            "exporting traces over OTLP/HTTP"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            complain(&format!("cannot start the async runtime: {e}"));
            return exit(EXIT_FAILURE);
        }
    };
    let result = match (cli.server, cli.command) {
        (Some(server), Command::Instance(command)) => runtime.block_on(async {
            let remote = remote::Remote::new(&server, cli.token_file.as_deref())?;
            remote::instance(&remote, command).await
        }),
        (Some(_), _) => Err(output::CliError {
            message: "--server runs the instance commands only (stead instance ...)".into(),
            code: EXIT_USAGE,
        }),
        (None, command) => runtime.block_on(commands::dispatch(command, config)),
    };
    // Outside the runtime: the exporter's last batch is sent by blocking.
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match result {
        Ok(code) => exit(code),
        Err(e) => {
            complain(&e.message);
            exit(e.code)
        }
    }
}

/// `--help` and `--version` go to standard output (exit 0, quietly on a
/// closed pipe); a wrong command line to standard error (exit 2).
fn usage(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            say(error.to_string());
            exit(EXIT_OK)
        }
        _ => {
            let _ = error.print();
            exit(EXIT_USAGE)
        }
    }
}

impl Command {
    /// Commands that run the loops log at info by default; the others log
    /// only warnings unless `STEAD_LOG` says otherwise.
    fn is_daemon(&self) -> bool {
        matches!(self, Command::Run { .. } | Command::Tick)
    }
}

/// Logs go to standard error; colours only when it is a terminal, so a
/// file or journal never receives escape codes. Spans also go to
/// `telemetry`'s exporter when there is one, whatever `STEAD_LOG` shows.
fn init_tracing(format: LogFormat, daemon: bool, telemetry: Option<&Telemetry>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEAD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Json => logs.json().boxed(),
        LogFormat::Text => logs.boxed(),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(telemetry.map(Telemetry::layer))
        .init();
}

/// Reports that a command is about a config whose file is `config`.
pub fn config_source(config: &DaemonConfig) -> String {
    match &config.source {
        Some(path) => path.display().to_string(),
        None => "defaults and environment (no config file)".to_owned(),
    }
}
