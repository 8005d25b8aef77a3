//! The probe port's contract, run against the in-memory double and the
//! real probes alike (issue #44, "doubles that cannot lie"): HTTP and TCP
//! against real loopback listeners, the log probe against a real container
//! on dockerd. The same situations must get the same verdicts and error
//! kinds: the kind decides whether a failed upgrade's probe is retried
//! (`unavailable`, `not_ready`) or fails the task at once (`refused`).
//!
//! Documented differences (docs/simulation.md, "The port contracts"):
//! - A backend that answers HTTP 500 is `not_ready` for the real probe;
//!   the double knows no HTTP status, so a container that is not ready is
//!   `unavailable` to it. Both are retried alike; neither passes.
//! - With no probe (`none`) the real probe passes without a look; the
//!   double passes only the execution the container still runs, as if a
//!   probe were set. The simulation renders no probe and relies on the
//!   double to stand for the one a catalog would set.

// Real listeners and a real container, waited on by the wall clock.
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::sync::Arc;
use std::time::Duration;

use stead::adapters::docker::{DockerRuntime, LABEL_INSTANCE};
use stead::adapters::probe::{NetAndLogProbe, NetProbe};
use stead::core::spec::ReadinessProbe;
use stead::core::types::{Binds, ContainerId, GenerationKey, Timestamp};
use stead::ports::{PortFailure, Probe, ProbeTarget, Runtime};
use stead_testkit::ports::{Hooks, ManualClock, MemoryProbe, MemoryRuntime};
use support_services::docker::{create_request, docker, httpd_spec, runtime};
use support_services::{free_port, unique};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PORT: u16 = 8080;
const GRACE: Duration = Duration::from_secs(1);

/// What the backend behind the probed binds does.
#[derive(Clone, Copy, Debug)]
enum Backend {
    /// Serves: HTTP 200, and accepts connections.
    Serving,
    /// Answers HTTP 500 (the double: a container that is not ready).
    Erroring,
    /// Accepts connections and never answers (the double: not ready).
    Silent,
    /// Nothing listens (the double: the container exited).
    Refusing,
}

/// How the probed target differs from the backend's own binds.
#[derive(Clone, Copy, Debug)]
enum Aim {
    AsIs,
    /// The target has no binds at all (the runtime reports none for a
    /// container that does not run).
    NoBinds,
    /// The probe's port has no bind; another port has.
    OtherPort,
}

fn http(path: &str) -> ReadinessProbe {
    ReadinessProbe::Http {
        port: PORT,
        path: path.to_owned(),
        timeout: Duration::from_millis(300),
        interval: Duration::from_millis(50),
        attempts_max: 2,
    }
}

fn tcp() -> ReadinessProbe {
    ReadinessProbe::Tcp {
        port: PORT,
        timeout: Duration::from_millis(300),
        interval: Duration::from_millis(50),
        attempts_max: 2,
    }
}

/// The net contract: each probe of a backend with the verdict every
/// implementation must give, and the double's where it documentedly
/// differs.
fn net_contract() -> Vec<(
    ReadinessProbe,
    Backend,
    Aim,
    &'static str,
    Option<&'static str>,
)> {
    use Aim::*;
    use Backend::*;
    vec![
        (http("/ready"), Serving, AsIs, "ok", None),
        (tcp(), Serving, AsIs, "ok", None),
        (
            http("/ready"),
            Erroring,
            AsIs,
            "not_ready",
            Some("unavailable"),
        ),
        // A timeout and a refusal are the same kind: nothing answered.
        (http("/ready"), Silent, AsIs, "unavailable", None),
        (http("/ready"), Refusing, AsIs, "unavailable", None),
        (tcp(), Refusing, AsIs, "unavailable", None),
        // Misconfigured: failing again is certain until the catalog
        // changes, so the kind is permanent.
        (http("/ready"), Serving, NoBinds, "refused", None),
        (tcp(), Serving, OtherPort, "refused", None),
        (http("ready"), Serving, AsIs, "refused", None),
        (ReadinessProbe::None, Serving, AsIs, "ok", None),
        (
            ReadinessProbe::None,
            Refusing,
            AsIs,
            "ok",
            Some("unavailable"),
        ),
    ]
}

fn aimed(target: ProbeTarget, aim: Aim) -> ProbeTarget {
    match aim {
        Aim::AsIs => target,
        Aim::NoBinds => ProbeTarget {
            binds: Binds::new(),
            ..target
        },
        Aim::OtherPort => ProbeTarget {
            binds: target
                .binds
                .values()
                .map(|host| (PORT + 1, *host))
                .collect(),
            ..target
        },
    }
}

