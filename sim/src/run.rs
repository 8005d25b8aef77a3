//! One simulated run: set the world up, run the safety phase with faults,
//! then the liveness phase without, and report.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use stead::core::catalog::{Catalog, CatalogEntry};
use stead::core::fleet::{add, InstanceState, RolloutState, TaskKind, TaskState};
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy};
use stead::core::spec::{Healthcheck, ReadinessProbe, ServiceSpec, UpdateStrategy};
use stead::core::types::{
    ActiveService, ContainerId, ContainerStatus, InhibitionReason, InstanceName, ServiceKey,
    Timestamp,
};
use stead::core::window::Window;
use stead::engine::recovery::InstanceLocks;
use stead::engine::SystemClock;
use stead::ports::{
    Clock, CreateContainer, NewInstance, Provisioner, Runtime, RuntimeEventAction, Store,
};
use stead_testkit::ports::{
    Hooks, MemContainer, MemoryNotifier, MemoryProbe, MemoryProvisioner, MemoryRuntime,
    MemoryTraffic,
};
use stead_testkit::store::{Garbled, MemoryStore};

use crate::checker::{ladder_cap, Checker, CLOCK_TOLERANCE};
use crate::topology::{process_main, Shared, Slot, Topology};
use crate::world::{
    has_ports, helm_instance_name, instance_name, service_name, Actors, ClockFaults, FaultCounts,
    FaultMix, SimService, SwarmFaults, VersionScheme, HELM_TYPE, LEGACY_TYPE, SERVICE_TYPE,
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
            services_per_instance: 3,
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
    /// Which ways the engine's decisions went ([`crate::coverage`]).
    pub branches: crate::coverage::Branches,
}

/// Runs one seed in its own madsim runtime.
pub fn run_seed(cfg: &SimConfig) -> SimOutcome {
    let runtime =
        madsim::runtime::Runtime::with_seed_and_config(cfg.seed, madsim::Config::default());
    let cfg = cfg.clone();
    // madsim runs every node of the run on this thread: the tally sees
    // every process's counters and nothing of another run's.
    let tally = crate::coverage::Tally::default();
    let mut outcome = tally.around(|| runtime.block_on(simulate(cfg, tally.clone())));
    outcome.branches = tally.branches();
    outcome
}

