//! The operator commands of `src/ops.rs` over the in-memory store: what
//! they enqueue, what they refuse, and how they share the instance lock
//! (T3). The same commands against the real CLI and SQLite are in
//! `tests/cli.rs`.

use std::sync::Arc;
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::grants::Grants;
use stead::core::types::Timestamp;
use stead::ops::*;
use stead::ports::Store;
use stead_testkit::store::MemoryStore;

fn catalog() -> Catalog {
    Catalog::from_toml(
        "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"http\"\nimage = \"i\"\n",
        "catalog.toml",
        &Grants::default(),
    )
    .unwrap()
}

fn request(name: &str) -> CreateRequest {
    CreateRequest {
        domains: Vec::new(),
        parameters: Default::default(),
        name: name.into(),
        service_type: "web".into(),
        team: "t".into(),
        version: None,
        ttl: None,
        maintenance_window: None,
        exists_ok: false,
    }
}

fn at() -> Timestamp {
    "2026-11-30T00:00:00Z".parse().unwrap()
}

#[tokio::test]
async fn operator_tasks_carry_a_fresh_traceparent() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    for name in ["blog", "wiki"] {
        ops.create(&request(name)).await.unwrap();
    }
    ops.delete("blog", false).await.unwrap();
    let tasks = store.all_tasks();
    assert_eq!(tasks.len(), 3);
    let mut seen = std::collections::BTreeSet::new();
    for task in &tasks {
        let tp = task.traceparent.as_deref().expect("a traceparent");
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4, "{tp}");
        assert_eq!((parts[0], parts[3]), ("00", "01"), "{tp}");
        assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{tp}");
        assert!(seen.insert(parts[1].to_owned()), "one trace per command");
    }
}

#[tokio::test]
async fn a_version_the_catalog_does_not_have_is_refused_naming_both() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let error = ops
        .create(&CreateRequest {
            version: Some("99".into()),
            ..request("blog")
        })
        .await
        .unwrap_err();
    assert!(matches!(error, OpsError::Invalid(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("\"99\"") && message.contains("\"1\""),
        "{message}"
    );
    let ok = ops
        .create(&CreateRequest {
            version: Some("1".into()),
            ..request("blog")
        })
        .await
        .unwrap();
    assert_eq!(ok.instance.version, "1");
}

#[tokio::test]
async fn an_existing_name_is_an_error_unless_exists_ok_and_the_same_type() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let first = ops.create(&request("blog")).await.unwrap();
    assert!(first.task.is_some());
    let error = ops.create(&request("blog")).await.unwrap_err();
    assert!(matches!(error, OpsError::Conflict(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("already exists") && message.contains("--exists-ok"),
        "{message}"
    );
    let again = ops
        .create(&CreateRequest {
            exists_ok: true,
            ..request("blog")
        })
        .await
        .unwrap();
    assert_eq!((again.instance.id, again.task), (first.instance.id, None));
    assert_eq!(store.all_tasks().len(), 1, "no second provision");
}

#[tokio::test]
async fn a_zero_ttl_is_refused() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let error = ops
        .create(&CreateRequest {
            ttl: Some(Duration::ZERO),
            ..request("blog")
        })
        .await
        .unwrap_err();
    assert!(matches!(error, OpsError::Invalid(_)), "{error:?}");
    assert!(error.to_string().starts_with("ttl 0 s"), "{error}");
}

#[tokio::test]
async fn deleting_says_what_it_cancelled_and_is_idempotent() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let created = ops.create(&request("blog")).await.unwrap();
    let Deletion::Started { cancelled, .. } = ops.delete("blog", false).await.unwrap() else {
        panic!("deletion did not start");
    };
    assert_eq!(cancelled, vec![created.task.unwrap()], "the provision");
    assert_eq!(
        ops.delete("blog", false).await.unwrap(),
        Deletion::AlreadyDeleting
    );
    let error = ops.create(&request("blog")).await.unwrap_err();
    assert!(matches!(error, OpsError::Conflict(_)), "{error:?}");
    assert!(error.to_string().contains("being deleted"), "{error}");
}

/// T3: a command waits for a pass or task holding the instance, then
/// acts on the instance as it is under the lock, and releases it.
#[tokio::test(start_paused = true)]
async fn a_command_waits_for_the_instance_lock_and_releases_it() {
    let store = Arc::new(MemoryStore::new());
    let ops = Ops::new(store.as_ref(), Arc::new(catalog()), at(), 7);
    let created = ops.create(&request("blog")).await.unwrap();
    let id = created.instance.id;
    let worker = "worker#1";
    assert_eq!(
        store
            .try_lock_instances(&[id], worker, Duration::from_secs(600))
            .await
            .unwrap(),
        vec![id]
    );
    let releaser = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            store.unlock_instances(&[id], worker).await.unwrap();
        })
    };
    let began = tokio::time::Instant::now();
    assert!(ops.set_stopped("blog", true).await.unwrap());
    assert!(began.elapsed() >= Duration::from_secs(5), "did not wait");
    releaser.await.unwrap();
    // Released: a worker takes it at once.
    assert_eq!(
        store
            .try_lock_instances(&[id], worker, Duration::from_secs(600))
            .await
            .unwrap(),
        vec![id]
    );
}

