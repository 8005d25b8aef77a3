//! C8: version drift, one rollout per catalog service type.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::{is_expired, Decision, FastMap, Plan, Planner, Report};
use crate::catalog::CatalogEntry;
use crate::fleet::{
    Instance, InstanceId, InstanceState, RetryDecision, RolloutState, Task, TaskKind,
};
use crate::types::Timestamp;
use crate::window::{next_run_after, Window, WindowError, WINDOW_SPEC_LEN_MAX};

/// The reason of the upgrade task that carries an operator's `rollout
/// undo` out (`core::undo`).
pub const UNDO_REASON: &str = "operator: rollout undo";

/// Most dot-separated components compared in a version; longer versions
/// compare as opaque strings.
const VERSION_COMPONENTS_MAX: usize = 8;

/// Compares two versions made of dot-separated unsigned numbers (an
/// optional leading `v`, missing components count as zero). `None` when
/// either is not of that shape.
fn compare_numeric(a: &str, b: &str) -> Option<Ordering> {
    let parts = |v: &str| {
        let v = v.strip_prefix('v').unwrap_or(v);
        let mut out = [0u64; VERSION_COMPONENTS_MAX];
        for (n, part) in v.split('.').enumerate() {
            if n == VERSION_COMPONENTS_MAX || part.is_empty() {
                return None;
            }
            out[n] = part.parse().ok()?;
        }
        Some(out)
    };
    Some(parts(a)?.cmp(&parts(b)?))
}

/// Whether an instance at `current` should be upgraded to `target`. Numeric
/// versions (`1.10.2`) compare numerically, so an instance ahead of the
/// catalog is never downgraded; any other version is behind whenever it
/// differs from the catalog's, which stays the authority.
pub fn is_behind(current: &str, target: &str) -> bool {
    match compare_numeric(current, target) {
        Some(order) => order == Ordering::Less,
        None => current != target,
    }
}

/// Whether `a` is an older version than `b` for certain: both numeric and
/// `a` below. A worker whose catalog is older than what an instance runs
/// must not install its version over it (that would be a downgrade, or an
/// older release under a newer version's name). Versions that are not
/// numeric are never older: the catalog is the authority for them.
pub fn is_older(a: &str, b: &str) -> bool {
    compare_numeric(a, b) == Some(Ordering::Less)
}

/// Whether an instance at the catalog's version runs another spec than the
/// catalog's (its recorded digest differs): a change of spec is an upgrade
/// like any other. An instance with no recorded digest (a row from before
/// stead recorded them) counts as current until the next version.
pub fn spec_changed(instance: &Instance, entry: &CatalogEntry) -> bool {
    instance.version == entry.version
        && instance
            .spec_digest
            .as_deref()
            .is_some_and(|digest| digest != entry.spec_digest)
}

/// Whether `instance` is away from `entry`, what its type rolls toward:
/// toward an undo's pin (`pinned`) any other version, older ones included;
/// else an older version or, at the same one, another spec.
pub(super) fn away_from(instance: &Instance, entry: &CatalogEntry, pinned: bool) -> bool {
    if pinned {
        instance.version != entry.version
    } else {
        is_behind(&instance.version, &entry.version) || spec_changed(instance, entry)
    }
}

/// C8's order: the configured own team first, then by service type, name
/// and id.
fn order<'i>(instance: &'i Instance, own_team: &str) -> (bool, &'i str, &'i str, InstanceId) {
    (
        instance.team != own_team,
        &instance.service_type,
        instance.name.as_str(),
        instance.id,
    )
}

/// What becomes of a failed upgrade that has attempts left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpgradeRetry {
    /// Queued again, due at this instant: the backoff's end.
    At(Timestamp),
    /// The backoff ends outside the instance's maintenance window: the
    /// task ends instead of parking in the queue until `opens_at` (#55),
    /// where it would hold its instance's task slot and one of
    /// `max_in_flight`'s, so that every other upgrade of the fleet,
    /// security releases included, waited behind it for up to a week.
    /// Version drift queues the upgrade again inside the window's next
    /// opening, toward whatever the catalog says then.
    Deferred { opens_at: Timestamp },
}

