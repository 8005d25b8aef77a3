//! One suite of store behaviours, run against every backend: the in-memory
//! model, SQLite (a temp file) and Postgres (a fresh database in the test
//! server; see `tests/support`). A behaviour is an async fn taking a
//! [`TestStore`]; `store_suite!` instantiates it once per backend.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use stead::core::event_log::{Event, EventFilter, EventKind, LoggedEvent};
use stead::core::fleet::{
    add, InstanceState, ListedInstance, NewTask, RolloutState, TaskKind, TaskState,
};
use stead::core::types::{
    ActiveService, ContainerId, Inhibition, InhibitionReason, InstanceName, ServiceName,
};
use stead::ports::{LockGrant, LockedWrite, NewInstance, Store, StoreError, TypeVersion, WaysBack};
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
        instance_is_created_provisioning_and_loaded_by_name_and_id,
        instance_names_are_unique,
        instances_are_listed_in_id_order,
        instance_state_is_compare_and_set,
        stopped_and_version_updates_need_an_existing_instance,
        parameters_and_the_purge_flag_round_trip,
        active_services_round_trip_and_are_replaced,
        a_batch_load_reads_what_the_single_loads_read,
        active_of_an_unknown_instance_is_empty_and_cannot_be_saved,
        binds_persist_only_while_the_generation_is_unchanged,
        verified_execution_is_recorded_for_the_named_container_only,
        a_verified_execution_start_round_trips_to_the_nanosecond,
        released_claims_clear_the_binds_of_that_container,
        inhibition_save_replaces_the_same_key_and_clear_is_idempotent,
        enqueue_is_idempotent_per_instance_and_kind,
        enqueue_for_a_missing_instance_is_not_found,
        claim_takes_due_tasks_oldest_first_up_to_the_limit,
        a_claimed_task_is_not_claimed_again,
        concurrent_claimers_share_the_queue_without_double_claims,
        only_the_lease_holder_extends_or_finishes_a_task,
        retry_requeues_after_the_backoff_and_keeps_attempts,
        failed_and_done_tasks_free_their_slot,
        expired_leases_are_requeued_only_after_they_expired,
        extending_a_lease_postpones_its_expiry,
        ttl_expiry_changes_state_and_enqueues_one_deprovision,
        ttl_expiry_is_all_or_nothing,
        a_purging_deletion_sets_its_flag_only_when_the_deletion_happens,
        deletion_cancels_queued_tasks_in_the_same_transaction,
        a_refused_deletion_cancels_nothing,
        a_deleted_instances_name_can_be_reused,
        a_live_instances_name_is_refused_naming_its_holder,
        a_deleted_instance_with_an_active_task_keeps_its_name,
        tasks_are_listed_newest_first_and_finished_ones_on_request,
        rollout_records_keep_their_reason_and_time,
        a_pin_is_lifted_by_any_change_of_the_switch,
        type_versions_are_immutable_one_per_definition_and_fenced,
        ways_back_name_the_baking_instances_and_those_an_operator_undid,
        type_versions_are_pruned_unless_run_pinned_or_newest,
        the_reconciler_lease_holder_is_readable_without_taking_it,
        gauges_count_the_queue_and_instances_by_state,
        live_service_types_are_those_with_instances_not_deleted,
        rollouts_are_upserted_per_service_type,
        reconciler_lease_is_exclusive_until_it_expires,
        a_restarted_identity_takes_its_lease_back_at_once,
        a_restarted_identity_queues_its_predecessors_running_tasks_again,
        two_live_incarnations_of_one_identity_do_not_alternate_the_lease,
        a_restart_reclaims_only_its_own_sites_locks_and_tasks_not_a_twins,
        queued_tasks_are_cancelled_one_by_id_or_a_types_upgrades_at_once,
        stale_lease_holder_writes_are_fenced_and_write_nothing,
        recovery_writes_are_fenced_too,
        instance_locks_exclude_other_holders_until_released_or_expired,
        writes_under_a_lost_instance_lock_are_refused_and_change_nothing,
        timestamps_round_trip_at_microsecond_precision,
        a_store_outage_fails_calls_and_loses_nothing,
        events_are_appended_in_order_and_read_back_with_every_field,
        events_are_filtered_by_instance_kind_and_since_and_the_newest_kept,
        following_the_event_log_reads_on_after_the_last_id_seen,
        old_events_are_pruned_in_bounded_batches_and_newer_ones_kept,
        finished_tasks_are_pruned_oldest_first_and_active_ones_never,
        an_enqueue_and_its_event_are_recorded_together_or_not_at_all,
        a_ttl_expiry_and_its_event_are_recorded_together_or_not_at_all,
        a_tasks_end_and_its_event_are_recorded_together_or_not_at_all,
        a_webhook_cursor_is_created_once_and_moves_only_from_where_it_was_read,
    ],
    sql: [
        unknown_instance_state_is_a_bad_row_and_others_are_listed,
        unknown_task_kind_is_reported_never_claimed_and_others_run,
        unknown_rollout_state_is_a_clear_error,
        bad_binds_name_the_row,
        instance_names_that_are_not_dns_labels_are_bad_rows_and_others_are_listed,
        bad_names_in_active_and_inhibition_rows_are_bad_rows_and_other_instances_load,
        the_schema_itself_rejects_bad_states_and_duplicate_active_tasks,
        an_event_of_an_unknown_kind_is_a_bad_row_and_the_others_are_read,
        an_event_the_database_refuses_takes_its_enqueue_and_expiry_with_it,
    ]
}

// --- helpers -------------------------------------------------------------

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
        service_type: "wiki".into(),
        version: "1.0".into(),
        expires_at: Some(t(3600)),
        maintenance_window: Some("sun 03:00-05:00".into()),
    }
}

fn task(kind: TaskKind, instance: i64, run_after: Timestamp) -> NewTask {
    NewTask {
        kind,
        instance,
        run_after,
        reason: "test".into(),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
    }
}

async fn instance(store: &dyn Store, name: &str) -> i64 {
    store
        .create_instance(&new_instance(name), t(0))
        .await
        .unwrap()
        .id
}

fn active(container: &str, revision: &str) -> ActiveService {
    ActiveService {
        container: ContainerId::new(container),
        effective_revision: revision.into(),
        binds: BTreeMap::from([(80, 32_768), (443, 32_769)]),
        stop_grace: Some(Duration::from_secs(10)),
        verified_started_at: None,
    }
}

// --- instances -----------------------------------------------------------

async fn instance_is_created_provisioning_and_loaded_by_name_and_id(s: TestStore) {
    let store = &*s.store;
    let created = store
        .create_instance(&new_instance("alpha"), t(5))
        .await
        .unwrap();
    assert_eq!(created.state, InstanceState::Provisioning);
    assert!(!created.stopped);
    assert_eq!((created.created_at, created.updated_at), (t(5), t(5)));
    assert_eq!(created.expires_at, Some(t(3600)));
    assert_eq!(
        created.maintenance_window.as_deref(),
        Some("sun 03:00-05:00")
    );
    let by_name = store.instance(&InstanceName::new("alpha")).await.unwrap();
    assert_eq!(by_name.as_ref(), Some(&created));
    assert_eq!(
        store.instance_by_id(created.id).await.unwrap(),
        Some(created)
    );
    assert_eq!(
        store.instance(&InstanceName::new("nope")).await.unwrap(),
        None
    );
    assert_eq!(store.instance_by_id(9_999).await.unwrap(), None);
}

async fn instance_names_are_unique(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let again = store.create_instance(&new_instance("alpha"), t(1)).await;
    assert!(
        matches!(again, Err(StoreError::Conflict(_))),
        "{}: {again:?}",
        s.name()
    );
    assert_eq!(store.list_instances().await.unwrap().rows.len(), 1);
}

async fn instances_are_listed_in_id_order(s: TestStore) {
    let store = &*s.store;
    for name in ["c", "a", "b"] {
        instance(store, name).await;
    }
    let listed = store.list_instances().await.unwrap();
    assert!(listed.bad.is_empty());
    let names: Vec<_> = listed.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["c", "a", "b"]);
    // A recovery pass's listing: the same instances, in the same order,
    // each with the fields the pass plans by.
    let for_recovery = store.list_for_recovery().await.unwrap();
    assert!(for_recovery.bad.is_empty());
    let expected: Vec<ListedInstance> = listed.rows.iter().map(ListedInstance::from).collect();
    assert_eq!(for_recovery.rows, expected);
}

async fn instance_state_is_compare_and_set(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    use InstanceState::*;
    assert!(!store
        .set_instance_state(id, Ready, Failed, t(1))
        .await
        .unwrap());
    assert!(store
        .set_instance_state(id, Provisioning, Ready, t(2))
        .await
        .unwrap());
    assert!(!store
        .set_instance_state(id, Provisioning, Ready, t(3))
        .await
        .unwrap());
    assert!(!store
        .set_instance_state(9_999, Ready, Failed, t(3))
        .await
        .unwrap());
    let loaded = store.instance_by_id(id).await.unwrap().unwrap();
    assert_eq!((loaded.state, loaded.updated_at), (Ready, t(2)));
}

async fn stopped_and_version_updates_need_an_existing_instance(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    store.set_instance_stopped(id, true, t(1)).await.unwrap();
    store.set_instance_version(id, "2.0", t(2)).await.unwrap();
    let loaded = store.instance_by_id(id).await.unwrap().unwrap();
    assert!(loaded.stopped);
    assert_eq!((loaded.version.as_str(), loaded.updated_at), ("2.0", t(2)));
    let missing = store.set_instance_stopped(9_999, true, t(1)).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
    let missing = store.set_instance_version(9_999, "2", t(1)).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
}

async fn parameters_and_the_purge_flag_round_trip(s: TestStore) {
    let store = &*s.store;
    let mut new = new_instance("alpha");
    new.parameters = std::collections::BTreeMap::from([
        ("title".to_owned(), "Ünïcode \"quoted\" {braces}".to_owned()),
        ("empty".to_owned(), String::new()),
    ]);
    new.domains = vec!["shop.a.example".to_owned(), "a.example".to_owned()];
    let created = store.create_instance(&new, t(0)).await.unwrap();
    assert_eq!(created.parameters, new.parameters);
    assert_eq!(created.domains, new.domains);
    assert!(!created.purge_volumes, "a new instance keeps its volumes");
    store.set_purge_volumes(created.id, t(1)).await.unwrap();
    store.set_purge_volumes(created.id, t(2)).await.unwrap();
    let loaded = store.instance(&new.name).await.unwrap().unwrap();
    assert_eq!(loaded.parameters, new.parameters);
    assert_eq!(loaded.domains, new.domains);
    // The listing and a pass's batch load read them too.
    assert_eq!(
        store.list_instances().await.unwrap().rows[0].domains,
        new.domains
    );
    let batch = store.load_instances(&[created.id]).await.unwrap();
    assert_eq!(
        batch[&created.id].as_ref().unwrap().instance.domains,
        new.domains
    );
    assert!(loaded.purge_volumes);
    assert_eq!(loaded.updated_at, t(2));
    let missing = store.set_purge_volumes(9_999, t(1)).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
}

// --- ACTIVE --------------------------------------------------------------

async fn active_services_round_trip_and_are_replaced(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let name = InstanceName::new("alpha");
    let (web, worker) = (ServiceName::new("web"), ServiceName::new("worker"));
    let mut web_active = active("c1", "r1");
    web_active.verified_started_at = Some(t(7));
    store
        .save_active_service(&name, &web, &web_active)
        .await
        .unwrap();
    store
        .save_active_service(&name, &worker, &active("c2", "r1"))
        .await
        .unwrap();
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services.get(&web), Some(&web_active));
    assert_eq!(loaded.services.len(), 2);

    let successor = ActiveService {
        stop_grace: None,
        binds: BTreeMap::new(),
        ..active("c3", "r2")
    };
    store
        .save_active_service(&name, &web, &successor)
        .await
        .unwrap();
    store.remove_active_service(&name, &worker).await.unwrap();
    store.remove_active_service(&name, &worker).await.unwrap();
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services, BTreeMap::from([(web, successor)]));
}

async fn active_of_an_unknown_instance_is_empty_and_cannot_be_saved(s: TestStore) {
    let store = &*s.store;
    let ghost = InstanceName::new("ghost");
    assert!(store.load_active(&ghost).await.unwrap().services.is_empty());
    let saved = store
        .save_active_service(&ghost, &ServiceName::new("web"), &active("c1", "r1"))
        .await;
    assert!(matches!(saved, Err(StoreError::NotFound(_))), "{saved:?}");
}

async fn binds_persist_only_while_the_generation_is_unchanged(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let (name, web) = (InstanceName::new("alpha"), ServiceName::new("web"));
    store
        .save_active_service(&name, &web, &active("c1", "r1"))
        .await
        .unwrap();
    let binds = BTreeMap::from([(8080, 40_000)]);
    let c1 = ContainerId::new("c1");
    assert!(!store
        .persist_binds(&name, &web, &c1, "r0", &binds, None)
        .await
        .unwrap());
    assert!(!store
        .persist_binds(&name, &web, &ContainerId::new("c9"), "r1", &binds, None)
        .await
        .unwrap());
    assert!(store
        .persist_binds(&name, &web, &c1, "r1", &binds, None)
        .await
        .unwrap());
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services[&web].binds, binds);
}

