//! Tenancy in the store (#54): the API's tokens and the per-team quotas a
//! create is held to. A supertrait of [`Store`](super::Store), so every
//! backend implements it and every `dyn Store` answers it.
//!
//! A token's secret is never stored: only its SHA-256. Tokens are 32 bytes
//! from the OS's generator, so a fast hash is enough — a slow KDF protects
//! guessable passwords, and 256 random bits are not guessable, so stretching
//! their hash would add latency to every request and no security.

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::core::fleet::{Instance, InstanceState};
use crate::core::types::Timestamp;
use crate::ports::{NewInstance, StoreError};

/// What a token may do: a tenant sees and changes its own team's
/// instances; an operator sees the fleet and may halt and resume rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TokenRole {
    Tenant,
    Operator,
}

impl TokenRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Operator => "operator",
        }
    }

    /// The role a row or a flag names; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "tenant" => Some(Self::Tenant),
            "operator" => Some(Self::Operator),
            _ => None,
        }
    }
}

/// A token as the store keeps it: everything but the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub id: i64,
    pub team: String,
    pub role: TokenRole,
    /// The secret's SHA-256, lower-case hex ([`secret_sha256`]).
    pub secret_sha256: String,
    pub label: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

impl Token {
    /// Whether the token may be used at `now`: not revoked, not expired.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at)
    }
}

/// A token to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewToken {
    pub team: String,
    pub role: TokenRole,
    pub secret_sha256: String,
    pub label: String,
    pub expires_at: Option<Timestamp>,
}

/// What [`Tenancy::revoke_token`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revocation {
    /// Revoked now.
    Revoked,
    /// Revoked before: nothing changed (revoking twice is safe).
    AlreadyRevoked,
    /// No token has that id.
    Unknown,
}

/// The SHA-256 of a token's secret, lower-case hex: what the store keeps
/// and looks a presented token up by.
pub fn secret_sha256(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equality of two digests in time independent of where they differ, so a
/// comparison's timing tells an attacker nothing about a stored hash.
pub fn same_digest(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A team's quotas (`[teams.NAME]` in `stead.toml`); `None` is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TeamQuota {
    pub max_instances: Option<u64>,
    pub max_memory_mb: Option<u64>,
    pub max_public_hosts: Option<u64>,
    /// The domains whose names (and names under them) the team may give
    /// its instances at create (#54); none unless listed.
    pub domain_suffixes: Vec<String>,
}

/// What one instance counts against its team's quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaCharge {
    pub memory_mb: u64,
    pub public_hosts: u64,
}

/// What a team's live (not deleted) instances use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaUsage {
    pub instances: u64,
    pub memory_mb: u64,
    pub public_hosts: u64,
}

/// A create refused by a quota: names the team, the quota and the numbers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "team {team:?} is at its quota {quota} = {limit}: {used} in use, this instance asks for \
     {asked} more"
)]
pub struct QuotaExceeded {
    pub team: String,
    /// The quota's key in `[teams.NAME]`.
    pub quota: &'static str,
    pub limit: u64,
    pub used: u64,
    pub asked: u64,
}

impl TeamQuota {
    /// The first quota `usage` plus `charge` would exceed, if any.
    pub fn check(
        &self,
        team: &str,
        usage: QuotaUsage,
        charge: QuotaCharge,
    ) -> Result<(), QuotaExceeded> {
        let checks = [
            ("max_instances", self.max_instances, usage.instances, 1),
            (
                "max_memory_mb",
                self.max_memory_mb,
                usage.memory_mb,
                charge.memory_mb,
            ),
            (
                "max_public_hosts",
                self.max_public_hosts,
                usage.public_hosts,
                charge.public_hosts,
            ),
        ];
        for (quota, limit, used, asked) in checks {
            if let Some(limit) = limit {
                if used.saturating_add(asked) > limit {
                    return Err(QuotaExceeded {
                        team: team.to_owned(),
                        quota,
                        limit,
                        used,
                        asked,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether an instance in `state` counts against its team's quotas.
pub fn counts_against_quota(state: InstanceState) -> bool {
    state != InstanceState::Deleted
}

/// Tokens and quota-held creates; every [`Store`](super::Store) is one.
#[async_trait]
pub trait Tenancy: Send + Sync {
    /// Records a token; its id is new.
    async fn create_token(&self, new: &NewToken, now: Timestamp) -> Result<Token, StoreError>;
    /// Every token, revoked and expired ones too, in id order.
    async fn tokens(&self) -> Result<Vec<Token>, StoreError>;
    /// The token whose secret hashes to `secret_sha256`, live or not.
    async fn token_by_secret_sha256(
        &self,
        secret_sha256: &str,
    ) -> Result<Option<Token>, StoreError>;
    /// Revokes token `id` at `now`. Idempotent: a revoked token keeps its
    /// first revocation time.
    async fn revoke_token(&self, id: i64, now: Timestamp) -> Result<Revocation, StoreError>;
    /// What `team`'s live instances use.
    async fn quota_usage(&self, team: &str) -> Result<QuotaUsage, StoreError>;
    /// [`Store::create_instance`](super::Store::create_instance), refused
    /// (`Ok(Err(_))`, nothing written) when `new.team`'s usage plus
    /// `charge` would exceed `quota`. The check and the insert are one
    /// transaction that serialises with every other create of the team, so
    /// concurrent creates never exceed a quota together.
    async fn create_instance_within(
        &self,
        new: &NewInstance,
        quota: &TeamQuota,
        charge: QuotaCharge,
        now: Timestamp,
    ) -> Result<Result<Instance, QuotaExceeded>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_names_the_first_limit_the_create_would_pass() {
        let quota = TeamQuota {
            domain_suffixes: Vec::new(),
            max_instances: Some(5),
            max_memory_mb: Some(1024),
            max_public_hosts: None,
        };
        let usage = QuotaUsage {
            instances: 4,
            memory_mb: 1000,
            public_hosts: 40,
        };
        let charge = QuotaCharge {
            memory_mb: 64,
            public_hosts: 3,
        };
        let refused = quota.check("a", usage, charge).unwrap_err();
        assert_eq!(
            (refused.quota, refused.limit, refused.used),
            ("max_memory_mb", 1024, 1000)
        );
        assert!(refused.to_string().contains("max_memory_mb = 1024"));
        let at_five = QuotaUsage {
            instances: 5,
            ..QuotaUsage::default()
        };
        assert_eq!(
            quota
                .check("a", at_five, QuotaCharge::default())
                .unwrap_err()
                .quota,
            "max_instances"
        );
        assert!(quota.check("a", QuotaUsage::default(), charge).is_ok());
    }

    #[test]
    fn digests_compare_equal_only_when_equal() {
        let a = secret_sha256("stead_x");
        assert!(same_digest(&a, &secret_sha256("stead_x")));
        assert!(!same_digest(&a, &secret_sha256("stead_y")));
        assert!(!same_digest(&a, &a[1..]));
        assert_eq!(a.len(), 64);
    }
}
