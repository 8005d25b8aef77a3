//! Performs the pass's commands through the ports. No decisions here.

use crate::core::bake::RevertStep;
use crate::core::errors::Cause;
use crate::core::fleet::{Instance, RolloutState};
use crate::core::pass::{InstanceAnswer, InstanceCommand};
use crate::core::recovery::{Command, Outcome};
use crate::core::spec::ReadinessProbe;
use crate::core::types::{GenerationKey, RuntimeError, ServiceKey};
use crate::ports::{LeaseGrant, LockedWrite, ProbeTarget, Route};

use super::Recoverer;

impl Recoverer {
    /// Performs one command through the ports. No decisions here.
    pub(super) async fn perform(
        &self,
        instance: &Instance,
        command: &InstanceCommand,
        fence: &LeaseGrant,
    ) -> InstanceAnswer {
        let p = &self.ports;
        match command {
            InstanceCommand::Service { key, command } => {
                InstanceAnswer::Service(self.perform_service(instance, key, command, fence).await)
            }
            InstanceCommand::InspectSuccessor(id) => {
                InstanceAnswer::SuccessorInspected(p.runtime.inspect(id).await)
            }
            InstanceCommand::InspectPredecessor(id) => {
                InstanceAnswer::PredecessorInspected(p.runtime.inspect(id).await)
            }
            InstanceCommand::ReadRoutes => InstanceAnswer::RoutesRead(
                p.traffic
                    .held_routes()
                    .await
                    .map(|routes| routes.into_iter().map(|r| (r.service, r.port)).collect()),
            ),
            InstanceCommand::StopPredecessor { generation, grace } => {
                InstanceAnswer::PredecessorStopped(p.runtime.stop(generation, *grace).await)
            }
            InstanceCommand::RemovePredecessor(generation) => {
                InstanceAnswer::PredecessorRemoved(p.runtime.remove(generation).await)
            }
            InstanceCommand::ReleaseClaims(generation) => InstanceAnswer::ClaimsReleased(
                p.store
                    .release_claims(&generation.instance, &generation.container, Some(fence))
                    .await,
            ),
            InstanceCommand::ClearMarker(generation) => InstanceAnswer::MarkerCleared(
                p.store
                    .clear_inhibition(
                        &generation.instance,
                        &generation.service,
                        &generation.container,
                        Some(fence),
                    )
                    .await,
            ),
            InstanceCommand::Revert { service_type, step } => {
                InstanceAnswer::Reverted(self.revert(instance, service_type, step, fence).await)
            }
            InstanceCommand::WithdrawStale(service) => {
                let result = p.traffic.withdraw(service).await;
                if result.is_ok() {
                    tracing::info!(
                        instance = %service.instance,
                        service = %service.service,
                        "withdrew a route nothing serves any more"
                    );
                }
                InstanceAnswer::StaleWithdrawn(result)
            }
        }
    }

    /// Performs one step of a revert (#40) through the ports.
    /// One instance write of a revert, under the reconciler lease (T2);
    /// the mutation exercise's `UnfencedRevert` writes it without.
    async fn write_fenced(
        &self,
        fence: &LeaseGrant,
        write: LockedWrite<'_>,
    ) -> Result<bool, crate::ports::StoreError> {
        let store = self.ports.store.as_ref();
        if crate::broken!(self.policy.broken, UnfencedRevert) {
            return unfenced(store, write).await;
        }
        store.write_under_lease(fence, write).await
    }

