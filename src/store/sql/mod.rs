//! The SQL stores: [`SqliteStore`] (the embedded default) and
//! [`PostgresStore`] (production, and many workers on many hosts).
//!
//! Both speak the same schema (`migrations/sqlite`, `migrations/postgres`)
//! and, wherever the dialects agree, the very same statements
//! ([`statements`]); the backend files differ only where locking differs:
//! Postgres claims with `FOR UPDATE SKIP LOCKED` and fences under a shared
//! row lock, SQLite serialises writers with `BEGIN IMMEDIATE`. Rows are
//! decoded once, in [`rows`], into the core's types; a row another tool wrote
//! with a value stead does not know becomes a [`StoreError::BadRow`] naming
//! table, id, field and value.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::daemon::DatabaseSettings;
use crate::ports::{Store, StoreError};

pub mod backup;
mod hosts;
mod postgres;
mod rows;
mod shared;
mod sqlite;
pub mod statements;
mod tenancy;

pub use super::Backend;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Opens the store a URL names, with the default [`DatabaseSettings`]. It
/// does not migrate: run [`migrate`] first (the CLI's `migrate` command) or
/// [`connect_and_migrate`].
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    connect_with(url, &DatabaseSettings::default()).await
}

/// [`connect`] with the pool sizes and timeouts of `stead.toml`'s
/// `[database]`.
pub async fn connect_with(
    url: &str,
    settings: &DatabaseSettings,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match Backend::of_url(url)? {
        Backend::Sqlite => Arc::new(SqliteStore::connect(url).await?.with_settings(settings)),
        Backend::Postgres => Arc::new(PostgresStore::connect_with(url, settings).await?),
    })
}

/// Runs one store call with a client-side bound: a server that stops
/// answering (a hung host, a dropped network path) answers no server-side
/// timeout, and a tick waiting on it would never end. The error names the
/// call and the bound. Dropping the call's future drops its connection's
/// work: an open transaction is rolled back, by the server when the
/// connection goes.
async fn timed<T>(
    call: &'static str,
    limit: Duration,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, work).await {
        Ok(answer) => answer,
        Err(_) => Err(StoreError::Unavailable(format!(
            "{call}: no answer from the database within {} ms (database.call_timeout_ms)",
            limit.as_millis()
        ))),
    }
}

/// What [`migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// Migrations applied by this call: version and description.
    pub applied: Vec<(i64, String)>,
    /// Migrations the binary carries, all applied now.
    pub known: usize,
}

/// Applies the embedded migrations of the backend the URL names, and says
/// which it applied. Idempotent; safe to run while daemons are up (each
/// migration runs in a transaction and sqlx's migrator takes a lock so
/// concurrent runs do not collide).
pub async fn migrate(url: &str) -> Result<Migrated, StoreError> {
    match Backend::of_url(url)? {
        Backend::Sqlite => {
            let store = SqliteStore::connect(url).await?;
            let before: Vec<i64> = sqlx::query_scalar(APPLIED_MIGRATIONS)
                .fetch_all(store.pool())
                .await
                .unwrap_or_default();
            store.migrate().await?;
            Ok(migrated(SqliteStore::migrator(), &before))
        }
        Backend::Postgres => {
            let store = PostgresStore::connect_with(url, &migration_settings()).await?;
            let before: Vec<i64> = sqlx::query_scalar(APPLIED_MIGRATIONS)
                .fetch_all(store.pool())
                .await
                .unwrap_or_default();
            store.migrate().await?;
            Ok(migrated(PostgresStore::migrator(), &before))
        }
    }
}

/// A migration may rewrite a large table, and a second host migrating at
/// once waits for the first's advisory lock: migrations run without the
/// daemon's statement and lock timeouts (zero turns them off). The idle
/// bound stays.
fn migration_settings() -> DatabaseSettings {
    let defaults = DatabaseSettings::default();
    DatabaseSettings {
        statement_timeout: Duration::ZERO,
        lock_timeout: Duration::ZERO,
        call_timeout: Duration::MAX,
        ..defaults
    }
}

/// How many of the migrations this binary carries the Postgres database
/// behind `store` has not applied: all of them when it was never migrated
/// (no bookkeeping table), none when its schema is current. A daemon or a
/// command that does not migrate checks this before its first query, so
/// an unmigrated database is named as such instead of failing a statement.
pub async fn pending_migrations(store: &PostgresStore) -> Result<usize, StoreError> {
    /// Postgres's SQLSTATE for a table that does not exist.
    const UNDEFINED_TABLE: &str = "42P01";
    let before: Vec<i64> = match sqlx::query_scalar(APPLIED_MIGRATIONS)
        .fetch_all(store.pool())
        .await
    {
        Ok(versions) => versions,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_TABLE) => Vec::new(),
        Err(e) => return Err(db_error(e)),
    };
    Ok(migrated(PostgresStore::migrator(), &before).applied.len())
}

/// Versions already recorded as applied; none when the bookkeeping table
/// does not exist yet (a new database).
const APPLIED_MIGRATIONS: &str = "SELECT version FROM _sqlx_migrations WHERE success";

fn migrated(migrator: &sqlx::migrate::Migrator, before: &[i64]) -> Migrated {
    Migrated {
        applied: migrator
            .iter()
            .filter(|m| !before.contains(&m.version))
            .map(|m| (m.version, m.description.to_string()))
            .collect(),
        known: migrator.iter().count(),
    }
}

/// [`migrate`], then [`connect`]: the zero-setup path for the embedded
/// SQLite default.
pub async fn connect_and_migrate(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match Backend::of_url(url)? {
        Backend::Sqlite => {
            let store = SqliteStore::connect(url).await?;
            store.migrate().await?;
            Arc::new(store)
        }
        Backend::Postgres => {
            let store = PostgresStore::connect(url).await?;
            store.migrate().await?;
            Arc::new(store)
        }
    })
}

/// Maps a driver error onto the port's vocabulary. Constraint violations are
/// the database enforcing the schema (a taken name, a missing instance);
/// everything else is the database being unreachable or unwell, which a tick
/// retries.
fn db_error(error: sqlx::Error) -> StoreError {
    use sqlx::error::ErrorKind;
    match &error {
        sqlx::Error::Database(db) => match db.kind() {
            ErrorKind::UniqueViolation => StoreError::Conflict(db.message().to_owned()),
            ErrorKind::ForeignKeyViolation => StoreError::NotFound(db.message().to_owned()),
            ErrorKind::CheckViolation | ErrorKind::NotNullViolation => {
                StoreError::Conflict(db.message().to_owned())
            }
            _ => StoreError::Unavailable(error.to_string()),
        },
        sqlx::Error::RowNotFound => StoreError::NotFound(error.to_string()),
        _ => StoreError::Unavailable(error.to_string()),
    }
}

fn migrate_error(error: sqlx::migrate::MigrateError) -> StoreError {
    StoreError::Unavailable(format!("migration failed: {error}"))
}
