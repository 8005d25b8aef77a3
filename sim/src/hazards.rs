//! N4 (#54): a hazardous catalog is never applied unless that start was
//! forced, across restarts.
//!
//! Every catalog the daemons restart with goes through the start's own
//! verdict (`engine::start_hazards::judge_start`, what `stead run` calls)
//! against what the store records. Now and then the operator's new file
//! is hazardous: it renames the named volume every service of the Docker
//! type mounts (`data` to `data-moved` at the same path), which would
//! start every service on an empty volume. Started without
//! `--force-catalog` it must be refused, and the operator puts the file
//! back; forced, it is applied, and the operator keeps the rename, so each
//! later file is refused for it while an instance still runs a version
//! recorded with the old name, and the operator, who accepted that
//! hazard, forces those starts too.
//!
//! The judge's model of a hazard is the world's own: a live instance of
//! the Docker type at a version the store records with a volume name the
//! new file does not mount. Nothing of the code's accounting is used.

use std::sync::atomic::Ordering;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stead::core::catalog::Catalog;
use stead::core::fleet::InstanceState;
use stead::core::spec::MountSource;
use stead::engine::start_hazards::{judge_start, ReloadMode, StartRefused};
use stead_testkit::store::MemoryStore;

use crate::checker::Checker;
use crate::world::{Actors, SERVICE_TYPE};

/// N4's two judgements: a catalog applied, a catalog refused.
pub const N4_APPLIED: &str =
    "N4 a hazardous catalog is never applied without force, across restarts";
pub const N4_REFUSED: &str = "N4 a start refuses a catalog only for a hazard";

/// The named volume a hazardous file mounts in place of `data`.
pub const MOVED_VOLUME: &str = "data-moved";
/// The share of catalog bumps whose file is hazardous, until the operator
/// forced one; and the share of those started with `--force-catalog`.
const HAZARDOUS_P: f64 = 0.3;
const FORCED_P: f64 = 0.4;

/// `catalog` with the Docker type's every named volume renamed to
/// `volume`, at the same paths: what a hazardous file says.
pub fn with_volume(catalog: &Catalog, volume: &str) -> Catalog {
    Catalog::from_entries(catalog.entries().cloned().map(|mut entry| {
        if entry.service_type == SERVICE_TYPE {
            for service in &mut entry.services {
                for mount in &mut service.run.mounts {
                    if let MountSource::Volume(name) = &mut mount.source {
                        *name = volume.to_owned();
                    }
                }
            }
            entry.spec_digest = entry.digest();
        }
        entry
    }))
    .with_grants(crate::run::sim_grants())
}

/// The volume `catalog`'s Docker type mounts.
fn volume_of(catalog: &Catalog) -> &str {
    if catalog
        .get(SERVICE_TYPE)
        .into_iter()
        .flat_map(|e| &e.services)
        .flat_map(|s| &s.run.mounts)
        .any(|m| m.source == MountSource::Volume(MOVED_VOLUME.to_owned()))
    {
        MOVED_VOLUME
    } else {
        "data"
    }
}

/// Whether starting with a file that mounts `volume` endangers a live
/// instance, by the store's state: one of the Docker type at a version
/// whose newest recorded definition mounts another volume name (what the
/// last daemon to load that version ran it as: a file forced once is
/// recorded beside the old definition, and a reload from that daemon
/// would find no change).
fn hazardous(store: &MemoryStore, volume: &str) -> bool {
    let recorded = store.type_versions_now();
    let moved = format!("\"{MOVED_VOLUME}\"");
    store.all_instances().iter().any(|instance| {
        instance.state != InstanceState::Deleted
            && instance.service_type == SERVICE_TYPE
            && recorded
                .iter()
                .filter(|row| row.service_type == SERVICE_TYPE && row.version == instance.version)
                .max_by_key(|row| row.recorded_at)
                .is_some_and(|row| {
                    let was = if row.source.contains(&moved) {
                        MOVED_VOLUME
                    } else {
                        "data"
                    };
                    was != volume
                })
    })
}

/// The daemons' start with `catalog` in `mode`, judged: `true` if it may
/// be applied.
async fn start(
    checker: &Checker,
    store: &MemoryStore,
    catalog: &Catalog,
    mode: ReloadMode,
    broken: stead::core::broken::Armed,
) -> bool {
    let expected = hazardous(store, volume_of(catalog));
    if expected {
        checker.count_case("N4 case: a start with a hazardous catalog");
    }
    let forced = mode == ReloadMode::Forced;
    match judge_start(store, catalog, &Default::default(), mode, broken).await {
        Ok(_) => {
            checker.judge(N4_APPLIED, !expected || forced, || {
                format!(
                    "a catalog mounting {:?} was applied unforced over instances recorded \
                     with another volume",
                    volume_of(catalog)
                )
            });
            true
        }
        Err(StartRefused::Hazards(found)) => {
            checker.judge(N4_REFUSED, expected && !forced, || {
                format!("a start ({mode:?}) was refused for {:?}", found.hazards)
            });
            false
        }
        // Fail closed: the store did not say. The sim's store answers
        // between ticks, so this is a start that never happened.
        Err(StartRefused::Store(_)) => false,
    }
}

/// The catalog the daemons restart with after the operator's bump to
/// `standard` (the file as the world renders it), judged at each start.
pub async fn restart_with(
    actors: &Actors,
    checker: &Checker,
    store: &MemoryStore,
    standard: Catalog,
    rng: &mut ChaCha8Rng,
    broken: stead::core::broken::Armed,
) -> Catalog {
    if !actors.volume_moved.load(Ordering::Relaxed) && rng.random_bool(HAZARDOUS_P) {
        let attempt = with_volume(&standard, MOVED_VOLUME);
        let mode = if rng.random_bool(FORCED_P) {
            ReloadMode::Forced
        } else {
            ReloadMode::Guarded
        };
        actors.counts.bump(if mode == ReloadMode::Forced {
            "operator restarted with a hazardous catalog, forced"
        } else {
            "operator restarted with a hazardous catalog"
        });
        if start(checker, store, &attempt, mode, broken).await {
            actors.volume_moved.store(true, Ordering::Relaxed);
            return attempt;
        }
        // Refused: the operator puts the file back.
    }
    if start(checker, store, &standard, ReloadMode::Guarded, broken).await {
        return standard;
    }
    // Refused for the rename the operator forced before: forced again.
    actors
        .counts
        .bump("operator forced a catalog it had accepted the hazard of");
    if !start(checker, store, &standard, ReloadMode::Forced, broken).await {
        actors
            .counts
            .bump("catalog start not judged: the store did not answer");
    }
    standard
}