async fn simulate(cfg: SimConfig, tally: crate::coverage::Tally) -> SimOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mix = FaultMix::draw(&mut rng);
    // The clock faults' own stream: the seed's other draws stay as they were.
    let mut clock_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x0c10_c4a0_5eed_0041);
    let clock_faults = ClockFaults::draw(&mut clock_rng);
    let topology = Topology::draw(rng.random());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The mutation exercise arms a rule on this thread; the core gets it
    // as data.
    let policy = RecoveryPolicy {
        broken: stead_testkit::mutants::armed_now(),
        ..RecoveryPolicy::default()
    };
    let control = ControlConfig {
        broken: stead_testkit::mutants::armed_now(),
        // One, two or three upgrades at once, a third of the seeds each
        // (from the seed, not its random stream, so every other draw of a
        // seed stays as it was): with one, a planner that ignores an
        // instance's own queued upgrade never gets a slot to show it.
        max_in_flight: 1 + (cfg.seed % 3) as u32,
        ..ControlConfig::default()
    };
    let versions = VersionScheme::of_seed(cfg.seed);
    let checker = Arc::new(Checker::new(
        clock.clone(),
        policy.clone(),
        &control,
        versions,
    ));
    let counts = Arc::new(FaultCounts::default());
    let faults = Arc::new(SwarmFaults::new(
        mix.clone(),
        rng.random(),
        counts.clone(),
        versions,
    ));
    let hooks = Hooks {
        faults: faults.clone(),
        observer: checker.clone(),
    };
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), hooks.clone()));
    // The database's clock: true time, stepped now and then (#41).
    let database_clock = Arc::new(DatabaseClock::default());
    let store = Arc::new(MemoryStore::observed(checker.clone()).with_clock(database_clock.clone()));
    checker.watch_store(store.clone());
    let _ = faults.checker.set(checker.clone());
    let _ = faults.runtime.set(Arc::downgrade(&runtime));
    let traffic = Arc::new(MemoryTraffic::new(hooks.clone()));
    let provisioner = Arc::new(MemoryProvisioner::new("foreign", hooks.clone()));
    checker.watch_provisioner(provisioner.clone());
    checker.watch_gauges(tally);
    let actors = Arc::new(Actors {
        rng: Mutex::new(ChaCha8Rng::seed_from_u64(rng.random())),
        mix: mix.clone(),
        runtime: runtime.clone(),
        provisioner: provisioner.clone(),
        store: store.clone(),
        clock: clock.clone(),
        checker: checker.clone(),
        services: Mutex::new(Vec::new()),
        // The operators are a process of their own: their own in-process
        // locks, the store's lock rows shared with everyone (T3).
        locks: Arc::new(InstanceLocks::new(store.clone())),
        counts: counts.clone(),
        chaos: true.into(),
        deploys: 0.into(),
        catalog_version: 1.into(),
        versions,
        spec_edition: 0.into(),
        bake: if cfg.seed % 2 == 0 {
            SIM_BAKE
        } else {
            Duration::ZERO
        },
        dropped: Mutex::new(None),
        created: 0.into(),
        bad_versions: faults.bad_versions.clone(),
        sick: Mutex::default(),
        volume_moved: false.into(),
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

    // The workload and the operators run beside the daemons.
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

    let shared = Arc::new(Shared {
        store: store.clone(),
        runtime: runtime.clone(),
        traffic: traffic.clone(),
        provisioner: provisioner.clone(),
        probe: Arc::new(MemoryProbe::new(runtime.clone(), hooks.clone())),
        notifier: Arc::new(MemoryNotifier::new(hooks.clone())),
        checker: checker.clone(),
        catalog: Mutex::new(Arc::new({
            let catalog = with_sources(sim_catalog(&actors, 1, false));
            checker.catalog_published(&catalog);
            catalog
        })),
        policy: policy.clone(),
        control: control.clone(),
        tick: cfg.tick,
        events: rng.random_bool(0.7),
        seed: rng.random(),
    });
    let mut processes = Processes::start(&topology, &shared, &mix, &clock_faults, &mut rng);
    // The tenants (#54) act beside the operators, through the API's
    // commands; their draws come from streams of their own.
    let tenants = Arc::new(crate::tenants::Tenants {
        actors: actors.clone(),
        shared: shared.clone(),
        store: store.clone(),
        checker: checker.clone(),
        quotas: Arc::new(crate::tenants::quotas()),
        broken: policy.broken,
        created: 0.into(),
    });
    for (i, team) in crate::tenants::TENANT_TEAMS.into_iter().enumerate() {
        let seed = cfg.seed ^ 0x7e4a_47c5_0054_0000 ^ i as u64;
        tokio::spawn(tenants.clone().run(team, seed));
    }
    // Which catalog bumps come with a hazardous file (N4): a stream of
    // its own.
    let mut hazard_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x4a2a_4d05_0054_0004);
    let _ = faults
        .process_nodes
        .set(processes.nodes.iter().map(|n| n.id()).collect());

    let mut outcome = SimOutcome {
        seed: cfg.seed,
        ..Default::default()
    };
    let start = clock.now();
    let safety_ticks = cfg.safety.as_secs() / cfg.tick.as_secs();
    let mut catalog_now = (1, 0);
    // Ticks left in which the proxy is restarted often: operators roll a
    // catalog that drops a service out with the proxy's own config, so the
    // proxy comes and goes while upgrades retire the dropped service (a
    // withdrawal refused mid-retirement, seed 6240).
    let mut proxy_restarts_left = 0u32;
    // Instance rows another tool garbles for a tick (a state stead does not
    // know): drawn from their own stream, so every other fault of a seed
    // stays what it was before this fault existed.
    let mut row_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5851_f42d_4c95_7f2d);
    // Which field another tool garbled: the state, which every listing
    // reads, or the parameters, which a recovery pass's listing does not
    // (it lists the instance, and only its load fails). Its own stream
    // too, so the garbled rows and ticks stay what they were.
    let mut field_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x2545_f491_4f6c_dd1d);
    let garble_p = if row_rng.random_bool(0.5) {
        row_rng.random_range(0.0..0.08)
    } else {
        0.0
    };
    // Twins (#41 item 3): a second process of a live one's identity, from
    // a copied `state_dir` or a cloned VM image, in half the seeds. Their
    // own stream too, so the other faults' draws stay what they were.
    let mut twin_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x7e1e_0041_0003_a11e);
    let twin_p = if twin_rng.random_bool(0.5) {
        twin_rng.random_range(0.005..0.03)
    } else {
        0.0
    };
    for _ in 0..safety_ticks {
        // A bumped catalog is rolled out as operators do: every process
        // restarts with the new file (memory lost, R17).
        let version = actors.catalog_version.load(Ordering::Relaxed);
        let edition = actors.spec_edition.load(Ordering::Relaxed);
        if (version, edition) != catalog_now {
            catalog_now = (version, edition);
            let dropped = actors.dropped.lock().expect("poisoned").clone();
            if dropped.is_some() {
                proxy_restarts_left = PROXY_RESTART_TICKS;
            }
            let security = rng.random_bool(0.2);
            // The daemons restart with the operator's file, each start
            // judging it as `stead run` does (N4).
            let catalog = crate::hazards::restart_with(
                &actors,
                &checker,
                store.as_ref(),
                sim_catalog(&actors, version, security),
                &mut hazard_rng,
                policy.broken,
            )
            .await;
            let catalog = with_sources(catalog);
            checker.catalog_bumped(version, dropped, &catalog);
            *shared.catalog.lock().expect("poisoned") = Arc::new(catalog);
            processes.adopt_pauses(&faults, &mut rng);
            processes.restart_all(&counts);
        }
        // After a bump's start: a row garbled then would hide its
        // instance from the start's judgement of the catalog (N4).
        let garbled = row_rng
            .random_bool(garble_p)
            .then(|| {
                let instances = store.all_instances();
                let live: Vec<_> = instances
                    .iter()
                    .filter(|i| i.state != InstanceState::Deleted)
                    .collect();
                (!live.is_empty()).then(|| live[row_rng.random_range(0..live.len())].id)
            })
            .flatten();
        if let Some(id) = garbled {
            let field = if field_rng.random_bool(0.5) {
                counts.bump("instance row garbled for a tick (its state)");
                Garbled::Listed
            } else {
                counts.bump("instance row garbled for a tick (its parameters)");
                Garbled::Unlisted
            };
            checker.set_rows_garbled(true);
            store.garble_instance_row(Some((id, field)));
        }
        processes.adopt_pauses(&faults, &mut rng);
        processes.inject(&mut rng, &mix, &counts);
        if twin_rng.random_bool(twin_p) {
            processes.start_twin(&mut twin_rng, &counts);
        }
        if clock_rng.random_bool(clock_faults.database_step) {
            step_database_clock(&database_clock, &checker, cfg.tick, &mut clock_rng, &counts);
        }
        let outage = rng
            .random_bool(mix.store_outage)
            .then(|| Duration::from_secs(rng.random_range(5..cfg.tick.as_secs().max(6))));
        let proxy_down_p = if proxy_restarts_left > 0 {
            proxy_restarts_left -= 1;
            PROXY_RESTART_P.max(mix.proxy_down)
        } else {
            mix.proxy_down
        };
        let proxy_down = rng
            .random_bool(proxy_down_p)
            .then(|| Duration::from_secs(rng.random_range(5..cfg.tick.as_secs().max(6))));
        if rng.random_bool(mix.proxy_loss) {
            counts.bump("proxy lost every route");
            traffic.lose_everything();
        }
        if let Some(d) = outage {
            counts.bump("store outage");
            store.set_unavailable(true);
            checker.set_store_outage(true);
            tokio::time::sleep(d).await;
            store.set_unavailable(false);
            checker.set_store_outage(false);
        }
        if let Some(d) = proxy_down {
            counts.bump("proxy down");
            faults.proxy_down.store(true, Ordering::Relaxed);
            tokio::time::sleep(d).await;
            faults.proxy_down.store(false, Ordering::Relaxed);
        }
        let spent = outage.unwrap_or_default() + proxy_down.unwrap_or_default();
        let rest = cfg.tick.saturating_sub(spent);
        // A pause lands at any instant of the tick, not only between
        // passes: a process frozen mid-pass, between checking its leases
        // and acting, is the case T2 is about.
        if rng.random_bool(mix.pause) {
            let at = Duration::from_millis(rng.random_range(0..rest.as_millis().max(1) as u64));
            tokio::time::sleep(at).await;
            processes.adopt_pauses(&faults, &mut rng);
            processes.pause_one(&mut rng, &counts);
            tokio::time::sleep(rest - at).await;
        } else {
            tokio::time::sleep(rest).await;
        }
        if garbled.is_some() {
            store.garble_instance_row(None);
            checker.set_rows_garbled(false);
        }
        processes.adopt_pauses(&faults, &mut rng);
        processes.settle(clock.now(), &counts);
        check_queue(
            &checker,
            store.as_ref(),
            &control,
            &catalog_of(&shared),
            clock.now(),
        )
        .await;
        crate::tenants::judge_quotas(&checker, &store, &tenants.quotas);
        actors.forget_retired();
        if !checker.violations().is_empty() {
            break;
        }
    }

    // Liveness: faults stop, workloads behave, every process runs again;
    // everything must converge within the budget's cap (and a lease, for
    // tasks of killed workers) plus a few ticks.
    actors.chaos.store(false, Ordering::Relaxed);
    faults.enabled.store(false, Ordering::Relaxed);
    faults.proxy_down.store(false, Ordering::Relaxed);
    store.set_unavailable(false);
    checker.set_store_outage(false);
    processes.adopt_pauses(&faults, &mut rng);
    processes.recover_all(&counts);
    let liveness = ladder_cap(&policy) + control.lease + cfg.tick * 4;
    let faults_stopped = clock.now();
    if checker.violations().is_empty() {
        // L6: the proxy forgets everything once more; within one tick (and
        // a pass) every verified route is back, with no fault in the way.
        // First a live process leads: a lease left by a process that came
        // back as a stranger expires in its own time.
        tokio::time::sleep(reconciler_lease_ttl(cfg.tick, policy.instance_deadline) + cfg.tick * 2)
            .await;
        check_stop_forgets_budget(&checker, &actors, store.as_ref(), &runtime, cfg.tick).await;
        let routed_before = traffic.routes();
        let lost_at = clock.now();
        traffic.lose_everything();
        tokio::time::sleep(cfg.tick + ROUTE_RESTORE_SLACK).await;
        check_routes_restored(
            &checker,
            &routed_before,
            lost_at,
            traffic.as_ref(),
            runtime.as_ref(),
        );
        let ticks = liveness.as_secs() / cfg.tick.as_secs();
        for _ in 0..ticks {
            tokio::time::sleep(cfg.tick).await;
            check_queue(
                &checker,
                store.as_ref(),
                &control,
                &catalog_of(&shared),
                clock.now(),
            )
            .await;
            actors.forget_retired();
        }
        tokio::time::sleep(cfg.tick).await;
        check_liveness(
            &checker,
            &actors,
            store.as_ref(),
            runtime.as_ref(),
            provisioner.as_ref(),
            faults_stopped,
            cfg.tick,
        )
        .await;
        if checker.violations().is_empty() {
            check_budget_reset(
                &checker,
                &actors,
                store.as_ref(),
                &runtime,
                &policy,
                cfg.tick,
            )
            .await;
            check_health_restart(
                &checker,
                &actors,
                store.as_ref(),
                &runtime,
                &policy,
                cfg.tick,
            )
            .await;
            let observed_within = if shared.events {
                // A crash's event brings a targeted pass at once.
                LADDER_SLACK
            } else {
                cfg.tick + LADDER_SLACK
            };
            check_ladder_on_time(
                &checker,
                &actors,
                &runtime,
                &policy,
                observed_within,
                cfg.tick,
            )
            .await;
        }
    }

    if checker.violations().is_empty() {
        crate::events::judge_log(&checker, store.as_ref(), &processes.slots).await;
    }
    outcome.violations = checker.violations();
    outcome.trace = checker.trace();
    outcome.trace_hash = checker.trace_hash();
    outcome.effects = checker.effects();
    outcome.checks = checker.checks();
    outcome.passes = checker.ticks();
    outcome.faults = counts.counts.lock().expect("poisoned").clone();
    outcome.simulated = clock.now().duration_since(start).unsigned_abs();
    outcome
}

/// The container the leader recovered most often in one streak (past
/// the free attempts) among ACTIVE's running-intent, live, uninhibited
/// ones that `up` accepts, with its service.
fn most_recovered(
    checker: &Checker,
    store: &MemoryStore,
    up: impl Fn(&ContainerId) -> bool,
) -> Option<(ServiceKey, ContainerId)> {
    let leader = store.lease_now()?.holder;
    let truth = checker.truth_snapshot();
    let service_of = |id: &ContainerId| {
        truth
            .active
            .iter()
            .find(|(_, c)| *c == id)
            .map(|(key, _)| key.clone())
    };
    let eligible =
        |id: &ContainerId| service_of(id).is_some_and(|key| truth.meant_to_run(&key, id) && up(id));
    let id = checker.most_recovered_by(&leader, eligible)?;
    Some((service_of(&id)?, id))
}

/// Whether `container` is running an execution started at or after
/// `since` (the calm-phase checks' "started again").
fn runs_an_execution_since(container: Option<&MemContainer>, since: Timestamp) -> bool {
    container.is_some_and(|c| {
        c.status == ContainerStatus::Running && c.started_at.is_some_and(|at| at >= since)
    })
}

