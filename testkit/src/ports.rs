//! In-memory implementations of the ports, for unit tests and the madsim
//! simulation. They are deterministic (BTreeMaps, no clocks of their own)
//! and take two hooks:
//!
//! - a [`FaultInjector`] consulted before every operation, which may let it
//!   proceed, fail it, or hang it (the simulation's swarm faults);
//! - an [`Observer`] told synchronously about every effect, so a checker can
//!   assert invariants at the very instant an effect happens.
//!
//! Only `std::sync::Mutex` is used, never held across an await.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::mutants::{self, Mutant};
use stead::core::hash::FastMap;
use stead::core::names;
use stead::core::spec::ReadinessProbe;
use stead::core::types::{
    Binds, ContainerId, ContainerStatus, Exit, GenerationKey, Health, InstanceName, Observation,
    RuntimeError, ServiceName, Timestamp,
};

use stead::ports::{
    Clock, CreateContainer, EventSubscription, HeldRoute, HelmRelease, ManagedContainer, Notifier,
    NotifyError, PlaneCheck, Policy, PolicyError, Probe, ProbeError, ProbeTarget, ProvisionError,
    Provisioner, Release, ReleaseHealth, ReleaseSpec, ReleaseStatus, ReleaseTarget, Route, Runtime,
    RuntimeEvent, RuntimeEventAction, RuntimeEvents, ServiceKey, Traffic, TrafficError,
};

/// Which operation a fault is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Inspect,
    Start,
    Stop,
    Restart,
    Health,
    Binds,
    List,
    Create,
    Remove,
    Publish,
    Withdraw,
    /// Making sure of the traffic plane and reading its routes back (T5).
    TrafficRead,
    Probe,
    Policy,
    Install,
    Uninstall,
    ListReleases,
    /// A Helm bake's check of a release's status and tests (#40).
    CheckRelease,
    Notify,
}

/// What the injector decides for one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Proceed,
    /// Fail with a transient error carrying this detail.
    Fail(String),
    /// Refuse what was asked, for good, with this detail (runtime
    /// operations: an image that cannot be pulled); elsewhere as `Fail`.
    Refused(String),
    /// Answer not-found (runtime operations only).
    NotFound,
    /// Never answer (the caller's deadline must cut it off).
    Hang,
    /// Answer normally, after this long.
    Slow(Duration),
    /// Reading routes back only: the proxy restarts without its config
    /// just before it answers, so the answer holds no route (a reload or a
    /// crash mid-pass, after the pass's own read of the plane).
    ProxyRestart,
}

/// Decides faults. The default injects none.
pub trait FaultInjector: Send + Sync {
    fn decide(&self, op: Op, subject: &str) -> Fault;
    /// What becomes of one event on its way to one subscriber.
    fn event_fate(&self, _event: &RuntimeEvent) -> EventFate {
        EventFate::Deliver
    }
}

/// What becomes of one runtime event on its way to one subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFate {
    Deliver,
    /// Lost.
    Drop,
    /// Delivered twice.
    Duplicate,
    /// Delivered this much later.
    Delay(Duration),
    /// The subscription ends here (the connection dropped).
    Disconnect,
}

/// Events the in-memory runtime keeps for replay to a new subscription,
/// as Docker keeps its last 256.
pub const EVENT_REPLAY_LEN: usize = 256;
/// Events one subscription buffers before further ones are lost (a slow
/// reader of a real stream loses its connection; here, its events).
const EVENT_BUFFER_LEN: usize = 1024;

/// Injects nothing.
#[derive(Debug, Default)]
pub struct NoFaults;

impl FaultInjector for NoFaults {
    fn decide(&self, _: Op, _: &str) -> Fault {
        Fault::Proceed
    }
}

/// An effect on the world, reported the instant it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Started {
        id: ContainerId,
    },
    Restarted {
        id: ContainerId,
    },
    Stopped {
        id: ContainerId,
    },
    Created {
        id: ContainerId,
        instance: InstanceName,
        service: ServiceName,
    },
    Removed {
        id: ContainerId,
    },
    Published {
        route: Route,
    },
    Withdrawn {
        service: ServiceKey,
    },
    WithdrawFailed {
        service: ServiceKey,
    },
    ProbePassed {
        id: ContainerId,
        started_at: Option<Timestamp>,
        binds: Binds,
    },
    /// Binds written into ACTIVE (by recovery or by a worker's switch).
    BindsSaved {
        id: ContainerId,
        binds: Binds,
    },
    /// ACTIVE now names `container` for the service.
    ActiveSaved {
        service: ServiceKey,
        container: ContainerId,
        /// Written under the reconciler lease's fence (T2).
        under_lease: bool,
    },
    /// The service left ACTIVE.
    ActiveRemoved {
        service: ServiceKey,
    },
    InhibitionSaved {
        service: ServiceKey,
        container: ContainerId,
        retirement: bool,
        /// The hold an upgrade takes on a service its new version dropped.
        dropped: bool,
        /// Written under the reconciler lease's fence (T2).
        under_lease: bool,
        /// A revert's marker: until when its container is kept, stopped,
        /// as the evidence of what failed (#55).
        kept_until: Option<Timestamp>,
    },
    InhibitionCleared {
        service: ServiceKey,
        container: ContainerId,
    },
    RolloutSet {
        service_type: String,
        halted: bool,
    },
    /// An inspection answered: what the runtime told the reader (`None`:
    /// not found). The checker judges a retirement by the successor's last
    /// inspection before it (S5).
    Inspected {
        id: ContainerId,
        seen: Option<(ContainerStatus, Option<Timestamp>)>,
    },
    /// A health read answered: what the runtime told the reader.
    HealthRead {
        id: ContainerId,
        health: Health,
    },
    /// A task was offered to the queue: by the reconciler's planners (with
    /// its fence) or an operator (without). `refused_for`: the queue
    /// already held an active task of that instance and kind (its id and
    /// when it was created), and refused this one.
    Enqueue {
        instance: i64,
        kind: stead::core::fleet::TaskKind,
        fenced: bool,
        refused_for: Option<(i64, Timestamp)>,
    },
    /// An operator's undo pinned a halted type to a recorded version.
    RolloutPinned {
        service_type: String,
        version: String,
    },
    /// A worker finished its task: done.
    TaskDone {
        task: i64,
        instance: i64,
        reason: String,
    },
    /// The reconciler lease went to `holder` from `from`, another
    /// incarnation of its identity at another site (a twin: a copied
    /// `state_dir`, T1), whose grant ran until `from_expires_at`; `at` is
    /// the database's clock when it changed hands.
    LeaseTakenByTwin {
        holder: String,
        from: String,
        from_expires_at: Option<Timestamp>,
        at: Timestamp,
    },
    /// A running task's lease was broken: the task went back to the queue
    /// (C6). `locked_at` is when its worker last took or renewed it.
    LeaseBroken {
        task: i64,
        locked_at: Timestamp,
    },
    /// A restarted daemon queued again a task its earlier incarnation's
    /// worker `holder` held running (T1), before the task's lease expired.
    TaskReclaimed {
        task: i64,
        holder: String,
    },
    /// The reconciler swept the queue for expired leases at `now` (the
    /// planner's snapshot time) and freed `freed` tasks: C6's planner
    /// decides a sweep only when some lease ran out, so a sweep that frees
    /// nothing while no task moved since the planner looked is a wrong
    /// decision (issue #15).
    LeaseSweep {
        now: Timestamp,
        freed: u64,
    },
    /// A worker put its failed task back in the queue to run again at
    /// `run_after` (its backoff, and for an upgrade its window's next
    /// opening: C8).
    TaskRetried {
        task: i64,
        instance: i64,
        kind: stead::core::fleet::TaskKind,
        run_after: Timestamp,
    },
    /// An instance moved along its lifecycle.
    InstanceState {
        instance: InstanceName,
        state: stead::core::fleet::InstanceState,
    },
    Installed {
        release: String,
    },
    Uninstalled {
        release: String,
    },
    /// A Helm release rolled back (#40) from chart version `from`, which
    /// had gone bad (`bad`) or not.
    RolledBack {
        release: String,
        from: String,
        bad: bool,
    },
    /// A process took (or renewed) an instance's lock (T3).
    InstanceLocked {
        instance: InstanceName,
        holder: String,
    },
    /// A process released an instance's lock.
    InstanceUnlocked {
        instance: InstanceName,
        holder: String,
    },
    /// The proxy lost a route by itself (it restarted without its config).
    RouteLost {
        service: ServiceKey,
    },
}

