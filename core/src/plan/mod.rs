//! The four checks of the control loop (docs/rules.md C5–C8) as pure planners.
//!
//! A planner reads a [`Snapshot`] — instances, active tasks, live releases,
//! catalog, rollout switches, `now` and the [`ControlConfig`] — and returns a
//! [`Plan`]: [`Decision`]s for the engine to carry out through the `Store`,
//! and [`Report`]s for it to log. Planners never act, never read a clock and
//! never fail; bad data of one instance becomes a report about that
//! instance and the others are planned as usual.
//!
//! **Idempotence.** Planning again on a snapshot that already contains the
//! effects of a plan's decisions (the testkit's `apply_as_store`, the store's
//! stand-in) yields no decision.
//! Reports are not decisions: an orphan release is reported by every plan
//! while it lasts; the engine logs a report when it appears and when it is
//! gone, not every tick.
//!
//! How the engine carries out a decision:
//!
//! | decision | store call |
//! | --- | --- |
//! | [`Decision::Enqueue`] | `enqueue(task, now, fence)` (the database refuses a second active task per instance and kind) |
//! | [`Decision::Expire`] | `expire_instance(instance, from, task, now, fence)` (compare-and-set plus insert, one transaction) |
//! | [`Decision::RequeueExpiredLease`] | one `reset_expired_leases(now, config.lease, fence)` per tick, which applies the same rule |
//! | [`Decision::Notify`] | `Notifier`; a failure is logged and never aborts the tick |
//! | [`Decision::HaltRollout`] | `set_rollout(service_type, Halted, reason, now)` |

mod config;
mod drift;
mod forecast;
mod lease;
mod rollout;
mod ttl;

use std::collections::{BTreeMap, BTreeSet};

pub use config::{ConfigError, ControlConfig, RawControlConfig};
pub use forecast::{forecast, Forecast, Left, Outage, Round, Upgrade};
pub use lease::task_lease;
pub use rollout::{
    halt_after_failed_upgrade, is_behind, is_older, spec_changed, upgrade_retry, UpgradeRetry,
    PINNED_REASON, UNDO_REASON,
};

use super::catalog::{Catalog, CatalogEntry};
use super::fleet::{
    Instance, InstanceId, InstanceState, NewTask, Release, RolloutState, Task, TaskId, TaskKind,
    TaskState,
};
use super::hash::{FastMap, FastSet};
use super::types::{InstanceName, ServiceName, Timestamp};
use super::window::WindowError;

/// Everything the planners look at, read once per tick.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub now: Timestamp,
    pub instances: Vec<Instance>,
    /// Instance rows the store could not decode (each logged, none in
    /// `instances`): a live release may be one of theirs, so drift calls
    /// no release an orphan while there are any.
    pub unreadable_instances: usize,
    /// The queued and running tasks. Finished tasks may be present; they
    /// are ignored.
    pub tasks: Vec<Task>,
    /// The provisioner's live releases; `None` when listing them failed this
    /// tick, in which case drift plans nothing rather than mistaking an
    /// unreachable provisioner for a fleet without releases.
    pub releases: Option<Vec<Release>>,
    pub catalog: &'a Catalog,
    /// Rollout switches from the store, per service type; a type without an
    /// entry is active (unless the catalog itself halts it).
    pub rollouts: BTreeMap<String, RolloutState>,
    pub config: &'a ControlConfig,
    /// W3C trace context of the tick; every enqueued task carries it (C9).
    pub traceparent: Option<String>,
    /// Per instance, the services whose ACTIVE container the last recovery
    /// pass confirmed gone (R7: removed by hand, lost with a disk). Drift
    /// reprovisions a ready instance that has any, though its release is
    /// live: the rest of its containers make it look whole.
    pub lost_services: BTreeMap<InstanceName, BTreeSet<ServiceName>>,
    /// The entries operators' undos pinned halted types to (`rollout undo
    /// --to`, #40), as recorded: version drift moves their instances there
    /// instead of to the catalog's version.
    pub pins: BTreeMap<String, CatalogEntry>,
    /// Instances of halted types whose baking markers ask for an undo
    /// (`rollout undo`) that no task carries out yet: version drift gives
    /// each an upgrade task within `max_in_flight`, ahead of any other.
    pub undos: BTreeSet<InstanceId>,
    /// Instances whose upgrade switched and whose successor still bakes
    /// (a `retirement-pending` marker with a way back, its window not
    /// ended; #55): each holds a slot of `max_in_flight` until its bake
    /// ends, so the next wave waits for this one's verdict. `None` when
    /// the markers could not be read this tick: version drift then starts
    /// no upgrade (an unknown bake is not a free slot).
    pub baking: Option<BTreeSet<InstanceId>>,
}

/// What a planner decided: effects for the engine, reports for the log.
#[must_use]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    pub reports: Vec<Report>,
}