/// L10 (R4): stopped intent forgets a service's budget. Right after the
/// faults stop, while the leader's memory still holds the crash loops of
/// the run, the instance of the container it recovered most often is
/// stopped and started again by hand: the container must be started within
/// two ticks of the start, whatever its ladder said before. A budget that
/// survives a stop (`Budget::forget` -> `()`) holds it down for minutes.
async fn check_stop_forgets_budget(
    checker: &Checker,
    actors: &Actors,
    store: &MemoryStore,
    runtime: &Arc<MemoryRuntime>,
    tick: Duration,
) {
    let Some((key, id)) = most_recovered(checker, store, |id| runtime.container(id).is_some())
    else {
        return;
    };
    if !actors.stop_or_start(&key.instance, true).await {
        return;
    }
    tokio::time::sleep(tick * 2).await;
    let started_at = runtime.next_execution();
    if !actors.stop_or_start(&key.instance, false).await {
        return;
    }
    tokio::time::sleep(tick * 2).await;
    // An upgrade that replaced the container meanwhile moves the question
    // to another generation: nothing to judge.
    if checker.truth(|t| t.active.get(&key) != Some(&id)) {
        return;
    }
    let after = runtime.container(&id);
    let started = runs_an_execution_since(after.as_ref(), started_at);
    checker.check_external(
        "L10 a stopped instance started again starts at once",
        started,
        || {
            format!(
                "{id} of {} was not started within two ticks of `instance start` at {started_at} \
             ({:?} since {:?}): a stop must forget its budget (R4)",
                key.instance,
                after.as_ref().map(|c| c.status),
                after.as_ref().and_then(|c| c.started_at)
            )
        },
    );
    actors
        .counts
        .bump("an operator stopped and started an instance");
}

/// L9 (R14): five stable minutes reset the budget. Once everything has
/// converged and stayed up a stable window (and a few ticks) with no fault,
/// the container the leader recovered most often in one streak crashes
/// once more: its budget must have been dropped, so it is started at once
/// (within a couple of ticks), not held on the ladder. A budget that never
/// resets, or resets late, is more conservative than the rule and broke no
/// other invariant: it delays this start by minutes.
async fn check_budget_reset(
    checker: &Checker,
    actors: &Actors,
    store: &MemoryStore,
    runtime: &Arc<MemoryRuntime>,
    policy: &RecoveryPolicy,
    tick: Duration,
) {
    tokio::time::sleep(policy.stable_window + tick * 3).await;
    let running = |id: &ContainerId| {
        runtime
            .container(id)
            .is_some_and(|c| c.status == ContainerStatus::Running)
    };
    let Some((_, id)) = most_recovered(checker, store, running) else {
        return;
    };
    let crashed_at = runtime.next_execution();
    runtime.with_containers(|cs| {
        if let Some(c) = cs.get_mut(&id) {
            c.status = ContainerStatus::Exited;
        }
    });
    checker.container_went_down(&id);
    runtime.emit(&id, RuntimeEventAction::Die);
    tokio::time::sleep(tick * 2).await;
    // An upgrade in a window that opened meanwhile may have replaced or
    // retired it: nothing to judge then.
    if !checker.truth(|t| t.active.values().any(|c| *c == id)) {
        return;
    }
    let after = runtime.container(&id);
    let restarted = runs_an_execution_since(after.as_ref(), crashed_at);
    checker.check_external(
        "L9 a stable generation's budget resets",
        restarted,
        || {
            format!(
                "{id} ran stable for {:?} after converging, crashed once at {crashed_at} and was \
                 not started again within two ticks ({:?} since {:?}): its budget never reset (R14)",
                policy.stable_window,
                after.as_ref().map(|c| c.status),
                after.as_ref().and_then(|c| c.started_at)
            )
        },
    );
    actors.counts.bump("a stable generation crashed once more");
}

/// L11 (R12): a container whose healthcheck keeps failing is restarted
/// at the threshold's consecutive unhealthy read, in that same pass (the
/// checker fails a read past the threshold), and so within the threshold's
/// ticks (a pass a tick, and one per health event). S12 judges that no
/// restart comes before the threshold; this, in the calm that follows the
/// run (budgets reset, no fault), that none comes later. The container
/// heals again afterwards.
async fn check_health_restart(
    checker: &Checker,
    actors: &Actors,
    store: &MemoryStore,
    runtime: &Arc<MemoryRuntime>,
    policy: &RecoveryPolicy,
    tick: Duration,
) {
    let healthy = |id: &ContainerId| {
        runtime.container(id).is_some_and(|c| {
            c.status == ContainerStatus::Running && c.health == stead::core::types::Health::Healthy
        })
    };
    // Any healthy container will do; the one recovered most often first,
    // else the first ACTIVE one.
    let id = most_recovered(checker, store, healthy)
        .map(|(_, id)| id)
        .or_else(|| {
            let truth = checker.truth_snapshot();
            truth
                .active
                .iter()
                .filter(|(key, id)| truth.meant_to_run(key, id) && healthy(id))
                .map(|(_, id)| id.clone())
                .next()
        });
    let Some(id) = id else {
        return;
    };
    let Some(before) = runtime.container(&id).and_then(|c| c.started_at) else {
        return;
    };
    checker.watch_health(&id, true);
    actors.sick.lock().expect("poisoned").insert(id.clone());
    let within = tick * policy.unhealthy_threshold + ROUTE_RESTORE_SLACK;
    tokio::time::sleep(within).await;
    actors.sick.lock().expect("poisoned").remove(&id);
    checker.watch_health(&id, false);
    // An upgrade in a window that opened meanwhile may have replaced or
    // retired it: nothing to judge then.
    if !checker.truth(|t| t.active.values().any(|c| *c == id)) {
        return;
    }
    let after = runtime.container(&id);
    let restarted = after
        .as_ref()
        .and_then(|c| c.started_at)
        .is_some_and(|at| at > before);
    checker.check_external(
        "L11 an unhealthy container is restarted at the threshold",
        restarted,
        || {
            format!(
                "{id} unhealthy for {within:?} (threshold {} reads, a pass a tick) and not \
                 restarted: still on the execution started at {before}",
                policy.unhealthy_threshold
            )
        },
    );
    actors
        .counts
        .bump("a container's healthcheck failed on purpose");
}

/// L12 (R10): the crash-loop ladder is climbed on time, not later. In the
/// calm after L11, a container that has run stable for longer than the
/// stable window (so its budget was reset) crashes again each time it is
/// started, `free_attempts + 2` times. The first `free_attempts` restarts
/// must come within `observed_within` of the crash; each later one within
/// that plus the ladder's next delay: the budget charges a crash when the
/// engine observes it (at once on its event, else at the next tick) and the
/// wake-up queue brings the instance back the moment the delay ends.
/// S6 judges that no restart comes earlier; this, that none comes later: a
/// ladder that waits longer than the rule, or an attempt charged twice,
/// broke no other invariant.
async fn check_ladder_on_time(
    checker: &Checker,
    actors: &Actors,
    runtime: &Arc<MemoryRuntime>,
    policy: &RecoveryPolicy,
    observed_within: Duration,
    tick: Duration,
) {
    let now = actors.clock.now();
    // Stable for the window after its start, with room for the readiness
    // and verification that start the stable streak.
    let settled = |c: &MemContainer| {
        c.status == ContainerStatus::Running
            && c.health == stead::core::types::Health::Healthy
            && c.started_at
                .is_some_and(|at| add(at, policy.stable_window + STABLE_STREAK_SLACK) <= now)
    };
    let truth = checker.truth_snapshot();
    let Some((key, id)) = truth
        .active
        .iter()
        .find(|(key, id)| {
            truth.meant_to_run(key, id)
                && !truth.markers.contains_key(*id)
                && runtime.container(id).is_some_and(|c| settled(&c))
        })
        .map(|(key, id)| (key.clone(), id.clone()))
    else {
        return;
    };
    let free = policy.free_attempts as usize;
    for crash in 1..=free + 2 {
        let delay = crash.checked_sub(free + 1).map_or(Duration::ZERO, |rung| {
            policy.delays[rung.min(policy.delays.len() - 1)]
        });
        let since = runtime.next_execution();
        let crashed_at = actors.clock.now();
        let crashed = runtime.with_containers(|cs| match cs.get_mut(&id) {
            Some(c) if c.status == ContainerStatus::Running => {
                c.status = ContainerStatus::Exited;
                true
            }
            _ => false,
        });
        if !crashed {
            return;
        }
        checker.container_went_down(&id);
        runtime.emit(&id, RuntimeEventAction::Die);
        let limit = delay + observed_within + CLOCK_TOLERANCE;
        let mut waited = Duration::ZERO;
        let restarted = loop {
            if runs_an_execution_since(runtime.container(&id).as_ref(), since) {
                break true;
            }
            if waited >= limit {
                break false;
            }
            tokio::time::sleep(LADDER_POLL).await;
            waited += LADDER_POLL;
        };
        // An upgrade in a window that opened meanwhile may have replaced
        // or retired it: nothing to judge then.
        if checker.truth(|t| t.active.get(&key) != Some(&id)) {
            return;
        }
        checker.check_external(
            "L12 the crash-loop ladder is climbed on time",
            restarted,
            || {
                format!(
                "{id} crashed for the {crash}th time in a row at {crashed_at} and was not started \
                 again within {limit:?} (the ladder's delay for that crash is {delay:?}, \
                 {free} attempts free): the budget waits longer than the rule (R10)"
            )
            },
        );
        if !restarted {
            return;
        }
        // The pass that started it finishes (verification, publication)
        // before the next crash.
        tokio::time::sleep(tick).await;
    }
    actors
        .counts
        .bump("a container crashed down its budget's ladder");
}

/// What L12 allows beyond the moment a crash is observed and the
/// ladder's delay: the pass that starts the container, and a poll.
const LADDER_SLACK: Duration = Duration::from_secs(5);

