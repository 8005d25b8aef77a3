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
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use super::rows::{assemble_loaded, collect_rows, count_states, found_or, instance_found_or};
use super::rows::{
    claim_order, decode_rollout, decode_rollout_record, encode_binds, encode_grace,
    encode_parameters, encode_timestamp, inhibition_order, lease_grant, ActiveRow, InhibitionRow,
    InstanceRow, LeaseRow, TaskRow,
};
use super::shared::impl_sql_store;
use super::statements as sql;
use super::{db_error, migrate_error};
use crate::core::fleet::{
    Instance, InstanceId, InstanceState, NewTask, RolloutState, Task, TaskId, CANCELLED_BY_DELETION,
};
use crate::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, Inhibition, InstanceName, ServiceName,
    Timestamp,
};
use crate::ports::{
    Expired, LeaseGrant, LoadedInstances, NewInstance, RolloutRecord, Rows, Store, StoreError,
};
use crate::store::{
    execution_start_to_ns, fenced, lease_cutoff_us, lease_to_us, name_held_by_task, name_taken,
    timestamp_from_us, timestamp_to_us,
};

/// The database's clock in microseconds. SQLite lives on one host, so its
/// clock is that host's; `unixepoch('subsec')` has millisecond precision.
const SELECT_DB_NOW: &str = "SELECT CAST(unixepoch('subsec') * 1000000 AS INTEGER)";
/// The lease row with the database's clock. Writes take SQLite's one write
/// lock first (`BEGIN IMMEDIATE`), so reading it inside a write transaction
/// locks it.
const SELECT_LEASE: &str = "SELECT holder, epoch, expires_at_us, \
     CAST(unixepoch('subsec') * 1000000 AS INTEGER) AS now_us FROM reconciler_lease WHERE id = 1";

/// T3: take the free, expired or own locks of the instances a JSON array
/// names, in one statement; `$3` is the lock's length in microseconds.
/// (SQLite's upsert after a `SELECT` needs its `WHERE`.)
const TRY_LOCK_INSTANCES: &str = "INSERT INTO instance_locks (instance_id, holder, expires_at_us) \
     SELECT i.id, $2, CAST(unixepoch('subsec') * 1000000 AS INTEGER) + $3 FROM instances i \
     WHERE i.id IN (SELECT value FROM json_each($1)) \
     ON CONFLICT (instance_id) DO UPDATE SET holder = excluded.holder, \
       expires_at_us = excluded.expires_at_us \
     WHERE instance_locks.holder = excluded.holder \
        OR instance_locks.expires_at_us <= CAST(unixepoch('subsec') * 1000000 AS INTEGER) \
     RETURNING instance_id";
const UNLOCK_INSTANCES: &str = "DELETE FROM instance_locks \
     WHERE holder = $2 AND instance_id IN (SELECT value FROM json_each($1))";

/// A list of instance ids as the lock statements take it: a JSON array.
fn id_list(ids: &[InstanceId]) -> String {
    serde_json::to_string(ids).expect("a list of integers always serialises")
}

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
        let filename = options.get_filename().to_owned();
        let create = url.contains("mode=rwc");
        let pool = SqlitePoolOptions::new()
            .max_connections(CONNECTIONS_MAX)
            .connect_with(options)
            .await
            .map_err(|e| open_error(&filename, create, e))?;
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
        Self::migrator()
            .run(&self.pool)
            .await
            .map_err(migrate_error)
    }

    /// The embedded `migrations/sqlite`.
    pub fn migrator() -> &'static sqlx::migrate::Migrator {
        static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");
        &MIGRATOR
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
            let (row, now_us) = sqlx::query_as::<_, LeaseRow>(SELECT_LEASE)
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
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
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

    /// Runs one self-contained write; `true` if it changed any row.
    async fn write<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<bool, StoreError> {
        let done = query.execute(&self.pool).await.map_err(db_error)?;
        Ok(done.rows_affected() > 0)
    }
}

/// SQLite says only "unable to open database file": name the file and
/// find out why.
fn open_error(file: &Path, create: bool, error: sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!(
        "SQLite database {}: cannot open: {error}{}",
        file.display(),
        why_not_openable(file, create)
            .map(|why| format!(" ({why})"))
            .unwrap_or_default()
    ))
}

/// The likeliest reason a SQLite file cannot be opened, from what the file
/// system says about it and its directory.
fn why_not_openable(file: &Path, create: bool) -> Option<String> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) => return Some(format!("its directory {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => return Some(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
    }
    match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
            Some("the file does not exist; add ?mode=rwc to the URL to create it".to_owned())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !writable(dir) => Some(format!(
            "the file does not exist and its directory {} is not writable by this user",
            dir.display()
        )),
        Err(e) => Some(e.to_string()),
        Ok(m) if m.is_dir() => Some("it is a directory".to_owned()),
        Ok(_) if !writable(file) => Some("the file is not writable by this user".to_owned()),
        Ok(_) => None,
    }
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access(2) only reads it.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
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

/// The batch reads of `load_instances`, naming their ids as this backend
/// takes a list.
mod batch {
    super::sql::batch_loads!("IN (SELECT value FROM json_each($1))");
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
