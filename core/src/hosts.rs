//! Public host names held by the instance that first claimed them (#54):
//! which hosts a publish may carry, given the reservations the store
//! answered.
//!
//! A host name from the catalog's `domains` (`domains.rs`) is reserved
//! for an instance the first time a publish of that instance claims it,
//! and stays reserved until the instance is deleted: not when its route is
//! withdrawn (a crash, a stop-first upgrade), not while it is stopped or
//! upgrading. Another instance asking for it is refused that host, and
//! only that host: its other hosts and its loopback route are published as
//! usual. The store makes the claim atomic (an insert that succeeds only
//! while no live instance holds the host, `Store::reserve_hosts`); this
//! module decides from its answer, so the engine only performs.

use std::collections::BTreeMap;

use crate::broken::Armed;
use crate::types::{InstanceName, ServiceName, Timestamp};

/// Most host names one claim reserves: a service's `domains`
/// ([`crate::domains`]'s bound, stated once).
pub const HOSTS_PER_CLAIM_MAX: usize = crate::domains::DOMAINS_PER_SERVICE_MAX;

/// A public host name reserved for a live instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostReservation {
    pub host: String,
    /// The instance it is reserved for until that instance is deleted.
    pub instance: InstanceName,
    /// The service whose publish first claimed it.
    pub service: ServiceName,
    pub created_at: Timestamp,
}

/// A host a publish may not carry, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRefusal {
    pub host: String,
    /// The live instance the host is reserved for; `None`: the store
    /// reserved it for nobody (the claiming instance is no longer live),
    /// and a host is never published unreserved.
    pub holder: Option<InstanceName>,
}

impl HostRefusal {
    /// One plain sentence for the log, the event log and `instance why`.
    pub fn sentence(&self, claimant: &InstanceName) -> String {
        match &self.holder {
            Some(holder) => format!(
                "host {} is reserved for instance {holder} until it is deleted; \
                 {claimant} is not served under it",
                self.host
            ),
            None => format!(
                "host {} could not be reserved for {claimant} (not a live instance); \
                 it is not served under it",
                self.host
            ),
        }
    }
}

/// Which of the hosts asked for a publish carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostGrant {
    /// In the order asked.
    pub granted: Vec<String>,
    /// In the order asked.
    pub refused: Vec<HostRefusal>,
}

/// The hosts of `wanted` a publish of `instance` may carry: exactly those
/// `reservations` (the store's answer to the claim) hold for `instance`
/// itself. A host reserved for another live instance is refused, naming
/// it; a host reserved for nobody is refused too (fail closed).
pub fn grant_hosts(
    instance: &InstanceName,
    wanted: &[String],
    reservations: &[HostReservation],
    broken: Armed,
) -> HostGrant {
    let holders: BTreeMap<&str, &InstanceName> = reservations
        .iter()
        .map(|r| (r.host.as_str(), &r.instance))
        .collect();
    let mut grant = HostGrant::default();
    for host in wanted {
        let holder = holders.get(host.as_str()).copied();
        if holder == Some(instance) || crate::broken!(broken, IgnoreHostReservations) {
            grant.granted.push(host.clone());
        } else {
            grant.refused.push(HostRefusal {
                host: host.clone(),
                holder: holder.cloned(),
            });
        }
    }
    grant
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved(host: &str, instance: &str) -> HostReservation {
        HostReservation {
            host: host.to_owned(),
            instance: instance.into(),
            service: "web".into(),
            created_at: Timestamp::UNIX_EPOCH,
        }
    }

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| (*h).to_owned()).collect()
    }

    #[test]
    fn a_host_reserved_for_the_instance_itself_is_granted() {
        let grant = grant_hosts(
            &"shop".into(),
            &hosts(&["shop.example.com"]),
            &[reserved("shop.example.com", "shop")],
            Armed::default(),
        );
        assert_eq!(grant.granted, hosts(&["shop.example.com"]));
        assert!(grant.refused.is_empty());
    }

    #[test]
    fn a_host_reserved_for_another_live_instance_is_refused_naming_its_holder() {
        let grant = grant_hosts(
            &"thief".into(),
            &hosts(&["shop.example.com"]),
            &[reserved("shop.example.com", "shop")],
            Armed::default(),
        );
        assert!(grant.granted.is_empty());
        assert_eq!(
            grant.refused,
            vec![HostRefusal {
                host: "shop.example.com".into(),
                holder: Some("shop".into()),
            }]
        );
        let said = grant.refused[0].sentence(&"thief".into());
        assert!(
            said.contains("shop.example.com") && said.contains("instance shop"),
            "{said}"
        );
    }

    #[test]
    fn a_host_the_store_reserved_for_nobody_is_never_published() {
        let grant = grant_hosts(
            &"gone".into(),
            &hosts(&["shop.example.com"]),
            &[],
            Armed::default(),
        );
        assert!(grant.granted.is_empty());
        assert_eq!(grant.refused[0].holder, None);
    }

    #[test]
    fn a_refused_host_leaves_the_instances_other_hosts_granted_in_order() {
        let grant = grant_hosts(
            &"b".into(),
            &hosts(&["b.example.com", "shop.example.com", "www.b.example.com"]),
            &[
                reserved("shop.example.com", "a"),
                reserved("b.example.com", "b"),
                reserved("www.b.example.com", "b"),
            ],
            Armed::default(),
        );
        assert_eq!(
            grant.granted,
            hosts(&["b.example.com", "www.b.example.com"])
        );
        assert_eq!(grant.refused.len(), 1);
        assert_eq!(grant.refused[0].host, "shop.example.com");
    }

    #[test]
    fn nothing_asked_is_nothing_granted_or_refused() {
        let grant = grant_hosts(
            &"a".into(),
            &[],
            &[reserved("shop.example.com", "a")],
            Armed::default(),
        );
        assert_eq!(grant, HostGrant::default());
    }
}
