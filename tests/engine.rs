//! The engine against in-memory ports and the in-memory store: the tick's
//! error boundaries, heartbeat and trace context (C3, C9), the singleton
//! lease (C2), the recovery pass's bounds (R2, R3), and the workers'
//! handlers (C11). The same engine runs against the real adapters in
//! `tests/e2e_*` and in the simulation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::errors::{Cause, ErrorKind, PortName};
use stead::core::fleet::{
    InstanceState, NewTask, RolloutState, TaskKind, TaskRetryPolicy, TaskState,
};
use stead::core::grants::Grants;
use stead::core::pass::PassError;
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::core::recovery::RecoveryError;
use stead::core::types::{
    ContainerId, ContainerStatus, Inhibition, InhibitionReason, InstanceName, RuntimeError,
    ServiceKey, ServiceName, Timestamp,
};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, RecoverError, Recoverer};
use stead::engine::tick::{Check, Reconciler};
use stead::engine::wake::WakeQueue;
use stead::engine::worker::{TaskEnd, Worker, WorkerConfig};
use stead::engine::Ports;
use stead::ports::{NewInstance, Runtime, Store, Traffic, TypeVersion};
use stead_testkit::metrics::Tally;
use stead_testkit::ports::{
    Fault, FaultInjector, Hooks, ManualClock, MemoryNotifier, MemoryPolicy, MemoryProbe,
    MemoryProvisioner, MemoryRuntime, MemoryTraffic, Op,
};
use stead_testkit::store::{Garbled, MemoryStore};

/// Predecessors retire as soon as their successors serve (`bake_ms = 0`):
/// the scenarios below that are not about the bake window (#40).
const CATALOG: &str = r#"
[types.wiki]
version = "2"
bake_ms = 0

[[types.wiki.services]]
name = "web"
image = "wiki"
ports = [8080]
volumes = [{ name = "data", path = "/data" }]
# Asked for: a service with a named volume is replaced stop-first unless
# overlap is asked for (#40); these tests are of the overlap.
update = "overlap"

[types.wiki.services.readiness]
kind = "none"
"#;

/// `wiki` with a database beside web: no ports, reached only on the
/// instance network, its data on a named volume.
const CATALOG_WITH_DB: &str = r#"
[types.wiki]
version = "2"
bake_ms = 0

[[types.wiki.services]]
name = "web"
image = "wiki"
ports = [8080]

[types.wiki.services.readiness]
kind = "none"

[[types.wiki.services]]
name = "db"
image = "db"
volumes = [{ name = "data", path = "/data" }]

[types.wiki.services.readiness]
kind = "none"
"#;

/// Something that happens in the world at a chosen moment.
type Happening = Box<dyn FnOnce() + Send>;

/// Fails the operations listed, by subject prefix.
#[derive(Default)]
struct Script {
    rules: std::sync::Mutex<Vec<(Op, String, Fault)>>,
    /// Run once, the next time this operation is asked for.
    armed: std::sync::Mutex<Vec<(Op, Happening)>>,
    /// Every operation the ports were asked for, in order.
    seen: std::sync::Mutex<Vec<Op>>,
}

impl Script {
    fn count(&self, op: Op) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|o| **o == op)
            .count()
    }

    /// Makes something happen in the world the next time `op` is asked
    /// for, as a proxy reload happens between two steps of a pass.
    fn on_next(&self, op: Op, happen: impl FnOnce() + Send + 'static) {
        self.armed.lock().unwrap().push((op, Box::new(happen)));
    }

    /// Every rule dropped: the port answers again.
    fn heal(&self) {
        self.rules.lock().unwrap().clear();
    }

    fn fail(&self, op: Op, subject_prefix: &str, fault: Fault) {
        self.rules
            .lock()
            .unwrap()
            .push((op, subject_prefix.into(), fault));
    }
}

impl FaultInjector for Script {
    fn decide(&self, op: Op, subject: &str) -> Fault {
        self.seen.lock().unwrap().push(op);
        let due = {
            let mut armed = self.armed.lock().unwrap();
            armed
                .iter()
                .position(|(o, _)| *o == op)
                .map(|i| armed.remove(i).1)
        };
        if let Some(happen) = due {
            happen();
        }
        let rules = self.rules.lock().unwrap();
        rules
            .iter()
            .find(|(o, prefix, _)| *o == op && subject.starts_with(prefix.as_str()))
            .map_or(Fault::Proceed, |(_, _, f)| f.clone())
    }
}

struct Fixture {
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    runtime: Arc<MemoryRuntime>,
    traffic: Arc<MemoryTraffic>,
    provisioner: Arc<MemoryProvisioner>,
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
    let provisioner = Arc::new(MemoryProvisioner::new("stead", hooks.clone()));
    // The store's clock is the test's: leases and locks are timed by the
    // database's clock (T2), which here is the manual one.
    let store = Arc::new(MemoryStore::new().with_clock(clock.clone()));
    let ports = Ports {
        clock: clock.clone(),
        runtime: runtime.clone(),
        traffic: traffic.clone(),
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime.clone(), hooks.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: provisioner.clone(),
        notifier: Arc::new(MemoryNotifier::new(hooks)),
    };
    Fixture {
        clock,
        locks: Arc::new(InstanceLocks::new(store.clone())),
        store,
        runtime,
        traffic,
        provisioner,
        script,
        ports,
        catalog: Arc::new(Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap()),
    }
}

/// The fixture's catalog file as written at `version`, parsed again (its
/// spec digests that version's own): what the daemon loaded that day.
fn catalog_file_at(version: &str) -> Catalog {
    let text = CATALOG.replace("version = \"2\"", &format!("version = \"{version}\""));
    Catalog::from_toml(&text, "catalog.toml", &Grants::default()).unwrap()
}

impl Fixture {
    fn recoverer(&self) -> Arc<Recoverer> {
        self.recoverer_of("a")
    }

    /// The recovery of process `holder` (its own lease view, this
    /// process's locks).
    fn recoverer_of(&self, holder: &str) -> Arc<Recoverer> {
        self.recoverer_broken(holder, None)
    }

    /// The recovery of process `holder`, with `broken` armed (the mutation
    /// exercise's switch).
    fn recoverer_broken(
        &self,
        holder: &str,
        broken: Option<stead::core::broken::Mutant>,
    ) -> Arc<Recoverer> {
        let policy = RecoveryPolicy {
            instance_deadline: Duration::from_millis(300),
            broken,
            ..Default::default()
        };
        let ttl = reconciler_lease_ttl(
            ControlConfig::default().tick_interval,
            policy.instance_deadline,
        );
        Arc::new(Recoverer::new(
            self.ports.clone(),
            policy,
            Default::default(),
            self.locks.clone(),
            format!("{holder}/recovery"),
            Arc::new(LeaseGuard::new(holder.into(), ttl, LEASE_MARGIN)),
        ))
    }

    fn reconciler(&self, holder: &str) -> Reconciler {
        Reconciler::new(
            self.ports.clone(),
            self.catalog.clone(),
            ControlConfig::default(),
            self.recoverer_of(holder),
            7,
        )
    }

    fn worker(&self) -> Worker {
        self.worker_with(self.catalog.clone())
    }

    /// The fixture's catalog as it was at `version`, with the same
    /// services: what a worker of that day provisioned with.
    fn catalog_at(&self, version: &str) -> Arc<Catalog> {
        Arc::new(Catalog::from_entries(self.catalog.entries().map(|e| {
            stead::core::catalog::CatalogEntry {
                version: version.into(),
                ..e.clone()
            }
        })))
    }

    fn worker_with(&self, catalog: Arc<Catalog>) -> Worker {
        Worker::new(
            self.ports.clone(),
            catalog,
            WorkerConfig {
                id: "w1".into(),
                lease: Duration::from_secs(300),
                retry: TaskRetryPolicy {
                    attempts_max: 2,
                    ..Default::default()
                },
                idle_poll: Duration::from_millis(10),
                stop_grace_default: Duration::from_secs(1),
                broken: None,
            },
            self.locks.clone(),
        )
    }

    /// A wiki instance at version 2 whose TTL ends `after` from now.
    async fn expiring(
        &self,
        name: &str,
        after: jiff::SignedDuration,
    ) -> stead::core::fleet::Instance {
        self.instance_until(name, "2", Some(self.clock.now() + after))
            .await
    }

    async fn instance(&self, name: &str, version: &str) -> stead::core::fleet::Instance {
        self.instance_until(name, version, None).await
    }

    /// A wiki instance whose TTL ends at `expires_at`, if set.
    async fn instance_until(
        &self,
        name: &str,
        version: &str,
        expires_at: Option<stead::core::types::Timestamp>,
    ) -> stead::core::fleet::Instance {
        self.store
            .create_instance(
                &NewInstance {
                    domains: Vec::new(),
                    spec_digest: None,
                    parameters: Default::default(),
                    name: InstanceName::new(name),
                    team: "t".into(),
                    service_type: "wiki".into(),
                    version: version.into(),
                    expires_at,
                    maintenance_window: None,
                },
                self.clock.now(),
            )
            .await
            .unwrap()
    }

    async fn enqueue(&self, instance: i64, kind: TaskKind) {
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
    }

    /// Provisions `name` at `version` through a worker whose catalog had
    /// that version (a worker provisions its own catalog's version), and
    /// one pass, so it is served.
    /// wiki1 served at version 1 with a second service, api, in ACTIVE
    /// (version 2, the catalog's, no longer lists api).
    async fn served_with_api(&self) -> (stead::core::fleet::Instance, ContainerId) {
        let instance = self.served("wiki1", "1").await;
        let api = self
            .runtime
            .create(&create_request("wiki1", "api"))
            .await
            .expect("create api");
        let record = stead::core::types::ActiveService {
            container: api.clone(),
            effective_revision: "1".into(),
            binds: self.runtime.binds(&api).await.unwrap(),
            stop_grace: None,
            verified_started_at: self.runtime.inspect(&api).await.unwrap().started_at,
        };
        self.store
            .save_active_service(&instance.name, &ServiceName::new("api"), &record)
            .await
            .unwrap();
        (instance, api)
    }

    async fn served(&self, name: &str, version: &str) -> stead::core::fleet::Instance {
        let instance = self.instance(name, version).await;
        self.enqueue(instance.id, TaskKind::Provision).await;
        let (_, end) = self
            .worker_with(self.catalog_at(version))
            .work_once()
            .await
            .expect("a task");
        assert_eq!(end, TaskEnd::Done);
        self.recoverer().pass().await;
        assert!(self.routed(name, "web"), "provisioned and published");
        instance
    }

    /// An operator's halt of `service_type`'s rollout, now.
    async fn halt_by_operator(&self, service_type: &str) {
        let now = stead::ports::Clock::now(self.clock.as_ref());
        self.store
            .set_rollout(service_type, RolloutState::Halted, "operator", now, None)
            .await
            .unwrap();
    }

    /// What the daemon records as it loads each of `catalogs` in turn
    /// (ten seconds apart): `service_type`'s version as the file says it.
    async fn record_versions<const N: usize>(&self, service_type: &str, catalogs: [&Catalog; N]) {
        for (at, catalog) in (0u64..).step_by(10).zip(catalogs) {
            let entry = catalog.get(service_type).unwrap();
            self.store
                .record_type_version(
                    &TypeVersion {
                        service_type: service_type.into(),
                        version: entry.version.clone(),
                        spec_digest: entry.spec_digest.clone(),
                        source: catalog.source_of(service_type).unwrap().to_owned(),
                        recorded_at: self.clock.now() + Duration::from_secs(at),
                    },
                    None,
                )
                .await
                .unwrap();
        }
    }

    /// The container ACTIVE names for `instance`'s web service.
    async fn web_container(&self, instance: &str) -> ContainerId {
        self.store
            .load_active(&InstanceName::new(instance))
            .await
            .unwrap()
            .services[&ServiceName::new("web")]
            .container
            .clone()
    }

    fn routed(&self, instance: &str, service: &str) -> bool {
        self.traffic.routes().contains_key(&ServiceKey {
            instance: InstanceName::new(instance),
            service: ServiceName::new(service),
        })
    }

    fn routes_to(&self, instance: &str, service: &str, container: &ContainerId) -> bool {
        let key = ServiceKey {
            instance: InstanceName::new(instance),
            service: ServiceName::new(service),
        };
        self.traffic
            .routes()
            .get(&key)
            .is_some_and(|r| &r.container == container)
    }
}

use stead::ports::Clock;

#[tokio::test]
async fn provision_creates_containers_and_active_and_the_pass_publishes() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    let active = f.store.load_active(&instance.name).await.unwrap();
    let web = &active.services[&ServiceName::new("web")];
    assert!(f.runtime.container(&web.container).is_some());
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.state, InstanceState::Ready);
}

#[tokio::test]
async fn provisioning_twice_is_idempotent() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    let before = f.store.load_active(&instance.name).await.unwrap();
    f.enqueue(instance.id, TaskKind::Reprovision).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    assert_eq!(f.store.load_active(&instance.name).await.unwrap(), before);
}

#[tokio::test]
async fn tick_reprovisions_a_vanished_release_and_never_deletes_an_orphan() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    f.provisioner.remove_by_hand("wiki1");
    f.provisioner.add_foreign("somebody-elses");
    let r = f.reconciler("a");
    let out = r.tick().await;
    assert!(out.ok(), "{:?}", out.failed);
    let tasks = f.store.active_tasks().await.unwrap().rows;
    assert!(tasks
        .iter()
        .any(|t| t.instance == instance.id && t.kind == TaskKind::Reprovision));
    assert!(f
        .provisioner
        .release_names()
        .contains(&"somebody-elses".to_string()));
    // Again: no second reprovision while one is queued.
    r.tick().await;
    let n = f
        .store
        .active_tasks()
        .await
        .unwrap()
        .rows
        .iter()
        .filter(|t| t.kind == TaskKind::Reprovision)
        .count();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn an_orphan_release_is_logged_as_an_event_once_while_it_stands() {
    use stead::core::event_log::{EventFilter, EventKind};
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    f.served("wiki1", "2").await;
    f.provisioner.add_foreign("somebody-elses");
    let r = f.reconciler("a");
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    r.recoverer().log_events_to(sink);
    for _ in 0..3 {
        assert!(r.tick().await.ok());
    }
    flusher.flush(f.store.as_ref()).await;
    let filter = EventFilter {
        kind: Some(EventKind::OrphanRelease),
        ..EventFilter::default()
    };
    let orphans = f.store.events(&filter).await.unwrap().rows;
    assert_eq!(orphans.len(), 1, "once while it stands: {orphans:?}");
    assert_eq!(orphans[0].event.reason, "C5");
    assert!(
        orphans[0].event.message.contains("somebody-elses"),
        "{:?}",
        orphans[0].event.message
    );
}

/// A row another tool garbled (its state does not decode) hides its
/// instance from the listing, not from the world: its release is no orphan
/// (the gauge and the log keep what they said before), and its routes are
/// not taken for a gone instance's. Found by the simulation once it
/// garbled rows (issue #15).
#[tokio::test]
async fn an_unreadable_instance_row_is_neither_an_orphan_nor_gone() {
    let f = fixture();
    let hidden = f.served("wiki1", "2").await;
    f.served("wiki2", "2").await;
    f.provisioner.add_foreign("somebody-elses");
    // Every task of a current-thread test runtime runs on this thread.
    let tally = Tally::default();
    let _recording = metrics::set_default_local_recorder(&tally);
    let r = f.reconciler("a");
    let out = r.tick().await;
    assert!(out.ok(), "{:?}", out.failed);
    assert_eq!(tally.gauge("stead_orphan_releases"), Some(1.0));

    f.store
        .garble_instance_row(Some((hidden.id, Garbled::Listed)));
    let out = r.tick().await;
    // The bad row is the operator's to fix, so the pass says so; every
    // other check ran clean.
    assert!(
        matches!(&out.failed[..], [(Check::Recovery, why)] if why.contains("bad row in instances (id 1)")),
        "{:?}",
        out.failed
    );
    assert_eq!(
        tally.gauge("stead_orphan_releases"),
        Some(1.0),
        "wiki1's release is not counted, somebody-elses' still is"
    );
    assert!(
        f.routed("wiki1", "web"),
        "not withdrawn as a gone instance's"
    );
    assert!(f.provisioner.release_names().contains(&"wiki1".to_string()));

    f.store.garble_instance_row(None);
    f.provisioner.remove_by_hand("somebody-elses");
    let out = r.tick().await;
    assert!(out.ok(), "{:?}", out.failed);
    assert_eq!(tally.gauge("stead_orphan_releases"), Some(0.0));
}