async fn verified_execution_is_recorded_for_the_named_container_only(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let (name, web) = (InstanceName::new("alpha"), ServiceName::new("web"));
    store
        .save_active_service(&name, &web, &active("c1", "r1"))
        .await
        .unwrap();
    store
        .record_verified_execution(&name, &web, &ContainerId::new("old"), t(1), None)
        .await
        .unwrap();
    assert_eq!(
        store.load_active(&name).await.unwrap().services[&web].verified_started_at,
        None
    );
    store
        .record_verified_execution(&name, &web, &ContainerId::new("c1"), t(2), None)
        .await
        .unwrap();
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services[&web].verified_started_at, Some(t(2)));
}

/// Docker reports an execution's start to the nanosecond, and recovery
/// recognises a verified execution by equality (R17): a store that dropped
/// the sub-microsecond part made every restarted daemon and every upgrade's
/// successor look like a new execution and withdrew its traffic.
async fn a_verified_execution_start_round_trips_to_the_nanosecond(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let (name, web) = (InstanceName::new("alpha"), ServiceName::new("web"));
    let started = Timestamp::new(1_800_000_000, 123_456_789).unwrap();
    let saved = ActiveService {
        verified_started_at: Some(started),
        ..active("c1", "r1")
    };
    store
        .save_active_service(&name, &web, &saved)
        .await
        .unwrap();
    assert_eq!(
        store.load_active(&name).await.unwrap().services[&web].verified_started_at,
        Some(started),
        "as saved with ACTIVE (an upgrade's verified successor)"
    );
    let restarted = Timestamp::new(1_800_000_100, 987_654_321).unwrap();
    store
        .record_verified_execution(&name, &web, &ContainerId::new("c1"), restarted, None)
        .await
        .unwrap();
    assert_eq!(
        store.load_active(&name).await.unwrap().services[&web].verified_started_at,
        Some(restarted),
        "as recorded by recovery"
    );
}

async fn released_claims_clear_the_binds_of_that_container(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let name = InstanceName::new("alpha");
    let (web, api) = (ServiceName::new("web"), ServiceName::new("api"));
    store
        .save_active_service(&name, &web, &active("c1", "r1"))
        .await
        .unwrap();
    store
        .save_active_service(&name, &api, &active("c2", "r1"))
        .await
        .unwrap();
    store
        .release_claims(&name, &ContainerId::new("c1"), None)
        .await
        .unwrap();
    let loaded = store.load_active(&name).await.unwrap();
    assert!(loaded.services[&web].binds.is_empty());
    assert_eq!(loaded.services[&api].binds.len(), 2);
}

// --- inhibitions ---------------------------------------------------------

async fn inhibition_save_replaces_the_same_key_and_clear_is_idempotent(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let name = InstanceName::new("alpha");
    let hold = Inhibition {
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
        reason: InhibitionReason::Hold("operator-hold".into()),
        operation: "manual".into(),
        created_at: t(1),
        stop_grace: None,
        revert_to: None,
    };
    let marker = Inhibition {
        reason: InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: t(2),
        stop_grace: Some(Duration::from_millis(2_500)),
        ..hold.clone()
    };
    let other = Inhibition {
        container: ContainerId::new("c0"),
        ..hold.clone()
    };
    store.save_inhibition(&name, &hold).await.unwrap();
    store.save_inhibition(&name, &other).await.unwrap();
    store.save_inhibition(&name, &marker).await.unwrap();
    assert_eq!(
        store.load_inhibitions(&name).await.unwrap(),
        [other.clone(), marker]
    );
    for _ in 0..2 {
        store
            .clear_inhibition(&name, &hold.service, &hold.container, None)
            .await
            .unwrap();
    }
    assert_eq!(store.load_inhibitions(&name).await.unwrap(), [other]);
    let ghost = store
        .save_inhibition(&InstanceName::new("ghost"), &hold)
        .await;
    assert!(matches!(ghost, Err(StoreError::NotFound(_))), "{ghost:?}");
}

/// The tick's one read of the upgrade markers: the instances whose
/// successor bakes until the window ends (not after, nor for a plain
/// hold), and those whose way back an operator asked for.
async fn ways_back_name_the_baking_instances_and_those_an_operator_undid(s: TestStore) {
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    let beta = instance(store, "beta").await;
    instance(store, "gamma").await;
    let back = stead::core::types::RevertTo {
        revision: "r0".into(),
        binds: Default::default(),
        version: "1".into(),
        spec_digest: None,
        until: t(600),
        hold: None,
        stop_first: false,
        undone: false,
    };
    let marker = |undone: bool| Inhibition {
        service: ServiceName::new("web"),
        container: ContainerId::new("c0"),
        reason: InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: t(1),
        stop_grace: None,
        revert_to: Some(stead::core::types::RevertTo {
            undone,
            ..back.clone()
        }),
    };
    assert_eq!(store.ways_back(t(0)).await.unwrap(), WaysBack::default());
    let hold = Inhibition {
        reason: InhibitionReason::Hold("operator-hold".into()),
        revert_to: None,
        ..marker(false)
    };
    store
        .save_inhibition(&InstanceName::new("gamma"), &hold)
        .await
        .unwrap();
    store
        .save_inhibition(&InstanceName::new("beta"), &marker(false))
        .await
        .unwrap();
    store
        .save_inhibition(&InstanceName::new("alpha"), &marker(true))
        .await
        .unwrap();
    let ways = store.ways_back(t(599)).await.unwrap();
    assert_eq!(ways.baking, [alpha, beta].into_iter().collect());
    assert_eq!(ways.undone, [alpha].into_iter().collect());
    // The bake window ends at t(600): from then on nothing bakes.
    let ways = store.ways_back(t(600)).await.unwrap();
    assert!(ways.baking.is_empty(), "{ways:?}");
    assert_eq!(ways.undone, [alpha].into_iter().collect());
}

// --- tasks ---------------------------------------------------------------

async fn enqueue_is_idempotent_per_instance_and_kind(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let first = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap();
    assert!(first.is_some());
    let again = store
        .enqueue(&task(TaskKind::Provision, id, t(5)), t(1), None)
        .await
        .unwrap();
    assert_eq!(again, None);
    let other_kind = store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(1), None)
        .await
        .unwrap();
    assert!(other_kind.is_some());
    let claimed = store.claim("w1", t(2), 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    // Running still holds the slot.
    assert_eq!(
        store
            .enqueue(&task(TaskKind::Provision, id, t(0)), t(3), None)
            .await
            .unwrap(),
        None
    );
    let active = store.active_tasks().await.unwrap();
    assert_eq!(active.rows.len(), 2);
    let stored = store.task(first.unwrap()).await.unwrap().unwrap();
    assert_eq!(
        stored.traceparent,
        task(TaskKind::Provision, id, t(0)).traceparent
    );
    assert_eq!((stored.reason.as_str(), stored.created_at), ("test", t(0)));
}

async fn enqueue_for_a_missing_instance_is_not_found(s: TestStore) {
    let queued = s
        .store
        .enqueue(&task(TaskKind::Provision, 9_999, t(0)), t(0), None)
        .await;
    assert!(matches!(queued, Err(StoreError::NotFound(_))), "{queued:?}");
}

async fn claim_takes_due_tasks_oldest_first_up_to_the_limit(s: TestStore) {
    let store = &*s.store;
    let mut ids = Vec::new();
    for (name, run_after) in [("a", 30), ("b", 10), ("c", 20), ("d", 100)] {
        let instance_id = instance(store, name).await;
        let id = store
            .enqueue(
                &task(TaskKind::Provision, instance_id, t(run_after)),
                t(0),
                None,
            )
            .await
            .unwrap()
            .unwrap();
        ids.push(id);
    }
    let claimed = store.claim("w1", t(30), 2).await.unwrap();
    let claimed_ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    assert_eq!(claimed_ids, [ids[1], ids[2]]);
    for task in &claimed {
        assert_eq!(task.state, TaskState::Running);
        assert_eq!(task.locked_by.as_deref(), Some("w1"));
        assert_eq!(task.locked_at, Some(t(30)));
        assert_eq!(task.attempts, 1);
    }
    let rest = store.claim("w2", t(30), 10).await.unwrap();
    assert_eq!(rest.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[0]]);
    assert!(store.claim("w2", t(99), 10).await.unwrap().is_empty());
    assert_eq!(store.claim("w2", t(100), 0).await.unwrap(), []);
}

async fn a_claimed_task_is_not_claimed_again(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap();
    assert_eq!(store.claim("w1", t(1), 5).await.unwrap().len(), 1);
    assert!(store.claim("w2", t(1), 5).await.unwrap().is_empty());
}

async fn concurrent_claimers_share_the_queue_without_double_claims(s: TestStore) {
    const N_INSTANCES: usize = 30;
    const N_WORKERS: usize = 8;
    let mut expected = Vec::new();
    for i in 0..N_INSTANCES {
        let id = instance(&*s.store, &format!("tenant-{i}")).await;
        for kind in [TaskKind::Provision, TaskKind::Upgrade] {
            let queued = s
                .store
                .enqueue(&task(kind, id, t(0)), t(0), None)
                .await
                .unwrap();
            expected.push(queued.unwrap());
        }
    }
    let mut workers = Vec::new();
    for w in 0..N_WORKERS {
        let store = s.store.clone();
        workers.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut claimed = Vec::new();
            loop {
                let batch = store.claim(&worker, t(1), 2).await.unwrap();
                if batch.is_empty() {
                    return claimed;
                }
                for task in batch {
                    assert!(store.complete(task.id, &worker, t(1)).await.unwrap());
                    claimed.push(task.id);
                }
            }
        }));
    }
    let mut claimed = Vec::new();
    for worker in workers {
        claimed.extend(worker.await.unwrap());
    }
    claimed.sort();
    assert_eq!(
        claimed,
        expected,
        "{}: each task claimed exactly once",
        s.name()
    );
}

async fn only_the_lease_holder_extends_or_finishes_a_task(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let task_id = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w1", t(1), 1).await.unwrap();
    assert!(!store.extend_lease(task_id, "w2", t(2)).await.unwrap());
    assert!(!store.complete(task_id, "w2", t(2)).await.unwrap());
    assert!(!store.retry(task_id, "w2", t(9), "x", t(2)).await.unwrap());
    assert!(!store.fail(task_id, "w2", "x", t(2)).await.unwrap());
    assert!(store.extend_lease(task_id, "w1", t(3)).await.unwrap());
    assert!(store.complete(task_id, "w1", t(4)).await.unwrap());
    assert!(
        !store.complete(task_id, "w1", t(5)).await.unwrap(),
        "done twice"
    );
    let done = store.task(task_id).await.unwrap().unwrap();
    assert_eq!(done.state, TaskState::Done);
    assert_eq!((done.locked_by, done.locked_at), (None, None));
    assert_eq!(done.updated_at, t(4));
    assert!(!store.extend_lease(9_999, "w1", t(5)).await.unwrap());
}

async fn retry_requeues_after_the_backoff_and_keeps_attempts(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let task_id = store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w1", t(1), 1).await.unwrap();
    assert!(store
        .retry(task_id, "w1", t(60), "helm timed out", t(2))
        .await
        .unwrap());
    let queued = store.task(task_id).await.unwrap().unwrap();
    assert_eq!(queued.state, TaskState::Queued);
    assert_eq!((queued.run_after, queued.attempts), (t(60), 1));
    assert_eq!(queued.last_error.as_deref(), Some("helm timed out"));
    assert_eq!(queued.locked_by, None);
    assert!(store.claim("w1", t(59), 1).await.unwrap().is_empty());
    let again = store.claim("w2", t(60), 1).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
}

async fn failed_and_done_tasks_free_their_slot(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let first = store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w1", t(1), 1).await.unwrap();
    assert!(store.fail(first, "w1", "bad chart", t(2)).await.unwrap());
    let failed = store.task(first).await.unwrap().unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.last_error.as_deref(), Some("bad chart"));
    assert!(store.active_tasks().await.unwrap().rows.is_empty());
    let second = store
        .enqueue(&task(TaskKind::Upgrade, id, t(3)), t(3), None)
        .await
        .unwrap();
    assert!(second.is_some_and(|second| second > first));
}

async fn expired_leases_are_requeued_only_after_they_expired(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let task_id = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w1", t(10), 1).await.unwrap();
    let lease = Duration::from_secs(300);
    // At exactly locked_at + lease the lease is still held.
    assert_eq!(
        store
            .reset_expired_leases(t(310), lease, None)
            .await
            .unwrap(),
        0
    );
    let just_after = add(t(310), Duration::from_micros(1));
    assert_eq!(
        store
            .reset_expired_leases(just_after, lease, None)
            .await
            .unwrap(),
        1
    );
    let requeued = store.task(task_id).await.unwrap().unwrap();
    assert_eq!(requeued.state, TaskState::Queued);
    assert_eq!((requeued.locked_by, requeued.attempts), (None, 1));
    assert!(
        !store.complete(task_id, "w1", t(311)).await.unwrap(),
        "lease was broken"
    );
    assert_eq!(store.claim("w2", t(312), 1).await.unwrap()[0].attempts, 2);
}

