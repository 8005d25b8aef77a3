//! Issue #14: what a steady recovery pass costs the store, counted (not
//! timed). A pass lists the instances once, then per batch of
//! `recovery.instances_at_once` instances takes their locks and loads
//! their rows in one round trip and releases them in one; nothing per
//! instance or per service. So the round trips of a pass grow with the
//! number of batches, and a fleet a hundred times larger costs the store a
//! hundred times fewer round trips per instance than one trip each would.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::Ports;
use stead_testkit::fleet::{build_steady_fleet, FleetShape};
use stead_testkit::ports::{
    Fault, FaultInjector, Hooks, ManualClock, MemoryNotifier, MemoryPolicy, MemoryProbe,
    MemoryProvisioner, MemoryRuntime, MemoryTraffic, Op,
};
use stead_testkit::store::MemoryStore;

/// A batch's round trips: its locks taken with its rows, then released.
const TRIPS_PER_BATCH: u64 = 2;

/// The store round trips of one steady pass over `shape`, after a first
/// pass (which takes the lease) changed nothing either.
async fn steady_round_trips(shape: FleetShape, policy: &RecoveryPolicy) -> u64 {
    steady_round_trips_with(shape, policy, Hooks::default()).await
}

/// [`steady_round_trips`] with the runtime's faults decided by `hooks`.
async fn steady_round_trips_with(shape: FleetShape, policy: &RecoveryPolicy, hooks: Hooks) -> u64 {
    let clock = Arc::new(ManualClock::new(
        Timestamp::from_second(1_800_000_000).unwrap(),
    ));
    let store = Arc::new(MemoryStore::new().with_clock(clock.clone()));
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), hooks.clone()));
    let traffic = Arc::new(MemoryTraffic::new(hooks.clone()));
    build_steady_fleet(
        shape,
        store.as_ref(),
        &runtime,
        &traffic,
        Timestamp::from_second(1_800_000_000).unwrap(),
    )
    .await
    .unwrap();
    let ports = Ports {
        clock: clock.clone(),
        runtime: runtime.clone(),
        traffic: traffic.clone(),
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime.clone(), hooks.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: Arc::new(MemoryProvisioner::new("stead", hooks.clone())),
        notifier: Arc::new(MemoryNotifier::new(hooks)),
    };
    let ttl = reconciler_lease_ttl(Duration::from_secs(30), policy.instance_deadline);
    let locks = Arc::new(InstanceLocks::new(store.clone()));
    let recoverer = Recoverer::new(
        ports,
        policy.clone(),
        Default::default(),
        locks.clone(),
        "a/recovery".into(),
        Arc::new(LeaseGuard::new("a".into(), ttl, LEASE_MARGIN)),
    );
    for pass in ["first", "steady"] {
        let before = store.n_calls();
        let outcome = recoverer.pass().await;
        assert_eq!(
            outcome.error_count(),
            0,
            "{pass} pass: {:?}",
            outcome.errors
        );
        assert_eq!(outcome.instances.len(), shape.instances, "{pass} pass");
        let reports = outcome.outcomes().flat_map(|i| &i.reports);
        assert_eq!(reports.clone().count(), shape.services(), "{pass} pass");
        assert!(
            reports.clone().all(|r| !r.intervened),
            "a steady fleet is left alone ({pass} pass)"
        );
        // Released locks are forgotten in-process too: the map does not
        // grow with every instance the process ever locked.
        assert_eq!(
            locks.local_entries(),
            0,
            "in-process lock entries left after the {pass} pass"
        );
        if pass == "steady" {
            return store.n_calls() - before;
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_steady_pass_costs_one_listing_and_two_round_trips_per_batch() {
    let policy = RecoveryPolicy::default();
    let batch = policy.instances_at_once;
    for instances in [1, batch - 1, batch, batch + 1, 10 * batch] {
        let shape = FleetShape {
            instances,
            services_per_instance: 2,
        };
        let batches = instances.div_ceil(batch) as u64;
        assert_eq!(
            steady_round_trips(shape, &policy).await,
            1 + TRIPS_PER_BATCH * batches,
            "{instances} instances in {batches} batch(es) of {batch}"
        );
    }
}

#[tokio::test]
async fn the_services_of_an_instance_cost_the_store_nothing_more() {
    let policy = RecoveryPolicy::default();
    let trips = |services_per_instance| {
        steady_round_trips(
            FleetShape {
                instances: 40,
                services_per_instance,
            },
            &policy,
        )
    };
    let one = trips(1).await;
    assert_eq!(one, trips(5).await);
}

#[tokio::test]
async fn larger_batches_mean_fewer_round_trips_for_the_same_fleet() {
    let shape = FleetShape {
        instances: 256,
        services_per_instance: 1,
    };
    let mut last = u64::MAX;
    for instances_at_once in [1, 8, 64, 256] {
        let policy = RecoveryPolicy {
            instances_at_once,
            ..Default::default()
        };
        let trips = steady_round_trips(shape, &policy).await;
        assert_eq!(
            trips,
            1 + TRIPS_PER_BATCH * (256 / instances_at_once) as u64
        );
        assert!(trips < last);
        last = trips;
    }
}

/// Answers every inspect after a while, and nothing else.
struct SlowInspect(Duration);

impl FaultInjector for SlowInspect {
    fn decide(&self, op: Op, _subject: &str) -> Fault {
        match op {
            Op::Inspect => Fault::Slow(self.0),
            _ => Fault::Proceed,
        }
    }
}

/// The pass takes the next batch's locks and rows while it drives this
/// one; a batch that waited behind a slow one longer than a second is
/// released and taken again before it is driven (its locks' trust and its
/// deadline run from when they were taken), and one that waited less is
/// driven as taken.
#[tokio::test(start_paused = true)]
async fn a_batch_taken_ahead_of_a_slow_one_is_taken_again_before_it_is_driven() {
    let policy = RecoveryPolicy {
        instances_at_once: 1,
        ..Default::default()
    };
    let shape = FleetShape {
        instances: 4,
        services_per_instance: 1,
    };
    let slow = |after| Hooks {
        faults: Arc::new(SlowInspect(after)),
        ..Hooks::default()
    };
    assert_eq!(
        steady_round_trips_with(shape, &policy, slow(Duration::from_millis(500))).await,
        1 + TRIPS_PER_BATCH * 4,
        "half a second behind: every batch driven as taken ahead"
    );
    assert_eq!(
        steady_round_trips_with(shape, &policy, slow(Duration::from_millis(1500))).await,
        1 + TRIPS_PER_BATCH * 4 + TRIPS_PER_BATCH * 3,
        "a second and a half behind: each batch after the first released, locked and loaded again"
    );
}
