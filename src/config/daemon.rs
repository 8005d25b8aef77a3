//! The daemon's one configuration file (`stead.toml`), its `STEAD_*`
//! environment overrides, and validation at load. Every error names the
//! field (dotted, as in the file) and the offending value.
//!
//! It needs no adapter, so it builds without the `io` feature: the daemon
//! re-exports it as `daemon::config`, and the `config` fuzz target parses
//! arbitrary files with it.
//!
//! The `[control]` table is handed to [`ControlConfig::from_toml`], the
//! `[recovery]` table becomes a [`RecoveryPolicy`] checked by
//! [`RecoveryPolicy::validated`], and the `[grants]` table (what a catalog
//! may give a container) becomes [`Grants`] through [`Grants::new`], and
//! the `[limits]` table (what every container gets, and the most a catalog
//! may give) becomes [`ContainerLimits`] through [`ContainerLimits::new`],
//! so the daemon adds no second set of rules for them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod tenancy;
pub use tenancy::{ApiSettings, TenancySettings, TEAM_KEYS};

use crate::core::event_log::EventKind;
use crate::core::grants::{
    is_capability_name, Grants, Isolation, PodSecurity, CAP_DROP_DEFAULT, GRANT_ENTRIES_MAX,
};
use crate::core::limits::{ContainerLimits, RawLimits};
use crate::core::plan::{ConfigError, ControlConfig, RawControlConfig};
use crate::core::policy::{
    RecoveryPolicy, HELM_KILL_MARGIN, INSTANCES_AT_ONCE_MAX, LEASE_MARGIN, TASK_LEASE_SAFETY_MARGIN,
};
use crate::core::toml_error;
use crate::core::webhook::{
    WebhookFormat, DEFAULT_KINDS, EVENT_GAP_MARGIN, WEBHOOKS_MAX, WEBHOOK_TIMEOUT_MS_DEFAULT,
    WEBHOOK_TIMEOUT_MS_MAX, WEBHOOK_TIMEOUT_MS_MIN,
};

/// Where the config file is looked for when neither `--config` nor
/// `$STEAD_CONFIG` names one.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/stead/stead.toml";
/// The state directory on a single machine.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/stead";
/// The catalog when the file names none.
pub const DEFAULT_CATALOG_PATH: &str = "/etc/stead/catalog.toml";
/// Metrics and health endpoints: loopback only unless configured.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// Where Caddy serves stead's routes.
pub const DEFAULT_CADDY_LISTEN: &str = "127.0.0.1:8080";
/// The Docker engine's socket; the Docker adapter's default too.
pub const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// Caddy's admin API; the Caddy adapter's default too.
pub const DEFAULT_CADDY_ADMIN: &str = "127.0.0.1:2019";
/// Longest config file accepted, in bytes.
pub const CONFIG_LEN_MAX: u64 = 256 * 1024;
/// Most workers in one process.
pub const WORKERS_MAX: u32 = 64;
/// Longest shutdown bound.
pub const SHUTDOWN_GRACE_MAX: Duration = Duration::from_secs(3600);
/// How long the event log keeps an event unless `events.retention_days`
/// says otherwise, and the bounds of that setting.
pub const EVENT_RETENTION_DAYS_DEFAULT: i64 = 14;
pub const EVENT_RETENTION_DAYS_MIN: i64 = 1;
pub const EVENT_RETENTION_DAYS_MAX: i64 = 3650;
const _: () = assert!(
    EVENT_RETENTION_DAYS_MIN <= EVENT_RETENTION_DAYS_DEFAULT
        && EVENT_RETENTION_DAYS_DEFAULT <= EVENT_RETENTION_DAYS_MAX
);
/// The `service.name` traces are exported under unless
/// `telemetry.service_name` says otherwise.
pub const TELEMETRY_SERVICE_NAME_DEFAULT: &str = "stead";
/// The bound on one OTLP export request unless
/// `telemetry.export_timeout_ms` says otherwise, and that setting's bounds.
pub const TELEMETRY_EXPORT_TIMEOUT_MS_DEFAULT: i64 = 10_000;
pub const TELEMETRY_EXPORT_TIMEOUT_MS_MIN: i64 = 100;
pub const TELEMETRY_EXPORT_TIMEOUT_MS_MAX: i64 = 60_000;
/// How many passes the flight recorder keeps per instance unless
/// `flight_recorder.passes_per_instance` says otherwise, and its bounds.
pub const FLIGHT_PASSES_DEFAULT: i64 = 200;
pub const FLIGHT_PASSES_MIN: i64 = 2;
pub const FLIGHT_PASSES_MAX: i64 = 100_000;
/// Most extra host names one listener answers to (`admin_hosts`).
pub const LISTENER_HOSTS_MAX: usize = 32;
/// Longest value quoted back in an error.
const ERROR_VALUE_LEN_MAX: usize = 120;

/// Every key the file accepts, as dotted paths. Each one can also be set
/// from the environment as `STEAD_` + the path upper-cased with `.` turned
/// into `__` (e.g. `control.tick_interval_s` → `STEAD_CONTROL__TICK_INTERVAL_S`).
/// `docs/operations.md` documents each; a test checks the two agree.
pub const KEYS: &[&str] = &[
    "state_dir",
    "database_url",
    "catalog",
    "admin_listen",
    "admin_hosts",
    "admin_token_file",
    "api_listen",
    "api_hosts",
    "api_max_connections",
    "api_requests_per_minute",
    "log_format",
    "workers",
    "worker_idle_poll_ms",
    "shutdown_grace_s",
    "docker_events",
    "control.own_team",
    "control.max_in_flight",
    "control.lease_s",
    "control.provisioner_timeout_s",
    "control.tick_interval_s",
    "recovery.free_attempts",
    "recovery.delays_s",
    "recovery.stable_window_s",
    "recovery.unhealthy_threshold",
    "recovery.instance_deadline_s",
    "recovery.instances_at_once",
    "recovery.stop_grace_default_ms",
    "docker.socket",
    "docker.request_timeout_s",
    "docker.restart_policy",
    "docker.cap_drop",
    "docker.isolation",
    "caddy.admin",
    "caddy.listen",
    "caddy.server_name",
    "caddy.host_suffix",
    "caddy.request_timeout_s",
    "caddy.watch_interval_ms",
    "caddy.tls.mode",
    "caddy.tls.listen",
    "caddy.tls.domain",
    "caddy.tls.email",
    "caddy.tls.acme_ca",
    "caddy.tls.hsts_max_age_s",
    "helm.path",
    "helm.wait_timeout_s",
    "helm.kill_margin_s",
    "helm.pass_env",
    "helm.kubectl_path",
    "grants.host_path_prefixes",
    "grants.secret_dirs",
    "grants.env_passthrough",
    "grants.networks",
    "grants.capabilities",
    "grants.helm_charts",
    "grants.helm_namespace_prefix",
    "grants.helm_pod_security",
    "limits.memory_default_mb",
    "limits.memory_max_mb",
    "limits.pids_limit",
    "limits.log_max_size_mb",
    "limits.log_max_files",
    "events.retention_days",
    "flight_recorder.enabled",
    "flight_recorder.passes_per_instance",
    "flight_recorder.dir",
    "telemetry.otlp_endpoint",
    "telemetry.service_name",
    "telemetry.export_timeout_ms",
    "database.max_connections",
    "database.acquire_timeout_ms",
    "database.call_timeout_ms",
    "database.statement_timeout_ms",
    "database.lock_timeout_ms",
    "database.idle_in_transaction_session_timeout_ms",
];

/// The keys of each `[[webhooks]]` entry. A list of tables has no
/// environment override; `docs/operations.md` documents each as
/// `webhooks[].<key>`, and a test checks it does.
pub const WEBHOOK_KEYS: &[&str] = &[
    "name",
    "url",
    "secret_file",
    "kinds",
    "teams",
    "format",
    "timeout_ms",
];
/// Longest webhook URL accepted, in bytes.
pub const WEBHOOK_URL_LEN_MAX: usize = 2048;

/// The environment variable that overrides a key.
pub fn env_name(key: &str) -> String {
    format!("STEAD_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn parse(word: &str) -> Option<LogFormat> {
        match word {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DockerSettings {
    pub socket: PathBuf,
    pub request_timeout: Duration,
    /// `no` (stead is the only restarter) or `unless-stopped`.
    pub restart_unless_stopped: bool,
    /// Capabilities every container drops (default `NET_RAW`).
    pub cap_drop: Vec<String>,
    /// Where a lone service runs: `shared` (the isolated network) or `off`.
    pub isolation: Isolation,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaddySettings {
    pub admin: String,
    pub listen: String,
    pub server_name: String,
    pub host_suffix: String,
    pub request_timeout: Duration,
    /// How often a cheap read checks that Caddy still holds stead's
    /// servers, between ticks (a Caddy reloaded with another config).
    pub watch_interval: Duration,
    /// `[caddy.tls]`: HTTPS for public host names (#43).
    pub tls: TlsSettings,
}

/// Where the HTTPS server listens unless `caddy.tls.listen` says otherwise.
pub const DEFAULT_CADDY_TLS_LISTEN: &str = "0.0.0.0:443";
/// Longest HSTS max-age accepted: two years, the preload lists' figure.
pub const HSTS_MAX_AGE_S_MAX: i64 = 2 * 365 * 24 * 3600;
/// Bounds of `caddy.watch_interval_ms`.
pub const CADDY_WATCH_INTERVAL_MS_MIN: i64 = 100;
pub const CADDY_WATCH_INTERVAL_MS_MAX: i64 = 60_000;

/// `[caddy.tls]` (#43).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: TlsMode,
    /// The HTTPS server's address (`IP:port`).
    pub listen: String,
    /// The default scheme `<service>.<instance>.<domain>`; `None`: only the
    /// catalog's `domains` are public.
    pub domain: Option<String>,
    /// ACME account email (mode `acme` only).
    pub email: Option<String>,
    /// ACME directory URL instead of Let's Encrypt's (mode `acme` only).
    pub acme_ca: Option<String>,
    /// `Strict-Transport-Security` max-age; `None` (0 in the file) sends
    /// no such header.
    pub hsts_max_age: Option<Duration>,
}

/// Who serves HTTPS for public host names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Loopback HTTP only (the default): no public host names.
    Off,
    /// Certificates from an ACME CA (Let's Encrypt unless `acme_ca`).
    Acme,
    /// Certificates from Caddy's local CA: tests and private networks.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmSettings {
    pub path: PathBuf,
    /// The `kubectl` that creates a release's namespace with its Pod
    /// Security labels before helm installs into it.
    pub kubectl_path: PathBuf,
    pub wait_timeout: Duration,
    /// How long past `wait_timeout` a helm process is killed.
    pub kill_margin: Duration,
    /// Further daemon environment variables helm receives (besides `PATH`,
    /// `HOME`, `KUBECONFIG` and `HELM_*`).
    pub pass_env: Vec<String>,
    /// Variables set for helm with these values.
    pub env: BTreeMap<String, String>,
}

/// `[database]`: the connection pool and the per-connection timeouts of a
/// Postgres store (SQLite, one file on one host, takes only
/// [`Self::call_timeout`]). Every bound is checked at load
/// ([`Validator::database`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseSettings {
    /// Most connections in this process's pool.
    pub max_connections: u32,
    /// How long a call waits for a pooled connection.
    pub acquire_timeout: Duration,
    /// Client-side bound on one lease, listing or snapshot call, however
    /// the database behaves (a hung server answers no server-side timeout).
    pub call_timeout: Duration,
    /// Server side, per connection: the longest one statement may run.
    pub statement_timeout: Duration,
    /// Server side, per connection: the longest one statement waits for a
    /// lock (a standby waiting on the lease row, say).
    pub lock_timeout: Duration,
    /// Server side, per connection: a session idle inside a transaction
    /// this long is ended, releasing its locks (a process paused inside a
    /// fenced transaction holds the lease row until then).
    pub idle_in_transaction_session_timeout: Duration,
}

/// Most connections `database.max_connections` allows.
pub const DATABASE_CONNECTIONS_MAX: u32 = 1000;
/// The shortest of the database timeouts, in milliseconds.
pub const DATABASE_TIMEOUT_MS_MIN: u64 = 100;
/// The longest statement, acquire or call timeout, in milliseconds.
pub const DATABASE_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// A paused process's session must end before its lease does: a fenced
/// write starts only while its grant is trusted for [`LEASE_MARGIN`] more,
/// so a session ended within that margin frees the lease row by the time
/// the lease expires, and a standby is never held past it.
pub const IDLE_IN_TRANSACTION_MS_MAX: u64 = LEASE_MARGIN.as_millis() as u64;
const _: () = assert!(DATABASE_TIMEOUT_MS_MIN <= IDLE_IN_TRANSACTION_MS_MAX);
/// The longest call timeout: above the longest statement or acquire wait.
pub const CALL_TIMEOUT_MS_MAX: u64 = 2 * DATABASE_TIMEOUT_MS_MAX;
/// Unset, the call timeout is at least this much longer than the longest
/// server-side or pool wait it covers.
const CALL_TIMEOUT_SLACK_MS: i64 = 30_000;

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            idle_in_transaction_session_timeout: LEASE_MARGIN,
        }
    }
}

