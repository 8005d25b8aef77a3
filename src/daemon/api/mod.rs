//! The tenant API (#54): JSON over HTTP under `/v1` on its own listener
//! (`api_listen`, off by default). A team's portal or CLI creates, reads,
//! stops, starts, retries and deletes its instances with a bearer token;
//! an operator's token sees the fleet and halts and resumes rollouts.
//!
//! Every handler runs the same [`Ops`] command the CLI runs, scoped to the
//! caller's team ([`Ops::scoped`]): one set of checks, messages and
//! effects. Every change records an event naming the token and the team.
//! The OpenAPI 3.1 document at `/v1/openapi.json` is generated from the
//! handlers and wire types here (`utoipa`), never written by hand.
//!
//! The listener refuses a `Host` it does not serve (DNS rebinding) and
//! holds at most `api_max_connections` connections (`listener.rs`).

mod auth;
mod holds;
mod idempotency;
mod instances;
mod listener;
mod openapi;
mod problem;
mod rollouts;
pub mod views;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::Router;
use tokio::sync::watch;

use crate::config::daemon::ApiSettings;
use crate::core::event_log::{Event, EventKind};
use crate::core::types::InstanceName;
use crate::daemon::listener::{CappedListener, HostAllowlist};
use crate::engine::SharedCatalog;
use crate::ops::{Ops, Scope};
use crate::ports::{Clock, Store, TeamQuota};

pub use auth::Caller;
pub use listener::{bind, ApiBindError};
pub use problem::{Problem, PROBLEM_JSON};

/// Longest request body: a create is a few hundred bytes; parameters are
/// at most a few KiB.
const BODY_LEN_MAX: usize = 64 * 1024;

/// What the API's handlers share.
#[derive(Clone)]
pub struct ApiState {
    store: Arc<dyn Store>,
    catalog: SharedCatalog,
    clock: Arc<dyn Clock>,
    settings: Arc<ApiSettings>,
    teams: Arc<BTreeMap<String, TeamQuota>>,
    memory_bytes_default: u64,
    served: Arc<views::Served>,
    rate_limit: Arc<auth::RateLimit>,
    idempotency: Arc<idempotency::Idempotency>,
}

/// What [`ApiState::new`] is built from: the daemon's, or a test's.
pub struct ApiParts {
    pub store: Arc<dyn Store>,
    pub catalog: SharedCatalog,
    pub clock: Arc<dyn Clock>,
    pub settings: ApiSettings,
    /// `[teams.NAME]`.
    pub teams: BTreeMap<String, TeamQuota>,
    /// `limits.memory_default_mb`, in bytes: what a service without its own
    /// limit counts against a memory quota.
    pub memory_bytes_default: u64,
    pub served: views::Served,
}

impl ApiState {
    pub fn new(parts: ApiParts) -> Self {
        Self {
            rate_limit: Arc::new(auth::RateLimit::per_minute(
                parts.settings.requests_per_minute,
            )),
            store: parts.store,
            catalog: parts.catalog,
            clock: parts.clock,
            settings: Arc::new(parts.settings),
            teams: Arc::new(parts.teams),
            memory_bytes_default: parts.memory_bytes_default,
            served: Arc::new(parts.served),
            idempotency: Arc::default(),
        }
    }

    /// The daemon's API: its store, catalog and clock, its config's keys.
    pub fn of_daemon(daemon: &super::Daemon) -> Self {
        let config = &daemon.config;
        let port = config
            .caddy
            .listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 80);
        Self::new(ApiParts {
            store: daemon.ports.store.clone(),
            catalog: daemon.catalog.clone(),
            clock: daemon.ports.clock.clone(),
            settings: config.tenancy.api.clone(),
            teams: config.tenancy.teams.clone(),
            memory_bytes_default: config.limits.memory_bytes_default,
            served: views::Served {
                host_suffix: config.caddy.host_suffix.clone(),
                port,
            },
        })
    }

    /// The operator commands as `scope` may run them, now.
    fn ops(&self, scope: Scope) -> Ops<'_> {
        Ops::new(
            self.store.as_ref(),
            self.catalog.current(),
            self.clock.now(),
            super::os_seed(),
        )
        .with_quotas(self.teams.clone(), self.memory_bytes_default)
        .scoped(scope)
    }

    /// Records a change `caller` made, naming its token and team. Best
    /// effort: the change is made; a log that cannot be written is logged.
    async fn record(&self, caller: &Caller, instance: Option<&InstanceName>, what: &str) {
        let message = format!(
            "{what}, through the API by token {} of team {}",
            caller.token_id, caller.team
        );
        let mut event = Event::new(EventKind::Api, self.clock.now(), "api", message);
        event.writer = caller.writer();
        if let Some(instance) = instance {
            event = event.instance(instance);
        }
        if let Err(e) = self.store.append_events(&[event]).await {
            tracing::warn!(error = %e, token = caller.token_id, "an API change's event was not written");
        }
    }
}

/// The API's routes: `/v1/openapi.json` for anyone, the rest for a live
/// token; all of them only under a `Host` in `hosts`.
pub fn router(state: ApiState, hosts: Arc<HostAllowlist>) -> Router {
    let document = openapi::document();
    let secured = openapi::routes()
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LEN_MAX));
    let document = Arc::new(document);
    Router::new()
        .merge(secured)
        .route(
            "/v1/openapi.json",
            axum::routing::get(move |State(state): State<ApiState>| {
                openapi::serve_document(document.clone(), state.catalog.current())
            }),
        )
        .fallback(|| async { Problem::not_found("no such endpoint under /v1") })
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            listener::refuse_unserved_host,
        ))
        .with_state(state)
}

/// Serves the API on `listener` until `stop`, at most `max_connections`
/// at once.
pub async fn serve(
    state: ApiState,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    let local = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            tracing::error!(error = %e, "tenant API listener has no address; not serving");
            return;
        }
    };
    let hosts = Arc::new(HostAllowlist::new(
        local,
        &state.settings.hosts,
        "api_hosts",
    ));
    let (max_connections, idle) = (state.settings.max_connections, state.settings.idle_timeout);
    let app = router(state, hosts);
    let listener = CappedListener::new(listener, max_connections, idle);
    let shutdown = async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "tenant API server failed");
    }
}
