//! Teams, tokens and quotas in the operator commands (#54). The CLI and
//! the tenant API run the same commands; the API's are [`Ops::scoped`] to
//! its token's team, so one `find` hides another team's instances from
//! every command at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::{CreateRequest, Ops, OpsError, TTL_MAX};
use crate::core::catalog::CatalogEntry;
use crate::core::domains::check_given_domains;
use crate::core::fleet::{Instance, InstanceState};
use crate::ports::tenancy::{same_digest, secret_sha256};
use crate::ports::{NewInstance, NewToken, QuotaCharge, Revocation, TeamQuota, Token, TokenRole};

/// What every token starts with, so a leaked one is recognisable (secret
/// scanners match on it) and a mistyped header is told apart from a token.
pub const TOKEN_PREFIX: &str = "stead_";
/// Random bytes in a token's secret: 256 bits, beyond any guessing, which
/// is why its stored SHA-256 needs no slow KDF (`ports::tenancy`).
const TOKEN_SECRET_BYTES: usize = 32;
/// Longest token label.
const TOKEN_LABEL_LEN_MAX: usize = 200;
/// Longest a token can be presented: the prefix and 64 hex digits, with
/// room to spare; anything longer is refused before it is hashed.
pub const TOKEN_LEN_MAX: usize = 128;

/// Whose instances a command sees and changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// The whole fleet: the CLI on the database, an operator's token.
    #[default]
    Fleet,
    /// One team's instances: a tenant's token. Another team's instance is
    /// not found, never forbidden, so a tenant cannot learn it exists.
    Team(String),
}

impl Scope {
    pub fn sees(&self, team: &str) -> bool {
        match self {
            Self::Fleet => true,
            Self::Team(own) => own == team,
        }
    }

    /// A create for `team` within this scope.
    pub(super) fn check_team(&self, team: &str) -> Result<(), OpsError> {
        match self {
            Self::Team(own) if own != team => Err(OpsError::Invalid(format!(
                "team {team:?}: this token is team {own:?}'s and creates its instances only"
            ))),
            _ => Ok(()),
        }
    }

    /// A command on the whole fleet (`what`), which no team's scope may run.
    pub(super) fn check_fleet(&self, what: &str) -> Result<(), OpsError> {
        match self {
            Self::Fleet => Ok(()),
            Self::Team(own) => Err(OpsError::Invalid(format!(
                "{what} is the fleet's; team {own:?}'s token cannot change it (an operator \
                 token can)"
            ))),
        }
    }
}

/// `stead token create`.
#[derive(Clone, Debug)]
pub struct TokenRequest {
    pub team: String,
    pub role: TokenRole,
    /// How long the token lives; `None` until revoked.
    pub expires_in: Option<Duration>,
    pub label: String,
}

