//! One service's recovery across consecutive passes, explored
//! exhaustively: every answer its ports may give, a container that
//! crashes, restarts natively or turns unhealthy between any two steps,
//! time going on by a little or a lot between passes (budget delays, the
//! stable window), and an operator inhibiting it or stopping it.
//!
//! The answers come from a small world ([`ServiceWorld`]): the container,
//! the proxy's route and ACTIVE's record. The fault-free answer is the
//! world's truth; a fault either changes the world (a crash, a native
//! restart, a removal, health turning bad) or fails the port call. What a
//! pass leaves (its memory, what it recorded in ACTIVE, the route) is the
//! next pass's input, so R6 (a withdrawal pending until it succeeds), R10
//! (the budget across passes), R14 (the stable window) and R17 (record
//! before publish) are all exercised across passes.
//!
//! Safety: the recovery checker of `machine.rs` ([`run_and_check_with`])
//! after every step of every pass. Liveness, after [`TAIL_PASSES`]
//! fault-free passes: a pending withdrawal was retried (L4), a delayed or
//! crashed service was started again and is verified and routed to its
//! running execution (L1), a stopped or inhibited one is down or
//! unrouted (R4, R5), a removed one is forgotten (R7).

use std::time::Duration;

use stead::core::broken::Mutant;
use stead::core::errors::{PolicyError, ProbeError, StoreError, TrafficError};
use stead::core::policy::RecoveryPolicy;
use stead::core::recovery::{
    Command, GenerationMemory, Outcome, ProxyView, ServiceInput, ServiceMemory, Verdict,
};
use stead::core::types::{
    ActiveService, Binds, ContainerId, ContainerStatus, GenerationKey, Health, InstanceName,
    Intent, Observation, RuntimeError, ServiceName, Timestamp,
};

use super::Chooser;
use crate::machine::{base, run_and_check_with, Case};
use crate::model::later;

/// Passes on which faults are on offer.
pub const PASSES: usize = 4;
/// Fault-free passes after them, before the liveness properties are
/// checked: enough for a delayed, crash-looping or unhealthy service to
/// be started, restarted and verified again.
pub const TAIL_PASSES: usize = 4;
/// How long each command takes.
const STEP: Duration = Duration::from_secs(1);
/// Time between passes: usually past every delay and the stable window;
/// a fault makes it short.
const LONG: Duration = Duration::from_secs(150);
const SHORT: Duration = Duration::from_secs(20);

/// The explored policy: small numbers, so that the crash-loop delays, the
/// stable window and the unhealthy threshold all come into play within a
/// few passes.
pub fn policy(broken: Option<Mutant>) -> RecoveryPolicy {
    let policy = RecoveryPolicy {
        free_attempts: 2,
        delays: vec![Duration::from_secs(60), Duration::from_secs(120)],
        stable_window: Duration::from_secs(90),
        unhealthy_threshold: 2,
        ..RecoveryPolicy::default()
    }
    .validated()
    .expect("valid policy");
    RecoveryPolicy { broken, ..policy }
}

/// The start time of execution `n` of a container.
pub fn execution_at(n: u32) -> Timestamp {
    Timestamp::from_second(base().as_second() - 100_000 + i64::from(n)).expect("valid")
}

/// One service as the world holds it: its container, the proxy's route
/// for it and ACTIVE's record of it. Every map in it is ordered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceWorld {
    pub status: ContainerStatus,
    /// The current execution (see [`execution_at`]).
    pub execution: u32,
    pub health: Health,
    /// The ports the container publishes.
    pub binds: Binds,
    /// An operator removed the container.
    pub gone: bool,
    pub proxy: ProxyView,
    /// ACTIVE's durable record.
    pub active: ActiveService,
}

impl ServiceWorld {
    /// A container running execution 1, verified, healthy and routed.
    pub fn serving(container: &str, binds: Binds) -> Self {
        let proxy = binds
            .values()
            .next()
            .map_or(ProxyView::Absent, |p| ProxyView::Dials(*p));
        Self {
            status: ContainerStatus::Running,
            execution: 1,
            health: Health::Healthy,
            binds: binds.clone(),
            gone: false,
            proxy,
            active: ActiveService {
                container: ContainerId::new(container),
                effective_revision: "r1".into(),
                binds,
                stop_grace: None,
                verified_started_at: Some(execution_at(1)),
            },
        }
    }

    pub fn started_at(&self) -> Option<Timestamp> {
        Some(execution_at(self.execution))
    }

    /// What an inspection truly sees.
    pub fn observation(&self) -> Result<Observation, RuntimeError> {
        if self.gone {
            return Err(RuntimeError::NotFound);
        }
        Ok(Observation {
            status: self.status,
            started_at: self.started_at(),
            exit: None,
        })
    }

