//! Requests through Caddy while stead changes routes: a steady request rate
//! against served instances while stead upgrades one service type (a
//! catalog reload: every instance of it is replaced with overlap) and
//! recovers killed containers of *other* instances. Every publish and
//! withdrawal is a Caddy config change, which Caddy applies by reloading its
//! whole config; this measures whether any request pays for that.
//!
//! Load goes to two groups, never to the killed instances (whose requests
//! fail by design while they are down):
//! - `upgraded`: instances whose route moves to a successor container;
//! - `untouched`: instances whose route never changes.
//!
//! Prints requests sent, failures by cause (reset, 5xx, timeout, other) and
//! latency percentiles per group, and the host's `net.ipv4.tcp_migrate_req`
//! (see docs/operations.md, "Caddy reloads"). Asserts nothing: the e2e test
//! `an_upgrade_replaces_with_overlap_and_fails_no_request` holds the bar.
//!
//!   cargo bench --bench route_load     20 upgrades, 20 recoveries, 200 req/s
//!   cargo test --benches               a smoke run (2 upgrades, 2 recoveries)
#![allow(clippy::disallowed_methods)] // Latency is wall-clock by nature.

#[path = "../tests/e2e/mod.rs"]
mod e2e;
#[path = "../tests/support_services/mod.rs"]
mod support_services;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::query_parameters::KillContainerOptions;
use e2e::{catalog, wait_until, Harness, Setup, HTTPD, SERVICE};
use support_services::docker::{docker, Cleanup};
use support_services::unique;
use tokio::sync::{Mutex, Semaphore};

/// The upgraded type is the harness's `web`; victims and untouched
/// instances are of this type, which no catalog reload changes.
const STEADY_TYPE: &str = "steady";
const LIMIT: Duration = Duration::from_secs(180);
/// Bound on requests in flight; a request that would exceed it is counted
/// as `client saturated`, never queued.
const IN_FLIGHT_MAX: usize = 256;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

struct Plan {
    upgraded: usize,
    victims: usize,
    kills_per_victim: usize,
    untouched: usize,
    rate_per_s: u32,
}

const BENCH: Plan = Plan {
    upgraded: 20,
    victims: 10,
    kills_per_victim: 2,
    untouched: 4,
    rate_per_s: 200,
};
const SMOKE: Plan = Plan {
    upgraded: 2,
    victims: 1,
    kills_per_victim: 2,
    untouched: 1,
    rate_per_s: 50,
};

#[derive(Default, Clone)]
struct Stats {
    sent: u64,
    ok: u64,
    reset: u64,
    server_error: u64,
    timeout: u64,
    other: u64,
    saturated: u64,
    latencies_us: Vec<u64>,
}