impl Ops<'_> {
    /// The same commands, held to each team's quotas (`[teams.NAME]`).
    /// `memory_bytes_default` is what a service without its own memory
    /// limit counts (`limits.memory_default_mb`).
    pub fn with_quotas(
        mut self,
        teams: Arc<BTreeMap<String, TeamQuota>>,
        memory_bytes_default: u64,
    ) -> Self {
        self.quotas = teams;
        self.memory_bytes_default = memory_bytes_default;
        self
    }

    /// The same commands, seeing and changing `scope`'s instances only.
    pub fn scoped(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The same commands with the mutation exercise's rule `broken`
    /// broken (the simulation's tenants); the daemon never calls it.
    pub fn armed(mut self, broken: crate::core::broken::Armed) -> Self {
        self.broken = broken;
        self
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The host names a create gives (`--domain`, #54): only for a type
    /// with a service that takes them, each within the team's
    /// `domain_suffixes`, and none another live instance holds or was
    /// given. Two creates racing for one name both pass here; the store's
    /// reservation at publish serves only the first (`core::hosts`).
    pub(super) async fn check_given_domains(
        &self,
        request: &CreateRequest,
        entry: &CatalogEntry,
    ) -> Result<(), OpsError> {
        if request.domains.is_empty() {
            return Ok(());
        }
        if !entry.services.iter().any(|s| s.tenant_domains) {
            return Err(OpsError::Invalid(format!(
                "--domain: service type {:?} serves no host names given at create (no service \
                 of it has tenant_domains = true in the catalog)",
                entry.service_type
            )));
        }
        let suffixes = if crate::broken!(self.broken, IgnoreDomainSuffixes) {
            // The mutation exercise's broken rule: every name is allowed.
            request.domains.as_slice()
        } else {
            self.quotas
                .get(&request.team)
                .map(|team| team.domain_suffixes.as_slice())
                .unwrap_or_default()
        };
        check_given_domains(&request.team, &request.domains, suffixes)
            .map_err(|e| OpsError::Invalid(format!("--domain: {e}")))?;
        let held = self.held_hosts(&request.name).await?;
        if let Some(host) = request.domains.iter().find(|host| held.contains(*host)) {
            // Which instance holds it is not said: it may be another team's.
            return Err(OpsError::Conflict(format!(
                "--domain {host}: another live instance holds this host name; it is free once \
                 that instance is deleted"
            )));
        }
        Ok(())
    }

    /// The public host names live instances other than `name` hold: their
    /// reservations and the names they were given at create.
    async fn held_hosts(&self, name: &str) -> Result<BTreeSet<String>, OpsError> {
        let reservations = self
            .store
            .host_reservations()
            .await
            .map_err(OpsError::from)?;
        let instances = self.store.list_instances().await.map_err(OpsError::from)?;
        let others = instances
            .rows
            .into_iter()
            .filter(|i| i.state != InstanceState::Deleted && i.name.as_str() != name);
        Ok(reservations
            .into_iter()
            .filter(|r| r.instance.as_str() != name)
            .map(|r| r.host)
            .chain(others.flat_map(|i| i.domains))
            .collect())
    }

    /// What an instance of `entry` counts against its team's quotas: each
    /// service's memory limit (or the default) and its public host names.
    pub fn quota_charge(&self, entry: &CatalogEntry) -> QuotaCharge {
        const MIB: u64 = 1024 * 1024;
        let mut charge = QuotaCharge::default();
        for service in &entry.services {
            let bytes = service
                .run
                .memory_bytes
                .unwrap_or(self.memory_bytes_default);
            charge.memory_mb += bytes.div_ceil(MIB);
            charge.public_hosts += service.domains.len() as u64;
        }
        charge
    }

    /// Inserts `new` if its team's quotas allow it, in the store's one
    /// transaction (concurrent creates never pass a quota together).
    pub(super) async fn create_within_quota(
        &self,
        new: &NewInstance,
        entry: &CatalogEntry,
    ) -> Result<Instance, OpsError> {
        let mut quota = self.quotas.get(&new.team).cloned().unwrap_or_default();
        if crate::broken!(self.broken, QuotaOffByOne) {
            for limit in [
                &mut quota.max_instances,
                &mut quota.max_memory_mb,
                &mut quota.max_public_hosts,
            ] {
                *limit = limit.map(|l| l + 1);
            }
        }
        let mut charge = self.quota_charge(entry);
        charge.public_hosts += new.domains.len() as u64;
        self.store
            .create_instance_within(new, &quota, charge, self.now)
            .await
            .map_err(OpsError::from)?
            .map_err(|exceeded| OpsError::Conflict(exceeded.to_string()))
    }

    /// The instances in scope, in id order; deleted ones only with
    /// `include_deleted`. Rows that do not decode are left out.
    pub async fn list(&self, include_deleted: bool) -> Result<Vec<Instance>, OpsError> {
        let rows = self.store.list_instances().await.map_err(OpsError::from)?;
        Ok(rows
            .rows
            .into_iter()
            .filter(|i| self.scope.sees(&i.team))
            .filter(|i| include_deleted || i.state != InstanceState::Deleted)
            .collect())
    }

    /// Records a token and returns it with its secret, the one time the
    /// secret is known: only its hash is stored.
    pub async fn create_token(&self, request: &TokenRequest) -> Result<(Token, String), OpsError> {
        self.scope.check_fleet("a token")?;
        crate::core::names::check_dns_label("--team", &request.team)
            .map_err(|e| OpsError::Invalid(e.to_string()))?;
        if request.label.len() > TOKEN_LABEL_LEN_MAX || request.label.chars().any(char::is_control)
        {
            return Err(OpsError::Invalid(format!(
                "--label {:?}: at most {TOKEN_LABEL_LEN_MAX} printable characters",
                request.label
            )));
        }
        let expires_at = match request.expires_in {
            None => None,
            Some(d) if d.is_zero() || d > TTL_MAX => {
                return Err(OpsError::Invalid(format!(
                    "--expires {} s: must be between 1 s and {} s",
                    d.as_secs(),
                    TTL_MAX.as_secs()
                )))
            }
            Some(d) => Some(
                jiff::SignedDuration::try_from(d)
                    .ok()
                    .and_then(|d| self.now.checked_add(d).ok())
                    .ok_or_else(|| OpsError::Invalid(format!("--expires {d:?}: out of range")))?,
            ),
        };
        let secret = new_secret()?;
        let new = NewToken {
            team: request.team.clone(),
            role: request.role,
            secret_sha256: secret_sha256(&secret),
            label: request.label.clone(),
            expires_at,
        };
        let token = self
            .store
            .create_token(&new, self.now)
            .await
            .map_err(OpsError::from)?;
        Ok((token, secret))
    }

    /// Every token (never their secrets, which are not stored).
    pub async fn tokens(&self) -> Result<Vec<Token>, OpsError> {
        self.scope.check_fleet("the token list")?;
        self.store.tokens().await.map_err(OpsError::from)
    }

    /// Revokes token `id`; `Ok(false)` when it was revoked before.
    pub async fn revoke_token(&self, id: i64) -> Result<bool, OpsError> {
        self.scope.check_fleet("a token")?;
        match self
            .store
            .revoke_token(id, self.now)
            .await
            .map_err(OpsError::from)?
        {
            Revocation::Revoked => Ok(true),
            Revocation::AlreadyRevoked => Ok(false),
            Revocation::Unknown => Err(OpsError::NotFound(format!(
                "no token with id {id} (see `stead token list`)"
            ))),
        }
    }

    /// The live token `presented` is, if any: looked up by its hash, the
    /// hash compared again in constant time, then checked for revocation
    /// and expiry. `None` for anything else, without saying why.
    pub async fn authenticate(&self, presented: &str) -> Result<Option<Token>, OpsError> {
        if !presented.starts_with(TOKEN_PREFIX) || presented.len() > TOKEN_LEN_MAX {
            return Ok(None);
        }
        let digest = secret_sha256(presented);
        let found = self
            .store
            .token_by_secret_sha256(&digest)
            .await
            .map_err(OpsError::from)?;
        Ok(found.filter(|t| same_digest(&t.secret_sha256, &digest) && t.is_live(self.now)))
    }
}

/// A new token: the prefix and 32 bytes from the OS's generator, in hex.
fn new_secret() -> Result<String, OpsError> {
    use rand::TryRngCore;
    let mut bytes = [0u8; TOKEN_SECRET_BYTES];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes).map_err(|e| {
        OpsError::Busy(format!(
            "the OS's random number generator failed ({e}); no token was made, try again"
        ))
    })?;
    let mut secret = String::with_capacity(TOKEN_PREFIX.len() + 2 * TOKEN_SECRET_BYTES);
    secret.push_str(TOKEN_PREFIX);
    for b in bytes {
        secret.push_str(&format!("{b:02x}"));
    }
    Ok(secret)
}
