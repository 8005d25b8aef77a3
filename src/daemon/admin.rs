//! The admin endpoints on a loopback port: `/metrics` (Prometheus text),
//! `/healthz` (the process is up and, for a reconciler, the last tick is
//! recent), `/readyz` (the store answers and, for a reconciler, this
//! replica holds the singleton lease), `/status` (`stead status --live`:
//! the status view with this daemon's budgets and loaded catalog),
//! `/catalog` (the loaded catalog's versions) and `POST /reload` (`stead
//! reload`: re-read the catalog file, as SIGHUP does).
//!
//! `POST /reload` changes the daemon, so it demands [`RELOAD_HEADER`]: a
//! web page the operator's browser has open can send a "simple" POST to a
//! loopback port without asking first, but it cannot add a custom header
//! without a CORS preflight, which this server never answers.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use super::{metrics_handle, Daemon, Role};

/// The header (and its value) `POST /reload` requires; `stead reload`
/// sends it. Any other caller gets 403.
pub const RELOAD_HEADER: &str = "x-stead-request";
pub const RELOAD_HEADER_VALUE: &str = "reload";

/// A tick older than this many intervals (plus the instance deadline, which
/// bounds one pass) means the loop is stuck.
const STALE_TICK_INTERVALS: u32 = 3;

#[derive(Clone)]
struct AdminState {
    daemon: Arc<Daemon>,
    role: Role,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// The admin port could not be taken. Fatal at start: if another local
/// process holds the port, it would answer `/healthz`, `/readyz` and
/// `/metrics` in stead's name, so stead refuses to run beside it.
#[derive(Debug, thiserror::Error)]
#[error(
    "admin_listen = \"{addr}\": cannot listen: {source}; another process may hold the port, \
     and stead will not run while something else answers its health and metrics endpoints"
)]
pub struct AdminBindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Takes the admin port; [`serve`] then answers on it.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, AdminBindError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminBindError { addr, source })
}

/// Serves on `listener` (from [`bind`]) until `stop`.
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: tokio::net::TcpListener,
    role: Role,
    mut stop: watch::Receiver<bool>,
) {
    let state = AdminState {
        daemon,
        role,
        metrics: metrics_handle(),
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/catalog", get(catalog))
        .route("/reload", axum::routing::post(reload))
        .with_state(state);
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(%addr, "admin endpoints: /metrics /healthz /readyz /status /catalog, POST /reload");
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
        tracing::error!(error = %e, "admin server failed");
    }
}

async fn metrics(
    State(state): State<AdminState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

async fn healthz(State(state): State<AdminState>) -> (StatusCode, String) {
    if !state.role.reconciles() {
        return (StatusCode::OK, "ok\n".into());
    }
    let daemon = &state.daemon;
    let last = daemon.reconciler.last_tick_s();
    let now = daemon.ports.clock.now().as_second();
    let bound = (daemon.config.control.tick_interval * STALE_TICK_INTERVALS
        + daemon.config.recovery.instance_deadline)
        .as_secs() as i64;
    if last == 0 {
        // Before the first tick: up, but say so.
        return (StatusCode::OK, "ok: first tick running\n".into());
    }
    if now - last > bound {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("last tick {}s ago (bound {bound}s)\n", now - last),
        );
    }
    (
        StatusCode::OK,
        format!("ok: last tick {}s ago\n", now - last),
    )
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, String) {
    let daemon = &state.daemon;
    if let Err(e) = daemon.ports.store.queue_depth().await {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n"));
    }
    if state.role.reconciles() && !daemon.reconciler.holds_lease() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "reconciler lease not held (another replica leads, or the first tick has not run)\n"
                .into(),
        );
    }
    (StatusCode::OK, "ready\n".into())
}

/// The status view with live budgets and the loaded catalog, for `stead
/// status --live` (JSON).
async fn status(
    State(state): State<AdminState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let daemon = &state.daemon;
    let memory = daemon.recoverer.memory();
    let catalog = daemon.catalog.current();
    let status = super::status::status(super::status::StatusSources {
        store: daemon.ports.store.as_ref(),
        runtime: daemon.ports.runtime.as_ref(),
        catalog: &catalog,
        memory: Some(&memory),
        caddy_admin: Some(&daemon.config.caddy.admin),
        provisioner: Some(daemon.ports.provisioner.as_ref()),
        database: super::redact(&daemon.config.database_url),
        now: daemon.ports.clock.now(),
    })
    .await;
    json(StatusCode::OK, &status)
}

/// The loaded catalog: each service type's version, and the file.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CatalogView {
    pub file: String,
    pub versions: std::collections::BTreeMap<String, String>,
}

impl CatalogView {
    pub fn of(file: &std::path::Path, catalog: &crate::core::catalog::Catalog) -> Self {
        Self {
            file: file.display().to_string(),
            versions: catalog
                .entries()
                .map(|e| (e.service_type.clone(), e.version.clone()))
                .collect(),
        }
    }
}

async fn catalog(
    State(state): State<AdminState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let daemon = &state.daemon;
    let view = CatalogView::of(&daemon.config.catalog, &daemon.catalog.current());
    json(StatusCode::OK, &view)
}

/// What `POST /reload` answers.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ReloadAnswer {
    /// What changed, one line each; empty when nothing did.
    pub changes: Vec<String>,
    /// Why the file was refused (the running catalog is kept).
    pub error: Option<String>,
    /// The catalog running after the call.
    pub catalog: CatalogView,
}

/// Re-reads the catalog file (as SIGHUP does). 200 with the changes, or
/// 422 with the error when the file was refused.
async fn reload(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let asked = headers.get(RELOAD_HEADER).is_some_and(|value| {
        value
            .as_bytes()
            .eq_ignore_ascii_case(RELOAD_HEADER_VALUE.as_bytes())
    });
    if !asked {
        tracing::warn!("POST /reload without {RELOAD_HEADER}: refused (403)");
        return (
            StatusCode::FORBIDDEN,
            [("content-type", "text/plain")],
            format!(
                "POST /reload needs the header {RELOAD_HEADER}: {RELOAD_HEADER_VALUE} (a request \
                 without it may come from a web page in a browser, so it is refused); `stead \
                 reload` sends it\n"
            ),
        );
    }
    let daemon = &state.daemon;
    let result = daemon.reload_catalog();
    let catalog = CatalogView::of(&daemon.config.catalog, &daemon.catalog.current());
    let (code, answer) = match result {
        Ok(changes) => (
            StatusCode::OK,
            ReloadAnswer {
                changes: changes.iter().map(ToString::to_string).collect(),
                error: None,
                catalog,
            },
        ),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            ReloadAnswer {
                changes: Vec::new(),
                error: Some(e.to_string()),
                catalog,
            },
        ),
    };
    json(code, &answer)
}

fn json(
    code: StatusCode,
    value: &impl serde::Serialize,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    match serde_json::to_string(value) {
        Ok(body) => (code, [("content-type", "application/json")], body),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            format!("cannot serialise: {e}\n"),
        ),
    }
}