/// The log lines a test runtime's thread writes while a [`Lines`] is its
/// default subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl Lines {
    /// Records this thread's log at info and above until the guard drops.
    fn record(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn count(&self, text: &str) -> usize {
        let bytes = self.0.lock().unwrap();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A bad row lasts until an operator mends it: the ticks it spans log it,
/// and the recovery check it fails, once when it appears and once when it
/// is gone, not once per tick (docs/operations.md, "Logs").
#[tokio::test]
async fn a_lasting_bad_row_and_the_check_it_fails_are_logged_once_when_they_begin_and_end() {
    let f = fixture();
    let hidden = f.served("wiki1", "2").await;
    f.served("wiki2", "2").await;
    let lines = Lines::default();
    let _recording = lines.record();
    let r = f.reconciler("a");
    assert!(r.tick().await.ok());
    f.store
        .garble_instance_row(Some((hidden.id, Garbled::Listed)));
    for _ in 0..3 {
        let out = r.tick().await;
        assert_eq!(out.failed.len(), 1, "{:?}", out.failed);
    }
    assert_eq!(lines.count("skipped a bad row"), 1, "{}", lines.text());
    assert_eq!(lines.count("check failed"), 1, "{}", lines.text());
    f.store.garble_instance_row(None);
    for _ in 0..2 {
        assert!(r.tick().await.ok());
    }
    assert_eq!(
        lines.count("no longer the case: skipped a bad row"),
        1,
        "{}",
        lines.text()
    );
    assert_eq!(
        lines.count("check recovery passes again"),
        1,
        "{}",
        lines.text()
    );
    // It comes back: it is logged again.
    f.store
        .garble_instance_row(Some((hidden.id, Garbled::Listed)));
    assert!(!r.tick().await.ok());
    assert_eq!(lines.count("check failed"), 2, "{}", lines.text());
}

/// A whole pass lists the fleet by id, name, type and state only. A row
/// garbled in another field (its parameters) is listed: its routes are not
/// taken for a gone instance's, its load fails alone, and the routes of an
/// instance that really is gone are still withdrawn. A row garbled in a
/// listed field hides the instance, so nothing is taken for gone then.
#[tokio::test]
async fn a_row_garbled_outside_the_listed_fields_fails_only_its_own_load() {
    let f = fixture();
    let recoverer = f.recoverer();
    let hidden = f.served("wiki1", "2").await;
    f.served("wiki2", "2").await;
    let web = f.traffic.routes()[&ServiceKey {
        instance: InstanceName::new("wiki1"),
        service: ServiceName::new("web"),
    }]
        .clone();
    let leave_ghost = |name: &str| {
        let route = stead::ports::Route {
            service: ServiceKey {
                instance: InstanceName::new(name),
                service: ServiceName::new("web"),
            },
            ..web.clone()
        };
        let traffic = f.traffic.clone();
        async move { traffic.publish(&route).await.unwrap() }
    };

    leave_ghost("ghost1").await;
    f.store
        .garble_instance_row(Some((hidden.id, Garbled::Unlisted)));
    let outcome = recoverer.pass().await;
    let wiki1 = outcome.instance(&hidden.name).expect("listed");
    assert!(!wiki1.driven);
    assert!(
        matches!(
            &wiki1.errors[..],
            [RecoverError::Load {
                source: stead::ports::StoreError::BadRow {
                    field: "parameters",
                    ..
                },
                ..
            }]
        ),
        "{:?}",
        wiki1.errors
    );
    assert!(
        outcome
            .instance(&InstanceName::new("wiki2"))
            .unwrap()
            .driven
    );
    assert!(!f.routed("ghost1", "web"), "a gone instance's route goes");
    assert!(f.routed("wiki1", "web"), "not taken for a gone instance's");

    leave_ghost("ghost2").await;
    f.store
        .garble_instance_row(Some((hidden.id, Garbled::Listed)));
    let outcome = recoverer.pass().await;
    assert!(outcome.instance(&hidden.name).is_none(), "not listed");
    assert!(f.routed("ghost2", "web"), "nothing is taken for gone");
    assert!(f.routed("wiki1", "web"));
}

#[tokio::test]
async fn a_failing_check_does_not_stop_the_others_and_the_heartbeat_is_set() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    f.script
        .fail(Op::ListReleases, "", Fault::Fail("helm unreachable".into()));
    // Expired: the TTL check must still run.
    let expired = f.instance("old", "2").await;
    f.store
        .set_instance_state(
            expired.id,
            InstanceState::Provisioning,
            InstanceState::Ready,
            f.clock.now(),
        )
        .await
        .unwrap();
    let _ = instance;
    let r = f.reconciler("a");
    let out = r.tick().await;
    assert!(out.failed.iter().any(|(c, _)| *c == Check::Drift));
    assert!(!out.failed.iter().any(|(c, _)| *c == Check::Ttl));
    assert_eq!(r.last_tick_s(), f.clock.now().as_second());
}

#[tokio::test]
async fn enqueued_tasks_carry_the_ticks_traceparent() {
    let f = fixture();
    f.served("wiki1", "1").await; // behind the catalog's version 2
    let out = f.reconciler("a").tick().await;
    assert!(out.ok(), "{:?}", out.failed);
    let tasks = f.store.active_tasks().await.unwrap().rows;
    let upgrade = tasks
        .iter()
        .find(|t| t.kind == TaskKind::Upgrade)
        .expect("an upgrade");
    assert_eq!(
        upgrade.traceparent.as_deref(),
        Some(out.traceparent.as_str())
    );
    assert!(out.traceparent.starts_with("00-") && out.traceparent.len() == 55);
}

#[tokio::test]
async fn a_second_reconciler_does_not_tick_while_the_lease_is_held() {
    let f = fixture();
    let a = f.reconciler("a");
    let b = f.reconciler("b");
    assert!(a.tick().await.leader);
    let out = b.tick().await;
    assert!(!out.leader);
    assert!(
        b.last_tick_s() > 0,
        "the heartbeat runs even without the lease"
    );
}

/// T1, issue #41: two reconcilers of one identity at two sites (a copied
/// `state_dir`) never alternate: the holder leads every tick, the twin
/// waits and, once it sees the holder renew, reports a live twin naming
/// the identity and both incarnations.
#[tokio::test]
async fn a_twin_from_a_copied_state_dir_never_leads_while_the_holder_renews_and_is_reported() {
    let f = fixture();
    let (first, copy) = ("host-1#5173e1.aa", "host-1#9c02d4.bb");
    let a = f.reconciler(first);
    let b = f.reconciler(copy);
    let lines = Lines::default();
    let _recording = lines.record();
    for tick in 0..3 {
        assert!(a.tick().await.leader, "tick {tick}: the holder leads");
        assert!(!b.tick().await.leader, "tick {tick}: the twin waits");
        f.clock.advance(Duration::from_secs(60));
    }
    assert_eq!(b.live_twin().as_deref(), Some(first));
    assert_eq!(a.live_twin(), None, "the holder sees no twin");
    let reported = "two live processes share identity host-1";
    assert_eq!(lines.count(reported), 1, "once: {}", lines.text());
    let text = lines.text();
    let line = text.lines().find(|l| l.contains(reported)).unwrap();
    assert!(
        line.contains("ERROR") && line.contains(first) && line.contains(copy),
        "{line}"
    );
}

#[tokio::test]
async fn upgrade_replaces_with_overlap_and_the_pass_retires_the_predecessor() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.store.load_active(&instance.name).await.unwrap().services
        [&ServiceName::new("web")]
        .container
        .clone();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    let after = f.store.load_active(&instance.name).await.unwrap().services
        [&ServiceName::new("web")]
        .clone();
    assert_ne!(after.container, before);
    assert!(
        f.runtime.container(&before).is_some(),
        "the predecessor keeps running until the pass retires it"
    );
    let markers = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert!(markers
        .iter()
        .any(|m| m.container == before && m.reason == InhibitionReason::RetirementPending));
    let recoverer = f.recoverer();
    recoverer.pass().await;
    assert!(
        f.routes_to("wiki1", "web", &after.container),
        "the pass routes the successor"
    );
    assert!(
        f.runtime.container(&before).is_some(),
        "the predecessor drains for one pass after the switch"
    );
    recoverer.pass().await;
    assert!(f.runtime.container(&before).is_none(), "retired");
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(
        (row.version.as_str(), row.state),
        ("2", InstanceState::Ready)
    );
}

/// Found by a new user on the notes example (#40): the proxy refuses a
/// route without an upstream, so a pass that asked for one for a service
/// without ports failed it every time, the upgrade never counted as
/// verified and routed, and the old database containers ran on forever.
#[tokio::test]
async fn a_service_without_ports_is_verified_never_routed_and_its_predecessor_retired() {
    let mut f = fixture();
    f.catalog =
        Arc::new(Catalog::from_toml(CATALOG_WITH_DB, "catalog.toml", &Grants::default()).unwrap());
    let instance = f.served("wiki1", "1").await;
    let recoverer = f.recoverer();
    recoverer.pass().await;
    let db = ServiceName::new("db");
    let before = f.store.load_active(&instance.name).await.unwrap().services[&db].clone();
    assert!(before.binds.is_empty());
    assert!(
        before.verified_started_at.is_some(),
        "the first pass verified db"
    );
    assert!(!f.routed("wiki1", "db"), "db has nothing to route");
    let publications = f.script.count(Op::Publish);
    let steady = recoverer.pass().await;
    assert_eq!(steady.error_count(), 0, "{steady:?}");
    assert_eq!(
        f.script.count(Op::Publish),
        publications,
        "a steady pass publishes nothing: {steady:?}"
    );

    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let after = f.store.load_active(&instance.name).await.unwrap().services[&db].clone();
    assert_ne!(after.container, before.container);
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(
        f.runtime.container(&before.container).is_none(),
        "the predecessor is retired"
    );
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
    let verified = f.store.load_active(&instance.name).await.unwrap().services[&db].clone();
    assert_eq!(verified.container, after.container);
    assert!(
        verified.verified_started_at.is_some(),
        "the successor is verified"
    );
    assert!(!f.routed("wiki1", "db"));
    assert!(f.routed("wiki1", "web"), "web serves throughout");
}

/// #40: a two-service instance that lost one container (removed by hand)
/// was never repaired: its other container made its release look live,
/// and recovery never recreates (R7). The pass now tells drift, which
/// reprovisions it: back and verified within two ticks.
#[tokio::test]
async fn a_container_removed_by_hand_is_recreated_within_two_ticks() {
    let mut f = fixture();
    f.catalog =
        Arc::new(Catalog::from_toml(CATALOG_WITH_DB, "catalog.toml", &Grants::default()).unwrap());
    let instance = f.served("wiki1", "2").await;
    let db = ServiceName::new("db");
    let gone = f.store.load_active(&instance.name).await.unwrap().services[&db]
        .container
        .clone();
    assert!(f.runtime.remove_by_hand(&gone));
    let reconciler = f.reconciler("a");
    for _ in 0..2 {
        let out = reconciler.tick().await;
        assert!(out.leader, "{:?}", out.failed);
        f.clock.advance(Duration::from_secs(60));
    }
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    reconciler.tick().await;
    let back = f.store.load_active(&instance.name).await.unwrap().services[&db].clone();
    let container = f.runtime.container(&back.container).expect("recreated");
    assert_eq!(
        container.status,
        stead::core::types::ContainerStatus::Running
    );
    assert!(
        back.verified_started_at.is_some() && back.verified_started_at == container.started_at,
        "verified again: {back:?}"
    );
    assert!(f.routed("wiki1", "web"), "web served throughout");
}

/// #40: an upgrade abandoned between creating its candidate and switching
/// ACTIVE (a crash, a catalog bump) left the candidate running, beside
/// the old container and on its volumes, when the next attempt was at
/// another revision. The next upgrade sweeps it; the predecessor it
/// switches from stays for the pass to retire (R15).
#[tokio::test]
async fn an_upgrade_sweeps_a_candidate_an_interrupted_upgrade_left_behind() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    let stray = f
        .runtime
        .create(&stead::ports::CreateContainer {
            revision: "1.5.abandoned".into(),
            ..create_request("wiki1", "web")
        })
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert!(f.runtime.container(&stray).is_none(), "the stray is gone");
    let after = f.web_container("wiki1").await;
    assert_ne!(after, before);
    assert!(f.runtime.container(&after).is_some(), "the successor runs");
    assert!(
        f.runtime.container(&before).is_some(),
        "the predecessor waits for the pass to retire it"
    );
}

/// #40: the worker never re-read the rollout switch, so a halt left
/// upgrades already queued to run anyway.
#[tokio::test]
async fn a_worker_does_not_start_an_upgrade_whose_rollout_was_halted_after_it_was_queued() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    let containers = f.runtime.list_managed().await.unwrap().len();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    f.halt_by_operator("wiki").await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done, "not run, and not a failure to retry");
    assert_eq!(f.web_container("wiki1").await, before, "ACTIVE unchanged");
    assert_eq!(
        f.runtime.list_managed().await.unwrap().len(),
        containers,
        "no candidate created"
    );
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1");
}

#[tokio::test]
async fn a_version_that_drops_a_service_retires_it_and_the_pass_never_revives_it() {
    // Version 1 of wiki ran two services; version 2 (the catalog) lists
    // only web. The upgrade must hold, withdraw, stop, remove and forget
    // api, then clear the hold (#17).
    let f = fixture();
    let (instance, api) = f.served_with_api().await;
    let recoverer = f.recoverer();
    recoverer.pass().await;
    assert!(f.routed("wiki1", "api"), "version 1 serves api");

    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let active = f.store.load_active(&instance.name).await.unwrap();
    assert!(
        !active.services.contains_key(&ServiceName::new("api")),
        "api left ACTIVE"
    );
    assert!(!f.routed("wiki1", "api"), "api is withdrawn");
    assert!(f.runtime.container(&api).is_none(), "api is removed");
    assert!(
        f.store
            .load_inhibitions(&instance.name)
            .await
            .unwrap()
            .iter()
            .all(|m| m.service != ServiceName::new("api")),
        "the hold is cleared once api is gone"
    );
    for _ in 0..3 {
        recoverer.pass().await;
    }
    assert!(!f.routed("wiki1", "api"), "no pass routes api again");
    assert!(
        f.runtime
            .list_managed()
            .await
            .unwrap()
            .iter()
            .all(|c| c.service != ServiceName::new("api")),
        "no pass starts api again"
    );
    assert!(f.routed("wiki1", "web"), "web serves throughout");
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(
        (row.version.as_str(), row.state),
        ("2", InstanceState::Ready)
    );
}

#[tokio::test]
async fn a_dropped_service_whose_withdrawal_failed_is_not_routed_again_before_the_retry() {
    // Simulation seed 6240: the proxy restarted without its routes and
    // refused the upgrade's withdrawal of api, a service version 2 drops;
    // the task waited for its retry, and the recovery pass in between
    // found api's route lost and its execution verified, and published it
    // again. The retirement now holds api before withdrawing it: the pass
    // withdraws it itself and never routes it (R5).
    let f = fixture();
    let (instance, api) = f.served_with_api().await;
    let recoverer = f.recoverer();
    recoverer.pass().await;
    assert!(f.routed("wiki1", "api"), "version 1 serves api");

    f.traffic.lose_everything();
    f.script
        .fail(Op::Withdraw, "wiki1/api", Fault::Fail("proxy down".into()));
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let end = f.worker().work_once().await.unwrap().1;
    assert!(
        matches!(&end, TaskEnd::Retried(e) if e.to_string().contains("proxy down")),
        "{end:?}"
    );
    f.script.heal();
    for _ in 0..2 {
        recoverer.pass().await;
        assert!(
            !f.routed("wiki1", "api"),
            "a service being dropped is never routed again"
        );
    }
    assert!(f.routed("wiki1", "web"), "web is republished");

    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert!(f.runtime.container(&api).is_none(), "api is removed");
    recoverer.pass().await;
    assert!(!f.routed("wiki1", "api"));
}

#[tokio::test]
async fn a_dropped_services_hold_left_by_a_crash_is_finished_off() {
    // A crash between dropping api from ACTIVE and clearing its hold
    // leaves only the hold: the next upgrade removes what is left and
    // clears it.
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let api = f
        .runtime
        .create(&create_request("wiki1", "api"))
        .await
        .expect("create api");
    let hold = stead::core::types::Inhibition {
        service: ServiceName::new("api"),
        container: api.clone(),
        reason: InhibitionReason::Hold(InhibitionReason::SERVICE_DROPPED.into()),
        operation: "upgrade".into(),
        created_at: f.clock.now(),
        stop_grace: None,
        revert_to: None,
    };
    f.store
        .save_inhibition(&instance.name, &hold)
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert!(
        f.runtime.container(&api).is_none(),
        "what was left is removed"
    );
    let holds = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert!(
        holds.iter().all(|m| m.service != ServiceName::new("api")),
        "the hold is cleared: {holds:?}"
    );
}

