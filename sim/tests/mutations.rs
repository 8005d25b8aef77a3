//! The mutation exercise: break one rule at a time (see `testkit/src/mutants.rs`)
//! and prove the checker names the invariant that guards it. A checker that
//! stays green while a rule is broken is a checker that proves nothing.
//!
//! Each test searches seeds from 1 until the expected invariant fires, and
//! fails if none of the first `SEEDS_MAX` does.
#![cfg(madsim)]

use std::time::Duration;

use stead_sim::{run_seed, say, SimConfig};
use stead_testkit::mutants::{armed, Mutant};

/// Seeds tried per mutant before the checker is declared blind to it.
/// Most are caught in the first few; `IgnoreOwnTeam` took 94 once the
/// tenants' teams joined the fleet (its order matters only when another
/// team's instance sorts ahead of one of the own team's while slots are
/// short).
const SEEDS_MAX: u64 = 200;

/// Runs seeds with `mutant` armed until a violation of `invariant` shows;
/// returns that seed and the violation.
fn first_catch(mutant: Mutant, invariant: &str) -> (u64, String) {
    first_catch_over(mutant, invariant, Duration::from_secs(2 * 3600))
}

/// [`first_catch`] with `safety` of faults per seed.
fn first_catch_over(mutant: Mutant, invariant: &str, safety: Duration) -> (u64, String) {
    let mut other = Vec::new();
    for seed in 1..=SEEDS_MAX {
        let mut cfg = SimConfig::new(seed);
        cfg.safety = safety;
        let outcome = armed(mutant, || run_seed(&cfg));
        if let Some(v) = outcome.violations.iter().find(|v| v.starts_with(invariant)) {
            return (seed, v.clone());
        }
        other.extend(outcome.violations.into_iter().take(1));
    }
    panic!(
        "{mutant:?} was never caught as {invariant:?} in {SEEDS_MAX} seeds; \
         other violations seen: {other:?}"
    );
}

fn assert_caught(mutant: Mutant, invariant: &str) {
    let (seed, violation) = first_catch(mutant, invariant);
    say!("{mutant:?}: caught at seed {seed}: {violation}");
}

#[test]
fn an_upgrade_parked_behind_its_window_is_caught() {
    assert_caught(
        Mutant::ParkUpgradeBehindWindow,
        "S9 an upgrade is enqueued only inside its window, due at once",
    );
}

/// #55: a retry outside the window ends its task instead of parking.
#[test]
fn a_retry_parked_behind_its_window_is_caught() {
    assert_caught(
        Mutant::ParkRetryBehindWindow,
        "S9 a retried upgrade never parks behind its window",
    );
}

/// #55: a reverted successor is kept, stopped, as evidence.
#[test]
fn a_reverted_successor_removed_at_once_is_caught() {
    assert_caught(
        Mutant::RemoveRevertedAtOnce,
        "B3 a reverted successor is kept for its hour",
    );
}

/// #55: a bake holds its instance's slot of `max_in_flight`.
#[test]
fn an_upgrade_started_while_another_bakes_at_the_limit_is_caught() {
    assert_caught(
        Mutant::BakesDoNotHold,
        "S9 upgrades in flight within the limit",
    );
}

#[test]
fn a_revert_that_does_not_halt_its_type_first_is_caught() {
    assert_caught(
        Mutant::RevertWithoutHalt,
        "B2 a revert halts its type first",
    );
}

#[test]
fn a_stop_first_service_replaced_by_overlap_is_caught() {
    assert_caught(
        Mutant::OverlapStopFirst,
        "V1 a stop-first service never runs two containers at once",
    );
}

/// The proxy refuses the route (the traffic double as Caddy does), so the
/// service never verifies and its predecessor's marker is never resolved
/// (L3, at the end of the seed); the core's judge over every pass (X2)
/// names the decision itself first, at its step.
#[test]
fn a_publication_of_a_service_without_ports_is_caught() {
    let (seed, violation) = first_catch(
        Mutant::PublishPortless,
        "X2 every pass keeps the rules of the core's judge",
    );
    assert!(
        violation.contains("breaks R13: a service without ports is never routed"),
        "{violation}"
    );
    say!(
        "PublishPortless: caught at seed {seed}: {}",
        violation.lines().next().unwrap_or_default()
    );
}

