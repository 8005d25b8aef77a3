//! Test support for the store tests: one constructor per backend, and a
//! throwaway Postgres.
//!
//! Postgres: when `STEAD_TEST_DATABASE_URL` is set, that server is used (the
//! URL must allow `CREATE DATABASE`). Otherwise the first test that needs
//! Postgres starts a private server from the machine's installed binaries
//! (`initdb` into a temp dir, a free loopback port, `pg_ctl start`); a
//! watchdog process stops it and deletes the directory when the test process
//! exits, however it exits. Every test gets a fresh database in that server.
//! Postgres tests never skip: if no server can be had, they fail and say why.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use sqlx::Connection;
use stead::ports::Store;
use stead::store::sql::{PostgresStore, SqliteStore};
use stead_testkit::store::MemoryStore;

/// One store under test, plus what a test needs to reach behind it.
pub struct TestStore {
    pub store: Arc<dyn Store>,
    pub backend: Backend,
}

pub enum Backend {
    Memory(Arc<MemoryStore>),
    Sqlite {
        store: SqliteStore,
        url: String,
        // Deleted when the test ends.
        _dir: tempfile::TempDir,
    },
    Postgres {
        store: PostgresStore,
        url: String,
    },
}

impl TestStore {
    pub fn name(&self) -> &'static str {
        match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Sqlite { .. } => "sqlite",
            Backend::Postgres { .. } => "postgres",
        }
    }

    /// Simulates an outage: every later call through `self.store` fails.
    pub async fn take_down(&self) {
        match &self.backend {
            Backend::Memory(store) => store.set_unavailable(true),
            Backend::Sqlite { store, .. } => store.pool().close().await,
            Backend::Postgres { store, .. } => store.pool().close().await,
        }
    }

    /// The same durable state through a new connection (after `take_down`,
    /// or to play a second process).
    pub async fn reopen(&self) -> Arc<dyn Store> {
        match &self.backend {
            Backend::Memory(store) => {
                store.set_unavailable(false);
                store.clone()
            }
            Backend::Sqlite { url, .. } => Arc::new(SqliteStore::connect(url).await.unwrap()),
            Backend::Postgres { url, .. } => Arc::new(PostgresStore::connect(url).await.unwrap()),
        }
    }

    /// Runs raw SQL as another tool would, with the CHECK constraints on
    /// states and kinds out of the way (a newer or foreign schema wrote
    /// values this build does not know). `None` for the memory store, which
    /// cannot hold such rows.
    pub async fn write_as_foreign_tool(&self, statements: &str) -> Option<()> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Sqlite { store, .. } => {
                // The pragma is per connection: one raw script keeps it on
                // the connection that writes, and switches it back off.
                let script = format!(
                    "PRAGMA ignore_check_constraints = ON; {statements}; \
                     PRAGMA ignore_check_constraints = OFF;"
                );
                sqlx::raw_sql(&script).execute(store.pool()).await.unwrap();
                Some(())
            }
            Backend::Postgres { store, .. } => {
                let script = format!(
                    "ALTER TABLE instances DROP CONSTRAINT instances_state_check; \
                     ALTER TABLE tasks DROP CONSTRAINT tasks_kind_check; \
                     ALTER TABLE tasks DROP CONSTRAINT tasks_state_check; \
                     ALTER TABLE rollouts DROP CONSTRAINT rollouts_state_check; \
                     {statements}"
                );
                sqlx::raw_sql(&script).execute(store.pool()).await.unwrap();
                Some(())
            }
        }
    }

    /// Runs raw SQL with every constraint in force; the error, if any.
    pub async fn raw(&self, statements: &str) -> Option<Result<(), sqlx::Error>> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Sqlite { store, .. } => Some(
                sqlx::raw_sql(statements)
                    .execute(store.pool())
                    .await
                    .map(drop),
            ),
            Backend::Postgres { store, .. } => Some(
                sqlx::raw_sql(statements)
                    .execute(store.pool())
                    .await
                    .map(drop),
            ),
        }
    }
}

pub async fn memory() -> TestStore {
    let store = Arc::new(MemoryStore::new());
    TestStore {
        store: store.clone(),
        backend: Backend::Memory(store),
    }
}

pub async fn sqlite() -> TestStore {
    let dir = tempfile::Builder::new()
        .prefix("stead-sqlite-")
        .tempdir()
        .expect("a temp dir for SQLite");
    let url = sqlite_url(&dir.path().join("stead.db"));
    let store = SqliteStore::connect(&url).await.expect("open SQLite");
    store.migrate().await.expect("migrate SQLite");
    TestStore {
        store: Arc::new(store.clone()),
        backend: Backend::Sqlite {
            store,
            url,
            _dir: dir,
        },
    }
}

pub fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
}

