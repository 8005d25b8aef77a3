//! Drives one `InstancePass` with arbitrary answers and checks the pass's
//! own safety properties (docs/rules.md R2, R15, T5; S1, S5):
//!
//! - no command stops or removes a container ACTIVE names;
//! - a predecessor is removed only after this pass stopped it (or found it
//!   gone), and its marker is cleared only after its claims were released —
//!   or without touching it when ACTIVE still names it;
//! - a predecessor of a running service ACTIVE still has is stopped only
//!   when this pass verified the successor without republishing it, the
//!   final inspection showed that very execution running, and the proxy,
//!   read back just then, routed the service to the successor's binds;
//! - a stale route withdrawn is one ACTIVE does not name;
//! - the pass ends, within a bound, and abandoning it ends it at once.
//!
//! Shared by the cargo-fuzz target `instance_pass` and by
//! `tests/pass_properties.rs` (as `stead_testkit::…`), like `machine.rs`.

use std::collections::BTreeMap;

use std::time::Duration;
use stead::core::bake::{self, RevertStep};
use stead::core::errors::{StoreError, TrafficError};
use stead::core::fleet::add;
use stead::core::memory::InstanceMemory;
use stead::core::pass::{
    Abandon, InstanceAnswer, InstanceCommand, InstancePass, InstanceReport, PassInput,
};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{
    Command, GenerationMemory, Outcome, ServiceMemory, Verdict, COMMANDS_PER_RECOVERY_MAX,
};
use stead::core::traffic::HeldRoutes;
use stead::core::types::{
    ActiveRecord, ActiveService, ContainerId, ContainerStatus, GenerationKey, Health, Inhibition,
    InhibitionReason, InstanceName, Intent, Observation, RevertTo, RuntimeError, ServiceKey,
    ServiceName, Timestamp,
};

use crate::machine::{base, binds, execution, outcome_for, unit, OutcomeSeed};

/// One service of the instance, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceSeed {
    pub in_active: bool,
    pub active_binds: u8,
    pub active_verified: u8,
    /// `% 4` — 0: no marker; 1: a marker on a predecessor; 2: a marker on
    /// ACTIVE's own container; 3: both. Bit 2 (`& 4`): the markers carry
    /// a way back that still holds at the pass's `now` (#40: they bake);
    /// bit 3 (`& 8`): of a `stop-first` service; bit 4 (`& 16`): undone
    /// by an operator.
    pub marker: u8,
    /// 0: no route held; 1..: a port, see [`held_port`].
    pub route: u8,
    /// The execution this daemon verified earlier, see [`execution`].
    pub memory_verified: u8,
}

/// The inputs of one instance's pass, as numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassSeed {
    pub stopped: bool,
    /// `false`: the pass read no routes (a targeted pass).
    pub routes_read: bool,
    pub services: Vec<ServiceSeed>,
    /// Abandon after this many commands (0: never).
    pub abandon_after: u8,
    /// The services' own answers come from a steady world (each container
    /// running the execution memory verified, healthy, ready, on ACTIVE's
    /// binds) but for one failure in eight; otherwise they are arbitrary.
    /// Arbitrary answers rarely verify a service, so without this the
    /// retirement path would hardly be reached.
    pub steady: bool,
}

const SERVICES: [&str; 3] = ["web", "api", "worker"];

fn held_port(n: u8) -> Option<u16> {
    match n % 4 {
        0 => None,
        1 => Some(30001),
        2 => Some(30002),
        _ => Some(30003),
    }
}

/// A fully built pass input.
#[derive(Clone, Debug)]
pub struct PassCase {
    pub policy: RecoveryPolicy,
    pub input: PassInput,
}

