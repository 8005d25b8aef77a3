//! Caddy: the `Traffic` port over Caddy's admin API.
//!
//! Each (instance, service) gets one route tagged `"@id":
//! "stead-<instance>-<service>"` in one HTTP server of Caddy's config
//! ([`CaddyConfig::server_name`]). A route matches the host
//! `<service>.<instance>.<host_suffix>` (e.g. `web.shop.localhost` with the
//! default suffix `localhost`; set the suffix to a wildcard DNS name you own,
//! such as `apps.example.net`) and reverse-proxies to `127.0.0.1:<host port>`
//! from the route's verified binds.
//!
//! New routes are inserted at the front of the server's route list, so a
//! catch-all at its end (the `404 no route` that [`CaddyTraffic::ensure_server`]
//! installs) keeps answering hosts with no published route.
//!
//! A call succeeds only when Caddy answered 2xx; anything else is a
//! [`TrafficError`] carrying the status and an excerpt of Caddy's body.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::core::types::ServiceKey;
use crate::ports::{Route, Traffic, TrafficError};

/// Caddy's admin API default, on loopback.
pub const DEFAULT_ADMIN_ADDR: &str = crate::config::daemon::DEFAULT_CADDY_ADMIN;

/// Upper bound on the bytes of Caddy's answer quoted in an error.
const BODY_EXCERPT_LEN_MAX: usize = 300;

/// How to reach Caddy and how to name what stead puts there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaddyConfig {
    /// `host:port` of the admin API (plain HTTP; keep it on loopback).
    pub admin_addr: String,
    /// The key of the HTTP server (under `apps.http.servers`) holding
    /// stead's routes.
    pub server_name: String,
    /// Routes match `<service>.<instance>.<host_suffix>`.
    pub host_suffix: String,
    /// Bound on one admin API call.
    pub request_timeout: Duration,
}