/// When a failed upgrade runs again, given when its backoff ends: like its
/// first run, only inside the instance's maintenance window unless the
/// catalog entry is a security release (C8). Without a window, for a
/// security release, or with a window that no longer parses (the planner
/// reports that one), at the backoff's end; a backoff that ends outside
/// the window defers the upgrade to the window's next opening, holding
/// nothing meanwhile.
pub fn upgrade_retry(backoff_ends: Timestamp, instance: &Instance, security: bool) -> UpgradeRetry {
    let (Some(spec), false) = (&instance.maintenance_window, security) else {
        return UpgradeRetry::At(backoff_ends);
    };
    match Window::parse(spec) {
        Ok(window) => {
            let opens_at = next_run_after(&window, backoff_ends);
            if opens_at == backoff_ends {
                UpgradeRetry::At(backoff_ends)
            } else {
                UpgradeRetry::Deferred { opens_at }
            }
        }
        Err(_) => UpgradeRetry::At(backoff_ends),
    }
}

/// The worker's rule for a failed upgrade: once the task is out of
/// attempts, halt its service type's rollout so a bad version stops after
/// one tenant. `None` for other tasks or while retries remain.
pub fn halt_after_failed_upgrade(
    task: &Task,
    instance: &Instance,
    retry: RetryDecision,
) -> Option<Decision> {
    if task.kind != TaskKind::Upgrade || retry != RetryDecision::Fail {
        return None;
    }
    Some(Decision::HaltRollout {
        service_type: instance.service_type.clone(),
        reason: format!(
            "upgrade of {} to the catalog version failed after {} attempts: {}",
            instance.name,
            task.attempts,
            task.last_error.as_deref().unwrap_or("no error recorded")
        ),
    })
}

