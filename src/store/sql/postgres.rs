//! The Postgres store: production, and the way to grow past one machine.
//!
//! Many workers on many hosts share one queue: a claim locks the due rows it
//! takes with `FOR UPDATE SKIP LOCKED`, so concurrent claimers skip each
//! other's rows instead of waiting or double-claiming. The reconciler lease is
//! a row in the same database: acquiring it locks the row `FOR UPDATE`, and a
//! fenced write reads it `FOR SHARE` inside its own transaction, so the lease
//! cannot change hands between the fence check and the commit.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::{Postgres, Transaction};

use super::rows::{assemble_loaded, collect_rows, count_states, found_or, instance_found_or};
use super::rows::{
    claim_order, decode_rollout, decode_rollout_record, decode_type_version, encode_binds,
    encode_domains, encode_grace, encode_parameters, encode_revert_to, encode_timestamp,
    inhibition_order, lease_grant, read_rows, ActiveRow, BatchRows, InhibitionRow, InstanceRow,
    LeaseRow, ListedRow, ReadRow, TaskRow,
};
use super::shared::impl_sql_store;
use super::statements as sql;
use super::{db_error, migrate_error};
use crate::config::daemon::DatabaseSettings;
use crate::core::fleet::{
    Instance, InstanceId, InstanceState, ListedInstance, NewTask, RolloutState, Task, TaskId,
    CANCELLED_BY_DELETION,
};
use crate::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, Inhibition, InstanceName, ServiceName,
    Timestamp,
};
use crate::ports::{
    Expired, LeaseGrant, LoadedInstances, LockGrant, LockedWrite, NewInstance, RolloutRecord, Rows,
    Store, StoreError, TypeVersion,
};
use crate::store::{
    execution_start_to_ns, fenced, lease_cutoff_us, lease_to_us, lock_lost, name_held_by_task,
    name_taken, timestamp_from_us, timestamp_to_us,
};

/// The database's clock in microseconds: `clock_timestamp()`, not `now()`,
/// which stands still for a whole transaction.
const SELECT_DB_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
/// Fenced writes share the lease row; acquiring and releasing lock it. Both
/// read the database's clock with it (T2).
const SHARE_LEASE: &str = "SELECT holder, epoch, expires_at_us, \
     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us \
     FROM reconciler_lease WHERE id = 1 FOR SHARE";
const LOCK_LEASE: &str = "SELECT holder, epoch, expires_at_us, \
     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us \
     FROM reconciler_lease WHERE id = 1 FOR UPDATE";

/// T3: take the free, expired or own locks of the instances in `$1`, in one
/// statement; `$3` is the lock's length in microseconds. A concurrent
/// taker of the same row waits for this transaction and then re-checks the
/// condition against what it committed.
const TRY_LOCK_INSTANCES: &str = "INSERT INTO instance_locks (instance_id, holder, expires_at_us) \
     SELECT i.id, $2, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + $3 \
     FROM instances i WHERE i.id = ANY($1) \
     ON CONFLICT (instance_id) DO UPDATE SET holder = excluded.holder, \
       expires_at_us = excluded.expires_at_us \
     WHERE instance_locks.holder = excluded.holder \
        OR instance_locks.expires_at_us <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
     RETURNING instance_id";
/// T3: the lock row of `$1` if it is `$2`'s and unexpired by the
/// database's clock, locked `FOR SHARE` inside a write's transaction: a
/// taker of the lock (the upsert of `TRY_LOCK_INSTANCES`) waits for that
/// write to commit, and then finds the row as it left it.
const HOLDS_LOCK: &str = "SELECT instance_id FROM instance_locks \
     WHERE instance_id = $1 AND holder = $2 \
       AND expires_at_us > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
     FOR SHARE";
const UNLOCK_INSTANCES: &str =
    "DELETE FROM instance_locks WHERE holder = $2 AND instance_id = ANY($1)";

/// A list of instance ids as the lock statements take it: an array.
fn id_list(ids: &[InstanceId]) -> Vec<i64> {
    ids.to_vec()
}

impl PostgresStore {
    /// Every instance row, by id.
    async fn instance_rows(&self) -> Result<Vec<ReadRow<InstanceRow>>, StoreError> {
        sqlx::query_as::<_, InstanceRow>(sql::LIST_INSTANCES)
            .fetch_all(&self.pool)
            .await
            .map(read_rows)
            .map_err(db_error)
    }

