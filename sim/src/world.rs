//! The simulated world: instances and their workloads, the swarm fault
//! injector, and the operators. Every random draw comes from a ChaCha8 RNG
//! seeded from the run's seed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use stead::core::fleet::{Instance, InstanceState, NewTask, RolloutState, TaskKind};
use stead::core::spec::ServiceSpec;
use stead::core::types::{
    ActiveService, ContainerId, ContainerStatus, Health, Inhibition, InhibitionReason,
    InstanceName, ServiceKey, ServiceName,
};
use stead::ports::RuntimeEventAction;
use stead::ports::{Clock, CreateContainer, NewInstance, Runtime, Store};
use stead_testkit::ports::{
    EventFate, Fault, FaultInjector, MemContainer, MemoryProvisioner, MemoryRuntime, Op,
};

use crate::checker::Checker;

/// How one service's workload behaves during the safety phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    Healthy,
    /// Crashes after a random uptime.
    CrashAfterUptime,
    /// Dies right after every start.
    CrashLoop,
    /// Health flips between healthy and unhealthy.
    FlappingHealth,
    /// Never becomes healthy.
    NeverHealthy,
    /// Not ready for a while after each start.
    SlowReady,
    /// No healthcheck at all.
    NoHealthcheck,
}

const BEHAVIOURS: [Behaviour; 7] = [
    Behaviour::Healthy,
    Behaviour::CrashAfterUptime,
    Behaviour::CrashLoop,
    Behaviour::FlappingHealth,
    Behaviour::NeverHealthy,
    Behaviour::SlowReady,
    Behaviour::NoHealthcheck,
];

/// Per-seed fault probabilities (swarm testing: each seed its own mix).
#[derive(Clone, Debug)]
pub struct FaultMix {
    pub transient: f64,
    pub hang: f64,
    pub not_found: f64,
    pub slow: f64,
    pub traffic_fail: f64,
    pub native_restart: f64,
    pub crash: f64,
    pub operator: f64,
    /// Per tick: a process is killed (and started again a while later).
    pub daemon_kill: f64,
    pub store_outage: f64,
    /// Per tick: a process freezes for longer than its leases.
    pub pause: f64,
    /// Per outside effect: the process freezes right after issuing it,
    /// for longer than its leases, and resumes mid-pass (T2).
    pub pause_after_effect: f64,
    /// A killed process comes back as a stranger (its data dir was lost).
    pub new_identity: f64,
    /// Largest skew of a host's wall clock against the database's.
    pub skew_ms_max: i64,
    /// Per event and subscriber.
    pub event_drop: f64,
    pub event_duplicate: f64,
    pub event_delay: f64,
    pub event_disconnect: f64,
    /// Per workload step: a storm of events for one container.
    pub event_storm: f64,
    /// Per tick: the proxy restarts without its config (every route lost).
    pub proxy_loss: f64,
    /// Per tick: the proxy is down for a while.
    pub proxy_down: f64,
    /// Per native restart: the runtime holds the container in `restarting`
    /// for a workload step first.
    pub restarting_phase: f64,
    /// Per native restart: the container comes back on new host ports.
    pub rebind_on_restart: f64,
    /// Per operator action: the operator keeps the instance lock a while
    /// longer (a long command), so passes meet a busy instance (R3).
    pub operator_holds_lock: f64,
    /// Per provisioner install and container create: the call takes
    /// minutes (a long task).
    pub long_task: f64,
    /// Per start of a down container: the runtime's own restart policy
    /// brings it up at that very moment, and the start fails (R11's race).
    pub start_race: f64,
}

/// The clock faults of #41, drawn from a stream of their own (seeded from
/// the seed) so that every other fault of a seed stays as it was drawn
/// before they existed.
#[derive(Clone, Debug)]
pub struct ClockFaults {
    /// Per pause: the host is suspended (its VM paused), so the process's
    /// monotonic clock stands still with it.
    pub suspend: f64,
    /// Per tick: the database's clock steps (an NTP step on its host),
    /// either way, and steps back within the tick.
    pub database_step: f64,
    /// Seeds the suspends' own draws.
    pub seed: u64,
}

/// One fault's rate in a seed's mix (swarm testing): off in three seeds in
/// ten, else anywhere below `max`.
fn drawn_rate(rng: &mut ChaCha8Rng, max: f64) -> f64 {
    if rng.random_bool(0.3) {
        0.0
    } else {
        rng.random_range(0.0..max)
    }
}

impl ClockFaults {
    pub fn draw(rng: &mut ChaCha8Rng) -> Self {
        let mut p = |max: f64| drawn_rate(rng, max);
        let (suspend, database_step) = (p(1.0), p(0.03));
        Self {
            suspend,
            database_step,
            seed: rng.random(),
        }
    }
}

impl FaultMix {
    pub fn draw(rng: &mut ChaCha8Rng) -> Self {
        let mut p = |max: f64| drawn_rate(rng, max);
        Self {
            transient: p(0.08),
            hang: p(0.004),
            not_found: p(0.004),
            slow: p(0.05),
            traffic_fail: p(0.1),
            native_restart: p(0.5),
            crash: p(0.05),
            operator: p(0.05),
            daemon_kill: p(0.1),
            store_outage: p(0.05),
            pause: p(0.03),
            pause_after_effect: p(0.01),
            new_identity: p(0.3),
            skew_ms_max: (p(1.0) * 600_000.0) as i64,
            event_drop: p(0.2),
            event_duplicate: p(0.1),
            event_delay: p(0.1),
            event_disconnect: p(0.02),
            event_storm: p(0.01),
            proxy_loss: p(0.02),
            proxy_down: p(0.02),
            restarting_phase: p(0.6),
            rebind_on_restart: p(0.3),
            operator_holds_lock: p(0.6),
            long_task: p(0.5),
            start_race: p(0.3),
        }
    }
}

/// Counts of each fault injected, for the runner's summary.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl FaultCounts {
    pub fn bump(&self, what: &'static str) {
        *self
            .counts
            .lock()
            .expect("poisoned")
            .entry(what)
            .or_default() += 1;
    }
}