async fn extending_a_lease_postpones_its_expiry(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let task_id = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w1", t(0), 1).await.unwrap();
    let lease = Duration::from_secs(100);
    assert!(store.extend_lease(task_id, "w1", t(90)).await.unwrap());
    assert_eq!(
        store
            .reset_expired_leases(t(150), lease, None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .reset_expired_leases(t(191), lease, None)
            .await
            .unwrap(),
        1
    );
}

async fn ttl_expiry_changes_state_and_enqueues_one_deprovision(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    store
        .set_instance_state(id, InstanceState::Provisioning, InstanceState::Ready, t(1))
        .await
        .unwrap();
    let deprovision = task(TaskKind::Deprovision, id, t(5));
    let expired = store
        .expire_instance(id, InstanceState::Ready, &deprovision, t(5), None)
        .await
        .unwrap()
        .expect("expired");
    assert!(expired.cancelled.is_empty());
    let task_id = expired.task;
    let expired = store.instance_by_id(id).await.unwrap().unwrap();
    assert_eq!(
        (expired.state, expired.updated_at),
        (InstanceState::Deleting, t(5))
    );
    let queued = store.task(task_id).await.unwrap().unwrap();
    assert_eq!(
        (queued.kind, queued.state),
        (TaskKind::Deprovision, TaskState::Queued)
    );
    // The compare-and-set fails now: no second deprovision.
    let again = store
        .expire_instance(id, InstanceState::Ready, &deprovision, t(6), None)
        .await;
    assert_eq!(again, Ok(None));
    assert_eq!(store.active_tasks().await.unwrap().rows.len(), 1);
}

/// #41: `delete --purge-volumes` records its purge in the deletion's own
/// transaction. A deletion refused (a deprovision already queued, or the
/// state moved) leaves no purge that a later plain delete or TTL expiry
/// would carry out; one that happens carries it.
async fn a_purging_deletion_sets_its_flag_only_when_the_deletion_happens(s: TestStore) {
    let store = &*s.store;
    let flagged = |id| async move {
        let row = store.instance_by_id(id).await.unwrap().unwrap();
        (row.state, row.purge_volumes)
    };
    // The state moved since it was read: the compare-and-set fails.
    let alpha = instance(store, "alpha").await;
    let deprovision = task(TaskKind::Deprovision, alpha, t(0));
    let refused = store
        .expire_instance_purging(alpha, InstanceState::Ready, &deprovision, t(5))
        .await;
    assert_eq!(refused, Ok(None));
    assert_eq!(
        flagged(alpha).await,
        (InstanceState::Provisioning, false),
        "a refused deletion leaves neither its state nor its purge"
    );
    // A deprovision is already queued: the insert is refused.
    store
        .enqueue(&deprovision, t(0), None)
        .await
        .unwrap()
        .unwrap();
    let refused = store
        .expire_instance_purging(alpha, InstanceState::Provisioning, &deprovision, t(6))
        .await;
    assert_eq!(refused, Ok(None));
    assert_eq!(flagged(alpha).await, (InstanceState::Provisioning, false));
    // A deletion that happens carries its purge.
    let beta = instance(store, "beta").await;
    let deprovision = task(TaskKind::Deprovision, beta, t(7));
    let expired = store
        .expire_instance_purging(beta, InstanceState::Provisioning, &deprovision, t(7))
        .await
        .unwrap()
        .expect("expired");
    assert_eq!(flagged(beta).await, (InstanceState::Deleting, true));
    let queued = store.task(expired.task).await.unwrap().unwrap();
    assert_eq!(
        (queued.kind, queued.state),
        (TaskKind::Deprovision, TaskState::Queued)
    );
}

async fn ttl_expiry_is_all_or_nothing(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    // A deprovision is already queued (say, by an operator): expiry must not
    // leave the state changed without its own insert, nor add a second task.
    let deprovision = task(TaskKind::Deprovision, id, t(0));
    store
        .enqueue(&deprovision, t(0), None)
        .await
        .unwrap()
        .unwrap();
    let expired = store
        .expire_instance(id, InstanceState::Provisioning, &deprovision, t(5), None)
        .await;
    assert_eq!(expired, Ok(None));
    let instance = store.instance_by_id(id).await.unwrap().unwrap();
    assert_eq!(
        (instance.state, instance.updated_at),
        (InstanceState::Provisioning, t(0))
    );
    assert_eq!(store.active_tasks().await.unwrap().rows.len(), 1);
}

/// T4: a deletion (here an operator's, from `ready`) cancels the queued
/// provision-like tasks of that instance, never a running one, never
/// another instance's, in the transaction that moves it to `deleting`.
async fn deletion_cancels_queued_tasks_in_the_same_transaction(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let other = instance(store, "beta").await;
    store
        .set_instance_state(id, InstanceState::Provisioning, InstanceState::Ready, t(1))
        .await
        .unwrap();
    let running = store
        .enqueue(&task(TaskKind::Reprovision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.claim("w", t(1), 1).await.unwrap()[0].id, running);
    let upgrade = store
        .enqueue(&task(TaskKind::Upgrade, id, t(100)), t(1), None)
        .await
        .unwrap()
        .unwrap();
    let others = store
        .enqueue(&task(TaskKind::Upgrade, other, t(0)), t(1), None)
        .await
        .unwrap()
        .unwrap();
    let expired = store
        .expire_instance(
            id,
            InstanceState::Ready,
            &task(TaskKind::Deprovision, id, t(5)),
            t(5),
            None,
        )
        .await
        .unwrap()
        .expect("deleted");
    assert_eq!(expired.cancelled, vec![upgrade], "{}", s.name());
    let cancelled = store.task(upgrade).await.unwrap().unwrap();
    assert_eq!(
        (
            cancelled.state,
            cancelled.last_error.as_deref(),
            cancelled.updated_at
        ),
        (
            TaskState::Failed,
            Some(stead::core::fleet::CANCELLED_BY_DELETION),
            t(5)
        )
    );
    let states = |task: Option<stead::core::fleet::Task>| task.map(|t| t.state);
    assert_eq!(
        states(store.task(running).await.unwrap()),
        Some(TaskState::Running)
    );
    assert_eq!(
        states(store.task(others).await.unwrap()),
        Some(TaskState::Queued)
    );
    assert_eq!(
        states(store.task(expired.task).await.unwrap()),
        Some(TaskState::Queued)
    );
}

async fn a_refused_deletion_cancels_nothing(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let upgrade = store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    // The compare-and-set names the wrong state: nothing happens at all.
    let refused = store
        .expire_instance(
            id,
            InstanceState::Ready,
            &task(TaskKind::Deprovision, id, t(5)),
            t(5),
            None,
        )
        .await;
    assert_eq!(refused, Ok(None));
    let queued = store.task(upgrade).await.unwrap().unwrap();
    assert_eq!((queued.state, queued.last_error), (TaskState::Queued, None));
}

/// Runs a deletion to its end the way a worker does: deprovision claimed,
/// instance marked deleted, task done.
async fn delete_completely(store: &dyn Store, id: i64, at: i64) {
    let current = store.instance_by_id(id).await.unwrap().unwrap().state;
    let expired = store
        .expire_instance(
            id,
            current,
            &task(TaskKind::Deprovision, id, t(at)),
            t(at),
            None,
        )
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

async fn a_deleted_instances_name_can_be_reused(s: TestStore) {
    let store = &*s.store;
    let old = instance(store, "alpha").await;
    store
        .save_active_service(
            &InstanceName::new("alpha"),
            &ServiceName::new("web"),
            &active("c1", "1"),
        )
        .await
        .unwrap();
    delete_completely(store, old, 10).await;
    let listed = store.list_instances().await.unwrap().rows;
    assert_eq!(
        listed.len(),
        1,
        "a deleted row stays until its name is reused"
    );
    let new = store
        .create_instance(&new_instance("alpha"), t(20))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", s.name()));
    assert_ne!(new.id, old, "ids are never reused");
    assert_eq!(new.state, InstanceState::Provisioning);
    let by_name = store.instance(&InstanceName::new("alpha")).await.unwrap();
    assert_eq!(by_name.map(|i| i.id), Some(new.id));
    assert_eq!(store.instance_by_id(old).await.unwrap(), None);
    let active = store
        .load_active(&InstanceName::new("alpha"))
        .await
        .unwrap();
    assert!(
        active.services.is_empty(),
        "nothing of the old one is inherited"
    );
    assert!(store.tasks(true, 100).await.unwrap().rows.is_empty());
}

async fn a_live_instances_name_is_refused_naming_its_holder(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let error = store
        .create_instance(&new_instance("alpha"), t(1))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("conflict: instance name alpha is taken by instance {id} (provisioning)")
    );
}

async fn a_deleted_instance_with_an_active_task_keeps_its_name(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    // A reprovision a worker still runs when the deletion completes.
    store
        .enqueue(&task(TaskKind::Reprovision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("straggler", t(0), 1).await.unwrap();
    delete_completely(store, id, 10).await;
    let refused = store.create_instance(&new_instance("alpha"), t(20)).await;
    assert!(
        matches!(&refused, Err(StoreError::Conflict(m)) if m.contains("queued or running task")),
        "{}: {refused:?}",
        s.name()
    );
    assert!(store.instance_by_id(id).await.unwrap().is_some());
}

async fn tasks_are_listed_newest_first_and_finished_ones_on_request(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let done = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    store.claim("w", t(0), 1).await.unwrap();
    store.complete(done, "w", t(1)).await.unwrap();
    let upgrade = store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(2), None)
        .await
        .unwrap()
        .unwrap();
    let reprovision = store
        .enqueue(&task(TaskKind::Reprovision, id, t(0)), t(3), None)
        .await
        .unwrap()
        .unwrap();
    let ids = |rows: Vec<stead::core::fleet::Task>| rows.iter().map(|t| t.id).collect::<Vec<_>>();
    let active = store.tasks(false, 100).await.unwrap();
    assert!(active.bad.is_empty());
    assert_eq!(ids(active.rows), vec![reprovision, upgrade]);
    let all = store.tasks(true, 100).await.unwrap();
    assert_eq!(ids(all.rows), vec![reprovision, upgrade, done]);
    let limited = store.tasks(true, 2).await.unwrap();
    assert_eq!(ids(limited.rows), vec![reprovision, upgrade]);
}

async fn a_pin_is_lifted_by_any_change_of_the_switch(s: TestStore) {
    let store = &*s.store;
    let pinned = |records: Vec<stead::ports::RolloutRecord>| {
        records
            .into_iter()
            .map(|r| (r.service_type, r.state, r.pinned))
            .collect::<Vec<_>>()
    };
    store
        .pin_rollout("wiki", "1.0", "operator: rollout undo --to 1.0", t(1))
        .await
        .unwrap();
    let halted = (RolloutState::Halted, Some("1.0".to_owned()));
    assert_eq!(
        pinned(store.rollout_records().await.unwrap()),
        vec![("wiki".to_owned(), halted.0, halted.1.clone())]
    );
    // A halt (a reverted move toward the pin's) lifts the pin: the type
    // stays halted, and nothing moves on to that version again.
    store
        .set_rollout("wiki", RolloutState::Halted, "bake failed", t(2), None)
        .await
        .unwrap();
    let records = store.rollout_records().await.unwrap();
    assert_eq!(records[0].reason, "bake failed");
    assert_eq!(records[0].pinned, None);
    store
        .pin_rollout("wiki", "1.0", "operator: rollout undo --to 1.0", t(3))
        .await
        .unwrap();
    store
        .set_rollout("wiki", RolloutState::Active, "operator: resume", t(4), None)
        .await
        .unwrap();
    assert_eq!(
        pinned(store.rollout_records().await.unwrap()),
        vec![("wiki".to_owned(), RolloutState::Active, None)]
    );
}

/// #54: a recorded definition is immutable, one per (type, version, spec
/// digest): recorded again (another source, later) it is left as it was;
/// a version changed in place records a second definition beside it. A
/// fenced write lands only under the current reconciler lease.
async fn type_versions_are_immutable_one_per_definition_and_fenced(s: TestStore) {
    let store = &*s.store;
    let version = |v: &str, digest: &str, at: i64| TypeVersion {
        service_type: "wiki".into(),
        version: v.into(),
        spec_digest: digest.into(),
        source: format!("[types.wiki]\nversion = \"{v}\"\n# {at}\n"),
        recorded_at: t(at),
    };
    let lease = store
        .acquire_reconciler_lease("a", SHORT)
        .await
        .unwrap()
        .unwrap();
    let record = |v: TypeVersion| {
        let lease = &lease;
        async move { store.record_type_version(&v, Some(lease)).await.unwrap() }
    };
    assert!(record(version("1.0", "a", 1)).await);
    assert!(record(version("2.0", "b", 2)).await);
    // The same definition again, later and with another source: kept.
    assert!(!record(version("1.0", "a", 3)).await);
    // The version changed in place: a definition beside the first.
    assert!(record(version("1.0", "c", 4)).await);
    let mut other = version("9.0", "z", 0);
    other.service_type = "chat".into();
    assert!(store.record_type_version(&other, None).await.unwrap());
    let seen: Vec<_> = store
        .type_versions("wiki")
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.version,
                r.spec_digest,
                r.recorded_at,
                r.source.contains("# 1"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("1.0".to_owned(), "a".to_owned(), t(1), true),
            ("2.0".to_owned(), "b".to_owned(), t(2), false),
            ("1.0".to_owned(), "c".to_owned(), t(4), false),
        ]
    );
    assert!(store.type_versions("nope").await.unwrap().is_empty());
    // Past its lease, its holder writes nothing.
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        store
            .record_type_version(&version("3.0", "d", 5), Some(&lease))
            .await,
        Err(StoreError::Fenced { epoch: lease.epoch })
    );
    assert_eq!(store.type_versions("wiki").await.unwrap().len(), 3);
}

/// #54: the type-version history is kept as long as the event log, but
/// never a version a live instance runs, the one a rollout is pinned to,
/// or a type's newest.
async fn type_versions_are_pruned_unless_run_pinned_or_newest(s: TestStore) {
    let store = &*s.store;
    let record = |v: &str, at: i64| TypeVersion {
        service_type: "wiki".into(),
        version: v.into(),
        spec_digest: format!("d{v}"),
        source: format!("[types.wiki]\nversion = \"{v}\"\n"),
        recorded_at: t(at),
    };
    for (v, at) in [("1.0", 1), ("2.0", 2), ("3.0", 3), ("4.0", 4), ("5.0", 50)] {
        store
            .record_type_version(&record(v, at), None)
            .await
            .unwrap();
    }
    // `new_instance` makes an instance of wiki at 1.0: live, it keeps 1.0.
    store
        .create_instance(&new_instance("a"), t(5))
        .await
        .unwrap();
    store
        .pin_rollout("wiki", "3.0", "operator: undo", t(6))
        .await
        .unwrap();
    // Everything before 10 is past the retention; 5.0 is newer.
    assert_eq!(store.prune_type_versions(t(10)).await.unwrap(), 2);
    let kept: Vec<String> = store
        .type_versions("wiki")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(kept, ["1.0", "3.0", "5.0"]);
    // Past everything: the newest stays whatever its age.
    store
        .set_rollout("wiki", RolloutState::Active, "resume", t(60), None)
        .await
        .unwrap();
    assert_eq!(store.prune_type_versions(t(100)).await.unwrap(), 1);
    let kept: Vec<String> = store
        .type_versions("wiki")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(kept, ["1.0", "5.0"]);
}

async fn rollout_records_keep_their_reason_and_time(s: TestStore) {
    let store = &*s.store;
    store
        .set_rollout(
            "wiki",
            RolloutState::Halted,
            "upgrade of a failed",
            t(1),
            None,
        )
        .await
        .unwrap();
    store
        .set_rollout("chat", RolloutState::Active, "operator: resume", t(2), None)
        .await
        .unwrap();
    let records = store.rollout_records().await.unwrap();
    let seen: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r.service_type.as_str(),
                r.state,
                r.reason.as_str(),
                r.updated_at,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("chat", RolloutState::Active, "operator: resume", t(2)),
            ("wiki", RolloutState::Halted, "upgrade of a failed", t(1)),
        ]
    );
}

