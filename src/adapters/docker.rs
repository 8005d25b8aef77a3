//! The Docker runtime: the `Runtime` port over the Docker Engine API.
//!
//! It speaks to a unix socket (default `/var/run/docker.sock`). Podman's
//! Docker-compatible socket works too: point [`DockerConfig::socket_path`]
//! at `/run/podman/podman.sock` (rootful, `systemctl enable --now
//! podman.socket`) or `$XDG_RUNTIME_DIR/podman/podman.sock` (rootless).
//! Where Podman 4.3's answers differ from Docker's (a taken name, the event
//! filter's words, verdict-less health events, `stopping`, a stopped
//! container's ports) the adapter makes them read as Docker's; each is
//! listed in docs/operations.md, "Podman", and tested against both engines
//! by tests/docker_runtime.rs.
//!
//! What stead owns is marked by labels, never by name patterns:
//! `stead.managed=true`, `stead.instance`, `stead.service`, `stead.revision`.
//! The adapter stops or removes a container only when its labels say it is
//! stead's and belongs to the instance and service the caller names.
//! A container's name, `stead.<instance>.<service>.<revision>`
//! ([`DockerRuntime::container_name`]), only makes `create` idempotent; no
//! two services share one.
//!
//! The steady state costs one API call. Docker's list does not report when
//! the current execution started, which recovery needs (R8, R13), so each
//! read is an inspect of the exact container; but one inspect answers every
//! read of a pass, and while the daemon follows [`DockerRuntime::events`] the
//! answer is kept in a [`ReadCache`] until Docker reports a change. A steady
//! pass then makes one labelled `GET /containers/json` (in
//! [`Runtime::begin_pass`], which drops every entry whose status changed)
//! and no inspect at all. See `read_cache.rs` for when entries are dropped.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, EventMessage,
    HealthConfig, HealthStatusEnum, HostConfig, HostConfigLogConfig, PortBinding, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, EventsOptions, ListContainersOptions,
    RemoveContainerOptions, RestartContainerOptions, StartContainerOptions, StopContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures_util::{Stream, StreamExt};

use super::read_cache::{Inspected, ReadCache};

mod logs;
mod walls;
mod workload;
pub use walls::{Isolation, CAP_DROP_DEFAULT, ICC_OPTION, ISOLATED_NETWORK};
pub use workload::{
    network_name, volume_name, LABEL_INSTANCE_ID, LABEL_VOLUME, SECRET_FILE_LEN_MAX,
};

use crate::core::errors::PortFailure;
use crate::core::limits::ContainerLimits;
use crate::core::names;
use crate::core::types::{
    Binds, ContainerId, ContainerStatus, Exit, GenerationKey, Health, InstanceName, Observation,
    RuntimeError, ServiceName, Timestamp,
};
use crate::ports::{
    CreateContainer, EventSubscription, ManagedContainer, ProvisionError, Provisioner, Release,
    ReleaseSpec, ReleaseTarget, Runtime, RuntimeEvents,
};

/// Label that marks a container as stead's. Its value is always `true`.
pub const LABEL_MANAGED: &str = "stead.managed";
/// Label carrying the instance name.
pub const LABEL_INSTANCE: &str = "stead.instance";
/// Label carrying the service name.
pub const LABEL_SERVICE: &str = "stead.service";
/// Label carrying the revision that distinguishes an upgrade's successor.
pub const LABEL_REVISION: &str = "stead.revision";

/// The default Engine API socket.
pub const DEFAULT_SOCKET_PATH: &str = crate::config::daemon::DEFAULT_DOCKER_SOCKET;

/// The only host address stead publishes on and reads binds from: probes and
/// traffic dial loopback, never container IPs.
const LOOPBACK_HOST_IP: &str = "127.0.0.1";

/// Docker's rendering of "never": a container created but not yet started
/// reports this as `State.StartedAt`.
const DOCKER_ZERO_TIME_PREFIX: &str = "0001-01-01T00:00:00";

/// How Podman's compatible API words a create whose name is taken (it
/// answers 500, not Docker's 409).
const PODMAN_NAME_IN_USE: &str = "that name is already in use";

/// What an operator whose engine does not answer should check.
const DOCKERD_HINT: &str = "is dockerd running? `scripts/services up` starts it";

/// The log driver of every container: rotated files the engine keeps,
/// which `docker logs` (and the log readiness probe) read.
pub const LOG_DRIVER: &str = "json-file";

/// json-file rotation at the operator's size and count.
fn log_config(limits: &ContainerLimits) -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some(LOG_DRIVER.to_owned()),
        config: Some(HashMap::from([
            (
                "max-size".to_owned(),
                format!("{}m", limits.log_max_size_mb),
            ),
            ("max-file".to_owned(), limits.log_max_files.to_string()),
        ])),
    }
}

/// Set on every container: no process in it gains privileges through a
/// setuid binary or file capabilities. Both dockerd and Podman take this
/// spelling.
pub const NO_NEW_PRIVILEGES: &str = "no-new-privileges";

/// Upper bound on the bytes of a Docker error message carried into ours, so
/// a runaway body cannot flood logs.
const DETAIL_LEN_MAX: usize = 512;

/// Upper bound on the progress messages read from one image pull; a pull
/// that keeps talking past it is abandoned with an error.
const PULL_MESSAGES_MAX: usize = 100_000;

/// What a container does when its process exits, on the runtime's own
/// initiative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NativeRestart {
    /// `no`: stead's recovery pass (with its budget) is the only restarter.
    #[default]
    Never,
    /// `unless-stopped`: Docker restarts crashed containers itself, racing
    /// the recovery pass (R11 tolerates that race).
    UnlessStopped,
}

/// How to reach the Docker Engine API and how to create containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DockerConfig {
    /// The Engine API's unix socket (Docker's or Podman's).
    pub socket_path: PathBuf,
    /// Bound on one API call, not counting a stop or restart grace period
    /// (which is added to it for those calls).
    pub request_timeout: Duration,
    /// API version to speak before negotiation; [`DockerRuntime::connect`]
    /// lowers it to the server's when the server is older. 1.41 is Docker
    /// 20.10 and Podman 4's compat API.
    pub api_version: (usize, usize),
    /// Restart policy given to created containers.
    pub native_restart: NativeRestart,
    /// What every created container gets: its memory limit unless the
    /// catalog names one, a pids limit and log rotation.
    pub limits: ContainerLimits,
    /// Capabilities every container drops (`[docker] cap_drop`), less the
    /// ones its catalog entry adds back.
    pub cap_drop: Vec<String>,
    /// Where a lone service runs (`[docker] isolation`).
    pub isolation: Isolation,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            socket_path: PathBuf::from(DEFAULT_SOCKET_PATH),
            request_timeout: Duration::from_secs(30),
            api_version: (1, 41),
            native_restart: NativeRestart::Never,
            limits: ContainerLimits::default(),
            cap_drop: CAP_DROP_DEFAULT.iter().map(|c| (*c).to_owned()).collect(),
            isolation: Isolation::default(),
        }
    }
}

/// A labelled container as the list call shows it, with the revision label
/// that [`ManagedContainer`] leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelledContainer {
    pub id: ContainerId,
    /// The container's name without Docker's leading `/`.
    pub name: String,
    pub instance: InstanceName,
    pub service: ServiceName,
    pub revision: Option<String>,
    pub status: ContainerStatus,
}

pub use crate::ports::{RuntimeEvent, RuntimeEventAction};

/// A boxed stream of events; ends when the connection to the runtime drops
/// (the caller resubscribes).
pub type RuntimeEventStream =
    Pin<Box<dyn Stream<Item = Result<RuntimeEvent, RuntimeError>> + Send>>;

/// The `Runtime` port over Docker's (or Podman's) Engine API.
#[derive(Clone, Debug)]
pub struct DockerRuntime {
    docker: Docker,
    config: DockerConfig,
    /// Engine API requests made through this client (and its clones), so
    /// benchmarks and metrics can show what a pass costs.
    api_calls: Arc<AtomicU64>,
    /// Of those, the ones Docker would not have needed ([`Self::compat_call_count`]).
    compat_calls: Arc<AtomicU64>,
    /// Inspect answers, kept only while the event stream is followed.
    cache: Arc<ReadCache>,
}