/// Told about every effect. The default ignores them.
pub trait Observer: Send + Sync {
    fn effect(&self, effect: &Effect);

    /// Whether effects are worth building for it: a port skips building
    /// (and copying names into) an effect nobody reads, which a steady
    /// pass over a large fleet would do several times per service.
    fn observes(&self) -> bool {
        true
    }
}

#[derive(Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn effect(&self, _: &Effect) {}

    fn observes(&self) -> bool {
        false
    }
}

/// The hooks every in-memory port shares.
#[derive(Clone)]
pub struct Hooks {
    pub faults: Arc<dyn FaultInjector>,
    pub observer: Arc<dyn Observer>,
}

impl Hooks {
    /// Tells the observer of the effect `effect` builds, if it observes.
    pub fn tell(&self, effect: impl FnOnce() -> Effect) {
        if self.observer.observes() {
            self.observer.effect(&effect());
        }
    }
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            faults: Arc::new(NoFaults),
            observer: Arc::new(NoObserver),
        }
    }
}

/// How late the answer to an operation that acted comes.
#[must_use]
struct Latency(Option<Duration>);

impl Latency {
    async fn answer(self) {
        if let Some(after) = self.0 {
            tokio::time::sleep(after).await;
        }
    }
}

impl Hooks {
    /// For an operation with an effect: the injector's decision, applied
    /// before the effect when the request never takes effect (a failure,
    /// not-found, a hang), and returned as latency to add *after* the
    /// effect when it is only slow: the runtime acted at once, its answer is
    /// late. (A caller paused while waiting does not delay the effect.)
    async fn admit(&self, op: Op, subject: &str) -> Result<Latency, Fault> {
        match self.faults.decide(op, subject) {
            Fault::Proceed => Ok(Latency(None)),
            Fault::Hang => {
                std::future::pending::<()>().await;
                unreachable!("pending never completes")
            }
            Fault::Slow(d) => Ok(Latency(Some(d))),
            other => Err(other),
        }
    }

    /// Applies the injector's decision; `Ok(())` means proceed.
    async fn gate(&self, op: Op, subject: &str) -> Result<(), Fault> {
        match self.faults.decide(op, subject) {
            Fault::Proceed => Ok(()),
            Fault::Hang => {
                std::future::pending::<()>().await;
                unreachable!("pending never completes")
            }
            Fault::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            other => Err(other),
        }
    }
}

fn runtime_err(fault: Fault) -> RuntimeError {
    match fault {
        Fault::NotFound => RuntimeError::NotFound,
        Fault::Fail(detail) => RuntimeError::Transient(detail),
        Fault::Refused(detail) => RuntimeError::Refused(detail),
        Fault::Proceed | Fault::Hang | Fault::Slow(_) | Fault::ProxyRestart => {
            RuntimeError::Transient("injected".into())
        }
    }
}

fn text_err(fault: Fault) -> String {
    match fault {
        Fault::Fail(detail) | Fault::Refused(detail) => detail,
        other => format!("{other:?}"),
    }
}

/// A clock the test or simulation sets by hand.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    pub fn new(now: Timestamp) -> Self {
        Self {
            now: Mutex::new(now),
        }
    }

    pub fn set(&self, now: Timestamp) {
        *self.now.lock().expect("clock poisoned") = now;
    }

    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().expect("clock poisoned");
        *now = stead::core::fleet::add(*now, d);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().expect("clock poisoned")
    }
}

/// One container of the in-memory runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemContainer {
    pub instance: InstanceName,
    pub service: ServiceName,
    pub status: ContainerStatus,
    pub started_at: Option<Timestamp>,
    pub health: Health,
    pub binds: Binds,
    /// Whether readiness probes against its binds pass.
    pub ready: bool,
    /// Status right after a (re)start: `Running`, or `Exited` for a
    /// workload that dies at once.
    pub status_after_start: ContainerStatus,
    /// Stopped on request: a runtime restart policy leaves it alone.
    pub stopped_on_request: bool,
    /// The lines it printed, each with the execution that printed it
    /// (Docker keeps a container's logs across restarts): the last
    /// [`MEM_LOG_LINES_MAX`].
    pub log: VecDeque<(Option<Timestamp>, String)>,
}

