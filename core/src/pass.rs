//! One instance's recovery pass as a sans-IO machine (R2, R3, R15, R16, T5).
//!
//! It owns the order of everything a pass does to one instance: each
//! service's recovery ([`ServiceRecovery`]) in ACTIVE's order, then every
//! `retirement-pending` marker (R15: confirm the successor, read its route
//! back, stop, remove, release claims, clear the marker), then the routes
//! ACTIVE no longer names, then pruning memory (R16). The daemon's engine
//! and the test [`super::world::World`] drive this one machine, so the
//! sequence they run is the same by construction.
//!
//! The caller loads the instance under its lock, then loops:
//!
//! ```text
//! while let Some(command) = pass.poll_command() {
//!     // outside effects only while the lease and lock are trusted
//!     let answer = perform(command);      // through the ports
//!     pass.handle(answer, now);
//! }
//! let report = pass.into_report();
//! ```
//!
//! The instance deadline is the driver's, measured on its monotonic clock:
//! when it passes, or when the driver loses its mandate (lease or lock)
//! mid-pass, the driver calls [`InstancePass::abandon`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::bake::{
    bakes, baking, fails_while_baking, keeps_reverted, revert_steps, RevertStep, UNDO_TASK_GRACE,
};
use super::errors::{failure_of, Cause, ErrorKind, PortName, StoreError, TrafficError};
use super::machine::{Machine, MachineAnswer, MachineCommand};

use super::fleet::{add, InstanceState, ListedInstance};
use super::memory::InstanceMemory;
use super::policy::RecoveryPolicy;
use super::recovery::{
    Command, Outcome, ProxyView, RecoveryError, Report, ServiceInput, ServiceRecovery, Verdict, Why,
};
use super::retire::{
    decide_marker, inhibition_for, note_verdict, successor_confirmed, successor_routed,
    MarkerDecision, VerifiedThisPass,
};
use super::traffic::{routes_of_gone_instances, routes_without_active, FleetRoutes, HeldRoutes};
use super::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, GenerationKey, Inhibition, InhibitionReason,
    InstanceName, Intent, Observation, RuntimeError, ServiceKey, ServiceName,
};

/// What one instance's pass starts from, all loaded under its lock.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PassInput {
    pub instance: InstanceName,
    pub intent: Intent,
    pub active: ActiveRecord,
    pub inhibitions: Vec<Inhibition>,
    /// The routes the proxy held when the whole pass began (T5); `None`
    /// for a targeted pass or when the read failed (memory is trusted).
    pub held: Option<HeldRoutes>,
    /// This instance's memory from earlier passes
    /// ([`super::memory::RecoveryMemory::of_instance`]).
    pub memory: InstanceMemory,
    /// The instance's type, whose rollout a revert halts.
    pub service_type: String,
    /// When the pass began: whether a successor still bakes (#40).
    pub now: Timestamp,
}

/// One effect the driver must perform.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum InstanceCommand {
    /// A step of one service's recovery, on that exact generation. The
    /// key is shared by every step of the service (a steady service takes
    /// several; each copy of three names was three atomic increments and
    /// three decrements, issue #14).
    Service {
        key: Arc<GenerationKey>,
        command: Command,
    },
    /// R15: the successor's final inspection before its predecessor goes.
    InspectSuccessor(ContainerId),
    /// #40: whether a baking predecessor still runs (once stopped, it is
    /// left alone until its window ends).
    InspectPredecessor(ContainerId),
    /// R15, S5: the proxy's routes, read back at the moment of retiring
    /// (the pass's own view is as old as the pass).
    ReadRoutes,
    /// R15: stop the superseded container.
    StopPredecessor {
        generation: GenerationKey,
        grace: Duration,
    },
    RemovePredecessor(GenerationKey),
    /// Release the bind claims of the removed predecessor.
    ReleaseClaims(GenerationKey),
    /// Drop the `retirement-pending` marker of this generation.
    ClearMarker(GenerationKey),
    /// T5: a route of this instance's service that ACTIVE no longer names.
    WithdrawStale(ServiceKey),
    /// #40: one step of reverting a successor that failed while baking.
    Revert {
        service_type: String,
        step: Box<RevertStep>,
    },
}

impl MachineCommand for InstanceCommand {
    fn is_effect(&self) -> bool {
        self.is_outside_effect()
    }
}