async fn the_reconciler_lease_holder_is_readable_without_taking_it(s: TestStore) {
    let store = &*s.store;
    assert_eq!(store.reconciler_lease().await.unwrap(), None);
    let ttl = Duration::from_secs(30);
    let a = store
        .acquire_reconciler_lease("a", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.reconciler_lease().await.unwrap(), Some(a.clone()));
    // Reading it changes nothing: the holder renews with its epoch.
    let renewed = store
        .acquire_reconciler_lease("a", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.epoch, a.epoch);
    store.release_reconciler_lease(&renewed).await.unwrap();
    assert_eq!(store.reconciler_lease().await.unwrap(), None);
}

// --- gauges and rollouts ---------------------------------------------------

async fn live_service_types_are_those_with_instances_not_deleted(s: TestStore) {
    let store = &*s.store;
    assert!(store.live_service_types().await.unwrap().is_empty());
    let of_type = |name: &str, service_type: &str| NewInstance {
        service_type: service_type.into(),
        ..new_instance(name)
    };
    store
        .create_instance(&of_type("a", "wiki"), t(0))
        .await
        .unwrap();
    store
        .create_instance(&of_type("b", "wiki"), t(0))
        .await
        .unwrap();
    let gone = store
        .create_instance(&of_type("c", "blog"), t(0))
        .await
        .unwrap();
    let deleting = store
        .create_instance(&of_type("d", "shop"), t(0))
        .await
        .unwrap();
    delete_completely(store, gone.id, 1).await;
    store
        .expire_instance(
            deleting.id,
            InstanceState::Provisioning,
            &task(TaskKind::Deprovision, deleting.id, t(2)),
            t(2),
            None,
        )
        .await
        .unwrap()
        .expect("deletion starts");
    let live: Vec<String> = store
        .live_service_types()
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(
        live,
        ["shop", "wiki"],
        "a deleted instance's type is not live; a deleting one's is"
    );
}

async fn gauges_count_the_queue_and_instances_by_state(s: TestStore) {
    let store = &*s.store;
    assert_eq!(store.queue_depth().await.unwrap(), 0);
    let a = instance(store, "a").await;
    let b = instance(store, "b").await;
    instance(store, "c").await;
    store
        .set_instance_state(a, InstanceState::Provisioning, InstanceState::Ready, t(1))
        .await
        .unwrap();
    store
        .enqueue(&task(TaskKind::Provision, a, t(0)), t(0), None)
        .await
        .unwrap();
    store
        .enqueue(&task(TaskKind::Provision, b, t(0)), t(0), None)
        .await
        .unwrap();
    store
        .enqueue(&task(TaskKind::Upgrade, b, t(50)), t(0), None)
        .await
        .unwrap();
    store.claim("w", t(1), 1).await.unwrap();
    assert_eq!(store.queue_depth().await.unwrap(), 2);
    let counts = store.instance_counts().await.unwrap();
    let expected: BTreeMap<_, _> = InstanceState::ALL
        .into_iter()
        .map(|state| {
            let n = match state {
                InstanceState::Ready => 1,
                InstanceState::Provisioning => 2,
                _ => 0,
            };
            (state, n)
        })
        .collect();
    assert_eq!(counts, expected);
}

async fn rollouts_are_upserted_per_service_type(s: TestStore) {
    let store = &*s.store;
    assert!(store.rollouts().await.unwrap().is_empty());
    store
        .set_rollout("wiki", RolloutState::Halted, "upgrade failed", t(1), None)
        .await
        .unwrap();
    store
        .set_rollout("chat", RolloutState::Active, "", t(1), None)
        .await
        .unwrap();
    store
        .set_rollout("wiki", RolloutState::Active, "resumed", t(2), None)
        .await
        .unwrap();
    let rollouts = store.rollouts().await.unwrap();
    assert_eq!(
        rollouts,
        BTreeMap::from([
            ("chat".to_owned(), RolloutState::Active),
            ("wiki".to_owned(), RolloutState::Active)
        ])
    );
}

// --- the reconciler lease ------------------------------------------------

/// Leases and instance locks are timed by the database's clock (T2), so
/// their expiry takes real time: short enough to keep the suite quick, far
/// above a round trip.
const SHORT: Duration = Duration::from_millis(300);
const PAST_SHORT: Duration = Duration::from_millis(400);

async fn reconciler_lease_is_exclusive_until_it_expires(s: TestStore) {
    let store = &*s.store;
    let before = store.database_now().await.unwrap();
    let a = store
        .acquire_reconciler_lease("a", SHORT)
        .await
        .unwrap()
        .unwrap();
    let after = store.database_now().await.unwrap();
    assert_eq!(a.epoch, 1);
    assert!(
        add(before, SHORT) <= a.expires_at && a.expires_at <= add(after, SHORT),
        "the lease is timed by the database's clock: {before} + {SHORT:?} <= {} <= {after} + {SHORT:?}",
        a.expires_at
    );
    assert_eq!(
        store.acquire_reconciler_lease("b", SHORT).await.unwrap(),
        None
    );
    let renewed = store
        .acquire_reconciler_lease("a", SHORT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.epoch, 1);
    assert!(renewed.expires_at >= a.expires_at);
    assert_eq!(
        store.acquire_reconciler_lease("b", SHORT).await.unwrap(),
        None
    );
    tokio::time::sleep(PAST_SHORT).await;
    let b = store
        .acquire_reconciler_lease("b", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.holder.as_str(), b.epoch), ("b", 2));
    // A stale release changes nothing; the holder's release frees the lease.
    store.release_reconciler_lease(&renewed).await.unwrap();
    assert_eq!(
        store.acquire_reconciler_lease("a", SHORT).await.unwrap(),
        None
    );
    store.release_reconciler_lease(&b).await.unwrap();
    let a_again = store
        .acquire_reconciler_lease("a", SHORT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a_again.epoch, 3);
}

/// T1: a daemon restarted on the same data directory is a new incarnation
/// of the same identity, and takes its lease back without waiting it out;
/// the old incarnation's fence is dead from then on.
async fn a_restarted_identity_takes_its_lease_back_at_once(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let long = Duration::from_secs(600);
    let old = store
        .acquire_reconciler_lease("host-1#aa", long)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .acquire_reconciler_lease("host-2#bb", long)
            .await
            .unwrap(),
        None,
        "another identity waits for expiry"
    );
    let new = store
        .acquire_reconciler_lease("host-1#cc", long)
        .await
        .unwrap()
        .expect("the same identity takes it back at once");
    assert_eq!(
        (new.holder.as_str(), new.epoch),
        ("host-1#cc", old.epoch + 1)
    );
    let upgrade = task(TaskKind::Upgrade, id, t(0));
    assert_eq!(
        store.enqueue(&upgrade, t(1), Some(&old)).await,
        Err(StoreError::Fenced { epoch: old.epoch })
    );
    assert!(store
        .enqueue(&upgrade, t(1), Some(&new))
        .await
        .unwrap()
        .is_some());
}

async fn a_restarted_identity_queues_its_predecessors_running_tasks_again(s: TestStore) {
    // #40: killed mid-upgrade and restarted at once, a daemon used to
    // leave the upgrade running under its dead incarnation for the whole
    // task lease, every other task of the instance waiting behind it.
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    let beta = instance(store, "beta").await;
    let gamma = instance(store, "gamma").await;
    for id in [alpha, beta, gamma] {
        store
            .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(1), None)
            .await
            .unwrap()
            .expect("enqueued");
    }
    let mine = store.claim("host-1#aa/w0", t(2), 1).await.unwrap();
    let also_mine = store.claim("host-1#aa/w1", t(2), 1).await.unwrap();
    let theirs = store.claim("host-10#bb/w0", t(2), 1).await.unwrap();
    assert_eq!((mine.len(), also_mine.len(), theirs.len()), (1, 1, 1));

    let mut requeued = store.requeue_tasks_of("host-1#", t(3)).await.unwrap();
    requeued.sort_unstable();
    let mut expected = vec![mine[0].id, also_mine[0].id];
    expected.sort_unstable();
    assert_eq!(
        requeued, expected,
        "only this identity's tasks, not host-10's"
    );
    let tasks = store.active_tasks().await.unwrap().rows;
    for t in &tasks {
        if expected.contains(&t.id) {
            assert_eq!(t.state, TaskState::Queued);
            assert_eq!(
                (t.locked_by.as_deref(), t.attempts),
                (None, 1),
                "attempts kept"
            );
        } else {
            assert_eq!(t.state, TaskState::Running);
            assert_eq!(t.locked_by.as_deref(), Some("host-10#bb/w0"));
        }
    }
    assert!(
        store
            .requeue_tasks_of("host-1#", t(4))
            .await
            .unwrap()
            .is_empty(),
        "safe to run twice"
    );
    let again = store.claim("host-1#cc/w0", t(5), 5).await.unwrap();
    assert_eq!(again.len(), 2, "the new incarnation takes them up at once");
}

/// T1, issue #41: two live daemons started from one copied `state_dir`
/// share an identity but hold two different identity locks (two sites).
/// Neither takes the lease from the other: the holder renews under its
/// epoch, the twin waits as any standby would, tick after tick. (Before
/// sites, each took it back from the other at every tick, and both acted.)
async fn two_live_incarnations_of_one_identity_do_not_alternate_the_lease(s: TestStore) {
    let store = &*s.store;
    let ttl = Duration::from_secs(600);
    let (holder, twin) = ("host-1#5173e1.aa", "host-1#9c02d4.bb");
    let first = store
        .acquire_reconciler_lease(holder, ttl)
        .await
        .unwrap()
        .expect("vacant");
    for tick in 0..3 {
        assert_eq!(
            store.acquire_reconciler_lease(twin, ttl).await.unwrap(),
            None,
            "tick {tick}: the twin waits"
        );
        let renewed = store
            .acquire_reconciler_lease(holder, ttl)
            .await
            .unwrap()
            .expect("the holder keeps its lease");
        assert_eq!(
            (renewed.holder.as_str(), renewed.epoch),
            (holder, first.epoch),
            "tick {tick}: the lease never changed hands"
        );
    }
    let read = store.reconciler_lease().await.unwrap().unwrap();
    assert_eq!((read.holder.as_str(), read.epoch), (holder, first.epoch));
    // The holder's own restart (the same site) still takes it at once.
    let restarted = store
        .acquire_reconciler_lease("host-1#5173e1.cc", ttl)
        .await
        .unwrap()
        .expect("a predecessor at the same site is gone");
    assert_eq!(restarted.epoch, first.epoch + 1);
    assert_eq!(
        store.acquire_reconciler_lease(twin, ttl).await.unwrap(),
        None,
        "and the twin still waits"
    );
}