    async fn revert(
        &self,
        instance: &Instance,
        service_type: &str,
        step: &RevertStep,
        fence: &LeaseGrant,
    ) -> Result<(), Cause> {
        let p = &self.ports;
        let now = p.clock.now();
        let store = p.store.as_ref();
        match step {
            RevertStep::HaltRollout { reason } => store
                .set_rollout(service_type, RolloutState::Halted, reason, now, Some(fence))
                .await
                .map_err(Cause::from),
            RevertStep::SaveMarker(marker) => self
                .write_fenced(
                    fence,
                    LockedWrite::SaveInhibition {
                        instance: &instance.name,
                        inhibition: marker,
                    },
                )
                .await
                .map(drop)
                .map_err(Cause::from),
            RevertStep::StopSuccessor { generation, grace } => {
                match p.runtime.stop(generation, *grace).await {
                    // Already gone is what the stop wants.
                    Ok(()) | Err(RuntimeError::NotFound) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            RevertStep::RestoreActive { service, record } => self
                .write_fenced(
                    fence,
                    LockedWrite::SaveActive {
                        instance: &instance.name,
                        service,
                        active: record,
                    },
                )
                .await
                .map(drop)
                .map_err(Cause::from),
            // Every write of a revert carries the lease (T2): a reconciler
            // that lost it mid-revert writes nothing more (#55).
            RevertStep::RestoreVersion {
                version,
                spec_digest,
            } => {
                let id = instance.id;
                self.write_fenced(fence, LockedWrite::Version { id, version, now })
                    .await?;
                if let Some(digest) = spec_digest {
                    self.write_fenced(fence, LockedWrite::SpecDigest { id, digest, now })
                        .await?;
                }
                Ok(())
            }
        }
    }

    /// Performs one step of a service's recovery through the ports.
    async fn perform_service(
        &self,
        instance: &Instance,
        key: &GenerationKey,
        command: &Command,
        fence: &LeaseGrant,
    ) -> Outcome {
        let p = &self.ports;
        let fence = Some(fence);
        // Built only for the traffic plane's two commands: a steady
        // service's inspections need no copy of its names (issue #14).
        let service_key = || ServiceKey {
            instance: key.instance.clone(),
            service: key.service.clone(),
        };
        let id = &key.container;
        match command {
            Command::Withdraw => {
                let result = p.traffic.withdraw(&service_key()).await;
                if result.is_ok() {
                    metrics::counter!("stead_withdrawals_total").increment(1);
                }
                Outcome::Withdrawn(result)
            }
            Command::Inspect => Outcome::Inspected(p.runtime.inspect(id).await),
            Command::ReleaseClaims => {
                Outcome::ClaimsReleased(p.store.release_claims(&key.instance, id, fence).await)
            }
            Command::CheckPolicy => {
                Outcome::PolicyChecked(p.policy.check(&key.instance, &key.service).await)
            }
            Command::Start => {
                let result = p.runtime.start(id).await;
                if result.is_ok() {
                    metrics::counter!("stead_starts_total").increment(1);
                }
                Outcome::Started(result)
            }
            Command::Restart { grace } => {
                let result = p.runtime.restart(id, *grace).await;
                if result.is_ok() {
                    metrics::counter!("stead_restarts_total").increment(1);
                }
                Outcome::Restarted(result)
            }
            Command::Stop { grace } => Outcome::Stopped(p.runtime.stop(key, *grace).await),
            Command::ReadHealth => Outcome::Health(p.runtime.health(id).await),
            Command::ReadBinds => Outcome::Binds(p.runtime.binds(id).await),
            Command::ProbeReadiness { binds, started_at } => {
                let probe = self.readiness_probe(instance, key);
                let target = ProbeTarget {
                    container: id.clone(),
                    started_at: *started_at,
                    binds: binds.clone(),
                };
                Outcome::Readiness(p.probe.ready(&probe, &target).await)
            }
            Command::ReloadActive => Outcome::ActiveReloaded(
                p.store
                    .load_active(&key.instance)
                    .await
                    .map(|a| a.services.get(&key.service).cloned()),
            ),
            Command::PersistBinds { binds, revision } => Outcome::BindsPersisted(
                p.store
                    .persist_binds(&key.instance, &key.service, id, revision, binds, fence)
                    .await,
            ),
            Command::Publish { binds, started_at } => {
                let public_hosts = match self.granted_hosts(instance, key, fence).await {
                    Ok(hosts) => hosts,
                    Err(e) => return Outcome::Published(Err(e)),
                };
                let route = Route {
                    service: service_key(),
                    container: id.clone(),
                    binds: binds.clone(),
                    verified_started_at: *started_at,
                    public_hosts,
                };
                Outcome::Published(p.traffic.publish(&route).await)
            }
            Command::RecordExecution { started_at } => Outcome::ExecutionRecorded(
                p.store
                    .record_verified_execution(&key.instance, &key.service, id, *started_at, fence)
                    .await,
            ),
        }
    }

    /// The readiness probe of `key`'s service, as its type's catalog entry
    /// sets it (none when it sets none).
    fn readiness_probe(&self, instance: &Instance, key: &GenerationKey) -> ReadinessProbe {
        self.readiness
            .lock()
            .expect("readiness poisoned")
            .get(&(instance.service_type.clone(), key.service.clone()))
            .cloned()
            .unwrap_or(ReadinessProbe::None)
    }
}

/// The mutation exercise's unfenced revert write: the store method of the
/// same name, without the lease.
#[cfg(feature = "mutation-exercise")]
async fn unfenced(
    store: &dyn crate::ports::Store,
    write: LockedWrite<'_>,
) -> Result<bool, crate::ports::StoreError> {
    match write {
        LockedWrite::SaveInhibition {
            instance,
            inhibition,
        } => store
            .save_inhibition(instance, inhibition)
            .await
            .map(|()| true),
        LockedWrite::SaveActive {
            instance,
            service,
            active,
        } => store
            .save_active_service(instance, service, active)
            .await
            .map(|()| true),
        LockedWrite::Version { id, version, now } => store
            .set_instance_version(id, version, now)
            .await
            .map(|()| true),
        LockedWrite::SpecDigest { id, digest, now } => store
            .set_instance_spec_digest(id, digest, now)
            .await
            .map(|()| true),
        other => unreachable!("a revert makes no {other:?}"),
    }
}

/// Without the mutation exercise nothing is written unfenced.
#[cfg(not(feature = "mutation-exercise"))]
async fn unfenced(
    _: &dyn crate::ports::Store,
    _: LockedWrite<'_>,
) -> Result<bool, crate::ports::StoreError> {
    unreachable!("broken!() is false without the mutation exercise")
}
