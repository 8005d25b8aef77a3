//! What a steady recovery pass costs against the real Docker engine: API
//! calls and wall time of `list_managed` over many labelled containers.
//! Printed figures, not a timed test (DESIGN.md §8, issue item 11).
//!
//!     scripts/services up && cargo bench --bench docker_pass
//!
//! `STEAD_BENCH_CONTAINERS` sets the fleet size (default 200). Outside
//! `cargo bench` (e.g. `cargo test --all-targets`) it only says how to run.

// A benchmark measures wall time.
#![allow(clippy::disallowed_methods)]

use std::process::Command;
use std::time::{Duration, Instant};

use stead::adapters::docker::{DockerConfig, DockerRuntime, LABEL_INSTANCE};
use stead::core::spec::{ReadinessProbe, ServiceSpec};
use stead::core::types::{InstanceName, ServiceName};
use stead::ports::{CreateContainer, Runtime};

const CONTAINERS_DEFAULT: usize = 200;
const CONTAINERS_MAX: usize = 2_000;
const PASSES: usize = 20;
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
        let filter = format!("label={LABEL_INSTANCE}={}", self.0);
        let ids = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let ids: Vec<&str> = ids.split_whitespace().collect();
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
    let instance = format!("bench{}", std::process::id());
    let _cleanup = Cleanup(instance.clone());

    let began = Instant::now();
    for i in 0..n_containers {
        let request = CreateContainer {
            instance: InstanceName::new(instance.as_str()),
            spec: ServiceSpec {
                name: ServiceName::new(format!("s{i}")),
                image: IMAGE.to_owned(),
                command: ["sleep", "3600"].map(str::to_owned).to_vec(),
                ports: Vec::new(),
                healthcheck: None,
                readiness: ReadinessProbe::None,
                stop_grace: Duration::ZERO,
            },
            revision: "r1".to_owned(),
        };
        docker.create(&request).await.expect("create");
    }
    println!(
        "created {n_containers} containers in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    let mut durations = Vec::with_capacity(PASSES);
    let calls_before = docker.api_call_count();
    for _ in 0..PASSES {
        let began = Instant::now();
        let listed = docker.list_managed().await.expect("list");
        durations.push(began.elapsed());
        let mine = listed
            .iter()
            .filter(|c| c.instance.as_str() == instance)
            .count();
        assert_eq!(mine, n_containers, "every container is listed");
    }
    let calls = docker.api_call_count() - calls_before;
    durations.sort();
    let p50 = durations[durations.len() / 2];
    let max = durations[durations.len() - 1];
    println!(
        "steady pass over {n_containers} containers: {} Docker API call(s) per pass; \
         list_managed wall time p50 {:.1} ms, max {:.1} ms ({PASSES} passes)",
        calls as f64 / PASSES as f64,
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
    );
}
