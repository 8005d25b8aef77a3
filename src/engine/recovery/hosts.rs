//! The public host names a publish carries (#54): the catalog's hosts of
//! the service, claimed in the store, and of those the ones the core's
//! grant (`core::hosts::grant_hosts`) allows. A refused host is told in
//! the log and the event log, naming its holder. No decisions here.

use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::Instance;
use crate::core::hosts::{grant_hosts, HostRefusal};
use crate::core::types::{GenerationKey, Timestamp};
use crate::ports::{LeaseGrant, TrafficError};

use super::Recoverer;

/// The event log's reason for a refused host.
const HOST_REFUSED_REASON: &str = "host-reserved";

impl Recoverer {
    /// The public hosts `key`'s route may carry. A store that cannot take
    /// the claim fails the publish, as a proxy that cannot take the route
    /// does: nothing is published, and the next pass tries again (T5).
    pub(super) async fn granted_hosts(
        &self,
        instance: &Instance,
        key: &GenerationKey,
        fence: Option<&LeaseGrant>,
    ) -> Result<Vec<String>, TrafficError> {
        let wanted = self.public_hosts(instance, key);
        if wanted.is_empty() {
            // Nothing to claim: no store call for a service without hosts.
            return Ok(wanted);
        }
        let now = self.ports.clock.now();
        let reservations = self
            .ports
            .store
            .reserve_hosts(&key.instance, &key.service, &wanted, now, fence)
            .await
            .map_err(|e| {
                TrafficError::Unreachable(format!(
                    "route {}/{} not published: its public hosts could not be claimed: {e}",
                    key.instance, key.service
                ))
            })?;
        let grant = grant_hosts(&key.instance, &wanted, &reservations, self.policy.broken);
        for refusal in &grant.refused {
            self.tell_refused(key, refusal, now);
        }
        Ok(grant.granted)
    }

    /// The public host names of `key`'s service: its type's `domains`
    /// templates rendered for this instance (#43), and the names the
    /// instance was given at create where the service takes them (#54).
    fn public_hosts(&self, instance: &Instance, key: &GenerationKey) -> Vec<String> {
        self.domains
            .lock()
            .expect("domains poisoned")
            .get(&(instance.service_type.clone(), key.service.clone()))
            .map(|hosts| hosts.render(&key.instance, &key.service, &instance.domains))
            .unwrap_or_default()
    }

    /// Logs and records a host the publish of `key` was refused.
    fn tell_refused(&self, key: &GenerationKey, refusal: &HostRefusal, now: Timestamp) {
        let sentence = refusal.sentence(&key.instance);
        tracing::warn!(
            instance = %key.instance,
            service = %key.service,
            host = %refusal.host,
            holder = refusal.holder.as_ref().map_or("none", |h| h.as_str()),
            "{sentence}"
        );
        metrics::counter!("stead_hosts_refused_total").increment(1);
        self.events().emit(
            Event::new(EventKind::HostRefused, now, HOST_REFUSED_REASON, sentence)
                .instance(&key.instance)
                .service(&key.service)
                .container(&key.container),
        );
    }
}
