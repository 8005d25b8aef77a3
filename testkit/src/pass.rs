//! Drives one `InstancePass` with arbitrary answers and checks the pass's
//! own safety properties with the core's judge (`stead::core::judge`,
//! which lists them: R1/S1, R15/S5, the bake's rules of #40, T5, and the
//! pass's bound); here besides, abandoning a pass ends it at once.
//!
//! Shared by the cargo-fuzz target `instance_pass`, by
//! `tests/pass_properties.rs` and by the exhaustive explorer (as
//! `stead_testkit::…`), like `machine.rs`.

use std::time::Duration;
use stead::core::errors::{StoreError, TrafficError};
use stead::core::fleet::add;
use stead::core::judge::{Breach, PassJudge};
use stead::core::memory::InstanceMemory;
use stead::core::pass::{
    Abandon, InstanceAnswer, InstanceCommand, InstancePass, InstanceReport, PassInput,
};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{Command, GenerationMemory, Outcome, ServiceMemory};
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
    let mut judge = PassJudge::new(&case.policy, input);
    let judged = |result: Result<(), Breach>| {
        if let Err(breach) = result {
            panic!("{breach}");
        }
    };
    while let Some(command) = pass.poll_command() {
        judged(judge.decided(&command));
        let (answer, then_abandon) = match drive(&pass, &command) {
            Drive::Answer(answer) => (answer, None),
            Drive::AnswerThenAbandon(answer, why) => (answer, Some(why)),
            Drive::Abandon(why) => {
                abandoned = true;
                pass.abandon(why);
                continue;
            }
        };
        judge.answered(&command, &answer, input.now);
        pass.handle(answer, input.now);
        if let Some(why) = then_abandon {
            abandoned = true;
            pass.abandon(why);
            assert!(pass.poll_command().is_none(), "an abandoned pass went on");
        }
    }
    let report = pass.into_report();
    judged(judge.finished(&report, abandoned));
    let reverted = judge.reverted();
    (report, reverted)
}
