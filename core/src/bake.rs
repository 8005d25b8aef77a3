//! Bake, then commit or revert (#40), as pure decisions.
//!
//! An upgrade that switches ACTIVE writes its predecessor's
//! `retirement-pending` marker with the way back ([`RevertTo`]): the
//! predecessor's revision and binds, the instance's version before, and the
//! end of the type's bake window. Until then the recovery pass stops the
//! predecessor once its successor serves, but keeps it. A successor that
//! fails in that time, by any sign the pass sees ([`fails_while_baking`]),
//! is reverted with every other baking service of the instance (all or
//! nothing): the type's rollout is halted first, then each successor gets a
//! marker of its own and ACTIVE names the predecessor again, then the
//! instance's version goes back ([`revert_steps`]). The next pass starts,
//! verifies and publishes the predecessor and retires the successor as it
//! retires any superseded container. Once the window ends, the predecessor
//! is retired as before.
//!
//! Every write is idempotent, and the halt comes first: a crash mid-revert
//! leaves the type halted (nothing more is upgraded) and the rest redone by
//! the pass that next sees the successor fail.

use jiff::Timestamp;

use super::broken::Armed;
use super::recovery::{RecoveryError, Report, Verdict};
use super::types::{
    ActiveRecord, ActiveService, GenerationKey, Inhibition, InhibitionReason, InstanceName,
    RevertTo, ServiceName,
};

/// How long the recovery pass leaves an operator's undo to the upgrade
/// task that carries it out without a gap (`core::undo`) before it reverts
/// the instance itself: a worker that is down or busy does not keep the
/// instance on the version the operator undid.
pub const UNDO_TASK_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a successor a revert took the service away from is kept,
/// stopped, after the revert (#55): its container, its logs and its exit
/// code are the evidence of what failed (`docker logs`, `docker inspect`).
/// Not a `stop-first` service's ([`REVERT_STOP_FIRST_OPERATION`]).
/// Then it is retired like any superseded container. An upgrade of its
/// instance to that very revision takes it up again, by its name, as it
/// would before it was retired (its crash-loop budget goes on, R10).
pub const KEEP_REVERTED: std::time::Duration = std::time::Duration::from_secs(3600);

/// The operation of the marker a revert puts on the successor it takes the
/// service away from ([`revert_marker`]).
pub const REVERT_OPERATION: &str = "revert";

/// The same, for a `stop-first` service's successor: retired at once, not
/// kept, since it mounts the service's volumes and a `docker start` by hand
/// would run it beside the live one (#55).
pub const REVERT_STOP_FIRST_OPERATION: &str = "revert-stop-first";

/// Whether `marker` is a revert's, on a successor still kept at `now`
/// ([`KEEP_REVERTED`]).
pub fn keeps_reverted(marker: &Inhibition, now: Timestamp) -> bool {
    marker.reason == InhibitionReason::RetirementPending
        && marker.operation == REVERT_OPERATION
        && now < crate::fleet::add(marker.created_at, KEEP_REVERTED)
}

/// The grace a `stop-first` successor recorded without one is stopped
/// with (an upgrade always records its own).
const STOP_FIRST_GRACE_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);
use super::upgrade::revert_marker;

/// Why a baking successor counts as failed this pass, or `None` while it
/// serves. Stricter than the crash-loop budget on purpose: a version that
/// needs a restart, a readiness failure or a restart of its own within
/// minutes of its rollout is not one to keep rolling out, and the way back
/// is at hand. A failure of stead's own ports (the proxy, the store, an
/// inspection) says nothing about the version and reverts nothing.
pub fn fails_while_baking(report: &Report, switched: &ActiveService) -> Option<String> {
    if report.intervened {
        let exited = report
            .exit
            .map(|exit| format!("it exited with code {} and ", exit.code))
            .unwrap_or_else(|| "it ".to_owned());
        return Some(format!(
            "{exited}was {} by recovery",
            report.verdict.label()
        ));
    }
    let workload = report.errors.iter().find(|e| {
        matches!(
            e,
            RecoveryError::NotReady(_) | RecoveryError::ExecutionChanged | RecoveryError::Gone
        )
    });
    if let Some(error) = workload {
        return Some(error.to_string());
    }
    match report.verdict {
        Verdict::Transitional => Some("it is restarting".into()),
        Verdict::Delayed { .. } => Some("it is down, its restarts delayed".into()),
        Verdict::Gone => Some("its container is gone".into()),
        Verdict::Verified {
            started_at: Some(started_at),
            ..
        } if switched
            .verified_started_at
            .is_some_and(|switched_at| switched_at != started_at) =>
        {
            Some("it restarted by itself".into())
        }
        _ => None,
    }
}

