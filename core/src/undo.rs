//! `stead rollout undo` of one instance (#40), without a gap where it can
//! be, as a sans-IO machine (`core::machine`).
//!
//! The operator's undo asks for the way back on the markers of the
//! instance's baking upgrade (`RevertTo::undone`), and an upgrade task of
//! the halted type runs this machine under the instance lock:
//!
//! 1. every predecessor that may run beside its successor (replaced by
//!    overlap, not held by an operator, the instance not stopped, and no
//!    route dialing it: its service's route dials the successor) is
//!    started again and verified (`core::verify`) while its successor
//!    still serves; if one fails, every one started is stopped again (still
//!    kept) and nothing is switched;
//! 2. then per service: the successor gets its `retirement-pending` marker
//!    (no way back of its own); a `stop-first` successor is stopped; ACTIVE
//!    names the predecessor again, with the execution verified in step 1,
//!    so the recovery pass publishes it at once (the route moves from the
//!    successor to the predecessor, never withdrawn) and then retires the
//!    successor; an operator's hold is put back;
//! 3. the instance's version (and digest) before the upgrade.
//!
//! A predecessor not started in step 1 is started, verified and published
//! by the next pass, as after any revert. Every write is idempotent: a
//! retry finds the services not yet switched still baking, still undone.

use std::collections::VecDeque;
use std::time::Duration;

use jiff::Timestamp;

use super::errors::{
    failure_of, Cause, ErrorKind, PortName, ProbeError, StoreError, TaskError, TrafficError,
};
use super::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use super::spec::ReadinessProbe;
use super::traffic::HeldRoutes;
use super::types::{
    ActiveService, Binds, ContainerId, GenerationKey, Inhibition, InhibitionReason, InstanceName,
    Observation, ProbeTarget, RevertTo, RuntimeError, ServiceKey, ServiceName,
};
use super::upgrade::revert_marker;
use super::verify::{Check, Progress, Verification, RETRY_INTERVAL};

/// One service an operator undid: its predecessor's marker and way back,
/// and the successor ACTIVE names.
#[derive(Clone, Debug)]
pub struct Undone {
    pub marker: Inhibition,
    pub back: RevertTo,
    pub successor: ActiveService,
    /// The readiness probe of the service, as the catalog has it.
    pub readiness: ReadinessProbe,
}

impl Undone {
    fn service(&self) -> &ServiceName {
        &self.marker.service
    }

    fn predecessor(&self) -> &ContainerId {
        &self.marker.container
    }
}

/// What one undo starts from.
#[derive(Clone, Debug)]
pub struct UndoInput {
    pub instance: InstanceName,
    /// Stopped intent: nothing is started, the pass starts nothing either.
    pub stopped: bool,
    pub services: Vec<Undone>,
    pub stop_grace_default: Duration,
}

/// One effect the driver must perform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UndoCommand {
    /// The proxy's routes: a predecessor still routed (its successor not
    /// published yet) is not started again beside that route (R8).
    ReadRoutes,
    /// Start a kept predecessor again (it is stopped, never removed).
    Start(GenerationKey),
    Inspect(ContainerId),
    ReadBinds(ContainerId),
    Probe {
        readiness: ReadinessProbe,
        target: ProbeTarget,
    },
    Stop {
        generation: GenerationKey,
        grace: Duration,
    },
    SaveMarker(Inhibition),
    SaveActive {
        service: ServiceName,
        record: ActiveService,
    },
    RestoreVersion {
        version: String,
        spec_digest: Option<String>,
    },
}

impl MachineCommand for UndoCommand {
    fn is_effect(&self) -> bool {
        !matches!(
            self,
            Self::ReadRoutes | Self::Inspect(_) | Self::ReadBinds(_) | Self::Probe { .. }
        )
    }
}

/// The result of performing an [`UndoCommand`], variant for variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UndoAnswer {
    Routes(Result<HeldRoutes, TrafficError>),
    Started(Result<(), RuntimeError>),
    Inspected(Result<Observation, RuntimeError>),
    Binds(Result<Binds, RuntimeError>),
    Probed(Result<(), ProbeError>),
    Stopped(Result<(), RuntimeError>),
    Saved(Result<(), StoreError>),
}

impl UndoAnswer {
    /// The port and kind of the failure this answer reports, if any.
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Routes(r) => failure_of(r),
            Self::Started(r) | Self::Stopped(r) => failure_of(r),
            Self::Inspected(r) => failure_of(r),
            Self::Binds(r) => failure_of(r),
            Self::Probed(r) => failure_of(r),
            Self::Saved(r) => failure_of(r),
        }
    }
}

/// What the predecessor in hand is at.
#[derive(Debug)]
enum Warm {
    Start,
    Verify(Verification),
}