#[test]
fn a_start_without_withdrawing_first_is_caught() {
    assert_caught(
        Mutant::SkipWithdrawBeforeStart,
        "S2 never routed to an unverified execution",
    );
}

#[test]
fn a_publication_before_readiness_is_caught() {
    assert_caught(Mutant::PublishBeforeReadiness, "S2 publish only verified");
}

#[test]
fn an_uncharged_crash_loop_is_caught() {
    assert_caught(Mutant::ForgetCrashLoopCharge, "S6 budget");
}

#[test]
fn a_retirement_before_the_successor_serves_is_caught() {
    assert_caught(
        Mutant::RetireBeforeSuccessorVerified,
        "S5 retire after successor serves",
    );
}

#[test]
fn a_start_of_a_non_active_container_is_caught() {
    assert_caught(Mutant::StartNonActive, "S1 start only ACTIVE");
}

#[test]
fn an_unarmed_run_is_clean() {
    // The hooks are inert unless armed: the same seeds pass untouched.
    for seed in 1..=3 {
        let mut cfg = SimConfig::new(seed);
        cfg.safety = Duration::from_secs(2 * 3600);
        let outcome = run_seed(&cfg);
        assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    }
}

#[test]
fn binds_saved_before_readiness_are_caught() {
    // The same broken rule also lets unprobed binds reach ACTIVE.
    assert_caught(
        Mutant::PublishBeforeReadiness,
        "S7 binds saved only after readiness",
    );
}

// --- the production topology (docs/operations.md, "Topologies") --------------------------------

#[test]
fn a_process_acting_without_the_instance_lock_row_is_caught() {
    assert_caught(
        Mutant::SkipInstanceLockRow,
        "T3 one process changes an instance at a time",
    );
}

#[test]
fn a_process_acting_on_an_expired_lease_is_caught() {
    assert_caught(Mutant::ActOnExpiredLease, "T2 no effect after the lease");
}

#[test]
fn a_task_run_on_a_deleted_instance_is_caught() {
    assert_caught(Mutant::ReviveDeletedInstance, "T4 deleted stays deleted");
}

#[test]
fn a_traffic_plane_remembered_instead_of_read_back_is_caught() {
    assert_caught(
        Mutant::ForgetProxyRoutes,
        "L6 lost routes are back within one tick",
    );
}

#[test]
fn a_restarted_daemon_waiting_out_its_own_lease_is_caught() {
    assert_caught(
        Mutant::StrangerAfterRestart,
        "L7 a restarted daemon reconciles at once",
    );
}

#[test]
fn a_publication_before_its_record_is_caught() {
    assert_caught(
        Mutant::PublishBeforeRecord,
        "S11 routed only once durably verified",
    );
}

#[test]
fn container_names_that_collide_are_caught() {
    assert_caught(
        Mutant::DashedContainerNames,
        "T6 no two services share a container name",
    );
}

#[test]
fn a_task_lease_broken_early_is_caught() {
    assert_caught(
        Mutant::BreakTaskLeaseEarly,
        "C6 never broken before the lease expires",
    );
}

#[test]
fn an_expiry_ticks_after_the_ttl_is_caught() {
    assert_caught(Mutant::ExpireLate, "C7 expired within one tick of its TTL");
}

#[test]
fn a_restart_for_health_before_the_threshold_is_caught() {
    assert_caught(
        Mutant::RestartBeforeThreshold,
        "S12 restart for health only at the threshold",
    );
}

#[test]
fn an_upgrade_order_without_the_own_team_first_is_caught() {
    assert_caught(
        Mutant::IgnoreOwnTeam,
        "C8 upgrades in order, own team first",
    );
}

#[test]
fn an_upgrade_slot_left_unused_is_caught() {
    assert_caught(
        Mutant::UnderuseInFlight,
        "C8 max_in_flight not left unused while instances wait",
    );
}

