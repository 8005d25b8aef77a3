//! Traces over OTLP/HTTP (#42): a daemon built as `stead run` builds it
//! (real dockerd, a private Caddy, SQLite), exporting to an in-process
//! OTLP/HTTP receiver that decodes what it is sent with the protocol's own
//! message types. A tick that expires an instance enqueues its
//! deprovision, a worker runs it, and the receiver gets one trace: the
//! tick's span with the ids of its `traceparent`, the task's span its
//! child through the `traceparent` stored with the task, and the store,
//! Docker and Caddy calls beneath them.
//!
//! The exporter's layer is installed as the process's global subscriber,
//! as `stead run` installs it, once for the tests of this file: a span
//! whose last handle is dropped on another thread (sqlx's SQLite threads
//! hold the span of a connection's last statement) closes its parent
//! through that thread's default subscriber, so a subscriber set for one
//! thread only would leave the tick's and the task's spans open. The
//! receiver runs on a thread of its own for the same reason (each test
//! has its own runtime), and the tests that use it take turns.

mod support_services;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use stead::core::fleet::{InstanceState, TaskKind};
use stead::core::types::InstanceName;
use stead::daemon::telemetry::Telemetry;
use stead::daemon::{config, Daemon};
use stead::engine::SystemClock;
use stead::ports::{Clock, NewInstance};
use support_services::caddy::CaddyProcess;
use support_services::{free_port, unique};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What the receiver was sent: every span, with its service's name, and
/// how many export requests arrived.
#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    requests: Arc<AtomicUsize>,
    /// While set, each request is held unanswered (a collector that
    /// hangs), counted in `held`.
    hold: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
}

impl Received {
    fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn export(
    State(received): State<Received>,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    received.requests.fetch_add(1, Ordering::SeqCst);
    if received.hold.load(Ordering::SeqCst) {
        received.held.fetch_add(1, Ordering::SeqCst);
        while received.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"not an ExportTraceServiceRequest".to_vec(),
        );
    };
    let mut spans = received.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| match &v.value {
                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => {
                    Some(s.clone())
                }
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push((service.clone(), span));
            }
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        answer,
    )
}

/// An OTLP/HTTP receiver on a loopback port: `POST /v1/traces` of
/// protobuf, as a collector takes it on port 4318. Its base URL (no path:
/// the daemon adds `/v1/traces`) and what it received.
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(export))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

/// [`receiver`] on a thread and runtime of its own, so it outlives the
/// runtime of the test that started it.
fn receiver_on_its_own_thread() -> (String, Received) {
    let (sent, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            sent.send(receiver().await).unwrap();
            std::future::pending::<()>().await
        })
    });
    got.recv().unwrap()
}

/// The process's one exporter, its receiver and its subscriber.
struct Exporting {
    telemetry: Telemetry,
    endpoint: String,
    received: Received,
    /// Taken by each test that exports, for the whole test.
    turn: tokio::sync::Mutex<()>,
}

/// Builds the exporter from `[telemetry]` as the daemon's config gives
/// it, and installs its layer as `stead run` does (globally), once.
fn exporting() -> &'static Exporting {
    static EXPORTING: OnceLock<Exporting> = OnceLock::new();
    EXPORTING.get_or_init(|| {
        let (endpoint, received) = receiver_on_its_own_thread();
        // The longest export bound there is: a tick that waited for an
        // export would take a minute.
        let settings = config::parse(
            &format!(
                "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"stead-test\"\n\
                 export_timeout_ms = 60000\n"
            ),
            "stead.toml",
            &[],
        )
        .unwrap()
        .telemetry;
        let telemetry = Telemetry::new(&settings)
            .unwrap()
            .expect("an endpoint builds an exporter");
        tracing_subscriber::registry()
            .with(telemetry.layer())
            .init();
        Exporting {
            telemetry,
            endpoint,
            received,
            turn: tokio::sync::Mutex::new(()),
        }
    })
}

/// What a test's daemon runs on, kept for the test's length: a private
/// Caddy, a directory of its own, and the daemon's config there (the real
/// dockerd; the OTLP export as the process set it up).
async fn site() -> (CaddyProcess, tempfile::TempDir, config::DaemonConfig) {
    let caddy = CaddyProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = daemon_config(
        dir.path(),
        &caddy.admin_addr,
        &support_services::docker::socket_path(),
    );
    (caddy, dir, config)
}

