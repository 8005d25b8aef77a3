//! Drives one `ServiceRecovery` with arbitrary outcomes and checks its
//! safety properties (docs/rules.md R1, R4–R14 and S1–S7) after every step.
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
    ServiceRecovery, Verdict, COMMANDS_PER_RECOVERY_MAX,
};
use stead::core::types::{
    ActiveService, Binds, ContainerId, ContainerStatus, GenerationKey, Health, InstanceName,
    Intent, Observation, RuntimeError, ServiceName, Timestamp,
};

use crate::model::{later, BudgetModel};

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

/// What the checker remembers about the run so far.
struct Checker<'a> {
    case: &'a Case,
    /// The budget as remembered before the run, in the reference model.
    budget_at_start: BudgetModel,
    /// The last execution known verified when the run began (R17).
    verified_at_start: Option<Timestamp>,
    commands: u32,
    intervened: bool,
    starts: u32,
    restarts: u32,
    first_inspect: Option<(Timestamp, Result<Observation, RuntimeError>)>,
    last_inspect: Option<Result<Observation, RuntimeError>>,
    last_health: Option<(Timestamp, Result<Health, RuntimeError>)>,
    last_binds: Option<Binds>,
    /// Result of the last withdrawal fed (`true`: succeeded).
    last_withdraw: Option<bool>,
    published_since_withdraw: bool,
    last_policy_check: Option<bool>,
    /// `now` of the last outcome fed: the machine decides with it.
    last_outcome_at: Timestamp,
    /// `now` the machine decided to check policy (for a start or restart).
    decided_at: Option<Timestamp>,
    /// Executions whose readiness probe passed in this run.
    ready: Vec<Option<Timestamp>>,
    /// The execution ACTIVE durably records as verified: the input's,
    /// then each record that succeeded.
    recorded: Option<Timestamp>,
    /// The execution of the record command awaiting its outcome.
    recording: Option<Timestamp>,
}

impl<'a> Checker<'a> {
    fn new(case: &'a Case, start: Timestamp) -> Self {
        let memory = &case.input.memory;
        Self {
            case,
            budget_at_start: BudgetModel::from_entry(memory.generation.budget.as_ref()),
            verified_at_start: memory
                .generation
                .verified_started_at
                .or(case.input.active.verified_started_at),
            commands: 0,
            intervened: false,
            starts: 0,
            restarts: 0,
            first_inspect: None,
            last_inspect: None,
            last_health: None,
            last_binds: None,
            last_withdraw: None,
            published_since_withdraw: false,
            last_policy_check: None,
            last_outcome_at: start,
            decided_at: None,
            ready: Vec::new(),
            recorded: case.input.active.verified_started_at,
            recording: None,
        }
    }

    fn running(&self) -> bool {
        self.case.input.intent == Intent::Running
    }

    fn withdrawal_pending(&self) -> bool {
        self.last_withdraw
            .map_or(self.case.input.memory.withdrawal_pending, |ok| !ok)
    }

    fn current_execution(&self) -> Option<Option<Timestamp>> {
        match &self.last_inspect {
            Some(Ok(obs)) => Some(obs.started_at),
            _ => None,
        }
    }

    /// R13: a started, restarted or fresh execution must pass readiness.
    fn needs_readiness(&self, execution: Option<Timestamp>) -> bool {
        self.intervened || execution.is_none() || execution != self.verified_at_start
    }

    fn assert_traffic_withdrawn(&self, what: &str) {
        assert_eq!(
            self.last_withdraw,
            Some(true),
            "{what} without a successful withdrawal first (R8/R12)"
        );
        assert!(
            !self.published_since_withdraw,
            "{what} while a publication is routed"
        );
    }

