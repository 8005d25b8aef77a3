//! The instance pass's own rules, judged from outside the machine (issue
//! #44): an observer handed each command the pass decides, each answer it
//! got, and its report, that says which rule a decision broke and where.
//!
//! The machine (`core::pass`) is written to keep these rules; this module
//! is written separately to check that it did, from what it was given and
//! what it asked for, never from its internals. Two callers:
//!
//! - the test kit's pass checker (`stead_testkit::pass`), under proptest,
//!   cargo-fuzz and the exhaustive explorer, where a breach is a failure;
//! - `stead replay`, which judges every recorded pass of a real incident.
//!
//! The rules (docs/rules.md):
//!
//! - R1/S1: recovery acts only on the container ACTIVE names;
//! - R15/S5: no command stops or removes a container ACTIVE names; a
//!   predecessor is removed only after this pass stopped it (or found it
//!   gone), its claims are released only once it is removed, and its marker
//!   cleared only after both (or without touching it when ACTIVE still
//!   names it); a predecessor of a running service is stopped only when
//!   this pass verified its successor without republishing it and recorded
//!   that execution, the final inspection showed that very execution
//!   running, and the proxy, read back just then, routed the service to
//!   the successor's binds;
//! - #40 (bake): a predecessor that still bakes is never removed (it is the
//!   way back); a revert halts the type first, stops a `stop-first`
//!   successor before ACTIVE is put back, puts ACTIVE back only on a
//!   baking predecessor, leaves everything else to the next pass, and
//!   happens exactly when a baking successor failed (or an operator undid
//!   it);
//! - T5: a stale route withdrawn is one ACTIVE does not name, and every
//!   one the proxy held is withdrawn (or tried);
//! - the pass ends within a bound of commands;
//! - and each service's recovery keeps its own rules ([`recovery`]: R4–R14,
//!   S2–S7, S11), judged against the reference budget model.

pub mod budget_model;
mod finish;
pub mod recovery;

use recovery::RecoveryJudge;

use std::collections::BTreeMap;
use std::fmt;

use super::bake::{self, RevertStep};
use super::pass::{proxy_view, InstanceAnswer, InstanceCommand, PassInput};
use super::policy::RecoveryPolicy;
use super::recovery::{ServiceInput, COMMANDS_PER_RECOVERY_MAX};
use super::retire::inhibition_for;
use super::types::{
    ActiveService, ContainerId, GenerationKey, Inhibition, Observation, RevertTo, RuntimeError,
    ServiceKey, ServiceName, Timestamp,
};

/// A baking predecessor's marker, its way back, and the successor it bakes.
type Baking<'a> = (&'a Inhibition, &'a RevertTo, &'a ActiveService);

/// A rule a pass broke: which, and what it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    /// The rule's name in docs/rules.md (`R15/S5`, `T5`, …).
    pub rule: &'static str,
    pub what: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.what)
    }
}

fn breach(rule: &'static str, what: String) -> Result<(), Breach> {
    Err(Breach { rule, what })
}

/// What the pass did to one predecessor, in order.
#[derive(Default)]
struct Predecessor {
    stopped: bool,
    /// Its stop answered "no such container": nothing is kept.
    gone: bool,
    removed: bool,
    claims_released: bool,
}

/// A predecessor stopped, with what the pass had seen of its successor
/// just then (each marker is retired on a look of its own: a later look
/// for another marker of the service judges nothing of this one).
struct Stop {
    service: ServiceName,
    container: ContainerId,
    seen: Option<Observation>,
    routed: Option<Option<u16>>,
}

/// One pass under judgement: hand it every command before it is performed
/// ([`decided`](Self::decided)), every answer after
/// ([`answered`](Self::answered)), and the report at the end
/// ([`finished`](Self::finished)).
pub struct PassJudge<'i> {
    policy: &'i RecoveryPolicy,
    input: &'i PassInput,
    /// Each service's recovery, from its first command.
    recoveries: BTreeMap<ServiceName, RecoveryJudge<'i>>,
    /// The service whose recovery the last command was a step of.
    recovering: Option<ServiceName>,
    bound: usize,
    issued: usize,
    predecessors: BTreeMap<ContainerId, Predecessor>,
    /// Per service: the successor's inspection and the route read back
    /// since the last look began (a failed one leaves none).
    inspected: BTreeMap<ServiceName, Observation>,
    routed: BTreeMap<ServiceName, Option<u16>>,
    /// The service whose successor was inspected last.
    marker_service: Option<ServiceName>,
    stops: Vec<Stop>,
    reverts: Vec<RevertStep>,
    withdrawn_stale: Vec<ServiceKey>,
}

