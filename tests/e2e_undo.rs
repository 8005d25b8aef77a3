//! #40's bar for `stead rollout undo`: a good upgrade (version 1 to 2,
//! `overlap`, baking) undone by an operator through the CLI returns the
//! instance to version 1, the very container kept stopped while version 2
//! baked, with no failed request. A request loop through Caddy, started
//! while version 2 serves and kept running across the whole undo, sees
//! version 2 answer, then version 1, and nothing else: no gap, no error,
//! no going back and forth. Real dockerd, Caddy and SQLite; the daemon is
//! the harness's, the CLI the `stead` binary on the daemon's database.

mod e2e;
mod support;
mod support_services;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::{inspect, wait_until, CapturedLog, Harness, Setup};
use stead::core::event_log::{EventFilter, EventKind};
use stead::core::fleet::RolloutState;
use stead::core::types::InstanceName;
use support_services::docker::{docker, Cleanup};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(60);
/// Long enough that the upgrade still bakes when the operator undoes it.
const BAKE_MS: u64 = 120_000;
/// Requests the loop makes at least while version 2 serves, before the
/// undo, so that it is seen to answer.
const REQUESTS_BEFORE_UNDO_MIN: u32 = 20;
/// Consecutive runs of one version the loop keeps; more than two is
/// already a failure (the route went back and forth).
const RUNS_MAX: usize = 16;

/// A busybox httpd (as `e2e::HTTPD`) whose page names its version.
fn serving_its_version(version: &str) -> String {
    format!("busybox rm -f /tmp/sick; echo version {version} > /www/index.html; exec httpd -f -p 8080 -h /www")
}

/// The e2e catalog at `version`, baking for [`BAKE_MS`], its service
/// replaced by `overlap` explicitly (the undo starts the predecessor while
/// the successor serves only for an overlap service).
fn catalog(version: &str) -> String {
    let doc = e2e::catalog_baking(version, &serving_its_version(version), BAKE_MS);
    let overlap = doc.replacen(
        "stop_grace_ms = 1000\n",
        "stop_grace_ms = 1000\nupdate = \"overlap\"\n",
        1,
    );
    assert_ne!(overlap, doc, "the service table takes `update`");
    overlap
}

/// The version named by the page Caddy serves for `instance`, or why
/// there is none (a status, an error).
async fn served_version(
    client: &reqwest::Client,
    listen: &str,
    instance: &str,
) -> Result<String, String> {
    let answer = client
        .get(format!("http://{listen}/"))
        .header("host", format!("{}.{instance}.localhost", e2e::SERVICE))
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let status = answer.status();
    let body = answer.text().await.map_err(|e| format!("{e:?}"))?;
    match body.trim().strip_prefix("version ") {
        Some(version) if status == 200 => Ok(version.to_owned()),
        _ => Err(format!("{status}: {body:?}")),
    }
}

/// A client that opens a fresh connection per request (see the request
/// loop of `e2e_daemon.rs`: a Caddy reload closes idle keep-alive
/// connections, which is the host's business, not stead's).
fn fresh_connections() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// What the request loop saw: its failed requests, how many it made, and
/// the versions that answered, one entry per run of the same version.
struct Seen {
    failures: Vec<String>,
    total: u32,
    runs: Vec<(String, u32)>,
}

/// GET through Caddy in a loop until `stop`, every 20 ms, each on a fresh
/// connection; any answer but a 200 naming a version is a failure.
/// `made` counts the requests as they are made.
fn request_loop(
    listen: String,
    name: String,
    stop: tokio::sync::watch::Receiver<bool>,
    made: Arc<AtomicU32>,
) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let client = fresh_connections();
        let mut seen = Seen {
            failures: Vec::new(),
            total: 0,
            runs: Vec::new(),
        };
        while !*stop.borrow() {
            seen.total += 1;
            made.store(seen.total, Ordering::Relaxed);
            match served_version(&client, &listen, &name).await {
                Ok(version) => {
                    let n_runs = seen.runs.len();
                    match seen.runs.last_mut() {
                        Some((last, n)) if *last == version => *n += 1,
                        _ if n_runs < RUNS_MAX => seen.runs.push((version, 1)),
                        _ => seen
                            .failures
                            .push(format!("request {}: runs past {RUNS_MAX}", seen.total)),
                    }
                }
                Err(why) => seen.failures.push(format!("request {}: {why}", seen.total)),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen
    })
}

/// How many containers, running or not, the runtime has of `instance`.
fn containers_of(instance: &str) -> usize {
    let filter = format!("label=stead.instance={instance}");
    docker(&["ps", "-aq", "--filter", &filter])
        .unwrap_or_default()
        .lines()
        .count()
}