    fn command(&mut self, command: &Command) {
        self.commands += 1;
        assert!(
            self.commands <= COMMANDS_PER_RECOVERY_MAX,
            "more than {COMMANDS_PER_RECOVERY_MAX} commands"
        );
        if self.running() && self.last_withdraw == Some(false) {
            panic!("{command:?} after a failed withdrawal: nothing else may happen (R6/R8)");
        }
        let must_withdraw_first = self.case.input.memory.withdrawal_pending
            || self.case.input.inhibition.is_some()
            || !self.running();
        if self.commands == 1 && must_withdraw_first {
            assert_eq!(command, &Command::Withdraw, "R4/R5/R6: withdraw first");
        }
        if self.running() && self.case.input.inhibition.is_some() {
            assert_eq!(command, &Command::Withdraw, "R5: an inhibited generation");
        }
        if !self.running() {
            assert!(
                matches!(
                    command,
                    Command::Withdraw | Command::Inspect | Command::Stop { .. }
                ),
                "R4: stopped intent only withdraws, inspects and stops, not {command:?}"
            );
        }
        // R8: a fresh or non-running first observation is withdrawn before
        // anything else happens.
        if let Some((_, Ok(obs))) = &self.first_inspect {
            let fresh = obs.started_at.is_none() || obs.started_at != self.verified_at_start;
            let unverified =
                obs.status != ContainerStatus::Running && !obs.status.is_transitional();
            if self.running() && (fresh || unverified) && self.last_withdraw != Some(true) {
                assert_eq!(command, &Command::Withdraw, "R8: fail closed first");
            }
        }
        match command {
            Command::CheckPolicy => self.decided_at = Some(self.last_outcome_at),
            Command::Start => self.check_start(),
            Command::Restart { .. } => self.check_restart(),
            Command::Stop { .. } => {
                assert!(!self.running(), "R4: Stop only for stopped intent");
                assert!(
                    matches!(&self.last_inspect, Some(Ok(obs))
                        if obs.status == ContainerStatus::Running || obs.status.is_transitional()),
                    "R4: only a running or transitional container is stopped"
                );
            }
            Command::ProbeReadiness { binds, started_at } => {
                assert_eq!(
                    Some(binds),
                    self.last_binds.as_ref(),
                    "R13: probe the read binds"
                );
                assert_eq!(
                    Some(*started_at),
                    self.current_execution(),
                    "R13: probe the execution inspected last"
                );
            }
            Command::PersistBinds { binds, .. } => {
                assert_eq!(
                    Some(binds),
                    self.last_binds.as_ref(),
                    "R13: persist read binds"
                );
                let execution = self
                    .current_execution()
                    .expect("inspected before persisting");
                if self.needs_readiness(execution) {
                    assert!(
                        self.ready.contains(&execution),
                        "S7: binds of {execution:?} persisted before its readiness passed"
                    );
                }
            }
            Command::Publish { binds, started_at } => self.check_publish(binds, *started_at),
            Command::RecordExecution { started_at } => {
                assert_eq!(
                    self.current_execution(),
                    Some(Some(*started_at)),
                    "R13: record the execution just verified"
                );
                self.recording = Some(*started_at);
            }
            _ => {}
        }
    }

    fn check_start(&mut self) {
        self.starts += 1;
        self.intervened = true;
        assert!(self.running(), "S3: a stopped instance is never started");
        assert!(self.case.input.inhibition.is_none(), "S4: inhibited start");
        assert_eq!(self.starts, 1, "one start per recovery");
        assert_eq!(
            self.last_policy_check,
            Some(true),
            "R11: policy checked first"
        );
        self.assert_traffic_withdrawn("Start");
        let decided_at = self.decided_at.expect("policy checked first");
        let (_, first) = self.first_inspect.as_ref().expect("inspected first");
        assert!(
            matches!(first, Ok(obs) if obs.status.is_down()),
            "R9: only a down container is started, saw {first:?}"
        );
        let mut model = self.budget_at_start.clone();
        assert!(
            model.found_down(&self.case.policy, decided_at),
            "S6: start at {decided_at} while the budget {:?} forbids it",
            self.case.input.memory.generation.budget
        );
    }

    fn check_restart(&mut self) {
        self.restarts += 1;
        self.intervened = true;
        assert!(self.running(), "S3: a stopped instance is never restarted");
        assert!(
            self.case.input.inhibition.is_none(),
            "S4: inhibited restart"
        );
        assert_eq!(self.restarts, 1, "one restart per recovery");
        assert_eq!(
            self.last_policy_check,
            Some(true),
            "R11: policy checked first"
        );
        self.assert_traffic_withdrawn("Restart");
        let decided_at = self.decided_at.expect("policy checked first");
        let (_, health) = self.last_health.as_ref().expect("health read first");
        assert_eq!(
            health,
            &Ok(Health::Unhealthy),
            "R12: restart only for health"
        );
        // R12: the streak this unhealthy read makes, counted from the
        // remembered one unless the first inspection saw a new execution
        // (whose streak starts over).
        let fresh = match &self.first_inspect {
            Some((_, Ok(obs))) => {
                obs.started_at.is_none() || obs.started_at != self.verified_at_start
            }
            _ => true,
        };
        let before = if fresh {
            0
        } else {
            self.budget_at_start.unhealthy_streak()
        };
        assert!(
            before + 1 >= self.case.policy.unhealthy_threshold,
            "R12: restarted at an unhealthy streak of {} below the threshold {}",
            before + 1,
            self.case.policy.unhealthy_threshold
        );
        assert!(
            self.budget_at_start.allow(decided_at),
            "S6: restart at {decided_at} while the budget forbids it"
        );
    }