/// The baking markers of an instance at `now` whose successor ACTIVE
/// still names: the services a revert puts back.
pub fn baking<'a>(
    inhibitions: &'a [Inhibition],
    active: &'a ActiveRecord,
    now: Timestamp,
) -> impl Iterator<Item = (&'a Inhibition, &'a RevertTo, &'a ActiveService)> + 'a {
    inhibitions.iter().filter_map(move |marker| {
        bakes(marker, active, now).map(|(back, successor)| (marker, back, successor))
    })
}

/// One marker's way back and the successor that bakes on it at `now`, or
/// `None` when its predecessor is not kept: no way back holds, or ACTIVE
/// has no other container of the service (a service ACTIVE no longer has
/// has nothing to go back from).
pub fn bakes<'a>(
    marker: &'a Inhibition,
    active: &'a ActiveRecord,
    now: Timestamp,
) -> Option<(&'a RevertTo, &'a ActiveService)> {
    let back = marker.bakes_at(now)?;
    let successor = active.services.get(&marker.service)?;
    (successor.container != marker.container).then_some((back, successor))
}

/// One step of a revert, in order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RevertStep {
    /// First: nothing more of the type is upgraded, whatever happens next.
    HaltRollout { reason: String },
    /// The successor's marker (no way back of its own), before ACTIVE
    /// moves off it.
    SaveMarker(Inhibition),
    /// A `stop-first` successor stopped before its predecessor may start.
    StopSuccessor {
        generation: GenerationKey,
        grace: std::time::Duration,
    },
    /// ACTIVE names the predecessor again; the next pass starts, verifies
    /// and publishes it.
    RestoreActive {
        service: ServiceName,
        record: ActiveService,
    },
    /// The version (and digest) the instance ran before the upgrade.
    RestoreVersion {
        version: String,
        spec_digest: Option<String>,
    },
}

/// The steps reverting every baking service of an instance, or none when
/// nothing bakes.
pub(crate) fn revert_steps(
    instance: &str,
    inhibitions: &[Inhibition],
    active: &ActiveRecord,
    why: &str,
    now: Timestamp,
    broken: Armed,
) -> Vec<RevertStep> {
    let baking: Vec<_> = baking(inhibitions, active, now).collect();
    let Some(&(_, back, _)) = baking.first() else {
        return Vec::new();
    };
    let mut steps = vec![RevertStep::HaltRollout {
        reason: format!(
            "{instance} reverted to {} while baking: {why}",
            back.version
        ),
    }];
    if crate::broken!(broken, RevertWithoutHalt) {
        steps.clear();
    }
    for &(marker, to, successor) in &baking {
        steps.push(RevertStep::SaveMarker(revert_marker(
            &marker.service,
            successor,
            to.stop_first,
            now,
        )));
        if to.stop_first {
            // Down before ACTIVE names its predecessor, which the next
            // pass starts: never two on the service's volumes. A stop that
            // fails ends the revert here, the successor still ACTIVE.
            steps.push(RevertStep::StopSuccessor {
                generation: GenerationKey {
                    instance: InstanceName::new(instance),
                    service: marker.service.clone(),
                    container: successor.container.clone(),
                },
                grace: successor.stop_grace.unwrap_or(STOP_FIRST_GRACE_DEFAULT),
            });
        }
        steps.push(RevertStep::RestoreActive {
            service: marker.service.clone(),
            record: ActiveService {
                container: marker.container.clone(),
                effective_revision: to.revision.clone(),
                binds: to.binds.clone(),
                stop_grace: marker.stop_grace,
                // Stopped while it baked: started and verified afresh.
                verified_started_at: None,
            },
        });
        if let Some(hold) = &to.hold {
            // The operator's hold its marker replaced, back in its place:
            // the predecessor stays down (R5).
            steps.push(RevertStep::SaveMarker(Inhibition {
                reason: InhibitionReason::Hold(hold.clone()),
                operation: "operator".into(),
                created_at: now,
                revert_to: None,
                ..marker.clone()
            }));
        }
    }
    steps.push(RevertStep::RestoreVersion {
        version: back.version.clone(),
        spec_digest: back.spec_digest.clone(),
    });
    steps
}
