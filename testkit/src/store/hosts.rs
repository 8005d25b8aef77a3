//! Public host names reserved for an instance (#54), as the SQL stores
//! keep them: one holder per host, a holder that is deleted no longer
//! counts, and the reservation goes with its instance's row.

use std::collections::BTreeSet;

use stead::core::fleet::{InstanceId, InstanceState};
use stead::core::hosts::{HostReservation, HOSTS_PER_CLAIM_MAX};
use stead::core::types::{InstanceName, ServiceName, Timestamp};
use stead::ports::StoreError;
use stead::store::normalize_timestamp;

use super::State;

/// One `host_reservations` row.
#[derive(Clone, Debug)]
pub(super) struct HostRow {
    instance: InstanceId,
    service: ServiceName,
    created_at: Timestamp,
}

impl State {
    /// The live instance `id` names, if it is live.
    fn live(&self, id: InstanceId) -> Option<&InstanceName> {
        self.instances
            .get(&id)
            .filter(|i| i.state != InstanceState::Deleted)
            .map(|i| &i.name)
    }

    /// `Store::reserve_hosts`, under the store's one lock.
    pub(super) fn reserve_hosts(
        &mut self,
        instance: &InstanceName,
        service: &ServiceName,
        hosts: &[String],
        now: Timestamp,
    ) -> Result<Vec<HostReservation>, StoreError> {
        if hosts.len() > HOSTS_PER_CLAIM_MAX {
            return Err(StoreError::Conflict(format!(
                "hosts: {} in one claim, at most {HOSTS_PER_CLAIM_MAX}",
                hosts.len()
            )));
        }
        let claimant = self
            .instance_id(instance)
            .filter(|id| self.live(*id).is_some());
        let hosts: BTreeSet<&String> = hosts.iter().collect();
        let mut held = Vec::with_capacity(hosts.len());
        for host in hosts {
            let free = self
                .host_reservations
                .get(host)
                .is_none_or(|row| self.live(row.instance).is_none());
            if let (true, Some(id)) = (free, claimant) {
                let row = HostRow {
                    instance: id,
                    service: service.clone(),
                    created_at: normalize_timestamp(now),
                };
                self.host_reservations.insert(host.clone(), row);
            }
            held.extend(self.reservation(host));
        }
        Ok(held)
    }

    /// The reservation of `host`, if a live instance holds it.
    fn reservation(&self, host: &str) -> Option<HostReservation> {
        let row = self.host_reservations.get(host)?;
        Some(HostReservation {
            host: host.to_owned(),
            instance: self.live(row.instance)?.clone(),
            service: row.service.clone(),
            created_at: row.created_at,
        })
    }

    /// `Store::host_reservations`.
    pub(super) fn host_reservations(&self) -> Vec<HostReservation> {
        self.host_reservations
            .keys()
            .filter_map(|host| self.reservation(host))
            .collect()
    }
}

impl HostRow {
    /// The instance the row names (its foreign key).
    pub(super) fn instance(&self) -> InstanceId {
        self.instance
    }
}
