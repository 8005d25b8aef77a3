//! The recovery pass (R2, R3, R15, R16): a dumb interpreter that runs the
//! core's instance-pass machine (`core::pass`) over the ports. Every
//! decision is the core's; this module only sequences, bounds, locks and
//! aggregates: the whole-fleet pass here, one instance in `instance`, the
//! ports in `perform`, the traffic plane in `plane`, the log in `log`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::core::domains::DomainTemplate;
use crate::core::memory::RecoveryMemory;
use crate::core::pass::plan_fleet_pass;
use crate::core::policy::{RecoveryPolicy, INSTANCE_LEASE_SLACK};
use crate::core::spec::ReadinessProbe;
use crate::core::types::ServiceName;
use crate::ports::LeaseGrant;

mod instance;
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

/// How long a batch taken ahead (while the one before it was driven) may
/// wait before it is driven; longer, and it is released and taken again,
/// so its passes get their whole deadline under locks taken just before.
const PREFETCH_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Readiness probe per (service type, service), from the catalog.
pub type ReadinessTable = BTreeMap<(String, ServiceName), ReadinessProbe>;

/// Public host name templates per (service type, service), from the
/// catalog's `domains` (#43); a service absent has none.
pub type DomainTable = BTreeMap<(String, ServiceName), Vec<DomainTemplate>>;

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

    /// One pass over every instance. Never fails as a whole: errors are
    /// aggregated per instance so one never hides another.
    pub async fn pass(&self) -> PassOutcome {
        self.pass_traced(None).await
    }

    /// [`Recoverer::pass`] as part of the tick traced by `traceparent`:
    /// the events it logs carry its trace id, so one pass's events group.
    pub async fn pass_traced(&self, traceparent: Option<&str>) -> PassOutcome {
        let mut outcome = PassOutcome::default();
        let began = tokio::time::timeout(self.policy.instance_deadline, async {
            self.ports.runtime.begin_pass().await
        })
        .await;
        match began {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome.errors.push(RecoverError::RuntimeList(e).counted()),
            Err(_) => outcome.errors.push(RecoverError::Deadline {
                what: "runtime list".to_owned(),
            }),
        }
        // The routes are read before the instances are listed: an instance
        // created in between is listed, so its fresh route is never taken
        // for a gone instance's.
        let mut held = self.read_traffic_plane(&mut outcome).await;
        let mut rows = match self.ports.store.list_for_recovery().await {
            Ok(rows) => rows,
            Err(e) => {
                outcome
                    .errors
                    .push(RecoverError::ListInstances(e).counted());
                return outcome;
            }
        };
        let bad_rows = !rows.bad.is_empty();
        {
            let helm = self.helm_types.lock().expect("helm types poisoned");
            rows.rows.retain(|i| !helm.contains(&i.service_type));
        }
        outcome.errors.extend(
            rows.bad
                .into_iter()
                .map(|e| RecoverError::SkippedRow(e).counted()),
        );
        let plan = plan_fleet_pass(held.as_ref(), rows.rows, bad_rows);
        for gone in &plan.withdraw {
            self.withdraw_stale(gone, &mut outcome.errors).await;
        }
        {
            let mut memory = self.memory.lock().expect("memory poisoned");
            for name in &plan.forget {
                memory.forget_instance(name);
            }
        }
        // A pipeline of two: the next batch's locks are taken and its rows
        // loaded while this batch's instances are driven, so the store's
        // round trips and the passes overlap; at most `instances_at_once`
        // instances are driven at a time.
        let mut batches = plan.recover.chunks(self.policy.instances_at_once.max(1));
        // Gathered in listing order, as the outcome keeps them.
        let mut instances = Vec::with_capacity(plan.recover.len());
        let mut current = match batches.next() {
            Some(batch) => Some((batch, self.take_batch(batch).await)),
            None => None,
        };
        while let Some((batch, mut taken)) = current.take() {
            if taken.is_stale(PREFETCH_FRESH) {
                // The batch before took long (a slow runtime): these locks
                // were taken too long ago to drive under; take them again.
                taken.release().await;
                taken = self.take_batch(batch).await;
            }
            let next = batches.next();
            let (results, next_taken) = tokio::join!(
                self.finish_batch(batch, taken, held.as_mut(), traceparent),
                async {
                    match next {
                        Some(next) => Some((next, self.take_batch(next).await)),
                        None => None,
                    }
                }
            );
            current = next_taken;
            if results.iter().any(|(_, r)| r.skipped_no_lease) {
                // The lease is lost: nothing more may be done this pass.
                outcome.errors.push(RecoverError::LeaseLost);
                if let Some((_, taken)) = current.take() {
                    taken.release().await;
                }
                break;
            }
            let busy = results.iter().filter(|(_, r)| r.skipped_busy).count();
            if busy > 0 {
                metrics::counter!("stead_recovery_busy_skips_total", "by" => "pass")
                    .increment(busy as u64);
            }
            instances.extend(results);
        }
        outcome.instances = instances;
        outcome
    }
}
