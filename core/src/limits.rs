//! What every container gets unless the catalog says otherwise, and the
//! most the catalog may say: the operator's `[limits]` in `stead.toml`.
//!
//! A tenant's image must not starve the host. Every container stead
//! creates has a memory limit (the catalog's `memory_mb`, or
//! [`ContainerLimits::memory_bytes_default`]), a pids limit, json-file log
//! rotation and `no-new-privileges`; none of these is the catalog's to turn
//! off. A catalog asking for more memory than
//! [`ContainerLimits::memory_bytes_max`] is refused when it is loaded,
//! naming its field and the bound, as an ungranted host path is. The
//! daemon's config validates the table once, through
//! [`ContainerLimits::new`]; the Docker adapter applies the defaults at
//! creation, so changing a default replaces no running container.

use super::catalog::{quote, MEMORY_MB_MAX, MEMORY_MB_MIN};

/// Bytes in a mebibyte, the unit of every size in `[limits]`.
pub(crate) const MIB: u64 = 1024 * 1024;

/// `memory_default_mb` when unset: 1 GiB.
pub(crate) const MEMORY_DEFAULT_MB_DEFAULT: i64 = 1024;
/// `memory_max_mb` when unset: 16 GiB.
pub(crate) const MEMORY_MAX_MB_DEFAULT: i64 = 16 * 1024;
/// `pids_limit` when unset.
pub(crate) const PIDS_LIMIT_DEFAULT: i64 = 512;
/// Fewest processes a container may be held to: a shell, a server and
/// its workers.
pub(crate) const PIDS_LIMIT_MIN: i64 = 16;
/// The kernel's own ceiling on process ids (`pid_max` on 64-bit).
pub(crate) const PIDS_LIMIT_MAX: i64 = 1 << 22;
/// `log_max_size_mb` when unset.
pub(crate) const LOG_MAX_SIZE_MB_DEFAULT: i64 = 10;
/// Largest log file before rotation.
pub(crate) const LOG_MAX_SIZE_MB_MAX: i64 = 1024;
/// `log_max_files` when unset.
pub(crate) const LOG_MAX_FILES_DEFAULT: i64 = 3;
/// Most rotated log files kept per container.
pub(crate) const LOG_MAX_FILES_MAX: i64 = 100;

const _: () = assert!(MEMORY_MB_MIN <= MEMORY_DEFAULT_MB_DEFAULT);
const _: () = assert!(MEMORY_DEFAULT_MB_DEFAULT <= MEMORY_MAX_MB_DEFAULT);
const _: () = assert!(MEMORY_MAX_MB_DEFAULT <= MEMORY_MB_MAX);
const _: () = assert!(PIDS_LIMIT_MIN <= PIDS_LIMIT_DEFAULT && PIDS_LIMIT_DEFAULT <= PIDS_LIMIT_MAX);
const _: () =
    assert!(1 <= LOG_MAX_SIZE_MB_DEFAULT && LOG_MAX_SIZE_MB_DEFAULT <= LOG_MAX_SIZE_MB_MAX);
const _: () = assert!(1 <= LOG_MAX_FILES_DEFAULT && LOG_MAX_FILES_DEFAULT <= LOG_MAX_FILES_MAX);

/// `[limits]` as the file writes it: each key unset or a number, negative
/// ones included so the validator can name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawLimits {
    pub memory_default_mb: Option<i64>,
    pub memory_max_mb: Option<i64>,
    pub pids_limit: Option<i64>,
    pub log_max_size_mb: Option<i64>,
    pub log_max_files: Option<i64>,
}

/// A bad value of `[limits]`: `field` is relative to the table
/// (`memory_max_mb`); the daemon's config names the file or variable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct LimitError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

/// The operator's container limits, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerLimits {
    /// The memory limit of a service whose catalog entry names none.
    pub memory_bytes_default: u64,
    /// The most memory a catalog may give a service.
    pub memory_bytes_max: u64,
    /// The most processes (threads included) in one container.
    pub pids_limit: u32,
    /// The size at which a container's json-file log is rotated.
    pub log_max_size_mb: u32,
    /// How many log files, the current one included, are kept.
    pub log_max_files: u32,
}

impl Default for ContainerLimits {
    fn default() -> Self {
        ContainerLimits::new(&RawLimits::default()).expect("the defaults are within bounds")
    }
}