pub async fn postgres() -> TestStore {
    let url = fresh_postgres_database().await;
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect to the test database");
    store.migrate().await.expect("migrate Postgres");
    TestStore {
        store: Arc::new(store.clone()),
        backend: Backend::Postgres { store, url },
    }
}

/// A URL to a new, empty database in the test server.
pub async fn fresh_postgres_database() -> String {
    static N_DATABASES: AtomicU32 = AtomicU32::new(0);
    let server = postgres_server();
    let n = N_DATABASES.fetch_add(1, Ordering::Relaxed);
    // Identifiers cannot be bound parameters; this one is built from two
    // integers only.
    let name = format!("stead_test_{}_{n}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&server.admin_url)
        .await
        .unwrap_or_else(|e| panic!("connect to test Postgres at {}: {e}", server.admin_url));
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
    admin.close().await.ok();
    with_database(&server.admin_url, &name)
}

/// Replaces the database name in a `postgres://` URL.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base["postgres://".len().min(base.len())..]
        .find('/')
        .map(|i| i + "postgres://".len())
        .unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

pub struct PostgresServer {
    /// A URL whose user may create databases.
    pub admin_url: String,
}

/// The process-wide test server, started on first use.
pub fn postgres_server() -> &'static PostgresServer {
    static SERVER: OnceLock<Result<PostgresServer, String>> = OnceLock::new();
    match SERVER.get_or_init(start_postgres) {
        Ok(server) => server,
        Err(why) => panic!(
            "Postgres tests need a server and none could be had: {why}\n\
             Install PostgreSQL (apt-get install postgresql) or set \
             STEAD_TEST_DATABASE_URL=postgres://user@host/db (a user allowed to CREATE DATABASE)."
        ),
    }
}

/// A second throwaway server that speaks TLS on a loopback TCP port (Postgres
/// never speaks TLS on a Unix socket), with a certificate for `localhost`
/// issued by a CA made for it, and a second CA that issued nothing here.
pub struct TlsPostgresServer {
    /// `postgres://postgres@localhost:PORT`, without database or query.
    pub base_url: String,
    /// The CA that issued the server's certificate (`sslrootcert`).
    pub ca_cert: PathBuf,
    /// A CA unrelated to the server's certificate.
    pub wrong_ca_cert: PathBuf,
}

impl TlsPostgresServer {
    /// A new, empty database in this server; its URL (plus `query`).
    pub async fn fresh_database(&self, query: &str) -> String {
        static N_DATABASES: AtomicU32 = AtomicU32::new(0);
        let n = N_DATABASES.fetch_add(1, Ordering::Relaxed);
        // Built from two integers only (identifiers cannot be bound).
        let name = format!("stead_tls_{}_{n}", std::process::id());
        let admin_url = format!("{}/postgres?sslmode=disable", self.base_url);
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("connect to the TLS test Postgres at {admin_url}: {e}"));
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
        admin.close().await.ok();
        format!("{}/{name}?{query}", self.base_url)
    }
}

/// The process-wide TLS test server, started on first use. It is always a
/// private one (`STEAD_TEST_DATABASE_URL` names a server whose certificate
/// the tests cannot know); it needs the `openssl` command, which
/// `scripts/services up` installs.
pub fn tls_postgres_server() -> &'static TlsPostgresServer {
    static SERVER: OnceLock<Result<TlsPostgresServer, String>> = OnceLock::new();
    match SERVER.get_or_init(start_tls_postgres) {
        Ok(server) => server,
        Err(why) => panic!(
            "the TLS tests need a Postgres server with TLS and none could be had: {why}\n\
             Install PostgreSQL and openssl (scripts/services up)."
        ),
    }
}

/// How often a TLS server start is retried on another port: a port found
/// free may be taken by another process before the server binds it.
const TLS_START_TRIES_MAX: u32 = 5;