impl InstanceCommand {
    /// Whether the command changes the workload or the traffic plane (no
    /// fence can guard it, so it needs the lease and lock trusted now).
    pub fn is_outside_effect(&self) -> bool {
        match self {
            Self::Service { command, .. } => command.is_outside_effect(),
            Self::StopPredecessor { .. } | Self::RemovePredecessor(_) | Self::WithdrawStale(_) => {
                true
            }
            // Unfenced writes: performed only while the mandate holds.
            Self::Revert { .. } => true,
            Self::InspectSuccessor(_)
            | Self::InspectPredecessor(_)
            | Self::ReadRoutes
            | Self::ReleaseClaims(_)
            | Self::ClearMarker(_) => false,
        }
    }
}

/// The result of performing an [`InstanceCommand`], variant for variant.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum InstanceAnswer {
    Service(Outcome),
    SuccessorInspected(Result<Observation, RuntimeError>),
    PredecessorInspected(Result<Observation, RuntimeError>),
    RoutesRead(Result<HeldRoutes, TrafficError>),
    PredecessorStopped(Result<(), RuntimeError>),
    PredecessorRemoved(Result<(), RuntimeError>),
    ClaimsReleased(Result<(), StoreError>),
    MarkerCleared(Result<(), StoreError>),
    StaleWithdrawn(Result<(), TrafficError>),
    Reverted(Result<(), Cause>),
}

impl InstanceAnswer {
    /// The port and kind of the failure this answer reports, if any.
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Service(outcome) => outcome.port_failure(),
            Self::SuccessorInspected(r) | Self::PredecessorInspected(r) => failure_of(r),
            Self::RoutesRead(r) => failure_of(r),
            Self::PredecessorStopped(r) | Self::PredecessorRemoved(r) => failure_of(r),
            Self::ClaimsReleased(r) | Self::MarkerCleared(r) => failure_of(r),
            Self::StaleWithdrawn(r) => failure_of(r),
            Self::Reverted(r) => r.as_ref().err().and_then(|c| Some((c.port()?, c.kind()))),
        }
    }

    /// Whether this is the kind of answer `command` is answered with (a
    /// replayed recording is checked by it: the machine is never fed
    /// another).
    pub fn answers(&self, command: &InstanceCommand) -> bool {
        use InstanceCommand as C;
        match (self, command) {
            (Self::Service(outcome), C::Service { command, .. }) => {
                super::recovery::outcome_answers(outcome, command)
            }
            (Self::SuccessorInspected(_), C::InspectSuccessor(_))
            | (Self::PredecessorInspected(_), C::InspectPredecessor(_))
            | (Self::RoutesRead(_), C::ReadRoutes)
            | (Self::PredecessorStopped(_), C::StopPredecessor { .. })
            | (Self::PredecessorRemoved(_), C::RemovePredecessor(_))
            | (Self::ClaimsReleased(_), C::ReleaseClaims(_))
            | (Self::MarkerCleared(_), C::ClearMarker(_))
            | (Self::StaleWithdrawn(_), C::WithdrawStale(_))
            | (Self::Reverted(_), C::Revert { .. }) => true,
            _ => false,
        }
    }
}

/// One failure of an instance's pass, naming the instance and what in it
/// failed; a port's failure is its source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error("{instance}/{service}: {source}")]
    Service {
        instance: InstanceName,
        service: ServiceName,
        #[source]
        source: RecoveryError,
    },
    #[error("{instance}: retirement pending for {container}: {source}")]
    Retirement {
        instance: InstanceName,
        container: ContainerId,
        #[source]
        source: RetireError,
    },
    #[error("{}/{}: withdraw stale route: {source}", .route.instance, .route.service)]
    StaleRoute {
        route: ServiceKey,
        #[source]
        source: TrafficError,
    },
    #[error("{instance}: reverting a failed successor: {step:?}: {source}")]
    Revert {
        instance: InstanceName,
        step: Box<RevertStep>,
        #[source]
        source: Cause,
    },
    #[error("{instance}: {pending} retirement(s) left for the next pass: {}", .why.describe())]
    RetirementsLeft {
        instance: InstanceName,
        pending: usize,
        why: Abandon,
    },
}

