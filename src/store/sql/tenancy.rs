//! [`Tenancy`](crate::ports::Tenancy) for both SQL backends (#54): the
//! API's tokens and the quota-held create. Like [`super::shared`], a macro
//! expanded in each backend's file, where its transaction helpers are.
//!
//! Quotas are checked in the create's own transaction. SQLite's write
//! transaction (`BEGIN IMMEDIATE`) already serialises every writer; on
//! Postgres the transaction first takes an advisory lock keyed by the team,
//! so two creates of one team queue while creates of other teams do not.

use crate::ports::{StoreError, Token, TokenRole};
use crate::store::timestamp_from_us;

use super::rows::bad_row;

pub const CREATE_TOKEN: &str = "INSERT INTO tokens \
     (team, role, secret_sha256, label, created_at_us, expires_at_us) \
     VALUES ($1, $2, $3, $4, $5, $6) \
     RETURNING id, team, role, secret_sha256, label, created_at_us, expires_at_us, revoked_at_us";
pub const TOKENS: &str = "SELECT id, team, role, secret_sha256, label, created_at_us, \
     expires_at_us, revoked_at_us FROM tokens ORDER BY id";
pub const TOKEN_BY_SECRET_SHA256: &str = "SELECT id, team, role, secret_sha256, label, \
     created_at_us, expires_at_us, revoked_at_us FROM tokens WHERE secret_sha256 = $1";
/// Sets the revocation time only once: revoking twice keeps the first.
pub const REVOKE_TOKEN: &str =
    "UPDATE tokens SET revoked_at_us = $2 WHERE id = $1 AND revoked_at_us IS NULL";
pub const TOKEN_EXISTS: &str = "SELECT COUNT(*) FROM tokens WHERE id = $1";
/// What a team's live instances count against its quotas.
pub const QUOTA_USAGE: &str = "SELECT COUNT(*), \
     CAST(COALESCE(SUM(quota_memory_mb), 0) AS BIGINT), \
     CAST(COALESCE(SUM(quota_public_hosts), 0) AS BIGINT) \
     FROM instances WHERE team = $1 AND state <> 'deleted'";
pub const SET_QUOTA_CHARGE: &str =
    "UPDATE instances SET quota_memory_mb = $2, quota_public_hosts = $3 WHERE id = $1";
/// Postgres: serialise the creates of one team until the transaction ends.
pub const POSTGRES_LOCK_TEAM: &str =
    "SELECT pg_advisory_xact_lock(hashtext('stead.team-quota'), hashtext($1))";

/// A token row: id, team, role, hash, label, created, expires, revoked.
pub type TokenRow = (
    i64,
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<i64>,
);

pub fn decode_token(row: TokenRow) -> Result<Token, StoreError> {
    let (id, team, role, secret_sha256, label, created, expires, revoked) = row;
    let time = |field: &'static str, us: i64| {
        timestamp_from_us(us).ok_or_else(|| bad_row("tokens", id, field, &us.to_string()))
    };
    Ok(Token {
        id,
        role: TokenRole::parse(&role).ok_or_else(|| bad_row("tokens", id, "role", &role))?,
        team,
        secret_sha256,
        label,
        created_at: time("created_at_us", created)?,
        expires_at: expires.map(|us| time("expires_at_us", us)).transpose()?,
        revoked_at: revoked.map(|us| time("revoked_at_us", us)).transpose()?,
    })
}

/// Inserts `$new` in `$tx` at `$now` as `Store::create_instance` does:
/// a deleted holder of the name is removed with its finished tasks, a live
/// one (or one a task still works on) refuses. Evaluates to the instance.
macro_rules! insert_instance {
    ($tx:expr, $new:expr, $now:expr) => {{
        let new: &NewInstance = $new;
        let holder = sqlx::query_as::<_, InstanceRow>(sql::INSTANCE_BY_NAME)
            .bind(new.name.as_str())
            .fetch_optional(&mut *$tx)
            .await
            .map_err(db_error)?
            .map(InstanceRow::decode)
            .transpose()?;
        if let Some(holder) = holder {
            if holder.state != InstanceState::Deleted {
                return Err(name_taken(&new.name, holder.id, holder.state));
            }
            let active: i64 = sqlx::query_scalar(sql::ACTIVE_TASKS_OF_INSTANCE)
                .bind(holder.id)
                .fetch_one(&mut *$tx)
                .await
                .map_err(db_error)?;
            if active > 0 {
                return Err(name_held_by_task(&new.name, holder.id));
            }
            for statement in [
                sql::DELETE_FINISHED_TASKS_OF_INSTANCE,
                sql::DELETE_DELETED_INSTANCE,
            ] {
                sqlx::query(statement)
                    .bind(holder.id)
                    .execute(&mut *$tx)
                    .await
                    .map_err(db_error)?;
            }
        }
        sqlx::query_as::<_, InstanceRow>(sql::CREATE_INSTANCE)
            .bind(new.name.as_str())
            .bind(&new.team)
            .bind(&new.service_type)
            .bind(&new.version)
            .bind(encode_timestamp(new.expires_at))
            .bind(&new.maintenance_window)
            .bind(timestamp_to_us($now))
            .bind(encode_parameters(&new.parameters))
            .bind(&new.spec_digest)
            .bind(encode_domains(&new.domains))
            .fetch_one(&mut *$tx)
            .await
            .map_err(db_error)?
            .decode()?
    }};
}
pub(super) use insert_instance;