/// The exit code the in-memory runtime reports of a container stopped on
/// request (Docker's for a process ended by SIGTERM).
pub const MEM_EXIT_CODE_STOPPED: i64 = 143;
/// The exit code it reports of a container that went down by itself.
pub const MEM_EXIT_CODE_CRASHED: i64 = 1;

impl MemContainer {
    /// How its last execution ended, as Docker reports it of a down
    /// container: a code only once it ran, and no end time (none of the
    /// fakes keeps one).
    pub fn exit(&self) -> Option<Exit> {
        let code = if self.stopped_on_request {
            MEM_EXIT_CODE_STOPPED
        } else {
            MEM_EXIT_CODE_CRASHED
        };
        (self.status.is_down() && self.started_at.is_some()).then_some(Exit {
            code,
            finished_at: None,
        })
    }
}

/// Most log lines the in-memory runtime keeps per container.
pub const MEM_LOG_LINES_MAX: usize = 64;

/// The in-memory container runtime.
pub struct MemoryRuntime {
    hooks: Hooks,
    clock: Arc<dyn Clock>,
    /// Hashed: every runtime call of a pass looks its container up here,
    /// and ordered lookups of 20,000 IDs were a tenth of a steady pass
    /// (issue #14). What lists them sorts.
    containers: Mutex<FastMap<ContainerId, MemContainer>>,
    /// Named volumes by (instance, service, volume): created with the first
    /// container that mounts them, removed only by a purge.
    volumes: Mutex<std::collections::BTreeSet<(InstanceName, ServiceName, String)>>,
    /// The row id of the instance each volume was created for (its label).
    volume_owners: Mutex<BTreeMap<(InstanceName, ServiceName, String), i64>>,
    next_port: Mutex<u16>,
    /// Strictly increasing execution starts, even within one instant.
    executions: Mutex<i64>,
    events: Mutex<EventLog>,
}

/// The event stream's memory: recent events for replay, and subscribers.
#[derive(Default)]
struct EventLog {
    recent: std::collections::VecDeque<(Timestamp, RuntimeEvent)>,
    subscribers: Vec<tokio::sync::mpsc::Sender<Option<RuntimeEvent>>>,
}

/// One subscription to the in-memory event stream.
struct MemorySubscription {
    events: tokio::sync::mpsc::Receiver<Option<RuntimeEvent>>,
}

#[async_trait]
impl EventSubscription for MemorySubscription {
    async fn next_event(&mut self) -> Option<Result<RuntimeEvent, RuntimeError>> {
        // `None` in the channel is a dropped connection; a closed channel too.
        self.events.recv().await.flatten().map(Ok)
    }
}

#[async_trait]
impl RuntimeEvents for MemoryRuntime {
    async fn subscribe(
        &self,
        since: Timestamp,
    ) -> Result<Box<dyn EventSubscription>, RuntimeError> {
        self.hooks
            .gate(Op::List, "events")
            .await
            .map_err(runtime_err)?;
        let (sender, events) = tokio::sync::mpsc::channel(EVENT_BUFFER_LEN);
        let mut log = self.events.lock().expect("events poisoned");
        for (at, event) in &log.recent {
            if *at > since {
                let _ = sender.try_send(Some(event.clone()));
            }
        }
        log.subscribers.push(sender);
        Ok(Box::new(MemorySubscription { events }))
    }
}

impl MemoryRuntime {
    pub fn new(clock: Arc<dyn Clock>, hooks: Hooks) -> Self {
        Self {
            hooks,
            clock,
            containers: Mutex::new(FastMap::default()),
            volumes: Mutex::default(),
            volume_owners: Mutex::default(),
            next_port: Mutex::new(20000),
            executions: Mutex::new(0),
            events: Mutex::default(),
        }
    }

    /// The named volumes that exist, as (instance, service, volume).
    pub fn volumes(&self) -> Vec<(InstanceName, ServiceName, String)> {
        self.volumes
            .lock()
            .expect("runtime poisoned")
            .iter()
            .cloned()
            .collect()
    }

    /// Tells the event stream what happened to container `id` (the engine's
    /// own calls do this themselves; the simulation's workload model calls
    /// it for crashes, native restarts and health changes).
    pub fn emit(&self, id: &ContainerId, action: RuntimeEventAction) {
        let Some(c) = self.container(id) else { return };
        self.emit_for(id, &c.instance, &c.service, action);
    }

