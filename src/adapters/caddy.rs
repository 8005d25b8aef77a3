//! Caddy: the `Traffic` port over Caddy's admin API.
//!
//! Each (instance, service) gets one route tagged `"@id":
//! "stead.<instance>.<service>"` ([`CaddyTraffic::route_id`]) in one HTTP
//! server of Caddy's config ([`CaddyConfig::server_name`]). A route matches
//! the host `<service>.<instance>.<host_suffix>` (e.g. `web.shop.localhost`
//! with the default suffix `localhost`; set the suffix to a wildcard DNS
//! name you own, such as `apps.example.net`) and reverse-proxies to
//! `127.0.0.1:<host port>` from the route's verified binds. Instance and
//! service names are DNS labels, which contain no dot, so neither the id nor
//! the host of two different services can be equal.
//!
//! ## One writer, whole-array writes
//!
//! Caddy applies every admin-API change by reloading its whole config, and
//! its `/id/<id>` paths are resolved to an array index *before* the change
//! takes Caddy's config lock: two concurrent changes through `/id/` paths
//! can land on each other's index and replace or delete the wrong route
//! (seen under load: one tenant's crash recovery withdrew another tenant's
//! route). So stead never writes through `/id/`. All changes of one process
//! go through one writer: a change is queued, and whoever holds the write
//! lock takes every queued change, reads the server's route array once,
//! applies them all and writes the array back once, guarded by Caddy's
//! `If-Match` ETag against writers outside this process. Changes that
//! arrive while a write is in flight therefore share the next write: a burst
//! of route changes costs one reload, not one each, and a change that
//! changes nothing (a publish of the route Caddy already holds, a withdrawal
//! of an absent one) costs none.
//!
//! New routes go to the front of the array, so a catch-all at its end (the
//! `404 no route` that [`CaddyTraffic::ensure_server`] installs) keeps
//! answering hosts with no published route. Routes stead does not own are
//! kept as they are, in place.
//!
//! A call succeeds only when Caddy answered 2xx; anything else is a
//! [`TrafficError`] carrying the status and an excerpt of Caddy's body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::core::names;
use crate::core::types::ServiceKey;
use crate::ports::{HeldRoute, PlaneCheck, Route, Traffic, TrafficError};

/// Caddy's admin API default, on loopback.
pub const DEFAULT_ADMIN_ADDR: &str = crate::config::daemon::DEFAULT_CADDY_ADMIN;
/// Where stead's server listens unless configured otherwise.
pub const DEFAULT_LISTEN_ADDR: &str = crate::config::daemon::DEFAULT_CADDY_LISTEN;

/// Upper bound on the bytes of Caddy's answer quoted in an error.
const BODY_EXCERPT_LEN_MAX: usize = 300;
/// The most of one Caddy admin API answer stead reads. The largest it
/// asks for is stead's routes array, a few hundred bytes per route, so
/// this holds well over 100,000 routes; a larger answer is not Caddy's
/// (or not sane) and is refused rather than buffered.
pub const CADDY_ANSWER_LEN_MAX: usize = 64 * 1024 * 1024;
/// Retries of a refused admin connection (50 ms doubling: 3.1 s in all).
const ADMIN_CONNECT_RETRIES_MAX: u32 = 6;
/// Attempts of one batched write: a write refused because the routes
/// changed since they were read (412), or because the server was missing
/// and had to be created first, is retried with a fresh read.
const WRITE_ATTEMPTS_MAX: u32 = 4;

/// How to reach Caddy and how to name what stead puts there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaddyConfig {
    /// `host:port` of the admin API (plain HTTP; keep it on loopback).
    pub admin_addr: String,
    /// The key of the HTTP server (under `apps.http.servers`) holding
    /// stead's routes.
    pub server_name: String,
    /// Where that server listens (`host:port`).
    pub listen_addr: String,
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
            listen_addr: DEFAULT_LISTEN_ADDR.to_owned(),
            host_suffix: "localhost".to_owned(),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// What [`CaddyTraffic::ensure_server`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerCheck {
    /// The server exists and listens where the config says.
    Present,
    /// The server was missing (Caddy restarted without its saved config,
    /// or never had it) and was created, without routes.
    Created,
    /// The server listened elsewhere; its listen address was corrected.
    ListenCorrected { was: Vec<String> },
}