/// `impl Tenancy for $store`; `$lock_team` is run first in a create's
/// transaction with the team bound (a no-op where the write transaction
/// serialises already).
macro_rules! impl_sql_tenancy {
    ($store:ty, lock_team: $lock_team:expr) => {
        #[async_trait::async_trait]
        impl crate::ports::Tenancy for $store {
            async fn create_token(
                &self,
                new: &crate::ports::NewToken,
                now: Timestamp,
            ) -> Result<crate::ports::Token, StoreError> {
                use super::tenancy as t;
                let row: t::TokenRow = sqlx::query_as(t::CREATE_TOKEN)
                    .bind(&new.team)
                    .bind(new.role.as_str())
                    .bind(&new.secret_sha256)
                    .bind(&new.label)
                    .bind(timestamp_to_us(now))
                    .bind(encode_timestamp(new.expires_at))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db_error)?;
                t::decode_token(row)
            }

            async fn tokens(&self) -> Result<Vec<crate::ports::Token>, StoreError> {
                use super::tenancy as t;
                let rows: Vec<t::TokenRow> = sqlx::query_as(t::TOKENS)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                rows.into_iter().map(t::decode_token).collect()
            }

            async fn token_by_secret_sha256(
                &self,
                secret_sha256: &str,
            ) -> Result<Option<crate::ports::Token>, StoreError> {
                use super::tenancy as t;
                let row: Option<t::TokenRow> = sqlx::query_as(t::TOKEN_BY_SECRET_SHA256)
                    .bind(secret_sha256)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?;
                row.map(t::decode_token).transpose()
            }

            async fn revoke_token(
                &self,
                id: i64,
                now: Timestamp,
            ) -> Result<crate::ports::Revocation, StoreError> {
                use super::tenancy as t;
                let changed = sqlx::query(t::REVOKE_TOKEN)
                    .bind(id)
                    .bind(timestamp_to_us(now))
                    .execute(&self.pool)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                if changed > 0 {
                    return Ok(crate::ports::Revocation::Revoked);
                }
                let exists: i64 = sqlx::query_scalar(t::TOKEN_EXISTS)
                    .bind(id)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db_error)?;
                Ok(if exists > 0 {
                    crate::ports::Revocation::AlreadyRevoked
                } else {
                    crate::ports::Revocation::Unknown
                })
            }

            async fn quota_usage(
                &self,
                team: &str,
            ) -> Result<crate::ports::QuotaUsage, StoreError> {
                let (instances, memory_mb, public_hosts): (i64, i64, i64) =
                    sqlx::query_as(super::tenancy::QUOTA_USAGE)
                        .bind(team)
                        .fetch_one(&self.pool)
                        .await
                        .map_err(db_error)?;
                Ok(super::tenancy::usage(instances, memory_mb, public_hosts))
            }

            #[tracing::instrument(name = "store.create_instance_within", level = "debug", skip_all)]
            async fn create_instance_within(
                &self,
                new: &NewInstance,
                quota: &crate::ports::TeamQuota,
                charge: crate::ports::QuotaCharge,
                now: Timestamp,
            ) -> Result<Result<Instance, crate::ports::QuotaExceeded>, StoreError> {
                use super::tenancy as t;
                let mut tx = self.write_transaction().await?;
                sqlx::query($lock_team)
                    .bind(&new.team)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                let (instances, memory_mb, public_hosts): (i64, i64, i64) =
                    sqlx::query_as(t::QUOTA_USAGE)
                        .bind(&new.team)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_error)?;
                let usage = t::usage(instances, memory_mb, public_hosts);
                if let Err(exceeded) = quota.check(&new.team, usage, charge) {
                    return Ok(Err(exceeded)); // Dropping the transaction rolls it back.
                }
                let created = super::tenancy::insert_instance!(tx, new, now);
                sqlx::query(t::SET_QUOTA_CHARGE)
                    .bind(created.id)
                    .bind(i64::try_from(charge.memory_mb).unwrap_or(i64::MAX))
                    .bind(i64::try_from(charge.public_hosts).unwrap_or(i64::MAX))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                Ok(Ok(created))
            }
        }
    };
}
pub(super) use impl_sql_tenancy;

/// Usage from the database's counts (never negative).
pub fn usage(instances: i64, memory_mb: i64, public_hosts: i64) -> crate::ports::QuotaUsage {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    crate::ports::QuotaUsage {
        instances: count(instances),
        memory_mb: count(memory_mb),
        public_hosts: count(public_hosts),
    }
}
