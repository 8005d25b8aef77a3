//! Performs the protocol machines' commands through the ports. No
//! decisions here.

use std::collections::BTreeMap;

use crate::core::fleet::Instance;
use crate::core::provision::{WorkAnswer, WorkCommand, WorkError};
use crate::core::undo::{UndoAnswer, UndoCommand};
use crate::core::upgrade::{UpgradeAnswer, UpgradeCommand};
use crate::ports::{LockedWrite, ReleaseSpec, StoreError};

use super::Worker;

impl Worker {
    /// Performs one step of provisioning or deprovisioning. No decisions.
    pub(super) async fn perform_work(
        &self,
        instance: &Instance,
        parameters: &BTreeMap<String, String>,
        command: WorkCommand,
    ) -> WorkAnswer {
        let p = &self.ports;
        let name = &instance.name;
        match command {
            WorkCommand::Install(release) => done(p.provisioner.install_or_upgrade(&release).await),
            WorkCommand::Uninstall(release) => done(p.provisioner.uninstall(&release).await),
            WorkCommand::Inspect(id) => WorkAnswer::Inspected(p.runtime.inspect(&id).await),
            WorkCommand::Create {
                spec,
                version,
                revision,
            } => WorkAnswer::Created(
                self.create(instance, parameters, &spec, &version, &revision)
                    .await,
            ),
            WorkCommand::SaveActive { service, record } => done(
                self.write_locked(LockedWrite::SaveActive {
                    instance: name,
                    service: &service,
                    active: &record,
                })
                .await,
            ),
            WorkCommand::Withdraw(key) => done(p.traffic.withdraw(&key).await),
            WorkCommand::Stop { generation, grace } => {
                WorkAnswer::Stopped(p.runtime.stop(&generation, grace).await)
            }
            WorkCommand::Remove(generation) => {
                WorkAnswer::Removed(p.runtime.remove(&generation).await)
            }
            WorkCommand::ReleaseClaims(container) => done(
                self.write_locked(LockedWrite::ReleaseClaims {
                    instance: name,
                    container: &container,
                })
                .await,
            ),
            WorkCommand::RemoveActive(service) => done(
                self.write_locked(LockedWrite::RemoveActive {
                    instance: name,
                    service: &service,
                })
                .await,
            ),
            WorkCommand::PurgeVolumes => {
                let purged = p.runtime.purge_volumes(name, instance.id).await;
                if let Ok(volumes) = &purged {
                    tracing::warn!(instance = %name, volumes = ?volumes, "purged the instance's named volumes (delete --purge-volumes)");
                }
                WorkAnswer::Purged(purged)
            }
            WorkCommand::Inhibit(marker) => done(
                self.write_locked(LockedWrite::SaveInhibition {
                    instance: name,
                    inhibition: &marker,
                })
                .await,
            ),
            WorkCommand::ClearInhibition(marker) => done(
                self.write_locked(LockedWrite::ClearInhibition {
                    instance: name,
                    service: &marker.service,
                    container: &marker.container,
                })
                .await,
            ),
            WorkCommand::RecordVersion {
                version,
                spec_digest,
            } => {
                let recorded = self.record_version(instance, &version, &spec_digest).await;
                // A digest alone is recorded quietly: a row from before
                // stead recorded digests has none.
                if recorded.is_ok() && version != instance.version {
                    metrics::counter!("stead_provision_versions_recorded_total").increment(1);
                    tracing::warn!(
                        instance = %name,
                        was = %instance.version,
                        now = %version,
                        "provisioned at this worker's catalog version, not the one the instance \
                         named (its catalog moved between the two); recorded the version it runs"
                    );
                }
                done(recorded)
            }
        }
    }

    /// Records the version (and spec digest) the instance now runs, for
    /// a provision and an upgrade alike. Two writes: a crash between them
    /// leaves the old digest, so the next tick plans an upgrade that finds
    /// every service at its revision and records it again.
    pub(super) async fn record_version(
        &self,
        instance: &Instance,
        version: &str,
        spec_digest: &str,
    ) -> Result<(), StoreError> {
        let (id, now) = (instance.id, self.ports.clock.now());
        self.write_locked(LockedWrite::Version { id, version, now })
            .await?;
        let digest = spec_digest;
        self.write_locked(LockedWrite::SpecDigest { id, digest, now })
            .await
            .map(drop)
    }

