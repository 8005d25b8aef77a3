//! What a catalog would do to the fleet, told before it is loaded
//! (`stead plan`, #55): the real version-drift planner, run again and
//! again over a copy of the snapshot whose clock jumps from one event to
//! the next (a bake's end, a window's opening), each wave's upgrades taken
//! as done.
//!
//! A forecast assumes the best of every upgrade: it succeeds at once and
//! its bake holds. It is therefore the fastest the rollout can go, the
//! order it goes in and where it stops (a halted type, a closed window,
//! an instance that is not ready); a failed bake halts the type at its
//! first wave instead.

use std::collections::BTreeMap;
use std::time::Duration;

use super::rollout::away_from;
use super::{Decision, Planner, Report, Snapshot};
use crate::catalog::CatalogEntry;
use crate::fleet::{Instance, InstanceId, InstanceState, RolloutState, TaskKind};
use crate::hash::{FastMap, FastSet};
use crate::spec::{ReadinessProbe, UpdateStrategy};
use crate::types::{InstanceName, ServiceName, Timestamp};

/// Most planning rounds of one forecast: each upgrades at least one
/// instance or waits for an event, so a fleet needs far fewer.
const ROUNDS_MAX: usize = 10_000;

/// Per service type, its waves so far and the planning round of the last.
type Waves = BTreeMap<String, (u32, usize)>;

/// What a catalog would do to the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forecast {
    /// The instant the forecast starts from (the snapshot's `now`).
    pub from: Timestamp,
    /// Instances with an upgrade queued or running, or whose successor
    /// still bakes, at the start: each holds a slot until it is done.
    pub in_flight: Vec<InstanceName>,
    /// The rounds that start upgrades, in time order.
    pub rounds: Vec<Round>,
    /// Instances away from their target that the forecast never upgrades,
    /// each with why.
    pub left: Vec<Left>,
    /// The forecast stopped at its horizon with upgrades still to come.
    pub horizon_reached: bool,
}

/// Upgrades that start at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    pub at: Timestamp,
    pub upgrades: Vec<Upgrade>,
}

/// One instance's upgrade, as version drift would enqueue it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    pub name: InstanceName,
    pub service_type: String,
    /// Which wave of its type this is: 1 for the type's first upgrade.
    pub wave: u32,
    pub from: String,
    pub to: String,
    /// The task's reason (a newer version, a changed spec, a pin).
    pub reason: String,
    /// The services replaced `stop-first`, each down from its
    /// predecessor's stop until its successor is verified.
    pub outages: Vec<Outage>,
}

/// A `stop-first` service's outage during its upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    pub service: ServiceName,
    /// The longest it may last besides pulling and starting the image:
    /// the predecessor's stop grace and the readiness probe's longest wait.
    pub at_most: Duration,
}

/// An instance the forecast leaves where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Left {
    pub name: InstanceName,
    pub service_type: String,
    pub why: String,
}

impl ReadinessProbe {
    /// The longest a probe waits before it gives up: every attempt timing
    /// out, with its interval between attempts.
    pub fn longest_wait(&self) -> Duration {
        match self {
            Self::None => Duration::ZERO,
            Self::Http {
                timeout,
                interval,
                attempts_max,
                ..
            }
            | Self::Tcp {
                timeout,
                interval,
                attempts_max,
                ..
            } => {
                let attempts = *attempts_max;
                *timeout * attempts + *interval * attempts.saturating_sub(1)
            }
            Self::Log { timeout, .. } => *timeout,
        }
    }
}

