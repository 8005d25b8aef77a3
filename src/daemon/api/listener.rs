//! The API's listener: bound where `api_listen` says, answering only the
//! host names it serves, and holding a bounded number of connections.
//!
//! The `Host` check stops DNS rebinding: a web page whose name an attacker
//! points at 127.0.0.1 reaches a loopback listener with the attacker's
//! name in `Host`, which is refused here before any handler runs.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::Problem;

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

/// The `Host` values the API answers to, lower-case: its listen address
/// as written (`127.0.0.1:9465`, `[::1]:9465`), `localhost` with its port
/// on a loopback address, and each of `api_hosts` with or without a port.
pub fn allowed_hosts(listen: Option<SocketAddr>, names: &[String]) -> Vec<String> {
    let mut hosts = Vec::new();
    if let Some(addr) = listen {
        hosts.push(addr.to_string());
        if addr.ip().is_loopback() {
            hosts.push(format!("localhost:{}", addr.port()));
        }
    }
    for name in names {
        hosts.push(name.to_ascii_lowercase());
        if let Some(addr) = listen {
            hosts.push(format!("{}:{}", name.to_ascii_lowercase(), addr.port()));
        }
    }
    hosts
}

/// Refuses (421) a request whose `Host` is not one the API serves.
pub async fn refuse_unserved_host(
    State(hosts): State<Arc<Vec<String>>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    match host {
        Some(host) if hosts.contains(&host) => next.run(request).await,
        host => Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            "unserved-host",
            format!(
                "this listener serves {} only (api_hosts adds names)",
                hosts.join(", ")
            ),
        )
        .at("Host", host.unwrap_or_default())
        .into_response(),
    }
}

/// A listener that holds at most `max` connections: past it, new ones
/// wait in the kernel's backlog until one closes. A connection that sends
/// nothing for `idle` is closed, so idle or trickling clients cannot hold
/// every place.
pub struct Capped {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl Capped {
    pub fn new(inner: TcpListener, max: usize, idle: Duration) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
            idle,
        }
    }
}

/// Pause after a failed accept (out of file descriptors, say), so a
/// failing accept does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

impl axum::serve::Listener for Capped {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = loop {
            match self.permits.clone().acquire_owned().await {
                Ok(permit) => break permit,
                // The semaphore is never closed; wait as after an error.
                Err(_) => tokio::time::sleep(ACCEPT_RETRY).await,
            }
        };
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let stream = CappedStream {
                        stream,
                        _permit: permit,
                        idle: self.idle,
                        deadline: Box::pin(tokio::time::sleep(self.idle)),
                    };
                    return (stream, addr);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tenant API: accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection holding its place under the cap until it closes, or
/// until it has neither sent nor been sent anything for `idle`.
pub struct CappedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl CappedStream {
    fn active(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the tenant API closed an idle connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
            ready => ready,
        }
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            if n > 0 {
                self.active();
            }
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