/// The validated daemon configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Where the file came from (`None`: defaults only).
    pub source: Option<PathBuf>,
    /// Start even when the catalog would damage live instances (`stead run
    /// --force-catalog`, as `stead reload --force`): set by the command
    /// line only, never by the file.
    pub force_catalog: bool,
    pub state_dir: PathBuf,
    pub database_url: String,
    /// `[database]`: pool sizes and timeouts.
    pub database: DatabaseSettings,
    pub catalog: PathBuf,
    /// `None` turns the admin endpoints off (`admin_listen = ""`).
    pub admin_listen: Option<SocketAddr>,
    /// The file holding the bearer token the admin endpoints that show or
    /// change the fleet require (the status page, `/status`, `/catalog`,
    /// `POST /reload`); required when `admin_listen` is beyond loopback.
    /// Read when the daemon starts and by the CLI when it asks the daemon
    /// ([`crate::config::admin_token::AdminToken::read`]), never at load,
    /// so a CLI user who cannot read it can still run every other command.
    pub admin_token_file: Option<PathBuf>,
    /// Host names the admin endpoints answer to besides their own address
    /// and `localhost` (`daemon::listener`): the names a scraper or an
    /// operator's browser reaches them by.
    pub admin_hosts: Vec<String>,
    pub log_format: LogFormat,
    pub workers: u32,
    pub worker_idle_poll: Duration,
    pub shutdown_grace: Duration,
    pub docker_events: bool,
    pub control: ControlConfig,
    pub recovery: RecoveryPolicy,
    pub docker: DockerSettings,
    pub caddy: CaddySettings,
    pub helm: HelmSettings,
    /// What the catalog may give a container: host paths to bind-mount,
    /// secret directories, daemon variables. Every catalog load checks
    /// against these (`config::load_catalog`); they carry [`Self::limits`].
    pub grants: Grants,
    /// What every container gets unless the catalog says otherwise, and
    /// the most memory the catalog may give one.
    pub limits: ContainerLimits,
    /// The event log (#42).
    pub events: EventSettings,
    /// Where events are delivered as they are logged (#42); none unless
    /// configured.
    pub webhooks: Vec<WebhookSettings>,
    /// Where traces are exported (#42); off unless configured.
    pub telemetry: TelemetrySettings,
    /// The flight recorder (#44); off unless enabled.
    pub flight_recorder: FlightRecorderSettings,
    /// The tenant API's listener and the teams' quotas (#54).
    pub tenancy: TenancySettings,
}

/// The `[flight_recorder]` table: every instance pass recorded for
/// `stead replay`, a bounded ring of lines per instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightRecorderSettings {
    pub enabled: bool,
    /// The most passes one instance's file holds; when it is full the
    /// older half is dropped.
    pub passes_per_instance: usize,
    /// Where the files are (`<instance>.jsonl`); `<state_dir>/flight`
    /// unless configured.
    pub dir: PathBuf,
}

/// The `[telemetry]` table: the daemon's spans exported over OTLP/HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP traces URL (`http://host:4318/v1/traces`);
    /// `None` (the default) builds no exporter at all.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute of every span.
    pub service_name: String,
    /// The bound on one export request, connecting included.
    pub export_timeout: Duration,
}

/// One `[[webhooks]]` entry: where events of which kinds are posted, and
/// how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSettings {
    /// A DNS label, unique among the webhooks: it keys the delivery
    /// cursor in the database and labels the metrics and logs.
    pub name: String,
    /// An `http://` or `https://` URL, posted to.
    pub url: String,
    /// The file holding the HMAC-SHA256 key that signs every body; read
    /// when the daemon starts, never written in `stead.toml`. Unsigned
    /// without.
    pub secret_file: Option<PathBuf>,
    /// The kinds delivered, in [`EventKind::ALL`] order, none twice.
    pub kinds: Vec<EventKind>,
    /// Only events about instances of these teams; empty: every event
    /// (#54: a team's own receiver).
    pub teams: Vec<String>,
    pub format: WebhookFormat,
    /// The bound on one request, connecting included.
    pub timeout: Duration,
}

impl DaemonConfig {
    /// How long webhook delivery waits for a missing event id before it
    /// passes it: the longest a store call may hold the transaction that
    /// drew it, and a margin (`core::webhook`).
    pub fn event_gap_grace(&self) -> Duration {
        self.database.call_timeout + EVENT_GAP_MARGIN
    }
}

/// The `[events]` table: how long the event log keeps what it records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSettings {
    /// Events older than this are pruned by the leader's ticks.
    pub retention: Duration,
}

/// Why the daemon configuration was rejected. Every error says where the
/// bad value came from (`origin`): the file and, when known, its line
/// (`stead.toml: line 3`), or the environment variable that overrode it
/// (`environment variable STEAD_WORKERS`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DaemonConfigError {
    /// The file could not be read: missing, not a regular file, too large,
    /// or not UTF-8.
    #[error("{file}: {reason}")]
    Read { file: String, reason: String },
    /// Not TOML, an unknown key, or a value of the wrong type; `message`
    /// names the key.
    #[error("{origin}: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: {field} = {value}: {reason}")]
    Invalid {
        origin: String,
        field: String,
        value: String,
        reason: String,
    },
}

/// A task lease too short for the helm call it covers: the settings and
/// the least lease that would do, in seconds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "control.lease_s ({lease_s}) must exceed helm.wait_timeout_s ({wait_timeout_s}) plus \
     helm.kill_margin_s ({kill_margin_s}) and {record_s} s to record the outcome, i.e. be at \
     least {least_s} s; raise control.lease_s or lower helm.wait_timeout_s"
)]
pub struct HelmLeaseTooShort {
    pub lease_s: u64,
    pub wait_timeout_s: u64,
    pub kill_margin_s: u64,
    pub record_s: u64,
    pub least_s: u64,
}

fn quote(value: impl std::fmt::Debug) -> String {
    let mut value = format!("{value:?}");
    if value.chars().count() > ERROR_VALUE_LEN_MAX {
        value = value.chars().take(ERROR_VALUE_LEN_MAX).collect::<String>() + "…";
    }
    value
}

/// Picks the config path: the flag, else `$STEAD_CONFIG`, else the default.
/// The boolean says whether it was asked for explicitly (then it must exist).
pub fn config_path(flag: Option<&Path>) -> (PathBuf, bool) {
    if let Some(path) = flag {
        return (path.to_owned(), true);
    }
    match std::env::var_os("STEAD_CONFIG") {
        Some(path) if !path.is_empty() => (PathBuf::from(path), true),
        _ => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    }
}

/// Reads the file (when it exists, or must), applies the process
/// environment's `STEAD_*` overrides and validates.
pub fn load(flag: Option<&Path>) -> Result<DaemonConfig, DaemonConfigError> {
    let (path, required) = config_path(flag);
    let env: Vec<(String, String)> = std::env::vars().collect();
    load_from(&path, required, &env)
}

/// [`load`] with the environment passed in, for tests. A relative
/// `catalog` is resolved against the config file's directory (or, when it
/// came from `STEAD_CATALOG` or there is no file, the working directory),
/// and made absolute, so every later message names the file stead reads.
pub fn load_from(
    path: &Path,
    required: bool,
    env: &[(String, String)],
) -> Result<DaemonConfig, DaemonConfigError> {
    let file = path.display().to_string();
    let contents = match crate::config::read_bounded(path, CONFIG_LEN_MAX) {
        Err(e) if e.is_not_found() && !required => None,
        Err(e) => {
            return Err(DaemonConfigError::Read {
                file,
                reason: e.to_string(),
            })
        }
        Ok(text) => Some(text),
    };
    let mut config = parse(contents.as_deref().unwrap_or(""), &file, env)?;
    let catalog_from_env = env.iter().any(|(k, _)| *k == env_name("catalog"));
    let base = match (&contents, catalog_from_env) {
        (Some(_), false) => path.parent().map(Path::to_owned).unwrap_or_default(),
        _ => PathBuf::new(),
    };
    config.catalog = std::path::absolute(base.join(&config.catalog)).map_err(|e| {
        DaemonConfigError::Invalid {
            origin: file.clone(),
            field: "catalog".into(),
            value: quote(&config.catalog),
            reason: format!("cannot be made absolute: {e}"),
        }
    })?;
    config.source = contents.map(|_| path.to_owned());
    Ok(config)
}

/// Parses `contents` (a TOML document), applies `env` overrides and
/// validates. `file` labels errors only.
///
/// Types and unknown keys are checked against the text first, so an error
/// points at its line and names its key; then each environment override is
/// checked alone, so an error names its variable.
pub fn parse(
    contents: &str,
    file: &str,
    env: &[(String, String)],
) -> Result<DaemonConfig, DaemonConfigError> {
    let in_file = |e: toml::de::Error| DaemonConfigError::Syntax {
        origin: file.to_owned(),
        message: toml_error::describe(&e, contents),
    };
    let mut doc: toml::Table = toml::from_str(contents).map_err(in_file)?;
    toml::from_str::<RawConfig>(contents).map_err(in_file)?;
    let overridden = apply_env(&mut doc, env)?;
    let helm_configured = doc.contains_key("helm");
    let raw: RawConfig = toml::Value::Table(doc)
        .try_into()
        .map_err(|e: toml::de::Error| DaemonConfigError::Syntax {
            // Each part was checked above; a failure of the whole would be
            // a bug, reported rather than hidden.
            origin: file.to_owned(),
            message: toml_error::message(&e, ""),
        })?;
    let validator = Validator {
        file,
        contents,
        overridden,
    };
    // The tenant API's keys and quotas are read apart from the rest (one
    // room per reader, `tests/rooms.rs`).
    let tenancy = validator.tenancy(&raw)?;
    let mut config = validator.config(raw)?;
    config.tenancy = tenancy;
    // A task's lease must outlive the helm call it covers, or a slow
    // `upgrade --wait` is handed to a second worker mid-flight and left
    // pending-upgrade. Checked here when helm is configured, and by the
    // daemon whenever its catalog has a Helm type.
    if helm_configured {
        if let Err(reason) = config.check_helm_timeouts() {
            return Err(validator.invalid(
                "control.lease_s",
                config.control.lease.as_secs(),
                reason.to_string(),
            ));
        }
    }
    Ok(config)
}

impl DaemonConfig {
    /// Whether the task lease outlives a whole helm call: helm's wait, the
    /// kill margin, and the time to record the outcome. The error names
    /// both settings.
    pub fn check_helm_timeouts(&self) -> Result<(), HelmLeaseTooShort> {
        let bound = self.helm.wait_timeout + self.helm.kill_margin + TASK_LEASE_SAFETY_MARGIN;
        if self.control.lease > bound {
            return Ok(());
        }
        Err(HelmLeaseTooShort {
            lease_s: self.control.lease.as_secs(),
            wait_timeout_s: self.helm.wait_timeout.as_secs(),
            kill_margin_s: self.helm.kill_margin.as_secs(),
            record_s: TASK_LEASE_SAFETY_MARGIN.as_secs(),
            least_s: bound.as_secs() + 1,
        })
    }
}

/// `sqlite::memory:`, `sqlite://:memory:`, `sqlite:foo?mode=memory` and
/// the like: a database that lives and dies with one connection.
fn is_in_memory_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:") && (url.contains(":memory:") || url.contains("mode=memory"))
}

pub use crate::core::release::DOCKER_RELEASE_NAMESPACE;

/// Sets each known key found in the environment, and returns which keys
/// were set, by variable name. A value that reads as a TOML value (a
/// number, a boolean, an array) is taken as one, anything else as a string,
/// so `STEAD_CADDY__ADMIN=127.0.0.1:2019` needs no quotes. A value of the
/// wrong type is an error naming the variable.
fn apply_env(
    doc: &mut toml::Table,
    env: &[(String, String)],
) -> Result<BTreeMap<&'static str, String>, DaemonConfigError> {
    let mut overridden = BTreeMap::new();
    for key in KEYS {
        let name = env_name(key);
        let Some((_, raw)) = env.iter().find(|(k, _)| *k == name) else {
            continue;
        };
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let mut alone = toml::Table::new();
        set_key(&mut alone, key, value.clone());
        if let Err(e) = toml::Value::Table(alone).try_into::<RawConfig>() {
            return Err(DaemonConfigError::Syntax {
                origin: format!("environment variable {name}"),
                message: format!("{key}: {}", e.message()),
            });
        }
        set_key(doc, key, value);
        overridden.insert(*key, name);
    }
    Ok(overridden)
}