/// The forecast of `snapshot` (its catalog the one to judge) up to
/// `horizon` after its `now`.
pub fn forecast(snapshot: &Snapshot, horizon: Duration) -> Forecast {
    let start = snapshot.now;
    let end = start
        .checked_add(jiff::SignedDuration::try_from(horizon).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    let mut world = snapshot.clone();
    // Baking instances whose bake ends when, as far as the forecast knows:
    // a bake already under way ends at most one bake from now.
    let mut bakes: BTreeMap<InstanceId, Timestamp> = BTreeMap::new();
    let mut waves = Waves::new();
    let mut out = Forecast {
        from: start,
        in_flight: in_flight_at_start(snapshot),
        rounds: Vec::new(),
        left: Vec::new(),
        horizon_reached: false,
    };
    let mut reports = Vec::new();
    for round in 0..ROUNDS_MAX {
        let plan = Planner::new(&world).version_drift();
        let started: Vec<InstanceId> = plan
            .decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Enqueue(task) if task.kind == TaskKind::Upgrade => Some(task.instance),
                _ => None,
            })
            .collect();
        let opening = plan
            .reports
            .iter()
            .filter_map(|r| match r {
                Report::WaitsForWindow { opens_at, .. } => Some(*opens_at),
                _ => None,
            })
            .min();
        reports = plan.reports;
        let reasons: BTreeMap<InstanceId, String> = plan
            .decisions
            .into_iter()
            .filter_map(|d| match d {
                Decision::Enqueue(task) => Some((task.instance, task.reason)),
                _ => None,
            })
            .collect();
        if round == 0 && settle_start(&mut world, &mut bakes) && started.is_empty() {
            // What was in flight is done (or bakes): plan again at once.
            continue;
        }
        if !started.is_empty() {
            let by_id: FastMap<InstanceId, &Instance> =
                world.instances.iter().map(|i| (i.id, i)).collect();
            let upgrades = started
                .iter()
                .filter_map(|id| upgrade(&world, by_id.get(id)?, &reasons, &mut waves, round))
                .collect();
            out.rounds.push(Round {
                at: world.now,
                upgrades,
            });
            finish(&mut world, &started, &mut bakes);
            world.undos.clear();
            if bakes.is_empty() {
                // Nothing bakes: the next wave may start at once.
                continue;
            }
        }
        let next = bakes.values().copied().chain(opening).min();
        match next {
            Some(at) if at > end => {
                out.horizon_reached = true;
                break;
            }
            Some(at) => {
                world.now = at.max(world.now);
                bakes.retain(|_, ends| *ends > world.now);
                world.baking = Some(bakes.keys().copied().collect());
            }
            None => break,
        }
    }
    out.left = left_behind(&world, &reports, out.horizon_reached);
    out
}

/// The instances holding a slot when the forecast starts.
fn in_flight_at_start(snapshot: &Snapshot) -> Vec<InstanceName> {
    let busy: std::collections::BTreeSet<InstanceId> = snapshot
        .tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Upgrade && t.state.is_active())
        .map(|t| t.instance)
        .chain(snapshot.baking.iter().flatten().copied())
        .collect();
    snapshot
        .instances
        .iter()
        .filter(|i| busy.contains(&i.id))
        .map(|i| i.name.clone())
        .collect()
}

/// After the first round: the upgrades in flight finish and bake (a
/// queued upgrade runs toward the catalog it finds, this one), and every
/// other task is taken as done (a deprovision's instance is gone).
/// Whether there was anything to settle.
fn settle_start(world: &mut Snapshot, bakes: &mut BTreeMap<InstanceId, Timestamp>) -> bool {
    let tasks = std::mem::take(&mut world.tasks);
    let busy = tasks.iter().any(|t| t.state.is_active())
        || world.baking.as_ref().is_some_and(|b| !b.is_empty());
    let active = || tasks.iter().filter(|t| t.state.is_active());
    let gone: FastSet<InstanceId> = active()
        .filter(|t| t.kind == TaskKind::Deprovision)
        .map(|t| t.instance)
        .collect();
    world.instances.retain(|i| !gone.contains(&i.id));
    let upgraded: Vec<InstanceId> = active()
        .filter(|t| t.kind == TaskKind::Upgrade)
        .map(|t| t.instance)
        .collect();
    finish(world, &upgraded, bakes);
    let still: FastSet<InstanceId> = world.baking.iter().flatten().copied().collect();
    for instance in world.instances.iter().filter(|i| still.contains(&i.id)) {
        let ends = bake_end(world, instance);
        bakes.entry(instance.id).or_insert(ends);
    }
    world.baking = Some(bakes.keys().copied().collect());
    busy
}

/// The entry an instance of `service_type` rolls toward: an undo's pin,
/// or the catalog's.
fn target<'a>(world: &'a Snapshot, service_type: &str) -> Option<&'a CatalogEntry> {
    world
        .pins
        .get(service_type)
        .or_else(|| world.catalog.get(service_type))
}

