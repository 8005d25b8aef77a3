//! End-to-end: one daemon running a Docker type and a Helm type side by
//! side, against the real dockerd and Caddy, and `tests/fixtures/fake-helm`
//! (Helm 3's CLI contract over a state file; there is no cluster here).
//! Both instances are provisioned, upgraded on one catalog bump and
//! deprovisioned; 300 releases that are not stead's, some pending, cause
//! no reprovision of the Helm instance listed after them.

mod e2e;
mod support;
mod support_services;

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{catalog, wait_until, Harness, Setup, HTTPD};
use serde_json::{json, Value};
use stead::core::event_log::{EventFilter, EventKind};
use stead::core::fleet::{Instance, InstanceState, RolloutState, TaskKind, TaskState};
use stead::core::types::InstanceName;
use support_services::docker::{docker, Cleanup};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(60);
const HELM_TYPE: &str = "search";

/// The harness's Docker type `web` and a Helm type `search`, both at
/// `version` (the chart version follows the catalog version). The Helm
/// type bakes two seconds after an upgrade (#40).
fn both(version: &str) -> String {
    format!(
        r#"{docker}
[types.search]
version = "{version}"
provisioner = "helm"
bake_ms = 2000

[types.search.helm]
chart = "charts/search"
namespace = "{ns_prefix}{{instance}}"

[types.search.helm.values]
host = "{{instance}}.search.example"
"#,
        docker = catalog(version, HTTPD),
        ns_prefix = NAMESPACE_PREFIX,
    )
}

/// What the operator grants the Helm type (#54): its chart, and the
/// prefix its namespaces carry.
const NAMESPACE_PREFIX: &str = "t-";

fn helm_grants() -> String {
    format!(
        "[grants]\nhelm_charts = [\"charts/search\"]\nhelm_namespace_prefix = \"{NAMESPACE_PREFIX}\"\n"
    )
}

/// The namespace the Helm instance `name` lives in.
fn namespace_of(name: &str) -> String {
    format!("{NAMESPACE_PREFIX}{name}")
}

fn fake_kubectl() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-kubectl")
}

async fn instance(h: &Harness, name: &str) -> Option<Instance> {
    h.ops().find(name).await.ok()
}

fn fake_helm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-helm")
}

/// Every helm call the daemon made, as argument vectors.
fn helm_calls(log: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let call: Value = serde_json::from_str(line).expect("a JSON line");
            call["argv"]
                .as_array()
                .expect("argv")
                .iter()
                .map(|a| a.as_str().expect("a string").to_owned())
                .collect()
        })
        .collect()
}

/// The releases in the fake's state, as (name, namespace, status, chart version).
fn releases(state: &Path) -> Vec<(String, String, String, String)> {
    let text = std::fs::read_to_string(state.join("releases.json")).unwrap_or_default();
    let doc: Value = serde_json::from_str(&text).unwrap_or(json!({"releases": []}));
    doc["releases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (
                field("name"),
                field("namespace"),
                field("status"),
                field("chart_version"),
            )
        })
        .collect()
}

