//! The daemon's one `Provisioner`: each call routed to the provisioner of
//! its release's kind (`core::release`), Docker's or Helm's, so one
//! daemon runs both kinds of service type side by side.

use std::sync::Arc;

use async_trait::async_trait;

use crate::engine::SharedCatalog;
use crate::ports::{HelmRelease, ReleaseHealth};
use crate::ports::{
    ProvisionError, Provisioner, Release, ReleaseKind, ReleaseSpec, ReleaseStatus, ReleaseTarget,
};

/// Routes each release to the provisioner of its kind.
pub struct RoutedProvisioner {
    docker: Arc<dyn Provisioner>,
    helm: Arc<dyn Provisioner>,
    /// Helm is asked for its releases only while the catalog has a Helm
    /// type: a Docker-only daemon needs neither `helm` nor a cluster.
    catalog: SharedCatalog,
}

impl RoutedProvisioner {
    pub fn new(
        docker: Arc<dyn Provisioner>,
        helm: Arc<dyn Provisioner>,
        catalog: SharedCatalog,
    ) -> Self {
        Self {
            docker,
            helm,
            catalog,
        }
    }

    fn of(&self, kind: ReleaseKind) -> &dyn Provisioner {
        match kind {
            ReleaseKind::Docker => self.docker.as_ref(),
            ReleaseKind::Helm => self.helm.as_ref(),
        }
    }
}

#[async_trait]
impl Provisioner for RoutedProvisioner {
    async fn install_or_upgrade(&self, release: &ReleaseSpec) -> Result<(), ProvisionError> {
        self.of(release.target().kind)
            .install_or_upgrade(release)
            .await
    }

    async fn uninstall(&self, release: &ReleaseTarget) -> Result<(), ProvisionError> {
        self.of(release.kind).uninstall(release).await
    }

    async fn roll_back(&self, release: &HelmRelease) -> Result<(), ProvisionError> {
        self.helm.roll_back(release).await
    }

    async fn check_release(
        &self,
        release: &ReleaseTarget,
        tests: bool,
    ) -> Result<ReleaseHealth, ProvisionError> {
        self.of(release.kind).check_release(release, tests).await
    }

    async fn roll_back_from(
        &self,
        release: &ReleaseTarget,
        bad_chart_version: &str,
        back_to: Option<&HelmRelease>,
    ) -> Result<(), ProvisionError> {
        self.of(release.kind)
            .roll_back_from(release, bad_chart_version, back_to)
            .await
    }

    /// Docker's releases, then Helm's when the catalog has a Helm type.
    /// Either failing fails the listing: drift then plans nothing this
    /// tick (C3) rather than take one provisioner's releases for missing.
    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError> {
        let mut releases = self.docker.list_releases().await?;
        let any_helm = self.catalog.current().entries().any(|e| !e.is_docker());
        if any_helm {
            releases.extend(self.helm.list_releases().await?);
        }
        releases.sort();
        releases.dedup();
        Ok(releases)
    }

    async fn status(
        &self,
        release: &ReleaseTarget,
    ) -> Result<Option<ReleaseStatus>, ProvisionError> {
        self.of(release.kind).status(release).await
    }
}
