//! The daemon's one configuration file (`stead.toml`), its `STEAD_*`
//! environment overrides, and validation at load. Every error names the
//! field (dotted, as in the file) and the offending value.
//!
//! It needs no adapter, so it builds without the `io` feature: the daemon
//! re-exports it as `daemon::config`, and the `config` fuzz target parses
//! arbitrary files with it.
//!
//! The `[control]` table is handed to [`ControlConfig::from_toml`] and the
//! `[recovery]` table becomes a [`RecoveryPolicy`] checked by
//! [`RecoveryPolicy::validated`], so the daemon adds no second set of rules
//! for them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::core::plan::{ConfigError, ControlConfig};
use crate::core::policy::RecoveryPolicy;
use crate::core::toml_error;

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
    "provisioner",
    "admin_listen",
    "log_format",
    "workers",
    "worker_idle_poll_ms",
    "shutdown_grace_s",
    "docker_events",
    "control.namespace",
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
    "recovery.stop_grace_default_ms",
    "docker.socket",
    "docker.request_timeout_s",
    "docker.restart_policy",
    "caddy.admin",
    "caddy.listen",
    "caddy.server_name",
    "caddy.host_suffix",
    "caddy.request_timeout_s",
    "helm.path",
    "helm.chart",
    "helm.namespace",
    "helm.wait_timeout_s",
];

