//! `stead status` over the in-memory store and runtime: what it says about
//! pending upgrades and halted rollouts.

use std::collections::BTreeMap;
use std::sync::Arc;

use stead::core::catalog::Catalog;
use stead::core::fleet::{InstanceState, NewTask, RolloutState, TaskKind};
use stead::core::grants::Grants;
use stead::core::types::{InstanceName, Timestamp};
use stead::daemon::status::{render_status, status, StatusSources};
use stead::ports::{NewInstance, Store};
use stead_testkit::ports::{Hooks, ManualClock, MemoryRuntime};
use stead_testkit::store::MemoryStore;

#[tokio::test]
async fn pending_upgrades_say_where_they_are_and_halted_rollouts_why() {
    let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let catalog = Catalog::from_toml(
        "[types.web]\nversion = \"2\"\n[[types.web.services]]\nname = \"http\"\nimage = \"i\"\n\
         [types.db]\nversion = \"7\"\n[[types.db.services]]\nname = \"pg\"\nimage = \"i\"\n",
        "catalog.toml",
        &Grants::default(),
    )
    .unwrap();
    let mut ids = BTreeMap::new();
    // 2026-11-30 is a Monday: d's Sunday 03:00 window opens in six days and three hours.
    for (name, service_type, version, window) in [
        ("a", "web", "1", None),
        ("b", "web", "1", None),
        ("c", "db", "6", None),
        ("d", "web", "1", Some("sun 03:00-05:00")),
    ] {
        let new = NewInstance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            name: InstanceName::new(name),
            team: "t".into(),
            service_type: service_type.into(),
            version: version.into(),
            expires_at: None,
            maintenance_window: window.map(str::to_owned),
        };
        let i = store.create_instance(&new, now).await.unwrap();
        assert!(store
            .set_instance_state(i.id, InstanceState::Provisioning, InstanceState::Ready, now)
            .await
            .unwrap());
        ids.insert(name, i.id);
    }
    let parked = NewTask {
        kind: TaskKind::Upgrade,
        instance: ids["a"],
        run_after: stead::core::fleet::add(now, std::time::Duration::from_secs(3 * 3600)),
        reason: "version drift: 1 -> 2".into(),
        traceparent: None,
    };
    let task = store.enqueue(&parked, now, None).await.unwrap().unwrap();
    store
        .set_rollout("db", RolloutState::Halted, "upgrade of z failed", now, None)
        .await
        .unwrap();
    let runtime = MemoryRuntime::new(Arc::new(ManualClock::new(now)), Hooks::default());
    let status = status(StatusSources {
        store: &store,
        runtime: &runtime,
        catalog: &catalog,
        memory: None,
        caddy_admin: None,
        provisioner: None,
        database: "sqlite://x".into(),
        now,
    })
    .await;
    let progress = |service_type: &str| -> Vec<(String, String)> {
        status
            .catalog
            .iter()
            .find(|t| t.service_type == service_type)
            .unwrap()
            .pending
            .iter()
            .map(|p| (p.instance.clone(), p.progress.clone()))
            .collect()
    };
    assert_eq!(
        progress("web"),
        vec![
            ("a".to_owned(), format!("queued (task {task}), due in 3 h")),
            (
                "b".to_owned(),
                "planned at the next tick (at most max_in_flight at a time)".to_owned()
            ),
            (
                "d".to_owned(),
                "waits for its maintenance window, which opens in 6 d 3 h".to_owned()
            ),
        ]
    );
    let db = status
        .catalog
        .iter()
        .find(|t| t.service_type == "db")
        .unwrap();
    assert_eq!(db.rollout, "halted: upgrade of z failed");
    assert_eq!(
        progress("db"),
        vec![(
            "c".to_owned(),
            "not planned: rollout halted: upgrade of z failed".to_owned()
        )]
    );
    assert_eq!(
        status.halted_rollouts,
        vec!["db: upgrade of z failed".to_owned()]
    );
    let text = render_status(&status);
    assert!(text.contains("upgrade a 1 -> 2: queued"), "{text}");
    assert!(text.contains("db    7"), "{text}");
}

/// #40: a provision that ran out of attempts leaves its instance failed,
/// and status says why and how to get out of it.
#[tokio::test]
async fn a_failed_instance_shows_its_provisions_error_and_the_way_out() {
    let now: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
    let store = MemoryStore::new();
    let catalog = Catalog::from_toml(
        "[types.web]\nversion = \"2\"\n[[types.web.services]]\nname = \"http\"\nimage = \"i\"\n",
        "catalog.toml",
        &Grants::default(),
    )
    .unwrap();
    let new = NewInstance {
        domains: Vec::new(),
        spec_digest: None,
        parameters: Default::default(),
        name: InstanceName::new("shop"),
        team: "t".into(),
        service_type: "web".into(),
        version: "2".into(),
        expires_at: None,
        maintenance_window: None,
    };
    let shop = store.create_instance(&new, now).await.unwrap();
    let provision = NewTask {
        kind: TaskKind::Provision,
        instance: shop.id,
        run_after: now,
        reason: "operator: instance create".into(),
        traceparent: None,
    };
    let task = store.enqueue(&provision, now, None).await.unwrap().unwrap();
    store.claim("w", now, 1).await.unwrap();
    assert!(store
        .fail(task, "w", "create http: pull access denied for i", now)
        .await
        .unwrap());
    assert!(store
        .set_instance_state(
            shop.id,
            InstanceState::Provisioning,
            InstanceState::Failed,
            now
        )
        .await
        .unwrap());
    let runtime = MemoryRuntime::new(Arc::new(ManualClock::new(now)), Hooks::default());
    let status = status(StatusSources {
        store: &store,
        runtime: &runtime,
        catalog: &catalog,
        memory: None,
        caddy_admin: None,
        provisioner: None,
        database: "sqlite://x".into(),
        now,
    })
    .await;
    let row = status.rows.iter().find(|r| r.instance == "shop").unwrap();
    assert_eq!(row.state, "failed");
    assert_eq!(
        row.condition,
        "failed: create http: pull access denied for i (`stead instance retry shop`)"
    );
}
