//! `stead backup` and `stead restore` for the SQLite store.
//!
//! A backup is SQLite's own `VACUUM INTO`: it reads the database inside one
//! read transaction, so it is consistent (every row as of one commit) and
//! online (under WAL a running daemon keeps writing meanwhile), and it
//! writes a compact, self-contained file with no `-wal` beside it. It is
//! written to a temporary file in the target's directory and moved to its
//! name only once whole, so a backup that fails halfway leaves no file that
//! looks like one.
//!
//! A restore checks that the file is a stead database at a schema this
//! binary knows (its applied migrations, each with the checksum of this
//! binary's), that no daemon holds the reconciler lease or an instance lock
//! in the database it replaces, copies the file next to the database,
//! migrates the copy (a backup taken by an older stead is brought up to
//! this binary's schema, as SQLite always is when opened) and moves it into
//! place.
//!
//! Postgres has tools of its own for this (`pg_dump`, `pg_restore`);
//! both functions refuse a Postgres URL with [`BackupError::UsePostgresTools`].

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::SqlitePool;

use super::{Backend, SqliteStore};
use crate::ports::StoreError;

/// Why a backup or a restore was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The configured database is Postgres: its own tools back it up.
    #[error(
        "the configured database is Postgres ({database}); stead backup and restore copy a \
         SQLite file: back Postgres up with pg_dump and restore it with pg_restore \
         (docs/operations.md, \"Backup and restore\")"
    )]
    UsePostgresTools { database: String },
    /// The backup's file exists and overwriting was not asked for.
    #[error("{}: already exists; choose another file, or pass --force to replace it", .0.display())]
    Exists(PathBuf),
    /// A restore would replace a database that exists, and that was not
    /// asked for.
    #[error(
        "{}: a database exists there; pass --force to replace it with the backup",
        .0.display()
    )]
    TargetExists(PathBuf),
    /// A process still uses the database a restore would replace.
    #[error(
        "{database}: {what}; stop every stead process that uses this database \
         (systemctl stop stead), then run the restore again"
    )]
    InUse { database: String, what: String },
    /// The file to restore is not a stead database this binary can take.
    #[error("{}: {why}", .file.display())]
    NotStead { file: PathBuf, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{}: {error}", .file.display())]
    Io {
        file: PathBuf,
        error: std::io::Error,
    },
}

/// What a backup or a restore left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copied {
    /// The file written: the backup, or the restored database.
    pub file: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its newest migration (the schema it is at).
    pub schema: i64,
    /// Live (not deleted) instances in it.
    pub instances: i64,
    /// Migrations the restore applied to bring the backup up to this
    /// binary's schema; none for a backup.
    pub migrated: Vec<i64>,
}

/// Copies the SQLite database `url` names to `file`, consistently, while
/// daemons keep running. Refuses an existing `file` unless `overwrite`.
pub async fn backup(url: &str, file: &Path, overwrite: bool) -> Result<Copied, BackupError> {
    let source = sqlite_file(url)?;
    if !overwrite && file.exists() {
        return Err(BackupError::Exists(file.to_owned()));
    }
    let pool = open(&source, false).await?;
    schema_of(&pool, &source).await?;
    let temporary = Temporary::beside(file)?;
    // VACUUM INTO takes its file name as an expression: bound, not spliced.
    sqlx::query("VACUUM INTO $1")
        .bind(temporary.path_text()?)
        .execute(&pool)
        .await
        .map_err(|e| StoreError::Unavailable(format!("{}: VACUUM INTO: {e}", source.display())))?;
    pool.close().await;
    // The database holds instance parameters and the operator's data:
    // the copy is for its owner only.
    set_mode(temporary.path(), 0o600)?;
    let copy = open(temporary.path(), true).await?;
    let (schema, instances) = (
        schema_of(&copy, temporary.path()).await?,
        instances(&copy).await?,
    );
    copy.close().await;
    temporary.persist(file, overwrite)?;
    Ok(Copied {
        file: file.to_owned(),
        bytes: size(file)?,
        schema,
        instances,
        migrated: Vec::new(),
    })
}