/// One effect the engine should carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Insert a task (drift's reprovision, version drift's upgrade).
    Enqueue(NewTask),
    /// Move `instance` from `from` to `deleting` and insert `task` (a
    /// deprovision) in one compare-and-set transaction (C7).
    Expire {
        instance: InstanceId,
        from: InstanceState,
        task: NewTask,
    },
    /// Put a running task whose lease ran out back to `queued`, clearing
    /// `locked_by` and keeping its attempts (C6).
    RequeueExpiredLease {
        task: TaskId,
        locked_by: Option<String>,
        locked_at: Option<Timestamp>,
        attempts: u32,
    },
    /// Tell a human; best-effort.
    Notify(Notice),
    /// Stop a service type's rollout (from [`halt_after_failed_upgrade`]).
    HaltRollout {
        service_type: String,
        reason: String,
    },
}

impl Decision {
    /// Every label [`Decision::label`] gives.
    pub const LABELS: [&'static str; 8] = [
        "enqueue_provision",
        "enqueue_reprovision",
        "enqueue_upgrade",
        "enqueue_deprovision",
        "expire",
        "requeue_expired_lease",
        "notify",
        "halt_rollout",
    ];

    /// A metric label: what kind of decision this is (an enqueue by its
    /// task's kind).
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Enqueue(task) => match task.kind {
                TaskKind::Provision => "enqueue_provision",
                TaskKind::Reprovision => "enqueue_reprovision",
                TaskKind::Upgrade => "enqueue_upgrade",
                TaskKind::Deprovision => "enqueue_deprovision",
            },
            Decision::Expire { .. } => "expire",
            Decision::RequeueExpiredLease { .. } => "requeue_expired_lease",
            Decision::Notify(_) => "notify",
            Decision::HaltRollout { .. } => "halt_rollout",
        }
    }
}

/// A notification about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// A stable event name (`drift.release_missing`).
    pub event: &'static str,
    pub instance: InstanceId,
    pub team: String,
    pub message: String,
}

/// How loudly the engine should log a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// Something worth logging that changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// A live release the database does not know. Never deleted: it might
    /// belong to another team or tool; a human decides (C5).
    OrphanRelease { name: String, namespace: String },
    /// Orphan releases were not judged this tick: `unreadable` instance
    /// rows did not decode, and a live release no readable row names may
    /// be one of theirs. What was last reported of orphans stands.
    OrphansWithheld { unreadable: usize },
    /// An instance's maintenance window did not parse; its upgrade was
    /// skipped this tick and every other instance was planned (C8).
    BadWindow {
        instance: InstanceId,
        name: InstanceName,
        window: String,
        error: WindowError,
    },
    /// A running task without `locked_at` (a row written by another tool).
    /// No lease can be broken early, so it was requeued.
    RunningWithoutLease { task: TaskId },
    /// An instance whose release cannot be located: its type's namespace
    /// template does not render for it. Drift cannot check it.
    BadRelease {
        instance: InstanceId,
        name: InstanceName,
        error: String,
    },
    /// An instance of a service type the catalog does not list; it is
    /// never upgraded.
    UnknownServiceType {
        instance: InstanceId,
        service_type: String,
    },
    /// An instance behind its catalog version whose maintenance window is
    /// closed: its upgrade is enqueued by the first tick inside the window
    /// and until then holds neither a task nor a `max_in_flight` slot (C8).
    WaitsForWindow {
        instance: InstanceId,
        name: InstanceName,
        opens_at: Timestamp,
    },
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OrphanRelease { name, namespace } => write!(
                f,
                "release {name} in {namespace} belongs to no instance stead knows; \
                 it is left alone (C5): remove it by hand if it is not someone else's"
            ),
            Self::OrphansWithheld { unreadable } => write!(
                f,
                "orphan releases not judged: {unreadable} instance row(s) do not decode \
                 (each is logged as a bad row), and a release no readable row names may be \
                 theirs; fix the rows"
            ),
            Self::BadWindow {
                name,
                window,
                error,
                ..
            } => write!(
                f,
                "instance {name}: maintenance window {window:?} does not parse ({error}); \
                 its upgrades are skipped until it is fixed (C8)"
            ),
            Self::BadRelease { name, error, .. } => write!(
                f,
                "instance {name}: its release cannot be located ({error}); drift does not \
                 check it until the catalog is fixed"
            ),
            Self::RunningWithoutLease { task } => write!(
                f,
                "task {task} is running without locked_at (written by another tool); requeued"
            ),
            Self::UnknownServiceType {
                instance,
                service_type,
            } => write!(
                f,
                "instance {instance} has service type {service_type:?}, which the catalog does \
                 not list; it is never upgraded"
            ),
            Self::WaitsForWindow { name, opens_at, .. } => write!(
                f,
                "instance {name}: upgrade waits for its maintenance window, which opens at \
                 {opens_at} (C8)"
            ),
        }
    }
}

impl Report {
    pub fn level(&self) -> Level {
        match self {
            Self::OrphanRelease { .. } | Self::BadRelease { .. } => Level::Error,
            Self::BadWindow { .. }
            | Self::RunningWithoutLease { .. }
            | Self::OrphansWithheld { .. } => Level::Warn,
            Self::UnknownServiceType { .. } => Level::Warn,
            Self::WaitsForWindow { .. } => Level::Info,
        }
    }
}

