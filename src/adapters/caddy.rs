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

mod admin;
use admin::{AdminClient, Answer, CallFailure};
pub use admin::{AdminEndpoint, UNIX_PREFIX};
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
    /// HTTPS for public host names (#43); `None` serves loopback HTTP only.
    pub tls: Option<CaddyTls>,
}

/// HTTPS for the public host names of services (#43): a second server of
/// stead's, with Caddy's automatic HTTPS for the names its routes match,
/// certificates from `issuer`, and HTTP redirected to it by routes in the
/// HTTP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaddyTls {
    pub issuer: TlsIssuer,
    /// Where the HTTPS server listens (`host:port`).
    pub listen_addr: String,
    /// The default scheme: with a domain, every service is also served as
    /// `<service>.<instance>.<domain>`.
    pub domain: Option<String>,
    /// `Strict-Transport-Security: max-age=…` on every HTTPS answer; `None`
    /// sends no such header.
    pub hsts_max_age: Option<Duration>,
}

/// Who signs the certificates of the public host names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsIssuer {
    /// Caddy's own local CA (`/pki/ca/local`): tests and private networks,
    /// whose clients trust that CA's root.
    Internal,
    /// An ACME CA: Let's Encrypt unless `ca` names another directory.
    Acme {
        email: Option<String>,
        ca: Option<String>,
    },
}

impl TlsIssuer {
    /// The issuer as Caddy's automation policy takes it.
    fn json(&self) -> Value {
        match self {
            Self::Internal => json!({ "module": "internal" }),
            Self::Acme { email, ca } => {
                let mut issuer = json!({ "module": "acme" });
                if let Some(email) = email {
                    issuer["email"] = json!(email);
                }
                if let Some(ca) = ca {
                    issuer["ca"] = json!(ca);
                }
                issuer
            }
        }
    }
}