/// T1: a restarted daemon releases the instance locks and requeues the
/// running tasks of its earlier incarnations at its own site, and leaves a
/// live twin's (the same identity at another site) to their holder.
async fn a_restart_reclaims_only_its_own_sites_locks_and_tasks_not_a_twins(s: TestStore) {
    let store = &*s.store;
    let long = Duration::from_secs(600);
    let mine = instance(store, "alpha").await;
    let twins = instance(store, "beta").await;
    for id in [mine, twins] {
        store
            .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(1), None)
            .await
            .unwrap()
            .expect("enqueued");
    }
    let my_task = store.claim("host-1#5173e1.aa/w0", t(2), 1).await.unwrap();
    let twin_task = store.claim("host-1#9c02d4.bb/w0", t(2), 1).await.unwrap();
    assert_eq!((my_task.len(), twin_task.len()), (1, 1));
    assert_eq!(
        store
            .try_lock_instances(&[mine], "host-1#5173e1.aa/recovery", long)
            .await
            .unwrap(),
        [mine]
    );
    assert_eq!(
        store
            .try_lock_instances(&[twins], "host-1#9c02d4.bb/recovery", long)
            .await
            .unwrap(),
        [twins]
    );

    let prefix = stead::core::succession::predecessors_prefix("host-1#5173e1.cc");
    assert_eq!(
        store.requeue_tasks_of(&prefix, t(3)).await.unwrap(),
        [my_task[0].id],
        "the predecessor's task only"
    );
    assert_eq!(store.clear_instance_locks_of(&prefix).await.unwrap(), 1);
    let me = "host-1#5173e1.cc/recovery";
    assert_eq!(
        store
            .try_lock_instances(&[mine, twins], me, long)
            .await
            .unwrap(),
        [mine],
        "the twin's lock is still its own"
    );
    let tasks = store.active_tasks().await.unwrap().rows;
    let twin_row = tasks.iter().find(|t| t.id == twin_task[0].id).unwrap();
    assert_eq!(
        (twin_row.state, twin_row.locked_by.as_deref()),
        (TaskState::Running, Some("host-1#9c02d4.bb/w0"))
    );
}

async fn queued_tasks_are_cancelled_one_by_id_or_a_types_upgrades_at_once(s: TestStore) {
    let store = &*s.store;
    let alpha = instance(store, "alpha").await;
    let beta = instance(store, "beta").await;
    let mut other_type = new_instance("gamma");
    other_type.service_type = "blog".into();
    let gamma = store.create_instance(&other_type, t(0)).await.unwrap().id;
    let mut ids = Vec::new();
    for (kind, id) in [
        (TaskKind::Upgrade, alpha),
        (TaskKind::Upgrade, beta),
        (TaskKind::Upgrade, gamma),
        (TaskKind::Provision, alpha),
    ] {
        ids.push(
            store
                .enqueue(&task(kind, id, t(0)), t(1), None)
                .await
                .unwrap()
                .expect("enqueued"),
        );
    }
    let running = store.claim("w", t(2), 1).await.unwrap();
    assert_eq!(running[0].id, ids[0], "alpha's upgrade runs");

    let cancelled = store
        .cancel_queued_upgrades("wiki", "cancelled: halted", t(3))
        .await
        .unwrap();
    assert_eq!(
        cancelled,
        vec![ids[1]],
        "beta's only: not running, not blog's, not a provision"
    );
    assert!(
        !store
            .cancel_queued_task(ids[0], "cancelled: x", t(3))
            .await
            .unwrap(),
        "running"
    );
    assert!(store
        .cancel_queued_task(ids[3], "cancelled: x", t(3))
        .await
        .unwrap());
    assert!(
        !store
            .cancel_queued_task(ids[3], "cancelled: x", t(4))
            .await
            .unwrap(),
        "twice"
    );
    assert!(!store
        .cancel_queued_task(9_999, "cancelled: x", t(4))
        .await
        .unwrap());
    // An upgrade that began and waits for its retry is left for that
    // retry, which runs halted and tidies what its attempt left.
    assert!(store
        .retry(ids[0], "w", t(9), "helm timed out", t(4))
        .await
        .unwrap());
    assert_eq!(
        store
            .cancel_queued_upgrades("wiki", "cancelled: halted", t(5))
            .await
            .unwrap(),
        Vec::<i64>::new(),
        "a begun upgrade is not cancelled"
    );
    for (id, state, error) in [
        (ids[0], TaskState::Queued, Some("helm timed out")),
        (ids[1], TaskState::Failed, Some("cancelled: halted")),
        (ids[2], TaskState::Queued, None),
        (ids[3], TaskState::Failed, Some("cancelled: x")),
    ] {
        let row = store.task(id).await.unwrap().unwrap();
        assert_eq!(
            (row.state, row.last_error.as_deref()),
            (state, error),
            "task {id}"
        );
    }
}

async fn stale_lease_holder_writes_are_fenced_and_write_nothing(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let a = store
        .acquire_reconciler_lease("a", SHORT)
        .await
        .unwrap()
        .unwrap();
    let provision = task(TaskKind::Provision, id, t(0));
    assert!(store
        .enqueue(&provision, t(1), Some(&a))
        .await
        .unwrap()
        .is_some());
    tokio::time::sleep(PAST_SHORT).await;
    // Expired and not yet taken over: its holder may be a process paused
    // past its lease, so its writes are refused already.
    let fenced = StoreError::Fenced { epoch: a.epoch };
    let upgrade = task(TaskKind::Upgrade, id, t(0));
    assert_eq!(
        store.enqueue(&upgrade, t(32), Some(&a)).await,
        Err(fenced.clone())
    );
    let b = store
        .acquire_reconciler_lease("b", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.enqueue(&upgrade, t(32), Some(&a)).await,
        Err(fenced.clone())
    );
    assert_eq!(
        store.reset_expired_leases(t(32), SHORT, Some(&a)).await,
        Err(fenced.clone())
    );
    let deprovision = task(TaskKind::Deprovision, id, t(0));
    assert_eq!(
        store
            .expire_instance(
                id,
                InstanceState::Provisioning,
                &deprovision,
                t(32),
                Some(&a)
            )
            .await,
        Err(fenced.clone())
    );
    assert_eq!(store.active_tasks().await.unwrap().rows.len(), 1);
    let state = store.instance_by_id(id).await.unwrap().unwrap().state;
    assert_eq!(state, InstanceState::Provisioning);
    assert!(store
        .enqueue(&upgrade, t(33), Some(&b))
        .await
        .unwrap()
        .is_some());
}

/// T2: every write the recovery pass makes carries the reconciler's fence.
async fn recovery_writes_are_fenced_too(s: TestStore) {
    let store = &*s.store;
    instance(store, "alpha").await;
    let (name, web) = (InstanceName::new("alpha"), ServiceName::new("web"));
    let c1 = ContainerId::new("c1");
    store
        .save_active_service(&name, &web, &active("c1", "r1"))
        .await
        .unwrap();
    let hold = Inhibition {
        service: web.clone(),
        container: c1.clone(),
        reason: InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: t(0),
        stop_grace: None,
        revert_to: None,
    };
    store.save_inhibition(&name, &hold).await.unwrap();
    let a = store
        .acquire_reconciler_lease("a#1", SHORT)
        .await
        .unwrap()
        .unwrap();
    let _b = store.acquire_reconciler_lease("b#1", SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let fenced = StoreError::Fenced { epoch: a.epoch };
    let binds = BTreeMap::from([(8080, 40_000)]);
    assert_eq!(
        store
            .persist_binds(&name, &web, &c1, "r1", &binds, Some(&a))
            .await,
        Err(fenced.clone())
    );
    assert_eq!(
        store
            .record_verified_execution(&name, &web, &c1, t(5), Some(&a))
            .await,
        Err(fenced.clone())
    );
    assert_eq!(
        store.release_claims(&name, &c1, Some(&a)).await,
        Err(fenced.clone())
    );
    assert_eq!(
        store.clear_inhibition(&name, &web, &c1, Some(&a)).await,
        Err(fenced.clone())
    );
    assert_eq!(
        store
            .set_rollout("wiki", RolloutState::Halted, "x", t(5), Some(&a))
            .await,
        Err(fenced.clone())
    );
    // A bake's revert (#55): the marker, ACTIVE and the version it puts
    // back carry the lease too.
    let id = store.instance(&name).await.unwrap().unwrap().id;
    let marker = Inhibition {
        container: ContainerId::new("c2"),
        ..hold.clone()
    };
    for write in [
        LockedWrite::SaveInhibition {
            instance: &name,
            inhibition: &marker,
        },
        LockedWrite::SaveActive {
            instance: &name,
            service: &web,
            active: &active("c9", "r9"),
        },
        LockedWrite::Version {
            id,
            version: "0.9",
            now: t(5),
        },
        LockedWrite::SpecDigest {
            id,
            digest: "sha256:old",
            now: t(5),
        },
    ] {
        assert_eq!(
            store.write_under_lease(&a, write).await,
            Err(fenced.clone()),
            "{write:?}"
        );
    }
    let version = store.instance(&name).await.unwrap().unwrap().version;
    assert_eq!(version, "1.0", "no version put back");
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services[&web], active("c1", "r1"), "nothing written");
    assert_eq!(store.load_inhibitions(&name).await.unwrap(), [hold]);
    assert!(store.rollouts().await.unwrap().is_empty());
}

/// T3: one holder at a time per instance, across processes; taken in one
/// call for many instances, renewed by its holder, free once released or
/// expired by the database's clock.
async fn instance_locks_exclude_other_holders_until_released_or_expired(s: TestStore) {
    let store = &*s.store;
    let a = instance(store, "alpha").await;
    let b = instance(store, "beta").await;
    let long = Duration::from_secs(600);
    let mut got = store
        .try_lock_instances(&[a, b, 999_999], "p1#x/recovery", long)
        .await
        .unwrap();
    got.sort_unstable();
    assert_eq!(got, [a, b], "unknown instances are skipped");
    assert_eq!(
        store
            .try_lock_instances(&[a, b], "p2#y/w0", long)
            .await
            .unwrap(),
        Vec::<i64>::new(),
        "held by another"
    );
    assert_eq!(
        store
            .try_lock_instances(&[a], "p1#x/recovery", long)
            .await
            .unwrap(),
        [a],
        "its holder renews"
    );
    store.unlock_instances(&[a], "p2#y/w0").await.unwrap();
    assert_eq!(
        store
            .try_lock_instances(&[a], "p2#y/w0", long)
            .await
            .unwrap(),
        Vec::<i64>::new(),
        "only the holder releases"
    );
    store.unlock_instances(&[a], "p1#x/recovery").await.unwrap();
    assert_eq!(
        store
            .try_lock_instances(&[a], "p2#y/w0", SHORT)
            .await
            .unwrap(),
        [a]
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        store
            .try_lock_instances(&[a], "p3#z/w1", long)
            .await
            .unwrap(),
        [a],
        "an expired lock is free"
    );
    // A restarted identity clears its previous incarnation's locks.
    assert_eq!(store.clear_instance_locks_of("p1#").await.unwrap(), 1);
    assert_eq!(
        store
            .try_lock_instances(&[b], "p3#z/w1", long)
            .await
            .unwrap(),
        [b]
    );
}

