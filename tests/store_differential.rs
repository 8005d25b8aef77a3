//! Differential property test: random operation sequences applied to the
//! in-memory model and to a SQL store give the same observable results.
//! The SQL is checked against the model, call by call.
//!
//! Ids are the one thing allowed to differ (a Postgres sequence advances
//! even when an insert conflicts), so results are compared with every
//! instance and task id replaced by its order of creation.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use stead::core::fleet::{
    add, Instance, InstanceState, ListedInstance, NewTask, RolloutState, Task, TaskKind,
};
use stead::core::types::{
    ActiveRecord, ActiveService, ContainerId, Inhibition, InhibitionReason, InstanceName,
    ServiceName,
};
use stead::ports::{LeaseGrant, LockGrant, LockedWrite, NewInstance, Store, StoreError};
use support::{Backend, TestStore};

/// Cases per backend, and operations per case.
const CASES: u32 = 64;
const OPS_MAX: usize = 60;

#[derive(Clone, Debug)]
enum Op {
    Advance {
        us: i64,
    },
    Create {
        name: u8,
        expires: bool,
    },
    SetState {
        instance: u8,
        from: InstanceState,
        to: InstanceState,
    },
    SetStopped {
        instance: u8,
        stopped: bool,
    },
    SetVersion {
        instance: u8,
        version: u8,
    },
    Enqueue {
        instance: u8,
        kind: TaskKind,
        delay_s: i64,
        fence: Option<u8>,
    },
    Claim {
        worker: u8,
        limit: u32,
    },
    Extend {
        task: u8,
        worker: u8,
    },
    Complete {
        task: u8,
        worker: u8,
    },
    Retry {
        task: u8,
        worker: u8,
        delay_s: i64,
    },
    Fail {
        task: u8,
        worker: u8,
    },
    ResetExpired {
        lease_s: u64,
        fence: Option<u8>,
    },
    Expire {
        instance: u8,
        from: InstanceState,
        fence: Option<u8>,
    },
    SaveActive {
        name: u8,
        service: u8,
        container: u8,
        revision: u8,
        port: u16,
        verified: bool,
    },
    RemoveActive {
        name: u8,
        service: u8,
    },
    PersistBinds {
        name: u8,
        service: u8,
        container: u8,
        revision: u8,
        port: u16,
    },
    RecordVerified {
        name: u8,
        service: u8,
        container: u8,
    },
    ReleaseClaims {
        name: u8,
        container: u8,
    },
    SaveInhibition {
        name: u8,
        service: u8,
        container: u8,
        reason: u8,
        grace_ms: Option<u64>,
    },
    ClearInhibition {
        name: u8,
        service: u8,
        container: u8,
    },
    SetRollout {
        service_type: u8,
        halted: bool,
    },
    Acquire {
        holder: u8,
        ttl_s: u64,
    },
    Release {
        holder: u8,
    },
    TryLock {
        instances: Vec<u8>,
        holder: u8,
        expired: bool,
    },
    Unlock {
        instances: Vec<u8>,
        holder: u8,
    },
    /// A worker's write under its instance lock (T3): a version, or a
    /// move from provisioning to ready.
    UnderLock {
        instance: u8,
        holder: u8,
        version: Option<u8>,
    },
    LoadInstance {
        name: u8,
    },
    LoadActive {
        name: u8,
    },
    LoadInhibitions {
        name: u8,
    },
    LoadTask {
        task: u8,
    },
}

fn instance_state() -> impl Strategy<Value = InstanceState> {
    proptest::sample::select(InstanceState::ALL.to_vec())
}