impl<'s> Planner<'s, '_> {
    fn halted(&self, entry: &CatalogEntry) -> bool {
        entry.rollout == RolloutState::Halted
            || self.snapshot.rollouts.get(&entry.service_type) == Some(&RolloutState::Halted)
    }

    /// Whether `instance` may be upgraded now, apart from the fleet limit
    /// and the rollout switch. Cheap checks first: this runs per instance.
    /// Toward a pin, any other version is to move, older ones included.
    fn upgradable(&self, instance: &Instance, target: &Target) -> bool {
        let entry = target.entry;
        instance.state == InstanceState::Ready
            // A stopped instance runs nothing to overlap with and must not be
            // started or published (S3): it is upgraded once started again.
            && !instance.stopped
            && !is_expired(instance, self.snapshot.now)
            && away_from(instance, entry, target.pinned)
            // One task per instance at a time: an upgrade racing a
            // reprovision or deprovision helps nobody.
            && !self.active_kinds(instance.id).any()
            // A missing release is drift's to repair first.
            && self.live.as_ref().is_none_or(|live| {
                self.release_namespace(instance, &mut Plan::default())
                    .is_some_and(|namespace| live.contains(instance.name.as_str(), &namespace))
            })
    }

    /// Instances behind their catalog version get an `upgrade`, the
    /// configured own team first, then by service type, name and id. At
    /// most `max_in_flight` upgrades are queued or running across the
    /// fleet, counting those already there; operators' undos take them
    /// first ([`Planner::undos`]). Nothing else for a halted type.
    /// An upgrade is enqueued only while the instance's maintenance window
    /// is open (or it has none, or the entry is a `security` release), to
    /// run now: one whose window is closed is reported with the opening
    /// and enqueued by the first tick inside it, so it never parks in the
    /// queue holding a slot that every other upgrade of the fleet, security
    /// releases included, would wait behind (#40). An instance whose window
    /// does not parse is reported and skipped. Either way the next
    /// candidate takes the slot.
    pub fn version_drift(&self) -> Plan {
        let snapshot = self.snapshot;
        let mut plan = Plan::default();
        let limit = snapshot.config.max_in_flight as usize;
        let limit = if crate::broken!(snapshot.config.broken, UnderuseInFlight) {
            limit - 1
        } else {
            limit
        };
        if snapshot.baking.is_none() {
            // Which instances bake is unknown this tick: a slot that looks
            // free may be one a bake holds.
            return plan;
        }
        let mut slots = limit.saturating_sub(self.in_flight.len());
        let own_team = if crate::broken!(snapshot.config.broken, IgnoreOwnTeam) {
            ""
        } else {
            snapshot.config.own_team.as_str()
        };
        // An operator's undo first: it takes a bad version away.
        let undoing = self.undos(&mut slots, own_team, &mut plan);
        let types = self.targets();
        let mut waves = self.waves(&types);
        // Instances of unknown types are reported every tick, a full fleet
        // limit or not: a report that came and went with the free slots
        // would log its warning again each time it came back.
        let mut candidates: Vec<(&Instance, Target)> = Vec::new();
        for instance in &snapshot.instances {
            match types.get(instance.service_type.as_str()) {
                Some(Some(target))
                    if (slots > 0 || self.in_flight.contains(&instance.id))
                        && self.upgradable(instance, target)
                        && !undoing.contains(&instance.id) =>
                {
                    candidates.push((instance, *target))
                }
                Some(_) => {}
                None if instance.state == InstanceState::Ready => {
                    plan.reports.push(Report::UnknownServiceType {
                        instance: instance.id,
                        service_type: instance.service_type.clone(),
                    })
                }
                None => {}
            }
        }
        candidates.sort_unstable_by(|(a, _), (b, _)| order(a, own_team).cmp(&order(b, own_team)));
        // Many instances share a window spec, and the next opening depends
        // only on the spec and `now`: compute each spec's answer once.
        let mut run_afters: HashMap<&str, Result<Timestamp, WindowError>> = HashMap::new();
        for (instance, target) in candidates {
            // A baking instance moves on to a newer version in the slot and
            // the wave its bake holds: the version it bakes is superseded.
            let own_slot = self.in_flight.contains(&instance.id);
            if slots == 0 && !own_slot {
                continue;
            }
            let entry = target.entry;
            let wave = waves
                .get_mut(entry.service_type.as_str())
                .filter(|_| !own_slot);
            if wave.as_ref().is_some_and(|room| **room == 0) {
                continue;
            }
            // A move back to a pin is an operator's way out of a bad
            // version: like a security release, it waits for no window.
            let urgent = entry.security || target.pinned;
            let Some(run_after) = self.run_after(instance, urgent, &mut run_afters, &mut plan)
            else {
                continue;
            };
            let reason = upgrade_reason(instance, target);
            plan.decisions.push(Decision::Enqueue(self.new_task(
                TaskKind::Upgrade,
                instance.id,
                run_after,
                reason,
            )));
            if !own_slot {
                slots -= 1;
            }
            if let Some(room) = wave {
                *room -= 1;
            }
        }
        plan
    }

    /// How many more upgrades each type may start in its current wave
    /// (#55): one more than its instances already on the target and past
    /// their bake, less those in flight. A type's first upgrade goes alone,
    /// and the rollout widens (1, 2, 4, …, within `max_in_flight`) only as
    /// bakes end well: a version that fails its bake reaches one instance
    /// before the halt. A move back to an undo's pin waits for no wave.
    fn waves(&self, types: &FastMap<&'s str, Option<Target<'s>>>) -> FastMap<&'s str, usize> {
        let snapshot = self.snapshot;
        let mut counts: FastMap<&str, (usize, usize)> = FastMap::default();
        if crate::broken!(snapshot.config.broken, NoWaves) {
            return FastMap::default();
        }
        for instance in &snapshot.instances {
            let Some(Some(target)) = types.get(instance.service_type.as_str()) else {
                continue;
            };
            if target.pinned {
                continue;
            }
            let (done, flying) = counts
                .entry(target.entry.service_type.as_str())
                .or_default();
            if self.in_flight.contains(&instance.id) {
                *flying += 1;
            } else if instance.state == InstanceState::Ready
                && !instance.stopped
                && !self.expiring.contains(&instance.id)
                && !is_behind(&instance.version, &target.entry.version)
                && !spec_changed(instance, target.entry)
            {
                *done += 1;
            }
        }
        counts
            .into_iter()
            .map(|(service_type, (done, flying))| (service_type, (done + 1).saturating_sub(flying)))
            .collect()
    }

    /// The upgrade tasks that carry operators' undos out, in C8's order,
    /// within the `slots` left; returns their instances. An instance with
    /// an upgrade task already has its undo carried out there; one on its
    /// way out gets none (its expiry, C7, this very tick, cancels what it
    /// has queued, and an undo's task would outlive that).
    fn undos(&self, slots: &mut usize, own_team: &str, plan: &mut Plan) -> Vec<InstanceId> {
        let snapshot = self.snapshot;
        if snapshot.undos.is_empty() {
            return Vec::new();
        }
        let mut asked: Vec<&Instance> = snapshot
            .instances
            .iter()
            .filter(|i| {
                snapshot.undos.contains(&i.id)
                    && i.state == InstanceState::Ready
                    && !is_expired(i, snapshot.now)
                    && !self.active_kinds(i.id).any()
            })
            .collect();
        asked.sort_unstable_by(|a, b| order(a, own_team).cmp(&order(b, own_team)));
        // A baking instance's undo takes over the slot its bake holds; any
        // other needs a free one.
        asked.retain(|i| {
            if self.in_flight.contains(&i.id) {
                true
            } else if *slots > 0 {
                *slots -= 1;
                true
            } else {
                false
            }
        });
        for instance in &asked {
            plan.decisions.push(Decision::Enqueue(self.new_task(
                TaskKind::Upgrade,
                instance.id,
                snapshot.now,
                UNDO_REASON.to_owned(),
            )));
        }
        asked.iter().map(|i| i.id).collect()
    }

    /// What each type rolls toward: the catalog's entry, or while an undo
    /// pins the halted type, the pinned one; `None` while halted otherwise.
    /// Looked up once per type rather than once per instance.
    fn targets(&self) -> FastMap<&'s str, Option<Target<'s>>> {
        let snapshot = self.snapshot;
        let mut types: FastMap<&str, Option<Target>> = FastMap::default();
        for entry in snapshot.catalog.entries() {
            let target = match snapshot.pins.get(&entry.service_type) {
                Some(pin) => Some(Target {
                    entry: pin,
                    pinned: true,
                }),
                None => (!self.halted(entry)).then_some(Target {
                    entry,
                    pinned: false,
                }),
            };
            types.insert(entry.service_type.as_str(), target);
        }
        types
    }

    /// When `instance`'s upgrade may run: now if it is `urgent` or has no
    /// window, else its window's next opening. `None` (reported) while the
    /// window is closed, or when it does not parse. Many instances share a
    /// window spec: `run_afters` keeps each spec's answer.
    fn run_after<'i>(
        &self,
        instance: &'i Instance,
        urgent: bool,
        run_afters: &mut HashMap<&'i str, Result<Timestamp, WindowError>>,
        plan: &mut Plan,
    ) -> Option<Timestamp> {
        let snapshot = self.snapshot;
        let (Some(spec), false) = (&instance.maintenance_window, urgent) else {
            return Some(snapshot.now);
        };
        let scheduled = run_afters.entry(spec.as_str()).or_insert_with(|| {
            Window::parse(spec).map(|window| next_run_after(&window, snapshot.now))
        });
        match scheduled {
            Ok(at)
                if *at > snapshot.now
                    && !crate::broken!(snapshot.config.broken, ParkUpgradeBehindWindow) =>
            {
                plan.reports.push(Report::WaitsForWindow {
                    instance: instance.id,
                    name: instance.name.clone(),
                    opens_at: *at,
                });
                None
            }
            Ok(at) => Some(*at),
            Err(error) => {
                plan.reports.push(Report::BadWindow {
                    instance: instance.id,
                    name: instance.name.clone(),
                    window: spec.chars().take(WINDOW_SPEC_LEN_MAX).collect(),
                    error: error.clone(),
                });
                None
            }
        }
    }
}

/// Why `instance` is upgraded toward `target`: a pin, a changed spec, or a
/// newer version.
fn upgrade_reason(instance: &Instance, target: Target) -> String {
    let entry = target.entry;
    let security = if entry.security { " (security)" } else { "" };
    if target.pinned {
        format!(
            "{PINNED_REASON} {}: {} -> {}",
            entry.version, instance.version, entry.version
        )
    } else if instance.version == entry.version {
        format!(
            "spec drift: the catalog changed {}'s spec at version {}{security}",
            entry.service_type, entry.version
        )
    } else {
        format!(
            "version drift: {} -> {}{security}",
            instance.version, entry.version
        )
    }
}

/// The words every upgrade toward an undo's pin begins its reason with.
pub const PINNED_REASON: &str = "rollout undo --to";

/// What version drift moves a type's instances to.
#[derive(Clone, Copy)]
struct Target<'e> {
    entry: &'e CatalogEntry,
    /// An operator's undo pinned the halted type to `entry`.
    pinned: bool,
}
