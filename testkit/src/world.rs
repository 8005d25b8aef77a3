//! A small deterministic world for driving the recovery machine
//! synchronously: containers, a traffic plane, ACTIVE, inhibitions and a
//! clock you advance. Scenario tests, property tests and benchmarks use it
//! so that each reads like a story. Pure: it is data plus a loop.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use jiff::Timestamp;

use stead::core::bake::RevertStep;
use stead::core::errors::{PolicyError, ProbeError, StoreError, TrafficError};
use stead::core::fleet::add;
use stead::core::memory::RecoveryMemory;
use stead::core::pass::{InstanceAnswer, InstanceCommand, InstancePass, PassInput};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{Command, Outcome, Report, Why};
use stead::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, ContainerStatus, Health, Inhibition,
    InhibitionReason, InstanceName, Intent, Observation, RuntimeError, ServiceKey, ServiceName,
};

/// One container of the fake runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeContainer {
    pub status: ContainerStatus,
    pub started_at: Option<Timestamp>,
    pub health: Health,
    pub binds: Binds,
    /// Whether a readiness probe against it passes.
    pub ready: bool,
    /// What the container does right after a start: `Running`, or crash
    /// straight back to `Exited`.
    pub status_after_start: ContainerStatus,
    /// Health it reports after a start or restart.
    pub health_after_start: Health,
}

impl FakeContainer {
    pub fn running(started_at: Timestamp, binds: Binds) -> Self {
        Self {
            status: ContainerStatus::Running,
            started_at: Some(started_at),
            health: Health::Healthy,
            binds,
            ready: true,
            status_after_start: ContainerStatus::Running,
            health_after_start: Health::Healthy,
        }
    }
}

/// Results the next commands of one kind are forced to have.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub withdraw: VecDeque<TrafficError>,
    pub publish: VecDeque<TrafficError>,
    pub inspect: VecDeque<RuntimeError>,
    pub start: VecDeque<RuntimeError>,
    pub restart: VecDeque<RuntimeError>,
    pub health: VecDeque<RuntimeError>,
    pub binds: VecDeque<RuntimeError>,
    pub persist: VecDeque<StoreError>,
    /// Failures of recording a verified execution in ACTIVE.
    pub record: VecDeque<StoreError>,
    /// When set, the policy check fails with this error.
    pub policy_revoked: Option<PolicyError>,
    /// When set, the runtime itself restarts the container while the
    /// readiness probe runs (a native restart racing verification).
    pub native_restart_during_probe: bool,
    /// When set, ACTIVE switches to this container during the probe (at
    /// the same effective revision: the container alone changed).
    pub active_switch_during_probe: Option<ContainerId>,
    /// When set, ACTIVE's effective revision becomes this during the probe
    /// (the same container, re-recorded by a deploy).
    pub active_revision_during_probe: Option<String>,
    /// When set, the runtime's own restart policy revives the container
    /// just as stead's start fails.
    pub native_restart_races_start: bool,
    /// When set, the inspection right after a failed start fails with it.
    pub inspect_after_failed_start: Option<RuntimeError>,
    /// When set, the process freezes this long between its inspect and
    /// its health read (a pause mid-pass): the clock jumps once.
    pub pause_before_health: Option<Duration>,
    /// When set, the process freezes this long right before a start (the
    /// first inspect saw the container down; the start and everything
    /// after it happen once the clock jumped).
    pub pause_before_start: Option<Duration>,
}

/// One command the world performed, for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Performed {
    pub at: Timestamp,
    pub service: ServiceName,
    pub container: ContainerId,
    pub command: Command,
    /// Why the machine asked for it (what the log line and the step
    /// counter say).
    pub why: Option<Why>,
}

/// A route in the fake traffic plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeRoute {
    pub container: ContainerId,
    pub binds: Binds,
    pub started_at: Option<Timestamp>,
}

/// The world. Fields are public so scenarios can arrange anything.
#[derive(Clone, Debug)]
pub struct World {
    pub now: Timestamp,
    pub policy: RecoveryPolicy,
    pub instance: InstanceName,
    pub intent: Intent,
    pub containers: BTreeMap<ContainerId, FakeContainer>,
    pub active: ActiveRecord,
    pub routes: BTreeMap<ServiceName, FakeRoute>,
    pub inhibitions: Vec<Inhibition>,
    pub memory: RecoveryMemory,
    pub faults: Faults,
    pub log: Vec<Performed>,
    /// Containers removed by retirement.
    pub removed: Vec<ContainerId>,
    /// Claims released for gone containers.
    pub released_claims: Vec<ContainerId>,
    /// Executions that passed a readiness probe: (container, started_at).
    pub probed_ready: Vec<(ContainerId, Option<Timestamp>)>,
    /// The version the instance's row records (a revert puts it back).
    pub version: String,
    /// Why the type's rollout was halted, once a revert halted it.
    pub halted: Option<String>,
    executions_started: i64,
}

