//! Settings of the control loop, validated once at load.

use std::time::Duration;

use crate::broken::Armed;

use serde::Deserialize;

/// Upper bound on `max_in_flight`: more concurrent upgrades than this is a
/// typo, not a rollout policy.
pub(crate) const MAX_IN_FLIGHT_MAX: u32 = 1000;
/// Longest team name (the namespace is a DNS label, `names::LABEL_LEN_MAX`).
pub const NAME_LEN_MAX: usize = 63;
/// Bounds on the tick interval.
pub(crate) const TICK_INTERVAL_MIN: Duration = Duration::from_secs(1);
pub(crate) const TICK_INTERVAL_MAX: Duration = Duration::from_secs(3600);
/// Bounds on the task lease.
pub(crate) const LEASE_MIN: Duration = Duration::from_secs(10);
pub(crate) const LEASE_MAX: Duration = Duration::from_secs(24 * 3600);
/// Bounds on the provisioner's own timeout.
pub(crate) const PROVISIONER_TIMEOUT_MIN: Duration = Duration::from_secs(1);
pub(crate) const PROVISIONER_TIMEOUT_MAX: Duration = Duration::from_secs(12 * 3600);
/// Longest config file accepted, in bytes.
pub const CONFIG_LEN_MAX: usize = 64 * 1024;

/// What the four checks of the control loop need to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlConfig {
    /// Team whose instances upgrade first: stead's operators eat their own
    /// dog food before any tenant does.
    pub own_team: String,
    /// Upgrades queued or running across the whole fleet, at most.
    pub max_in_flight: u32,
    /// How long a worker's claim on a task lasts without renewal. Must
    /// exceed `provisioner_timeout`, or a healthy but slow provision is
    /// handed to a second worker.
    pub lease: Duration,
    /// The provisioner's own deadline for one install, upgrade or uninstall.
    pub provisioner_timeout: Duration,
    /// Pause between the end of one tick and the start of the next.
    pub tick_interval: Duration,
    /// A rule broken on purpose by the mutation exercise; `None` outside
    /// it (never read from a file).
    pub broken: Armed,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            own_team: "platform".to_owned(),
            max_in_flight: 1,
            // Longer than helm's default wait (300 s) plus the margins
            // (`policy::HELM_KILL_MARGIN`, `TASK_LEASE_SAFETY_MARGIN`).
            lease: Duration::from_secs(600),
            provisioner_timeout: Duration::from_secs(240),
            tick_interval: Duration::from_secs(60),
            broken: Armed::default(),
        }
    }
}

/// Why a control-loop configuration was rejected; names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    #[error("{field} = {value}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("{file}: {error}")]
    InFile {
        file: String,
        #[source]
        error: Box<ConfigError>,
    },
}

fn invalid(
    field: &'static str,
    value: impl std::fmt::Debug,
    reason: impl Into<String>,
) -> ConfigError {
    let value: String = format!("{value:?}").chars().take(80).collect();
    ConfigError::Invalid {
        field,
        value,
        reason: reason.into(),
    }
}

/// A team name is compared with instances' teams and never becomes part of
/// a name, so it may hold `_`; it is not a DNS label.
fn check_team(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= NAME_LEN_MAX
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            value,
            format!("must be 1 to {NAME_LEN_MAX} of a-z, 0-9, '-' and '_'"),
        ))
    }
}

fn check_range(
    field: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            field,
            value,
            format!("must be between {min:?} and {max:?}"),
        ));
    }
    Ok(())
}

