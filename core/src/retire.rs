//! Retirement of superseded containers (R15), as pure decisions.
//!
//! An upgrade leaves its predecessor running beside the successor with a
//! `retirement-pending` marker. The recovery pass retires it only when it can
//! no longer be the serving one.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::broken::Armed;

use super::recovery::{ProxyView, Verdict};
use super::types::{
    ActiveRecord, Binds, ContainerId, ContainerStatus, Inhibition, InhibitionReason, Intent,
    Observation, RuntimeError, ServiceName,
};

/// What to do with one `retirement-pending` marker this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MarkerDecision {
    /// ACTIVE still names the container: the replacement never took over.
    /// Drop the marker, keep the container.
    ClearMarker,
    /// Nothing may depend on it any more: retire it now.
    Retire,
    /// Retire only if a final inspection of the successor shows it still
    /// running the execution this pass verified.
    /// And only if the proxy, read back at that moment, still routes the
    /// service to the successor's `binds` ([`successor_routed`]).
    ConfirmSuccessor {
        successor: ContainerId,
        verified_started_at: Option<Timestamp>,
        binds: Binds,
    },
    /// The successor has not been verified and routed this pass.
    Wait,
}

/// Per service, the execution this pass verified and routed.
pub(crate) type VerifiedThisPass = BTreeMap<ServiceName, Option<Timestamp>>;

/// The hold on one generation that recovery must honour (R5), as the
/// machine's `inhibition` input. A `retirement-pending` marker is not a
/// hold: it is resolved by [`decide_marker`], never by withholding recovery.
pub(crate) fn inhibition_for(
    inhibitions: &[Inhibition],
    service: &ServiceName,
    container: &ContainerId,
) -> Option<String> {
    inhibitions
        .iter()
        .find(|i| {
            &i.service == service
                && &i.container == container
                && i.reason != InhibitionReason::RetirementPending
        })
        .map(|i| i.reason.as_str().to_owned())
}

/// Notes one service's verdict for this pass's markers (R15). A successor
/// first routed in this very pass does not let its predecessor go yet: the
/// proxy may still be finishing requests it sent there, so the next pass
/// (which finds the route in place) retires it.
pub(crate) fn note_verdict(
    verified: &mut VerifiedThisPass,
    service: &ServiceName,
    verdict: &Verdict,
) {
    if let Verdict::Verified {
        started_at,
        published: false,
    } = verdict
    {
        verified.insert(service.clone(), *started_at);
    }
}

/// Decides one marker (R15).
pub(crate) fn decide_marker(
    marker: &Inhibition,
    active: &ActiveRecord,
    intent: Intent,
    verified: &VerifiedThisPass,
    broken: Armed,
) -> MarkerDecision {
    if active.names_container(&marker.container) {
        return MarkerDecision::ClearMarker;
    }
    if intent == Intent::Stopped {
        return MarkerDecision::Retire;
    }
    let Some(successor) = active.services.get(&marker.service) else {
        return MarkerDecision::Retire;
    };
    if crate::broken!(broken, RetireBeforeSuccessorVerified) {
        return MarkerDecision::Retire;
    }
    match verified.get(&marker.service) {
        Some(started_at) => MarkerDecision::ConfirmSuccessor {
            successor: successor.container.clone(),
            verified_started_at: *started_at,
            binds: successor.binds.clone(),
        },
        None => MarkerDecision::Wait,
    }
}

/// Whether the proxy, read back just before retirement, routes the service
/// to the successor's `binds` (S5). The pass's own view of the proxy was
/// read when the pass began; a proxy that lost its routes since (a reload,
/// a restart without its config) would otherwise see the predecessor
/// retired while nothing routes to the successor. The next pass republishes
/// and the one after retires. A read that failed (`Unknown`) retires
/// nothing. A successor without binds has nothing to route.
pub(crate) fn successor_routed(proxy: ProxyView, binds: &Binds) -> bool {
    binds.is_empty() || (proxy != ProxyView::Unknown && !proxy.contradicts(binds))
}

/// Whether the final inspection of the successor confirms it still serves
/// the execution that was verified.
pub(crate) fn successor_confirmed(
    inspection: &Result<Observation, RuntimeError>,
    verified_started_at: Option<Timestamp>,
    broken: Armed,
) -> bool {
    let same_execution = |obs: &Observation| {
        obs.started_at == verified_started_at || crate::broken!(broken, RetireOnAnyExecution)
    };
    matches!(inspection, Ok(obs)
        if obs.status == ContainerStatus::Running
            && obs.started_at.is_some()
            && same_execution(obs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(started_at: &str) -> Result<Observation, RuntimeError> {
        Ok(Observation {
            status: ContainerStatus::Running,
            started_at: Some(started_at.parse().unwrap()),
            exit: None,
        })
    }

    /// The final inspection confirms the very execution that was verified
    /// and routed: a successor that restarted since (natively, a new
    /// execution the pass never probed) lets no predecessor go (#44: no
    /// test failed when this comparison was dropped).
    #[test]
    fn the_final_inspection_confirms_the_verified_execution_only() {
        let verified = Some("2026-01-01T00:00:00Z".parse().unwrap());
        let armed = Armed::default();
        assert!(successor_confirmed(
            &running("2026-01-01T00:00:00Z"),
            verified,
            armed
        ));
        assert!(!successor_confirmed(
            &running("2026-01-01T00:05:00Z"),
            verified,
            armed
        ));
        assert!(!successor_confirmed(
            &Err(RuntimeError::NotFound),
            verified,
            armed
        ));
        assert!(!successor_confirmed(
            &running("2026-01-01T00:00:00Z"),
            None,
            armed
        ));
    }
}