/// T3: a command that cannot get the lock in time changes nothing and
/// says what to do.
#[tokio::test(start_paused = true)]
async fn a_command_on_a_busy_instance_changes_nothing_and_says_so() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let created = ops.create(&request("blog")).await.unwrap();
    let id = created.instance.id;
    store
        .try_lock_instances(&[id], "worker#1", Duration::from_secs(3600))
        .await
        .unwrap();
    let error = ops.delete("blog", false).await.unwrap_err();
    assert!(matches!(error, OpsError::Busy(_)), "{error:?}");
    assert!(error.to_string().contains("blog is busy"), "{error}");
    assert!(error.to_string().contains("nothing was changed"), "{error}");
    let error = ops.set_stopped("blog", true).await.unwrap_err();
    assert!(matches!(error, OpsError::Busy(_)), "{error:?}");
    let instance = ops.find("blog").await.unwrap();
    assert_eq!(instance.state, created.instance.state);
    assert!(!instance.stopped);
    assert_eq!(
        store.all_tasks().len(),
        1,
        "the provision only, nothing cancelled"
    );
}

#[tokio::test]
async fn stop_and_start_of_a_helm_instance_are_refused_saying_why() {
    let store = MemoryStore::new();
    let catalog = Catalog::from_toml(
        "[types.search]\nversion = \"1\"\nprovisioner = \"helm\"\n[types.search.helm]\nchart = \"c/search\"\nnamespace = \"t-{instance}\"\n",
        "catalog.toml",
        &Grants::default()
            .with_helm(&["c/search".to_owned()], Some("t-"))
            .unwrap(),
    )
    .unwrap();
    let ops = Ops::new(&store, Arc::new(catalog), at(), 7);
    ops.create(&CreateRequest {
        service_type: "search".into(),
        ..request("acme")
    })
    .await
    .unwrap();
    for stopped in [true, false] {
        let error = ops.set_stopped("acme", stopped).await.unwrap_err();
        assert!(matches!(error, OpsError::Invalid(_)), "{error:?}");
        assert!(error.to_string().contains("Helm type search"), "{error}");
    }
    let instance = ops.find("acme").await.unwrap();
    assert!(!instance.stopped, "nothing changed");
}

/// #40: `rollout halt` used to leave the type's queued upgrades queued, so
/// they ran anyway; a halt now cancels them (a running one finishes, and
/// its worker checks the switch before it starts). Safe to run twice.
#[tokio::test]
async fn halting_a_rollout_cancels_its_queued_upgrades_and_nothing_else() {
    use stead::core::fleet::{NewTask, RolloutState, TaskKind, TaskState, CANCELLED_BY_HALT};
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let blog = ops.create(&request("blog")).await.unwrap();
    let wiki = ops.create(&request("wiki")).await.unwrap();
    let upgrade = |instance| NewTask {
        kind: TaskKind::Upgrade,
        instance,
        run_after: at(),
        reason: "version drift: 1 -> 2".into(),
        traceparent: None,
    };
    // A retry waiting for its backoff: queued, not yet due.
    let retry = NewTask {
        run_after: stead::core::fleet::add(at(), Duration::from_secs(60)),
        ..upgrade(blog.instance.id)
    };
    let queued = store.enqueue(&retry, at(), None).await.unwrap().unwrap();
    let running = store
        .enqueue(&upgrade(wiki.instance.id), at(), None)
        .await
        .unwrap()
        .unwrap();
    // The provisions are due too: claim until wiki's upgrade runs.
    while store.task(running).await.unwrap().unwrap().state != TaskState::Running {
        assert!(!store.claim("w1", at(), 1).await.unwrap().is_empty());
    }
    let (before, cancelled) = ops
        .set_rollout("web", RolloutState::Halted, "operator")
        .await
        .unwrap();
    assert_eq!((before, cancelled), (RolloutState::Active, vec![queued]));
    let task = store.task(queued).await.unwrap().unwrap();
    assert_eq!(
        (task.state, task.last_error.as_deref()),
        (TaskState::Failed, Some(CANCELLED_BY_HALT))
    );
    assert_eq!(
        store.task(running).await.unwrap().unwrap().state,
        TaskState::Running,
        "a running upgrade is never interrupted"
    );
    assert_eq!(
        ops.set_rollout("web", RolloutState::Halted, "operator")
            .await
            .unwrap(),
        (RolloutState::Halted, vec![])
    );
}