impl DockerRuntime {
    /// Builds a client without talking to the server; the socket file must
    /// exist. Requests speak `config.api_version`, and the socket is dialled
    /// per request, so a client outlives a dockerd restart.
    pub fn new(config: DockerConfig) -> Result<Self, RuntimeError> {
        // bollard counts its timeout in whole seconds; less than one would
        // time every request out at once.
        if config.request_timeout < Duration::from_secs(1) {
            return Err(RuntimeError::Refused(format!(
                "docker request_timeout = {:?} must be at least 1 s",
                config.request_timeout
            )));
        }
        let path = config.socket_path.to_str().ok_or_else(|| {
            RuntimeError::Refused(format!(
                "docker socket_path {:?} is not valid UTF-8",
                config.socket_path
            ))
        })?;
        let version = ClientVersion {
            major_version: config.api_version.0,
            minor_version: config.api_version.1,
        };
        let docker = Docker::connect_with_unix(path, config.request_timeout.as_secs(), &version)
            .map_err(|e| {
                RuntimeError::Transient(format!(
                    "docker socket {path}: {} ({DOCKERD_HINT})",
                    detail(&e)
                ))
            })?;
        Ok(Self {
            docker,
            config,
            api_calls: Arc::default(),
            compat_calls: Arc::default(),
            cache: Arc::default(),
        })
    }

    /// Builds a client and negotiates the API version with the server, so a
    /// newer client never sends a version an older engine refuses. Fails,
    /// naming the socket, when the server does not answer.
    pub async fn connect(config: DockerConfig) -> Result<Self, RuntimeError> {
        let Self {
            docker,
            config,
            api_calls,
            compat_calls,
            cache,
        } = Self::new(config)?;
        let socket = config.socket_path.display().to_string();
        let docker = docker.negotiate_version().await.map_err(|e| {
            RuntimeError::Transient(format!(
                "docker at {socket} did not answer ({DOCKERD_HINT}): {}",
                detail(&e)
            ))
        })?;
        Ok(Self {
            docker,
            config,
            api_calls,
            compat_calls,
            cache,
        })
    }

    /// Engine API requests made so far by this runtime and its clones
    /// (version negotiation excluded; an event subscription counts once).
    pub fn api_call_count(&self) -> u64 {
        self.api_calls.load(Ordering::Relaxed)
    }

    /// Of [`Self::api_call_count`], the calls made only because the engine
    /// answered otherwise than Docker does; always 0 against Docker. Against
    /// Podman 4.3: an inspect per health event of an event stream (its
    /// events carry no verdict, [`Self::events`]), and a second read of a
    /// list or inspect answer that shows a `stopping` container
    /// (`get_with_docker_states`).
    pub fn compat_call_count(&self) -> u64 {
        self.compat_calls.load(Ordering::Relaxed)
    }

    /// The client, counting one API request.
    fn api(&self) -> &Docker {
        self.count_call();
        &self.docker
    }

    fn count_call(&self) {
        self.api_calls.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("stead_docker_api_calls_total").increment(1);
    }

    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The read cache. Whoever follows [`DockerRuntime::events`] tells it
    /// about every event and whether the stream is up; nobody else needs to.
    pub fn read_cache(&self) -> &ReadCache {
        &self.cache
    }

    /// Follows the event stream from `since` only to keep the read cache
    /// sound: every event drops its container's answer. Returns when the
    /// stream ends, having stopped the cache. The daemon's own follower
    /// (`daemon::events`) does this too, besides triggering passes and
    /// resubscribing; benchmarks and tests use this one. The cache follows
    /// from the call on, not from the future's first poll.
    pub fn follow_into_cache(self, since: Timestamp) -> impl Future<Output = ()> + Send {
        let mut events = self.events(since);
        self.cache.set_following(true);
        async move {
            while let Some(Ok(event)) = events.next().await {
                self.cache.invalidate(&event.container);
            }
            self.cache.set_following(false);
        }
    }

    /// One inspect, answering all three reads, through the cache.
    async fn inspected(&self, id: &ContainerId) -> Result<Inspected, RuntimeError> {
        if let Some(hit) = self.cache.get(id) {
            return Ok(hit);
        }
        let ticket = self.cache.ticket(id);
        let response = self.inspect_raw(id).await?;
        let inspected = Inspected {
            observation: observation(id, &response)?,
            health: health_of(&response),
            binds: binds_of(id, &response)?,
        };
        self.cache.fill(id, ticket, inspected.clone());
        Ok(inspected)
    }

    /// The deterministic name of a service's container at one revision:
    /// `stead.<instance>.<service>.<revision>` ([`names::container_name`]),
    /// which no two (instance, service, revision) share.
    ///
    /// Containers created before this scheme keep their old names
    /// (`stead-<instance>-<service>-<revision>`, which two pairs could
    /// share) and need no migration: ACTIVE, inhibitions and the worker
    /// address containers by ID, and ownership is read from the labels,
    /// never from the name. The name serves one purpose, the idempotence of
    /// [`Runtime::create`], which looks a container up by it only after a
    /// create was refused as a duplicate, and then adopts it only if all
    /// four labels match the request ([`Self::existing`]). An old-named
    /// container is therefore never adopted under a new name, and two new
    /// names never meet, so no create can pick another service's container.
    pub fn container_name(
        instance: &InstanceName,
        service: &ServiceName,
        revision: &str,
    ) -> Result<String, RuntimeError> {
        names::container_name(instance, service, revision)
            .map_err(|e| RuntimeError::Transient(format!("container name: {e}")))
    }

    /// Every container carrying `stead.managed=true`, in one list call,
    /// with its revision label. Containers whose instance or service label is
    /// missing are left out (with a warning), so one bad container never
    /// hides the others.
    pub async fn list_labelled(&self) -> Result<Vec<LabelledContainer>, RuntimeError> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")])]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let summaries: Vec<bollard::models::ContainerSummary> =
            match self.api().list_containers(Some(options)).await {
                Ok(summaries) => summaries,
                Err(e) if is_unknown_state(&e) => {
                    let filters = format!(r#"{{"label":["{LABEL_MANAGED}=true"]}}"#);
                    let path = format!("/containers/json?all=1&filters={}", url_encode(&filters));
                    self.get_with_docker_states(&path)
                        .await
                        .map_err(|e| transient("list containers", LABEL_MANAGED, e))?
                }
                Err(e) => return Err(transient("list containers", LABEL_MANAGED, e)),
            };
        let mut containers = Vec::with_capacity(summaries.len());
        for summary in summaries {
            let Some(id) = summary.id else {
                tracing::warn!("docker listed a managed container without an Id; skipped");
                continue;
            };
            let labels = summary.labels.unwrap_or_default();
            let (Some(instance), Some(service)) =
                (labels.get(LABEL_INSTANCE), labels.get(LABEL_SERVICE))
            else {
                tracing::warn!(
                    container = %id,
                    "managed container lacks the {LABEL_INSTANCE} or {LABEL_SERVICE} label; skipped"
                );
                continue;
            };
            // Labels are input from outside (anyone can label a container):
            // names that break the rule never reach a release name or a pass.
            if let Err(e) = check_labelled_names(instance, service) {
                tracing::warn!(container = %id, "managed container's {e}; skipped");
                continue;
            }
            let name = summary
                .names
                .and_then(|names| names.into_iter().next())
                .map(|n| n.trim_start_matches('/').to_owned())
                .unwrap_or_default();
            let status = summary.state.map_or(ContainerStatus::Unknown, |s| {
                ContainerStatus::parse(s.as_ref())
            });
            containers.push(LabelledContainer {
                id: ContainerId::new(id),
                name,
                instance: InstanceName::new(instance.as_str()),
                service: ServiceName::new(service.as_str()),
                revision: labels.get(LABEL_REVISION).cloned(),
                status,
            });
        }
        Ok(containers)
    }

