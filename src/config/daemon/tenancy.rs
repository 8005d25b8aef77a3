//! `stead.toml`'s tenant API keys (#54): `api_listen`,
//! `api_max_connections`, `api_requests_per_minute` and the per-team quota
//! tables `[teams.NAME]`, validated at load like every other key.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::{quote, DaemonConfigError, Validator};
use crate::ports::TeamQuota;

/// Most simultaneous connections the API listener takes unless
/// `api_max_connections` says otherwise, and its bounds.
pub const API_MAX_CONNECTIONS_DEFAULT: i64 = 64;
pub const API_MAX_CONNECTIONS_MAX: i64 = 10_000;
/// Requests a token may make per minute unless `api_requests_per_minute`
/// says otherwise, and its bounds.
pub const API_REQUESTS_PER_MINUTE_DEFAULT: i64 = 600;
pub const API_REQUESTS_PER_MINUTE_MAX: i64 = 1_000_000;
/// Most `[teams.NAME]` tables.
pub const TEAMS_MAX: usize = 10_000;
/// Largest value any quota takes.
pub const QUOTA_MAX: i64 = 1 << 40;

/// The keys of each `[teams.NAME]` table; `docs/configuration.md`
/// documents each as `teams.<name>.<key>`.
pub const TEAM_KEYS: &[&str] = &[
    "max_instances",
    "max_memory_mb",
    "max_public_hosts",
    "domain_suffixes",
];
/// Most entries in one team's `domain_suffixes`.
pub const DOMAIN_SUFFIXES_MAX: usize = 64;

/// Most names in `api_hosts`.
pub const API_HOSTS_MAX: usize = 64;

/// The tenant API's listener; off unless `api_listen` names an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiSettings {
    pub listen: Option<SocketAddr>,
    /// The host names the API answers to besides its listen address (and
    /// `localhost` on a loopback one): the public name a proxy in front of
    /// it (Caddy, with TLS) passes on. Any other `Host` is refused.
    pub hosts: Vec<String>,
    pub max_connections: usize,
    pub requests_per_minute: u32,
    /// How long a connection may send nothing before it is closed, so idle
    /// or trickling clients cannot hold every place under the cap. Not a
    /// key: [`API_IDLE_TIMEOUT`] (tests shorten it).
    pub idle_timeout: std::time::Duration,
}

/// [`ApiSettings::idle_timeout`]: longer than the longest a command waits
/// for an instance's lock (`ops::OPERATOR_LOCK_WAIT`, 30 s), so a request
/// waiting on one is never cut.
pub const API_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            listen: None,
            hosts: Vec::new(),
            max_connections: API_MAX_CONNECTIONS_DEFAULT as usize,
            requests_per_minute: API_REQUESTS_PER_MINUTE_DEFAULT as u32,
            idle_timeout: API_IDLE_TIMEOUT,
        }
    }
}

/// The tenant API's listener and the teams' quotas (#54).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenancySettings {
    /// The API's listener; off unless `api_listen` is set.
    pub api: ApiSettings,
    /// `[teams.NAME]`: each team's quotas; a team not named has none.
    pub teams: BTreeMap<String, TeamQuota>,
}

#[derive(Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTeam {
    max_instances: Option<i64>,
    max_memory_mb: Option<i64>,
    max_public_hosts: Option<i64>,
    #[serde(default)]
    domain_suffixes: Vec<String>,
}