#[tokio::test]
async fn a_delete_keeps_named_volumes_unless_asked_to_purge_them() {
    let f = fixture();
    for name in ["kept", "purged"] {
        f.served(name, "2").await;
    }
    let volumes = |instance: &str| {
        f.runtime
            .volumes()
            .into_iter()
            .filter(|(i, _, _)| i.as_str() == instance)
            .map(|(_, s, v)| format!("{s}/{v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        volumes("kept"),
        ["web/data"],
        "created with the first container"
    );
    let ops = stead::ops::Ops::new(f.store.as_ref(), f.catalog.clone(), f.clock.now(), 7);
    ops.delete("kept", false).await.unwrap();
    ops.delete("purged", true).await.unwrap();
    for _ in 0..2 {
        assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    }
    for name in ["kept", "purged"] {
        let row = f
            .store
            .instance(&InstanceName::new(name))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.state, InstanceState::Deleted, "{name}");
    }
    assert_eq!(
        volumes("kept"),
        ["web/data"],
        "a plain delete keeps the volume"
    );
    assert!(volumes("purged").is_empty(), "--purge-volumes removed it");
}

#[tokio::test]
async fn a_predecessor_is_not_retired_while_the_proxy_lost_the_successors_route() {
    // Found by the simulation (seed 201): the pass reads the proxy's routes
    // once, as it begins. The proxy lost them during the pass (a reload),
    // the pass still believed the successor routed and retired the
    // predecessor while nothing routed to either (S5). Retirement now reads
    // the route back at the moment it decides.
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let web = ServiceName::new("web");
    let before = f.store.load_active(&instance.name).await.unwrap().services[&web]
        .container
        .clone();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let after = f.store.load_active(&instance.name).await.unwrap().services[&web]
        .container
        .clone();
    let recoverer = f.recoverer();
    recoverer.pass().await;
    assert!(
        f.routes_to("wiki1", "web", &after),
        "the successor is routed"
    );

    // The next pass reads the route, then the proxy loses it while the
    // pass inspects the successor.
    let traffic = f.traffic.clone();
    f.script
        .on_next(Op::Inspect, move || traffic.lose_everything());
    recoverer.pass().await;
    assert!(
        f.runtime.container(&before).is_some(),
        "nothing routes to the successor: the predecessor must stay"
    );

    recoverer.pass().await;
    assert!(
        f.routes_to("wiki1", "web", &after),
        "the next pass finds the route gone and republishes it"
    );
    recoverer.pass().await;
    assert!(
        f.runtime.container(&before).is_none(),
        "retired once the successor is routed again"
    );
}

#[tokio::test]
async fn an_upgrade_of_a_stopped_instance_starts_and_publishes_nothing() {
    // Found by the simulation: the overlap replacement published the
    // successor of an instance stopped after the upgrade was planned (S3).
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.store.load_active(&instance.name).await.unwrap();
    f.store
        .set_instance_stopped(instance.id, true, f.clock.now())
        .await
        .unwrap();
    f.recoverer().pass().await;
    assert!(!f.routed("wiki1", "web"), "stopped intent withdrew it");
    let containers = f.runtime.with_containers(|cs| cs.len());
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    assert!(!f.routed("wiki1", "web"), "nothing published");
    assert_eq!(f.runtime.with_containers(|cs| cs.len()), containers);
    assert_eq!(f.store.load_active(&instance.name).await.unwrap(), before);
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1", "upgraded once started again");
}

#[tokio::test]
async fn an_instance_deleted_after_it_was_asked_for_is_forgotten_not_recovered() {
    // Found by the simulation's R16 check: a targeted pass asked for an
    // instance (a runtime event) and loaded it after its deprovision had
    // finished; it drove the deleted instance and wrote its memory back
    // after the fleet's pass had forgotten it.
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let recoverer = f.recoverer();
    recoverer.pass().await;
    assert!(
        recoverer
            .memory()
            .instance_names()
            .any(|n| n == &instance.name),
        "a served instance is remembered (its verified execution)"
    );
    for (from, to) in [
        (InstanceState::Ready, InstanceState::Deleting),
        (InstanceState::Deleting, InstanceState::Deleted),
    ] {
        assert!(f
            .store
            .set_instance_state(instance.id, from, to, f.clock.now())
            .await
            .unwrap());
    }
    let asked_before = f.script.seen.lock().unwrap().len();
    // The row the event was resolved to is the live one from before.
    let outcome = recoverer.recover_instance(&instance).await;
    assert!(!outcome.driven, "a deleted instance is not driven");
    assert!(outcome.reports.is_empty() && outcome.errors.is_empty());
    let asked: Vec<Op> = f.script.seen.lock().unwrap()[asked_before..].to_vec();
    assert!(asked.is_empty(), "nothing asked of any port: {asked:?}");
    assert!(
        recoverer
            .memory()
            .instance_names()
            .all(|n| n != &instance.name),
        "and nothing of it is remembered (R4, R16)"
    );
}

#[tokio::test]
async fn a_deleting_instance_is_kept_withdrawn_and_stopped_until_deprovisioned() {
    // Found by the simulation: a deprovision whose withdrawal failed was
    // retried later, and meanwhile the pass republished the instance.
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let id = f.web_container(instance.name.as_str()).await;
    assert!(f
        .store
        .set_instance_state(
            instance.id,
            InstanceState::Ready,
            InstanceState::Deleting,
            f.clock.now()
        )
        .await
        .unwrap());
    f.recoverer().pass().await;
    assert!(!f.routed("wiki1", "web"), "withdrawn, not republished");
    let container = f.runtime.container(&id).expect("kept for the deprovision");
    assert_ne!(
        container.status,
        stead::core::types::ContainerStatus::Running,
        "stopped"
    );
}

#[tokio::test]
async fn a_failed_upgrade_removes_the_candidate_keeps_active_and_halts_the_rollout() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.store.load_active(&instance.name).await.unwrap();
    // The candidate is created, then vanishes before it is verified.
    f.script
        .fail(Op::Inspect, "stead.wiki1.web.2", Fault::NotFound);
    for _ in 0..2 {
        f.enqueue(instance.id, TaskKind::Upgrade).await;
        f.clock.advance(Duration::from_secs(3600));
        let (_, end) = f.worker().work_once().await.unwrap();
        assert!(
            matches!(end, TaskEnd::Retried(_) | TaskEnd::Failed(_)),
            "{end:?}"
        );
    }
    assert_eq!(f.store.load_active(&instance.name).await.unwrap(), before);
    assert!(f
        .runtime
        .container(&stead::core::types::ContainerId::new("stead.wiki1.web.2"))
        .is_none());
    let rollouts = f.store.rollouts().await.unwrap();
    assert_eq!(rollouts.get("wiki"), Some(&RolloutState::Halted));
}

/// #40: a provision that failed for good left its instance
/// `provisioning` forever, and only delete-and-recreate got out of it.
#[tokio::test]
async fn a_provision_that_runs_out_of_attempts_leaves_the_instance_failed_until_retried() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.script
        .fail(Op::Create, "", Fault::Fail("no such image".into()));
    let mut last = None;
    for _ in 0..2 {
        f.clock.advance(Duration::from_secs(3600));
        last = Some(f.worker().work_once().await.unwrap().1);
    }
    assert!(matches!(last, Some(TaskEnd::Failed(_))), "{last:?}");
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.state, InstanceState::Failed);

    f.script.heal();
    let ops = stead::ops::Ops::new(
        f.store.as_ref(),
        f.catalog.clone(),
        stead::ports::Clock::now(f.clock.as_ref()),
        7,
    );
    assert!(matches!(
        ops.retry("wiki1").await.unwrap(),
        stead::ops::Retry::Provisioning { .. }
    ));
    assert!(
        matches!(
            ops.retry("wiki1").await.unwrap(),
            stead::ops::Retry::AlreadyQueued {
                kind: TaskKind::Provision
            }
        ),
        "safe to run twice"
    );
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.state, InstanceState::Ready);
    f.recoverer().pass().await;
    assert!(
        f.routed("wiki1", "web"),
        "provisioned and served after the retry"
    );
}

#[tokio::test]
async fn deprovision_withdraws_removes_and_marks_deleted() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    let id = f.web_container(instance.name.as_str()).await;
    f.store
        .set_instance_state(
            instance.id,
            InstanceState::Ready,
            InstanceState::Deleting,
            f.clock.now(),
        )
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Deprovision).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    assert!(!f.routed("wiki1", "web"));
    assert!(f.runtime.container(&id).is_none());
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.state, InstanceState::Deleted);
}

#[tokio::test]
async fn a_busy_instance_is_skipped_never_waited_on() {
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    let held = f
        .locks
        .lock(
            instance.id,
            "operator",
            Duration::from_secs(60),
            Duration::ZERO,
        )
        .await
        .expect("free");
    let outcome = f.recoverer().pass().await;
    assert!(outcome.instance(&instance.name).unwrap().skipped_busy);
    held.release().await;
}

#[tokio::test]
async fn a_hung_runtime_call_times_out_and_the_next_instance_is_still_recovered() {
    let f = fixture();
    f.served("a-hangs", "2").await;
    f.served("b-fine", "2").await;
    f.script.fail(Op::Inspect, "stead.a-hangs.", Fault::Hang);
    let b_web = f.web_container("b-fine").await;
    f.runtime.with_containers(|cs| {
        cs.get_mut(&b_web).unwrap().status = stead::core::types::ContainerStatus::Exited
    });
    let outcome = f.recoverer().pass().await;
    let a = outcome.instance(&InstanceName::new("a-hangs")).unwrap();
    assert!(
        a.errors.iter().any(|e| matches!(
            e,
            RecoverError::Pass(PassError::Service {
                source: RecoveryError::DeadlineExceeded,
                ..
            })
        )),
        "{:?}",
        a.errors
    );
    assert_eq!(
        f.runtime.container(&b_web).unwrap().status,
        stead::core::types::ContainerStatus::Running,
        "the other instance was recovered"
    );
}

#[tokio::test]
async fn a_store_outage_fails_the_tick_and_the_next_tick_recovers() {
    let f = fixture();
    f.served("wiki1", "1").await;
    let r = f.reconciler("a");
    f.store.set_unavailable(true);
    let out = r.tick().await;
    assert!(!out.leader || !out.ok());
    f.store.set_unavailable(false);
    let out = r.tick().await;
    assert!(out.ok(), "{:?}", out.failed);
    assert!(
        out.tasks_enqueued >= 1,
        "the upgrade is planned once the store is back"
    );
}

/// Issue #14: a service its budget delays is recovered when the delay
/// ends (the core's `next_attempt`), not at whatever tick follows it.
#[tokio::test(start_paused = true)]
async fn a_delayed_service_is_woken_when_its_backoff_ends() {
    let f = fixture();
    f.served("crashy", "2").await;
    let web = f.web_container("crashy").await;
    // A workload that dies at once after every start.
    f.runtime.with_containers(|cs| {
        let c = cs.get_mut(&web).unwrap();
        c.status = stead::core::types::ContainerStatus::Exited;
        c.status_after_start = stead::core::types::ContainerStatus::Exited;
    });
    let queue = Arc::new(WakeQueue::new(16));
    let recoverer = f.recoverer();
    recoverer.wake_at_requested_times(queue.clone());
    // The free attempts go, then the budget delays the next one (R10).
    let mut delayed_until = None;
    for _ in 0..6 {
        let outcome = recoverer.pass().await;
        delayed_until = outcome
            .instance(&InstanceName::new("crashy"))
            .unwrap()
            .reports
            .iter()
            .find_map(|r| match r.verdict {
                stead::core::recovery::Verdict::Delayed { next_attempt } => next_attempt,
                _ => None,
            });
        if delayed_until.is_some() {
            break;
        }
    }
    let next_attempt = delayed_until.expect("the budget delayed the service");
    assert_eq!(queue.len(), 1, "the instance asked to be woken");
    let wait = Duration::try_from(next_attempt.duration_since(f.clock.now())).unwrap();
    assert!(
        wait >= Duration::from_secs(59),
        "the ladder's first delay: {wait:?}"
    );
    let began = tokio::time::Instant::now();
    assert_eq!(queue.next().await, InstanceName::new("crashy"));
    let woke_after = began.elapsed();
    assert!(
        woke_after >= wait && woke_after <= wait + Duration::from_millis(50),
        "woken {woke_after:?} after the delay, which was {wait:?}"
    );
}

/// Issue #15: a watcher is told every instance pass whole — the memory it
/// started from, each command with its answer and instant, the memory it
/// left — as the simulation's budget judge needs it.
#[tokio::test(start_paused = true)]
async fn a_pass_watcher_is_told_each_pass_with_its_steps_and_memory() {
    use stead::core::pass::{InstanceAnswer, InstanceCommand};
    use stead::core::recovery::{Command, Outcome};
    use stead::engine::recovery::{PassWatcher, WatchedPass};

    /// One pass: its instance, its service steps, and whether an attempt
    /// was pending in the memory before and after it.
    type Told = (String, Vec<String>, bool, bool);
    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<Told>>);
    impl PassWatcher for Seen {
        fn passed(&self, pass: &WatchedPass<'_>) {
            let steps = pass
                .steps
                .iter()
                .filter_map(|s| match (&s.command, &s.answer) {
                    (
                        InstanceCommand::Service { command, .. },
                        InstanceAnswer::Service(outcome),
                    ) => Some(match (command, outcome) {
                        (Command::Start, Outcome::Started(Ok(()))) => "started".to_owned(),
                        (command, _) => format!("{command:?}"),
                    }),
                    _ => None,
                })
                .collect();
            let pending = |m: &stead::core::memory::InstanceMemory| {
                pass.active.services.iter().any(|(service, record)| {
                    let key = stead::core::types::GenerationKey {
                        instance: pass.instance.clone(),
                        service: service.clone(),
                        container: record.container.clone(),
                    };
                    m.service(&key)
                        .generation
                        .budget
                        .is_some_and(|b| b.attempt_pending)
                })
            };
            self.0.lock().unwrap().push((
                pass.instance.to_string(),
                steps,
                pending(pass.before),
                pending(pass.after),
            ));
        }
    }

    let f = fixture();
    f.served("crashy", "2").await;
    let web = f.web_container("crashy").await;
    f.runtime.with_containers(|cs| {
        cs.get_mut(&web).unwrap().status = stead::core::types::ContainerStatus::Exited;
    });
    let recoverer = f.recoverer();
    let seen = Arc::new(Seen::default());
    recoverer.watch_passes(seen.clone());
    recoverer.pass().await;
    let seen = seen.0.lock().unwrap();
    let (instance, steps, before, after) = seen
        .iter()
        .find(|(instance, steps, ..)| instance == "crashy" && steps.contains(&"started".to_owned()))
        .unwrap_or_else(|| panic!("no pass of crashy with its start: {seen:?}"));
    assert_eq!(instance, "crashy");
    assert!(
        steps.iter().position(|s| s == "Inspect") < steps.iter().position(|s| s == "started"),
        "the inspection that found it down comes before the start: {steps:?}"
    );
    assert!(!before, "nothing was pending before the pass");
    assert!(
        after,
        "the start is left pending (R11), as the memory after shows"
    );
}

/// Issue #14: one scheduler. A wake-up that came due before the periodic
/// pass loaded its instance is served by that pass (no worker repeats the
/// recovery); one asked for a later moment stays queued.
#[tokio::test(start_paused = true)]
async fn the_periodic_pass_serves_a_wake_up_that_came_due_and_keeps_a_later_one() {
    let f = fixture();
    f.served("due", "2").await;
    f.served("later", "2").await;
    let queue = Arc::new(WakeQueue::new(16));
    let recoverer = f.recoverer();
    recoverer.wake_at_requested_times(queue.clone());
    let now = tokio::time::Instant::now();
    queue.wake(&InstanceName::new("due"), now);
    queue.wake(&InstanceName::new("later"), now + Duration::from_secs(600));
    let outcome = recoverer.pass().await;
    assert_eq!(outcome.error_count(), 0, "{:?}", outcome.errors);
    assert_eq!(queue.len(), 1, "the due wake-up was served by the pass");
    assert_eq!(queue.next().await, InstanceName::new("later"));
}