    /// Subscribes to Docker's event stream for stead's containers: `start`,
    /// `die`, `health_status` and `destroy`. Events without stead's instance
    /// and service labels are dropped. The stream ends when the connection
    /// drops; resubscribe (a lost event costs at most one pass interval).
    ///
    /// The subscription starts at `since` (Docker replays what happened
    /// after it), not at the stream's first poll, so events in between are
    /// not lost. Pass the clock's `now` when subscribing, or the time of the
    /// last event seen when resubscribing.
    ///
    /// Podman's compatible API (4.3) differs in three ways the stream
    /// absorbs (docs/operations.md, "Podman"):
    /// - its event filter matches Podman's own names, `died` and `remove`,
    ///   not `die` and `destroy` (which it reports as `die` and `remove`):
    ///   the filter asks for both spellings (Docker matches none of
    ///   Podman's), and `remove` is read as `destroy`;
    /// - it sends a `health_status` event after every healthcheck run, not
    ///   only when the verdict changes, and without the verdict in the
    ///   action. For such an event the stream inspects the container (see
    ///   [`Self::compat_call_count`]) and passes the event on only when
    ///   the verdict differs from the last one it passed on for that
    ///   container's current execution, so an unchanged check neither drops
    ///   a cached answer nor wakes recovery. Podman emits the event just
    ///   before it records the run's verdict, so a change can be seen one
    ///   run late: a changed verdict reaches stead within one healthcheck
    ///   interval.
    pub fn events(&self, since: Timestamp) -> RuntimeEventStream {
        let since = format!(
            "{}.{:09}",
            since.as_second(),
            since.subsec_nanosecond().max(0)
        );
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")]),
            (
                "event".to_owned(),
                // `died` and `remove`: Podman's names for `die` and `destroy`.
                ["start", "die", "died", "health_status", "destroy", "remove"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
        ]);
        let options = EventsOptions {
            since: Some(since),
            filters: Some(filters),
            ..Default::default()
        };
        let runtime = self.clone();
        let verdicts = Arc::new(Mutex::new(HashMap::new()));
        let stream = self.api().events(Some(options)).filter_map(move |item| {
            let runtime = runtime.clone();
            let verdicts = verdicts.clone();
            async move {
                match item {
                    Ok(message) => runtime.with_verdict(parse_event(message)?, &verdicts).await,
                    Err(e) => Some(Err(transient("read docker events", "", e))),
                }
            }
        });
        Box::pin(stream)
    }

    /// Gives a verdict-less health event (Podman's) its verdict, read by an
    /// inspect, and drops it when that verdict is the one last passed on for
    /// the container; `verdicts` is the stream's memory of those, forgotten
    /// at each start, die and destroy. Other events pass unchanged.
    async fn with_verdict(
        &self,
        mut event: RuntimeEvent,
        verdicts: &Mutex<HashMap<ContainerId, Health>>,
    ) -> Option<Result<RuntimeEvent, RuntimeError>> {
        let remember = |health: Option<Health>| {
            let mut verdicts = verdicts.lock().unwrap_or_else(|e| e.into_inner());
            match health {
                Some(health) => verdicts.insert(event.container.clone(), health),
                None => verdicts.remove(&event.container),
            }
        };
        match event.action {
            RuntimeEventAction::HealthStatus(Health::None) => {
                self.compat_calls.fetch_add(1, Ordering::Relaxed);
                let health = match self.inspect_raw(&event.container).await {
                    Ok(response) => health_of(&response),
                    // Removed since: its destroy event follows.
                    Err(RuntimeError::NotFound) => return None,
                    Err(e) => return Some(Err(e)),
                };
                if remember(Some(health)) == Some(health) {
                    return None;
                }
                event.action = RuntimeEventAction::HealthStatus(health);
            }
            RuntimeEventAction::HealthStatus(health) => {
                remember(Some(health));
            }
            RuntimeEventAction::Start | RuntimeEventAction::Die | RuntimeEventAction::Destroy => {
                remember(None);
            }
        }
        Some(Ok(event))
    }

    async fn inspect_raw(
        &self,
        id: &ContainerId,
    ) -> Result<ContainerInspectResponse, RuntimeError> {
        let inspected = self
            .api()
            .inspect_container(
                id.as_str(),
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await;
        let result = match inspected {
            Err(e) if is_unknown_state(&e) => {
                let path = format!("/containers/{}/json", url_encode(id.as_str()));
                self.get_with_docker_states(&path).await
            }
            other => other,
        };
        result.map_err(|e| not_found_or_transient("inspect", id.as_str(), e))
    }

    /// GETs `path` (with its query) again, without bollard, for an answer
    /// bollard refused because a container's state is a word Docker's API
    /// does not have: Podman 4.3 says `stopping` for a container whose stop
    /// grace is running, where Docker says `running`. The state words are
    /// made Docker's ([`docker_state`]) before the answer is parsed. One
    /// more API call; HTTP/1.0, so the answer is neither chunked nor kept
    /// alive.
    async fn get_with_docker_states<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, DockerError> {
        use tokio::io::AsyncWriteExt;
        self.count_call();
        self.compat_calls.fetch_add(1, Ordering::Relaxed);
        let version = self.docker.client_version();
        let request = format!(
            "GET /v{}.{}{path} HTTP/1.0\r\nHost: docker\r\n\r\n",
            version.major_version, version.minor_version
        );
        let exchange = async {
            let mut stream = tokio::net::UnixStream::connect(&self.config.socket_path).await?;
            stream.write_all(request.as_bytes()).await?;
            read_answer_bounded(stream, DOCKER_ANSWER_LEN_MAX, path).await
        };
        let response = tokio::time::timeout(self.config.request_timeout, exchange)
            .await
            .map_err(|_| DockerError::RequestTimeoutError)??;
        let (status_code, body) =
            split_response(&response).ok_or_else(|| DockerError::IOError {
                err: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("GET {path}: not an HTTP answer"),
                ),
            })?;
        if status_code != 200 {
            // Docker's error body, `{"message": …}`, or whatever came.
            let message = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            return Err(DockerError::DockerResponseServerError {
                status_code,
                message,
            });
        }
        let mut value: serde_json::Value = serde_json::from_slice(body)?;
        with_docker_states(&mut value);
        Ok(serde_json::from_value(value)?)
    }

    /// A client whose timeout covers the grace period on top of the usual
    /// request bound, so a graceful stop is not cut short by the client.
    fn with_grace(&self, grace: Duration) -> Docker {
        self.api()
            .clone()
            .with_timeout(self.config.request_timeout + grace)
    }