fn task_kind() -> impl Strategy<Value = TaskKind> {
    proptest::sample::select(TaskKind::ALL.to_vec())
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly unfenced; a fence names a holder that may or may not hold.
    let fence = prop_oneof![3 => Just(None), 1 => (0u8..2).prop_map(Some)];
    prop_oneof![
        // Whole seconds make lease and run_after boundaries (equal times)
        // likely; odd microseconds check precision.
        5 => proptest::sample::select(vec![0i64, 1, 2, 5, 10])
            .prop_map(|s| Op::Advance { us: s * 1_000_000 }),
        1 => (0i64..120_000_000).prop_map(|us| Op::Advance { us }),
        1 => (0u8..5, any::<bool>()).prop_map(|(name, expires)| Op::Create { name, expires }),
        2 => (0u8..5, instance_state(), instance_state())
            .prop_map(|(instance, from, to)| Op::SetState { instance, from, to }),
        1 => (0u8..5, any::<bool>()).prop_map(|(instance, stopped)| Op::SetStopped { instance, stopped }),
        1 => (0u8..5, 0u8..3).prop_map(|(instance, version)| Op::SetVersion { instance, version }),
        8 => (0u8..4, task_kind(), -5i64..10, fence.clone())
            .prop_map(|(instance, kind, delay_s, fence)| Op::Enqueue { instance, kind, delay_s, fence }),
        6 => (0u8..3, 0u32..4).prop_map(|(worker, limit)| Op::Claim { worker, limit }),
        1 => (0u8..5, 0u8..3).prop_map(|(task, worker)| Op::Extend { task, worker }),
        2 => (0u8..5, 0u8..3).prop_map(|(task, worker)| Op::Complete { task, worker }),
        2 => (0u8..5, 0u8..3, 0i64..120).prop_map(|(task, worker, delay_s)| Op::Retry { task, worker, delay_s }),
        1 => (0u8..5, 0u8..3).prop_map(|(task, worker)| Op::Fail { task, worker }),
        5 => (proptest::sample::select(vec![0u64, 1, 2, 5, 10, 15]), fence.clone())
            .prop_map(|(lease_s, fence)| Op::ResetExpired { lease_s, fence }),
        2 => (0u8..5, instance_state(), fence)
            .prop_map(|(instance, from, fence)| Op::Expire { instance, from, fence }),
        2 => (0u8..5, 0u8..2, 0u8..3, 0u8..2, 1u16..4, any::<bool>()).prop_map(
            |(name, service, container, revision, port, verified)| Op::SaveActive {
                name, service, container, revision, port, verified
            }),
        1 => (0u8..5, 0u8..2).prop_map(|(name, service)| Op::RemoveActive { name, service }),
        2 => (0u8..5, 0u8..2, 0u8..3, 0u8..2, 1u16..4).prop_map(
            |(name, service, container, revision, port)| Op::PersistBinds {
                name, service, container, revision, port
            }),
        1 => (0u8..5, 0u8..2, 0u8..3)
            .prop_map(|(name, service, container)| Op::RecordVerified { name, service, container }),
        1 => (0u8..5, 0u8..3).prop_map(|(name, container)| Op::ReleaseClaims { name, container }),
        2 => (0u8..5, 0u8..2, 0u8..3, 0u8..3, proptest::option::of(0u64..100_000)).prop_map(
            |(name, service, container, reason, grace_ms)| Op::SaveInhibition {
                name, service, container, reason, grace_ms
            }),
        1 => (0u8..5, 0u8..2, 0u8..3)
            .prop_map(|(name, service, container)| Op::ClearInhibition { name, service, container }),
        1 => (0u8..2, any::<bool>()).prop_map(|(service_type, halted)| Op::SetRollout { service_type, halted }),
        2 => (0u8..2, 1u64..120).prop_map(|(holder, ttl_s)| Op::Acquire { holder, ttl_s }),
        1 => (0u8..2).prop_map(|holder| Op::Release { holder }),
        2 => (proptest::collection::vec(0u8..6, 0..4), 0u8..2, proptest::bool::weighted(0.2))
            .prop_map(|(instances, holder, expired)| Op::TryLock { instances, holder, expired }),
        1 => (proptest::collection::vec(0u8..6, 0..4), 0u8..2)
            .prop_map(|(instances, holder)| Op::Unlock { instances, holder }),
        2 => (0u8..5, 0u8..2, proptest::option::of(0u8..3))
            .prop_map(|(instance, holder, version)| Op::UnderLock { instance, holder, version }),
        1 => (0u8..5).prop_map(|name| Op::LoadInstance { name }),
        1 => (0u8..5).prop_map(|name| Op::LoadActive { name }),
        1 => (0u8..5).prop_map(|name| Op::LoadInhibitions { name }),
        1 => (0u8..8).prop_map(|task| Op::LoadTask { task }),
    ]
}

/// One store and what the test learnt about it: the ids it handed out, in
/// order, and the lease grants each holder received.
struct Subject {
    store: Arc<dyn Store>,
    instances: Vec<i64>,
    tasks: Vec<i64>,
    grants: BTreeMap<u8, LeaseGrant>,
}

/// An id no store will ever hand out in a test this small.
const MISSING_ID: i64 = 1_000_000;

impl Subject {
    fn new(store: Arc<dyn Store>) -> Self {
        Subject {
            store,
            instances: Vec::new(),
            tasks: Vec::new(),
            grants: BTreeMap::new(),
        }
    }