/// Issue #14: the control checks run beside the recovery pass, so a
/// runtime that hangs holds up recovery (each instance to its deadline),
/// never a TTL expiry.
#[tokio::test(start_paused = true)]
async fn a_hung_runtime_does_not_hold_back_the_control_checks() {
    let f = fixture();
    f.served("a-hangs", "2").await;
    let expiring = f
        .expiring("b-expires", jiff::SignedDuration::from_secs(1))
        .await;
    f.clock.advance(Duration::from_secs(2));
    f.script.fail(Op::Inspect, "stead.a-hangs.", Fault::Hang);
    let reconciler = f.reconciler("a");
    let tick = reconciler.tick();
    tokio::pin!(tick);
    let began = tokio::time::Instant::now();
    let deprovision_queued = || async {
        f.store
            .active_tasks()
            .await
            .unwrap()
            .rows
            .iter()
            .any(|t| t.instance == expiring.id && t.kind == TaskKind::Deprovision)
    };
    loop {
        tokio::select! {
            biased;
            _ = &mut tick => panic!("the tick ended before the expiry was seen: checks waited"),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if deprovision_queued().await {
            break;
        }
    }
    assert!(
        began.elapsed() < Duration::from_millis(300),
        "expired while recovery still waits on the hung runtime ({:?})",
        began.elapsed()
    );
    let out = tick.await;
    assert!(
        out.warnings.iter().any(|w| w.contains("a-hangs")),
        "the hung instance hit its deadline: {:?}",
        out.warnings
    );
}

// --- regressions found by the simulation ------------------------------------

#[tokio::test(start_paused = true)]
async fn a_hung_release_listing_fails_drift_but_not_the_tick() {
    let f = fixture();
    f.served("wiki1", "1").await;
    f.script.fail(Op::ListReleases, "", Fault::Hang);
    let out = f.reconciler("a").tick().await;
    assert!(out.failed.iter().any(|(c, _)| *c == Check::Drift));
    assert!(
        out.tasks_enqueued >= 1,
        "version drift still planned its upgrade"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_handler_is_bounded_by_its_lease() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.script.fail(Op::Create, "stead.wiki1.", Fault::Hang);
    let (_, end) = f.worker().work_once().await.expect("a task");
    assert!(
        matches!(end, TaskEnd::Retried(ref e) if e.to_string().contains("lease")),
        "{end:?}"
    );
    let lock = f
        .locks
        .try_lock(instance.id, "another", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(lock.is_some(), "the instance lock is released");
}

/// T3 (#41 item 8): a worker whose instance lock expired while it was
/// stuck in a runtime call (its process paused, by the database's clock)
/// finds its next write refused by the store. It writes nothing, makes no
/// further effect (the candidate it created is left for the lock's next
/// holder, not removed), records no end: the task stays its until its lease
/// runs out, and the lease path then queues it again, attempts kept.
#[tokio::test]
async fn a_worker_whose_instance_lock_expired_writes_nothing_and_leaves_its_task_to_the_lease() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    let lease = Duration::from_secs(300);
    let clock = f.clock.clone();
    // The database's clock moves past the worker's lock (its lease and
    // slack) while the worker waits on the runtime.
    f.script.on_next(Op::Create, move || {
        clock.advance(lease + stead::core::policy::WORKER_LOCK_SLACK + Duration::from_secs(1));
    });
    let (task, end) = f.worker().work_once().await.expect("a task");
    assert_eq!(end, TaskEnd::LeaseLost);
    let web = ServiceKey {
        instance: InstanceName::new("wiki1"),
        service: ServiceName::new("web"),
    };
    assert_eq!(f.store.active_now(&web), None, "ACTIVE not written");
    assert_eq!(
        f.store
            .instance_now(&InstanceName::new("wiki1"))
            .unwrap()
            .state,
        InstanceState::Provisioning
    );
    assert_eq!(
        f.runtime.container_ids().len(),
        1,
        "the container made under the lock is not removed without it"
    );
    let running = f.store.task(task.id).await.unwrap().unwrap();
    assert_eq!(
        (running.state, running.attempts),
        (TaskState::Running, task.attempts),
        "no end recorded"
    );
    let requeued = f
        .store
        .reset_expired_leases(f.clock.now(), lease, None)
        .await
        .unwrap();
    assert_eq!(requeued, 1, "the lease path queues it again");
    let again = f.store.task(task.id).await.unwrap().unwrap();
    assert_eq!(
        (again.state, again.attempts),
        (TaskState::Queued, task.attempts)
    );
    let (_, end) = f.worker().work_once().await.expect("the task again");
    assert_eq!(end, TaskEnd::Done);
    assert!(f.store.active_now(&web).is_some());
}

// --- T5: the traffic plane reconciled, not remembered ---------------------

#[tokio::test]
async fn routes_a_restarted_proxy_lost_are_republished_by_the_next_pass_without_a_probe() {
    let f = fixture();
    let recoverer = f.recoverer();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.worker().work_once().await.expect("a task");
    recoverer.pass().await;
    assert!(f.routed("wiki1", "web"));
    recoverer.pass().await;
    let probes = f.script.count(Op::Probe);
    let restarts = f.script.count(Op::Restart) + f.script.count(Op::Start);
    f.traffic.lose_everything();
    assert!(!f.routed("wiki1", "web"));
    recoverer.pass().await;
    assert!(f.routed("wiki1", "web"), "republished within one pass");
    assert_eq!(f.script.count(Op::Probe), probes, "no new probe");
    assert_eq!(
        f.script.count(Op::Restart) + f.script.count(Op::Start),
        restarts,
        "no container touched"
    );
}

#[tokio::test]
async fn a_route_dialling_another_port_is_republished_with_the_verified_binds() {
    let f = fixture();
    let recoverer = f.recoverer();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.worker().work_once().await.expect("a task");
    recoverer.pass().await;
    let key = ServiceKey {
        instance: InstanceName::new("wiki1"),
        service: ServiceName::new("web"),
    };
    let good = f.traffic.routes()[&key].clone();
    // Someone points the route elsewhere by hand.
    let wrong = stead::ports::Route {
        binds: BTreeMap::from([(8080, 1)]),
        ..good.clone()
    };
    f.traffic.publish(&wrong).await.unwrap();
    recoverer.pass().await;
    assert_eq!(f.traffic.routes()[&key].binds, good.binds);
}

#[tokio::test]
async fn routes_of_gone_instances_and_dropped_services_are_withdrawn() {
    let f = fixture();
    let recoverer = f.recoverer();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.worker().work_once().await.expect("a task");
    recoverer.pass().await;
    let web = f.traffic.routes()[&ServiceKey {
        instance: InstanceName::new("wiki1"),
        service: ServiceName::new("web"),
    }]
        .clone();
    // Left behind: a route of an instance the store does not know, and one
    // of a service ACTIVE does not name.
    for (instance, service) in [("ghost", "web"), ("wiki1", "dropped")] {
        let route = stead::ports::Route {
            service: ServiceKey {
                instance: InstanceName::new(instance),
                service: ServiceName::new(service),
            },
            ..web.clone()
        };
        f.traffic.publish(&route).await.unwrap();
    }
    recoverer.pass().await;
    assert!(!f.routed("ghost", "web"));
    assert!(!f.routed("wiki1", "dropped"));
    assert!(f.routed("wiki1", "web"), "the live route stays");
}

// --- names (T6) --------------------------------------------------------------

fn create_request(instance: &str, service: &str) -> stead::ports::CreateContainer {
    let entry = Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap();
    let mut spec = entry.get("wiki").unwrap().services[0].clone();
    spec.name = ServiceName::new(service);
    stead::ports::CreateContainer {
        instance: InstanceName::new(instance),
        instance_id: 1,
        env: Vec::new(),
        spec,
        revision: "2".into(),
    }
}

#[tokio::test]
async fn services_whose_dashed_names_collide_get_two_containers() {
    use stead::ports::Runtime;
    let f = fixture();
    let a = f
        .runtime
        .create(&create_request("a-api", "web"))
        .await
        .unwrap();
    let b = f
        .runtime
        .create(&create_request("a", "api-web"))
        .await
        .unwrap();
    assert_ne!(a, b);
    for (id, instance, service) in [(&a, "a-api", "web"), (&b, "a", "api-web")] {
        let container = f.runtime.container(id).expect("created");
        assert_eq!(
            (container.instance.as_str(), container.service.as_str()),
            (instance, service)
        );
    }
}

#[tokio::test]
async fn the_memory_runtime_refuses_to_stop_or_remove_another_generation() {
    use stead::core::types::{GenerationKey, RuntimeError};
    use stead::ports::Runtime;
    let f = fixture();
    let id = f
        .runtime
        .create(&create_request("a-api", "web"))
        .await
        .unwrap();
    let key = |instance: &str, service: &str| GenerationKey {
        instance: InstanceName::new(instance),
        service: ServiceName::new(service),
        container: id.clone(),
    };
    for wrong in [key("a", "web"), key("a-api", "api-web")] {
        let stopped = f.runtime.stop(&wrong, Duration::from_secs(1)).await;
        let removed = f.runtime.remove(&wrong).await;
        for result in [stopped, removed] {
            assert!(
                matches!(&result, Err(RuntimeError::Refused(m)) if m.contains("belongs to a-api/web")),
                "{result:?}"
            );
        }
    }
    let container = f.runtime.container(&id).expect("it survived");
    assert_eq!(
        container.status,
        stead::core::types::ContainerStatus::Running
    );
    f.runtime.remove(&key("a-api", "web")).await.unwrap();
    assert!(f.runtime.container(&id).is_none());
}

/// T7: an event subscription the runtime accepts and never answers (a hung
/// dockerd) is given up after `SUBSCRIBE_TIMEOUT` and tried again, so once
/// the runtime answers, its events wake instances again; the follower never
/// waits on it forever, leaving every recovery a tick late. (The
/// simulation's L12 found a follower stuck so since the chaos of its run.)
#[tokio::test(start_paused = true)]
async fn a_hung_event_subscription_is_given_up_and_tried_again() {
    let f = fixture();
    f.served("evented", "2").await;
    let web = f.web_container("evented").await;
    f.script.fail(Op::List, "events", Fault::Hang);
    let queue = Arc::new(WakeQueue::new(16));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let follower = tokio::spawn(stead::engine::events::follow(
        f.runtime.clone(),
        f.runtime.clone(),
        f.clock.clone(),
        queue.clone(),
        stopped,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.script.heal();
    tokio::time::sleep(stead::engine::events::SUBSCRIBE_TIMEOUT + Duration::from_secs(5)).await;
    f.clock.advance(Duration::from_secs(1));
    f.runtime.emit(&web, stead::ports::RuntimeEventAction::Die);
    let woken = tokio::time::timeout(Duration::from_secs(1), queue.next()).await;
    assert_eq!(
        woken.ok(),
        Some(InstanceName::new("evented")),
        "the crash's event woke its instance once the runtime answered again"
    );
    stop.send(true).unwrap();
    follower.await.unwrap();
}

/// A worker provisions its own catalog's version (issue found by seed 780
/// of the simulation): one whose catalog is behind the instance's version
/// installs nothing and retries, naming both versions; one whose catalog
/// is ahead provisions that version and records it on the row, so the
/// rollout (which upgrades only instances behind) sees what runs.
#[tokio::test]
async fn a_worker_provisions_its_own_catalogs_version_and_records_it() {
    let f = fixture();
    let ahead = f.instance("wiki2", "2").await;
    f.enqueue(ahead.id, TaskKind::Provision).await;
    let (_, end) = f
        .worker_with(f.catalog_at("1"))
        .work_once()
        .await
        .expect("a task");
    assert!(
        matches!(&end, TaskEnd::Retried(e)
            if e.to_string().contains("version 1") && e.to_string().contains("instance's 2")),
        "{end:?}"
    );
    assert_eq!(
        f.runtime.with_containers(|cs| cs.len()),
        0,
        "nothing created"
    );
    assert_eq!(f.script.count(Op::Install), 0, "nothing installed");

    let behind = f.instance("wiki1", "1").await;
    f.enqueue(behind.id, TaskKind::Provision).await;
    let (_, end) = f.worker().work_once().await.expect("a task");
    assert_eq!(end, TaskEnd::Done);
    let row = f.store.instance(&behind.name).await.unwrap().unwrap();
    let entry = f.catalog.get("wiki").unwrap();
    assert_eq!(
        (row.version.as_str(), row.spec_digest.as_deref()),
        ("2", Some(entry.spec_digest.as_str())),
        "the version it runs"
    );
    let web = f.web_container("wiki1").await;
    assert!(web.as_str().contains(".2."), "{web} is of version 2");
}

/// The pass's own store calls (the listing, the batch's lock-and-load)
/// are counted against the store like a machine's writes: an operator
/// watching `stead_port_errors_total` sees an outage that failed only
/// those. One failed lock-and-load is one failure, however many instances
/// it left untaken.
#[tokio::test]
async fn the_pass_counts_the_failures_of_its_own_store_calls() {
    let f = fixture();
    let wiki1 = f.served("wiki1", "1").await;
    f.served("wiki2", "1").await;
    let recoverer = f.recoverer();
    recoverer.pass().await;
    // Every task of a current-thread test runtime runs on this thread.
    let tally = Tally::default();
    let _recording = metrics::set_default_local_recorder(&tally);
    let store_unavailable = || {
        tally
            .branches()
            .get("stead_port_errors_total{port=\"store\",kind=\"unavailable\"}")
            .copied()
            .unwrap_or(0)
    };

    f.store.fail_next_calls(1);
    let pass = recoverer.pass().await;
    assert!(
        matches!(&pass.errors[..], [RecoverError::ListInstances(_)]),
        "{:?}",
        pass.errors
    );
    assert_eq!(store_unavailable(), 1, "the failed listing");

    // The grant is fresh: the targeted pass's first store call is its
    // lock-and-load.
    f.store.fail_next_calls(1);
    let outcome = recoverer.recover_instance(&wiki1).await;
    assert!(
        matches!(&outcome.errors[..], [RecoverError::Lock { .. }]),
        "{:?}",
        outcome.errors
    );
    assert_eq!(store_unavailable(), 2, "and the failed lock-and-load");

    let pass = recoverer.pass().await;
    assert!(pass.errors.is_empty(), "{:?}", pass.errors);
    assert_eq!(store_unavailable(), 2, "nothing failed: nothing counted");
}

/// Issue #45: a create the runtime refuses for good (an image that cannot
/// be pulled) fails the provision on its first attempt, with its reason;
/// retries would fail alike.
#[tokio::test]
async fn a_provision_whose_image_cannot_be_pulled_fails_on_its_first_attempt() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    let denied = "pull access denied for wiki: repository does not exist";
    f.script
        .fail(Op::Create, "stead.wiki1.", Fault::Refused(denied.into()));
    let (task, end) = f.worker().work_once().await.expect("a task");
    assert_eq!(task.attempts, 1);
    let TaskEnd::Failed(error) = end else {
        panic!("failed for good at once, not {end:?}")
    };
    assert_eq!(error.kind(), ErrorKind::Refused);
    assert!(error.to_string().contains(denied), "{error}");
    let row = f.store.task(task.id).await.unwrap().expect("the task");
    assert_eq!(row.state, TaskState::Failed);
    assert!(row.last_error.is_some_and(|e| e.contains(denied)));
    f.clock.advance(Duration::from_secs(3600));
    assert!(f.worker().work_once().await.is_none(), "not retried");
}

/// Issue #45: an upgrade whose new version's image cannot be pulled fails
/// on its first attempt and halts its type's rollout (C8) at once, instead
/// of after every attempt failed alike.
#[tokio::test]
async fn an_upgrade_whose_image_cannot_be_pulled_fails_at_once_and_halts_the_rollout() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let before = f.store.load_active(&instance.name).await.unwrap();
    f.script.fail(
        Op::Create,
        "stead.wiki1.web.2",
        Fault::Refused("pull access denied: manifest unknown".into()),
    );
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (task, end) = f.worker().work_once().await.expect("a task");
    assert_eq!(task.attempts, 1);
    assert!(
        matches!(&end, TaskEnd::Failed(e) if e.kind() == ErrorKind::Refused),
        "{end:?}"
    );
    assert_eq!(f.store.load_active(&instance.name).await.unwrap(), before);
    let rollouts = f.store.rollouts().await.unwrap();
    assert_eq!(rollouts.get("wiki"), Some(&RolloutState::Halted));
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.state, InstanceState::Ready, "back to ready, serving 1");
}

/// Issue #45: a runtime that could not be reached is a failure that may
/// pass: the task is retried after the policy's backoff, and succeeds once
/// the runtime answers.
#[tokio::test]
async fn a_provision_whose_runtime_is_unavailable_is_retried_after_a_backoff() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.script.fail(
        Op::Create,
        "stead.wiki1.",
        Fault::Fail("docker daemon not answering".into()),
    );
    let failed_at = f.clock.now();
    let (task, end) = f.worker().work_once().await.expect("a task");
    let TaskEnd::Retried(error) = end else {
        panic!("retried, not {end:?}")
    };
    assert!(!error.is_permanent());
    assert_eq!(error.kind(), ErrorKind::Transient);
    let row = f.store.task(task.id).await.unwrap().expect("the task");
    let backoff = TaskRetryPolicy::default().backoff_base;
    assert_eq!(row.run_after, stead::core::fleet::add(failed_at, backoff));
    assert!(
        f.worker().work_once().await.is_none(),
        "not before its backoff"
    );
    f.script.heal();
    f.clock.advance(backoff);
    let (task, end) = f.worker().work_once().await.expect("the retry");
    assert_eq!((task.attempts, end), (2, TaskEnd::Done));
}

