//! Upgrading stead itself (docs/operations.md, "Upgrading stead"): a
//! database left by the previous release, at that release's schema and with
//! rows as that release wrote them, is brought up to date by the real
//! `stead migrate`, after which the rows read back intact and the CLI and a
//! daemon's tick work on it. On SQLite and on Postgres.
//!
//! There are no release tags yet; the previous release is taken to be the
//! schema of 1 December 2026 (migrations up to `20261201000002`), the last
//! one before the migrations of 5 December (the bake window's marker, the
//! event log, webhook cursors, recorded type versions), which together are
//! the newest release's schema changes.

// Bounds on the commands' run time are wall-clock by nature.
#![allow(clippy::disallowed_methods)]

mod support;
mod support_services;

use std::borrow::Cow;
use std::path::Path;
use std::process::Command;

use sqlx::migrate::Migrator;
use stead::store::sql::{PostgresStore, SqliteStore};
use support_services::caddy::CaddyProcess;

/// The newest migration of the previous release's schema.
const PREVIOUS_RELEASE: i64 = 20261201000002;

/// The migrations `migrator` carries up to the previous release.
fn previous_release(migrator: &Migrator) -> Migrator {
    let migrations: Vec<_> = migrator
        .iter()
        .filter(|m| m.version <= PREVIOUS_RELEASE)
        .cloned()
        .collect();
    assert!(
        migrations.len() >= 5 && migrations.len() < migrator.iter().count(),
        "the previous release is a strict prefix of this binary's migrations"
    );
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

/// Rows as the previous release wrote them, in its columns only: a served
/// instance with its ACTIVE service and a hold, a stopped one with a TTL,
/// their finished provisions, a queued reprovision and a halted rollout.
/// The same statements run on both backends (`TRUE`/`FALSE` are SQLite's
/// 1/0).
fn previous_release_rows(prefix: &str) -> String {
    let (t0, t1) = (1_764_547_200_000_000_i64, 1_764_547_260_000_000_i64);
    format!(
        "INSERT INTO instances (name, team, service_type, version, state, stopped, expires_at_us, \
           maintenance_window, created_at_us, updated_at_us, parameters, purge_volumes, spec_digest) \
         VALUES ('{prefix}alpha', 'blue', 'web', '1', 'ready', TRUE, NULL, 'sun 03:00-05:00 UTC', \
           {t0}, {t1}, '{{}}', FALSE, NULL), \
                ('{prefix}beta', 'default', 'web', '1', 'ready', TRUE, 4102444800000000, NULL, \
           {t0}, {t1}, '{{}}', TRUE, NULL); \
         INSERT INTO active_services (instance_id, service, container_id, effective_revision, \
           backend_binds, stop_grace_ms, verified_started_at_ns) \
         SELECT id, 'http', 'c0ffee{prefix}', 'rev-1', '{{\"8080\":31001}}', 2000, 1764547201000000000 \
           FROM instances WHERE name = '{prefix}alpha'; \
         INSERT INTO inhibitions (instance_id, service, container_id, reason, operation, \
           created_at_us, stop_grace_ms) \
         SELECT id, 'http', 'c0ffee{prefix}', 'operator hold', 'operator', {t1}, 2000 \
           FROM instances WHERE name = '{prefix}alpha'; \
         INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
           created_at_us, updated_at_us) \
         SELECT 'provision', id, 'done', {t0}, 1, 'operator: instance create', {t0}, {t1} \
           FROM instances; \
         INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
           created_at_us, updated_at_us) \
         SELECT 'reprovision', id, 'queued', {t1}, 0, 'operator: instance retry', {t1}, {t1} \
           FROM instances WHERE name = '{prefix}beta'; \
         INSERT INTO rollouts (service_type, state, reason, updated_at_us) \
         VALUES ('web', 'halted', 'frozen before the upgrade', {t1});"
    )
}