/// The machine. See the module docs.
#[derive(Debug)]
pub struct Undo {
    instance: InstanceName,
    /// Step 1: predecessors still to start and verify (once the routes
    /// were read), and the one in hand.
    routes_read: bool,
    warming: VecDeque<usize>,
    in_hand: Option<(usize, Warm)>,
    /// The executions verified, by service index.
    verified: Vec<Option<(Timestamp, Binds)>>,
    /// The predecessors started (stopped again if one fails).
    started: Vec<usize>,
    /// Steps 2 and 3, planned once step 1 succeeded (or stops, to undo it).
    writes: VecDeque<UndoCommand>,
    planned: bool,
    services: Vec<Undone>,
    stop_grace_default: Duration,
    outstanding: Option<UndoCommand>,
    error: Option<TaskError>,
    now: Option<Timestamp>,
}

impl Undo {
    pub fn new(input: UndoInput) -> Self {
        let warming = input
            .services
            .iter()
            .enumerate()
            .filter(|(_, s)| !input.stopped && !s.back.stop_first && s.back.hold.is_none())
            .map(|(i, _)| i)
            .collect();
        Self {
            instance: input.instance,
            routes_read: false,
            warming,
            in_hand: None,
            verified: vec![None; input.services.len()],
            started: Vec::new(),
            writes: VecDeque::new(),
            planned: false,
            services: input.services,
            stop_grace_default: input.stop_grace_default,
            outstanding: None,
            error: None,
            now: None,
        }
    }

    fn generation(&self, service: &ServiceName, container: &ContainerId) -> GenerationKey {
        GenerationKey {
            instance: self.instance.clone(),
            service: service.clone(),
            container: container.clone(),
        }
    }

    fn grace(&self, recorded: Option<Duration>) -> Duration {
        recorded.unwrap_or(self.stop_grace_default)
    }

    /// Steps 2 and 3, or (after a failure in step 1) the predecessors
    /// started stopped again.
    fn plan(&mut self) {
        self.planned = true;
        let now = self.now.unwrap_or(Timestamp::UNIX_EPOCH);
        if self.error.is_some() {
            for &i in &self.started {
                let s = &self.services[i];
                let generation = self.generation(s.service(), s.predecessor());
                let grace = self.grace(s.marker.stop_grace);
                self.writes
                    .push_back(UndoCommand::Stop { generation, grace });
            }
            return;
        }
        for (i, s) in self.services.iter().enumerate() {
            self.writes.push_back(UndoCommand::SaveMarker(revert_marker(
                s.service(),
                &s.successor,
                s.back.stop_first,
                now,
            )));
            if s.back.stop_first {
                self.writes.push_back(UndoCommand::Stop {
                    generation: self.generation(s.service(), &s.successor.container),
                    grace: self.grace(s.successor.stop_grace),
                });
            }
            let (binds, verified_started_at) = match &self.verified[i] {
                Some((started_at, binds)) => (binds.clone(), Some(*started_at)),
                None => (s.back.binds.clone(), None),
            };
            self.writes.push_back(UndoCommand::SaveActive {
                service: s.service().clone(),
                record: ActiveService {
                    container: s.predecessor().clone(),
                    effective_revision: s.back.revision.clone(),
                    binds,
                    stop_grace: s.marker.stop_grace,
                    verified_started_at,
                },
            });
            if let Some(hold) = &s.back.hold {
                self.writes.push_back(UndoCommand::SaveMarker(Inhibition {
                    reason: InhibitionReason::Hold(hold.clone()),
                    operation: "operator".into(),
                    created_at: now,
                    revert_to: None,
                    ..s.marker.clone()
                }));
            }
        }
        if let Some(s) = self.services.first() {
            self.writes.push_back(UndoCommand::RestoreVersion {
                version: s.back.version.clone(),
                spec_digest: s.back.spec_digest.clone(),
            });
        }
    }

    fn poll(&mut self) -> Option<UndoCommand> {
        loop {
            if self.planned {
                return self.writes.pop_front();
            }
            if self.error.is_some() {
                self.plan();
                continue;
            }
            if !self.routes_read && !self.warming.is_empty() {
                return Some(UndoCommand::ReadRoutes);
            }
            let Some((i, warm)) = &self.in_hand else {
                match self.warming.pop_front() {
                    Some(i) => self.in_hand = Some((i, Warm::Start)),
                    None => self.plan(),
                }
                continue;
            };
            let s = &self.services[*i];
            return match warm {
                Warm::Start => Some(UndoCommand::Start(
                    self.generation(s.service(), s.predecessor()),
                )),
                Warm::Verify(verification) => match verification.check() {
                    Check::Inspect(container) => Some(UndoCommand::Inspect(container)),
                    Check::ReadBinds(container) => Some(UndoCommand::ReadBinds(container)),
                    Check::Probe { readiness, target } => {
                        Some(UndoCommand::Probe { readiness, target })
                    }
                    Check::Wait => None,
                },
            };
        }
    }

