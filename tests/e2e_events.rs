//! End-to-end (#42): the event log the daemon writes against real dockerd,
//! Caddy and SQLite, as `stead events` and `stead timeline` read it: a
//! container killed by hand is withdrawn, started and republished, each
//! step one row naming its rule, written while the daemon runs and kept
//! when it stops.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{wait_until, Harness, Setup};
use stead::core::event_log::{EventFilter, EventKind};
use stead::core::types::InstanceName;
use support_services::docker::{docker, Cleanup};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(60);

async fn kinds(h: &Harness, name: &str) -> Vec<(EventKind, String)> {
    h.daemon()
        .ports
        .store
        .events(&EventFilter {
            instance: Some(InstanceName::new(name)),
            ..Default::default()
        })
        .await
        .expect("the event log reads")
        .rows
        .into_iter()
        .map(|e| (e.event.kind, e.event.reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_containers_recovery_is_in_the_event_log_step_by_step() {
    let name = unique("e2eevents");
    let _cleanup = Cleanup::new(&name);
    let mut h = Harness::start(Setup::default()).await;
    h.create(&name, None).await;
    wait_until("served through caddy", CONVERGE, || async {
        h.get(&name).await == 200
    })
    .await;
    let id = h.active_container(&name).await.expect("ACTIVE names one");
    wait_until("the first publication is logged", CONVERGE, || async {
        kinds(&h, &name)
            .await
            .iter()
            .any(|(k, _)| *k == EventKind::Publish)
    })
    .await;
    let before = kinds(&h, &name).await.len();
    docker(&["kill", &id]).expect("docker kill");
    wait_until("started and republished, and logged", CONVERGE, || async {
        let after = kinds(&h, &name).await;
        let recent = &after[before.min(after.len())..];
        recent.contains(&(EventKind::Start, "R9".to_owned()))
            && recent.iter().any(|(k, _)| *k == EventKind::Publish)
    })
    .await;
    let events = kinds(&h, &name).await;
    let recent = &events[before..];
    let start = recent
        .iter()
        .position(|e| *e == (EventKind::Start, "R9".to_owned()))
        .unwrap();
    let publish = recent
        .iter()
        .rposition(|(k, _)| *k == EventKind::Publish)
        .unwrap();
    assert!(start < publish, "started, then published: {recent:?}");
    assert!(
        events.contains(&(EventKind::TaskDone, "C11".to_owned())),
        "the provision's end: {events:?}"
    );
    // What the daemon wrote is kept after it stops.
    h.shutdown().await;
    let store = stead::store::sql::connect(&format!(
        "sqlite://{}?mode=rwc",
        h.dir.path().join("stead.db").display()
    ))
    .await
    .unwrap();
    let kept = store
        .events(&EventFilter {
            instance: Some(InstanceName::new(&name)),
            ..Default::default()
        })
        .await
        .unwrap()
        .rows;
    assert!(kept.len() >= events.len(), "{kept:?}");
    assert!(kept.iter().all(|e| !e.event.writer.is_empty()));
}