    fn emit_for(
        &self,
        id: &ContainerId,
        instance: &InstanceName,
        service: &ServiceName,
        action: RuntimeEventAction,
    ) {
        let event = RuntimeEvent {
            instance: instance.clone(),
            service: service.clone(),
            container: id.clone(),
            action,
        };
        let mut log = self.events.lock().expect("events poisoned");
        if log.recent.len() >= EVENT_REPLAY_LEN {
            log.recent.pop_front();
        }
        log.recent.push_back((self.clock.now(), event.clone()));
        let faults = self.hooks.faults.clone();
        log.subscribers.retain(|subscriber| {
            match faults.event_fate(&event) {
                EventFate::Deliver => {
                    let _ = subscriber.try_send(Some(event.clone()));
                }
                EventFate::Drop => {}
                EventFate::Duplicate => {
                    let _ = subscriber.try_send(Some(event.clone()));
                    let _ = subscriber.try_send(Some(event.clone()));
                }
                EventFate::Delay(after) => {
                    let (subscriber, event) = (subscriber.clone(), event.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = subscriber.try_send(Some(event));
                    });
                }
                EventFate::Disconnect => {
                    let _ = subscriber.try_send(None);
                    return false;
                }
            }
            !subscriber.is_closed()
        });
    }

    /// A new, strictly increasing execution start at about `now`, with the
    /// nanoseconds Docker reports (a store that kept less would not
    /// recognise its verified executions, R17).
    pub fn next_execution(&self) -> Timestamp {
        let mut n = self.executions.lock().expect("poisoned");
        *n += 1;
        let n = *n as u64;
        stead::core::fleet::add(
            self.clock.now(),
            Duration::from_nanos((n % 1_000_000) * 1_000 + 1 + n % 997),
        )
    }

    /// Direct access for scenarios and the simulation's workload model
    /// (in no particular order: [`Self::container_ids`] lists them in
    /// order).
    pub fn with_containers<R>(
        &self,
        f: impl FnOnce(&mut FastMap<ContainerId, MemContainer>) -> R,
    ) -> R {
        f(&mut self.containers.lock().expect("runtime poisoned"))
    }

    /// Every container's ID, in order.
    pub fn container_ids(&self) -> Vec<ContainerId> {
        let mut ids: Vec<ContainerId> = self.with_containers(|cs| cs.keys().cloned().collect());
        ids.sort();
        ids
    }

    /// The container's current execution prints `line`; false if there is
    /// no such container.
    pub fn print(&self, id: &ContainerId, line: &str) -> bool {
        self.mutate(id, |c| {
            if c.log.len() == MEM_LOG_LINES_MAX {
                c.log.pop_front();
            }
            c.log.push_back((c.started_at, line.to_owned()));
        })
        .is_ok()
    }

    /// `docker rm -f` by hand: the container is gone, with a `destroy`
    /// event; false if there was none.
    pub fn remove_by_hand(&self, id: &ContainerId) -> bool {
        let removed = self.with_containers(|cs| cs.remove(id)).is_some();
        if removed {
            self.emit(id, RuntimeEventAction::Destroy);
        }
        removed
    }

    pub fn container(&self, id: &ContainerId) -> Option<MemContainer> {
        self.read(id, MemContainer::clone)
    }

    /// `f` of container `id`, without copying the container.
    fn read<R>(&self, id: &ContainerId, f: impl FnOnce(&MemContainer) -> R) -> Option<R> {
        self.containers
            .lock()
            .expect("runtime poisoned")
            .get(id)
            .map(f)
    }

    /// The ID [`Runtime::create`] gives the container of `request`: its
    /// deterministic name, as Docker's adapter names it, so IDs here are as
    /// injective as names there.
    pub fn id_of(request: &CreateContainer) -> Result<ContainerId, RuntimeError> {
        if mutants::active(Mutant::DashedContainerNames) {
            // The old, colliding scheme (T6), for the mutation exercise.
            return Ok(ContainerId::new(format!(
                "{}-{}-{}-{}",
                names::CONTAINER_NAME_PREFIX,
                request.instance,
                request.spec.name,
                request.revision
            )));
        }
        names::container_name(&request.instance, &request.spec.name, &request.revision)
            .map(ContainerId::new)
            .map_err(|e| RuntimeError::Transient(format!("container name: {e}")))
    }

    /// A host port no container was given lately: what Docker hands out
    /// for an ephemeral publication (the simulation's native restarts
    /// draw new ones, as Docker's restarts may).
    pub fn alloc_port(&self) -> u16 {
        let mut p = self.next_port.lock().expect("poisoned");
        *p = if *p >= 60000 { 20000 } else { *p + 1 };
        *p
    }

    fn mutate<R>(
        &self,
        id: &ContainerId,
        f: impl FnOnce(&mut MemContainer) -> R,
    ) -> Result<R, RuntimeError> {
        let mut containers = self.containers.lock().expect("runtime poisoned");
        let c = containers.get_mut(id).ok_or(RuntimeError::NotFound)?;
        Ok(f(c))
    }

    fn run(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let started_at = self.next_execution();
        self.mutate(id, |c| {
            c.status = c.status_after_start;
            c.started_at = Some(started_at);
            c.health = Health::Starting;
            c.stopped_on_request = false;
        })
    }
}

#[async_trait]
impl Runtime for MemoryRuntime {
    async fn inspect(&self, id: &ContainerId) -> Result<Observation, RuntimeError> {
        self.hooks
            .gate(Op::Inspect, id.as_str())
            .await
            .map_err(runtime_err)?;
        let observation = self.read(id, |c| Observation {
            status: c.status,
            started_at: c.started_at,
            exit: c.exit(),
        });
        self.hooks.tell(|| Effect::Inspected {
            id: id.clone(),
            seen: observation.as_ref().map(|o| (o.status, o.started_at)),
        });
        observation.ok_or(RuntimeError::NotFound)
    }

    async fn start(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let latency = self
            .hooks
            .admit(Op::Start, id.as_str())
            .await
            .map_err(runtime_err)?;
        // A container that is not there is not started (Docker answers
        // 404): nothing is told of it, as of a stop or a remove.
        let status = self.read(id, |c| c.status).ok_or(RuntimeError::NotFound)?;
        // The call is judged (S1, E1) whatever the runtime makes of it.
        self.hooks.tell(|| Effect::Started { id: id.clone() });
        // Starting a running (or paused) container is Docker's 304 "not
        // modified": the same execution goes on, and the event stream says
        // nothing (tests/runtime_contract.rs).
        if matches!(status, ContainerStatus::Running | ContainerStatus::Paused) {
            latency.answer().await;
            return Ok(());
        }
        self.run(id)?;
        self.emit(id, RuntimeEventAction::Start);
        latency.answer().await;
        Ok(())
    }

    async fn stop(&self, key: &GenerationKey, _grace: Duration) -> Result<(), RuntimeError> {
        let id = &key.container;
        let latency = self
            .hooks
            .admit(Op::Stop, id.as_str())
            .await
            .map_err(runtime_err)?;
        let was_down = self.mutate(id, |c| {
            check_owner("stop", key, c)?;
            let was_down = c.status.is_down();
            c.status = ContainerStatus::Exited;
            c.stopped_on_request = true;
            Ok(was_down)
        })??;
        self.hooks.tell(|| Effect::Stopped { id: id.clone() });
        // Docker answers a stop of a stopped container "not modified",
        // and says nothing on its event stream.
        if !was_down {
            self.emit(id, RuntimeEventAction::Die);
        }
        latency.answer().await;
        Ok(())
    }

    async fn restart(&self, id: &ContainerId, _grace: Duration) -> Result<(), RuntimeError> {
        let latency = self
            .hooks
            .admit(Op::Restart, id.as_str())
            .await
            .map_err(runtime_err)?;
        self.read(id, |_| ()).ok_or(RuntimeError::NotFound)?;
        self.hooks.tell(|| Effect::Restarted { id: id.clone() });
        self.run(id)?;
        self.emit(id, RuntimeEventAction::Die);
        self.emit(id, RuntimeEventAction::Start);
        latency.answer().await;
        Ok(())
    }

    async fn health(&self, id: &ContainerId) -> Result<Health, RuntimeError> {
        self.hooks
            .gate(Op::Health, id.as_str())
            .await
            .map_err(runtime_err)?;
        let health = self.read(id, |c| c.health).ok_or(RuntimeError::NotFound)?;
        self.hooks.tell(|| Effect::HealthRead {
            id: id.clone(),
            health,
        });
        Ok(health)
    }