/// The swarm injector the ports consult.
pub struct SwarmFaults {
    pub enabled: AtomicBool,
    /// The proxy is down: every traffic call fails.
    pub proxy_down: AtomicBool,
    mix: FaultMix,
    rng: Mutex<ChaCha8Rng>,
    pub counts: Arc<FaultCounts>,
    /// Told about injected not-found answers, which make the engine forget.
    pub checker: std::sync::OnceLock<Arc<Checker>>,
    /// The stead processes' nodes: only they are paused after an effect.
    pub process_nodes: std::sync::OnceLock<Vec<madsim::task::NodeId>>,
    /// Nodes paused right after an effect, for the runner to resume.
    pub paused_after_effect: Mutex<Vec<madsim::task::NodeId>>,
    /// The runtime the faults act in, for the runtime's own restart that
    /// races a start.
    pub runtime: std::sync::OnceLock<std::sync::Weak<MemoryRuntime>>,
    /// Catalog versions whose image is broken (shared with the operators,
    /// who publish them): every container of one fails to create while
    /// the faults last, so upgrades to it fail and halt the rollout.
    pub bad_versions: Arc<Mutex<BTreeSet<u32>>>,
    /// Per read of the routes: the proxy restarts without its config just
    /// before it answers. A retirement reads the routes back right before
    /// it stops the predecessor (S5), so this is what judges that the
    /// read-back is heeded. Drawn, with its decisions, from an rng of its
    /// own: the other faults' draws stay what they were.
    proxy_restart_on_read: f64,
    mid_pass_rng: Mutex<ChaCha8Rng>,
    /// How often a running successor of a retirement-pending predecessor
    /// crashes and is restarted by the runtime just before an inspection
    /// answers (#44), drawn from a stream of its own so the other draws
    /// stay as they were.
    restart_on_inspect: f64,
    /// How often a Helm bake's check cannot reach the cluster (#40: no
    /// verdict), from the same stream.
    release_check_fail: f64,
    look_rng: Mutex<ChaCha8Rng>,
    /// How the seed spells versions, to read one back from a container name.
    pub versions: VersionScheme,
}

impl SwarmFaults {
    pub fn new(
        mix: FaultMix,
        seed: u64,
        counts: Arc<FaultCounts>,
        versions: VersionScheme,
    ) -> Self {
        let mut mid_pass_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let proxy_restart_on_read = if mid_pass_rng.random_bool(0.3) {
            0.0
        } else {
            mid_pass_rng.random_range(0.0..0.05)
        };
        let mut look_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5851_f42d_4c95_7f2d);
        let restart_on_inspect = if look_rng.random_bool(0.3) {
            0.0
        } else {
            look_rng.random_range(0.0..0.3)
        };
        let release_check_fail = if look_rng.random_bool(0.5) {
            0.0
        } else {
            look_rng.random_range(0.0..0.3)
        };
        Self {
            enabled: AtomicBool::new(true),
            proxy_down: AtomicBool::new(false),
            mix,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            counts,
            checker: std::sync::OnceLock::new(),
            process_nodes: std::sync::OnceLock::new(),
            paused_after_effect: Mutex::new(Vec::new()),
            runtime: std::sync::OnceLock::new(),
            bad_versions: Arc::default(),
            proxy_restart_on_read,
            mid_pass_rng: Mutex::new(mid_pass_rng),
            restart_on_inspect,
            release_check_fail,
            look_rng: Mutex::new(look_rng),
            versions,
        }
    }

    /// Whether a container name (`stead.<instance>.<service>.<version>.
    /// <digest>`) is of a broken catalog version.
    fn of_bad_version(&self, container: &str) -> bool {
        let version = self.versions.number(version_of_container(container));
        version.is_some_and(|v| self.bad_versions.lock().expect("poisoned").contains(&v))
    }

    /// The runtime's own restart policy brings a down container up just
    /// as stead starts it (R11): true if it did, and the start must fail.
    fn race_start(&self, subject: &str) -> bool {
        let Some(runtime) = self.runtime.get().and_then(std::sync::Weak::upgrade) else {
            return false;
        };
        let id = ContainerId::new(subject);
        let started = runtime.next_execution();
        let came_up = runtime.with_containers(|cs| match cs.get_mut(&id) {
            Some(c) if c.status.is_down() && !c.stopped_on_request => {
                c.status = ContainerStatus::Running;
                c.started_at = Some(started);
                true
            }
            _ => false,
        });
        if came_up {
            self.counts.bump("start raced the runtime's own restart");
            if let Some(checker) = self.checker.get() {
                checker.container_came_up(&id);
            }
            runtime.emit(&id, RuntimeEventAction::Start);
        }
        came_up
    }

    /// A running container crashes and the runtime's restart policy
    /// brings it up again just before an inspection answers: a new
    /// execution between two looks of one pass (the verification and the
    /// final inspection before a retirement, #44), which no probe saw.
    fn restart_as_inspected(&self, subject: &str) {
        let Some(runtime) = self.runtime.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        let id = ContainerId::new(subject);
        let started = runtime.next_execution();
        let restarted = runtime.with_containers(|cs| match cs.get_mut(&id) {
            Some(c) if c.status == ContainerStatus::Running => {
                c.started_at = Some(started);
                true
            }
            _ => false,
        });
        if restarted {
            self.counts.bump("native restart just before an inspection");
            if let Some(checker) = self.checker.get() {
                checker.container_went_down(&id);
                checker.container_came_up(&id);
            }
            runtime.emit(&id, RuntimeEventAction::Die);
            runtime.emit(&id, RuntimeEventAction::Start);
        }
    }

    /// The fault for one operation, drawn from the seed's mix.
    fn choose(&self, op: Op, subject: &str) -> Fault {
        if self.proxy_down.load(Ordering::Relaxed)
            && matches!(op, Op::Publish | Op::Withdraw | Op::TrafficRead)
        {
            return Fault::Fail("proxy down".into());
        }
        if !self.enabled.load(Ordering::Relaxed) {
            return Fault::Proceed;
        }
        if op == Op::Inspect
            && self
                .checker
                .get()
                .is_some_and(|c| c.succeeds_a_marker(&ContainerId::new(subject)))
            && self
                .look_rng
                .lock()
                .expect("poisoned")
                .random_bool(self.restart_on_inspect)
        {
            self.restart_as_inspected(subject);
        }
        if op == Op::CheckRelease {
            // A bake's check that cannot reach the cluster: no verdict
            // (#40). Never a hang: the double's check has no deadline.
            if self
                .look_rng
                .lock()
                .expect("poisoned")
                .random_bool(self.release_check_fail)
            {
                self.counts
                    .bump("release check could not reach the cluster");
                return Fault::Fail("cluster unreachable".into());
            }
            return Fault::Proceed;
        }
        if op == Op::Create && self.of_bad_version(subject) {
            // An image tag that does not exist: an upgrade to this version
            // can never succeed. The runtime says so (a refused pull, a
            // permanent kind), so the task fails on its first attempt and
            // the rollout halts after one tenant (#45: no retries of what
            // never succeeds).
            self.counts.bump("create of a broken version");
            return Fault::Refused("pull access denied: manifest unknown".into());
        }
        if op == Op::TrafficRead
            && subject == "read routes"
            && self
                .mid_pass_rng
                .lock()
                .expect("poisoned")
                .random_bool(self.proxy_restart_on_read)
        {
            self.counts.bump("proxy restarted as its routes were read");
            return Fault::ProxyRestart;
        }
        let mut rng = self.rng.lock().expect("poisoned");
        let m = &self.mix;
        match op {
            Op::Publish | Op::Withdraw | Op::TrafficRead => {
                if rng.random_bool(m.traffic_fail) {
                    self.counts.bump("traffic failure");
                    return Fault::Fail("proxy unavailable".into());
                }
            }
            Op::Policy | Op::Notify => {}
            // Drawn before, from a stream of its own.
            Op::CheckRelease => {}
            _ => {
                if rng.random_bool(m.hang) {
                    self.counts.bump("hang");
                    return Fault::Hang;
                }
                if rng.random_bool(m.transient) {
                    self.counts.bump("transient error");
                    return Fault::Fail("injected transient error".into());
                }
                // A spurious not-found answers only a start: on inspect,
                // not-found comes from a container an operator really
                // removed (`Actors::operate`), which the checker follows.
                if op == Op::Start && rng.random_bool(m.start_race) {
                    // The race acts in the runtime, whose events consult
                    // this injector's rng: released first.
                    drop(rng);
                    if self.race_start(subject) {
                        return Fault::Fail("container start already in progress".into());
                    }
                    rng = self.rng.lock().expect("poisoned");
                }
                if op == Op::Start && rng.random_bool(m.not_found) {
                    self.counts.bump("not found");
                    if let Some(checker) = self.checker.get() {
                        checker.generation_forgotten(&ContainerId::new(subject));
                        checker.container_reported_gone(&ContainerId::new(subject));
                    }
                    return Fault::NotFound;
                }
            }
        }
        let outside_effect = matches!(
            op,
            Op::Start | Op::Stop | Op::Restart | Op::Remove | Op::Publish | Op::Withdraw
        );
        if outside_effect && rng.random_bool(m.pause_after_effect) {
            // The effect happens; its answer comes after the pause, so the
            // process resumes mid-pass with its leases long gone.
            let node = madsim::plugin::node();
            if self.process_nodes.get().is_some_and(|n| n.contains(&node)) {
                self.counts.bump("daemon paused right after an effect");
                madsim::runtime::Handle::current().pause(node);
                if let Some(checker) = self.checker.get() {
                    checker.events.frozen(node);
                }
                self.paused_after_effect
                    .lock()
                    .expect("poisoned")
                    .push(node);
                return Fault::Slow(Duration::from_millis(1));
            }
        }
        if matches!(op, Op::Install | Op::Create) && rng.random_bool(m.long_task) {
            // A chart that takes minutes to come up, an image pull over a
            // slow link: the task holding it runs for a large part of its
            // lease or beyond, and kills of its process land mid-task.
            self.counts.bump("long task step");
            return Fault::Slow(Duration::from_secs(rng.random_range(60..400)));
        }
        if rng.random_bool(m.slow) {
            self.counts.bump("slow call");
            return Fault::Slow(Duration::from_millis(rng.random_range(10..3_000)));
        }
        Fault::Proceed
    }
}