/// T3 (#41 item 8): a worker's writes carry its instance lock and are made
/// only while the lock is still its own. Once it expired (its worker paused
/// past it) every kind of write is refused, typed, and changes nothing,
/// before and after another holder took the lock over; the new holder's
/// writes are made.
async fn writes_under_a_lost_instance_lock_are_refused_and_change_nothing(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let (name, web) = (InstanceName::new("alpha"), ServiceName::new("web"));
    let c1 = ContainerId::new("c1");
    let paused = LockGrant {
        instance: id,
        holder: "host-1#s1.aa/w0".into(),
    };
    let next = LockGrant {
        instance: id,
        holder: "host-2#s2.bb/w1".into(),
    };
    assert_eq!(
        store
            .write_under_lock(
                &paused,
                LockedWrite::Version {
                    id,
                    version: "1.1",
                    now: t(1),
                }
            )
            .await,
        Err(StoreError::LockLost {
            instance: id,
            holder: paused.holder.clone(),
        }),
        "a lock never taken admits nothing"
    );
    let taken = store
        .try_lock_instances(&[id], &paused.holder, SHORT)
        .await
        .unwrap();
    assert_eq!(taken, [id]);
    let hold = Inhibition {
        service: web.clone(),
        container: c1.clone(),
        reason: InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: t(0),
        stop_grace: None,
        revert_to: None,
    };
    let held_writes = [
        LockedWrite::Version {
            id,
            version: "1.1",
            now: t(1),
        },
        LockedWrite::SaveActive {
            instance: &name,
            service: &web,
            active: &active("c1", "r1"),
        },
        LockedWrite::SaveInhibition {
            instance: &name,
            inhibition: &hold,
        },
    ];
    for write in held_writes {
        assert_eq!(
            store.write_under_lock(&paused, write).await,
            Ok(true),
            "its holder writes: {write:?}"
        );
    }
    let cas_missed = LockedWrite::State {
        id,
        from: InstanceState::Ready,
        to: InstanceState::Failed,
        now: t(1),
    };
    assert_eq!(
        store.write_under_lock(&paused, cas_missed).await,
        Ok(false),
        "a compare-and-set under the lock still compares"
    );
    let other = LockGrant {
        instance: instance(store, "beta").await,
        holder: paused.holder.clone(),
    };
    store
        .try_lock_instances(&[other.instance], &other.holder, Duration::from_secs(600))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let lost = Err(StoreError::LockLost {
        instance: id,
        holder: paused.holder.clone(),
    });
    let late = LockedWrite::Version {
        id,
        version: "9.9",
        now: t(2),
    };
    assert_eq!(
        store.write_under_lock(&paused, late).await,
        lost,
        "expired and not yet taken over: its holder may be paused past it"
    );
    let taken = store
        .try_lock_instances(&[id], &next.holder, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(taken, [id]);
    let new_active = active("c2", "r2");
    let refused = [
        LockedWrite::State {
            id,
            from: InstanceState::Provisioning,
            to: InstanceState::Ready,
            now: t(2),
        },
        late,
        LockedWrite::SpecDigest {
            id,
            digest: "sha256:stale",
            now: t(2),
        },
        LockedWrite::SaveActive {
            instance: &name,
            service: &web,
            active: &new_active,
        },
        LockedWrite::RemoveActive {
            instance: &name,
            service: &web,
        },
        LockedWrite::ReleaseClaims {
            instance: &name,
            container: &c1,
        },
        LockedWrite::SaveInhibition {
            instance: &name,
            inhibition: &Inhibition {
                reason: InhibitionReason::parse("operator-hold"),
                ..hold.clone()
            },
        },
        LockedWrite::ClearInhibition {
            instance: &name,
            service: &web,
            container: &c1,
        },
    ];
    for write in refused {
        assert_eq!(
            store.write_under_lock(&paused, write).await,
            lost,
            "taken over: {write:?}"
        );
    }
    let row = store.instance_by_id(id).await.unwrap().unwrap();
    assert_eq!(
        (row.state, row.version.as_str(), row.spec_digest),
        (InstanceState::Provisioning, "1.1", None),
        "nothing written"
    );
    let loaded = store.load_active(&name).await.unwrap();
    assert_eq!(loaded.services[&web], active("c1", "r1"), "nothing written");
    assert_eq!(store.load_inhibitions(&name).await.unwrap(), [hold]);
    let moved = LockedWrite::State {
        id,
        from: InstanceState::Provisioning,
        to: InstanceState::Ready,
        now: t(3),
    };
    assert_eq!(store.write_under_lock(&next, moved).await, Ok(true));
    let cleared = LockedWrite::ClearInhibition {
        instance: &name,
        service: &web,
        container: &c1,
    };
    assert_eq!(store.write_under_lock(&next, cleared).await, Ok(true));
    assert_eq!(
        store.instance_by_id(id).await.unwrap().unwrap().state,
        InstanceState::Ready
    );
    assert!(store.load_inhibitions(&name).await.unwrap().is_empty());
    store.unlock_instances(&[id], &next.holder).await.unwrap();
    assert_eq!(
        store.write_under_lock(&next, moved).await,
        Err(StoreError::LockLost {
            instance: id,
            holder: next.holder.clone(),
        }),
        "a released lock admits nothing"
    );
}

async fn timestamps_round_trip_at_microsecond_precision(s: TestStore) {
    let store = &*s.store;
    let precise = Timestamp::new(1_800_000_000, 123_456_789).unwrap();
    let mut new = new_instance("alpha");
    new.expires_at = Some(precise);
    let created = store.create_instance(&new, precise).await.unwrap();
    let micros = Timestamp::new(1_800_000_000, 123_456_000).unwrap();
    assert_eq!(
        (created.expires_at, created.created_at),
        (Some(micros), micros)
    );
    let loaded = store.instance_by_id(created.id).await.unwrap().unwrap();
    assert_eq!(loaded, created);
    // Far past and far future survive too.
    let mut old = new_instance("old");
    old.expires_at = Some(Timestamp::MAX);
    let created = store.create_instance(&old, Timestamp::MIN).await.unwrap();
    assert_eq!(
        store.instance_by_id(created.id).await.unwrap(),
        Some(created)
    );
}

async fn a_store_outage_fails_calls_and_loses_nothing(s: TestStore) {
    let id = instance(&*s.store, "alpha").await;
    s.store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap();
    s.take_down().await;
    let down = s
        .store
        .enqueue(&task(TaskKind::Upgrade, id, t(0)), t(1), None)
        .await;
    assert!(
        matches!(down, Err(StoreError::Unavailable(_))),
        "{}: {down:?}",
        s.name()
    );
    let down = s.store.claim("w", t(1), 5).await;
    assert!(matches!(down, Err(StoreError::Unavailable(_))), "{down:?}");
    let store = s.reopen().await;
    let tasks = store.active_tasks().await.unwrap().rows;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].state, TaskState::Queued);
    assert_eq!(store.claim("w", t(2), 5).await.unwrap().len(), 1);
}

// --- bad data (SQL backends: the model cannot hold such rows) -------------

async fn unknown_instance_state_is_a_bad_row_and_others_are_listed(s: TestStore) {
    let store = &*s.store;
    instance(store, "good-1").await;
    s.write_as_foreign_tool(
        "INSERT INTO instances (name, team, service_type, version, state, stopped, \
         created_at_us, updated_at_us) VALUES ('weird', 't', 'wiki', '1', 'suspended', FALSE, 0, 0)",
    )
    .await
    .unwrap();
    instance(store, "good-2").await;
    let listed = store.list_instances().await.unwrap();
    let names: Vec<_> = listed.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1", "good-2"]);
    assert_eq!(listed.bad.len(), 1);
    let StoreError::BadRow {
        table,
        field,
        value,
        ..
    } = &listed.bad[0]
    else {
        panic!("{:?}", listed.bad);
    };
    assert_eq!(
        (*table, *field, value.as_str()),
        ("instances", "state", "suspended")
    );
    let message = listed.bad[0].to_string();
    assert!(
        message.contains("instances") && message.contains("suspended"),
        "{message}"
    );
    let for_recovery = store.list_for_recovery().await.unwrap();
    let names: Vec<_> = for_recovery.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1", "good-2"]);
    assert!(
        matches!(&for_recovery.bad[..], [StoreError::BadRow { table: "instances", field: "state", value, .. }] if value == "suspended"),
        "{:?}",
        for_recovery.bad
    );
    let direct = store.instance(&InstanceName::new("weird")).await;
    assert!(
        matches!(direct, Err(StoreError::BadRow { .. })),
        "{direct:?}"
    );
    // The gauges skip it rather than fail.
    let counts = store.instance_counts().await.unwrap();
    assert_eq!(counts[&InstanceState::Provisioning], 2);
}

async fn unknown_task_kind_is_reported_never_claimed_and_others_run(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    s.write_as_foreign_tool(&format!(
        "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
         created_at_us, updated_at_us) VALUES ('explode', {id}, 'queued', 0, 0, 'x', 0, 0)"
    ))
    .await
    .unwrap();
    let good = store
        .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
        .await
        .unwrap()
        .unwrap();
    let active = store.active_tasks().await.unwrap();
    assert_eq!(active.rows.iter().map(|t| t.id).collect::<Vec<_>>(), [good]);
    assert!(
        matches!(&active.bad[..], [StoreError::BadRow { table: "tasks", field: "kind", value, .. }] if value == "explode"),
        "{:?}",
        active.bad
    );
    let claimed = store.claim("w", t(1), 10).await.unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [good]);
}

async fn unknown_rollout_state_is_a_clear_error(s: TestStore) {
    let store = &*s.store;
    s.write_as_foreign_tool(
        "INSERT INTO rollouts (service_type, state, reason, updated_at_us) \
         VALUES ('wiki', 'paused', '', 0)",
    )
    .await
    .unwrap();
    let rollouts = store.rollouts().await;
    assert!(
        matches!(&rollouts, Err(StoreError::BadRow { table: "rollouts", field: "state", value, .. }) if value == "paused"),
        "{rollouts:?}"
    );
}

async fn bad_binds_name_the_row(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    s.write_as_foreign_tool(&format!(
        "INSERT INTO active_services (instance_id, service, container_id, effective_revision, \
         backend_binds) VALUES ({id}, 'web', 'c1', 'r1', 'not json')"
    ))
    .await
    .unwrap();
    let loaded = store.load_active(&InstanceName::new("alpha")).await;
    assert!(
        matches!(
            &loaded,
            Err(StoreError::BadRow {
                table: "active_services",
                field: "backend_binds",
                ..
            })
        ),
        "{loaded:?}"
    );
}

async fn instance_names_that_are_not_dns_labels_are_bad_rows_and_others_are_listed(s: TestStore) {
    let store = &*s.store;
    instance(store, "good-1").await;
    // A path, a matcher breaker, a leading capital, a trailing '-', empty.
    let bad = ["x/../../config#", "a.b", "Shop", "shop-", ""];
    for name in bad {
        s.raw(&format!(
            "INSERT INTO instances (name, team, service_type, version, state, stopped, \
             created_at_us, updated_at_us) VALUES ('{name}', 't', 'wiki', '1', 'ready', FALSE, 0, 0)"
        ))
        .await
        .unwrap()
        .unwrap();
    }
    instance(store, "good-2").await;
    let listed = store.list_instances().await.unwrap();
    let names: Vec<_> = listed.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1", "good-2"]);
    let reported: Vec<_> = listed
        .bad
        .iter()
        .map(|e| match e {
            StoreError::BadRow {
                table: "instances",
                field: "name",
                value,
                ..
            } => value.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(reported, bad);
    let for_recovery = store.list_for_recovery().await.unwrap();
    let names: Vec<_> = for_recovery.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1", "good-2"]);
    assert_eq!(for_recovery.bad, listed.bad);
    let direct = store.instance(&InstanceName::new("x/../../config#")).await;
    assert!(
        matches!(&direct, Err(StoreError::BadRow { field: "name", .. })),
        "{direct:?}"
    );
}

async fn bad_names_in_active_and_inhibition_rows_are_bad_rows_and_other_instances_load(
    s: TestStore,
) {
    let store = &*s.store;
    let good = InstanceName::new("good");
    instance(store, good.as_str()).await;
    store
        .save_active_service(&good, &ServiceName::new("web"), &active("c1", "r1"))
        .await
        .unwrap();
    let hold = Inhibition {
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
        reason: InhibitionReason::Hold("operator-hold".into()),
        operation: "manual".into(),
        created_at: t(1),
        stop_grace: None,
        revert_to: None,
    };
    store.save_inhibition(&good, &hold).await.unwrap();

    let active_row = |id: i64, service: &str, container: &str| {
        format!(
            "INSERT INTO active_services (instance_id, service, container_id, \
             effective_revision, backend_binds) VALUES ({id}, '{service}', '{container}', 'r1', '{{}}')"
        )
    };
    let inhibition_row = |id: i64, service: &str, container: &str| {
        format!(
            "INSERT INTO inhibitions (instance_id, service, container_id, reason, operation, \
             created_at_us) VALUES ({id}, '{service}', '{container}', 'operator-hold', 'x', 0)"
        )
    };
    let cases = [
        ("active_services", "service", "web/../x", "c1"),
        ("active_services", "service", "Web", "c1"),
        ("active_services", "container_id", "web", "../../images/x"),
        ("inhibitions", "service", "web-", "c1"),
        ("inhibitions", "container_id", "web", "c1?force=1"),
    ];
    for (n, (table, field, service, container)) in cases.into_iter().enumerate() {
        let name = InstanceName::new(format!("bad-{n}"));
        let id = instance(store, name.as_str()).await;
        let is_active = table == "active_services";
        let insert = if is_active {
            active_row(id, service, container)
        } else {
            inhibition_row(id, service, container)
        };
        // The schema holds no name rule, so another tool's insert succeeds.
        s.raw(&insert).await.unwrap().unwrap();
        let result = if is_active {
            store.load_active(&name).await.map(drop)
        } else {
            store.load_inhibitions(&name).await.map(drop)
        };
        let value = if field == "service" {
            service
        } else {
            container
        };
        assert!(
            matches!(
                &result,
                Err(StoreError::BadRow { table: t, field: f, value: v, .. })
                    if t == &table && f == &field && v == value
            ),
            "{table}.{field} = {value:?}: {result:?}"
        );
        // The batch load names the bad row for that instance alone.
        let good_id = store.instance(&good).await.unwrap().unwrap().id;
        let batch = store.load_instances(&[good_id, id]).await.unwrap();
        assert!(
            matches!(&batch[&id], Err(StoreError::BadRow { table: t, .. }) if t == &table),
            "{:?}",
            batch[&id]
        );
        assert!(batch[&good_id].is_ok(), "{:?}", batch[&good_id]);
        // One tenant's bad row never stops another's.
        let active = store.load_active(&good).await.unwrap();
        assert_eq!(active.services.len(), 1);
        assert_eq!(
            store.load_inhibitions(&good).await.unwrap(),
            std::slice::from_ref(&hold)
        );
    }
}

async fn a_batch_load_reads_what_the_single_loads_read(s: TestStore) {
    let store = &*s.store;
    let mut ids = Vec::new();
    for (n, name) in ["alpha", "beta", "gamma"].into_iter().enumerate() {
        // Every field a batch decodes, set and unset (SQLite reads them
        // back through JSON: quoting, nulls, booleans, big integers).
        let mut new = new_instance(name);
        if n == 1 {
            new.parameters = BTreeMap::from([
                (
                    "title".to_owned(),
                    "Ünïcode \"quoted\" {braces} \\ /".to_owned(),
                ),
                ("empty".to_owned(), String::new()),
            ]);
            new.spec_digest = Some("sha256:0123abcd".into());
            new.expires_at = None;
            new.maintenance_window = None;
        }
        let id = store.create_instance(&new, t(0)).await.unwrap().id;
        ids.push(id);
        if n == 1 {
            store.set_purge_volumes(id, t(1)).await.unwrap();
            store.set_instance_stopped(id, true, t(2)).await.unwrap();
        }
        let name = InstanceName::new(name);
        for service in ["web", "db"].iter().take(n + 1) {
            let mut record = active("c1", "r1");
            if n == 2 {
                record.verified_started_at =
                    Some(Timestamp::from_nanosecond(1_800_000_000_123_456_789).unwrap());
                record.stop_grace = None;
                record.binds = BTreeMap::new();
            }
            store
                .save_active_service(&name, &ServiceName::new(*service), &record)
                .await
                .unwrap();
        }
        if n > 0 {
            let hold = Inhibition {
                service: ServiceName::new("web"),
                container: ContainerId::new(format!("c{n}")),
                reason: InhibitionReason::Hold("operator-hold".into()),
                operation: "manual".into(),
                created_at: t(1),
                stop_grace: None,
                revert_to: None,
            };
            store.save_inhibition(&name, &hold).await.unwrap();
        }
    }
    let missing = 999_999;
    let mut asked = ids.clone();
    asked.push(missing);
    let batch = store.load_instances(&asked).await.unwrap();
    let listed = store.list_instances().await.unwrap();
    assert!(listed.bad.is_empty(), "{:?}", listed.bad);
    assert_eq!(batch.len(), 3, "the missing instance is absent: {batch:?}");
    for id in ids {
        let single = store.instance_by_id(id).await.unwrap().unwrap();
        let loaded = batch[&id].as_ref().unwrap();
        assert_eq!(loaded.instance, single);
        assert_eq!(listed.rows.iter().find(|i| i.id == id), Some(&single));
        assert_eq!(
            loaded.active,
            store.load_active(&single.name).await.unwrap()
        );
        assert_eq!(
            loaded.inhibitions,
            store.load_inhibitions(&single.name).await.unwrap()
        );
    }
    assert!(store.load_instances(&[]).await.unwrap().is_empty());

    // A pass takes a batch's locks and rows together: the same rows, read
    // under the locks; an instance another holds is neither locked nor
    // read (R3, T3).
    let long = Duration::from_secs(600);
    let (mut locked, rows) = store
        .try_lock_and_load(&asked, "p1#x/recovery", long)
        .await
        .unwrap();
    locked.sort_unstable();
    let mut expected = asked[..3].to_vec();
    expected.sort_unstable();
    assert_eq!(locked, expected, "the missing instance is not locked");
    assert_eq!(rows.unwrap(), batch, "the rows a batch load reads");
    let (locked, rows) = store
        .try_lock_and_load(&asked, "p2#y/w0", long)
        .await
        .unwrap();
    assert!(locked.is_empty(), "held by the first: {locked:?}");
    assert!(rows.unwrap().is_empty());
    store
        .unlock_instances(&asked, "p1#x/recovery")
        .await
        .unwrap();
    let (locked, rows) = store
        .try_lock_and_load(&asked[..1], "p2#y/w0", long)
        .await
        .unwrap();
    assert_eq!(locked, asked[..1], "free once released");
    assert_eq!(rows.unwrap().len(), 1);
    let (locked, rows) = store.try_lock_and_load(&[], "p2#y/w0", long).await.unwrap();
    assert!(locked.is_empty() && rows.unwrap().is_empty());
}

async fn the_schema_itself_rejects_bad_states_and_duplicate_active_tasks(s: TestStore) {
    let id = instance(&*s.store, "alpha").await;
    let bad_state = s
        .raw(&format!(
            "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
             created_at_us, updated_at_us) VALUES ('provision', {id}, 'lost', 0, 0, 'x', 0, 0)"
        ))
        .await
        .unwrap();
    assert!(bad_state.is_err(), "CHECK on tasks.state");
    let insert_queued = format!(
        "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
         created_at_us, updated_at_us) VALUES ('provision', {id}, 'queued', 0, 0, 'x', 0, 0)"
    );
    s.raw(&insert_queued).await.unwrap().unwrap();
    assert!(
        s.raw(&insert_queued).await.unwrap().is_err(),
        "partial unique index"
    );
    let orphan = s
        .raw(
            "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
             created_at_us, updated_at_us) VALUES ('provision', 9999, 'queued', 0, 0, 'x', 0, 0)",
        )
        .await
        .unwrap();
    assert!(orphan.is_err(), "foreign key");
    let running_unlocked = s
        .raw(&format!(
            "INSERT INTO tasks (kind, instance_id, state, run_after_us, attempts, reason, \
             created_at_us, updated_at_us) VALUES ('upgrade', {id}, 'running', 0, 0, 'x', 0, 0)"
        ))
        .await
        .unwrap();
    assert!(running_unlocked.is_err(), "a running task holds a lease");
}

