//! The changes of a reload that would silently damage running instances.

use std::collections::BTreeSet;

use super::{Catalog, CatalogEntry};
use crate::spec::{MountSource, ServiceSpec};

/// A change of a reload that would silently damage instances already
/// running: refused unless the operator forces it (`stead reload --force`).
/// Each names the type and the old and new values; only a type with live
/// (not deleted) instances has hazards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadHazard {
    /// The type is gone while instances of it live: they lose their grant
    /// (R11) and stead no longer knows where their releases are.
    TypeDropped { service_type: String },
    /// The type moved between Docker and Helm: its instances keep the
    /// release they were installed as, which nothing then recovers.
    ProvisionerMoved {
        service_type: String,
        from: &'static str,
        to: &'static str,
    },
    /// Services were removed *and* added at once, most likely a rename:
    /// every instance would start the added service on empty volumes.
    ServicesRenamed {
        service_type: String,
        removed: Vec<String>,
        added: Vec<String>,
    },
    /// A named volume a service mounted is gone from it (renamed, most
    /// likely): every instance would start that service on an empty
    /// volume. `to` is the named volume now mounted at the same path.
    VolumeRenamed {
        service_type: String,
        service: String,
        path: String,
        from: String,
        to: Option<String>,
    },
}

impl std::fmt::Display for ReloadHazard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TypeDropped { service_type } => write!(
                f,
                "types.{service_type}: removed while it has live instances (they would lose \
                 their grant; delete them first)"
            ),
            Self::ProvisionerMoved {
                service_type,
                from,
                to,
            } => write!(
                f,
                "types.{service_type}: provisioner {from} -> {to} while it has live instances \
                 (they keep their {from} release, which nothing would recover)"
            ),
            Self::ServicesRenamed {
                service_type,
                removed,
                added,
            } => write!(
                f,
                "types.{service_type}.services: {} -> {} while it has live instances (a \
                 rename: every instance would start {} on empty volumes)",
                removed.join(", "),
                added.join(", "),
                added.join(", ")
            ),
            Self::VolumeRenamed {
                service_type,
                service,
                path,
                from,
                to,
            } => write!(
                f,
                "types.{service_type}.services.{service}.volumes: named volume {from} -> {} \
                 at {path} while it has live instances (every instance would lose the data \
                 in {from})",
                to.as_deref().unwrap_or("none")
            ),
        }
    }
}

/// The changes from `old` to `new` that would damage live instances: those
/// of the types in `live_types` (types with instances not deleted). In
/// service-type order, then service, then volume. Removing a service alone
/// (retired on upgrade) or adding one alone is no hazard.
pub fn reload_hazards(
    old: &Catalog,
    new: &Catalog,
    live_types: &BTreeSet<String>,
) -> Vec<ReloadHazard> {
    let mut hazards = Vec::new();
    for service_type in live_types {
        let Some(before) = old.get(service_type) else {
            // Not in the running catalog: nothing of it runs that a
            // reload could break.
            continue;
        };
        let Some(after) = new.get(service_type) else {
            hazards.push(ReloadHazard::TypeDropped {
                service_type: service_type.clone(),
            });
            continue;
        };
        if before.provisioning.word() != after.provisioning.word() {
            hazards.push(ReloadHazard::ProvisionerMoved {
                service_type: service_type.clone(),
                from: before.provisioning.word(),
                to: after.provisioning.word(),
            });
            continue;
        }
        service_hazards(before, after, &mut hazards);
    }
    hazards
}

/// The hazards between two versions of one type on the same provisioner.
fn service_hazards(before: &CatalogEntry, after: &CatalogEntry, hazards: &mut Vec<ReloadHazard>) {
    let names = |entry: &CatalogEntry| -> BTreeSet<String> {
        entry
            .services
            .iter()
            .map(|s| s.name.as_str().to_owned())
            .collect()
    };
    let (names_before, names_after) = (names(before), names(after));
    let removed: Vec<String> = names_before.difference(&names_after).cloned().collect();
    let added: Vec<String> = names_after.difference(&names_before).cloned().collect();
    if !removed.is_empty() && !added.is_empty() {
        hazards.push(ReloadHazard::ServicesRenamed {
            service_type: before.service_type.clone(),
            removed,
            added,
        });
    }
    for service in &before.services {
        let Some(kept) = after.services.iter().find(|s| s.name == service.name) else {
            continue;
        };
        for (from, path) in named_volumes(service) {
            if named_volumes(kept).any(|(name, _)| name == from) {
                continue;
            }
            let to = named_volumes(kept)
                .find(|(_, at)| *at == path)
                .map(|(name, _)| name.to_owned());
            hazards.push(ReloadHazard::VolumeRenamed {
                service_type: before.service_type.clone(),
                service: service.name.as_str().to_owned(),
                path: path.to_owned(),
                from: from.to_owned(),
                to,
            });
        }
    }
}

/// A service's named volumes with their mount paths, in catalog order.
fn named_volumes(service: &ServiceSpec) -> impl Iterator<Item = (&str, &str)> {
    service.run.mounts.iter().filter_map(|m| match &m.source {
        MountSource::Volume(name) => Some((name.as_str(), m.target.as_str())),
        MountSource::HostPath(_) => None,
    })
}
