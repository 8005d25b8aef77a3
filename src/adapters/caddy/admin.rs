//! How stead reaches Caddy's admin API: over TCP (`host:port`, Caddy's
//! default) or over a unix socket (`unix//run/stead/caddy-admin.sock`, as
//! Caddy's own `admin.listen` spells it).
//!
//! The admin API has no authentication: whoever reaches it can reroute
//! every tenant's traffic. On TCP that is every local user, whatever port
//! it is on; on a unix socket it is whoever the socket's file permissions
//! let in (#54). Caddy 2.6 refuses a `Host` of `localhost` or none on its
//! unix socket, and accepts an empty one, which is what is sent here.
//!
//! Each call opens a fresh connection: Caddy may close admin connections
//! when it reloads its config, and admin calls are few.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::ports::TrafficError;

/// The prefix of a unix socket address, as Caddy's `admin.listen` takes it.
pub const UNIX_PREFIX: &str = "unix/";

/// Where the admin API listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminEndpoint {
    /// `host:port`, plain HTTP.
    Tcp(String),
    /// An absolute path of a unix socket.
    Unix(PathBuf),
}

impl AdminEndpoint {
    /// `unix//path` (an absolute path after `unix/`) or `host:port` (taken
    /// as it is; the config checked it).
    pub fn parse(addr: &str) -> Result<Self, NotAnAdminAddress> {
        match addr.strip_prefix(UNIX_PREFIX) {
            Some(path) if path.starts_with('/') && path.len() > 1 => {
                Ok(Self::Unix(PathBuf::from(path)))
            }
            Some(_) => Err(NotAnAdminAddress),
            None => Ok(Self::Tcp(addr.to_owned())),
        }
    }
}

/// A `unix/` address without an absolute path after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a unix socket is written unix//absolute/path (e.g. unix//run/stead/caddy-admin.sock)")]
pub struct NotAnAdminAddress;

/// One answer of the admin API, its body read within the bound.
pub struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

/// Why a call got no answer.
pub enum CallFailure {
    /// The connection was refused or the socket is missing: the call never
    /// reached Caddy, so retrying it is safe for every method.
    Connect(String),
    /// Anything else (a timeout, a reset mid-answer).
    Other(String),
    /// The answer was larger than the bound.
    TooLarge,
}

/// The admin API's client.
#[derive(Clone, Debug)]
pub struct AdminClient {
    endpoint: AdminEndpoint,
    /// For TCP; never pools (see the module doc).
    http: reqwest::Client,
    timeout: Duration,
    body_len_max: usize,
}

impl AdminClient {
    pub fn new(
        endpoint: AdminEndpoint,
        timeout: Duration,
        body_len_max: usize,
    ) -> Result<Self, TrafficError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            // The admin API is local; a proxy in the environment must not
            // intercept it.
            .no_proxy()
            // Caddy answers a path it cleans (`..`) with a redirect
            // elsewhere in its config: never follow it.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| TrafficError::Rejected(format!("build the caddy admin client: {e}")))?;
        Ok(Self {
            endpoint,
            http,
            timeout,
            body_len_max,
        })
    }

    /// Sends one request and reads its answer.
    pub async fn call(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, CallFailure> {
        match &self.endpoint {
            AdminEndpoint::Tcp(addr) => self.call_tcp(addr, method, path, body, if_match).await,
            AdminEndpoint::Unix(socket) => {
                let call = call_unix(socket, method, path, body, if_match, self.body_len_max);
                tokio::time::timeout(self.timeout, call)
                    .await
                    .unwrap_or_else(|_| {
                        Err(CallFailure::Other(format!(
                            "no answer within {} ms",
                            self.timeout.as_millis()
                        )))
                    })
            }
        }
    }

    async fn call_tcp(
        &self,
        addr: &str,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, CallFailure> {
        let mut request = self
            .http
            .request(method.clone(), format!("http://{addr}{path}"));
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(tag) = if_match {
            request = request.header("If-Match", tag);
        }
        let mut response = request.send().await.map_err(|e| {
            if e.is_connect() {
                CallFailure::Connect(e.to_string())
            } else {
                CallFailure::Other(e.to_string())
            }
        })?;
        let status = response.status();
        if response
            .content_length()
            .is_some_and(|len| len > self.body_len_max as u64)
        {
            return Err(CallFailure::TooLarge);
        }
        let mut answer = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| CallFailure::Other(format!("read body: {e}")))?
        {
            if answer.len() + chunk.len() > self.body_len_max {
                return Err(CallFailure::TooLarge);
            }
            answer.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            body: answer,
        })
    }
}

/// One request over a fresh connection to the unix socket.
async fn call_unix(
    socket: &std::path::Path,
    method: &Method,
    path: &str,
    body: Option<&Value>,
    if_match: Option<&str>,
    body_len_max: usize,
) -> Result<Answer, CallFailure> {
    let other = |what: &str, e: &dyn std::fmt::Display| CallFailure::Other(format!("{what}: {e}"));
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| CallFailure::Connect(format!("{}: {e}", socket.display())))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| other("handshake", &e))?;
    // The connection is driven beside the request and ends with it.
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = http::Request::builder()
        .method(method.clone())
        .uri(path)
        .header(http::header::HOST, "");
    let payload = match body {
        Some(value) => {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(serde_json::to_vec(value).map_err(|e| other("encode", &e))?)
        }
        None => Bytes::new(),
    };
    if let Some(tag) = if_match {
        request = request.header("If-Match", tag);
    }
    let request = request
        .body(Full::new(payload))
        .map_err(|e| other("build the request", &e))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| other("send", &e))?;
        let status = response.status();
        let mut incoming = response.into_body();
        let mut answer = Vec::new();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| other("read body", &e))?;
            if let Ok(chunk) = frame.into_data() {
                if answer.len() + chunk.len() > body_len_max {
                    return Err(CallFailure::TooLarge);
                }
                answer.extend_from_slice(&chunk);
            }
        }
        Ok(Answer {
            status,
            body: answer,
        })
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_address_is_a_unix_socket_or_host_and_port() {
        assert_eq!(
            AdminEndpoint::parse("unix//run/stead/caddy-admin.sock"),
            Ok(AdminEndpoint::Unix(PathBuf::from(
                "/run/stead/caddy-admin.sock"
            )))
        );
        assert_eq!(
            AdminEndpoint::parse("127.0.0.1:2019"),
            Ok(AdminEndpoint::Tcp("127.0.0.1:2019".into()))
        );
        for bad in ["unix/relative.sock", "unix//", "unix/"] {
            assert!(AdminEndpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