    /// The n-th created instance, or one that does not exist.
    fn instance_id(&self, n: u8) -> i64 {
        self.instances
            .get(usize::from(n))
            .copied()
            .unwrap_or(MISSING_ID)
    }

    fn task_id(&self, n: u8) -> i64 {
        self.tasks
            .get(usize::from(n))
            .copied()
            .unwrap_or(MISSING_ID)
    }

    fn fence(&self, holder: Option<u8>) -> Option<LeaseGrant> {
        // A holder that never got a grant uses a made-up one, which every
        // backend must reject the same way.
        holder.map(|h| {
            self.grants.get(&h).cloned().unwrap_or(LeaseGrant {
                holder: format!("holder-{h}"),
                epoch: 99,
                expires_at: Timestamp::UNIX_EPOCH,
            })
        })
    }

    fn canonical_instance(&self, id: i64) -> i64 {
        self.instances
            .iter()
            .position(|&i| i == id)
            .map_or(-1, |p| p as i64)
    }

    fn canonical_task(&self, id: i64) -> i64 {
        self.tasks
            .iter()
            .position(|&i| i == id)
            .map_or(-1, |p| p as i64)
    }

    fn instance(&self, mut instance: Instance) -> Instance {
        instance.id = self.canonical_instance(instance.id);
        instance
    }

    fn task(&self, mut task: Task) -> Task {
        task.id = self.canonical_task(task.id);
        task.instance = self.canonical_instance(task.instance);
        task
    }
}

/// What a call returned, with ids made comparable.
#[derive(Debug, PartialEq)]
enum Seen {
    Unit,
    Bool(bool),
    Count(u64),
    NewId(Option<i64>),
    /// An expiry's deprovision (as `NewId`) and the tasks it cancelled.
    Expired(Box<Seen>, Vec<i64>),
    Instance(Option<Instance>),
    Instances(Vec<Instance>, usize),
    Listed(Vec<ListedInstance>, usize),
    Task(Option<Task>),
    Tasks(Vec<Task>, usize),
    Active(ActiveRecord),
    Inhibitions(Vec<Inhibition>),
    Counts(BTreeMap<InstanceState, u64>),
    Rollouts(BTreeMap<String, RolloutState>),
    Lease(Option<(String, i64)>),
    /// Instances by creation order (ids may differ between backends).
    Ids(Vec<i64>),
    /// Errors compare by kind (the messages are the databases' own).
    Error(String),
}

fn error_kind(error: &StoreError) -> String {
    match error {
        StoreError::Unavailable(_) => "unavailable".into(),
        StoreError::BadRow { table, field, .. } => format!("bad row {table}.{field}"),
        StoreError::Conflict(_) => "conflict".into(),
        StoreError::Fenced { epoch } => format!("fenced {epoch}"),
        StoreError::LockLost { holder, .. } => format!("lock lost by {holder}"),
        StoreError::NotFound(_) => "not found".into(),
    }
}

fn seen<T>(result: Result<T, StoreError>, f: impl FnOnce(T) -> Seen) -> Seen {
    result.map_or_else(|e| Seen::Error(error_kind(&e)), f)
}

fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn name(n: u8) -> InstanceName {
    InstanceName::new(format!("tenant-{n}"))
}

fn service(n: u8) -> ServiceName {
    ServiceName::new(["web", "worker"][usize::from(n) % 2])
}

fn container(n: u8) -> ContainerId {
    ContainerId::new(format!("c{n}"))
}