impl FaultInjector for SwarmFaults {
    fn decide(&self, op: Op, subject: &str) -> Fault {
        // The instant a port is asked to act: T2 is judged here.
        if let Some(checker) = self.checker.get() {
            checker.attempt(op, subject);
        }
        let fault = self.choose(op, subject);
        if let (Op::Start, Fault::Fail(_), Some(checker)) = (op, &fault, self.checker.get()) {
            // What the pass does next is R11's to judge.
            checker.start_refused(&ContainerId::new(subject));
        }
        fault
    }

    fn event_fate(&self, _event: &stead::ports::RuntimeEvent) -> EventFate {
        if !self.enabled.load(Ordering::Relaxed) {
            return EventFate::Deliver;
        }
        let mut rng = self.rng.lock().expect("poisoned");
        let m = &self.mix;
        if rng.random_bool(m.event_disconnect) {
            self.counts.bump("event stream disconnect");
            return EventFate::Disconnect;
        }
        if rng.random_bool(m.event_drop) {
            self.counts.bump("event dropped");
            return EventFate::Drop;
        }
        if rng.random_bool(m.event_duplicate) {
            self.counts.bump("event duplicated");
            return EventFate::Duplicate;
        }
        if rng.random_bool(m.event_delay) {
            self.counts.bump("event delayed");
            return EventFate::Delay(Duration::from_millis(rng.random_range(10..30_000)));
        }
        EventFate::Deliver
    }
}

/// One simulated service and its workload.
#[derive(Clone, Debug)]
pub struct SimService {
    pub key: ServiceKey,
    pub behaviour: Behaviour,
    pub spec: ServiceSpec,
}

