//! The traffic plane as the pass sees it (T5): made sure of and read back
//! once per pass; routes nothing may be routed by any more withdrawn.

use crate::core::traffic::FleetRoutes;
use crate::core::types::ServiceKey;
use crate::ports::PlaneCheck;

use super::{PassOutcome, RecoverError, Recoverer};

impl Recoverer {
    /// T5: makes sure of the traffic plane and reads its routes back, one
    /// call each per pass. `None` when the plane did not answer: the pass
    /// then trusts memory, as a targeted pass does.
    pub(super) async fn read_traffic_plane(
        &self,
        outcome: &mut PassOutcome,
    ) -> Option<FleetRoutes> {
        let traffic = &self.ports.traffic;
        let deadline = self.policy.instance_deadline;
        let ensured = tokio::time::timeout(deadline, traffic.ensure()).await;
        let first = matches!(ensured, Ok(Ok(_)))
            && !self
                .plane_ensured
                .swap(true, std::sync::atomic::Ordering::Relaxed);
        match ensured {
            Ok(Ok(PlaneCheck::Present)) => {}
            Ok(Ok(PlaneCheck::Recreated)) if first => {
                tracing::info!("created stead's server in the traffic plane");
            }
            Ok(Ok(PlaneCheck::Recreated)) => {
                metrics::counter!("stead_traffic_plane_recreated_total").increment(1);
                tracing::warn!(
                    "the traffic plane had lost stead's routes (proxy restarted without its config?); recreated, republishing verified routes"
                );
            }
            Ok(Ok(PlaneCheck::Corrected { was })) => tracing::warn!(
                was = %was,
                "stead's proxy server listened elsewhere than configured; corrected"
            ),
            Ok(Err(e)) => outcome.errors.push(RecoverError::TrafficPlane(e).counted()),
            Err(_) => outcome.errors.push(RecoverError::Deadline {
                what: "traffic plane".to_owned(),
            }),
        }
        match tokio::time::timeout(deadline, traffic.held_routes()).await {
            Ok(Ok(routes)) => Some(routes.into_iter().map(|r| (r.service, r.port)).collect()),
            Ok(Err(e)) => {
                outcome.errors.push(RecoverError::ReadRoutes(e).counted());
                None
            }
            Err(_) => {
                outcome.errors.push(RecoverError::Deadline {
                    what: "read routes back".to_owned(),
                });
                None
            }
        }
    }

    /// Withdraws a route nothing may be routed by any more, under the lease.
    pub(super) async fn withdraw_stale(
        &self,
        service: &ServiceKey,
        errors: &mut Vec<RecoverError>,
    ) {
        if self.fence().await.is_none() {
            return;
        }
        let withdrawn = tokio::time::timeout(
            self.policy.instance_deadline,
            self.ports.traffic.withdraw(service),
        )
        .await;
        match withdrawn {
            Ok(Ok(())) => {
                metrics::counter!("stead_withdrawals_total").increment(1);
                tracing::info!(
                    instance = %service.instance,
                    service = %service.service,
                    "withdrew a route nothing serves any more"
                );
            }
            Ok(Err(source)) => errors.push(
                RecoverError::WithdrawStale {
                    route: service.clone(),
                    source,
                }
                .counted(),
            ),
            Err(_) => errors.push(RecoverError::Deadline {
                what: format!(
                    "{}/{}: withdraw stale route",
                    service.instance, service.service
                ),
            }),
        }
    }
}