async fn apply(subject: &mut Subject, op: &Op, now: &mut Timestamp) -> Seen {
    let store = subject.store.clone();
    let now_v = *now;
    let seconds = |s: i64| {
        now_v
            .checked_add(jiff::SignedDuration::from_secs(s))
            .unwrap()
    };
    match op.clone() {
        Op::Advance { us } => {
            *now = add(*now, Duration::from_micros(us as u64));
            Seen::Unit
        }
        Op::Create { name: n, expires } => {
            let new = NewInstance {
                domains: Vec::new(),
                spec_digest: None,
                parameters: Default::default(),
                name: name(n),
                team: "team".into(),
                service_type: "wiki".into(),
                version: "1".into(),
                expires_at: expires.then(|| seconds(3600)),
                maintenance_window: None,
            };
            let created = store.create_instance(&new, now_v).await;
            if let Ok(instance) = &created {
                subject.instances.push(instance.id);
            }
            seen(created, |i| Seen::Instance(Some(subject.instance(i))))
        }
        Op::SetState { instance, from, to } => seen(
            store
                .set_instance_state(subject.instance_id(instance), from, to, now_v)
                .await,
            Seen::Bool,
        ),
        Op::SetStopped { instance, stopped } => seen(
            store
                .set_instance_stopped(subject.instance_id(instance), stopped, now_v)
                .await,
            |()| Seen::Unit,
        ),
        Op::SetVersion { instance, version } => seen(
            store
                .set_instance_version(subject.instance_id(instance), &format!("v{version}"), now_v)
                .await,
            |()| Seen::Unit,
        ),
        Op::Enqueue {
            instance,
            kind,
            delay_s,
            fence,
        } => {
            let task = NewTask {
                kind,
                instance: subject.instance_id(instance),
                run_after: seconds(delay_s),
                reason: "diff".into(),
                traceparent: None,
            };
            let queued = store
                .enqueue(&task, now_v, subject.fence(fence).as_ref())
                .await;
            new_task_id(subject, queued)
        }
        Op::Claim { worker, limit } => {
            let claimed = store.claim(&format!("w{worker}"), now_v, limit).await;
            seen(claimed, |tasks| {
                Seen::Tasks(tasks.into_iter().map(|t| subject.task(t)).collect(), 0)
            })
        }
        Op::Extend { task, worker } => seen(
            store
                .extend_lease(subject.task_id(task), &format!("w{worker}"), now_v)
                .await,
            Seen::Bool,
        ),
        Op::Complete { task, worker } => seen(
            store
                .complete(subject.task_id(task), &format!("w{worker}"), now_v)
                .await,
            Seen::Bool,
        ),
        Op::Retry {
            task,
            worker,
            delay_s,
        } => seen(
            store
                .retry(
                    subject.task_id(task),
                    &format!("w{worker}"),
                    seconds(delay_s),
                    "boom",
                    now_v,
                )
                .await,
            Seen::Bool,
        ),
        Op::Fail { task, worker } => seen(
            store
                .fail(subject.task_id(task), &format!("w{worker}"), "bust", now_v)
                .await,
            Seen::Bool,
        ),
        Op::ResetExpired { lease_s, fence } => seen(
            store
                .reset_expired_leases(
                    now_v,
                    Duration::from_secs(lease_s),
                    subject.fence(fence).as_ref(),
                )
                .await,
            Seen::Count,
        ),
        Op::Expire {
            instance,
            from,
            fence,
        } => {
            let id = subject.instance_id(instance);
            let task = NewTask {
                kind: TaskKind::Deprovision,
                instance: id,
                run_after: now_v,
                reason: "ttl".into(),
                traceparent: None,
            };
            let expired = store
                .expire_instance(id, from, &task, now_v, subject.fence(fence).as_ref())
                .await;
            let cancelled: Vec<i64> = expired
                .as_ref()
                .ok()
                .and_then(|e| e.as_ref())
                .map(|e| {
                    e.cancelled
                        .iter()
                        .map(|&id| subject.canonical_task(id))
                        .collect()
                })
                .unwrap_or_default();
            let id = new_task_id(subject, expired.map(|e| e.map(|e| e.task)));
            Seen::Expired(Box::new(id), cancelled)
        }
        Op::SaveActive {
            name: n,
            service: s,
            container: c,
            revision,
            port,
            verified,
        } => {
            let active = ActiveService {
                container: container(c),
                effective_revision: format!("r{revision}"),
                binds: BTreeMap::from([(80, 30_000 + port)]),
                stop_grace: Some(Duration::from_millis(1_500)),
                verified_started_at: verified.then_some(now_v),
            };
            seen(
                store
                    .save_active_service(&name(n), &service(s), &active)
                    .await,
                |()| Seen::Unit,
            )
        }
        Op::RemoveActive {
            name: n,
            service: s,
        } => seen(
            store.remove_active_service(&name(n), &service(s)).await,
            |()| Seen::Unit,
        ),
        Op::PersistBinds {
            name: n,
            service: s,
            container: c,
            revision,
            port,
        } => seen(
            store
                .persist_binds(
                    &name(n),
                    &service(s),
                    &container(c),
                    &format!("r{revision}"),
                    &BTreeMap::from([(8080, 40_000 + port)]),
                    None,
                )
                .await,
            Seen::Bool,
        ),
        Op::RecordVerified {
            name: n,
            service: s,
            container: c,
        } => seen(
            store
                .record_verified_execution(&name(n), &service(s), &container(c), now_v, None)
                .await,
            |()| Seen::Unit,
        ),
        Op::ReleaseClaims {
            name: n,
            container: c,
        } => seen(
            store.release_claims(&name(n), &container(c), None).await,
            |()| Seen::Unit,
        ),
        Op::SaveInhibition {
            name: n,
            service: s,
            container: c,
            reason,
            grace_ms,
        } => {
            let inhibition = Inhibition {
                service: service(s),
                container: container(c),
                reason: InhibitionReason::parse(
                    ["retirement-pending", "operator-hold", "failed-deploy"][usize::from(reason)],
                ),
                operation: "diff".into(),
                created_at: now_v,
                stop_grace: grace_ms.map(Duration::from_millis),
                revert_to: None,
            };
            seen(store.save_inhibition(&name(n), &inhibition).await, |()| {
                Seen::Unit
            })
        }
        Op::ClearInhibition {
            name: n,
            service: s,
            container: c,
        } => seen(
            store
                .clear_inhibition(&name(n), &service(s), &container(c), None)
                .await,
            |()| Seen::Unit,
        ),
        Op::SetRollout {
            service_type,
            halted,
        } => {
            let state = if halted {
                RolloutState::Halted
            } else {
                RolloutState::Active
            };
            seen(
                store
                    .set_rollout(
                        ["wiki", "chat"][usize::from(service_type)],
                        state,
                        "diff",
                        now_v,
                        None,
                    )
                    .await,
                |()| Seen::Unit,
            )
        }
        Op::Acquire { holder, ttl_s } => {
            let granted = store
                .acquire_reconciler_lease(&format!("holder-{holder}"), Duration::from_secs(ttl_s))
                .await;
            if let Ok(Some(grant)) = &granted {
                subject.grants.insert(holder, grant.clone());
            }
            // Leases are timed by each database's own clock (T2), read at
            // different instants: who holds it and under which epoch is
            // what must agree. A lease of at least a second never expires
            // within this test.
            seen(granted, |g| Seen::Lease(g.map(|g| (g.holder, g.epoch))))
        }
        Op::TryLock {
            instances,
            holder,
            expired,
        } => {
            let ids: Vec<i64> = instances.iter().map(|n| subject.instance_id(*n)).collect();
            // A lock of zero length is expired at once; one of an hour
            // never expires within this test.
            let ttl = if expired {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            };
            let locked = store
                .try_lock_instances(&ids, &format!("holder-{holder}"), ttl)
                .await;
            seen(locked, |mut ids| {
                ids.sort_unstable();
                Seen::Ids(
                    ids.iter()
                        .map(|id| subject.canonical_instance(*id))
                        .collect(),
                )
            })
        }
        Op::Unlock { instances, holder } => {
            let ids: Vec<i64> = instances.iter().map(|n| subject.instance_id(*n)).collect();
            seen(
                store
                    .unlock_instances(&ids, &format!("holder-{holder}"))
                    .await,
                |()| Seen::Unit,
            )
        }
        Op::UnderLock {
            instance,
            holder,
            version,
        } => {
            let id = subject.instance_id(instance);
            let lock = LockGrant {
                instance: id,
                holder: format!("holder-{holder}"),
            };
            let version = version.map(|v| format!("v{v}"));
            let write = match &version {
                Some(version) => LockedWrite::Version {
                    id,
                    version,
                    now: now_v,
                },
                None => LockedWrite::State {
                    id,
                    from: InstanceState::Provisioning,
                    to: InstanceState::Ready,
                    now: now_v,
                },
            };
            seen(store.write_under_lock(&lock, write).await, Seen::Bool)
        }
        Op::Release { holder } => match subject.grants.get(&holder).cloned() {
            Some(grant) => seen(store.release_reconciler_lease(&grant).await, |()| {
                Seen::Unit
            }),
            None => Seen::Unit,
        },
        Op::LoadInstance { name: n } => seen(store.instance(&name(n)).await, |i| {
            Seen::Instance(i.map(|i| subject.instance(i)))
        }),
        Op::LoadActive { name: n } => seen(store.load_active(&name(n)).await, Seen::Active),
        Op::LoadInhibitions { name: n } => {
            seen(store.load_inhibitions(&name(n)).await, Seen::Inhibitions)
        }
        Op::LoadTask { task } => seen(store.task(subject.task_id(task)).await, |t| {
            Seen::Task(t.map(|t| subject.task(t)))
        }),
    }
}

