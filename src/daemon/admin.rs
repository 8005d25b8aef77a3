//! The admin endpoints on a loopback port: `/metrics` (Prometheus text),
//! `/healthz` (the process is up and, for a reconciler, the last tick is
//! recent), `/readyz` (the store answers and, for a reconciler, this
//! replica holds the singleton lease), `/status` (`stead status --live`:
//! the status view with this daemon's budgets and loaded catalog),
//! `/catalog` (the loaded catalog's versions), `/plan` (`stead plan`:
//! what a reload of the catalog file would do), `POST /reload` (`stead
//! reload`: re-read the catalog file, as SIGHUP does), and the status page
//! (`GET /`, `GET /instances/{name}`: [`super::page`]).
//!
//! With `admin_token_file` set (required beyond loopback), every endpoint
//! that shows or changes the fleet demands `Authorization: Bearer <token>`
//! and answers 401 without it; `/metrics`, `/healthz` and `/readyz` stay
//! open for scrapers and probes.
//!
//! `POST /reload?force=true` (`stead reload --force`) applies a catalog
//! even when it would damage live instances ([`ReloadMode::Forced`]).
//!
//! `POST /reload` changes the daemon, so it demands [`RELOAD_HEADER`]: a
//! web page the operator's browser has open can send a "simple" POST to a
//! loopback port without asking first, but it cannot add a custom header
//! without a CORS preflight, which this server never answers.
//!
//! Every request must name a host the listener serves (its address,
//! `localhost`, `admin_hosts`), so a page that rebinds its own name to
//! 127.0.0.1 reaches nothing; connections are capped
//! ([`super::listener`]). `/readyz` reads the store at most once per
//! [`READY_FRESH_MS`], one read at a time, each bounded by
//! [`READY_TIMEOUT`]: a probe loop costs the store nothing more.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::{watch, Semaphore};

use super::listener::{self, CappedListener, HostAllowlist};
use super::status::Status;
use super::{metrics_handle, page, Daemon, ReloadError, ReloadMode, Role};
use crate::config::admin_token::AdminToken;
use crate::core::catalog::ReloadHazard;
use crate::core::event_log::EventFilter;
use crate::core::types::InstanceName;

/// The header (and its value) `POST /reload` requires; `stead reload`
/// sends it. Any other caller gets 403.
pub const RELOAD_HEADER: &str = "x-stead-request";
pub const RELOAD_HEADER_VALUE: &str = "reload";

/// A tick older than this many intervals (plus the instance deadline, which
/// bounds one pass) means the loop is stuck.
const STALE_TICK_INTERVALS: u32 = 3;

/// At most this many `/status` answers (or status pages, which read the
/// same view) are rendered at once. A render reads every instance, task
/// and inhibition from the store; one at a time serves an operator, and a
/// loop of requests then holds at most one of the store's connections,
/// never the pool the tick needs.
pub const STATUS_CONCURRENT_MAX: usize = 1;
/// A `/status` render that takes longer is abandoned with 503 (a hung
/// runtime or Caddy must not hold the permit).
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// `Retry-After` of a `/status` refused because another render runs.
pub const STATUS_RETRY_AFTER_S: u64 = 1;

/// A `/readyz` answer younger than this is served again without a read.
pub const READY_FRESH_MS: i64 = 1000;
/// A store read for `/readyz` that takes longer is a failed check.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a gated request was not served.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateRefusal {
    #[error("busy: {concurrent_max} request(s) of this kind already running")]
    Busy { concurrent_max: usize },
    #[error("took longer than {timeout_ms} ms; abandoned")]
    TimedOut { timeout_ms: u128 },
}

/// Bounds an expensive endpoint: at most `concurrent_max` requests run at
/// once (the others are refused at once, never queued), each for at most
/// `timeout`.
#[derive(Clone, Debug)]
pub struct Gate {
    permits: Arc<Semaphore>,
    concurrent_max: usize,
    timeout: Duration,
}

impl Gate {
    pub fn new(concurrent_max: usize, timeout: Duration) -> Self {
        assert!(concurrent_max > 0, "a gate that admits nothing");
        Self {
            permits: Arc::new(Semaphore::new(concurrent_max)),
            concurrent_max,
            timeout,
        }
    }

    /// Runs `work` if a permit is free, within the timeout.
    pub async fn run<F: std::future::Future>(&self, work: F) -> Result<F::Output, GateRefusal> {
        let _permit = self.permits.try_acquire().map_err(|_| GateRefusal::Busy {
            concurrent_max: self.concurrent_max,
        })?;
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| GateRefusal::TimedOut {
                timeout_ms: self.timeout.as_millis(),
            })
    }
}