impl Stats {
    fn failed(&self) -> u64 {
        self.reset + self.server_error + self.timeout + self.other
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let plan = if bench { BENCH } else { SMOKE };
    println!(
        "route load: {} upgrades, {} recoveries of other instances, {} req/s; caddy {}; net.ipv4.tcp_migrate_req = {}",
        plan.upgraded,
        plan.victims * plan.kills_per_victim,
        plan.rate_per_s,
        caddy_version(),
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
    );
    let prefix = unique("rl");
    let name = |group: &str, i: usize| format!("{prefix}{group}{i}");
    let upgraded: Vec<String> = (0..plan.upgraded).map(|i| name("u", i)).collect();
    let victims: Vec<String> = (0..plan.victims).map(|i| name("v", i)).collect();
    let untouched: Vec<String> = (0..plan.untouched).map(|i| name("s", i)).collect();
    let _cleanup: Vec<Cleanup> = upgraded
        .iter()
        .chain(&victims)
        .chain(&untouched)
        .map(|n| Cleanup::new(n))
        .collect();

    let mut h = Harness::start(Setup {
        catalog: two_types("1"),
        // Upgrades run four at a time, as a fleet operator would allow.
        control_extra: "max_in_flight = 4\n".into(),
        ..Setup::default()
    })
    .await;
    for n in &upgraded {
        h.create(n, None).await;
    }
    for n in victims.iter().chain(&untouched) {
        h.create_typed(n, STEADY_TYPE, None).await;
    }
    for n in upgraded.iter().chain(&victims).chain(&untouched) {
        wait_until("served", LIMIT, || async { h.get(n).await == 200 }).await;
    }
    let before: Vec<String> = {
        let mut ids = Vec::new();
        for n in &upgraded {
            ids.push(h.active_container(n).await.expect("ACTIVE"));
        }
        ids
    };

    let stats = Arc::new([Mutex::new(Stats::default()), Mutex::new(Stats::default())]);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = tokio::spawn(load(
        h.listen.clone(),
        vec![upgraded.clone(), untouched.clone()],
        plan.rate_per_s,
        stats.clone(),
        stop_rx,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let began = Instant::now();

    // The catalog reload, as SIGHUP or `stead reload` does it, with the
    // daemon running: every `web` instance gets an upgrade.
    let writes_before = h.daemon().caddy.route_writes();
    std::fs::write(&h.daemon().config.catalog, two_types("2")).expect("write catalog");
    let reloaded = h
        .daemon()
        .reload_catalog(stead::daemon::ReloadMode::Guarded)
        .await
        .expect("the new catalog is valid");
    assert!(
        !reloaded.changes.is_empty(),
        "the reload changed the web version"
    );
    // Meanwhile, containers of other instances crash and are recovered.
    let api = bollard::Docker::connect_with_local_defaults().expect("docker socket");
    let mut recoveries = 0;
    for round in 0..plan.kills_per_victim {
        for v in &victims {
            let id = h.active_container(v).await.expect("victim ACTIVE");
            api.kill_container(&id, None::<KillContainerOptions>)
                .await
                .expect("kill through the Engine API");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for v in &victims {
            wait_until(&format!("{v} recovered (round {round})"), LIMIT, || async {
                h.get(v).await == 200
            })
            .await;
            recoveries += 1;
        }
    }
    for (n, old) in upgraded.iter().zip(&before) {
        wait_until(
            &format!("{n} upgraded, predecessor retired"),
            LIMIT,
            || async {
                h.active_container(n).await.is_some_and(|c| &c != old)
                    && docker(&["inspect", "--format", "{{.Id}}", old]).is_err()
            },
        )
        .await;
    }
    let took = began.elapsed();
    let writes = h.daemon().caddy.route_writes() - writes_before;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).expect("load running");
    load.await.expect("load task");

    println!(
        "{} upgrades and {recoveries} recoveries done in {:.1} s with {writes} caddy route writes (reloads)",
        plan.upgraded,
        took.as_secs_f64()
    );
    for (group, stats) in ["upgraded", "untouched"].iter().zip(stats.iter()) {
        print_stats(group, &stats.lock().await.clone());
    }
    h.shutdown().await;
}

fn two_types(web_version: &str) -> String {
    catalog(web_version, HTTPD) + &catalog("1", HTTPD).replace("types.web", "types.steady")
}

fn caddy_version() -> String {
    std::process::Command::new("caddy")
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Open-loop load: `rate_per_s` requests a second, round-robin over each
/// group's instances, a fresh connection per request (so a reset is never
/// a stale keep-alive connection's), until `stop`.
async fn load(
    listen: String,
    groups: Vec<Vec<String>>,
    rate_per_s: u32,
    stats: Arc<[Mutex<Stats>; 2]>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("client");
    let permits = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate_per_s);
    let targets: Vec<(usize, String)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, names)| names.iter().map(move |n| (g, n.clone())))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = 0;
    while !*stop.borrow() {
        ticker.tick().await;
        let (group, instance) = targets[next % targets.len()].clone();
        next += 1;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            stats[group].lock().await.saturated += 1;
            continue;
        };
        let (client, listen, stats) = (client.clone(), listen.clone(), stats.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            let answer = client
                .get(format!("http://{listen}/"))
                .header("host", format!("{SERVICE}.{instance}.localhost"))
                .send()
                .await;
            let latency_us = start.elapsed().as_micros() as u64;
            let mut s = stats[group].lock().await;
            s.sent += 1;
            match answer {
                Ok(r) if r.status().is_success() => {
                    s.ok += 1;
                    s.latencies_us.push(latency_us);
                }
                Ok(r) if r.status().is_server_error() => s.server_error += 1,
                Ok(r) => {
                    eprintln!("{instance}: unexpected {}", r.status());
                    s.other += 1;
                }
                Err(e) if e.is_timeout() => s.timeout += 1,
                Err(e) if is_reset(&e) => {
                    eprintln!("{instance}: reset: {e}");
                    s.reset += 1;
                }
                Err(e) => {
                    eprintln!("{instance}: {e:?}");
                    s.other += 1;
                }
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Whether an error was a connection reset (anywhere in its source chain).
fn is_reset(error: &reqwest::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionReset {
                return true;
            }
        }
        source = e.source();
    }
    false
}

fn print_stats(group: &str, s: &Stats) {
    let mut l = s.latencies_us.clone();
    l.sort_unstable();
    let p = |q: usize| -> f64 {
        if l.is_empty() {
            return 0.0;
        }
        let rank = (q * l.len()).div_ceil(100).clamp(1, l.len());
        l[rank - 1] as f64 / 1000.0
    };
    println!(
        "{group:>9}: sent {} ok {} failed {} (reset {}, 5xx {}, timeout {}, other {}), client saturated {}; latency ms p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
        s.sent,
        s.ok,
        s.failed(),
        s.reset,
        s.server_error,
        s.timeout,
        s.other,
        s.saturated,
        p(50),
        p(90),
        p(99),
        p(100),
    );
}
