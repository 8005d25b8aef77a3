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
    bad_row, claim_order, decode_rollout, decode_rollout_record, decode_type_version, encode_binds,
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
/// (SQLite's upsert after a `SELECT` needs its `WHERE`.) What it returns
/// is the caller's: `TRY_LOCK_INSTANCES` the ids, `batch::LOCK_AND_LOAD`
/// their rows too.
macro_rules! lock_instances {
    () => {
        "INSERT INTO instance_locks (instance_id, holder, expires_at_us) \
         SELECT i.id, $2, CAST(unixepoch('subsec') * 1000000 AS INTEGER) + $3 FROM instances i \
         WHERE i.id IN (SELECT value FROM json_each($1)) \
         ON CONFLICT (instance_id) DO UPDATE SET holder = excluded.holder, \
           expires_at_us = excluded.expires_at_us \
         WHERE instance_locks.holder = excluded.holder \
            OR instance_locks.expires_at_us <= CAST(unixepoch('subsec') * 1000000 AS INTEGER) "
    };
}
const TRY_LOCK_INSTANCES: &str = concat!(lock_instances!(), "RETURNING instance_id");
/// T3: whether the lock row of `$1` is `$2`'s and unexpired by the
/// database's clock, read inside a write's `BEGIN IMMEDIATE` transaction:
/// nobody can take the lock before that write commits.
const HOLDS_LOCK: &str = "SELECT EXISTS (SELECT 1 FROM instance_locks \
     WHERE instance_id = $1 AND holder = $2 \
       AND expires_at_us > CAST(unixepoch('subsec') * 1000000 AS INTEGER))";
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
    /// Client-side bound on each lease, listing and snapshot call.
    call_timeout: Duration,
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
        Ok(Self::from_pool(pool))
    }

    /// Takes what of `stead.toml`'s `[database]` applies to one local file:
    /// the client-side bound on lease, listing and snapshot calls. (Its
    /// pool size is fixed and its lock waits are SQLite's busy timeout.)
    pub fn with_settings(self, settings: &DatabaseSettings) -> Self {
        Self {
            call_timeout: settings.call_timeout,
            ..self
        }
    }

    /// Wraps a pool the caller configured (it must have foreign keys on).
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            pool,
            call_timeout: DatabaseSettings::default().call_timeout,
        }
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

    /// One write, made only while `lock` is held (T3): checked inside the
    /// write's transaction, whose write lock no taker of the lock can pass.
    async fn write_locked<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        lock: &LockGrant,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write_transaction().await?;
        let held: bool = sqlx::query_scalar(HOLDS_LOCK)
            .bind(lock.instance)
            .bind(&lock.holder)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
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

/// The reads a pass makes of every instance (its listing, then each
/// batch's rows under their locks), each table's rows as one JSON array
/// of objects named as the row types' fields. sqlx's SQLite driver hands
/// every row from its connection thread to the caller's through a channel
/// and copies every value on the way: per row and value, that cost more
/// than the query. One value per read makes a batch three hand-overs
/// instead of one per row (issue #14: at 10,000 instances the batches'
/// decoding on the caller's thread alone was ~250 ms of an ~830 ms pass).
mod batch {
    /// An instance row as a JSON object.
    macro_rules! instance_object {
        () => {
            "json_object('id', id, 'name', name, 'team', team, \
             'service_type', service_type, 'version', version, 'state', state, \
             'stopped', stopped, 'expires_at_us', expires_at_us, \
             'maintenance_window', maintenance_window, 'created_at_us', created_at_us, \
             'updated_at_us', updated_at_us, 'parameters', parameters, \
             'purge_volumes', purge_volumes, 'spec_digest', spec_digest, \
             'domains', domains)"
        };
    }
    pub const INSTANCES: &str = concat!(
        "SELECT json_group_array(",
        instance_object!(),
        " ORDER BY id) FROM instances"
    );
    /// What a whole pass lists of every instance (`ListedRow`).
    pub const LISTED: &str = "SELECT json_group_array(json_object('id', id, 'name', name, \
         'service_type', service_type, 'state', state) ORDER BY id) FROM instances";
    pub const INSTANCES_OF_IDS: &str = concat!(
        "SELECT json_group_array(",
        instance_object!(),
        ") FROM instances WHERE id IN (SELECT value FROM json_each($1))"
    );
    /// An ACTIVE row as a JSON object.
    macro_rules! active_object {
        () => {
            "json_object('instance_id', instance_id, 'service', service, \
             'container_id', container_id, 'effective_revision', effective_revision, \
             'backend_binds', backend_binds, 'stop_grace_ms', stop_grace_ms, \
             'verified_started_at_ns', verified_started_at_ns)"
        };
    }
    /// An inhibition row as a JSON object.
    macro_rules! inhibition_object {
        () => {
            "json_object('instance_id', instance_id, 'service', service, \
             'container_id', container_id, 'reason', reason, 'operation', operation, \
             'created_at_us', created_at_us, 'stop_grace_ms', stop_grace_ms, \
             'revert_to', revert_to)"
        };
    }
    pub const ACTIVE_OF_IDS: &str = concat!(
        "SELECT json_group_array(",
        active_object!(),
        ") FROM active_services WHERE instance_id IN (SELECT value FROM json_each($1))"
    );
    pub const INHIBITIONS_OF_IDS: &str = concat!(
        "SELECT json_group_array(",
        inhibition_object!(),
        ") FROM inhibitions WHERE instance_id IN (SELECT value FROM json_each($1))"
    );
    /// T3 and a batch's reads in one statement: the locks taken as
    /// `TRY_LOCK_INSTANCES` takes them, and for each instance locked its
    /// row, ACTIVE and inhibitions, read by the same statement under the
    /// write lock that takes them (so after the locks, as a separate read
    /// would be). Two hand-overs a batch fewer than locking, then reading.
    /// Inside each subquery the bare column names are the subquery's
    /// table's (SQLite resolves a name in the innermost scope first).
    pub const LOCK_AND_LOAD: &str = concat!(
        lock_instances!(),
        "RETURNING instance_id, (SELECT ",
        instance_object!(),
        " FROM instances WHERE id = instance_locks.instance_id), (SELECT json_group_array(",
        active_object!(),
        ") FROM active_services WHERE instance_id = instance_locks.instance_id), \
         (SELECT json_group_array(",
        inhibition_object!(),
        ") FROM inhibitions WHERE instance_id = instance_locks.instance_id)"
    );
}

