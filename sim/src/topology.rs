//! The production topologies of docs/operations.md, "Topologies", as simulated processes.
//!
//! Each stead process is a madsim node running exactly what the daemon
//! runs for its role: the reconciler's tick loop, the event follower and
//! its draining workers, and task workers, all on one store, one runtime
//! and one traffic plane. A process has its own memory, its own in-process
//! locks, its own wall clock (skewed against the database's) and its own
//! identity; killing a node loses all of that, restarting it runs a new
//! incarnation (mostly under the same identity, sometimes under a new one,
//! as when a data directory is lost), and pausing it freezes it mid-flight
//! for longer than its leases.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use stead::core::catalog::Catalog;
use stead::core::fleet::TaskRetryPolicy;
use stead::core::plan::ControlConfig;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::core::types::Timestamp;
use stead::engine::clock::AnchoredClock;
use stead::engine::event_log::{EventSink, EVENT_BUFFER_MAX};
use stead::engine::events::{drain, follow};
use stead::engine::lease::{LeaseGuard, ProcessIdentity};
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::tick::Reconciler;
use stead::engine::wake::WakeQueue;
use stead::engine::worker::{Worker, WorkerConfig};
use stead::engine::{Ports, SystemClock};
use stead::ports::{Clock, RuntimeEvents, Store};
use stead_testkit::ports::{
    MemoryNotifier, MemoryPolicy, MemoryProbe, MemoryProvisioner, MemoryRuntime, MemoryTraffic,
};
use stead_testkit::store::MemoryStore;

use crate::checker::{Checker, Ticked};
use crate::judge::PassJudge;

/// What a process runs (`stead run --role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reconciler and workers: the one-host default.
    All,
    /// The reconciler only (a leader or a standby).
    Reconciler,
    /// Task workers only.
    Worker,
}

impl Role {
    pub fn reconciles(self) -> bool {
        matches!(self, Role::All | Role::Reconciler)
    }
    pub fn works(self) -> bool {
        matches!(self, Role::All | Role::Worker)
    }
}

/// The processes of one run, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Topology {
    pub roles: Vec<Role>,
}

impl Topology {
    /// One of the supported topologies (docs/operations.md): one host; a
    /// standby reconciler; split roles; split roles with a standby.
    pub fn draw(choice: u64) -> Self {
        let roles = match choice % 4 {
            0 => vec![Role::All],
            1 => vec![Role::All, Role::All],
            2 => vec![Role::Reconciler, Role::Worker],
            _ => vec![
                Role::Reconciler,
                Role::Reconciler,
                Role::Worker,
                Role::Worker,
            ],
        };
        Self { roles }
    }
}

/// Everything the processes share: the one database, runtime, proxy and
/// provisioner of the deployment, and the catalog file.
pub struct Shared {
    pub store: Arc<MemoryStore>,
    pub runtime: Arc<MemoryRuntime>,
    pub traffic: Arc<MemoryTraffic>,
    pub provisioner: Arc<MemoryProvisioner>,
    pub probe: Arc<MemoryProbe>,
    pub notifier: Arc<MemoryNotifier>,
    pub checker: Arc<Checker>,
    pub catalog: Mutex<Arc<Catalog>>,
    pub policy: RecoveryPolicy,
    pub control: ControlConfig,
    pub tick: Duration,
    /// Whether processes follow the runtime's event stream.
    pub events: bool,
    pub seed: u64,
}

/// One process slot: a host that runs one stead process, restarted in
/// place.
pub struct Slot {
    pub index: usize,
    pub role: Role,
    identity: Mutex<String>,
    /// The identity lock the process holds (`core::succession`: its
    /// incarnations are `<site>.i<n>`): the slot's own, or, for a twin
    /// started beside it from a copy of its `state_dir`, another.
    site: String,
    incarnations: AtomicU64,
    /// The host's wall clock minus the database's, in milliseconds.
    skew_ms: AtomicI64,
    /// While set, the process runs but its node is paused by the runner.
    pub paused: AtomicBool,
    /// How long, in all, the host stood still suspended: its monotonic
    /// clock did not move meanwhile (#41).
    stood_still_ms: AtomicU64,
    /// Each incarnation's event sink (#42), for its drop count.
    sinks: Mutex<Vec<(String, EventSink)>>,
}

impl Slot {
    pub fn new(index: usize, role: Role, skew_ms: i64) -> Self {
        Self {
            index,
            role,
            identity: Mutex::new(format!("host{index}-a")),
            site: format!("s{index}"),
            incarnations: AtomicU64::new(0),
            skew_ms: AtomicI64::new(skew_ms),
            paused: AtomicBool::new(false),
            stood_still_ms: AtomicU64::new(0),
            sinks: Mutex::default(),
        }
    }

