//! Log readiness through the engine, over in-memory ports: a service ready
//! on a log line is published only once its execution printed that line
//! (R13), a line an earlier execution printed never counts, and an upgrade
//! switches only to a successor that printed its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::fleet::{InstanceState, NewTask, TaskKind, TaskRetryPolicy};
use stead::core::grants::Grants;
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::core::types::{ContainerId, InstanceName, ServiceKey, ServiceName, Timestamp};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::worker::{TaskEnd, Worker, WorkerConfig};
use stead::engine::Ports;
use stead::ports::{Clock, NewInstance, Store};
use stead_testkit::ports::{
    Fault, FaultInjector, Hooks, ManualClock, MemoryNotifier, MemoryPolicy, MemoryProbe,
    MemoryProvisioner, MemoryRuntime, MemoryTraffic, Op,
};
use stead_testkit::store::MemoryStore;

const CATALOG: &str = r#"
[types.ledger]
version = "2"

[[types.ledger.services]]
name = "db"
image = "ledger-db"
# A port, so there is a route to withhold until the line appears: a
# service without ports is never routed (the proxy refuses a route
# without an upstream, and so does the traffic double).
ports = [5432]

[types.ledger.services.readiness]
kind = "log"
pattern = "ready to accept connections"
"#;

const READY_LINE: &str = "LOG: database system is ready to accept connections";

/// Something that happens in the world at a chosen moment.
type Happening = Box<dyn FnOnce() + Send>;

/// Runs a happening the next time an operation is asked for, and injects
/// no fault.
#[derive(Default)]
struct Script {
    armed: Mutex<Vec<(Op, Happening)>>,
}

impl Script {
    fn on_next(&self, op: Op, happen: impl FnOnce() + Send + 'static) {
        self.armed.lock().unwrap().push((op, Box::new(happen)));
    }
}

impl FaultInjector for Script {
    fn decide(&self, op: Op, _subject: &str) -> Fault {
        let due = {
            let mut armed = self.armed.lock().unwrap();
            let at = armed.iter().position(|(o, _)| *o == op);
            at.map(|i| armed.remove(i).1)
        };
        if let Some(happen) = due {
            happen();
        }
        Fault::Proceed
    }
}

struct Fixture {
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    runtime: Arc<MemoryRuntime>,
    traffic: Arc<MemoryTraffic>,
    script: Arc<Script>,
    ports: Ports,
    catalog: Arc<Catalog>,
    locks: Arc<InstanceLocks>,
}

fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(
        Timestamp::from_second(1_800_000_000).unwrap(),
    ));
    let script = Arc::new(Script::default());
    let hooks = Hooks {
        faults: script.clone(),
        ..Hooks::default()
    };
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), hooks.clone()));
    let traffic = Arc::new(MemoryTraffic::new(hooks.clone()));
    let store = Arc::new(MemoryStore::new().with_clock(clock.clone()));
    let ports = Ports {
        clock: clock.clone(),
        runtime: runtime.clone(),
        traffic: traffic.clone(),
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime.clone(), hooks.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: Arc::new(MemoryProvisioner::new("stead", hooks.clone())),
        notifier: Arc::new(MemoryNotifier::new(hooks)),
    };
    Fixture {
        clock,
        locks: Arc::new(InstanceLocks::new(store.clone())),
        store,
        runtime,
        traffic,
        script,
        ports,
        catalog: Arc::new(Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap()),
    }
}

impl Fixture {
    /// The recovery pass, with the catalog's readiness probes as the
    /// daemon installs them.
    fn recoverer(&self) -> Recoverer {
        let policy = RecoveryPolicy {
            instance_deadline: Duration::from_millis(300),
            ..Default::default()
        };
        let ttl = reconciler_lease_ttl(
            ControlConfig::default().tick_interval,
            policy.instance_deadline,
        );
        let readiness = self
            .catalog
            .entries()
            .flat_map(|entry| {
                entry.services.iter().map(|spec| {
                    (
                        (entry.service_type.clone(), spec.name.clone()),
                        spec.readiness.clone(),
                    )
                })
            })
            .collect::<BTreeMap<_, _>>();
        Recoverer::new(
            self.ports.clone(),
            policy,
            readiness,
            self.locks.clone(),
            "a/recovery".into(),
            Arc::new(LeaseGuard::new("a".into(), ttl, LEASE_MARGIN)),
        )
    }

    fn worker(&self) -> Worker {
        self.worker_with(self.catalog.clone())
    }

    /// A worker whose catalog is `catalog`.
    fn worker_with(&self, catalog: Arc<Catalog>) -> Worker {
        Worker::new(
            self.ports.clone(),
            catalog,
            WorkerConfig {
                id: "w1".into(),
                lease: Duration::from_secs(300),
                retry: TaskRetryPolicy {
                    attempts_max: 1,
                    ..Default::default()
                },
                idle_poll: Duration::from_millis(10),
                stop_grace_default: Duration::from_secs(1),
                broken: None,
            },
            self.locks.clone(),
        )
    }

