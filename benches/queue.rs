//! Queue throughput: claim + complete with 1, 4 and 16 workers, on Postgres
//! and on SQLite, against a bare-SQL baseline of the same statements run in
//! the same process on the same pool. Prints tasks/s and the ratio store /
//! baseline (the target is at least 0.8: the store's abstraction, decoding
//! and validation may cost little next to the database round trips).
//!
//! `cargo bench --bench queue` (uses `STEAD_TEST_DATABASE_URL` or starts a
//! throwaway Postgres, like the tests). `STEAD_BENCH_TASKS` sets the number
//! of tasks per run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use stead::ports::Store;
use stead::store::sql::statements::{COMPLETE, POSTGRES_CLAIM, SQLITE_CLAIM};
use support::{Backend, TestStore};

const WORKER_COUNTS: [usize; 3] = [1, 4, 16];
const TASKS_DEFAULT: usize = 2_000;
/// Each configuration runs this many times; the best run counts (the
/// machine is shared, and the best run is the least disturbed one).
const RUNS: usize = 5;

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

/// Fills the queue with `n_tasks` due tasks, one per instance, in two
/// set-based statements (seeding is not what is measured).
async fn seed(test: &TestStore, n_tasks: usize) {
    let n = i64::try_from(n_tasks).unwrap();
    match &test.backend {
        Backend::Postgres { store, .. } => {
            let pool = store.pool();
            sqlx::raw_sql("TRUNCATE tasks, instances RESTART IDENTITY CASCADE")
                .execute(pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO instances (name, team, service_type, version, state, stopped, \
                 created_at_us, updated_at_us) \
                 SELECT 'bench-' || g, 't', 'wiki', '1', 'ready', FALSE, 0, 0 \
                 FROM generate_series(1, $1) g",
            )
            .bind(n)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query(INSERT_TASKS).execute(pool).await.unwrap();
        }
        Backend::Sqlite { store, .. } => {
            let pool = store.pool();
            sqlx::raw_sql("DELETE FROM tasks; DELETE FROM instances")
                .execute(pool)
                .await
                .unwrap();
            sqlx::query(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $1) \
                 INSERT INTO instances (name, team, service_type, version, state, stopped, \
                 created_at_us, updated_at_us) \
                 SELECT 'bench-' || n, 't', 'wiki', '1', 'ready', FALSE, 0, 0 FROM g",
            )
            .bind(n)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query(INSERT_TASKS).execute(pool).await.unwrap();
        }
        Backend::Memory(_) => unreachable!("the bench measures SQL stores"),
    }
}

const INSERT_TASKS: &str = "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, \
     reason, created_at_us, updated_at_us) \
     SELECT 'provision', id, 'queued', 0, 0, 'bench', 0, 0 FROM instances";

/// Workers loop claim(1) + complete through the `Store` until the queue is
/// empty. Returns how many tasks they completed.
async fn run_store(store: Arc<dyn Store>, n_workers: usize) -> usize {
    let mut workers = Vec::new();
    for w in 0..n_workers {
        let store = store.clone();
        workers.push(tokio::spawn(async move {
            let name = format!("worker-{w}");
            let mut n_done = 0;
            loop {
                let claimed = store.claim(&name, now(), 1).await.unwrap();
                let Some(task) = claimed.first() else {
                    return n_done;
                };
                assert!(store.complete(task.id, &name, now()).await.unwrap());
                n_done += 1;
            }
        }));
    }
    let mut n_done = 0;
    for worker in workers {
        n_done += worker.await.unwrap();
    }
    n_done
}

/// The same statements, bare: bind, execute, read the id, nothing else.
macro_rules! bare_worker {
    ($pool:expr, $claim:expr, $w:expr) => {{
        let pool = $pool.clone();
        let w = $w;
        tokio::spawn(async move {
            let name = format!("worker-{w}");
            let now_us = now().as_microsecond();
            let mut n_done = 0usize;
            loop {
                let row: Option<(i64,)> = sqlx::query_as($claim)
                    .bind(&name)
                    .bind(now_us)
                    .bind(1i64)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
                let Some((id,)) = row else {
                    return n_done;
                };
                let done = sqlx::query(COMPLETE)
                    .bind(id)
                    .bind(&name)
                    .bind(now_us)
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(done.rows_affected(), 1);
                n_done += 1;
            }
        })
    }};
}

async fn run_bare(test: &TestStore, n_workers: usize) -> usize {
    let mut workers = Vec::new();
    for w in 0..n_workers {
        workers.push(match &test.backend {
            Backend::Postgres { store, .. } => bare_worker!(store.pool(), POSTGRES_CLAIM, w),
            Backend::Sqlite { store, .. } => bare_worker!(store.pool(), SQLITE_CLAIM, w),
            Backend::Memory(_) => unreachable!(),
        });
    }
    let mut n_done = 0;
    for worker in workers {
        n_done += worker.await.unwrap();
    }
    n_done
}

fn per_second(n_tasks: usize, elapsed: Duration) -> f64 {
    n_tasks as f64 / elapsed.as_secs_f64()
}

/// Tasks/s of one run: seed the queue, drain it, time the draining.
// A benchmark measures wall-clock time: the one place outside the daemon's
// Clock where reading it is the point.
#[allow(clippy::disallowed_methods)]
async fn run_once(test: &TestStore, n_tasks: usize, n_workers: usize, bare: bool) -> f64 {
    seed(test, n_tasks).await;
    let started = Instant::now();
    let n_done = if bare {
        run_bare(test, n_workers).await
    } else {
        run_store(test.store.clone(), n_workers).await
    };
    let elapsed = started.elapsed();
    assert_eq!(n_done, n_tasks, "every task completed exactly once");
    per_second(n_tasks, elapsed)
}

/// Best tasks/s of bare SQL and of the store. Runs alternate, so load from
/// elsewhere on the machine disturbs both sides alike.
async fn measure(test: &TestStore, n_tasks: usize, n_workers: usize) -> (f64, f64) {
    let (mut bare, mut store) = (0.0f64, 0.0f64);
    for _ in 0..RUNS {
        bare = bare.max(run_once(test, n_tasks, n_workers, true).await);
        store = store.max(run_once(test, n_tasks, n_workers, false).await);
    }
    (bare, store)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // and only wants to know the bench builds and runs: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n_tasks = std::env::var("STEAD_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 50 } else { TASKS_DEFAULT });
    println!("queue: claim(1) + complete, {n_tasks} tasks, best of {RUNS} runs");
    println!(
        "{:<9} {:>7} {:>16} {:>16} {:>7}",
        "backend", "workers", "bare SQL tasks/s", "store tasks/s", "ratio"
    );
    for (label, test) in [
        ("postgres", support::postgres().await),
        ("sqlite", support::sqlite().await),
    ] {
        for n_workers in WORKER_COUNTS {
            let (bare, store) = measure(&test, n_tasks, n_workers).await;
            println!(
                "{label:<9} {n_workers:>7} {bare:>16.0} {store:>16.0} {:>7.2}",
                store / bare
            );
        }
    }
}