impl PassSeed {
    pub fn build(&self) -> PassCase {
        let instance = InstanceName::new("app");
        let mut active = ActiveRecord::default();
        let mut inhibitions = Vec::new();
        let mut held = HeldRoutes::new();
        let mut memory = InstanceMemory::default();
        for (i, seed) in self.services.iter().take(SERVICES.len()).enumerate() {
            let service = ServiceName::new(SERVICES[i]);
            let current = ContainerId::new(format!("{}-2", SERVICES[i]));
            if seed.in_active {
                memory.put(
                    &GenerationKey {
                        instance: instance.clone(),
                        service: service.clone(),
                        container: current.clone(),
                    },
                    &ServiceMemory {
                        generation: GenerationMemory {
                            budget: None,
                            verified_started_at: execution(seed.memory_verified),
                        },
                        withdrawal_pending: false,
                    },
                );
                active.services.insert(
                    service.clone(),
                    ActiveService {
                        container: current.clone(),
                        effective_revision: "r2".into(),
                        binds: binds(seed.active_binds),
                        stop_grace: None,
                        verified_started_at: execution(seed.active_verified),
                    },
                );
            }
            let bakes = seed.marker & 4 != 0;
            let marker = |container: ContainerId| Inhibition {
                service: service.clone(),
                container,
                reason: InhibitionReason::RetirementPending,
                operation: "upgrade".into(),
                created_at: base(),
                stop_grace: None,
                revert_to: bakes.then(|| RevertTo {
                    revision: "r1".into(),
                    binds: binds(seed.active_binds.wrapping_add(1)),
                    version: "1".into(),
                    spec_digest: None,
                    until: add(base(), Duration::from_secs(300)),
                    hold: None,
                    stop_first: seed.marker & 8 != 0,
                    undone: seed.marker & 16 != 0,
                }),
            };
            if seed.marker % 4 == 1 || seed.marker % 4 == 3 {
                inhibitions.push(marker(ContainerId::new(format!("{}-1", SERVICES[i]))));
            }
            if seed.marker % 4 >= 2 {
                inhibitions.push(marker(current));
            }
            if let Some(port) = held_port(seed.route) {
                held.insert(
                    ServiceKey {
                        instance: instance.clone(),
                        service,
                    },
                    port,
                );
            }
        }
        let policy = RecoveryPolicy::default().validated().expect("valid policy");
        PassCase {
            input: PassInput {
                instance,
                intent: if self.stopped {
                    Intent::Stopped
                } else {
                    Intent::Running
                },
                active,
                inhibitions,
                held: self.routes_read.then_some(held),
                memory,
                service_type: "app".into(),
                now: base(),
            },
            policy,
        }
    }
}

/// The execution the pass's memory vouches for, for `service`.
fn remembered(input: &PassInput, service: &ServiceName) -> Option<stead::core::types::Timestamp> {
    let record = input.active.services.get(service)?;
    let key = GenerationKey {
        instance: input.instance.clone(),
        service: service.clone(),
        container: record.container.clone(),
    };
    input.memory.service(&key).generation.verified_started_at
}

/// A steady world's answer to one of a service's commands.
fn steady_outcome(
    command: &Command,
    active: &ActiveService,
    running: Option<Timestamp>,
) -> Outcome {
    let observation = Observation {
        status: ContainerStatus::Running,
        started_at: running,
        exit: None,
    };
    match command {
        Command::Withdraw => Outcome::Withdrawn(Ok(())),
        Command::Inspect => Outcome::Inspected(Ok(observation)),
        Command::ReleaseClaims => Outcome::ClaimsReleased(Ok(())),
        Command::CheckPolicy => Outcome::PolicyChecked(Ok(())),
        Command::Start => Outcome::Started(Ok(())),
        Command::Restart { .. } => Outcome::Restarted(Ok(())),
        Command::Stop { .. } => Outcome::Stopped(Ok(())),
        Command::ReadHealth => Outcome::Health(Ok(Health::Healthy)),
        Command::ReadBinds => Outcome::Binds(Ok(active.binds.clone())),
        Command::ProbeReadiness { .. } => Outcome::Readiness(Ok(())),
        Command::ReloadActive => Outcome::ActiveReloaded(Ok(Some(active.clone()))),
        Command::PersistBinds { .. } => Outcome::BindsPersisted(Ok(true)),
        Command::Publish { .. } => Outcome::Published(Ok(())),
        Command::RecordExecution { .. } => Outcome::ExecutionRecorded(Ok(())),
    }
}