/// Whether `url` reads as an `https://` URL with a host (the config module
/// builds without an HTTP client, so this is checked by hand).
fn is_https_url(url: &str) -> bool {
    url.strip_prefix("https://").is_some_and(|rest| {
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !url.chars().any(|c| c.is_whitespace() || c.is_control())
    })
}

/// Sets dotted `key` in `doc`, making (or replacing) tables on the way.
fn set_key(doc: &mut toml::Table, key: &str, value: toml::Value) {
    let mut table = doc;
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().expect("keys are non-empty");
    for part in parts {
        let entry = table
            .entry(part.to_owned())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        if !entry.is_table() {
            *entry = toml::Value::Table(Default::default());
        }
        table = entry.as_table_mut().expect("made a table above");
    }
    table.insert(leaf.to_owned(), value);
}

// --- the file format ---------------------------------------------------------
//
// Numbers are i64 so a negative value reaches the validator, which names it.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    state_dir: Option<String>,
    database_url: Option<String>,
    catalog: Option<String>,
    /// Removed (read only to say where it went).
    provisioner: Option<String>,
    admin_listen: Option<String>,
    admin_token_file: Option<String>,
    admin_hosts: Option<Vec<String>>,
    api_listen: Option<String>,
    #[serde(default)]
    api_hosts: Vec<String>,
    api_max_connections: Option<i64>,
    api_requests_per_minute: Option<i64>,
    #[serde(default)]
    teams: BTreeMap<String, tenancy::RawTeam>,
    log_format: Option<String>,
    workers: Option<i64>,
    worker_idle_poll_ms: Option<i64>,
    shutdown_grace_s: Option<i64>,
    docker_events: Option<bool>,
    control: Option<RawControlConfig>,
    #[serde(default)]
    recovery: RawRecovery,
    #[serde(default)]
    docker: RawDocker,
    #[serde(default)]
    caddy: RawCaddy,
    #[serde(default)]
    helm: RawHelm,
    #[serde(default)]
    grants: RawGrants,
    #[serde(default)]
    limits: RawLimitsTable,
    #[serde(default)]
    events: RawEvents,
    #[serde(default)]
    database: RawDatabase,
    #[serde(default)]
    webhooks: Vec<RawWebhook>,
    #[serde(default)]
    telemetry: RawTelemetry,
    #[serde(default)]
    flight_recorder: RawFlightRecorder,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFlightRecorder {
    enabled: Option<bool>,
    passes_per_instance: Option<i64>,
    dir: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    name: Option<String>,
    url: Option<String>,
    secret_file: Option<String>,
    kinds: Option<Vec<String>>,
    teams: Option<Vec<String>>,
    format: Option<String>,
    timeout_ms: Option<i64>,
}

/// Why a webhook URL is refused.
#[derive(Debug, thiserror::Error)]
enum WebhookUrlError {
    #[error("is too long (at most {WEBHOOK_URL_LEN_MAX} bytes)")]
    TooLong,
    #[error("must not contain spaces or control characters")]
    Spaces,
    #[error("must be an http:// or https:// URL")]
    Scheme,
    #[error("must name a host, as in https://alerts.example/stead")]
    NoHost,
}

/// A webhook URL must be `http://` or `https://`, name a host, hold no
/// space or control character, and be bounded.
fn check_webhook_url(url: &str) -> Result<(), WebhookUrlError> {
    if url.len() > WEBHOOK_URL_LEN_MAX {
        return Err(WebhookUrlError::TooLong);
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(WebhookUrlError::Spaces);
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or(WebhookUrlError::Scheme)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err(WebhookUrlError::NoHost);
    }
    Ok(())
}