/// Issue #45: a task's error names its instance, the step that failed
/// (with the service) and the port, and keeps the port's typed error as
/// its source.
#[tokio::test]
async fn a_task_error_names_the_instance_the_step_and_the_port() {
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    f.script.fail(
        Op::Create,
        "stead.wiki1.",
        Fault::Refused("no such image".into()),
    );
    let (_, end) = f.worker().work_once().await.expect("a task");
    let TaskEnd::Failed(error) = end else {
        panic!("failed, not {end:?}")
    };
    assert_eq!(error.instance, "wiki1");
    assert_eq!(error.step, "create web");
    assert_eq!(error.port(), Some(PortName::Runtime));
    assert_eq!(
        *error.cause,
        Cause::Runtime(RuntimeError::Refused("no such image".into()))
    );
    assert_eq!(
        error.to_string(),
        "wiki1: create web: runtime refused: no such image"
    );
}

/// `wiki` of [`CATALOG`], baking its upgrades for five minutes (#40).
fn baking(f: &mut Fixture) {
    f.catalog = Arc::new(
        Catalog::from_toml(
            &CATALOG.replace("bake_ms = 0", "bake_ms = 300000"),
            "catalog.toml",
            &Grants::default(),
        )
        .unwrap(),
    );
}

/// `wiki1` served at version 1, upgraded to 2 with a five-minute bake, and
/// two passes later: the successor serves, the predecessor is stopped and
/// kept. Returns the fixture, the instance, the predecessor, the successor
/// and the recovery that ran the passes.
async fn upgraded_and_baking() -> (
    Fixture,
    stead::core::fleet::Instance,
    ContainerId,
    ContainerId,
    Arc<Recoverer>,
) {
    let mut f = fixture();
    baking(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let after = f.web_container("wiki1").await;
    let recoverer = f.recoverer();
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(f.routes_to("wiki1", "web", &after));
    let kept = f.runtime.container(&before).expect("kept while baking");
    assert!(
        kept.status.is_down(),
        "stopped while baking: {:?}",
        kept.status
    );
    (f, instance, before, after, recoverer)
}

/// #40: after an upgrade switched ACTIVE, the predecessor is stopped once
/// the successor serves, but kept (the way back) until the bake window
/// ends; then it is retired as before.
#[tokio::test]
async fn a_baking_upgrade_keeps_its_predecessor_stopped_until_the_window_ends() {
    let (f, instance, before, after, recoverer) = upgraded_and_baking().await;
    let outcome = recoverer.pass().await;
    assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    assert!(f.routes_to("wiki1", "web", &after));
    assert!(
        f.runtime.container(&before).unwrap().status.is_down(),
        "a pass more, still kept, not started again"
    );
    let markers = f.store.load_inhibitions(&instance.name).await.unwrap();
    let back = markers[0].revert_to.as_ref().expect("the way back");
    assert_eq!(back.version, "1");
    f.clock.advance(Duration::from_secs(301));
    // A fresh process view: the old one's lease lapsed meanwhile.
    // (Its first pass republishes what it cannot vouch for; the next one
    // retires, R15.)
    let recoverer = f.recoverer();
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(f.runtime.container(&before).is_none(), "retired once baked");
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "2");
}

/// `container` exits, and exits again whenever it is started: a version
/// that crashes for good.
fn crash_for_good(f: &Fixture, container: &ContainerId) {
    f.runtime.with_containers(|cs| {
        let c = cs.get_mut(container).unwrap();
        c.status = ContainerStatus::Exited;
        c.status_after_start = ContainerStatus::Exited;
    });
}

/// #40: a successor that crashes while it bakes is reverted: the type's
/// rollout is halted (first, with the reason), ACTIVE names the
/// predecessor again and the instance's version goes back; the next pass
/// starts, verifies and publishes the predecessor, and the one after
/// retires the failed successor.
#[tokio::test]
async fn a_successor_that_crashes_while_baking_is_reverted_and_its_type_halted() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let (f, instance, before, after, _) = upgraded_and_baking().await;

    f.clock.advance(Duration::from_secs(120));
    let recoverer = f.recoverer();
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    recoverer.log_events_to(sink);
    crash_for_good(&f, &after);
    f.runtime.with_containers(|cs| {
        let c = cs.get_mut(&after).unwrap();
        c.log
            .push_back((c.started_at, "config: no such key \"db.url\"".into()));
    });
    recoverer.pass().await;
    // #55: the revert event tells the exit code and the last lines.
    flusher.flush(f.store.as_ref()).await;
    let events = logged_events(&f, "wiki1").await;
    let revert = events
        .iter()
        .find(|e| e.kind == EventKind::Revert)
        .unwrap_or_else(|| panic!("a revert event: {events:?}"));
    assert!(
        revert.message.contains("it exited with code 1")
            && revert
                .message
                .ends_with("; last lines of web: config: no such key \"db.url\""),
        "{}",
        revert.message
    );
    let rollouts = f.store.rollout_records().await.unwrap();
    let wiki = rollouts.iter().find(|r| r.service_type == "wiki").unwrap();
    assert_eq!(wiki.state, RolloutState::Halted);
    assert!(
        wiki.reason.contains("wiki1 reverted to 1 while baking"),
        "{}",
        wiki.reason
    );
    // #55: what failed, as the runtime said it.
    assert!(
        wiki.reason.contains("web: it exited with code 1 and was"),
        "{}",
        wiki.reason
    );
    assert_eq!(f.web_container("wiki1").await, before, "ACTIVE put back");
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1", "the version put back");

    for _ in 0..2 {
        recoverer.pass().await;
    }
    assert!(
        f.routes_to("wiki1", "web", &before),
        "the predecessor serves again"
    );
    assert_eq!(
        f.runtime.container(&before).unwrap().status,
        ContainerStatus::Running
    );
    // #55: the failed successor is kept, stopped, as the evidence of what
    // failed (its logs and exit code), for an hour; then retired.
    assert!(
        f.runtime.container(&after).unwrap().status.is_down(),
        "the failed successor kept, stopped"
    );
    f.clock.advance(stead::core::bake::KEEP_REVERTED);
    // The lease ran out by the store's clock meanwhile (this test's clock
    // moves only the wall): a fresh guard takes it anew.
    let recoverer = f.recoverer();
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(
        f.runtime.container(&after).is_none(),
        "the failed successor retired once kept long enough"
    );
    let left = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
    // Halted: version drift plans no upgrade back to the bad version.
    assert!(f.store.active_tasks().await.unwrap().rows.is_empty());
}

/// #40: `stead rollout undo TYPE` halts the type, asks for the way back on
/// the markers of every instance whose upgrade still bakes, and queues it
/// an upgrade task; the halted type's task starts and verifies the
/// predecessor while the successor still serves, then switches ACTIVE
/// back, so the next pass moves the route without withdrawing it, and
/// retires the successor. Asked twice, nothing changes twice; run again
/// after, it finds nothing baking.
#[tokio::test]
async fn rollout_undo_puts_a_baking_instance_back_without_a_gap_and_is_safe_to_run_twice() {
    let (f, instance, before, after, recoverer) = upgraded_and_baking().await;
    let withdrawals = f.script.count(Op::Withdraw);

    let ops = stead::ops::Ops::new(f.store.as_ref(), f.catalog.clone(), f.clock.now(), 7);
    let undo = ops.undo_rollout("wiki").await.unwrap();
    assert_eq!(
        undo.reverted,
        vec![(InstanceName::new("wiki1"), vec![ServiceName::new("web")])]
    );
    let rollouts = f.store.rollouts().await.unwrap();
    assert_eq!(rollouts.get("wiki"), Some(&RolloutState::Halted));
    // Asked, not yet done.
    assert_eq!(f.web_container("wiki1").await, after);
    let asked = f.store.load_inhibitions(&instance.name).await.unwrap();
    let twice = ops.undo_rollout("wiki").await.unwrap();
    assert_eq!(twice.reverted, undo.reverted);
    assert_eq!(
        f.store.load_inhibitions(&instance.name).await.unwrap(),
        asked,
        "asked twice, written once"
    );
    // The leader's version drift gives it the task that carries it out,
    // within `max_in_flight`.
    assert!(f.store.active_tasks().await.unwrap().rows.is_empty());
    assert!(f.reconciler("a").tick().await.ok());
    let tasks = f.store.active_tasks().await.unwrap().rows;
    assert_eq!(
        tasks.len(),
        1,
        "one upgrade task carries the undo: {tasks:?}"
    );
    assert_eq!(tasks[0].reason, stead::ops::UNDO_REASON);

    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert_eq!(f.web_container("wiki1").await, before);
    assert!(
        f.runtime.container(&before).unwrap().status == ContainerStatus::Running,
        "started again by the undo"
    );
    assert!(
        f.routes_to("wiki1", "web", &after),
        "the successor still serves"
    );
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1");

    two_passes_move_the_route_back_without_a_gap(&f, &recoverer, &before, &after, withdrawals)
        .await;

    let again = ops.undo_rollout("wiki").await.unwrap();
    assert!(again.reverted.is_empty(), "{again:?}");
    assert_eq!(again.not_baking, vec![InstanceName::new("wiki1")]);
    assert_eq!(f.web_container("wiki1").await, before);
    let unknown = ops.undo_rollout("nope").await.unwrap_err();
    assert!(unknown.to_string().contains("\"nope\""), "{unknown}");
}

/// #40: `stead rollout undo TYPE --to VERSION` after the bake window:
/// nothing bakes, so the type is pinned to the recorded version, and the
/// reconciler's version drift moves the instance back to it by an upgrade
/// (a downgrade, allowed only under the pin) through the usual overlap: the old version's
/// container is created, verified and switched to, and the next passes
/// move the route and retire the bad one. Run twice, it finds the
/// instance there; an unrecorded version is refused, naming the ones
/// recorded; a resume lifts the pin.
#[tokio::test]
async fn rollout_undo_to_a_recorded_version_moves_an_instance_back_after_its_bake() {
    let f = fixture();
    f.record_versions("wiki", [&catalog_file_at("1"), &*f.catalog])
        .await;
    let instance = f.served("wiki1", "1").await;
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let recoverer = f.recoverer();
    for _ in 0..3 {
        recoverer.pass().await;
    }
    let bad = f.web_container("wiki1").await;
    assert!(f.routes_to("wiki1", "web", &bad));
    assert_eq!(
        f.runtime.with_containers(|cs| cs.len()),
        1,
        "no bake: retired at once"
    );

    let ops = stead::ops::Ops::new(f.store.as_ref(), f.catalog.clone(), f.clock.now(), 7);
    let unknown = ops.undo_rollout_to("wiki", "7").await.unwrap_err();
    assert!(unknown.to_string().contains("recorded: 1, 2"), "{unknown}");
    let undo = ops.undo_rollout_to("wiki", "1").await.unwrap();
    assert_eq!(undo.moving, vec![InstanceName::new("wiki1")]);
    let wiki = f.store.rollout_records().await.unwrap();
    assert_eq!(wiki[0].state, RolloutState::Halted);
    assert_eq!(wiki[0].pinned.as_deref(), Some("1"));
    assert!(f.store.active_tasks().await.unwrap().rows.is_empty());

    // The reconciler's version drift moves it toward the pin, though
    // halted, as a rollout does: within max_in_flight, at once.
    assert!(f.reconciler("a").tick().await.ok());
    let tasks = f.store.active_tasks().await.unwrap().rows;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0].reason, "rollout undo --to 1: 2 -> 1");
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let good = f.web_container("wiki1").await;
    assert_ne!(good, bad, "a container of version 1 replaced it");
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1");
    assert!(f.routes_to("wiki1", "web", &bad), "no gap: still served");
    for _ in 0..3 {
        recoverer.pass().await;
    }
    assert!(f.routes_to("wiki1", "web", &good));
    assert!(f.runtime.container(&bad).is_none(), "the bad one retired");

    let twice = ops.undo_rollout_to("wiki", "1").await.unwrap();
    assert!(twice.moving.is_empty(), "{twice:?}");
    assert_eq!(twice.not_baking, vec![InstanceName::new("wiki1")]);
    assert!(f.reconciler("a").tick().await.ok());
    assert!(
        f.store.active_tasks().await.unwrap().rows.is_empty(),
        "nothing more to move"
    );

    ops.set_rollout("wiki", RolloutState::Active, "operator: resume")
        .await
        .unwrap();
    let wiki = f.store.rollout_records().await.unwrap();
    assert_eq!(wiki[0].pinned, None, "a resume lifts the pin");
}