    async fn binds(&self, id: &ContainerId) -> Result<Binds, RuntimeError> {
        self.hooks
            .gate(Op::Binds, id.as_str())
            .await
            .map_err(runtime_err)?;
        // Binds only of a running (or paused) container, as the Docker
        // adapter reads them: Docker frees a stopped container's host
        // ports (tests/runtime_contract.rs).
        self.read(id, |c| match c.status {
            ContainerStatus::Running | ContainerStatus::Paused => c.binds.clone(),
            _ => Binds::new(),
        })
        .ok_or(RuntimeError::NotFound)
    }

    async fn last_lines(
        &self,
        id: &ContainerId,
        lines: usize,
    ) -> Result<Vec<String>, RuntimeError> {
        let containers = self.containers.lock().expect("runtime poisoned");
        let container = containers.get(id).ok_or(RuntimeError::NotFound)?;
        let skip = container.log.len().saturating_sub(lines);
        Ok(container
            .log
            .iter()
            .skip(skip)
            .map(|(_, line)| line.clone())
            .collect())
    }

    async fn list_managed(&self) -> Result<Vec<ManagedContainer>, RuntimeError> {
        self.hooks.gate(Op::List, "").await.map_err(runtime_err)?;
        let containers = self.containers.lock().expect("runtime poisoned");
        let mut listed: Vec<ManagedContainer> = containers
            .iter()
            .map(|(id, c)| ManagedContainer {
                id: id.clone(),
                instance: c.instance.clone(),
                service: c.service.clone(),
                status: c.status,
                // Docker's list does not report it (the Docker adapter's
                // `list_managed`), so neither does this one.
                started_at: None,
            })
            .collect();
        listed.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(listed)
    }

    async fn purge_volumes(
        &self,
        instance: &InstanceName,
        instance_id: stead::core::fleet::InstanceId,
    ) -> Result<Vec<String>, RuntimeError> {
        let owners = self.volume_owners.lock().expect("runtime poisoned");
        let mut volumes = self.volumes.lock().expect("runtime poisoned");
        let purged: Vec<_> = volumes
            .iter()
            .filter(|key| &key.0 == instance && owners.get(*key) == Some(&instance_id))
            .cloned()
            .collect();
        drop(owners);
        let mut owners = self.volume_owners.lock().expect("runtime poisoned");
        for volume in &purged {
            volumes.remove(volume);
            owners.remove(volume);
        }
        Ok(purged
            .into_iter()
            .map(|(i, s, v)| format!("stead.{i}.{s}.{v}"))
            .collect())
    }

    async fn create(&self, request: &CreateContainer) -> Result<ContainerId, RuntimeError> {
        let id = Self::id_of(request)?;
        let latency = self
            .hooks
            .admit(Op::Create, id.as_str())
            .await
            .map_err(runtime_err)?;
        if let Some(taken) = self.container(&id) {
            // Adopted only when it is this very service's container, as
            // the Docker adapter checks its labels; another's is refused
            // (tests/runtime_contract.rs).
            // Under the mutation exercise's colliding names the old
            // scheme's adoption by name alone is what is exercised.
            let owner_differs =
                taken.instance != request.instance || taken.service != request.spec.name;
            if owner_differs && !mutants::active(Mutant::DashedContainerNames) {
                return Err(RuntimeError::Transient(format!(
                    "container name {id:?} is taken by a container of {}/{}; refusing to adopt it",
                    taken.instance, taken.service
                )));
            }
            latency.answer().await;
            return Ok(id);
        }
        let binds: Binds = request
            .spec
            .ports
            .iter()
            .map(|port| (*port, self.alloc_port()))
            .collect();
        let started_at = self.next_execution();
        for v in request.spec.run.volumes() {
            let key = (
                request.instance.clone(),
                request.spec.name.clone(),
                v.to_owned(),
            );
            // Created with the first container that mounts it, owned by
            // that instance's row from then on (as its label says).
            self.volume_owners
                .lock()
                .expect("runtime poisoned")
                .entry(key.clone())
                .or_insert(request.instance_id);
            self.volumes.lock().expect("runtime poisoned").insert(key);
        }
        self.containers.lock().expect("runtime poisoned").insert(
            id.clone(),
            MemContainer {
                instance: request.instance.clone(),
                service: request.spec.name.clone(),
                status: ContainerStatus::Running,
                started_at: Some(started_at),
                health: if request.spec.healthcheck.is_some() {
                    Health::Starting
                } else {
                    Health::None
                },
                binds,
                ready: true,
                status_after_start: ContainerStatus::Running,
                stopped_on_request: false,
                log: VecDeque::new(),
            },
        );
        self.hooks.tell(|| Effect::Created {
            id: id.clone(),
            instance: request.instance.clone(),
            service: request.spec.name.clone(),
        });
        self.emit(&id, RuntimeEventAction::Start);
        latency.answer().await;
        Ok(id)
    }

    async fn remove(&self, key: &GenerationKey) -> Result<(), RuntimeError> {
        let id = &key.container;
        let latency = self
            .hooks
            .admit(Op::Remove, id.as_str())
            .await
            .map_err(runtime_err)?;
        let removed = {
            let mut containers = self.containers.lock().expect("runtime poisoned");
            match containers.get(id) {
                None => false,
                Some(container) => {
                    check_owner("remove", key, container)?;
                    containers.remove(id);
                    true
                }
            }
        };
        if !removed {
            latency.answer().await;
            return Ok(());
        }
        self.hooks.tell(|| Effect::Removed { id: id.clone() });
        self.emit_for(id, &key.instance, &key.service, RuntimeEventAction::Destroy);
        latency.answer().await;
        Ok(())
    }
}

/// Refuses to `operation` a container that is not the generation `key`
/// names, as the Docker adapter refuses one whose labels differ.
fn check_owner(
    operation: &str,
    key: &GenerationKey,
    container: &MemContainer,
) -> Result<(), RuntimeError> {
    if container.instance == key.instance && container.service == key.service {
        return Ok(());
    }
    Err(RuntimeError::Refused(format!(
        "refusing to {operation} container {}: it belongs to {}/{}, not {}/{}",
        key.container, container.instance, container.service, key.instance, key.service
    )))
}

/// The in-memory traffic plane: service → route.
pub struct MemoryTraffic {
    hooks: Hooks,
    routes: Mutex<BTreeMap<ServiceKey, Route>>,
    /// Fault: the proxy's part of stead is gone (restarted without its
    /// saved config) until `ensure` recreates it.
    lost: std::sync::atomic::AtomicBool,
}