/// Kinds of queued-or-running tasks of one instance, one bit per kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ActiveKinds(u8);

impl ActiveKinds {
    fn bit(kind: TaskKind) -> u8 {
        1 << (kind as u8)
    }

    fn has(self, kind: TaskKind) -> bool {
        self.0 & Self::bit(kind) != 0
    }

    fn any(self) -> bool {
        self.0 != 0
    }
}

/// The distinct live releases, each with a position so that drift can mark
/// the ones an instance owns in a plain vector.
struct LiveReleases<'s> {
    positions: FastMap<(&'s str, &'s str), usize>,
    distinct: Vec<(&'s str, &'s str)>,
}

impl<'s> LiveReleases<'s> {
    fn new(releases: &'s [Release]) -> Self {
        let mut positions: FastMap<(&str, &str), usize> = FastMap::default();
        positions.reserve(releases.len());
        let mut distinct = Vec::with_capacity(releases.len());
        for release in releases {
            let key = (release.name.as_str(), release.namespace.as_str());
            positions.entry(key).or_insert_with(|| {
                distinct.push(key);
                distinct.len() - 1
            });
        }
        Self {
            positions,
            distinct,
        }
    }

    fn position(&self, name: &str, namespace: &str) -> Option<usize> {
        self.positions.get(&(name, namespace)).copied()
    }

    fn contains(&self, name: &str, namespace: &str) -> bool {
        self.positions.contains_key(&(name, namespace))
    }
}

/// A snapshot with the indexes every planner needs, built once so the four
/// planners together stay linear in the fleet's size.
pub struct Planner<'s, 'a> {
    snapshot: &'s Snapshot<'a>,
    active: FastMap<InstanceId, ActiveKinds>,
    /// Instances with an upgrade queued or running, or baking: what
    /// `max_in_flight` limits.
    in_flight: FastSet<InstanceId>,
    /// Instances this tick's TTL check sends to deletion (T4).
    expiring: FastSet<InstanceId>,
    /// Live releases; `None` when unknown.
    live: Option<LiveReleases<'s>>,
}

impl<'s, 'a> Planner<'s, 'a> {
    pub fn new(snapshot: &'s Snapshot<'a>) -> Self {
        let mut active: FastMap<InstanceId, ActiveKinds> = FastMap::default();
        active.reserve(snapshot.tasks.len());
        for task in snapshot.tasks.iter().filter(|t| t.state.is_active()) {
            active.entry(task.instance).or_default().0 |= ActiveKinds::bit(task.kind);
        }
        // T4: this tick's expiries cancel their instances' queued tasks,
        // upgrades included (and a running one whose lease runs out this
        // tick is queued again first, C6), so a slot such an upgrade holds
        // is free already. Counting it would let the next plan, made on this
        // plan's effects, fill it: planning would not be idempotent.
        let expiring: FastSet<InstanceId> = snapshot
            .instances
            .iter()
            .filter(|i| {
                let kinds = active.get(&i.id).copied().unwrap_or_default();
                ttl_expires(i, snapshot.now, kinds)
            })
            .map(|i| i.id)
            .collect();
        let mut in_flight: FastSet<InstanceId> = snapshot
            .tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Upgrade && t.state.is_active())
            .filter(|t| {
                !expiring.contains(&t.instance)
                    || !(t.state == TaskState::Queued
                        || lease::lease_ran_out(t, snapshot.now, snapshot.config.lease))
            })
            .map(|t| t.instance)
            .collect();
        // A baking instance holds its slot until its bake ends (#55), an
        // undo's task carrying its bake out included, counted once.
        if !crate::broken!(snapshot.config.broken, BakesDoNotHold) {
            in_flight.extend(snapshot.baking.iter().flatten().copied());
        }
        let live = snapshot.releases.as_deref().map(LiveReleases::new);
        Self {
            snapshot,
            active,
            in_flight,
            expiring,
            live,
        }
    }

    fn active_kinds(&self, instance: InstanceId) -> ActiveKinds {
        self.active.get(&instance).copied().unwrap_or_default()
    }

    fn new_task(
        &self,
        kind: TaskKind,
        instance: InstanceId,
        run_after: Timestamp,
        reason: String,
    ) -> NewTask {
        NewTask {
            kind,
            instance,
            run_after,
            reason,
            traceparent: self.snapshot.traceparent.clone(),
        }
    }
}

/// Whether an instance's TTL has run out at `now`.
fn is_expired(instance: &Instance, now: Timestamp) -> bool {
    instance.expires_at.is_some_and(|at| now >= at)
}

/// Whether the TTL check (C7) moves `instance` to `deleting` this tick: it
/// is past its TTL, or already deleting, and no deprovision is queued or
/// running for it.
fn ttl_expires(instance: &Instance, now: Timestamp, kinds: ActiveKinds) -> bool {
    instance.state != InstanceState::Deleted
        && (instance.state == InstanceState::Deleting || is_expired(instance, now))
        && !kinds.has(TaskKind::Deprovision)
}
