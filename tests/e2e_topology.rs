//! End-to-end in the topologies stead documents (docs/operations.md, "Topologies",
//! docs/operations.md "Topologies"): a daemon killed with SIGKILL and
//! started again, a Caddy restarted without its saved config, two full
//! daemons on one Postgres, separate reconciler and worker processes, and
//! names that glue into each other. Real dockerd, Caddy, SQLite and
//! Postgres, as the rest of the e2e suite.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{catalog, cli, daemon_log, inspect, wait_until, DaemonProcess, Harness, Setup, HTTPD};
use stead::daemon::Role;
use support_services::caddy::CaddyProcess;
use support_services::docker::{docker, Cleanup, StartCounter};
use support_services::{free_port, unique};

const CONVERGE: Duration = Duration::from_secs(60);

async fn get(listen: &str, instance: &str) -> u16 {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    match client
        .get(format!("http://{listen}/"))
        .header("host", format!("{}.{instance}.localhost", e2e::SERVICE))
        .send()
        .await
    {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// T1: the killed daemon's successor process keeps its identity, takes
/// its lease back at once and recovers within one tick, instead of waiting
/// out its own lease (minutes) as a stranger would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_with_sigkill_reconciles_within_one_tick_of_its_restart() {
    const TICK_S: u64 = 5;
    let name = unique("e2ek9");
    let _cleanup = Cleanup::new(&name);
    let caddy = CaddyProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    std::fs::write(dir.path().join("catalog.toml"), catalog("1", HTTPD)).unwrap();
    let config = format!(
        r#"
state_dir = "{state}"
catalog = "{state}/catalog.toml"
admin_listen = ""
worker_idle_poll_ms = 100
[control]
tick_interval_s = {TICK_S}
lease_s = 10
provisioner_timeout_s = 5
[caddy]
admin = "{admin}"
listen = "{listen}"
"#,
        state = dir.path().display(),
        admin = caddy.admin_addr,
    );
    std::fs::write(dir.path().join("stead.toml"), config).unwrap();
    cli(dir.path(), &["migrate"]);
    let mut daemon = DaemonProcess::spawn(dir.path());
    cli(
        dir.path(),
        &["instance", "create", &name, "--type", e2e::TYPE],
    );
    wait_until("served", CONVERGE, || async {
        get(&listen, &name).await == 200
    })
    .await;
    let id = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=stead.instance={name}"),
    ])
    .expect("the container");

    // SIGKILL: no shutdown, the lease and any lock are left behind.
    daemon.kill_9();
    let before = inspect(&id, "{{.State.StartedAt}}").unwrap();
    docker(&["kill", &id]).expect("docker kill");

    let daemon = DaemonProcess::spawn(dir.path());
    let took = wait_until("recovered by the new process", CONVERGE, || async {
        inspect(&id, "{{.State.StartedAt}}").is_ok_and(|s| s != before)
            && get(&listen, &name).await == 200
    })
    .await;
    drop(daemon);
    let log = daemon_log(dir.path());
    assert!(
        took <= Duration::from_secs(TICK_S + 10),
        "recovered {took:?} after the restart, not within one {TICK_S} s tick; daemon log:\n{log}"
    );
}

/// T5: Caddy restarted without `--resume` comes back empty; within one
/// tick every verified route is republished, and no steady container is
/// touched to do it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_come_back_within_one_tick_after_caddy_restarts_without_its_config() {
    let names = [unique("e2ecr"), unique("e2ecr")];
    let _cleanup: Vec<Cleanup> = names.iter().map(|n| Cleanup::new(n)).collect();
    let mut h = Harness::start(Setup::default()).await;
    let mut started = Vec::new();
    for name in &names {
        h.create(name, None).await;
        wait_until("served", CONVERGE, || async { h.get(name).await == 200 }).await;
        let id = h.active_container(name).await.unwrap();
        started.push((id.clone(), inspect(&id, "{{.State.StartedAt}}").unwrap()));
    }
    let recreated_before = h.daemon().caddy.servers_created();
    h.caddy.restart_without_resume().await;
    let took = wait_until("every route back", Duration::from_secs(20), || async {
        let mut all = true;
        for name in &names {
            all &= h.get(name).await == 200;
        }
        all
    })
    .await;
    assert!(
        took <= Duration::from_secs(1 + 5),
        "routes back after {took:?}, not within the one-second tick"
    );
    // That Caddy came back empty is proven by stead having had to create
    // its server again; asking Caddy for a 404 first would race the tick
    // that already repaired it.
    assert!(
        h.daemon().caddy.servers_created() > recreated_before,
        "Caddy did not lose its config: the test proved nothing"
    );
    for (id, before) in started {
        assert_eq!(
            inspect(&id, "{{.State.StartedAt}}").unwrap(),
            before,
            "a steady container was restarted to republish its route"
        );
    }
}