impl<'i> PassJudge<'i> {
    /// A pass over `input` under `policy`.
    pub fn new(policy: &'i RecoveryPolicy, input: &'i PassInput) -> Self {
        let bound = input.active.services.len() * COMMANDS_PER_RECOVERY_MAX as usize
            + input.inhibitions.len() * 6
            + input.held.as_ref().map_or(0, |h| h.len())
            + 1;
        PassJudge {
            policy,
            input,
            recoveries: BTreeMap::new(),
            recovering: None,
            bound,
            issued: 0,
            predecessors: BTreeMap::new(),
            inspected: BTreeMap::new(),
            routed: BTreeMap::new(),
            marker_service: None,
            stops: Vec::new(),
            reverts: Vec::new(),
            withdrawn_stale: Vec::new(),
        }
    }

    /// The predecessors kept while their successors bake (#40).
    fn baking(&self) -> impl Iterator<Item = Baking<'i>> + 'i {
        bake::baking(&self.input.inhibitions, &self.input.active, self.input.now)
    }

    fn bakes(&self, id: &ContainerId) -> bool {
        self.baking().any(|(m, _, _)| &m.container == id)
    }

    /// Whether the pass did `what` to predecessor `id` (nothing yet: no).
    fn did(&self, id: &ContainerId, what: impl Fn(&Predecessor) -> bool) -> bool {
        self.predecessors.get(id).is_some_and(what)
    }

    /// What the pass did to predecessor `id`, for an answer to add to.
    fn predecessor(&mut self, id: &ContainerId) -> &mut Predecessor {
        self.predecessors.entry(id.clone()).or_default()
    }

    fn named_by_active(&self, id: &ContainerId) -> bool {
        self.input.active.names_container(id)
    }

    /// Judges `command`, which the pass decided and is about to be
    /// performed.
    pub fn decided(&mut self, command: &InstanceCommand) -> Result<(), Breach> {
        self.issued += 1;
        if self.issued > self.bound {
            return breach(
                "bound",
                format!("the pass issued more than {} commands", self.bound),
            );
        }
        if !self.reverts.is_empty()
            && !matches!(
                command,
                InstanceCommand::Revert { .. } | InstanceCommand::WithdrawStale(_)
            )
        {
            return breach(
                "#40",
                format!(
                    "after a revert the pass leaves the markers to the next one, not {command:?}"
                ),
            );
        }
        self.bake_rules(command)?;
        self.retirement_rules(command)?;
        if let InstanceCommand::Service { key, command } = command {
            let named = self.input.active.services.get(&key.service);
            let Some(record) = named.filter(|a| a.container == key.container) else {
                return breach(
                    "R1/S1",
                    format!(
                        "recovered {} of {}, which ACTIVE does not name",
                        key.container, key.service
                    ),
                );
            };
            let (policy, input) = (self.policy, self.input);
            let recovery = self
                .recoveries
                .entry(key.service.clone())
                .or_insert_with(|| {
                    let service = service_input(input, &key.service, record);
                    RecoveryJudge::new(policy, service, input.now)
                });
            self.recovering = Some(key.service.clone());
            recovery.decided(command)?;
        }
        Ok(())
    }