    /// Whether the route dials this container's ports.
    pub fn routed(&self) -> bool {
        matches!(self.proxy, ProxyView::Dials(p) if self.binds.values().next() == Some(&p))
    }

    fn run_anew(&mut self) {
        self.status = ContainerStatus::Running;
        self.execution += 1;
        self.health = Health::Healthy;
    }

    /// A runtime call that mutates the container: it happens, or it fails.
    fn mutation(
        &mut self,
        ch: &mut Chooser,
        happen: impl FnOnce(&mut Self),
    ) -> Result<(), RuntimeError> {
        if self.gone {
            return Err(RuntimeError::NotFound);
        }
        if ch.choose(2) == 1 {
            return Err(RuntimeError::Transient("timeout".into()));
        }
        happen(self);
        Ok(())
    }

    fn inspect(&mut self, ch: &mut Chooser) -> Result<Observation, RuntimeError> {
        if self.gone {
            return self.observation();
        }
        let running = self.status == ContainerStatus::Running;
        // 0 truth; 1 a transient error; 2 removed by an operator;
        // 3 restarted natively; 4 crashed (a running one).
        match ch.choose(if running { 5 } else { 4 }) {
            1 => return Err(RuntimeError::Transient("timeout".into())),
            2 => self.gone = true,
            3 => self.run_anew(),
            4 => self.status = ContainerStatus::Exited,
            _ => {}
        }
        self.observation()
    }

    /// The answer to `command`: the truth, or one of the faults on offer.
    pub fn answer(&mut self, command: &Command, ch: &mut Chooser) -> Outcome {
        let fails = |ch: &mut Chooser| ch.choose(2) == 1;
        match command {
            Command::Withdraw => Outcome::Withdrawn(if fails(ch) {
                Err(TrafficError::Rejected("proxy 500".into()))
            } else {
                self.proxy = ProxyView::Absent;
                Ok(())
            }),
            Command::Inspect => Outcome::Inspected(self.inspect(ch)),
            Command::ReleaseClaims => Outcome::ClaimsReleased(if fails(ch) {
                Err(StoreError::Unavailable("store down".into()))
            } else {
                Ok(())
            }),
            Command::CheckPolicy => Outcome::PolicyChecked(if fails(ch) {
                Err(PolicyError::Revoked("bind policy revoked".into()))
            } else {
                Ok(())
            }),
            Command::Start => Outcome::Started(self.mutation(ch, Self::run_anew)),
            Command::Restart { .. } => Outcome::Restarted(self.mutation(ch, Self::run_anew)),
            Command::Stop { .. } => {
                Outcome::Stopped(self.mutation(ch, |w| w.status = ContainerStatus::Exited))
            }
            Command::ReadHealth => Outcome::Health(match ch.choose(3) {
                1 => Err(RuntimeError::Transient("timeout".into())),
                2 => {
                    self.health = Health::Unhealthy;
                    Ok(Health::Unhealthy)
                }
                _ => Ok(self.health),
            }),
            Command::ReadBinds => Outcome::Binds(if fails(ch) {
                Err(RuntimeError::Transient("timeout".into()))
            } else {
                Ok(self.binds.clone())
            }),
            Command::ProbeReadiness { .. } => Outcome::Readiness(if fails(ch) {
                Err(ProbeError::Unreachable("connection refused".into()))
            } else {
                Ok(())
            }),
            Command::ReloadActive => Outcome::ActiveReloaded(if fails(ch) {
                Err(StoreError::Unavailable("store down".into()))
            } else {
                Ok(Some(self.active.clone()))
            }),
            Command::PersistBinds { binds, .. } => Outcome::BindsPersisted(if fails(ch) {
                Err(StoreError::Unavailable("store down".into()))
            } else {
                self.active.binds = binds.clone();
                Ok(true)
            }),
            Command::Publish { binds, .. } => Outcome::Published(if fails(ch) {
                Err(TrafficError::Rejected("proxy 500".into()))
            } else {
                self.proxy = binds
                    .values()
                    .next()
                    .map_or(ProxyView::Absent, |p| ProxyView::Dials(*p));
                Ok(())
            }),
            Command::RecordExecution { started_at } => Outcome::ExecutionRecorded(if fails(ch) {
                Err(StoreError::Unavailable("store down".into()))
            } else {
                self.active.verified_started_at = Some(*started_at);
                Ok(())
            }),
        }
    }
}

/// The initial configurations, each explored in full.
pub const SETUPS: [&str; 4] = [
    "serving, verified and routed",
    "serving without ports (a worker)",
    "a withdrawal left pending by the previous pass",
    "a restarted daemon: no memory, ACTIVE records the execution",
];

/// What the explored service is and what is known of it.
#[derive(Clone, Debug)]
struct Service {
    world: ServiceWorld,
    memory: ServiceMemory,
    intent: Intent,
    inhibited: bool,
}

