//! `config`: the daemon's `stead.toml` parser, `config::daemon::parse`,
//! with arbitrary text and a small arbitrary `STEAD_*` environment. The
//! `[control]` table goes through `ControlConfig::from_raw` on the way, so
//! it is fuzzed too.
//!
//! Asserted: no panic; the same input gives the same answer twice; an
//! error names its origin, the file or the environment variable (and, for
//! an invalid value, the field and the value) and never echoes more of a
//! bad database URL than its scheme; an
//! accepted config satisfies every bound `src/config/daemon.rs`,
//! `ControlConfig::validate` and `RecoveryPolicy::validated` enforce.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead::config::daemon::{
    env_name, parse, DaemonConfig, DaemonConfigError, KEYS, SHUTDOWN_GRACE_MAX, WORKERS_MAX,
};
use stead::core::grants::{is_reserved_env, Grant, GRANT_ENTRIES_MAX};

const FILE: &str = "fuzz.toml";

/// Most environment variables one input sets.
const ENV_MAX: usize = 8;

/// The file's text, then (after the first NUL byte) one environment
/// variable per line: the line's first byte picks the key from `KEYS`, the
/// rest is the value. A seed without NUL is just a `stead.toml`.
#[derive(Debug)]
struct Input {
    contents: String,
    env: Vec<(String, String)>,
}

impl Input {
    fn from_bytes(data: &[u8]) -> Self {
        let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        let contents = String::from_utf8_lossy(&data[..split]).into_owned();
        let env = data
            .get(split + 1..)
            .unwrap_or_default()
            .split(|&b| b == b'\n')
            .filter_map(|line| {
                let (&pick, value) = line.split_first()?;
                let key = KEYS[usize::from(pick) % KEYS.len()];
                Some((env_name(key), String::from_utf8_lossy(value).into_owned()))
            })
            .take(ENV_MAX)
            .collect();
        Input { contents, env }
    }
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let len = u.len();
        Ok(Self::from_bytes(u.bytes(len)?))
    }

    fn arbitrary_take_rest(u: Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self::from_bytes(u.take_rest()))
    }
}

/// The validator's rule for free-text settings.
fn is_text(value: &str) -> bool {
    !value.is_empty() && value.len() <= 1024 && !value.chars().any(char::is_control)
}

fn is_dns(value: &str) -> bool {
    value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
}

fn within(value: Duration, min: Duration, max: Duration) -> bool {
    (min..=max).contains(&value)
}

fn check_accepted(config: &DaemonConfig) {
    let s = Duration::from_secs;
    assert_eq!(config.source, None, "parse reads no file");
    assert!(config.state_dir.is_absolute(), "{:?}", config.state_dir);
    assert!(is_text(&config.state_dir.to_string_lossy()));
    let url = &config.database_url;
    assert!(
        url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"),
        "database_url {url:?}"
    );
    assert!(is_text(&config.catalog.to_string_lossy()));
    assert!(config.workers <= WORKERS_MAX, "workers {}", config.workers);
    assert!(within(
        config.worker_idle_poll,
        Duration::from_millis(10),
        s(60)
    ));
    assert!(within(config.shutdown_grace, s(1), SHUTDOWN_GRACE_MAX));
    assert_eq!(config.control.validate(), Ok(()), "{:?}", config.control);
    assert_eq!(
        config.recovery.clone().validated().as_ref(),
        Ok(&config.recovery),
        "recovery policy"
    );
    assert!(config.docker.socket.is_absolute());
    assert!(within(config.docker.request_timeout, s(1), s(600)));
    let caddy = &config.caddy;
    assert!(
        caddy.admin.parse::<std::net::SocketAddr>().is_ok(),
        "{:?}",
        caddy.admin
    );
    assert!(
        caddy.listen.parse::<std::net::SocketAddr>().is_ok(),
        "{:?}",
        caddy.listen
    );
    assert!(is_text(&caddy.server_name) && is_dns(&caddy.server_name));
    assert!(is_text(&caddy.host_suffix) && is_dns(&caddy.host_suffix));
    assert!(within(caddy.request_timeout, s(1), s(600)));
    assert!(is_text(&config.helm.path.to_string_lossy()));
    assert!(within(config.helm.wait_timeout, s(1), s(12 * 3600)));
    assert!(within(config.helm.kill_margin, s(1), s(600)));
    let env_name = |n: &str| {
        !n.is_empty()
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    assert!(config.helm.pass_env.iter().all(|n| env_name(n)));
    assert!(config.helm.env.keys().all(|n| env_name(n)));
    // Nothing stead itself uses is ever granted to a container, and every
    // granted directory is clean, absolute and not the root.
    let passed = config.grants.granted(Grant::DaemonEnv);
    assert!(passed.len() <= GRANT_ENTRIES_MAX);
    for name in &passed {
        assert!(env_name(name) && !is_reserved_env(name), "{name:?}");
        assert!(config.grants.passes_env(name), "{name:?}");
    }
    for grant in [Grant::HostPath, Grant::SecretFile] {
        let dirs = config.grants.granted(grant);
        assert!(dirs.len() <= GRANT_ENTRIES_MAX);
        for dir in &dirs {
            let inner = dir
                .strip_prefix('/')
                .and_then(|d| d.strip_suffix('/'))
                .unwrap_or_else(|| panic!("{dir:?} is not /…/"));
            assert!(
                inner.split('/').all(|c| !matches!(c, "" | "." | "..")),
                "{dir:?}"
            );
        }
    }
}

fn check_rejected(error: &DaemonConfigError) {
    let message = error.to_string();
    // An error names where the bad value came from: the file (with a line
    // when known) or the environment variable that set it.
    assert!(
        message.starts_with(FILE) || message.starts_with("environment variable STEAD_"),
        "{message}"
    );
    match error {
        DaemonConfigError::Read { .. } => panic!("parse reads nothing: {message}"),
        DaemonConfigError::Syntax { message: m, .. } => assert!(!m.trim().is_empty(), "{error:?}"),
        DaemonConfigError::Invalid {
            field,
            value,
            reason,
            ..
        } => {
            assert!(
                !field.is_empty() && !value.is_empty() && !reason.is_empty(),
                "{message}"
            );
            if field == "database_url" {
                // Only the scheme (which holds no ':') and an ellipsis: the
                // rest of a URL may be a password.
                let after_scheme = value.split_once(':').map(|(_, rest)| rest);
                assert!(
                    after_scheme.is_none_or(|rest| rest == "…\""),
                    "database_url echoed: {value}"
                );
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let result = parse(&input.contents, FILE, &input.env);
    assert_eq!(
        result,
        parse(&input.contents, FILE, &input.env),
        "not deterministic"
    );
    match result {
        Ok(config) => check_accepted(&config),
        Err(error) => check_rejected(&error),
    }
});