/// One queued route change.
#[derive(Debug)]
enum Change {
    Publish { service: ServiceKey, route: Value },
    Withdraw { service: ServiceKey },
}

impl Change {
    fn service(&self) -> &ServiceKey {
        match self {
            Change::Publish { service, .. } | Change::Withdraw { service } => service,
        }
    }
}

type Reply = oneshot::Sender<Result<(), TrafficError>>;

/// The queue of changes and the lock its drainer holds (see the module
/// doc). Shared by every clone of one [`CaddyTraffic`].
#[derive(Debug, Default)]
struct Writer {
    queued: Mutex<Vec<(Change, Reply)>>,
    write: tokio::sync::Mutex<()>,
    /// Route writes Caddy accepted: each one is a reload of its config.
    route_writes: AtomicU64,
    /// Times `ensure` found stead's server gone and created it again.
    servers_created: AtomicU64,
}

/// The `Traffic` port over Caddy's admin API.
#[derive(Clone, Debug)]
pub struct CaddyTraffic {
    client: reqwest::Client,
    config: CaddyConfig,
    admin_url: String,
    writer: Arc<Writer>,
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
            .map_err(|e| TrafficError::Rejected(format!("build the caddy admin client: {e}")))?;
        let admin_url = format!("http://{}", config.admin_addr);
        Ok(Self {
            client,
            config,
            admin_url,
            writer: Arc::default(),
        })
    }

    pub fn config(&self) -> &CaddyConfig {
        &self.config
    }

    /// The `@id` of a service's route ([`names::route_id`]).
    pub fn route_id(service: &ServiceKey) -> String {
        names::route_id(service)
    }

    /// The service a route id names ([`names::service_of_route_id`]).
    pub fn service_of(route_id: &str) -> Option<ServiceKey> {
        names::service_of_route_id(route_id)
    }

    /// The admin API's address of a service's route by its `@id`
    /// (`/id/<id>`), the id percent-encoded as one path segment, so a `?`
    /// or `#` cannot cut it short. Caddy's mux still decodes and cleans the
    /// path, answering a `..` with a redirect elsewhere, so a caller must
    /// not follow redirects; the names in an id are DNS labels, checked
    /// where they are read, which holds none of these. For reads only:
    /// stead writes through the routes array (see the module doc).
    pub fn route_id_url(
        admin_addr: &str,
        service: &ServiceKey,
    ) -> Result<reqwest::Url, TrafficError> {
        let invalid =
            |e: String| TrafficError::Rejected(format!("caddy admin address {admin_addr:?}: {e}"));
        let mut url = reqwest::Url::parse(&format!("http://{admin_addr}/id"))
            .map_err(|e| invalid(e.to_string()))?;
        url.path_segments_mut()
            .map_err(|()| invalid("not a base URL".to_owned()))?
            .push(&Self::route_id(service));
        Ok(url)
    }

    /// The id earlier versions gave a route. Not injective (`a-b`/`c` and
    /// `a`/`b-c` share it), so a legacy route is only ever taken for this
    /// service's when its host matches too; see [`Self::owns`].
    fn legacy_route_id(service: &ServiceKey) -> String {
        format!("stead-{}-{}", service.instance, service.service)
    }

    /// The host name a service is served under.
    pub fn host(&self, service: &ServiceKey) -> String {
        format!(
            "{}.{}.{}",
            service.service, service.instance, self.config.host_suffix
        )
    }

    fn routes_path(&self) -> String {
        format!(
            "/config/apps/http/servers/{}/routes",
            self.config.server_name
        )
    }

    /// Creates stead's HTTP server (automatic HTTPS off, a `404 no route`
    /// catch-all) if it is missing, and corrects its listen address if it
    /// differs from the config. Only the missing levels of
    /// `apps.http.servers` are created, so the rest of Caddy's config (its
    /// admin endpoint above all) is never replaced. Cheap when nothing is
    /// wrong (one read), so it runs every tick: a Caddy restarted without
    /// its saved config comes back empty.
    pub async fn ensure_server(&self) -> Result<ServerCheck, TrafficError> {
        let name = &self.config.server_name;
        let listen = json!([self.config.listen_addr]);
        let servers = "/config/apps/http/servers";
        let server_path = format!("{servers}/{name}");
        if let Some(current) = self.read(&format!("{server_path}/listen")).await? {
            if current.value == listen {
                return Ok(ServerCheck::Present);
            }
            let was = current
                .value
                .as_array()
                .map(|a| a.iter().map(|v| v.to_string()).collect())
                .unwrap_or_default();
            self.write(Method::PATCH, &format!("{server_path}/listen"), &listen)
                .await?;
            return Ok(ServerCheck::ListenCorrected { was });
        }
        let server = json!({
            "listen": listen,
            "automatic_https": { "disable": true },
            "routes": [catch_all()],
        });
        // Create only the missing levels: the deepest existing one gets the
        // rest nested under it.
        let (path, value) = if self.exists(servers).await? {
            (server_path, server)
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
        self.write(Method::PUT, &path, &value).await?;
        Ok(ServerCheck::Created)
    }

    /// The route object for one service.
    fn route_value(&self, route: &Route) -> Result<Value, TrafficError> {
        // Names are checked where they are read (rows, labels); checked
        // again here because they become a host matcher and an id, whose
        // injectivity rests on their being DNS labels.
        let ServiceKey { instance, service } = &route.service;
        names::check_instance_name("instance", instance.as_str())
            .and_then(|()| names::check_dns_label("service", service.as_str()))
            .map_err(|e| TrafficError::Rejected(format!("route not published: {e}")))?;
        let id = Self::route_id(&route.service);
        // The lowest container port is the one served: a service exposing
        // several ports publishes its HTTP port as the lowest.
        let (container_port, host_port) = route.binds.iter().next().ok_or_else(|| {
            TrafficError::Rejected(format!("route {id} has no binds to proxy to"))
        })?;
        // Binds may come from a database row another tool wrote: refuse, never panic.
        if *host_port == 0 {
            return Err(TrafficError::Rejected(format!(
                "route {id}: bind of container port {container_port} = host port 0, not a port"
            )));
        }
        Ok(json!({
            "@id": id,
            "match": [{ "host": [self.host(&route.service)] }],
            "handle": [{
                "handler": "reverse_proxy",
                "upstreams": [{ "dial": format!("127.0.0.1:{host_port}") }],
            }],
            "terminal": true,
        }))
    }

    /// Whether `route` (an element of the routes array) is `service`'s.
    fn owns(&self, route: &Value, service: &ServiceKey) -> bool {
        let id = route.get("@id").and_then(Value::as_str);
        if id == Some(Self::route_id(service).as_str()) {
            return true;
        }
        id == Some(Self::legacy_route_id(service).as_str())
            && route["match"][0]["host"][0].as_str() == Some(self.host(service).as_str())
    }

    /// Queues a change and waits until a write that includes it finished.
    async fn submit(&self, change: Change) -> Result<(), TrafficError> {
        let (reply, mut answer) = oneshot::channel();
        self.writer
            .queued
            .lock()
            .expect("caddy change queue poisoned")
            .push((change, reply));
        let _write = self.writer.write.lock().await;
        // The previous holder may have written our change with its batch.
        match answer.try_recv() {
            Ok(result) => return result,
            Err(oneshot::error::TryRecvError::Closed) => return Err(abandoned()),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let batch = std::mem::take(
            &mut *self
                .writer
                .queued
                .lock()
                .expect("caddy change queue poisoned"),
        );
        let (changes, replies): (Vec<Change>, Vec<Reply>) = batch.into_iter().unzip();
        let result = self.apply(&changes).await;
        for reply in replies {
            // A caller that gave up (its deadline passed) dropped its end.
            let _ = reply.send(result.clone());
        }
        // Our change was queued before we took the lock, so it was in the
        // batch just written.
        answer.try_recv().unwrap_or_else(|_| Err(abandoned()))
    }

    /// Applies a batch of changes with one read and at most one write.
    async fn apply(&self, changes: &[Change]) -> Result<(), TrafficError> {
        let path = self.routes_path();
        let mut last_error = None;
        for _ in 0..WRITE_ATTEMPTS_MAX {
            let Some(current) = self.read(&path).await? else {
                if changes.iter().all(|c| matches!(c, Change::Withdraw { .. })) {
                    // No server, so no route: withdrawn already.
                    return Ok(());
                }
                // A publish that finds no server creates it and tries again;
                // a server without a routes array gets one.
                if self.ensure_server().await? == ServerCheck::Present {
                    self.write(Method::PUT, &path, &json!([catch_all()]))
                        .await?;
                }
                continue;
            };
            let Value::Array(routes) = current.value else {
                return Err(TrafficError::Rejected(format!(
                    "caddy GET {path}: expected an array of routes, got {}",
                    excerpt(&current.value.to_string())
                )));
            };
            let updated = self.changed_routes(&routes, changes);
            if updated == routes {
                return Ok(());
            }
            match self
                .send_checked(
                    Method::PATCH,
                    &path,
                    Some(&Value::Array(updated)),
                    Some(&current.etag),
                )
                .await?
            {
                Written::Done => {
                    self.writer.route_writes.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("stead_caddy_route_writes_total").increment(1);
                    return Ok(());
                }
                Written::Stale(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            TrafficError::Rejected(format!(
                "caddy {path}: server {:?} still missing after creating it",
                self.config.server_name
            ))
        }))
    }

    /// The routes array after applying `changes` in order.
    fn changed_routes(&self, routes: &[Value], changes: &[Change]) -> Vec<Value> {
        let mut routes = routes.to_vec();
        for change in changes {
            let service = change.service();
            let position = routes.iter().position(|r| self.owns(r, service));
            routes.retain(|r| !self.owns(r, service));
            if let Change::Publish { route, .. } = change {
                routes.insert(position.unwrap_or(0), route.clone());
            }
        }
        routes
    }

    /// How many route writes (each one a reload of Caddy's config) this
    /// traffic plane and its clones made.
    pub fn route_writes(&self) -> u64 {
        self.writer.route_writes.load(Ordering::Relaxed)
    }

    /// How many times `ensure` found stead's server gone (the proxy lost
    /// its config) and created it again.
    pub fn servers_created(&self) -> u64 {
        self.writer.servers_created.load(Ordering::Relaxed)
    }

    /// Every route stead owns, as Caddy holds it now: route id → the
    /// upstream it dials. `None` when stead's server does not exist.
    pub async fn routes(&self) -> Result<Option<Vec<(String, String)>>, TrafficError> {
        let path = self.routes_path();
        let Some(current) = self.read(&path).await? else {
            return Ok(None);
        };
        let routes = current.value.as_array().cloned().unwrap_or_default();
        Ok(Some(
            routes
                .iter()
                .filter_map(|r| {
                    let id = r.get("@id")?.as_str()?;
                    let dial = r["handle"][0]["upstreams"][0]["dial"].as_str()?;
                    id.starts_with(names::ROUTE_ID_PREFIX)
                        .then(|| (id.to_owned(), dial.to_owned()))
                })
                .collect(),
        ))
    }

    /// Whether Caddy holds a route for `service` now.
    pub async fn is_published(&self, service: &ServiceKey) -> Result<bool, TrafficError> {
        let id = Self::route_id(service);
        Ok(self
            .routes()
            .await?
            .is_some_and(|routes| routes.iter().any(|(r, _)| *r == id)))
    }

    /// Reads a config value and its ETag; `None` when the path is absent
    /// (Caddy answers 400 "invalid traversal path", 404, or `null`).
    async fn read(&self, path: &str) -> Result<Option<Current>, TrafficError> {
        let response = self.send(Method::GET, path, None, None).await?;
        let status = response.status();
        let body = read_answer(response, &Method::GET, path).await?;
        match status {
            s if s.is_success() => {}
            StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => return Ok(None),
            s => return Err(error("GET", path, s, &String::from_utf8_lossy(&body))),
        }
        let value: Value = serde_json::from_slice(&body).map_err(|e| {
            TrafficError::Rejected(format!(
                "caddy GET {path}: not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(&body))
            ))
        })?;
        if value.is_null() {
            return Ok(None);
        }
        Ok(Some(Current {
            value,
            etag: etag(path, &body),
        }))
    }

    async fn exists(&self, path: &str) -> Result<bool, TrafficError> {
        Ok(self.read(path).await?.is_some())
    }

    /// A write without a precondition (creating the server's levels,
    /// correcting its listen address).
    async fn write(&self, method: Method, path: &str, value: &Value) -> Result<(), TrafficError> {
        match self.send_checked(method, path, Some(value), None).await? {
            Written::Done => Ok(()),
            Written::Stale(e) => Err(e),
        }
    }

    /// Sends a change; 2xx is done, 412 (the `If-Match` precondition
    /// failed: someone else changed the config) is stale, anything else an
    /// error carrying the status and an excerpt of Caddy's body.
    async fn send_checked(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Written, TrafficError> {
        let response = self.send(method.clone(), path, body, if_match).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(Written::Done);
        }
        let body = read_answer(response, &method, path).await?;
        let text = String::from_utf8_lossy(&body);
        let e = error(method.as_str(), path, status, &text);
        if status == StatusCode::PRECONDITION_FAILED {
            return Ok(Written::Stale(e));
        }
        Err(e)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<reqwest::Response, TrafficError> {
        let url = format!("{}{path}", self.admin_url);
        let mut attempt = 0;
        loop {
            let mut request = self.client.request(method.clone(), &url);
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(tag) = if_match {
                request = request.header("If-Match", tag);
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
                    return Err(TrafficError::Unreachable(format!(
                        "caddy {method} {path}: admin API at {} did not answer: {e}",
                        self.config.admin_addr
                    )))
                }
            }
        }
    }
}

/// Reads the body of one admin API answer, at most
/// [`CADDY_ANSWER_LEN_MAX`] bytes whatever it claims: a larger one is
/// refused naming the call and the bound, before or while it is read.
async fn read_answer(
    mut response: reqwest::Response,
    method: &Method,
    path: &str,
) -> Result<Vec<u8>, TrafficError> {
    let too_large = || {
        TrafficError::Rejected(format!(
            "caddy {method} {path}: the answer is larger than {CADDY_ANSWER_LEN_MAX} bytes, \
             the most stead reads from Caddy's admin API"
        ))
    };
    if response
        .content_length()
        .is_some_and(|len| len > CADDY_ANSWER_LEN_MAX as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| TrafficError::Unreachable(format!("caddy {method} {path}: read body: {e}")))?
    {
        if body.len() + chunk.len() > CADDY_ANSWER_LEN_MAX {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A config value as read, with the ETag that guards a write of it.
struct Current {
    value: Value,
    etag: String,
}

enum Written {
    Done,
    Stale(TrafficError),
}

/// Where Linux says whether connections queued on a closed `SO_REUSEPORT`
/// listener move to its sibling instead of being reset.
const TCP_MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// A warning when this host resets connections on every Caddy reload.
///
/// Caddy (2.6 and later, on Linux) opens each config generation's listener
/// as a new `SO_REUSEPORT` socket beside the old one and closes the old one
/// once the new config runs. Connections the kernel had already queued on
/// the old socket are reset when it closes, unless `net.ipv4.tcp_migrate_req`
/// is 1, which hands them to the new socket. Every route change is a reload,
/// so with the default 0 a few requests to *any* instance are reset around
/// each publish or withdrawal (measured: about one per reload at 7,700
/// requests/s; none with the setting on). stead cannot change a host's
/// kernel settings for it; it says so, and `docs/operations.md` shows the
/// one-line fix. `None` when the setting is on, or the host has no such
/// setting (not Linux, or a kernel older than 5.14, which has no remedy).
pub fn host_reload_warning() -> Option<String> {
    let value = crate::config::read_bounded(std::path::Path::new(TCP_MIGRATE_REQ), 16).ok()?;
    (value.trim() == "0").then(|| {
        format!(
            "{TCP_MIGRATE_REQ} is 0: if Caddy runs on this host, each route change (a Caddy reload) resets \
             connections queued on its old listener; set net.ipv4.tcp_migrate_req = 1 \
             (docs/operations.md, \"Caddy reloads\")"
        )
    })
}

/// The answer to a change whose batch was dropped midway: the caller that
/// was writing it gave up (its deadline passed), so nobody knows whether
/// Caddy applied it. Reported as a failure, which is the safe reading: a
/// failed withdrawal is retried, a failed publication is not trusted.
fn abandoned() -> TrafficError {
    TrafficError::Unreachable(
        "caddy: the write carrying this route change was abandoned midway; Caddy may or may not hold it"
            .to_owned(),
    )
}

/// The catch-all at the end of stead's server: hosts with no route get 404.
fn catch_all() -> Value {
    json!({
        "handle": [{
            "handler": "static_response",
            "status_code": 404,
            "body": "no route\n",
        }],
    })
}

/// Caddy's ETag of a config read: `"<path> <hex FNV-1a 32 of the body>"`.
/// Caddy 2.6 sends it as an HTTP trailer, which the client does not expose,
/// so it is computed from the body exactly as Caddy computes it.
pub fn etag(path: &str, body: &[u8]) -> String {
    format!("\"{path} {:08x}\"", fnv1a_32(body))
}

/// The 32-bit FNV-1a hash (Caddy's `hash/fnv.New32a`).
fn fnv1a_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(PRIME)
    })
}

#[async_trait]
impl Traffic for CaddyTraffic {
    async fn publish(&self, route: &Route) -> Result<(), TrafficError> {
        let value = self.route_value(route)?;
        self.submit(Change::Publish {
            service: route.service.clone(),
            route: value,
        })
        .await
    }

    async fn withdraw(&self, service: &ServiceKey) -> Result<(), TrafficError> {
        self.submit(Change::Withdraw {
            service: service.clone(),
        })
        .await
    }

    async fn ensure(&self) -> Result<PlaneCheck, TrafficError> {
        Ok(match self.ensure_server().await? {
            ServerCheck::Present => PlaneCheck::Present,
            ServerCheck::Created => {
                self.writer.servers_created.fetch_add(1, Ordering::Relaxed);
                PlaneCheck::Recreated
            }
            ServerCheck::ListenCorrected { was } => PlaneCheck::Corrected {
                was: was.join(", "),
            },
        })
    }

    async fn held_routes(&self) -> Result<Vec<HeldRoute>, TrafficError> {
        Ok(self
            .routes()
            .await?
            .unwrap_or_default()
            .iter()
            .filter_map(|(id, dial)| {
                Some(HeldRoute {
                    service: Self::service_of(id)?,
                    port: dial.strip_prefix("127.0.0.1:")?.parse().ok()?,
                })
            })
            .collect())
    }
}

fn excerpt(body: &str) -> &str {
    let mut excerpt = body.trim();
    if excerpt.len() > BODY_EXCERPT_LEN_MAX {
        let mut end = BODY_EXCERPT_LEN_MAX;
        while !excerpt.is_char_boundary(end) {
            end -= 1;
        }
        excerpt = &excerpt[..end];
    }
    excerpt
}

fn error(method: &str, path: &str, status: StatusCode, body: &str) -> TrafficError {
    TrafficError::Rejected(format!(
        "caddy {method} {path}: {status}: {}",
        excerpt(body)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_32_matches_the_reference_vectors() {
        // From the FNV reference (draft-eastlake-fnv).
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    fn key(instance: &str, service: &str) -> ServiceKey {
        ServiceKey {
            instance: instance.into(),
            service: service.into(),
        }
    }

    #[test]
    fn route_ids_decode_only_into_valid_names() {
        let web = key("a-api", "web");
        assert_eq!(
            CaddyTraffic::service_of(&CaddyTraffic::route_id(&web)),
            Some(web)
        );
        for bad in [
            "stead-a-web",
            "stead.a",
            "stead.a.b.c",
            "stead.x/../../config#.web",
            "stead..web",
            "other.a.web",
        ] {
            assert_eq!(CaddyTraffic::service_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn route_ids_of_services_whose_dashed_names_collide_differ() {
        let a = CaddyTraffic::route_id(&key("a-api", "web"));
        let b = CaddyTraffic::route_id(&key("a", "api-web"));
        assert_ne!(a, b);
        // The legacy scheme is the collision this replaces.
        assert_eq!(
            CaddyTraffic::legacy_route_id(&key("a-api", "web")),
            CaddyTraffic::legacy_route_id(&key("a", "api-web"))
        );
    }

    #[test]
    fn an_id_url_keeps_any_name_inside_one_path_segment() {
        let url = CaddyTraffic::route_id_url("127.0.0.1:2019", &key("shop", "web")).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:2019/id/stead.shop.web");
        // A name no row or label check lets through, encoded anyway.
        let url =
            CaddyTraffic::route_id_url("127.0.0.1:2019", &key("x/../../config#", "web")).unwrap();
        assert_eq!(url.path(), "/id/stead.x%2F..%2F..%2Fconfig%23.web");
        assert_eq!(url.fragment(), None);
    }

    #[test]
    fn a_route_for_a_name_that_is_not_a_dns_label_is_refused() {
        let caddy = CaddyTraffic::new(CaddyConfig::default()).unwrap();
        for (instance, service) in [("x/../../config#", "web"), ("shop", "web.evil")] {
            let route = Route {
                service: key(instance, service),
                container: "c1".into(),
                binds: [(8080, 32768)].into(),
                verified_started_at: None,
            };
            let Err(TrafficError::Rejected(message)) = caddy.route_value(&route) else {
                panic!("{instance}/{service} must be refused");
            };
            assert!(message.contains("must be a DNS label"), "{message}");
        }
    }

    #[test]
    fn a_legacy_route_is_replaced_in_place_only_for_its_own_host() {
        let caddy = CaddyTraffic::new(CaddyConfig::default()).unwrap();
        let mine = key("a-api", "web");
        let theirs = key("a", "api-web");
        let legacy = |service: &ServiceKey| {
            json!({
                "@id": CaddyTraffic::legacy_route_id(service),
                "match": [{ "host": [caddy.host(service)] }],
            })
        };
        let routes = vec![legacy(&theirs), legacy(&mine), catch_all()];
        let new = json!({ "@id": CaddyTraffic::route_id(&mine) });
        let changed = caddy.changed_routes(
            &routes,
            &[Change::Publish {
                service: mine.clone(),
                route: new.clone(),
            }],
        );
        assert_eq!(changed, vec![legacy(&theirs), new, catch_all()]);
        let withdrawn = caddy.changed_routes(&changed, &[Change::Withdraw { service: mine }]);
        assert_eq!(withdrawn, vec![legacy(&theirs), catch_all()]);
    }

    #[test]
    fn new_routes_go_ahead_of_the_catch_all_and_a_batch_applies_in_order() {
        let caddy = CaddyTraffic::new(CaddyConfig::default()).unwrap();
        let (a, b) = (key("shop", "web"), key("blog", "web"));
        let route =
            |k: &ServiceKey, port: u16| json!({ "@id": CaddyTraffic::route_id(k), "port": port });
        let changes = [
            Change::Publish {
                service: a.clone(),
                route: route(&a, 1),
            },
            Change::Publish {
                service: b.clone(),
                route: route(&b, 2),
            },
            Change::Withdraw { service: a.clone() },
            Change::Publish {
                service: b.clone(),
                route: route(&b, 3),
            },
        ];
        let changed = caddy.changed_routes(&[catch_all()], &changes);
        assert_eq!(changed, vec![route(&b, 3), catch_all()]);
    }
}