/// T2, T3: two full daemons on one Postgres. Only the lease holder acts,
/// so a crash-looping container gets exactly the budget's starts, not
/// twice as many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_one_postgres_start_a_crash_loop_exactly_as_budgeted() {
    let name = unique("e2e2d");
    let _cleanup = Cleanup::new(&name);
    let url = support::fresh_postgres_database().await;
    stead::store::sql::migrate(&url).await.expect("migrate");
    let h = Harness::start(Setup {
        database_url: Some(url),
        catalog: catalog("1", "httpd -p 8080 -h /www; sleep 2; exit 3")
            .replace("attempts_max = 100", "attempts_max = 10"),
        ..Setup::default()
    })
    .await;
    let mut standby = h.peer(Role::All).await;
    let counter = StartCounter::follow(&name);
    h.create(&name, None).await;
    // One start from the worker's create, then three by recovery.
    wait_until("four starts", 2 * CONVERGE, || async {
        counter.starts() >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        counter.starts(),
        4,
        "exactly three recovery starts across both daemons, then the budget waits"
    );
    standby.shutdown().await;
}

/// T1, issue #41: two `stead run` processes started from one copied
/// `state_dir` share an identity on one Postgres. The copy holds another
/// identity lock (another site), so it never takes the lease from the live
/// holder: a crash-looping container gets exactly the budget's starts, not
/// one budget per process (before, each took the lease back from the other
/// at every tick, and both recovered it), and the waiting one logs the
/// error that names the identity and both incarnations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_from_one_copied_state_dir_start_a_crash_loop_exactly_as_budgeted() {
    const TICK_S: u64 = 2;
    const TWIN: &str = "two live processes share identity";
    let name = unique("e2etw");
    let _cleanup = Cleanup::new(&name);
    let caddy = CaddyProcess::start().await;
    let url = support::fresh_postgres_database().await;
    let first = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let catalog_path = first.path().join("catalog.toml");
    std::fs::write(
        &catalog_path,
        catalog("1", "httpd -p 8080 -h /www; sleep 2; exit 3")
            .replace("attempts_max = 100", "attempts_max = 10"),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    for dir in [first.path(), copy.path()] {
        let config = format!(
            r#"
state_dir = "{state}"
catalog = "{catalog}"
database_url = "{url}"
admin_listen = ""
worker_idle_poll_ms = 100
[control]
tick_interval_s = {TICK_S}
lease_s = 10
provisioner_timeout_s = 5
[caddy]
admin = "{admin}"
listen = "{listen}"
"#,
            state = dir.display(),
            catalog = catalog_path.display(),
            admin = caddy.admin_addr,
        );
        std::fs::write(dir.join("stead.toml"), config).unwrap();
    }
    cli(first.path(), &["migrate"]);
    let holder = DaemonProcess::spawn(first.path());
    wait_until("the identity is made", CONVERGE, || async {
        first.path().join("identity").exists()
    })
    .await;
    // The copy: the identity file (and the lock file's contents) as a
    // backup restored elsewhere, or a cloned VM image, would carry them.
    for file in ["identity", "identity.lock"] {
        std::fs::copy(first.path().join(file), copy.path().join(file)).unwrap();
    }
    let twin = DaemonProcess::spawn(copy.path());
    let counter = StartCounter::follow(&name);
    cli(
        first.path(),
        &["instance", "create", &name, "--type", e2e::TYPE],
    );
    let logs = || {
        [first.path(), copy.path()]
            .map(daemon_log)
            .join("\n--- the copy's log ---\n")
    };
    // One start from the worker's create, then three by recovery.
    wait_until("four starts", 2 * CONVERGE, || async {
        counter.starts() >= 4
    })
    .await;
    // Three more ticks of each process: a twin that acted would start the
    // container again (its own budget has three free attempts); the
    // holder's budget waits a minute. Then the twin's report, which came
    // with its second tick.
    let window = tokio::time::Instant::now();
    while window.elapsed() < Duration::from_secs(3 * TICK_S) {
        assert_eq!(
            counter.starts(),
            4,
            "exactly three recovery starts across both processes, then the budget waits; logs:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_until("the twin is reported", CONVERGE, || async {
        logs().contains(TWIN)
    })
    .await;
    drop((holder, twin));
    let logs = logs();
    let line = logs
        .lines()
        .find(|l| l.contains(TWIN))
        .expect("the error line");
    assert!(line.contains("ERROR"), "{line}");
    let identity = std::fs::read_to_string(first.path().join("identity")).unwrap();
    assert!(
        line.contains(&format!("identity {}", identity.trim())),
        "names the identity: {line}"
    );
    assert!(
        line.matches(&format!("{}#", identity.trim())).count() >= 2,
        "names both incarnations: {line}"
    );
}