    /// Per incarnation (writer), the events its sink dropped.
    pub fn events_dropped(&self) -> Vec<(String, u64)> {
        let sinks = self.sinks.lock().expect("poisoned");
        sinks
            .iter()
            .map(|(writer, sink)| (writer.clone(), sink.dropped()))
            .collect()
    }

    /// The host was suspended for `d` (called while its node is paused):
    /// its monotonic clock resumes where it stopped.
    pub fn stood_still(&self, d: Duration) {
        self.stood_still_ms
            .fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// A second process of `slot`'s identity, as a copied `state_dir` or a
    /// cloned VM image starts one (#41 item 3): the same identity and role,
    /// at another site (another identity lock), with a wall clock of its
    /// own; its `n`th twin.
    pub fn twin_of(slot: &Slot, n: u64, skew_ms: i64) -> Self {
        Self {
            identity: Mutex::new(slot.identity()),
            site: format!("t{}x{n}", slot.index),
            ..Self::new(slot.index, slot.role, skew_ms)
        }
    }

    /// The host lost its data directory: the next run is a stranger.
    pub fn new_identity(&self) {
        let mut identity = self.identity.lock().expect("poisoned");
        let next = format!("{identity}x");
        *identity = next;
    }

    pub fn set_skew_ms(&self, skew_ms: i64) {
        self.skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    fn identity(&self) -> String {
        self.identity.lock().expect("poisoned").clone()
    }
}

/// A host's clocks: its wall clock the true time off by the slot's skew;
/// its monotonic clock the simulation's, less the time the host stood
/// still since this process started.
struct SkewedClock {
    skew_ms: Arc<Slot>,
    /// The monotonic clock's origin, and how long the host had stood
    /// still by then.
    origin: (tokio::time::Instant, u64),
}

impl SkewedClock {
    fn new(slot: Arc<Slot>) -> Self {
        let stood_still = slot.stood_still_ms.load(Ordering::Relaxed);
        Self {
            skew_ms: slot,
            origin: (tokio::time::Instant::now(), stood_still),
        }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let skew = self.skew_ms.skew_ms.load(Ordering::Relaxed);
        let true_now = SystemClock.now();
        let skew = jiff::SignedDuration::from_millis(skew);
        true_now.checked_add(skew).unwrap_or(true_now)
    }

    fn monotonic(&self) -> tokio::time::Instant {
        let (origin, stood_still_then) = self.origin;
        let stood_still = self.skew_ms.stood_still_ms.load(Ordering::Relaxed) - stood_still_then;
        origin
            + origin
                .elapsed()
                .saturating_sub(Duration::from_millis(stood_still))
    }
}

/// Task workers per process that works.
const WORKERS_PER_PROCESS: u32 = 2;
/// Event-draining workers per reconciler.
const EVENT_WORKERS: usize = 2;
/// Wake-ups one process's queue holds.
const WAKE_CAPACITY: usize = 1024;

/// The body of one process: runs until its node is killed.
pub async fn process_main(slot: Arc<Slot>, shared: Arc<Shared>) {
    let incarnation = slot.incarnations.fetch_add(1, Ordering::Relaxed) + 1;
    let identity = ProcessIdentity {
        identity: slot.identity(),
        incarnation: format!("{}.i{incarnation}", slot.site),
    };
    shared
        .checker
        .process_started(madsim::plugin::node(), &identity, slot.role);
    let clock: Arc<dyn Clock> = Arc::new(
        AnchoredClock::new(Arc::new(SkewedClock::new(slot.clone())))
            .with_broken(shared.policy.broken),
    );
    let catalog = shared.catalog.lock().expect("poisoned").clone();
    let ports = Ports {
        clock: clock.clone(),
        runtime: shared.runtime.clone(),
        traffic: shared.traffic.clone(),
        store: shared.store.clone(),
        probe: shared.probe.clone(),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: shared.provisioner.clone(),
        notifier: shared.notifier.clone(),
    };
    let locks = Arc::new(InstanceLocks::new(shared.store.clone()).timed_by(clock.clone()));
    // T1: as the daemon does at start: its own site's earlier
    // incarnations are gone, a twin's are not.
    let _ = shared
        .store
        .requeue_tasks_of(&identity.predecessors_prefix(), clock.now())
        .await;
    let _ = shared
        .store
        .clear_instance_locks_of(&identity.predecessors_prefix())
        .await;
    let (_stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::new();
    // The event log (#42), as the daemon writes it: a bounded sink, and
    // its flusher into the one store; both die with the process. The
    // flusher runs at the end of each tick, inline, not as a task of its
    // own (`events.rs` says why).
    let (events, flusher) = EventSink::new(identity.holder(), EVENT_BUFFER_MAX);
    // Kept to the process's end where no tick takes it: a worker-only
    // process's events stay buffered (not judged).
    let mut flusher = Some(flusher);
    slot.sinks
        .lock()
        .expect("poisoned")
        .push((identity.holder(), events.clone()));
    if slot.role.reconciles() {
        let lease = Arc::new(
            LeaseGuard::new(
                identity.holder(),
                reconciler_lease_ttl(
                    shared.control.tick_interval,
                    shared.policy.instance_deadline,
                ),
                LEASE_MARGIN,
            )
            .timed_by(clock.clone()),
        );
        let recoverer = Arc::new(Recoverer::new(
            ports.clone(),
            shared.policy.clone(),
            Default::default(),
            locks.clone(),
            identity.actor("recovery"),
            lease,
        ));
        recoverer.log_events_to(events.clone());
        recoverer.trace_targeted_passes(shared.seed ^ incarnation);
        recoverer.watch_passes(Arc::new(PassJudge::new(
            shared.checker.clone(),
            shared.policy.clone(),
        )));
        // As the daemon: Kubernetes recovers the Helm type's instances.
        recoverer.set_helm_types(catalog.helm_types());
        // As the daemon: the catalog's public host names (#43, #54).
        recoverer.set_domains(stead::engine::recovery::domain_table(&catalog));
        let reconciler = Arc::new(Reconciler::new(
            ports.clone(),
            catalog.clone(),
            shared.control.clone(),
            recoverer.clone(),
            shared.seed ^ incarnation,
        ));
        // The wake-up queue is fed by the event follower (when processes
        // follow events) and by the recovery pass itself, at the moment a
        // delayed service's budget allows its next attempt.
        let wake = Arc::new(WakeQueue::new(WAKE_CAPACITY));
        recoverer.wake_at_requested_times(wake.clone());
        if shared.events {
            let source: Arc<dyn RuntimeEvents> = shared.runtime.clone();
            tasks.push(tokio::spawn(follow(
                source,
                shared.runtime.clone(),
                clock.clone(),
                wake.clone(),
                stop.clone(),
            )));
        }
        for _ in 0..EVENT_WORKERS {
            let store: Arc<dyn Store> = shared.store.clone();
            tasks.push(tokio::spawn(drain(
                recoverer.clone(),
                store,
                wake.clone(),
                stop.clone(),
            )));
        }
        let (checker, tick, node) = (shared.checker.clone(), shared.tick, madsim::plugin::node());
        let holder = identity.holder();
        let store = shared.store.clone();
        let mut flusher = flusher.take();
        tasks.push(tokio::spawn(async move {
            loop {
                let began = stead::ports::Clock::now(&stead::engine::SystemClock);
                checker.tick_began(node, began);
                let outcome = reconciler.tick().await;
                let failed: Vec<_> = outcome.failed.iter().map(|(check, _)| *check).collect();
                let memory = reconciler.recoverer().memory();
                checker.ticked(
                    node,
                    &holder,
                    Ticked {
                        leader: outcome.leader,
                        clock_unverified: outcome.clock_unverified,
                        began,
                        failed: &failed,
                        recovered: &outcome.recovered.iter().cloned().collect(),
                        memory: &memory,
                    },
                );
                // Never yields: the in-memory store answers at once, and
                // is not offered a batch while it is down.
                if let Some(flusher) = flusher.as_mut().filter(|_| !store.is_unavailable()) {
                    flusher.flush(store.as_ref()).await;
                    checker
                        .events
                        .flushed(node, stead::ports::Clock::now(&stead::engine::SystemClock));
                }
                tokio::time::sleep(tick).await;
            }
        }));
    }
    if slot.role.works() {
        for n in 0..WORKERS_PER_PROCESS {
            let worker = Worker::new(
                ports.clone(),
                catalog.clone(),
                WorkerConfig {
                    id: identity.actor(&format!("w{n}")),
                    lease: shared.control.lease,
                    retry: TaskRetryPolicy::default(),
                    idle_poll: Duration::from_secs(1),
                    stop_grace_default: shared.policy.stop_grace_default,
                    broken: shared.policy.broken,
                },
                locks.clone(),
            )
            .with_events(events.clone());
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move { worker.run(stop).await }));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
}