    /// Creates `name` at `version` and runs its provisioning task, by a
    /// worker whose catalog had that version (a worker provisions its own
    /// catalog's version): its container runs and ACTIVE names it, nothing
    /// is published yet.
    async fn provisioned(&self, name: &str, version: &str) -> i64 {
        let instance = self
            .store
            .create_instance(
                &NewInstance {
                    domains: Vec::new(),
                    spec_digest: None,
                    parameters: Default::default(),
                    name: InstanceName::new(name),
                    team: "t".into(),
                    service_type: "ledger".into(),
                    version: version.into(),
                    expires_at: None,
                    maintenance_window: None,
                },
                self.clock.now(),
            )
            .await
            .unwrap();
        let then = Arc::new(Catalog::from_entries(self.catalog.entries().map(|e| {
            stead::core::catalog::CatalogEntry {
                version: version.into(),
                ..e.clone()
            }
        })));
        let end = self
            .run_task_by(&self.worker_with(then), instance.id, TaskKind::Provision)
            .await;
        assert_eq!(end, TaskEnd::Done, "provisioned");
        instance.id
    }

    async fn run_task(&self, instance: i64, kind: TaskKind) -> TaskEnd {
        self.run_task_by(&self.worker(), instance, kind).await
    }

    async fn run_task_by(&self, worker: &Worker, instance: i64, kind: TaskKind) -> TaskEnd {
        self.store
            .enqueue(
                &NewTask {
                    kind,
                    instance,
                    run_after: self.clock.now(),
                    reason: "test".into(),
                    traceparent: None,
                },
                self.clock.now(),
                None,
            )
            .await
            .unwrap();
        let (_, end) = worker.work_once().await.expect("a task");
        end
    }

    async fn db_container(&self, instance: &str) -> ContainerId {
        self.store
            .load_active(&InstanceName::new(instance))
            .await
            .unwrap()
            .services[&ServiceName::new("db")]
            .container
            .clone()
    }

    fn routed_to(&self, instance: &str) -> Option<ContainerId> {
        let key = ServiceKey {
            instance: InstanceName::new(instance),
            service: ServiceName::new("db"),
        };
        self.traffic.routes().get(&key).map(|r| r.container.clone())
    }

    /// One recovery pass, a second after the last: a failed verification
    /// is retried at once while its budget has free attempts (R10).
    async fn pass_later(&self, recoverer: &Recoverer) -> String {
        self.clock.advance(Duration::from_secs(1));
        format!("{:?}", recoverer.pass().await)
    }
}

#[tokio::test]
async fn a_log_ready_service_is_published_only_after_its_line_appears() {
    let f = fixture();
    f.provisioned("l1", "2").await;
    let db = f.db_container("l1").await;
    let recoverer = f.recoverer();

    f.runtime.print(&db, "LOG: starting, replaying the journal");
    let outcome = f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), None, "published before its line");
    assert!(
        outcome.contains("waiting for a log line containing"),
        "{outcome}"
    );

    f.runtime.print(&db, READY_LINE);
    let outcome = f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), Some(db), "{outcome}");
}

#[tokio::test]
async fn a_line_of_an_earlier_execution_does_not_publish_the_next_one() {
    let f = fixture();
    f.provisioned("l1", "2").await;
    let db = f.db_container("l1").await;
    let recoverer = f.recoverer();
    f.runtime.print(&db, READY_LINE);
    f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), Some(db.clone()));

    // The runtime restarts it on its own; the logs keep the old line.
    let restarted = f.runtime.next_execution();
    f.runtime.with_containers(|cs| {
        cs.get_mut(&db).unwrap().started_at = Some(restarted);
    });
    let outcome = f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), None, "the new execution is unverified");
    assert!(
        outcome.contains("waiting for a log line containing"),
        "{outcome}"
    );

    f.runtime.print(&db, READY_LINE);
    f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), Some(db));
}

#[tokio::test]
async fn an_upgrade_switches_only_to_a_successor_that_printed_its_own_line() {
    let f = fixture();
    let instance = f.provisioned("l1", "1").await;
    let before = f.db_container("l1").await;
    f.runtime.print(&before, READY_LINE);
    let recoverer = f.recoverer();
    f.pass_later(&recoverer).await;
    assert_eq!(f.routed_to("l1"), Some(before.clone()));

    // The predecessor's line says nothing of the successor.
    let end = f.run_task(instance, TaskKind::Upgrade).await;
    assert!(
        matches!(end, TaskEnd::Retried(_) | TaskEnd::Failed(_)),
        "{end:?}"
    );
    assert_eq!(f.db_container("l1").await, before);

    // Now the successor prints its line right before it is probed.
    // Named by its revision: the version and the spec's digest.
    let revision = f.catalog.get("ledger").unwrap().services[0].revision("2");
    let successor = ContainerId::new(format!("stead.l1.db.{revision}"));
    let runtime = f.runtime.clone();
    let printer = successor.clone();
    f.script.on_next(Op::Probe, move || {
        assert!(runtime.print(&printer, READY_LINE), "the successor runs");
    });
    f.clock.advance(Duration::from_secs(3600));
    // The failed upgrade halted the rollout (C8); an operator resumes it,
    // or the worker would rightly not start the next one.
    f.store
        .set_rollout(
            "ledger",
            stead::core::fleet::RolloutState::Active,
            "operator: resume",
            f.clock.now(),
            None,
        )
        .await
        .unwrap();
    let end = f.run_task(instance, TaskKind::Upgrade).await;
    assert_eq!(end, TaskEnd::Done);
    assert_eq!(f.db_container("l1").await, successor);
    let row = f
        .store
        .instance(&InstanceName::new("l1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.version.as_str(), row.state),
        ("2", InstanceState::Ready)
    );
}