    /// The create call. `secrets` are the resolved `NAME=value` entries;
    /// they go into the environment and nowhere else.
    fn create_body(&self, request: &CreateContainer, secrets: Vec<String>) -> ContainerCreateBody {
        let spec = &request.spec;
        let run = &spec.run;
        // The catalog refuses `stead.*` keys, so stead's own cannot be overridden.
        let mut labels: HashMap<String, String> = run
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.extend([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_INSTANCE.to_owned(), request.instance.to_string()),
            (LABEL_SERVICE.to_owned(), spec.name.to_string()),
            (LABEL_REVISION.to_owned(), request.revision.clone()),
        ]);
        let env: Vec<String> = request
            .env
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .chain(secrets)
            .collect();
        let (network, networking_config) =
            workload::networking(request, self.config.isolation).unzip();
        let (cap_drop, cap_add) = walls::capabilities(&self.config.cap_drop, &run.cap_add);
        let mounts = workload::mounts(request);
        let exposed_ports = spec
            .ports
            .iter()
            .map(|port| (format!("{port}/tcp"), HashMap::new()))
            .collect();
        // Host port "0": Docker picks a free ephemeral port, on loopback only.
        let port_bindings = spec
            .ports
            .iter()
            .map(|port| {
                let binding = PortBinding {
                    host_ip: Some(LOOPBACK_HOST_IP.to_owned()),
                    host_port: Some("0".to_owned()),
                };
                (format!("{port}/tcp"), Some(vec![binding]))
            })
            .collect();
        let healthcheck = spec.healthcheck.as_ref().map(|check| HealthConfig {
            // `CMD` runs the argument vector directly; never `CMD-SHELL`.
            test: Some(
                std::iter::once("CMD".to_owned())
                    .chain(check.command.iter().cloned())
                    .collect(),
            ),
            interval: Some(duration_ns(check.interval)),
            timeout: Some(duration_ns(check.timeout)),
            retries: Some(i64::from(check.retries)),
            ..Default::default()
        });
        let limits = &self.config.limits;
        let restart = match self.config.native_restart {
            NativeRestart::Never => RestartPolicyNameEnum::NO,
            NativeRestart::UnlessStopped => RestartPolicyNameEnum::UNLESS_STOPPED,
        };
        ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            entrypoint: (!run.entrypoint.is_empty()).then(|| run.entrypoint.clone()),
            user: run.user.clone(),
            env: (!env.is_empty()).then_some(env),
            labels: Some(labels),
            networking_config,
            exposed_ports: Some(exposed_ports),
            healthcheck,
            stop_timeout: Some(i64::from(grace_secs(spec.stop_grace))),
            host_config: Some(HostConfig {
                port_bindings: Some(port_bindings),
                network_mode: network,
                mounts: (!mounts.is_empty()).then_some(mounts),
                memory: i64::try_from(limits.memory_bytes(run.memory_bytes)).ok(),
                nano_cpus: run.nano_cpus.and_then(|n| i64::try_from(n).ok()),
                pids_limit: Some(i64::from(limits.pids_limit)),
                log_config: Some(log_config(limits)),
                security_opt: Some(vec![NO_NEW_PRIVILEGES.to_owned()]),
                cap_drop,
                cap_add,
                restart_policy: Some(RestartPolicy {
                    name: Some(restart),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Creates the container; `Ok(None)` when the name is taken.
    async fn try_create(
        &self,
        name: &str,
        body: &ContainerCreateBody,
    ) -> Result<Option<ContainerId>, DockerError> {
        let options = CreateContainerOptions {
            name: Some(name.to_owned()),
            ..Default::default()
        };
        match self
            .api()
            .create_container(Some(options), body.clone())
            .await
        {
            Ok(created) => Ok(Some(ContainerId::new(created.id))),
            Err(e) if name_taken(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Best-effort pull of a missing image. A failure names the image and
    /// what the registry said, so "image missing" is never a mystery.
    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        let options = CreateImageOptions {
            from_image: Some(image.to_owned()),
            ..Default::default()
        };
        let mut progress = self.api().create_image(Some(options), None, None);
        let mut n_messages = 0usize;
        while let Some(message) = progress.next().await {
            n_messages += 1;
            if n_messages > PULL_MESSAGES_MAX {
                return Err(RuntimeError::Transient(format!(
                    "image {image:?} is missing and its pull sent more than {PULL_MESSAGES_MAX} messages; abandoned"
                )));
            }
            let info = message.map_err(|e| {
                let refused = matches!(
                    e,
                    DockerError::DockerResponseServerError {
                        status_code: 401 | 403 | 404,
                        ..
                    }
                );
                pull_failure(image, &detail(&e), refused)
            })?;
            if let Some(error) = info.error_detail.and_then(|d| d.message) {
                return Err(pull_failure(image, &truncate(&error), false));
            }
        }
        Ok(())
    }

    /// The ID of the existing container with this name, after checking it is
    /// the same (instance, service, revision): a foreign container squatting
    /// on stead's name is an error, never adopted.
    async fn existing(
        &self,
        name: &str,
        request: &CreateContainer,
    ) -> Result<ContainerId, RuntimeError> {
        let existing = self.inspect_raw(&ContainerId::new(name)).await?;
        let expected = [
            (LABEL_MANAGED, "true"),
            (LABEL_INSTANCE, request.instance.as_str()),
            (LABEL_SERVICE, request.spec.name.as_str()),
            (LABEL_REVISION, request.revision.as_str()),
        ];
        if let Err(mismatch) = check_labels(&existing, &expected) {
            return Err(RuntimeError::Transient(format!(
                "container name {name:?} is taken by a container whose {mismatch}; refusing to adopt it"
            )));
        }
        let id = existing.id.ok_or_else(|| {
            RuntimeError::Transient(format!("inspect of {name:?} returned no Id"))
        })?;
        Ok(ContainerId::new(id))
    }

    /// The exact ID of the container `key` names, after checking that its
    /// labels say it is stead's and belongs to `key.instance` and
    /// `key.service`: a container recorded under the wrong generation (a
    /// database row another tool wrote, a name re-pointed) is refused,
    /// naming what its labels say, never stopped or removed.
    async fn owned(&self, key: &GenerationKey, operation: &str) -> Result<String, RuntimeError> {
        let id = &key.container;
        let response = self.inspect_raw(id).await?;
        let expected = [
            (LABEL_MANAGED, "true"),
            (LABEL_INSTANCE, key.instance.as_str()),
            (LABEL_SERVICE, key.service.as_str()),
        ];
        if let Err(mismatch) = check_labels(&response, &expected) {
            return Err(RuntimeError::Refused(format!(
                "refusing to {operation} container {id}: its {mismatch}; stead {operation}s only \
                 the generation it names ({}/{})",
                key.instance, key.service
            )));
        }
        // Act on the exact ID inspect returned, so a name cannot be
        // re-pointed between the check and the call.
        Ok(response.id.unwrap_or_else(|| id.to_string()))
    }
}

/// A label a container does not carry with the value expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("label {label} is {found:?}, expected {expected:?}")]
struct LabelMismatch {
    label: String,
    found: Option<String>,
    expected: String,
}

/// The first of `expected`'s labels the container does not carry with the
/// expected value.
fn check_labels(
    response: &ContainerInspectResponse,
    expected: &[(&str, &str)],
) -> Result<(), LabelMismatch> {
    let labels = response.config.as_ref().and_then(|c| c.labels.as_ref());
    for (label, value) in expected {
        let found = labels.and_then(|l| l.get(*label));
        if found.map(String::as_str) != Some(*value) {
            return Err(LabelMismatch {
                label: (*label).to_owned(),
                found: found.cloned(),
                expected: (*value).to_owned(),
            });
        }
    }
    Ok(())
}

#[async_trait]
impl Runtime for DockerRuntime {
    #[tracing::instrument(name = "docker.begin_pass", level = "debug", skip_all)]
    async fn begin_pass(&self) -> Result<(), RuntimeError> {
        if self.cache.is_empty() {
            // Nothing to check the list against: skip the call.
            return Ok(());
        }
        match self.list_labelled().await {
            Ok(listed) => {
                let listed = listed.into_iter().map(|c| (c.id, c.status)).collect();
                self.cache.reconcile(&listed);
                Ok(())
            }
            Err(e) => {
                // Unchecked answers are not served: this pass inspects.
                self.cache.forget_all();
                Err(e)
            }
        }
    }

    #[tracing::instrument(name = "docker.inspect", level = "debug", skip_all, fields(container = %id))]
    async fn inspect(&self, id: &ContainerId) -> Result<Observation, RuntimeError> {
        Ok(self.inspected(id).await?.observation)
    }

    #[tracing::instrument(name = "docker.start", level = "debug", skip_all, fields(container = %id))]
    async fn start(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        // 304 (already running) is a success for bollard and for us.
        let result = self
            .api()
            .start_container(id.as_str(), None::<StartContainerOptions>)
            .await
            .map_err(|e| not_found_or_transient("start", id.as_str(), e));
        self.cache.invalidate(id);
        result
    }

    #[tracing::instrument(name = "docker.stop", level = "debug", skip_all, fields(container = %key.container))]
    async fn stop(&self, key: &GenerationKey, grace: Duration) -> Result<(), RuntimeError> {
        let exact = self.owned(key, "stop").await?;
        let options = StopContainerOptions {
            t: Some(grace_secs(grace)),
            ..Default::default()
        };
        let result = self
            .with_grace(grace)
            .stop_container(&exact, Some(options))
            .await
            .map_err(|e| not_found_or_transient("stop", &exact, e));
        self.cache.invalidate(&key.container);
        self.cache.invalidate(&ContainerId::new(exact));
        result
    }

    #[tracing::instrument(name = "docker.restart", level = "debug", skip_all, fields(container = %id))]
    async fn restart(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        let options = RestartContainerOptions {
            t: Some(grace_secs(grace)),
            ..Default::default()
        };
        let result = self
            .with_grace(grace)
            .restart_container(id.as_str(), Some(options))
            .await
            .map_err(|e| not_found_or_transient("restart", id.as_str(), e));
        self.cache.invalidate(id);
        result
    }

    #[tracing::instrument(name = "docker.health", level = "debug", skip_all, fields(container = %id))]
    async fn health(&self, id: &ContainerId) -> Result<Health, RuntimeError> {
        Ok(self.inspected(id).await?.health)
    }

    #[tracing::instrument(name = "docker.binds", level = "debug", skip_all, fields(container = %id))]
    async fn binds(&self, id: &ContainerId) -> Result<Binds, RuntimeError> {
        Ok(self.inspected(id).await?.binds)
    }

    #[tracing::instrument(name = "docker.last_lines", level = "debug", skip_all)]
    async fn last_lines(
        &self,
        id: &ContainerId,
        lines: usize,
    ) -> Result<Vec<String>, RuntimeError> {
        self.tail_lines(id, lines).await
    }

    #[tracing::instrument(name = "docker.list_managed", level = "debug", skip_all)]
    async fn list_managed(&self) -> Result<Vec<ManagedContainer>, RuntimeError> {
        let containers = self.list_labelled().await?;
        Ok(containers
            .into_iter()
            .map(|c| ManagedContainer {
                id: c.id,
                instance: c.instance,
                service: c.service,
                status: c.status,
                // Docker's list does not report it; see the module docs.
                started_at: None,
            })
            .collect())
    }

    #[tracing::instrument(name = "docker.create", level = "debug", skip_all, fields(instance = %request.instance, service = %request.spec.name))]
    async fn create(&self, request: &CreateContainer) -> Result<ContainerId, RuntimeError> {
        let name = Self::container_name(&request.instance, &request.spec.name, &request.revision)?;
        // Everything the container needs, before the container: a missing
        // secret or a volume kept from another instance stops here.
        let secrets = workload::resolve_secrets(&request.instance, &request.spec).await?;
        if request.spec.run.instance_network {
            self.ensure_network(&request.instance).await?;
        } else if self.config.isolation == Isolation::Shared {
            self.ensure_isolated_network().await?;
        }
        for volume in request.spec.run.volumes() {
            self.ensure_volume(request, volume).await?;
        }
        let body = self.create_body(request, secrets);
        let created = match self.try_create(&name, &body).await {
            Ok(created) => created,
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                // 404 on create means the image is missing: pull, then once more.
                self.pull(&request.spec.image).await?;
                self.try_create(&name, &body)
                    .await
                    .map_err(|e| transient("create", &name, e))?
            }
            Err(e) => return Err(transient("create", &name, e)),
        };
        let id = match created {
            Some(id) => id,
            None => {
                let id = self.existing(&name, request).await?;
                // Idempotence: a container created by an earlier, interrupted
                // call is started here; one that already ran and exited is the
                // recovery pass's to start, under its budget.
                if self.inspect(&id).await?.status != ContainerStatus::Created {
                    return Ok(id);
                }
                id
            }
        };
        self.join_networks(&id, request).await?;
        self.start(&id).await?;
        Ok(id)
    }

    #[tracing::instrument(name = "docker.remove", level = "debug", skip_all, fields(container = %key.container))]
    async fn remove(&self, key: &GenerationKey) -> Result<(), RuntimeError> {
        let exact = match self.owned(key, "remove").await {
            Ok(exact) => exact,
            Err(RuntimeError::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        };
        // `v` removes the anonymous volumes an image's `VOLUME` gave the
        // container, which nothing else would ever remove; named volumes
        // (the instance's data) are never removed by it, on Docker or
        // Podman (#41).
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        let result = match self.api().remove_container(&exact, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) => match not_found_or_transient("remove", &exact, e) {
                RuntimeError::NotFound => Ok(()),
                other => Err(other),
            },
        };
        self.cache.invalidate(&key.container);
        self.cache.invalidate(&ContainerId::new(exact));
        result
    }

    #[tracing::instrument(name = "docker.purge_volumes", level = "debug", skip_all, fields(instance = %instance))]
    async fn purge_volumes(
        &self,
        instance: &InstanceName,
        instance_id: crate::core::fleet::InstanceId,
    ) -> Result<Vec<String>, RuntimeError> {
        self.purge_instance_volumes(instance, instance_id).await
    }

    /// The stream is what makes the read cache sound: every event drops
    /// its container's cached answer.
    fn event_seen(&self, event: &RuntimeEvent) {
        self.cache.invalidate(&event.container);
    }

    fn events_followed(&self, followed: bool) {
        self.cache.set_following(followed);
    }
}

/// One subscription to Docker's event stream.
struct DockerSubscription {
    events: RuntimeEventStream,
}

#[async_trait]
impl EventSubscription for DockerSubscription {
    async fn next_event(&mut self) -> Option<Result<RuntimeEvent, RuntimeError>> {
        self.events.next().await
    }
}

#[async_trait]
impl RuntimeEvents for DockerRuntime {
    async fn subscribe(
        &self,
        since: Timestamp,
    ) -> Result<Box<dyn EventSubscription>, RuntimeError> {
        Ok(Box::new(DockerSubscription {
            events: self.events(since),
        }))
    }
}

/// The `Provisioner` port for the embedded default, where an instance's
/// services are labelled containers on the local engine.
///
/// A release is the set of containers sharing a `stead.instance` label, so
/// `list_releases` is one labelled list call and drift detection (C5) works
/// as with Helm. Creating the containers needs the catalog's specs, which
/// this port's `install_or_upgrade(release, version)` does not carry: the
/// engine's worker creates them itself through [`Runtime::create`], and
/// `install_or_upgrade` here answers with an error that says so instead of
/// pretending. `uninstall` removes every managed container of the release.
#[derive(Clone, Debug)]
pub struct DockerProvisioner {
    runtime: DockerRuntime,
    /// What `list_releases` reports as every release's namespace.
    namespace: String,
}

impl DockerProvisioner {
    /// Namespace reported for Docker releases (there are none in Docker).
    pub const NAMESPACE: &'static str = crate::config::daemon::DOCKER_RELEASE_NAMESPACE;

    pub fn new(runtime: DockerRuntime) -> Self {
        Self {
            runtime,
            namespace: Self::NAMESPACE.to_owned(),
        }
    }
}

#[async_trait]
impl Provisioner for DockerProvisioner {
    /// Nothing to do: with Docker, a release *is* its labelled containers,
    /// which the worker creates from catalog specs through `Runtime::create`
    /// (idempotent on their deterministic names) right after this call.
    #[tracing::instrument(name = "docker.install_or_upgrade", level = "debug", skip_all)]
    async fn install_or_upgrade(&self, release: &ReleaseSpec) -> Result<(), ProvisionError> {
        match release {
            ReleaseSpec::Docker { .. } => Ok(()),
            ReleaseSpec::Helm(helm) => Err(ProvisionError::Refused(format!(
                "release {} is a Helm release; the Docker provisioner installs none",
                helm.name
            ))),
        }
    }

    #[tracing::instrument(name = "docker.uninstall", level = "debug", skip_all)]
    async fn uninstall(&self, target: &ReleaseTarget) -> Result<(), ProvisionError> {
        let release = target.release.name.as_str();
        let containers = self
            .runtime
            .list_labelled()
            .await
            .map_err(|e| ProvisionError::Unavailable(format!("uninstall {release:?}: {e}")))?;
        let mut failures = Vec::new();
        // Whether a removal was refused for good (a container that is not
        // the generation's, T6); otherwise the runtime may answer next time.
        let mut refused = false;
        for container in containers.iter().filter(|c| c.instance.as_str() == release) {
            let key = GenerationKey {
                instance: container.instance.clone(),
                service: container.service.clone(),
                container: container.id.clone(),
            };
            if let Err(e) = self.runtime.remove(&key).await {
                refused |= e.kind().is_permanent();
                failures.push(format!("{}: {e}", container.id));
            }
        }
        // The network goes with the last container; named volumes stay
        // (only an explicit purge removes them).
        if failures.is_empty() {
            if let Err(e) = self
                .runtime
                .remove_network(&InstanceName::new(release))
                .await
            {
                refused |= e.kind().is_permanent();
                failures.push(format!(
                    "network {:?}: {e}",
                    network_name(&InstanceName::new(release))
                ));
            }
        }
        if failures.is_empty() {
            return Ok(());
        }
        let message = format!(
            "uninstall {release:?}: {} container(s) not removed: {}",
            failures.len(),
            failures.join("; ")
        );
        // A deprovision retries a runtime that did not answer; only a
        // refusal fails it for good.
        Err(if refused {
            ProvisionError::Failed(message)
        } else {
            ProvisionError::Unavailable(message)
        })
    }

    #[tracing::instrument(name = "docker.list_releases", level = "debug", skip_all)]
    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError> {
        let containers = self
            .runtime
            .list_labelled()
            .await
            .map_err(|e| ProvisionError::Unavailable(format!("list releases: {e}")))?;
        let mut releases: Vec<Release> = containers
            .into_iter()
            .map(|c| Release {
                name: c.instance.to_string(),
                namespace: self.namespace.clone(),
            })
            .collect();
        releases.sort();
        releases.dedup();
        Ok(releases)
    }
}

/// Status and execution start of an inspected container.
fn observation(
    id: &ContainerId,
    response: &ContainerInspectResponse,
) -> Result<Observation, RuntimeError> {
    let state = response
        .state
        .as_ref()
        .ok_or_else(|| RuntimeError::Transient(format!("inspect of {id} returned no State")))?;
    let status = state.status.map_or(ContainerStatus::Unknown, |s| {
        ContainerStatus::parse(s.as_ref())
    });
    let started_at = parse_started_at(id, state.started_at.as_deref())?;
    // Docker keeps the last execution's exit code and end while the
    // container runs again; only a down container's is its present.
    let exit = match (status.is_down(), state.exit_code) {
        (true, Some(code)) if started_at.is_some() => Some(Exit {
            code,
            finished_at: parse_started_at(id, state.finished_at.as_deref()).unwrap_or(None),
        }),
        _ => None,
    };
    Ok(Observation {
        status,
        started_at,
        exit,
    })
}

fn health_of(response: &ContainerInspectResponse) -> Health {
    let status = response
        .state
        .as_ref()
        .and_then(|s| s.health.as_ref())
        .and_then(|h| h.status);
    match status {
        None | Some(HealthStatusEnum::EMPTY) | Some(HealthStatusEnum::NONE) => Health::None,
        Some(HealthStatusEnum::STARTING) => Health::Starting,
        Some(HealthStatusEnum::HEALTHY) => Health::Healthy,
        Some(HealthStatusEnum::UNHEALTHY) => Health::Unhealthy,
    }
}

/// A container's loopback binds; none unless it runs (or is paused: Docker
/// keeps them then). Docker forgets a stopped container's host ports (a
/// start picks new ones); Podman keeps reporting the ones it picked at
/// create, on which nothing listens while the container is stopped.
fn binds_of(id: &ContainerId, response: &ContainerInspectResponse) -> Result<Binds, RuntimeError> {
    let status = response.state.as_ref().and_then(|s| s.status);
    if !matches!(
        status,
        Some(ContainerStateStatusEnum::RUNNING | ContainerStateStatusEnum::PAUSED)
    ) {
        return Ok(Binds::new());
    }
    let empty = HashMap::new();
    let ports = response
        .network_settings
        .as_ref()
        .and_then(|n| n.ports.as_ref())
        .unwrap_or(&empty);
    parse_binds(id, ports)
}

/// `State.StartedAt` as a timestamp; Docker's zero time (never started) and
/// an absent or empty value are `None`.
pub fn parse_started_at(
    id: &ContainerId,
    value: Option<&str>,
) -> Result<Option<Timestamp>, RuntimeError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if value.starts_with(DOCKER_ZERO_TIME_PREFIX) {
        return Ok(None);
    }
    value.parse::<Timestamp>().map(Some).map_err(|e| {
        RuntimeError::Transient(format!(
            "container {id}: State.StartedAt = {value:?} is not a timestamp: {e}"
        ))
    })
}

/// Loopback binds from `NetworkSettings.Ports` (`"8080/tcp" → [{HostIp,
/// HostPort}]`). Only TCP ports bound on 127.0.0.1 count; a malformed port
/// is an error naming the value.
pub fn parse_binds(
    id: &ContainerId,
    ports: &HashMap<String, Option<Vec<PortBinding>>>,
) -> Result<Binds, RuntimeError> {
    let mut binds = Binds::new();
    for (key, bindings) in ports {
        let (port, protocol) = key.split_once('/').unwrap_or((key.as_str(), "tcp"));
        if protocol != "tcp" {
            continue;
        }
        let container_port = parse_port(id, "NetworkSettings.Ports key", key, port)?;
        for binding in bindings.iter().flatten() {
            if binding.host_ip.as_deref() != Some(LOOPBACK_HOST_IP) {
                continue;
            }
            let raw = binding.host_port.as_deref().unwrap_or("");
            let host_port = parse_port(id, "NetworkSettings.Ports HostPort", raw, raw)?;
            // With several loopback bindings of one port, the lowest wins, so
            // the answer does not depend on Docker's ordering.
            binds
                .entry(container_port)
                .and_modify(|p| *p = (*p).min(host_port))
                .or_insert(host_port);
        }
    }
    Ok(binds)
}

fn parse_port(
    id: &ContainerId,
    field: &str,
    value: &str,
    digits: &str,
) -> Result<u16, RuntimeError> {
    match digits.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(RuntimeError::Transient(format!(
            "container {id}: {field} = {value:?} is not a port (1-65535)"
        ))),
    }
}

/// One Docker event as a stead event; `None` for events stead does not use
/// or that lack its labels. A `health_status` event without a verdict
/// (Podman's) gets `Health::None`, which no real health event reports (an
/// event never says "no healthcheck"): [`DockerRuntime::events`] then reads
/// the verdict by an inspect.
fn parse_event(message: EventMessage) -> Option<RuntimeEvent> {
    let action = message.action?;
    let actor = message.actor?;
    let container = actor.id?;
    let attributes = actor.attributes.unwrap_or_default();
    let instance = attributes.get(LABEL_INSTANCE)?;
    let service = attributes.get(LABEL_SERVICE)?;
    check_labelled_names(instance, service).ok()?;
    // Health events read `health_status: healthy`.
    let (verb, argument) = match action.split_once(':') {
        Some((verb, argument)) => (verb.trim(), argument.trim()),
        None => (action.as_str(), ""),
    };
    let action = match verb {
        "start" => RuntimeEventAction::Start,
        "die" => RuntimeEventAction::Die,
        // `remove`: Podman's name for it.
        "destroy" | "remove" => RuntimeEventAction::Destroy,
        "health_status" => RuntimeEventAction::HealthStatus(match argument {
            "healthy" => Health::Healthy,
            "unhealthy" => Health::Unhealthy,
            "starting" => Health::Starting,
            _ => Health::None,
        }),
        _ => return None,
    };
    Some(RuntimeEvent {
        instance: InstanceName::new(instance.as_str()),
        service: ServiceName::new(service.as_str()),
        container: ContainerId::new(container),
        action,
    })
}

/// The instance and service labels of a container, checked against the
/// name rule before they are used as names.
fn check_labelled_names(instance: &str, service: &str) -> Result<(), names::NameError> {
    names::check_instance_name(LABEL_INSTANCE, instance)?;
    names::check_dns_label(LABEL_SERVICE, service)
}

/// Docker takes a stop grace in whole seconds: round up, so a grace is never
/// shortened.
fn grace_secs(grace: Duration) -> i32 {
    let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

fn duration_ns(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// Whether bollard refused an answer for a word its enums lack, which among
/// the answers stead reads only a container's state can be (Podman's
/// `stopping`).
fn is_unknown_state(error: &DockerError) -> bool {
    matches!(error, DockerError::JsonDataError { message, .. } if message.contains("unknown variant"))
}

/// The state words Docker's API uses; bollard refuses any other.
const DOCKER_STATES: [&str; 8] = [
    "",
    "created",
    "running",
    "paused",
    "restarting",
    "removing",
    "exited",
    "dead",
];

/// A state word as Docker would say it. Podman's `stopping` (a stop's grace
/// is running; the process still runs) is Docker's `running`; any other
/// word Docker lacks becomes the empty one, which stead reads as
/// [`ContainerStatus::Unknown`] and never acts on.
fn docker_state(word: &str) -> &str {
    match word {
        "stopping" => "running",
        word if DOCKER_STATES.contains(&word) => word,
        _ => "",
    }
}

/// Rewrites the state words of a list answer (`[{"State": …}]`) or an
/// inspect answer (`{"State": {"Status": …}}`) as Docker's.
fn with_docker_states(value: &mut serde_json::Value) {
    let words = match value {
        serde_json::Value::Array(summaries) => summaries
            .iter_mut()
            .filter_map(|summary| summary.get_mut("State"))
            .collect(),
        serde_json::Value::Object(inspected) => inspected
            .get_mut("State")
            .and_then(|state| state.get_mut("Status"))
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    for word in words {
        if let Some(docker) = word.as_str().map(|w| docker_state(w).to_owned()) {
            *word = serde_json::Value::String(docker);
        }
    }
}

/// The most of one answer stead reads itself from the Engine API socket
/// ([`DockerRuntime::get_with_docker_states`]: one container's inspect or
/// the labelled list of stead's containers, a few KiB per container).
pub const DOCKER_ANSWER_LEN_MAX: usize = 64 * 1024 * 1024;

/// Reads `reader` to its end, at most `max` bytes: a longer answer is
/// refused naming `path` and the bound, after reading one byte more than
/// the bound, never all of it.
async fn read_answer_bounded(
    reader: impl tokio::io::AsyncRead + Unpin,
    max: usize,
    path: &str,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    reader.take(max as u64 + 1).read_to_end(&mut answer).await?;
    if answer.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("GET {path}: the answer is larger than {max} bytes, the most stead reads from the Engine API"),
        ));
    }
    Ok(answer)
}

/// The status code and body of an HTTP/1.x answer.
fn split_response(response: &[u8]) -> Option<(u16, &[u8])> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&response[..end]).ok()?;
    let status_code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status_code, &response[end + 4..]))
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn url_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// What the registry's refusal of a pull says, in the words Docker and
/// registries use: the image or tag does not exist, or stead may not pull
/// it. Pulling it again fails alike until the catalog or the registry
/// changes. A rate limit (`toomanyrequests`) passes.
const PULL_REFUSED_MARKERS: [&str; 6] = [
    "pull access denied",
    "manifest unknown",
    "not found",
    "repository does not exist",
    "unauthorized",
    "invalid reference format",
];