#[derive(Clone)]
struct AdminState {
    daemon: Arc<Daemon>,
    role: Role,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Bounds `/status` and the status page together: they read the same.
    status_gate: Gate,
    /// Demanded by the endpoints that show or change the fleet, when set.
    token: Option<Arc<AdminToken>>,
    /// `/readyz`'s last store check, and the gate of the next.
    ready: Arc<ReadyCheck>,
}

/// The store half of `/readyz`: one read at a time, its answer kept for
/// [`READY_FRESH_MS`].
struct ReadyCheck {
    gate: Gate,
    /// When the last read ended (the daemon's clock, ms) and what it said.
    last: std::sync::Mutex<Option<(i64, Result<(), Unready>)>>,
}

/// Why the store half of `/readyz` failed, as the answer says it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct Unready(String);

impl ReadyCheck {
    fn new() -> Self {
        Self {
            gate: Gate::new(1, READY_TIMEOUT),
            last: std::sync::Mutex::new(None),
        }
    }

    fn remembered(&self, now_ms: i64) -> Option<Result<(), Unready>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|(at, _)| (0..READY_FRESH_MS).contains(&(now_ms - at)))
            .map(|(_, answer)| answer.clone())
    }

    /// Whether the store answers, read anew unless a fresh answer is kept.
    async fn store(&self, daemon: &Daemon) -> Result<(), Unready> {
        let clock = &daemon.ports.clock;
        self.check(
            || clock.now().as_millisecond(),
            daemon.ports.store.queue_depth(),
        )
        .await
    }

    /// [`Self::store`] with the clock and the read given: `read` is polled
    /// only when no answer younger than [`READY_FRESH_MS`] is kept.
    async fn check<E: std::fmt::Display>(
        &self,
        now_ms: impl Fn() -> i64,
        read: impl std::future::Future<Output = Result<u64, E>>,
    ) -> Result<(), Unready> {
        if let Some(answer) = self.remembered(now_ms()) {
            return answer;
        }
        let answer = match self.gate.run(read).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Unready(e.to_string())),
            // Another probe is reading: its answer is as good as ours.
            Err(GateRefusal::Busy { .. }) => {
                let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
                return last.as_ref().map_or(
                    Err(Unready("the first check is running".to_owned())),
                    |(_, a)| a.clone(),
                );
            }
            Err(refusal @ GateRefusal::TimedOut { .. }) => Err(Unready(refusal.to_string())),
        };
        let ended_ms = now_ms();
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((ended_ms, answer.clone()));
        answer
    }
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

/// Serves on `listener` (from [`bind`]) until `stop`; with `token`, the
/// endpoints that show or change the fleet demand it. Answers only to the
/// host names of [`HostAllowlist`] (`admin_hosts` added), on at most
/// [`super::listener::CONNECTIONS_MAX`] connections.
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: tokio::net::TcpListener,
    role: Role,
    token: Option<AdminToken>,
    mut stop: watch::Receiver<bool>,
) {
    let guarded = token.is_some();
    let hosts = match listener.local_addr() {
        Ok(addr) => HostAllowlist::new(addr, &daemon.config.admin_hosts, "admin_hosts"),
        Err(e) => {
            tracing::error!(error = %e, "admin listener has no address; not serving");
            return;
        }
    };
    let state = AdminState {
        daemon,
        role,
        metrics: metrics_handle(),
        status_gate: Gate::new(STATUS_CONCURRENT_MAX, STATUS_TIMEOUT),
        token: token.map(Arc::new),
        ready: Arc::new(ReadyCheck::new()),
    };
    let fleet = Router::new()
        .route("/", get(fleet_page))
        .route("/instances/{name}", get(instance_page))
        .route("/status", get(status))
        .route("/catalog", get(catalog))
        .route("/reload", axum::routing::post(reload))
        .route("/plan", get(plan))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(fleet)
        .with_state(state)
        .layer(middleware::from_fn_with_state(
            Arc::new(hosts),
            listener::require_host,
        ));
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        %addr,
        token = if guarded { "required" } else { "none" },
        "admin endpoints: /metrics /healthz /readyz, and / /instances/NAME /status /catalog \
         /plan POST /reload"
    );
    let shutdown = async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    if let Err(e) = axum::serve(
        CappedListener::new(
            listener,
            listener::CONNECTIONS_MAX,
            listener::CONNECTION_IDLE,
        ),
        app,
    )
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
    if let Err(e) = state.ready.store(daemon).await {
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

/// With a token configured, lets through only a request that presents it;
/// any other gets 401 and a body that says nothing of the fleet.
async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes());
    if token.admits(presented) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer"),
            (header::CONTENT_TYPE, "text/plain"),
        ],
        "401: this endpoint requires Authorization: Bearer <the token of admin_token_file>\n",
    )
        .into_response()
}

