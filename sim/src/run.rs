//! One simulated run: set the world up, run the safety phase with faults,
//! then the liveness phase without, and report.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use stead::core::catalog::{Catalog, CatalogEntry};
use stead::core::fleet::{InstanceState, RolloutState, TaskKind, TaskRetryPolicy};
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::core::spec::{Healthcheck, ReadinessProbe, ServiceSpec};
use stead::core::types::{ActiveService, ContainerStatus, InhibitionReason, ServiceKey, Timestamp};
use stead::core::window::Window;
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::tick::Reconciler;
use stead::engine::worker::{Worker, WorkerConfig};
use stead::engine::{Ports, SystemClock};
use stead::ports::memory::{
    Hooks, MemoryNotifier, MemoryPolicy, MemoryProbe, MemoryProvisioner, MemoryRuntime,
    MemoryTraffic,
};
use stead::ports::{Clock, CreateContainer, NewInstance, Provisioner, Runtime, Store};
use stead::store::memory::MemoryStore;

use crate::checker::{ladder_cap, Checker};
use crate::world::{
    instance_name, service_name, Actors, FaultCounts, FaultMix, SimService, SwarmFaults,
    SERVICE_TYPE,
};

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub instances: usize,
    pub services_per_instance: usize,
    /// Simulated length of the safety phase.
    pub safety: Duration,
    pub tick: Duration,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            instances: 6,
            services_per_instance: 2,
            safety: Duration::from_secs(6 * 3600),
            tick: Duration::from_secs(60),
        }
    }
}

/// What one run found.
#[derive(Clone, Debug, Default)]
pub struct SimOutcome {
    pub seed: u64,
    pub violations: Vec<String>,
    /// The last effects before the end (or the violation).
    pub trace: Vec<String>,
    pub trace_hash: u64,
    pub simulated: Duration,
    pub effects: u64,
    pub passes: u64,
    pub checks: BTreeMap<&'static str, u64>,
    pub faults: BTreeMap<&'static str, u64>,
}

/// Runs one seed in its own madsim runtime.
pub fn run_seed(cfg: &SimConfig) -> SimOutcome {
    let runtime =
        madsim::runtime::Runtime::with_seed_and_config(cfg.seed, madsim::Config::default());
    let cfg = cfg.clone();
    runtime.block_on(simulate(cfg))
}

