//! The in-memory store's tokens and quota-held creates (#54): the model
//! the SQL backends' `Tenancy` is checked against. Each call takes the
//! store's one lock, so a quota check and its insert are one step, as the
//! SQL stores make them one transaction.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::MemoryStore;
use stead::core::fleet::{Instance, InstanceId};
use stead::core::types::Timestamp;
use stead::ports::tenancy::counts_against_quota;
use stead::ports::{
    NewInstance, NewToken, QuotaCharge, QuotaExceeded, QuotaUsage, Revocation, StoreError,
    TeamQuota, Tenancy, Token,
};
use stead::store::normalize_timestamp;

#[derive(Debug, Default)]
pub(super) struct TenancyState {
    tokens: BTreeMap<i64, Token>,
    next_token_id: i64,
    /// What each instance was charged against its team's quotas.
    charges: BTreeMap<InstanceId, QuotaCharge>,
}

impl super::State {
    fn quota_usage(&self, team: &str) -> QuotaUsage {
        let mut usage = QuotaUsage::default();
        for instance in self.instances.values() {
            if instance.team != team || !counts_against_quota(instance.state) {
                continue;
            }
            let charge = self
                .tenancy
                .charges
                .get(&instance.id)
                .copied()
                .unwrap_or_default();
            usage.instances += 1;
            usage.memory_mb += charge.memory_mb;
            usage.public_hosts += charge.public_hosts;
        }
        usage
    }
}

#[async_trait]
impl Tenancy for MemoryStore {
    async fn create_token(&self, new: &NewToken, now: Timestamp) -> Result<Token, StoreError> {
        let mut state = self.call()?;
        let tenancy = &mut state.tenancy;
        if tenancy
            .tokens
            .values()
            .any(|t| t.secret_sha256 == new.secret_sha256)
        {
            return Err(StoreError::Conflict(
                "a token with that secret exists".into(),
            ));
        }
        tenancy.next_token_id += 1;
        let token = Token {
            id: tenancy.next_token_id,
            team: new.team.clone(),
            role: new.role,
            secret_sha256: new.secret_sha256.clone(),
            label: new.label.clone(),
            created_at: normalize_timestamp(now),
            expires_at: new.expires_at.map(normalize_timestamp),
            revoked_at: None,
        };
        tenancy.tokens.insert(token.id, token.clone());
        Ok(token)
    }

    async fn tokens(&self) -> Result<Vec<Token>, StoreError> {
        Ok(self.call()?.tenancy.tokens.values().cloned().collect())
    }

    async fn token_by_secret_sha256(
        &self,
        secret_sha256: &str,
    ) -> Result<Option<Token>, StoreError> {
        Ok(self
            .call()?
            .tenancy
            .tokens
            .values()
            .find(|t| t.secret_sha256 == secret_sha256)
            .cloned())
    }

    async fn revoke_token(&self, id: i64, now: Timestamp) -> Result<Revocation, StoreError> {
        let mut state = self.call()?;
        Ok(match state.tenancy.tokens.get_mut(&id) {
            None => Revocation::Unknown,
            Some(token) if token.revoked_at.is_some() => Revocation::AlreadyRevoked,
            Some(token) => {
                token.revoked_at = Some(normalize_timestamp(now));
                Revocation::Revoked
            }
        })
    }

    async fn quota_usage(&self, team: &str) -> Result<QuotaUsage, StoreError> {
        Ok(self.call()?.quota_usage(team))
    }

    async fn create_instance_within(
        &self,
        new: &NewInstance,
        quota: &TeamQuota,
        charge: QuotaCharge,
        now: Timestamp,
    ) -> Result<Result<Instance, QuotaExceeded>, StoreError> {
        let mut state = self.call()?;
        let usage = state.quota_usage(&new.team);
        if let Err(exceeded) = quota.check(&new.team, usage, charge) {
            return Ok(Err(exceeded));
        }
        let instance = state.create(new, now)?;
        state.tenancy.charges.insert(instance.id, charge);
        Ok(Ok(instance))
    }
}