impl MemoryTraffic {
    pub fn new(hooks: Hooks) -> Self {
        Self {
            hooks,
            routes: Mutex::new(BTreeMap::new()),
            lost: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn routes(&self) -> BTreeMap<ServiceKey, Route> {
        self.routes.lock().expect("traffic poisoned").clone()
    }

    /// Fault: the proxy restarts without its saved config: every route is
    /// gone and stead's server with them, until `ensure` recreates it
    /// (publishing recreates it too, as the Caddy adapter does).
    pub fn lose_everything(&self) {
        self.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        let lost: Vec<ServiceKey> =
            std::mem::take(&mut *self.routes.lock().expect("traffic poisoned"))
                .into_keys()
                .collect();
        for service in lost {
            self.hooks.tell(|| Effect::RouteLost { service });
        }
    }
}

#[async_trait]
impl Traffic for MemoryTraffic {
    async fn publish(&self, route: &Route) -> Result<(), TrafficError> {
        let subject = format!("{}/{}", route.service.instance, route.service.service);
        // Refused as the Caddy adapter refuses it, before any call: a route
        // needs an upstream. A double that accepted it would hide a service
        // failing every pass in production.
        match route.binds.iter().next() {
            None => {
                return Err(TrafficError::Rejected(format!(
                    "route {subject} has no binds to proxy to"
                )))
            }
            Some((container_port, 0)) => {
                return Err(TrafficError::Rejected(format!(
                    "route {subject}: bind of container port {container_port} = host port 0, not a port"
                )))
            }
            Some(_) => {}
        }
        let latency = self
            .hooks
            .admit(Op::Publish, &subject)
            .await
            .map_err(|f| TrafficError::Unreachable(text_err(f)))?;
        self.hooks.tell(|| Effect::Published {
            route: route.clone(),
        });
        self.lost.store(false, std::sync::atomic::Ordering::SeqCst);
        self.routes
            .lock()
            .expect("traffic poisoned")
            .insert(route.service.clone(), route.clone());
        latency.answer().await;
        Ok(())
    }

    async fn ensure(&self) -> Result<PlaneCheck, TrafficError> {
        self.hooks
            .gate(Op::TrafficRead, "ensure")
            .await
            .map_err(|f| TrafficError::Unreachable(text_err(f)))?;
        if self.lost.swap(false, std::sync::atomic::Ordering::SeqCst) {
            Ok(PlaneCheck::Recreated)
        } else {
            Ok(PlaneCheck::Present)
        }
    }

    async fn held_routes(&self) -> Result<Vec<HeldRoute>, TrafficError> {
        match self.hooks.gate(Op::TrafficRead, "read routes").await {
            Ok(()) => {}
            Err(Fault::ProxyRestart) => self.lose_everything(),
            Err(f) => return Err(TrafficError::Unreachable(text_err(f))),
        }
        let routes = self.routes.lock().expect("traffic poisoned");
        // Sized once: a fleet's routes would otherwise regrow (and copy)
        // the vector a dozen times.
        let mut held = Vec::with_capacity(routes.len());
        held.extend(routes.values().filter_map(|r| {
            r.binds.values().next().map(|port| HeldRoute {
                service: r.service.clone(),
                port: *port,
            })
        }));
        Ok(held)
    }

    async fn withdraw(&self, service: &ServiceKey) -> Result<(), TrafficError> {
        let subject = format!("{}/{}", service.instance, service.service);
        let latency = match self.hooks.admit(Op::Withdraw, &subject).await {
            Ok(latency) => latency,
            Err(f) => {
                self.hooks.tell(|| Effect::WithdrawFailed {
                    service: service.clone(),
                });
                return Err(TrafficError::Unreachable(text_err(f)));
            }
        };
        self.routes
            .lock()
            .expect("traffic poisoned")
            .remove(service);
        self.hooks.tell(|| Effect::Withdrawn {
            service: service.clone(),
        });
        latency.answer().await;
        Ok(())
    }
}

/// Readiness against the in-memory runtime, of the exact execution probed:
/// its container runs it still, and either says it is ready on exactly
/// the probed binds or, for a log probe, printed a line containing the
/// pattern during that execution. A log probe answers at once, as if its
/// timeout had passed: a line printed later counts for a later probe.
pub struct MemoryProbe {
    hooks: Hooks,
    runtime: Arc<MemoryRuntime>,
}

impl MemoryProbe {
    pub fn new(runtime: Arc<MemoryRuntime>, hooks: Hooks) -> Self {
        Self { hooks, runtime }
    }
}

#[async_trait]
impl Probe for MemoryProbe {
    async fn ready(&self, probe: &ReadinessProbe, target: &ProbeTarget) -> Result<(), ProbeError> {
        self.hooks
            .gate(Op::Probe, "")
            .await
            .map_err(|f| ProbeError::Unreachable(text_err(f)))?;
        let id = &target.container;
        let container = self
            .runtime
            .container(id)
            .filter(|c| c.status == ContainerStatus::Running && c.started_at == target.started_at);
        let not_running = || {
            format!(
                "container {id} does not run the execution started at {:?}",
                target.started_at
            )
        };
        // The order of the real probes' checks (adapters/probe.rs and
        // docker/logs.rs), and their kinds (tests/probe_contract.rs).
        let ready = match probe {
            ReadinessProbe::Log { pattern, timeout } => {
                log_ready(id, target, pattern, *timeout, container.as_ref())
            }
            ReadinessProbe::Http { path, .. } if !path.starts_with('/') => {
                Err(ProbeError::Misconfigured(format!(
                    "http probe path = {path:?} must start with '/'"
                )))
            }
            ReadinessProbe::Http { port, .. } | ReadinessProbe::Tcp { port, .. }
                if !target.binds.contains_key(port) =>
            {
                Err(ProbeError::Misconfigured(format!(
                    "readiness port {port} has no bind on this container (binds: {:?})",
                    target.binds
                )))
            }
            // `None` included: the real probe passes it without a look, but
            // the simulation renders no probe and lets this one stand for
            // the one a catalog would set (docs/simulation.md, "The port
            // contracts").
            _ => match &container {
                None => Err(ProbeError::Unreachable(not_running())),
                Some(c) if c.ready && c.binds == target.binds => Ok(()),
                Some(_) => Err(ProbeError::Unreachable("connection refused".into())),
            },
        };
        if ready.is_ok() {
            self.hooks.tell(|| Effect::ProbePassed {
                id: id.clone(),
                started_at: target.started_at,
                binds: target.binds.clone(),
            });
        }
        ready
    }
}

/// A log probe's verdict against the in-memory runtime, as the Docker
/// adapter's (`docker/logs.rs`) gives it: no start to tell executions
/// apart by, another execution, or none, is not ready; a bad pattern is
/// misconfigured; a line of this execution passes; otherwise the probe
/// timed out.
fn log_ready(
    id: &ContainerId,
    target: &ProbeTarget,
    pattern: &str,
    timeout: Duration,
    container: Option<&MemContainer>,
) -> Result<(), ProbeError> {
    let Some(started_at) = target.started_at else {
        return Err(ProbeError::NotReady(format!(
            "container {id}: the runtime reported no start, so its execution's log lines \
             cannot be told from an earlier one's"
        )));
    };
    if pattern.is_empty() || pattern.len() > stead::core::catalog::LOG_PATTERN_LEN_MAX {
        return Err(ProbeError::Misconfigured(format!(
            "log probe pattern {pattern:?} must be 1 to {} bytes",
            stead::core::catalog::LOG_PATTERN_LEN_MAX
        )));
    }
    let Some(c) = container else {
        return Err(ProbeError::NotReady(format!(
            "container {id} does not run the execution started at {started_at}"
        )));
    };
    let printed = c
        .log
        .iter()
        .any(|(execution, line)| *execution == c.started_at && line.contains(pattern));
    printed.then_some(()).ok_or_else(|| {
        ProbeError::NotReady(format!(
            "container {id}: timed out after {} s waiting for a log line containing {pattern:?}",
            timeout.as_secs_f64()
        ))
    })
}

/// Grants: a set of revoked (instance, service) pairs.
#[derive(Default)]
pub struct MemoryPolicy {
    revoked: Mutex<BTreeSet<(InstanceName, ServiceName)>>,
}

impl MemoryPolicy {
    pub fn revoke(&self, instance: InstanceName, service: ServiceName) {
        self.revoked
            .lock()
            .expect("poisoned")
            .insert((instance, service));
    }
}

#[async_trait]
impl Policy for MemoryPolicy {
    async fn check(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
    ) -> Result<(), PolicyError> {
        let revoked = self.revoked.lock().expect("poisoned");
        if revoked.contains(&(instance.clone(), service.clone())) {
            Err(PolicyError::Revoked(format!(
                "grants for {instance}/{service} revoked"
            )))
        } else {
            Ok(())
        }
    }
}

/// Releases by name, each with its namespace and version.
pub struct MemoryProvisioner {
    hooks: Hooks,
    /// Where `add_foreign` puts releases.
    namespace: String,
    releases: Mutex<BTreeMap<String, (String, String)>>,
    /// Each release's versions, one per revision, oldest first: what a
    /// rollback goes back through.
    history: Mutex<BTreeMap<String, Vec<String>>>,
    /// Chart versions whose releases go bad once installed (a bake's check
    /// finds them so).
    bad_versions: Mutex<std::collections::BTreeSet<String>>,
}

impl MemoryProvisioner {
    pub fn new(namespace: &str, hooks: Hooks) -> Self {
        Self {
            hooks,
            namespace: namespace.to_owned(),
            releases: Mutex::new(BTreeMap::new()),
            history: Mutex::new(BTreeMap::new()),
            bad_versions: Mutex::default(),
        }
    }

    /// Releases at chart version `version` go bad: a bake's check (#40)
    /// finds their chart's tests failing.
    pub fn go_bad(&self, version: &str) {
        self.bad_versions
            .lock()
            .expect("poisoned")
            .insert(version.to_owned());
    }

    /// An operator uninstalling by hand.
    pub fn remove_by_hand(&self, release: &str) {
        self.releases.lock().expect("poisoned").remove(release);
        self.history.lock().expect("poisoned").remove(release);
    }

    /// A release installed by some other tool.
    pub fn add_foreign(&self, release: &str) {
        self.releases.lock().expect("poisoned").insert(
            release.to_owned(),
            (self.namespace.clone(), "foreign".into()),
        );
    }

    /// Each release's version (a Helm release's chart version; empty for
    /// a Docker release).
    pub fn release_versions(&self) -> BTreeMap<String, String> {
        self.releases
            .lock()
            .expect("poisoned")
            .iter()
            .map(|(name, (_, version))| (name.clone(), version.clone()))
            .collect()
    }

    pub fn release_names(&self) -> Vec<String> {
        self.releases
            .lock()
            .expect("poisoned")
            .keys()
            .cloned()
            .collect()
    }
}

#[async_trait]
impl Provisioner for MemoryProvisioner {
    async fn install_or_upgrade(&self, spec: &ReleaseSpec) -> Result<(), ProvisionError> {
        let target = spec.target();
        let release = target.release.name.as_str();
        let version = match spec {
            ReleaseSpec::Docker { .. } => String::new(),
            ReleaseSpec::Helm(helm) => helm.chart_version.clone(),
        };
        check_release_names(&target)?;
        let latency = self
            .hooks
            .admit(Op::Install, release)
            .await
            .map_err(|f| ProvisionError::Unavailable(text_err(f)))?;
        self.history
            .lock()
            .expect("poisoned")
            .entry(release.to_owned())
            .or_default()
            .push(version.clone());
        self.releases.lock().expect("poisoned").insert(
            release.to_owned(),
            (target.release.namespace.clone(), version),
        );
        self.hooks.tell(|| Effect::Installed {
            release: release.to_owned(),
        });
        latency.answer().await;
        Ok(())
    }

    async fn uninstall(&self, target: &ReleaseTarget) -> Result<(), ProvisionError> {
        let release = target.release.name.as_str();
        check_release_names(target)?;
        let latency = self
            .hooks
            .admit(Op::Uninstall, release)
            .await
            .map_err(|f| ProvisionError::Unavailable(text_err(f)))?;
        // Only the release of that name in that namespace: one of the same
        // name elsewhere is another release, as to helm
        // (tests/provisioner_contract.rs).
        {
            let mut releases = self.releases.lock().expect("poisoned");
            if releases
                .get(release)
                .is_some_and(|(namespace, _)| *namespace == target.release.namespace)
            {
                releases.remove(release);
                self.history.lock().expect("poisoned").remove(release);
            }
        }
        self.hooks.tell(|| Effect::Uninstalled {
            release: release.to_owned(),
        });
        latency.answer().await;
        Ok(())
    }

    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError> {
        self.hooks
            .gate(Op::ListReleases, "")
            .await
            .map_err(|f| ProvisionError::Unavailable(text_err(f)))?;
        Ok(self
            .releases
            .lock()
            .expect("poisoned")
            .iter()
            .map(|(name, (namespace, _))| Release {
                name: name.clone(),
                namespace: namespace.clone(),
            })
            .collect())
    }

    async fn check_release(
        &self,
        target: &ReleaseTarget,
        tests: bool,
    ) -> Result<ReleaseHealth, ProvisionError> {
        // Gated by an op of its own: a listing's is the drift check's
        // (C5), whose faults the simulation judges by the tick.
        let release = target.release.name.as_str();
        self.hooks
            .gate(Op::CheckRelease, release)
            .await
            .map_err(|f| ProvisionError::Unavailable(text_err(f)))?;
        let version = self
            .releases
            .lock()
            .expect("poisoned")
            .get(release)
            .map(|(_, version)| version.clone());
        Ok(match version {
            None => ReleaseHealth::Bad(format!("release {release} is gone")),
            // A bad version's chart tests fail; its status stays deployed,
            // so only a check that runs the tests finds it bad.
            Some(v) if tests && self.bad_versions.lock().expect("poisoned").contains(&v) => {
                ReleaseHealth::Bad(format!("release {release} at chart {v}: its tests fail"))
            }
            Some(_) => ReleaseHealth::Healthy,
        })
    }

    /// Helm's: a release already at the version is left alone (no new
    /// revision); otherwise a new revision at it.
    async fn roll_back(&self, release: &HelmRelease) -> Result<(), ProvisionError> {
        let already = self
            .releases
            .lock()
            .expect("poisoned")
            .get(&release.name)
            .is_some_and(|(namespace, version)| {
                *namespace == release.namespace && *version == release.chart_version
            });
        if already {
            check_release_names(&ReleaseSpec::Helm(release.clone()).target())?;
            return Ok(());
        }
        self.install_or_upgrade(&ReleaseSpec::Helm(release.clone()))
            .await
    }

    async fn roll_back_from(
        &self,
        target: &ReleaseTarget,
        bad_chart_version: &str,
        back_to: Option<&HelmRelease>,
    ) -> Result<(), ProvisionError> {
        let release = target.release.name.as_str();
        // A release gone meanwhile (uninstalled by hand) has nothing to
        // roll back: Helm's adapter upgrades to the recorded version, which
        // installs it; without one, Helm says it is not found. (The fake
        // once told the checker it installed it and did not: simulation
        // seed 248, a C5 reprovision of a release the checker thought
        // there.)
        let present = self
            .releases
            .lock()
            .expect("poisoned")
            .contains_key(release);
        if !present {
            return match back_to {
                Some(back_to) => {
                    self.install_or_upgrade(&ReleaseSpec::Helm(back_to.clone()))
                        .await
                }
                None => Err(ProvisionError::Failed(format!(
                    "rollback of release {release}: release: not found"
                ))),
            };
        }
        let latency = self
            .hooks
            .admit(Op::Install, release)
            .await
            .map_err(|f| ProvisionError::Unavailable(text_err(f)))?;
        let back = {
            let mut history = self.history.lock().expect("poisoned");
            let revisions = history.entry(release.to_owned()).or_default();
            // The recorded version's chart (a rollback to its revision or
            // an upgrade to it, the same here); with none recorded, the
            // newest revision at another chart version, else the previous
            // one.
            let back = match back_to {
                Some(back_to) => Some(back_to.chart_version.clone()),
                None => revisions
                    .iter()
                    .rev()
                    .find(|v| *v != bad_chart_version)
                    .or_else(|| revisions.iter().rev().nth(1))
                    .cloned(),
            };
            if let Some(back) = &back {
                revisions.push(back.clone());
            }
            back
        };
        let Some(back) = back else {
            return Err(ProvisionError::Failed(format!(
                "release {release} has no revision to roll back to"
            )));
        };
        let from = self
            .releases
            .lock()
            .expect("poisoned")
            .get_mut(release)
            .map(|(_, version)| std::mem::replace(version, back));
        if let Some(from) = from {
            let bad = self.bad_versions.lock().expect("poisoned").contains(&from);
            self.hooks.tell(|| Effect::RolledBack {
                release: release.to_owned(),
                from,
                bad,
            });
        }
        self.hooks.tell(|| Effect::Installed {
            release: release.to_owned(),
        });
        latency.answer().await;
        Ok(())
    }

    async fn status(
        &self,
        target: &ReleaseTarget,
    ) -> Result<Option<ReleaseStatus>, ProvisionError> {
        Ok(self
            .releases
            .lock()
            .expect("poisoned")
            .get(&target.release.name)
            .filter(|(namespace, _)| *namespace == target.release.namespace)
            .map(|(_, version)| ReleaseStatus {
                status: "deployed".into(),
                // One revision per install, upgrade and rollback, as helm
                // counts them (a foreign release has one).
                revision: self
                    .history
                    .lock()
                    .expect("poisoned")
                    .get(&target.release.name)
                    .map_or(1, |h| h.len().max(1) as u64),
                chart: format!("chart-{version}"),
                description: "Install complete".into(),
            }))
    }
}

/// Refuses a release name or namespace the Helm adapter would refuse
/// before running helm: a release is named after its instance.
fn check_release_names(target: &ReleaseTarget) -> Result<(), ProvisionError> {
    names::check_instance_name("release", &target.release.name)
        .and_then(|()| names::check_dns_label("namespace", &target.release.namespace))
        .map_err(|e| ProvisionError::Refused(e.to_string()))
}

/// Records notifications.
#[derive(Default)]
pub struct MemoryNotifier {
    pub sent: Mutex<Vec<(String, String)>>,
    hooks: Hooks,
}

impl MemoryNotifier {
    pub fn new(hooks: Hooks) -> Self {
        Self {
            sent: Mutex::new(Vec::new()),
            hooks,
        }
    }
}

#[async_trait]
impl Notifier for MemoryNotifier {
    async fn notify(&self, event: &str, message: &str) -> Result<(), NotifyError> {
        self.hooks
            .gate(Op::Notify, event)
            .await
            .map_err(|f| NotifyError(text_err(f)))?;
        self.sent
            .lock()
            .expect("poisoned")
            .push((event.to_owned(), message.to_owned()));
        Ok(())
    }
}
