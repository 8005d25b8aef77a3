//! The Postgres store's connections as production runs them (#41 item 2):
//! TLS as `sslmode` says, the server-side timeouts of `[database]` on every
//! pooled connection, a client-side bound on lease and listing calls, and a
//! lease holder paused inside a fenced transaction that cannot keep a
//! standby out past its lease.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::time::Duration;

use sqlx::Connection;
use stead::config::daemon::DatabaseSettings;
use stead::core::fleet::{NewTask, TaskKind};
use stead::ports::{Store, StoreError};
use stead::store::sql::PostgresStore;
use tokio::time::Instant;

/// A fresh, migrated database in the private (Unix-socket) test server.
async fn fresh_database() -> String {
    let url = support::fresh_postgres_database().await;
    PostgresStore::connect(&url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    url
}

/// What the server says a setting is on one connection of `store`'s pool.
async fn show(connection: &mut sqlx::PgConnection, setting: &str) -> String {
    // SHOW takes no parameters; the names are this file's literals.
    sqlx::query_scalar(&format!("SHOW {setting}"))
        .fetch_one(connection)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pooled_connection_carries_the_configured_server_timeouts() {
    let url = fresh_database().await;
    let settings = DatabaseSettings {
        max_connections: 3,
        acquire_timeout: Duration::from_secs(4),
        call_timeout: Duration::from_secs(50),
        statement_timeout: Duration::from_secs(45),
        lock_timeout: Duration::from_millis(1500),
        idle_in_transaction_session_timeout: Duration::from_millis(2500),
    };
    // The URL's own `options` come first; `[database]` wins.
    let joint = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{joint}options=-c%20statement_timeout%3D1234");
    let store = PostgresStore::connect_with(&url, &settings).await.unwrap();
    assert_eq!(store.pool().options().get_max_connections(), 3);
    assert_eq!(
        store.pool().options().get_acquire_timeout(),
        Duration::from_secs(4)
    );
    // All three connections the pool may open, held at once, so each is
    // a separate session.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(store.pool().acquire().await.unwrap());
    }
    let mut pids = Vec::new();
    for connection in &mut held {
        assert_eq!(show(connection, "statement_timeout").await, "45s");
        assert_eq!(show(connection, "lock_timeout").await, "1500ms");
        assert_eq!(
            show(connection, "idle_in_transaction_session_timeout").await,
            "2500ms"
        );
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **connection)
            .await
            .unwrap();
        pids.push(pid);
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 3, "three sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_longer_than_the_statement_timeout_is_cancelled_by_the_server() {
    let url = fresh_database().await;
    let settings = DatabaseSettings {
        statement_timeout: Duration::from_millis(200),
        lock_timeout: Duration::from_millis(200),
        ..DatabaseSettings::default()
    };
    let store = PostgresStore::connect_with(&url, &settings).await.unwrap();
    let started = Instant::now();
    let error = sqlx::query("SELECT pg_sleep($1)")
        .bind(5.0_f64)
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("statement timeout"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cancelled early"
    );
}

/// Holds an exclusive lock on `table` in a transaction of a connection of
/// its own (no timeouts: the server keeps it as long as the test likes),
/// so every statement of the store's that touches it waits: a database
/// that answers nothing.
async fn hang_table(url: &str, table: &str) -> sqlx::PgConnection {
    let mut blocker = sqlx::PgConnection::connect(url).await.unwrap();
    // Identifiers cannot be bound; `table` is one of this file's literals.
    sqlx::raw_sql(&format!(
        "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    ))
    .execute(&mut blocker)
    .await
    .unwrap();
    blocker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_database_fails_lease_and_listing_calls_within_the_call_timeout_naming_them() {
    let url = fresh_database().await;
    // Server-side bounds far away, as with a server that stopped answering:
    // only the client-side bound can end the calls.
    let settings = DatabaseSettings {
        call_timeout: Duration::from_millis(500),
        statement_timeout: Duration::from_secs(600),
        lock_timeout: Duration::from_secs(600),
        ..DatabaseSettings::default()
    };
    let store = PostgresStore::connect_with(&url, &settings).await.unwrap();
    let lease_blocker = hang_table(&url, "reconciler_lease").await;
    let list_blocker = hang_table(&url, "instances").await;

    let started = Instant::now();
    let lease = store
        .acquire_reconciler_lease("stuck", Duration::from_secs(30))
        .await;
    let listed = store.list_instances().await.map(drop);
    let recovery = store.list_for_recovery().await.map(drop);
    assert!(started.elapsed() < Duration::from_secs(5), "bounded calls");
    for (call, answer) in [
        ("acquire_reconciler_lease", lease.map(drop)),
        ("list_instances", listed),
        ("list_for_recovery", recovery),
    ] {
        match answer {
            Err(StoreError::Unavailable(message)) => assert!(
                message.contains(call) && message.contains("within 500 ms"),
                "{call}: {message}"
            ),
            other => panic!("{call}: expected a timeout, got {other:?}"),
        }
    }
    lease_blocker.close().await.ok();
    list_blocker.close().await.ok();
}

/// Short enough to keep the test quick, long against a round trip.
const LEASE: Duration = Duration::from_secs(2);
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(1);
const LOCK_WAIT: Duration = Duration::from_millis(300);
/// What the fence check of a fenced write reads, as the store reads it.
const SHARE_LEASE: &str = "SELECT holder, epoch FROM reconciler_lease WHERE id = 1 FOR SHARE";

fn paused_settings() -> DatabaseSettings {
    DatabaseSettings {
        lock_timeout: LOCK_WAIT,
        idle_in_transaction_session_timeout: IDLE_IN_TRANSACTION,
        ..DatabaseSettings::default()
    }
}

/// The standby's loop: ask for the lease every 100 ms until it is granted
/// or `deadline` passes; the answers it had before, and when it got it.
async fn take_over(
    standby: &PostgresStore,
    deadline: Duration,
) -> (Vec<Result<(), StoreError>>, Option<Duration>) {
    let started = Instant::now();
    let mut refused = Vec::new();
    while started.elapsed() < deadline {
        match standby.acquire_reconciler_lease("standby", LEASE).await {
            Ok(Some(_)) => return (refused, Some(started.elapsed())),
            Ok(None) => refused.push(Ok(())),
            Err(e) => refused.push(Err(e)),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (refused, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_the_lease_from_a_holder_paused_inside_a_fenced_transaction() {
    let url = fresh_database().await;
    let holder = PostgresStore::connect_with(&url, &paused_settings())
        .await
        .unwrap();
    let standby = PostgresStore::connect_with(&url, &paused_settings())
        .await
        .unwrap();
    let grant = holder
        .acquire_reconciler_lease("holder", LEASE)
        .await
        .unwrap()
        .expect("a free lease");
    // The holder begins a fenced write, as the store does (the lease row
    // read FOR SHARE inside the write's transaction), and then stops: a
    // stopped VM, a SIGSTOP, a stalled network path. Its session stays
    // open, idle inside the transaction, holding the row.
    let mut paused = holder.pool().begin().await.unwrap();
    sqlx::query(SHARE_LEASE)
        .fetch_one(&mut *paused)
        .await
        .unwrap();

    // While the row is held, the standby's attempt waits no longer than
    // the lock timeout: the tick goes on instead of hanging.
    let first = Instant::now();
    let blocked = standby.acquire_reconciler_lease("standby", LEASE).await;
    assert!(
        first.elapsed() < LOCK_WAIT + Duration::from_secs(1),
        "the attempt waited {:?}",
        first.elapsed()
    );
    match blocked {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("lock timeout"), "{message}")
        }
        other => panic!("expected a lock timeout while the row is held, got {other:?}"),
    }

    // The server ends the paused session after the idle bound, well
    // before the lease runs out, so the standby takes over once it does.
    let (_, took) = take_over(&standby, LEASE * 4).await;
    let took = took.expect("the standby never took over from the paused holder");
    // Its lease, then a poll or two (a loaded machine's round trips).
    assert!(
        took < LEASE + Duration::from_secs(2),
        "the standby took over after {took:?}, the lease lasts {LEASE:?}"
    );
    let now = standby.database_now().await.unwrap();
    assert!(grant.expires_at <= now, "taken over before expiry");

    // The paused process resumes: its transaction is gone with its
    // session, so the write it was about to make fails instead of landing.
    let resumed = sqlx::query("UPDATE reconciler_lease SET holder = $1 WHERE id = 1")
        .bind("holder")
        .execute(&mut *paused)
        .await;
    assert!(resumed.is_err(), "the paused write landed: {resumed:?}");
    drop(paused);
    let lease = standby.reconciler_lease().await.unwrap().unwrap();
    assert_eq!(lease.holder, "standby");
    // And through the store, its stale grant is fenced.
    let task = NewTask {
        kind: TaskKind::Provision,
        instance: 1,
        run_after: now,
        reason: "paused".into(),
        traceparent: None,
    };
    assert_eq!(
        holder.enqueue(&task, now, Some(&grant)).await,
        Err(StoreError::Fenced { epoch: grant.epoch })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_idle_bound_a_paused_holder_keeps_the_standby_out_past_its_lease() {
    // The control for the test above: the same pause on a session without
    // `idle_in_transaction_session_timeout` holds the row until it ends,
    // so it is that bound which frees the lease row.
    let url = fresh_database().await;
    let holder = PostgresStore::connect_with(&url, &paused_settings())
        .await
        .unwrap();
    let standby = PostgresStore::connect_with(&url, &paused_settings())
        .await
        .unwrap();
    holder
        .acquire_reconciler_lease("holder", LEASE)
        .await
        .unwrap()
        .expect("a free lease");
    let mut unbounded = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut paused = unbounded.begin().await.unwrap();
    sqlx::query(SHARE_LEASE)
        .fetch_one(&mut *paused)
        .await
        .unwrap();
    // Longer than the test above allows for the takeover.
    let (refused, took) = take_over(&standby, LEASE * 2 + Duration::from_secs(1)).await;
    assert_eq!(took, None, "taken over while the row was held");
    assert!(
        refused
            .iter()
            .any(|r| matches!(r, Err(StoreError::Unavailable(m)) if m.contains("lock timeout"))),
        "{refused:?}"
    );
    paused.rollback().await.unwrap();
    let (_, took) = take_over(&standby, LEASE).await;
    assert!(took.is_some(), "free once the pause ends");
}

// --- TLS -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_every_pooled_session() {
    let server = support::tls_postgres_server();
    let url = server.fresh_database("sslmode=require").await;
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    // A store call works over it.
    assert!(store.reconciler_lease().await.unwrap().is_none());
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(store.pool().acquire().await.unwrap());
    }
    for connection in &mut held {
        let (ssl, version): (bool, Option<String>) =
            sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&mut **connection)
                .await
                .unwrap();
        assert!(ssl, "the session is not encrypted");
        assert!(version.is_some_and(|v| v.starts_with("TLS")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_verify_full_connects_with_the_servers_ca_and_refuses_another() {
    let server = support::tls_postgres_server();
    let ca = server.ca_cert.display();
    let url = server
        .fresh_database(&format!("sslmode=verify-full&sslrootcert={ca}"))
        .await;
    let store = PostgresStore::connect(&url).await.unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(ssl);

    let wrong = url.replace(
        &format!("sslrootcert={ca}"),
        &format!("sslrootcert={}", server.wrong_ca_cert.display()),
    );
    let error = PostgresStore::connect(&wrong)
        .await
        .unwrap_err()
        .to_string();
    // Which server, that TLS failed and why, and what to check.
    for part in [
        "Postgres at localhost:",
        "cannot connect: TLS:",
        "UnknownIssuer",
        "check sslmode and sslrootcert",
    ] {
        assert!(error.contains(part), "{error:?} lacks {part:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_connect_with_the_statement_and_lock_timeouts_off() {
    // `stead migrate` may rewrite a large table or wait for another host's
    // migration: its connections set both timeouts to zero (off), which
    // the server must accept.
    let url = support::fresh_postgres_database().await;
    let migrated = stead::store::sql::migrate(&url).await.unwrap();
    assert_eq!(migrated.applied.len(), migrated.known);
    let again = stead::store::sql::migrate(&url).await.unwrap();
    assert!(again.applied.is_empty());
}