fn installs_of<'a>(
    calls: &'a [Vec<String>],
    release: &'a str,
) -> impl Iterator<Item = &'a Vec<String>> {
    calls.iter().filter(move |c| {
        c.first().is_some_and(|a| a == "upgrade") && c.get(2).is_some_and(|r| r == release)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_type_and_a_helm_type_provision_upgrade_and_deprovision_side_by_side() {
    let web = unique("e2ehweb");
    let _cleanup = Cleanup::new(&web);
    // Listed after the 300 seeded releases: helm's default cap of 256
    // would leave it out, and it would look missing every tick.
    let search = format!("z{}", unique("hs"));
    let _cleanup_search = Cleanup::new(&search);
    let fake = tempfile::tempdir().unwrap();
    let state = fake.path().join("state");
    let log = fake.path().join("calls.jsonl");
    std::fs::create_dir_all(&state).unwrap();
    let statuses = [
        "deployed",
        "failed",
        "pending-install",
        "pending-upgrade",
        "superseded",
    ];
    let foreign: Vec<Value> = (0..300)
        .map(|n| {
            json!({
                "name": format!("other-{n:03}"),
                "namespace": format!("team-{}", n % 5),
                "status": statuses[n % statuses.len()],
                "chart_version": "9.9.9",
                "revision": 1,
            })
        })
        .collect();
    std::fs::write(
        state.join("releases.json"),
        json!({"namespaces": ["default", "team-0", "team-1", "team-2", "team-3", "team-4"],
               "releases": foreign})
        .to_string(),
    )
    .unwrap();

    let mut h = Harness::start(Setup {
        catalog: both("1"),
        control_extra: "max_in_flight = 2".into(),
        helm_extra: format!(
            "path = \"{}\"\nkubectl_path = \"{}\"\nenv = {{ FAKE_HELM_STATE = \"{}\", FAKE_HELM_LOG = \"{}\" }}\n",
            fake_helm().display(),
            fake_kubectl().display(),
            state.display(),
            log.display()
        ),
        extra_config: helm_grants(),
        ..Setup::default()
    })
    .await;
    // Each upgrades inside its maintenance window: one open now, around
    // the current hour.
    let hour = h
        .daemon()
        .ports
        .clock
        .now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .hour();
    let window = format!("daily {:02}:00-{:02}:00", (hour + 23) % 24, (hour + 2) % 24);
    for (name, service_type) in [(&web, e2e::TYPE), (&search, HELM_TYPE)] {
        h.ops()
            .create(&stead::ops::CreateRequest {
                domains: Vec::new(),
                parameters: Default::default(),
                name: name.clone(),
                service_type: service_type.to_owned(),
                team: "e2e".to_owned(),
                version: None,
                ttl: None,
                maintenance_window: Some(window.clone()),
                exists_ok: false,
            })
            .await
            .expect("create instance");
    }

    // Provisioned: the Docker instance serves through Caddy; the Helm one
    // is ready with its release deployed in its own namespace.
    wait_until("both provisioned", CONVERGE, || async {
        let ready = h
            .ops()
            .find(&search)
            .await
            .is_ok_and(|i| i.state == InstanceState::Ready);
        ready && h.get(&web).await == 200
    })
    .await;
    let release = (
        search.clone(),
        namespace_of(&search),
        "deployed".to_owned(),
        "1".to_owned(),
    );
    assert!(
        releases(&state).contains(&release),
        "{:?}",
        releases(&state).last()
    );
    let calls = helm_calls(&log);
    let install = installs_of(&calls, &search)
        .next()
        .expect("helm installed it")
        .clone();
    for expected in ["--install", "charts/search", "--wait"] {
        assert!(install.contains(&expected.to_owned()), "{install:?}");
    }
    // stead made the namespace, with its Pod Security labels (#54).
    assert!(
        !install.contains(&"--create-namespace".to_owned()),
        "{install:?}"
    );
    assert!(
        install
            .windows(2)
            .any(|w| w == ["--namespace", namespace_of(&search).as_str()]),
        "{install:?}"
    );
    let labels: Value = serde_json::from_str(
        &std::fs::read_to_string(state.join("namespaces.json")).expect("namespaces were made"),
    )
    .unwrap();
    assert_eq!(
        labels[namespace_of(&search)]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    assert!(
        !install.contains(&"--atomic".to_owned()),
        "a first install has nothing to roll back to"
    );
    // Kubernetes runs it: no container of stead's, nothing in ACTIVE.
    let filter = format!("label=stead.instance={search}");
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &filter]).unwrap().trim(),
        ""
    );
    let active = h
        .daemon()
        .ports
        .store
        .load_active(&InstanceName::new(&search))
        .await
        .unwrap();
    assert!(active.services.is_empty(), "{active:?}");
    // stead status shows the release as Helm reports it.
    let status = stead::daemon::status::status(stead::daemon::status::StatusSources {
        store: h.daemon().ports.store.as_ref(),
        runtime: h.daemon().ports.runtime.as_ref(),
        catalog: &h.daemon().catalog.current(),
        memory: None,
        caddy_admin: None,
        provisioner: Some(h.daemon().ports.provisioner.as_ref()),
        database: String::new(),
        now: h.daemon().ports.clock.now(),
    })
    .await;
    let row = status
        .releases
        .iter()
        .find(|r| r.instance == search)
        .expect("a release row");
    assert_eq!(
        (row.release.as_str(), row.namespace.as_str()),
        ("deployed", namespace_of(&search).as_str())
    );
    assert!(
        status.rows.iter().all(|r| r.instance != search),
        "no container rows for it"
    );

    // Several ticks over 300 foreign releases (some pending): no
    // reprovision, and none of them touched.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls = helm_calls(&log);
    assert_eq!(
        installs_of(&calls, &search).count(),
        1,
        "no reprovision: {calls:?}"
    );
    let tasks = h.daemon().ports.store.tasks(true, 1000).await.unwrap().rows;
    assert!(
        !tasks.iter().any(|t| t.kind == TaskKind::Reprovision),
        "a spurious reprovision: {tasks:?}"
    );
    assert!(
        calls.iter().any(|c| c.first().is_some_and(|a| a == "list")),
        "drift listed releases"
    );
    assert!(calls
        .iter()
        .all(|c| c.first().is_none_or(|a| a != "uninstall")));
    assert_eq!(releases(&state).len(), 301);

    // A catalog bump: the Helm release is upgraded by helm (--atomic, the
    // new chart version), the Docker containers are swapped.
    let old = h
        .active_container(&web)
        .await
        .expect("ACTIVE names a container");
    h.restart_with_catalog(&both("2")).await;
    wait_until("both upgraded", 2 * CONVERGE, || async {
        let at_2 = |i: Option<Instance>| {
            i.is_some_and(|i| i.version == "2" && i.state == InstanceState::Ready)
        };
        at_2(instance(&h, &search).await)
            && at_2(instance(&h, &web).await)
            && h.active_container(&web).await.is_some_and(|c| c != old)
    })
    .await;
    let tasks = h.daemon().ports.store.tasks(true, 1000).await.unwrap().rows;
    let upgrades: Vec<_> = tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Upgrade)
        .collect();
    assert_eq!(
        upgrades.len(),
        2,
        "one upgrade each, both in flight at once: {upgrades:?}"
    );
    let calls = helm_calls(&log);
    let upgrade = installs_of(&calls, &search).last().unwrap().clone();
    assert!(upgrade.contains(&"--atomic".to_owned()), "{upgrade:?}");
    // It baked: the chart's tests ran at the end of the window, passed,
    // and the upgrade stood.
    wait_until("the bake's helm test", CONVERGE, || async {
        helm_calls(&log)
            .iter()
            .any(|c| c.first().is_some_and(|a| a == "test") && c.get(1) == Some(&search))
    })
    .await;
    assert!(
        upgrade.windows(2).any(|w| w == ["--version", "2"]),
        "{upgrade:?}"
    );
    let release = (
        search.clone(),
        namespace_of(&search),
        "deployed".to_owned(),
        "2".to_owned(),
    );
    assert!(releases(&state).contains(&release));
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &filter]).unwrap().trim(),
        ""
    );
    wait_until("the new Docker generation serves", CONVERGE, || async {
        h.get(&web).await == 200
    })
    .await;

    // #40: `rollout undo` of the Helm type goes back to the version the
    // daemon recorded before the catalog's (1, recorded when it first
    // loaded it): helm rolls the release back to its revision at chart 1.
    // `rollout undo --to 1` of the Docker type, past its bake, moves the
    // instance back by an upgrade, with no gap.
    let helm_undo = h.ops().undo_rollout(HELM_TYPE).await.unwrap();
    let docker_undo = h.ops().undo_rollout_to(e2e::TYPE, "1").await.unwrap();
    for (undo, name) in [(helm_undo, &search), (docker_undo, &web)] {
        assert_eq!(undo.pinned.as_deref(), Some("1"), "{undo:?}");
        assert_eq!(
            undo.moving,
            vec![InstanceName::new(name.as_str())],
            "{undo:?}"
        );
    }
    let moved = h.active_container(&web).await;
    wait_until("both back at 1", 2 * CONVERGE, || async {
        let at_1 = |i: Option<Instance>| {
            i.is_some_and(|i| i.version == "1" && i.state == InstanceState::Ready)
        };
        at_1(instance(&h, &search).await)
            && at_1(instance(&h, &web).await)
            && h.active_container(&web).await != moved
    })
    .await;
    let calls = helm_calls(&log);
    let rollback = calls
        .iter()
        .find(|c| c.first().is_some_and(|a| a == "rollback"))
        .unwrap_or_else(|| panic!("helm rollback was run: {calls:?}"));
    assert_eq!(rollback[1], search, "{rollback:?}");
    let release = (
        search.clone(),
        namespace_of(&search),
        "deployed".to_owned(),
        "1".to_owned(),
    );
    assert!(
        releases(&state).contains(&release),
        "{:?}",
        releases(&state)
    );
    wait_until("version 1 serves again", CONVERGE, || async {
        h.get(&web).await == 200
    })
    .await;

    // Deprovisioned: the release uninstalled, the containers removed; the
    // foreign releases are still there.
    h.ops().delete(&web, false).await.unwrap();
    h.ops().delete(&search, false).await.unwrap();
    wait_until("both deleted", CONVERGE, || async {
        let gone = |i: Option<Instance>| i.is_some_and(|i| i.state == InstanceState::Deleted);
        gone(instance(&h, &search).await) && gone(instance(&h, &web).await)
    })
    .await;
    let calls = helm_calls(&log);
    assert!(
        calls
            .iter()
            .any(|c| c.first().is_some_and(|a| a == "uninstall") && c.get(1) == Some(&search)),
        "{calls:?}"
    );
    let left = releases(&state);
    assert!(left.iter().all(|r| r.0 != search), "uninstalled: {left:?}");
    assert_eq!(left.len(), 300, "nothing of anyone else's was deleted");
    let web_filter = format!("label=stead.instance={web}");
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &web_filter])
            .unwrap()
            .trim(),
        ""
    );
    h.shutdown().await;
}