/// The CLI on `database_url`, with the example catalog (type `web`) and a
/// private Caddy; its exit status and what it printed.
struct Cli {
    dir: tempfile::TempDir,
    database_url: String,
    caddy: String,
    listen: String,
}

impl Cli {
    fn new(database_url: String, caddy: &CaddyProcess) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            database_url,
            caddy: caddy.admin_addr.clone(),
            listen: format!("127.0.0.1:{}", support_services::free_port()),
        }
    }

    fn run(&self, args: &[&str]) -> (i32, String) {
        let catalog = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/catalog.toml");
        let out = Command::new(env!("CARGO_BIN_EXE_stead"))
            .args(args)
            .env_remove("STEAD_CONFIG")
            .env_remove("STEAD_LOG")
            .env("STEAD_STATE_DIR", self.dir.path())
            .env("STEAD_CATALOG", catalog)
            .env("STEAD_DATABASE_URL", &self.database_url)
            .env("STEAD_ADMIN_LISTEN", "")
            .env("STEAD_CADDY__ADMIN", &self.caddy)
            .env("STEAD_CADDY__LISTEN", &self.listen)
            .output()
            .expect("run stead");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, text) = self.run(args);
        assert_eq!(code, 0, "{args:?}:\n{text}");
        text
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let text = self.ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}:\n{text}"))
    }
}

