//! One instance's pass with two services and a retirement-pending
//! marker, explored exhaustively over consecutive passes: every answer of
//! every port (each service's own, the successor's final inspection, the
//! proxy's routes read back, the predecessor's stop and removal, the
//! store's claims and markers, a stale route's withdrawal, a revert's
//! steps), a proxy that loses its routes, and the lease lost before any
//! effect (the pass abandoned, as the driver does).
//!
//! The instance: `web` (ACTIVE names `web-2`; its predecessor `web-1`
//! still runs under a `retirement-pending` marker), `api` (ACTIVE names
//! `api-2`), and a route the proxy still holds for `worker`, which ACTIVE
//! no longer has. The setups: the marker plain, or carrying a way back
//! that still holds (#40: the successor bakes; a failure reverts), or two
//! plain markers on `web` (`web-0` too: each retired on a look of its own
//! at the successor, which may restart between the two).
//!
//! Safety: the pass checker of `pass.rs` ([`run_pass_and_check_with`])
//! after every step, and the recovery rules through the services' worlds.
//! Liveness, after [`TAIL_PASSES`] fault-free passes (unless a pass
//! reverted, which hands the instance to the next upgrade or operator): a
//! verified successor retired its predecessor and the marker is gone
//! (L3), the stale route is withdrawn, each service is verified and
//! routed (L1).

use std::collections::BTreeMap;
use std::time::Duration;

use stead::core::bake::RevertStep;
use stead::core::broken::Mutant;
use stead::core::errors::{StoreError, TrafficError};
use stead::core::fleet::add;
use stead::core::memory::InstanceMemory;
use stead::core::pass::{Abandon, InstanceAnswer, InstanceCommand, InstanceReport, PassInput};
use stead::core::recovery::{GenerationMemory, ProxyView, ServiceMemory, Verdict};
use stead::core::traffic::HeldRoutes;
use stead::core::types::{
    ActiveRecord, ContainerId, ContainerStatus, GenerationKey, Inhibition, InhibitionReason,
    InstanceName, Intent, Observation, RevertTo, RuntimeError, ServiceKey, ServiceName, Timestamp,
};

use super::recovery::{execution_at, policy, ServiceWorld};
use super::Chooser;
use crate::machine::base;
use crate::model::later;
use crate::pass::{run_pass_and_check_with, Drive, PassCase};

/// Passes on which faults are on offer.
pub const PASSES: usize = 3;
/// Fault-free passes after them, before the liveness properties.
pub const TAIL_PASSES: usize = 4;
/// Time between passes.
const BETWEEN: Duration = Duration::from_secs(150);

/// The initial configurations, each explored in full.
pub const SETUPS: [&str; 4] = [
    "web-1 pending retirement behind web-2",
    "web-1 kept while web-2 bakes (a way back)",
    "web-1 kept while web-2, a stop-first service, bakes",
    "web-0 and web-1 both pending retirement behind web-2",
];

/// A predecessor's container.
#[derive(Clone, Debug, Default)]
struct Predecessor {
    stopped: bool,
    removed: bool,
}

/// The instance as the world holds it. Every map in it is ordered.
#[derive(Clone, Debug)]
struct Instance {
    services: BTreeMap<ServiceName, ServiceWorld>,
    predecessors: BTreeMap<ContainerId, Predecessor>,
    inhibitions: Vec<Inhibition>,
    /// The proxy still routes `worker`, which ACTIVE no longer has.
    stale_route: bool,
    memory: InstanceMemory,
    halted: bool,
}

fn web() -> ServiceName {
    ServiceName::new("web")
}

fn instance() -> InstanceName {
    InstanceName::new("app")
}

fn setup(ch: &mut Chooser, now: Timestamp) -> Instance {
    let which = ch.setup(SETUPS.len());
    ch.step(|| format!("setup: {}", SETUPS[which]));
    let mut services = BTreeMap::new();
    let mut memory = InstanceMemory::default();
    for (name, port) in [("web", 30001), ("api", 30002)] {
        let world = ServiceWorld::serving(&format!("{name}-2"), [(8080, port)].into());
        let key = GenerationKey {
            instance: instance(),
            service: ServiceName::new(name),
            container: world.active.container.clone(),
        };
        let remembered = ServiceMemory {
            generation: GenerationMemory {
                budget: None,
                verified_started_at: Some(execution_at(1)),
            },
            withdrawal_pending: false,
        };
        memory.put(&key, &remembered);
        services.insert(ServiceName::new(name), world);
    }
    let marker = |container: &str| Inhibition {
        service: web(),
        container: ContainerId::new(container),
        reason: InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: now,
        stop_grace: None,
        revert_to: (which > 0)
            .then(|| RevertTo {
                revision: "r0".into(),
                binds: [(8080, 30003)].into(),
                version: "1".into(),
                spec_digest: None,
                until: add(now, Duration::from_secs(3600)),
                hold: None,
                stop_first: which == 2,
                undone: false,
            })
            .filter(|_| which < 3),
    };
    let marked: &[&str] = if which == 3 {
        &["web-0", "web-1"]
    } else {
        &["web-1"]
    };
    Instance {
        services,
        predecessors: marked
            .iter()
            .map(|c| (ContainerId::new(*c), Predecessor::default()))
            .collect(),
        inhibitions: marked.iter().map(|c| marker(c)).collect(),
        stale_route: true,
        memory,
        halted: false,
    }
}

