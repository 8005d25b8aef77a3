//! Provisioning and deprovisioning: the `core::provision` machines driven
//! through the ports, and the instance moved along its lifecycle.

use std::collections::BTreeMap;

use crate::core::catalog::CatalogEntry;
use crate::core::errors::TaskError;
use crate::core::fleet::Instance;
use crate::core::provision::{Deprovision, DeprovisionInput, Provision, ProvisionInput};
use crate::core::release::{Provisioning, ReleaseParams, ReleaseTarget};

use crate::engine::worker::Worker;

impl Worker {
    /// Install-or-upgrade on the deterministic release name, then one
    /// container per service and ACTIVE naming it (`core::provision`).
    pub(in crate::engine::worker) async fn provision(
        &self,
        instance: &Instance,
        entry: CatalogEntry,
        pinned: bool,
    ) -> Result<(), TaskError> {
        let name = &instance.name;
        let active = self
            .ports
            .store
            .load_active(name)
            .await
            .map_err(|e| TaskError::new(name, "load ACTIVE", e))?;
        let parameters = entry.parameters_of(&instance.parameters);
        let release = Self::rendered(instance, &entry, &parameters, |params| {
            entry.provisioning.spec_of(params, false)
        })?;
        let (containers, inhibitions) = if entry.provisioning == Provisioning::Docker {
            (
                self.containers_of(instance).await?,
                self.ports
                    .store
                    .load_inhibitions(name)
                    .await
                    .map_err(|e| TaskError::new(name, "load the inhibitions", e))?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let mut provision = Provision::new(ProvisionInput {
            containers,
            inhibitions,
            instance: instance.name.clone(),
            version: entry.version.clone(),
            spec_digest: entry.spec_digest.clone(),
            recorded_version: instance.version.clone(),
            recorded_digest: instance.spec_digest.clone(),
            release,
            services: entry.services,
            active,
            pinned,
        });
        self.drive_task(instance, &parameters, &mut provision).await;
        provision.into_report()?;
        self.move_to(instance, Provision::SETTLES_AT).await
    }

    /// Withdraw, stop and remove every container of the instance, release
    /// its claims, uninstall the release, mark it deleted
    /// (`core::provision`).
    pub(in crate::engine::worker) async fn deprovision(
        &self,
        instance: &Instance,
    ) -> Result<(), TaskError> {
        let p = &self.ports;
        let name = &instance.name;
        let active = p
            .store
            .load_active(name)
            .await
            .map_err(|e| TaskError::new(name, "load ACTIVE", e))?;
        let inhibitions = p
            .store
            .load_inhibitions(name)
            .await
            .map_err(|e| TaskError::new(name, "load the inhibitions", e))?;
        let release = self.release_target(instance)?;
        let mut deprovision = Deprovision::new(DeprovisionInput {
            instance: name.clone(),
            release,
            active,
            inhibitions,
            stop_grace_default: self.config.stop_grace_default,
            purge_volumes: instance.purge_volumes,
        });
        self.drive_task(instance, &BTreeMap::new(), &mut deprovision)
            .await;
        deprovision.into_report()?;
        self.move_to(instance, Deprovision::SETTLES_AT).await
    }

    /// Where the instance's release lives, by its type's provisioner. A
    /// type gone from the catalog was Docker's or Helm's, and stead cannot
    /// tell which: its containers are removed as a Docker release's, and
    /// the log says a Helm release, if it had one, is left installed.
    fn release_target(&self, instance: &Instance) -> Result<ReleaseTarget, TaskError> {
        let provisioning = match self.entry(instance) {
            Ok(entry) => entry.provisioning,
            Err(e) => {
                tracing::warn!(
                    instance = %instance.name,
                    "{e}: deprovisioned as a Docker release; a Helm release of it, if any, \
                     is left installed (keep a type in the catalog until its instances are deleted)"
                );
                Provisioning::Docker
            }
        };
        provisioning
            .target_of(&ReleaseParams::of(instance, &instance.version))
            .map_err(|e| TaskError::new(&instance.name, "name the release", e))
    }
}
