//! What a steady recovery pass costs against the real Docker engine: the
//! real `Recoverer` over many labelled containers (one service each, every
//! other port in memory), Docker API calls and wall time per pass, with the
//! event stream followed (reads served from the adapter's cache, checked by
//! one list call) against a baseline in the same process with polling only
//! (every read inspects). Printed figures, not a timed test.
//!
//!     scripts/services up && cargo bench --bench docker_pass
//!
//! `STEAD_BENCH_CONTAINERS` sets the fleet size (default 200). Outside
//! `cargo bench` (e.g. `cargo test --all-targets`) it only says how to run.

// A benchmark measures wall time.
#![allow(clippy::disallowed_methods)]

use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::Arc;

use stead::adapters::docker::{DockerConfig, DockerRuntime, LABEL_INSTANCE};
use stead::adapters::probe::NetProbe;
use stead::core::policy::LEASE_MARGIN;
use stead::core::spec::{ReadinessProbe, ServiceSpec};
use stead::core::types::{ActiveService, InstanceName, ServiceName};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::{Ports, SystemClock};
use stead::ports::{Clock, CreateContainer, NewInstance, Runtime, Store};
use stead_testkit::ports::{Hooks, MemoryNotifier, MemoryPolicy, MemoryProvisioner, MemoryTraffic};
use stead_testkit::store::MemoryStore;

const CONTAINERS_DEFAULT: usize = 200;
const CONTAINERS_MAX: usize = 2_000;
const PASSES: usize = 10;
const IMAGE: &str = "stead-test/busybox:1";

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("docker_pass: run it with `cargo bench --bench docker_pass`");
        return;
    }
    let n_containers = std::env::var("STEAD_BENCH_CONTAINERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(CONTAINERS_DEFAULT)
        .clamp(1, CONTAINERS_MAX);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(bench(n_containers));
}

/// Removes the bench's containers even when the bench panics.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Every container of this run carries an instance label starting
        // with the run's prefix; the CLI filters labels by exact value, so
        // list every managed one and keep ours.
        let format = format!("{{{{.ID}}}} {{{{.Label \"{LABEL_INSTANCE}\"}}}}");
        let ids = Command::new("docker")
            .args(["ps", "-a", "--format", &format])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let prefix = format!("{}-", self.0);
        let ids: Vec<&str> = ids
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter(|(_, instance)| instance.starts_with(&prefix))
            .map(|(id, _)| id)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(&ids)
                .output();
        }
    }
}

async fn bench(n_containers: usize) {
    let docker = DockerRuntime::connect(DockerConfig::default())
        .await
        .unwrap_or_else(|e| panic!("dockerd is not reachable ({e}); run `scripts/services up`"));
    let instance_prefix = format!("bench{}", std::process::id());
    let _cleanup = Cleanup(instance_prefix.clone());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(MemoryStore::new());

    let began = Instant::now();
    for i in 0..n_containers {
        // One instance per container, all sharing the label the cleanup
        // filters on through their instance name's prefix.
        let instance = InstanceName::new(format!("{instance_prefix}-{i}"));
        let spec = ServiceSpec {
            name: ServiceName::new("s"),
            image: IMAGE.to_owned(),
            command: ["sleep", "3600"].map(str::to_owned).to_vec(),
            ports: Vec::new(),
            healthcheck: None,
            readiness: ReadinessProbe::None,
            stop_grace: Duration::ZERO,
            update: Default::default(),
            domains: Vec::new(),
            tenant_domains: false,
            run: Default::default(),
        };
        let request = CreateContainer {
            instance: instance.clone(),
            instance_id: 1,
            env: Vec::new(),
            spec,
            revision: "r1".to_owned(),
        };
        let id = docker.create(&request).await.expect("create");
        let now = clock.now();
        store
            .create_instance(
                &NewInstance {
                    domains: Vec::new(),
                    spec_digest: None,
                    parameters: Default::default(),
                    name: instance.clone(),
                    team: "bench".into(),
                    service_type: "bench".into(),
                    version: "1".into(),
                    expires_at: None,
                    maintenance_window: None,
                },
                now,
            )
            .await
            .expect("instance row");
        let active = ActiveService {
            container: id,
            effective_revision: "r1".into(),
            binds: Default::default(),
            stop_grace: Some(Duration::ZERO),
            verified_started_at: None,
        };
        store
            .save_active_service(&instance, &ServiceName::new("s"), &active)
            .await
            .expect("ACTIVE");
    }
    println!(
        "created {n_containers} containers in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    let hooks = Hooks::default();
    let ports = Ports {
        clock: clock.clone(),
        runtime: Arc::new(docker.clone()),
        traffic: Arc::new(MemoryTraffic::new(hooks.clone())),
        store,
        probe: Arc::new(NetProbe::new().expect("probe client")),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: Arc::new(MemoryProvisioner::new("stead", hooks.clone())),
        notifier: Arc::new(MemoryNotifier::new(hooks)),
    };
    let store = ports.store.clone();
    let recoverer = Recoverer::new(
        ports,
        Default::default(),
        Default::default(),
        Arc::new(InstanceLocks::new(store)),
        "bench#1/recovery".into(),
        Arc::new(LeaseGuard::new(
            "bench#1".into(),
            Duration::from_secs(600),
            LEASE_MARGIN,
        )),
    );

    // Baseline: polling only, every read is an inspect.
    let polling = measure(&recoverer, &docker).await;
    // Events followed, as the daemon does by default.
    let following = tokio::spawn(docker.clone().follow_into_cache(clock.now()));
    let cached = measure(&recoverer, &docker).await;
    following.abort();

    for (mode, (calls, p50, max)) in [("polling only", polling), ("events on   ", cached)] {
        println!(
            "{mode}  steady pass over {n_containers} containers: {calls:.1} Docker API calls; \
             wall p50 {:.1} ms, max {:.1} ms ({PASSES} passes)",
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
        );
    }
    println!(
        "events on / polling only: {:.3} of the API calls, {:.2} of the wall time",
        cached.0 / polling.0,
        cached.1.as_secs_f64() / polling.1.as_secs_f64()
    );
}

/// One warm-up pass (fills the cache, publishes), then `PASSES` timed
/// steady passes: (API calls per pass, p50, max).
async fn measure(recoverer: &Recoverer, docker: &DockerRuntime) -> (f64, Duration, Duration) {
    let warm = recoverer.pass().await;
    assert_eq!(warm.error_count(), 0, "warm-up pass: {:?}", warm.errors);
    let calls_before = docker.api_call_count();
    let mut durations = Vec::with_capacity(PASSES);
    for _ in 0..PASSES {
        let began = Instant::now();
        let outcome = recoverer.pass().await;
        durations.push(began.elapsed());
        assert_eq!(outcome.error_count(), 0, "steady pass failed");
        let intervened = outcome
            .outcomes()
            .flat_map(|i| &i.reports)
            .filter(|r| r.intervened)
            .count();
        assert_eq!(intervened, 0, "a steady pass touches nothing");
    }
    let calls = (docker.api_call_count() - calls_before) as f64 / PASSES as f64;
    durations.sort();
    (calls, durations[PASSES / 2], durations[PASSES - 1])
}
