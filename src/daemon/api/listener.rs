//! The API's listener: bound where `api_listen` says, answering only the
//! host names it serves (the rule of [`crate::daemon::listener`], with a
//! problem+json refusal), holding a bounded number of connections
//! ([`crate::daemon::listener::CappedListener`]).
//!
//! The `Host` check stops DNS rebinding: a web page whose name an attacker
//! points at 127.0.0.1 reaches a loopback listener with the attacker's
//! name in `Host`, which is refused here before any handler runs.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use super::problem::Problem;
use crate::daemon::listener::{shown_host, HostAllowlist};

/// Why the API's port could not be taken.
#[derive(Debug, thiserror::Error)]
#[error("api_listen {addr}: cannot listen: {source}")]
pub struct ApiBindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ApiBindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ApiBindError { addr, source })
}

/// Refuses (421, as problem+json) a request whose `Host` the API does
/// not serve ([`HostAllowlist`]: its address, the loopback names, and
/// `api_hosts`).
pub async fn refuse_unserved_host(
    State(hosts): State<Arc<HostAllowlist>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if hosts.admits(host) {
        return next.run(request).await;
    }
    Problem::new(
        StatusCode::MISDIRECTED_REQUEST,
        "unserved-host",
        "this listener serves its own address, localhost and the names of api_hosts only"
            .to_owned(),
    )
    .at("Host", shown_host(host))
    .into_response()
}
