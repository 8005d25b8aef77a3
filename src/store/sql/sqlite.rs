//! The SQLite store: the embedded default, one file, zero setup.
//!
//! SQLite has one writer at a time. Single-statement writes (enqueue, claim,
//! finish) are atomic by themselves; multi-statement writes (fenced writes,
//! TTL expiry, the reconciler lease) open with `BEGIN IMMEDIATE`, which takes
//! the write lock up front so a transaction never has to upgrade a read lock
//! (an upgrade can fail with `SQLITE_BUSY` regardless of the busy timeout).
//! WAL lets readers proceed while a writer holds the lock; the busy timeout
//! makes writers queue instead of failing.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use super::rows::{
    claim_order, decode_rollout, encode_binds, encode_grace, encode_timestamp, inhibition_order,
    lease_grant, ActiveRow, InhibitionRow, InstanceRow, LeaseRow, TaskRow, SELECT_LEASE,
};
use super::rows::{collect_rows, count_states, found_or, instance_found_or};
use super::shared::impl_sql_store;
use super::statements as sql;
use super::{db_error, migrate_error};
use crate::core::fleet::{
    Instance, InstanceId, InstanceState, NewTask, RolloutState, Task, TaskId,
};
use crate::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, Inhibition, InstanceName, ServiceName,
    Timestamp,
};
use crate::ports::{LeaseGrant, NewInstance, Rows, Store, StoreError};
use crate::store::{execution_start_to_ns, fenced, lease_cutoff_us, lease_to_us, timestamp_to_us};

/// How long a writer waits for SQLite's write lock before the call fails as
/// unavailable (and the tick retries).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Readers run in parallel under WAL; writers queue on the file lock anyway,
/// so a few connections are enough.
const CONNECTIONS_MAX: u32 = 4;

/// A [`Store`] on a SQLite file.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (with `?mode=rwc`, creates) the database file a `sqlite:` URL
    /// names, in WAL mode with foreign keys on and a busy timeout.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("bad SQLite URL: {e}")))?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(CONNECTIONS_MAX)
            .connect_with(options)
            .await
            .map_err(db_error)?;
        Ok(Self { pool })
    }

    /// Wraps a pool the caller configured (it must have foreign keys on).
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Applies the embedded `migrations/sqlite`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("migrations/sqlite")
            .run(&self.pool)
            .await
            .map_err(migrate_error)
    }

    async fn write_transaction(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)
    }

    /// Opens a write transaction, checking the fence inside it: the write
    /// lock is held from here to commit, so the lease cannot change hands
    /// in between.
    async fn fenced_transaction(
        &self,
        fence: Option<&LeaseGrant>,
    ) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let mut tx = self.write_transaction().await?;
        if let Some(grant) = fence {
            let row = sqlx::query_as::<_, LeaseRow>(SELECT_LEASE)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_error)?
                .decode();
            if !row.admits(grant) {
                return Err(fenced(grant));
            }
        }
        Ok(tx)
    }

    /// Runs one self-contained write; `true` if it changed any row.
    async fn write<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<bool, StoreError> {
        let done = query.execute(&self.pool).await.map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }
}

async fn insert_task<'e>(
    executor: impl sqlx::SqliteExecutor<'e>,
    task: &NewTask,
    now: Timestamp,
) -> Result<Option<TaskId>, StoreError> {
    sqlx::query_scalar::<_, i64>(sql::ENQUEUE)
        .bind(task.kind.as_str())
        .bind(task.instance)
        .bind(timestamp_to_us(task.run_after))
        .bind(&task.reason)
        .bind(&task.traceparent)
        .bind(timestamp_to_us(now))
        .fetch_optional(executor)
        .await
        .map_err(db_error)
}

impl_sql_store!(SqliteStore, claim: sql::SQLITE_CLAIM, lock_lease: SELECT_LEASE);

async fn write_lease(
    tx: &mut Transaction<'static, Sqlite>,
    row: &crate::store::ReconcilerLeaseRow,
) -> Result<(), StoreError> {
    sqlx::query(sql::WRITE_LEASE)
        .bind(&row.holder)
        .bind(row.epoch)
        .bind(row.expires_at_us)
        .execute(&mut **tx)
        .await
        .map_err(db_error)
        .map(drop)
}
