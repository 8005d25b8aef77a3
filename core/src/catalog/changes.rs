//! How a reloaded catalog differs from the one before.

use super::Catalog;

/// How a service type differs between two catalogs (a reload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogChange {
    Added {
        service_type: String,
        version: String,
    },
    Removed {
        service_type: String,
    },
    /// A new version: version drift plans its upgrades (C8).
    Version {
        service_type: String,
        from: String,
        to: String,
    },
    /// The spec changed but the version did not: rolled out as an upgrade
    /// to instances that recorded the old spec's digest.
    SpecWithoutVersion {
        service_type: String,
        version: String,
    },
    /// A type moved between Docker and Helm: its existing instances keep
    /// the release they were installed as until they are reprovisioned.
    Provisioner {
        service_type: String,
        from: &'static str,
        to: &'static str,
    },
    /// `security`, `rollout` or `bake_ms` changed.
    Settings {
        service_type: String,
    },
}

impl std::fmt::Display for CatalogChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Added {
                service_type,
                version,
            } => write!(f, "{service_type} added at version {version}"),
            Self::Removed { service_type } => write!(
                f,
                "{service_type} removed (its instances are no longer granted, R11)"
            ),
            Self::Version {
                service_type,
                from,
                to,
            } => write!(f, "{service_type} {from} -> {to}"),
            Self::SpecWithoutVersion {
                service_type,
                version,
            } => write!(
                f,
                "{service_type} spec changed at the same version {version} \
                 (rolled out as an upgrade, within the windows and max_in_flight)"
            ),
            Self::Settings { service_type } => {
                write!(
                    f,
                    "{service_type} security, rollout or bake setting changed"
                )
            }
            Self::Provisioner {
                service_type,
                from,
                to,
            } => write!(
                f,
                "{service_type} moved from {from} to {to} (existing instances keep \
                 their {from} release; delete and recreate them to move them)"
            ),
        }
    }
}

impl Catalog {
    /// What changed from `old` to `self`, in service-type order.
    pub fn changes_from(&self, old: &Catalog) -> Vec<CatalogChange> {
        let mut changes = Vec::new();
        for old_entry in old.entries() {
            if self.get(&old_entry.service_type).is_none() {
                changes.push(CatalogChange::Removed {
                    service_type: old_entry.service_type.clone(),
                });
            }
        }
        for entry in self.entries() {
            let service_type = entry.service_type.clone();
            let Some(before) = old.get(&entry.service_type) else {
                changes.push(CatalogChange::Added {
                    service_type,
                    version: entry.version.clone(),
                });
                continue;
            };
            if before.provisioning.word() != entry.provisioning.word() {
                changes.push(CatalogChange::Provisioner {
                    service_type,
                    from: before.provisioning.word(),
                    to: entry.provisioning.word(),
                });
            } else if before.version != entry.version {
                changes.push(CatalogChange::Version {
                    service_type,
                    from: before.version.clone(),
                    to: entry.version.clone(),
                });
            } else if before.services != entry.services || before.provisioning != entry.provisioning
            {
                changes.push(CatalogChange::SpecWithoutVersion {
                    service_type,
                    version: entry.version.clone(),
                });
            } else if (before.security, before.rollout, before.bake)
                != (entry.security, entry.rollout, entry.bake)
            {
                changes.push(CatalogChange::Settings { service_type });
            }
        }
        changes.sort_by(|a, b| change_type(a).cmp(change_type(b)));
        changes
    }
}

fn change_type(change: &CatalogChange) -> &str {
    match change {
        CatalogChange::Added { service_type, .. }
        | CatalogChange::Removed { service_type }
        | CatalogChange::Version { service_type, .. }
        | CatalogChange::SpecWithoutVersion { service_type, .. }
        | CatalogChange::Provisioner { service_type, .. }
        | CatalogChange::Settings { service_type } => service_type,
    }
}