impl Instance {
    fn input(&self, intent: Intent, now: Timestamp) -> PassInput {
        let mut active = ActiveRecord::default();
        let mut held = HeldRoutes::new();
        for (name, world) in &self.services {
            active.services.insert(name.clone(), world.active.clone());
            if let ProxyView::Dials(port) = world.proxy {
                held.insert(self.key(name), port);
            }
        }
        if self.stale_route {
            held.insert(self.key(&ServiceName::new("worker")), 30009);
        }
        PassInput {
            instance: instance(),
            intent,
            active,
            inhibitions: self.inhibitions.clone(),
            held: Some(held),
            memory: self.memory.clone(),
            service_type: "app".into(),
            now,
        }
    }

    fn key(&self, service: &ServiceName) -> ServiceKey {
        ServiceKey {
            instance: instance(),
            service: service.clone(),
        }
    }

    fn successor(&mut self, id: &ContainerId) -> &mut ServiceWorld {
        self.services
            .values_mut()
            .find(|w| &w.active.container == id)
            .expect("a successor ACTIVE names")
    }

    fn routes(&mut self, ch: &mut Chooser) -> Result<HeldRoutes, TrafficError> {
        // 0 truth; 1 unreachable; 2 the proxy lost every route (a
        // restart without its config).
        match ch.choose(3) {
            1 => return Err(TrafficError::Unreachable("proxy unavailable".into())),
            2 => {
                for world in self.services.values_mut() {
                    world.proxy = ProxyView::Absent;
                }
                self.stale_route = false;
            }
            _ => {}
        }
        let mut routes = HeldRoutes::new();
        for (name, world) in &self.services {
            if let ProxyView::Dials(port) = world.proxy {
                routes.insert(self.key(name), port);
            }
        }
        if self.stale_route {
            routes.insert(self.key(&ServiceName::new("worker")), 30009);
        }
        Ok(routes)
    }

    fn predecessor(&self, id: &ContainerId) -> Result<Observation, RuntimeError> {
        let predecessor = &self.predecessors[id];
        if predecessor.removed {
            return Err(RuntimeError::NotFound);
        }
        Ok(Observation {
            status: if predecessor.stopped {
                ContainerStatus::Exited
            } else {
                ContainerStatus::Running
            },
            started_at: Some(execution_at(0)),
            exit: None,
        })
    }

    /// The answer to `command`: the truth, or one of the faults on offer.
    fn answer(&mut self, command: &InstanceCommand, ch: &mut Chooser) -> InstanceAnswer {
        let fails = |ch: &mut Chooser| ch.choose(2) == 1;
        let store = |ch: &mut Chooser| {
            if fails(ch) {
                Err(StoreError::Unavailable("store down".into()))
            } else {
                Ok(())
            }
        };
        let runtime = |ch: &mut Chooser, gone: bool| {
            if gone {
                Err(RuntimeError::NotFound)
            } else if fails(ch) {
                Err(RuntimeError::Transient("timeout".into()))
            } else {
                Ok(())
            }
        };
        match command {
            InstanceCommand::Service { key, command } => {
                let world = self.services.get_mut(&key.service).expect("a service");
                InstanceAnswer::Service(world.answer(command, ch))
            }
            InstanceCommand::InspectSuccessor(id) => {
                let world = self.successor(id);
                let seen = world.observation();
                InstanceAnswer::SuccessorInspected(match ch.choose(4) {
                    1 => Err(RuntimeError::Transient("timeout".into())),
                    2 => {
                        world.status = ContainerStatus::Exited;
                        world.observation()
                    }
                    3 => {
                        world.execution += 1;
                        world.observation()
                    }
                    _ => seen,
                })
            }
            InstanceCommand::InspectPredecessor(id) => {
                InstanceAnswer::PredecessorInspected(if fails(ch) {
                    Err(RuntimeError::Transient("timeout".into()))
                } else {
                    self.predecessor(id)
                })
            }
            InstanceCommand::ReadRoutes => InstanceAnswer::RoutesRead(self.routes(ch)),
            InstanceCommand::StopPredecessor { generation, .. } => {
                let predecessor = self.predecessors.get_mut(&generation.container);
                let predecessor = predecessor.expect("a marked predecessor");
                let r = runtime(ch, predecessor.removed);
                predecessor.stopped |= r.is_ok();
                InstanceAnswer::PredecessorStopped(r)
            }
            InstanceCommand::RemovePredecessor(generation) => {
                // Removing what is gone is done (the runtimes' contract,
                // as the in-memory runtime and the Docker adapter keep it).
                let r = runtime(ch, false);
                let predecessor = self.predecessors.get_mut(&generation.container);
                predecessor.expect("a marked predecessor").removed |= r.is_ok();
                InstanceAnswer::PredecessorRemoved(r)
            }
            InstanceCommand::ReleaseClaims(_) => InstanceAnswer::ClaimsReleased(store(ch)),
            InstanceCommand::ClearMarker(generation) => {
                let r = store(ch);
                if r.is_ok() {
                    self.inhibitions.retain(|m| {
                        !(m.service == generation.service && m.container == generation.container)
                    });
                }
                InstanceAnswer::MarkerCleared(r)
            }
            InstanceCommand::WithdrawStale(_) => {
                let r = if fails(ch) {
                    Err(TrafficError::Rejected("proxy 500".into()))
                } else {
                    self.stale_route = false;
                    Ok(())
                };
                InstanceAnswer::StaleWithdrawn(r)
            }
            InstanceCommand::Revert { step, .. } => {
                let r = store(ch);
                if r.is_ok() && matches!(**step, RevertStep::HaltRollout { .. }) {
                    self.halted = true;
                }
                InstanceAnswer::Reverted(r.map_err(Into::into))
            }
        }
    }
}