    fn bake_rules(&mut self, command: &InstanceCommand) -> Result<(), Breach> {
        match command {
            InstanceCommand::RemovePredecessor(generation)
            | InstanceCommand::ReleaseClaims(generation)
                if self.bakes(&generation.container)
                    && !self.did(&generation.container, |p| p.gone) =>
            {
                breach(
                    "#40",
                    format!("{command:?} of a predecessor that still bakes (it is the way back)"),
                )
            }
            InstanceCommand::Revert { step, .. } => {
                self.revert_step(step)?;
                self.reverts.push((**step).clone());
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn revert_step(&self, step: &RevertStep) -> Result<(), Breach> {
        if self.baking().next().is_none() {
            return breach("#40", format!("a revert with nothing baking: {step:?}"));
        }
        if self.reverts.is_empty() && !matches!(step, RevertStep::HaltRollout { .. }) {
            return breach(
                "#40/C11",
                format!("a revert halts the type first, not {step:?}"),
            );
        }
        match step {
            RevertStep::RestoreActive { service, record } => {
                if !self.bakes(&record.container) {
                    return breach(
                        "#40",
                        format!(
                            "ACTIVE put back on {}, which is no baking predecessor",
                            record.container
                        ),
                    );
                }
                // A `stop-first` successor is stopped first: never two on
                // the service's volumes.
                let Some((_, back, successor)) =
                    self.baking().find(|(m, _, _)| &m.service == service)
                else {
                    return breach(
                        "#40",
                        format!("ACTIVE of {service} put back with no marker baking"),
                    );
                };
                let stopped = self.reverts.iter().any(|r| {
                    matches!(r, RevertStep::StopSuccessor { generation, .. }
                        if generation.container == successor.container)
                });
                if back.stop_first && !stopped {
                    return breach(
                        "#40",
                        format!(
                            "ACTIVE of stop-first {service} put back before its successor {} was stopped",
                            successor.container
                        ),
                    );
                }
                Ok(())
            }
            RevertStep::StopSuccessor { generation, .. } => {
                let baking_stop_first = self.baking().any(|(m, back, successor)| {
                    back.stop_first
                        && m.service == generation.service
                        && successor.container == generation.container
                });
                if !baking_stop_first {
                    return breach(
                        "#40",
                        format!(
                            "stopped {}, which is no stop-first baking successor",
                            generation.container
                        ),
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn retirement_rules(&mut self, command: &InstanceCommand) -> Result<(), Breach> {
        match command {
            InstanceCommand::StopPredecessor { generation, .. } => {
                if self.named_by_active(&generation.container) {
                    return breach(
                        "R15/S5",
                        format!("stopped ACTIVE's container {}", generation.container),
                    );
                }
                let service = &generation.service;
                self.stops.push(Stop {
                    service: service.clone(),
                    container: generation.container.clone(),
                    seen: self.inspected.get(service).cloned(),
                    routed: self.routed.get(service).copied(),
                });
            }
            InstanceCommand::RemovePredecessor(generation) => {
                if self.named_by_active(&generation.container) {
                    return breach(
                        "R15/S5",
                        format!("removed ACTIVE's container {}", generation.container),
                    );
                }
                if !self.did(&generation.container, |p| p.stopped) {
                    return breach(
                        "R15/S5",
                        format!("removed {} before stopping it", generation.container),
                    );
                }
            }
            InstanceCommand::ClearMarker(generation) => {
                let active = self.named_by_active(&generation.container);
                let gone = self.did(&generation.container, |p| p.removed && p.claims_released);
                if !(active || gone) {
                    return breach(
                        "R15/S5",
                        format!(
                            "cleared the marker of {} before it was gone and its claims released",
                            generation.container
                        ),
                    );
                }
            }
            InstanceCommand::ReleaseClaims(generation)
                if !self.did(&generation.container, |p| p.removed) =>
            {
                return breach(
                    "R15/S5",
                    format!("released claims of {} still present", generation.container),
                );
            }
            InstanceCommand::WithdrawStale(key) => {
                self.withdrawn_stale.push(key.clone());
                if self.input.active.services.contains_key(&key.service) {
                    return breach(
                        "T5",
                        format!("withdrew the route of {} which ACTIVE names", key.service),
                    );
                }
            }
            InstanceCommand::InspectSuccessor(id) => {
                self.marker_service = self
                    .input
                    .active
                    .services
                    .iter()
                    .find(|(_, s)| &s.container == id)
                    .map(|(name, _)| name.clone());
                // A new look: what an earlier one saw vouches for nothing.
                if let Some(service) = &self.marker_service {
                    self.inspected.remove(service);
                    self.routed.remove(service);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the pass took any step of a revert (#40).
    pub fn reverted(&self) -> bool {
        !self.reverts.is_empty()
    }

    /// Takes in what `command` was answered, and the `now` handed with
    /// the answer.
    pub fn answered(&mut self, command: &InstanceCommand, answer: &InstanceAnswer, now: Timestamp) {
        match (command, answer) {
            (InstanceCommand::Service { key, .. }, InstanceAnswer::Service(outcome)) => {
                if let Some(recovery) = self.recoveries.get_mut(&key.service) {
                    recovery.answered(outcome, now);
                }
            }
            (
                InstanceCommand::StopPredecessor { generation, .. },
                InstanceAnswer::PredecessorStopped(r),
            ) => {
                if matches!(r, Ok(()) | Err(RuntimeError::NotFound)) {
                    let p = self.predecessor(&generation.container);
                    p.stopped = true;
                    p.gone = matches!(r, Err(RuntimeError::NotFound));
                }
            }
            (InstanceCommand::RemovePredecessor(g), InstanceAnswer::PredecessorRemoved(Ok(()))) => {
                self.predecessor(&g.container).removed = true;
            }
            (InstanceCommand::ReleaseClaims(g), InstanceAnswer::ClaimsReleased(Ok(()))) => {
                self.predecessor(&g.container).claims_released = true;
            }
            (InstanceCommand::InspectSuccessor(_), InstanceAnswer::SuccessorInspected(Ok(obs))) => {
                if let Some(service) = &self.marker_service {
                    self.inspected.insert(service.clone(), obs.clone());
                }
            }
            (InstanceCommand::ReadRoutes, InstanceAnswer::RoutesRead(Ok(routes))) => {
                if let Some(service) = &self.marker_service {
                    let key = ServiceKey {
                        instance: self.input.instance.clone(),
                        service: service.clone(),
                    };
                    self.routed
                        .insert(service.clone(), routes.get(&key).copied());
                }
            }
            _ => {}
        }
    }
}

/// What the recovery of `service`, on the container ACTIVE names for it,
/// is handed within a pass over `input` (as `core::pass` hands it).
fn service_input(input: &PassInput, service: &ServiceName, record: &ActiveService) -> ServiceInput {
    let key = GenerationKey {
        instance: input.instance.clone(),
        service: service.clone(),
        container: record.container.clone(),
    };
    ServiceInput {
        inhibition: inhibition_for(&input.inhibitions, service, &record.container),
        memory: input.memory.service(&key),
        key,
        active: record.clone(),
        intent: input.intent,
        proxy: proxy_view(input.held.as_ref(), &input.instance, service),
    }
}