/// What the upgrade must keep and what the upgraded database must do, the
/// same on both backends. `migrated_by_cli` is the CLI on the database at
/// the previous release's schema, with `previous_release_rows(prefix)`.
fn upgrade_and_check(cli: &Cli, prefix: &str) {
    let migrated = cli.ok(&["migrate"]);
    let newest = SqliteStore::migrator()
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    assert!(
        migrated.contains(&format!("applied migration {newest} "))
            && !migrated.contains(&format!("applied migration {PREVIOUS_RELEASE} ")),
        "only the migrations after the previous release:\n{migrated}"
    );
    assert!(
        cli.ok(&["migrate"]).contains("none applied now"),
        "migrate again"
    );

    let (alpha, beta) = (format!("{prefix}alpha"), format!("{prefix}beta"));
    let listed = cli.json(&["instance", "list", "--all", "--json"]);
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap().clone();
    let (a, b) = (row(&alpha), row(&beta));
    assert_eq!(
        (&a["team"], &a["version"], &a["state"], &a["intent"]),
        (
            &"blue".into(),
            &"1".into(),
            &"ready".into(),
            &"stopped".into()
        ),
        "{a}"
    );
    assert_eq!(a["maintenance_window"], "sun 03:00-05:00 UTC", "{a}");
    assert_eq!(a["created_at"], "2025-12-01T00:00:00Z", "{a}");
    assert_eq!(b["expires_at"], "2100-01-01T00:00:00Z", "{b}");
    assert_eq!(b["purge_volumes"], true, "{b}");

    let shown = cli.json(&["instance", "show", &alpha, "--json"]);
    assert_eq!(
        shown["services"]["http"],
        format!("c0ffee{prefix}"),
        "{shown}"
    );
    let service = &shown["status"][0];
    assert_eq!(service["binds"], "8080->31001", "{shown}");
    assert_eq!(
        service["inhibitions"],
        serde_json::json!([format!("operator hold:c0ffee{prefix}")]),
        "the hold is kept: {shown}"
    );

    let tasks = cli.json(&["task", "list", "--all", "--json"]);
    let kinds: Vec<(String, String)> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap().to_owned(),
                t["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(kinds.len(), 3, "{tasks}");
    assert!(
        kinds.contains(&("reprovision".into(), "queued".into())),
        "{tasks}"
    );
    let status = cli.json(&["status", "--json"]);
    assert!(
        status["catalog"]
            .to_string()
            .contains("frozen before the upgrade"),
        "the halted rollout and its reason: {status}"
    );

    // The upgraded database takes writes and a tick: the tick records the
    // type's version and its events (tables the previous release did not
    // have), and finds that Docker has neither release (these rows were
    // written by hand), so it queues their reprovisions, for workers this
    // test does not run.
    cli.ok(&["instance", "start", &beta]);
    cli.ok(&["instance", "stop", &beta]);
    cli.ok(&["task", "cancel", &reprovision_id(&tasks)]);
    let (code, text) = cli.run(&["tick"]);
    assert_eq!(code, 0, "tick on the upgraded database:\n{text}");
    assert!(
        text.contains("tick: 2 task(s) enqueued, 0 check(s) failed"),
        "{text}"
    );
    for name in [&alpha, &beta] {
        assert!(
            text.contains(&format!(
                "reprovision of {name}: drift: release {name} missing"
            )),
            "{text}"
        );
    }
    let versions = cli.ok(&["rollout", "versions", "web"]);
    assert!(
        versions.trim_start().starts_with("1  recorded "),
        "the tick recorded web 1: {versions}"
    );
    let events = cli.ok(&["events", "--json"]);
    assert!(
        events.contains("lease_taken"),
        "the event log, new in this release, is written: {events}"
    );
}

fn reprovision_id(tasks: &serde_json::Value) -> String {
    tasks
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "reprovision")
        .unwrap()["id"]
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_of_the_previous_release_is_migrated_and_works() {
    let caddy = CaddyProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = support::sqlite_url(&dir.path().join("stead.db"));
    let store = SqliteStore::connect(&url).await.unwrap();
    previous_release(SqliteStore::migrator())
        .run(store.pool())
        .await
        .unwrap();
    sqlx::raw_sql(&previous_release_rows("upsq"))
        .execute(store.pool())
        .await
        .unwrap();
    store.pool().close().await;
    upgrade_and_check(&Cli::new(url, &caddy), "upsq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_database_of_the_previous_release_is_refused_until_migrated_and_then_works() {
    let caddy = CaddyProcess::start().await;
    let url = support::fresh_postgres_database().await;
    let store = PostgresStore::connect(&url).await.unwrap();
    previous_release(PostgresStore::migrator())
        .run(store.pool())
        .await
        .unwrap();
    sqlx::raw_sql(&previous_release_rows("uppg"))
        .execute(store.pool())
        .await
        .unwrap();
    store.pool().close().await;
    let cli = Cli::new(url, &caddy);
    // A new binary on the old schema, before `stead migrate`: refused,
    // saying what to run, the rows untouched.
    let (code, text) = cli.run(&["instance", "list"]);
    assert_eq!(code, 7, "{text}");
    assert!(text.contains("run `stead migrate`"), "{text}");
    upgrade_and_check(&cli, "uppg");
}

/// A backup taken by the previous release restores with this one: the
/// restore brings the copy up to this binary's schema before it takes the
/// database's place, and says which migrations it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_backup_of_the_previous_release_is_restored_at_this_schema() {
    let caddy = CaddyProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("previous-release.db");
    let store = SqliteStore::connect(&support::sqlite_url(&old))
        .await
        .unwrap();
    previous_release(SqliteStore::migrator())
        .run(store.pool())
        .await
        .unwrap();
    sqlx::raw_sql(&previous_release_rows("uprs"))
        .execute(store.pool())
        .await
        .unwrap();
    store.pool().close().await;

    let url = support::sqlite_url(&dir.path().join("restored/stead.db"));
    let cli = Cli::new(url, &caddy);
    let said = cli.ok(&["restore", old.to_str().unwrap()]);
    let newest = SqliteStore::migrator()
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    assert!(
        said.contains(&format!("applied migration {newest} to the restored copy"))
            && said.contains("2 instance(s)"),
        "{said}"
    );
    assert!(
        cli.ok(&["migrate"]).contains("none applied now"),
        "already current"
    );
    let listed = cli.json(&["instance", "list", "--all", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
}