/// A daemon config on `dir` against Caddy's admin API at `caddy_admin`.
fn daemon_config(
    dir: &std::path::Path,
    caddy_admin: &str,
    docker_socket: &std::path::Path,
) -> config::DaemonConfig {
    let catalog = dir.join("catalog.toml");
    std::fs::write(
        &catalog,
        "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"http\"\n\
         image = \"stead-test/busybox:1\"\nports = [8080]\n",
    )
    .unwrap();
    let doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{socket}\"\n\
         [caddy]\nadmin = \"{caddy_admin}\"\nlisten = \"127.0.0.1:{listen}\"\n",
        dir = dir.display(),
        catalog = catalog.display(),
        socket = docker_socket.display(),
        listen = free_port(),
    );
    config::parse(&doc, "stead.toml", &[]).unwrap()
}

/// The daemon's first tick: it reads the database's clock and takes the
/// lease, and expires nothing until the next tick's reading agrees.
async fn first_tick(daemon: &Daemon) {
    let tick = daemon.reconciler.tick().await;
    assert!(tick.ok() && tick.leader, "{:?}", tick.failed);
}

/// An instance of `web` whose TTL ended a minute ago: the next tick
/// (after the first) expires it and enqueues its deprovision.
async fn expired_instance(daemon: &Daemon, name: &str) -> i64 {
    let now = SystemClock.now();
    let store = &daemon.ports.store;
    let instance = store
        .create_instance(
            &NewInstance {
                domains: Vec::new(),
                name: InstanceName::new(name),
                team: "t".into(),
                service_type: "web".into(),
                version: "1".into(),
                expires_at: Some(now - jiff::SignedDuration::from_mins(1)),
                maintenance_window: None,
                parameters: Default::default(),
                spec_digest: None,
            },
            now,
        )
        .await
        .unwrap();
    store
        .set_instance_state(instance.id, instance.state, InstanceState::Ready, now)
        .await
        .unwrap();
    instance.id
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The trace and span ids of a W3C `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    (parts[1].to_owned(), parts[2].to_owned())
}

/// Whether `span` is `ancestor` or lies beneath it among `spans`.
fn beneath(span: &Span, ancestor: &Span, spans: &[&Span]) -> bool {
    let mut at = span;
    for _ in 0..spans.len() + 1 {
        if at.span_id == ancestor.span_id {
            return true;
        }
        match spans.iter().find(|s| s.span_id == at.parent_span_id) {
            Some(parent) => at = parent,
            None => return false,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_and_the_task_it_enqueued_are_one_exported_trace() {
    let exporting = exporting();
    let _turn = exporting.turn.lock().await;
    let telemetry = &exporting.telemetry;
    assert_eq!(
        telemetry.endpoint(),
        format!("{}/v1/traces", exporting.endpoint),
        "an endpoint without a path gets OTLP's traces path"
    );
    let (_caddy, _dir, config) = site().await;
    let daemon = Daemon::build(config).await.expect("daemon builds");
    first_tick(&daemon).await;
    let name = unique("otlp");
    let instance = expired_instance(&daemon, &name).await;
    let tick = daemon.reconciler.tick().await;
    assert!(tick.ok(), "{:?}", tick.failed);
    let task = daemon
        .ports
        .store
        .active_tasks()
        .await
        .unwrap()
        .rows
        .into_iter()
        .find(|t| t.instance == instance)
        .expect("the tick enqueued the expired instance's deprovision");
    assert_eq!(task.kind, TaskKind::Deprovision);
    assert_eq!(task.traceparent.as_deref(), Some(tick.traceparent.as_str()));
    assert!(daemon.work_once().await, "the worker ran the deprovision");
    assert_eq!(
        daemon
            .ports
            .store
            .task(task.id)
            .await
            .unwrap()
            .unwrap()
            .state,
        stead::core::fleet::TaskState::Done
    );
    let (trace_id, tick_span_id) = ids(&tick.traceparent);
    // The export is asynchronous: a span ended reaches the batch
    // processor's queue on its own, and a flush may overtake the last one
    // (the task's, which ends last; CI once saw every span of the trace
    // but it). Flushed until both roots of the trace are in, within a bound.
    let mut rounds = 0;
    let all = loop {
        telemetry.flush();
        let all = exporting.received.spans();
        let arrived = |name: &str| {
            all.iter()
                .any(|(_, s)| s.name == name && hex(&s.trace_id) == trace_id)
        };
        rounds += 1;
        // Two hundred rounds of 50 ms: ten seconds at most.
        if (arrived("tick") && arrived("task")) || rounds == 200 {
            break all;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!all.is_empty(), "no span arrived");
    assert!(all.iter().all(|(service, _)| service == "stead-test"));
    let trace: Vec<&Span> = all
        .iter()
        .map(|(_, s)| s)
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
    let tick_span = trace
        .iter()
        .find(|s| s.name == "tick")
        .unwrap_or_else(|| panic!("no tick span in trace {trace_id}: {names:?}"));
    assert_eq!(
        hex(&tick_span.span_id),
        tick_span_id,
        "the tick's span is the one its traceparent names"
    );
    assert!(
        tick_span.parent_span_id.is_empty(),
        "the tick's span is the root"
    );
    let task_span = trace
        .iter()
        .find(|s| s.name == "task")
        .unwrap_or_else(|| panic!("no task span in trace {trace_id}: {names:?}"));
    assert_eq!(
        task_span.parent_span_id, tick_span.span_id,
        "the task's span is a child of the tick's, through the stored traceparent"
    );
    let under = |ancestor: &Span, prefix: &str| {
        trace
            .iter()
            .filter(|s| s.name.starts_with(prefix) && beneath(s, ancestor, &trace))
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    let tick_store = under(tick_span, "store.");
    assert!(
        tick_store
            .iter()
            .any(|n| n == "store.expire_instance_recorded"),
        "the tick's expiry is a store call beneath it: {names:?}"
    );
    let task_store = under(task_span, "store.");
    assert!(
        task_store.iter().any(|n| n == "store.finish_task_recorded"),
        "the task's end is a store call beneath it: {names:?}"
    );
    assert!(
        !under(task_span, "docker.").is_empty(),
        "the deprovision's Docker calls are beneath the task: {names:?}"
    );
    assert!(
        !under(tick_span, "caddy.").is_empty(),
        "the pass's Caddy calls are beneath the tick: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_no_exporter_is_built_and_nothing_is_sent() {
    let (endpoint, received) = receiver().await;
    // Not even the SDK's own environment variable turns export on.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    let (_caddy, _dir, config) = site().await;
    assert_eq!(config.telemetry.otlp_endpoint, None);
    assert!(Telemetry::new(&config.telemetry).unwrap().is_none());
    let daemon = Daemon::build(config).await.expect("daemon builds");
    first_tick(&daemon).await;
    expired_instance(&daemon, &unique("otlpoff")).await;
    let tick = daemon.reconciler.tick().await;
    assert!(tick.ok(), "{:?}", tick.failed);
    assert!(daemon.work_once().await);
    // Past the SDK's default batch delay (5 s): anything exported would
    // have been sent by now.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(received.requests(), 0, "nothing was exported");
    std::env::remove_var("OTEL_EXPORTER_OTLP_ENDPOINT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_never_holds_up_a_tick() {
    let exporting = exporting();
    let _turn = exporting.turn.lock().await;
    let (_caddy, _dir, config) = site().await;
    let daemon = Daemon::build(config).await.expect("daemon builds");
    first_tick(&daemon).await;
    // The collector stops answering; the first tick's spans go out and
    // the export hangs there (for up to a minute, the export bound).
    let received = &exporting.received;
    received.hold.store(true, Ordering::SeqCst);
    let held_before = received.held.load(Ordering::SeqCst);
    let flushing = std::thread::spawn(move || exporting.telemetry.flush());
    for _ in 0..200 {
        if received.held.load(Ordering::SeqCst) > held_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        received.held.load(Ordering::SeqCst) > held_before,
        "the exporter never reached the collector"
    );
    // While that export hangs, ticks go on, each well within its bound.
    for _ in 0..3 {
        let tick = tokio::time::timeout(Duration::from_secs(30), daemon.reconciler.tick())
            .await
            .expect("a tick finished while the collector hung");
        assert!(tick.ok(), "{:?}", tick.failed);
    }
    assert!(!flushing.is_finished(), "the export was still held");
    received.hold.store(false, Ordering::SeqCst);
    tokio::task::spawn_blocking(move || flushing.join().unwrap())
        .await
        .unwrap();
}
