//! The runtime port's contract, run against the in-memory double and the
//! real Docker adapter on dockerd and on Podman's compatible API alike:
//! the same calls must get the same answers and error kinds, and leave the
//! same containers (issue #44, "doubles that cannot lie"). The simulation
//! and the engine's tests run on the double, so whatever it answers that
//! the real runtimes do not is a behaviour no test of theirs would catch.
//!
//! Documented differences (docs/simulation.md, "The port contracts"):
//! - The double's container IDs are the deterministic names, so a
//!   container created again under a removed one's name gets its ID back;
//!   Docker and Podman give it a new one. The contract's last call shows it.
//! - Health is compared as "checked" (starting or healthy) or "none": the
//!   real engines run the healthcheck on their own clock, the double's
//!   health moves only when the simulation's workload model moves it.
//! - Exit codes are not compared: the double reports 143 for a stop, the
//!   real engines whatever the process did with the signal.

// These tests talk to real engines and name their containers after the
// wall clock (support_services::unique).
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use stead::adapters::docker::{DockerConfig, DockerRuntime, LABEL_INSTANCE};
use stead::core::types::{
    ContainerId, ContainerStatus, GenerationKey, Health, InstanceName, ServiceName, Timestamp,
};
use stead::ports::{PortFailure, Runtime};
use stead_testkit::ports::{Hooks, ManualClock, MemContainer, MemoryRuntime};
use support_services::docker::{create_request, httpd_spec, TEST_IMAGE};
use support_services::unique;

const GRACE: Duration = Duration::from_secs(1);
const DOCKERD_SOCKET: &str = "/var/run/docker.sock";
/// Podman's Docker-compatible API, as `scripts/services up` serves it.
const PODMAN_SOCKET_DEFAULT: &str = "/run/podman/podman.sock";