    /// Every instance as a whole pass lists it, by id.
    async fn listed_rows(&self) -> Result<Vec<ReadRow<ListedRow>>, StoreError> {
        sqlx::query_as::<_, ListedRow>(sql::LIST_FOR_RECOVERY)
            .fetch_all(&self.pool)
            .await
            .map(read_rows)
            .map_err(db_error)
    }

    /// The locks of a batch, then its rows read under them (two round
    /// trips; SQLite makes it one statement).
    async fn lock_and_load_batch(
        &self,
        ids: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<(Vec<InstanceId>, Result<BatchRows, StoreError>), StoreError> {
        let locked = self.try_lock_instances(ids, holder, ttl).await?;
        let rows = if locked.is_empty() {
            Ok((Vec::new(), Vec::new(), Vec::new()))
        } else {
            self.load_batch(&locked).await
        };
        Ok((locked, rows))
    }

    /// The rows of a batch of instances, read on three of the pool's
    /// connections at once: the caller holds the instances' locks, so no
    /// writer of theirs runs in between.
    async fn load_batch(&self, ids: &[InstanceId]) -> Result<BatchRows, StoreError> {
        let (instances, active, inhibitions) = tokio::try_join!(
            sqlx::query_as::<_, InstanceRow>(batch::INSTANCES_OF_IDS)
                .bind(id_list(ids))
                .fetch_all(&self.pool),
            sqlx::query_as::<_, ActiveRow>(batch::ACTIVE_OF_IDS)
                .bind(id_list(ids))
                .fetch_all(&self.pool),
            sqlx::query_as::<_, InhibitionRow>(batch::INHIBITIONS_OF_IDS)
                .bind(id_list(ids))
                .fetch_all(&self.pool),
        )
        .map_err(db_error)?;
        Ok((
            read_rows(instances),
            read_rows(active),
            read_rows(inhibitions),
        ))
    }
}

/// A [`Store`] on a Postgres database.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    /// Client-side bound on each lease, listing and snapshot call.
    call_timeout: Duration,
}

impl PostgresStore {
    /// [`Self::connect_with`] the default [`DatabaseSettings`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &DatabaseSettings::default()).await
    }

    /// Connects to the database a `postgres://` URL names (TLS as its
    /// `sslmode` and `sslrootcert` say), every pooled connection with the
    /// server-side timeouts of `settings`. One direct connection first,
    /// bounded by the acquire timeout: a pool retries a refused connection
    /// until its timeout and then says only "pool timed out", while one
    /// attempt says what the server, the OS or the TLS handshake answered.
    pub async fn connect_with(url: &str, settings: &DatabaseSettings) -> Result<Self, StoreError> {
        use sqlx::{ConnectOptions, Connection};
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("bad Postgres URL: {e}")))?
            .options(session_timeouts(settings));
        let server = describe_server(&options);
        let cannot =
            |why: String| StoreError::Unavailable(format!("{server}: cannot connect: {why}"));
        let acquire_timeout = settings.acquire_timeout;
        let ssl_mode = options.get_ssl_mode();
        match tokio::time::timeout(acquire_timeout, options.connect()).await {
            Err(_) => return Err(cannot(format!("no answer within {acquire_timeout:?}"))),
            Ok(Err(e)) => return Err(cannot(connect_error(e, ssl_mode))),
            Ok(Ok(probe)) => {
                let _ = probe.close().await;
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(acquire_timeout)
            .connect_with(options)
            .await
            .map_err(|e| cannot(connect_error(e, ssl_mode)))?;
        Ok(Self {
            pool,
            call_timeout: settings.call_timeout,
        })
    }

    /// Wraps a pool the caller configured (its connections' timeouts are
    /// the caller's; calls get the default client-side bound).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            call_timeout: DatabaseSettings::default().call_timeout,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the embedded `migrations/postgres`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        Self::migrator()
            .run(&self.pool)
            .await
            .map_err(migrate_error)
    }

    /// The embedded `migrations/postgres`.
    pub fn migrator() -> &'static sqlx::migrate::Migrator {
        static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
        &MIGRATOR
    }

    async fn write_transaction(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.pool.begin().await.map_err(db_error)
    }

    /// Opens a transaction, checking the fence inside it under a shared lock
    /// on the lease row: the lease cannot change hands before this
    /// transaction ends.
    async fn fenced_transaction(
        &self,
        fence: Option<&LeaseGrant>,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.write_transaction().await?;
        if let Some(grant) = fence {
            let (row, now_us) = sqlx::query_as::<_, LeaseRow>(SHARE_LEASE)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_error)?
                .decode();
            if !row.admits(grant, now_us) {
                return Err(fenced(grant));
            }
        }
        Ok(tx)
    }

    /// One write, fenced when a grant is given (T2).
    async fn write_fenced<'q>(
        &self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
        fence: Option<&LeaseGrant>,
    ) -> Result<bool, StoreError> {
        if fence.is_none() {
            return self.write(query).await;
        }
        let mut tx = self.fenced_transaction(fence).await?;
        let done = query.execute(&mut *tx).await.map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }

    /// One write, made only while `lock` is held (T3): checked inside the
    /// write's transaction under a shared lock on the lock row, so the lock
    /// cannot change hands before the write commits.
    async fn write_locked<'q>(
        &self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
        lock: &LockGrant,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write_transaction().await?;
        let held = sqlx::query_scalar::<_, i64>(HOLDS_LOCK)
            .bind(lock.instance)
            .bind(&lock.holder)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
            .is_some();
        if !held {
            return Err(lock_lost(lock));
        }
        let done = query.execute(&mut *tx).await.map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }

    /// Runs one self-contained write; `true` if it changed any row.
    async fn write<'q>(
        &self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<bool, StoreError> {
        let done = query.execute(&self.pool).await.map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }
}