/// How often L12 looks for the restart it waits for.
const LADDER_POLL: Duration = Duration::from_millis(250);

/// How long after a start the stable streak that resets a budget may
/// begin: the first verified, ready observation.
const STABLE_STREAK_SLACK: Duration = Duration::from_secs(60);

/// After a catalog that drops a service, for how many ticks the proxy is
/// down with [`PROXY_RESTART_P`] each tick.
const PROXY_RESTART_TICKS: u32 = 30;
const PROXY_RESTART_P: f64 = 0.3;

/// How long after one tick a lost route may take to be back: the pass
/// that republishes it runs at the tick, and takes a moment.
const ROUTE_RESTORE_SLACK: Duration = Duration::from_secs(30);

fn catalog_of(shared: &Shared) -> Arc<Catalog> {
    shared.catalog.lock().expect("poisoned").clone()
}

/// L6 (T5): every route that was up before the proxy forgot them is back,
/// for every container still running the execution it was verified for —
/// except on an instance a worker or an operator's command held locked
/// since the routes were lost: the pass skips a busy instance (R3), and
/// republishing beside an upgrade could route back to the generation it is
/// replacing. Such routes are L1's to judge once every lock is free.
fn check_routes_restored(
    checker: &Checker,
    before: &BTreeMap<ServiceKey, stead::ports::Route>,
    lost_at: Timestamp,
    traffic: &MemoryTraffic,
    runtime: &MemoryRuntime,
) {
    let now = traffic.routes();
    for (key, route) in before {
        let still = runtime.container(&route.container).is_some_and(|c| {
            c.status == ContainerStatus::Running && c.started_at == route.verified_started_at
        });
        if !still || checker.locked_by_others_since(&key.instance, lost_at) {
            continue;
        }
        // Back to the same container, or to the successor ACTIVE switched
        // to meanwhile (an upgrade that finished just before the proxy
        // forgot: the pass then routes the successor, as it must).
        let active = checker.truth(|t| t.active.get(key).cloned());
        checker.check_external(
            "L6 lost routes are back within one tick",
            now.get(key).is_some_and(|r| {
                r.container == route.container || Some(&r.container) == active.as_ref()
            }),
            || {
                format!(
                    "{key:?} on {} not republished within a tick (routed now: {:?}, ACTIVE: {:?})",
                    route.container,
                    now.get(key).map(|r| &r.container),
                    active,
                )
            },
        );
    }
}

/// The database's clock: the simulation's true time, off by a step while
/// one lasts (an NTP step on the database's host, then stepped back).
#[derive(Debug, Default)]
pub struct DatabaseClock {
    offset_ms: std::sync::atomic::AtomicI64,
}

impl Clock for DatabaseClock {
    fn now(&self) -> Timestamp {
        let offset = jiff::SignedDuration::from_millis(self.offset_ms.load(Ordering::Relaxed));
        let true_now = SystemClock.now();
        true_now.checked_add(offset).unwrap_or(true_now)
    }
}

/// Steps the database's clock at a random moment of this tick, either way
/// by 10 to 50 s, and back again before a tick has passed: no process
/// reads it stepped at two ticks in a row, so a process that checks each
/// reading against the last decides nothing on it (#41). Not by more:
/// instance locks are taken by the database's clock alone, and a step
/// longer than what is left of another holder's lock lets a pass take it
/// (the limit docs/operations.md states; seed 199 of an earlier draw, a
/// two-hour step, showed it).
fn step_database_clock(
    database_clock: &Arc<DatabaseClock>,
    checker: &Arc<Checker>,
    tick: Duration,
    rng: &mut ChaCha8Rng,
    counts: &FaultCounts,
) {
    let ahead = rng.random_bool(0.6);
    let by_s = rng.random_range(10..=50i64) * if ahead { 1 } else { -1 };
    counts.bump(if ahead {
        "database clock stepped ahead"
    } else {
        "database clock stepped back"
    });
    let at = Duration::from_millis(rng.random_range(0..tick.as_millis() as u64 / 2));
    let lasts = Duration::from_millis(rng.random_range(1000..tick.as_millis() as u64 / 2));
    let (database_clock, checker) = (database_clock.clone(), checker.clone());
    tokio::spawn(async move {
        tokio::time::sleep(at).await;
        database_clock
            .offset_ms
            .store(by_s * 1000, Ordering::Relaxed);
        checker.database_clock_stepped(by_s * 1000);
        tokio::time::sleep(lasts).await;
        database_clock.offset_ms.store(0, Ordering::Relaxed);
        checker.database_clock_stepped(0);
    });
}

/// The processes of a run and the faults pending on them.
struct Processes {
    slots: Vec<Arc<Slot>>,
    nodes: Vec<madsim::runtime::NodeHandle>,
    /// Slots killed, and when each starts again.
    down_until: BTreeMap<usize, Timestamp>,
    /// Slots paused, and when each resumes.
    paused_until: BTreeMap<usize, Timestamp>,
    /// The paused slots whose host is suspended, since when: their
    /// monotonic clock stands still (#41).
    suspended_since: BTreeMap<usize, Timestamp>,
    /// When each slot last woke from a suspend.
    woke_from_suspend: BTreeMap<usize, Timestamp>,
    /// Per pause: the chance it is a suspend.
    suspend: f64,
    /// The twin running beside a slot's process, if any (#41 item 3), and
    /// when it is stopped.
    twin: Option<(madsim::runtime::NodeHandle, Timestamp)>,
    /// Twins started so far.
    twins: u64,
    /// What a twin's process shares with the others.
    shared: Arc<Shared>,
    /// The suspends' own draws (#41), apart from the other faults' so
    /// that those stay as they were.
    suspend_rng: ChaCha8Rng,
    tick: Duration,
    skew_ms_max: i64,
    /// Told of each kill and pause (E1: a process's unwritten events die
    /// with it).
    checker: Arc<Checker>,
}

impl Processes {
    fn start(
        topology: &Topology,
        shared: &Arc<Shared>,
        mix: &FaultMix,
        clock_faults: &ClockFaults,
        rng: &mut ChaCha8Rng,
    ) -> Self {
        let handle = madsim::runtime::Handle::current();
        let mut slots = Vec::new();
        let mut nodes = Vec::new();
        for (i, role) in topology.roles.iter().enumerate() {
            let skew = draw_skew(rng, mix.skew_ms_max);
            let slot = Arc::new(Slot::new(i, *role, skew));
            let (s, sh) = (slot.clone(), shared.clone());
            let node = handle
                .create_node()
                .name(format!("stead{i}"))
                .ip(std::net::IpAddr::from([10, 0, 0, i as u8 + 1]))
                .init(move || process_main(s.clone(), sh.clone()))
                .build();
            slots.push(slot);
            nodes.push(node);
        }
        Self {
            slots,
            nodes,
            down_until: BTreeMap::new(),
            paused_until: BTreeMap::new(),
            suspended_since: BTreeMap::new(),
            woke_from_suspend: BTreeMap::new(),
            suspend: clock_faults.suspend,
            twin: None,
            twins: 0,
            shared: shared.clone(),
            suspend_rng: ChaCha8Rng::seed_from_u64(clock_faults.seed),
            tick: shared.tick,
            skew_ms_max: mix.skew_ms_max,
            checker: shared.checker.clone(),
        }
    }

    /// Draws this tick's process faults: a kill (the process comes back a
    /// tick or more later, now and then as a stranger) and a jump of a
    /// host's wall clock. (Pauses are drawn mid-tick: [`Self::pause_one`].)
    fn inject(&mut self, rng: &mut ChaCha8Rng, mix: &FaultMix, counts: &FaultCounts) {
        let handle = madsim::runtime::Handle::current();
        let now = SystemClock.now();
        let n = self.slots.len();
        if rng.random_bool(mix.daemon_kill) {
            let i = rng.random_range(0..n);
            if !self.down_until.contains_key(&i) {
                counts.bump("daemon killed");
                // Before the resume: killed while frozen, if it was.
                self.checker.events.killed(self.nodes[i].id(), now);
                if self.paused_until.remove(&i).is_some() {
                    self.resume(i, now, counts);
                }
                handle.kill(self.nodes[i].id());
                if rng.random_bool(mix.new_identity) {
                    counts.bump("daemon back as a stranger");
                    self.slots[i].new_identity();
                }
                let after = self.tick * rng.random_range(0..3u32)
                    + Duration::from_secs(rng.random_range(1..30));
                self.down_until.insert(i, add(now, after));
            }
        }
        if self.skew_ms_max > 0 && rng.random_bool(0.05) {
            let i = rng.random_range(0..n);
            // Not while its host is suspended, nor for a lease's length
            // after it woke: a trust window ends when either of the host's
            // clocks says so, and a host whose wall clock steps back by as
            // long as its monotonic clock stood still gives no local sign
            // of the time lost (#41, the limit docs/operations.md states).
            let lease =
                reconciler_lease_ttl(self.tick, RecoveryPolicy::default().instance_deadline);
            let woke_lately = self
                .woke_from_suspend
                .get(&i)
                .is_some_and(|at| now < add(*at, lease));
            // Drawn either way, so that the other faults' draws stay as
            // they were before suspends existed.
            let skew = draw_skew(rng, self.skew_ms_max);
            if !self.suspended_since.contains_key(&i) && !woke_lately {
                counts.bump("host clock jumped");
                self.slots[i].set_skew_ms(skew);
            }
        }
    }