/// Replaces the SQLite database `url` names with the backup `file`. Refuses
/// a file that is not a stead database at a schema this binary knows, a
/// database that a daemon still uses (its reconciler lease or an instance
/// lock is live), and an existing database unless `overwrite`.
pub async fn restore(url: &str, file: &Path, overwrite: bool) -> Result<Copied, BackupError> {
    let target = sqlite_file(url)?;
    let backup = open(file, true).await?;
    let quick = sqlx::query_scalar::<_, String>("PRAGMA quick_check")
        .fetch_one(&backup)
        .await
        .map_err(|e| not_stead(file, format!("not a readable SQLite database ({e})")))?;
    if quick != "ok" {
        return Err(not_stead(
            file,
            format!("damaged: quick_check says {quick}"),
        ));
    }
    schema_of(&backup, file).await?;
    if target.exists() {
        if !overwrite {
            return Err(BackupError::TargetExists(target));
        }
        refuse_if_in_use(url, &target).await?;
    }
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|error| BackupError::Io {
            file: dir.to_owned(),
            error,
        })?;
    }
    let temporary = Temporary::beside(&target)?;
    sqlx::query("VACUUM INTO $1")
        .bind(temporary.path_text()?)
        .execute(&backup)
        .await
        .map_err(|e| StoreError::Unavailable(format!("{}: VACUUM INTO: {e}", file.display())))?;
    backup.close().await;

    // Brought up to this binary's schema before it takes the database's
    // place, so a restore either leaves a current database or none.
    let restored = SqliteStore::connect(&sqlite_url(temporary.path())).await?;
    let before = applied(restored.pool()).await?;
    restored.migrate().await?;
    // Nothing runs on the restored database yet: the lease and the instance
    // locks recorded at backup time belong to processes that are gone, and
    // would make the next daemon wait out their expiry. The lease's epoch
    // is kept, so fencing still only moves forward from it.
    sqlx::raw_sql(
        "UPDATE reconciler_lease SET holder = NULL, expires_at_us = NULL WHERE id = 1; \
         DELETE FROM instance_locks;",
    )
    .execute(restored.pool())
    .await
    .map_err(super::db_error)?;
    // One file again: the migrations' WAL folded in, before the move.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(restored.pool())
        .await
        .map_err(super::db_error)?;
    let schema = schema_of(restored.pool(), temporary.path()).await?;
    let instances = instances(restored.pool()).await?;
    let migrated = applied(restored.pool())
        .await?
        .into_iter()
        .filter(|v| !before.contains(v))
        .collect();
    restored.pool().close().await;
    remove_sidecars(temporary.path())?;
    // The restored file takes the replaced one's permissions (or only
    // its owner's, when there was none).
    let mode = std::fs::metadata(&target).map_or(0o600, |m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o7777
    });
    set_mode(temporary.path(), mode)?;
    temporary.persist(&target, true)?;
    // The replaced database's WAL and shared memory were checkpointed and
    // emptied above; left beside the new file they would be read as its.
    remove_sidecars(&target)?;
    Ok(Copied {
        file: target.clone(),
        bytes: size(&target)?,
        schema,
        instances,
        migrated,
    })
}

/// The database file of a `sqlite:` URL; a Postgres URL is refused.
fn sqlite_file(url: &str) -> Result<PathBuf, BackupError> {
    match Backend::of_url(url)? {
        Backend::Postgres => Err(BackupError::UsePostgresTools {
            database: crate::daemon::redact(url),
        }),
        Backend::Sqlite => {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::Unavailable(format!("bad SQLite URL: {e}")))?;
            Ok(options.get_filename().to_owned())
        }
    }
}

fn sqlite_url(file: &Path) -> String {
    format!("sqlite://{}", file.display())
}

/// One connection to an existing SQLite file; `read_only` for a file this
/// command only reads.
async fn open(file: &Path, read_only: bool) -> Result<SqlitePool, BackupError> {
    if !file.is_file() {
        return Err(BackupError::Io {
            file: file.to_owned(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file (or not a regular file)",
            ),
        });
    }
    let options = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(false)
        .read_only(read_only);
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| not_stead(file, format!("cannot open as SQLite: {e}")))
}

/// The newest migration of the stead database behind `pool`, after
/// checking that every migration it records is one of this binary's, with
/// the same checksum.
async fn schema_of(pool: &SqlitePool, file: &Path) -> Result<i64, BackupError> {
    let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
        "SELECT version, checksum FROM _sqlx_migrations WHERE success ORDER BY version",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| {
        not_stead(
            file,
            format!("not a stead database (no migration record: {e})"),
        )
    })?;
    let known = SqliteStore::migrator();
    for (version, checksum) in &rows {
        match known.iter().find(|m| m.version == *version) {
            None => {
                return Err(not_stead(
                    file,
                    format!(
                        "has migration {version}, which this stead does not know (a newer \
                         stead's backup?); restore it with that version of stead"
                    ),
                ))
            }
            Some(m) if m.checksum.as_ref() != checksum.as_slice() => {
                return Err(not_stead(
                    file,
                    format!("migration {version} differs from this stead's (edited by hand?)"),
                ))
            }
            Some(_) => {}
        }
    }
    rows.last().map(|(version, _)| *version).ok_or_else(|| {
        not_stead(
            file,
            "not a stead database (no migration applied)".to_owned(),
        )
    })
}

async fn applied(pool: &SqlitePool) -> Result<Vec<i64>, BackupError> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
        .map_err(|e| BackupError::Store(super::db_error(e)))
}