/// A webhook URL as an error may quote it: its scheme and host, never
/// its user information, path or query (a token often travels there).
fn url_shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        let scheme: String = url
            .split(':')
            .next()
            .unwrap_or("")
            .chars()
            .take(16)
            .collect();
        return format!("{scheme}:…");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let tail = if rest.len() > host.len() { "/…" } else { "" };
    format!("{scheme}://{host}{tail}")
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    otlp_endpoint: Option<String>,
    service_name: Option<String>,
    export_timeout_ms: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEvents {
    retention_days: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDatabase {
    max_connections: Option<i64>,
    acquire_timeout_ms: Option<i64>,
    call_timeout_ms: Option<i64>,
    statement_timeout_ms: Option<i64>,
    lock_timeout_ms: Option<i64>,
    idle_in_transaction_session_timeout_ms: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimitsTable {
    memory_default_mb: Option<i64>,
    memory_max_mb: Option<i64>,
    pids_limit: Option<i64>,
    log_max_size_mb: Option<i64>,
    log_max_files: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    #[serde(default)]
    host_path_prefixes: Vec<String>,
    #[serde(default)]
    secret_dirs: Vec<String>,
    #[serde(default)]
    env_passthrough: Vec<String>,
    #[serde(default)]
    networks: Vec<String>,
    #[serde(default)]
    capabilities: Vec<String>,
    #[serde(default)]
    helm_charts: Vec<String>,
    helm_namespace_prefix: Option<String>,
    helm_pod_security: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRecovery {
    free_attempts: Option<i64>,
    delays_s: Option<Vec<i64>>,
    stable_window_s: Option<i64>,
    unhealthy_threshold: Option<i64>,
    instance_deadline_s: Option<i64>,
    instances_at_once: Option<i64>,
    stop_grace_default_ms: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDocker {
    socket: Option<String>,
    request_timeout_s: Option<i64>,
    restart_policy: Option<String>,
    cap_drop: Option<Vec<String>>,
    isolation: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCaddy {
    admin: Option<String>,
    listen: Option<String>,
    server_name: Option<String>,
    host_suffix: Option<String>,
    request_timeout_s: Option<i64>,
    watch_interval_ms: Option<i64>,
    #[serde(default)]
    tls: RawTls,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTls {
    mode: Option<String>,
    listen: Option<String>,
    domain: Option<String>,
    email: Option<String>,
    acme_ca: Option<String>,
    hsts_max_age_s: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHelm {
    path: Option<String>,
    /// Removed (read only to say where they went).
    chart: Option<String>,
    namespace: Option<String>,
    wait_timeout_s: Option<i64>,
    kill_margin_s: Option<i64>,
    pass_env: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    kubectl_path: Option<String>,
}

struct Validator<'a> {
    file: &'a str,
    contents: &'a str,
    /// Keys set from the environment, with the variable that set each.
    overridden: BTreeMap<&'static str, String>,
}

impl Validator<'_> {
    fn invalid(
        &self,
        field: &str,
        value: impl std::fmt::Debug,
        reason: impl Into<String>,
    ) -> DaemonConfigError {
        self.invalid_quoted(field, quote(value), reason.into())
    }

    fn invalid_quoted(&self, field: &str, value: String, reason: String) -> DaemonConfigError {
        DaemonConfigError::Invalid {
            origin: self.origin(field),
            field: field.to_owned(),
            value,
            reason,
        }
    }

    /// Where `field` (`recovery.delays_s[1]`) was set: by its environment
    /// variable, on a line of the file, or nowhere (a default; then the
    /// file, whose other values made the default wrong).
    fn origin(&self, field: &str) -> String {
        let key = field.split('[').next().unwrap_or(field);
        if let Some(name) = self.overridden.get(key) {
            return format!("environment variable {name}");
        }
        match toml_error::line_of(self.contents, field) {
            Some(line) => format!("{}: line {line}", self.file),
            None => self.file.to_owned(),
        }
    }

    /// The `[control]` table, validated by [`ControlConfig::from_raw`]
    /// (one set of rules), its errors named as the file names the keys.
    fn control(&self, raw: Option<RawControlConfig>) -> Result<ControlConfig, DaemonConfigError> {
        ControlConfig::from_raw(raw.unwrap_or_default()).map_err(|e| match e {
            ConfigError::Invalid {
                field,
                value,
                reason,
            } => self.invalid_quoted(&format!("control.{field}"), value, reason),
            other => DaemonConfigError::Syntax {
                origin: self.file.to_owned(),
                message: format!("[control]: {other}"),
            },
        })
    }

    fn int(
        &self,
        field: &str,
        value: Option<i64>,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<u64, DaemonConfigError> {
        let v = value.unwrap_or(default);
        if v < min || v > max {
            return Err(self.invalid(field, v, format!("must be between {min} and {max}")));
        }
        Ok(v as u64)
    }

    fn secs(
        &self,
        field: &str,
        value: Option<i64>,
        default: Duration,
        min: i64,
        max: i64,
    ) -> Result<Duration, DaemonConfigError> {
        self.int(field, value, default.as_secs() as i64, min, max)
            .map(Duration::from_secs)
    }

    fn text(
        &self,
        field: &str,
        value: Option<String>,
        default: &str,
    ) -> Result<String, DaemonConfigError> {
        let v = value.unwrap_or_else(|| default.to_owned());
        if v.is_empty() || v.len() > 1024 || v.chars().any(char::is_control) {
            return Err(self.invalid(field, &v, "must be 1 to 1024 printable characters"));
        }
        Ok(v)
    }

    fn addr(&self, field: &str, value: &str) -> Result<SocketAddr, DaemonConfigError> {
        value
            .parse::<SocketAddr>()
            .map_err(|_| self.invalid(field, value, "must be an IP:port such as 127.0.0.1:9464"))
    }

    fn config(&self, raw: RawConfig) -> Result<DaemonConfig, DaemonConfigError> {
        let control = self.control(raw.control)?;
        let state_dir = PathBuf::from(self.text("state_dir", raw.state_dir, DEFAULT_STATE_DIR)?);
        if !state_dir.is_absolute() {
            return Err(self.invalid("state_dir", &state_dir, "must be an absolute path"));
        }
        let database_url = match raw.database_url {
            None => format!("sqlite://{}?mode=rwc", state_dir.join("stead.db").display()),
            Some(url) => {
                if is_in_memory_sqlite(&url) {
                    // Named, not echoed: the URL is never quoted back.
                    return Err(self.invalid(
                        "database_url",
                        "sqlite (in memory)",
                        "an in-memory SQLite database is lost when stead exits, and each \
                         pooled connection would see its own: name a file, e.g. \
                         sqlite:///var/lib/stead/stead.db?mode=rwc",
                    ));
                }
                if crate::store::Backend::of_url(&url).is_err() {
                    // Never echo a URL back: it may carry a password.
                    let scheme: String = url
                        .split(':')
                        .next()
                        .unwrap_or("")
                        .chars()
                        .take(16)
                        .collect();
                    return Err(self.invalid(
                        "database_url",
                        format!("{scheme}:…"),
                        "must start with sqlite: or postgres://",
                    ));
                }
                url
            }
        };
        let catalog = PathBuf::from(self.text("catalog", raw.catalog, DEFAULT_CATALOG_PATH)?);
        if let Some(word) = &raw.provisioner {
            return Err(self.invalid(
                "provisioner",
                word,
                "is now chosen per service type: write provisioner = \"docker\" or \"helm\" \
                 in the catalog's [types.<name>] and remove it here",
            ));
        }
        let (admin_listen, admin_token_file, admin_hosts) =
            self.admin_endpoints(raw.admin_listen, raw.admin_token_file, raw.admin_hosts)?;
        let log_format = match raw.log_format.as_deref() {
            None => LogFormat::Text,
            Some(word) => LogFormat::parse(word)
                .ok_or_else(|| self.invalid("log_format", word, "must be \"text\" or \"json\""))?,
        };
        let workers = self.int("workers", raw.workers, 2, 0, WORKERS_MAX as i64)? as u32;
        let worker_idle_poll = Duration::from_millis(self.int(
            "worker_idle_poll_ms",
            raw.worker_idle_poll_ms,
            1000,
            10,
            60_000,
        )?);
        let shutdown_grace = self.secs(
            "shutdown_grace_s",
            raw.shutdown_grace_s,
            Duration::from_secs(30),
            1,
            SHUTDOWN_GRACE_MAX.as_secs() as i64,
        )?;
        let limits = self.limits(raw.limits)?;
        let flight_recorder = self.flight_recorder(raw.flight_recorder, &state_dir)?;
        Ok(DaemonConfig {
            source: None,
            force_catalog: false,
            state_dir,
            database_url,
            database: self.database(raw.database)?,
            catalog,
            admin_listen,
            admin_token_file,
            admin_hosts,
            log_format,
            workers,
            worker_idle_poll,
            shutdown_grace,
            docker_events: raw.docker_events.unwrap_or(true),
            control,
            recovery: self.recovery(raw.recovery)?,
            docker: self.docker(raw.docker)?,
            caddy: self.caddy(raw.caddy)?,
            helm: self.helm(raw.helm)?,
            grants: self.grants(&raw.grants)?.with_limits(limits.clone()),
            limits,
            events: self.events(raw.events)?,
            webhooks: self.webhooks(raw.webhooks)?,
            telemetry: self.telemetry(raw.telemetry)?,
            flight_recorder,
            tenancy: TenancySettings::default(), // Set by `parse`.
        })
    }

    /// `[flight_recorder]`: off by default; a bound within its limits and
    /// an absolute directory.
    fn flight_recorder(
        &self,
        raw: RawFlightRecorder,
        state_dir: &std::path::Path,
    ) -> Result<FlightRecorderSettings, DaemonConfigError> {
        let passes_per_instance = self.int(
            "flight_recorder.passes_per_instance",
            raw.passes_per_instance,
            FLIGHT_PASSES_DEFAULT,
            FLIGHT_PASSES_MIN,
            FLIGHT_PASSES_MAX,
        )? as usize;
        let dir = match raw.dir {
            None => state_dir.join("flight"),
            Some(dir) => {
                let dir = PathBuf::from(self.text("flight_recorder.dir", Some(dir), "")?);
                if !dir.is_absolute() {
                    return Err(self.invalid(
                        "flight_recorder.dir",
                        &dir,
                        "must be an absolute path",
                    ));
                }
                dir
            }
        };
        Ok(FlightRecorderSettings {
            enabled: raw.enabled.unwrap_or(false),
            passes_per_instance,
            dir,
        })
    }

    /// `[telemetry]`: an http(s) endpoint (as a webhook's URL is checked;
    /// an empty one is off, so `STEAD_TELEMETRY__OTLP_ENDPOINT=` turns a
    /// file's endpoint off), a printable service name, a bounded timeout.
    fn telemetry(&self, raw: RawTelemetry) -> Result<TelemetrySettings, DaemonConfigError> {
        let otlp_endpoint = match raw.otlp_endpoint {
            None => None,
            Some(url) if url.is_empty() => None,
            Some(url) => {
                check_webhook_url(&url).map_err(|reason| {
                    self.invalid_quoted(
                        "telemetry.otlp_endpoint",
                        quote(url_shown(&url)),
                        reason.to_string(),
                    )
                })?;
                Some(url)
            }
        };
        let service_name = self.text(
            "telemetry.service_name",
            raw.service_name,
            TELEMETRY_SERVICE_NAME_DEFAULT,
        )?;
        let export_timeout = Duration::from_millis(self.int(
            "telemetry.export_timeout_ms",
            raw.export_timeout_ms,
            TELEMETRY_EXPORT_TIMEOUT_MS_DEFAULT,
            TELEMETRY_EXPORT_TIMEOUT_MS_MIN,
            TELEMETRY_EXPORT_TIMEOUT_MS_MAX,
        )?);
        Ok(TelemetrySettings {
            otlp_endpoint,
            service_name,
            export_timeout,
        })
    }

    /// `[[webhooks]]`: at most [`WEBHOOKS_MAX`], each named uniquely, with
    /// an http(s) URL and known kinds.
    fn webhooks(&self, raw: Vec<RawWebhook>) -> Result<Vec<WebhookSettings>, DaemonConfigError> {
        if raw.len() > WEBHOOKS_MAX {
            return Err(self.invalid_quoted(
                "webhooks",
                format!("{} entries", raw.len()),
                format!("at most {WEBHOOKS_MAX} webhooks"),
            ));
        }
        let mut webhooks: Vec<WebhookSettings> = Vec::with_capacity(raw.len());
        for (n, raw) in raw.into_iter().enumerate() {
            let webhook = self.webhook(n, raw)?;
            if webhooks.iter().any(|w| w.name == webhook.name) {
                return Err(self.invalid(
                    &format!("webhooks[{n}].name"),
                    &webhook.name,
                    "names another webhook too; each webhook's name is its own",
                ));
            }
            webhooks.push(webhook);
        }
        Ok(webhooks)
    }

    fn webhook(&self, n: usize, raw: RawWebhook) -> Result<WebhookSettings, DaemonConfigError> {
        let field = |key: &str| format!("webhooks[{n}].{key}");
        let name = raw.name.ok_or_else(|| {
            self.invalid_quoted(&field("name"), "nothing".into(), "is required".into())
        })?;
        crate::core::names::check_dns_label(&field("name"), &name)
            .map_err(|e| self.invalid_quoted(&e.field, quote(&e.value), e.rule.to_string()))?;
        let url = raw.url.ok_or_else(|| {
            self.invalid_quoted(&field("url"), "nothing".into(), "is required".into())
        })?;
        check_webhook_url(&url).map_err(|reason| {
            self.invalid_quoted(&field("url"), quote(url_shown(&url)), reason.to_string())
        })?;
        let secret_file = match raw.secret_file {
            None => None,
            Some(path) => {
                let path = PathBuf::from(self.text(&field("secret_file"), Some(path), "")?);
                if !path.is_absolute() {
                    return Err(self.invalid(
                        &field("secret_file"),
                        &path,
                        "must be an absolute path",
                    ));
                }
                Some(path)
            }
        };
        let kinds = match raw.kinds {
            None => DEFAULT_KINDS.to_vec(),
            Some(words) => self.webhook_kinds(&field("kinds"), &words)?,
        };
        let teams = raw.teams.unwrap_or_default();
        for (i, team) in teams.iter().enumerate() {
            if crate::core::names::check_dns_label("team", team).is_err() {
                return Err(self.invalid(
                    &field(&format!("teams[{i}]")),
                    team,
                    "must be a team's name (a DNS label)",
                ));
            }
        }
        let format = match raw.format.as_deref() {
            None => WebhookFormat::Stead,
            Some(word) => WebhookFormat::parse(word).ok_or_else(|| {
                self.invalid(
                    &field("format"),
                    word,
                    "must be \"stead\" or \"alertmanager\"",
                )
            })?,
        };
        let timeout = Duration::from_millis(self.int(
            &field("timeout_ms"),
            raw.timeout_ms,
            WEBHOOK_TIMEOUT_MS_DEFAULT as i64,
            WEBHOOK_TIMEOUT_MS_MIN as i64,
            WEBHOOK_TIMEOUT_MS_MAX as i64,
        )?);
        Ok(WebhookSettings {
            name,
            url,
            secret_file,
            kinds,
            teams,
            format,
            timeout,
        })
    }

    /// A webhook's `kinds`: at least one, each a stable event kind name.
    fn webhook_kinds(
        &self,
        field: &str,
        words: &[String],
    ) -> Result<Vec<EventKind>, DaemonConfigError> {
        if words.is_empty() {
            return Err(self.invalid(field, words, "must name at least one event kind"));
        }
        let mut kinds = Vec::with_capacity(words.len());
        for (i, word) in words.iter().enumerate() {
            let kind = EventKind::parse(word).map_err(|_| {
                let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                self.invalid(
                    &format!("{field}[{i}]"),
                    word,
                    format!("is not an event kind ({})", known.join(", ")),
                )
            })?;
            kinds.push(kind);
        }
        kinds.sort_unstable();
        kinds.dedup();
        Ok(kinds)
    }

    /// `admin_token_file`: an absolute path, and required when the admin
    /// endpoints listen beyond loopback, where anyone who reaches the port
    /// would otherwise read the fleet and reload the catalog.
    fn admin_token_file(
        &self,
        admin_listen: Option<SocketAddr>,
        raw: Option<String>,
    ) -> Result<Option<PathBuf>, DaemonConfigError> {
        let file = match raw {
            None => None,
            Some(path) => {
                let path = PathBuf::from(self.text("admin_token_file", Some(path), "")?);
                if !path.is_absolute() {
                    return Err(self.invalid(
                        "admin_token_file",
                        &path,
                        "must be an absolute path",
                    ));
                }
                Some(path)
            }
        };
        match admin_listen {
            Some(addr) if !addr.ip().is_loopback() && file.is_none() => Err(self.invalid(
                "admin_listen",
                addr.to_string(),
                "is beyond loopback, and admin_token_file is not set: set admin_token_file to a \
                 file holding the bearer token the status page, /status, /catalog and POST \
                 /reload then require (/metrics, /healthz and /readyz stay open), or listen on \
                 127.0.0.1",
            )),
            _ => Ok(file),
        }
    }

    /// `[events]`: the retention, in whole days within its bounds.
    fn events(&self, raw: RawEvents) -> Result<EventSettings, DaemonConfigError> {
        const DAY_S: u64 = 24 * 3600;
        let days = self.int(
            "events.retention_days",
            raw.retention_days,
            EVENT_RETENTION_DAYS_DEFAULT,
            EVENT_RETENTION_DAYS_MIN,
            EVENT_RETENTION_DAYS_MAX,
        )?;
        Ok(EventSettings {
            retention: Duration::from_secs(days * DAY_S),
        })
    }

    /// `[limits]`, validated by [`ContainerLimits::new`] (one set of
    /// rules), its errors named as the file names the keys.
    fn limits(&self, raw: RawLimitsTable) -> Result<ContainerLimits, DaemonConfigError> {
        let raw = RawLimits {
            memory_default_mb: raw.memory_default_mb,
            memory_max_mb: raw.memory_max_mb,
            pids_limit: raw.pids_limit,
            log_max_size_mb: raw.log_max_size_mb,
            log_max_files: raw.log_max_files,
        };
        ContainerLimits::new(&raw)
            .map_err(|e| self.invalid_quoted(&format!("limits.{}", e.field), e.value, e.reason))
    }

    /// `admin_listen`, `admin_token_file` (required beyond loopback) and
    /// `admin_hosts`.
    #[allow(clippy::type_complexity)]
    fn admin_endpoints(
        &self,
        listen: Option<String>,
        token_file: Option<String>,
        hosts: Option<Vec<String>>,
    ) -> Result<(Option<SocketAddr>, Option<PathBuf>, Vec<String>), DaemonConfigError> {
        let listen = match listen.as_deref().unwrap_or(DEFAULT_ADMIN_LISTEN) {
            "" => None,
            addr => Some(self.addr("admin_listen", addr)?),
        };
        let token_file = self.admin_token_file(listen, token_file)?;
        let hosts = self.listener_hosts("admin_hosts", hosts)?;
        Ok((listen, token_file, hosts))
    }

    /// The extra host names of a listener (`admin_hosts`): DNS names or IP
    /// addresses, at most [`LISTENER_HOSTS_MAX`].
    fn listener_hosts(
        &self,
        key: &str,
        raw: Option<Vec<String>>,
    ) -> Result<Vec<String>, DaemonConfigError> {
        let raw = raw.unwrap_or_default();
        if raw.len() > LISTENER_HOSTS_MAX {
            return Err(self.invalid(
                key,
                raw.len(),
                format!("at most {LISTENER_HOSTS_MAX} host names"),
            ));
        }
        for (i, host) in raw.iter().enumerate() {
            let is_ip = host.parse::<std::net::IpAddr>().is_ok();
            if !is_ip && crate::core::names::check_dns_name(key, host).is_err() {
                return Err(self.invalid(
                    &format!("{key}[{i}]"),
                    host,
                    "must be a DNS name or an IP address, without a port or a scheme",
                ));
            }
        }
        Ok(raw)
    }

    /// `[grants]`, validated by [`Grants::new`] (one set of rules), its
    /// errors named as the file names the keys.
    fn grants(&self, raw: &RawGrants) -> Result<Grants, DaemonConfigError> {
        let pod_security = self.pod_security(raw.helm_pod_security.as_deref())?;
        let grants = Grants::new(
            &raw.host_path_prefixes,
            &raw.secret_dirs,
            &raw.env_passthrough,
        )
        .and_then(|grants| grants.with_networks(&raw.networks))
        .and_then(|grants| grants.with_capabilities(&raw.capabilities))
        .and_then(|grants| grants.with_helm(&raw.helm_charts, raw.helm_namespace_prefix.as_deref()))
        .map_err(|e| self.invalid_quoted(&format!("grants.{}", e.field), e.value, e.reason))?;
        Ok(grants.with_helm_pod_security(pod_security))
    }

    /// `grants.helm_pod_security`: the Pod Security Standard the
    /// namespaces of Helm releases enforce, `restricted` unless granted
    /// otherwise.
    fn pod_security(&self, raw: Option<&str>) -> Result<PodSecurity, DaemonConfigError> {
        let Some(word) = raw else {
            return Ok(PodSecurity::default());
        };
        PodSecurity::parse(word).ok_or_else(|| {
            self.invalid(
                "grants.helm_pod_security",
                word,
                "must be \"restricted\", \"baseline\" or \"privileged\"",
            )
        })
    }

    /// `[database]`: each value in its range, and the relations that keep
    /// the timeouts meaningful (a lock wait within a statement, a call
    /// longer than what it waits for on the server).
    fn database(&self, raw: RawDatabase) -> Result<DatabaseSettings, DaemonConfigError> {
        let d = DatabaseSettings::default();
        let ms = |d: Duration| d.as_millis() as i64;
        let (min, max) = (
            DATABASE_TIMEOUT_MS_MIN as i64,
            DATABASE_TIMEOUT_MS_MAX as i64,
        );
        let max_connections = self.int(
            "database.max_connections",
            raw.max_connections,
            d.max_connections.into(),
            1,
            DATABASE_CONNECTIONS_MAX.into(),
        )? as u32;
        let acquire_timeout_ms = self.int(
            "database.acquire_timeout_ms",
            raw.acquire_timeout_ms,
            ms(d.acquire_timeout),
            min,
            max,
        )?;
        let statement_timeout_ms = self.int(
            "database.statement_timeout_ms",
            raw.statement_timeout_ms,
            ms(d.statement_timeout),
            min,
            max,
        )?;
        // Unset, the lock wait and the call follow a changed statement
        // timeout instead of contradicting it.
        let lock_timeout_ms = self.bounded_by(
            "database.lock_timeout_ms",
            raw.lock_timeout_ms,
            ms(d.lock_timeout).min(statement_timeout_ms as i64),
            ("database.statement_timeout_ms", statement_timeout_ms),
        )?;
        let idle_field = "database.idle_in_transaction_session_timeout_ms";
        let idle_in_transaction_ms = raw
            .idle_in_transaction_session_timeout_ms
            .unwrap_or(ms(d.idle_in_transaction_session_timeout));
        if !(min..=IDLE_IN_TRANSACTION_MS_MAX as i64).contains(&idle_in_transaction_ms) {
            return Err(self.invalid(
                idle_field,
                idle_in_transaction_ms,
                format!(
                    "must be between {min} and {IDLE_IN_TRANSACTION_MS_MAX} (the reconciler \
                     lease's margin): a process paused inside a transaction keeps the lease row \
                     locked until the server ends its session, which must come before its lease \
                     runs out"
                ),
            ));
        }
        let waited_ms = statement_timeout_ms.max(acquire_timeout_ms);
        let call_timeout_ms = raw
            .call_timeout_ms
            .unwrap_or(ms(d.call_timeout).max(waited_ms as i64 + CALL_TIMEOUT_SLACK_MS));
        if call_timeout_ms <= waited_ms as i64 || call_timeout_ms > CALL_TIMEOUT_MS_MAX as i64 {
            return Err(self.invalid(
                "database.call_timeout_ms",
                call_timeout_ms,
                format!(
                    "must exceed database.statement_timeout_ms ({statement_timeout_ms}) and \
                     database.acquire_timeout_ms ({acquire_timeout_ms}), so a live server's own \
                     timeout answers first, and be at most {CALL_TIMEOUT_MS_MAX}"
                ),
            ));
        }
        let call_timeout_ms = call_timeout_ms as u64;
        let idle_in_transaction_ms = idle_in_transaction_ms as u64;
        Ok(DatabaseSettings {
            max_connections,
            acquire_timeout: Duration::from_millis(acquire_timeout_ms),
            call_timeout: Duration::from_millis(call_timeout_ms),
            statement_timeout: Duration::from_millis(statement_timeout_ms),
            lock_timeout: Duration::from_millis(lock_timeout_ms),
            idle_in_transaction_session_timeout: Duration::from_millis(idle_in_transaction_ms),
        })
    }

    /// A millisecond value from [`DATABASE_TIMEOUT_MS_MIN`] up to another
    /// setting's value, the error naming both.
    fn bounded_by(
        &self,
        field: &str,
        value: Option<i64>,
        default: i64,
        (bound_field, bound_ms): (&str, u64),
    ) -> Result<u64, DaemonConfigError> {
        let v = value.unwrap_or(default);
        let min = DATABASE_TIMEOUT_MS_MIN as i64;
        if v < min || v as u64 > bound_ms {
            return Err(self.invalid(
                field,
                v,
                format!("must be between {min} and {bound_field} ({bound_ms})"),
            ));
        }
        Ok(v as u64)
    }

    fn recovery(&self, raw: RawRecovery) -> Result<RecoveryPolicy, DaemonConfigError> {
        let d = RecoveryPolicy::default();
        let day = 24 * 3600;
        let delays = match raw.delays_s {
            None => d.delays.clone(),
            Some(list) => {
                let mut delays = Vec::with_capacity(list.len());
                for (i, s) in list.iter().enumerate() {
                    delays.push(Duration::from_secs(self.int(
                        &format!("recovery.delays_s[{i}]"),
                        Some(*s),
                        0,
                        1,
                        day,
                    )?));
                }
                delays
            }
        };
        let policy = RecoveryPolicy {
            free_attempts: self.int(
                "recovery.free_attempts",
                raw.free_attempts,
                d.free_attempts as i64,
                1,
                100,
            )? as u32,
            delays,
            stable_window: self.secs(
                "recovery.stable_window_s",
                raw.stable_window_s,
                d.stable_window,
                1,
                day,
            )?,
            unhealthy_threshold: self.int(
                "recovery.unhealthy_threshold",
                raw.unhealthy_threshold,
                d.unhealthy_threshold as i64,
                1,
                100,
            )? as u32,
            instance_deadline: self.secs(
                "recovery.instance_deadline_s",
                raw.instance_deadline_s,
                d.instance_deadline,
                1,
                day,
            )?,
            instances_at_once: self.int(
                "recovery.instances_at_once",
                raw.instances_at_once,
                d.instances_at_once as i64,
                1,
                INSTANCES_AT_ONCE_MAX as i64,
            )? as usize,
            stop_grace_default: Duration::from_millis(self.int(
                "recovery.stop_grace_default_ms",
                raw.stop_grace_default_ms,
                d.stop_grace_default.as_millis() as i64,
                0,
                3_600_000,
            )?),
            broken: Default::default(),
        };
        policy
            .validated()
            .map_err(|e| self.invalid(&format!("recovery.{}", e.field), e.value, e.reason))
    }

    fn docker(&self, raw: RawDocker) -> Result<DockerSettings, DaemonConfigError> {
        let socket =
            PathBuf::from(self.text("docker.socket", raw.socket, DEFAULT_DOCKER_SOCKET)?);
        if !socket.is_absolute() {
            return Err(self.invalid("docker.socket", &socket, "must be an absolute path"));
        }
        let restart_unless_stopped = match raw.restart_policy.as_deref().unwrap_or("no") {
            "no" => false,
            "unless-stopped" => true,
            other => {
                return Err(self.invalid(
                    "docker.restart_policy",
                    other,
                    "must be \"no\" or \"unless-stopped\"",
                ))
            }
        };
        Ok(DockerSettings {
            socket,
            request_timeout: self.secs(
                "docker.request_timeout_s",
                raw.request_timeout_s,
                Duration::from_secs(30),
                1,
                600,
            )?,
            restart_unless_stopped,
            cap_drop: self.cap_drop(raw.cap_drop)?,
            isolation: match raw.isolation.as_deref().unwrap_or("shared") {
                "shared" => Isolation::Shared,
                "off" => Isolation::Off,
                other => {
                    return Err(self.invalid(
                        "docker.isolation",
                        other,
                        "must be \"shared\" (lone services on one network with inter-container \
                         traffic off) or \"off\" (the engine's default network: no walls \
                         between instances)",
                    ))
                }
            },
        })
    }

    /// `docker.cap_drop`: capability names in the runtime's spelling, or
    /// `ALL`; `NET_RAW` when absent.
    fn cap_drop(&self, raw: Option<Vec<String>>) -> Result<Vec<String>, DaemonConfigError> {
        let Some(raw) = raw else {
            return Ok(CAP_DROP_DEFAULT.iter().map(|c| (*c).to_owned()).collect());
        };
        if raw.len() > GRANT_ENTRIES_MAX {
            return Err(self.invalid(
                "docker.cap_drop",
                raw.len(),
                format!("at most {GRANT_ENTRIES_MAX} capabilities"),
            ));
        }
        for (i, name) in raw.iter().enumerate() {
            if name != "ALL" && !is_capability_name(name) {
                return Err(self.invalid(
                    &format!("docker.cap_drop[{i}]"),
                    name,
                    "must be ALL or a capability's name as the runtime takes it (e.g. NET_RAW, \
                     no CAP_ prefix)",
                ));
            }
        }
        Ok(raw)
    }

    fn caddy(&self, raw: RawCaddy) -> Result<CaddySettings, DaemonConfigError> {
        let admin = self.text("caddy.admin", raw.admin, DEFAULT_CADDY_ADMIN)?;
        // Caddy's own spelling of a unix socket (`admin.listen`), which
        // only its file permissions guard: the safe way (#54).
        match admin.strip_prefix("unix/") {
            Some(path) => {
                if !(path.starts_with('/') && Path::new(path).is_absolute() && path.len() > 1) {
                    return Err(self.invalid(
                        "caddy.admin",
                        &admin,
                        "a unix socket is written unix//absolute/path (e.g. \
                         unix//run/stead/caddy-admin.sock)",
                    ));
                }
            }
            None => {
                self.addr("caddy.admin", &admin)?;
            }
        }
        let listen = self.text("caddy.listen", raw.listen, DEFAULT_CADDY_LISTEN)?;
        self.addr("caddy.listen", &listen)?;
        let server_name = self.text("caddy.server_name", raw.server_name, "stead")?;
        let host_suffix = self.text("caddy.host_suffix", raw.host_suffix, "localhost")?;
        let dns = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        };
        if !dns(&server_name) {
            return Err(self.invalid(
                "caddy.server_name",
                &server_name,
                "must be letters, digits, '-', '_' and '.'",
            ));
        }
        if !dns(&host_suffix) {
            return Err(self.invalid("caddy.host_suffix", &host_suffix, "must be a DNS name"));
        }
        let tls = self.tls(raw.tls, &listen)?;
        Ok(CaddySettings {
            admin,
            listen,
            server_name,
            host_suffix,
            request_timeout: self.secs(
                "caddy.request_timeout_s",
                raw.request_timeout_s,
                Duration::from_secs(10),
                1,
                600,
            )?,
            watch_interval: Duration::from_millis(self.int(
                "caddy.watch_interval_ms",
                raw.watch_interval_ms,
                2_000,
                CADDY_WATCH_INTERVAL_MS_MIN,
                CADDY_WATCH_INTERVAL_MS_MAX,
            )?),
            tls,
        })
    }

    /// `[caddy.tls]`: every value checked, whatever the mode; ACME's keys
    /// refused in another mode, where they would silently mean nothing.
    fn tls(&self, raw: RawTls, http_listen: &str) -> Result<TlsSettings, DaemonConfigError> {
        let mode = match raw.mode.as_deref().unwrap_or("off") {
            "off" => TlsMode::Off,
            "acme" => TlsMode::Acme,
            "internal" => TlsMode::Internal,
            other => {
                return Err(self.invalid(
                    "caddy.tls.mode",
                    other,
                    "must be \"off\", \"acme\" or \"internal\"",
                ))
            }
        };
        let listen = self.text("caddy.tls.listen", raw.listen, DEFAULT_CADDY_TLS_LISTEN)?;
        let https = self.addr("caddy.tls.listen", &listen)?;
        let same_port =
            http_listen.parse::<SocketAddr>().ok().map(|a| a.port()) == Some(https.port());
        if mode != TlsMode::Off && same_port {
            return Err(self.invalid(
                "caddy.tls.listen",
                &listen,
                format!("must be another port than caddy.listen ({http_listen}): one server is HTTP, the other HTTPS"),
            ));
        }
        let domain = match raw.domain {
            None => None,
            Some(domain) => {
                crate::core::names::check_dns_name("caddy.tls.domain", &domain)
                    .map_err(|e| self.invalid("caddy.tls.domain", &domain, e.rule.to_string()))?;
                Some(domain)
            }
        };
        for (field, value) in [
            ("caddy.tls.email", &raw.email),
            ("caddy.tls.acme_ca", &raw.acme_ca),
        ] {
            if let Some(value) = value.as_ref().filter(|_| mode != TlsMode::Acme) {
                return Err(self.invalid(
                    field,
                    value,
                    "is read only with caddy.tls.mode = \"acme\"",
                ));
            }
        }
        if let Some(email) = &raw.email {
            let valid = email.len() <= 254
                && email.split_once('@').is_some_and(|(user, host)| {
                    !user.is_empty() && crate::core::names::check_dns_name("", host).is_ok()
                })
                && !email.chars().any(|c| c.is_whitespace() || c.is_control());
            if !valid {
                return Err(self.invalid(
                    "caddy.tls.email",
                    email,
                    "must be an email address such as ops@example.com",
                ));
            }
        }
        if let Some(ca) = &raw.acme_ca {
            let valid = is_https_url(ca);
            if !valid {
                return Err(self.invalid(
                    "caddy.tls.acme_ca",
                    ca,
                    "must be an https:// URL of an ACME directory",
                ));
            }
        }
        let hsts_s = self.int(
            "caddy.tls.hsts_max_age_s",
            raw.hsts_max_age_s,
            0,
            0,
            HSTS_MAX_AGE_S_MAX,
        )?;
        Ok(TlsSettings {
            mode,
            listen,
            domain,
            email: raw.email,
            acme_ca: raw.acme_ca,
            hsts_max_age: (hsts_s > 0).then(|| Duration::from_secs(hsts_s)),
        })
    }

    fn helm(&self, raw: RawHelm) -> Result<HelmSettings, DaemonConfigError> {
        for (field, value) in [
            ("helm.chart", &raw.chart),
            ("helm.namespace", &raw.namespace),
        ] {
            if let Some(value) = value {
                return Err(self.invalid(
                    field,
                    value,
                    "is now set per service type: write it in the catalog's \
                     [types.<name>.helm] and remove it here",
                ));
            }
        }
        let env_name_ok = |name: &str| {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        };
        let pass_env = raw.pass_env.unwrap_or_default();
        for (i, name) in pass_env.iter().enumerate() {
            if !env_name_ok(name) {
                return Err(self.invalid(
                    &format!("helm.pass_env[{i}]"),
                    name,
                    "must be an environment variable name (A-Z, a-z, 0-9, _)",
                ));
            }
        }
        let env = raw.env.unwrap_or_default();
        for name in env.keys() {
            if !env_name_ok(name) {
                return Err(self.invalid(
                    &format!("helm.env.{name}"),
                    name,
                    "must be an environment variable name (A-Z, a-z, 0-9, _)",
                ));
            }
        }
        Ok(HelmSettings {
            path: PathBuf::from(self.text("helm.path", raw.path, "helm")?),
            kubectl_path: PathBuf::from(self.text(
                "helm.kubectl_path",
                raw.kubectl_path,
                "kubectl",
            )?),
            pass_env,
            env,
            kill_margin: self.secs(
                "helm.kill_margin_s",
                raw.kill_margin_s,
                HELM_KILL_MARGIN,
                1,
                600,
            )?,
            wait_timeout: self.secs(
                "helm.wait_timeout_s",
                raw.wait_timeout_s,
                Duration::from_secs(300),
                1,
                12 * 3600,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_err(doc: &str, env: &[(&str, &str)], expect: &str) {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let error = parse(doc, "stead.toml", &env)
            .expect_err("must be rejected")
            .to_string();
        assert!(
            error.contains(expect),
            "{error:?} should contain {expect:?}"
        );
    }

    #[test]
    fn defaults_work_on_one_machine() {
        let config = parse("", "stead.toml", &[]).unwrap();
        assert_eq!(
            config.database_url,
            "sqlite:///var/lib/stead/stead.db?mode=rwc"
        );
        assert_eq!(config.caddy.admin, "127.0.0.1:2019");
        assert_eq!(config.admin_listen.unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(config.docker.socket, PathBuf::from("/var/run/docker.sock"));
        assert_eq!(config.helm.wait_timeout, Duration::from_secs(300));
        assert!(
            config.control.lease
                > config.helm.wait_timeout + config.helm.kill_margin + TASK_LEASE_SAFETY_MARGIN
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = vec![
            ("STEAD_CONTROL__TICK_INTERVAL_S".to_owned(), "5".to_owned()),
            ("STEAD_CADDY__ADMIN".to_owned(), "127.0.0.1:2999".to_owned()),
            ("STEAD_STATE_DIR".to_owned(), "/tmp/x".to_owned()),
        ];
        let config = parse("[control]\ntick_interval_s = 60\n", "f", &env).unwrap();
        assert_eq!(config.control.tick_interval, Duration::from_secs(5));
        assert_eq!(config.caddy.admin, "127.0.0.1:2999");
        assert_eq!(config.database_url, "sqlite:///tmp/x/stead.db?mode=rwc");
    }

    #[test]
    fn bad_values_name_field_and_value() {
        check_err("provisioner = \"k8s\"", &[], "provisioner = \"k8s\"");
        check_err("workers = -1", &[], "workers = -1");
        check_err(
            "[caddy]\nadmin = \"nowhere\"",
            &[],
            "caddy.admin = \"nowhere\"",
        );
        check_err(
            "[recovery]\ndelays_s = [60, 0]",
            &[],
            "recovery.delays_s[1] = 0",
        );
        check_err("[recovery]\ndelays_s = [120, 60]", &[], "recovery.delays");
        check_err(
            "[control]\nlease_s = 10\nprovisioner_timeout_s = 20",
            &[],
            "lease_s",
        );
        check_err("typo = 1", &[], "unknown field `typo`");
        check_err("", &[("STEAD_LOG_FORMAT", "xml")], "log_format = \"xml\"");
        check_err("database_url = \"mysql://u:secret@h/db\"", &[], "mysql:…");
        check_err(
            "[caddy]\nadmin = \"unix/relative.sock\"",
            &[],
            "caddy.admin = \"unix/relative.sock\"",
        );
        check_err(
            "admin_hosts = [\"http://evil.example\"]",
            &[],
            "admin_hosts[0] = \"http://evil.example\"",
        );
        check_err(
            "[docker]\nisolation = \"none\"",
            &[],
            "docker.isolation = \"none\"",
        );
        check_err(
            "[docker]\ncap_drop = [\"NET_RAW\", \"cap_sys_admin\"]",
            &[],
            "docker.cap_drop[1] = \"cap_sys_admin\"",
        );
        check_err(
            "[grants]\nnetworks = [\"stead.other\"]",
            &[],
            "grants.networks[0] = \"stead.other\"",
        );
        check_err(
            "[grants]\ncapabilities = [\"CAP_NET_RAW\"]",
            &[],
            "grants.capabilities[0] = \"CAP_NET_RAW\"",
        );
    }

    #[test]
    fn containers_drop_net_raw_and_lone_services_are_walled_by_default() {
        let config = parse("", "stead.toml", &[]).unwrap();
        assert_eq!(config.docker.cap_drop, vec!["NET_RAW".to_owned()]);
        assert_eq!(config.docker.isolation, Isolation::Shared);
        let config = parse(
            "[docker]\ncap_drop = [\"ALL\"]\nisolation = \"off\"\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert_eq!(config.docker.cap_drop, vec!["ALL".to_owned()]);
        assert_eq!(config.docker.isolation, Isolation::Off);
    }

    /// A lone carriage return is explained, not reported as a blank (found
    /// by the `config` fuzz target, `fuzz/regressions/config/lone-carriage-return`,
    /// when toml 0.8 gave it no message; `toml_error::message` still covers
    /// a blank one).
    #[test]
    fn a_lone_carriage_return_is_explained() {
        let error = parse("\r", "stead.toml", &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            "stead.toml: line 1, column 2: carriage return must be followed by newline, expected newline"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key_and_line() {
        check_err(
            "state_dir = \"/x\"\nworkers = \"x\"\n",
            &[],
            "stead.toml: line 2, column 11: workers: invalid type: string \"x\", expected i64",
        );
        check_err(
            "[recovery]\ndelays_s = [60, \"2m\"]\n",
            &[],
            "stead.toml: line 2, column 17: recovery.delays_s[1]: invalid type: string",
        );
        check_err(
            "[control]\ntick_interval_s = true\n",
            &[],
            "stead.toml: line 2, column 19: control.tick_interval_s: invalid type: boolean",
        );
        check_err(
            "[caddy]\nadmn = \"x\"\n",
            &[],
            "stead.toml: line 2, column 1: caddy.admn: unknown field `admn`",
        );
    }

    #[test]
    fn an_invalid_value_names_the_line_it_is_on() {
        check_err(
            "# a comment\n\nworkers = 1000\n",
            &[],
            "stead.toml: line 3: workers = 1000: must be between 0 and 64",
        );
        check_err(
            "[control]\nlease_s = 10\nprovisioner_timeout_s = 20\n",
            &[],
            "stead.toml: line 2: control.lease_s = 10s: must exceed provisioner_timeout_s",
        );
    }

    #[test]
    fn an_environment_override_names_its_variable_not_the_file() {
        check_err(
            "workers = 2\n",
            &[("STEAD_WORKERS", "abc")],
            "environment variable STEAD_WORKERS: workers: invalid type: string \"abc\", expected i64",
        );
        check_err(
            "workers = 2\n",
            &[("STEAD_WORKERS", "1000")],
            "environment variable STEAD_WORKERS: workers = 1000: must be between 0 and 64",
        );
        check_err(
            "",
            &[("STEAD_RECOVERY__DELAYS_S", "[60, 0]")],
            "environment variable STEAD_RECOVERY__DELAYS_S: recovery.delays_s[1] = 0",
        );
    }

    #[test]
    fn an_in_memory_sqlite_database_is_refused() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite:x.db?mode=memory",
        ] {
            check_err(
                &format!("database_url = \"{url}\"\n"),
                &[],
                "stead.toml: line 1: database_url = \"sqlite (in memory)\": an in-memory SQLite",
            );
        }
    }

    #[test]
    fn a_relative_catalog_is_resolved_against_the_config_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stead.toml");
        std::fs::write(&path, "catalog = \"types/catalog.toml\"\n").unwrap();
        let config = load_from(&path, true, &[]).unwrap();
        assert_eq!(config.catalog, dir.path().join("types/catalog.toml"));
        // From the environment it is relative to the working directory,
        // like any path on a command line.
        let env = vec![(env_name("catalog"), "here.toml".to_owned())];
        let config = load_from(&path, true, &env).unwrap();
        assert_eq!(
            config.catalog,
            std::env::current_dir().unwrap().join("here.toml")
        );
    }

    #[test]
    fn a_device_as_config_file_is_refused_without_reading_it() {
        let e = load_from(Path::new("/dev/zero"), true, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: is a character device, not a regular file; stead reads its \
             configuration from regular files only"
        );
    }

    #[test]
    fn a_database_password_is_never_echoed() {
        let e = parse("database_url = \"mysql://u:secret@h/db\"", "f", &[]).unwrap_err();
        assert!(!e.to_string().contains("secret"));
    }

    #[test]
    fn an_admin_listener_beyond_loopback_needs_a_token_file() {
        let e = parse("admin_listen = \"0.0.0.0:9464\"\n", "stead.toml", &[]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(
                "stead.toml: line 1: admin_listen = \"0.0.0.0:9464\": is beyond loopback"
            ),
            "{text}"
        );
        assert!(text.contains("set admin_token_file"), "{text}");
        let env = vec![(env_name("admin_listen"), "[::]:9464".to_owned())];
        let text = parse("", "f", &env).unwrap_err().to_string();
        assert!(text.contains("STEAD_ADMIN_LISTEN"), "{text}");
        let guarded = parse(
            "admin_listen = \"0.0.0.0:9464\"\nadmin_token_file = \"/etc/stead/admin.token\"\n",
            "f",
            &[],
        )
        .unwrap();
        assert_eq!(
            guarded.admin_token_file.as_deref(),
            Some(Path::new("/etc/stead/admin.token"))
        );
        for loopback in ["127.0.0.1:9464", "[::1]:9464", ""] {
            let doc = format!("admin_listen = \"{loopback}\"\n");
            let config = parse(&doc, "f", &[]).unwrap_or_else(|e| panic!("{loopback}: {e}"));
            assert_eq!(config.admin_token_file, None);
        }
        let e = parse("admin_token_file = \"token\"\n", "stead.toml", &[]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "stead.toml: line 1: admin_token_file = \"token\": must be an absolute path"
            ),
            "{e}"
        );
    }

    #[test]
    fn https_is_off_by_default_and_read_from_caddy_tls() {
        let defaults = parse("", "f", &[]).unwrap();
        assert_eq!(defaults.caddy.tls.mode, TlsMode::Off);
        assert_eq!(defaults.caddy.watch_interval, Duration::from_secs(2));
        let config = parse(
            "[caddy.tls]\nmode = \"acme\"\nlisten = \"0.0.0.0:8443\"\ndomain = \"apps.example.com\"\n\
             email = \"ops@example.com\"\nacme_ca = \"https://ca.internal/acme/directory\"\nhsts_max_age_s = 300\n",
            "f",
            &[],
        )
        .unwrap();
        let tls = config.caddy.tls;
        assert_eq!(tls.mode, TlsMode::Acme);
        assert_eq!(tls.listen, "0.0.0.0:8443");
        assert_eq!(tls.domain.as_deref(), Some("apps.example.com"));
        assert_eq!(tls.email.as_deref(), Some("ops@example.com"));
        assert_eq!(tls.hsts_max_age, Some(Duration::from_secs(300)));
        let internal = parse(
            "",
            "f",
            &[("STEAD_CADDY__TLS__MODE".into(), "internal".into())],
        )
        .unwrap();
        assert_eq!(internal.caddy.tls.mode, TlsMode::Internal);
    }

    #[test]
    fn a_bad_https_setting_is_refused_naming_its_key_and_value() {
        for (doc, expect) in [
            ("[caddy.tls]\nmode = \"on\"", "caddy.tls.mode = \"on\""),
            ("[caddy.tls]\nmode = \"internal\"\nlisten = \"443\"", "caddy.tls.listen = \"443\""),
            (
                "[caddy]\nlisten = \"127.0.0.1:8443\"\n[caddy.tls]\nmode = \"internal\"\nlisten = \"127.0.0.1:8443\"",
                "caddy.tls.listen = \"127.0.0.1:8443\": must be another port than caddy.listen",
            ),
            ("[caddy.tls]\ndomain = \"Apps.example.com\"", "caddy.tls.domain = \"Apps.example.com\""),
            ("[caddy.tls]\ndomain = \"*.example.com\"", "caddy.tls.domain = \"*.example.com\""),
            ("[caddy.tls]\nmode = \"internal\"\nemail = \"a@b.c\"", "caddy.tls.email = \"a@b.c\": is read only with"),
            ("[caddy.tls]\nmode = \"acme\"\nemail = \"nobody\"", "caddy.tls.email = \"nobody\""),
            ("[caddy.tls]\nmode = \"acme\"\nacme_ca = \"http://ca\"", "caddy.tls.acme_ca = \"http://ca\""),
            ("[caddy.tls]\nhsts_max_age_s = -1", "caddy.tls.hsts_max_age_s = -1"),
            ("[caddy]\nwatch_interval_ms = 10", "caddy.watch_interval_ms = 10"),
            ("[caddy.tls]\nmod = \"acme\"", "unknown field `mod`"),
        ] {
            check_err(doc, &[], expect);
        }
    }

    #[test]
    fn every_key_is_documented_in_the_operations_guide() {
        let guide = include_str!("../../docs/operations.md");
        for key in KEYS {
            assert!(
                guide.contains(&format!("| `{key}` |")),
                "docs/operations.md lacks {key}"
            );
        }
    }

    #[test]
    fn the_event_retention_is_read_in_days_and_refused_out_of_bounds_naming_field_and_value() {
        let defaults = parse("", "f", &[]).unwrap();
        assert_eq!(
            defaults.events.retention,
            Duration::from_secs(14 * 24 * 3600)
        );
        let set = parse("[events]\nretention_days = 2\n", "f", &[]).unwrap();
        assert_eq!(set.events.retention, Duration::from_secs(2 * 24 * 3600));
        let e = parse("[events]\nretention_days = 0\n", "stead.toml", &[]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("events.retention_days = 0") && text.contains("between 1 and 3650"),
            "{text}"
        );
        let env = vec![(env_name("events.retention_days"), "99999".to_owned())];
        let text = parse("", "f", &env).unwrap_err().to_string();
        assert!(
            text.contains("STEAD_EVENTS__RETENTION_DAYS") && text.contains("99999"),
            "{text}"
        );
    }

    #[test]
    fn every_key_can_be_set_from_the_environment() {
        // Each documented key is a real field: setting it must not be
        // rejected as unknown (values may still be out of range).
        for key in KEYS {
            let env = vec![(env_name(key), "1".to_owned())];
            if let Err(e) = parse("", "f", &env) {
                assert!(!e.to_string().contains("unknown field"), "{key}: {e}");
            }
        }
    }

    #[test]
    fn settings_that_moved_to_the_catalog_are_refused_saying_where_they_went() {
        let e = parse("[control]\nnamespace = \"prod\"\n", "stead.toml", &[]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "stead.toml: line 2: control.namespace = \"prod\": is no longer a setting"
            ),
            "{e}"
        );
        let e = parse("provisioner = \"helm\"\n", "stead.toml", &[]).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("stead.toml: line 1: provisioner = \"helm\""),
            "{e}"
        );
        assert!(e.contains("in the catalog's [types.<name>]"), "{e}");
        for key in ["chart", "namespace"] {
            let doc = format!("[helm]\n{key} = \"x\"\n");
            let e = parse(&doc, "stead.toml", &[]).unwrap_err().to_string();
            assert!(e.contains(&format!("helm.{key} = \"x\"")), "{e}");
            assert!(e.contains("[types.<name>.helm]"), "{e}");
        }
    }

    #[test]
    fn a_task_lease_shorter_than_a_helm_call_is_refused_naming_both_settings() {
        let e = parse(
            "[control]\nlease_s = 300\n[helm]\nwait_timeout_s = 300\n",
            "stead.toml",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "stead.toml: line 2: control.lease_s = 300: control.lease_s (300) must exceed"
            ),
            "{e}"
        );
        assert!(e.contains("helm.wait_timeout_s (300)"), "{e}");
        assert!(e.contains("helm.kill_margin_s (30)"), "{e}");
        assert!(e.contains("at least 336 s"), "{e}");
        // Within the bound, either way round.
        parse("[control]\nlease_s = 336\n[helm]\n", "stead.toml", &[]).unwrap();
        // A Docker-only config (no [helm] table) keeps its short lease; the
        // daemon checks again once its catalog has a Helm type.
        let docker_only = parse(
            "[control]\nlease_s = 10\nprovisioner_timeout_s = 5\n",
            "f",
            &[],
        )
        .unwrap();
        assert!(docker_only
            .check_helm_timeouts()
            .unwrap_err()
            .to_string()
            .contains("helm.wait_timeout_s (300)"));
        let short = "[helm]\nwait_timeout_s = 2\nkill_margin_s = 1\n[control]\nlease_s = 10\nprovisioner_timeout_s = 5\n";
        parse(short, "f", &[]).unwrap();
        let env = vec![(env_name("helm.wait_timeout_s"), "900".to_owned())];
        let e = parse("", "stead.toml", &env).unwrap_err().to_string();
        assert!(e.contains("helm.wait_timeout_s (900)"), "{e}");
    }

    #[test]
    fn helm_grants_are_read_from_the_file_and_bad_entries_are_named() {
        let config = parse(
            "[grants]\nhelm_charts = [\"oci://registry.example/charts/\"]\n\
             helm_namespace_prefix = \"tenant-\"\nhelm_pod_security = \"baseline\"\n\
             [helm]\nkubectl_path = \"/usr/local/bin/kubectl\"\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert!(config
            .grants
            .allows_helm_chart("oci://registry.example/charts/search"));
        assert_eq!(config.grants.helm_namespace_prefix(), Some("tenant-"));
        assert_eq!(config.grants.helm_pod_security(), PodSecurity::Baseline);
        assert_eq!(
            config.helm.kubectl_path,
            PathBuf::from("/usr/local/bin/kubectl")
        );
        let defaults = parse("", "stead.toml", &[]).unwrap();
        assert_eq!(defaults.grants.helm_pod_security(), PodSecurity::Restricted);
        assert_eq!(defaults.helm.kubectl_path, PathBuf::from("kubectl"));
        for (doc, expect) in [
            (
                "[grants]\nhelm_charts = [\"ok/\", \"/\"]\nhelm_namespace_prefix = \"t-\"\n",
                "stead.toml: line 2: grants.helm_charts[1] = \"/\": must name a repository",
            ),
            (
                "[grants]\nhelm_charts = [\"charts/../x/\"]\nhelm_namespace_prefix = \"t-\"\n",
                "stead.toml: line 2: grants.helm_charts[0] = \"charts/../x/\": must have no '.'",
            ),
            (
                "[grants]\nhelm_charts = [\"ok/\"]\n",
                "grants.helm_namespace_prefix = missing: required when helm_charts grants a chart",
            ),
            (
                "[grants]\nhelm_charts = [\"ok/\"]\nhelm_namespace_prefix = \"Tenant-\"\n",
                "stead.toml: line 3: grants.helm_namespace_prefix = \"Tenant-\": must be the start \
                 of a DNS label",
            ),
            (
                "[grants]\nhelm_charts = [\"ok/\"]\nhelm_namespace_prefix = \"kube-\"\n",
                "grants.helm_namespace_prefix = \"kube-\": kube-* are Kubernetes' own namespaces",
            ),
            (
                "[grants]\nhelm_pod_security = \"none\"\n",
                "stead.toml: line 2: grants.helm_pod_security = \"none\": must be \"restricted\", \
                 \"baseline\" or \"privileged\"",
            ),
        ] {
            let e = parse(doc, "stead.toml", &[]).unwrap_err().to_string();
            assert!(e.contains(expect), "{doc}\n{e}");
        }
        let env = vec![(env_name("grants.helm_charts"), "[\"a/\"]".to_owned())];
        let e = parse("", "stead.toml", &env).unwrap_err().to_string();
        assert!(e.contains("grants.helm_namespace_prefix = missing"), "{e}");
    }

    #[test]
    fn nothing_is_granted_by_default_and_grants_are_read_from_the_file() {
        let none = parse("", "stead.toml", &[]).unwrap().grants;
        assert_eq!(none, Grants::default());
        let config = parse(
            "[grants]\nhost_path_prefixes = [\"/srv/stead\"]\nsecret_dirs = [\"/etc/stead/secrets\"]\n\
             env_passthrough = [\"NOTES_DB_PASSWORD\"]\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert!(config.grants.allows_host_path("/srv/stead/notes"));
        assert!(config.grants.allows_secret_file("/etc/stead/secrets/db"));
        assert!(config.grants.passes_env("NOTES_DB_PASSWORD"));
    }

    #[test]
    fn a_bad_grant_is_refused_naming_its_line_entry_and_value() {
        check_err(
            "[grants]\nhost_path_prefixes = [\"/\"]\n",
            &[],
            "stead.toml: line 2: grants.host_path_prefixes[0] = \"/\": must be an absolute directory other than /",
        );
        check_err(
            "[grants]\nsecret_dirs = [\"/etc/stead/../..\"]\n",
            &[],
            "grants.secret_dirs[0] = \"/etc/stead/../..\": must be an absolute directory",
        );
        check_err(
            "[grants]\nenv_passthrough = [\"A B\"]\n",
            &[],
            "grants.env_passthrough[0] = \"A B\": must be an environment variable's name",
        );
        check_err(
            &format!(
                "[grants]\nsecret_dirs = [{}]\n",
                vec!["\"/d\""; crate::core::grants::GRANT_ENTRIES_MAX + 1].join(", ")
            ),
            &[],
            &format!(
                "grants.secret_dirs = {}: at most {} entries",
                crate::core::grants::GRANT_ENTRIES_MAX + 1,
                crate::core::grants::GRANT_ENTRIES_MAX
            ),
        );
    }

    #[test]
    fn a_variable_stead_uses_cannot_be_granted_from_the_file_or_the_environment() {
        check_err(
            "[grants]\nenv_passthrough = [\"NOTES_DB_PASSWORD\", \"STEAD_DATABASE_URL\"]\n",
            &[],
            "stead.toml: line 2: grants.env_passthrough[1] = \"STEAD_DATABASE_URL\": is a variable stead itself uses",
        );
        check_err(
            "[grants]\nenv_passthrough = [\"KUBECONFIG\"]\n",
            &[],
            "grants.env_passthrough[0] = \"KUBECONFIG\": is a variable stead itself uses",
        );
        check_err(
            "",
            &[("STEAD_GRANTS__ENV_PASSTHROUGH", "[\"STEAD_DATABASE_URL\"]")],
            "environment variable STEAD_GRANTS__ENV_PASSTHROUGH: grants.env_passthrough[0] = \"STEAD_DATABASE_URL\"",
        );
    }

    #[test]
    fn limits_are_read_from_the_file_and_reach_the_grants() {
        let config = parse(
            "[limits]\nmemory_default_mb = 256\nmemory_max_mb = 2048\npids_limit = 100\n\
             log_max_size_mb = 5\nlog_max_files = 2\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert_eq!(config.limits.memory_bytes_default, 256 * 1024 * 1024);
        assert_eq!(config.limits.memory_bytes_max, 2048 * 1024 * 1024);
        assert_eq!(config.limits.pids_limit, 100);
        assert_eq!(
            (config.limits.log_max_size_mb, config.limits.log_max_files),
            (5, 2)
        );
        assert_eq!(config.grants.limits(), &config.limits);
        let unset = parse("", "stead.toml", &[]).unwrap();
        assert_eq!(unset.limits, ContainerLimits::default());
    }

    #[test]
    fn a_bad_limit_is_refused_naming_its_line_key_and_value() {
        check_err(
            "[limits]\npids_limit = 0\n",
            &[],
            "stead.toml: line 2: limits.pids_limit = 0: must be between 16 and 4194304",
        );
        check_err(
            "[limits]\nmemory_max_mb = 512\nmemory_default_mb = 1024\n",
            &[],
            "limits.memory_default_mb = 1024: must be between 6 and memory_max_mb (512)",
        );
        check_err(
            "",
            &[("STEAD_LIMITS__LOG_MAX_FILES", "0")],
            "environment variable STEAD_LIMITS__LOG_MAX_FILES: limits.log_max_files = 0",
        );
    }

    #[test]
    fn helm_environment_settings_are_names_and_values() {
        let config = parse(
            "[helm]\npass_env = [\"AWS_PROFILE\"]\nenv = { KUBECONFIG = \"/etc/k\" }\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert_eq!(config.helm.pass_env, ["AWS_PROFILE"]);
        assert_eq!(config.helm.env["KUBECONFIG"], "/etc/k");
        let e = parse("[helm]\npass_env = [\"A B\"]\n", "stead.toml", &[]).unwrap_err();
        assert!(e.to_string().contains("helm.pass_env[0] = \"A B\""), "{e}");
        let e = parse("[helm]\nenv = { \"1X\" = \"v\" }\n", "stead.toml", &[]).unwrap_err();
        assert!(e.to_string().contains("helm.env.1X"), "{e}");
    }

    #[test]
    fn database_settings_default_to_a_lease_safe_pool_and_are_read_from_the_file() {
        let defaults = parse("", "stead.toml", &[]).unwrap().database;
        assert_eq!(defaults, DatabaseSettings::default());
        assert!(defaults.idle_in_transaction_session_timeout <= LEASE_MARGIN);
        assert!(defaults.call_timeout > defaults.statement_timeout);
        let config = parse(
            "[database]\nmax_connections = 4\nacquire_timeout_ms = 2000\n\
             statement_timeout_ms = 90000\nlock_timeout_ms = 1500\n\
             idle_in_transaction_session_timeout_ms = 3000\n",
            "stead.toml",
            &[(
                "STEAD_DATABASE__CALL_TIMEOUT_MS".to_owned(),
                "95000".to_owned(),
            )],
        )
        .unwrap();
        assert_eq!(
            config.database,
            DatabaseSettings {
                max_connections: 4,
                acquire_timeout: Duration::from_secs(2),
                call_timeout: Duration::from_secs(95),
                statement_timeout: Duration::from_secs(90),
                lock_timeout: Duration::from_millis(1500),
                idle_in_transaction_session_timeout: Duration::from_secs(3),
            }
        );
        // Unset, the lock wait and the call follow a changed statement
        // timeout rather than contradict it.
        let short = parse("[database]\nstatement_timeout_ms = 1000\n", "f", &[]).unwrap();
        assert_eq!(short.database.lock_timeout, Duration::from_secs(1));
        let long = parse("[database]\nstatement_timeout_ms = 600000\n", "f", &[]).unwrap();
        assert!(long.database.call_timeout > long.database.statement_timeout);
    }

    #[test]
    fn a_bad_database_setting_is_refused_naming_its_line_key_and_value() {
        check_err(
            "[database]\nmax_connections = 0\n",
            &[],
            "stead.toml: line 2: database.max_connections = 0: must be between 1 and 1000",
        );
        check_err(
            "[database]\nstatement_timeout_ms = -5\n",
            &[],
            "database.statement_timeout_ms = -5: must be between 100 and 3600000",
        );
        check_err(
            "[database]\nstatement_timeout_ms = 2000\nlock_timeout_ms = 3000\n",
            &[],
            "stead.toml: line 3: database.lock_timeout_ms = 3000: must be between 100 and \
             database.statement_timeout_ms (2000)",
        );
        check_err(
            "[database]\nidle_in_transaction_session_timeout_ms = 60000\n",
            &[],
            "database.idle_in_transaction_session_timeout_ms = 60000: must be between 100 and \
             10000 (the reconciler lease's margin)",
        );
        check_err(
            "[database]\ncall_timeout_ms = 30000\n",
            &[],
            "database.call_timeout_ms = 30000: must exceed database.statement_timeout_ms (30000)",
        );
        check_err(
            "",
            &[("STEAD_DATABASE__ACQUIRE_TIMEOUT_MS", "0")],
            "environment variable STEAD_DATABASE__ACQUIRE_TIMEOUT_MS: \
             database.acquire_timeout_ms = 0",
        );
    }

    #[test]
    fn there_are_no_webhooks_by_default_and_an_entry_takes_its_defaults() {
        assert!(parse("", "f", &[]).unwrap().webhooks.is_empty());
        let config = parse(
            "[[webhooks]]\nname = \"ops\"\nurl = \"https://alerts.example/stead\"\n",
            "f",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.webhooks,
            [WebhookSettings {
                name: "ops".into(),
                url: "https://alerts.example/stead".into(),
                secret_file: None,
                kinds: DEFAULT_KINDS.to_vec(),
                teams: Vec::new(),
                format: WebhookFormat::Stead,
                timeout: Duration::from_millis(WEBHOOK_TIMEOUT_MS_DEFAULT),
            }]
        );
    }

    #[test]
    fn a_webhook_is_read_with_its_kinds_format_secret_file_and_timeout() {
        let config = parse(
            "[[webhooks]]\nname = \"pager\"\nurl = \"http://127.0.0.1:9000/hook\"\n\
             secret_file = \"/etc/stead/webhook.key\"\nkinds = [\"halt\", \"crash_loop_delay\", \"halt\"]\n\
             format = \"alertmanager\"\ntimeout_ms = 2500\n",
            "f",
            &[],
        )
        .unwrap();
        let hook = &config.webhooks[0];
        assert_eq!(hook.kinds, [EventKind::Halt, EventKind::CrashLoopDelay]);
        assert_eq!(hook.format, WebhookFormat::Alertmanager);
        assert_eq!(
            hook.secret_file.as_deref(),
            Some(Path::new("/etc/stead/webhook.key"))
        );
        assert_eq!(hook.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn the_flight_recorder_is_off_by_default_and_its_settings_are_checked() {
        let off = parse("state_dir = \"/s\"\n", "f", &[])
            .unwrap()
            .flight_recorder;
        assert!(!off.enabled);
        assert_eq!(off.passes_per_instance, FLIGHT_PASSES_DEFAULT as usize);
        assert_eq!(off.dir, PathBuf::from("/s/flight"));
        let on = parse(
            "[flight_recorder]\nenabled = true\npasses_per_instance = 10\ndir = \"/r\"\n",
            "f",
            &[],
        )
        .unwrap()
        .flight_recorder;
        assert!(on.enabled);
        assert_eq!((on.passes_per_instance, on.dir), (10, PathBuf::from("/r")));
        for (text, says) in [
            (
                "[flight_recorder]\npasses_per_instance = 1\n",
                "flight_recorder.passes_per_instance = 1: must be between 2 and 100000",
            ),
            (
                "[flight_recorder]\ndir = \"rel\"\n",
                "flight_recorder.dir = \"rel\": must be an absolute path",
            ),
        ] {
            let e = parse(text, "stead.toml", &[]).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn telemetry_is_off_unless_an_endpoint_is_configured() {
        let off = parse("", "f", &[]).unwrap().telemetry;
        assert_eq!(off.otlp_endpoint, None);
        assert_eq!(off.service_name, TELEMETRY_SERVICE_NAME_DEFAULT);
        let on = parse(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/v1/traces\"\n\
             service_name = \"stead-eu\"\nexport_timeout_ms = 2500\n",
            "f",
            &[],
        )
        .unwrap()
        .telemetry;
        assert_eq!(
            on.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(on.service_name, "stead-eu");
        assert_eq!(on.export_timeout, Duration::from_millis(2500));
        // An empty override turns a file's endpoint off.
        let env = [("STEAD_TELEMETRY__OTLP_ENDPOINT".to_owned(), String::new())];
        let overridden = parse(
            "[telemetry]\notlp_endpoint = \"http://c:4318\"\n",
            "f",
            &env,
        );
        assert_eq!(overridden.unwrap().telemetry.otlp_endpoint, None);
    }

    #[test]
    fn a_bad_telemetry_value_is_refused_naming_its_field_and_value() {
        for (doc, expect) in [
            (
                "[telemetry]\notlp_endpoint = \"collector:4318\"\n",
                "stead.toml: line 2: telemetry.otlp_endpoint = \"collector:…\": must be an http:// or https:// URL",
            ),
            (
                "[telemetry]\notlp_endpoint = \"http://\"\n",
                "telemetry.otlp_endpoint = \"http://\": must name a host",
            ),
            (
                "[telemetry]\nexport_timeout_ms = 0\n",
                "telemetry.export_timeout_ms = 0: must be between 100 and 60000",
            ),
            (
                "[telemetry]\nservice_name = \"\"\n",
                "telemetry.service_name = \"\": must be 1 to 1024 printable characters",
            ),
            ("[telemetry]\nendpoint = \"http://c:4318\"\n", "unknown field `endpoint`"),
        ] {
            let err = parse(doc, "stead.toml", &[]).unwrap_err().to_string();
            assert!(err.contains(expect), "{doc}: {err}");
        }
    }

    #[test]
    fn a_bad_webhook_value_is_refused_naming_its_field_and_value() {
        let hook = |body: &str| format!("[[webhooks]]\nname = \"ops\"\n{body}\n");
        for (doc, expect) in [
            (
                hook("url = \"ftp://files.example/x\""),
                "stead.toml: line 3: webhooks[0].url = \"ftp://files.example/…\": must be an http:// or https:// URL",
            ),
            (hook("url = \"https:///path\""), "webhooks[0].url = \"https:///…\": must name a host"),
            (
                hook("url = \"http://a.example\"\nkinds = [\"halt\", \"reboot\"]"),
                "webhooks[0].kinds[1] = \"reboot\": is not an event kind (start,",
            ),
            (
                hook("url = \"http://a.example\"\nkinds = []"),
                "webhooks[0].kinds = []: must name at least one event kind",
            ),
            (
                hook("url = \"http://a.example\"\nformat = \"slack\""),
                "webhooks[0].format = \"slack\": must be \"stead\" or \"alertmanager\"",
            ),
            (
                hook("url = \"http://a.example\"\ntimeout_ms = 0"),
                "webhooks[0].timeout_ms = 0: must be between 100 and 60000",
            ),
            (
                hook("url = \"http://a.example\"\nsecret_file = \"key\""),
                "webhooks[0].secret_file = \"key\": must be an absolute path",
            ),
            (hook(""), "webhooks[0].url = nothing: is required"),
            (
                "[[webhooks]]\nname = \"Ops!\"\nurl = \"http://a.example\"\n".to_owned(),
                "webhooks[0].name = \"Ops!\": must be a DNS label",
            ),
            (
                format!("{}{}", hook("url = \"http://a.example\""), hook("url = \"http://b.example\"")),
                "webhooks[1].name = \"ops\": names another webhook too",
            ),
            (hook("url = \"http://a.example\"\nsecret = \"hunter2\""), "unknown field `secret`"),
        ] {
            check_err(&doc, &[], expect);
        }
    }

    #[test]
    fn a_refused_webhook_url_never_quotes_its_path_or_credentials() {
        let doc = "[[webhooks]]\nname = \"ops\"\nurl = \"gopher://u:pw@h.example/T0K3N\"\n";
        let text = parse(doc, "f", &[]).unwrap_err().to_string();
        assert!(!text.contains("T0K3N") && !text.contains("pw"), "{text}");
        let doc = "[[webhooks]]\nname = \"ops\"\nurl = \"http://u:pw@h.example/T0K3N x\"\n";
        let text = parse(doc, "f", &[]).unwrap_err().to_string();
        assert!(!text.contains("T0K3N") && !text.contains("pw"), "{text}");
    }

    #[test]
    fn the_webhook_example_in_the_operations_guide_loads_as_shown() {
        let guide = include_str!("../../docs/operations.md");
        let start = guide
            .find("```toml\n# stead.toml\n[[webhooks]]")
            .expect("the guide shows a webhook");
        let block = &guide[start + "```toml\n".len()..];
        let block = &block[..block.find("```").unwrap()];
        let config = parse(block, "docs/operations.md", &[]).unwrap_or_else(|e| panic!("{e}"));
        let hook = &config.webhooks[0];
        assert_eq!(hook.kinds, DEFAULT_KINDS.to_vec(), "it lists the defaults");
        assert_eq!(
            hook.timeout,
            Duration::from_millis(WEBHOOK_TIMEOUT_MS_DEFAULT)
        );
    }

    #[test]
    fn every_webhook_key_is_documented_in_the_operations_guide() {
        let guide = include_str!("../../docs/operations.md");
        for key in WEBHOOK_KEYS {
            assert!(
                guide.contains(&format!("| `webhooks[].{key}` |")),
                "docs/operations.md lacks webhooks[].{key}"
            );
        }
    }
}