    /// Starts a twin of a reconciling slot's process beside it (#41 item
    /// 3): the same identity and role at another site, as a copied
    /// `state_dir` or a cloned VM image starts one, for 2 to 11 ticks. The
    /// slot's process may be up, paused or down meanwhile: the twin waits
    /// for the lease as long as the other renews it, and takes it only once
    /// its grant ran out (T1). It is never paused, and is killed (SIGKILL)
    /// at its end, its lease and locks left to expire.
    fn start_twin(&mut self, rng: &mut ChaCha8Rng, counts: &FaultCounts) {
        let reconcilers: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.slots[*i].role.reconciles())
            .collect();
        let i = reconcilers[rng.random_range(0..reconcilers.len())];
        let ticks = rng.random_range(2..12u32);
        let skew = draw_skew(rng, self.skew_ms_max);
        if self.twin.is_some() {
            return;
        }
        counts.bump("twin started beside a process (a copied state_dir)");
        self.twins += 1;
        let slot = Arc::new(Slot::twin_of(&self.slots[i], self.twins, skew));
        let shared = self.shared.clone();
        let node = madsim::runtime::Handle::current()
            .create_node()
            .name(format!("stead{i}-twin{}", self.twins))
            .ip(std::net::IpAddr::from([
                10,
                1,
                (self.twins / 250) as u8,
                (self.twins % 250) as u8 + 1,
            ]))
            .init(move || process_main(slot.clone(), shared.clone()))
            .build();
        self.twin = Some((node, add(SystemClock.now(), self.tick * ticks)));
    }

    /// Kills the twin, if one runs and its time is up (or `now` is `None`).
    fn stop_twin(&mut self, now: Option<Timestamp>) {
        if self
            .twin
            .as_ref()
            .is_some_and(|(_, until)| now.is_none_or(|now| *until <= now))
        {
            let (node, _) = self.twin.take().expect("checked");
            madsim::runtime::Handle::current().kill(node.id());
        }
    }

    /// Takes over the pauses the fault injector started right after an
    /// effect: each resumes after the leases and a while more.
    fn adopt_pauses(&mut self, faults: &SwarmFaults, rng: &mut ChaCha8Rng) {
        let now = SystemClock.now();
        let paused = std::mem::take(&mut *faults.paused_after_effect.lock().expect("poisoned"));
        for node in paused {
            let Some(i) = self.nodes.iter().position(|n| n.id() == node) else {
                continue;
            };
            let ttl = reconciler_lease_ttl(self.tick, RecoveryPolicy::default().instance_deadline);
            let after = ttl + Duration::from_secs(rng.random_range(1..120));
            if !self.paused_until.contains_key(&i) {
                self.paused_until.insert(i, add(now, after));
                self.maybe_suspended(i, now);
            }
        }
    }

    /// Whether the pause of slot `i` that begins `now` suspends its host.
    fn maybe_suspended(&mut self, i: usize, now: Timestamp) {
        if self.suspend_rng.random_bool(self.suspend) {
            self.suspended_since.insert(i, now);
        }
    }

    /// Resumes slot `i`'s node; a suspended host's monotonic clock missed
    /// the time it stood still.
    fn resume(&mut self, i: usize, now: Timestamp, counts: &FaultCounts) {
        if let Some(since) = self.suspended_since.remove(&i) {
            counts.bump("host suspended past its leases");
            let stood = now.duration_since(since);
            self.woke_from_suspend.insert(i, now);
            self.slots[i].stood_still(Duration::try_from(stood).unwrap_or_default());
            self.checker.suspended(self.nodes[i].id(), stood);
        }
        self.checker.events.thawed(self.nodes[i].id(), now);
        madsim::runtime::Handle::current().resume(self.nodes[i].id());
    }

    /// Freezes one running process for longer than its leases.
    fn pause_one(&mut self, rng: &mut ChaCha8Rng, counts: &FaultCounts) {
        let handle = madsim::runtime::Handle::current();
        let now = SystemClock.now();
        let n = self.slots.len();
        let i = rng.random_range(0..n);
        if !self.down_until.contains_key(&i) && !self.paused_until.contains_key(&i) {
            counts.bump("daemon paused past its leases");
            handle.pause(self.nodes[i].id());
            self.checker.events.frozen(self.nodes[i].id());
            let ttl = reconciler_lease_ttl(self.tick, RecoveryPolicy::default().instance_deadline);
            let after = ttl + Duration::from_secs(rng.random_range(1..120));
            self.paused_until.insert(i, add(now, after));
            self.maybe_suspended(i, now);
        }
    }

    /// Restarts and resumes what is due, and stops a twin whose time is up.
    fn settle(&mut self, now: Timestamp, counts: &FaultCounts) {
        self.stop_twin(Some(now));
        let handle = madsim::runtime::Handle::current();
        let due: Vec<usize> = self
            .down_until
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            self.down_until.remove(&i);
            counts.bump("daemon restarted");
            handle.restart(self.nodes[i].id());
        }
        let due: Vec<usize> = self
            .paused_until
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            self.paused_until.remove(&i);
            self.resume(i, now, counts);
        }
    }

    /// Every process restarts at once (a new catalog rolled out); a twin
    /// is stopped.
    fn restart_all(&mut self, counts: &FaultCounts) {
        self.stop_twin(None);
        let handle = madsim::runtime::Handle::current();
        let now = SystemClock.now();
        for i in 0..self.nodes.len() {
            if !self.down_until.contains_key(&i) {
                self.checker.events.killed(self.nodes[i].id(), now);
            }
            if self.paused_until.remove(&i).is_some() {
                self.resume(i, now, counts);
            }
            self.down_until.remove(&i);
            counts.bump("daemon restarted");
            handle.restart(self.nodes[i].id());
        }
    }

    /// The faults stop: everything paused resumes, everything down starts,
    /// a twin is stopped.
    fn recover_all(&mut self, counts: &FaultCounts) {
        self.stop_twin(None);
        let handle = madsim::runtime::Handle::current();
        let now = SystemClock.now();
        for i in std::mem::take(&mut self.paused_until).into_keys() {
            self.resume(i, now, counts);
        }
        for i in std::mem::take(&mut self.down_until).into_keys() {
            handle.restart(self.nodes[i].id());
        }
        // A host woken from a suspend keeps its wall clock as it was: one
        // stepped back as it resumes gives no local sign of the time lost
        // (see `inject`). Its skew is harmless here: the engine's clock
        // follows the database's.
        let lease = reconciler_lease_ttl(self.tick, RecoveryPolicy::default().instance_deadline);
        for (i, slot) in self.slots.iter().enumerate() {
            let woke_lately = self
                .woke_from_suspend
                .get(&i)
                .is_some_and(|at| now < add(*at, lease));
            if !woke_lately {
                slot.set_skew_ms(0);
            }
        }
    }
}