impl Default for CaddyConfig {
    fn default() -> Self {
        Self {
            admin_addr: DEFAULT_ADMIN_ADDR.to_owned(),
            server_name: "stead".to_owned(),
            host_suffix: "localhost".to_owned(),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The `Traffic` port over Caddy's admin API.
/// Retries of a refused admin connection (50 ms doubling: 3.1 s in all).
const ADMIN_CONNECT_RETRIES_MAX: u32 = 6;

#[derive(Clone, Debug)]
pub struct CaddyTraffic {
    client: reqwest::Client,
    config: CaddyConfig,
    admin_url: String,
}

impl CaddyTraffic {
    pub fn new(config: CaddyConfig) -> Result<Self, TrafficError> {
        let client = reqwest::Client::builder()
            .timeout(config.request_timeout)
            // The admin API is local; a proxy in the environment must not
            // intercept it.
            .no_proxy()
            // Caddy may close admin connections when it reloads its config;
            // a fresh connection per call never trips over a stale one, and
            // admin calls are few.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| TrafficError(format!("build the caddy admin client: {e}")))?;
        let admin_url = format!("http://{}", config.admin_addr);
        Ok(Self {
            client,
            config,
            admin_url,
        })
    }

    pub fn config(&self) -> &CaddyConfig {
        &self.config
    }

    /// The `@id` of a service's route.
    pub fn route_id(service: &ServiceKey) -> String {
        format!("stead-{}-{}", service.instance, service.service)
    }

    /// The host name a service is served under.
    pub fn host(&self, service: &ServiceKey) -> String {
        format!(
            "{}.{}.{}",
            service.service, service.instance, self.config.host_suffix
        )
    }

    /// Creates stead's HTTP server listening on `listen_addr` (e.g.
    /// `127.0.0.1:8080`), with automatic HTTPS off and a `404 no route`
    /// catch-all, unless a server of that name exists (then it is left as
    /// it is, listen address included). Only the missing levels of
    /// `apps.http.servers` are created, so the rest of Caddy's config
    /// (its admin endpoint above all) is never replaced.
    pub async fn ensure_server(&self, listen_addr: &str) -> Result<(), TrafficError> {
        let name = &self.config.server_name;
        let server = json!({
            "listen": [listen_addr],
            "automatic_https": { "disable": true },
            "routes": [{
                "handle": [{
                    "handler": "static_response",
                    "status_code": 404,
                    "body": "no route\n",
                }],
            }],
        });
        let servers = "/config/apps/http/servers";
        if self.exists(&format!("{servers}/{name}")).await? {
            return Ok(());
        }
        // Create only the missing levels: the deepest existing one gets the
        // rest nested under it.
        let (path, value) = if self.exists(servers).await? {
            (format!("{servers}/{name}"), server)
        } else if self.exists("/config/apps/http").await? {
            (servers.to_owned(), json!({ name.as_str(): server }))
        } else if self.exists("/config/apps").await? {
            (
                "/config/apps/http".to_owned(),
                json!({ "servers": { name.as_str(): server } }),
            )
        } else {
            (
                "/config/apps".to_owned(),
                json!({ "http": { "servers": { name.as_str(): server } } }),
            )
        };
        match self.call(Method::PUT, &path, Some(&value)).await? {
            StatusCode::NOT_FOUND => Err(TrafficError(format!("caddy PUT {path}: 404"))),
            _ => Ok(()),
        }
    }

    /// The route object for one service.
    fn route_value(&self, route: &Route) -> Result<Value, TrafficError> {
        // The lowest container port is the one served: a service exposing
        // several ports publishes its HTTP port as the lowest.
        let (container_port, host_port) = route.binds.iter().next().ok_or_else(|| {
            TrafficError(format!(
                "route {} has no binds to proxy to",
                Self::route_id(&route.service)
            ))
        })?;
        // Binds may come from a database row another tool wrote: refuse, never panic.
        if *host_port == 0 {
            return Err(TrafficError(format!(
                "route {}: bind of container port {container_port} = host port 0, not a port",
                Self::route_id(&route.service)
            )));
        }
        Ok(json!({
            "@id": Self::route_id(&route.service),
            "match": [{ "host": [self.host(&route.service)] }],
            "handle": [{
                "handler": "reverse_proxy",
                "upstreams": [{ "dial": format!("127.0.0.1:{host_port}") }],
            }],
            "terminal": true,
        }))
    }

    /// Whether a config path holds a non-null value. Caddy answers 400
    /// ("invalid traversal path") or `null` for absent paths.
    async fn exists(&self, path: &str) -> Result<bool, TrafficError> {
        let response = self.send(Method::GET, path, None).await?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| TrafficError(format!("caddy GET {path}: read body: {e}")))?;
        match status {
            s if s.is_success() => Ok(body.trim() != "null" && !body.trim().is_empty()),
            StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => Ok(false),
            s => Err(error("GET", path, s, &body)),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, TrafficError> {
        let url = format!("{}{path}", self.admin_url);
        let mut attempt = 0;
        loop {
            let mut request = self.client.request(method.clone(), &url);
            if let Some(body) = body {
                request = request.json(body);
            }
            match request.send().await {
                Ok(response) => return Ok(response),
                // Caddy restarts its admin listener when it loads a new
                // config, so a call right after a change can find the port
                // closed for a moment. A refused connection never reached
                // Caddy, so retrying it is safe for every method.
                Err(e) if e.is_connect() && attempt < ADMIN_CONNECT_RETRIES_MAX => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
                Err(e) => {
                    return Err(TrafficError(format!(
                        "caddy {method} {path}: admin API at {} did not answer: {e}",
                        self.config.admin_addr
                    )))
                }
            }
        }
    }

    /// Sends a request; `Ok(status)` only for 2xx, and for 404 (the caller
    /// decides what a missing object means). Other answers are errors
    /// carrying the status and an excerpt of the body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<StatusCode, TrafficError> {
        let response = self.send(method.clone(), path, body).await?;
        let status = response.status();
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(status);
        }
        let text = response.text().await.unwrap_or_default();
        Err(error(method.as_str(), path, status, &text))
    }
}

#[async_trait]
impl Traffic for CaddyTraffic {
    async fn publish(&self, route: &Route) -> Result<(), TrafficError> {
        let value = self.route_value(route)?;
        let id = Self::route_id(&route.service);
        let path = format!("/id/{id}");
        // Replace in place when the route exists …
        if self.call(Method::PATCH, &path, Some(&value)).await? != StatusCode::NOT_FOUND {
            return Ok(());
        }
        // … else insert it at the front, ahead of the catch-all.
        let routes = format!(
            "/config/apps/http/servers/{}/routes/0",
            self.config.server_name
        );
        match self.call(Method::PUT, &routes, Some(&value)).await? {
            StatusCode::NOT_FOUND => Err(TrafficError(format!(
                "caddy PUT {routes}: 404: server {:?} does not exist (ensure_server creates it)",
                self.config.server_name
            ))),
            _ => Ok(()),
        }
    }

    async fn withdraw(&self, service: &ServiceKey) -> Result<(), TrafficError> {
        let path = format!("/id/{}", Self::route_id(service));
        // 404: the route is already gone, which is what withdraw wants.
        self.call(Method::DELETE, &path, None).await.map(drop)
    }
}

fn error(method: &str, path: &str, status: StatusCode, body: &str) -> TrafficError {
    let mut excerpt = body.trim();
    if excerpt.len() > BODY_EXCERPT_LEN_MAX {
        let mut end = BODY_EXCERPT_LEN_MAX;
        while !excerpt.is_char_boundary(end) {
            end -= 1;
        }
        excerpt = &excerpt[..end];
    }
    TrafficError(format!("caddy {method} {path}: {status}: {excerpt}"))
}