/// A given host name that is not a DNS name would be published as a
/// route's host: its row is bad, naming the column, and fails alone.
#[tokio::test]
async fn sqlite_a_given_domain_that_is_no_host_name_fails_only_its_row() {
    let s = support::sqlite().await;
    let store = &*s.store;
    instance(store, "good-1").await;
    instance(store, "odd-1").await;
    s.write_as_foreign_tool(
        r#"UPDATE instances SET domains = '["evil host/"]' WHERE name = 'odd-1'"#,
    )
    .await
    .unwrap();
    let listed = store.list_instances().await.unwrap();
    let names: Vec<_> = listed.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1"]);
    assert!(
        matches!(
            &listed.bad[..],
            [StoreError::BadRow {
                table: "instances",
                field: "domains",
                ..
            }]
        ),
        "{:?}",
        listed.bad
    );
}

/// SQLite lets a column hold a value of any type, and another tool may
/// write one: such a row is a bad row naming its table, id and value, and
/// fails alone — the rest of the listing and of its batch read on. (A
/// Postgres column cannot hold such a value.)
#[tokio::test]
async fn sqlite_a_value_of_the_wrong_type_fails_only_its_row() {
    let s = support::sqlite().await;
    let store = &*s.store;
    let good = instance(store, "good-1").await;
    let odd = instance(store, "odd-1").await;
    s.write_as_foreign_tool("UPDATE instances SET expires_at_us = 'soon' WHERE name = 'odd-1'")
        .await
        .unwrap();
    let wrong_type = |e: &StoreError, table: &str| {
        matches!(e, StoreError::BadRow { table: t, id, value, .. }
            if *t == table && id == &odd.to_string() && value.contains("invalid type"))
    };

    let listed = store.list_instances().await.unwrap();
    let names: Vec<_> = listed.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1"]);
    assert!(
        matches!(&listed.bad[..], [e] if wrong_type(e, "instances")),
        "{:?}",
        listed.bad
    );
    let message = listed.bad[0].to_string();
    assert!(message.contains("soon"), "the value is quoted: {message}");
    // A recovery pass lists it (its name and state are sound), so its
    // routes are not taken for a gone instance's; its load fails alone.
    let for_recovery = store.list_for_recovery().await.unwrap();
    let names: Vec<_> = for_recovery.rows.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["good-1", "odd-1"]);
    assert!(for_recovery.bad.is_empty(), "{:?}", for_recovery.bad);

    let batch = store.load_instances(&[good, odd]).await.unwrap();
    assert!(batch[&good].is_ok(), "{batch:?}");
    assert!(
        matches!(&batch[&odd], Err(e) if wrong_type(e, "instances")),
        "{batch:?}"
    );

    // A wrong-typed ACTIVE row fails its own instance only.
    s.write_as_foreign_tool(&format!(
        "UPDATE instances SET expires_at_us = NULL WHERE id = {odd}; \
         INSERT INTO active_services (instance_id, service, container_id, \
         effective_revision, stop_grace_ms) VALUES ({odd}, 'web', 'c1', 'r1', 'long')"
    ))
    .await
    .unwrap();
    let batch = store.load_instances(&[good, odd]).await.unwrap();
    assert!(batch[&good].is_ok(), "{batch:?}");
    assert!(
        matches!(&batch[&odd], Err(e) if wrong_type(e, "active_services")),
        "{batch:?}"
    );
    assert_eq!(store.list_instances().await.unwrap().rows.len(), 2);

    // Taken with its locks, the batch reads the same: the bad row fails
    // its instance alone, and both locks are taken (the pass releases
    // them with the batch).
    let (mut locked, rows) = store
        .try_lock_and_load(&[good, odd], "p1#x/recovery", Duration::from_secs(600))
        .await
        .unwrap();
    locked.sort_unstable();
    assert_eq!(locked, [good, odd]);
    let rows = rows.unwrap();
    assert!(rows[&good].is_ok(), "{rows:?}");
    assert!(
        matches!(&rows[&odd], Err(e) if wrong_type(e, "active_services")),
        "{rows:?}"
    );
}

// --- the event log (#42) -------------------------------------------------

fn event(kind: EventKind, at: Timestamp, instance: Option<&str>) -> Event {
    let mut event = Event::new(kind, at, "R9", format!("{kind} at {at}"));
    event.instance = instance.map(InstanceName::new);
    event.writer = "host-1#a".into();
    event
}

fn kinds_and_instances(rows: &[LoggedEvent]) -> Vec<(EventKind, Option<String>)> {
    rows.iter()
        .map(|e| {
            (
                e.event.kind,
                e.event.instance.as_ref().map(|i| i.to_string()),
            )
        })
        .collect()
}