/// When a bake that starts now ends, for an instance of its type.
fn bake_end(world: &Snapshot, instance: &Instance) -> Timestamp {
    let bake = target(world, &instance.service_type).map_or(Duration::ZERO, |entry| entry.bake);
    world
        .now
        .checked_add(jiff::SignedDuration::try_from(bake).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// Upgrades done: each instance runs its target and bakes. One walk over
/// the fleet, however many finish.
fn finish(world: &mut Snapshot, ids: &[InstanceId], bakes: &mut BTreeMap<InstanceId, Timestamp>) {
    if ids.is_empty() {
        return;
    }
    let ids: FastSet<InstanceId> = ids.iter().copied().collect();
    // Each one's target and bake end, read before the fleet is changed.
    let mut ended = Vec::with_capacity(ids.len());
    let mut runs: FastMap<InstanceId, (String, String)> = FastMap::default();
    for instance in world.instances.iter().filter(|i| ids.contains(&i.id)) {
        ended.push((instance.id, bake_end(world, instance)));
        if let Some(entry) = target(world, &instance.service_type) {
            runs.insert(
                instance.id,
                (entry.version.clone(), entry.spec_digest.clone()),
            );
        }
    }
    for instance in world.instances.iter_mut() {
        if let Some((version, digest)) = runs.remove(&instance.id) {
            instance.version = version;
            instance.spec_digest = Some(digest);
            instance.state = InstanceState::Ready;
        }
    }
    for (id, ends) in ended {
        if ends > world.now {
            bakes.insert(id, ends);
        } else {
            bakes.remove(&id);
        }
    }
    world.baking = Some(bakes.keys().copied().collect());
}

/// How `id`'s upgrade in this round looks.
fn upgrade(
    world: &Snapshot,
    instance: &Instance,
    reasons: &BTreeMap<InstanceId, String>,
    waves: &mut Waves,
    round: usize,
) -> Option<Upgrade> {
    let id = instance.id;
    let entry = target(world, &instance.service_type)?;
    Some(Upgrade {
        name: instance.name.clone(),
        service_type: instance.service_type.clone(),
        wave: wave_of(waves, &instance.service_type, round),
        from: instance.version.clone(),
        to: entry.version.clone(),
        reason: reasons.get(&id).cloned().unwrap_or_default(),
        outages: entry
            .services
            .iter()
            .filter(|s| s.update == UpdateStrategy::StopFirst)
            .map(|s| Outage {
                service: s.name.clone(),
                at_most: s.stop_grace + s.readiness.longest_wait(),
            })
            .collect(),
    })
}

/// The wave number of a type's upgrade in planning round `round`: one
/// more than the type's last wave, unless that wave is this round's.
fn wave_of(waves: &mut Waves, service_type: &str, round: usize) -> u32 {
    let (count, last) = waves
        .entry(service_type.to_owned())
        .or_insert((0, usize::MAX));
    if *last != round {
        *count += 1;
        *last = round;
    }
    *count
}

/// Whether `instance` is away from the entry its type rolls toward.
fn away(world: &Snapshot, instance: &Instance) -> bool {
    let pinned = world.pins.contains_key(&instance.service_type);
    target(world, &instance.service_type).is_some_and(|entry| away_from(instance, entry, pinned))
}

/// The instances still away from their target when the forecast ends,
/// and why version drift leaves them there.
fn left_behind(world: &Snapshot, reports: &[Report], horizon_reached: bool) -> Vec<Left> {
    let mut left = Vec::new();
    for instance in &world.instances {
        let why = match reports.iter().find_map(|r| report_about(r, instance.id)) {
            Some(why) => why,
            None if world.catalog.get(&instance.service_type).is_none() => continue,
            None if !away(world, instance) => continue,
            None => why_left(world, instance, horizon_reached),
        };
        left.push(Left {
            name: instance.name.clone(),
            service_type: instance.service_type.clone(),
            why,
        });
    }
    left
}

fn report_about(report: &Report, id: InstanceId) -> Option<String> {
    match report {
        Report::BadWindow {
            instance, error, ..
        } if *instance == id => Some(format!("its maintenance window does not parse ({error})")),
        Report::UnknownServiceType {
            instance,
            service_type,
        } if *instance == id => Some(format!("the catalog has no service type {service_type:?}")),
        Report::WaitsForWindow {
            instance, opens_at, ..
        } if *instance == id => Some(format!(
            "its maintenance window opens at {opens_at}, past the forecast's end"
        )),
        _ => None,
    }
}

fn why_left(world: &Snapshot, instance: &Instance, horizon_reached: bool) -> String {
    let halted = world.catalog.get(&instance.service_type).is_some_and(|e| {
        e.rollout == RolloutState::Halted
            || world.rollouts.get(&e.service_type) == Some(&RolloutState::Halted)
    });
    if halted && !world.pins.contains_key(&instance.service_type) {
        format!(
            "the rollout of {} is halted (`stead rollout resume {}`)",
            instance.service_type, instance.service_type
        )
    } else if instance.expires_at.is_some_and(|at| at <= world.now) {
        "its TTL ends before its turn".to_owned()
    } else if instance.stopped {
        "it is stopped: it is upgraded once started".to_owned()
    } else if instance.state != InstanceState::Ready {
        format!("it is {}, not ready", instance.state)
    } else if horizon_reached {
        "its turn comes after the forecast's end".to_owned()
    } else {
        "version drift does not upgrade it: its release is missing, or a task of it runs first"
            .to_owned()
    }
}
