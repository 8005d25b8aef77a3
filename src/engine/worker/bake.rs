//! A Helm type's bake after its upgrade (#40): `core::helm_bake` driven
//! through the provisioner and the store, under the task lease and the
//! instance lock like every other step of the task.

use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::Instance;
use crate::core::helm_bake::{
    BakeVerdict, HelmBake, HelmBakeAnswer, HelmBakeCommand, HelmBakeInput,
};
use crate::core::machine::Machine;
use std::time::Duration;

use crate::core::release::{HelmRelease, ReleaseSpec, ReleaseTarget};
use crate::engine::drive::{drive, Performer};
use crate::ports::LockedWrite;

use super::Worker;

/// A Helm release an upgrade task bakes once upgraded (#40).
pub(super) struct HelmBaking {
    release: ReleaseTarget,
    /// The chart version it was upgraded to.
    chart_version: String,
    bake: Duration,
    /// The version and spec digest the instance records once the bake
    /// held (`Upgrade::version_after_bake`).
    version: String,
    spec_digest: String,
    /// The release of the version the instance records, which a revert
    /// goes back to (`HelmBakeInput::back_to`).
    back_to: Option<HelmRelease>,
}

impl HelmBaking {
    /// What an upgrade of `release` (a Helm type's; `None` for Docker)
    /// bakes afterwards: a rollout's upgrade with a bake window, not a
    /// pinned move back nor a halted type's tidy-up.
    pub(super) fn after(
        release: Option<&HelmRelease>,
        rollout: bool,
        entry: &crate::core::catalog::CatalogEntry,
    ) -> Option<Self> {
        let bake = entry.bake;
        let release = release.filter(|_| rollout && !bake.is_zero())?;
        Some(Self {
            release: ReleaseSpec::Helm(release.clone()).target(),
            chart_version: release.chart_version.clone(),
            bake,
            version: entry.version.clone(),
            spec_digest: entry.spec_digest.clone(),
            back_to: None,
        })
    }

    /// This bake with the release its revert goes back to.
    pub(super) fn back_to(self, back_to: Option<HelmRelease>) -> Self {
        Self { back_to, ..self }
    }
}

/// Performs a bake's commands through the worker's ports.
struct BakeSteps<'a> {
    worker: &'a Worker,
    instance: &'a Instance,
}

impl Performer<HelmBake> for BakeSteps<'_> {
    async fn perform(&mut self, _: &HelmBake, command: &HelmBakeCommand) -> HelmBakeAnswer {
        let p = &self.worker.ports;
        match command {
            HelmBakeCommand::Check { release, tests } => {
                HelmBakeAnswer::Checked(p.provisioner.check_release(release, *tests).await)
            }
            HelmBakeCommand::RollBack {
                release,
                bad_chart_version,
                back_to,
            } => HelmBakeAnswer::RolledBack(
                p.provisioner
                    .roll_back_from(release, bad_chart_version, back_to.as_ref())
                    .await,
            ),
            HelmBakeCommand::RestoreVersion {
                version,
                spec_digest,
                ..
            } => {
                // Under the instance lock, as every write of the task
                // (T3): a worker paused past its lock writes nothing.
                let now = p.clock.now();
                let id = self.instance.id;
                let worker = self.worker;
                let mut restored = worker
                    .write_locked(LockedWrite::Version { id, version, now })
                    .await
                    .map(drop);
                if let (Ok(()), Some(digest)) = (&restored, spec_digest) {
                    restored = worker
                        .write_locked(LockedWrite::SpecDigest { id, digest, now })
                        .await
                        .map(drop);
                }
                HelmBakeAnswer::VersionRestored(restored)
            }
        }
    }
}

impl Worker {
    /// Bakes the release an upgrade just installed for `instance` (whose
    /// row still says what it recorded before the upgrade) over the type's
    /// window. A release that goes bad is rolled back and the task fails
    /// for good with the reason, which halts the type's rollout (C11).
    pub(super) async fn bake_release(
        &self,
        instance: &Instance,
        baking: HelmBaking,
    ) -> Result<(), TaskError> {
        let HelmBaking {
            release,
            chart_version,
            bake,
            version,
            spec_digest,
            back_to,
        } = baking;
        let name = &instance.name;
        let mut machine = HelmBake::new(HelmBakeInput {
            instance: name.clone(),
            release: release.clone(),
            chart_version,
            bake,
            started: self.ports.clock.now(),
            previous_version: instance.version.clone(),
            previous_spec_digest: instance.spec_digest.clone(),
            back_to,
            broken: self.config.broken,
        });
        tracing::info!(
            instance = %name,
            release = %release.release.name,
            namespace = %release.release.namespace,
            until = %machine.until(),
            "helm release upgraded; baking: its status is read every 30 s and its chart's \
             tests run at the end"
        );
        let mut steps = BakeSteps {
            worker: self,
            instance,
        };
        drive(&mut machine, &mut steps, self.ports.clock.as_ref(), || {
            self.allowed(name).is_ok()
        })
        .await;
        let record = || async {
            self.record_version(instance, &version, &spec_digest)
                .await
                .map_err(|e| TaskError::new(name, "record the version its bake held", e))
        };
        match machine.into_report()? {
            BakeVerdict::Held => {
                tracing::info!(instance = %name, version = %version, "helm release held through its bake");
                record().await
            }
            BakeVerdict::Unchecked(why) => {
                tracing::warn!(instance = %name, version = %version, "{why}; the upgrade stands");
                record().await
            }
            BakeVerdict::Reverted(reason) => {
                let message = format!(
                    "helm release {} went bad while baking ({reason}): rolled back to its \
                     previous revision, version {} recorded again",
                    release.release.name, instance.version
                );
                metrics::counter!("stead_reverts_total", "cause" => "helm_bake").increment(1);
                tracing::warn!(instance = %name, "{message}");
                let event = Event::new(EventKind::Revert, self.ports.clock.now(), "C11", &message);
                self.events.emit(event.instance(name));
                // Permanent: the same version goes bad again; the failed
                // upgrade halts the type's rollout with this reason.
                Err(TaskError::new(
                    name,
                    "bake the upgraded helm release",
                    Cause::verdict(ErrorKind::Failed, message),
                ))
            }
        }
    }
}
