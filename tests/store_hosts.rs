//! Public host name reservations (#54), run against every backend as
//! `tests/store_suite.rs` runs its suite: the in-memory model, SQLite and
//! Postgres. A host is reserved for the first live instance that claims
//! it and stays reserved until that instance is deleted.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use stead::core::fleet::{InstanceState, NewTask, TaskKind};
use stead::core::hosts::{HostReservation, HOSTS_PER_CLAIM_MAX};
use stead::core::types::{InstanceName, ServiceName};
use stead::ports::{NewInstance, Store, StoreError};
use support::TestStore;

macro_rules! store_suite {
    (all: [$($all:ident),* $(,)?], sql: [$($sql:ident),* $(,)?]) => {
        mod memory {
            $(#[tokio::test] async fn $all() { super::$all(super::support::memory().await).await })*
        }
        mod sqlite {
            $(#[tokio::test] async fn $all() { super::$all(super::support::sqlite().await).await })*
            $(#[tokio::test] async fn $sql() { super::$sql(super::support::sqlite().await).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $all() { super::$all(super::support::postgres().await).await })*
            $(#[tokio::test] async fn $sql() { super::$sql(super::support::postgres().await).await })*
        }
    };
}

store_suite! {
    all: [
        a_host_is_reserved_for_the_first_instance_that_claims_it,
        a_reservation_outlasts_stop_and_upgrade_and_is_not_taken_over,
        a_deleted_holders_host_goes_to_the_next_claimant,
        an_instance_that_is_not_live_reserves_nothing,
        a_stale_lease_holders_claim_is_fenced_and_reserves_nothing,
        racing_claimants_of_one_host_all_see_one_holder,
        a_claim_of_more_hosts_than_a_service_may_have_is_refused,
    ],
    sql: [
        the_schema_keeps_one_holder_per_host_and_drops_a_reservation_with_its_instance,
    ]
}

const HOST: &str = "shop.example.com";

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn new_instance(name: &str) -> NewInstance {
    NewInstance {
        domains: Vec::new(),
        spec_digest: None,
        parameters: Default::default(),
        name: InstanceName::new(name),
        team: "team-a".into(),
        service_type: "shop".into(),
        version: "1.0".into(),
        expires_at: None,
        maintenance_window: None,
    }
}

async fn instance(store: &dyn Store, name: &str) -> i64 {
    store
        .create_instance(&new_instance(name), t(0))
        .await
        .unwrap()
        .id
}

async fn claim(
    store: &dyn Store,
    instance: &str,
    hosts: &[&str],
    at: i64,
) -> Result<Vec<HostReservation>, StoreError> {
    let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
    store
        .reserve_hosts(
            &InstanceName::new(instance),
            &ServiceName::new("web"),
            &hosts,
            t(at),
            None,
        )
        .await
}

/// The (host, holder) pairs of an answer.
fn holders(answer: &[HostReservation]) -> Vec<(&str, &str)> {
    answer
        .iter()
        .map(|r| (r.host.as_str(), r.instance.as_str()))
        .collect()
}

/// Takes instance `id` through a deprovision to `deleted`.
async fn delete(store: &dyn Store, id: i64, at: i64) {
    let current = store.instance_by_id(id).await.unwrap().unwrap().state;
    let task = NewTask {
        kind: TaskKind::Deprovision,
        instance: id,
        run_after: t(at),
        reason: "test".into(),
        traceparent: None,
    };
    let expired = store
        .expire_instance(id, current, &task, t(at), None)
        .await
        .unwrap()
        .expect("deletion starts");
    let claimed = store.claim("w", t(at), 1).await.unwrap();
    assert_eq!(claimed[0].id, expired.task);
    assert!(store
        .set_instance_state(id, InstanceState::Deleting, InstanceState::Deleted, t(at))
        .await
        .unwrap());
    assert!(store.complete(expired.task, "w", t(at)).await.unwrap());
}

async fn a_host_is_reserved_for_the_first_instance_that_claims_it(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    instance(store, "beta").await;
    let first = claim(store, "alpha", &[HOST, "alpha.example.com"], 1)
        .await
        .unwrap();
    assert_eq!(
        holders(&first),
        vec![("alpha.example.com", "alpha"), (HOST, "alpha")],
        "{}",
        s.name()
    );
    assert_eq!(first[1].service.as_str(), "web");
    assert_eq!(first[1].created_at, t(1));
    let second = claim(store, "beta", &["beta.example.com", HOST], 2)
        .await
        .unwrap();
    assert_eq!(
        holders(&second),
        vec![("beta.example.com", "beta"), (HOST, "alpha")],
        "{}: the second claimant gets its own host, not alpha's",
        s.name()
    );
    assert_eq!(second[1].created_at, t(1), "the first claim stands");
    let again = claim(store, "alpha", &[HOST], 3).await.unwrap();
    assert_eq!(holders(&again), vec![(HOST, "alpha")]);
    let all = store.host_reservations().await.unwrap();
    assert_eq!(
        holders(&all),
        vec![
            ("alpha.example.com", "alpha"),
            ("beta.example.com", "beta"),
            (HOST, "alpha"),
        ]
    );
}

async fn a_reservation_outlasts_stop_and_upgrade_and_is_not_taken_over(s: TestStore) {
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    instance(store, "beta").await;
    claim(store, "alpha", &[HOST], 1).await.unwrap();
    store.set_instance_stopped(alpha, true, t(2)).await.unwrap();
    assert_eq!(
        holders(&claim(store, "beta", &[HOST], 3).await.unwrap()),
        vec![(HOST, "alpha")],
        "{}: stopped",
        s.name()
    );
    for (from, to) in [
        (InstanceState::Provisioning, InstanceState::Ready),
        (InstanceState::Ready, InstanceState::Upgrading),
    ] {
        assert!(store
            .set_instance_state(alpha, from, to, t(4))
            .await
            .unwrap());
        assert_eq!(
            holders(&claim(store, "beta", &[HOST], 5).await.unwrap()),
            vec![(HOST, "alpha")],
            "{}: {to:?}",
            s.name()
        );
    }
    store
        .set_instance_stopped(alpha, false, t(6))
        .await
        .unwrap();
    assert_eq!(
        holders(&claim(store, "alpha", &[HOST], 7).await.unwrap()),
        vec![(HOST, "alpha")]
    );
}

async fn a_deleted_holders_host_goes_to_the_next_claimant(s: TestStore) {
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    instance(store, "beta").await;
    claim(store, "alpha", &[HOST], 1).await.unwrap();
    delete(store, alpha, 10).await;
    assert!(
        store.host_reservations().await.unwrap().is_empty(),
        "{}: a deleted instance holds nothing",
        s.name()
    );
    let taken = claim(store, "beta", &[HOST], 11).await.unwrap();
    assert_eq!(holders(&taken), vec![(HOST, "beta")], "{}", s.name());
    assert_eq!(taken[0].created_at, t(11));
    // A new instance under the deleted one's name (its row goes, and its
    // reservations with it) is a stranger to the host.
    instance(store, "alpha").await;
    assert_eq!(
        holders(&claim(store, "alpha", &[HOST], 12).await.unwrap()),
        vec![(HOST, "beta")],
        "{}",
        s.name()
    );
}

async fn an_instance_that_is_not_live_reserves_nothing(s: TestStore) {
    let store = &*s.store;
    assert!(claim(store, "ghost", &[HOST], 1).await.unwrap().is_empty());
    let alpha = instance(store, "alpha").await;
    delete(store, alpha, 2).await;
    assert!(claim(store, "alpha", &[HOST], 3).await.unwrap().is_empty());
    assert!(store.host_reservations().await.unwrap().is_empty());
    instance(store, "beta").await;
    assert_eq!(
        holders(&claim(store, "beta", &[HOST], 4).await.unwrap()),
        vec![(HOST, "beta")],
        "{}",
        s.name()
    );
}

async fn a_stale_lease_holders_claim_is_fenced_and_reserves_nothing(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let a = store
        .acquire_reconciler_lease("a", Duration::from_millis(200))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    store
        .acquire_reconciler_lease("b", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let fenced = store
        .reserve_hosts(
            &InstanceName::new("alpha"),
            &ServiceName::new("web"),
            &[HOST.to_owned()],
            t(1),
            Some(&a),
        )
        .await;
    assert_eq!(
        fenced,
        Err(StoreError::Fenced { epoch: a.epoch }),
        "{}",
        s.name()
    );
    assert!(store.host_reservations().await.unwrap().is_empty());
}

async fn racing_claimants_of_one_host_all_see_one_holder(s: TestStore) {
    const CLAIMANTS: usize = 8;
    let store: Arc<dyn Store> = s.store.clone();
    for i in 0..CLAIMANTS {
        instance(&*store, &format!("i{i}")).await;
    }
    let claims = (0..CLAIMANTS).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { claim(&*store, &format!("i{i}"), &[HOST], 1).await })
    });
    let mut seen = std::collections::BTreeSet::new();
    for answer in claims {
        let answer = answer.await.unwrap().unwrap();
        assert_eq!(answer.len(), 1, "{}", s.name());
        seen.insert(answer[0].instance.as_str().to_owned());
    }
    assert_eq!(seen.len(), 1, "{}: holders seen {seen:?}", s.name());
    let all = store.host_reservations().await.unwrap();
    assert_eq!(all.len(), 1);
    assert!(seen.contains(all[0].instance.as_str()));
}

async fn a_claim_of_more_hosts_than_a_service_may_have_is_refused(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let many: Vec<String> = (0..=HOSTS_PER_CLAIM_MAX)
        .map(|i| format!("h{i}.example.com"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let refused = claim(store, "alpha", &many, 1).await;
    match refused {
        Err(StoreError::Conflict(message)) => {
            assert!(message.contains("hosts"), "{}: {message}", s.name())
        }
        other => panic!("{}: {other:?}", s.name()),
    }
    assert!(store.host_reservations().await.unwrap().is_empty());
}

async fn the_schema_keeps_one_holder_per_host_and_drops_a_reservation_with_its_instance(
    s: TestStore,
) {
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    let beta = instance(store, "beta").await;
    claim(store, "alpha", &[HOST], 1).await.unwrap();
    let duplicate = s
        .raw(&format!(
            "INSERT INTO host_reservations (host, instance_id, service, created_at_us) \
             VALUES ('{HOST}', {beta}, 'web', 0)"
        ))
        .await
        .expect("a SQL store");
    assert!(duplicate.is_err(), "{}: a second holder", s.name());
    let orphan = s
        .raw(
            "INSERT INTO host_reservations (host, instance_id, service, created_at_us) \
             VALUES ('other.example.com', 999999, 'web', 0)",
        )
        .await
        .expect("a SQL store");
    assert!(orphan.is_err(), "{}: no such instance", s.name());
    s.raw(&format!("DELETE FROM instances WHERE id = {alpha}"))
        .await
        .expect("a SQL store")
        .unwrap();
    assert!(store.host_reservations().await.unwrap().is_empty());
    let rows = s
        .raw(&format!(
            "INSERT INTO host_reservations (host, instance_id, service, created_at_us) \
             VALUES ('{HOST}', {beta}, 'web', 0)"
        ))
        .await
        .expect("a SQL store");
    assert!(
        rows.is_ok(),
        "{}: the cascade freed the host: {rows:?}",
        s.name()
    );
}