/// The server-side timeouts every connection sets at startup (`options=-c
/// name=value`, as libpq's `PGOPTIONS`), in milliseconds; zero turns one
/// off. They follow any `options` the URL carries, so `stead.toml` wins.
fn session_timeouts(settings: &DatabaseSettings) -> [(&'static str, String); 3] {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    [
        ("statement_timeout", ms(settings.statement_timeout)),
        ("lock_timeout", ms(settings.lock_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(settings.idle_in_transaction_session_timeout),
        ),
    ]
}

/// What a failed connection attempt says. A failed TLS handshake (an
/// unknown issuer, a name mismatch, a server without TLS) is named as one,
/// with what to check: rustls reports a certificate it refuses as an I/O
/// error of kind `InvalidData`, which alone reads like a broken network.
fn connect_error(error: sqlx::Error, ssl_mode: PgSslMode) -> String {
    let tls_required = !matches!(ssl_mode, PgSslMode::Disable | PgSslMode::Allow);
    match error {
        sqlx::Error::Tls(e) => format!("TLS: {e} (check sslmode and sslrootcert)"),
        sqlx::Error::Io(e) if tls_required && e.kind() == std::io::ErrorKind::InvalidData => {
            format!("TLS: {e} (check sslmode and sslrootcert)")
        }
        // The operating system's own words ("Connection refused"), not
        // sqlx's wrapping of them.
        sqlx::Error::Io(e) => e.to_string(),
        e => e.to_string(),
    }
}

/// `Postgres at HOST:PORT (database D, user U)`, never the password.
fn describe_server(options: &PgConnectOptions) -> String {
    let host = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => options.get_host().to_owned(),
    };
    format!(
        "Postgres at {host}:{} (database {}, user {})",
        options.get_port(),
        options.get_database().unwrap_or("(default)"),
        options.get_username()
    )
}

async fn insert_task<'e>(
    executor: impl sqlx::PgExecutor<'e>,
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

/// The batch reads of `load_instances`, naming their ids as this backend
/// takes a list.
/// The batch reads of `load_instances`, the ids bound as one array.
/// (SQLite's read the same rows as JSON: `sqlite.rs`'s `batch`.)
mod batch {
    pub const INSTANCES_OF_IDS: &str = "SELECT id, name, team, service_type, version, state, \
         stopped, expires_at_us, maintenance_window, created_at_us, updated_at_us, parameters, \
         purge_volumes, spec_digest, domains FROM instances WHERE id = ANY($1)";
    pub const ACTIVE_OF_IDS: &str = "SELECT instance_id, service, container_id, \
         effective_revision, backend_binds, stop_grace_ms, verified_started_at_ns \
         FROM active_services WHERE instance_id = ANY($1)";
    pub const INHIBITIONS_OF_IDS: &str = "SELECT instance_id, service, container_id, reason, \
         operation, created_at_us, stop_grace_ms, revert_to FROM inhibitions \
         WHERE instance_id = ANY($1)";
}

impl_sql_store!(PostgresStore, claim: sql::POSTGRES_CLAIM, lock_lease: LOCK_LEASE);
super::tenancy::impl_sql_tenancy!(PostgresStore, lock_team: super::tenancy::POSTGRES_LOCK_TEAM);

async fn write_lease(
    tx: &mut Transaction<'static, Postgres>,
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