async fn simulate(cfg: SimConfig) -> SimOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mix = FaultMix::draw(&mut rng);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let policy = RecoveryPolicy::default();
    let checker = Arc::new(Checker::new(clock.clone(), policy.clone()));
    let counts = Arc::new(FaultCounts::default());
    let faults = Arc::new(SwarmFaults::new(mix.clone(), rng.random(), counts.clone()));
    let hooks = Hooks {
        faults: faults.clone(),
        observer: checker.clone(),
    };
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), hooks.clone()));
    let _ = faults.checker.set(checker.clone());
    let store = Arc::new(MemoryStore::observed(checker.clone()));
    let traffic = Arc::new(MemoryTraffic::new(hooks.clone()));
    let provisioner = Arc::new(MemoryProvisioner::new("stead", hooks.clone()));
    let ports = Ports {
        clock: clock.clone(),
        runtime: runtime.clone(),
        traffic,
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime.clone(), hooks.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: provisioner.clone(),
        notifier: Arc::new(MemoryNotifier::new(hooks.clone())),
    };
    let locks = Arc::new(InstanceLocks::new(store.clone()));
    let actors = Arc::new(Actors {
        rng: Mutex::new(ChaCha8Rng::seed_from_u64(rng.random())),
        mix: mix.clone(),
        runtime: runtime.clone(),
        provisioner: provisioner.clone(),
        store: store.clone(),
        clock: clock.clone(),
        checker: checker.clone(),
        services: Mutex::new(Vec::new()),
        locks: locks.clone(),
        counts: counts.clone(),
        chaos: true.into(),
        deploys: 0.into(),
        catalog_version: 1.into(),
        created: 0.into(),
    });
    faults.enabled.store(false, Ordering::Relaxed);
    setup(
        &cfg,
        &mut rng,
        &actors,
        store.as_ref(),
        runtime.as_ref(),
        provisioner.as_ref(),
    )
    .await;
    faults.enabled.store(true, Ordering::Relaxed);

    // The workload and the operators run beside the daemon.
    let world = actors.clone();
    let operator_p = mix.operator;
    let mut world_rng = ChaCha8Rng::seed_from_u64(rng.random());
    let _workload = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            world.workload_step();
            if world.chaos.load(Ordering::Relaxed) && world_rng.random_bool(operator_p / 4.0) {
                // Operators' mutations are bounded like the engine's: a
                // hung runtime call must not hold an instance lock forever.
                let _ = tokio::time::timeout(Duration::from_secs(30), world.operator_step()).await;
            }
        }
    });

    let mut outcome = SimOutcome {
        seed: cfg.seed,
        ..Default::default()
    };
    let start = clock.now();
    let control = ControlConfig::default();
    let daemon_seed: u64 = rng.random();
    let mut catalog = Arc::new(sim_catalog(&actors, 1, false));
    let new_daemon = |catalog: &Arc<Catalog>| {
        let lease = Arc::new(LeaseGuard::new(
            "sim#1".into(),
            reconciler_lease_ttl(control.tick_interval, policy.instance_deadline),
            LEASE_MARGIN,
        ));
        let recoverer = Arc::new(Recoverer::new(
            ports.clone(),
            policy.clone(),
            Default::default(),
            locks.clone(),
            "sim#1/recovery".into(),
            lease,
        ));
        Reconciler::new(
            ports.clone(),
            catalog.clone(),
            control.clone(),
            recoverer,
            daemon_seed,
        )
    };
    let new_worker = |catalog: &Arc<Catalog>| {
        Worker::new(
            ports.clone(),
            catalog.clone(),
            WorkerConfig {
                id: "sim-worker".into(),
                lease: control.lease,
                retry: TaskRetryPolicy::default(),
                idle_poll: Duration::from_secs(1),
                stop_grace_default: policy.stop_grace_default,
            },
            locks.clone(),
        )
    };
    let mut worker = new_worker(&catalog);
    let mut daemon: Option<Reconciler> = None;
    let safety_ticks = cfg.safety.as_secs() / cfg.tick.as_secs();
    for _ in 0..safety_ticks {
        let outage = rng.random_bool(mix.store_outage);
        store.set_unavailable(outage);
        if outage {
            counts.bump("store outage");
        }
        let kill_at = rng
            .random_bool(mix.daemon_kill)
            .then(|| Duration::from_millis(rng.random_range(0..cfg.tick.as_millis() as u64)));
        // A bumped catalog is rolled out as operators do: the daemon and
        // the workers restart with the new file (memory lost, R17).
        let version = actors.catalog_version.load(Ordering::Relaxed);
        if catalog_version(&catalog) != version {
            let security = rng.random_bool(0.2);
            catalog = Arc::new(sim_catalog(&actors, version, security));
            worker = new_worker(&catalog);
            if daemon.take().is_some() {
                checker.daemon_restarted();
            }
        }
        let reconciler = daemon.get_or_insert_with(|| new_daemon(&catalog));
        let killed = match kill_at {
            None => {
                reconciler.tick().await;
                false
            }
            Some(at) => {
                tokio::select! {
                    _ = reconciler.tick() => false,
                    _ = tokio::time::sleep(at) => true,
                }
            }
        };
        outcome.passes += 1;
        store.set_unavailable(false);
        if killed {
            counts.bump("daemon killed");
            daemon = None;
            checker.daemon_restarted();
        }
        check_queue(&checker, store.as_ref(), &control, &catalog).await;
        let worker_kill = rng
            .random_bool(mix.daemon_kill)
            .then(|| Duration::from_millis(rng.random_range(0..5_000)));
        run_workers(&checker, &worker, worker_kill, &counts).await;
        actors.forget_retired();
        if !checker.violations().is_empty() {
            break;
        }
        tokio::time::sleep(cfg.tick).await;
    }

    // Liveness: faults stop, workloads behave; everything must converge
    // within the budget's cap (and a lease, for tasks of killed workers)
    // plus a few ticks.
    actors.chaos.store(false, Ordering::Relaxed);
    faults.enabled.store(false, Ordering::Relaxed);
    let liveness = ladder_cap(&policy) + control.lease + cfg.tick * 4;
    let faults_stopped = clock.now();
    let reconciler = daemon.get_or_insert_with(|| new_daemon(&catalog));
    let ticks = liveness.as_secs() / cfg.tick.as_secs();
    if checker.violations().is_empty() {
        for _ in 0..ticks {
            reconciler.tick().await;
            outcome.passes += 1;
            check_queue(&checker, store.as_ref(), &control, &catalog).await;
            run_workers(&checker, &worker, None, &counts).await;
            actors.forget_retired();
            tokio::time::sleep(cfg.tick).await;
        }
        reconciler.tick().await;
        check_liveness(
            &checker,
            store.as_ref(),
            runtime.as_ref(),
            provisioner.as_ref(),
            faults_stopped,
        )
        .await;
    }

    outcome.violations = checker.violations();
    outcome.trace = checker.trace();
    outcome.trace_hash = checker.trace_hash();
    outcome.effects = checker.effects();
    outcome.checks = checker.checks();
    outcome.faults = counts.counts.lock().expect("poisoned").clone();
    outcome.simulated = clock.now().duration_since(start).unsigned_abs();
    outcome
}