/// An answer of the right kind for `command`, picked by `seed`.
fn answer_for(
    command: &InstanceCommand,
    seed: &OutcomeSeed,
    input: &PassInput,
    steady: bool,
) -> InstanceAnswer {
    let fails = seed.choice.is_multiple_of(8);
    let runtime = || match seed.choice % 8 {
        0 => Err(RuntimeError::NotFound),
        1 => Err(RuntimeError::Transient("timeout".into())),
        _ => Ok(()),
    };
    match command {
        InstanceCommand::Service { key, command } => {
            let active = input.active.services[&key.service].clone();
            InstanceAnswer::Service(if steady && !seed.choice.is_multiple_of(8) {
                steady_outcome(
                    command,
                    &active,
                    remembered(input, &key.service).or(base_execution()),
                )
            } else {
                outcome_for(command, seed, &active)
            })
        }
        InstanceCommand::InspectSuccessor(id) if steady && !seed.choice.is_multiple_of(8) => {
            let service = input
                .active
                .services
                .iter()
                .find(|(_, s)| &s.container == id)
                .map(|(name, _)| name.clone());
            InstanceAnswer::SuccessorInspected(Ok(Observation {
                status: ContainerStatus::Running,
                started_at: service
                    .and_then(|s| remembered(input, &s))
                    .or(base_execution()),
                exit: None,
            }))
        }
        InstanceCommand::InspectPredecessor(_) => {
            InstanceAnswer::PredecessorInspected(match seed.choice % 8 {
                0 => Err(RuntimeError::NotFound),
                1 => Err(RuntimeError::Transient("timeout".into())),
                _ => Ok(Observation {
                    status: if seed.status < 128 {
                        ContainerStatus::Running
                    } else {
                        ContainerStatus::Exited
                    },
                    started_at: execution(seed.execution),
                    exit: None,
                }),
            })
        }
        InstanceCommand::InspectSuccessor(_) => {
            InstanceAnswer::SuccessorInspected(match seed.choice % 8 {
                0 => Err(RuntimeError::NotFound),
                1 => Err(RuntimeError::Transient("timeout".into())),
                _ => Ok(Observation {
                    status: if seed.status < 192 {
                        ContainerStatus::Running
                    } else {
                        ContainerStatus::Exited
                    },
                    started_at: execution(seed.execution),
                    exit: None,
                }),
            })
        }
        InstanceCommand::ReadRoutes => InstanceAnswer::RoutesRead(if fails {
            Err(TrafficError::Unreachable("proxy unavailable".into()))
        } else {
            let mut routes = HeldRoutes::new();
            for (i, service) in input.active.services.keys().enumerate() {
                if let Some(port) = held_port(seed.binds.rotate_left(i as u32)) {
                    routes.insert(
                        ServiceKey {
                            instance: input.instance.clone(),
                            service: service.clone(),
                        },
                        port,
                    );
                }
            }
            Ok(routes)
        }),
        InstanceCommand::StopPredecessor { .. } => InstanceAnswer::PredecessorStopped(runtime()),
        InstanceCommand::RemovePredecessor(_) => {
            InstanceAnswer::PredecessorRemoved(match seed.choice % 8 {
                1 => Err(RuntimeError::Transient("timeout".into())),
                _ => Ok(()),
            })
        }
        InstanceCommand::ReleaseClaims(_) => InstanceAnswer::ClaimsReleased(unit(
            fails,
            StoreError::Unavailable("store down".into()),
        )),
        InstanceCommand::ClearMarker(_) => {
            InstanceAnswer::MarkerCleared(unit(fails, StoreError::Unavailable("store down".into())))
        }
        InstanceCommand::WithdrawStale(_) => {
            InstanceAnswer::StaleWithdrawn(unit(fails, TrafficError::Rejected("proxy 500".into())))
        }
        InstanceCommand::Revert { .. } => InstanceAnswer::Reverted(unit(
            fails,
            StoreError::Unavailable("store down".into()).into(),
        )),
    }
}