fn new_task_id(subject: &mut Subject, result: Result<Option<i64>, StoreError>) -> Seen {
    if let Ok(Some(id)) = &result {
        subject.tasks.push(*id);
    }
    seen(result, |id| {
        Seen::NewId(id.map(|id| subject.canonical_task(id)))
    })
}

/// Everything observable at the end of a case.
async fn snapshot(subject: &Subject) -> Vec<Seen> {
    let store = &subject.store;
    let mut seen_all = vec![
        seen(store.list_instances().await, |rows| {
            Seen::Instances(
                rows.rows.into_iter().map(|i| subject.instance(i)).collect(),
                rows.bad.len(),
            )
        }),
        seen(store.list_for_recovery().await, |rows| {
            Seen::Listed(
                rows.rows
                    .into_iter()
                    .map(|mut i| {
                        i.id = subject.canonical_instance(i.id);
                        i
                    })
                    .collect(),
                rows.bad.len(),
            )
        }),
        seen(store.active_tasks().await, |rows| {
            Seen::Tasks(
                rows.rows.into_iter().map(|t| subject.task(t)).collect(),
                rows.bad.len(),
            )
        }),
        seen(store.queue_depth().await, Seen::Count),
        seen(store.instance_counts().await, Seen::Counts),
        seen(store.rollouts().await, Seen::Rollouts),
    ];
    for &id in &subject.tasks {
        seen_all.push(seen(store.task(id).await, |t| {
            Seen::Task(t.map(|t| subject.task(t)))
        }));
    }
    for n in 0..5 {
        seen_all.push(seen(store.load_active(&name(n)).await, Seen::Active));
        seen_all.push(seen(
            store.load_inhibitions(&name(n)).await,
            Seen::Inhibitions,
        ));
    }
    seen_all
}