/// Why one marker's retirement did not finish this pass (R15).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetireError {
    #[error("the proxy's routes could not be read back ({0}); retirement left for later")]
    RoutesUnread(#[source] TrafficError),
    #[error("stop: {0}")]
    Stop(#[source] RuntimeError),
    #[error("remove: {0}")]
    Remove(#[source] RuntimeError),
    #[error("release claims: {0}")]
    ReleaseClaims(#[source] StoreError),
    #[error("clear marker: {0}")]
    ClearMarker(#[source] StoreError),
}

pub use super::machine::Abandon;

/// What one instance's pass did.
#[derive(Debug)]
pub struct InstanceReport {
    pub reports: Vec<Report>,
    /// Predecessors retired (R15).
    pub retired: Vec<ContainerId>,
    /// Stale routes withdrawn (T5).
    pub withdrawn_stale: Vec<ServiceKey>,
    /// #40: why the instance's baking successors were reverted this pass
    /// (every step of the revert done), with the services put back and
    /// the successor each was taken from (kept a while, #55).
    pub reverted: Option<(String, Vec<(ServiceName, ContainerId)>)>,
    /// Each naming the instance (and service) it concerns.
    pub errors: Vec<PassError>,
    /// This instance's memory for the next pass, pruned (R16).
    pub memory: InstanceMemory,
}

impl InstanceReport {
    /// When this instance next wants a pass of its own: the earliest
    /// moment a delayed service's budget allows its next attempt (R10), so
    /// it is recovered then rather than at the next tick.
    pub fn wake_at(&self) -> Option<Timestamp> {
        self.reports
            .iter()
            .filter_map(|r| match r.verdict {
                Verdict::Delayed { next_attempt } => next_attempt,
                _ => None,
            })
            .min()
    }
}

/// Where one marker's retirement stands.
#[derive(Debug)]
enum MarkerStep {
    Clear,
    /// #40: a baking predecessor already down is left as it is; a running
    /// one goes on to `then` (confirm the successor, stop it).
    InspectPredecessor {
        then: Box<MarkerStep>,
    },
    InspectSuccessor {
        successor: ContainerId,
        verified_started_at: Option<Timestamp>,
        binds: Binds,
    },
    ReadRoutes {
        binds: Binds,
    },
    Stop,
    Remove,
    ReleaseClaims,
    ClearRetired,
}

/// The command awaiting its answer.
#[derive(Debug)]
enum Outstanding {
    /// The service in hand's: its own machine holds the command.
    Service,
    Other(InstanceCommand),
}

#[derive(Debug)]
enum Stage {
    Services,
    /// #40: a baking successor failed: revert, then skip the markers.
    Revert,
    Markers,
    Stale,
    Done,
}

/// The machine. See the module docs.
#[derive(Debug)]
pub struct InstancePass<'p> {
    policy: &'p RecoveryPolicy,
    instance: InstanceName,
    intent: Intent,
    active: ActiveRecord,
    inhibitions: Vec<Inhibition>,
    held: Option<HeldRoutes>,
    memory: InstanceMemory,
    stage: Stage,
    services: VecDeque<(ServiceName, ActiveService)>,
    current: Option<ServiceRecovery<'p>>,
    /// The current machine's key, shared by its commands.
    current_key: Option<Arc<GenerationKey>>,
    verified: VerifiedThisPass,
    markers: VecDeque<Inhibition>,
    marker: Option<(Inhibition, MarkerStep)>,
    stale: VecDeque<ServiceKey>,
    outstanding: Option<Outstanding>,
    reports: Vec<Report>,
    retired: Vec<ContainerId>,
    withdrawn_stale: Vec<ServiceKey>,
    errors: Vec<PassError>,
    service_type: String,
    now: Timestamp,
    /// The first baking successor seen failing this pass, and why.
    failing: Option<(ServiceName, String)>,
    reverting: VecDeque<RevertStep>,
    reverted: Option<(String, Vec<(ServiceName, ContainerId)>)>,
}

impl<'p> InstancePass<'p> {
    pub fn new(policy: &'p RecoveryPolicy, input: PassInput) -> Self {
        let services = input
            .active
            .services
            .iter()
            .map(|(name, record)| (name.clone(), record.clone()))
            .collect();
        let markers = input
            .inhibitions
            .iter()
            .filter(|i| i.reason == InhibitionReason::RetirementPending)
            .cloned()
            .collect();
        let held = input
            .held
            .filter(|_| !crate::broken!(policy.broken, ForgetProxyRoutes));
        Self {
            policy,
            instance: input.instance,
            intent: input.intent,
            active: input.active,
            inhibitions: input.inhibitions,
            held,
            memory: input.memory,
            stage: Stage::Services,
            services,
            current: None,
            current_key: None,
            verified: VerifiedThisPass::new(),
            markers,
            marker: None,
            stale: VecDeque::new(),
            outstanding: None,
            reports: Vec::new(),
            retired: Vec::new(),
            withdrawn_stale: Vec::new(),
            errors: Vec::new(),
            service_type: input.service_type,
            now: input.now,
            failing: None,
            reverting: VecDeque::new(),
            reverted: None,
        }
    }

    pub fn instance(&self) -> &InstanceName {
        &self.instance
    }

    /// Why the current service's machine does what it does (for the log).
    pub fn why(&self) -> Option<Why> {
        self.current.as_ref().map(ServiceRecovery::why)
    }

    pub fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }

    /// The next effect to perform, or `None` once the pass is over.
    pub fn poll_command(&mut self) -> Option<InstanceCommand> {
        assert!(
            self.outstanding.is_none(),
            "poll_command before the last command was answered"
        );
        let command = self.next_command()?;
        // Services one at a time, each to its end, before anything else
        // of the instance (retirements, stale routes) is touched.
        debug_assert!(
            matches!(command, InstanceCommand::Service { .. }) || self.current.is_none(),
            "{command:?} issued while a service's recovery is unfinished"
        );
        self.outstanding = Some(match &command {
            // The service's machine keeps its own command: no copy of the
            // key per step (a steady pass issues several per service).
            InstanceCommand::Service { .. } => Outstanding::Service,
            other => Outstanding::Other(other.clone()),
        });
        Some(command)
    }

    fn next_command(&mut self) -> Option<InstanceCommand> {
        loop {
            match self.stage {
                Stage::Services => {
                    if let Some(machine) = &mut self.current {
                        if let Some(command) = machine.poll_command() {
                            let key = self.current_key.as_ref().expect("a machine's key");
                            return Some(InstanceCommand::Service {
                                key: Arc::clone(key),
                                command,
                            });
                        }
                        let machine = self.current.take().expect("current");
                        self.current_key = None;
                        self.finish_service(machine.into_report());
                        continue;
                    }
                    match self.services.pop_front() {
                        Some((name, record)) => {
                            let machine = self.service_machine(name, record);
                            self.current_key = Some(Arc::new(machine.key().clone()));
                            self.current = Some(machine);
                        }
                        None => self.stage = self.plan_revert(),
                    }
                }
                Stage::Revert => match self.reverting.front() {
                    Some(step) => {
                        return Some(InstanceCommand::Revert {
                            service_type: self.service_type.clone(),
                            step: Box::new(step.clone()),
                        })
                    }
                    None => {
                        // ACTIVE and the markers changed under the pass:
                        // the next pass retires what is to be retired.
                        self.markers.clear();
                        self.stage = Stage::Markers;
                    }
                },
                Stage::Markers => {
                    if let Some(command) = self.marker_command() {
                        return Some(command);
                    }
                    // `marker_command` answers `None` only once no marker
                    // is in hand and none is left.
                    self.stale = self
                        .held
                        .as_ref()
                        .map(|held| routes_without_active(held, &self.instance, &self.active))
                        .unwrap_or_default()
                        .into();
                    self.stage = Stage::Stale;
                }
                Stage::Stale => match self.stale.pop_front() {
                    Some(key) => return Some(InstanceCommand::WithdrawStale(key)),
                    None => {
                        self.prune_memory();
                        self.stage = Stage::Done;
                    }
                },
                Stage::Done => return None,
            }
        }
    }

    fn service_machine(&self, service: ServiceName, record: ActiveService) -> ServiceRecovery<'p> {
        let record = if crate::broken!(self.policy.broken, StartNonActive) {
            let marker = self
                .inhibitions
                .iter()
                .find(|i| i.service == service && i.reason == InhibitionReason::RetirementPending);
            ActiveService {
                container: marker.map_or(record.container.clone(), |m| m.container.clone()),
                ..record
            }
        } else {
            record
        };
        let key = GenerationKey {
            instance: self.instance.clone(),
            service: service.clone(),
            container: record.container.clone(),
        };
        let input = ServiceInput {
            inhibition: inhibition_for(&self.inhibitions, &service, &record.container),
            memory: self.memory.service(&key),
            key,
            active: record,
            intent: self.intent,
            proxy: proxy_view(self.held.as_ref(), &self.instance, &service),
        };
        ServiceRecovery::new(self.policy, input)
    }

    /// #40: whether the marker's predecessor is kept, stopped
    /// ([`bakes`]). One found gone is retired all the same: there is
    /// nothing left to go back to. A successor a revert took away is kept
    /// stopped too, for a while, as the evidence of what failed (#55).
    fn keeps(&self, marker: &Inhibition) -> bool {
        bakes(marker, &self.active, self.now).is_some()
            || (keeps_reverted(marker, self.now)
                && !crate::broken!(self.policy.broken, RemoveRevertedAtOnce))
    }

    /// R16, keeping the history of the generations under a marker: a
    /// revert makes a baking predecessor ACTIVE again, and an upgrade
    /// retried before a reverted successor is retired creates (by name)
    /// and switches to that very container again (#40, seed 324): either
    /// way its crash-loop budget goes on (R10). A marker lasts until its
    /// container is retired, so this holds nothing for long.
    fn prune_memory(&mut self) {
        let marked: Vec<&ContainerId> = self
            .inhibitions
            .iter()
            .filter(|m| m.reason == InhibitionReason::RetirementPending)
            .map(|m| &m.container)
            .collect();
        self.memory.prune_keeping(&self.active, &marked);
    }

    /// After the services: revert if a baking successor failed (#40),
    /// else go on to the markers.
    fn plan_revert(&mut self) -> Stage {
        // `stead rollout undo` asks for the way back on the markers, for
        // an upgrade task to take without a gap (`core::undo`); if none
        // has after a while, the pass takes it.
        let undone = || {
            baking(&self.inhibitions, &self.active, self.now)
                .find(|(marker, back, _)| {
                    back.undone && add(marker.created_at, UNDO_TASK_GRACE) <= self.now
                })
                .map(|(marker, _, _)| (marker.service.clone(), "undone by an operator".to_owned()))
        };
        let Some((service, why)) = self.failing.clone().or_else(undone) else {
            return Stage::Markers;
        };
        let why = format!("{service}: {why}");
        self.reverting = revert_steps(
            self.instance.as_str(),
            &self.inhibitions,
            &self.active,
            &why,
            self.now,
            self.policy.broken,
        )
        .into();
        let services = baking(&self.inhibitions, &self.active, self.now)
            .map(|(marker, _, successor)| (marker.service.clone(), successor.container.clone()))
            .collect();
        self.reverted = Some((why, services));
        Stage::Revert
    }

    fn finish_service(&mut self, report: Report) {
        if self.failing.is_none() {
            let key = &report.key;
            let failing = baking(&self.inhibitions, &self.active, self.now)
                .find(|(marker, _, successor)| {
                    marker.service == key.service && successor.container == key.container
                })
                .and_then(|(_, _, successor)| fails_while_baking(&report, successor));
            if let Some(why) = failing {
                self.failing = Some((key.service.clone(), why));
            }
        }
        // A successor whose verified execution could not be recorded does
        // not let its predecessor go: a port-less one is verified without a
        // route, and retiring on it would leave ACTIVE naming an execution
        // nobody recorded as serving (S5; found with the clock faults of
        // #41, a write fenced while the outside effects were still trusted).
        let recorded = !report
            .errors
            .iter()
            .any(|e| matches!(e, RecoveryError::RecordFailed(_)));
        if recorded {
            note_verdict(&mut self.verified, &report.key.service, &report.verdict);
        }
        for e in &report.errors {
            self.errors.push(PassError::Service {
                instance: self.instance.clone(),
                service: report.key.service.clone(),
                source: e.clone(),
            });
        }
        self.memory.apply(&report);
        self.reports.push(report);
    }

    /// The next command of the marker in hand, taking up markers in turn;
    /// `None` when no marker is left.
    fn marker_command(&mut self) -> Option<InstanceCommand> {
        loop {
            if self.marker.is_none() {
                let marker = self.markers.pop_front()?;
                let step = match decide_marker(
                    &marker,
                    &self.active,
                    self.intent,
                    &self.verified,
                    self.policy.broken,
                ) {
                    MarkerDecision::ClearMarker => MarkerStep::Clear,
                    MarkerDecision::Wait => continue,
                    MarkerDecision::Retire => MarkerStep::Stop,
                    MarkerDecision::ConfirmSuccessor {
                        successor,
                        verified_started_at,
                        binds,
                    } => MarkerStep::InspectSuccessor {
                        successor,
                        verified_started_at,
                        binds,
                    },
                };
                let step = match step {
                    MarkerStep::Clear => step,
                    then if self.keeps(&marker) => MarkerStep::InspectPredecessor {
                        then: Box::new(then),
                    },
                    then => then,
                };
                self.marker = Some((marker, step));
            }
            let (marker, step) = self.marker.as_ref().expect("marker in hand");
            let generation = GenerationKey {
                instance: self.instance.clone(),
                service: marker.service.clone(),
                container: marker.container.clone(),
            };
            return Some(match step {
                MarkerStep::Clear | MarkerStep::ClearRetired => {
                    InstanceCommand::ClearMarker(generation)
                }
                MarkerStep::InspectSuccessor { successor, .. } => {
                    InstanceCommand::InspectSuccessor(successor.clone())
                }
                MarkerStep::InspectPredecessor { .. } => {
                    InstanceCommand::InspectPredecessor(marker.container.clone())
                }
                MarkerStep::ReadRoutes { .. } => InstanceCommand::ReadRoutes,
                MarkerStep::Stop => InstanceCommand::StopPredecessor {
                    generation,
                    grace: marker.stop_grace.unwrap_or(self.policy.stop_grace_default),
                },
                MarkerStep::Remove => InstanceCommand::RemovePredecessor(generation),
                MarkerStep::ReleaseClaims => InstanceCommand::ReleaseClaims(generation),
            });
        }
    }

    /// Feeds the answer to the last command.
    pub fn handle(&mut self, answer: InstanceAnswer, now: Timestamp) {
        let command = self
            .outstanding
            .take()
            .expect("an answer without a command");
        let command = match (command, answer) {
            (Outstanding::Service, InstanceAnswer::Service(outcome)) => {
                return self
                    .current
                    .as_mut()
                    .expect("a service in hand")
                    .handle(outcome, now)
            }
            (Outstanding::Service, answer) => {
                panic!("a service's command answered with {answer:?}")
            }
            (Outstanding::Other(command), answer) => (command, answer),
        };
        match command {
            (InstanceCommand::Revert { step, .. }, InstanceAnswer::Reverted(result)) => {
                self.reverting.pop_front();
                // The pass's ACTIVE stays the one it loaded: its memory is
                // pruned against it, and the next pass loads the new one.
                match result {
                    Ok(()) => {}
                    Err(source) => {
                        // The rest waits for the pass that next sees the
                        // successor fail; the halt, if done, holds.
                        self.reverting.clear();
                        self.reverted = None;
                        self.errors.push(PassError::Revert {
                            instance: self.instance.clone(),
                            step,
                            source,
                        });
                    }
                }
            }
            (InstanceCommand::WithdrawStale(key), InstanceAnswer::StaleWithdrawn(result)) => {
                match result {
                    Ok(()) => self.withdrawn_stale.push(key),
                    Err(source) => self
                        .errors
                        .push(PassError::StaleRoute { route: key, source }),
                }
            }
            (command, answer) => self.handle_marker(command, answer),
        }
    }

    fn handle_marker(&mut self, command: InstanceCommand, answer: InstanceAnswer) {
        let (marker, step) = self.marker.take().expect("a marker in hand");
        let next = match (step, answer) {
            (MarkerStep::Clear, InstanceAnswer::MarkerCleared(result)) => {
                result.err().map(|e| Err(RetireError::ClearMarker(e)))
            }
            (
                MarkerStep::InspectPredecessor { then },
                InstanceAnswer::PredecessorInspected(seen),
            ) => {
                match seen {
                    Ok(obs) if !obs.status.is_down() => Some(Ok(*then)),
                    // Stopped already, or gone (the end of the bake finds
                    // it so), or unreadable: looked at again next pass.
                    _ => None,
                }
            }
            (
                MarkerStep::InspectSuccessor {
                    verified_started_at,
                    binds,
                    ..
                },
                InstanceAnswer::SuccessorInspected(inspection),
            ) => successor_confirmed(&inspection, verified_started_at, self.policy.broken)
                .then_some(Ok(MarkerStep::ReadRoutes { binds })),
            (MarkerStep::ReadRoutes { binds }, InstanceAnswer::RoutesRead(read)) => {
                let key = ServiceKey {
                    instance: self.instance.clone(),
                    service: marker.service.clone(),
                };
                match read {
                    Ok(routes) => {
                        let proxy = routes
                            .get(&key)
                            .map_or(ProxyView::Absent, |port| ProxyView::Dials(*port));
                        successor_routed(proxy, &binds).then_some(Ok(MarkerStep::Stop))
                    }
                    Err(e) => Some(Err(RetireError::RoutesUnread(e))),
                }
            }
            // #40: while the successor bakes, its predecessor is stopped
            // but kept, the way back.
            (MarkerStep::Stop, InstanceAnswer::PredecessorStopped(Ok(())))
                if self.keeps(&marker) =>
            {
                None
            }
            (MarkerStep::Stop, InstanceAnswer::PredecessorStopped(result)) => match result {
                Ok(()) | Err(RuntimeError::NotFound) => Some(Ok(MarkerStep::Remove)),
                Err(e) => Some(Err(RetireError::Stop(e))),
            },
            // The marker stays until the container is gone and its claims
            // are released, so a failure of either is retried next pass.
            (MarkerStep::Remove, InstanceAnswer::PredecessorRemoved(result)) => Some(
                result
                    .map(|()| MarkerStep::ReleaseClaims)
                    .map_err(RetireError::Remove),
            ),
            (MarkerStep::ReleaseClaims, InstanceAnswer::ClaimsReleased(result)) => Some(
                result
                    .map(|()| MarkerStep::ClearRetired)
                    .map_err(RetireError::ReleaseClaims),
            ),
            (MarkerStep::ClearRetired, InstanceAnswer::MarkerCleared(result)) => match result {
                Ok(()) => {
                    self.retired.push(marker.container.clone());
                    None
                }
                Err(e) => Some(Err(RetireError::ClearMarker(e))),
            },
            (step, answer) => {
                panic!("answer {answer:?} does not answer {command:?} (marker step {step:?})")
            }
        };
        match next {
            Some(Ok(step)) => self.marker = Some((marker, step)),
            Some(Err(source)) => self.errors.push(PassError::Retirement {
                instance: self.instance.clone(),
                container: marker.container.clone(),
                source,
            }),
            None => {}
        }
    }

    /// Gives up the rest of the pass, failing closed: the service in hand
    /// and every service not reached yet are abandoned (an unanswered
    /// withdrawal counts as failed; a period nobody watched does not count
    /// towards the stable minutes that reset a budget, R10), markers and
    /// stale routes wait for the next pass. Memory keeps what was learnt.
    pub fn abandon(&mut self, why: Abandon) {
        if self.is_done() {
            return;
        }
        self.outstanding = None;
        self.current_key = None;
        if let Some(mut machine) = self.current.take() {
            machine.abandon(why);
            self.finish_service(machine.into_report());
        }
        while let Some((name, record)) = self.services.pop_front() {
            let mut machine = self.service_machine(name, record);
            machine.abandon(why);
            self.finish_service(machine.into_report());
        }
        let pending = self.markers.len() + usize::from(self.marker.is_some());
        if pending > 0 {
            self.errors.push(PassError::RetirementsLeft {
                instance: self.instance.clone(),
                pending,
                why,
            });
        }
        self.marker = None;
        self.markers.clear();
        self.stale.clear();
        if !self.reverting.is_empty() {
            self.reverted = None;
            self.reverting.clear();
        }
        self.prune_memory();
        self.stage = Stage::Done;
    }

    /// What the pass did. Call once it is over.
    pub fn into_report(self) -> InstanceReport {
        assert!(self.is_done(), "report taken before the pass finished");
        InstanceReport {
            reports: self.reports,
            retired: self.retired,
            withdrawn_stale: self.withdrawn_stale,
            reverted: self.reverted,
            errors: self.errors,
            memory: self.memory,
        }
    }
}

/// What one whole pass does before and around the instances (R2, T5).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FleetPassPlan {
    /// Routes of instances that are gone, to withdraw first.
    pub withdraw: Vec<ServiceKey>,
    /// Deleted instances: their memory is forgotten, nothing else done.
    pub forget: Vec<InstanceName>,
    /// Every other instance, in listing order, each by its own pass.
    pub recover: Vec<ListedInstance>,
}

