//! The reload hazards of a catalog the daemon starts with (#54), and the
//! start's verdict on them ([`judge_start`]): the one function `stead run`
//! and the simulation's restarts call.
//!
//! A reload refuses a catalog that would damage live instances (a type
//! dropped, a service or volume renamed: `core::catalog::reload_hazards`)
//! unless forced. A restart used to skip that check, since there is no
//! running catalog to compare with, so a refused catalog was applied
//! anyway at the next start. Here the comparison is with what the live
//! instances run: the recorded definition (`type_versions`) of each
//! version a live instance is at. `stead run` refuses hazards unless
//! `--force-catalog`; `stead check` reports them (exit 1).
//!
//! Not behind `io`: it needs a store and the core only, so the simulation
//! judges every catalog its daemons restart with by this very function.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::catalog::{reload_hazards, Catalog, ReloadHazard};
use crate::core::fleet::InstanceState;
use crate::core::grants::Grants;
use crate::ports::{Store, StoreError};

/// Whether a catalog reload (or a start) may damage live instances
/// ([`ReloadHazard`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadMode {
    /// Refuse a reload with a hazard (SIGHUP, `stead reload`; `stead run`).
    Guarded,
    /// Apply it anyway, logging each hazard (`stead reload --force`,
    /// `POST /reload?force=true`; `stead run --force-catalog`).
    Forced,
}

/// Why a start refused its catalog.
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    /// The store did not answer, so nothing shows the catalog is safe:
    /// fail closed (the unit restarts the daemon).
    #[error("cannot judge whether it would damage live instances: {0}")]
    Store(#[source] StoreError),
    /// The catalog would damage live instances and the start was not forced.
    #[error("refused at start, as a reload would be")]
    Hazards(StartHazards),
}

/// The verdict on the catalog a daemon starts with: `Ok` with what was
/// found (the hazards forced, the warnings) when it may be applied,
/// refused when it has hazards and `mode` is guarded, or when the store
/// cannot say. `broken` is the mutation exercise's (nothing in the daemon).
pub async fn judge_start(
    store: &dyn Store,
    catalog: &Catalog,
    grants: &Grants,
    mode: ReloadMode,
    broken: crate::core::broken::Armed,
) -> Result<StartHazards, StartRefused> {
    if crate::broken!(broken, SkipStartHazards) {
        return Ok(StartHazards::default());
    }
    let found = start_hazards(store, catalog, grants)
        .await
        .map_err(StartRefused::Store)?;
    if found.hazards.is_empty() || mode == ReloadMode::Forced {
        return Ok(found);
    }
    Err(StartRefused::Hazards(found))
}

/// What the check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StartHazards {
    /// The hazards, each once, in type order.
    pub hazards: Vec<ReloadHazard>,
    /// What could not be judged, and why (a version never recorded, a
    /// recorded definition today's grants refuse); each is a warning.
    pub unjudged: Vec<String>,
}

/// The hazards of `catalog` against the recorded definitions of the
/// versions live instances run.
pub async fn start_hazards(
    store: &dyn Store,
    catalog: &Catalog,
    grants: &Grants,
) -> Result<StartHazards, StoreError> {
    let live_types = store.live_service_types().await?;
    if live_types.is_empty() {
        return Ok(StartHazards::default());
    }
    let mut live_versions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for instance in store.list_instances().await?.rows {
        if instance.state != InstanceState::Deleted && live_types.contains(&instance.service_type) {
            live_versions
                .entry(instance.service_type)
                .or_default()
                .insert(instance.version);
        }
    }
    let mut found = StartHazards::default();
    for (service_type, versions) in live_versions {
        let recorded = store.type_versions(&service_type).await?;
        let only_this_type = BTreeSet::from([service_type.clone()]);
        for version in versions {
            // Its newest definition: what the last daemon to load the
            // version ran it as, so a start judges the catalog as a reload
            // from that daemon's would (a catalog forced once is not
            // refused again at the next start).
            let Some(row) = crate::store::recorded_definition(&recorded, &version, None) else {
                found.unjudged.push(format!(
                    "types.{service_type} version {version}: never recorded (instances from \
                     before stead recorded versions), so its changes cannot be judged"
                ));
                continue;
            };
            let file = format!("type_versions ({service_type} {version})");
            let before = match Catalog::from_toml(&row.source, &file, grants) {
                Ok(before) => before,
                Err(e) => {
                    found.unjudged.push(format!(
                        "types.{service_type} version {version}: its recorded definition does \
                         not load today ({e}), so its changes cannot be judged"
                    ));
                    continue;
                }
            };
            for hazard in reload_hazards(&before, catalog, &only_this_type) {
                if !found.hazards.contains(&hazard) {
                    found.hazards.push(hazard);
                }
            }
        }
    }
    Ok(found)
}
