//! The admin endpoints on a loopback port: `/metrics` (Prometheus text),
//! `/healthz` (the process is up and, for a reconciler, the last tick is
//! recent) and `/readyz` (the store answers and, for a reconciler, this
//! replica holds the singleton lease).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use super::{metrics_handle, Daemon, Role};

/// A tick older than this many intervals (plus the instance deadline, which
/// bounds one pass) means the loop is stuck.
const STALE_TICK_INTERVALS: u32 = 3;

#[derive(Clone)]
struct AdminState {
    daemon: Arc<Daemon>,
    role: Role,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// Serves until `stop`. A bind failure is logged, not fatal: the loops
/// matter more than their dashboards.
pub async fn serve(
    daemon: Arc<Daemon>,
    addr: SocketAddr,
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
        .with_state(state);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "admin endpoints not served");
            return;
        }
    };
    tracing::info!(%addr, "admin endpoints: /metrics /healthz /readyz");
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

/// The status table with live budgets, for `stead status` (JSON).
async fn status(
    State(state): State<AdminState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let daemon = &state.daemon;
    let memory = daemon.recoverer.memory();
    let status = super::ops::status(
        daemon.ports.store.as_ref(),
        daemon.ports.runtime.as_ref(),
        Some(&memory),
        Some(&daemon.config.caddy.admin),
    )
    .await;
    let body = serde_json::to_string(&status).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    (StatusCode::OK, [("content-type", "application/json")], body)
}
