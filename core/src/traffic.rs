//! The traffic plane reconciled, not remembered (T5): what to do about
//! routes the proxy holds, as read back at the start of a pass.
//!
//! A route the proxy lacks, or dials elsewhere, is the recovery machine's
//! business: it republishes after verifying the execution
//! ([`super::recovery::ProxyView`]). What is decided here is the opposite
//! case: routes the proxy holds that nothing may be routed by any more.

use std::collections::BTreeMap;

use super::fleet::{InstanceState, ListedInstance};
use super::hash::FastMap;
use super::types::{ActiveRecord, InstanceName, ServiceKey};

/// The routes a pass found in the proxy: service → loopback host port.
pub type HeldRoutes = BTreeMap<ServiceKey, u16>;

/// The routes a whole pass found in the proxy, grouped by instance, so
/// each instance's pass finds its own in one hashed lookup (issue #14: a
/// range over one fleet-wide ordered map cost every instance a chain of
/// name comparisons, each a cache miss in a large fleet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetRoutes {
    by_instance: FastMap<InstanceName, HeldRoutes>,
}

impl FromIterator<(ServiceKey, u16)> for FleetRoutes {
    fn from_iter<I: IntoIterator<Item = (ServiceKey, u16)>>(routes: I) -> Self {
        let mut by_instance: FastMap<InstanceName, HeldRoutes> = FastMap::default();
        for (key, port) in routes {
            by_instance
                .entry(key.instance.clone())
                .or_default()
                .insert(key, port);
        }
        Self { by_instance }
    }
}

impl FleetRoutes {
    /// Takes out the routes of one instance's services (its pass is the
    /// only one that reads them: no copy).
    pub fn take(&mut self, instance: &InstanceName) -> HeldRoutes {
        self.by_instance.remove(instance).unwrap_or_default()
    }
}

/// Routes of instances that are gone: deleted, or unknown to the store
/// (another tool's row, or one pruned). Nothing may be routed to them.
/// `instances` must have been listed *after* the routes were read, so an
/// instance created in between is in the list. In order.
pub(crate) fn routes_of_gone_instances(
    held: &FleetRoutes,
    instances: &[ListedInstance],
) -> Vec<ServiceKey> {
    let live: FastMap<&InstanceName, InstanceState> =
        instances.iter().map(|i| (&i.name, i.state)).collect();
    let mut gone: Vec<ServiceKey> = held
        .by_instance
        .iter()
        .filter(|(instance, _)| {
            live.get(instance)
                .is_none_or(|state| *state == InstanceState::Deleted)
        })
        .flat_map(|(_, routes)| routes.keys().cloned())
        .collect();
    // The groups come out of a hash map: in order, so the withdrawals do.
    gone.sort_unstable();
    gone
}

/// Routes of one live instance's services that ACTIVE no longer names
/// (a service its new version dropped, or one removed by hand).
pub(crate) fn routes_without_active(
    held: &HeldRoutes,
    instance: &InstanceName,
    active: &ActiveRecord,
) -> Vec<ServiceKey> {
    held.keys()
        .filter(|key| &key.instance == instance && !active.services.contains_key(&key.service))
        .cloned()
        .collect()
}