/// The workload model and the operators, acting on the ports directly (as
/// the runtime and humans would), never through the engine.
pub struct Actors {
    pub rng: Mutex<ChaCha8Rng>,
    pub mix: FaultMix,
    pub runtime: Arc<MemoryRuntime>,
    pub provisioner: Arc<MemoryProvisioner>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub checker: Arc<Checker>,
    pub services: Mutex<Vec<SimService>>,
    pub locks: Arc<stead::engine::recovery::InstanceLocks>,
    pub counts: Arc<FaultCounts>,
    pub chaos: AtomicBool,
    pub deploys: AtomicU64,
    /// The catalog's version of the service type; operators bump it.
    pub catalog_version: AtomicU32,
    /// How the seed spells versions.
    pub versions: VersionScheme,
    /// The catalog's spec edition: operators change the services' spec
    /// without a new version (C8: an upgrade like any other).
    pub spec_edition: AtomicU32,
    /// The Docker type's bake window (#40): `SIM_BAKE` in even seeds, none
    /// in odd ones (in the chaos, a random crash of a baking successor
    /// reverts and halts the type, so a world that always baked would
    /// upgrade too seldom to judge the rollout's order).
    pub bake: std::time::Duration,
    /// A service the catalog's current version no longer lists: an
    /// operator's bump dropped it (the upgrade retires it), a later bump
    /// may list it again (the upgrade creates it anew).
    pub dropped: Mutex<Option<ServiceName>>,
    /// Instances the operators created so far.
    pub created: AtomicU64,
    /// Catalog versions published with a broken image (`SwarmFaults`).
    pub bad_versions: Arc<Mutex<BTreeSet<u32>>>,
    /// Containers whose healthcheck fails whatever their behaviour, chaos
    /// or not (a calm-phase check makes one sick on purpose).
    pub sick: Mutex<BTreeSet<ContainerId>>,
    /// Whether the operator forced a catalog that renames the Docker
    /// type's volume (N4, `hazards.rs`): every later file keeps the rename.
    pub volume_moved: std::sync::atomic::AtomicBool,
}

impl Actors {
    /// The behaviour of every ACTIVE container; anything else (a candidate,
    /// a predecessor) is healthy, and everything is once chaos ends.
    fn behaviours(&self) -> BTreeMap<ContainerId, Behaviour> {
        let sick = self.sick.lock().expect("poisoned").clone();
        let sick = sick.into_iter().map(|id| (id, Behaviour::NeverHealthy));
        if !self.chaos.load(Ordering::Relaxed) {
            return sick.collect();
        }
        let services = self.services.lock().expect("poisoned");
        let mut behaviours: BTreeMap<ContainerId, Behaviour> = self.checker.truth(|t| {
            services
                .iter()
                .filter_map(|s| t.active.get(&s.key).map(|id| (id.clone(), s.behaviour)))
                .collect()
        });
        behaviours.extend(sick);
        behaviours
    }

    pub fn draw_behaviour(rng: &mut ChaCha8Rng) -> Behaviour {
        BEHAVIOURS[rng.random_range(0..BEHAVIOURS.len())]
    }

    /// One step of every workload (every few simulated seconds).
    pub fn workload_step(&self) {
        let chaos = self.chaos.load(Ordering::Relaxed);
        let ids: Vec<ContainerId> = self.runtime.container_ids();
        let behaviours = self.behaviours();
        for id in ids {
            let behaviour = behaviours.get(&id).copied().unwrap_or(Behaviour::Healthy);
            let (crash, restart, flip, ready_now, storm, via_restarting, new_ports) = {
                let mut rng = self.rng.lock().expect("poisoned");
                (
                    chaos && rng.random_bool(self.mix.crash / 4.0),
                    chaos && rng.random_bool(self.mix.native_restart),
                    rng.random_bool(0.3),
                    rng.random_bool(0.2),
                    chaos && rng.random_bool(self.mix.event_storm),
                    rng.random_bool(self.mix.restarting_phase),
                    rng.random_bool(self.mix.rebind_on_restart),
                )
            };
            let mut went_down = false;
            let mut came_up = false;
            let mut rebound = false;
            let mut health_now = None;
            let started = self.runtime.next_execution();
            self.runtime.with_containers(|cs| {
                let Some(c) = cs.get_mut(&id) else { return };
                let health_before = c.health;
                apply_behaviour(c, behaviour, flip, ready_now);
                if c.health != health_before {
                    health_now = Some(c.health);
                }
                if c.status == ContainerStatus::Running
                    && (crash || behaviour == Behaviour::CrashLoop && chaos)
                {
                    c.status = ContainerStatus::Exited;
                    went_down = true;
                } else if c.status == ContainerStatus::Restarting
                    || (c.status == ContainerStatus::Exited
                        && restart
                        && !went_down
                        && !c.stopped_on_request)
                {
                    // The runtime's own restart policy, racing the engine:
                    // at once, or through `restarting` (its backoff) for a
                    // step, which the engine must leave alone.
                    if c.status == ContainerStatus::Exited && via_restarting {
                        c.status = ContainerStatus::Restarting;
                        return;
                    }
                    c.status = ContainerStatus::Running;
                    c.started_at = Some(started);
                    if new_ports {
                        // Ephemeral host ports are drawn anew on a restart:
                        // the route must follow (R8's binds check).
                        for host in c.binds.values_mut() {
                            *host = self.runtime.alloc_port();
                        }
                        rebound = true;
                    }
                    came_up = true;
                }
            });
            if rebound {
                self.counts.bump("native restart on new ports");
            }
            // The runtime tells its event stream what happened (T7).
            if let Some(health) = health_now {
                self.runtime
                    .emit(&id, RuntimeEventAction::HealthStatus(health));
            }
            if went_down {
                self.counts.bump("workload crash");
                self.checker.container_went_down(&id);
                self.runtime.emit(&id, RuntimeEventAction::Die);
            }
            if came_up {
                self.counts.bump("native restart");
                self.checker.container_came_up(&id);
                self.runtime.emit(&id, RuntimeEventAction::Start);
            }
            if storm {
                // A flapping container, or a restart loop elsewhere on the
                // host: hundreds of events for one instance at once.
                self.counts.bump("event storm");
                for _ in 0..EVENT_STORM_LEN {
                    self.runtime
                        .emit(&id, RuntimeEventAction::HealthStatus(Health::Unhealthy));
                }
            }
        }
    }