/// One path: the passes, the faults its choices make, the checks.
pub fn run(ch: &mut Chooser, broken: Option<Mutant>) {
    let policy = policy(broken);
    let mut now = base();
    let mut world = setup(ch, now);
    let mut last = None;
    for n in 1..=PASSES + TAIL_PASSES {
        if n > PASSES {
            ch.hush();
        }
        let case = PassCase {
            policy: policy.clone(),
            input: world.input(Intent::Running, now),
        };
        let at = now;
        // The pass machine's own rendering is large (its policy, memory and
        // indexes) and hashing it at every step took 95% of the time: a
        // state here is the pass's input, then each pair of the world (its
        // containers, routes, ACTIVE and how many markers) and the command.
        ch.state(&case.input);
        let (report, reverted) = run_pass_and_check_with(&case, |_, command| {
            ch.state(&(
                &world.services,
                &world.predecessors,
                world.inhibitions.len(),
                world.stale_route,
                command,
            ));
            if command.is_outside_effect() && ch.choose(2) == 1 {
                ch.step(|| format!("pass {n}: {command:?}: the lease is lost; abandoned"));
                return Drive::Abandon(Abandon::MandateLost);
            }
            let answer = world.answer(command, ch);
            ch.step(|| format!("pass {n}, {at}: {command:?} -> {answer:?}"));
            Drive::Answer(answer)
        });
        ch.step(|| {
            format!(
                "pass {n} ends: verdicts {:?}, retired {:?}, errors {:?}",
                report
                    .reports
                    .iter()
                    .map(|r| &r.verdict)
                    .collect::<Vec<_>>(),
                report.retired,
                report.errors
            )
        });
        world.memory = report.memory.clone();
        if reverted {
            // The instance is back on its predecessor's record, the type
            // halted: what follows is the next pass's, from state this
            // world does not model. The revert itself was checked.
            assert!(
                world.halted || ch.faults() > 0,
                "a revert that halted nothing"
            );
            return;
        }
        last = Some(report);
        now = later(now, BETWEEN);
    }
    liveness(&world, &last.expect("a pass ran"));
}

/// After the fault-free passes (L1, L3, T5).
fn liveness(world: &Instance, report: &InstanceReport) {
    for r in &report.reports {
        let w = &world.services[&r.key.service];
        if w.gone {
            continue;
        }
        assert!(
            matches!(r.verdict, Verdict::Verified { started_at, .. } if started_at == w.started_at()),
            "L1: {} not verified after {TAIL_PASSES} fault-free passes: {:?}",
            r.key.service,
            r.verdict
        );
        assert!(w.routed(), "L1: {} not routed: {w:?}", r.key.service);
    }
    let baking = world.inhibitions.iter().any(|m| m.revert_to.is_some());
    if !baking && !world.services[&web()].gone {
        assert!(
            world.inhibitions.is_empty(),
            "L3: the marker is still there after {TAIL_PASSES} fault-free passes: {:?}",
            world.inhibitions
        );
        for (id, predecessor) in &world.predecessors {
            assert!(
                predecessor.removed,
                "L3: a verified successor did not retire its predecessor {id}"
            );
        }
    }
    assert!(!world.stale_route, "T5: the stale route is still held");
}