async fn setup(
    cfg: &SimConfig,
    rng: &mut ChaCha8Rng,
    actors: &Actors,
    store: &MemoryStore,
    runtime: &MemoryRuntime,
    provisioner: &MemoryProvisioner,
) {
    let now = actors.clock.now();
    for i in 0..cfg.instances {
        // Some instances expire during the safety phase (C7).
        let expires_at = rng.random_bool(0.3).then(|| {
            let after = Duration::from_secs(rng.random_range(600..cfg.safety.as_secs().max(601)));
            stead::core::fleet::add(now, after)
        });
        let name = instance_name(i);
        store
            .create_instance(
                &NewInstance {
                    name: name.clone(),
                    team: "sim".into(),
                    service_type: SERVICE_TYPE.into(),
                    version: "1".into(),
                    expires_at,
                    maintenance_window: WINDOWS[i % WINDOWS.len()].map(str::to_owned),
                },
                now,
            )
            .await
            .expect("setup: create instance");
        let row = store
            .instance(&name)
            .await
            .expect("setup")
            .expect("created");
        store
            .set_instance_state(row.id, row.state, InstanceState::Ready, now)
            .await
            .expect("setup: ready");
        provisioner
            .install_or_upgrade(name.as_str(), "1")
            .await
            .expect("setup: install");
        for j in 0..cfg.services_per_instance {
            let service = service_name(j);
            let key = ServiceKey {
                instance: name.clone(),
                service: service.clone(),
            };
            let behaviour = Actors::draw_behaviour(rng);
            let spec = ServiceSpec {
                name: service.clone(),
                image: "sim".into(),
                command: vec![],
                ports: vec![8080],
                healthcheck: Some(Healthcheck {
                    command: vec!["true".into()],
                    interval: Duration::from_secs(5),
                    timeout: Duration::from_secs(1),
                    retries: 3,
                }),
                readiness: ReadinessProbe::None,
                stop_grace: Duration::from_secs(5),
            };
            let request = CreateContainer {
                instance: name.clone(),
                spec: spec.clone(),
                revision: "r0".into(),
            };
            let id = MemoryRuntime::id_of(&request).expect("setup: a valid container name");
            actors
                .checker
                .truth(|t| t.operator_created.insert(id.clone()));
            let id = runtime.create(&request).await.expect("setup: create");
            store
                .save_active_service(
                    &name,
                    &service,
                    &ActiveService {
                        container: id.clone(),
                        effective_revision: "r0".into(),
                        binds: Default::default(),
                        stop_grace: Some(Duration::from_secs(5)),
                        verified_started_at: None,
                    },
                )
                .await
                .expect("setup: save ACTIVE");
            actors.services.lock().expect("poisoned").push(SimService {
                key,
                behaviour,
                spec,
            });
        }
    }
}