/// #55: a `stop-first` service's failed successor is not kept: it mounts
/// the service's volumes, and a `docker start` by hand would run it beside
/// the predecessor. It is stopped before the predecessor starts, and
/// retired once the predecessor serves.
#[tokio::test]
async fn a_stop_first_successor_that_fails_its_bake_is_not_kept() {
    let mut f = fixture();
    f.catalog = Arc::new(
        Catalog::from_toml(
            &CATALOG
                .replace("bake_ms = 0", "bake_ms = 300000")
                .replace("update = \"overlap\"", ""),
            "catalog.toml",
            &Grants::default(),
        )
        .unwrap(),
    );
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let after = f.web_container("wiki1").await;
    let recoverer = f.recoverer();
    for _ in 0..2 {
        recoverer.pass().await;
    }
    assert!(f.routes_to("wiki1", "web", &after), "the successor serves");
    f.clock.advance(Duration::from_secs(120));
    crash_for_good(&f, &after);
    for _ in 0..3 {
        recoverer.pass().await;
    }
    assert!(f.routes_to("wiki1", "web", &before), "reverted");
    assert!(
        f.runtime.container(&after).is_none(),
        "a stop-first successor is retired, not kept"
    );
    let left = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// #55, the mutation exercise: a pass that retires a reverted successor
/// at once, like any superseded container, is caught by the keep the test
/// above checks, as the simulation's B3 does.
#[tokio::test]
async fn a_pass_that_removes_a_reverted_successor_at_once_is_caught() {
    let (f, _, before, after, _) = upgraded_and_baking().await;
    f.clock.advance(Duration::from_secs(120));
    let recoverer =
        f.recoverer_broken("a", Some(stead::core::broken::Mutant::RemoveRevertedAtOnce));
    crash_for_good(&f, &after);
    for _ in 0..3 {
        recoverer.pass().await;
    }
    assert!(f.routes_to("wiki1", "web", &before), "reverted");
    assert!(
        f.runtime.container(&after).is_none(),
        "with the rule broken, the evidence is gone: the keep's check sees it"
    );
}

/// After an undo's task: two passes later the predecessor serves, the
/// route moved to it with no withdrawal since `withdrawals` were counted,
/// and the successor is retired.
async fn two_passes_move_the_route_back_without_a_gap(
    f: &Fixture,
    recoverer: &Recoverer,
    before: &ContainerId,
    after: &ContainerId,
    withdrawals: usize,
) {
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(
        f.routes_to("wiki1", "web", before),
        "the predecessor serves"
    );
    assert_eq!(
        f.script.count(Op::Withdraw),
        withdrawals,
        "the route moved to the predecessor without being withdrawn"
    );
    assert!(
        f.runtime.container(after).unwrap().status.is_down(),
        "the successor stopped, kept a while as what was undone (#55)"
    );
}

/// #40: the undo moves the route without a gap also on a daemon that
/// served the predecessor itself before the upgrade, as a long-running
/// one did: the execution it remembers verifying then is not the one the
/// undo started and verified, and must not make that one look new, or
/// the pass withdraws the successor's route before it publishes the
/// predecessor (R8). Found by the e2e on dockerd; the test above runs its
/// passes on a recovery that never saw the predecessor serve.
#[tokio::test]
async fn rollout_undo_moves_the_route_without_a_gap_on_the_daemon_that_served_the_predecessor() {
    let mut f = fixture();
    baking(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    let recoverer = f.recoverer();
    let outcome = recoverer.pass().await;
    assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let after = f.web_container("wiki1").await;
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(f.routes_to("wiki1", "web", &after));
    assert!(f.runtime.container(&before).unwrap().status.is_down());
    // The undo's start of the predecessor is a later execution.
    f.clock.advance(Duration::from_secs(10));
    let withdrawals = f.script.count(Op::Withdraw);

    let ops = stead::ops::Ops::new(f.store.as_ref(), f.catalog.clone(), f.clock.now(), 7);
    ops.undo_rollout("wiki").await.unwrap();
    assert!(f.reconciler("a").tick().await.ok());
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert_eq!(f.web_container("wiki1").await, before);
    two_passes_move_the_route_back_without_a_gap(&f, &recoverer, &before, &after, withdrawals)
        .await;
}

/// `web` replaced `stop-first`, the default for a service with a named
/// volume (#40).
fn stop_first(f: &mut Fixture) {
    f.catalog = Arc::new(
        Catalog::from_toml(
            &CATALOG.replace("update = \"overlap\"", ""),
            "catalog.toml",
            &Grants::default(),
        )
        .unwrap(),
    );
    let web = &f.catalog.get("wiki").unwrap().services[0];
    assert_eq!(web.update, stead::core::spec::UpdateStrategy::StopFirst);
}

/// #40: a `stop-first` upgrade holds, withdraws and stops the predecessor
/// before it creates the successor, so the two never run at once on the
/// service's volume; the successor is verified and switched, the
/// predecessor marked (the hold replaced) and retired once the successor
/// serves.
#[tokio::test]
async fn a_stop_first_upgrade_stops_the_predecessor_before_creating_its_successor() {
    let mut f = fixture();
    stop_first(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    let at_create = Arc::new(std::sync::Mutex::new(None));
    let (runtime, traffic, seen, old) = (
        f.runtime.clone(),
        f.traffic.clone(),
        at_create.clone(),
        before.clone(),
    );
    f.script.on_next(Op::Create, move || {
        let down = runtime.container(&old).map(|c| c.status.is_down());
        let routed = traffic.routes().keys().any(|k| k.service.as_str() == "web");
        *seen.lock().unwrap() = Some((down, routed));
    });
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert_eq!(
        *at_create.lock().unwrap(),
        Some((Some(true), false)),
        "when the successor was created, the predecessor was (down, routed)"
    );
    let after = f.web_container("wiki1").await;
    assert_ne!(after, before);
    let records = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].container, before);
    assert_eq!(records[0].reason, InhibitionReason::RetirementPending);

    let recoverer = f.recoverer();
    for _ in 0..2 {
        let outcome = recoverer.pass().await;
        assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    }
    assert!(f.routes_to("wiki1", "web", &after), "the successor serves");
    assert!(
        f.runtime.container(&before).is_none(),
        "the predecessor retired"
    );
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
}

/// #40: a `stop-first` successor that cannot be created (an image that
/// cannot be pulled) gives the predecessor back: its hold is cleared and
/// the next pass starts, verifies and publishes it; the rollout halts.
#[tokio::test]
async fn a_stop_first_successor_that_fails_gives_its_predecessor_back() {
    let mut f = fixture();
    stop_first(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    f.script
        .fail(Op::Create, "", Fault::Refused("no such image".into()));
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert!(matches!(end, TaskEnd::Failed(_)), "{end:?}");
    assert_eq!(f.web_container("wiki1").await, before);
    assert!(
        f.runtime.container(&before).unwrap().status.is_down(),
        "stopped first"
    );
    assert!(
        f.store
            .load_inhibitions(&instance.name)
            .await
            .unwrap()
            .is_empty(),
        "the hold cleared"
    );
    let rollouts = f.store.rollouts().await.unwrap();
    assert_eq!(rollouts.get("wiki"), Some(&RolloutState::Halted));
    let outcome = f.recoverer().pass().await;
    assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    assert!(
        f.routes_to("wiki1", "web", &before),
        "the predecessor started and served again"
    );
    assert_eq!(
        f.store
            .instance(&instance.name)
            .await
            .unwrap()
            .unwrap()
            .state,
        InstanceState::Ready
    );
}

/// #40: a `stop-first` upgrade interrupted after it created its candidate
/// (the process died) leaves the predecessor stopped under its hold, the
/// candidate running and the instance `upgrading`. A halt cancels no such
/// upgrade; its worker, finding the rollout halted, upgrades nothing but
/// removes the candidate first, then clears the hold and returns the
/// instance to ready, and the next pass starts the predecessor: never two.
#[tokio::test]
async fn a_halted_rollout_still_tidies_an_interrupted_stop_first_upgrade() {
    let mut f = fixture();
    stop_first(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    // What the dead upgrade left.
    assert!(f
        .store
        .set_instance_state(
            instance.id,
            InstanceState::Ready,
            InstanceState::Upgrading,
            f.clock.now()
        )
        .await
        .unwrap());
    let key = stead::core::types::GenerationKey {
        instance: instance.name.clone(),
        service: ServiceName::new("web"),
        container: before.clone(),
    };
    f.runtime.stop(&key, Duration::ZERO).await.unwrap();
    let hold = Inhibition {
        service: ServiceName::new("web"),
        container: before.clone(),
        reason: InhibitionReason::Hold(InhibitionReason::STOP_FIRST.into()),
        operation: "upgrade".into(),
        created_at: f.clock.now(),
        stop_grace: None,
        revert_to: None,
    };
    f.store
        .save_inhibition(&instance.name, &hold)
        .await
        .unwrap();
    let candidate = f
        .runtime
        .create(&create_request("wiki1", "web"))
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    // The pass keeps the held predecessor down meanwhile (R5).
    f.recoverer().pass().await;
    assert!(f.runtime.container(&before).unwrap().status.is_down());

    let ops = stead::ops::Ops::new(f.store.as_ref(), f.catalog.clone(), f.clock.now(), 7);
    let halted = ops.undo_rollout("wiki").await.unwrap();
    assert!(halted.cancelled.is_empty(), "{halted:?}");
    let tasks = f.store.active_tasks().await.unwrap().rows;
    let task = tasks
        .first()
        .expect("the interrupted upgrade is not cancelled");
    let refused = ops.cancel_task(task.id).await.unwrap_err();
    assert!(refused.to_string().contains("interrupted"), "{refused}");

    let ran = Arc::new(std::sync::Mutex::new(None));
    let (runtime, seen, old) = (f.runtime.clone(), ran.clone(), before.clone());
    f.script.on_next(Op::Remove, move || {
        *seen.lock().unwrap() = Some(runtime.container(&old).map(|c| c.status.is_down()));
    });
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    assert_eq!(
        *ran.lock().unwrap(),
        Some(Some(true)),
        "the predecessor stayed down while the candidate went"
    );
    assert!(
        f.runtime.container(&candidate).is_none(),
        "the candidate removed"
    );
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(
        (row.state, row.version.as_str()),
        (InstanceState::Ready, "1")
    );
    let outcome = f.recoverer().pass().await;
    assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    assert!(f.routes_to("wiki1", "web", &before), "served again");
}

/// #40: a `stop-first` successor that is not ready fails its task at once
/// (the rollout halts): a retry would stop the predecessor again, an
/// outage per attempt, for a version that just failed. An overlap upgrade
/// retries the same failure (`a_failed_upgrade_removes_the_candidate_…`).
#[tokio::test]
async fn a_stop_first_successor_that_is_not_ready_is_not_retried() {
    let mut f = fixture();
    stop_first(&mut f);
    let instance = f.served("wiki1", "1").await;
    let before = f.web_container("wiki1").await;
    // The candidate is created, then vanishes before it is verified.
    f.script
        .fail(Op::Inspect, "stead.wiki1.web.2", Fault::NotFound);
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    let TaskEnd::Failed(error) = end else {
        panic!("retried: {end:?}")
    };
    assert!(error.to_string().contains("not retried"), "{error}");
    let rollouts = f.store.rollouts().await.unwrap();
    assert_eq!(rollouts.get("wiki"), Some(&RolloutState::Halted));
    assert_eq!(f.web_container("wiki1").await, before);
    assert!(f
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap()
        .is_empty());
    let outcome = f.recoverer().pass().await;
    assert_eq!(outcome.error_count(), 0, "{outcome:?}");
    assert!(f.routes_to("wiki1", "web", &before), "served again");
}

/// #40: an earlier attempt at this very revision switched to its successor
/// and put it back under a retirement marker. The next attempt's create
/// adopts that container (names are by revision); when it then fails
/// verification and is removed, its marker goes with it. Left behind, the
/// marker named the container created next under that name, and the
/// recovery pass retired that one by it (the simulation, seed 424, S1).
#[tokio::test]
async fn a_failed_candidate_removed_under_a_retirement_marker_takes_its_marker_with_it() {
    let f = fixture();
    let instance = f.served("wiki1", "1").await;
    let mut request = create_request("wiki1", "web");
    request.revision = request.spec.revision("2");
    let reverted = f.runtime.create(&request).await.expect("create");
    let marker = stead::core::types::Inhibition {
        service: ServiceName::new("web"),
        container: reverted.clone(),
        reason: InhibitionReason::RetirementPending,
        operation: "revert".into(),
        created_at: f.clock.now(),
        stop_grace: None,
        revert_to: None,
    };
    f.store
        .save_inhibition(&instance.name, &marker)
        .await
        .unwrap();
    // The adopted candidate vanishes before it is verified.
    f.script
        .fail(Op::Inspect, reverted.as_str(), Fault::NotFound);
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker().work_once().await.unwrap();
    assert!(matches!(end, TaskEnd::Retried(_)), "{end:?}");
    let records = f.store.load_inhibitions(&instance.name).await.unwrap();
    assert!(
        records.iter().all(|m| m.container != reverted),
        "the removed candidate's marker is gone: {records:?}"
    );
}

/// A halted type's reprovision puts back the version the instance records,
/// not the catalog's: the catalog's is the version its rollout halted on,
/// and installing it would upgrade a halted type (the simulation, seed
/// 494: a Helm release its bake had rolled back came back at the broken
/// version once it was uninstalled by hand).
#[tokio::test]
async fn a_halted_types_reprovision_puts_back_the_recorded_version_not_the_catalogs() {
    let f = fixture();
    f.record_versions("wiki", [&catalog_file_at("1"), &*f.catalog])
        .await;
    let instance = f.served("wiki1", "1").await;
    let gone = f.web_container("wiki1").await;
    f.halt_by_operator("wiki").await;
    assert!(f.runtime.remove_by_hand(&gone));
    f.enqueue(instance.id, TaskKind::Reprovision).await;
    assert_eq!(f.worker().work_once().await.unwrap().1, TaskEnd::Done);
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1", "still the version the rollout halted at");
    let back = f.web_container("wiki1").await;
    assert!(
        back.as_str().starts_with("stead.wiki1.web.1."),
        "made at the recorded version: {back}"
    );
}

/// A Helm type halted while one of its releases runs a version its
/// instance does not record (an upgrade or a bake interrupted after `helm
/// upgrade`: here the bake recorded the old version again and its rollback
/// failed): the halted type's upgrade task puts the release back at the
/// recorded version. The retry used to find the type halted and tidy
/// nothing, leaving the release at the broken version for good (the
/// simulation's fifty-instance day, seed 2, H2).
#[tokio::test]
async fn a_halted_helm_types_release_ahead_of_its_instance_is_put_back() {
    let f = fixture();
    let helm = |version: &str| {
        Catalog::from_toml(
            &format!(
                "[types.search]\nversion = \"{version}\"\nprovisioner = \"helm\"\n\
                 [types.search.helm]\nchart = \"charts/search\"\nnamespace = \"t-{{instance}}\"\n"
            ),
            "catalog.toml",
            &Grants::default()
                .with_helm(&["charts/search".to_owned()], Some("t-"))
                .unwrap(),
        )
        .unwrap()
    };
    let (at_1, at_2) = (helm("1"), helm("2"));
    f.record_versions("search", [&at_1, &at_2]).await;
    let instance = f
        .store
        .create_instance(
            &NewInstance {
                domains: Vec::new(),
                spec_digest: None,
                parameters: Default::default(),
                name: InstanceName::new("s1"),
                team: "t".into(),
                service_type: "search".into(),
                version: "1".into(),
                expires_at: None,
                maintenance_window: None,
            },
            f.clock.now(),
        )
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Provision).await;
    let (_, end) = f.worker_with(Arc::new(at_1)).work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    assert_eq!(f.provisioner.release_versions()["s1"], "1");
    // `helm upgrade` to 2 went through; the version was not recorded.
    let entry = at_2.get("search").unwrap();
    let stead::core::release::Provisioning::Helm(chart) = &entry.provisioning else {
        panic!("a helm type")
    };
    let params = stead::core::release::ReleaseParams::of(&instance, "2");
    let release = chart.release_of(&params, true).unwrap();
    stead::ports::Provisioner::install_or_upgrade(
        f.provisioner.as_ref(),
        &stead::core::release::ReleaseSpec::Helm(release),
    )
    .await
    .unwrap();
    assert_eq!(f.provisioner.release_versions()["s1"], "2");
    f.halt_by_operator("search").await;
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let (_, end) = f.worker_with(Arc::new(at_2)).work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    assert_eq!(
        f.provisioner.release_versions()["s1"],
        "1",
        "back at the version the instance records"
    );
    let row = f.store.instance(&instance.name).await.unwrap().unwrap();
    assert_eq!(row.version, "1");
}

/// #43: two tasks that run at once on one thread each log under their
/// own trace id. A task's span was held entered across its awaits, so the
/// other task's lines carried it too.
#[tokio::test]
async fn tasks_that_run_at_once_log_under_their_own_trace_ids() {
    let f = fixture();
    let one = f.instance("wiki1", "2").await;
    let two = f.instance("wiki2", "2").await;
    let trace = |n: u8| format!("00-{:032x}-{:016x}-01", n, n);
    for (instance, n) in [(&one, 1), (&two, 2)] {
        f.store
            .enqueue(
                &NewTask {
                    kind: TaskKind::Provision,
                    instance: instance.id,
                    run_after: f.clock.now(),
                    reason: "test".into(),
                    traceparent: Some(trace(n)),
                },
                f.clock.now(),
                None,
            )
            .await
            .unwrap();
    }
    // Each creation takes a while, so the two tasks interleave.
    f.script
        .fail(Op::Create, "", Fault::Slow(Duration::from_millis(50)));
    let lines = Lines::default();
    let _recording = lines.record();
    let (a, b) = (f.worker(), f.worker());
    let (ran_a, ran_b) = tokio::join!(a.work_once(), b.work_once());
    assert_eq!(ran_a.unwrap().1, TaskEnd::Done);
    assert_eq!(ran_b.unwrap().1, TaskEnd::Done);
    let text = lines.text();
    let mut seen = 0;
    for line in text.lines() {
        for (name, own, other) in [("wiki1", trace(1), trace(2)), ("wiki2", trace(2), trace(1))] {
            if line.contains(&format!("of {name}")) {
                seen += 1;
                assert!(
                    line.contains(&own) && !line.contains(&other),
                    "{name}'s line under the wrong trace: {line}"
                );
            }
        }
    }
    assert!(seen >= 4, "each task's start and end lines: {text}");
}

// --- the event log (#42) ---------------------------------------------------

/// The events of `instance` the store holds, oldest first.
async fn logged_events(f: &Fixture, instance: &str) -> Vec<stead::core::event_log::Event> {
    f.store
        .events(&stead::core::event_log::EventFilter {
            instance: Some(InstanceName::new(instance)),
            ..Default::default()
        })
        .await
        .unwrap()
        .rows
        .into_iter()
        .map(|logged| logged.event)
        .collect()
}

#[tokio::test]
async fn a_ticks_start_and_restart_are_logged_as_events_with_rule_trace_and_writer() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    f.served("wiki1", "2").await;
    let web = f.web_container("wiki1").await;
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let r = f.reconciler("a");
    r.recoverer().log_events_to(sink);
    // A container found down is started (R9), then published (R13).
    f.runtime.with_containers(|cs| {
        cs.get_mut(&web).unwrap().status = stead::core::types::ContainerStatus::Exited
    });
    let out = r.tick().await;
    assert!(out.leader && out.ok(), "{:?}", out.failed);
    assert!(flusher.flush(f.store.as_ref()).await > 0);
    let events = logged_events(&f, "wiki1").await;
    let start = events
        .iter()
        .find(|e| e.kind == EventKind::Start)
        .unwrap_or_else(|| panic!("a start event: {events:?}"));
    assert_eq!(start.reason, "R9");
    assert_eq!(start.service.as_ref().map(|s| s.as_str()), Some("web"));
    assert_eq!(start.container.as_ref(), Some(&web));
    assert_eq!(start.writer, "host-1#a");
    assert_eq!(start.at, f.clock.now(), "the engine's clock");
    let trace = stead::core::event_log::trace_id_of(&out.traceparent);
    assert_eq!(start.trace_id.as_deref(), Some(trace), "the tick's trace");
    assert!(
        events
            .iter()
            .any(|e| e.kind == EventKind::Publish && e.trace_id.as_deref() == Some(trace)),
        "{events:?}"
    );
    // The lease this tick took is an event too, about no instance.
    let all = f.store.events(&Default::default()).await.unwrap().rows;
    assert!(
        all.iter().any(|e| e.event.kind == EventKind::LeaseTaken
            && e.event.instance.is_none()
            && e.event.reason == "C2"),
        "{all:?}"
    );
    // Unhealthy past the threshold: withdrawn and restarted (R12).
    f.runtime.with_containers(|cs| {
        cs.get_mut(&web).unwrap().health = stead::core::types::Health::Unhealthy
    });
    for _ in 0..4 {
        r.recoverer().pass().await;
    }
    flusher.flush(f.store.as_ref()).await;
    let events = logged_events(&f, "wiki1").await;
    let restart = events
        .iter()
        .find(|e| e.kind == EventKind::Restart)
        .unwrap_or_else(|| panic!("a restart event: {events:?}"));
    assert_eq!(restart.reason, "R12");
    assert_eq!(restart.container.as_ref(), Some(&web));
    assert!(restart.trace_id.is_none(), "a pass outside a tick has none");
    let withdrawn_first = events
        .iter()
        .position(|e| e.kind == EventKind::Withdraw && e.reason == "R12");
    let restarted = events.iter().position(|e| e.kind == EventKind::Restart);
    assert!(
        withdrawn_first < restarted && withdrawn_first.is_some(),
        "withdrawn before the restart: {events:?}"
    );
}

#[tokio::test]
async fn a_targeted_pass_logs_its_events_under_a_trace_of_its_own() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    let instance = f.served("wiki1", "2").await;
    let web = f.web_container("wiki1").await;
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let r = f.reconciler("a");
    r.recoverer().log_events_to(sink);
    r.recoverer().trace_targeted_passes(7);
    assert!(r.tick().await.leader);
    let down = || {
        f.runtime.with_containers(|cs| {
            cs.get_mut(&web).unwrap().status = stead::core::types::ContainerStatus::Exited
        })
    };
    let mut traces = Vec::new();
    for _ in 0..2 {
        let before = logged_events(&f, "wiki1").await.len();
        down();
        // As a Docker event's wake-up runs it.
        r.recoverer().recover_instance(&instance).await;
        flusher.flush(f.store.as_ref()).await;
        let events = logged_events(&f, "wiki1").await[before..].to_vec();
        let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
        assert!(
            kinds.contains(&EventKind::Start) && kinds.contains(&EventKind::Publish),
            "{events:?}"
        );
        let trace = events[0].trace_id.clone().expect("a trace id");
        assert_eq!(trace.len(), 32, "{trace}");
        assert!(
            events.iter().all(|e| e.trace_id.as_ref() == Some(&trace)),
            "one pass, one trace: {events:?}"
        );
        traces.push(trace);
    }
    assert_ne!(traces[0], traces[1], "each targeted pass has its own");
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_delay_is_logged_once_with_its_next_attempt() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    f.served("crashy", "2").await;
    let web = f.web_container("crashy").await;
    f.runtime.with_containers(|cs| {
        let c = cs.get_mut(&web).unwrap();
        c.status = stead::core::types::ContainerStatus::Exited;
        c.status_after_start = stead::core::types::ContainerStatus::Exited;
    });
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let recoverer = f.recoverer();
    recoverer.log_events_to(sink);
    let mut next_attempt = None;
    for _ in 0..8 {
        let outcome = recoverer.pass().await;
        next_attempt = next_attempt.or_else(|| {
            outcome
                .instance(&InstanceName::new("crashy"))
                .unwrap()
                .reports
                .iter()
                .find_map(|r| match r.verdict {
                    stead::core::recovery::Verdict::Delayed { next_attempt } => next_attempt,
                    _ => None,
                })
        });
    }
    let next_attempt = next_attempt.expect("the budget delayed the service");
    flusher.flush(f.store.as_ref()).await;
    let delays: Vec<_> = logged_events(&f, "crashy")
        .await
        .into_iter()
        .filter(|e| e.kind == EventKind::CrashLoopDelay)
        .collect();
    assert_eq!(delays.len(), 1, "once per new delay: {delays:?}");
    assert_eq!(delays[0].until, Some(next_attempt));
    assert_eq!(delays[0].reason, "R10");
    let starts = logged_events(&f, "crashy")
        .await
        .into_iter()
        .filter(|e| e.kind == EventKind::Start)
        .count();
    assert_eq!(starts, 3, "the three real attempts before the delay");
}