impl World {
    /// A world with one instance `app` and no services.
    pub fn new() -> Self {
        Self {
            now: Timestamp::from_second(1_800_000_000).expect("valid"),
            policy: RecoveryPolicy::default(),
            instance: InstanceName::new("app"),
            intent: Intent::Running,
            containers: BTreeMap::new(),
            active: ActiveRecord::default(),
            routes: BTreeMap::new(),
            inhibitions: Vec::new(),
            memory: RecoveryMemory::default(),
            faults: Faults::default(),
            log: Vec::new(),
            removed: Vec::new(),
            released_claims: Vec::new(),
            probed_ready: Vec::new(),
            version: "1".into(),
            halted: None,
            executions_started: 0,
        }
    }

    /// Adds a running, healthy service whose ACTIVE record names `container`
    /// with verified binds `{8080: port}`.
    pub fn with_service(mut self, service: &str, container: &str, port: u16) -> Self {
        self.add_service(service, container, port);
        self
    }

    pub fn add_service(&mut self, service: &str, container: &str, port: u16) {
        let binds = Binds::from([(8080, port)]);
        let started_at = self.next_execution();
        self.containers.insert(
            ContainerId::new(container),
            FakeContainer::running(started_at, binds.clone()),
        );
        self.active.services.insert(
            ServiceName::new(service),
            ActiveService {
                container: ContainerId::new(container),
                effective_revision: "r1".into(),
                binds,
                stop_grace: None,
                verified_started_at: None,
            },
        );
    }

    pub fn container(&mut self, id: &str) -> &mut FakeContainer {
        self.containers
            .get_mut(&ContainerId::new(id))
            .unwrap_or_else(|| panic!("no container {id}"))
    }

    /// The container crashes: exited, traffic (if any) still routed.
    pub fn crash(&mut self, id: &str) {
        self.container(id).status = ContainerStatus::Exited;
    }

    /// The runtime restarts the container by itself: a new execution.
    pub fn native_restart(&mut self, id: &str) {
        let started_at = self.next_execution();
        let c = self.container(id);
        c.status = ContainerStatus::Running;
        c.started_at = Some(started_at);
    }

    pub fn advance(&mut self, d: Duration) {
        self.now = add(self.now, d);
    }

    pub fn inhibit(&mut self, service: &str, container: &str, reason: InhibitionReason) {
        self.inhibitions.push(Inhibition {
            service: ServiceName::new(service),
            container: ContainerId::new(container),
            reason,
            operation: "test".into(),
            created_at: self.now,
            stop_grace: None,
            revert_to: None,
        });
    }

    fn next_execution(&mut self) -> Timestamp {
        self.executions_started += 1;
        add(
            self.now,
            Duration::from_millis(self.executions_started as u64),
        )
    }

    /// Commands performed so far for `service`, without the log noise of
    /// other services.
    pub fn commands(&self, service: &str) -> Vec<Command> {
        self.log
            .iter()
            .filter(|p| p.service.as_str() == service)
            .map(|p| p.command.clone())
            .collect()
    }

    /// How many times `command` was performed on any service.
    pub fn count(&self, pred: impl Fn(&Command) -> bool) -> usize {
        self.log.iter().filter(|p| pred(&p.command)).count()
    }

    /// One recovery pass over the instance: the engine's own
    /// [`InstancePass`] machine, performed synchronously against this
    /// world. Returns the service reports.
    pub fn pass(&mut self) -> Vec<Report> {
        let input = PassInput {
            instance: self.instance.clone(),
            intent: self.intent,
            active: self.active.clone(),
            inhibitions: self.inhibitions.clone(),
            held: None,
            memory: self.memory.of_instance(&self.instance),
            service_type: "app".into(),
            now: self.now,
        };
        let policy = self.policy.clone();
        let mut pass = InstancePass::new(&policy, input);
        while let Some(command) = pass.poll_command() {
            let answer = self.perform_step(&command, pass.why());
            pass.handle(answer, self.now);
        }
        let report = pass.into_report();
        self.memory.replace_instance(&self.instance, report.memory);
        report.reports
    }

