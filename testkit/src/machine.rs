//! Drives one `ServiceRecovery` with arbitrary outcomes and checks its
//! safety properties (docs/rules.md R1, R4–R14, S1–S7 and S11) after every
//! step, with the core's judge (`stead::core::judge::recovery`).
//!
//! Shared, without duplication, by the cargo-fuzz target `recovery_machine`
//! (re-exported by `fuzz/src/lib.rs`) and by `tests/recovery_properties.rs`
//! (as `stead_testkit::…`). Inputs are plain numbers so that proptest strategies
//! and `arbitrary` can both produce them; every number maps onto a valid
//! input, so nothing is rejected.

use std::time::Duration;

use stead::core::budget::BudgetEntry;
use stead::core::errors::{PolicyError, ProbeError, StoreError, TrafficError};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{
    Command, GenerationMemory, Outcome, ProxyView, Report, ServiceInput, ServiceMemory,
    ServiceRecovery,
};
use stead::core::types::{
    ActiveService, Binds, ContainerId, ContainerStatus, GenerationKey, Health, InstanceName,
    Intent, Observation, RuntimeError, ServiceName, Timestamp,
};

use crate::model::later;
use stead::core::judge::recovery::RecoveryJudge;
use stead::core::judge::Breach;

/// When every recovery of the harness begins.
pub fn base() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("valid")
}

/// A small set of executions, so that collisions (same `started_at`) are
/// common: 0 is "never started".
pub fn execution(n: u8) -> Option<Timestamp> {
    match n % 4 {
        0 => None,
        k => Some(Timestamp::from_second(1_799_990_000 + i64::from(k)).expect("valid")),
    }
}

pub fn binds(n: u8) -> Binds {
    match n % 4 {
        0 => Binds::new(),
        1 => Binds::from([(8080, 30001)]),
        2 => Binds::from([(8080, 30002)]),
        _ => Binds::from([(8080, 30001), (9090, 30003)]),
    }
}

const STATUSES: [ContainerStatus; 12] = [
    ContainerStatus::Running,
    ContainerStatus::Running,
    ContainerStatus::Running,
    ContainerStatus::Running,
    ContainerStatus::Restarting,
    ContainerStatus::Starting,
    ContainerStatus::Created,
    ContainerStatus::Exited,
    ContainerStatus::Dead,
    ContainerStatus::Stopped,
    ContainerStatus::Paused,
    ContainerStatus::Unknown,
];

const HEALTHS: [Health; 4] = [
    Health::Healthy,
    Health::Unhealthy,
    Health::Starting,
    Health::None,
];

/// The remembered budget of the generation, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntrySeed {
    pub failures: u8,
    /// Seconds from `base()`; `None`: no delay.
    pub next_attempt_s: Option<i16>,
    pub stable_since_s: Option<i16>,
    pub unhealthy_streak: u8,
    pub attempt_pending: bool,
}

/// The inputs of one recovery, as numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaseSeed {
    pub stopped: bool,
    pub inhibited: bool,
    pub active_binds: u8,
    pub active_verified: u8,
    pub memory_verified: u8,
    pub withdrawal_pending: bool,
    pub budget: Option<EntrySeed>,
    pub free_attempts: u8,
    pub unhealthy_threshold: u8,
    /// What the proxy holds for the service (T5), see [`proxy_view`].
    pub proxy: u8,
}

/// The proxy's route as the pass read it: unknown, absent, or dialling one
/// of the ports [`binds`] hands out (so it matches ACTIVE's or not).
pub fn proxy_view(n: u8) -> ProxyView {
    match n % 4 {
        0 => ProxyView::Unknown,
        1 => ProxyView::Absent,
        2 => ProxyView::Dials(30001),
        _ => ProxyView::Dials(30002),
    }
}

/// The answer to whatever command comes next, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutcomeSeed {
    /// Success or which failure.
    pub choice: u8,
    pub status: u8,
    pub execution: u8,
    pub health: u8,
    pub binds: u8,
    /// How long the command took.
    pub took_ms: u16,
}

/// A fully built case.
#[derive(Clone, Debug)]
pub struct Case {
    pub policy: RecoveryPolicy,
    pub input: ServiceInput,
}

impl CaseSeed {
    pub fn build(&self) -> Case {
        let at = |s: i16| Timestamp::from_second(base().as_second() + i64::from(s)).ok();
        let budget = self.budget.map(|b| BudgetEntry {
            failures: u32::from(b.failures % 12),
            next_attempt: b.next_attempt_s.and_then(at),
            stable_since: b.stable_since_s.and_then(at),
            unhealthy_streak: u32::from(b.unhealthy_streak % 4),
            attempt_pending: b.attempt_pending,
        });
        let container = ContainerId::new("c1");
        let policy = RecoveryPolicy {
            free_attempts: 1 + u32::from(self.free_attempts % 3),
            unhealthy_threshold: 1 + u32::from(self.unhealthy_threshold % 3),
            ..RecoveryPolicy::default()
        }
        .validated()
        .expect("valid policy");
        let input = ServiceInput {
            key: GenerationKey {
                instance: InstanceName::new("app"),
                service: ServiceName::new("web"),
                container: container.clone(),
            },
            active: ActiveService {
                container,
                effective_revision: "r1".into(),
                binds: binds(self.active_binds),
                stop_grace: None,
                verified_started_at: execution(self.active_verified),
            },
            intent: if self.stopped {
                Intent::Stopped
            } else {
                Intent::Running
            },
            inhibition: self.inhibited.then(|| "operator-hold".to_owned()),
            memory: ServiceMemory {
                generation: GenerationMemory {
                    budget,
                    verified_started_at: execution(self.memory_verified),
                },
                withdrawal_pending: self.withdrawal_pending,
            },
            proxy: proxy_view(self.proxy),
        };
        Case { policy, input }
    }
}