impl ContainerLimits {
    /// Validates each key against its bounds, and the default memory
    /// against the maximum.
    pub fn new(raw: &RawLimits) -> Result<ContainerLimits, LimitError> {
        let memory_max_mb = bounded(
            "memory_max_mb",
            raw.memory_max_mb,
            MEMORY_MAX_MB_DEFAULT,
            MEMORY_MB_MIN,
            MEMORY_MB_MAX,
        )?;
        let memory_default_mb = bounded(
            "memory_default_mb",
            raw.memory_default_mb,
            MEMORY_DEFAULT_MB_DEFAULT.min(memory_max_mb),
            MEMORY_MB_MIN,
            memory_max_mb,
        )?;
        let pids_limit = bounded(
            "pids_limit",
            raw.pids_limit,
            PIDS_LIMIT_DEFAULT,
            PIDS_LIMIT_MIN,
            PIDS_LIMIT_MAX,
        )?;
        let log_max_size_mb = bounded(
            "log_max_size_mb",
            raw.log_max_size_mb,
            LOG_MAX_SIZE_MB_DEFAULT,
            1,
            LOG_MAX_SIZE_MB_MAX,
        )?;
        let log_max_files = bounded(
            "log_max_files",
            raw.log_max_files,
            LOG_MAX_FILES_DEFAULT,
            1,
            LOG_MAX_FILES_MAX,
        )?;
        // Every bound above is positive and fits a u32.
        let unsigned = |n: i64| u32::try_from(n).expect("bounded above");
        Ok(ContainerLimits {
            memory_bytes_default: memory_default_mb.unsigned_abs() * MIB,
            memory_bytes_max: memory_max_mb.unsigned_abs() * MIB,
            pids_limit: unsigned(pids_limit),
            log_max_size_mb: unsigned(log_max_size_mb),
            log_max_files: unsigned(log_max_files),
        })
    }

    /// The memory limit of a service: the catalog's, else the default.
    pub fn memory_bytes(&self, catalog_memory_bytes: Option<u64>) -> u64 {
        catalog_memory_bytes.unwrap_or(self.memory_bytes_default)
    }
}

fn bounded(
    field: &str,
    value: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, LimitError> {
    let Some(value) = value else {
        return Ok(default);
    };
    if !(min..=max).contains(&value) {
        let reason = if field == "memory_default_mb" && value > max {
            format!("must be between {min} and memory_max_mb ({max})")
        } else {
            format!("must be between {min} and {max}")
        };
        return Err(LimitError {
            field: field.to_owned(),
            value: quote(value),
            reason,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error for `raw`, as (field, value, reason).
    fn check(raw: RawLimits, expect: (&str, &str, &str)) {
        let error = ContainerLimits::new(&raw).unwrap_err();
        assert_eq!(
            (
                error.field.as_str(),
                error.value.as_str(),
                error.reason.as_str()
            ),
            expect
        );
    }

    #[test]
    fn unset_limits_are_a_gibibyte_512_pids_and_three_10_mb_logs() {
        let limits = ContainerLimits::default();
        assert_eq!(limits.memory_bytes_default, 1024 * MIB);
        assert_eq!(limits.memory_bytes_max, 16 * 1024 * MIB);
        assert_eq!(limits.pids_limit, 512);
        assert_eq!((limits.log_max_size_mb, limits.log_max_files), (10, 3));
        assert_eq!(limits.memory_bytes(None), 1024 * MIB);
        assert_eq!(limits.memory_bytes(Some(64 * MIB)), 64 * MIB);
    }

    #[test]
    fn out_of_bounds_limits_are_refused_naming_the_key_and_the_bound() {
        check(
            RawLimits {
                pids_limit: Some(0),
                ..Default::default()
            },
            (
                "pids_limit",
                "0",
                &format!("must be between {PIDS_LIMIT_MIN} and {PIDS_LIMIT_MAX}"),
            ),
        );
        check(
            RawLimits {
                memory_max_mb: Some(-1),
                ..Default::default()
            },
            (
                "memory_max_mb",
                "-1",
                &format!("must be between {MEMORY_MB_MIN} and {MEMORY_MB_MAX}"),
            ),
        );
        check(
            RawLimits {
                log_max_files: Some(LOG_MAX_FILES_MAX + 1),
                ..Default::default()
            },
            ("log_max_files", "101", "must be between 1 and 100"),
        );
        check(
            RawLimits {
                log_max_size_mb: Some(0),
                ..Default::default()
            },
            ("log_max_size_mb", "0", "must be between 1 and 1024"),
        );
    }

    #[test]
    fn the_default_memory_cannot_exceed_the_maximum() {
        check(
            RawLimits {
                memory_default_mb: Some(2048),
                memory_max_mb: Some(512),
                ..Default::default()
            },
            (
                "memory_default_mb",
                "2048",
                "must be between 6 and memory_max_mb (512)",
            ),
        );
        // A maximum below the unset default lowers the default to it.
        let limits = ContainerLimits::new(&RawLimits {
            memory_max_mb: Some(256),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(limits.memory_bytes_default, 256 * MIB);
    }
}