    /// Starts again only a predecessor nothing routes to: its service's
    /// route dials the successor (or it has no ports). One still routed
    /// (the pass has not published its successor yet), or routes that
    /// could not be read, leave the start to the pass, which withdraws
    /// first (R8).
    fn keep_warming_only_unrouted(&mut self, read: Result<HeldRoutes, TrafficError>) {
        let Ok(routes) = read else {
            self.warming.clear();
            return;
        };
        let instance = self.instance.clone();
        let services = &self.services;
        self.warming.retain(|&i| {
            let s = &services[i];
            if s.successor.binds.is_empty() {
                return true;
            }
            let key = ServiceKey {
                instance: instance.clone(),
                service: s.service().clone(),
            };
            routes.get(&key).is_some_and(|port| {
                s.successor.binds.values().any(|p| p == port)
                    && !s.back.binds.values().any(|p| p == port)
            })
        });
    }

    fn fail(&mut self, step: String, cause: Cause) {
        self.error
            .get_or_insert_with(|| TaskError::new(&self.instance, step, cause));
    }
}

impl Machine for Undo {
    type Command = UndoCommand;
    type Answer = UndoAnswer;
    type Report = Result<Vec<ServiceName>, TaskError>;

    fn poll_command(&mut self) -> Option<UndoCommand> {
        assert!(
            self.outstanding.is_none(),
            "poll_command before the last command was answered"
        );
        let command = self.poll()?;
        self.outstanding = Some(command.clone());
        Some(command)
    }

    fn handle(&mut self, answer: UndoAnswer, now: Timestamp) {
        self.now = Some(now);
        let command = self
            .outstanding
            .take()
            .expect("an answer without a command");
        if self.planned {
            let failed = match &answer {
                UndoAnswer::Stopped(r) => !matches!(r, Ok(()) | Err(RuntimeError::NotFound)),
                UndoAnswer::Saved(r) => r.is_err(),
                other => panic!("{other:?} does not answer {command:?}"),
            };
            if failed && self.error.is_none() {
                // A write that failed leaves the rest for the retry (the
                // services not switched still bake, still undone); a
                // `stop-first` successor not stopped keeps ACTIVE.
                let cause = match answer {
                    UndoAnswer::Stopped(Err(e)) => e.into(),
                    UndoAnswer::Saved(Err(e)) => e.into(),
                    _ => unreachable!("a failure"),
                };
                self.fail(format!("undo: {command:?}"), cause);
                self.writes.clear();
            }
            return;
        }
        if let UndoAnswer::Routes(read) = answer {
            self.routes_read = true;
            self.keep_warming_only_unrouted(read);
            return;
        }
        let Some((i, warm)) = self.in_hand.take() else {
            panic!("{answer:?} answered with no predecessor in hand")
        };
        let s = &self.services[i];
        let service = s.service().clone();
        match (warm, answer) {
            (Warm::Start, UndoAnswer::Started(result)) => match result {
                Ok(()) => {
                    self.started.push(i);
                    let verification = Verification::new(
                        s.predecessor().clone(),
                        s.readiness.clone(),
                        "predecessor",
                    );
                    self.in_hand = Some((i, Warm::Verify(verification)));
                }
                Err(e) => self.fail(format!("start the predecessor of {service}"), e.into()),
            },
            (Warm::Verify(mut verification), answer) => {
                let progress = match answer {
                    UndoAnswer::Inspected(inspected) => verification.inspected(inspected),
                    UndoAnswer::Binds(read) => verification.binds(read),
                    UndoAnswer::Probed(result) => verification.probed(result),
                    other => panic!("{other:?} does not answer {command:?}"),
                };
                match progress {
                    Progress::Going => self.in_hand = Some((i, Warm::Verify(verification))),
                    Progress::Verified { started_at, binds } => {
                        self.verified[i] = Some((started_at, binds));
                    }
                    Progress::Failed(cause) => {
                        self.fail(format!("predecessor of {service} not ready"), cause)
                    }
                }
            }
            (_, answer) => panic!("{answer:?} does not answer {command:?}"),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match &self.in_hand {
            Some((_, Warm::Verify(v))) if v.check() == Check::Wait && !self.planned => Some(
                super::fleet::add(self.now.unwrap_or(Timestamp::UNIX_EPOCH), RETRY_INTERVAL),
            ),
            _ => None,
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.now = Some(now);
        if let Some((_, Warm::Verify(verification))) = &mut self.in_hand {
            verification.waited();
        }
    }

    fn abandon(&mut self, why: Abandon) {
        self.outstanding = None;
        self.error
            .get_or_insert_with(|| TaskError::abandoned(&self.instance, why));
        self.in_hand = None;
        self.warming.clear();
        self.writes.clear();
        self.planned = true;
    }

    /// The services put back, or the error that stopped the undo.
    fn into_report(self) -> Result<Vec<ServiceName>, TaskError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.services.iter().map(|s| s.service().clone()).collect()),
        }
    }
}

impl MachineAnswer for UndoAnswer {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        UndoAnswer::port_failure(self)
    }
}