/// A missing image whose pull failed: refused (a permanent kind, so the
/// task fails at once and an upgrade halts its rollout, C8) when the
/// registry answered that the image cannot be had (`refused`, from its
/// status, or its words), transient when it could not be reached or
/// asked to wait.
fn pull_failure(image: &str, said: &str, refused: bool) -> RuntimeError {
    let message = format!("image {image:?} is missing and pulling it failed: {said}");
    let lower = said.to_ascii_lowercase();
    let refused = !lower.contains("toomanyrequests")
        && (refused || PULL_REFUSED_MARKERS.iter().any(|m| lower.contains(m)));
    if refused {
        RuntimeError::Refused(message)
    } else {
        RuntimeError::Transient(message)
    }
}

/// Whether a create failed because the name is taken: Docker answers 409;
/// Podman 4.3's compatible API answers 500 with libpod's message. Either way
/// [`Runtime::create`] adopts the container only if its labels match.
fn name_taken(error: &DockerError) -> bool {
    match error {
        DockerError::DockerResponseServerError {
            status_code: 409, ..
        } => true,
        DockerError::DockerResponseServerError {
            status_code: 500,
            message,
        } => message.contains(PODMAN_NAME_IN_USE),
        _ => false,
    }
}

/// Docker's answer by kind: 404 is a confirmed absence, 409 a conflict
/// with something already under way (a start racing the runtime's own
/// restart, a removal in progress), anything else transient.
fn not_found_or_transient(operation: &str, id: &str, error: DockerError) -> RuntimeError {
    match error {
        DockerError::DockerResponseServerError {
            status_code: 404, ..
        } => RuntimeError::NotFound,
        DockerError::DockerResponseServerError {
            status_code: 409, ..
        } => RuntimeError::Conflict(format!("docker {operation} {id}: {}", detail(&error))),
        other => transient(operation, id, other),
    }
}

