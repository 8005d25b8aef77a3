//! Public host names (#54) through the real engine against the in-memory
//! ports: the recovery pass publishes a service with only the hosts the
//! store reserved for its instance, and a host stays with its holder while
//! the holder's route is withdrawn, until the holder is deleted.

use std::sync::Arc;
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::fleet::{InstanceState, NewTask, TaskKind};
use stead::core::grants::Grants;
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::core::types::{InstanceName, ServiceKey, ServiceName, Timestamp};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{domain_table, InstanceLocks, Recoverer};
use stead::engine::worker::{TaskEnd, Worker, WorkerConfig};
use stead::engine::Ports;
use stead::ports::{Clock, NewInstance, Store};
use stead_testkit::ports::{
    Hooks, ManualClock, MemoryNotifier, MemoryPolicy, MemoryProbe, MemoryProvisioner,
    MemoryRuntime, MemoryTraffic,
};
use stead_testkit::store::MemoryStore;

/// A literal name every instance of the type claims, and one of each
/// instance's own.
const CATALOG: &str = r#"
[types.shop]
version = "1"

[[types.shop.services]]
name = "web"
image = "shop"
ports = [8080]
domains = ["shop.example.com", "{instance}.example.com"]
tenant_domains = true

[types.shop.services.readiness]
kind = "none"
"#;

struct Fixture {
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    traffic: Arc<MemoryTraffic>,
    ports: Ports,
    catalog: Arc<Catalog>,
    locks: Arc<InstanceLocks>,
    recoverer: Arc<Recoverer>,
}

fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(
        Timestamp::from_second(1_800_000_000).unwrap(),
    ));
    let hooks = Hooks::default();
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), hooks.clone()));
    let traffic = Arc::new(MemoryTraffic::new(hooks.clone()));
    let store = Arc::new(MemoryStore::new().with_clock(clock.clone()));
    let ports = Ports {
        clock: clock.clone(),
        runtime: runtime.clone(),
        traffic: traffic.clone(),
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime, hooks.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: Arc::new(MemoryProvisioner::new("stead", hooks.clone())),
        notifier: Arc::new(MemoryNotifier::new(hooks)),
    };
    let catalog =
        Arc::new(Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap());
    let locks = Arc::new(InstanceLocks::new(store.clone()));
    let policy = RecoveryPolicy {
        instance_deadline: Duration::from_millis(300),
        ..Default::default()
    };
    let ttl = reconciler_lease_ttl(
        ControlConfig::default().tick_interval,
        policy.instance_deadline,
    );
    let recoverer = Arc::new(Recoverer::new(
        ports.clone(),
        policy,
        Default::default(),
        locks.clone(),
        "a/recovery".into(),
        Arc::new(LeaseGuard::new("a".into(), ttl, LEASE_MARGIN)),
    ));
    recoverer.set_domains(domain_table(&catalog));
    Fixture {
        clock,
        store,
        traffic,
        ports,
        catalog,
        locks,
        recoverer,
    }
}

impl Fixture {
    /// Creates and provisions `name`, then runs a pass.
    async fn served(&self, name: &str) -> i64 {
        self.served_with(name, &[]).await
    }

    /// [`Self::served`], given host names at create as `--domain` gives
    /// them (unchecked here, as two creates racing for one name pass the
    /// command's check).
    async fn served_with(&self, name: &str, given: &[&str]) -> i64 {
        let now = self.clock.now();
        let instance = self
            .store
            .create_instance(
                &NewInstance {
                    domains: given.iter().map(|d| (*d).to_owned()).collect(),
                    spec_digest: None,
                    parameters: Default::default(),
                    name: InstanceName::new(name),
                    team: "t".into(),
                    service_type: "shop".into(),
                    version: "1".into(),
                    expires_at: None,
                    maintenance_window: None,
                },
                now,
            )
            .await
            .unwrap();
        let task = NewTask {
            kind: TaskKind::Provision,
            instance: instance.id,
            run_after: now,
            reason: "test".into(),
            traceparent: None,
        };
        self.store.enqueue(&task, now, None).await.unwrap();
        let worker = Worker::new(
            self.ports.clone(),
            self.catalog.clone(),
            WorkerConfig {
                id: "w1".into(),
                lease: Duration::from_secs(300),
                retry: Default::default(),
                idle_poll: Duration::from_millis(10),
                stop_grace_default: Duration::from_secs(1),
                broken: None,
            },
            self.locks.clone(),
        );
        let (_, end) = worker.work_once().await.expect("a task");
        assert_eq!(end, TaskEnd::Done);
        self.recoverer.pass().await;
        instance.id
    }