fn verdict(result: Result<(), stead::ports::ProbeError>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => e.kind().to_string(),
    }
}

fn check(answers: Vec<(String, String)>, what: &str) {
    let broken: Vec<String> = answers
        .iter()
        .enumerate()
        .filter(|(_, (got, want))| got != want)
        .map(|(n, (got, want))| format!("call {n}: answered {got:?}, the contract says {want:?}"))
        .collect();
    assert!(
        broken.is_empty(),
        "the {what} contract is broken:\n{}",
        broken.join("\n")
    );
}

// --- net probes -------------------------------------------------------------

/// A loopback listener answering every request with `status`, or, with
/// `None`, accepting and never answering. Returns its port.
async fn listener(status: Option<u16>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(code) = status else {
                    // Hold the connection open, silent, until the test ends.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(stream);
                    return;
                };
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let response =
                    format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    port
}

async fn real_target(backend: Backend) -> ProbeTarget {
    let port = match backend {
        Backend::Serving => listener(Some(200)).await,
        Backend::Erroring => listener(Some(500)).await,
        Backend::Silent => listener(None).await,
        Backend::Refusing => free_port(),
    };
    ProbeTarget {
        container: ContainerId::new("real-listener"),
        started_at: Some(Timestamp::UNIX_EPOCH),
        binds: Binds::from([(PORT, port)]),
    }
}

/// The double's container for `backend`, created in `runtime`.
async fn double_target(runtime: &MemoryRuntime, n: usize, backend: Backend) -> ProbeTarget {
    let mut spec = httpd_spec(&format!("svc{n}"));
    spec.ports = vec![PORT];
    let id = runtime
        .create(&create_request("probe-contract", spec, "r1"))
        .await
        .expect("create");
    let c = runtime.container(&id).expect("created");
    let target = ProbeTarget {
        container: id.clone(),
        started_at: c.started_at,
        binds: c.binds.clone(),
    };
    match backend {
        Backend::Serving => {}
        Backend::Erroring | Backend::Silent => {
            runtime.with_containers(|cs| cs.get_mut(&id).expect("there").ready = false);
        }
        Backend::Refusing => {
            let key = GenerationKey {
                instance: c.instance.clone(),
                service: c.service.clone(),
                container: id,
            };
            runtime.stop(&key, GRACE).await.expect("stop");
        }
    }
    target
}

#[tokio::test]
async fn the_memory_double_keeps_the_net_probe_contract() {
    let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
    let runtime = Arc::new(MemoryRuntime::new(clock, Hooks::default()));
    let probe = MemoryProbe::new(runtime.clone(), Hooks::default());
    let mut answers = Vec::new();
    for (n, (kind, backend, aim, answer, double)) in net_contract().into_iter().enumerate() {
        let target = aimed(double_target(&runtime, n, backend).await, aim);
        let got = verdict(probe.ready(&kind, &target).await);
        answers.push((got, double.unwrap_or(answer).to_owned()));
    }
    check(answers, "net probe");
}

#[tokio::test]
async fn the_net_probe_keeps_the_net_probe_contract() {
    let probe = NetProbe::new().expect("client");
    let mut answers = Vec::new();
    for (kind, backend, aim, answer, _) in net_contract() {
        let target = aimed(real_target(backend).await, aim);
        let got = verdict(probe.ready(&kind, &target).await);
        answers.push((got, answer.to_owned()));
    }
    check(answers, "net probe");
}

// --- the log probe ----------------------------------------------------------

/// The first execution prints two lines, every later one another.
const FIRST_RUN_ONLY: &str = "first-run-only";
const READY: &str = "ready now";
const AGAIN: &str = "started again";
const SCRIPT: &str = "if [ -e /tmp/ran ]; then echo started again; exec sleep 600; fi; \
                      echo > /tmp/ran; echo first-run-only; echo ready now; exec sleep 600";

