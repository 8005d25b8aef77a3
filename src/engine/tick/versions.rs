//! The leader records each definition of the catalog it runs (#40, #54):
//! the history `rollout undo --to` moves a type back along and the start
//! check judges a new catalog against. Only under the reconciler lease,
//! so a standby's catalog (which may differ) is never recorded as run,
//! and each definition once: the store never rewrites a row.

use std::sync::Arc;

use crate::core::catalog::Catalog;
use crate::ports::TypeVersion;

use super::Reconciler;

impl Reconciler {
    /// Records `catalog`'s definitions unless this leadership recorded
    /// this very catalog already. Best effort: a definition not recorded
    /// (the store did not answer, the lease was lost) is tried again at
    /// the next tick.
    pub(super) async fn record_catalog(&self, catalog: &Arc<Catalog>) {
        let done = self
            .recorded_catalog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|recorded| Arc::ptr_eq(recorded, catalog));
        if done {
            return;
        }
        let Some(fence) = self.recoverer.lease().current() else {
            return;
        };
        let now = self.ports.clock.now();
        let mut all = true;
        for entry in catalog.entries() {
            let Some(source) = catalog.source_of(&entry.service_type) else {
                continue;
            };
            let recorded = TypeVersion {
                service_type: entry.service_type.clone(),
                version: entry.version.clone(),
                spec_digest: entry.spec_digest.clone(),
                source: source.to_owned(),
                recorded_at: now,
            };
            match self
                .ports
                .store
                .record_type_version(&recorded, Some(&fence))
                .await
            {
                Ok(true) => tracing::info!(
                    service_type = %entry.service_type,
                    version = %entry.version,
                    digest = %&entry.spec_digest[..entry.spec_digest.len().min(12)],
                    "recorded this definition of the type for `rollout undo --to` and the start check"
                ),
                Ok(false) => {}
                Err(e) => {
                    all = false;
                    tracing::warn!(
                        service_type = %entry.service_type,
                        version = %entry.version,
                        error = %e,
                        "this version was not recorded for `rollout undo --to`; tried again next tick"
                    );
                }
            }
        }
        if all {
            *self
                .recorded_catalog
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(catalog.clone());
        }
    }
}