/// L1, L3, L4 after the liveness phase.
async fn check_liveness(
    checker: &Checker,
    store: &MemoryStore,
    runtime: &MemoryRuntime,
    provisioner: &MemoryProvisioner,
    faults_stopped: Timestamp,
) {
    let truth = checker.truth_snapshot();
    let routes = checker.routes();
    let mut failures = Vec::new();
    for (key, id) in &truth.active {
        if truth.deleting.contains(&key.instance) {
            continue;
        }
        let stopped = truth.stopped.contains(&key.instance);
        let inhibited = truth.inhibited.contains(id);
        let Some(c) = runtime.container(id) else {
            continue;
        };
        if stopped {
            if c.status == ContainerStatus::Running || routes.contains_key(key) {
                failures.push(format!("L1: stopped {key:?} still running or routed"));
            }
            continue;
        }
        if inhibited {
            continue;
        }
        let served = c.status == ContainerStatus::Running
            && routes
                .get(key)
                .is_some_and(|r| &r.container == id && r.verified_started_at == c.started_at);
        if !served {
            failures.push(format!(
                "L1: {key:?} on {id} not running, verified and published: {c:?}, route {:?}",
                routes.get(key)
            ));
        }
    }
    // L2 and L5: instances expired by the time the faults stopped reached
    // deleted (one expiring during the liveness phase may still be on its
    // way); every ready instance has its release.
    let releases = provisioner.release_names();
    if let Ok(rows) = store.list_instances().await {
        for i in &rows.rows {
            let expired = i.expires_at.is_some_and(|at| at <= faults_stopped);
            if expired && i.state != InstanceState::Deleted {
                let tasks: Vec<String> = store
                    .all_tasks()
                    .iter()
                    .filter(|t| t.instance == i.id)
                    .map(|t| format!("{:?} {:?} {:?}", t.kind, t.state, t.last_error))
                    .collect();
                failures.push(format!(
                    "L2: expired {} is {}, not deleted; its tasks: {tasks:?}",
                    i.name, i.state
                ));
            }
            if i.state == InstanceState::Ready && !releases.contains(&i.name.to_string()) {
                failures.push(format!(
                    "L5: release of ready {} never reprovisioned",
                    i.name
                ));
            }
        }
    }
    for key in checker.withdraw_failed() {
        failures.push(format!(
            "L4: withdrawal of {key:?} never retried to success"
        ));
    }
    let instances: Vec<_> = truth.active.keys().map(|k| k.instance.clone()).collect();
    for instance in instances {
        if let Ok(inhibitions) = store.load_inhibitions(&instance).await {
            for marker in inhibitions
                .iter()
                .filter(|i| i.reason == InhibitionReason::RetirementPending)
            {
                // A marker waits for its successor to serve (R15); a held
                // successor never does, so its predecessor rightly stays.
                let key = ServiceKey {
                    instance: instance.clone(),
                    service: marker.service.clone(),
                };
                if truth
                    .active
                    .get(&key)
                    .is_some_and(|succ| truth.inhibited.contains(succ))
                {
                    continue;
                }
                failures.push(format!("L3: marker on {} never resolved", marker.container));
            }
        }
    }
    failures.sort();
    failures.dedup();
    for f in failures {
        checker.record_violation(f);
    }
}

/// The catalog of the simulated fleet: one service type at `version`
/// (instances start at 1; operators bump it, and version drift upgrades
/// them), sometimes a security release that ignores windows.
fn sim_catalog(actors: &Actors, version: u32, security: bool) -> Catalog {
    let services = actors.services.lock().expect("poisoned");
    let mut specs: Vec<ServiceSpec> = Vec::new();
    for s in services.iter() {
        if !specs.iter().any(|x| x.name == s.spec.name) {
            specs.push(s.spec.clone());
        }
    }
    Catalog::from_entries([CatalogEntry {
        service_type: SERVICE_TYPE.into(),
        version: version.to_string(),
        security,
        rollout: RolloutState::Active,
        services: specs,
    }])
}

