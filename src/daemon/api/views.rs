//! What the API takes and answers, as JSON: the wire types, each with its
//! schema in the OpenAPI document. The core's types stay free of serde
//! (they are converted here, at the edge).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::core::catalog::CatalogEntry;
use crate::core::event_log::LoggedEvent;
use crate::core::fleet::Instance;

/// `POST /v1/instances`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInstance {
    /// The instance's name: a DNS label of at most 53 characters that
    /// starts with a letter, unique across the fleet (it names routes and
    /// containers; `core::names::INSTANCE_NAME_LEN_MAX`).
    #[schema(
        pattern = "^[a-z]([a-z0-9-]{0,51}[a-z0-9])?$",
        min_length = 1,
        max_length = 53
    )]
    pub name: String,
    /// The catalog's service type.
    #[serde(rename = "type")]
    #[schema(min_length = 1, max_length = 128)]
    pub service_type: String,
    /// The type's declared parameters (`{param.NAME}` in its templates).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Time to live in seconds; the instance is deleted after it. None: it
    /// lives until deleted.
    #[schema(minimum = 60, maximum = 315_360_000)]
    pub ttl_s: Option<u64>,
    /// When its upgrades may run: `"sun 03:00-05:00 Europe/Paris"`.
    #[schema(max_length = 200)]
    pub maintenance_window: Option<String>,
    /// Public host names to serve the instance's service under (the
    /// type's service with `tenant_domains`), each within a domain the
    /// team is allowed (`teams.NAME.domain_suffixes`).
    #[serde(default)]
    #[schema(max_items = 16)]
    pub domains: Vec<String>,
}

/// One instance as the API shows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct InstanceView {
    pub name: String,
    pub team: String,
    #[serde(rename = "type")]
    pub service_type: String,
    pub version: String,
    /// provisioning, ready, upgrading, deleting, deleted or failed.
    pub state: String,
    /// Whether its intent is stopped.
    pub stopped: bool,
    pub created_at: String,
    pub updated_at: String,
    pub expires_at: Option<String>,
    pub maintenance_window: Option<String>,
    pub parameters: BTreeMap<String, String>,
    /// The public host names it was given at create.
    pub domains: Vec<String>,
    /// Where its services are served: Caddy's routes by host name.
    pub urls: Vec<String>,
}

/// What the host names of an instance's routes are built from.
#[derive(Clone, Debug, Default)]
pub struct Served {
    /// `caddy.host_suffix`.
    pub host_suffix: String,
    /// The port of `caddy.listen`, when it is not 80.
    pub port: Option<u16>,
}

impl Served {
    /// The URLs `instance` is served at: one per service of its type,
    /// `http://<service>.<instance>.<host_suffix>`, and `https://` for
    /// each public host name the catalog gives a service.
    pub fn urls(&self, instance: &Instance, entry: Option<&CatalogEntry>) -> Vec<String> {
        let Some(entry) = entry else {
            return Vec::new();
        };
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        let mut urls = Vec::new();
        for service in &entry.services {
            urls.push(format!(
                "http://{}.{}.{}{port}/",
                service.name, instance.name, self.host_suffix
            ));
            let hosts = service
                .hosts()
                .render(&instance.name, &service.name, &instance.domains);
            urls.extend(hosts.into_iter().map(|host| format!("https://{host}/")));
        }
        urls
    }
}

impl InstanceView {
    pub fn new(instance: &Instance, urls: Vec<String>) -> Self {
        Self {
            name: instance.name.to_string(),
            team: instance.team.clone(),
            service_type: instance.service_type.clone(),
            version: instance.version.clone(),
            state: instance.state.to_string(),
            stopped: instance.stopped,
            created_at: instance.created_at.to_string(),
            updated_at: instance.updated_at.to_string(),
            expires_at: instance.expires_at.map(|t| t.to_string()),
            maintenance_window: instance.maintenance_window.clone(),
            parameters: instance.parameters.clone(),
            domains: instance.domains.clone(),
            urls,
        }
    }
}

/// A page of `GET /v1/instances`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct InstancePage {
    pub instances: Vec<InstanceView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// One service of an instance: the container ACTIVE names, if any.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ServiceView {
    pub name: String,
    /// The container serving it now; none before provisioning made one.
    pub container: Option<String>,
}

/// One line of an instance's event log.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct EventView {
    pub id: i64,
    pub at: String,
    pub kind: String,
    pub service: Option<String>,
    pub reason: String,
    pub message: String,
}

impl From<&LoggedEvent> for EventView {
    fn from(logged: &LoggedEvent) -> Self {
        let event = &logged.event;
        Self {
            id: logged.id,
            at: event.at.to_string(),
            kind: event.kind.to_string(),
            service: event.service.as_ref().map(|s| s.to_string()),
            reason: event.reason.clone(),
            message: event.message.clone(),
        }
    }
}

/// `GET /v1/instances/{name}`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct InstanceDetail {
    pub instance: InstanceView,
    pub services: Vec<ServiceView>,
    /// Its most recent events, oldest first.
    pub events: Vec<EventView>,
}

/// What a change did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Change {
    pub instance: InstanceView,
    /// What changed, as a sentence; "nothing changed" when it already was.
    pub message: String,
}

/// `POST /v1/rollouts/{type}/halt|resume`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RolloutChange {
    #[serde(rename = "type")]
    pub service_type: String,
    /// halted or active.
    pub state: String,
    /// The queued upgrades a halt cancelled.
    pub cancelled_tasks: Vec<i64>,
}