    /// The public hosts `instance`'s web route carries; `None`: no route.
    fn hosts_of(&self, instance: &str) -> Option<Vec<String>> {
        let key = ServiceKey {
            instance: InstanceName::new(instance),
            service: ServiceName::new("web"),
        };
        self.traffic
            .routes()
            .get(&key)
            .map(|r| r.public_hosts.clone())
    }

    async fn delete(&self, id: i64) {
        let now = self.clock.now();
        let task = NewTask {
            kind: TaskKind::Deprovision,
            instance: id,
            run_after: now,
            reason: "test".into(),
            traceparent: None,
        };
        self.store
            .expire_instance(id, InstanceState::Ready, &task, now, None)
            .await
            .unwrap()
            .expect("deletion starts");
        assert!(self
            .store
            .set_instance_state(id, InstanceState::Deleting, InstanceState::Deleted, now)
            .await
            .unwrap());
    }
}

fn hosts(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|h| (*h).to_owned()).collect())
}

#[tokio::test]
async fn a_host_stays_with_its_stopped_holder_and_goes_to_the_next_publication_once_it_is_deleted()
{
    let f = fixture();
    let holder = f.served("alpha").await;
    assert_eq!(
        f.hosts_of("alpha"),
        hosts(&["shop.example.com", "alpha.example.com"])
    );
    // Stopped: its route is withdrawn, its host stays reserved.
    f.store
        .set_instance_stopped(holder, true, f.clock.now())
        .await
        .unwrap();
    f.recoverer.pass().await;
    assert_eq!(f.hosts_of("alpha"), None, "withdrawn");
    f.served("beta").await;
    assert_eq!(
        f.hosts_of("beta"),
        hosts(&["beta.example.com"]),
        "published without the host alpha holds"
    );
    let reserved = f.store.host_reservations().await.unwrap();
    let holders: Vec<(&str, &str)> = reserved
        .iter()
        .map(|r| (r.host.as_str(), r.instance.as_str()))
        .collect();
    assert_eq!(
        holders,
        vec![
            ("alpha.example.com", "alpha"),
            ("beta.example.com", "beta"),
            ("shop.example.com", "alpha"),
        ]
    );
    // Deleted: the next publication of beta (here, after the proxy lost
    // its routes) takes the host.
    f.delete(holder).await;
    f.traffic.lose_everything();
    f.recoverer.pass().await;
    assert_eq!(
        f.hosts_of("beta"),
        hosts(&["shop.example.com", "beta.example.com"])
    );
}

#[tokio::test]
async fn a_name_given_at_create_is_published_and_reserved_like_the_catalogs() {
    let f = fixture();
    f.served_with("alpha", &["alpha.a.example"]).await;
    assert_eq!(
        f.hosts_of("alpha"),
        hosts(&["shop.example.com", "alpha.example.com", "alpha.a.example"])
    );
    // A second instance given the same name (two creates raced past the
    // command's check) is served without it: alpha holds it.
    f.served_with("beta", &["alpha.a.example", "beta.a.example"])
        .await;
    assert_eq!(
        f.hosts_of("beta"),
        hosts(&["beta.example.com", "beta.a.example"])
    );
    let holder = f
        .store
        .host_reservations()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.host == "alpha.a.example")
        .map(|r| r.instance.to_string());
    assert_eq!(holder.as_deref(), Some("alpha"));
}