impl SqliteStore {
    /// Every instance row, by id.
    async fn instance_rows(&self) -> Result<Vec<ReadRow<InstanceRow>>, StoreError> {
        let json: String = sqlx::query_scalar(batch::INSTANCES)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        json_rows("instances", "id", &json)
    }

    /// Every instance as a whole pass lists it, by id.
    async fn listed_rows(&self) -> Result<Vec<ReadRow<ListedRow>>, StoreError> {
        let json: String = sqlx::query_scalar(batch::LISTED)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        json_rows("instances", "id", &json)
    }

    /// The rows of a batch of instances, read on three of the pool's
    /// connections at once: the caller holds the instances' locks, so no
    /// writer of theirs runs in between.
    async fn load_batch(&self, ids: &[InstanceId]) -> Result<BatchRows, StoreError> {
        let ids = id_list(ids);
        let read = |statement: &'static str| {
            sqlx::query_scalar::<_, String>(statement)
                .bind(ids.as_str())
                .fetch_one(&self.pool)
        };
        let (instances, active, inhibitions) = tokio::try_join!(
            read(batch::INSTANCES_OF_IDS),
            read(batch::ACTIVE_OF_IDS),
            read(batch::INHIBITIONS_OF_IDS),
        )
        .map_err(db_error)?;
        Ok((
            json_rows("instances", "id", &instances)?,
            json_rows("active_services", "instance_id", &active)?,
            json_rows("inhibitions", "instance_id", &inhibitions)?,
        ))
    }
}

impl SqliteStore {
    /// The locks of a batch and its rows read under them, in one statement
    /// (`batch::LOCK_AND_LOAD`). The rows come back one locked instance at
    /// a time: a row that does not decode fails only its instance.
    async fn lock_and_load_batch(
        &self,
        ids: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<(Vec<InstanceId>, Result<BatchRows, StoreError>), StoreError> {
        let rows: Vec<(i64, Option<String>, String, String)> = sqlx::query_as(batch::LOCK_AND_LOAD)
            .bind(id_list(ids))
            .bind(holder)
            .bind(lease_to_us(ttl))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        let locked = rows.iter().map(|(id, ..)| *id).collect();
        // The locks are taken from here on: what fails now is the rows'.
        let batch = || -> Result<BatchRows, StoreError> {
            let mut batch: BatchRows = (Vec::new(), Vec::new(), Vec::new());
            for (id, instance, active, inhibitions) in rows {
                // Taken from `instances` by the same statement: present.
                let instance = instance.unwrap_or_default();
                batch.0.push(
                    serde_json::from_str::<InstanceRow>(&instance)
                        .map_err(|e| (id, bad_row("instances", id, "row", &e.to_string()))),
                );
                batch
                    .1
                    .extend(json_rows("active_services", "instance_id", &active)?);
                batch
                    .2
                    .extend(json_rows("inhibitions", "instance_id", &inhibitions)?);
            }
            Ok(batch)
        };
        Ok((locked, batch()))
    }
}

/// A table's rows from their JSON array, each named by its `id_field`
/// (the instance's id). SQLite lets a column hold a value of any type: a
/// row that does not fit its type fails alone, as a bad row naming its
/// table, id and what is wrong, and the other rows read on (one tenant's
/// bad row never stops the others).
fn json_rows<T: serde::de::DeserializeOwned>(
    table: &'static str,
    id_field: &'static str,
    json: &str,
) -> Result<Vec<ReadRow<T>>, StoreError> {
    if let Ok(rows) = serde_json::from_str::<Vec<T>>(json) {
        return Ok(read_rows(rows));
    }
    // Some row does not fit: read them one by one to say which.
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| bad_row(table, "?", "rows", &e.to_string()))?;
    rows.into_iter()
        .map(|row| {
            let Some(id) = row.get(id_field).and_then(serde_json::Value::as_i64) else {
                let value = row
                    .get(id_field)
                    .map_or_else(String::new, ToString::to_string);
                return Err(bad_row(table, "?", id_field, &value));
            };
            Ok(serde_json::from_value::<T>(row)
                .map_err(|e| (id, bad_row(table, id, "row", &e.to_string()))))
        })
        .collect()
}

impl_sql_store!(SqliteStore, claim: sql::SQLITE_CLAIM, lock_lease: SELECT_LEASE);
// `BEGIN IMMEDIATE` serialises every create already: the team lock is a no-op.
super::tenancy::impl_sql_tenancy!(SqliteStore, lock_team: "SELECT $1 IS NULL");

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