/// #40: a Helm release that `helm upgrade --atomic --wait` installed and
/// whose chart tests then fail goes back: the bake rolls it back to its
/// previous revision (`helm rollback` with no revision), the instance
/// records its old version again, the type's rollout halts with the reason,
/// and the event log has the revert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_release_whose_tests_fail_while_baking_is_rolled_back_and_its_rollout_halted() {
    let search = format!("z{}", unique("hb"));
    let _cleanup = Cleanup::new(&search);
    let fake = tempfile::tempdir().unwrap();
    let state = fake.path().join("state");
    let log = fake.path().join("calls.jsonl");
    std::fs::create_dir_all(&state).unwrap();
    let mut h = Harness::start(Setup {
        catalog: both("1"),
        helm_extra: format!(
            "path = \"{}\"\nkubectl_path = \"{}\"\nenv = {{ FAKE_HELM_STATE = \"{}\", FAKE_HELM_LOG = \"{}\", \
             FAKE_HELM_FAIL_TEST_CHART_VERSIONS = \"2\" }}\n",
            fake_helm().display(),
            fake_kubectl().display(),
            state.display(),
            log.display()
        ),
        extra_config: helm_grants(),
        ..Setup::default()
    })
    .await;
    h.ops()
        .create(&stead::ops::CreateRequest {
            domains: Vec::new(),
            parameters: Default::default(),
            name: search.clone(),
            service_type: HELM_TYPE.to_owned(),
            team: "e2e".to_owned(),
            version: None,
            ttl: None,
            maintenance_window: None,
            exists_ok: false,
        })
        .await
        .expect("create instance");
    wait_until("provisioned", CONVERGE, || async {
        instance(&h, &search)
            .await
            .is_some_and(|i| i.state == InstanceState::Ready && i.version == "1")
    })
    .await;

    // Chart 2 installs (helm's --wait is satisfied) and then fails its
    // tests at the end of the bake.
    h.restart_with_catalog(&both("2")).await;
    wait_until(
        "the upgrade reverted and the rollout halted",
        2 * CONVERGE,
        || async {
            let rollouts = h.daemon().ports.store.rollout_records().await.unwrap();
            rollouts
                .iter()
                .any(|r| r.service_type == HELM_TYPE && r.state == RolloutState::Halted)
        },
    )
    .await;
    let calls = helm_calls(&log);
    let upgraded =
        installs_of(&calls, &search).any(|c| c.windows(2).any(|w| w == ["--version", "2"]));
    assert!(upgraded, "helm upgraded it to chart 2 first: {calls:?}");
    let rollback = calls
        .iter()
        .find(|c| c.first().is_some_and(|a| a == "rollback"))
        .unwrap_or_else(|| panic!("helm rollback was run: {calls:?}"));
    // To revision 1, the newest at another chart than the bad one.
    assert_eq!(
        rollback[..3],
        ["rollback".to_owned(), search.clone(), "1".to_owned()],
        "{rollback:?}"
    );
    let release = (
        search.clone(),
        namespace_of(&search),
        "deployed".to_owned(),
        "1".to_owned(),
    );
    assert!(
        releases(&state).contains(&release),
        "{:?}",
        releases(&state)
    );
    let row = instance(&h, &search).await.expect("the instance");
    assert_eq!(row.version, "1", "the old version recorded again: {row:?}");
    assert_eq!(row.state, InstanceState::Ready);
    let halted = h
        .daemon()
        .ports
        .store
        .rollout_records()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.service_type == HELM_TYPE)
        .expect("the type's switch");
    assert!(
        halted.reason.contains("went bad while baking"),
        "{halted:?}"
    );
    let tasks = h.daemon().ports.store.tasks(true, 1000).await.unwrap().rows;
    let upgrade = tasks
        .iter()
        .find(|t| t.kind == TaskKind::Upgrade)
        .expect("the upgrade task");
    assert_eq!(
        upgrade.state,
        TaskState::Failed,
        "failed for good: {upgrade:?}"
    );
    wait_until("the revert's event", CONVERGE, || async {
        let filter = EventFilter {
            instance: Some(InstanceName::new(search.as_str())),
            kind: Some(EventKind::Revert),
            ..EventFilter::default()
        };
        let events = h.daemon().ports.store.events(&filter).await.unwrap().rows;
        events
            .iter()
            .any(|e| e.event.message.contains("went bad while baking"))
    })
    .await;
    // Halted: no second attempt at chart 2.
    let upgrades_to_2 = installs_of(&helm_calls(&log), &search)
        .filter(|c| c.windows(2).any(|w| w == ["--version", "2"]))
        .count();
    assert_eq!(upgrades_to_2, 1);
    h.shutdown().await;
}