fn draw_skew(rng: &mut ChaCha8Rng, skew_ms_max: i64) -> i64 {
    if skew_ms_max == 0 {
        0
    } else {
        rng.random_range(-skew_ms_max..=skew_ms_max)
    }
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
    let docker = stead::core::release::Provisioning::Docker;
    for i in 0..cfg.instances {
        let name = instance_name(i);
        ready_instance(
            cfg,
            rng,
            store,
            provisioner,
            now,
            i,
            &name,
            SERVICE_TYPE,
            &actors.versions.render(1),
            &docker,
        )
        .await;
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
                ports: if has_ports(&service) {
                    vec![8080]
                } else {
                    vec![]
                },
                healthcheck: Some(Healthcheck {
                    command: vec!["true".into()],
                    interval: Duration::from_secs(5),
                    timeout: Duration::from_secs(1),
                    retries: 3,
                }),
                readiness: ReadinessProbe::None,
                stop_grace: Duration::from_secs(5),
                update: if is_stop_first(cfg.seed, j) {
                    UpdateStrategy::StopFirst
                } else {
                    UpdateStrategy::Overlap
                },
                domains: crate::world::domains_of(&service),
                // `web` also takes the names tenants give at create (#54).
                tenant_domains: service.as_str() == "web",
                // Data that must outlive every container of the service,
                // a dropped one's too (only a purge removes it).
                run: Box::new(stead::core::spec::RunSpec {
                    mounts: vec![stead::core::spec::Mount {
                        source: stead::core::spec::MountSource::Volume(VOLUME.into()),
                        target: "/data".into(),
                        read_only: false,
                    }],
                    ..Default::default()
                }),
            };
            if is_stop_first(cfg.seed, j) {
                actors
                    .checker
                    .truth(|t| t.stop_first.insert(service.clone()));
            }
            if !has_ports(&service) {
                actors.checker.truth(|t| t.portless.insert(service.clone()));
            }
            let instance_id = store
                .instance_now(&name)
                .expect("setup: the instance was just created")
                .id;
            let request = CreateContainer {
                instance: name.clone(),
                instance_id,
                env: Vec::new(),
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
    let helm = stead::core::release::Provisioning::Helm(helm_chart(&actors.versions.render(1), 0));
    for k in 0..helm_instances(cfg.instances) {
        let name = helm_instance_name(k);
        ready_instance(
            cfg,
            rng,
            store,
            provisioner,
            now,
            k,
            &name,
            HELM_TYPE,
            &actors.versions.render(1),
            &helm,
        )
        .await;
    }
    legacy_instances(store, provisioner, now).await;
    // The starting fleet was provisioned by a stead that records specs:
    // each instance records its type's digest, so a spec change under the
    // same version upgrades it (C8).
    let catalog = sim_catalog(actors, 1, false);
    for instance in store.all_instances() {
        if let Some(entry) = catalog.get(&instance.service_type) {
            store
                .set_instance_spec_digest(instance.id, &entry.spec_digest, now)
                .await
                .expect("setup: record the spec digest");
        }
    }
}

/// Instances of a type the catalog no longer lists (it was removed while
/// they remained): version drift reports the ready one and never upgrades
/// either (C8); drift counts the ready one's release as its own, not an
/// orphan (C5). Drawn from no random stream: the rest of a seed stays as
/// it was.
async fn legacy_instances(store: &MemoryStore, provisioner: &MemoryProvisioner, now: Timestamp) {
    for (k, state) in [InstanceState::Ready, InstanceState::Failed]
        .into_iter()
        .enumerate()
    {
        let instance = store
            .create_instance(
                &NewInstance {
                    domains: Vec::new(),
                    spec_digest: None,
                    parameters: Default::default(),
                    name: InstanceName::new(format!("legacy{k}")),
                    team: crate::world::team_of(k).into(),
                    service_type: LEGACY_TYPE.into(),
                    version: "1".into(),
                    expires_at: None,
                    maintenance_window: None,
                },
                now,
            )
            .await
            .expect("setup: create a legacy instance");
        store
            .set_instance_state(instance.id, instance.state, state, now)
            .await
            .expect("setup: legacy state");
        if state == InstanceState::Ready {
            let release = stead::core::release::Provisioning::Docker
                .spec_of(
                    &stead::core::release::ReleaseParams::of(&instance, "1"),
                    false,
                )
                .expect("a Docker release renders");
            provisioner
                .install_or_upgrade(&release)
                .await
                .expect("setup: install a legacy release");
        }
    }
}

/// The `i`-th instance of a type in the starting fleet: created at version
/// 1, ready, its release installed as its type provisions it; some expire
/// during the safety phase (C7).
#[allow(clippy::too_many_arguments)]
async fn ready_instance(
    cfg: &SimConfig,
    rng: &mut ChaCha8Rng,
    store: &MemoryStore,
    provisioner: &MemoryProvisioner,
    now: Timestamp,
    i: usize,
    name: &InstanceName,
    service_type: &str,
    version: &str,
    provisioning: &stead::core::release::Provisioning,
) {
    let expires_at = rng.random_bool(0.3).then(|| {
        let after = Duration::from_secs(rng.random_range(600..cfg.safety.as_secs().max(601)));
        stead::core::fleet::add(now, after)
    });
    let instance = store
        .create_instance(
            &NewInstance {
                domains: Vec::new(),
                spec_digest: None,
                parameters: Default::default(),
                name: name.clone(),
                team: crate::world::team_of(i).into(),
                service_type: service_type.into(),
                version: version.into(),
                expires_at,
                maintenance_window: {
                    let windows = windows(now);
                    windows[i % windows.len()].clone()
                },
            },
            now,
        )
        .await
        .expect("setup: create instance");
    store
        .set_instance_state(instance.id, instance.state, InstanceState::Ready, now)
        .await
        .expect("setup: ready");
    let release = provisioning
        .spec_of(
            &stead::core::release::ReleaseParams::of(&instance, &instance.version),
            false,
        )
        .expect("the sim's catalog renders");
    provisioner
        .install_or_upgrade(&release)
        .await
        .expect("setup: install");
}

/// The named volume every simulated service mounts.
const VOLUME: &str = "data";

/// L1, L3, L4, L8 after the liveness phase.
#[allow(clippy::too_many_arguments)]
async fn check_liveness(
    checker: &Checker,
    actors: &Actors,
    store: &MemoryStore,
    runtime: &MemoryRuntime,
    provisioner: &MemoryProvisioner,
    faults_stopped: Timestamp,
    tick: Duration,
) {
    let now = SystemClock.now();
    let truth = checker.truth_snapshot();
    let routes = checker.routes();
    let mut failures = Vec::new();
    let dropped = actors.dropped.lock().expect("poisoned").clone();
    for (key, id) in &truth.active {
        if truth.deleting.contains(&key.instance) {
            continue;
        }
        // A service the catalog dropped is not granted (R11) and is on its
        // way out: L8 judges it.
        if Some(&key.service) == dropped.as_ref() {
            continue;
        }
        let stopped = truth.stopped.contains(&key.instance);
        let inhibited = truth.inhibited.contains(id);
        let Some(c) = runtime.container(id) else {
            // Removed by hand: no longer routed (R7), and (#40) created
            // again by drift's reprovision unless nothing of it may run.
            if routes.get(key).is_some_and(|r| &r.container == id) {
                failures.push(format!("L1: {key:?} still routed to {id}, which is gone"));
            }
            let ready = store
                .instance_now(&key.instance)
                .is_some_and(|i| i.state == InstanceState::Ready);
            if ready && !stopped && !inhibited {
                failures.push(format!(
                    "L1: {key:?}'s container {id} was removed by hand and never created again"
                ));
            }
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
        // An upgrade that switched ACTIVE in the last moments (a rollout
        // still going when the budget ran out, one instance a tick within
        // max_in_flight) is routed by the next pass: young, not stuck.
        let young = |at: Timestamp| {
            now.duration_since(at) < jiff::SignedDuration::try_from(tick * 2).expect("a tick fits")
        };
        if checker.active_since(key).is_some_and(young) {
            continue;
        }
        // A service without ports is served once ACTIVE records its running
        // execution as verified; it must never hold a route.
        let served = c.status == ContainerStatus::Running
            && if truth.portless.contains(&key.service) {
                !routes.contains_key(key)
                    && store.active_now(key).is_some_and(|a| {
                        &a.container == id
                            && a.verified_started_at
                                == c.started_at
                                    .and_then(stead::store::normalize_execution_start)
                    })
            } else {
                routes
                    .get(key)
                    .is_some_and(|r| &r.container == id && r.verified_started_at == c.started_at)
            };
        if !served {
            failures.push(format!(
                "L1: {key:?} on {id} not running, verified and published: {c:?}, route {:?}",
                routes.get(key)
            ));
        }
    }
    // L8: a service the catalog's version dropped is, once its instance
    // runs that version, neither running nor routed and gone from ACTIVE;
    // and no named volume ever goes (the operators never purge).
    let version = actors
        .versions
        .render(actors.catalog_version.load(Ordering::Relaxed));
    if let (Some(dropped), Ok(rows)) = (&dropped, store.list_instances().await) {
        let managed = runtime.list_managed().await.unwrap_or_default();
        for i in rows.rows.iter().filter(|i| {
            i.state == InstanceState::Ready
                && i.version == version
                && i.service_type == SERVICE_TYPE
        }) {
            let key = ServiceKey {
                instance: i.name.clone(),
                service: dropped.clone(),
            };
            let running: Vec<String> = managed
                .iter()
                .filter(|c| {
                    c.instance == i.name
                        && &c.service == dropped
                        && c.status == ContainerStatus::Running
                })
                .map(|c| c.id.to_string())
                .collect();
            if !running.is_empty() || routes.contains_key(&key) || truth.active.contains_key(&key) {
                failures.push(format!(
                    "L8: {key:?} was dropped by version {version}, which {} runs, yet it is{}{}{}",
                    i.name,
                    if running.is_empty() {
                        String::new()
                    } else {
                        format!(" running ({})", running.join(", "))
                    },
                    if routes.contains_key(&key) {
                        " routed"
                    } else {
                        ""
                    },
                    if truth.active.contains_key(&key) {
                        " in ACTIVE"
                    } else {
                        ""
                    },
                ));
            }
        }
    }
    let volumes = runtime.volumes();
    for s in actors.services.lock().expect("poisoned").iter() {
        let volume = (
            s.key.instance.clone(),
            s.key.service.clone(),
            VOLUME.to_owned(),
        );
        if !volumes.contains(&volume) {
            failures.push(format!("L8: the named volume of {:?} is gone", s.key));
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
                // Nor does one removed by hand.
                if truth.active.get(&key).is_some_and(|succ| {
                    truth.inhibited.contains(succ) || runtime.container(succ).is_none()
                }) {
                    continue;
                }
                // An upgrade that ran in the last moments (a maintenance
                // window opening at the end of the run) leaves markers the
                // next pass retires: they are young, not stuck.
                // A baking predecessor is kept until its window ends (#40),
                // a reverted successor for an hour as evidence (#55): its
                // age counts from then.
                let since = match &marker.revert_to {
                    Some(back) => back.until,
                    None if marker.operation == stead::core::bake::REVERT_OPERATION => {
                        add(marker.created_at, stead::core::bake::KEEP_REVERTED)
                    }
                    None => marker.created_at,
                };
                let age = now.duration_since(since);
                if age < jiff::SignedDuration::try_from(tick * 2).expect("a tick fits") {
                    continue;
                }
                failures.push(format!(
                    "L3: marker on {} never resolved (created {age:#} before the end)",
                    marker.container
                ));
            }
        }
    }
    failures.sort();
    failures.dedup();
    for f in failures {
        checker.record_violation(f);
    }
}

/// Whether the `j`-th service is replaced `stop-first` (#40): `web`, in
/// two seeds of every four (so with and without a bake window).
fn is_stop_first(seed: u64, j: usize) -> bool {
    j == 0 && seed % 4 >= 2
}

/// The Docker type's bake window in the seeds that bake (#40): three
/// ticks, so a version that fails minutes after its upgrade is reverted
/// within it.
pub const SIM_BAKE: Duration = Duration::from_secs(180);

/// The catalog of the simulated fleet: one service type at `version`
/// (instances start at 1; operators bump it, and version drift upgrades
/// them), sometimes a security release that ignores windows.
pub(crate) fn sim_catalog(actors: &Actors, number: u32, security: bool) -> Catalog {
    let services = actors.services.lock().expect("poisoned");
    let dropped = actors.dropped.lock().expect("poisoned").clone();
    let edition = actors.spec_edition.load(Ordering::Relaxed);
    let version = actors.versions.render(number);
    let mut specs: Vec<ServiceSpec> = Vec::new();
    for s in services.iter() {
        if Some(&s.spec.name) != dropped.as_ref() && !specs.iter().any(|x| x.name == s.spec.name) {
            let mut spec = s.spec.clone();
            if edition > 0 {
                // A spec change under the same version: another argument.
                spec.command = vec![format!("--edition={edition}")];
            }
            specs.push(spec);
        }
    }
    // As the catalog's parser sets it: the services of a type with more
    // than one share the instance's network.
    let shared_network = specs.len() > 1;
    for spec in &mut specs {
        spec.run.instance_network = shared_network;
    }
    let entries = [
        CatalogEntry {
            spec_digest: String::new(),
            parameters: Default::default(),
            service_type: SERVICE_TYPE.into(),
            version: version.clone(),
            security,
            rollout: RolloutState::Active,
            bake: actors.bake,
            provisioning: stead::core::release::Provisioning::Docker,
            services: specs,
        },
        // The Helm type moves with the Docker one: one catalog bump
        // upgrades both kinds, within one max_in_flight.
        CatalogEntry {
            spec_digest: String::new(),
            parameters: Default::default(),
            service_type: HELM_TYPE.into(),
            version: version.clone(),
            security,
            rollout: RolloutState::Active,
            // A Helm type bakes by asking Helm (#40): a release at a broken
            // version fails its chart tests and is rolled back.
            bake: actors.bake,
            provisioning: stead::core::release::Provisioning::Helm(helm_chart(&version, edition)),
            services: Vec::new(),
        },
    ];
    // Each entry records its digest, as `Catalog::load` does: an instance
    // records the digest it was provisioned or upgraded with, and one that
    // differs from the catalog's at the same version is behind (C8).
    let catalog = Catalog::from_entries(entries.map(|mut entry| {
        entry.spec_digest = entry.digest();
        entry
    }))
    .with_grants(sim_grants());
    if actors.volume_moved.load(Ordering::Relaxed) {
        // The operator forced a file renaming the volume (N4): every later
        // file keeps it.
        crate::hazards::with_volume(&catalog, crate::hazards::MOVED_VOLUME)
    } else {
        catalog
    }
}

/// The prefix of the Helm type's namespaces, as the operator grants it.
const HELM_NAMESPACE_PREFIX: &str = "sim-";

/// What the simulated operator grants (#54): the Helm type's chart and
/// its namespace prefix; nothing of the host.
pub(crate) fn sim_grants() -> stead::core::grants::Grants {
    stead::core::grants::Grants::default()
        .with_helm(&["charts/app".to_owned()], Some(HELM_NAMESPACE_PREFIX))
        .expect("the simulated grants are valid")
}

/// `catalog` with each type's table as a catalog file gives it, as the
/// daemons load a file: the leader's tick records each version from them
/// (#40, #54: fenced, once per definition), for `rollout undo --to` and
/// for putting a halted type's instance back as it was. (Until the Helm
/// type was recorded too, a halted Helm release ahead of its instance
/// could not be put back: the fifty-instance day's seed 2.)
fn with_sources(catalog: Catalog) -> Catalog {
    let sources = [
        catalog
            .get(SERVICE_TYPE)
            .map(|e| (SERVICE_TYPE.to_owned(), docker_type_source(e))),
        catalog
            .get(HELM_TYPE)
            .map(|e| (HELM_TYPE.to_owned(), helm_type_source(e))),
    ];
    catalog.with_sources(sources.into_iter().flatten().collect())
}

/// The simulated Helm type as a catalog file says it; read back through
/// the catalog's parser it must be the very entry.
pub(crate) fn helm_type_source(entry: &CatalogEntry) -> String {
    use toml::{Table, Value};
    let stead::core::release::Provisioning::Helm(chart) = &entry.provisioning else {
        panic!("{} is not a Helm type", entry.service_type)
    };
    let mut helm = Table::new();
    helm.insert("chart".into(), Value::String(chart.chart.clone()));
    helm.insert(
        "chart_version".into(),
        Value::String(chart.chart_version.clone()),
    );
    helm.insert("namespace".into(), Value::String(chart.namespace.clone()));
    let values: Table = toml::Table::try_from(&chart.values).expect("the values are a table");
    helm.insert("values".into(), Value::Table(values));
    let mut definition = Table::new();
    definition.insert("version".into(), Value::String(entry.version.clone()));
    definition.insert("security".into(), Value::Boolean(entry.security));
    definition.insert(
        "bake_ms".into(),
        Value::Integer(entry.bake.as_millis() as i64),
    );
    definition.insert("provisioner".into(), Value::String("helm".into()));
    definition.insert("helm".into(), Value::Table(helm));
    checked_source(entry, definition)
}

/// The simulated Docker type as a catalog file says it. Read back through
/// the catalog's own parser it must be the very entry: anything else is a
/// fault of this rendering, and the run stops on it.
pub(crate) fn docker_type_source(entry: &CatalogEntry) -> String {
    use toml::{Table, Value};
    let ms = |d: Duration| Value::Integer(d.as_millis() as i64);
    let strings =
        |items: &[String]| Value::Array(items.iter().cloned().map(Value::String).collect());
    let services: Vec<Value> = entry
        .services
        .iter()
        .map(|spec| {
            let mut service = Table::new();
            service.insert("name".into(), Value::String(spec.name.to_string()));
            service.insert("image".into(), Value::String(spec.image.clone()));
            service.insert("command".into(), strings(&spec.command));
            service.insert(
                "ports".into(),
                Value::Array(
                    spec.ports
                        .iter()
                        .map(|p| Value::Integer((*p).into()))
                        .collect(),
                ),
            );
            service.insert("stop_grace_ms".into(), ms(spec.stop_grace));
            let update = match spec.update {
                UpdateStrategy::Overlap => "overlap",
                UpdateStrategy::StopFirst => "stop-first",
            };
            service.insert("update".into(), Value::String(update.into()));
            if !spec.domains.is_empty() {
                let domains = spec.domains.iter().map(|d| d.as_str().to_owned());
                service.insert("domains".into(), strings(&domains.collect::<Vec<_>>()));
            }
            if spec.tenant_domains {
                service.insert("tenant_domains".into(), Value::Boolean(true));
            }
            let volumes = spec
                .run
                .mounts
                .iter()
                .map(|mount| match &mount.source {
                    stead::core::spec::MountSource::Volume(name) => {
                        let mut volume = Table::new();
                        volume.insert("name".into(), Value::String(name.clone()));
                        volume.insert("path".into(), Value::String(mount.target.clone()));
                        Value::Table(volume)
                    }
                    other => panic!("the sim's catalog mounts {other:?}, which it does not render"),
                })
                .collect();
            service.insert("volumes".into(), Value::Array(volumes));
            if let Some(check) = &spec.healthcheck {
                let mut healthcheck = Table::new();
                healthcheck.insert("command".into(), strings(&check.command));
                healthcheck.insert("interval_ms".into(), ms(check.interval));
                healthcheck.insert("timeout_ms".into(), ms(check.timeout));
                healthcheck.insert("retries".into(), Value::Integer(check.retries.into()));
                service.insert("healthcheck".into(), Value::Table(healthcheck));
            }
            assert_eq!(
                spec.readiness,
                ReadinessProbe::None,
                "the sim renders no probe"
            );
            let mut readiness = Table::new();
            readiness.insert("kind".into(), Value::String("none".into()));
            service.insert("readiness".into(), Value::Table(readiness));
            Value::Table(service)
        })
        .collect();
    let mut definition = Table::new();
    definition.insert("version".into(), Value::String(entry.version.clone()));
    definition.insert("security".into(), Value::Boolean(entry.security));
    definition.insert("bake_ms".into(), ms(entry.bake));
    definition.insert("services".into(), Value::Array(services));
    checked_source(entry, definition)
}

/// `entry`'s type as a catalog file holding `definition` says it. Read
/// back through the catalog's own parser it must be the very entry:
/// anything else is a fault of the rendering, and the run stops on it.
fn checked_source(entry: &CatalogEntry, definition: toml::Table) -> String {
    let mut types = toml::Table::new();
    types.insert(entry.service_type.clone(), toml::Value::Table(definition));
    let mut file = toml::Table::new();
    file.insert("types".into(), toml::Value::Table(types));
    let source = toml::to_string(&file).expect("a TOML table renders");
    let parsed = Catalog::from_toml(&source, "the simulated catalog", &sim_grants())
        .unwrap_or_else(|e| {
            panic!("the sim's catalog renders to a file that does not parse: {e}\n{source}")
        });
    assert_eq!(
        parsed.get(&entry.service_type),
        Some(entry),
        "the sim's catalog renders to another entry:\n{source}"
    );
    source
}

/// The Helm type's chart at a catalog version and spec edition.
fn helm_chart(version: &str, edition: u32) -> stead::core::release::HelmChart {
    stead::core::release::HelmChart {
        chart: "charts/app".into(),
        chart_version: version.to_owned(),
        namespace: format!("{HELM_NAMESPACE_PREFIX}{{instance}}"),
        namespace_prefix: HELM_NAMESPACE_PREFIX.into(),
        values: serde_json::json!({"host": "{instance}.example", "edition": edition}),
    }
}

/// Instances of the Helm type next to `instances` Docker ones.
pub fn helm_instances(instances: usize) -> usize {
    instances / 4 + 1
}

/// S9 and S10 on the queue after every tick.
async fn check_queue(
    checker: &Checker,
    store: &MemoryStore,
    control: &ControlConfig,
    catalog: &Catalog,
    now: Timestamp,
) {
    let tasks = store.all_tasks();
    let mut active = std::collections::BTreeSet::new();
    // #55: a baking successor holds its instance's slot. Counted only
    // where the planner, its clock anchored to the database's within
    // CLOCK_TOLERANCE, still saw it bake (a bake it saw end is no slot).
    let baking = store.baking_at(add(now, crate::checker::CLOCK_TOLERANCE));
    let mut upgrading = baking.clone();
    let mut dup = None;
    let mut upgrade_tasks = Vec::new();
    for t in tasks.iter().filter(|t| t.state.is_active()) {
        if !active.insert((t.instance, t.kind)) {
            dup = Some((t.instance, t.kind));
        }
        if t.kind == TaskKind::Upgrade {
            upgrading.insert(t.instance);
            upgrade_tasks.push((t.id, t.instance, t.state, t.created_at, t.reason.clone()));
        }
    }
    let upgrades = upgrading.len() as u32;
    checker.check_external(
        "S9 one active task per instance and kind",
        dup.is_none(),
        || format!("two active tasks {dup:?}"),
    );
    checker.check_external(
        "S9 upgrades in flight within the limit",
        upgrades <= control.max_in_flight,
        || {
            format!(
                "{upgrades} upgrades in flight at {now}: tasks (id, instance, state, created, reason) \
                 {upgrade_tasks:?}, baking instances {baking:?}"
            )
        },
    );
    // Upgrades enqueued since the last look: never while the rollout is
    // halted, and inside the instance's window unless a security release.
    let ids: Vec<i64> = tasks.iter().map(|t| t.id).collect();
    let new = checker.tasks_seen(&ids);
    let queued: Vec<(i64, Timestamp)> = tasks
        .iter()
        .filter(|t| t.state == TaskState::Queued)
        .map(|t| (t.id, t.run_after))
        .collect();
    let moved = checker.run_after_moved(&queued);
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
    let types: BTreeMap<i64, String> = store
        .all_instances()
        .into_iter()
        .map(|i| (i.id, i.service_type))
        .collect();
    let names: BTreeMap<i64, String> = store
        .all_instances()
        .into_iter()
        .map(|i| (i.id, i.name.to_string()))
        .collect();
    // A retried upgrade waits for its window as its first run did (the
    // 50-instance world's seed 38 found one retried past its window's end).
    // An operator's undo queues the halted type's upgrade task, which
    // upgrades nothing: it carries the undo out (`core::undo`). And an
    // undo's pin has version drift move a halted type's instances back,
    // waiting for no window (#40; U1 judges where to).
    let upgrade = |t: &&stead::core::fleet::Task| {
        t.kind == TaskKind::Upgrade
            && t.reason != stead::ops::UNDO_REASON
            && !t.reason.starts_with(stead::core::plan::PINNED_REASON)
    };
    // #55: a retry is due when its backoff ends, or the task ends; it
    // never parks in the queue until a window opens, holding its slots.
    let backoff_max = stead::core::fleet::TaskRetryPolicy::default().backoff_max;
    for t in tasks
        .iter()
        .filter(|t| upgrade(t) && t.state == TaskState::Queued && t.attempts > 0)
    {
        checker.check_external(
            "S9 a retried upgrade never parks behind its window",
            t.run_after <= add(t.updated_at, backoff_max + Duration::from_secs(1)),
            || {
                format!(
                    "upgrade task {} retried at {} waits until {}",
                    t.id, t.updated_at, t.run_after
                )
            },
        );
    }
    for t in tasks.iter().filter(|t| upgrade(t) && moved.contains(&t.id)) {
        let service_type = types.get(&t.instance).map_or(SERVICE_TYPE, String::as_str);
        let security = catalog.get(service_type).is_some_and(|e| e.security);
        if let Some(Some(spec)) = windows.get(&t.instance) {
            let window = Window::parse(spec).expect("the sim's windows parse");
            checker.check_external(
                "S9 upgrades run inside the window",
                security || window.contains(t.run_after),
                || {
                    format!(
                        "upgrade task {} retried at {} outside {spec:?}",
                        t.id, t.run_after
                    )
                },
            );
        }
    }
    for t in tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Reprovision && new.contains(&t.id))
    {
        if let Some(name) = names.get(&t.instance) {
            checker.check_reprovision(name, t.created_at, control.tick_interval);
        }
    }
    let halted = checker.truth(|t| t.halted_since.clone());
    for t in tasks.iter().filter(|t| upgrade(t) && new.contains(&t.id)) {
        let service_type = types.get(&t.instance).map_or(SERVICE_TYPE, String::as_str);
        let security = catalog.get(service_type).is_some_and(|e| e.security);
        let halted_since = halted.get(service_type).copied();
        let halted = halted_since.is_some_and(|since| t.created_at > since);
        checker.check_external("S9 none enqueued while halted", !halted, || {
            format!(
                "upgrade task {} enqueued at {} while halted",
                t.id, t.created_at
            )
        });
        // `run_after` as the planner wrote it (a retry moves it on), by a
        // planner that read this catalog (a tick may race a bump).
        let as_planned = t.attempts == 0
            && checker
                .catalog_changed_at()
                .is_none_or(|at| t.created_at > add(at, control.tick_interval));
        if let Some(Some(spec)) = windows.get(&t.instance) {
            let window = Window::parse(spec).expect("the sim's windows parse");
            let inside = security || window.contains(t.run_after);
            checker.check_external("S9 upgrades run inside the window", inside, || {
                format!(
                    "upgrade task {} runs at {} outside {spec:?}",
                    t.id, t.run_after
                )
            });
            // C8, #40: enqueued only while its window is open, due at
            // once: an upgrade never parks in the queue behind a closed
            // window, where it held its instance's task slot and one of
            // max_in_flight's until the window opened.
            if !security && as_planned {
                let due_at_once = t.run_after <= add(t.created_at, Duration::from_secs(1));
                checker.check_external(
                    "S9 an upgrade is enqueued only inside its window, due at once",
                    due_at_once && inside,
                    || {
                        format!(
                            "upgrade task {} enqueued at {} runs at {} ({spec:?})",
                            t.id, t.created_at, t.run_after
                        )
                    },
                );
            }
        }
        if security && as_planned {
            // C8: a security release does not wait for any window.
            checker.check_external(
                "S9 a security upgrade is due at once",
                t.run_after <= add(t.created_at, Duration::from_secs(1)),
                || {
                    format!(
                        "security upgrade task {} enqueued at {} waits until {}",
                        t.id, t.created_at, t.run_after
                    )
                },
            );
        }
    }
}

/// Maintenance windows, assigned round-robin; `None` upgrades at once.
/// Two are fixed (local times in zones with daylight saving); two open
/// a while after the run starts (madsim starts each seed at its own time of
/// day), so windowed upgrades run, fail and are retried inside the run.
/// They are minutes long: a failed upgrade's retries outlive them, and a
/// retry must wait for the next opening as the first run did (C8).
fn windows(start: Timestamp) -> [Option<String>; 5] {
    let daily = |after_mins: i64, len_mins: i64| {
        let open = (start + jiff::SignedDuration::from_mins(after_mins))
            .to_zoned(jiff::tz::TimeZone::UTC)
            .time();
        let close = open + jiff::SignedDuration::from_mins(len_mins);
        Some(format!(
            "daily {}-{}",
            open.strftime("%H:%M"),
            close.strftime("%H:%M")
        ))
    };
    [
        None,
        daily(75, 2),
        Some("mon-fri 22:00-02:00 Europe/Paris".into()),
        Some("sat,sun 01:30-04:00 America/New_York".into()),
        daily(200, 3),
    ]
}