    fn check_publish(&self, binds: &Binds, started_at: Option<Timestamp>) {
        assert!(self.running(), "S3: a stopped instance is never published");
        assert!(
            !binds.is_empty(),
            "R13: a service without ports is never routed (the proxy refuses it)"
        );
        assert!(
            !self.withdrawal_pending(),
            "S2: publication while a withdrawal is pending"
        );
        assert_eq!(
            Some(binds),
            self.last_binds.as_ref(),
            "R13: publish read binds"
        );
        assert!(
            matches!(&self.last_inspect, Some(Ok(obs))
                if obs.status == ContainerStatus::Running && obs.started_at == started_at),
            "R13: publication of {started_at:?} not confirmed by the last inspection {:?}",
            self.last_inspect
        );
        if self.needs_readiness(started_at) {
            assert!(
                self.ready.contains(&started_at),
                "S2: published {started_at:?} without its readiness passing (ready: {:?})",
                self.ready
            );
        }
        if started_at.is_some() {
            assert_eq!(
                self.recorded, started_at,
                "S11: published an execution ACTIVE does not record as verified \
                 (a restart now would blink it)"
            );
        }
    }

    fn outcome(&mut self, outcome: &Outcome, now: Timestamp) {
        self.last_outcome_at = now;
        match outcome {
            Outcome::Withdrawn(result) => {
                self.last_withdraw = Some(result.is_ok());
                if result.is_ok() {
                    self.published_since_withdraw = false;
                }
            }
            Outcome::Inspected(result) => {
                if self.first_inspect.is_none() {
                    self.first_inspect = Some((now, result.clone()));
                }
                self.last_inspect = Some(result.clone());
            }
            Outcome::PolicyChecked(result) => self.last_policy_check = Some(result.is_ok()),
            Outcome::Health(result) => self.last_health = Some((now, result.clone())),
            Outcome::Binds(Ok(binds)) => self.last_binds = Some(binds.clone()),
            Outcome::Readiness(Ok(())) => {
                let execution = self.current_execution().expect("inspected before probing");
                self.ready.push(execution);
            }
            Outcome::Published(Ok(())) => self.published_since_withdraw = true,
            Outcome::ExecutionRecorded(Ok(())) => self.recorded = self.recording.take(),
            _ => {}
        }
    }

    fn report(&self, report: &Report) {
        let input = &self.case.input;
        assert_eq!(
            report.memory.withdrawal_pending,
            self.withdrawal_pending(),
            "R6: a failed withdrawal stays pending until one succeeds"
        );
        assert!(!report.intervened || self.intervened, "intervened unasked");
        let budget = report.memory.generation.budget.as_ref();
        if let Some(after) = budget {
            // R10: only stability or forgetting resets the count.
            assert!(
                after.failures >= self.budget_at_start.failures(),
                "R10: failures dropped from {} to {} without a reset",
                self.budget_at_start.failures(),
                after.failures
            );
        }
        match &report.verdict {
            Verdict::Verified { started_at, .. } => {
                assert!(self.running() && input.inhibition.is_none());
                assert!(
                    !report.memory.withdrawal_pending,
                    "S2: verified while pending"
                );
                assert!(
                    matches!(&self.last_inspect, Some(Ok(obs))
                        if obs.status == ContainerStatus::Running && obs.started_at == *started_at),
                    "R13: verified {started_at:?} is not what the last inspection saw"
                );
                assert_eq!(report.memory.generation.verified_started_at, *started_at);
                if self.needs_readiness(*started_at) {
                    assert!(
                        self.ready.contains(started_at),
                        "verified without readiness"
                    );
                }
            }
            Verdict::Stopped => assert!(!self.running()),
            Verdict::Inhibited => assert!(self.running() && input.inhibition.is_some()),
            Verdict::Gone => {
                assert!(
                    report.memory.generation.is_empty(),
                    "R7: a gone generation is forgotten"
                );
            }
            Verdict::Delayed { next_attempt } => {
                let decided_at = self.last_outcome_at;
                let mut model = self.budget_at_start.clone();
                assert!(
                    !model.found_down(&self.case.policy, decided_at),
                    "R10: delayed although the budget allows"
                );
                assert_eq!(*next_attempt, model.next_attempt(), "R10: next attempt");
            }
            Verdict::Transitional | Verdict::Failed => {}
        }
        if !self.running() {
            assert_eq!(report.memory.generation.budget, None, "R4: forget memory");
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
    let mut checker = Checker::new(case, start);
    let mut now = start;
    while let Some(command) = machine.poll_command() {
        assert!(!machine.is_done(), "done with {command:?} outstanding");
        checker.command(&command);
        let (outcome, at) = answer(&machine, &command, now);
        now = at;
        checker.outcome(&outcome, now);
        machine.handle(outcome, now);
    }
    assert!(machine.is_done(), "no command but not done");
    assert_eq!(machine.poll_command(), None, "a command after the report");
    let report = machine.into_report();
    checker.report(&report);
    report
}