/// Whether the recovery pass acts on an instance in `state` (R2): every
/// instance but a deleted one, whose memory is only forgotten. A targeted
/// pass (a runtime event, T7) asks the same.
pub fn is_recovered(state: InstanceState) -> bool {
    state != InstanceState::Deleted
}

/// Plans a whole pass from the routes read back (`None`: not read) and the
/// instances listed after them. Rows that failed to decode may hide live
/// instances: with any, no route is taken for a gone instance's.
pub fn plan_fleet_pass(
    held: Option<&FleetRoutes>,
    instances: Vec<ListedInstance>,
    bad_rows: bool,
) -> FleetPassPlan {
    let withdraw = match held {
        Some(held) if !bad_rows => routes_of_gone_instances(held, &instances),
        _ => Vec::new(),
    };
    // In place: the listing becomes the recovery list (a pass over 100k
    // instances would otherwise copy and regrow two vectors of them).
    let mut recover = instances;
    let forget = recover
        .extract_if(.., |i| !is_recovered(i.state))
        .map(|i| i.name)
        .collect();
    FleetPassPlan {
        withdraw,
        forget,
        recover,
    }
}

impl Machine for InstancePass<'_> {
    type Command = InstanceCommand;
    type Answer = InstanceAnswer;
    type Report = InstanceReport;

    fn poll_command(&mut self) -> Option<InstanceCommand> {
        InstancePass::poll_command(self)
    }

    fn handle(&mut self, answer: InstanceAnswer, now: Timestamp) {
        InstancePass::handle(self, answer, now)
    }

    fn abandon(&mut self, why: Abandon) {
        InstancePass::abandon(self, why)
    }

    fn into_report(self) -> InstanceReport {
        InstancePass::into_report(self)
    }
}