/// The execution a steady container runs when memory vouches for none.
fn base_execution() -> Option<Timestamp> {
    execution(1)
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

/// Runs the pass over `answers` (cycled) and panics on any violated
/// property.
/// Returns how many predecessors the pass retired, and whether it
/// reverted (#40).
pub fn run_pass_and_check(
    case: &PassCase,
    answers: &[OutcomeSeed],
    abandon_after: u8,
    steady: bool,
) -> (usize, bool) {
    let default = OutcomeSeed::default();
    let input = &case.input;
    let mut issued = 0usize;
    let (report, reverted) = run_pass_and_check_with(case, |_, command| {
        issued += 1;
        let seed = if answers.is_empty() {
            &default
        } else {
            &answers[(issued - 1) % answers.len()]
        };
        let answer = answer_for(command, seed, input, steady);
        if abandon_after != 0 && issued == usize::from(abandon_after) {
            Drive::AnswerThenAbandon(answer, Abandon::Deadline)
        } else {
            Drive::Answer(answer)
        }
    });
    (report.retired.len(), reverted)
}

/// What the driver does with the command a pass asks for.
#[derive(Debug)]
pub enum Drive {
    /// Performs it and hands the pass this answer.
    Answer(InstanceAnswer),
    /// Performs it, hands the pass this answer, then abandons the pass
    /// (its deadline passed).
    AnswerThenAbandon(InstanceAnswer, Abandon),
    /// Does not perform it: the lease or the instance lock is no longer
    /// trusted (T2, T3), so the pass is abandoned instead.
    Abandon(Abandon),
}

/// Runs the pass, asking `drive` what to do with each command (it sees
/// the pass, for the exhaustive explorer's state count), and panics on
/// any violated property. Returns the pass's report and whether it
/// reverted (#40).
pub fn run_pass_and_check_with(
    case: &PassCase,
    mut drive: impl FnMut(&InstancePass<'_>, &InstanceCommand) -> Drive,
) -> (InstanceReport, bool) {
    let input = &case.input;
    let mut abandoned = false;
    let mut pass = InstancePass::new(&case.policy, input.clone());
    let bound = input.active.services.len() * COMMANDS_PER_RECOVERY_MAX as usize
        + input.inhibitions.len() * 6
        + input.held.as_ref().map_or(0, |h| h.len())
        + 1;
    let named_by_active = |id: &ContainerId| input.active.names_container(id);
    let mut predecessors: BTreeMap<ContainerId, Predecessor> = BTreeMap::new();
    // Per service: the last successor inspection and route read.
    let mut inspected: BTreeMap<ServiceName, Observation> = BTreeMap::new();
    let mut routed: BTreeMap<ServiceName, Option<u16>> = BTreeMap::new();
    let mut marker_service: Option<ServiceName> = None;
    let mut stops: Vec<(ServiceName, ContainerId)> = Vec::new();
    let mut issued = 0usize;
    // #40: the predecessors kept while their successors bake, by container.
    let baking = || bake::baking(&input.inhibitions, &input.active, input.now);
    let bakes = |id: &ContainerId| baking().any(|(m, _, _)| &m.container == id);
    let baking_successor = baking().next().is_some();
    let mut reverts: Vec<RevertStep> = Vec::new();
    let mut withdrawn_stale: Vec<ServiceKey> = Vec::new();
    while let Some(command) = pass.poll_command() {
        issued += 1;
        assert!(
            issued <= bound,
            "the pass issued more than {bound} commands"
        );
        if !reverts.is_empty() {
            assert!(
                matches!(
                    command,
                    InstanceCommand::Revert { .. } | InstanceCommand::WithdrawStale(_)
                ),
                "after a revert the pass leaves the markers to the next one, not {command:?}"
            );
        }
        match &command {
            InstanceCommand::RemovePredecessor(generation)
            | InstanceCommand::ReleaseClaims(generation)
                if bakes(&generation.container)
                    && !predecessors
                        .get(&generation.container)
                        .is_some_and(|p| p.gone) =>
            {
                panic!("{command:?} of a predecessor that still bakes (#40: it is the way back)");
            }
            InstanceCommand::Revert { step, .. } => {
                assert!(baking_successor, "a revert with nothing baking: {step:?}");
                if reverts.is_empty() {
                    assert!(
                        matches!(**step, RevertStep::HaltRollout { .. }),
                        "a revert halts the type first, not {step:?}"
                    );
                }
                if let RevertStep::RestoreActive { service, record } = &**step {
                    assert!(
                        bakes(&record.container),
                        "ACTIVE put back on {}, which is no baking predecessor",
                        record.container
                    );
                    // A `stop-first` successor is stopped first: never two
                    // on the service's volumes.
                    let (_, back, successor) = baking()
                        .find(|(m, _, _)| &m.service == service)
                        .expect("a baking marker of the service");
                    if back.stop_first {
                        assert!(
                            reverts.iter().any(|r| matches!(
                                r,
                                RevertStep::StopSuccessor { generation, .. }
                                    if generation.container == successor.container
                            )),
                            "ACTIVE of stop-first {service} put back before its successor \
                             {} was stopped",
                            successor.container
                        );
                    }
                }
                if let RevertStep::StopSuccessor { generation, .. } = &**step {
                    assert!(
                        baking().any(|(m, back, successor)| back.stop_first
                            && m.service == generation.service
                            && successor.container == generation.container),
                        "stopped {}, which is no stop-first baking successor",
                        generation.container
                    );
                }
                reverts.push((**step).clone());
            }
            _ => {}
        }
        match &command {
            InstanceCommand::StopPredecessor { generation, .. } => {
                assert!(
                    !named_by_active(&generation.container),
                    "stopped ACTIVE's container {}",
                    generation.container
                );
                stops.push((generation.service.clone(), generation.container.clone()));
            }
            InstanceCommand::RemovePredecessor(generation) => {
                assert!(
                    !named_by_active(&generation.container),
                    "removed ACTIVE's container {}",
                    generation.container
                );
                let p = predecessors
                    .entry(generation.container.clone())
                    .or_default();
                assert!(
                    p.stopped,
                    "removed {} before stopping it",
                    generation.container
                );
            }
            InstanceCommand::ClearMarker(generation) => {
                let p = predecessors
                    .entry(generation.container.clone())
                    .or_default();
                assert!(
                    named_by_active(&generation.container) || (p.removed && p.claims_released),
                    "cleared the marker of {} before it was gone and its claims released",
                    generation.container
                );
            }
            InstanceCommand::ReleaseClaims(generation) => {
                let p = predecessors
                    .entry(generation.container.clone())
                    .or_default();
                assert!(
                    p.removed,
                    "released claims of {} still present",
                    generation.container
                );
            }
            InstanceCommand::WithdrawStale(key) => {
                withdrawn_stale.push(key.clone());
                assert!(
                    !input.active.services.contains_key(&key.service),
                    "withdrew the route of {} which ACTIVE names",
                    key.service
                );
            }
            InstanceCommand::InspectSuccessor(id) => {
                marker_service = input
                    .active
                    .services
                    .iter()
                    .find(|(_, s)| &s.container == id)
                    .map(|(name, _)| name.clone());
            }
            _ => {}
        }
        if let InstanceCommand::Service { key, .. } = &command {
            assert_eq!(
                Some(&key.container),
                input
                    .active
                    .services
                    .get(&key.service)
                    .map(|a| &a.container),
                "R1/S1: recovered {} of {}, which ACTIVE does not name",
                key.container,
                key.service
            );
        }
        let (answer, then_abandon) = match drive(&pass, &command) {
            Drive::Answer(answer) => (answer, None),
            Drive::AnswerThenAbandon(answer, why) => (answer, Some(why)),
            Drive::Abandon(why) => {
                abandoned = true;
                pass.abandon(why);
                continue;
            }
        };
        match (&command, &answer) {
            (
                InstanceCommand::StopPredecessor { generation, .. },
                InstanceAnswer::PredecessorStopped(r),
            ) => {
                if matches!(r, Ok(()) | Err(RuntimeError::NotFound)) {
                    let p = predecessors
                        .entry(generation.container.clone())
                        .or_default();
                    p.stopped = true;
                    p.gone = matches!(r, Err(RuntimeError::NotFound));
                }
            }
            (InstanceCommand::RemovePredecessor(g), InstanceAnswer::PredecessorRemoved(Ok(()))) => {
                predecessors.entry(g.container.clone()).or_default().removed = true;
            }
            (InstanceCommand::ReleaseClaims(g), InstanceAnswer::ClaimsReleased(Ok(()))) => {
                predecessors
                    .entry(g.container.clone())
                    .or_default()
                    .claims_released = true;
            }
            (InstanceCommand::InspectSuccessor(_), InstanceAnswer::SuccessorInspected(Ok(obs))) => {
                if let Some(service) = &marker_service {
                    inspected.insert(service.clone(), obs.clone());
                }
            }
            (InstanceCommand::ReadRoutes, InstanceAnswer::RoutesRead(Ok(routes))) => {
                if let Some(service) = &marker_service {
                    let key = ServiceKey {
                        instance: input.instance.clone(),
                        service: service.clone(),
                    };
                    routed.insert(service.clone(), routes.get(&key).copied());
                }
            }
            _ => {}
        }
        pass.handle(answer, input.now);
        if let Some(why) = then_abandon {
            abandoned = true;
            pass.abandon(why);
            assert!(pass.poll_command().is_none(), "an abandoned pass went on");
        }
    }
    let report = pass.into_report();
    // #40: a revert happens exactly when a baking successor failed this
    // pass by the rule's own reading, or an operator undid it, and not
    // otherwise.
    let failed = baking()
        .any(|(m, back, _)| back.undone && add(m.created_at, bake::UNDO_TASK_GRACE) <= input.now)
        || report.reports.iter().any(|r| {
            baking().any(|(m, _, successor)| {
                m.service == r.key.service
                    && successor.container == r.key.container
                    && bake::fails_while_baking(r, successor).is_some()
            })
        });
    if !abandoned {
        // T5: every route the proxy held for a service ACTIVE does not
        // name was withdrawn (or tried).
        if let Some(held) = &input.held {
            for key in held.keys() {
                if !input.active.services.contains_key(&key.service) {
                    assert!(
                        withdrawn_stale.contains(key),
                        "the stale route of {} was never withdrawn",
                        key.service
                    );
                }
            }
        }
        assert_eq!(
            !reverts.is_empty(),
            failed,
            "a revert must follow exactly a baking successor's failure: reverts {reverts:?}"
        );
    } else {
        assert!(
            reverts.is_empty() || failed,
            "a revert without a failure: {reverts:?}"
        );
    }
    // R15 / S5: a predecessor of a running service ACTIVE has was stopped
    // only behind a verified, unchanged, routed successor.
    for (service, container) in stops {
        let Some(successor) = input.active.services.get(&service) else {
            continue;
        };
        if input.intent == Intent::Stopped {
            continue;
        }
        let verdict = report
            .reports
            .iter()
            .find(|r| r.key.service == service)
            .map(|r| &r.verdict);
        let Some(Verdict::Verified {
            started_at,
            published: false,
        }) = verdict
        else {
            panic!("retired {container} without its successor verified this pass: {verdict:?}");
        };
        let unrecorded = report
            .reports
            .iter()
            .filter(|r| r.key.service == service)
            .flat_map(|r| &r.errors)
            .any(|e| matches!(e, stead::core::recovery::RecoveryError::RecordFailed(_)));
        assert!(
            !unrecorded,
            "retired {container} though its successor's verified execution was never recorded (S5)"
        );
        let obs = inspected
            .get(&service)
            .unwrap_or_else(|| panic!("retired {container} without inspecting the successor"));
        assert!(
            obs.status == ContainerStatus::Running && obs.started_at == *started_at,
            "retired {container}: the successor's final inspection was {obs:?}, verified {started_at:?}"
        );
        if !successor.binds.is_empty() {
            assert_eq!(
                routed.get(&service).copied().flatten(),
                successor.binds.values().next().copied(),
                "retired {container} while the proxy did not route {service} to its successor"
            );
        }
    }
    let reverted = !reverts.is_empty();
    (report, reverted)
}