fn start_tls_postgres() -> Result<TlsPostgresServer, String> {
    let bin = postgres_bin_dir()?;
    let run_as_postgres = is_root()?;
    let dir = tempfile::Builder::new()
        .prefix("stead-pg-tls-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?
        .keep();
    let certs = dir.join("certs");
    std::fs::create_dir(&certs).map_err(|e| format!("mkdir {}: {e}", certs.display()))?;
    make_certificates(&certs)?;
    if run_as_postgres {
        let (uid, gid) = (id_of("-u")?, id_of("-g")?);
        for path in [dir.clone(), certs.clone(), certs.join("server.key")] {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(|e| format!("chown {} to postgres: {e}", path.display()))?;
        }
    }
    let data = dir.join("data");
    let as_pg = |program: PathBuf| {
        let mut command = if run_as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.stdin(Stdio::null());
        command
    };
    // initdb's `--auth=trust` lets loopback TCP in (`host ... 127.0.0.1/32`).
    run(as_pg(bin.join("initdb")).arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]))?;
    let mut last_error = String::new();
    for _ in 0..TLS_START_TRIES_MAX {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("find a free loopback port: {e}"))?
            .port();
        let options = format!(
            "-k {dir} -p {port} -c listen_addresses=127.0.0.1 -c ssl=on \
             -c ssl_cert_file={certs}/server.crt -c ssl_key_file={certs}/server.key \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=100",
            dir = dir.display(),
            certs = certs.display(),
        );
        let started = run(as_pg(bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("log"))
            .args(["-o", &options, "-w", "-t", "60", "start"]));
        match started {
            Ok(()) => {
                spawn_watchdog(&bin, &dir, &data, run_as_postgres)?;
                return Ok(TlsPostgresServer {
                    base_url: format!("postgres://postgres@localhost:{port}"),
                    ca_cert: certs.join("ca.crt"),
                    wrong_ca_cert: certs.join("wrong-ca.crt"),
                });
            }
            Err(e) => last_error = e,
        }
    }
    let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    Err(format!(
        "{TLS_START_TRIES_MAX} starts failed; the last: {last_error}\n{log}"
    ))
}

/// A CA, a server certificate it issued for `localhost` and 127.0.0.1, and
/// a second, unrelated CA, with the `openssl` command (P-256 keys: quick to
/// make, and both rustls and Postgres take them).
fn make_certificates(dir: &Path) -> Result<(), String> {
    let openssl = |args: &[&str]| {
        let mut command = Command::new("openssl");
        command.current_dir(dir).args(args).stdin(Stdio::null());
        run(&mut command)
    };
    let ca = |name: &str, subject: &str| {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ])
    };
    ca("ca", "/CN=stead test CA")?;
    ca("wrong-ca", "/CN=stead test CA that issued nothing")?;
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\n\
         subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .map_err(|e| format!("write server.ext: {e}"))?;
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ])?;
    // Postgres refuses a key others can read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(|e| format!("chmod server.key: {e}"))
}

fn start_postgres() -> Result<PostgresServer, String> {
    if let Ok(url) = std::env::var("STEAD_TEST_DATABASE_URL") {
        return Ok(PostgresServer { admin_url: url });
    }
    let bin = postgres_bin_dir()?;
    let run_as_postgres = is_root()?;
    let dir = tempfile::Builder::new()
        .prefix("stead-pg-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?
        .keep();
    if run_as_postgres {
        // Postgres refuses to run as root; the directory must belong to the
        // user it runs as.
        let (uid, gid) = (id_of("-u")?, id_of("-g")?);
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("chown {} to postgres: {e}", dir.display()))?;
    }
    let data = dir.join("data");
    let as_pg = |program: PathBuf| {
        let mut command = if run_as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.stdin(Stdio::null());
        command
    };
    run(as_pg(bin.join("initdb")).arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]))?;
    // Durability settings are off: the data dies with the test run anyway.
    // The server listens on a Unix socket in its own directory only: a TCP
    // port picked free beforehand could be taken by another process before
    // the server binds it, and every test process starts a server.
    let options = format!(
        "-k {} -c listen_addresses='' -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
        dir.display()
    );
    run(as_pg(bin.join("pg_ctl"))
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-o", &options, "-w", "-t", "60", "start"]))?;
    spawn_watchdog(&bin, &dir, &data, run_as_postgres)?;
    Ok(PostgresServer {
        admin_url: format!(
            "postgres://postgres@localhost/postgres?host={}",
            dir.display()
        ),
    })
}

/// Stops the server and removes its directory once this process is gone,
/// whether the tests passed, panicked or were killed.
fn spawn_watchdog(
    bin: &Path,
    dir: &Path,
    data: &Path,
    run_as_postgres: bool,
) -> Result<(), String> {
    let runuser = if run_as_postgres {
        "runuser -u postgres -- "
    } else {
        ""
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {runuser}'{pg_ctl}' -D '{data}' -m immediate stop; rm -rf '{dir}'",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("spawn the Postgres watchdog: {e}"))
}

/// `PG_BIN` if set, else the newest `/usr/lib/postgresql/<version>/bin`, else
/// `pg_config --bindir`.
fn postgres_bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map_err(|_| "no PostgreSQL binaries in /usr/lib/postgresql and no pg_config".to_owned())?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn is_root() -> Result<bool, String> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("id -u: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn id_of(flag: &str) -> Result<u32, String> {
    let out = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .map_err(|e| format!("id {flag} postgres: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            "running as root, but there is no `postgres` user to run Postgres as".to_owned()
        })
}

fn run(command: &mut Command) -> Result<(), String> {
    let out = command
        .output()
        .map_err(|e| format!("run {command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