    /// One operator action, chosen at random, under the instance lock.
    pub async fn operator_step(&self) {
        let (which, pick) = {
            let mut rng = self.rng.lock().expect("poisoned");
            (rng.random_range(0..11u32), rng.random_range(0..usize::MAX))
        };
        if which == 9 {
            self.create_instance(pick).await;
            return;
        }
        if which == 10 {
            self.delete_instance(pick).await;
            return;
        }
        if which == 4 && pick % 2 == 0 {
            self.uninstall_helm_by_hand(pick).await;
            return;
        }
        if pick % 3 == 1 && self.catalog_is_broken() {
            self.undo_rollout_to().await;
            return;
        }
        if pick % 6 == 0 && !self.bake.is_zero() && self.something_bakes().await {
            // Not under an instance lock of the operator's own: the undo
            // takes each instance's lock in turn, as the CLI does. (Taken
            // under one, it waited out its own lock and found that
            // instance busy every time.)
            self.undo_rollout().await;
            return;
        }
        let services = self.services.lock().expect("poisoned").clone();
        if services.is_empty() {
            return;
        }
        let svc = &services[pick % services.len()];
        let Ok(Some(instance)) = self.store.instance(&svc.key.instance).await else {
            return;
        };
        let Ok(guard) = self.lock_as_operator(instance.id).await else {
            return;
        };
        self.operate(which, pick, svc).await;
        let hold = {
            let mut rng = self.rng.lock().expect("poisoned");
            rng.random_bool(self.mix.operator_holds_lock)
                .then(|| Duration::from_secs(rng.random_range(5..25)))
        };
        if let Some(hold) = hold {
            self.counts.bump("operator held an instance lock");
            tokio::time::sleep(hold).await;
        }
        guard.release().await;
    }

    /// Operators take the instance lock as workers do (T3), waiting a
    /// bounded while for it as the CLI does.
    async fn lock_as_operator(
        &self,
        instance: i64,
    ) -> Result<stead::engine::locks::InstanceGuard, stead::engine::locks::LockError> {
        self.locks
            .lock(
                instance,
                "operator",
                Duration::from_secs(60),
                Duration::from_secs(20),
            )
            .await
    }

    /// `stead instance stop` or `start`, under the instance lock the
    /// caller holds: true if the store took it.
    async fn set_intent(&self, instance: &Instance, stopped: bool) -> bool {
        if self
            .store
            .set_instance_stopped(instance.id, stopped, self.clock.now())
            .await
            .is_err()
        {
            return false;
        }
        self.checker.truth(|t| {
            if stopped {
                t.stopped.insert(instance.name.clone());
            } else {
                t.stopped.remove(&instance.name);
            }
        });
        if stopped {
            self.checker.instance_stopped(&instance.name);
        }
        true
    }

    /// An operator stops or starts `name` by hand, taking its lock as the
    /// CLI does: true if it took effect.
    pub async fn stop_or_start(&self, name: &InstanceName, stopped: bool) -> bool {
        let Ok(Some(instance)) = self.store.instance(name).await else {
            return false;
        };
        let Ok(guard) = self.lock_as_operator(instance.id).await else {
            return false;
        };
        let done = self.set_intent(&instance, stopped).await;
        guard.release().await;
        done
    }

