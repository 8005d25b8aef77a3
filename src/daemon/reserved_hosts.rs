//! What `stead status` and `stead instance why` say of public host names
//! (#54): the hosts of a service that another live instance holds, so the
//! service is not served under them. Read from the store's reservations
//! and decided by the core's own grant (`core::hosts::grant_hosts`), the
//! rule a publish follows.

use serde::{Deserialize, Serialize};

use crate::core::broken::Armed;
use crate::core::fleet::Instance;
use crate::core::hosts::grant_hosts;
use crate::core::types::ServiceName;

use super::status::{Status, StatusSources};

/// A host a service asks for and another live instance holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedHost {
    pub host: String,
    /// The instance it is reserved for until that instance is deleted.
    pub holder: String,
}

/// The public hosts of `service` of `instance`: the catalog's, rendered,
/// and those it was given at create where the service takes them.
fn wanted_hosts(from: &StatusSources<'_>, instance: &Instance, service: &str) -> Vec<String> {
    let service = ServiceName::new(service);
    from.catalog
        .get(&instance.service_type)
        .and_then(|entry| entry.services.iter().find(|s| s.name == service))
        .map(|spec| {
            spec.hosts()
                .render(&instance.name, &service, &instance.domains)
        })
        .unwrap_or_default()
}

/// Fills each row's refused hosts. The reservations are read once, and
/// only when some row's service has public hosts.
pub(super) async fn mark_refused_hosts(
    from: &StatusSources<'_>,
    instances: &[&Instance],
    status: &mut Status,
) {
    let mut wanted: Vec<(usize, &Instance, Vec<String>)> = Vec::new();
    for (i, row) in status.rows.iter().enumerate() {
        let Some(instance) = instances.iter().find(|x| x.name.as_str() == row.instance) else {
            continue;
        };
        let hosts = wanted_hosts(from, instance, &row.service);
        if !hosts.is_empty() {
            wanted.push((i, instance, hosts));
        }
    }
    if wanted.is_empty() {
        return;
    }
    let reservations = match from.store.host_reservations().await {
        Ok(r) => r,
        Err(e) => {
            status.errors.push(format!("host reservations: {e}"));
            return;
        }
    };
    for (i, instance, hosts) in wanted {
        let grant = grant_hosts(&instance.name, &hosts, &reservations, Armed::default());
        // A host nobody holds yet is not refused: the next publish
        // claims it.
        status.rows[i].hosts_refused = grant
            .refused
            .into_iter()
            .filter_map(|r| {
                r.holder.map(|holder| RefusedHost {
                    host: r.host,
                    holder: holder.to_string(),
                })
            })
            .collect();
    }
}
