//! Docker for tests: a connected runtime (or a clear failure), the test image,
//! a busybox httpd spec, and cleanup of everything a test labelled.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use stead::adapters::docker::{
    DockerConfig, DockerRuntime, LABEL_INSTANCE, LABEL_REVISION, LABEL_SERVICE,
};
use stead::core::spec::{Healthcheck, ReadinessProbe, ServiceSpec};
use stead::core::types::{InstanceName, ServiceName};
use stead::ports::CreateContainer;

/// Built by `scripts/services up` with `docker import` from busybox-static.
pub const TEST_IMAGE: &str = "stead-test/busybox:1";
/// The port busybox httpd listens on inside the test containers.
pub const HTTP_PORT: u16 = 8080;

/// Names the Engine API socket the Docker tests talk to instead of
/// dockerd's: `scripts/test` runs `tests/docker_runtime.rs` a second time
/// with it set to Podman's (`/run/podman/podman.sock`).
pub const SOCKET_ENV: &str = "STEAD_TEST_DOCKER_SOCKET";

/// The socket [`SOCKET_ENV`] names, if it names one.
fn socket_override() -> Option<PathBuf> {
    std::env::var_os(SOCKET_ENV)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

/// The socket under test: [`SOCKET_ENV`], or dockerd's default.
pub fn socket_path() -> PathBuf {
    socket_override().unwrap_or_else(|| DockerConfig::default().socket_path)
}

/// Whether the engine under test is Podman (its compatible API), as the
/// engine itself says: its version lists a "Podman Engine" component.
/// Asked once per process. Tests use it only to assert what each engine
/// does where they differ (docs/operations.md, "Podman").
pub fn is_podman() -> bool {
    static PODMAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PODMAN.get_or_init(|| {
        let components = docker(&[
            "version",
            "--format",
            "{{range .Server.Components}}{{.Name}};{{end}}",
        ])
        .unwrap_or_else(|e| panic!("docker version on {:?}: {e}", socket_path()));
        components.split(';').any(|name| name == "Podman Engine")
    })
}

/// The default configuration, on the socket under test. Podman 4's
/// compatible API cannot wall lone services apart (it ignores
/// `enable_icc=false`), so there the tests run as an operator of Podman
/// must: with `isolation = "off"` (docs/operations.md, "Podman").
pub fn config() -> DockerConfig {
    DockerConfig {
        socket_path: socket_path(),
        isolation: if is_podman() {
            stead::adapters::docker::Isolation::Off
        } else {
            stead::adapters::docker::Isolation::Shared
        },
        ..DockerConfig::default()
    }
}

/// A runtime connected to the engine under test (the local dockerd unless
/// [`SOCKET_ENV`] names another socket). Fails the test, saying how to fix
/// it, when the engine does not answer or the test image is missing: these
/// tests run against the real engine or not at all.
pub async fn runtime() -> DockerRuntime {
    runtime_with(config()).await
}

pub async fn runtime_with(config: DockerConfig) -> DockerRuntime {
    let socket = config.socket_path.display().to_string();
    let runtime = DockerRuntime::connect(config).await.unwrap_or_else(|e| {
        panic!("the engine at {socket} is not reachable ({e}); run `scripts/services up` first")
    });
    let image = docker(&["image", "inspect", "--format", "{{.Id}}", TEST_IMAGE]);
    assert!(
        image.is_ok(),
        "test image {TEST_IMAGE} is missing; run `scripts/services up` first"
    );
    runtime
}

/// A service running busybox httpd on 8080 with a real wget healthcheck.
pub fn httpd_spec(service: &str) -> ServiceSpec {
    ServiceSpec {
        name: ServiceName::new(service),
        image: TEST_IMAGE.to_owned(),
        command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
            .map(str::to_owned)
            .to_vec(),
        ports: vec![HTTP_PORT],
        healthcheck: Some(Healthcheck {
            command: ["wget", "-q", "-O-", "http://127.0.0.1:8080/"]
                .map(str::to_owned)
                .to_vec(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            retries: 2,
        }),
        readiness: ReadinessProbe::None,
        stop_grace: Duration::from_secs(1),
        update: Default::default(),
        domains: Vec::new(),
        tenant_domains: false,
        run: Default::default(),
    }
}

pub fn create_request(instance: &str, spec: ServiceSpec, revision: &str) -> CreateContainer {
    CreateContainer {
        instance: InstanceName::new(instance),
        instance_id: 1,
        env: Vec::new(),
        spec,
        revision: revision.to_owned(),
    }
}

/// Runs the docker CLI with an argument vector (as an operator would),
/// against the engine under test. Returns stdout, or the stderr on failure.
pub fn docker(args: &[&str]) -> Result<String, String> {
    docker_at(socket_override().as_deref(), args)
}

/// [`docker`] against the engine at `socket` (the CLI's default: `None`).
pub fn docker_at(socket: Option<&std::path::Path>, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("docker");
    if let Some(socket) = socket {
        command.env("DOCKER_HOST", format!("unix://{}", socket.display()));
    }
    let output = command
        .args(args)
        .output()
        .map_err(|e| format!("run docker {args:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// The engine's stream of the instance's container events whose action is
/// one of `actions`, from this instant on: the subscription replays from
/// it, so an event in the moment before the stream opens is seen too.
fn container_events(
    instance: &str,
    actions: &[&str],
) -> impl futures_util::Stream<Item = Result<bollard::models::EventMessage, bollard::errors::Error>>
{
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    container_events_since(instance, actions, since)
}

/// [`container_events`] from `since` (since the epoch).
fn container_events_since(
    instance: &str,
    actions: &[&str],
    since: std::time::Duration,
) -> impl futures_util::Stream<Item = Result<bollard::models::EventMessage, bollard::errors::Error>>
{
    let api = match socket_override() {
        Some(socket) => bollard::Docker::connect_with_unix(
            &socket.to_string_lossy(),
            120,
            bollard::API_DEFAULT_VERSION,
        ),
        None => bollard::Docker::connect_with_local_defaults(),
    }
    .expect("docker socket");
    let filters = std::collections::HashMap::from([
        ("type".to_owned(), vec!["container".to_owned()]),
        (
            "event".to_owned(),
            actions.iter().map(|a| (*a).to_owned()).collect(),
        ),
        (
            "label".to_owned(),
            vec![format!("{LABEL_INSTANCE}={instance}")],
        ),
    ]);
    api.events(Some(bollard::query_parameters::EventsOptions {
        since: Some(format!("{}.{:09}", since.as_secs(), since.subsec_nanos())),
        filters: Some(filters),
        ..Default::default()
    }))
}

/// Counts `start` events of the instance's containers from now on, as
/// Docker streams them. A live stream, not `docker events --since`: dockerd
/// keeps only its last 256 events for replay, and on a busy machine
/// (healthcheck execs are events too) that is a few seconds of history.
pub type StartCounter = EventCounter;

/// Counts one kind of event of the instance's containers from now on, as
/// the engine streams them (raw, before stead's adapter reads them).
pub struct EventCounter {
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Why the stream ended early, if it did: a count from a broken
    /// stream would be a lie, so `count` refuses to give one.
    broken: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventCounter {
    /// Counts starts from now: the subscription replays from this instant,
    /// so a start in the moment before the stream opens is counted too.
    pub fn follow(instance: &str) -> EventCounter {
        Self::follow_action(instance, "start")
    }

    /// Counts events whose action filter is `action` (`start`,
    /// `health_status`, …) from now, as [`EventCounter::follow`] does.
    pub fn follow_action(instance: &str, action: &str) -> EventCounter {
        use futures_util::StreamExt;
        let mut from = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970");
        let mut events = container_events_since(instance, &[action], from).boxed();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = count.clone();
        let broken = std::sync::Arc::new(std::sync::Mutex::new(None));
        let reason = broken.clone();
        let (instance, action) = (instance.to_owned(), action.to_owned());
        let task = tokio::spawn(async move {
            // Podman ends a live events stream when it rotates its events
            // log (a podman CI run once saw it end within seconds, with
            // health checks every half second filling it): followed again
            // from just after the last event counted, nothing is missed or
            // counted twice. Dockerd keeps its streams open.
            let mut reopened = 0;
            let why = loop {
                match events.next().await {
                    Some(Ok(event)) => {
                        if let Some(nanos) = event.time_nano.and_then(|n| u64::try_from(n).ok()) {
                            from = std::time::Duration::from_nanos(nanos + 1);
                        }
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Some(Err(e)) => break format!("docker events failed: {e}"),
                    None if reopened < 5 => {
                        reopened += 1;
                        events = container_events_since(&instance, &[&action], from).boxed();
                    }
                    None => break "docker events ended".to_owned(),
                }
            };
            *reason.lock().expect("start counter lock") = Some(why);
        });
        EventCounter {
            count,
            broken,
            task,
        }
    }

    /// Starts seen so far (for a counter of starts).
    pub fn starts(&self) -> usize {
        self.count()
    }

    /// Events seen so far. Panics if the event stream broke: the count
    /// would then miss events and the test would judge a wrong figure.
    pub fn count(&self) -> usize {
        if let Some(why) = self.broken.lock().expect("start counter lock").as_ref() {
            panic!("cannot count starts: {why}");
        }
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for EventCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One container event, as the engine stamped it.
#[derive(Clone, Debug)]
pub struct ContainerEvent {
    /// The engine's clock (`timeNano`), in nanoseconds since 1970.
    pub time_ns: i64,
    pub container: String,
    /// `start`, `die`, …
    pub action: String,
    /// The container's service (its `stead.service` label).
    pub service: String,
    /// The container's revision (its `stead.revision` label).
    pub revision: String,
}

/// Records the instance's container events of some actions from now on,
/// as the engine streams them: a live stream, as [`EventCounter`]'s.
pub struct EventLog {
    events: std::sync::Arc<std::sync::Mutex<Vec<ContainerEvent>>>,
    /// Why the stream ended early, if it did: a record with a hole would
    /// be a lie, so `events` refuses to give one.
    broken: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventLog {
    pub fn follow(instance: &str, actions: &[&str]) -> EventLog {
        use futures_util::StreamExt;
        let mut stream = container_events(instance, actions);
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = events.clone();
        let broken = std::sync::Arc::new(std::sync::Mutex::new(None));
        let reason = broken.clone();
        let task = tokio::spawn(async move {
            let why = loop {
                match stream.next().await {
                    Some(Ok(message)) => {
                        let event = ContainerEvent::from_message(message);
                        recorded.lock().expect("event log lock").push(event);
                    }
                    Some(Err(e)) => break format!("docker events failed: {e}"),
                    None => break "docker events ended".to_owned(),
                }
            };
            *reason.lock().expect("event log lock") = Some(why);
        });
        EventLog {
            events,
            broken,
            task,
        }
    }

    /// The events seen so far, in the engine's time order (stream order
    /// between equal stamps). Panics if the stream broke.
    pub fn events(&self) -> Vec<ContainerEvent> {
        if let Some(why) = self.broken.lock().expect("event log lock").as_ref() {
            panic!("cannot replay container events: {why}");
        }
        let mut events = self.events.lock().expect("event log lock").clone();
        events.sort_by_key(|e| e.time_ns);
        events
    }
}

impl ContainerEvent {
    fn from_message(message: bollard::models::EventMessage) -> ContainerEvent {
        let actor = message.actor.unwrap_or_default();
        let attributes = actor.attributes.unwrap_or_default();
        let label = |key: &str| attributes.get(key).cloned().unwrap_or_default();
        ContainerEvent {
            time_ns: message.time_nano.expect("an event carries timeNano"),
            container: actor.id.expect("a container event names its container"),
            action: message.action.unwrap_or_default(),
            service: label(LABEL_SERVICE),
            revision: label(LABEL_REVISION),
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Removes, on drop, every container labelled with the instance and every
/// container named in `extra`, so a failing test leaves nothing behind.
pub struct Cleanup {
    pub instance: String,
    pub extra: Vec<String>,
}

impl Cleanup {
    pub fn new(instance: &str) -> Self {
        Self {
            instance: instance.to_owned(),
            extra: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_INSTANCE}={}", self.instance);
        let ids = docker(&["ps", "-aq", "--filter", &filter]).unwrap_or_default();
        let mut targets: Vec<&str> = ids.split_whitespace().collect();
        targets.extend(self.extra.iter().map(String::as_str));
        if !targets.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(targets);
            let _ = docker(&args);
        }
        // The instance's network and named volumes, once its containers
        // are gone (both are labelled like the containers).
        for kind in ["network", "volume"] {
            let names = docker(&[kind, "ls", "-q", "--filter", &filter]).unwrap_or_default();
            for name in names.split_whitespace() {
                let _ = docker(&[kind, "rm", name]);
            }
        }
    }
}