    async fn operate(&self, which: u32, pick: usize, svc: &SimService) {
        let Ok(Some(instance)) = self.store.instance(&svc.key.instance).await else {
            return;
        };
        if matches!(
            instance.state,
            InstanceState::Deleting | InstanceState::Deleted
        ) {
            return;
        }
        let Some(current) = self.checker.truth(|t| t.active.get(&svc.key).cloned()) else {
            return;
        };
        match which {
            0 => {
                if self.set_intent(&instance, !instance.stopped).await {
                    self.counts.bump("operator toggled intent");
                }
            }
            1 => {
                let inhibition = Inhibition {
                    service: svc.key.service.clone(),
                    container: current.clone(),
                    reason: InhibitionReason::Hold("operator-hold".into()),
                    operation: "sim".into(),
                    created_at: self.clock.now(),
                    stop_grace: None,
                    revert_to: None,
                };
                if self
                    .store
                    .save_inhibition(&instance.name, &inhibition)
                    .await
                    .is_ok()
                {
                    self.counts.bump("operator inhibited");
                }
            }
            2 => {
                let _ = self
                    .store
                    .clear_inhibition(&instance.name, &svc.key.service, &current, None)
                    .await;
            }
            3 => self.deploy(svc, &current).await,
            8 => {
                // `docker rm -f` by hand. Recovery withdraws its traffic and
                // releases its claims (R7), and never rebuilds it; drift
                // reprovisions the instance, which creates it again.
                if self.runtime.remove_by_hand(&current) {
                    self.counts.bump("operator removed a container");
                    self.checker
                        .container_removed_by_hand(instance.name.as_str(), &current);
                    self.checker.generation_forgotten(&current);
                }
            }
            4 => {
                // Someone runs `helm uninstall` by hand (C5: drift repairs).
                self.uninstall_by_hand(instance.name.as_str());
                self.counts.bump("operator uninstalled by hand");
            }
            5 if pick % 3 == 0 => {
                // The catalog's spec changes under the same version (an
                // image digest, an argument): version drift upgrades every
                // instance that records the old spec, as for a new version.
                self.spec_edition.fetch_add(1, Ordering::Relaxed);
                self.counts
                    .bump("operator changed the spec without a new version");
            }
            5 => {
                // Another tool's release appears: never ours to delete (S8).
                let name = format!("foreign-{pick}");
                self.checker.foreign_release_appeared(&name);
                self.provisioner.add_foreign(&name);
                self.counts.bump("foreign release");
            }
            6 => {
                // A new version in the catalog: version drift upgrades the
                // fleet through the queue, inside the maintenance windows.
                let toggle = self.rng.lock().expect("poisoned").random_ratio(1, 3);
                if toggle {
                    // The new version drops the second service, or lists a
                    // dropped one again.
                    let mut dropped = self.dropped.lock().expect("poisoned");
                    *dropped = match dropped.take() {
                        Some(_) => {
                            self.counts.bump("operator listed a dropped service again");
                            None
                        }
                        None => {
                            self.counts.bump("operator dropped a service");
                            Some(service_name(1))
                        }
                    };
                }
                let version = self.catalog_version.fetch_add(1, Ordering::Relaxed) + 1;
                self.counts.bump("operator bumped catalog");
                if pick % 3 == 2 {
                    // The release of an instance now behind the catalog is
                    // gone before the daemons plan its upgrade: drift must
                    // reprovision it first, and no upgrade may race that
                    // (C5 before C8).
                    self.uninstall_by_hand(instance.name.as_str());
                    self.counts
                        .bump("operator uninstalled a release the new version upgrades");
                }
                if self.rng.lock().expect("poisoned").random_ratio(1, 4) {
                    self.bad_versions.lock().expect("poisoned").insert(version);
                    // Its chart too: a Helm release at it fails its chart
                    // tests, which a bake finds (#40).
                    self.provisioner.go_bad(&self.versions.render(version));
                    self.counts.bump("operator published a broken version");
                }
                // Only a version stead can order can be ahead of a catalog
                // (an opaque one differing from the catalog's is behind it).
                if self.versions.ordered() && self.rng.lock().expect("poisoned").random_ratio(1, 2)
                {
                    // The operator's CLI has the new catalog before the
                    // daemons are restarted with it: an instance created
                    // now is at a version the workers do not have yet
                    // (seed 780 of 501-2500 found a worker installing its
                    // older version under the newer one's name).
                    self.counts
                        .bump("operator created an instance ahead of the daemons' catalog");
                    self.create_instance(pick).await;
                }
            }
            7 => {
                let halted = self
                    .store
                    .rollouts()
                    .await
                    .is_ok_and(|r| r.get(SERVICE_TYPE) == Some(&RolloutState::Halted));
                let next = if halted {
                    RolloutState::Active
                } else {
                    RolloutState::Halted
                };
                let now = self.clock.now();
                if self
                    .store
                    .set_rollout(SERVICE_TYPE, next, "sim operator", now, None)
                    .await
                    .is_ok()
                {
                    if next == RolloutState::Halted {
                        // As `stead rollout halt` does (`Ops::set_rollout`):
                        // the type's queued upgrades are cancelled too.
                        let _ = self
                            .store
                            .cancel_queued_upgrades(
                                SERVICE_TYPE,
                                stead::core::fleet::CANCELLED_BY_HALT,
                                now,
                            )
                            .await;
                    }
                    self.counts.bump(if halted {
                        "operator resumed rollout"
                    } else {
                        "operator halted rollout"
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether the catalog's version is one published broken.
    fn catalog_is_broken(&self) -> bool {
        let current = self.catalog_version.load(Ordering::Relaxed);
        self.bad_versions
            .lock()
            .expect("poisoned")
            .contains(&current)
    }

    /// Whether an upgrade of the Docker type bakes now: an undo then has
    /// something to put back (at a random moment it rarely has).
    async fn something_bakes(&self) -> bool {
        let now = self.clock.now();
        let Ok(instances) = self.store.list_instances().await else {
            return false;
        };
        for instance in instances
            .rows
            .iter()
            .filter(|i| i.service_type == SERVICE_TYPE)
        {
            if let Ok(markers) = self.store.load_inhibitions(&instance.name).await {
                if markers.iter().any(|m| m.bakes_at(now).is_some()) {
                    return true;
                }
            }
        }
        false
    }

    /// `stead rollout undo --to VERSION` (#40) once the catalog's version
    /// is a broken one, through the operator's own code: the newest other
    /// version the daemons recorded that is not broken. The type is pinned
    /// to it; the checker learns which instances a task held meanwhile.
    async fn undo_rollout_to(&self) {
        let current = self.catalog_version.load(Ordering::Relaxed);
        let Ok(recorded) = self.store.type_versions(SERVICE_TYPE).await else {
            return;
        };
        let good = |v: &stead::ports::TypeVersion| {
            self.versions.number(&v.version).is_some_and(|n| {
                n != current && !self.bad_versions.lock().expect("poisoned").contains(&n)
            })
        };
        let Some(to) = recorded.iter().rev().find(|v| good(v)) else {
            return;
        };
        let catalog = Arc::new(crate::run::sim_catalog(self, current, false));
        let to = to.version.clone();
        let nonce = self.rng.lock().expect("poisoned").random();
        let ops = stead::ops::Ops::new(self.store.as_ref(), catalog, self.clock.now(), nonce);
        match ops.undo_rollout_to(SERVICE_TYPE, &to).await {
            Ok(undo) => {
                self.counts
                    .bump("operator undid the rollout to a recorded version");
                if !undo.moving.is_empty() {
                    self.counts
                        .bump("operator undo --to moved an instance back");
                }
                // A new instance while pinned, by hand at the catalog's
                // version: it is provisioned at the pinned one.
                let pick = self
                    .rng
                    .lock()
                    .expect("poisoned")
                    .random_range(0..usize::MAX);
                // Of the Docker type (even), and not deleted at once (no
                // multiple of three): `create_instance` reads both off it.
                self.create_instance(pick / 6 * 6 + 2).await;
            }
            // A store fault: the pin, if it landed, holds (the checker
            // learnt it as it landed), and a later undo finds the rest.
            Err(_) => self.counts.bump("operator undo --to failed"),
        }
    }

    /// `stead rollout undo` (#40), through the operator's own code: the
    /// type halted, every instance whose upgrade still bakes put back on
    /// its kept predecessors under its lock.
    async fn undo_rollout(&self) {
        let version = self.catalog_version.load(Ordering::Relaxed);
        let catalog = Arc::new(crate::run::sim_catalog(self, version, false));
        let nonce = self.rng.lock().expect("poisoned").random();
        let ops = stead::ops::Ops::new(self.store.as_ref(), catalog, self.clock.now(), nonce);
        match ops.undo_rollout(SERVICE_TYPE).await {
            Ok(undo) => {
                self.counts.bump("operator undid the rollout");
                if !undo.reverted.is_empty() {
                    self.counts.bump("operator undo put an instance back");
                }
                if !undo.busy.is_empty() {
                    self.counts.bump("operator undo found an instance busy");
                }
            }
            // A store fault: the halt, if it landed, holds, and a later
            // undo finds the rest.
            Err(_) => self.counts.bump("operator undo failed"),
        }
    }

    /// `helm uninstall` (or its Docker equivalent) run by hand: the release
    /// is gone, and the checker knows since when (C5).
    fn uninstall_by_hand(&self, release: &str) {
        self.provisioner.remove_by_hand(release);
        self.checker
            .release_removed_by_hand(release, self.clock.now());
    }

    /// Someone runs `helm uninstall` on a Helm instance's release by hand:
    /// drift must reinstall it, and only it (C5).
    async fn uninstall_helm_by_hand(&self, pick: usize) {
        let Ok(rows) = self.store.list_instances().await else {
            return;
        };
        let helm: Vec<_> = rows
            .rows
            .iter()
            .filter(|i| is_helm_instance(i.name.as_str()) && i.state == InstanceState::Ready)
            .collect();
        if let Some(instance) = helm.get(pick % helm.len().max(1)) {
            self.uninstall_by_hand(instance.name.as_str());
            self.counts
                .bump("operator uninstalled a helm release by hand");
        }
    }

    /// `stead instance delete`, under the instance lock, preferably of an
    /// instance with work queued, parked behind a window or running: the
    /// race T4 is about.
    async fn delete_instance(&self, pick: usize) {
        let Ok(tasks) = self.store.active_tasks().await else {
            return;
        };
        let busy: Vec<i64> = tasks
            .rows
            .iter()
            .filter(|t| t.kind != TaskKind::Deprovision)
            .map(|t| t.instance)
            .collect();
        let Ok(rows) = self.store.list_instances().await else {
            return;
        };
        let live: Vec<_> = rows
            .rows
            .into_iter()
            .filter(|i| !matches!(i.state, InstanceState::Deleting | InstanceState::Deleted))
            .collect();
        let candidates: Vec<_> = live.iter().filter(|i| busy.contains(&i.id)).collect();
        let target = if candidates.is_empty() {
            live.get(pick % live.len().max(1))
        } else {
            Some(candidates[pick % candidates.len()])
        };
        if let Some(target) = target {
            self.delete(target.id).await;
        }
    }

    /// Deletes one instance with the command `stead instance delete` runs
    /// (`stead::ops`): under the instance lock, from another process (T3),
    /// cancelling queued tasks in the deletion's transaction (T4).
    async fn delete(&self, id: i64) {
        let Ok(Some(instance)) = self.store.instance_by_id(id).await else {
            return;
        };
        let seed = self.rng.lock().expect("poisoned").random();
        let ops = stead::ops::Ops::new(
            self.store.as_ref(),
            Default::default(),
            self.clock.now(),
            seed,
        );
        if let Ok(stead::ops::Deletion::Started { .. }) =
            ops.delete(instance.name.as_str(), false).await
        {
            self.counts.bump("operator deleted instance");
        }
    }

    /// `stead instance create`: a new row and a provision task, for the
    /// worker to install and create; half of them with a TTL.
    async fn create_instance(&self, pick: usize) {
        let n = self.created.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let ttl = (pick % 2 == 0).then(|| Duration::from_secs(600 + (pick as u64 % 10_000)));
        // Some are of the Helm type: their provision installs a chart and
        // must create no container.
        let helm = pick % 4 == 1;
        let service_type = if helm { HELM_TYPE } else { SERVICE_TYPE };
        // At the version an undo pins the type to, while it does, as
        // `Ops::create` makes it; otherwise the operator's catalog's.
        let pinned = self.store.rollout_records().await.ok().and_then(|records| {
            records
                .into_iter()
                .find(|r| r.service_type == service_type && r.state == RolloutState::Halted)
                .and_then(|r| r.pinned)
        });
        let version = pinned.unwrap_or_else(|| {
            self.versions
                .render(self.catalog_version.load(Ordering::Relaxed))
        });
        let new = NewInstance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            name: if helm {
                InstanceName::new(format!("chart-new{n}"))
            } else {
                InstanceName::new(format!("new{n}"))
            },
            team: team_of(pick).into(),
            service_type: service_type.into(),
            version,
            expires_at: ttl.map(|ttl| stead::core::fleet::add(now, ttl)),
            maintenance_window: None,
        };
        let Ok(instance) = self.store.create_instance(&new, now).await else {
            return;
        };
        let task = NewTask {
            kind: TaskKind::Provision,
            instance: instance.id,
            run_after: now,
            reason: "sim operator: instance create".into(),
            traceparent: None,
        };
        if self.store.enqueue(&task, now, None).await.is_ok() {
            self.counts.bump("operator created instance");
            // Changed their mind at once: deleted while its provision is
            // still queued (T4: it must never be built).
            if pick % 3 == 0 {
                self.delete(instance.id).await;
            }
        }
    }

    /// Deploys a new generation: create it, switch ACTIVE, mark the
    /// predecessor retirement-pending — what an upgrade worker does.
    async fn deploy(&self, svc: &SimService, current: &ContainerId) {
        if svc.spec.update == stead::core::spec::UpdateStrategy::StopFirst {
            // This hand-made deploy overlaps; an operator leaves a
            // stop-first service to stead's upgrades (V1).
            return;
        }
        let n = self.deploys.fetch_add(1, Ordering::Relaxed);
        let Ok(Some(owner)) = self.store.instance(&svc.key.instance).await else {
            return;
        };
        let request = CreateContainer {
            instance: svc.key.instance.clone(),
            instance_id: owner.id,
            env: Vec::new(),
            spec: svc.spec.clone(),
            revision: format!("d{n}"),
        };
        let Ok(id) = MemoryRuntime::id_of(&request) else {
            return;
        };
        self.checker
            .truth(|t| t.operator_created.insert(id.clone()));
        let Ok(id) = self.runtime.create(&request).await else {
            return;
        };
        let marker = Inhibition {
            service: svc.key.service.clone(),
            container: current.clone(),
            reason: InhibitionReason::RetirementPending,
            operation: "upgrade".into(),
            created_at: self.clock.now(),
            stop_grace: Some(Duration::from_secs(5)),
            revert_to: None,
        };
        // Marker first: a crash between the two writes leaves a marker on
        // the still-ACTIVE container, which the pass simply clears.
        if self
            .store
            .save_inhibition(&svc.key.instance, &marker)
            .await
            .is_err()
        {
            return;
        }
        let active = ActiveService {
            container: id.clone(),
            effective_revision: request.revision.clone(),
            binds: Default::default(),
            stop_grace: Some(Duration::from_secs(5)),
            verified_started_at: None,
        };
        if self
            .store
            .save_active_service(&svc.key.instance, &svc.key.service, &active)
            .await
            .is_ok()
        {
            self.counts.bump("operator deployed");
        }
    }

    /// Markers whose retirement finished are dropped from the truth.
    pub fn forget_retired(&self) {
        let present: Vec<ContainerId> = self.runtime.container_ids();
        self.checker
            .truth(|t| t.markers.retain(|id, _| present.contains(id)));
    }
}

fn apply_behaviour(c: &mut MemContainer, behaviour: Behaviour, flip: bool, ready_now: bool) {
    match behaviour {
        Behaviour::Healthy | Behaviour::CrashAfterUptime | Behaviour::CrashLoop => {
            c.health = Health::Healthy;
            c.ready = true;
        }
        Behaviour::FlappingHealth => {
            // Around the restart threshold: unhealthy for a read or two,
            // then healthy again, or `starting` (a healthcheck that has not
            // answered yet), which also breaks an unhealthy streak (R12).
            if flip {
                c.health = match (c.health, ready_now) {
                    (_, true) => Health::Starting,
                    (Health::Healthy, false) => Health::Unhealthy,
                    (_, false) => Health::Healthy,
                };
            }
            c.ready = true;
        }
        Behaviour::NeverHealthy => {
            c.health = Health::Unhealthy;
            c.ready = true;
        }
        Behaviour::SlowReady => {
            c.health = Health::Healthy;
            if ready_now {
                c.ready = true;
            } else if c.health == Health::Starting {
                c.ready = false;
            }
        }
        Behaviour::NoHealthcheck => {
            c.health = Health::None;
            c.ready = true;
        }
    }
}

/// Events in one storm.
const EVENT_STORM_LEN: usize = 300;

/// The name of the `i`-th simulated instance. Names are prefixes of each
/// other, and instance and service names glue into each other under a
/// dashed scheme (`a-api`/`web` vs `a`/`api-web`), so a name encoding that
/// is not injective collides here (T6).
pub fn instance_name(i: usize) -> InstanceName {
    let names = ["a", "a-api", "app", "app-web", "b", "b-web"];
    match names.get(i) {
        Some(name) => InstanceName::new(*name),
        None => InstanceName::new(format!("inst{i}")),
    }
}

/// The name of the `j`-th service.
pub fn service_name(j: usize) -> ServiceName {
    match ["web", "api-web", "worker"].get(j) {
        Some(name) => ServiceName::new(*name),
        None => ServiceName::new(format!("svc{j}")),
    }
}

/// Whether `service` publishes a port. `worker` has none: like a queue
/// worker or a database reached on the instance network, it is verified
/// and never routed (the proxy refuses a route without an upstream).
pub fn has_ports(service: &ServiceName) -> bool {
    service.as_str() != "worker"
}

/// The public host names (#54) of `service` in the Docker type: `web`
/// has a literal name every instance of the type claims, so they contend
/// for it (the first to publish holds it until it is deleted), and a name
/// of each instance's own.
pub fn domains_of(service: &ServiceName) -> Vec<stead::core::domains::DomainTemplate> {
    if service.as_str() != "web" {
        return Vec::new();
    }
    ["shop.example.com", "{instance}.example.com"]
        .into_iter()
        .map(|t| stead::core::domains::DomainTemplate::parse(t).expect("a checked template"))
        .collect()
}

/// Teams of the fleet: the control config's own team (`platform`, which
/// upgrades first, C8) and two tenants.
pub fn team_of(i: usize) -> &'static str {
    ["red", "platform", "blue"][i % 3]
}

/// The Docker service type of the simulated fleet.
pub const SERVICE_TYPE: &str = "app";

/// The Helm service type: its instances run in "Kubernetes" (the memory
/// provisioner), so no container, route or recovery may ever touch them,
/// and its upgrades go through the provisioner.
pub const HELM_TYPE: &str = "chart";

/// How a seed spells its catalog versions (drawn from the seed, so every
/// other draw stays as it was). The counter behind each version (1, 2, ...)
/// is the world's truth; how stead orders them is the rule under test:
/// numeric versions compare numerically (C8: never a downgrade), any other
/// version is behind whenever it differs from the catalog's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionScheme {
    /// `3`
    Plain,
    /// `2.0.11`: the patch crosses 9 to 10 at the second bump, where a
    /// comparison of strings would go wrong.
    Semver,
    /// `v3.0`
    Prefixed,
    /// `1.0.0.0.0.0.0.0.3`: more components than stead compares, so an
    /// opaque version.
    Long,
    /// `build-3`: not numeric, an opaque version.
    Named,
}

impl VersionScheme {
    pub fn of_seed(seed: u64) -> Self {
        match (seed / 3) % 5 {
            0 => Self::Plain,
            1 => Self::Semver,
            2 => Self::Prefixed,
            3 => Self::Long,
            _ => Self::Named,
        }
    }

    /// The catalog's spelling of version `n`.
    pub fn render(self, n: u32) -> String {
        match self {
            Self::Plain => n.to_string(),
            Self::Semver => format!("2.0.{}", n + 8),
            Self::Prefixed => format!("v{n}.0"),
            Self::Long => format!("1.0.0.0.0.0.0.0.{n}"),
            Self::Named => format!("build-{n}"),
        }
    }

    /// The counter behind a version this scheme rendered.
    pub fn number(self, version: &str) -> Option<u32> {
        match self {
            Self::Plain => version.parse().ok(),
            Self::Semver => version
                .strip_prefix("2.0.")?
                .parse::<u32>()
                .ok()?
                .checked_sub(8),
            Self::Prefixed => version.strip_prefix('v')?.strip_suffix(".0")?.parse().ok(),
            Self::Long => version.strip_prefix("1.0.0.0.0.0.0.0.")?.parse().ok(),
            Self::Named => version.strip_prefix("build-")?.parse().ok(),
        }
    }

    /// Whether stead can order these versions (numeric ones): only then can
    /// an instance be ahead of a catalog without being upgraded back.
    pub fn ordered(self) -> bool {
        matches!(self, Self::Plain | Self::Semver | Self::Prefixed)
    }
}

/// A service type the catalog does not list (removed while instances of it
/// remained).
pub const LEGACY_TYPE: &str = "legacy";

/// Instances of the Helm type are named so the checker knows them at once.
pub fn helm_instance_name(k: usize) -> InstanceName {
    InstanceName::new(format!("chart{k}"))
}

/// The version in a container's name (`stead.<instance>.<service>.
/// <version>.<digest>`): the first three dots end the prefix, the instance
/// and the service; the last one begins the spec digest.
pub fn version_of_container(container: &str) -> &str {
    let revision = container.splitn(4, '.').nth(3).unwrap_or_default();
    revision.rsplit_once('.').map_or(revision, |(v, _)| v)
}

pub fn is_helm_instance(name: &str) -> bool {
    name.starts_with("chart")
}