fn setup(ch: &mut Chooser) -> Service {
    let which = ch.setup(SETUPS.len());
    let ports = if which == 1 {
        Binds::new()
    } else {
        Binds::from([(8080, 30001)])
    };
    let world = ServiceWorld::serving("web-1", ports);
    let memory = ServiceMemory {
        generation: GenerationMemory {
            budget: None,
            verified_started_at: (which != 3).then(|| execution_at(1)),
        },
        withdrawal_pending: which == 2,
    };
    ch.step(|| format!("setup: {}", SETUPS[which]));
    Service {
        world,
        memory,
        intent: Intent::Running,
        inhibited: false,
    }
}

/// One path: the passes, the faults its choices make, the checks.
pub fn run(ch: &mut Chooser, broken: Option<Mutant>) {
    let policy = policy(broken);
    let mut s = setup(ch);
    let mut now = base();
    let mut last = None;
    for pass in 1..=PASSES + TAIL_PASSES {
        if pass > PASSES {
            ch.hush();
        }
        let case = Case {
            policy: policy.clone(),
            input: ServiceInput {
                key: GenerationKey {
                    instance: InstanceName::new("app"),
                    service: ServiceName::new("web"),
                    container: s.world.active.container.clone(),
                },
                active: s.world.active.clone(),
                intent: s.intent,
                inhibition: s.inhibited.then(|| "operator-hold".to_owned()),
                memory: s.memory.clone(),
                proxy: s.world.proxy,
            },
        };
        let world = &mut s.world;
        let mut end = now;
        let report = run_and_check_with(&case, now, |machine, command, at| {
            ch.state(&(machine, &*world));
            let outcome = world.answer(command, ch);
            let at = later(at, STEP);
            ch.step(|| {
                let t = at.as_second() - base().as_second();
                format!("pass {pass}, t+{t}s: {command:?} -> {outcome:?}")
            });
            end = at;
            (outcome, at)
        });
        now = end;
        ch.step(|| {
            format!(
                "pass {pass} ends: {:?}, errors {:?}, memory {:?}",
                report.verdict, report.errors, report.memory
            )
        });
        s.memory = report.memory;
        last = Some(report.verdict);
        between_passes(ch, &mut s, &mut now);
    }
    liveness(&s, last.expect("a pass ran"));
}

/// Time goes on; an operator may toggle the hold or the intent.
fn between_passes(ch: &mut Chooser, s: &mut Service, now: &mut Timestamp) {
    let what = match ch.choose(4) {
        1 => {
            *now = later(*now, SHORT);
            "a short wait"
        }
        2 => {
            s.inhibited = !s.inhibited;
            *now = later(*now, LONG);
            "an operator toggles a hold"
        }
        3 => {
            s.intent = match s.intent {
                Intent::Running => Intent::Stopped,
                Intent::Stopped => Intent::Running,
            };
            *now = later(*now, LONG);
            "an operator toggles the intent"
        }
        _ => {
            *now = later(*now, LONG);
            "a long wait"
        }
    };
    ch.step(|| format!("between passes: {what}"));
}

/// After the fault-free passes (L1, L4, R4, R5, R7).
fn liveness(s: &Service, verdict: Verdict) {
    assert!(
        !s.memory.withdrawal_pending,
        "L4: a withdrawal still pending after {TAIL_PASSES} fault-free passes"
    );
    let w = &s.world;
    match (s.intent, s.inhibited) {
        (Intent::Stopped, _) => {
            assert!(
                matches!(verdict, Verdict::Stopped | Verdict::Gone),
                "R4: {verdict:?}"
            );
            assert!(
                w.gone || w.status != ContainerStatus::Running,
                "R4: a stopped service still runs"
            );
            assert!(!w.routed(), "R4: a stopped service still routed");
        }
        (Intent::Running, true) => {
            assert_eq!(verdict, Verdict::Inhibited, "R5");
            assert!(!w.routed(), "R5: an inhibited service still routed");
        }
        (Intent::Running, false) if w.gone => {
            assert_eq!(verdict, Verdict::Gone, "R7: a removed container is gone");
            assert!(!w.routed(), "R7: a removed container still routed");
        }
        (Intent::Running, false) => {
            assert!(
                matches!(verdict, Verdict::Verified { started_at, .. } if started_at == w.started_at()),
                "L1: not verified after {TAIL_PASSES} fault-free passes: {verdict:?}, world {w:?}"
            );
            assert_eq!(w.status, ContainerStatus::Running, "L1: not running");
            assert!(
                w.binds.is_empty() || w.routed(),
                "L1: verified but not routed: {w:?}"
            );
            assert_eq!(
                w.active.verified_started_at,
                w.started_at(),
                "R17: the routed execution is not ACTIVE's"
            );
        }
    }
}