/// The environment variable that overrides a key.
pub fn env_name(key: &str) -> String {
    format!("STEAD_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// Which provisioner installs releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProvisionerKind {
    /// The embedded default: a release is its labelled containers.
    Docker,
    /// `helm` as a subprocess.
    Helm,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaddySettings {
    pub admin: String,
    pub listen: String,
    pub server_name: String,
    pub host_suffix: String,
    pub request_timeout: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmSettings {
    pub path: PathBuf,
    pub chart: String,
    pub namespace: String,
    pub wait_timeout: Duration,
}

/// The validated daemon configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Where the file came from (`None`: defaults only).
    pub source: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub database_url: String,
    pub catalog: PathBuf,
    pub provisioner: ProvisionerKind,
    /// `None` turns the admin endpoints off (`admin_listen = ""`).
    pub admin_listen: Option<SocketAddr>,
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
}

/// Why the daemon configuration was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DaemonConfigError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: {field} = {value}: {reason}")]
    Invalid {
        file: String,
        field: String,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Control(#[from] ConfigError),
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

/// [`load`] with the environment passed in, for tests.
pub fn load_from(
    path: &Path,
    required: bool,
    env: &[(String, String)],
) -> Result<DaemonConfig, DaemonConfigError> {
    let file = path.display().to_string();
    let contents = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => None,
        Err(e) => {
            return Err(DaemonConfigError::Read {
                file,
                reason: e.to_string(),
            })
        }
        Ok(meta) if meta.len() > CONFIG_LEN_MAX => {
            return Err(DaemonConfigError::Read {
                file,
                reason: format!("larger than {CONFIG_LEN_MAX} bytes"),
            })
        }
        Ok(_) => Some(
            std::fs::read_to_string(path).map_err(|e| DaemonConfigError::Read {
                file: file.clone(),
                reason: e.to_string(),
            })?,
        ),
    };
    let mut config = parse(contents.as_deref().unwrap_or(""), &file, env)?;
    config.source = contents.map(|_| path.to_owned());
    Ok(config)
}

/// Parses `contents` (a TOML document), applies `env` overrides and
/// validates. `file` labels errors only.
pub fn parse(
    contents: &str,
    file: &str,
    env: &[(String, String)],
) -> Result<DaemonConfig, DaemonConfigError> {
    let mut doc: toml::Table = toml::from_str(contents).map_err(|e| DaemonConfigError::Syntax {
        file: file.to_owned(),
        message: toml_error::message(&e, contents),
    })?;
    apply_env(&mut doc, env);
    let control_doc = doc
        .get("control")
        .cloned()
        .unwrap_or_else(|| toml::Value::Table(Default::default()));
    let raw: RawConfig = toml::Value::Table(doc)
        .try_into()
        .map_err(|e: toml::de::Error| DaemonConfigError::Syntax {
            file: file.to_owned(),
            // A typed read of the parsed table: toml names the key, and
            // there is no text to point into.
            message: toml_error::message(&e, ""),
        })?;
    let control_text = toml::to_string(&control_doc).map_err(|e| DaemonConfigError::Syntax {
        file: file.to_owned(),
        message: format!("[control]: {e}"),
    })?;
    let control = ControlConfig::from_toml(&control_text, &format!("{file} [control]"))?;
    let config = Validator { file }.config(raw, control)?;
    // The drift check compares releases in the provisioner's own namespace,
    // so a different `control.namespace` would be silently ignored: refuse it.
    if control_doc.get("namespace").is_some() {
        let (effective, source) = match config.provisioner {
            ProvisionerKind::Docker => (DOCKER_RELEASE_NAMESPACE, "provisioner = \"docker\""),
            ProvisionerKind::Helm => (config.helm.namespace.as_str(), "helm.namespace"),
        };
        if config.control.namespace != effective {
            return Err(DaemonConfigError::Invalid {
                file: file.to_owned(),
                field: "control.namespace".into(),
                value: quote(&config.control.namespace),
                reason: format!(
                    "releases are looked for in {effective:?} (from {source}); remove \
                     control.namespace or set it to that"
                ),
            });
        }
    }
    Ok(config)
}

/// The namespace the Docker provisioner reports its releases in (Docker has
/// none of its own).
pub const DOCKER_RELEASE_NAMESPACE: &str = "docker";

/// Sets each known key found in the environment. A value that reads as a
/// TOML value (a number, a boolean, an array) is taken as one, anything else
/// as a string, so `STEAD_CADDY__ADMIN=127.0.0.1:2019` needs no quotes.
fn apply_env(doc: &mut toml::Table, env: &[(String, String)]) {
    for key in KEYS {
        let name = env_name(key);
        let Some((_, raw)) = env.iter().find(|(k, _)| *k == name) else {
            continue;
        };
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let mut table = &mut *doc;
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
    provisioner: Option<String>,
    admin_listen: Option<String>,
    log_format: Option<String>,
    workers: Option<i64>,
    worker_idle_poll_ms: Option<i64>,
    shutdown_grace_s: Option<i64>,
    docker_events: Option<bool>,
    // Parsed and validated by `ControlConfig::from_toml`.
    #[allow(dead_code)]
    control: Option<toml::Table>,
    #[serde(default)]
    recovery: RawRecovery,
    #[serde(default)]
    docker: RawDocker,
    #[serde(default)]
    caddy: RawCaddy,
    #[serde(default)]
    helm: RawHelm,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRecovery {
    free_attempts: Option<i64>,
    delays_s: Option<Vec<i64>>,
    stable_window_s: Option<i64>,
    unhealthy_threshold: Option<i64>,
    instance_deadline_s: Option<i64>,
    stop_grace_default_ms: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDocker {
    socket: Option<String>,
    request_timeout_s: Option<i64>,
    restart_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCaddy {
    admin: Option<String>,
    listen: Option<String>,
    server_name: Option<String>,
    host_suffix: Option<String>,
    request_timeout_s: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHelm {
    path: Option<String>,
    chart: Option<String>,
    namespace: Option<String>,
    wait_timeout_s: Option<i64>,
}

struct Validator<'a> {
    file: &'a str,
}

impl Validator<'_> {
    fn invalid(
        &self,
        field: &str,
        value: impl std::fmt::Debug,
        reason: impl Into<String>,
    ) -> DaemonConfigError {
        DaemonConfigError::Invalid {
            file: self.file.to_owned(),
            field: field.to_owned(),
            value: quote(value),
            reason: reason.into(),
        }
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

    fn config(
        &self,
        raw: RawConfig,
        control: ControlConfig,
    ) -> Result<DaemonConfig, DaemonConfigError> {
        let state_dir = PathBuf::from(self.text("state_dir", raw.state_dir, DEFAULT_STATE_DIR)?);
        if !state_dir.is_absolute() {
            return Err(self.invalid("state_dir", &state_dir, "must be an absolute path"));
        }
        let database_url = match raw.database_url {
            None => format!("sqlite://{}?mode=rwc", state_dir.join("stead.db").display()),
            Some(url) => {
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
        let provisioner = match raw.provisioner.as_deref().unwrap_or("docker") {
            "docker" => ProvisionerKind::Docker,
            "helm" => ProvisionerKind::Helm,
            other => {
                return Err(self.invalid("provisioner", other, "must be \"docker\" or \"helm\""))
            }
        };
        let admin_listen = match raw.admin_listen.as_deref().unwrap_or(DEFAULT_ADMIN_LISTEN) {
            "" => None,
            addr => Some(self.addr("admin_listen", addr)?),
        };
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
        Ok(DaemonConfig {
            source: None,
            state_dir,
            database_url,
            catalog,
            provisioner,
            admin_listen,
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
        })
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
            stop_grace_default: Duration::from_millis(self.int(
                "recovery.stop_grace_default_ms",
                raw.stop_grace_default_ms,
                d.stop_grace_default.as_millis() as i64,
                0,
                3_600_000,
            )?),
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
        })
    }

    fn caddy(&self, raw: RawCaddy) -> Result<CaddySettings, DaemonConfigError> {
        let admin = self.text("caddy.admin", raw.admin, DEFAULT_CADDY_ADMIN)?;
        self.addr("caddy.admin", &admin)?;
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
        })
    }

    fn helm(&self, raw: RawHelm) -> Result<HelmSettings, DaemonConfigError> {
        Ok(HelmSettings {
            path: PathBuf::from(self.text("helm.path", raw.path, "helm")?),
            chart: raw.chart.unwrap_or_default(),
            namespace: self.text("helm.namespace", raw.namespace, "stead")?,
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
        assert_eq!(config.provisioner, ProvisionerKind::Docker);
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
            "stead.toml: carriage return must be followed by newline, expected newline"
        );
    }

    #[test]
    fn a_database_password_is_never_echoed() {
        let e = parse("database_url = \"mysql://u:secret@h/db\"", "f", &[]).unwrap_err();
        assert!(!e.to_string().contains("secret"));
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
    fn a_control_namespace_the_provisioner_would_ignore_is_refused() {
        let e = parse("[control]\nnamespace = \"prod\"\n", "stead.toml", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stead.toml: control.namespace = \"prod\": releases are looked for in \"docker\" \
             (from provisioner = \"docker\"); remove control.namespace or set it to that"
        );
        let helm = "provisioner = \"helm\"\n[helm]\nchart = \"c\"\nnamespace = \"prod\"\n";
        let agreeing = format!("{helm}[control]\nnamespace = \"prod\"\n");
        let config = parse(&agreeing, "stead.toml", &[]).unwrap();
        assert_eq!(config.control.namespace, "prod");
        let env = vec![(env_name("control.namespace"), "other".to_owned())];
        let e = parse(helm, "stead.toml", &env).unwrap_err().to_string();
        assert!(e.contains("control.namespace = \"other\""), "{e}");
        assert!(e.contains("from helm.namespace"), "{e}");
    }
}
