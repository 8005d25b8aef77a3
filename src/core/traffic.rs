//! The traffic plane reconciled, not remembered (T5): what to do about
//! routes the proxy holds, as read back at the start of a pass.
//!
//! A route the proxy lacks, or dials elsewhere, is the recovery machine's
//! business: it republishes after verifying the execution
//! ([`super::recovery::ProxyView`]). What is decided here is the opposite
//! case: routes the proxy holds that nothing may be routed by any more.

use std::collections::BTreeMap;

use super::fleet::{Instance, InstanceState};
use super::hash::FastMap;
use super::types::{ActiveRecord, InstanceName, ServiceKey, ServiceName};

/// The routes a pass found in the proxy: service → loopback host port.
pub type HeldRoutes = BTreeMap<ServiceKey, u16>;

/// The routes of one instance's services (keys sort by instance first:
/// a range, not a scan of the fleet).
pub fn routes_of(held: &HeldRoutes, instance: &InstanceName) -> HeldRoutes {
    let first = ServiceKey {
        instance: instance.clone(),
        service: ServiceName::least(),
    };
    // Inserted one by one: `collect` would gather and sort a vector first,
    // which for an instance's few routes costs more than the map itself.
    let mut routes = HeldRoutes::new();
    routes.extend(
        held.range(first..)
            .take_while(|(key, _)| &key.instance == instance)
            .map(|(key, port)| (key.clone(), *port)),
    );
    routes
}

/// Routes of instances that are gone: deleted, or unknown to the store
/// (another tool's row, or one pruned). Nothing may be routed to them.
/// `instances` must have been listed *after* the routes were read, so an
/// instance created in between is in the list.
pub fn routes_of_gone_instances(held: &HeldRoutes, instances: &[Instance]) -> Vec<ServiceKey> {
    let live: FastMap<&InstanceName, InstanceState> =
        instances.iter().map(|i| (&i.name, i.state)).collect();
    held.keys()
        .filter(|key| {
            live.get(&key.instance)
                .is_none_or(|state| *state == InstanceState::Deleted)
        })
        .cloned()
        .collect()
}

/// Routes of one live instance's services that ACTIVE no longer names
/// (a service its new version dropped, or one removed by hand).
pub fn routes_without_active(
    held: &HeldRoutes,
    instance: &InstanceName,
    active: &ActiveRecord,
) -> Vec<ServiceKey> {
    held.keys()
        .filter(|key| &key.instance == instance && !active.services.contains_key(&key.service))
        .cloned()
        .collect()
}