/// `Err(error)` when `fails`, else `Ok(())`.
pub fn unit<E>(fails: bool, error: E) -> Result<(), E> {
    if fails {
        Err(error)
    } else {
        Ok(())
    }
}

/// An outcome of the right kind for `command`, picked by `seed`.
pub fn outcome_for(command: &Command, seed: &OutcomeSeed, active: &ActiveService) -> Outcome {
    let fails = seed.choice.is_multiple_of(8);
    let runtime = || match seed.choice % 8 {
        0 => Err(RuntimeError::NotFound),
        1 => Err(RuntimeError::Transient("timeout".into())),
        _ => Ok(()),
    };
    match command {
        Command::Withdraw => {
            Outcome::Withdrawn(unit(fails, TrafficError::Rejected("proxy 500".into())))
        }
        Command::Inspect => Outcome::Inspected(match seed.choice % 8 {
            0 => Err(RuntimeError::NotFound),
            1 => Err(RuntimeError::Transient("timeout".into())),
            _ => Ok(Observation {
                // Half the observations are `running`, the path that matters.
                status: if seed.status < 128 {
                    ContainerStatus::Running
                } else {
                    STATUSES[usize::from(seed.status) % STATUSES.len()]
                },
                started_at: execution(seed.execution),
                exit: None,
            }),
        }),
        Command::ReleaseClaims => {
            Outcome::ClaimsReleased(unit(fails, StoreError::Unavailable("store down".into())))
        }
        Command::CheckPolicy => Outcome::PolicyChecked(unit(
            fails,
            PolicyError::Revoked("bind policy revoked".into()),
        )),
        Command::Start => Outcome::Started(runtime()),
        Command::Restart { .. } => Outcome::Restarted(runtime()),
        Command::Stop { .. } => Outcome::Stopped(runtime()),
        Command::ReadHealth => Outcome::Health(if seed.choice % 8 == 1 {
            Err(RuntimeError::Transient("timeout".into()))
        } else {
            Ok(HEALTHS[usize::from(seed.health) % HEALTHS.len()])
        }),
        Command::ReadBinds => Outcome::Binds(if fails {
            Err(RuntimeError::Transient("timeout".into()))
        } else {
            Ok(binds(seed.binds))
        }),
        Command::ProbeReadiness { .. } => Outcome::Readiness(unit(
            fails,
            ProbeError::Unreachable("connection refused".into()),
        )),
        Command::ReloadActive => Outcome::ActiveReloaded(match seed.choice % 8 {
            0 => Err(StoreError::Unavailable("store down".into())),
            1 => Ok(None),
            2 => Ok(Some(ActiveService {
                container: ContainerId::new("c2"),
                ..active.clone()
            })),
            3 => Ok(Some(ActiveService {
                effective_revision: "r2".into(),
                ..active.clone()
            })),
            4 => Ok(Some(ActiveService {
                binds: binds(seed.binds),
                ..active.clone()
            })),
            _ => Ok(Some(active.clone())),
        }),
        Command::PersistBinds { .. } => Outcome::BindsPersisted(match seed.choice % 8 {
            0 => Err(StoreError::Unavailable("store down".into())),
            1 => Ok(false),
            _ => Ok(true),
        }),
        Command::Publish { .. } => {
            Outcome::Published(unit(fails, TrafficError::Rejected("proxy 500".into())))
        }
        Command::RecordExecution { .. } => {
            Outcome::ExecutionRecorded(unit(fails, StoreError::Unavailable("store down".into())))
        }
    }
}

/// Runs one recovery of `case`, answering its n-th command with
/// `outcomes[n]` (the default seed once they run out), and asserts the
/// safety properties after every step. Returns the report.
pub fn run_and_check(case: &Case, outcomes: &[OutcomeSeed]) -> Report {
    let mut step = 0;
    run_and_check_with(case, base(), |_, command, now| {
        let seed = outcomes.get(step).copied().unwrap_or_default();
        step += 1;
        (
            outcome_for(command, &seed, &case.input.active),
            later(now, Duration::from_millis(u64::from(seed.took_ms))),
        )
    })
}

/// Runs one recovery of `case` beginning at `start`, answering each
/// command with what `answer` gives (the outcome and the time it came;
/// it sees the machine, for the exhaustive explorer's state count), and
/// asserts the safety properties after every step. Returns the report.
pub fn run_and_check_with(
    case: &Case,
    start: Timestamp,
    mut answer: impl FnMut(&ServiceRecovery<'_>, &Command, Timestamp) -> (Outcome, Timestamp),
) -> Report {
    let mut machine = ServiceRecovery::new(&case.policy, case.input.clone());
    let mut judge = RecoveryJudge::new(&case.policy, case.input.clone(), start);
    let judged = |result: Result<(), Breach>| {
        if let Err(breach) = result {
            panic!("{breach}");
        }
    };
    let mut now = start;
    while let Some(command) = machine.poll_command() {
        assert!(!machine.is_done(), "done with {command:?} outstanding");
        judged(judge.decided(&command));
        let (outcome, at) = answer(&machine, &command, now);
        now = at;
        judge.answered(&outcome, now);
        machine.handle(outcome, now);
    }
    assert!(machine.is_done(), "no command but not done");
    assert_eq!(machine.poll_command(), None, "a command after the report");
    let report = machine.into_report();
    judged(judge.finished(&report));
    report
}
