//! Concurrency and crash behaviour of the Postgres store, with real
//! concurrent connections: each "process" below has its own connection pool,
//! as workers and reconcilers on different hosts would.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use stead::core::fleet::{add, InstanceState, NewTask, TaskKind, TaskState};
use stead::core::types::InstanceName;
use stead::ports::{NewInstance, Store, StoreError};
use stead::store::sql::PostgresStore;

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn task(kind: TaskKind, instance: i64) -> NewTask {
    NewTask {
        kind,
        instance,
        run_after: t(0),
        reason: "concurrency".into(),
        traceparent: None,
    }
}

/// A fresh database and a way to open independent connections to it.
struct Db {
    url: String,
}

impl Db {
    async fn new() -> Db {
        let url = support::fresh_postgres_database().await;
        PostgresStore::connect(&url)
            .await
            .unwrap()
            .migrate()
            .await
            .unwrap();
        Db { url }
    }

    /// A separate pool: another process, another host.
    async fn process(&self) -> Arc<dyn Store> {
        Arc::new(PostgresStore::connect(&self.url).await.unwrap())
    }
}

async fn create_instances(store: &dyn Store, n: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let new = NewInstance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            name: InstanceName::new(format!("tenant-{i}")),
            team: "t".into(),
            service_type: "wiki".into(),
            version: "1".into(),
            expires_at: None,
            maintenance_window: None,
        };
        ids.push(store.create_instance(&new, t(0)).await.unwrap().id);
    }
    ids
}

const WORKERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_never_double_claim() {
    let db = Db::new().await;
    let setup = db.process().await;
    let instances = create_instances(&*setup, 60).await;
    let mut expected = BTreeSet::new();
    for &instance in &instances {
        for kind in TaskKind::ALL {
            let id = setup
                .enqueue(&task(kind, instance), t(0), None)
                .await
                .unwrap();
            expected.insert(id.unwrap());
        }
    }
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let store = db.process().await;
        workers.push(tokio::spawn(async move {
            let name = format!("worker-{w}");
            let mut claimed = Vec::new();
            loop {
                let batch = store.claim(&name, t(1), 3).await.unwrap();
                if batch.is_empty() {
                    return claimed;
                }
                for task in batch {
                    assert_eq!(task.locked_by.as_deref(), Some(name.as_str()));
                    assert!(store.complete(task.id, &name, t(2)).await.unwrap());
                    claimed.push(task.id);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    let unique: BTreeSet<_> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a task was claimed twice");
    assert_eq!(unique, expected, "every task claimed exactly once");
    for id in expected {
        let task = setup.task(id).await.unwrap().unwrap();
        assert_eq!((task.state, task.attempts), (TaskState::Done, 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_of_one_task_insert_exactly_one() {
    let db = Db::new().await;
    let setup = db.process().await;
    let instance = create_instances(&*setup, 1).await[0];
    let mut writers = Vec::new();
    for _ in 0..WORKERS {
        let store = db.process().await;
        writers.push(tokio::spawn(async move {
            store
                .enqueue(&task(TaskKind::Reprovision, instance), t(0), None)
                .await
                .unwrap()
        }));
    }
    let mut inserted = 0;
    for writer in writers {
        inserted += usize::from(writer.await.unwrap().is_some());
    }
    assert_eq!(inserted, 1);
    assert_eq!(setup.active_tasks().await.unwrap().rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_workers_task_is_requeued_only_after_its_lease_expired() {
    let db = Db::new().await;
    let reaper = db.process().await;
    let instance = create_instances(&*reaper, 1).await[0];
    let id = reaper
        .enqueue(&task(TaskKind::Provision, instance), t(0), None)
        .await
        .unwrap()
        .unwrap();
    {
        // The worker claims and then disappears: its connections are gone.
        let worker = PostgresStore::connect(&db.url).await.unwrap();
        assert_eq!(worker.claim("doomed", t(10), 1).await.unwrap().len(), 1);
        worker.pool().close().await;
    }
    let lease = Duration::from_secs(60);
    // Many reapers sweep concurrently at every instant up to expiry: none
    // may break the lease.
    let mut sweeps = Vec::new();
    for step in 0..=WORKERS as i64 {
        let store = db.process().await;
        let now = t(10 + step * 60 / WORKERS as i64);
        sweeps.push(tokio::spawn(async move {
            store.reset_expired_leases(now, lease, None).await.unwrap()
        }));
    }
    for sweep in sweeps {
        assert_eq!(
            sweep.await.unwrap(),
            0,
            "a lease was broken before it expired"
        );
    }
    let held = reaper.task(id).await.unwrap().unwrap();
    assert_eq!(
        (held.state, held.locked_by.as_deref()),
        (TaskState::Running, Some("doomed"))
    );
    let expired = add(t(70), Duration::from_micros(1));
    assert_eq!(
        reaper
            .reset_expired_leases(expired, lease, None)
            .await
            .unwrap(),
        1
    );
    let requeued = reaper.claim("survivor", expired, 1).await.unwrap();
    assert_eq!((requeued[0].id, requeued[0].attempts), (id, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_extension_racing_the_reaper_has_one_winner() {
    let db = Db::new().await;
    let setup = db.process().await;
    let instances = create_instances(&*setup, 24).await;
    let lease = Duration::from_secs(60);
    for (round, &instance) in instances.iter().enumerate() {
        let id = setup
            .enqueue(&task(TaskKind::Upgrade, instance), t(0), None)
            .await
            .unwrap()
            .unwrap();
        let worker = format!("w{round}");
        assert_eq!(setup.claim(&worker, t(0), 1).await.unwrap().len(), 1);
        // At t(61) the lease has expired; the worker's late extension and
        // the reaper race. Exactly one of them may win.
        let (extender, reaper) = (db.process().await, db.process().await);
        let extend = tokio::spawn(async move { extender.extend_lease(id, &worker, t(61)).await });
        let reap =
            tokio::spawn(async move { reaper.reset_expired_leases(t(61), lease, None).await });
        let extended = extend.await.unwrap().unwrap();
        let reaped = reap.await.unwrap().unwrap();
        assert!(
            extended != (reaped == 1),
            "round {round}: extended={extended} reaped={reaped}"
        );
        let state = setup.task(id).await.unwrap().unwrap().state;
        assert_eq!(
            state,
            if extended {
                TaskState::Running
            } else {
                TaskState::Queued
            }
        );
    }
}

/// Leases are timed by the database's clock (T2), so expiry takes real
/// time: this length keeps the test short and still far above a round trip.
const SHORT_LEASE: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_never_hold_the_lease_at_once() {
    let db = Db::new().await;
    let (a, b) = (db.process().await, db.process().await);
    let mut last: Option<stead::ports::LeaseGrant> = None;
    for step in 0..16 {
        let (a2, b2) = (a.clone(), b.clone());
        let ga = tokio::spawn(async move { a2.acquire_reconciler_lease("a", SHORT_LEASE).await });
        let gb = tokio::spawn(async move { b2.acquire_reconciler_lease("b", SHORT_LEASE).await });
        let (ga, gb) = (ga.await.unwrap().unwrap(), gb.await.unwrap().unwrap());
        assert!(
            ga.is_none() || gb.is_none(),
            "step {step}: both hold the lease"
        );
        let granted = ga
            .or(gb)
            .expect("someone holds it: a holder renews, else it is free");
        if let Some(previous) = &last {
            if previous.holder == granted.holder {
                assert_eq!(granted.epoch, previous.epoch);
            } else {
                assert_eq!(granted.epoch, previous.epoch + 1);
                let now = a.database_now().await.unwrap();
                assert!(previous.expires_at <= now, "taken over before expiry");
            }
        }
        // Every fourth step the holder stalls past its lease (a GC pause, a
        // partition) so the other one may take over, and its fenced writes
        // are refused from then on.
        if step % 4 == 3 {
            let stale = granted.clone();
            tokio::time::sleep(SHORT_LEASE + Duration::from_millis(50)).await;
            let (other_store, other) = if stale.holder == "a" {
                (&b, "b")
            } else {
                (&a, "a")
            };
            let taken = other_store
                .acquire_reconciler_lease(other, SHORT_LEASE)
                .await
                .unwrap()
                .expect("free after expiry");
            assert_eq!(taken.epoch, stale.epoch + 1);
            let stale_store = if stale.holder == "a" { &a } else { &b };
            let now = stale_store.database_now().await.unwrap();
            let fenced = stale_store
                .reset_expired_leases(now, SHORT_LEASE, Some(&stale))
                .await;
            assert_eq!(fenced, Err(StoreError::Fenced { epoch: stale.epoch }));
            last = Some(taken);
        } else {
            last = Some(granted);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_reconcilers_fenced_writes_race_a_takeover_safely() {
    let db = Db::new().await;
    let (old, new) = (db.process().await, db.process().await);
    let instances = create_instances(&*old, WORKERS).await;
    let stale = old
        .acquire_reconciler_lease("old", SHORT_LEASE)
        .await
        .unwrap()
        .unwrap();
    // The old holder keeps writing, paced, while the new one takes over as
    // soon as the lease expires.
    let writes = {
        let old = old.clone();
        let stale = stale.clone();
        let instances = instances.clone();
        tokio::spawn(async move {
            let mut results = Vec::new();
            for instance in instances {
                let now = old.database_now().await.unwrap();
                results.push(
                    old.enqueue(&task(TaskKind::Provision, instance), now, Some(&stale))
                        .await,
                );
                tokio::time::sleep(SHORT_LEASE / 8).await;
            }
            results
        })
    };
    let fresh = loop {
        if let Some(grant) = new
            .acquire_reconciler_lease("new", SHORT_LEASE * 10)
            .await
            .unwrap()
        {
            break grant;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(fresh.epoch, stale.epoch + 1);
    let results = writes.await.unwrap();
    // Every write either landed before the lease expired or was fenced;
    // once one was fenced, none after it landed.
    let first_fenced = results
        .iter()
        .position(|r| r.is_err())
        .unwrap_or(results.len());
    assert!(
        first_fenced < results.len(),
        "the writes outlasted the lease"
    );
    for (i, result) in results.iter().enumerate() {
        if i < first_fenced {
            assert!(matches!(result, Ok(Some(_))), "{i}: {result:?}");
        } else {
            assert_eq!(
                result,
                &Err(StoreError::Fenced { epoch: stale.epoch }),
                "{i}"
            );
        }
    }
    assert_eq!(new.active_tasks().await.unwrap().rows.len(), first_fenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ttl_expiry_state_change_and_insert_are_one_transaction() {
    let db = Db::new().await;
    let setup = db.process().await;
    let instances = create_instances(&*setup, 12).await;
    for &instance in &instances {
        // Concurrent reconciler ticks and an operator's hand-made
        // deprovision all race on one instance.
        let mut racers = Vec::new();
        for r in 0..6 {
            let store = db.process().await;
            racers.push(tokio::spawn(async move {
                let deprovision = task(TaskKind::Deprovision, instance);
                if r == 0 {
                    (
                        "enqueue",
                        store.enqueue(&deprovision, t(1), None).await.unwrap(),
                    )
                } else {
                    let expired = store
                        .expire_instance(
                            instance,
                            InstanceState::Provisioning,
                            &deprovision,
                            t(1),
                            None,
                        )
                        .await
                        .unwrap();
                    ("expire", expired.map(|e| e.task))
                }
            }));
        }
        let mut expired = 0;
        let mut enqueued = 0;
        for racer in racers {
            match racer.await.unwrap() {
                ("expire", Some(_)) => expired += 1,
                ("enqueue", Some(_)) => enqueued += 1,
                _ => {}
            }
        }
        assert_eq!(expired + enqueued, 1, "exactly one deprovision inserted");
        let tasks = setup.active_tasks().await.unwrap().rows;
        let deprovisions: Vec<_> = tasks.iter().filter(|t| t.instance == instance).collect();
        assert_eq!(deprovisions.len(), 1);
        let state = setup.instance_by_id(instance).await.unwrap().unwrap().state;
        // Never a state change without its task, never a task count of two.
        let expected = if expired == 1 {
            InstanceState::Deleting
        } else {
            InstanceState::Provisioning
        };
        assert_eq!(state, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_mid_expiry_leaves_nothing_half_written() {
    let db = Db::new().await;
    let setup = db.process().await;
    let instance = create_instances(&*setup, 1).await[0];
    // The connection dies while the expiry transaction is in flight: the
    // call is abandoned at every point it can yield. Whatever happened, the
    // instance and its task moved together.
    for attempt in 0..20u64 {
        let store = PostgresStore::connect(&db.url).await.unwrap();
        let deprovision = task(TaskKind::Deprovision, instance);
        let call = store.expire_instance(
            instance,
            InstanceState::Provisioning,
            &deprovision,
            t(1),
            None,
        );
        let _ = tokio::time::timeout(Duration::from_micros(attempt * 150), call).await;
        store.pool().close().await;
        let state = setup.instance_by_id(instance).await.unwrap().unwrap().state;
        let n_tasks = setup.active_tasks().await.unwrap().rows.len();
        match state {
            InstanceState::Provisioning => assert_eq!(n_tasks, 0, "attempt {attempt}"),
            InstanceState::Deleting => {
                assert_eq!(n_tasks, 1, "attempt {attempt}");
                return;
            }
            other => panic!("unexpected state {other}"),
        }
    }
    // The next tick repairs it: with no interruption the expiry goes through.
    let expired = setup
        .expire_instance(
            instance,
            InstanceState::Provisioning,
            &task(TaskKind::Deprovision, instance),
            t(2),
            None,
        )
        .await
        .unwrap();
    assert!(expired.is_some());
}