/// One call of the contract. Containers are named by `service.revision`
/// (the ID each implementation gave it is looked up); `ghost.r1` never
/// existed.
enum Call {
    /// Creates the service's container at revision `r1`.
    Create(&'static str, Healthcheck),
    Inspect(&'static str),
    Start(&'static str),
    Stop(&'static str),
    Restart(&'static str),
    Remove(&'static str),
    /// Stop and remove naming the container as another service's
    /// generation: a row that points at the wrong container.
    StopAs(&'static str, &'static str),
    RemoveAs(&'static str, &'static str),
    Health(&'static str),
    Binds(&'static str),
    /// The contract instance's containers, as `service:status`, sorted;
    /// a listing that reports execution starts says so.
    List,
    /// Set-up, not a port call: a container stead did not create takes
    /// the name stead would give the service's container at `r1`.
    Squat(&'static str),
}

/// Whether a created container has a healthcheck (the runtime runs it).
#[derive(Clone, Copy)]
enum Healthcheck {
    With,
    Without,
}

/// The calls, each with the answer every implementation must give:
/// - create: `ok new` (an ID not seen before for it) or `ok same`;
/// - inspect: the status and whether the execution is `new` or the `same`
///   as at the last inspect;
/// - binds: the container ports bound to a host port (none while down);
/// - health: `checked` (starting or healthy), `unhealthy` or `none`;
/// - otherwise `ok`, or the error's kind.
///
/// `a | b` accepts either answer, where the real engines differ between
/// themselves.
fn contract() -> Vec<(Call, &'static str)> {
    use Call::*;
    use Healthcheck::*;
    vec![
        (List, ""),
        (Create("web", With), "ok new"),
        // Idempotent on the deterministic name.
        (Create("web", With), "ok same"),
        (Create("worker", Without), "ok new"),
        (Inspect("web.r1"), "running new"),
        (Inspect("web.r1"), "running same"),
        (Binds("web.r1"), "8080"),
        (Health("web.r1"), "checked"),
        (Health("worker.r1"), "none"),
        (List, "web:running worker:running"),
        // Starting a running container changes nothing: the same execution.
        (Start("web.r1"), "ok"),
        (Inspect("web.r1"), "running same"),
        (Stop("web.r1"), "ok"),
        // A stopped container keeps its last execution's start, and has no
        // binds (Docker frees its host ports; Podman keeps them, unused).
        (Inspect("web.r1"), "exited same +exit"),
        (Binds("web.r1"), ""),
        // A stopped container's health is the engine's own: Docker says
        // unhealthy, Podman and the double keep the last verdict. No
        // decision reads it (R9 reads health only of a running container).
        (Health("web.r1"), "checked | unhealthy"),
        // Stopping a stopped container succeeds.
        (Stop("web.r1"), "ok"),
        (List, "web:exited worker:running"),
        // Creating an existing container that ran and exited adopts it and
        // leaves it down: starting it is the recovery pass's, under its
        // budget.
        (Create("web", With), "ok same"),
        (Inspect("web.r1"), "exited same +exit"),
        (Start("web.r1"), "ok"),
        (Inspect("web.r1"), "running new"),
        (Binds("web.r1"), "8080"),
        (Restart("web.r1"), "ok"),
        (Inspect("web.r1"), "running new"),
        // Restarting a stopped container starts it.
        (Stop("worker.r1"), "ok"),
        (Restart("worker.r1"), "ok"),
        (Inspect("worker.r1"), "running new"),
        // The wrong generation is refused and left alone.
        (StopAs("web.r1", "worker"), "refused"),
        (RemoveAs("web.r1", "worker"), "refused"),
        (Inspect("web.r1"), "running same"),
        // A taken name is adopted only when the labels say it is this very
        // container; another's is refused (a fault that may pass once an
        // operator removes it), never adopted.
        (Squat("db"), "ok"),
        (Create("db", Without), "transient"),
        (Remove("web.r1"), "ok"),
        (Inspect("web.r1"), "not_found"),
        // Removing what is gone succeeds: safe to run twice.
        (Remove("web.r1"), "ok"),
        (Start("web.r1"), "not_found"),
        (Stop("web.r1"), "not_found"),
        (Restart("web.r1"), "not_found"),
        (Health("web.r1"), "not_found"),
        (Binds("web.r1"), "not_found"),
        (Inspect("ghost.r1"), "not_found"),
        (Start("ghost.r1"), "not_found"),
        (Remove("ghost.r1"), "ok"),
        (List, "worker:running"),
        // Created again under the removed container's name: a new
        // execution; the ID is the documented difference (see
        // `created_again`).
        (Create("web", With), "created again"),
        (Inspect("web.r1"), "running new"),
    ]
}

/// Which side of the contract a run is on, where they documentedly differ.
#[derive(Clone, Copy)]
enum Implementation {
    Double,
    Engine,
}

/// What a container created again under a removed one's name answers:
/// the double reuses the ID (its IDs are names), the engines do not.
fn created_again(subject: Implementation) -> &'static str {
    if matches!(subject, Implementation::Double) {
        "ok same"
    } else {
        "ok new"
    }
}

fn expected(subject: Implementation) -> Vec<String> {
    contract()
        .into_iter()
        .map(|(_, answer)| match answer {
            "created again" => created_again(subject).to_owned(),
            other => other.to_owned(),
        })
        .collect()
}

/// How one implementation sets up what is not a port call.
trait Subject {
    fn runtime(&self) -> &dyn Runtime;
    /// A container stead did not create takes `name`.
    fn squat(&self, name: &str);
}

/// One run of the contract: the instance it works in, the ID each
/// container got, and the execution each inspect last saw.
struct Run<'a> {
    subject: &'a dyn Subject,
    instance: String,
    ids: BTreeMap<String, ContainerId>,
    seen: BTreeMap<String, Option<Timestamp>>,
}

impl Run<'_> {
    fn id(&self, container: &str) -> ContainerId {
        self.ids.get(container).cloned().unwrap_or_else(|| {
            // Never created: the name it would have, which nothing holds.
            let (service, revision) = container.split_once('.').expect("service.revision");
            ContainerId::new(format!("stead.{}.{service}.{revision}", self.instance))
        })
    }

    fn key(&self, container: &str, service: &str) -> GenerationKey {
        GenerationKey {
            instance: InstanceName::new(&self.instance),
            service: ServiceName::new(service),
            container: self.id(container),
        }
    }

    fn own_key(&self, container: &str) -> GenerationKey {
        let (service, _) = container.split_once('.').expect("service.revision");
        self.key(container, service)
    }

    async fn call(&mut self, call: &Call) -> String {
        let runtime = self.subject.runtime();
        let done = |result: Result<(), stead::core::types::RuntimeError>| match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.kind().to_string(),
        };
        match *call {
            Call::Create(service, healthcheck) => {
                let mut spec = httpd_spec(service);
                if matches!(healthcheck, Healthcheck::Without) {
                    spec.healthcheck = None;
                }
                let request = create_request(&self.instance, spec, "r1");
                match runtime.create(&request).await {
                    Ok(id) => {
                        let known = self.ids.insert(format!("{service}.r1"), id.clone());
                        if known.as_ref() == Some(&id) {
                            "ok same".to_owned()
                        } else {
                            "ok new".to_owned()
                        }
                    }
                    Err(e) => e.kind().to_string(),
                }
            }
            Call::Inspect(container) => match runtime.inspect(&self.id(container)).await {
                Ok(observation) => {
                    let last = self
                        .seen
                        .insert(container.to_owned(), observation.started_at);
                    let execution = match (observation.started_at, last) {
                        (None, _) => "never",
                        (now, Some(before)) if now == before => "same",
                        _ => "new",
                    };
                    // How the last execution ended is reported while the
                    // container is down, and only then.
                    let exit = if observation.exit.is_some() {
                        " +exit"
                    } else {
                        ""
                    };
                    format!("{} {execution}{exit}", status_word(observation.status))
                }
                Err(e) => e.kind().to_string(),
            },
            Call::Start(container) => done(runtime.start(&self.id(container)).await),
            Call::Stop(container) => done(runtime.stop(&self.own_key(container), GRACE).await),
            Call::Restart(container) => done(runtime.restart(&self.id(container), GRACE).await),
            Call::Remove(container) => done(runtime.remove(&self.own_key(container)).await),
            Call::StopAs(container, service) => {
                done(runtime.stop(&self.key(container, service), GRACE).await)
            }
            Call::RemoveAs(container, service) => {
                done(runtime.remove(&self.key(container, service)).await)
            }
            Call::Health(container) => match runtime.health(&self.id(container)).await {
                Ok(Health::None) => "none".to_owned(),
                Ok(Health::Starting | Health::Healthy) => "checked".to_owned(),
                Ok(Health::Unhealthy) => "unhealthy".to_owned(),
                Err(e) => e.kind().to_string(),
            },
            Call::Binds(container) => match runtime.binds(&self.id(container)).await {
                Ok(binds) => {
                    assert!(
                        binds.values().all(|host| *host != 0),
                        "a bind to host port 0: {binds:?}"
                    );
                    let ports: Vec<String> = binds.keys().map(u16::to_string).collect();
                    ports.join(" ")
                }
                Err(e) => e.kind().to_string(),
            },
            Call::List => match runtime.list_managed().await {
                Ok(listed) => {
                    let mut mine: Vec<String> = listed
                        .iter()
                        .filter(|c| c.instance.as_str() == self.instance)
                        .map(|c| format!("{}:{}", c.service, status_word(c.status)))
                        .collect();
                    mine.sort();
                    // Docker's list carries no execution start: nothing may
                    // come to depend on one.
                    if listed.iter().any(|c| c.started_at.is_some()) {
                        mine.push("(with starts)".to_owned());
                    }
                    mine.join(" ")
                }
                Err(e) => e.kind().to_string(),
            },
            Call::Squat(service) => {
                self.subject
                    .squat(&format!("stead.{}.{service}.r1", self.instance));
                "ok".to_owned()
            }
        }
    }
}

fn status_word(status: ContainerStatus) -> String {
    format!("{status:?}").to_ascii_lowercase()
}

/// Runs the contract in a fresh instance, returning each call's answer
/// beside the call's index, so a mismatch names the call.
async fn run(subject: &dyn Subject, instance: &str) -> Vec<String> {
    let mut run = Run {
        subject,
        instance: instance.to_owned(),
        ids: BTreeMap::new(),
        seen: BTreeMap::new(),
    };
    let mut answers = Vec::new();
    for (call, _) in contract() {
        answers.push(run.call(&call).await);
    }
    answers
}

fn assert_contract(answers: Vec<String>, subject: Implementation) {
    let expected = expected(subject);
    assert_eq!(answers.len(), expected.len());
    let broken: Vec<String> = answers
        .iter()
        .zip(&expected)
        .enumerate()
        .filter(|(_, (got, want))| !want.split(" | ").any(|w| w == got.as_str()))
        .map(|(n, (got, want))| format!("call {n}: answered {got:?}, the contract says {want:?}"))
        .collect();
    assert!(
        broken.is_empty(),
        "the runtime contract is broken:\n{}",
        broken.join("\n")
    );
}

// --- the double -------------------------------------------------------------

struct Double {
    runtime: MemoryRuntime,
}

impl Subject for Double {
    fn runtime(&self) -> &dyn Runtime {
        &self.runtime
    }

    fn squat(&self, name: &str) {
        // The nearest the double has to a container without stead's
        // labels: one whose instance and service are another's.
        self.runtime.with_containers(|containers| {
            containers.insert(
                ContainerId::new(name),
                MemContainer {
                    instance: InstanceName::new("someone-else"),
                    service: ServiceName::new("squatter"),
                    status: ContainerStatus::Created,
                    started_at: None,
                    health: Health::None,
                    binds: Default::default(),
                    ready: false,
                    status_after_start: ContainerStatus::Running,
                    stopped_on_request: false,
                    log: Default::default(),
                },
            );
        });
    }
}

#[tokio::test]
async fn the_memory_double_keeps_the_runtime_contract() {
    let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
    let double = Double {
        runtime: MemoryRuntime::new(clock, Hooks::default()),
    };
    assert_contract(run(&double, &unique("rc")).await, Implementation::Double);
}

// --- the engines --------------------------------------------------------------

/// A real engine on its Engine API socket.
struct Engine {
    runtime: DockerRuntime,
    socket: PathBuf,
    /// Containers made by hand (`Squat`), removed with the instance's.
    squatters: std::sync::Mutex<Vec<String>>,
    instance: String,
}

impl Engine {
    async fn connect(socket: &Path, instance: &str) -> Engine {
        let runtime = DockerRuntime::connect(DockerConfig {
            socket_path: socket.to_owned(),
            // Podman 4 cannot wall lone services apart; its operators run
            // with isolation off (docs/operations.md, "Podman").
            isolation: if socket != Path::new(DOCKERD_SOCKET) {
                stead::adapters::docker::Isolation::Off
            } else {
                stead::adapters::docker::Isolation::Shared
            },
            ..DockerConfig::default()
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the engine at {} is not reachable ({e}); run `scripts/services up` first",
                socket.display()
            )
        });
        let engine = Engine {
            runtime,
            socket: socket.to_owned(),
            squatters: Default::default(),
            instance: instance.to_owned(),
        };
        assert!(
            engine
                .docker(&["image", "inspect", "--format", "{{.Id}}", TEST_IMAGE])
                .is_ok(),
            "test image {TEST_IMAGE} is missing on {}; run `scripts/services up` first",
            socket.display()
        );
        engine
    }

    /// The docker CLI against this engine, with an argument vector.
    fn docker(&self, args: &[&str]) -> Result<String, String> {
        support_services::docker::docker_at(Some(&self.socket), args)
    }
}

impl Subject for Engine {
    fn runtime(&self) -> &dyn Runtime {
        &self.runtime
    }

    fn squat(&self, name: &str) {
        self.docker(&["create", "--name", name, TEST_IMAGE, "sleep", "600"])
            .unwrap_or_else(|e| panic!("create the squatter {name}: {e}"));
        self.squatters
            .lock()
            .expect("squatters")
            .push(name.to_owned());
    }
}

impl Drop for Engine {
    /// Removes this run's containers (labelled with its instance) and its
    /// squatters, and nothing else.
    fn drop(&mut self) {
        let filter = format!("label={LABEL_INSTANCE}={}", self.instance);
        let ids = self
            .docker(&["ps", "-aq", "--filter", &filter])
            .unwrap_or_default();
        let mut targets: Vec<String> = ids.split_whitespace().map(str::to_owned).collect();
        targets.extend(self.squatters.lock().expect("squatters").drain(..));
        if !targets.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(targets.iter().map(String::as_str));
            let _ = self.docker(&args);
        }
    }
}

async fn engine_keeps_the_contract(socket: &Path) {
    let instance = unique("rc");
    let engine = Engine::connect(socket, &instance).await;
    assert_contract(run(&engine, &instance).await, Implementation::Engine);
}

#[tokio::test]
async fn dockerd_keeps_the_runtime_contract() {
    engine_keeps_the_contract(Path::new(DOCKERD_SOCKET)).await;
}

#[tokio::test]
async fn podman_keeps_the_runtime_contract() {
    let socket =
        std::env::var("STEAD_PODMAN_SOCKET").unwrap_or_else(|_| PODMAN_SOCKET_DEFAULT.to_owned());
    engine_keeps_the_contract(Path::new(&socket)).await;
}