    /// Performs one command of the instance pass.
    fn perform_step(&mut self, command: &InstanceCommand, why: Option<Why>) -> InstanceAnswer {
        match command {
            InstanceCommand::Service { key, command } => {
                self.log.push(Performed {
                    at: self.now,
                    service: key.service.clone(),
                    container: key.container.clone(),
                    command: command.clone(),
                    why,
                });
                InstanceAnswer::Service(self.perform(&key.service, &key.container, command))
            }
            InstanceCommand::InspectSuccessor(id) => {
                InstanceAnswer::SuccessorInspected(self.inspect(id))
            }
            InstanceCommand::InspectPredecessor(id) => {
                InstanceAnswer::PredecessorInspected(self.inspect(id))
            }
            InstanceCommand::ReadRoutes => InstanceAnswer::RoutesRead(Ok(self
                .routes
                .iter()
                .filter_map(|(service, route)| {
                    let port = *route.binds.values().next()?;
                    let key = ServiceKey {
                        instance: self.instance.clone(),
                        service: service.clone(),
                    };
                    Some((key, port))
                })
                .collect())),
            InstanceCommand::StopPredecessor { generation, .. } => {
                InstanceAnswer::PredecessorStopped(
                    match self.containers.get_mut(&generation.container) {
                        None => Err(RuntimeError::NotFound),
                        Some(c) => {
                            c.status = ContainerStatus::Exited;
                            Ok(())
                        }
                    },
                )
            }
            InstanceCommand::RemovePredecessor(generation) => {
                self.containers.remove(&generation.container);
                self.removed.push(generation.container.clone());
                InstanceAnswer::PredecessorRemoved(Ok(()))
            }
            InstanceCommand::ReleaseClaims(generation) => {
                self.released_claims.push(generation.container.clone());
                InstanceAnswer::ClaimsReleased(Ok(()))
            }
            InstanceCommand::ClearMarker(generation) => {
                self.inhibitions.retain(|i| {
                    !(i.reason == InhibitionReason::RetirementPending
                        && i.service == generation.service
                        && i.container == generation.container)
                });
                InstanceAnswer::MarkerCleared(Ok(()))
            }
            InstanceCommand::WithdrawStale(key) => {
                self.routes.remove(&key.service);
                InstanceAnswer::StaleWithdrawn(Ok(()))
            }
            InstanceCommand::Revert { step, .. } => {
                match step.as_ref() {
                    RevertStep::HaltRollout { reason } => self.halted = Some(reason.clone()),
                    RevertStep::SaveMarker(marker) => {
                        self.inhibitions.retain(|i| {
                            (&i.service, &i.container) != (&marker.service, &marker.container)
                        });
                        self.inhibitions.push(marker.clone());
                    }
                    RevertStep::StopSuccessor { generation, .. } => {
                        if let Some(c) = self.containers.get_mut(&generation.container) {
                            c.status = ContainerStatus::Exited;
                        }
                    }
                    RevertStep::RestoreActive { service, record } => {
                        self.active.services.insert(service.clone(), record.clone());
                    }
                    RevertStep::RestoreVersion { version, .. } => self.version = version.clone(),
                }
                InstanceAnswer::Reverted(Ok(()))
            }
        }
    }

