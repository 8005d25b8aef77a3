//! Readiness probes: the `Probe` port over HTTP and TCP against loopback
//! binds, and over the runtime's logs. Probes dial `127.0.0.1:<host port>`
//! from the exact container's binds, never a container IP; a log probe
//! reads the logs of the exact execution (`docker/logs.rs`).

use std::time::Duration;

use async_trait::async_trait;

use super::docker::DockerRuntime;
use crate::core::spec::ReadinessProbe;
use crate::core::types::Binds;
use crate::ports::{Probe, ProbeError, ProbeTarget};

/// Upper bound on attempts, whatever the catalog says, so a probe always
/// ends within `attempts × (timeout + interval)`.
pub const PROBE_ATTEMPTS_MAX: u32 = 1_000;

/// The `Probe` port over HTTP GET (2xx or 3xx is ready; redirects are not
/// followed) and TCP connect. A log probe is not its to run: it refuses
/// one as misconfigured ([`NetAndLogProbe`] runs both).
#[derive(Clone, Debug)]
pub struct NetProbe {
    client: reqwest::Client,
}

/// The probe's HTTP client could not be built (no TLS backend, say).
#[derive(Debug, thiserror::Error)]
#[error("build the probe's http client: {0}")]
pub struct ProbeClientError(#[source] reqwest::Error);

impl NetProbe {
    pub fn new() -> Result<Self, ProbeClientError> {
        let client = reqwest::Client::builder()
            // A redirect answer already proves the backend serves.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            // Every attempt dials afresh: a pooled connection would vouch
            // for an execution that may have been replaced since.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(ProbeClientError)?;
        Ok(Self { client })
    }

    async fn http_once(&self, url: &str, timeout: Duration) -> Result<(), ProbeError> {
        let response = self
            .client
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| ProbeError::Unreachable(format!("GET {url}: {e}")))?;
        let status = response.status();
        if status.is_success() || status.is_redirection() {
            Ok(())
        } else {
            Err(ProbeError::NotReady(format!(
                "GET {url}: answered {status}"
            )))
        }
    }

    async fn tcp_once(address: &str, timeout: Duration) -> Result<(), ProbeError> {
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(ProbeError::Unreachable(format!("connect {address}: {e}"))),
            Err(_) => Err(ProbeError::Unreachable(format!(
                "connect {address}: no answer within {timeout:?}"
            ))),
        }
    }
}

#[async_trait]
impl Probe for NetProbe {
    async fn ready(&self, probe: &ReadinessProbe, target: &ProbeTarget) -> Result<(), ProbeError> {
        let binds = &target.binds;
        match probe {
            ReadinessProbe::None => Ok(()),
            ReadinessProbe::Log { .. } => Err(ProbeError::Misconfigured(
                "a log readiness probe needs the runtime's logs, which this probe does not read"
                    .to_owned(),
            )),
            ReadinessProbe::Http {
                port,
                path,
                timeout,
                interval,
                attempts_max,
            } => {
                if !path.starts_with('/') {
                    return Err(ProbeError::Misconfigured(format!(
                        "http probe path = {path:?} must start with '/'"
                    )));
                }
                let url = format!("http://127.0.0.1:{}{path}", host_port(*port, binds)?);
                retry(*attempts_max, *interval, || self.http_once(&url, *timeout)).await
            }
            ReadinessProbe::Tcp {
                port,
                timeout,
                interval,
                attempts_max,
            } => {
                let address = format!("127.0.0.1:{}", host_port(*port, binds)?);
                retry(*attempts_max, *interval, || {
                    Self::tcp_once(&address, *timeout)
                })
                .await
            }
        }
    }
}

/// The daemon's `Probe` port: HTTP, TCP and none through [`NetProbe`], log
/// lines through the Docker runtime's logs of the probed execution.
#[derive(Clone, Debug)]
pub struct NetAndLogProbe {
    net: NetProbe,
    logs: DockerRuntime,
}

impl NetAndLogProbe {
    pub fn new(net: NetProbe, logs: DockerRuntime) -> Self {
        Self { net, logs }
    }
}

#[async_trait]
impl Probe for NetAndLogProbe {
    async fn ready(&self, probe: &ReadinessProbe, target: &ProbeTarget) -> Result<(), ProbeError> {
        match probe {
            ReadinessProbe::Log { pattern, timeout } => {
                self.logs.log_line_appeared(target, pattern, *timeout).await
            }
            ReadinessProbe::None | ReadinessProbe::Http { .. } | ReadinessProbe::Tcp { .. } => {
                self.net.ready(probe, target).await
            }
        }
    }
}

/// The loopback host port a container port is published on. A container
/// with no bind at all is not running (the runtime reports binds only
/// while it runs): said so, rather than blaming the catalog's port.
fn host_port(port: u16, binds: &Binds) -> Result<u16, ProbeError> {
    if binds.is_empty() {
        return Err(ProbeError::Misconfigured(format!(
            "readiness port {port} cannot be probed: the container publishes no port, so it is \
             not running (it exited, or never started)"
        )));
    }
    binds.get(&port).copied().ok_or_else(|| {
        ProbeError::Misconfigured(format!(
            "readiness port {port} has no bind on this container (binds: {binds:?})"
        ))
    })
}

/// Runs `attempt` until it succeeds, at most `attempts_max` times (at least
/// once, at most [`PROBE_ATTEMPTS_MAX`]), sleeping `interval` between tries.
/// The last attempt's error is returned, of its kind, saying how many
/// attempts were made.
async fn retry<F, Fut>(
    attempts_max: u32,
    interval: Duration,
    mut attempt: F,
) -> Result<(), ProbeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ProbeError>>,
{
    let attempts = attempts_max.clamp(1, PROBE_ATTEMPTS_MAX);
    let mut n = 1;
    loop {
        let last = match attempt().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if n == attempts {
            let said = |e: String| format!("not ready after {attempts} attempt(s): {e}");
            return Err(match last {
                ProbeError::Unreachable(e) => ProbeError::Unreachable(said(e)),
                ProbeError::NotReady(e) => ProbeError::NotReady(said(e)),
                ProbeError::Misconfigured(e) => ProbeError::Misconfigured(said(e)),
            });
        }
        n += 1;
        tokio::time::sleep(interval).await;
    }
}