impl ControlConfig {
    /// Checks every bound and the relation between lease and provisioner
    /// timeout. The first violation is returned, naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_team("own_team", &self.own_team)?;
        if !(1..=MAX_IN_FLIGHT_MAX).contains(&self.max_in_flight) {
            return Err(invalid(
                "max_in_flight",
                self.max_in_flight,
                format!("must be between 1 and {MAX_IN_FLIGHT_MAX}"),
            ));
        }
        check_range(
            "tick_interval_s",
            self.tick_interval,
            TICK_INTERVAL_MIN,
            TICK_INTERVAL_MAX,
        )?;
        check_range("lease_s", self.lease, LEASE_MIN, LEASE_MAX)?;
        check_range(
            "provisioner_timeout_s",
            self.provisioner_timeout,
            PROVISIONER_TIMEOUT_MIN,
            PROVISIONER_TIMEOUT_MAX,
        )?;
        if self.lease <= self.provisioner_timeout {
            return Err(invalid(
                "lease_s",
                self.lease,
                format!(
                    "must exceed provisioner_timeout_s ({:?}), or a running provision is handed to a second worker",
                    self.provisioner_timeout
                ),
            ));
        }
        Ok(())
    }

    /// Parses and validates the `[control]`-style TOML document (every key
    /// optional, defaults as in [`ControlConfig::default`]). `file` labels
    /// errors only.
    pub fn from_toml(contents: &str, file: &str) -> Result<ControlConfig, ConfigError> {
        let in_file = |error: ConfigError| ConfigError::InFile {
            file: file.to_owned(),
            error: Box::new(error),
        };
        if contents.len() > CONFIG_LEN_MAX {
            return Err(in_file(invalid(
                "file",
                contents.len(),
                format!("at most {CONFIG_LEN_MAX} bytes"),
            )));
        }
        let raw: RawControlConfig = toml::from_str(contents).map_err(|e| ConfigError::Syntax {
            file: file.to_owned(),
            message: crate::toml_error::describe(&e, contents),
        })?;
        ControlConfig::from_raw(raw).map_err(in_file)
    }

    /// Validates settings already read as [`RawControlConfig`] (the daemon
    /// reads them as its `[control]` table). Errors are
    /// [`ConfigError::Invalid`], naming the field as written.
    pub fn from_raw(raw: RawControlConfig) -> Result<ControlConfig, ConfigError> {
        let defaults = ControlConfig::default();
        let seconds = |field: &'static str, value: Option<i64>, default: Duration| match value {
            None => Ok(default),
            Some(s) => u64::try_from(s)
                .map(Duration::from_secs)
                .map_err(|_| invalid(field, s, "must not be negative")),
        };
        if let Some(namespace) = &raw.namespace {
            return Err(invalid(
                "namespace",
                namespace,
                "is no longer a setting: each service type's provisioner says where its \
                 releases live (Docker's in \"docker\", a Helm type's in the catalog's \
                 helm.namespace); remove it",
            ));
        }
        let config = ControlConfig {
            own_team: raw.own_team.unwrap_or(defaults.own_team),
            max_in_flight: match raw.max_in_flight {
                None => defaults.max_in_flight,
                Some(n) => u32::try_from(n).map_err(|_| {
                    invalid(
                        "max_in_flight",
                        n,
                        format!("must be between 1 and {MAX_IN_FLIGHT_MAX}"),
                    )
                })?,
            },
            lease: seconds("lease_s", raw.lease_s, defaults.lease)?,
            provisioner_timeout: seconds(
                "provisioner_timeout_s",
                raw.provisioner_timeout_s,
                defaults.provisioner_timeout,
            )?,
            tick_interval: seconds(
                "tick_interval_s",
                raw.tick_interval_s,
                defaults.tick_interval,
            )?,
            broken: Armed::default(),
        };
        config.validate()?;
        Ok(config)
    }
}

/// The control settings as written: every key optional, numbers as `i64`
/// so a negative value reaches validation, which names it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawControlConfig {
    /// Removed (read only to say so).
    pub namespace: Option<String>,
    pub own_team: Option<String>,
    pub max_in_flight: Option<i64>,
    pub lease_s: Option<i64>,
    pub provisioner_timeout_s: Option<i64>,
    pub tick_interval_s: Option<i64>,
}