#[test]
fn a_worker_that_ignores_an_undo_pin_is_caught() {
    // A pin needs an operator's `rollout undo --to` while the catalog is
    // broken, then a worker making containers (U1) or moving an instance
    // (U2) under it: rare in two hours of faults (seed 29 met U2 first,
    // then, once the world gained restarts as inspected (#44), seed 120
    // met U1). Six hours, as the CI seeds run, give either judge of the
    // pin three times the chances.
    let (seed, violation) =
        first_catch_over(Mutant::IgnoreUndoPin, "U", Duration::from_secs(6 * 3600));
    assert!(
        violation.starts_with("U1 under a pin a worker makes only the pinned version")
            || violation.starts_with("U2 a move toward a pin ends at the pinned version"),
        "{violation}"
    );
    say!("IgnoreUndoPin: caught at seed {seed}: {violation}");
}

#[test]
fn trust_timed_by_the_monotonic_clock_alone_is_caught() {
    assert_caught(Mutant::TrustMonotonicOnly, "T2 no effect after the lease");
}

#[test]
fn a_twin_taking_over_a_live_lease_is_caught() {
    assert_caught(
        Mutant::TwinTakesOver,
        "T1 a live twin's lease is never taken over",
    );
}

#[test]
fn a_stepped_database_clock_taken_at_its_word_is_caught() {
    assert_caught(
        Mutant::IgnoreClockJump,
        "J1 nothing expired or requeued on a stepped database clock",
    );
}

#[test]
fn a_start_without_its_event_is_caught() {
    assert_caught(
        Mutant::ForgetStartEvent,
        "E1 every intervention has its event",
    );
}

#[test]
fn an_event_for_a_failed_start_is_caught() {
    assert_caught(
        Mutant::EventForFailedStart,
        "E1 every intervention has its event",
    );
}

#[test]
fn a_retirement_on_an_unverified_execution_of_the_successor_is_caught() {
    assert_caught(
        Mutant::RetireOnAnyExecution,
        "S5 retire only after the successor's final inspection",
    );
}

#[test]
fn a_failed_upgrade_that_drops_a_service_is_caught() {
    assert_caught(
        Mutant::DropOnFailedUpgrade,
        "D1 a service is dropped only once the new version serves",
    );
}

#[test]
fn a_dropped_service_whose_route_stays_is_caught() {
    assert_caught(
        Mutant::KeepDroppedRoute,
        "D2 a dropped service's route goes before its container",
    );
}

#[test]
fn a_helm_bake_that_takes_an_unreachable_cluster_for_a_bad_release_is_caught() {
    assert_caught(
        Mutant::UnreachableIsBad,
        "H4 a Helm release is rolled back only off a version that went bad",
    );
}

#[test]
fn a_publish_that_ignores_host_reservations_is_caught() {
    assert_caught(
        Mutant::IgnoreHostReservations,
        "N1 a public host name never moves from one live instance to another",
    );
}

/// #55: a revert whose marker, ACTIVE and version writes carry no lease.
#[test]
fn a_revert_written_without_the_lease_is_caught() {
    assert_caught(
        Mutant::UnfencedRevert,
        "T2 every store write of recovery carries the fence",
    );
}

/// #54: a tenant's command finds another team's instance by its name.
#[test]
fn a_team_scope_that_ignores_the_team_is_caught() {
    assert_caught(
        Mutant::IgnoreTeamScope,
        "N2 a tenant reads only its team's instances",
    );
}

/// #54: each quota one higher than configured lets a team's concurrent
/// creates end over it.
#[test]
fn a_quota_off_by_one_is_caught() {
    assert_caught(Mutant::QuotaOffByOne, "N3 a team's quota is never exceeded");
}

/// #54: a host name given at create outside the team's domains is
/// taken.
#[test]
fn a_given_name_outside_the_teams_domains_is_caught() {
    assert_caught(
        Mutant::IgnoreDomainSuffixes,
        "N2 a tenant gives no host name of another team's domains",
    );
}

/// #54: a daemon restarted with a hazardous catalog applies it unforced.
#[test]
fn a_start_that_skips_the_catalog_hazards_is_caught() {
    assert_caught(
        Mutant::SkipStartHazards,
        "N4 a hazardous catalog is never applied without force, across restarts",
    );
}