impl Default for CaddyConfig {
    fn default() -> Self {
        Self {
            admin_addr: DEFAULT_ADMIN_ADDR.to_owned(),
            server_name: "stead".to_owned(),
            listen_addr: DEFAULT_LISTEN_ADDR.to_owned(),
            host_suffix: "localhost".to_owned(),
            request_timeout: Duration::from_secs(10),
            tls: None,
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
    Publish {
        service: ServiceKey,
        routes: ServiceRoutes,
    },
    Withdraw {
        service: ServiceKey,
    },
}

/// The route objects of one published service.
#[derive(Clone, Debug)]
struct ServiceRoutes {
    /// In the HTTP server: the loopback host `<service>.<instance>.<suffix>`.
    http: Value,
    /// With HTTPS and public hosts: the HTTP server's redirect of those
    /// hosts to HTTPS, and the HTTPS server's route.
    https: Option<HttpsRoutes>,
}

#[derive(Clone, Debug)]
struct HttpsRoutes {
    hosts: Vec<String>,
    redirect: Value,
    tls: Value,
}

impl Change {
    fn service(&self) -> &ServiceKey {
        match self {
            Change::Publish { service, .. } | Change::Withdraw { service } => service,
        }
    }

    fn routes(&self) -> Option<&ServiceRoutes> {
        match self {
            Change::Publish { routes, .. } => Some(routes),
            Change::Withdraw { .. } => None,
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
    /// Times [`CaddyTraffic::servers_present`] found them gone.
    servers_missed: AtomicU64,
    /// With HTTPS on: the public hosts each service was last published
    /// with by this process (none: no HTTPS route), since it started or
    /// the catalog was reloaded. What Caddy holds is read back against
    /// this (T5, see `held_routes`).
    published_hosts: Mutex<std::collections::BTreeMap<ServiceKey, Vec<String>>>,
}

/// The `Traffic` port over Caddy's admin API.
#[derive(Clone, Debug)]
pub struct CaddyTraffic {
    admin: AdminClient,
    config: CaddyConfig,
    writer: Arc<Writer>,
}

impl CaddyTraffic {
    pub fn new(config: CaddyConfig) -> Result<Self, TrafficError> {
        let endpoint = AdminEndpoint::parse(&config.admin_addr).map_err(|e| {
            TrafficError::Rejected(format!("caddy admin address {:?}: {e}", config.admin_addr))
        })?;
        let admin = AdminClient::new(endpoint, config.request_timeout, CADDY_ANSWER_LEN_MAX)?;
        Ok(Self {
            admin,
            config,
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

    /// What Caddy answers for the service's route by its `@id` now (200:
    /// held, 404: not), over the configured transport. One try: a reader
    /// (the status view) says "unreachable" rather than wait out retries.
    pub async fn route_status(&self, service: &ServiceKey) -> Result<StatusCode, TrafficError> {
        let url = Self::route_id_url("caddy", service)?;
        match self.admin.call(&Method::GET, url.path(), None, None).await {
            Ok(Answer { status, .. }) => Ok(status),
            Err(CallFailure::Connect(e) | CallFailure::Other(e)) => Err(TrafficError::Unreachable(
                format!("caddy GET {}: {e}", url.path()),
            )),
            Err(CallFailure::TooLarge) => Err(TrafficError::Rejected(format!(
                "caddy GET {}: answer too large",
                url.path()
            ))),
        }
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

    /// The key of stead's HTTPS server (#43), beside its HTTP one.
    pub fn tls_server_name(&self) -> String {
        format!("{}-tls", self.config.server_name)
    }

    /// The `@id` of a service's route in the HTTPS server.
    fn tls_route_id(service: &ServiceKey) -> String {
        format!("{TLS_ROUTE_ID_PREFIX}{}", Self::route_id(service))
    }

    /// The `@id` of a service's redirect to HTTPS in the HTTP server.
    fn redirect_route_id(service: &ServiceKey) -> String {
        format!("{REDIRECT_ROUTE_ID_PREFIX}{}", Self::route_id(service))
    }

    /// The `@id` of stead's TLS automation policy.
    fn policy_id(&self) -> String {
        format!("tls-policy.{}", self.config.server_name)
    }

    /// Creates stead's HTTP server (automatic HTTPS off, a `404 no route`
    /// catch-all) if it is missing, and corrects its listen address if it
    /// differs from the config; with HTTPS on, its HTTPS server too (and,
    /// for the internal issuer, Caddy's local CA kept out of the host's
    /// trust store). Only the missing levels of Caddy's config are
    /// created, so the rest of it (its admin endpoint above all) is never
    /// replaced. Cheap when nothing is wrong (a read per server), so it
    /// runs every tick: a Caddy restarted without its saved config comes
    /// back empty.
    pub async fn ensure_server(&self) -> Result<ServerCheck, TrafficError> {
        let http = self
            .ensure_one(
                &self.config.server_name,
                &self.config.listen_addr,
                json!({
                    "automatic_https": { "disable": true },
                    "routes": [catch_all()],
                }),
            )
            .await?;
        let Some(tls) = &self.config.tls else {
            return Ok(http);
        };
        if tls.issuer == TlsIssuer::Internal {
            let local = ["apps", "pki", "certificate_authorities", "local"];
            if !self.exists(&config_path(&local)).await? {
                // Caddy installs its root in the host's trust store unless
                // told not to: not stead's to change.
                self.create_at(&local, json!({ "install_trust": false }))
                    .await?;
            }
        }
        let https = self
            .ensure_one(
                &self.tls_server_name(),
                &tls.listen_addr,
                json!({
                    // Certificates for the hosts its routes match; the
                    // redirects are stead's own routes in the HTTP server
                    // (Caddy's would need its HTTP port, not stead's).
                    "automatic_https": { "disable_redirects": true },
                    // TLS even before any route has a certificate.
                    "tls_connection_policies": [{}],
                    "routes": [catch_all()],
                }),
            )
            .await?;
        Ok(match (http, https) {
            (ServerCheck::Created, _) | (_, ServerCheck::Created) => ServerCheck::Created,
            (ServerCheck::ListenCorrected { mut was }, other)
            | (other, ServerCheck::ListenCorrected { mut was }) => {
                if let ServerCheck::ListenCorrected { was: more } = other {
                    was.extend(more);
                }
                ServerCheck::ListenCorrected { was }
            }
            (ServerCheck::Present, ServerCheck::Present) => ServerCheck::Present,
        })
    }

    /// [`Self::ensure_server`] for one server: `server` is its body without
    /// `listen`.
    async fn ensure_one(
        &self,
        name: &str,
        listen_addr: &str,
        mut server: Value,
    ) -> Result<ServerCheck, TrafficError> {
        let listen = json!([listen_addr]);
        let levels = ["apps", "http", "servers", name];
        let server_path = config_path(&levels);
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
        server["listen"] = listen;
        self.create_at(&levels, server).await?;
        // Counted where it happens: a publish that finds no server creates
        // it too, not only the pass's `ensure`.
        self.writer.servers_created.fetch_add(1, Ordering::Relaxed);
        Ok(ServerCheck::Created)
    }

    /// Whether stead's servers are in Caddy's config now: one read each,
    /// for the watcher between ticks (a Caddy that lost its config, e.g.
    /// reloaded with another Caddyfile, has none).
    pub async fn servers_present(&self) -> Result<bool, TrafficError> {
        let mut names = vec![self.config.server_name.clone()];
        if self.config.tls.is_some() {
            names.push(self.tls_server_name());
        }
        for name in names {
            let listen = config_path(&["apps", "http", "servers", &name, "listen"]);
            if !self.exists(&listen).await? {
                self.writer.servers_missed.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Puts `value` at `levels` under `/config/`, creating only the missing
    /// levels above it: the deepest existing one gets the rest nested
    /// under it.
    async fn create_at(&self, levels: &[&str], value: Value) -> Result<(), TrafficError> {
        assert!(!levels.is_empty(), "a value is put under some key");
        let mut parent = levels.len() - 1;
        while parent > 0 && !self.exists(&config_path(&levels[..parent])).await? {
            parent -= 1;
        }
        let nested = levels[parent + 1..]
            .iter()
            .rev()
            .fold(value, |value, key| json!({ *key: value }));
        self.write(Method::PUT, &config_path(&levels[..=parent]), &nested)
            .await
    }

    /// The route objects for one service.
    fn service_routes(&self, route: &Route) -> Result<ServiceRoutes, TrafficError> {
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
        let proxy = json!({
            "handler": "reverse_proxy",
            "upstreams": [{ "dial": format!("127.0.0.1:{host_port}") }],
        });
        let http = json!({
            "@id": id,
            "match": [{ "host": [self.host(&route.service)] }],
            "handle": [proxy],
            "terminal": true,
        });
        let https = match &self.config.tls {
            None => None,
            Some(tls) => self.https_routes(tls, route, proxy)?,
        };
        Ok(ServiceRoutes { http, https })
    }

    /// The HTTPS route and the redirect of a service with public hosts
    /// (the default scheme's and the catalog's); `None` without any.
    fn https_routes(
        &self,
        tls: &CaddyTls,
        route: &Route,
        proxy: Value,
    ) -> Result<Option<HttpsRoutes>, TrafficError> {
        let mut hosts = std::collections::BTreeSet::new();
        if let Some(domain) = &tls.domain {
            let ServiceKey { instance, service } = &route.service;
            hosts.insert(format!("{service}.{instance}.{domain}"));
        }
        for host in &route.public_hosts {
            // Rendered from checked templates; checked again because a
            // host becomes a matcher and a certificate's subject.
            names::check_dns_name("public host", host).map_err(|e| {
                TrafficError::Rejected(format!(
                    "route {} not published: {e}",
                    Self::route_id(&route.service)
                ))
            })?;
            hosts.insert(host.clone());
        }
        if hosts.is_empty() {
            return Ok(None);
        }
        let hosts: Vec<String> = hosts.into_iter().collect();
        let port = match tls.listen_addr.rsplit_once(':') {
            Some((_, "443")) | None => String::new(),
            Some((_, port)) => format!(":{port}"),
        };
        let redirect = json!({
            "@id": Self::redirect_route_id(&route.service),
            "match": [{ "host": hosts }],
            "handle": [{
                "handler": "static_response",
                "status_code": 308,
                "headers": {
                    "Location": [format!("https://{{http.request.host}}{port}{{http.request.uri}}")],
                },
            }],
            "terminal": true,
        });
        let mut handle = Vec::new();
        if let Some(max_age) = tls.hsts_max_age {
            handle.push(json!({
                "handler": "headers",
                "response": {
                    "set": {
                        "Strict-Transport-Security": [format!("max-age={}", max_age.as_secs())],
                    },
                },
            }));
        }
        handle.push(proxy);
        let tls_route = json!({
            "@id": Self::tls_route_id(&route.service),
            "match": [{ "host": hosts }],
            "handle": handle,
            "terminal": true,
        });
        Ok(Some(HttpsRoutes {
            hosts,
            redirect,
            tls: tls_route,
        }))
    }

    /// Whether `route` (an element of the HTTP server's routes array) is
    /// `service`'s loopback route.
    fn owns(&self, route: &Value, service: &ServiceKey) -> bool {
        let id = route.get("@id").and_then(Value::as_str);
        if id == Some(Self::route_id(service).as_str()) {
            return true;
        }
        id == Some(Self::legacy_route_id(service).as_str())
            && route["match"][0]["host"][0].as_str() == Some(self.host(service).as_str())
    }

    /// Whether `route` (in either server) is any of `service`'s.
    fn owns_any(&self, route: &Value, service: &ServiceKey) -> bool {
        let id = route.get("@id").and_then(Value::as_str);
        self.owns(route, service)
            || id == Some(Self::redirect_route_id(service).as_str())
            || id == Some(Self::tls_route_id(service).as_str())
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
        for (n, reply) in replies.into_iter().enumerate() {
            let answer = match &result {
                Ok(refusals) => refusals[n].clone().map_or(Ok(()), Err),
                Err(e) => Err(e.clone()),
            };
            // A caller that gave up (its deadline passed) dropped its end.
            let _ = reply.send(answer);
        }
        // Our change was queued before we took the lock, so it was in the
        // batch just written.
        answer.try_recv().unwrap_or_else(|_| Err(abandoned()))
    }

    /// Applies a batch of changes with one read and at most one write;
    /// with each change's refusal (a host another service holds), by
    /// position.
    async fn apply(&self, changes: &[Change]) -> Result<Vec<Option<TrafficError>>, TrafficError> {
        if self.config.tls.is_some() {
            return self.apply_to_apps(changes).await;
        }
        self.apply_to_routes(changes).await?;
        Ok(vec![None; changes.len()])
    }

    /// [`Self::apply`] without HTTPS: on the HTTP server's routes array.
    async fn apply_to_routes(&self, changes: &[Change]) -> Result<(), TrafficError> {
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
                match self.ensure_server().await? {
                    ServerCheck::Present => {
                        self.write(Method::PUT, &path, &json!([catch_all()]))
                            .await?
                    }
                    ServerCheck::Created => recreated_while_publishing(),
                    ServerCheck::ListenCorrected { .. } => {}
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
                .write_guarded(&path, Value::Array(updated), &current.etag)
                .await?
            {
                Written::Done => return Ok(()),
                Written::Stale(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| self.still_missing(&path)))
    }

    /// [`Self::apply`] with HTTPS: both servers' routes and the TLS
    /// automation policy live in different apps of Caddy's config, so the
    /// change is one read and one write of `/config/apps`, guarded by its
    /// ETag, and both servers and the policy change in one reload.
    async fn apply_to_apps(
        &self,
        changes: &[Change],
    ) -> Result<Vec<Option<TrafficError>>, TrafficError> {
        let path = "/config/apps";
        let mut last_error = None;
        for _ in 0..WRITE_ATTEMPTS_MAX {
            let current = self.read(path).await?;
            let edited = current.as_ref().and_then(|current| {
                let mut apps = current.value.clone();
                let refusals = self.changed_apps(&mut apps, changes)?;
                Some((apps, refusals))
            });
            let (Some(current), Some((apps, refusals))) = (current, edited) else {
                if changes.iter().all(|c| matches!(c, Change::Withdraw { .. })) {
                    // No server, so no route: withdrawn already.
                    return Ok(vec![None; changes.len()]);
                }
                if self.ensure_server().await? == ServerCheck::Created {
                    recreated_while_publishing();
                }
                continue;
            };
            if apps == current.value {
                return Ok(refusals);
            }
            match self.write_guarded(path, apps, &current.etag).await? {
                Written::Done => return Ok(refusals),
                Written::Stale(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| self.still_missing(path)))
    }

    /// A write of a value read with `etag`; counted when Caddy took it.
    async fn write_guarded(
        &self,
        path: &str,
        value: Value,
        etag: &str,
    ) -> Result<Written, TrafficError> {
        let written = self
            .send_checked(Method::PATCH, path, Some(&value), Some(etag))
            .await?;
        if matches!(written, Written::Done) {
            self.writer.route_writes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("stead_caddy_route_writes_total").increment(1);
        }
        Ok(written)
    }

    fn still_missing(&self, path: &str) -> TrafficError {
        TrafficError::Rejected(format!(
            "caddy {path}: server {:?} still missing after creating it",
            self.config.server_name
        ))
    }

    /// The HTTP server's routes array after applying `changes` in order.
    fn changed_routes(&self, routes: &[Value], changes: &[Change]) -> Vec<Value> {
        let mut routes = routes.to_vec();
        for change in changes {
            let service = change.service();
            let new = change.routes().map(|r| r.http.clone());
            place(&mut routes, |r| self.owns(r, service), new);
        }
        routes
    }

    /// Caddy's `apps` after applying `changes` in order (HTTPS on): the
    /// HTTP server's loopback routes and redirects, the HTTPS server's
    /// routes, and the automation policy naming exactly the hosts those
    /// routes match (none: no policy, since a policy without subjects
    /// would take every other site's certificates). A publish whose host
    /// another route in stead's servers already matches is refused, and
    /// the holder keeps it. `None` when a server is missing.
    fn changed_apps(
        &self,
        apps: &mut Value,
        changes: &[Change],
    ) -> Option<Vec<Option<TrafficError>>> {
        let http_path = format!("/http/servers/{}/routes", self.config.server_name);
        let tls_path = format!("/http/servers/{}/routes", self.tls_server_name());
        let mut http = apps.pointer(&http_path)?.as_array()?.clone();
        let mut tls = apps.pointer(&tls_path)?.as_array()?.clone();
        let mut refusals = Vec::with_capacity(changes.len());
        for change in changes {
            let service = change.service();
            let routes = change.routes();
            let hosts = routes
                .and_then(|r| r.https.as_ref())
                .map(|h| h.hosts.as_slice())
                .unwrap_or_default();
            if let Some(refusal) = self.claimed(service, hosts, tls.iter().chain(&http)) {
                refusals.push(Some(refusal));
                continue;
            }
            refusals.push(None);
            let https = routes.and_then(|r| r.https.as_ref());
            place(
                &mut http,
                |r| self.owns(r, service),
                routes.map(|r| r.http.clone()),
            );
            let redirect_id = Self::redirect_route_id(service);
            place(
                &mut http,
                |r| r.get("@id").and_then(Value::as_str) == Some(redirect_id.as_str()),
                https.map(|h| h.redirect.clone()),
            );
            let tls_id = Self::tls_route_id(service);
            place(
                &mut tls,
                |r| r.get("@id").and_then(Value::as_str) == Some(tls_id.as_str()),
                https.map(|h| h.tls.clone()),
            );
        }
        let subjects: std::collections::BTreeSet<&str> = tls
            .iter()
            .filter(|r| {
                r.get("@id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| id.starts_with(TLS_ROUTE_ID_PREFIX))
            })
            .flat_map(route_hosts)
            .collect();
        let policy = (!subjects.is_empty()).then(|| {
            json!({
                "@id": self.policy_id(),
                "subjects": subjects,
                "issuers": [self.config.tls.as_ref().map(|t| t.issuer.json())],
            })
        });
        self.place_policy(apps, policy);
        *apps.pointer_mut(&http_path)? = Value::Array(http);
        *apps.pointer_mut(&tls_path)? = Value::Array(tls);
        Some(refusals)
    }

    /// The refusal of a publish of `hosts` for `service` when another
    /// route already matches one of them (T6 for public names: two
    /// instances never share a host).
    fn claimed<'a>(
        &self,
        service: &ServiceKey,
        hosts: &[String],
        routes: impl Iterator<Item = &'a Value>,
    ) -> Option<TrafficError> {
        for route in routes.filter(|r| !self.owns_any(r, service)) {
            if let Some(host) = route_hosts(route).find(|h| hosts.iter().any(|mine| mine == h)) {
                let holder = route
                    .get("@id")
                    .and_then(Value::as_str)
                    .unwrap_or("a route stead does not own");
                return Some(TrafficError::Rejected(format!(
                    "route {} not published: host {host} is already served by {holder}; \
                     two services cannot share a host name (see the catalog's domains)",
                    Self::route_id(service)
                )));
            }
        }
        None
    }

    /// Puts stead's automation policy first in `apps.tls.automation.policies`
    /// (where it was, if it was there), or removes it when `None`.
    fn place_policy(&self, apps: &mut Value, policy: Option<Value>) {
        let id = self.policy_id();
        let owns = |p: &Value| p.get("@id").and_then(Value::as_str) == Some(id.as_str());
        if let Some(policies) = apps
            .pointer_mut("/tls/automation/policies")
            .and_then(Value::as_array_mut)
        {
            place(policies, owns, policy);
            return;
        }
        let Some(policy) = policy else {
            return;
        };
        let mut at = apps;
        for key in ["tls", "automation"] {
            if !at.get(key).is_some_and(Value::is_object) {
                at[key] = json!({});
            }
            at = &mut at[key];
        }
        at["policies"] = json!([policy]);
    }

    /// Notes the public hosts `service` is published with from now on;
    /// `None`: withdrawn.
    fn note_published_hosts(&self, service: &ServiceKey, hosts: Option<Vec<String>>) {
        let mut published = self
            .writer
            .published_hosts
            .lock()
            .expect("published hosts poisoned");
        match hosts {
            Some(hosts) => published.insert(service.clone(), hosts),
            None => published.remove(service),
        };
    }

    /// Forgets which public hosts each service was published with: the
    /// next pass reads every route back as wrong and republishes it, so a
    /// reloaded catalog's `domains` take effect without waiting for each
    /// service's next change. A republication that changes nothing writes
    /// nothing (one read per service, no reload).
    pub fn forget_published_hosts(&self) {
        self.writer
            .published_hosts
            .lock()
            .expect("published hosts poisoned")
            .clear();
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

    /// How many times [`Self::servers_present`] (the watcher between
    /// ticks) found stead's servers gone.
    pub fn servers_missed(&self) -> u64 {
        self.writer.servers_missed.load(Ordering::Relaxed)
    }

    /// Every route stead owns, as Caddy holds it now: route id → the
    /// upstream it dials. `None` when stead's server does not exist.
    pub async fn routes(&self) -> Result<Option<Vec<(String, String)>>, TrafficError> {
        let path = self.routes_path();
        let Some(current) = self.read(&path).await? else {
            return Ok(None);
        };
        Ok(Some(owned_dials(&current.value, names::ROUTE_ID_PREFIX)))
    }

    /// The HTTPS server's routes of stead's (#43): route id → the upstream
    /// it dials and the hosts it matches. `None` when HTTPS is off; empty
    /// when the server does not exist.
    async fn https_routes_held(
        &self,
    ) -> Result<Option<std::collections::BTreeMap<String, (String, Vec<String>)>>, TrafficError>
    {
        if self.config.tls.is_none() {
            return Ok(None);
        }
        let path = config_path(&["apps", "http", "servers", &self.tls_server_name(), "routes"]);
        let Some(current) = self.read(&path).await? else {
            return Ok(Some(Default::default()));
        };
        let prefix = format!("{TLS_ROUTE_ID_PREFIX}{}", names::ROUTE_ID_PREFIX);
        Ok(Some(
            current
                .value
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| {
                    let id = r.get("@id")?.as_str()?;
                    let dial = proxy_dial(r)?;
                    let hosts = route_hosts(r).map(str::to_owned).collect();
                    id.starts_with(&prefix)
                        .then(|| (id.to_owned(), (dial.to_owned(), hosts)))
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
        let Answer { status, body } = self.send(Method::GET, path, None, None).await?;
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
        let Answer { status, body } = self.send(method.clone(), path, body, if_match).await?;
        if status.is_success() {
            return Ok(Written::Done);
        }
        let text = String::from_utf8_lossy(&body);
        let e = error(method.as_str(), path, status, &text);
        if status == StatusCode::PRECONDITION_FAILED {
            return Ok(Written::Stale(e));
        }
        Err(e)
    }

    /// One admin call, its answer read within [`CADDY_ANSWER_LEN_MAX`].
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, TrafficError> {
        let mut attempt = 0;
        loop {
            match self.admin.call(&method, path, body, if_match).await {
                Ok(answer) => return Ok(answer),
                // Caddy restarts its admin listener when it loads a new
                // config, so a call right after a change can find the port
                // closed for a moment. A refused connection never reached
                // Caddy, so retrying it is safe for every method.
                Err(CallFailure::Connect(_)) if attempt < ADMIN_CONNECT_RETRIES_MAX => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
                Err(CallFailure::Connect(e) | CallFailure::Other(e)) => {
                    return Err(TrafficError::Unreachable(format!(
                        "caddy {method} {path}: admin API at {} did not answer: {e}",
                        self.config.admin_addr
                    )))
                }
                Err(CallFailure::TooLarge) => {
                    return Err(TrafficError::Rejected(format!(
                        "caddy {method} {path}: the answer is larger than \
                         {CADDY_ANSWER_LEN_MAX} bytes, the most stead reads from Caddy's admin API"
                    )))
                }
            }
        }
    }
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
/// A publish found Caddy without stead's server (restarted without its
/// config between the pass's check and this write) and created it: the
/// same intervention the pass reports from `ensure`, said the same way.
fn recreated_while_publishing() {
    metrics::counter!("stead_traffic_plane_recreated_total").increment(1);
    tracing::warn!(
        "caddy had lost stead's server when a route was published (restarted without its config?); recreated it, the next pass republishes verified routes"
    );
}

fn abandoned() -> TrafficError {
    TrafficError::Unreachable(
        "caddy: the write carrying this route change was abandoned midway; Caddy may or may not hold it"
            .to_owned(),
    )
}

/// Prefix of a service's route id in the HTTPS server (`tls.stead.…`).
const TLS_ROUTE_ID_PREFIX: &str = "tls.";
/// Prefix of a service's redirect id in the HTTP server.
const REDIRECT_ROUTE_ID_PREFIX: &str = "redirect.";

/// `/config/` and `levels` joined by `/`. Caddy's keys stead writes are
/// its own names (no `/`).
fn config_path(levels: &[&str]) -> String {
    format!("/config/{}", levels.join("/"))
}

/// Replaces the elements `owns` picks by `new` (where the first was, else
/// at the front), or removes them when `new` is `None`.
fn place(routes: &mut Vec<Value>, owns: impl Fn(&Value) -> bool, new: Option<Value>) {
    let position = routes.iter().position(&owns);
    routes.retain(|r| !owns(r));
    if let Some(new) = new {
        routes.insert(position.unwrap_or(0), new);
    }
}

/// Each route of `routes` whose id starts with `prefix`: its id and the
/// upstream it dials.
fn owned_dials(routes: &Value, prefix: &str) -> Vec<(String, String)> {
    routes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let id = r.get("@id")?.as_str()?;
            let dial = proxy_dial(r)?;
            id.starts_with(prefix)
                .then(|| (id.to_owned(), dial.to_owned()))
        })
        .collect()
}

/// The upstream a route's `reverse_proxy` handler dials.
fn proxy_dial(route: &Value) -> Option<&str> {
    route["handle"]
        .as_array()?
        .iter()
        .find(|h| h["handler"] == "reverse_proxy")?["upstreams"][0]["dial"]
        .as_str()
}

/// Every host a route's matchers name.
fn route_hosts(route: &Value) -> impl Iterator<Item = &str> {
    route["match"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["host"].as_array())
        .flatten()
        .filter_map(Value::as_str)
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
    #[tracing::instrument(name = "caddy.publish", level = "debug", skip_all, fields(instance = %route.service.instance, service = %route.service.service))]
    async fn publish(&self, route: &Route) -> Result<(), TrafficError> {
        let routes = self.service_routes(route)?;
        let hosts = routes.https.as_ref().map(|h| h.hosts.clone());
        self.note_published_hosts(&route.service, Some(hosts.unwrap_or_default()));
        self.submit(Change::Publish {
            service: route.service.clone(),
            routes,
        })
        .await
    }

    #[tracing::instrument(name = "caddy.withdraw", level = "debug", skip_all, fields(instance = %service.instance, service = %service.service))]
    async fn withdraw(&self, service: &ServiceKey) -> Result<(), TrafficError> {
        self.note_published_hosts(service, None);
        self.submit(Change::Withdraw {
            service: service.clone(),
        })
        .await
    }

    #[tracing::instrument(name = "caddy.ensure", level = "debug", skip_all)]
    async fn ensure(&self) -> Result<PlaneCheck, TrafficError> {
        Ok(match self.ensure_server().await? {
            ServerCheck::Present => PlaneCheck::Present,
            ServerCheck::Created => PlaneCheck::Recreated,
            ServerCheck::ListenCorrected { was } => PlaneCheck::Corrected {
                was: was.join(", "),
            },
        })
    }

    /// With HTTPS on, a service counts as held only when its HTTPS route
    /// is what this process last published for it: present with the same
    /// hosts and dialling the same port as its HTTP route, or absent when
    /// it has no public hosts. Otherwise it reads back as dialling port 0,
    /// which no verified bind has, so the pass republishes it (T5): a
    /// route lost or changed by hand, and every route once after a start
    /// or a reload (`forget_published_hosts`), whose hosts may be stale.
    #[tracing::instrument(name = "caddy.held_routes", level = "debug", skip_all)]
    async fn held_routes(&self) -> Result<Vec<HeldRoute>, TrafficError> {
        let http = self.routes().await?.unwrap_or_default();
        let https = self.https_routes_held().await?;
        let published = self
            .writer
            .published_hosts
            .lock()
            .expect("published hosts poisoned")
            .clone();
        Ok(http
            .iter()
            .filter_map(|(id, dial)| {
                let service = Self::service_of(id)?;
                let port = dial.strip_prefix("127.0.0.1:")?.parse().ok()?;
                let agrees = match (&https, published.get(&service)) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(held), Some(hosts)) => match held.get(&Self::tls_route_id(&service)) {
                        None => hosts.is_empty(),
                        Some((tls_dial, tls_hosts)) => tls_dial == dial && tls_hosts == hosts,
                    },
                };
                Some(HeldRoute {
                    service,
                    port: if agrees { port } else { 0 },
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

    fn publish(service: &ServiceKey, http: Value) -> Change {
        Change::Publish {
            service: service.clone(),
            routes: ServiceRoutes { http, https: None },
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
                public_hosts: Vec::new(),
            };
            let Err(TrafficError::Rejected(message)) = caddy.service_routes(&route) else {
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
        let changed = caddy.changed_routes(&routes, &[publish(&mine, new.clone())]);
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
            publish(&a, route(&a, 1)),
            publish(&b, route(&b, 2)),
            Change::Withdraw { service: a.clone() },
            publish(&b, route(&b, 3)),
        ];
        let changed = caddy.changed_routes(&[catch_all()], &changes);
        assert_eq!(changed, vec![route(&b, 3), catch_all()]);
    }

    fn https_caddy() -> CaddyTraffic {
        CaddyTraffic::new(CaddyConfig {
            tls: Some(CaddyTls {
                issuer: TlsIssuer::Internal,
                listen_addr: "127.0.0.1:8443".to_owned(),
                domain: Some("apps.example.test".to_owned()),
                hsts_max_age: Some(Duration::from_secs(300)),
            }),
            ..CaddyConfig::default()
        })
        .unwrap()
    }

    fn route_to(service: &ServiceKey, port: u16, public_hosts: &[&str]) -> Route {
        Route {
            service: service.clone(),
            container: "c1".into(),
            binds: [(8080, port)].into(),
            verified_started_at: None,
            public_hosts: public_hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    #[test]
    fn an_https_route_serves_the_default_scheme_and_the_catalogs_hosts_with_hsts() {
        let caddy = https_caddy();
        let shop = key("shop", "web");
        let routes = caddy
            .service_routes(&route_to(&shop, 32768, &["shop.example.com"]))
            .unwrap();
        let https = routes.https.expect("public hosts are served over HTTPS");
        assert_eq!(
            https.hosts,
            ["shop.example.com", "web.shop.apps.example.test"]
        );
        assert_eq!(https.tls["@id"], "tls.stead.shop.web");
        assert_eq!(
            https.tls["handle"][0]["response"]["set"]["Strict-Transport-Security"][0],
            "max-age=300"
        );
        assert_eq!(
            https.tls["handle"][1]["upstreams"][0]["dial"],
            "127.0.0.1:32768"
        );
        assert_eq!(
            https.redirect["handle"][0]["headers"]["Location"][0],
            "https://{http.request.host}:8443{http.request.uri}"
        );
        // The loopback route stays as it was.
        assert_eq!(routes.http["match"][0]["host"][0], "web.shop.localhost");
        // A host that is not a DNS name is refused, never matched.
        let bad = caddy.service_routes(&route_to(&shop, 32768, &["Shop.example.com"]));
        assert!(matches!(bad, Err(TrafficError::Rejected(m)) if m.contains("DNS name")));
        // Without HTTPS, public hosts are not served.
        let plain = CaddyTraffic::new(CaddyConfig::default()).unwrap();
        let routes = plain
            .service_routes(&route_to(&shop, 32768, &["shop.example.com"]))
            .unwrap();
        assert!(routes.https.is_none());
    }

    fn apps_with_servers(caddy: &CaddyTraffic) -> Value {
        json!({
            "http": { "servers": {
                "stead": { "routes": [catch_all()] },
                caddy.tls_server_name(): { "routes": [catch_all()] },
            }},
            "tls": { "automation": { "policies": [{ "subjects": ["other.example.org"] }] } },
        })
    }

    fn publish_route(caddy: &CaddyTraffic, route: &Route) -> Change {
        Change::Publish {
            service: route.service.clone(),
            routes: caddy.service_routes(route).unwrap(),
        }
    }

    #[test]
    fn a_host_another_service_holds_is_refused_and_the_holder_keeps_it() {
        let caddy = https_caddy();
        let (a, b) = (key("a", "web"), key("b", "web"));
        let mut apps = apps_with_servers(&caddy);
        let refusals = caddy
            .changed_apps(
                &mut apps,
                &[
                    publish_route(&caddy, &route_to(&a, 1001, &["shop.example.com"])),
                    publish_route(&caddy, &route_to(&b, 1002, &["shop.example.com"])),
                ],
            )
            .expect("both servers exist");
        assert!(refusals[0].is_none());
        let Some(TrafficError::Rejected(why)) = &refusals[1] else {
            panic!("the second claim of a host is refused: {refusals:?}");
        };
        assert!(
            why.contains("host shop.example.com is already served by tls.stead.a.web"),
            "{why}"
        );
        let tls_routes = apps["http"]["servers"]["stead-tls"]["routes"]
            .as_array()
            .unwrap();
        assert_eq!(tls_routes.len(), 2, "a's route and the catch-all");
        assert_eq!(
            tls_routes[0]["handle"][1]["upstreams"][0]["dial"],
            "127.0.0.1:1001"
        );
        // The policy names exactly the hosts served, first, beside the
        // operator's own.
        let policies = apps["tls"]["automation"]["policies"].as_array().unwrap();
        assert_eq!(
            policies[0]["subjects"],
            json!(["shop.example.com", "web.a.apps.example.test"])
        );
        assert_eq!(policies[0]["issuers"][0]["module"], "internal");
        assert_eq!(policies[1]["subjects"][0], "other.example.org");
        // b may have the host once a lets it go; with no host served, no
        // policy of stead's remains (one without subjects would take
        // every other site's certificates).
        let refusals = caddy
            .changed_apps(
                &mut apps,
                &[
                    Change::Withdraw { service: a.clone() },
                    publish_route(&caddy, &route_to(&b, 1002, &["shop.example.com"])),
                    Change::Withdraw { service: b.clone() },
                ],
            )
            .unwrap();
        assert!(refusals.iter().all(Option::is_none), "{refusals:?}");
        let policies = apps["tls"]["automation"]["policies"].as_array().unwrap();
        assert_eq!(policies.len(), 1);
        assert_eq!(policies[0]["subjects"][0], "other.example.org");
        assert_eq!(
            apps["http"]["servers"]["stead"]["routes"],
            json!([catch_all()])
        );
    }

    #[test]
    fn changes_to_a_caddy_without_stead_servers_are_not_applied() {
        let caddy = https_caddy();
        let mut apps = json!({ "http": { "servers": {} } });
        let publish = publish_route(&caddy, &route_to(&key("a", "web"), 1001, &[]));
        assert!(caddy.changed_apps(&mut apps, &[publish]).is_none());
    }
}