#[tokio::test]
async fn a_full_event_buffer_drops_and_counts_and_never_blocks_the_pass() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::EventSink;
    let f = fixture();
    // Every task of a current-thread test runtime runs on this thread.
    let tally = Tally::default();
    let _recording = metrics::set_default_local_recorder(&tally);
    f.served("wiki1", "2").await;
    let web = f.web_container("wiki1").await;
    // Room for one event, and nobody writing them out: the store might as
    // well be hung.
    let (sink, mut flusher) = EventSink::new("host-1#a", 1);
    let recoverer = f.recoverer();
    recoverer.log_events_to(sink.clone());
    f.runtime.with_containers(|cs| {
        cs.get_mut(&web).unwrap().status = stead::core::types::ContainerStatus::Exited
    });
    let outcome = tokio::time::timeout(Duration::from_secs(5), recoverer.pass())
        .await
        .expect("the pass never waits for the event log");
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(
        f.runtime.container(&web).unwrap().status,
        stead::core::types::ContainerStatus::Running,
        "the pass did its work"
    );
    assert!(
        sink.dropped() >= 1,
        "start and publish: one kept, the rest dropped"
    );
    assert_eq!(
        tally.branches().get("stead_events_dropped_total").copied(),
        Some(sink.dropped()),
        "each drop is counted"
    );
    // What the buffer kept is written; what was dropped is gone.
    assert_eq!(flusher.flush(f.store.as_ref()).await, 1);
    let events = logged_events(&f, "wiki1").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::Start);
    // A store that refuses every write loses its batch, counted the same
    // way, and the flusher goes on.
    let before = sink.dropped();
    assert!(sink.emit(stead::core::event_log::Event::new(
        EventKind::Stop,
        f.clock.now(),
        "R4",
        "stopped"
    )));
    f.store.set_unavailable(true);
    assert_eq!(flusher.flush(f.store.as_ref()).await, 0);
    assert_eq!(sink.dropped(), before + 1);
}

#[tokio::test]
async fn the_leaders_tick_prunes_events_past_their_retention() {
    use stead::core::event_log::{Event, EventKind};
    let f = fixture();
    let day = jiff::SignedDuration::from_hours(24);
    let now = f.clock.now();
    let old: Vec<Event> = (0..3)
        .map(|i| Event::new(EventKind::Start, now - day * (20 + i), "R9", "old"))
        .collect();
    f.store.append_events(&old).await.unwrap();
    f.store
        .append_events(&[Event::new(EventKind::Start, now - day, "R9", "recent")])
        .await
        .unwrap();
    let r = f.reconciler("a");
    r.keep_events_for(Duration::from_secs(14 * 24 * 3600));
    let out = r.tick().await;
    assert!(out.leader, "{:?}", out.failed);
    let left = f.store.events(&Default::default()).await.unwrap().rows;
    let messages: Vec<&str> = left.iter().map(|e| e.event.message.as_str()).collect();
    assert_eq!(messages, ["recent"], "what is older than 14 days goes");
    // A standby prunes nothing: only the leader's tick does.
    f.store
        .append_events(&[Event::new(EventKind::Start, now - day * 30, "R9", "old")])
        .await
        .unwrap();
    let standby = f.reconciler("b");
    standby.keep_events_for(Duration::from_secs(24 * 3600));
    assert!(!standby.tick().await.leader);
    assert_eq!(
        f.store
            .events(&Default::default())
            .await
            .unwrap()
            .rows
            .len(),
        2
    );
}

#[tokio::test]
async fn a_ticks_enqueue_is_recorded_with_its_task_in_the_same_write() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    f.served("wiki1", "1").await;
    let (sink, _flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let r = f.reconciler("a");
    r.recoverer().log_events_to(sink);
    let out = r.tick().await;
    assert!(out.ok() && out.tasks_enqueued >= 1, "{:?}", out.failed);
    let upgrade = f
        .store
        .active_tasks()
        .await
        .unwrap()
        .rows
        .into_iter()
        .find(|t| t.kind == TaskKind::Upgrade)
        .expect("the version drift's upgrade");
    // Nothing was flushed: the event went with the task's insert.
    let events = logged_events(&f, "wiki1").await;
    let queued = events
        .iter()
        .find(|e| e.kind == EventKind::Enqueue)
        .unwrap_or_else(|| panic!("an enqueue event: {events:?}"));
    assert_eq!(queued.task, Some(upgrade.id));
    assert_eq!(queued.reason, "C8");
    assert_eq!(queued.writer, "host-1#a");
    assert_eq!(
        queued.trace_id.as_deref(),
        Some(stead::core::event_log::trace_id_of(&out.traceparent))
    );
}

#[tokio::test]
async fn a_workers_task_end_is_recorded_with_its_task_when_it_finishes() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    let instance = f.instance("wiki1", "2").await;
    f.enqueue(instance.id, TaskKind::Provision).await;
    let (sink, _flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let (task, end) = f
        .worker()
        .with_events(sink)
        .work_once()
        .await
        .expect("a task");
    assert_eq!(end, TaskEnd::Done);
    // Nothing was flushed: the event went with the task's completion.
    let events = logged_events(&f, "wiki1").await;
    let done = events
        .iter()
        .find(|e| e.kind == EventKind::TaskDone)
        .unwrap_or_else(|| panic!("a task_done event: {events:?}"));
    assert_eq!(done.task, Some(task.id));
    assert_eq!(done.reason, "C11");
    assert_eq!(done.writer, "host-1#a");
    assert!(
        done.message.contains("provision of wiki1 done"),
        "{}",
        done.message
    );
}

#[tokio::test]
async fn an_upgrades_retirements_are_events_of_the_worker_and_of_the_pass() {
    use stead::core::event_log::EventKind;
    use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
    let f = fixture();
    let (instance, _api) = f.served_with_api().await;
    let before = f.web_container("wiki1").await;
    let (sink, mut flusher) = EventSink::new("host-1#a", EVENT_BUFFER_MAX);
    let recoverer = f.recoverer();
    recoverer.log_events_to(sink.clone());
    recoverer.pass().await;
    f.enqueue(instance.id, TaskKind::Upgrade).await;
    let worker = f.worker().with_events(sink);
    assert_eq!(worker.work_once().await.unwrap().1, TaskEnd::Done);
    for _ in 0..2 {
        recoverer.pass().await;
    }
    flusher.flush(f.store.as_ref()).await;
    let events = logged_events(&f, "wiki1").await;
    let api_retired = events
        .iter()
        .find(|e| e.kind == EventKind::Retire && e.reason == "C11")
        .unwrap_or_else(|| panic!("the dropped service's retirement: {events:?}"));
    assert_eq!(api_retired.service, Some(ServiceName::new("api")));
    let predecessor = events
        .iter()
        .find(|e| e.kind == EventKind::Retire && e.reason == "R15")
        .unwrap_or_else(|| panic!("the predecessor's retirement: {events:?}"));
    assert_eq!(predecessor.container.as_ref(), Some(&before));
    assert!(
        events.iter().any(|e| e.kind == EventKind::TaskDone),
        "{events:?}"
    );
}

// --- clocks that stop or step (#41) -------------------------------------------

impl Fixture {
    /// A reconciler of process `holder` whose engine clock is anchored to
    /// the database's (the fixture's manual clock, which the store reads)
    /// over a host clock of its own, as the daemon's is.
    fn anchored_reconciler(&self, holder: &str, host: Arc<ManualClock>) -> Reconciler {
        let clock: Arc<dyn Clock> = Arc::new(stead::engine::clock::AnchoredClock::new(host));
        let ports = Ports {
            clock: clock.clone(),
            ..self.ports.clone()
        };
        let policy = RecoveryPolicy::default();
        let ttl = reconciler_lease_ttl(
            ControlConfig::default().tick_interval,
            policy.instance_deadline,
        );
        let lease = LeaseGuard::new(holder.into(), ttl, LEASE_MARGIN).timed_by(clock.clone());
        let locks = InstanceLocks::new(self.store.clone()).timed_by(clock);
        let recoverer = Recoverer::new(
            ports.clone(),
            policy,
            Default::default(),
            Arc::new(locks),
            format!("{holder}/recovery"),
            Arc::new(lease),
        );
        Reconciler::new(
            ports,
            self.catalog.clone(),
            ControlConfig::default(),
            Arc::new(recoverer),
            7,
        )
    }
}

/// A step of the database's clock decides nothing by time: the tick that
/// reads a two-hour step ahead expires no TTL, and a standby takes over no
/// lease that looks expired only by the step; once the clock is stepped
/// back, nothing has moved, and the leader goes on leading.
#[tokio::test(start_paused = true)]
async fn a_stepped_database_clock_expires_nothing_and_takes_over_no_lease() {
    let f = fixture();
    let host = Arc::new(ManualClock::new(f.clock.now()));
    let expiring = f
        .expiring("b-expires", jiff::SignedDuration::from_hours(1))
        .await;
    let leader = f.anchored_reconciler("a", host.clone());
    let standby = f.anchored_reconciler("b", host.clone());
    let first = leader.tick().await;
    assert!(
        first.leader && first.clock_unverified,
        "a first reading vouches for nothing"
    );
    assert!(!standby.tick().await.leader);
    // Time passes for the database, the host and the monotonic clock.
    async fn pass(f: &Fixture, host: &ManualClock, d: Duration) {
        f.clock.advance(d);
        host.advance(d);
        tokio::time::advance(d).await;
    }
    pass(&f, &host, Duration::from_secs(60)).await;
    let steady = leader.tick().await;
    assert!(steady.leader && !steady.clock_unverified, "{steady:?}");
    assert!(!standby.tick().await.clock_unverified);

    // Four minutes more and the database's clock steps two hours ahead:
    // by it the TTL is past and the leader's lease ran out.
    pass(&f, &host, Duration::from_secs(240)).await;
    let before_step = f.clock.now();
    f.clock.advance(Duration::from_secs(7200));
    let waiting = standby.tick().await;
    assert!(
        !waiting.leader,
        "took over a lease that ran out only by the step"
    );
    assert!(waiting.clock_unverified);
    let stepped = leader.tick().await;
    assert!(stepped.leader && stepped.clock_unverified, "{stepped:?}");
    let row = f.store.instance_by_id(expiring.id).await.unwrap().unwrap();
    assert_eq!(row.state, expiring.state, "expired by a stepped clock");
    assert!(
        !f.store
            .active_tasks()
            .await
            .unwrap()
            .rows
            .iter()
            .any(|t| t.kind == TaskKind::Deprovision),
        "a deprovision queued on a stepped clock"
    );

    // Stepped back ten seconds later: the next readings agree with each
    // process's own reckoning, and the leader still leads.
    f.clock.set(before_step);
    pass(&f, &host, Duration::from_secs(10)).await;
    let back = leader.tick().await;
    assert!(back.leader && !back.clock_unverified, "{back:?}");
    assert!(!standby.tick().await.leader);
    let row = f.store.instance_by_id(expiring.id).await.unwrap().unwrap();
    assert_eq!(row.state, expiring.state);
}

/// #41 item 8: finished tasks do not pile up for ever: the leader's tick
/// deletes those finished longer ago than the retention (the event log's,
/// which names them); a queued or running task stays however old, and so
/// does a recent finished one.
#[tokio::test]
async fn the_leaders_tick_prunes_finished_tasks_past_their_retention_and_keeps_active_ones() {
    let f = fixture();
    let day = jiff::SignedDuration::from_hours(24);
    let now = f.clock.now();
    let wiki = f.served("wiki1", "1").await;
    let provisioned = f.store.all_tasks();
    assert_eq!(provisioned.len(), 1, "the provision, finished just now");
    let new = |kind| NewTask {
        kind,
        instance: wiki.id,
        run_after: now - day * 30,
        reason: "test".into(),
        traceparent: None,
    };
    let long_done = f
        .store
        .enqueue(&new(TaskKind::Reprovision), now - day * 30, None)
        .await
        .unwrap()
        .unwrap();
    f.store.claim("w-old", now - day * 30, 1).await.unwrap();
    assert!(f
        .store
        .complete(long_done, "w-old", now - day * 20)
        .await
        .unwrap());
    let long_queued = f
        .store
        .enqueue(&new(TaskKind::Upgrade), now - day * 30, None)
        .await
        .unwrap()
        .unwrap();
    let r = f.reconciler("a");
    r.keep_events_for(Duration::from_secs(14 * 24 * 3600));
    let out = r.tick().await;
    assert!(out.leader, "{:?}", out.failed);
    let left: Vec<_> = f.store.all_tasks().iter().map(|t| t.id).collect();
    assert!(
        !left.contains(&long_done),
        "a task finished 20 days ago outlived a 14-day retention: {left:?}"
    );
    assert!(
        left.contains(&long_queued),
        "an active task is never pruned"
    );
    assert!(
        left.contains(&provisioned[0].id),
        "a task finished just now is kept"
    );
}

