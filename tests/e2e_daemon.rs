//! End-to-end: the daemon against real dockerd, Caddy and SQLite. Each test
//! runs its own daemon, Caddy and database, names its instance uniquely and
//! removes its containers on the way out (also when it fails).

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{catalog, inspect, wait_until, Harness, Setup};
use support_services::docker::{docker, Cleanup, StartCounter};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(60);

/// Creates an instance and waits until Caddy serves it.
async fn serving(h: &Harness, name: &str) -> String {
    h.create(name, None).await;
    wait_until("served through caddy", CONVERGE, || async {
        h.get(name).await == 200
    })
    .await;
    h.active_container(name)
        .await
        .expect("ACTIVE names a container")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisions_an_instance_and_serves_it_through_caddy() {
    let name = unique("e2eserve");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup::default()).await;
    let id = serving(&h, &name).await;
    assert_eq!(inspect(&id, "{{.State.Status}}").unwrap(), "running");
    assert_eq!(
        h.get("no-such-instance").await,
        404,
        "unknown hosts get the catch-all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_container_is_withdrawn_started_verified_and_republished() {
    let name = unique("e2ekill");
    let _cleanup = Cleanup::new(&name);
    let metrics = stead::daemon::metrics_handle();
    let h = Harness::start(Setup::default()).await;
    let id = serving(&h, &name).await;
    let started_before = inspect(&id, "{{.State.StartedAt}}").unwrap();
    let before = metrics.render();

    docker(&["kill", &id]).unwrap();
    // Withdrawn: Caddy answers from its catch-all (404) rather than a dead
    // backend (502). With events this is well under a tick.
    let withdrawn = wait_until("withdrawn", Duration::from_secs(10), || async {
        h.get(&name).await == 404
    })
    .await;
    wait_until("served again", CONVERGE, || async {
        h.get(&name).await == 200
    })
    .await;
    let started_after = inspect(&id, "{{.State.StartedAt}}").unwrap();
    assert_ne!(
        started_before, started_after,
        "the same container was started again"
    );
    assert_eq!(
        h.active_container(&name).await.as_deref(),
        Some(id.as_str()),
        "same generation"
    );
    eprintln!("kill -> withdrawn in {withdrawn:?}");
    // The recovery shows in /metrics (the recorder is process-wide, so
    // other tests only ever add to these counters).
    let after = metrics.render();
    for counter in [
        "stead_withdrawals_total",
        "stead_starts_total",
        "stead_recoveries_total",
        "stead_docker_events_total",
    ] {
        assert!(
            counter_value(&after, counter) > counter_value(&before, counter),
            "{counter} did not grow:\n{after}"
        );
    }
    assert!(counter_value(&after, "stead_docker_api_calls_total") > 0.0);
}

/// The value of an unlabelled counter in Prometheus text; 0 when absent.
fn counter_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .filter_map(|value| value.trim().parse().ok())
        .next()
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_container_gets_exactly_three_starts_then_waits() {
    let name = unique("e2eloop");
    let _cleanup = Cleanup::new(&name);
    // Serves long enough to be verified and published once, then crashes
    // every second run after.
    let setup = Setup {
        // Few probe attempts: a probe of a dying container otherwise keeps
        // a pass busy for seconds, which is slow on a loaded machine.
        catalog: catalog("1", "httpd -p 8080 -h /www; sleep 2; exit 3")
            .replace("attempts_max = 100", "attempts_max = 10"),
        ..Setup::default()
    };
    let h = Harness::start(setup).await;
    let counter = StartCounter::follow(&name);
    h.create(&name, None).await;
    wait_until("created", CONVERGE, || async {
        h.active_container(&name).await.is_some()
    })
    .await;
    let id = h.active_container(&name).await.unwrap();
    let starts = || counter.starts();
    // One start from the worker's create, then three by recovery.
    wait_until("four starts", 2 * CONVERGE, || async { starts() >= 4 }).await;
    // The budget now delays the next attempt by a minute: nothing for a while.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        starts(),
        4,
        "exactly three recovery starts, then the budget waits"
    );
    assert_ne!(inspect(&id, "{{.State.Status}}").unwrap(), "running");
    assert_eq!(h.get(&name).await, 404, "a down backend is not routed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_container_is_restarted_after_two_unhealthy_observations() {
    let name = unique("e2esick");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup::default()).await;
    let id = serving(&h, &name).await;
    let started_before = inspect(&id, "{{.State.StartedAt}}").unwrap();
    docker(&["exec", &id, "sh", "-c", ": > /tmp/sick"]).unwrap();
    wait_until(
        "docker reports unhealthy",
        Duration::from_secs(10),
        || async { inspect(&id, "{{.State.Health.Status}}").unwrap_or_default() == "unhealthy" },
    )
    .await;
    // Restarted (new execution, same container), which removes the sick
    // file, so it turns healthy and serves again.
    wait_until("restarted", Duration::from_secs(20), || async {
        inspect(&id, "{{.State.StartedAt}}").unwrap_or_default() != started_before
    })
    .await;
    wait_until("served again", CONVERGE, || async {
        h.get(&name).await == 200
    })
    .await;
    assert_eq!(
        h.active_container(&name).await.as_deref(),
        Some(id.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_intent_stops_and_unpublishes_without_removing() {
    let name = unique("e2estop");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup::default()).await;
    let id = serving(&h, &name).await;
    h.ops().set_stopped(&name, true).await.unwrap();
    wait_until("stopped", Duration::from_secs(20), || async {
        inspect(&id, "{{.State.Status}}").unwrap_or_default() == "exited"
    })
    .await;
    wait_until("unpublished", Duration::from_secs(10), || async {
        h.get(&name).await == 404
    })
    .await;
    let memory = h.daemon().recoverer.memory();
    let catalog = h.daemon().catalog.current();
    let status = stead::daemon::status::status(stead::daemon::status::StatusSources {
        store: h.daemon().ports.store.as_ref(),
        runtime: h.daemon().ports.runtime.as_ref(),
        catalog: &catalog,
        memory: Some(&memory),
        caddy_admin: Some(&h.caddy.admin_addr),
        provisioner: Some(h.daemon().ports.provisioner.as_ref()),
        database: String::new(),
        now: h.daemon().ports.clock.now(),
    })
    .await;
    let row = status
        .rows
        .iter()
        .find(|r| r.instance == name)
        .expect("a status row");
    assert_eq!(
        (
            row.intent.as_str(),
            row.runtime.as_str(),
            row.publication.as_str(),
            row.condition.as_str()
        ),
        ("stopped", "exited", "withdrawn", "stopped")
    );
    // Several ticks later it is still there, still stopped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        inspect(&id, "{{.State.Status}}").unwrap(),
        "exited",
        "kept, not removed, not started"
    );
    h.ops().set_stopped(&name, false).await.unwrap();
    wait_until("served after start intent", CONVERGE, || async {
        h.get(&name).await == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_removed_by_hand_is_reprovisioned() {
    let name = unique("e2edrift");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup::default()).await;
    let id = serving(&h, &name).await;
    docker(&["rm", "-f", &id]).unwrap();
    wait_until("reprovisioned and served", CONVERGE, || async {
        h.get(&name).await == 200 && h.active_container(&name).await.is_some_and(|c| c != id)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_deprovisions() {
    let name = unique("e2ettl");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup::default()).await;
    h.create(&name, Some(Duration::from_secs(8))).await;
    wait_until("served", CONVERGE, || async { h.get(&name).await == 200 }).await;
    let id = h.active_container(&name).await.unwrap();
    wait_until("deprovisioned", CONVERGE, || async {
        let gone = inspect(&id, "{{.Id}}").is_err();
        let instance = h
            .daemon()
            .ports
            .store
            .instance(&stead::core::types::InstanceName::new(&name))
            .await
            .ok()
            .flatten();
        gone && instance.is_some_and(|i| i.state == stead::core::fleet::InstanceState::Deleted)
    })
    .await;
    assert_eq!(h.get(&name).await, 404);
}

/// Runs GET through Caddy in a loop until `stop`; returns the failed
/// requests (any answer but 200: a 404 is a gap in the route, a 5xx a
/// backend that did not answer, an error a reset or a timeout) and the
/// number of requests.
fn request_loop(
    listen: String,
    name: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(Vec<String>, u32)> {
    tokio::spawn(async move {
        // A fresh connection per request: every route change reloads
        // Caddy's config, which closes idle keep-alive connections, and a
        // request racing that close is reset before any backend is asked
        // (browsers retry those). What this loop measures is whether stead's
        // route changes ever fail a request, so it never reuses a connection.
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let (mut failures, mut total) = (Vec::new(), 0);
        while !*stop.borrow() {
            let answer = client
                .get(format!("http://{listen}/"))
                .header("host", format!("{}.{name}.localhost", e2e::SERVICE))
                .send()
                .await;
            total += 1;
            match answer {
                Ok(r) if r.status() == 200 => {}
                Ok(r) => failures.push(format!("request {total}: {}", r.status())),
                Err(e) => failures.push(format!("request {total}: {e:?}")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (failures, total)
    })
}

/// Zero-downtime upgrades hold only where Caddy's reloads reset nothing:
/// `scripts/services up` sets the kernel switch (docs/operations.md,
/// "Caddy reloads"). Without it this test would measure the host.
fn assert_host_keeps_connections_across_caddy_reloads() {
    if let Some(warning) = stead::adapters::caddy::host_reload_warning() {
        panic!("{warning}; run `scripts/services up` (it sets it) or `sysctl -w net.ipv4.tcp_migrate_req=1`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_replaces_with_overlap_and_fails_no_request() {
    assert_host_keeps_connections_across_caddy_reloads();
    let name = unique("e2eupg");
    let _cleanup = Cleanup::new(&name);
    let mut h = Harness::start(Setup::default()).await;
    let old = serving(&h, &name).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let requests = request_loop(h.listen.clone(), name.clone(), stop_rx);
    // A new catalog version: the next tick plans the upgrade.
    h.restart_with_catalog(&catalog("2", e2e::HTTPD)).await;
    wait_until("upgraded and predecessor retired", 2 * CONVERGE, || async {
        let new = h.active_container(&name).await;
        new.is_some_and(|n| n != old) && inspect(&old, "{{.Id}}").is_err()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send(true).unwrap();
    let (failures, total) = requests.await.unwrap();
    assert!(total > 10, "the loop ran ({total} requests)");
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed during the upgrade: {failures:#?}",
        failures.len()
    );
    assert_eq!(h.get(&name).await, 200);
}

/// #40's bar: a version whose container exits ten seconds after it
/// starts passes readiness, is switched to, and fails while it bakes: the
/// rollout halts, the instance serves the previous version again (the
/// very container, kept stopped while it baked), and a request loop
/// started once the revert completed sees no failed request. #55's bar on
/// top: of five instances with room for all, exactly one takes the version
/// (its bake holds the wave); the halt names the exit code; the failed
/// successor is kept, stopped, with its logs, and the revert event tells
/// its last lines; the halted gauge reads 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_crashes_while_baking_is_reverted_and_its_rollout_halted() {
    const BAKE_MS: u64 = 120_000;
    // The process-wide recorder, installed before the daemon records
    // anything (the harness runs no admin listener).
    let metrics = stead::daemon::metrics_handle();
    let name = unique("e2ebake");
    let _cleanup = Cleanup::new(&name);
    // Four more instances of the type, and room for all five at once: the
    // waves (#55) must still send the version to one instance only.
    let others: Vec<String> = (2..=5).map(|n| format!("{name}-{n}")).collect();
    let _cleanups: Vec<Cleanup> = others.iter().map(|o| Cleanup::new(o)).collect();
    let mut h = Harness::start(Setup {
        catalog: e2e::catalog_baking("1", e2e::HTTPD, BAKE_MS),
        control_extra: "max_in_flight = 5\n".into(),
        ..Setup::default()
    })
    .await;
    let old = serving(&h, &name).await;
    let mut others_before = Vec::new();
    for other in &others {
        others_before.push(serving(&h, other).await);
    }
    let crashes_after_ten_seconds = "busybox rm -f /tmp/sick; busybox httpd -f -p 8080 -h /www \
         & sleep 10; echo fatal: version 2 cannot read its config >&2; exit 3";
    h.restart_with_catalog(&e2e::catalog_baking(
        "2",
        crashes_after_ten_seconds,
        BAKE_MS,
    ))
    .await;
    let store = h.daemon().ports.store.clone();
    wait_until("switched to the new version", CONVERGE, || async {
        h.active_container(&name).await.is_some_and(|c| c != old)
    })
    .await;
    let bad = h.active_container(&name).await.unwrap();
    wait_until(
        "the predecessor is kept, stopped, while it bakes",
        CONVERGE,
        || async { inspect(&old, "{{.State.Status}}").is_ok_and(|s| s == "exited") },
    )
    .await;
    // The revert completes when the predecessor runs and serves again: the
    // pass that puts it back in ACTIVE withdraws the failed successor's
    // route, the next starts, verifies and publishes the predecessor.
    let reverted = wait_until("reverted to the predecessor, serving", CONVERGE, || async {
        h.active_container(&name).await.as_deref() == Some(old.as_str())
            && inspect(&old, "{{.State.Status}}").is_ok_and(|s| s == "running")
            && h.get(&name).await == 200
    })
    .await;
    assert!(
        reverted < Duration::from_millis(BAKE_MS),
        "reverted within the bake window"
    );
    let rollouts = store.rollout_records().await.unwrap();
    let web = rollouts
        .iter()
        .find(|r| r.service_type == e2e::TYPE)
        .unwrap();
    assert_eq!(web.state, stead::core::fleet::RolloutState::Halted);
    assert!(web.reason.contains("while baking"), "{}", web.reason);
    // #55: the reason says what failed, in words a person acts on.
    assert!(
        web.reason.contains("exited with code 3"),
        "the halt names the exit code: {}",
        web.reason
    );
    let row = store
        .instance(&stead::core::types::InstanceName::new(&name))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.version, "1", "the instance's version put back");

    // Exactly one instance took the version: the others never left 1.
    for (other, before) in others.iter().zip(&others_before) {
        assert_eq!(
            h.active_container(other).await.as_ref(),
            Some(before),
            "{other}"
        );
        let row = store
            .instance(&stead::core::types::InstanceName::new(other))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.version, "1", "{other} was not upgraded");
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let requests = request_loop(h.listen.clone(), name.clone(), stop_rx);
    // #55: the failed successor is kept, stopped, with its logs: the
    // evidence of what failed.
    wait_until("the failed successor kept, stopped", CONVERGE, || async {
        inspect(&bad, "{{.State.Status}}").is_ok_and(|s| s == "exited")
    })
    .await;
    let logs = std::process::Command::new("docker")
        .args(["logs", &bad])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&logs.stderr).contains("fatal: version 2 cannot read its config"),
        "docker logs of the kept container: {logs:?}"
    );
    h.daemon().flush_events().await;
    let events = store
        .events(&stead::core::event_log::EventFilter {
            kind: Some(stead::core::event_log::EventKind::Revert),
            ..Default::default()
        })
        .await
        .unwrap()
        .rows;
    assert!(
        events.iter().any(|e| e
            .event
            .message
            .contains("last lines of http: fatal: version 2 cannot read its config")),
        "the revert event tells the last lines: {events:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_tx.send(true).unwrap();
    let (failures, total) = requests.await.unwrap();
    assert!(total > 10, "the loop ran ({total} requests)");
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed after the revert: {failures:#?}",
        failures.len()
    );
    // Halted: nothing upgrades it back to the failed version.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        h.active_container(&name).await.as_deref(),
        Some(old.as_str())
    );
    // #55: the gauge an alert watches says the halt, the counter the
    // revert.
    let text = metrics.render();
    assert!(
        text.contains(&format!(
            "stead_rollout_halted{{service_type=\"{}\"}} 1",
            e2e::TYPE
        )),
        "{text}"
    );
    assert!(
        text.contains("stead_reverts_total{cause=\"bake\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_upgrade_converges_after_restart() {
    let name = unique("e2ekill9");
    let _cleanup = Cleanup::new(&name);
    let mut h = Harness::start(Setup::default()).await;
    let old = killed_mid_upgrade(&mut h, &name).await;
    h.restart_with_catalog(&catalog("2", e2e::HTTPD)).await;
    wait_until("converged on the new version", 2 * CONVERGE, || async {
        h.get(&name).await == 200
            && h.active_container(&name).await.is_some_and(|n| n != old)
            && containers_of(&name) == 1
    })
    .await;
}

/// Serves `name` at version 1, bumps the catalog to 2 and kills the
/// daemon (-9) as soon as the successor exists: mid-upgrade. Returns the
/// version-1 container.
async fn killed_mid_upgrade(h: &mut Harness, name: &str) -> String {
    let old = serving(h, name).await;
    h.restart_with_catalog(&catalog("2", e2e::HTTPD)).await;
    wait_until("the version-2 successor created", CONVERGE, || async {
        containers_of(name) >= 2
    })
    .await;
    h.kill().await;
    old
}

/// How many containers, running or not, the runtime has of `instance`.
fn containers_of(instance: &str) -> usize {
    let filter = format!("label=stead.instance={instance}");
    docker(&["ps", "-aq", "--filter", &filter])
        .unwrap_or_default()
        .lines()
        .count()
}

/// #40's bar: killed with -9 between creating the successor and switching
/// ACTIVE, restarted at once on a catalog bumped again: the restarted
/// identity takes back the task its previous incarnation held (T1), the
/// upgrade sweeps the half-made candidate, and the instance runs the newest
/// version with one container, long before the task lease (600 s) would
/// have let the work go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_upgrade_and_bumped_again_it_runs_the_newest_version_alone() {
    let name = unique("e2ekillbump");
    let _cleanup = Cleanup::new(&name);
    let mut h = Harness::start(Setup::default()).await;
    let old = killed_mid_upgrade(&mut h, &name).await;
    h.restart_with_catalog(&catalog("3", e2e::HTTPD)).await;
    let store = h.daemon().ports.store.clone();
    let took = wait_until(
        "the newest version, alone and serving",
        CONVERGE,
        || async {
            let active = store
                .load_active(&stead::core::types::InstanceName::new(&name))
                .await
                .unwrap_or_default();
            let at_3 = active
                .services
                .values()
                .all(|s| s.effective_revision.starts_with("3."));
            at_3 && !active.services.is_empty()
                && containers_of(&name) == 1
                && h.get(&name).await == 200
        },
    )
    .await;
    assert!(
        took < Duration::from_secs(30),
        "converged in {took:?}: the restarted daemon took its task back at once, not after \
         the task lease"
    );
    assert!(
        inspect(&old, "{{.Id}}").is_err(),
        "the version-1 container is gone"
    );
    let row = store
        .instance(&stead::core::types::InstanceName::new(&name))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.version, "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_instance_is_served_and_recovered() {
    let name = unique("e2epg");
    let _cleanup = Cleanup::new(&name);
    let url = support::fresh_postgres_database().await;
    stead::store::sql::migrate(&url).await.expect("migrate");
    let h = Harness::start(Setup {
        database_url: Some(url),
        ..Setup::default()
    })
    .await;
    let id = serving(&h, &name).await;
    docker(&["kill", &id]).unwrap();
    wait_until("withdrawn", Duration::from_secs(10), || async {
        h.get(&name).await == 404
    })
    .await;
    wait_until("served again", CONVERGE, || async {
        h.get(&name).await == 200
    })
    .await;
}
