//! The recovery pass (R2, R3, R15, R16): a dumb interpreter that runs the
//! core's instance-pass machine (`core::pass`) over the ports. Every
//! decision is the core's; this module only sequences, bounds, locks and
//! aggregates: the `Recoverer` and its settings here, the whole-fleet pass
//! in `fleet`, a batch's locks and rows in `batch`, one instance in
//! `instance` and its pass driven in `instance_pass`, the ports in
//! `perform`, the public hosts a publish carries in `hosts`, the traffic
//! plane in `plane`, the log in `log`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::core::domains::ServiceHosts;
use crate::core::memory::RecoveryMemory;
use crate::core::policy::{RecoveryPolicy, INSTANCE_LEASE_SLACK};
use crate::core::spec::ReadinessProbe;
use crate::core::types::ServiceName;
use crate::ports::LeaseGrant;

mod batch;
mod fleet;
mod hosts;
mod instance;
mod instance_pass;
mod log;
mod outcome;
mod perform;
mod plane;
mod watch;

pub use outcome::{InstanceOutcome, PassOutcome, RecoverError};
pub use watch::{PassWatcher, WatchedPass, WatchedStep};

use super::event_log::{EventSink, EVENTS_OFF};
use super::lease::LeaseGuard;
pub use super::locks::InstanceLocks;
use super::wake::WakeQueue;
use super::Ports;

/// Readiness probe per (service type, service), from the catalog.
pub type ReadinessTable = BTreeMap<(String, ServiceName), ReadinessProbe>;

/// Public host names per (service type, service), from the catalog's
/// `domains` (#43) and `tenant_domains` (#54); a service absent has none.
pub type DomainTable = BTreeMap<(String, ServiceName), ServiceHosts>;

/// The public host names of every (service type, service) of the catalog
/// that has any (#43, #54).
pub fn domain_table(catalog: &crate::core::catalog::Catalog) -> DomainTable {
    let mut table = BTreeMap::new();
    for entry in catalog.entries() {
        for spec in &entry.services {
            let hosts = spec.hosts();
            if !hosts.is_empty() {
                table.insert((entry.service_type.clone(), spec.name.clone()), hosts);
            }
        }
    }
    table
}

/// The recovery pass and the memory it keeps between passes.
pub struct Recoverer {
    ports: Ports,
    policy: RecoveryPolicy,
    /// Replaced when the catalog is reloaded.
    readiness: Mutex<ReadinessTable>,
    /// Replaced when the catalog is reloaded.
    domains: Mutex<DomainTable>,
    /// Service types whose instances Kubernetes recovers (Helm types):
    /// the pass leaves them alone. Replaced when the catalog is reloaded.
    helm_types: Mutex<BTreeSet<String>>,
    memory: Mutex<RecoveryMemory>,
    locks: Arc<InstanceLocks>,
    /// This process's recovery as an instance-lock holder (T3).
    lock_holder: String,
    /// The reconciler lease every effect of recovery needs (T2).
    lease: Arc<LeaseGuard>,
    /// Where an instance asks to be recovered again before the next tick
    /// (a delayed service's backoff expiring); none: it waits for a tick.
    wake: OnceLock<Arc<WakeQueue>>,
    /// Told of every instance pass; none: nothing is gathered for it.
    watcher: OnceLock<Arc<dyn PassWatcher>>,
    /// Where interventions are logged (#42); none: nowhere.
    events: OnceLock<EventSink>,
    /// Draws the trace id of each targeted pass (a runtime event's, a
    /// budget's wake-up), so its events group as a tick's do; none: they
    /// are untraced (the simulation, which counts effects, not traces).
    targeted_traces: OnceLock<Mutex<rand_chacha::ChaCha8Rng>>,
    /// Whether a pass of this process made sure of the traffic plane yet:
    /// the first one creates stead's server in a fresh proxy, which is a
    /// start, not a loss. A standby never writes the proxy before it holds
    /// the lease (#41), so this is the only place the server is created.
    plane_ensured: std::sync::atomic::AtomicBool,
}