fn catalog_version(catalog: &Catalog) -> u32 {
    catalog
        .get(SERVICE_TYPE)
        .and_then(|e| e.version.parse().ok())
        .expect("the sim catalog has a numeric version")
}

/// S9 and S10 on the queue after every tick.
async fn check_queue(
    checker: &Checker,
    store: &MemoryStore,
    control: &ControlConfig,
    catalog: &Catalog,
) {
    let tasks = store.all_tasks();
    let mut active = std::collections::BTreeSet::new();
    let mut upgrades = 0u32;
    let mut dup = None;
    for t in tasks.iter().filter(|t| t.state.is_active()) {
        if !active.insert((t.instance, t.kind)) {
            dup = Some((t.instance, t.kind));
        }
        if t.kind == TaskKind::Upgrade {
            upgrades += 1;
        }
    }
    checker.check_external(
        "S9 one active task per instance and kind",
        dup.is_none(),
        || format!("two active tasks {dup:?}"),
    );
    checker.check_external(
        "S9 upgrades in flight within the limit",
        upgrades <= control.max_in_flight,
        || format!("{upgrades} upgrades in flight"),
    );
    // Upgrades enqueued since the last look: never while the rollout is
    // halted, and inside the instance's window unless a security release.
    let ids: Vec<i64> = tasks.iter().map(|t| t.id).collect();
    let new = checker.tasks_seen(&ids);
    let windows: BTreeMap<_, _> = store
        .list_instances()
        .await
        .map(|rows| {
            rows.rows
                .into_iter()
                .map(|i| (i.id, i.maintenance_window))
                .collect()
        })
        .unwrap_or_default();
    let security = catalog.get(SERVICE_TYPE).is_some_and(|e| e.security);
    let halted_since = checker.truth(|t| t.halted_since.get(SERVICE_TYPE).copied());
    for t in tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Upgrade && new.contains(&t.id))
    {
        let halted = halted_since.is_some_and(|since| t.created_at > since);
        checker.check_external("S9 none enqueued while halted", !halted, || {
            format!(
                "upgrade task {} enqueued at {} while halted",
                t.id, t.created_at
            )
        });
        if let Some(Some(spec)) = windows.get(&t.instance) {
            let window = Window::parse(spec).expect("the sim's windows parse");
            let inside = security || window.contains(t.run_after);
            checker.check_external("S9 upgrades run inside the window", inside, || {
                format!(
                    "upgrade task {} runs at {} outside {spec:?}",
                    t.id, t.run_after
                )
            });
        }
    }
}

/// Runs due tasks; a worker may be killed mid-task, leaving its lease to
/// expire (C6).
async fn run_workers(
    checker: &Checker,
    worker: &Worker,
    kill_at: Option<Duration>,
    counts: &FaultCounts,
) {
    checker.set_workers_running(true);
    let work = async {
        for _ in 0..WORKER_TASKS_PER_TICK_MAX {
            if worker.work_once().await.is_none() {
                break;
            }
        }
    };
    match kill_at {
        None => work.await,
        Some(at) => {
            tokio::select! {
                _ = work => {}
                _ = tokio::time::sleep(at) => counts.bump("worker killed"),
            }
        }
    }
    checker.set_workers_running(false);
}

/// Maintenance windows, assigned round-robin; `None` upgrades at once.
const WINDOWS: [Option<&str>; 4] = [
    None,
    Some("daily 02:00-03:00"),
    Some("mon-fri 22:00-02:00 Europe/Paris"),
    Some("sat,sun 01:30-04:00 America/New_York"),
];

/// Bound on tasks one simulated worker runs between two ticks.
const WORKER_TASKS_PER_TICK_MAX: usize = 32;