/// Issue #44: the flight recorder and `stead replay`, on the in-memory
/// ports. A crash loop recorded pass by pass replays with the same
/// decisions; a recording edited to break a rule is caught at its step.
mod flight {
    use super::*;
    use std::sync::Mutex;
    use stead::core::record::RecordedPass;
    use stead::engine::flight::{FlightRecorder, FlightSink, NotRecorded};
    use stead::engine::replay::{read_line, replay, Diverged};

    #[derive(Default)]
    struct Lines(Mutex<Vec<String>>);

    impl FlightSink for Lines {
        fn offer(&self, _: &InstanceName, line: String) -> Result<(), NotRecorded> {
            self.0.lock().unwrap().push(line);
            Ok(())
        }
    }

    /// A container that exits after every start, through passes 30 s
    /// apart: started three times, then held back by the budget's delays
    /// (R10). Its passes as recorded.
    async fn crash_loop() -> Vec<String> {
        crash_loop_broken(None).await
    }

    /// [`crash_loop`], recorded by a daemon with `broken` armed.
    async fn crash_loop_broken(broken: Option<stead::core::broken::Mutant>) -> Vec<String> {
        let f = fixture();
        f.served("crashy", "2").await;
        let web = f.web_container("crashy").await;
        let recoverer = f.recoverer_broken("a", broken);
        let lines = Arc::new(Lines::default());
        recoverer.watch_passes(Arc::new(FlightRecorder::new(lines.clone())));
        for _ in 0..8 {
            f.runtime.with_containers(|cs| {
                cs.get_mut(&web).unwrap().status = stead::core::types::ContainerStatus::Exited;
            });
            recoverer.pass().await;
            f.clock.advance(Duration::from_secs(30));
        }
        let lines = lines.0.lock().unwrap().clone();
        lines
            .into_iter()
            .filter(|l| l.contains("\"crashy\""))
            .collect()
    }

    fn is(step: &serde_json::Value, command: &str) -> bool {
        step["command"]["Service"]["command"] == command
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_crash_loop_replays_with_the_same_decisions() {
        let lines = crash_loop().await;
        assert_eq!(lines.len(), 8, "one line per pass");
        let starts = lines.iter().filter(|l| l.contains("\"Start\"")).count();
        assert!(
            (3..8).contains(&starts),
            "started within the budget, then held back: {starts} starts"
        );
        let replayed = replay(&lines.join("\n")).unwrap();
        assert!(
            replayed.divergence.is_none(),
            "{}",
            replayed.divergence.unwrap()
        );
        assert_eq!(replayed.passes, 8);
        assert!(
            replayed.broken.is_empty(),
            "a clean crash loop broke no rule: {:?}",
            replayed.broken
        );
        let steps: usize = lines
            .iter()
            .map(|l| read_line(1, l).unwrap().steps.len())
            .sum();
        assert_eq!(replayed.steps, steps);
        assert!(steps > 8 * 2, "{steps} steps");
    }

    #[tokio::test(start_paused = true)]
    async fn a_withdrawal_deleted_before_a_start_is_reported_at_its_step() {
        let lines = crash_loop().await;
        // The second pass that starts the container: delete its
        // withdrawal (R8: traffic goes before the workload is touched).
        let mut values: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (pass, at) = values
            .iter()
            .enumerate()
            .filter_map(|(p, v)| {
                let steps = v["steps"].as_array().unwrap();
                let start = steps.iter().position(|s| is(s, "Start"))?;
                let withdraw = steps[..start].iter().rposition(|s| is(s, "Withdraw"))?;
                Some((p, withdraw))
            })
            .nth(1)
            .expect("a second pass that withdraws, then starts");
        values[pass]["steps"].as_array_mut().unwrap().remove(at);
        let edited: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let replayed = replay(&edited.join("\n")).unwrap();
        let divergence = replayed
            .divergence
            .expect("the deleted withdrawal is found");
        assert_eq!((divergence.pass, divergence.step), (pass + 1, at + 1));
        assert_eq!(replayed.passes, pass, "the passes before it replayed whole");
        // The recorded decisions, as edited, break R8 at that very step:
        // the grants checked before failing closed.
        let [broken] = &replayed.broken[..] else {
            panic!("one rule broken: {:?}", replayed.broken);
        };
        assert_eq!(broken.pass, pass + 1);
        assert_eq!(broken.step.as_ref().map(|(at, _)| *at), Some(at + 1));
        assert_eq!(broken.breach.rule, "R8", "{broken}");
        assert!(
            broken.to_string().starts_with(&format!(
                "pass {} (instance crashy), step {}: recorded `check the grants of service web",
                pass + 1,
                at + 1
            )),
            "{broken}"
        );
        // The machine still withdraws first; the recording, edited, went
        // on to the grants check before the start.
        match &divergence.what {
            Diverged::Command { recorded, decided } => {
                assert!(
                    format!("{recorded:?}").contains("CheckPolicy"),
                    "{recorded:?}"
                );
                assert!(format!("{decided:?}").contains("Withdraw"), "{decided:?}");
            }
            other => panic!("not a command: {other:?}"),
        }
        let said = divergence.to_string();
        assert!(
            said.contains(&format!("pass {} (instance crashy)", pass + 1))
                && said.contains(&format!("step {}", at + 1))
                && said.contains("recorded `check the grants of service web")
                && said.contains("the replay decided `withdraw the route of service web"),
            "{said}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_command_answer_or_memory_is_reported_where_it_bites() {
        let lines = crash_loop().await;
        let first: RecordedPass = read_line(1, &lines[0]).unwrap();
        let start = first
            .steps
            .iter()
            .position(|s| format!("{:?}", s.command).contains("command: Start"))
            .unwrap();
        // A recorded start written as a stop: found at that very step.
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        value["steps"][start]["command"]["Service"]["command"] =
            serde_json::json!({"Stop": {"grace": {"secs": 10, "nanos": 0}}});
        value["steps"][start]["answer"] = serde_json::json!({"Service": {"Stopped": {"Ok": null}}});
        let divergence = replay(&value.to_string()).unwrap().divergence.unwrap();
        assert_eq!(
            (divergence.pass, divergence.step),
            (1, start + 1),
            "{divergence}"
        );
        assert!(
            divergence
                .to_string()
                .contains("recorded `stop (grace 10s) of service web"),
            "{divergence}"
        );
        // The first inspection answered "running": the machine withdraws
        // nothing, and parts from the recording at the next step.
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        let seen = &mut value["steps"][0]["answer"]["Service"]["Inspected"]["Ok"];
        assert_eq!(seen["status"], "Exited");
        seen["status"] = serde_json::json!("Running");
        seen["exit"] = serde_json::Value::Null;
        let divergence = replay(&value.to_string()).unwrap().divergence.unwrap();
        assert_eq!((divergence.pass, divergence.step), (1, 2), "{divergence}");
        assert!(
            matches!(divergence.what, Diverged::Command { .. }),
            "{divergence}"
        );
        // A start recorded as refused: the machine asks the same, but
        // charges the budget otherwise, so the memory it leaves differs.
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        value["steps"][start]["answer"] =
            serde_json::json!({"Service": {"Started": {"Err": {"Refused": "no such image"}}}});
        let divergence = replay(&value.to_string()).unwrap().divergence.unwrap();
        assert_eq!(divergence.pass, 1);
        // The memory left, edited: the same steps, another memory.
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        value["after"] =
            serde_json::to_value(stead::core::memory::InstanceMemory::default()).unwrap();
        let divergence = replay(&value.to_string()).unwrap().divergence.unwrap();
        assert!(
            matches!(divergence.what, Diverged::Memory { .. }),
            "{divergence}"
        );
        assert_eq!(divergence.step, first.steps.len() + 1);
    }

    /// A daemon whose rule was broken (the mutation exercise's switch,
    /// which a recording never carries): its recording is judged at the
    /// step that broke the rule. The replay, running the rules unbroken,
    /// parts from it where the decisions first differ: at that step (a
    /// start without a withdrawal) or before it (the probe skipped, then
    /// the publication that breaks S2).
    #[tokio::test(start_paused = true)]
    async fn a_recording_of_a_broken_rule_names_the_rule_at_its_step() {
        use stead::core::broken::Mutant;
        for (mutant, rule, ahead) in [
            (Mutant::SkipWithdrawBeforeStart, "R8", 0),
            (Mutant::PublishBeforeReadiness, "S2", 3),
        ] {
            let lines = crash_loop_broken(Some(mutant)).await;
            let replayed = replay(&lines.join("\n")).unwrap();
            let broken = replayed
                .broken
                .first()
                .unwrap_or_else(|| panic!("{mutant:?}: no rule found broken"));
            assert_eq!(broken.breach.rule, rule, "{mutant:?}: {broken}");
            let divergence = replayed
                .divergence
                .unwrap_or_else(|| panic!("{mutant:?}: the replay decided the same"));
            let at = broken.step.as_ref().map(|(at, _)| *at);
            assert_eq!(
                (broken.pass, at),
                (divergence.pass, Some(divergence.step + ahead)),
                "{mutant:?}: judged at {broken}, parted at {divergence}"
            );
        }
    }

    /// R1/S1 is the pass's own rule: a step edited to act on a container
    /// ACTIVE does not name is judged at that step.
    #[tokio::test(start_paused = true)]
    async fn a_step_on_a_container_active_does_not_name_breaks_r1() {
        let lines = crash_loop().await;
        let mut value: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        value["steps"][1]["command"]["Service"]["key"]["container"] = serde_json::json!("imposter");
        let replayed = replay(&format!("{}\n{}\n{value}", lines[0], lines[1])).unwrap();
        let [broken] = &replayed.broken[..] else {
            panic!("one rule broken: {:?}", replayed.broken);
        };
        assert_eq!((broken.pass, broken.breach.rule), (3, "R1/S1"), "{broken}");
        assert_eq!(broken.step.as_ref().map(|(at, _)| *at), Some(2));
        assert!(broken.to_string().contains("imposter"), "{broken}");
        assert_eq!(
            replayed.passes, 2,
            "the two passes before it replayed whole"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_line_is_named_by_its_line_and_field() {
        let lines = crash_loop().await;
        let text = format!("{}\nnot json\n", lines[0]);
        let e = replay(&text).unwrap_err().to_string();
        assert!(e.starts_with("line 2: "), "{e}");
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        value.as_object_mut().unwrap().remove("after");
        let e = replay(&format!("{}\n\n{value}", lines[1]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("line 3: ") && e.contains("missing field `after`"),
            "{e}"
        );
        let mut value: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        value["steps"][0]["now"] = serde_json::json!("yesterday");
        let e = replay(&value.to_string()).unwrap_err().to_string();
        assert!(e.starts_with("line 1: steps[0].now: "), "{e}");
        let mut wrong: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        wrong["steps"][0]["answer"] = serde_json::json!({"Service": {"Started": {"Ok": null}}});
        let e = replay(&wrong.to_string()).unwrap_err().to_string();
        assert!(
            e.starts_with("line 1: steps[0].answer: ") && e.contains("does not answer"),
            "{e}"
        );
        let mut policy: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        policy["policy"]["delays"] = serde_json::json!([]);
        let e = replay(&policy.to_string()).unwrap_err().to_string();
        assert!(
            e.starts_with("line 1: policy: recovery policy: delays"),
            "{e}"
        );
        value["format"] = serde_json::json!(9);
        value["steps"][0]["now"] = serde_json::json!(lines.len());
        let e = read_line(4, &value.to_string()).unwrap_err().to_string();
        assert!(e.starts_with("line 4: steps[0].now"), "{e}");
    }
}

/// #54: the catalog's type versions are recorded by the reconciler lease
/// holder's tick only, once per definition: a standby that loaded another
/// definition writes nothing, and the leader's later ticks rewrite nothing.
/// A version changed in place is recorded beside the first definition.
#[tokio::test]
async fn only_the_lease_holder_records_type_versions_once_per_definition() {
    let f = fixture();
    assert!(f.store.type_versions("wiki").await.unwrap().is_empty());
    assert!(f.reconciler("a").tick().await.ok());
    let first = f.store.type_versions("wiki").await.unwrap();
    assert_eq!(
        first
            .iter()
            .map(|r| (r.version.as_str(), r.spec_digest.as_str()))
            .collect::<Vec<_>>(),
        [("2", f.catalog.get("wiki").unwrap().spec_digest.as_str())]
    );

    let standby = Reconciler::new(
        f.ports.clone(),
        Arc::new(catalog_file_at("3")),
        ControlConfig::default(),
        f.recoverer_of("b"),
        7,
    );
    standby.tick().await;
    assert_eq!(f.store.type_versions("wiki").await.unwrap(), first);
    assert!(f.reconciler("a").tick().await.ok());
    assert_eq!(f.store.type_versions("wiki").await.unwrap(), first);

    // The leader reloads a file that changes version 2 in place.
    let changed = Catalog::from_toml(
        &CATALOG.replace("image = \"wiki\"", "image = \"wiki-next\""),
        "catalog.toml",
        &Grants::default(),
    )
    .unwrap();
    let leader = Reconciler::new(
        f.ports.clone(),
        Arc::new(changed.clone()),
        ControlConfig::default(),
        f.recoverer_of("a"),
        7,
    );
    assert!(leader.tick().await.ok());
    let both = f.store.type_versions("wiki").await.unwrap();
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[0], first[0], "the first definition is kept as it was");
    assert_eq!(
        (both[1].version.as_str(), both[1].spec_digest.as_str()),
        ("2", changed.get("wiki").unwrap().spec_digest.as_str())
    );
}

/// #55: a failed upgrade whose retry would fall after its instance's
/// window closed used to park in the queue until the next opening,
/// holding its instance's task slot and one of `max_in_flight`'s, so
/// every other upgrade of the fleet waited behind it. The task now ends
/// (deferred: no halt, it had attempts left), holding nothing, and says
/// when the upgrade comes back.
#[tokio::test]
async fn an_upgrade_whose_retry_falls_outside_its_window_ends_instead_of_parking() {
    let f = fixture();
    // The fixture's clock reads 08:00:00 UTC; the window is one minute.
    let instance = f
        .store
        .create_instance(
            &NewInstance {
                domains: Vec::new(),
                spec_digest: None,
                parameters: Default::default(),
                name: InstanceName::new("wiki1"),
                team: "t".into(),
                service_type: "wiki".into(),
                version: "1".into(),
                expires_at: None,
                maintenance_window: Some("daily 08:00-08:01".into()),
            },
            f.clock.now(),
        )
        .await
        .unwrap();
    f.enqueue(instance.id, TaskKind::Provision).await;
    let (_, end) = f.worker_with(f.catalog_at("1")).work_once().await.unwrap();
    assert_eq!(end, TaskEnd::Done);
    f.recoverer().pass().await;

    f.enqueue(instance.id, TaskKind::Upgrade).await;
    f.script
        .fail(Op::Create, "", Fault::Fail("registry unreachable".into()));
    // At 08:00:55 the backoff (10 s) ends after the window closed.
    f.clock.advance(Duration::from_secs(55));
    let end = f.worker().work_once().await.unwrap().1;
    let next_opening: Timestamp = "2027-01-16T08:00:00Z".parse().unwrap();
    assert!(
        matches!(&end, TaskEnd::Deferred(e, at) if e.to_string().contains("registry unreachable") && *at == next_opening),
        "{end:?}"
    );
    let tasks = f.store.all_tasks();
    let upgrade = tasks
        .iter()
        .find(|t| t.kind == TaskKind::Upgrade)
        .expect("the upgrade task");
    assert_eq!(
        upgrade.state,
        TaskState::Failed,
        "ended, not parked in the queue"
    );
    assert!(
        upgrade
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("queued again when the window next opens")),
        "{:?}",
        upgrade.last_error
    );
    let rollouts = f.store.rollouts().await.unwrap();
    assert_ne!(
        rollouts.get("wiki"),
        Some(&RolloutState::Halted),
        "attempts were left: no halt"
    );
}
