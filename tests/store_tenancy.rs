//! The store's tokens and quota-held creates (#54), run against every
//! backend as `tests/store_suite.rs` runs its behaviours: the in-memory
//! model, SQLite (a temp file) and Postgres (a fresh database in the test
//! server; see `tests/support`).
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::sync::Arc;

use jiff::Timestamp;
use stead::core::fleet::InstanceState;
use stead::core::types::InstanceName;
use stead::ports::tenancy::secret_sha256;
use stead::ports::{
    NewInstance, NewToken, QuotaCharge, QuotaUsage, Revocation, Store, TeamQuota, TokenRole,
};
use support::TestStore;

macro_rules! tenancy_suite {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
              async fn $name() { super::$name(super::support::memory().await).await })*
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
              async fn $name() { super::$name(super::support::sqlite().await).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
              async fn $name() { super::$name(super::support::postgres().await).await })*
        }
    };
}

tenancy_suite! {
    tokens_are_created_listed_and_found_by_their_secrets_hash_only,
    revoking_a_token_twice_keeps_its_first_revocation,
    token_expiry_and_revocation_make_it_not_live,
    a_quota_refuses_the_create_that_would_pass_it_and_writes_nothing,
    twenty_concurrent_creates_against_a_quota_of_five_create_exactly_five,
    deleted_instances_free_their_quota,
    an_event_carries_its_instances_team_and_is_read_by_team,
}

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn new_token(team: &str, secret: &str) -> NewToken {
    NewToken {
        team: team.into(),
        role: TokenRole::Tenant,
        secret_sha256: secret_sha256(secret),
        label: "ci".into(),
        expires_at: None,
    }
}

fn new_instance(name: &str, team: &str) -> NewInstance {
    NewInstance {
        domains: Vec::new(),
        spec_digest: None,
        parameters: Default::default(),
        name: InstanceName::new(name),
        team: team.into(),
        service_type: "wiki".into(),
        version: "1.0".into(),
        expires_at: None,
        maintenance_window: None,
    }
}

fn max_instances(n: u64) -> TeamQuota {
    TeamQuota {
        max_instances: Some(n),
        ..TeamQuota::default()
    }
}

async fn tokens_are_created_listed_and_found_by_their_secrets_hash_only(s: TestStore) {
    let store = &*s.store;
    let a = store
        .create_token(&new_token("a", "stead_one"), t(0))
        .await
        .unwrap();
    let mut operator = new_token("ops", "stead_two");
    operator.role = TokenRole::Operator;
    operator.expires_at = Some(t(60));
    let b = store.create_token(&operator, t(1)).await.unwrap();
    assert_ne!(a.id, b.id, "{}", s.name());
    assert_eq!(
        (a.team.as_str(), a.role, a.created_at),
        ("a", TokenRole::Tenant, t(0))
    );
    assert_eq!((b.role, b.expires_at), (TokenRole::Operator, Some(t(60))));
    assert_eq!(store.tokens().await.unwrap(), vec![a.clone(), b.clone()]);
    let found = store
        .token_by_secret_sha256(&secret_sha256("stead_one"))
        .await
        .unwrap();
    assert_eq!(found, Some(a.clone()));
    assert_eq!(a.secret_sha256, secret_sha256("stead_one"));
    assert!(!a.secret_sha256.contains("stead_one"));
    let missing = store
        .token_by_secret_sha256(&secret_sha256("stead_three"))
        .await
        .unwrap();
    assert_eq!(missing, None);
    // The same secret twice is refused: a hash names one token.
    assert!(store
        .create_token(&new_token("c", "stead_one"), t(2))
        .await
        .is_err());
}

async fn revoking_a_token_twice_keeps_its_first_revocation(s: TestStore) {
    let store = &*s.store;
    let a = store
        .create_token(&new_token("a", "stead_one"), t(0))
        .await
        .unwrap();
    assert_eq!(
        store.revoke_token(a.id, t(5)).await.unwrap(),
        Revocation::Revoked
    );
    assert_eq!(
        store.revoke_token(a.id, t(9)).await.unwrap(),
        Revocation::AlreadyRevoked
    );
    assert_eq!(
        store.revoke_token(a.id + 100, t(9)).await.unwrap(),
        Revocation::Unknown
    );
    let tokens = store.tokens().await.unwrap();
    assert_eq!(tokens[0].revoked_at, Some(t(5)));
}

async fn token_expiry_and_revocation_make_it_not_live(s: TestStore) {
    let store = &*s.store;
    let mut expiring = new_token("a", "stead_one");
    expiring.expires_at = Some(t(60));
    let token = store.create_token(&expiring, t(0)).await.unwrap();
    assert!(token.is_live(t(59)));
    assert!(!token.is_live(t(60)));
    store.revoke_token(token.id, t(10)).await.unwrap();
    let revoked = store
        .token_by_secret_sha256(&secret_sha256("stead_one"))
        .await
        .unwrap()
        .unwrap();
    assert!(!revoked.is_live(t(11)));
}