async fn instances(pool: &SqlitePool) -> Result<i64, BackupError> {
    sqlx::query_scalar("SELECT COUNT(*) FROM instances WHERE state <> 'deleted'")
        .fetch_one(pool)
        .await
        .map_err(|e| BackupError::Store(super::db_error(e)))
}

/// Refuses while the reconciler lease or any instance lock in the database
/// at `target` is live, by the database's clock (SQLite's is the host's).
async fn refuse_if_in_use(url: &str, target: &Path) -> Result<(), BackupError> {
    let pool = open(target, false).await?;
    let lease: Option<(Option<String>, Option<i64>, i64)> = sqlx::query_as(
        "SELECT holder, expires_at_us, CAST(unixepoch('subsec') * 1000000 AS INTEGER) \
         FROM reconciler_lease WHERE id = 1",
    )
    .fetch_optional(&pool)
    .await
    .map_err(|e| {
        not_stead(
            target,
            format!("the database to replace has no lease table ({e})"),
        )
    })?;
    let database = crate::daemon::redact(url);
    if let Some((Some(holder), Some(expires_us), now_us)) = lease {
        if expires_us > now_us {
            return Err(BackupError::InUse {
                database,
                what: format!(
                    "{holder} holds the reconciler lease for {} s more",
                    (expires_us - now_us + 999_999) / 1_000_000
                ),
            });
        }
    }
    let locks: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.name, l.holder FROM instance_locks l JOIN instances i ON i.id = l.instance_id \
         WHERE l.expires_at_us > CAST(unixepoch('subsec') * 1000000 AS INTEGER) LIMIT 3",
    )
    .fetch_all(&pool)
    .await
    .map_err(|e| BackupError::Store(super::db_error(e)))?;
    if let Some((instance, holder)) = locks.first() {
        return Err(BackupError::InUse {
            database,
            what: format!("{holder} holds the lock of instance {instance}"),
        });
    }
    // Nobody else writes: fold the WAL into the file and empty it, so the
    // sidecars left behind by the move hold nothing.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&pool)
        .await
        .map_err(|e| BackupError::Store(super::db_error(e)))?;
    pool.close().await;
    Ok(())
}

fn not_stead(file: &Path, why: String) -> BackupError {
    BackupError::NotStead {
        file: file.to_owned(),
        why,
    }
}

fn size(file: &Path) -> Result<u64, BackupError> {
    std::fs::metadata(file)
        .map(|m| m.len())
        .map_err(|error| BackupError::Io {
            file: file.to_owned(),
            error,
        })
}

fn set_mode(file: &Path, mode: u32) -> Result<(), BackupError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).map_err(|error| {
        BackupError::Io {
            file: file.to_owned(),
            error,
        }
    })
}

/// Removes a SQLite file's `-wal` and `-shm`, when there are any.
fn remove_sidecars(file: &Path) -> Result<(), BackupError> {
    for suffix in ["-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        let sidecar = PathBuf::from(name);
        match std::fs::remove_file(&sidecar) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(BackupError::Io {
                    file: sidecar,
                    error,
                })
            }
        }
    }
    Ok(())
}

/// A name in a file's directory that does not exist yet (`VACUUM INTO`
/// refuses an existing non-empty file), removed on drop unless persisted.
struct Temporary {
    path: PathBuf,
    kept: bool,
}

impl Temporary {
    fn beside(file: &Path) -> Result<Self, BackupError> {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // tempfile makes the name unique; the empty file it creates is
        // removed so that VACUUM INTO makes it afresh.
        let placeholder = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(|error| BackupError::Io {
                file: dir.to_owned(),
                error,
            })?;
        let path = placeholder.path().to_owned();
        placeholder.close().map_err(|error| BackupError::Io {
            file: path.clone(),
            error,
        })?;
        Ok(Self { path, kept: false })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn path_text(&self) -> Result<&str, BackupError> {
        self.path.to_str().ok_or_else(|| BackupError::Io {
            file: self.path.clone(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not UTF-8"),
        })
    }

    /// Moves the file to `file`: replacing it when `overwrite`, else only
    /// if nothing took the name meanwhile (a hard link does not replace).
    fn persist(mut self, file: &Path, overwrite: bool) -> Result<(), BackupError> {
        let io = |error| BackupError::Io {
            file: file.to_owned(),
            error,
        };
        if overwrite {
            std::fs::rename(&self.path, file).map_err(io)?;
        } else {
            std::fs::hard_link(&self.path, file).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    BackupError::Exists(file.to_owned())
                } else {
                    io(e)
                }
            })?;
            let _ = std::fs::remove_file(&self.path);
        }
        self.kept = true;
        Ok(())
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
            let _ = remove_sidecars(&self.path);
        }
    }
}