impl Validator<'_> {
    pub(super) fn tenancy(
        &self,
        raw: &super::RawConfig,
    ) -> Result<TenancySettings, DaemonConfigError> {
        Ok(TenancySettings {
            api: self.api(
                raw.api_listen.clone(),
                raw.api_hosts.clone(),
                raw.api_max_connections,
                raw.api_requests_per_minute,
            )?,
            teams: self.teams(raw.teams.clone())?,
        })
    }

    fn api(
        &self,
        listen: Option<String>,
        hosts: Vec<String>,
        max_connections: Option<i64>,
        requests_per_minute: Option<i64>,
    ) -> Result<ApiSettings, DaemonConfigError> {
        if hosts.len() > API_HOSTS_MAX {
            return Err(self.invalid_quoted(
                "api_hosts",
                format!("{} names", hosts.len()),
                format!("at most {API_HOSTS_MAX} host names"),
            ));
        }
        for (n, host) in hosts.iter().enumerate() {
            let valid = !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                });
            if !valid {
                return Err(self.invalid(
                    &format!("api_hosts[{n}]"),
                    host,
                    "must be a host name such as api.example.com (no scheme, no port)",
                ));
            }
        }
        let listen = match listen.as_deref().unwrap_or("") {
            "" => None,
            addr => Some(self.addr("api_listen", addr)?),
        };
        let max_connections = self.int(
            "api_max_connections",
            max_connections,
            API_MAX_CONNECTIONS_DEFAULT,
            1,
            API_MAX_CONNECTIONS_MAX,
        )? as usize;
        let requests_per_minute = self.int(
            "api_requests_per_minute",
            requests_per_minute,
            API_REQUESTS_PER_MINUTE_DEFAULT,
            1,
            API_REQUESTS_PER_MINUTE_MAX,
        )? as u32;
        Ok(ApiSettings {
            listen,
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            max_connections,
            requests_per_minute,
            idle_timeout: API_IDLE_TIMEOUT,
        })
    }

    fn teams(
        &self,
        raw: BTreeMap<String, RawTeam>,
    ) -> Result<BTreeMap<String, TeamQuota>, DaemonConfigError> {
        if raw.len() > TEAMS_MAX {
            return Err(self.invalid_quoted(
                "teams",
                format!("{} tables", raw.len()),
                format!("at most {TEAMS_MAX} teams"),
            ));
        }
        let mut teams = BTreeMap::new();
        for (name, raw) in raw {
            crate::core::names::check_dns_label(&format!("teams.{name}"), &name)
                .map_err(|e| self.invalid_quoted(&e.field, quote(&e.value), e.rule.to_string()))?;
            let quota = |key: &str, value: Option<i64>| -> Result<Option<u64>, DaemonConfigError> {
                match value {
                    None => Ok(None),
                    Some(v) if (0..=QUOTA_MAX).contains(&v) => Ok(Some(v as u64)),
                    Some(v) => Err(self.invalid(
                        &format!("teams.{name}.{key}"),
                        v,
                        format!("must be between 0 and {QUOTA_MAX}"),
                    )),
                }
            };
            let team = TeamQuota {
                max_instances: quota("max_instances", raw.max_instances)?,
                max_memory_mb: quota("max_memory_mb", raw.max_memory_mb)?,
                max_public_hosts: quota("max_public_hosts", raw.max_public_hosts)?,
                domain_suffixes: self.domain_suffixes(&name, raw.domain_suffixes)?,
            };
            teams.insert(name, team);
        }
        self.disjoint_suffixes(&teams)?;
        Ok(teams)
    }

    /// `teams.NAME.domain_suffixes`: DNS names, lowercase, none twice.
    fn domain_suffixes(
        &self,
        team: &str,
        raw: Vec<String>,
    ) -> Result<Vec<String>, DaemonConfigError> {
        let key = format!("teams.{team}.domain_suffixes");
        if raw.len() > DOMAIN_SUFFIXES_MAX {
            return Err(self.invalid_quoted(
                &key,
                format!("{} names", raw.len()),
                format!("at most {DOMAIN_SUFFIXES_MAX} domains"),
            ));
        }
        for (n, suffix) in raw.iter().enumerate() {
            let field = format!("{key}[{n}]");
            crate::core::names::check_dns_name(&field, suffix)
                .map_err(|e| self.invalid_quoted(&field, quote(suffix), e.rule.to_string()))?;
            if raw[..n].contains(suffix) {
                return Err(self.invalid_quoted(&field, quote(suffix), "listed twice".to_owned()));
            }
        }
        Ok(raw)
    }

    /// No team's domain lies under (or is) another team's: each host name
    /// a tenant may give belongs to one team only (#54).
    fn disjoint_suffixes(
        &self,
        teams: &BTreeMap<String, TeamQuota>,
    ) -> Result<(), DaemonConfigError> {
        let owner: BTreeMap<&str, &str> = teams
            .iter()
            .flat_map(|(team, quota)| {
                quota
                    .domain_suffixes
                    .iter()
                    .map(|s| (s.as_str(), team.as_str()))
            })
            .collect();
        for (team, quota) in teams {
            for (n, suffix) in quota.domain_suffixes.iter().enumerate() {
                // The suffix itself, then each domain above it.
                let above = std::iter::successors(Some(suffix.as_str()), |s| {
                    s.split_once('.').map(|(_, rest)| rest)
                });
                for domain in above {
                    match owner.get(domain) {
                        Some(other) if *other != team.as_str() => {
                            return Err(self.invalid_quoted(
                                &format!("teams.{team}.domain_suffixes[{n}]"),
                                quote(suffix),
                                format!(
                                    "lies under {domain:?}, which teams.{other}.domain_suffixes \
                                     lists: a host name a tenant gives belongs to one team"
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    #[test]
    fn team_quotas_and_the_api_listener_are_read_and_checked() {
        let config = parse(
            "api_listen = \"127.0.0.1:9465\"\n[teams.a]\nmax_instances = 5\nmax_memory_mb = 2048\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.tenancy.api.listen.unwrap().to_string(),
            "127.0.0.1:9465"
        );
        let a = &config.tenancy.teams["a"];
        assert_eq!(
            (a.max_instances, a.max_memory_mb, a.max_public_hosts),
            (Some(5), Some(2048), None)
        );
        assert!(a.domain_suffixes.is_empty());
        assert_eq!(
            parse("", "stead.toml", &[]).unwrap().tenancy.api.listen,
            None
        );
    }

    #[test]
    fn every_team_key_is_documented_in_the_configuration_guide() {
        let guide = include_str!("../../../docs/configuration.md");
        for key in super::TEAM_KEYS {
            assert!(
                guide.contains(&format!("`teams.<name>.{key}`")),
                "docs/configuration.md lacks teams.<name>.{key}"
            );
        }
    }

    #[test]
    fn a_bad_quota_is_refused_naming_team_field_and_value() {
        let e = parse("[teams.a]\nmax_instances = -1\n", "stead.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("teams.a.max_instances") && e.contains("-1"),
            "{e}"
        );
        let e = parse("[teams.Bad_Team]\nmax_instances = 1\n", "stead.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Bad_Team"), "{e}");
        let e = parse("[teams.a]\nmax_cpus = 1\n", "stead.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_cpus"), "{e}");
    }

    #[test]
    fn domain_suffixes_are_dns_names_and_no_two_teams_share_one() {
        let config = parse(
            "[teams.a]\ndomain_suffixes = [\"a.example\", \"shop-a.example.net\"]\n\
             [teams.b]\ndomain_suffixes = [\"b.example\"]\n",
            "stead.toml",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.tenancy.teams["a"].domain_suffixes,
            ["a.example", "shop-a.example.net"]
        );
        let refused = |toml: &str| parse(toml, "stead.toml", &[]).unwrap_err().to_string();
        let e = refused("[teams.a]\ndomain_suffixes = [\"A.example\"]\n");
        assert!(
            e.contains("teams.a.domain_suffixes[0]") && e.contains("A.example"),
            "{e}"
        );
        let e = refused("[teams.a]\ndomain_suffixes = [\"a.example\", \"a.example\"]\n");
        assert!(
            e.contains("teams.a.domain_suffixes[1]") && e.contains("twice"),
            "{e}"
        );
        let e = refused(
            "[teams.a]\ndomain_suffixes = [\"example\"]\n[teams.b]\ndomain_suffixes = [\"b.example\"]\n",
        );
        assert!(
            e.contains("teams.b.domain_suffixes[0]") && e.contains("teams.a.domain_suffixes"),
            "{e}"
        );
    }
}