/// 503 with `Retry-After` for a request the status gate refused.
fn refused(what: &str, refusal: GateRefusal) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            ("retry-after", STATUS_RETRY_AFTER_S.to_string()),
            ("content-type", "text/plain".to_owned()),
        ],
        format!("{what}: {refusal}\n"),
    )
        .into_response()
}

/// The status view with live budgets and the loaded catalog, for `stead
/// status --live` (JSON); through the status gate, else 503 with
/// `Retry-After`.
async fn status(State(state): State<AdminState>) -> Response {
    match state.status_gate.run(live_status(&state.daemon)).await {
        Ok(status) => json(StatusCode::OK, &status).into_response(),
        Err(refusal) => refused("/status", refusal),
    }
}

/// A page: HTML that may neither run a script nor load anything (its
/// values are escaped; this says so again to the browser), nor be framed
/// or cached.
fn html(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; \
                 base-uri 'none'; form-action 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the fleet and the rollouts per type, from the view `/status`
/// serves, through the same gate.
async fn fleet_page(State(state): State<AdminState>) -> Response {
    match state.status_gate.run(live_status(&state.daemon)).await {
        Ok(status) => html(StatusCode::OK, page::fleet(&status)),
        Err(refusal) => refused("the status page", refusal),
    }
}

/// `GET /instances/{name}`: one instance's services, why and timeline,
/// from the view `/status` serves and the event log, through the status
/// gate. A name that is no instance name gets 404 without a read.
async fn instance_page(State(state): State<AdminState>, Path(name): Path<String>) -> Response {
    if crate::core::names::check_instance_name("instance", &name).is_err() {
        return html(StatusCode::NOT_FOUND, page::not_found(&name));
    }
    let daemon = &state.daemon;
    let read = async {
        let status = live_status(daemon).await;
        let filter = EventFilter {
            instance: Some(InstanceName::new(name.as_str())),
            limit: page::PAGE_TIMELINE_EVENTS_MAX,
            ..Default::default()
        };
        let events = daemon.ports.store.events(&filter).await;
        (status, events)
    };
    let (status, events) = match state.status_gate.run(read).await {
        Ok(read) => read,
        Err(refusal) => return refused("the status page", refusal),
    };
    let Some(why) = super::why::explain(&status, &name) else {
        return html(StatusCode::NOT_FOUND, page::not_found(&name));
    };
    let timeline = match events {
        Ok(read) => {
            let mut text = super::event_log::render_timeline(&name, &read.rows);
            for bad in &read.bad {
                text.push_str(&format!("\nskipped a bad row: {bad}"));
            }
            text
        }
        Err(e) => format!("the event log could not be read: {e}"),
    };
    html(
        StatusCode::OK,
        page::instance(&status, &name, &why, &timeline),
    )
}

/// The status view `/status` and the status page show: the store, the
/// runtime and the proxy read once, with this daemon's budgets.
async fn live_status(daemon: &Daemon) -> Status {
    let memory = daemon.recoverer.memory();
    let catalog = daemon.catalog.current();
    super::status::status(super::status::StatusSources {
        store: daemon.ports.store.as_ref(),
        runtime: daemon.ports.runtime.as_ref(),
        catalog: &catalog,
        memory: Some(&memory),
        caddy_admin: Some(&daemon.config.caddy.admin),
        provisioner: Some(daemon.ports.provisioner.as_ref()),
        database: super::redact(&daemon.config.database_url),
        now: daemon.ports.clock.now(),
    })
    .await
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
    /// The changes that would damage live instances, one line each: why
    /// the reload was refused, or, forced, what it applied anyway.
    #[serde(default)]
    pub hazards: Vec<String>,
    /// The catalog running after the call.
    pub catalog: CatalogView,
}

/// The query `POST /reload?force=true` forces a reload with hazards
/// (`stead reload --force`).
pub const RELOAD_FORCE_QUERY: &str = "force=true";

/// Re-reads the catalog file (as SIGHUP does). 200 with the changes; or,
/// the running catalog kept, 422 with the error of a refused file, 409
/// with the hazards of one that would damage live instances (unless
/// forced with [`RELOAD_FORCE_QUERY`]), 503 when the store cannot say
/// which types have live instances.
async fn reload(
    State(state): State<AdminState>,
    uri: axum::http::Uri,
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
    let forced = uri
        .query()
        .is_some_and(|query| query.split('&').any(|pair| pair == RELOAD_FORCE_QUERY));
    let mode = if forced {
        ReloadMode::Forced
    } else {
        ReloadMode::Guarded
    };
    let daemon = &state.daemon;
    let result = daemon.reload_catalog(mode).await;
    let catalog = CatalogView::of(&daemon.config.catalog, &daemon.catalog.current());
    let lines = |hazards: &[ReloadHazard]| hazards.iter().map(ToString::to_string).collect();
    let (code, answer) = match result {
        Ok(reloaded) => (
            StatusCode::OK,
            ReloadAnswer {
                changes: reloaded.changes.iter().map(ToString::to_string).collect(),
                error: None,
                hazards: lines(&reloaded.forced),
                catalog,
            },
        ),
        Err(e) => (
            match e {
                ReloadError::Catalog(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ReloadError::Hazards(_) => StatusCode::CONFLICT,
                ReloadError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            },
            ReloadAnswer {
                changes: Vec::new(),
                error: Some(e.to_string()),
                hazards: lines(e.hazards()),
                catalog,
            },
        ),
    };
    json(code, &answer)
}

/// What reloading the catalog file would do (`stead plan`, #55): 200
/// whether or not a reload would be refused (the answer says), and
/// nothing changes. One at a time, like a status render: each reads the
/// fleet.
async fn plan(State(state): State<AdminState>) -> Response {
    match state.status_gate.run(state.daemon.plan_catalog()).await {
        Ok(answer) => json(StatusCode::OK, &answer).into_response(),
        Err(refusal) => refused("/plan", refusal),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    use super::*;

    /// A render as slow as a loaded store: counts how many run at once.
    async fn slow_render(running: Arc<AtomicUsize>, peak: Arc<AtomicUsize>, len: Duration) {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(len).await;
        running.fetch_sub(1, Ordering::SeqCst);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_status_requests_runs_one_render_and_refuses_the_rest_at_once() {
        let gate = Gate::new(STATUS_CONCURRENT_MAX, STATUS_TIMEOUT);
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let start = tokio::time::Instant::now();
        let requests: Vec<_> = (0..32)
            .map(|_| {
                let (gate, running, peak) = (gate.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    let answer = gate
                        .run(slow_render(running, peak, Duration::from_secs(2)))
                        .await;
                    (answer, start.elapsed())
                })
            })
            .collect();
        let mut served = 0;
        for request in requests {
            let (answer, took) = request.await.expect("no panic");
            match answer {
                Ok(()) => served += 1,
                Err(refusal) => {
                    assert_eq!(
                        refusal,
                        GateRefusal::Busy {
                            concurrent_max: STATUS_CONCURRENT_MAX
                        }
                    );
                    assert_eq!(took, Duration::ZERO, "a refusal never waits");
                }
            }
        }
        assert_eq!(served, STATUS_CONCURRENT_MAX);
        assert_eq!(peak.load(Ordering::SeqCst), STATUS_CONCURRENT_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_status_render_is_abandoned_at_the_timeout_and_frees_its_permit() {
        let gate = Gate::new(STATUS_CONCURRENT_MAX, STATUS_TIMEOUT);
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let start = tokio::time::Instant::now();
        let hung = gate
            .run(slow_render(
                running.clone(),
                peak.clone(),
                Duration::from_secs(3600),
            ))
            .await;
        assert_eq!(
            hung,
            Err(GateRefusal::TimedOut {
                timeout_ms: STATUS_TIMEOUT.as_millis()
            })
        );
        assert_eq!(start.elapsed(), STATUS_TIMEOUT);
        let next = gate
            .run(slow_render(running, peak, Duration::from_millis(10)))
            .await;
        assert_eq!(next, Ok(()));
    }

    #[tokio::test]
    async fn readyz_reads_the_store_at_most_once_per_freshness_window() {
        let check = ReadyCheck::new();
        let reads = AtomicU32::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Unready>(0)
        };
        for now_ms in [0, 10, 500, READY_FRESH_MS - 1] {
            assert_eq!(check.check(|| now_ms, read()).await, Ok(()));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        assert_eq!(check.check(|| READY_FRESH_MS, read()).await, Ok(()));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_store_read_is_reported_and_kept_as_fresh_as_a_good_one() {
        let check = ReadyCheck::new();
        let failing = async { Err::<u64, _>("database is locked") };
        let locked = Err(Unready("database is locked".to_owned()));
        assert_eq!(check.check(|| 0, failing).await, locked);
        let unread = async {
            panic!("a fresh answer is served again without a read") as Result<u64, Unready>
        };
        assert_eq!(check.check(|| 5, unread).await, locked);
    }
}