fn check<T: PartialEq + Debug>(step: &str, model: &T, sql: &T) -> Result<(), TestCaseError> {
    if model == sql {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!(
            "{step}:\n  model: {model:?}\n  sql:   {sql:?}"
        )))
    }
}

/// Empties a SQL store between cases (a fresh database per case would be
/// slow); the lease row goes back to its migrated state.
async fn reset(store: &TestStore) {
    let statements = match store.backend {
        Backend::Sqlite { .. } => {
            "DELETE FROM active_services; DELETE FROM inhibitions; DELETE FROM tasks; \
             DELETE FROM rollouts; DELETE FROM instances; \
             UPDATE reconciler_lease SET holder = NULL, epoch = 0, expires_at_us = NULL"
        }
        Backend::Postgres { .. } => {
            "TRUNCATE active_services, inhibitions, tasks, rollouts, instances RESTART IDENTITY CASCADE; \
             UPDATE reconciler_lease SET holder = NULL, epoch = 0, expires_at_us = NULL"
        }
        Backend::Memory(_) => unreachable!("the model is never reset, it is rebuilt"),
    };
    store.raw(statements).await.unwrap().unwrap();
}

fn run_differential(open: fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = TestStore>>>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sql = runtime.block_on(open());
    // PROPTEST_CASES raises the count for a longer hunt.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = proptest::collection::vec(op(), 1..OPS_MAX);
    let result = runner.run(&ops, |ops| {
        runtime.block_on(async {
            reset(&sql).await;
            let mut model = Subject::new(support::memory().await.store);
            let mut subject = Subject::new(sql.store.clone());
            let (mut model_now, mut sql_now) = (t0(), t0());
            // Three tenants exist from the start so most operations find
            // one; the generated ops create (and collide with) more.
            let setup = (0..3).map(|n| Op::Create {
                name: n,
                expires: n == 1,
            });
            for (i, op) in setup.chain(ops.iter().cloned()).enumerate() {
                let op = &op;
                let expected = apply(&mut model, op, &mut model_now).await;
                let actual = apply(&mut subject, op, &mut sql_now).await;
                check(&format!("step {i} {op:?}"), &expected, &actual)?;
            }
            check(
                "final state",
                &snapshot(&model).await,
                &snapshot(&subject).await,
            )
        })
    });
    if let Err(failure) = result {
        panic!("{} diverges from the model: {failure}", sql.name());
    }
}

#[test]
fn sqlite_store_matches_the_model() {
    run_differential(|| Box::pin(support::sqlite()));
}

#[test]
fn postgres_store_matches_the_model() {
    run_differential(|| Box::pin(support::postgres()));
}