impl Recoverer {
    pub fn new(
        ports: Ports,
        policy: RecoveryPolicy,
        readiness: ReadinessTable,
        locks: Arc<InstanceLocks>,
        lock_holder: String,
        lease: Arc<LeaseGuard>,
    ) -> Self {
        Self {
            ports,
            policy,
            readiness: Mutex::new(readiness),
            domains: Mutex::new(DomainTable::new()),
            helm_types: Mutex::new(BTreeSet::new()),
            memory: Mutex::new(RecoveryMemory::default()),
            locks,
            lock_holder,
            lease,
            wake: OnceLock::new(),
            watcher: OnceLock::new(),
            events: OnceLock::new(),
            targeted_traces: OnceLock::new(),
            plane_ensured: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on, each targeted pass ([`Recoverer::recover_instance`])
    /// has a trace id of its own, drawn from `seed`: the events it logs
    /// name it, as a tick's pass's name the tick's (#42). Set once.
    pub fn trace_targeted_passes(&self, seed: u64) {
        use rand::SeedableRng;
        let _ = self
            .targeted_traces
            .set(Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)));
    }

    /// A new traceparent for one targeted pass, if they are traced.
    fn targeted_traceparent(&self) -> Option<String> {
        let rng = self.targeted_traces.get()?;
        let mut rng = rng.lock().expect("trace rng poisoned");
        Some(crate::engine::tick::new_traceparent(&mut *rng))
    }

    /// From now on, every intervention of a pass is also written to the
    /// event log through `sink` (#42). Set once.
    pub fn log_events_to(&self, sink: EventSink) {
        let _ = self.events.set(sink);
    }

    /// The event log's sink (off until [`Recoverer::log_events_to`]); the
    /// reconciler writes its own decisions through it too.
    pub fn events(&self) -> &EventSink {
        self.events.get().unwrap_or(&EVENTS_OFF)
    }

    /// From now on, an instance whose service is delayed by its budget is
    /// queued on `queue` for the moment the budget allows the next attempt
    /// (the core's `next_attempt`), not left to the next tick. Set once.
    pub fn wake_at_requested_times(&self, queue: Arc<WakeQueue>) {
        let _ = self.wake.set(queue);
    }

    /// From now on, every instance pass is told to `watcher` as it ends,
    /// step by step. Set once.
    pub fn watch_passes(&self, watcher: Arc<dyn PassWatcher>) {
        let _ = self.watcher.set(watcher);
    }

    /// The lease this recovery acts under.
    pub fn lease(&self) -> &Arc<LeaseGuard> {
        &self.lease
    }

    /// The grant, if it will last one instance's recovery (renewed if
    /// needed); `None`: do not act.
    async fn fence(&self) -> Option<LeaseGrant> {
        self.lease
            .ensure(
                self.ports.store.as_ref(),
                self.policy.instance_deadline + INSTANCE_LEASE_SLACK,
            )
            .await
    }

    /// Installs the readiness probes of a reloaded catalog; the next
    /// probe uses them.
    pub fn set_readiness(&self, readiness: ReadinessTable) {
        *self.readiness.lock().expect("readiness poisoned") = readiness;
    }

    /// Installs the public host names of a (reloaded) catalog; the next
    /// publication uses them.
    pub fn set_domains(&self, domains: DomainTable) {
        *self.domains.lock().expect("domains poisoned") = domains;
    }

    /// Installs the Helm types of a reloaded catalog: their instances run
    /// in Kubernetes, which recovers them, so the pass skips them.
    pub fn set_helm_types(&self, types: BTreeSet<String>) {
        *self.helm_types.lock().expect("helm types poisoned") = types;
    }

    pub fn memory(&self) -> RecoveryMemory {
        self.memory.lock().expect("memory poisoned").clone()
    }

    /// How many generations the crash-loop budget holds down now (a
    /// gauge, read every tick: counted in place, not on a copy of the
    /// whole fleet's memory).
    pub fn delays_in_force(&self) -> usize {
        self.memory
            .lock()
            .expect("memory poisoned")
            .delayed()
            .count()
    }
}