fn log(pattern: &str, timeout_ms: u64) -> ReadinessProbe {
    ReadinessProbe::Log {
        pattern: pattern.to_owned(),
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// One step of the log contract.
enum Step {
    /// Probes the first (`1`) or second (`2`) execution.
    Probe(u8, ReadinessProbe),
    /// Probes the first execution as a runtime that reported no start.
    ProbeUnstarted(ReadinessProbe),
    /// Restarts the container: the second execution.
    Restart,
    Remove,
}

fn log_contract() -> Vec<(Step, &'static str)> {
    use Step::*;
    vec![
        (Probe(1, log(READY, 5_000)), "ok"),
        (Probe(1, log("never printed", 1_000)), "not_ready"),
        (Probe(1, log("", 1_000)), "refused"),
        (ProbeUnstarted(log(READY, 1_000)), "not_ready"),
        (Restart, "ok"),
        (Probe(2, log(AGAIN, 5_000)), "ok"),
        // An earlier execution's line never counts.
        (Probe(2, log(FIRST_RUN_ONLY, 1_000)), "not_ready"),
        // Nor does a line probed for an execution that is over.
        (Probe(1, log(READY, 1_000)), "not_ready"),
        (Remove, "ok"),
        (Probe(2, log(AGAIN, 1_000)), "not_ready"),
    ]
}

/// Runs the log contract against `probe` over `runtime`, whose container
/// `id` of generation `key` is in its first execution; `printed` makes the
/// double's container print what the script would (the real one prints by
/// itself).
async fn run_log_contract(
    probe: &dyn Probe,
    runtime: &dyn Runtime,
    key: &GenerationKey,
    printed: &dyn Fn(&str),
) {
    let target = |observation: stead::core::types::Observation| ProbeTarget {
        container: key.container.clone(),
        started_at: observation.started_at,
        binds: Binds::new(),
    };
    let first = target(runtime.inspect(&key.container).await.expect("inspect"));
    printed(FIRST_RUN_ONLY);
    printed(READY);
    let mut second = None;
    let mut answers = Vec::new();
    for (step, answer) in log_contract() {
        let got = match step {
            Step::Probe(execution, kind) => {
                let target = if execution == 1 {
                    &first
                } else {
                    second.as_ref().expect("restarted")
                };
                verdict(probe.ready(&kind, target).await)
            }
            Step::ProbeUnstarted(kind) => {
                let unstarted = ProbeTarget {
                    started_at: None,
                    ..first.clone()
                };
                verdict(probe.ready(&kind, &unstarted).await)
            }
            Step::Restart => {
                runtime
                    .restart(&key.container, GRACE)
                    .await
                    .expect("restart");
                printed(AGAIN);
                second = Some(target(
                    runtime.inspect(&key.container).await.expect("inspect"),
                ));
                "ok".to_owned()
            }
            Step::Remove => {
                runtime.remove(key).await.expect("remove");
                "ok".to_owned()
            }
        };
        answers.push((got, answer.to_owned()));
    }
    check(answers, "log probe");
}

fn log_spec() -> stead::core::spec::ServiceSpec {
    let mut spec = httpd_spec("talker");
    spec.command = ["sh", "-c", SCRIPT].map(str::to_owned).to_vec();
    spec.ports = Vec::new();
    spec.healthcheck = None;
    spec
}

#[tokio::test]
async fn the_memory_double_keeps_the_log_probe_contract() {
    let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
    let runtime = Arc::new(MemoryRuntime::new(clock, Hooks::default()));
    let probe = MemoryProbe::new(runtime.clone(), Hooks::default());
    let request = create_request("probe-contract", log_spec(), "r1");
    let id = runtime.create(&request).await.expect("create");
    let key = GenerationKey {
        instance: request.instance.clone(),
        service: request.spec.name.clone(),
        container: id.clone(),
    };
    let print = |line: &str| assert!(runtime.print(&id, line), "printed");
    run_log_contract(&probe, runtime.as_ref(), &key, &print).await;
}

/// Removes the instance's containers on drop, and nothing else.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_INSTANCE}={}", self.0);
        let ids = docker(&["ps", "-aq", "--filter", &filter]).unwrap_or_default();
        for id in ids.split_whitespace() {
            let _ = docker(&["rm", "-f", id]);
        }
    }
}

#[tokio::test]
async fn the_docker_log_probe_keeps_the_log_probe_contract() {
    let runtime: DockerRuntime = runtime().await;
    let probe = NetAndLogProbe::new(NetProbe::new().expect("client"), runtime.clone());
    let instance = unique("pc");
    let _cleanup = Cleanup(instance.clone());
    let request = create_request(&instance, log_spec(), "r1");
    let id = runtime.create(&request).await.expect("create");
    let key = GenerationKey {
        instance: request.instance.clone(),
        service: request.spec.name.clone(),
        container: id,
    };
    run_log_contract(&probe, &runtime, &key, &|_| {}).await;
}
