//! Crash-to-withdrawn and crash-to-republished latency against real
//! dockerd and Caddy: kill the served container N times through the Engine
//! API (`POST /containers/{id}/kill`, as a crash would be seen: no CLI
//! process start-up in the figure) and time how long until Caddy stops
//! routing to it (404 from the catch-all) and until it serves again (200),
//! with Docker events on and with polling only (one-second tick). The clock
//! starts just before the kill request. Prints p50/p99; asserts nothing.
//!
//!   cargo bench --bench crash_latency     N = 50 kills per mode
//!   cargo test --benches                  N = 3 (a smoke run)
#![allow(clippy::disallowed_methods)] // Latency is wall-clock by nature.

#[path = "../tests/e2e/mod.rs"]
mod e2e;
#[path = "../tests/support_services/mod.rs"]
mod support_services;

use std::time::{Duration, Instant};

use bollard::query_parameters::KillContainerOptions;
use e2e::{wait_until, Harness, Setup};
use support_services::docker::Cleanup;
use support_services::unique;

const KILLS_BENCH: usize = 50;
const KILLS_SMOKE: usize = 3;
const POLL: Duration = Duration::from_millis(5);
const LIMIT: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let kills = if bench { KILLS_BENCH } else { KILLS_SMOKE };
    println!("crash latency over {kills} kills per mode (tick interval 1 s)");
    for events in [true, false] {
        let (withdrawn, republished, kill_calls) = measure(events, kills).await;
        let mode = if events {
            "events on   "
        } else {
            "polling only"
        };
        println!(
            "{mode}  crash->withdrawn p50 {:>6.0} ms p99 {:>6.0} ms   crash->republished p50 {:>6.0} ms p99 {:>6.0} ms",
            percentile(&withdrawn, 50),
            percentile(&withdrawn, 99),
            percentile(&republished, 50),
            percentile(&republished, 99),
        );
        // Docker answers a SIGKILL only once the container is dead, so the
        // request's return is the latest the crash can have happened.
        let after_death: Vec<f64> = withdrawn
            .iter()
            .zip(&kill_calls)
            .map(|(w, k)| w - k)
            .collect();
        println!(
            "{mode}  (the kill request itself took p50 {:.0} ms; from its return, withdrawn p50 {:.0} ms p99 {:.0} ms)",
            percentile(&kill_calls, 50),
            percentile(&after_death, 50),
            percentile(&after_death, 99),
        );
    }
}

async fn measure(events: bool, kills: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let name = unique("benchcrash");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup {
        docker_events: events,
        // Every kill is a crash of the same generation; lift the budget's
        // free attempts so the benchmark measures recovery, not backoff.
        extra_config: "\n[recovery]\nfree_attempts = 100\n".into(),
        ..Setup::default()
    })
    .await;
    h.create(&name, None).await;
    wait_until("served", LIMIT, || async { h.get(&name).await == 200 }).await;
    let id = h.active_container(&name).await.expect("ACTIVE");
    let api = bollard::Docker::connect_with_local_defaults().expect("docker socket");
    let (mut withdrawn, mut republished, mut kill_calls) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..kills {
        let start = Instant::now();
        api.kill_container(&id, None::<KillContainerOptions>)
            .await
            .expect("kill through the Engine API");
        kill_calls.push(start.elapsed().as_secs_f64() * 1000.0);
        let mut withdrawn_at = None;
        loop {
            assert!(start.elapsed() < LIMIT, "no recovery within {LIMIT:?}");
            let status = h.get(&name).await;
            if withdrawn_at.is_none() && status == 404 {
                withdrawn_at = Some(start.elapsed());
            }
            if withdrawn_at.is_some() && status == 200 {
                republished.push(start.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        withdrawn.push(withdrawn_at.expect("set").as_secs_f64() * 1000.0);
        // Let the healthcheck settle before the next kill.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (withdrawn, republished, kill_calls)
}

fn percentile(samples: &[f64], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p * sorted.len()).div_ceil(100)).clamp(1, sorted.len());
    sorted[rank - 1]
}
