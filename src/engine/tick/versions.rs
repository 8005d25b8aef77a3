//! The catalog's type versions, recorded by the leader (#40, #54): the
//! history `rollout undo --to` moves a type back along and a start's
//! hazard check judges against.

use crate::core::catalog::Catalog;
use crate::core::types::Timestamp;
use crate::ports::{LeaseGrant, TypeVersion};

use super::Reconciler;

impl Reconciler {
    /// Records each type's version as `catalog` defines it (#40): the
    /// history `rollout undo --to` moves a type back along and reloads are
    /// judged against. Written by the lease holder only (fenced), once per
    /// definition and never rewritten (#54). Best effort: a write that
    /// fails is logged and tried again next tick.
    pub(super) async fn record_type_versions(
        &self,
        catalog: &Catalog,
        now: Timestamp,
        fence: &LeaseGrant,
    ) {
        for entry in catalog.entries() {
            let Some(source) = catalog.source_of(&entry.service_type) else {
                continue;
            };
            let key = (
                entry.service_type.clone(),
                entry.version.clone(),
                entry.spec_digest.clone(),
            );
            if self
                .recorded_versions
                .lock()
                .expect("poisoned")
                .contains(&key)
            {
                continue;
            }
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
                .record_type_version(&recorded, Some(fence))
                .await
            {
                Ok(new) => {
                    if new {
                        tracing::info!(
                            service_type = %entry.service_type,
                            version = %entry.version,
                            spec_digest = %entry.spec_digest,
                            "recorded this version of the type for `rollout undo --to`"
                        );
                    }
                    self.recorded_versions.lock().expect("poisoned").insert(key);
                }
                Err(e) => tracing::warn!(
                    service_type = %entry.service_type,
                    version = %entry.version,
                    error = %e,
                    "this version was not recorded for `rollout undo --to`; tried again next tick"
                ),
            }
        }
    }
}