    /// Performs one step of an upgrade through the ports. No decisions.
    pub(super) async fn perform_upgrade(
        &self,
        instance: &Instance,
        parameters: &BTreeMap<String, String>,
        command: UpgradeCommand,
    ) -> UpgradeAnswer {
        let p = &self.ports;
        match command {
            UpgradeCommand::MoveState { from, to } => {
                let (id, now) = (instance.id, p.clock.now());
                UpgradeAnswer::StateMoved(
                    match self
                        .write_locked(LockedWrite::State { id, from, to, now })
                        .await
                    {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(StoreError::Conflict(format!(
                            "instance {} changed state concurrently (expected {from})",
                            instance.name
                        ))),
                        Err(e) => Err(e),
                    },
                )
            }
            UpgradeCommand::SetVersion {
                version,
                spec_digest,
            } => UpgradeAnswer::VersionSet(
                self.record_version(instance, &version, &spec_digest).await,
            ),
            UpgradeCommand::Create {
                spec,
                version,
                revision,
            } => UpgradeAnswer::Created(
                self.create(instance, parameters, &spec, &version, &revision)
                    .await,
            ),
            UpgradeCommand::Inspect(id) => UpgradeAnswer::Inspected(p.runtime.inspect(&id).await),
            UpgradeCommand::ReadBinds(id) => UpgradeAnswer::Binds(p.runtime.binds(&id).await),
            UpgradeCommand::Probe { readiness, target } => {
                UpgradeAnswer::Probed(p.probe.ready(&readiness, &target).await)
            }
            UpgradeCommand::Retire(step) => {
                let dropped = match &step {
                    WorkCommand::RemoveActive(service) => Some(service.clone()),
                    _ => None,
                };
                let answer = Box::pin(self.perform_work(instance, parameters, step)).await;
                if let (Some(service), WorkAnswer::Done(Ok(()))) = (dropped, &answer) {
                    metrics::counter!("stead_dropped_services_retired_total").increment(1);
                    tracing::info!(
                        instance = %instance.name,
                        %service,
                        "retired a service the instance's new catalog version no longer lists \
                         (its named volumes are kept)"
                    );
                    // The event log (#42).
                    let retired = crate::core::event_log::Event::new(
                        crate::core::event_log::EventKind::Retire,
                        p.clock.now(),
                        "C11",
                        "retired a service the instance's new catalog version no longer \
                         lists (its named volumes are kept)",
                    );
                    self.events
                        .emit(retired.instance(&instance.name).service(&service));
                }
                UpgradeAnswer::Retired(answer)
            }
            UpgradeCommand::RemoveCandidate(generation) => {
                UpgradeAnswer::Removed(p.runtime.remove(&generation).await)
            }
            UpgradeCommand::SaveMarker(marker) => UpgradeAnswer::MarkerSaved(
                self.write_locked(LockedWrite::SaveInhibition {
                    instance: &instance.name,
                    inhibition: &marker,
                })
                .await
                .map(drop),
            ),
            UpgradeCommand::UpgradeRelease(release) => UpgradeAnswer::ReleaseUpgraded(
                p.provisioner
                    .install_or_upgrade(&ReleaseSpec::Helm(release))
                    .await,
            ),
            UpgradeCommand::RollBackRelease(release) => {
                UpgradeAnswer::ReleaseUpgraded(p.provisioner.roll_back(&release).await)
            }
            UpgradeCommand::SaveActive { service, record } => UpgradeAnswer::ActiveSaved(
                self.write_locked(LockedWrite::SaveActive {
                    instance: &instance.name,
                    service: &service,
                    active: &record,
                })
                .await
                .map(drop),
            ),
        }
    }
}

impl Worker {
    /// Performs one step of an undo through the ports. No decisions.
    pub(super) async fn perform_undo(
        &self,
        instance: &Instance,
        command: &UndoCommand,
    ) -> UndoAnswer {
        let p = &self.ports;
        match command {
            UndoCommand::ReadRoutes => UndoAnswer::Routes(
                p.traffic
                    .held_routes()
                    .await
                    .map(|routes| routes.into_iter().map(|r| (r.service, r.port)).collect()),
            ),
            UndoCommand::Start(generation) => {
                UndoAnswer::Started(p.runtime.start(&generation.container).await)
            }
            UndoCommand::Inspect(id) => UndoAnswer::Inspected(p.runtime.inspect(id).await),
            UndoCommand::ReadBinds(id) => UndoAnswer::Binds(p.runtime.binds(id).await),
            UndoCommand::Probe { readiness, target } => {
                UndoAnswer::Probed(p.probe.ready(readiness, target).await)
            }
            UndoCommand::Stop { generation, grace } => {
                UndoAnswer::Stopped(p.runtime.stop(generation, *grace).await)
            }
            UndoCommand::SaveMarker(marker) => UndoAnswer::Saved(
                self.write_locked(LockedWrite::SaveInhibition {
                    instance: &instance.name,
                    inhibition: marker,
                })
                .await
                .map(drop),
            ),
            UndoCommand::SaveActive { service, record } => UndoAnswer::Saved(
                self.write_locked(LockedWrite::SaveActive {
                    instance: &instance.name,
                    service,
                    active: record,
                })
                .await
                .map(drop),
            ),
            UndoCommand::RestoreVersion {
                version,
                spec_digest,
            } => UndoAnswer::Saved(
                async {
                    let (id, now) = (instance.id, p.clock.now());
                    self.write_locked(LockedWrite::Version { id, version, now })
                        .await?;
                    if let Some(digest) = spec_digest {
                        self.write_locked(LockedWrite::SpecDigest { id, digest, now })
                            .await?;
                    }
                    Ok(())
                }
                .await,
            ),
        }
    }
}

/// The answer of a step whose only result is success or a port's failure.
fn done<T, E: Into<WorkError>>(result: Result<T, E>) -> WorkAnswer {
    WorkAnswer::Done(result.map(drop).map_err(Into::into))
}