async fn events_are_appended_in_order_and_read_back_with_every_field(s: TestStore) {
    let store = &*s.store;
    let full = Event::new(
        EventKind::CrashLoopDelay,
        t(10) + jiff::SignedDuration::from_nanos(1_234_567),
        "R10",
        "crash loop: alpha/web stays down",
    )
    .instance(&InstanceName::new("alpha"))
    .service(&ServiceName::new("web"))
    .container(&ContainerId::new("c0ffee"))
    .until(t(70))
    .task(7)
    .traced(Some(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ));
    let mut full = full;
    full.writer = "host-1#a".into();
    let bare = event(EventKind::LeaseTaken, t(11), None);
    store
        .append_events(&[full.clone(), bare.clone()])
        .await
        .unwrap();
    store.append_events(&[]).await.unwrap();
    let read = store.events(&EventFilter::default()).await.unwrap();
    assert!(read.bad.is_empty(), "{}: {:?}", s.name(), read.bad);
    assert_eq!(read.rows.len(), 2, "{}", s.name());
    assert!(
        read.rows[0].id < read.rows[1].id,
        "ids ascend in write order"
    );
    // Stored to the microsecond, as every timestamp.
    let mut expected = full;
    expected.at = t(10) + jiff::SignedDuration::from_micros(1_234);
    assert_eq!(read.rows[0].event, expected, "{}", s.name());
    assert_eq!(
        read.rows[0].event.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(read.rows[1].event, bare, "{}", s.name());
}

async fn events_are_filtered_by_instance_kind_and_since_and_the_newest_kept(s: TestStore) {
    let store = &*s.store;
    store
        .append_events(&[
            event(EventKind::Start, t(1), Some("alpha")),
            event(EventKind::Publish, t(2), Some("alpha")),
            event(EventKind::Start, t(3), Some("beta")),
            event(EventKind::Start, t(4), Some("alpha")),
            event(EventKind::CatalogReload, t(5), None),
        ])
        .await
        .unwrap();
    let read = |filter: EventFilter| async move { store.events(&filter).await.unwrap().rows };
    let alpha = Some(InstanceName::new("alpha"));
    let a = || Some("alpha".to_owned());
    assert_eq!(
        kinds_and_instances(
            &read(EventFilter {
                instance: alpha.clone(),
                ..Default::default()
            })
            .await
        ),
        [
            (EventKind::Start, a()),
            (EventKind::Publish, a()),
            (EventKind::Start, a())
        ],
        "{}",
        s.name()
    );
    let starts = read(EventFilter {
        kind: Some(EventKind::Start),
        ..Default::default()
    })
    .await;
    assert_eq!(starts.len(), 3, "{}", s.name());
    let recent = read(EventFilter {
        since: Some(t(3)),
        ..Default::default()
    })
    .await;
    assert_eq!(
        recent.iter().map(|e| e.event.at).collect::<Vec<_>>(),
        [t(3), t(4), t(5)],
        "since is inclusive: {}",
        s.name()
    );
    let newest_two = read(EventFilter {
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(
        newest_two.iter().map(|e| e.event.at).collect::<Vec<_>>(),
        [t(4), t(5)],
        "the newest, in order: {}",
        s.name()
    );
    let none = read(EventFilter {
        instance: alpha,
        kind: Some(EventKind::CatalogReload),
        ..Default::default()
    })
    .await;
    assert!(none.is_empty(), "{}", s.name());
}

async fn following_the_event_log_reads_on_after_the_last_id_seen(s: TestStore) {
    let store = &*s.store;
    let batch: Vec<Event> = (0..5)
        .map(|i| event(EventKind::Enqueue, t(i), Some("alpha")))
        .collect();
    store.append_events(&batch).await.unwrap();
    let all = store.events(&EventFilter::default()).await.unwrap().rows;
    let first = store
        .events(&EventFilter {
            after_id: Some(all[0].id),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .rows;
    assert_eq!(
        first.iter().map(|e| e.id).collect::<Vec<_>>(),
        [all[1].id, all[2].id],
        "the oldest after the id: {}",
        s.name()
    );
    store
        .append_events(&[event(EventKind::Cancel, t(9), Some("alpha"))])
        .await
        .unwrap();
    let rest = store
        .events(&EventFilter {
            after_id: Some(first[1].id),
            ..Default::default()
        })
        .await
        .unwrap()
        .rows;
    assert_eq!(
        rest.iter().map(|e| e.event.kind).collect::<Vec<_>>(),
        [EventKind::Enqueue, EventKind::Enqueue, EventKind::Cancel],
        "{}",
        s.name()
    );
}

/// #41 item 8: finished tasks are pruned past the retention, oldest first
/// in bounded batches; queued and running tasks are never pruned, however
/// old.
async fn finished_tasks_are_pruned_oldest_first_and_active_ones_never(s: TestStore) {
    let store = &*s.store;
    let mut ids = Vec::new();
    for name in ["alpha", "beta", "gamma", "delta", "eps"] {
        let id = instance(store, name).await;
        let queued = store
            .enqueue(&task(TaskKind::Provision, id, t(0)), t(0), None)
            .await
            .unwrap()
            .unwrap();
        ids.push(queued);
    }
    // Four claimed, the fifth stays queued from t(0) on.
    let claimed = store.claim("w1", t(1), 4).await.unwrap();
    assert_eq!(claimed.len(), 4, "{}", s.name());
    assert!(store.complete(ids[0], "w1", t(2)).await.unwrap());
    assert!(store.fail(ids[1], "w1", "broken", t(3)).await.unwrap());
    assert!(store.complete(ids[2], "w1", t(4)).await.unwrap());
    // ids[3] keeps running from t(1) on.
    let left = || async {
        let mut ids: Vec<_> = store
            .tasks(true, 100)
            .await
            .unwrap()
            .rows
            .into_iter()
            .map(|t| t.id)
            .collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(
        store.prune_finished_tasks(t(4), 1).await.unwrap(),
        1,
        "{}",
        s.name()
    );
    assert_eq!(
        left().await,
        [ids[1], ids[2], ids[3], ids[4]],
        "the oldest finished one goes first: {}",
        s.name()
    );
    assert_eq!(
        store.prune_finished_tasks(t(4), 10).await.unwrap(),
        1,
        "the failed one; the one done at t(4) is not older than t(4): {}",
        s.name()
    );
    assert_eq!(
        store.prune_finished_tasks(t(100), 10).await.unwrap(),
        1,
        "{}",
        s.name()
    );
    assert_eq!(
        left().await,
        [ids[3], ids[4]],
        "running and queued tasks stay: {}",
        s.name()
    );
    assert_eq!(store.active_tasks().await.unwrap().rows.len(), 2);
}

async fn old_events_are_pruned_in_bounded_batches_and_newer_ones_kept(s: TestStore) {
    let store = &*s.store;
    let batch: Vec<Event> = (0..7)
        .map(|i| event(EventKind::Publish, t(i), Some("alpha")))
        .collect();
    store.append_events(&batch).await.unwrap();
    assert_eq!(
        store.prune_events(t(5), 3).await.unwrap(),
        3,
        "{}",
        s.name()
    );
    let left = store.events(&EventFilter::default()).await.unwrap().rows;
    assert_eq!(
        left.iter().map(|e| e.event.at).collect::<Vec<_>>(),
        [t(3), t(4), t(5), t(6)],
        "the oldest go first: {}",
        s.name()
    );
    assert_eq!(
        store.prune_events(t(5), 3).await.unwrap(),
        2,
        "{}",
        s.name()
    );
    assert_eq!(
        store.prune_events(t(5), 3).await.unwrap(),
        0,
        "{}",
        s.name()
    );
    let left = store.events(&EventFilter::default()).await.unwrap().rows;
    assert_eq!(
        left.iter().map(|e| e.event.at).collect::<Vec<_>>(),
        [t(5), t(6)],
        "{}",
        s.name()
    );
}

async fn an_event_of_an_unknown_kind_is_a_bad_row_and_the_others_are_read(s: TestStore) {
    let store = &*s.store;
    store
        .append_events(&[event(EventKind::Start, t(1), Some("alpha"))])
        .await
        .unwrap();
    s.raw(
        "INSERT INTO events (at_us, kind, instance, reason, message, writer) \
         VALUES (0, 'reboot', 'alpha', 'R0', 'x', 'w'); \
         INSERT INTO events (at_us, kind, instance, reason, message, writer) \
         VALUES (0, 'start', 'Not A Label', 'R0', 'x', 'w')",
    )
    .await
    .unwrap()
    .unwrap();
    let read = store.events(&EventFilter::default()).await.unwrap();
    assert_eq!(read.rows.len(), 1, "{}", s.name());
    let bad: Vec<String> = read.bad.iter().map(ToString::to_string).collect();
    assert_eq!(bad.len(), 2, "{}: {bad:?}", s.name());
    assert!(
        read.bad.iter().any(|e| matches!(e, StoreError::BadRow { table: "events", field: "kind", value, .. } if value == "reboot")),
        "{bad:?}"
    );
    assert!(
        read.bad.iter().any(|e| matches!(
            e,
            StoreError::BadRow {
                table: "events",
                field: "instance",
                ..
            }
        )),
        "{bad:?}"
    );
}

async fn an_enqueue_and_its_event_are_recorded_together_or_not_at_all(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    let grant = store
        .acquire_reconciler_lease("a#1", SHORT)
        .await
        .unwrap()
        .unwrap();
    let queued = event(EventKind::Enqueue, t(1), Some("alpha"));
    let first = store
        .enqueue_recorded(
            &task(TaskKind::Upgrade, id, t(1)),
            t(1),
            Some(&grant),
            &queued,
        )
        .await
        .unwrap()
        .expect("inserted");
    let read = store.events(&EventFilter::default()).await.unwrap().rows;
    assert_eq!(read.len(), 1, "{}", s.name());
    assert_eq!(read[0].event.task, Some(first), "the event names its task");
    // Nothing queued (one upgrade at a time), nothing recorded.
    let again = store
        .enqueue_recorded(
            &task(TaskKind::Upgrade, id, t(2)),
            t(2),
            Some(&grant),
            &queued,
        )
        .await
        .unwrap();
    assert_eq!(again, None);
    assert_eq!(
        store
            .events(&EventFilter::default())
            .await
            .unwrap()
            .rows
            .len(),
        1
    );
    // A fenced write refused: neither the task nor its event.
    tokio::time::sleep(PAST_SHORT).await;
    let refused = store
        .enqueue_recorded(
            &task(TaskKind::Reprovision, id, t(3)),
            t(3),
            Some(&grant),
            &queued,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{}: {refused:?}",
        s.name()
    );
    assert_eq!(
        store
            .events(&EventFilter::default())
            .await
            .unwrap()
            .rows
            .len(),
        1
    );
    assert!(
        !store
            .active_tasks()
            .await
            .unwrap()
            .rows
            .iter()
            .any(|t| t.kind == TaskKind::Reprovision),
        "{}",
        s.name()
    );
}

async fn a_ttl_expiry_and_its_event_are_recorded_together_or_not_at_all(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    store
        .set_instance_state(id, InstanceState::Provisioning, InstanceState::Ready, t(1))
        .await
        .unwrap();
    let expiry = event(EventKind::TtlExpiry, t(2), Some("alpha"));
    let expired = store
        .expire_instance_recorded(
            id,
            InstanceState::Ready,
            &task(TaskKind::Deprovision, id, t(2)),
            t(2),
            None,
            &expiry,
        )
        .await
        .unwrap()
        .expect("expired");
    let read = store.events(&EventFilter::default()).await.unwrap().rows;
    assert_eq!(read.len(), 1, "{}", s.name());
    assert_eq!(read[0].event.kind, EventKind::TtlExpiry);
    assert_eq!(read[0].event.task, Some(expired.task));
    // The compare-and-set fails the second time: nothing is recorded.
    let again = store
        .expire_instance_recorded(
            id,
            InstanceState::Ready,
            &task(TaskKind::Deprovision, id, t(3)),
            t(3),
            None,
            &expiry,
        )
        .await
        .unwrap();
    assert_eq!(again, None);
    assert_eq!(
        store
            .events(&EventFilter::default())
            .await
            .unwrap()
            .rows
            .len(),
        1
    );
}

async fn an_event_the_database_refuses_takes_its_enqueue_and_expiry_with_it(s: TestStore) {
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    store
        .set_instance_state(id, InstanceState::Provisioning, InstanceState::Ready, t(1))
        .await
        .unwrap();
    // The schema refuses an event nobody wrote.
    let mut unsigned = event(EventKind::Enqueue, t(1), Some("alpha"));
    unsigned.writer.clear();
    let queued = store
        .enqueue_recorded(&task(TaskKind::Upgrade, id, t(1)), t(1), None, &unsigned)
        .await;
    assert!(queued.is_err(), "{}: {queued:?}", s.name());
    let expired = store
        .expire_instance_recorded(
            id,
            InstanceState::Ready,
            &task(TaskKind::Deprovision, id, t(2)),
            t(2),
            None,
            &unsigned,
        )
        .await;
    assert!(expired.is_err(), "{}: {expired:?}", s.name());
    assert!(
        store.active_tasks().await.unwrap().rows.is_empty(),
        "neither task was queued: {}",
        s.name()
    );
    let alpha = store.instance_by_id(id).await.unwrap().unwrap();
    assert_eq!(alpha.state, InstanceState::Ready, "{}", s.name());
    assert!(store
        .events(&EventFilter::default())
        .await
        .unwrap()
        .rows
        .is_empty());
}

async fn a_tasks_end_and_its_event_are_recorded_together_or_not_at_all(s: TestStore) {
    use stead::ports::TaskFinish;
    let store = &*s.store;
    let id = instance(store, "alpha").await;
    for kind in [
        TaskKind::Provision,
        TaskKind::Upgrade,
        TaskKind::Reprovision,
    ] {
        store
            .enqueue(&task(kind, id, t(0)), t(0), None)
            .await
            .unwrap();
    }
    let claimed = store.claim("w1", t(1), 3).await.unwrap();
    assert_eq!(claimed.len(), 3, "{}", s.name());
    let ended = event(EventKind::TaskDone, t(2), Some("alpha"));
    let finishes = [
        TaskFinish::Done,
        TaskFinish::Retry {
            run_after: t(60),
            error: "transient",
        },
        TaskFinish::Fail { error: "refused" },
    ];
    for (task, finish) in claimed.iter().zip(finishes) {
        // Another worker's finish changes nothing and records nothing.
        let foreign = store
            .finish_task_recorded(task.id, "w2", finish, t(2), &ended)
            .await
            .unwrap();
        assert!(!foreign, "{}: {finish:?}", s.name());
        let held = store
            .finish_task_recorded(task.id, "w1", finish, t(2), &ended)
            .await
            .unwrap();
        assert!(held, "{}: {finish:?}", s.name());
    }
    let events = store.events(&EventFilter::default()).await.unwrap().rows;
    let tasks: Vec<Option<i64>> = events.iter().map(|e| e.event.task).collect();
    let ids: Vec<Option<i64>> = claimed.iter().map(|t| Some(t.id)).collect();
    assert_eq!(
        tasks,
        ids,
        "one event per end, naming its task: {}",
        s.name()
    );
    let states: Vec<TaskState> = {
        let mut states = Vec::new();
        for t in &claimed {
            states.push(store.task(t.id).await.unwrap().unwrap().state);
        }
        states
    };
    assert_eq!(
        states,
        [TaskState::Done, TaskState::Queued, TaskState::Failed],
        "{}",
        s.name()
    );
}

// --- webhook cursors (#42) -----------------------------------------------

async fn a_webhook_cursor_is_created_once_and_moves_only_from_where_it_was_read(s: TestStore) {
    let store = s.store.as_ref();
    let name = s.name();
    assert_eq!(store.webhook_cursor("ops").await.unwrap(), None, "{name}");
    assert!(store
        .advance_webhook_cursor("ops", None, 5, t(1))
        .await
        .unwrap());
    assert!(
        !store
            .advance_webhook_cursor("ops", None, 9, t(2))
            .await
            .unwrap(),
        "{name}: a cursor is created once"
    );
    assert!(
        !store
            .advance_webhook_cursor("ops", Some(4), 9, t(2))
            .await
            .unwrap(),
        "{name}: a reader that read it late moves nothing"
    );
    assert_eq!(
        store.webhook_cursor("ops").await.unwrap(),
        Some(5),
        "{name}"
    );
    assert!(store
        .advance_webhook_cursor("ops", Some(5), 9, t(3))
        .await
        .unwrap());
    assert_eq!(
        store.webhook_cursor("ops").await.unwrap(),
        Some(9),
        "{name}"
    );
    assert_eq!(
        store.webhook_cursor("pager").await.unwrap(),
        None,
        "{name}: each webhook has its own"
    );
    // Two processes that read the same cursor: one moves it.
    let other = s.reopen().await;
    let (a, b) = tokio::join!(
        store.advance_webhook_cursor("ops", Some(9), 11, t(4)),
        other.advance_webhook_cursor("ops", Some(9), 12, t(4)),
    );
    assert!(a.unwrap() ^ b.unwrap(), "{name}: exactly one moves it");
    let moved = other.webhook_cursor("ops").await.unwrap();
    assert!(matches!(moved, Some(11 | 12)), "{name}: {moved:?}");
}