#[tokio::test]
async fn cancelling_a_task_cancels_only_a_queued_one_and_is_idempotent() {
    use stead::core::fleet::{TaskState, CANCELLED_BY_OPERATOR};
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let blog = ops.create(&request("blog")).await.unwrap().task.unwrap();
    let wiki = ops.create(&request("wiki")).await.unwrap().task.unwrap();
    let claimed = store.claim("w1", at(), 1).await.unwrap();
    assert_eq!(claimed[0].id, blog);

    let error = ops.cancel_task(blog).await.unwrap_err();
    assert!(matches!(error, OpsError::Conflict(_)), "{error:?}");
    assert!(error.to_string().contains("is running"), "{error}");

    let TaskCancel::Cancelled(task) = ops.cancel_task(wiki).await.unwrap() else {
        panic!("a queued task is cancelled");
    };
    assert_eq!(task.id, wiki);
    let now = store.task(wiki).await.unwrap().unwrap();
    assert_eq!(
        (now.state, now.last_error.as_deref()),
        (TaskState::Failed, Some(CANCELLED_BY_OPERATOR))
    );
    assert!(matches!(
        ops.cancel_task(wiki).await.unwrap(),
        TaskCancel::AlreadyOver(_)
    ));
    let error = ops.cancel_task(999).await.unwrap_err();
    assert!(matches!(error, OpsError::NotFound(_)), "{error:?}");
    assert_eq!(error.kind(), stead::core::errors::ErrorKind::NotFound);
}

#[tokio::test]
async fn retrying_a_ready_instance_reprovisions_it_and_a_deleting_one_is_refused() {
    use stead::core::fleet::{InstanceState, TaskKind};
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let blog = ops.create(&request("blog")).await.unwrap();
    assert!(
        matches!(
            ops.retry("blog").await.unwrap(),
            Retry::AlreadyQueued {
                kind: TaskKind::Provision
            }
        ),
        "its first provision is still queued"
    );
    assert!(store
        .set_instance_state(
            blog.instance.id,
            InstanceState::Provisioning,
            InstanceState::Ready,
            at()
        )
        .await
        .unwrap());
    let Retry::Reprovisioning { task } = ops.retry("blog").await.unwrap() else {
        panic!("a ready instance is reprovisioned");
    };
    assert_eq!(
        store.task(task).await.unwrap().unwrap().kind,
        TaskKind::Reprovision
    );
    ops.delete("blog", false).await.unwrap();
    let error = ops.retry("blog").await.unwrap_err();
    assert!(matches!(error, OpsError::Conflict(_)), "{error:?}");
    let error = ops.retry("nope").await.unwrap_err();
    assert!(matches!(error, OpsError::NotFound(_)), "{error:?}");
}

/// #41: a team becomes part of names (`{team}` in a Helm namespace and
/// values), so it follows the one DNS-label rule.
#[tokio::test]
async fn a_team_that_is_not_a_dns_label_is_refused_naming_the_flag() {
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    let error = ops
        .create(&CreateRequest {
            team: "Blue Team".into(),
            ..request("blog")
        })
        .await
        .unwrap_err();
    assert!(matches!(error, OpsError::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("--team"), "{error}");
    assert!(store.all_tasks().is_empty(), "nothing written");
}

/// #41: `delete --purge-volumes` that cannot delete (a deprovision is
/// already queued for the live instance) leaves no purge behind: before,
/// the flag was written first, on its own, and a later plain delete or
/// TTL expiry would have removed the volumes the operator was told were
/// kept.
#[tokio::test]
async fn a_refused_purging_delete_leaves_no_purge_for_a_later_deletion() {
    use stead::core::fleet::{NewTask, TaskKind};
    use stead::core::types::InstanceName;
    let store = MemoryStore::new();
    let ops = Ops::new(&store, Arc::new(catalog()), at(), 7);
    ops.create(&request("blog")).await.unwrap();
    let row = store
        .instance(&InstanceName::new("blog"))
        .await
        .unwrap()
        .unwrap();
    let queued = NewTask {
        kind: TaskKind::Deprovision,
        instance: row.id,
        run_after: at(),
        reason: "test: a deprovision already queued".into(),
        traceparent: None,
    };
    store.enqueue(&queued, at(), None).await.unwrap().unwrap();
    let refused = ops.delete("blog", true).await.unwrap_err();
    assert!(matches!(refused, OpsError::Conflict(_)), "{refused:?}");
    let row = store
        .instance(&InstanceName::new("blog"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !row.purge_volumes,
        "a delete that did not happen recorded its purge"
    );
}
