//! What every HTTP listener of the daemon (the admin endpoints, the tenant
//! API) does before a request reaches a handler, so that neither trusts a
//! local user or a web page more than its token says (#54):
//!
//! - **Only the host names it serves.** A web page can make the operator's
//!   browser send requests to a loopback port under its own name (DNS
//!   rebinding: `evil.example` resolving to 127.0.0.1), and the browser
//!   then lets the page read the answers. Such a request carries the page's
//!   name in `Host`, so a listener answers only to its own address,
//!   `localhost` and the names its config adds, and refuses anything else
//!   with 421 before any handler runs.
//! - **A bounded number of connections**, each closed when idle: a local
//!   process opening connections without end (or holding them idle) makes
//!   the listener wait, never the daemon run out of file descriptors.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
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

/// Most connections the admin listener holds open at once; more wait in
/// the kernel's backlog until one closes.
pub const CONNECTIONS_MAX: usize = 64;
/// Longest the admin listener keeps a connection on which nothing moves.
pub const CONNECTION_IDLE: Duration = Duration::from_secs(60);
/// Most extra host names one listener answers to.
pub const HOSTS_MAX: usize = 32;
const _: () = assert!(CONNECTIONS_MAX > 1 && HOSTS_MAX > 0);

/// The host names a listener answers to: its own address, the loopback
/// names, and the names its config adds; each with the listener's port or
/// without a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAllowlist {
    /// Lower-cased; IPv6 addresses without brackets.
    names: BTreeSet<String>,
    port: u16,
    /// The config key that adds names, for the refusal's message.
    key: &'static str,
}

impl HostAllowlist {
    /// The names a listener bound to `addr` answers to, with `extra` (from
    /// the config key `key`, checked at load) added.
    pub fn new(addr: SocketAddr, extra: &[String], key: &'static str) -> Self {
        let mut names: BTreeSet<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        names.insert(addr.ip().to_string());
        names.extend(extra.iter().map(|n| n.to_ascii_lowercase()));
        Self {
            names,
            port: addr.port(),
            key,
        }
    }

    /// Whether a request whose `Host` header is `host` is for this
    /// listener. No header at all is refused: HTTP/1.1 requires one, and
    /// every client stead's docs name sends it.
    pub fn admits(&self, host: Option<&str>) -> bool {
        let Some((name, port)) = host.and_then(split_host) else {
            return false;
        };
        port.is_none_or(|p| p == self.port) && self.names.contains(&name.to_ascii_lowercase())
    }
}

/// `name` and the port of a `Host` value: `name`, `name:port`, `[v6]`,
/// `[v6]:port`. `None` when it is none of these.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<IpAddr>().ok()?;
        match after {
            "" => (v6, None),
            _ => (v6, Some(after.strip_prefix(':')?)),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    (!name.is_empty()).then_some((name, port))
}

/// A refused `Host` as a message may quote it: at most 100 characters, no
/// control characters, `(none)` when absent.
pub fn shown_host(host: Option<&str>) -> String {
    host.unwrap_or("(none)")
        .chars()
        .take(100)
        .filter(|c| !c.is_control())
        .collect()
}

/// Middleware: answers 421 to a request whose `Host` the listener does not
/// serve, before any handler (or token check) runs.
pub async fn require_host(
    State(allowed): State<Arc<HostAllowlist>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if allowed.admits(host) {
        return next.run(request).await;
    }
    let shown = shown_host(host);
    tracing::warn!(host = %shown, "refused a request for a host this listener does not serve");
    (
        StatusCode::MISDIRECTED_REQUEST,
        [(header::CONTENT_TYPE, "text/plain")],
        format!(
            "421: this listener does not serve host {shown:?}; it answers to its own address, \
             localhost, and the names of {}\n",
            allowed.key
        ),
    )
        .into_response()
}

/// A TCP listener that holds at most `max` connections at once: past it,
/// new ones wait in the kernel's backlog until one closes. A connection
/// that neither sends nor is sent anything for `idle` is closed, so idle
/// or trickling clients cannot hold every place.
pub struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl CappedListener {
    pub fn new(inner: TcpListener, max: usize, idle: Duration) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(max.max(1))),
            idle,
        }
    }
}

/// Pause after a failed accept (out of file descriptors, a connection
/// reset before it was taken), so a failing accept does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

impl axum::serve::Listener for CappedListener {
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
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
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
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "closed an idle connection",
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
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            if n > 0 {
                self.active();
            }
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowlist(extra: &[&str]) -> HostAllowlist {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        HostAllowlist::new("127.0.0.1:9464".parse().unwrap(), &extra, "admin_hosts")
    }

    #[test]
    fn a_listener_answers_to_its_address_and_localhost() {
        let allowed = allowlist(&[]);
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST:9464",
            "localhost",
            "[::1]:9464",
        ] {
            assert!(allowed.admits(Some(host)), "{host}");
        }
    }

    #[test]
    fn a_rebound_name_another_port_or_no_host_is_refused() {
        let allowed = allowlist(&["stead.internal"]);
        for host in [
            Some("evil.example"),
            Some("evil.example:9464"),
            Some("localhost:80"),
            Some("127.0.0.1:9465"),
            Some("localhost.evil.example:9464"),
            Some("[::1"),
            Some(":9464"),
            Some("localhost:port"),
            None,
        ] {
            assert!(!allowed.admits(host), "{host:?}");
        }
        assert!(allowed.admits(Some("stead.internal:9464")));
    }

    #[test]
    fn a_wildcard_listener_answers_to_its_configured_names() {
        let allowed = HostAllowlist::new(
            "0.0.0.0:9464".parse().unwrap(),
            &["10.1.2.3".to_owned()],
            "admin_hosts",
        );
        assert!(allowed.admits(Some("10.1.2.3:9464")));
        assert!(allowed.admits(Some("0.0.0.0:9464")));
        assert!(!allowed.admits(Some("10.1.2.4:9464")));
    }

    /// Accepts from `listener` in a task, keeping every connection, and
    /// says how many it holds.
    fn hold_connections(
        mut listener: CappedListener,
    ) -> (
        Arc<std::sync::Mutex<Vec<CappedStream>>>,
        tokio::task::JoinHandle<()>,
    ) {
        use axum::serve::Listener;
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = held.clone();
        let task = tokio::spawn(async move {
            loop {
                let (io, _) = listener.accept().await;
                keep.lock().unwrap().push(io);
            }
        });
        (held, task)
    }

    #[tokio::test]
    async fn a_listener_holds_at_most_its_connection_cap_and_takes_more_as_they_close() {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let (held, task) =
            hold_connections(CappedListener::new(inner, CONNECTIONS_MAX, CONNECTION_IDLE));
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS_MAX + 3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let count = || held.lock().unwrap().len();
        for _ in 0..100 {
            if count() >= CONNECTIONS_MAX {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(count(), CONNECTIONS_MAX, "the cap holds");
        // Closing one (the server side drops it) frees a slot for the next.
        drop(held.lock().unwrap().pop());
        for _ in 0..100 {
            if count() == CONNECTIONS_MAX {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(count(), CONNECTIONS_MAX, "a freed slot is taken again");
        task.abort();
    }
}