    fn perform(&mut self, service: &ServiceName, id: &ContainerId, command: &Command) -> Outcome {
        match command {
            Command::Withdraw => Outcome::Withdrawn(match self.faults.withdraw.pop_front() {
                Some(e) => Err(e),
                None => {
                    self.routes.remove(service);
                    Ok(())
                }
            }),
            Command::Inspect => Outcome::Inspected(self.inspect(id)),
            Command::ReleaseClaims => {
                self.released_claims.push(id.clone());
                Outcome::ClaimsReleased(Ok(()))
            }
            Command::CheckPolicy => Outcome::PolicyChecked(match &self.faults.policy_revoked {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }),
            Command::Start if self.faults.pause_before_start.is_some() => {
                let frozen = self.faults.pause_before_start.take().expect("set");
                self.advance(frozen);
                self.perform(service, id, command)
            }
            Command::Start => Outcome::Started(self.start(id)),
            Command::Restart { .. } => Outcome::Restarted(self.restart(id)),
            Command::Stop { .. } => Outcome::Stopped(match self.containers.get_mut(id) {
                None => Err(RuntimeError::NotFound),
                Some(c) => {
                    c.status = ContainerStatus::Exited;
                    Ok(())
                }
            }),
            Command::ReadHealth if self.faults.pause_before_health.is_some() => {
                let frozen = self.faults.pause_before_health.take().expect("set");
                self.advance(frozen);
                self.perform(service, id, command)
            }
            Command::ReadHealth => Outcome::Health(match self.faults.health.pop_front() {
                Some(e) => Err(e),
                None => self
                    .containers
                    .get(id)
                    .map(|c| c.health)
                    .ok_or(RuntimeError::NotFound),
            }),
            Command::ReadBinds => Outcome::Binds(match self.faults.binds.pop_front() {
                Some(e) => Err(e),
                None => self
                    .containers
                    .get(id)
                    .map(|c| c.binds.clone())
                    .ok_or(RuntimeError::NotFound),
            }),
            Command::ProbeReadiness { .. } => Outcome::Readiness(self.probe(id)),
            Command::ReloadActive => {
                Outcome::ActiveReloaded(Ok(self.active.services.get(service).cloned()))
            }
            Command::PersistBinds { binds, .. } => {
                Outcome::BindsPersisted(match self.faults.persist.pop_front() {
                    Some(e) => Err(e),
                    None => match self.active.services.get_mut(service) {
                        Some(record) if &record.container == id => {
                            record.binds = binds.clone();
                            Ok(true)
                        }
                        _ => Ok(false),
                    },
                })
            }
            Command::Publish { binds, started_at } => {
                Outcome::Published(match self.faults.publish.pop_front() {
                    Some(e) => Err(e),
                    None => {
                        self.routes.insert(
                            service.clone(),
                            FakeRoute {
                                container: id.clone(),
                                binds: binds.clone(),
                                started_at: *started_at,
                            },
                        );
                        Ok(())
                    }
                })
            }
            Command::RecordExecution { started_at } => {
                if let Some(e) = self.faults.record.pop_front() {
                    return Outcome::ExecutionRecorded(Err(e));
                }
                if let Some(record) = self.active.services.get_mut(service) {
                    if &record.container == id {
                        record.verified_started_at = Some(*started_at);
                    }
                }
                Outcome::ExecutionRecorded(Ok(()))
            }
        }
    }

    fn inspect(&mut self, id: &ContainerId) -> Result<Observation, RuntimeError> {
        if let Some(e) = self.faults.inspect.pop_front() {
            return Err(e);
        }
        self.containers
            .get(id)
            .map(|c| Observation {
                status: c.status,
                started_at: c.started_at,
                // As the in-memory runtime reports a down container.
                exit: (c.status.is_down() && c.started_at.is_some()).then_some(
                    stead::core::types::Exit {
                        code: crate::ports::MEM_EXIT_CODE_CRASHED,
                        finished_at: None,
                    },
                ),
            })
            .ok_or(RuntimeError::NotFound)
    }

    fn start(&mut self, id: &ContainerId) -> Result<(), RuntimeError> {
        if !self.containers.contains_key(id) {
            return Err(RuntimeError::NotFound);
        }
        if let Some(e) = self.faults.start.pop_front() {
            if self.faults.native_restart_races_start {
                let started_at = self.next_execution();
                let c = self.containers.get_mut(id).expect("present");
                c.status = ContainerStatus::Running;
                c.started_at = Some(started_at);
            }
            if let Some(inspect) = self.faults.inspect_after_failed_start.take() {
                self.faults.inspect.push_front(inspect);
            }
            return Err(e);
        }
        let started_at = self.next_execution();
        let c = self.containers.get_mut(id).expect("present");
        c.status = c.status_after_start;
        c.started_at = Some(started_at);
        c.health = c.health_after_start;
        Ok(())
    }

    fn restart(&mut self, id: &ContainerId) -> Result<(), RuntimeError> {
        if let Some(e) = self.faults.restart.pop_front() {
            return Err(e);
        }
        self.start(id)
    }

    fn probe(&mut self, id: &ContainerId) -> Result<(), ProbeError> {
        if self.faults.native_restart_during_probe {
            self.faults.native_restart_during_probe = false;
            let started_at = self.next_execution();
            if let Some(c) = self.containers.get_mut(id) {
                c.started_at = Some(started_at);
            }
        }
        if let Some(next) = self.faults.active_switch_during_probe.take() {
            for record in self.active.services.values_mut() {
                if &record.container == id {
                    record.container = next.clone();
                }
            }
        }
        if let Some(revision) = self.faults.active_revision_during_probe.take() {
            for record in self.active.services.values_mut() {
                if &record.container == id {
                    record.effective_revision = revision.clone();
                }
            }
        }
        let c = self
            .containers
            .get(id)
            .ok_or_else(|| ProbeError::Unreachable("container gone".into()))?;
        if c.ready && c.status == ContainerStatus::Running {
            self.probed_ready.push((id.clone(), c.started_at));
            Ok(())
        } else {
            Err(ProbeError::Unreachable("connection refused".into()))
        }
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}