fn transient(operation: &str, subject: &str, error: DockerError) -> RuntimeError {
    RuntimeError::Transient(format!("docker {operation} {subject}: {}", detail(&error)))
}

fn detail(error: &DockerError) -> String {
    truncate(&error.to_string())
}

fn truncate(text: &str) -> String {
    if text.len() <= DETAIL_LEN_MAX {
        return text.to_owned();
    }
    let mut end = DETAIL_LEN_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #41 item 8: an endless answer on the Engine API socket (a wrong or
    /// hostile listener) is refused at the bound, not read into memory;
    /// one within it is read whole.
    #[tokio::test]
    async fn an_engine_answer_is_read_up_to_its_bound_and_refused_beyond() {
        let endless = tokio::io::repeat(b'x');
        let refused = read_answer_bounded(endless, 1024, "/containers/json")
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(
            refused.to_string(),
            "GET /containers/json: the answer is larger than 1024 bytes, the most stead reads \
             from the Engine API"
        );
        let answer = read_answer_bounded(&[b'y'; 1024][..], 1024, "/x")
            .await
            .expect("an answer of exactly the bound is read");
        assert_eq!(answer.len(), 1024);
    }

    #[test]
    fn an_image_the_registry_refuses_is_a_refused_pull_and_an_unreachable_one_transient() {
        let check = |said: &str, status_refused: bool, expect_refused: bool| {
            let error = pull_failure("wiki:9", said, status_refused);
            assert_eq!(
                matches!(error, RuntimeError::Refused(_)),
                expect_refused,
                "{said:?}: {error:?}"
            );
            assert!(error.to_string().contains("wiki:9"), "{error}");
        };
        check(
            "pull access denied for wiki, repository does not exist or may require 'docker login'",
            false,
            true,
        );
        check(
            "manifest for wiki:9 not found: manifest unknown",
            false,
            true,
        );
        check(
            "Head https://registry/v2/wiki/manifests/9: unauthorized",
            false,
            true,
        );
        check("anything the registry said with a 404", true, true);
        check("dial tcp 10.0.0.1:443: i/o timeout", false, false);
        check(
            "toomanyrequests: You have reached your pull rate limit",
            false,
            false,
        );
        check("toomanyrequests: not found in cache", true, false);
    }

    fn id() -> ContainerId {
        ContainerId::new("c1")
    }

    fn ports(entries: &[(&str, &[(&str, &str)])]) -> HashMap<String, Option<Vec<PortBinding>>> {
        entries
            .iter()
            .map(|(key, bindings)| {
                let bindings = bindings
                    .iter()
                    .map(|(ip, port)| PortBinding {
                        host_ip: Some((*ip).to_owned()),
                        host_port: Some((*port).to_owned()),
                    })
                    .collect();
                ((*key).to_owned(), Some(bindings))
            })
            .collect()
    }

    #[test]
    fn binds_keep_only_loopback_tcp() {
        let ports = ports(&[
            ("8080/tcp", &[("127.0.0.1", "32768"), ("0.0.0.0", "40000")]),
            ("53/udp", &[("127.0.0.1", "5353")]),
            ("9090/tcp", &[("0.0.0.0", "41000")]),
        ]);
        let binds = parse_binds(&id(), &ports).unwrap();
        assert_eq!(binds, Binds::from([(8080, 32768)]));
    }

    #[test]
    fn bad_port_strings_are_errors_naming_the_value() {
        for (key, host_port) in [
            ("http/tcp", "1"),
            ("8080/tcp", "abc"),
            ("8080/tcp", "70000"),
            ("8080/tcp", ""),
        ] {
            let ports = ports(&[(key, &[("127.0.0.1", host_port)])]);
            let Err(RuntimeError::Transient(message)) = parse_binds(&id(), &ports) else {
                panic!("{key} {host_port} should fail");
            };
            let named = if key.starts_with("http") {
                key
            } else {
                host_port
            };
            assert!(message.contains(&format!("{named:?}")), "{message}");
        }
    }

    #[test]
    fn zero_time_means_never_started() {
        assert_eq!(
            parse_started_at(&id(), Some("0001-01-01T00:00:00Z")).unwrap(),
            None
        );
        assert_eq!(parse_started_at(&id(), Some("")).unwrap(), None);
        assert_eq!(parse_started_at(&id(), None).unwrap(), None);
        let t = parse_started_at(&id(), Some("2026-11-30T04:37:25.399764252Z")).unwrap();
        assert_eq!(t.unwrap().to_string(), "2026-11-30T04:37:25.399764252Z");
        let Err(RuntimeError::Transient(message)) = parse_started_at(&id(), Some("yesterday"))
        else {
            panic!("a bad timestamp must be an error");
        };
        assert!(
            message.contains("State.StartedAt = \"yesterday\""),
            "{message}"
        );
    }

    #[test]
    fn container_names_are_deterministic_and_checked() {
        let name = DockerRuntime::container_name(&"shop".into(), &"web".into(), "r1").unwrap();
        assert_eq!(name, "stead.shop.web.r1");
        let Err(RuntimeError::Transient(message)) =
            DockerRuntime::container_name(&"shop/../x".into(), &"web".into(), "r1")
        else {
            panic!("a bad name must be refused");
        };
        assert!(message.contains("instance = \"shop/../x\""), "{message}");
    }

    #[test]
    fn container_names_of_pairs_whose_dashed_names_collide_differ() {
        let a = DockerRuntime::container_name(&"a-api".into(), &"web".into(), "1").unwrap();
        let b = DockerRuntime::container_name(&"a".into(), &"api-web".into(), "1").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn events_and_lists_drop_containers_whose_labels_are_not_names() {
        let message = |instance: &str| EventMessage {
            action: Some("die".to_owned()),
            actor: Some(bollard::models::EventActor {
                id: Some("abc".to_owned()),
                attributes: Some(HashMap::from([
                    (LABEL_INSTANCE.to_owned(), instance.to_owned()),
                    (LABEL_SERVICE.to_owned(), "web".to_owned()),
                ])),
            }),
            ..Default::default()
        };
        assert!(parse_event(message("shop")).is_some());
        assert!(parse_event(message("x/../../config#")).is_none());
        let error = check_labelled_names("shop", "We b")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("stead.service = \"We b\""), "{error}");
    }

    #[test]
    fn grace_rounds_up_to_whole_seconds() {
        assert_eq!(grace_secs(Duration::from_millis(1500)), 2);
        assert_eq!(grace_secs(Duration::from_secs(10)), 10);
        assert_eq!(grace_secs(Duration::ZERO), 0);
    }

    fn podman_event(action: &str) -> EventMessage {
        EventMessage {
            action: Some(action.to_owned()),
            actor: Some(bollard::models::EventActor {
                id: Some("abc".to_owned()),
                attributes: Some(HashMap::from([
                    (LABEL_INSTANCE.to_owned(), "shop".to_owned()),
                    (LABEL_SERVICE.to_owned(), "web".to_owned()),
                ])),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn podman_spellings_are_read_as_dockers() {
        let action = |name: &str| parse_event(podman_event(name)).map(|e| e.action);
        assert_eq!(action("remove"), Some(RuntimeEventAction::Destroy));
        assert_eq!(action("die"), Some(RuntimeEventAction::Die));
        // A check ran; the verdict is not in the event: `events` inspects.
        assert_eq!(
            action("health_status"),
            Some(RuntimeEventAction::HealthStatus(Health::None))
        );
        assert_eq!(action("exec_died"), None);
    }

    #[test]
    fn podmans_stopping_reads_as_dockers_running() {
        let mut listed = serde_json::json!([
            {"Id": "a", "State": "stopping"},
            {"Id": "b", "State": "exited"},
            {"Id": "c", "State": "configured"},
            {"Id": "d"},
        ]);
        with_docker_states(&mut listed);
        let summaries: Vec<bollard::models::ContainerSummary> =
            serde_json::from_value(listed).expect("bollard parses it now");
        let states: Vec<_> = summaries.iter().map(|s| s.state).collect();
        use bollard::models::ContainerSummaryStateEnum as S;
        assert_eq!(
            states,
            [Some(S::RUNNING), Some(S::EXITED), Some(S::EMPTY), None]
        );
        let mut inspected =
            serde_json::json!({"Id": "a", "State": {"Status": "stopping", "Running": false}});
        with_docker_states(&mut inspected);
        let response: ContainerInspectResponse = serde_json::from_value(inspected).unwrap();
        assert_eq!(
            response.state.and_then(|s| s.status),
            Some(ContainerStateStatusEnum::RUNNING)
        );
    }

    #[test]
    fn raw_answers_and_queries() {
        let answer = b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"message\":\"no such container\"}";
        assert_eq!(
            split_response(answer),
            Some((404, &b"{\"message\":\"no such container\"}"[..]))
        );
        assert_eq!(split_response(b"garbage"), None);
        assert_eq!(
            url_encode(r#"{"label":["stead.managed=true"]}"#),
            "%7B%22label%22%3A%5B%22stead.managed%3Dtrue%22%5D%7D"
        );
    }

    #[test]
    fn a_taken_name_is_409_or_podmans_500() {
        let error = |status_code: u16, message: &str| DockerError::DockerResponseServerError {
            status_code,
            message: message.to_owned(),
        };
        assert!(name_taken(&error(
            409,
            "Conflict. The container name is already in use"
        )));
        assert!(name_taken(&error(
            500,
            "container create: creating container storage: the container name \"x\" is \
             already in use by 1326. You have to remove that container to be able to reuse \
             that name: that name is already in use"
        )));
        assert!(!name_taken(&error(500, "no space left on device")));
        assert!(!name_taken(&error(404, "that name is already in use")));
    }

    #[test]
    fn a_container_that_does_not_run_has_no_binds() {
        let response = |running: bool| ContainerInspectResponse {
            state: Some(bollard::models::ContainerState {
                status: Some(if running {
                    ContainerStateStatusEnum::RUNNING
                } else {
                    ContainerStateStatusEnum::EXITED
                }),
                ..Default::default()
            }),
            network_settings: Some(bollard::models::NetworkSettings {
                ports: Some(ports(&[("8080/tcp", &[("127.0.0.1", "43723")])])),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            binds_of(&id(), &response(true)).unwrap(),
            Binds::from([(8080, 43723)])
        );
        assert_eq!(binds_of(&id(), &response(false)).unwrap(), Binds::new());
    }

    #[test]
    fn health_events_carry_their_verdict() {
        let message = EventMessage {
            action: Some("health_status: unhealthy".to_owned()),
            actor: Some(bollard::models::EventActor {
                id: Some("abc".to_owned()),
                attributes: Some(HashMap::from([
                    (LABEL_INSTANCE.to_owned(), "shop".to_owned()),
                    (LABEL_SERVICE.to_owned(), "web".to_owned()),
                ])),
            }),
            ..Default::default()
        };
        let event = parse_event(message).unwrap();
        assert_eq!(
            event.action,
            RuntimeEventAction::HealthStatus(Health::Unhealthy)
        );
        assert_eq!(event.instance.as_str(), "shop");
    }
}