/// T3: separate reconciler and worker processes during an upgrade. The
/// worker builds the successor under the instance lock, the reconciler
/// routes it and retires the predecessor, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_reconciler_and_worker_processes_upgrade_without_a_failed_request() {
    let name = unique("e2esplit");
    let _cleanup = Cleanup::new(&name);
    let url = support::fresh_postgres_database().await;
    stead::store::sql::migrate(&url).await.expect("migrate");
    let mut h = Harness::start(Setup {
        database_url: Some(url),
        role: Role::Reconciler,
        ..Setup::default()
    })
    .await;
    let mut worker = h.peer(Role::Worker).await;
    h.create(&name, None).await;
    wait_until("served", CONVERGE, || async { h.get(&name).await == 200 }).await;
    let old = h.active_container(&name).await.unwrap();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (listen, instance) = (h.listen.clone(), name.clone());
    let requests = tokio::spawn(async move {
        let mut failures = Vec::new();
        let mut total = 0;
        while !*stop_rx.borrow() {
            total += 1;
            let status = get(&listen, &instance).await;
            if status != 200 {
                failures.push(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (failures, total)
    });
    // The reconciler plans the upgrade on the new catalog; the worker
    // process (built before the change) is rebuilt on it too.
    h.restart_with_catalog(&catalog("2", HTTPD)).await;
    worker.shutdown().await;
    let mut worker = h.peer(Role::Worker).await;
    wait_until("upgraded and predecessor retired", 2 * CONVERGE, || async {
        h.active_container(&name).await.is_some_and(|n| n != old)
            && inspect(&old, "{{.Id}}").is_err()
    })
    .await;
    stop_tx.send(true).unwrap();
    let (failures, total) = requests.await.unwrap();
    assert!(total > 10, "the loop ran ({total} requests)");
    assert!(
        failures.is_empty(),
        "{failures:?} of {total} requests failed"
    );
    worker.shutdown().await;
}

/// T6: instance `a-api` with service `web` and instance `a` with service
/// `api-web` were one route and one container name under the old dashed
/// scheme. Both are served, each by its own container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_whose_dashed_names_collide_are_both_served() {
    let prefix = unique("e2en");
    let (first, second) = (format!("{prefix}a-api"), format!("{prefix}a"));
    let _cleanup = [Cleanup::new(&first), Cleanup::new(&second)];
    let two_types = catalog("1", HTTPD)
        + &catalog("1", HTTPD)
            .replace("types.web", "types.other")
            .replace("name = \"http\"", "name = \"api-http\"");
    let h = Harness::start(Setup {
        catalog: two_types,
        ..Setup::default()
    })
    .await;
    // `<p>a-api` / `http` and `<p>a` / `api-http`: `stead-<p>a-api-http-1`
    // both, under the old scheme.
    h.create_typed(&first, e2e::TYPE, None).await;
    h.create_typed(&second, "other", None).await;
    wait_until("first served", CONVERGE, || async {
        h.get(&first).await == 200
    })
    .await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_until("second served", CONVERGE, || async {
        client
            .get(format!("http://{}/", h.listen))
            .header("host", format!("api-http.{second}.localhost"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let ids: Vec<String> = [&first, &second]
        .iter()
        .map(|n| docker(&["ps", "-q", "--filter", &format!("label=stead.instance={n}")]).unwrap())
        .collect();
    assert_ne!(ids[0], ids[1], "one container each");
    assert_eq!(h.get(&first).await, 200, "still served");
}

/// Issue #41 item 8: a standby writes nothing to Caddy before it holds the
/// lease. Its Caddy here is its own, fresh one, so anything it wrote would
/// show; before, `stead run` created its server there at start, whoever
/// held the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_writes_nothing_to_caddy_before_it_holds_the_lease() {
    let url = support::fresh_postgres_database().await;
    stead::store::sql::migrate(&url).await.expect("migrate");
    let h = Harness::start(Setup {
        database_url: Some(url),
        ..Setup::default()
    })
    .await;
    wait_until("the harness's daemon leads", CONVERGE, || async {
        h.daemon().reconciler.holds_lease()
    })
    .await;
    let fresh = CaddyProcess::start().await;
    let fresh_admin = fresh.admin_addr.clone();
    let mut standby = h
        .peer_with(Role::All, |config| {
            config.caddy.admin = fresh_admin;
            config.caddy.listen = format!("127.0.0.1:{}", free_port());
        })
        .await;
    let server = h.daemon().config.caddy.server_name.clone();
    let servers_url = format!("http://{}/config/apps/http/servers", fresh.admin_addr);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // Several of the standby's ticks (one a second), each finding the
    // lease held.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!standby.daemon.reconciler.holds_lease());
        let servers = client
            .get(&servers_url)
            .send()
            .await
            .expect("the fresh caddy answers")
            .text()
            .await
            .unwrap();
        assert!(
            !servers.contains(&server),
            "the standby wrote its server into caddy: {servers}"
        );
    }
    standby.shutdown().await;
}