/// Runs the `stead` binary on `config`; its standard output, once it
/// succeeded.
fn stead(config: &std::path::Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_stead"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("STEAD_CONFIG")
        .output()
        .expect("run the stead binary");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "stead {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_undo_of_a_good_upgrade_returns_the_previous_version_with_no_failed_request() {
    if let Some(warning) = stead::adapters::caddy::host_reload_warning() {
        panic!("{warning}; run `scripts/services up` (it sets it) or `sysctl -w net.ipv4.tcp_migrate_req=1`");
    }
    let log = CapturedLog::install();
    let name = unique("e2eundo");
    let _cleanup = Cleanup::new(&name);
    let mut h = Harness::start(Setup {
        catalog: catalog("1"),
        ..Setup::default()
    })
    .await;
    let instance = InstanceName::new(&name);
    let client = fresh_connections();
    h.create(&name, None).await;
    wait_until("version 1 served through caddy", CONVERGE, || async {
        served_version(&client, &h.listen, &name).await.as_deref() == Ok("1")
    })
    .await;
    let old = h.active_container(&name).await.expect("ACTIVE names one");

    // A good version 2: switched to, its predecessor kept stopped while it
    // bakes.
    h.restart_with_catalog(&catalog("2")).await;
    let store = h.daemon().ports.store.clone();
    wait_until(
        "version 2 serves, version 1 kept stopped",
        CONVERGE,
        || async {
            h.active_container(&name).await.is_some_and(|c| c != old)
                && served_version(&client, &h.listen, &name).await.as_deref() == Ok("2")
                && inspect(&old, "{{.State.Status}}").is_ok_and(|s| s == "exited")
                && store
                    .instance(&instance)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|row| row.version == "2")
        },
    )
    .await;
    let new = h.active_container(&name).await.unwrap();
    assert_eq!(containers_of(&name), 2, "version 2 runs, version 1 is kept");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let made = Arc::new(AtomicU32::new(0));
    let requests = request_loop(h.listen.clone(), name.clone(), stop_rx, made.clone());
    wait_until("the loop asked version 2 a while", CONVERGE, || async {
        made.load(Ordering::Relaxed) >= REQUESTS_BEFORE_UNDO_MIN
    })
    .await;
    let config = h.cli_config();
    let said = stead(&config, &["rollout", "undo", e2e::TYPE]);
    assert!(
        said.contains(&format!("{name}: going back to its predecessors")),
        "{said}"
    );
    // The undo task's, not the pass's: the pass would revert (with a gap)
    // only once the task had not done it within the grace.
    let undone = wait_until(
        "back on version 1, the very container, version 2 stopped",
        stead::core::bake::UNDO_TASK_GRACE,
        || async {
            h.active_container(&name).await.as_deref() == Some(old.as_str())
                && served_version(&client, &h.listen, &name).await.as_deref() == Ok("1")
                && store
                    .instance(&instance)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|row| row.version == "1")
                // Version 2 stopped, kept a while as what was undone (#55).
                && inspect(&new, "{{.State.Status}}").is_ok_and(|s| s == "exited")
        },
    )
    .await;
    // Some more requests on version 1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).unwrap();
    let seen = requests.await.unwrap();
    let runs: Vec<&str> = seen.runs.iter().map(|(v, _)| v.as_str()).collect();
    eprintln!(
        "undone in {undone:?}; {} requests, runs {:?}",
        seen.total, seen.runs
    );
    assert!(
        seen.failures.is_empty(),
        "{} of {} requests failed across the undo: {:#?}",
        seen.failures.len(),
        seen.total,
        seen.failures
    );
    assert_eq!(
        runs,
        ["2", "1"],
        "version 2 answered, then version 1, and nothing else: {:?}",
        seen.runs
    );
    assert!(
        seen.runs[0].1 >= REQUESTS_BEFORE_UNDO_MIN,
        "version 2 answered before the undo: {:?}",
        seen.runs
    );
    assert_eq!(
        inspect(&new, "{{.State.Status}}").as_deref(),
        Ok("exited"),
        "version 2 is stopped, kept a while (#55)"
    );
    assert_eq!(inspect(&old, "{{.State.Status}}").as_deref(), Ok("running"));

    let rollouts = store.rollout_records().await.unwrap();
    let web = rollouts
        .iter()
        .find(|r| r.service_type == e2e::TYPE)
        .expect("the type's rollout record");
    assert_eq!(web.state, RolloutState::Halted);
    assert!(web.reason.contains("rollout undo"), "{}", web.reason);

    let text = log.text();
    assert!(
        text.lines()
            .any(|line| line.contains(&name) && line.contains("rollout undone by an operator")),
        "the worker logged the undo of {name}"
    );
    let kinds: Vec<(EventKind, String)> = store
        .events(&EventFilter {
            instance: Some(instance.clone()),
            ..Default::default()
        })
        .await
        .expect("the event log reads")
        .rows
        .into_iter()
        .map(|e| (e.event.kind, e.event.reason))
        .collect();
    assert!(
        !kinds.iter().any(|(k, _)| *k == EventKind::Withdraw),
        "the route moved, never withdrawn: {kinds:?}"
    );
    // As the operator reads it: the CLI's own record of the undo, and the
    // worker's once it carried it out.
    let reverts = stead(
        &config,
        &["events", "--instance", &name, "--kind", "revert", "--json"],
    );
    let reasons: Vec<String> = reverts
        .lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).expect("one JSON event");
            assert_eq!(event["kind"], "revert", "{line}");
            event["reason"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert!(
        reasons.iter().any(|r| r == "#40 undo"),
        "the worker's revert in `stead events`: {reverts}"
    );

    // Halted: nothing upgrades it to version 2 again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        h.active_container(&name).await.as_deref(),
        Some(old.as_str())
    );
    assert_eq!(containers_of(&name), 2, "version 1 runs, version 2 is kept");
    assert!(inspect(&new, "{{.State.Status}}").is_ok_and(|s| s == "exited"));
}