impl MachineAnswer for InstanceAnswer {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        InstanceAnswer::port_failure(self)
    }
}

/// What the proxy holds for `service` of `instance`, as its recovery is
/// handed it (T5): also what the judge hands its rules (`core::judge`).
pub(crate) fn proxy_view(
    held: Option<&HeldRoutes>,
    instance: &InstanceName,
    service: &ServiceName,
) -> ProxyView {
    let key = ServiceKey {
        instance: instance.clone(),
        service: service.clone(),
    };
    match held {
        None => ProxyView::Unknown,
        Some(held) => held
            .get(&key)
            .map_or(ProxyView::Absent, |port| ProxyView::Dials(*port)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: i64, name: &str, state: InstanceState) -> ListedInstance {
        ListedInstance {
            id,
            name: InstanceName::new(name),
            service_type: "web".into(),
            state,
        }
    }

    fn route(instance: &str) -> (ServiceKey, u16) {
        let key = ServiceKey {
            instance: InstanceName::new(instance),
            service: ServiceName::new("web"),
        };
        (key, 30001)
    }

    #[test]
    fn a_pass_withdraws_gone_instances_forgets_deleted_ones_and_recovers_the_rest() {
        let held: FleetRoutes = [route("live"), route("deleted"), route("unknown")]
            .into_iter()
            .collect();
        let plan = plan_fleet_pass(
            Some(&held),
            vec![
                instance(1, "live", InstanceState::Ready),
                instance(2, "deleted", InstanceState::Deleted),
            ],
            false,
        );
        assert_eq!(plan.withdraw, vec![route("deleted").0, route("unknown").0]);
        assert_eq!(plan.forget, vec![InstanceName::new("deleted")]);
        assert_eq!(plan.recover.len(), 1);
        assert_eq!(plan.recover[0].name.as_str(), "live");
    }

    #[test]
    fn bad_rows_or_unread_routes_withdraw_nothing() {
        let held: FleetRoutes = [route("unknown")].into_iter().collect();
        let live = || vec![instance(1, "live", InstanceState::Ready)];
        assert!(plan_fleet_pass(Some(&held), live(), true)
            .withdraw
            .is_empty());
        assert!(plan_fleet_pass(None, live(), false).withdraw.is_empty());
    }

    #[test]
    fn a_pass_abandoned_for_a_lost_mandate_says_so_for_every_service() {
        let mut active = ActiveRecord::default();
        for name in ["api", "web"] {
            active.services.insert(
                ServiceName::new(name),
                ActiveService {
                    container: ContainerId::new(format!("{name}-1")),
                    effective_revision: "1".into(),
                    binds: Default::default(),
                    stop_grace: None,
                    verified_started_at: None,
                },
            );
        }
        let policy = RecoveryPolicy::default();
        let mut pass = InstancePass::new(
            &policy,
            PassInput {
                instance: InstanceName::new("app"),
                intent: Intent::Running,
                active,
                inhibitions: Vec::new(),
                held: None,
                memory: InstanceMemory::default(),
                service_type: "app".into(),
                now: Timestamp::UNIX_EPOCH,
            },
        );
        assert!(pass.poll_command().is_some(), "the first service starts");
        pass.abandon(Abandon::MandateLost);
        assert!(pass.poll_command().is_none());
        let report = pass.into_report();
        assert_eq!(report.reports.len(), 2, "both services are reported");
        for service in &report.reports {
            assert_eq!(service.errors, vec![RecoveryError::MandateLost]);
            assert_eq!(service.verdict, super::super::recovery::Verdict::Failed);
        }
    }
}