async fn a_quota_refuses_the_create_that_would_pass_it_and_writes_nothing(s: TestStore) {
    let store = &*s.store;
    let quota = TeamQuota {
        domain_suffixes: Vec::new(),
        max_instances: Some(3),
        max_memory_mb: Some(1000),
        max_public_hosts: Some(1),
    };
    let charge = QuotaCharge {
        memory_mb: 400,
        public_hosts: 0,
    };
    for name in ["a1", "a2"] {
        let created = store
            .create_instance_within(&new_instance(name, "a"), &quota, charge, t(0))
            .await
            .unwrap();
        assert!(created.is_ok(), "{}: {created:?}", s.name());
    }
    let refused = store
        .create_instance_within(&new_instance("a3", "a"), &quota, charge, t(0))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (refused.quota, refused.limit, refused.used, refused.asked),
        ("max_memory_mb", 1000, 800, 400)
    );
    assert!(refused.to_string().contains("team \"a\""), "{refused}");
    assert_eq!(
        store.instance(&InstanceName::new("a3")).await.unwrap(),
        None
    );
    assert_eq!(
        store.quota_usage("a").await.unwrap(),
        QuotaUsage {
            instances: 2,
            memory_mb: 800,
            public_hosts: 0,
        }
    );
    // Another team is not held to team a's usage.
    let other = store
        .create_instance_within(&new_instance("b1", "b"), &quota, charge, t(0))
        .await
        .unwrap();
    assert!(other.is_ok());
}

async fn twenty_concurrent_creates_against_a_quota_of_five_create_exactly_five(s: TestStore) {
    let store: Arc<dyn Store> = s.store.clone();
    let creates = (0..20).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .create_instance_within(
                    &new_instance(&format!("race{n}"), "a"),
                    &max_instances(5),
                    QuotaCharge::default(),
                    t(0),
                )
                .await
        })
    });
    let mut created = 0;
    let mut refused = 0;
    for create in creates.collect::<Vec<_>>() {
        match create.await.unwrap() {
            Ok(Ok(_)) => created += 1,
            Ok(Err(exceeded)) => {
                assert_eq!((exceeded.quota, exceeded.used), ("max_instances", 5));
                refused += 1;
            }
            Err(e) => panic!("{}: a create failed: {e}", s.name()),
        }
    }
    assert_eq!((created, refused), (5, 15), "{}", s.name());
    assert_eq!(store.quota_usage("a").await.unwrap().instances, 5);
    let listed = store.list_instances().await.unwrap().rows;
    assert_eq!(listed.iter().filter(|i| i.team == "a").count(), 5);
}

async fn deleted_instances_free_their_quota(s: TestStore) {
    let store = &*s.store;
    let created = store
        .create_instance_within(
            &new_instance("a1", "a"),
            &max_instances(1),
            QuotaCharge::default(),
            t(0),
        )
        .await
        .unwrap()
        .unwrap();
    let again = store
        .create_instance_within(
            &new_instance("a2", "a"),
            &max_instances(1),
            QuotaCharge::default(),
            t(0),
        )
        .await
        .unwrap();
    assert!(again.is_err());
    for (from, to) in [
        (InstanceState::Provisioning, InstanceState::Deleting),
        (InstanceState::Deleting, InstanceState::Deleted),
    ] {
        assert!(store
            .set_instance_state(created.id, from, to, t(1))
            .await
            .unwrap());
    }
    let after = store
        .create_instance_within(
            &new_instance("a2", "a"),
            &max_instances(1),
            QuotaCharge::default(),
            t(2),
        )
        .await
        .unwrap();
    assert!(after.is_ok(), "{}: {after:?}", s.name());
}

/// #54: the store writes each event with its instance's team, and reads
/// a team's events alone; an event about no instance has none.
async fn an_event_carries_its_instances_team_and_is_read_by_team(s: TestStore) {
    use stead::core::event_log::{Event, EventFilter, EventKind};
    let store = &*s.store;
    store
        .create_instance(&new_instance("shop", "a"), t(0))
        .await
        .unwrap();
    store
        .create_instance(&new_instance("blog", "b"), t(0))
        .await
        .unwrap();
    let about = |instance: Option<&str>| {
        let event = Event::new(EventKind::Halt, t(1), "C8", "something");
        match instance {
            Some(name) => event.instance(&InstanceName::new(name)),
            None => event,
        }
    };
    let mut events = vec![about(Some("shop")), about(Some("blog")), about(None)];
    for event in &mut events {
        event.writer = "test".into();
    }
    store.append_events(&events).await.unwrap();
    let all = store.events(&EventFilter::default()).await.unwrap().rows;
    let teams: Vec<Option<&str>> = all.iter().map(|l| l.event.team.as_deref()).collect();
    assert_eq!(teams, [Some("a"), Some("b"), None]);
    let only_a = EventFilter {
        team: Some("a".into()),
        ..EventFilter::default()
    };
    let read = store.events(&only_a).await.unwrap().rows;
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].event.instance, Some(InstanceName::new("shop")));
}
