//! Scenario tests of the recovery machine, one or more per rule R1–R17 of
//! docs/rules.md (R1–R17). Each drives the pure machine through `stead_testkit::world::World`,
//! a synchronous fake world, so every test reads like a story.

use std::time::Duration;

use stead::core::errors::{PolicyError, StoreError, TrafficError};
use stead::core::recovery::{Command, RecoveryError, Report, Verdict, Why};
use stead::core::types::{
    Binds, ContainerId, ContainerStatus, Health, InhibitionReason, Intent, RuntimeError,
    ServiceName,
};
use stead_testkit::world::World;

const MINUTE: Duration = Duration::from_secs(60);
const PASS: Duration = Duration::from_secs(60);

/// One service `web` on container `c1`, already verified and routed by a
/// first pass; the log is cleared so a test sees only what it causes.
fn settled() -> World {
    let mut w = World::new().with_service("web", "c1", 30001);
    let reports = w.pass();
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
    assert!(w.routes.contains_key(&ServiceName::new("web")));
    w.log.clear();
    w.advance(PASS);
    w
}

fn is_start(c: &Command) -> bool {
    matches!(c, Command::Start)
}

fn is_restart(c: &Command) -> bool {
    matches!(c, Command::Restart { .. })
}

fn is_publish(c: &Command) -> bool {
    matches!(c, Command::Publish { .. })
}

/// Failures charged to the generation, as the report's memory says.
fn failures(report: &Report) -> u32 {
    report
        .memory
        .generation
        .budget
        .as_ref()
        .expect("a budget entry")
        .failures
}

fn routed(w: &World) -> bool {
    w.routes.contains_key(&ServiceName::new("web"))
}

// --- R1 exact identity ---------------------------------------------------

#[test]
fn recovery_only_ever_touches_the_container_active_names() {
    let mut w = settled();
    w.add_service("worker", "c2", 30002);
    w.crash("c1");
    w.pass();
    w.pass();
    for p in &w.log {
        let named = &w.active.services[&p.service].container;
        assert_eq!(&p.container, named, "{p:?}");
    }
    assert!(
        w.removed.is_empty(),
        "the pass never removes ACTIVE containers"
    );
}

#[test]
fn a_container_missing_from_the_runtime_is_never_reconstructed() {
    let mut w = settled();
    w.containers.clear();
    w.pass();
    assert_eq!(w.count(is_start), 0);
    assert!(w.containers.is_empty());
}

// --- R2/R3 are engine rules: see tests of the engine ----------------------

// --- R4 stopped intent -----------------------------------------------------

#[test]
fn stopped_intent_stops_a_revived_container_and_never_removes_it() {
    let mut w = settled();
    w.intent = Intent::Stopped;
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Stopped);
    assert!(w
        .commands("web")
        .iter()
        .any(|c| matches!(c, Command::Stop { .. })));
    assert_eq!(w.container("c1").status, ContainerStatus::Exited);
    assert!(w.containers.contains_key(&ContainerId::new("c1")));
    assert!(!routed(&w), "a stopped instance is unpublished");
    assert_eq!(w.count(is_start), 0);
}

#[test]
fn stopped_intent_forgets_memory_and_tolerates_a_missing_container() {
    let mut w = settled();
    w.crash("c1");
    w.pass(); // starts it once: the budget now has history
    w.intent = Intent::Stopped;
    w.containers.clear();
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Stopped);
    assert!(reports[0].errors.is_empty(), "{:?}", reports[0].errors);
    assert_eq!(reports[0].memory.generation.budget, None);
}

#[test]
fn stopped_intent_leaves_an_already_exited_container_alone() {
    let mut w = settled();
    w.crash("c1");
    w.intent = Intent::Stopped;
    w.pass();
    assert!(!w.commands("web").iter().any(|c| c.mutates_workload()));
}

#[test]
fn stopped_instance_retires_every_marker() {
    let mut w = settled();
    w.add_service("worker", "c2", 30002);
    w.containers.insert(
        ContainerId::new("old"),
        w.containers[&ContainerId::new("c1")].clone(),
    );
    w.inhibit("web", "old", InhibitionReason::RetirementPending);
    w.intent = Intent::Stopped;
    w.pass();
    assert_eq!(w.removed, vec![ContainerId::new("old")]);
    assert!(w.inhibitions.is_empty());
}

// --- R5 durable inhibition ------------------------------------------------

#[test]
fn an_inhibited_generation_is_never_started_and_is_withdrawn() {
    let mut w = settled();
    w.crash("c1");
    w.inhibit("web", "c1", InhibitionReason::Hold("operator-hold".into()));
    for _ in 0..3 {
        let reports = w.pass();
        assert_eq!(reports[0].verdict, Verdict::Inhibited);
        assert!(matches!(
            reports[0].errors[0],
            RecoveryError::Inhibited { ref reason } if reason == "operator-hold"
        ));
        w.advance(PASS);
    }
    assert_eq!(w.count(is_start), 0);
    assert!(!routed(&w));
}

#[test]
fn a_retirement_marker_on_the_active_container_does_not_inhibit_it() {
    let mut w = settled();
    w.crash("c1");
    w.inhibit("web", "c1", InhibitionReason::RetirementPending);
    w.pass();
    assert_eq!(w.count(is_start), 1);
    assert!(
        w.inhibitions.is_empty(),
        "the marker is cleared, container kept"
    );
}

// --- R6 pending withdrawal ------------------------------------------------

#[test]
fn a_failed_withdrawal_blocks_recovery() {
    let mut w = settled();
    w.crash("c1");
    w.faults
        .withdraw
        .push_back(TrafficError::Unreachable("proxy down".into()));
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Failed);
    assert!(reports[0].memory.withdrawal_pending);
    assert_eq!(w.count(is_start), 0, "nothing touches the workload");
}

#[test]
fn a_pending_withdrawal_is_retried_before_anything_else() {
    let mut w = settled();
    w.crash("c1");
    w.faults
        .withdraw
        .push_back(TrafficError::Unreachable("proxy down".into()));
    w.pass();
    w.log.clear();
    w.advance(PASS);
    let reports = w.pass();
    let commands = w.commands("web");
    assert_eq!(commands[0], Command::Withdraw);
    assert_eq!(commands[1], Command::Inspect);
    assert!(!reports[0].memory.withdrawal_pending);
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
}

#[test]
fn a_pending_withdrawal_that_fails_again_allows_no_publication() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults
        .withdraw
        .push_back(TrafficError::Unreachable("proxy down".into()));
    w.faults
        .withdraw
        .push_back(TrafficError::Unreachable("still down".into()));
    w.pass();
    w.advance(PASS);
    w.log.clear();
    w.pass();
    assert_eq!(w.commands("web"), vec![Command::Withdraw]);
    assert_eq!(w.count(is_publish), 0);
}

// --- R7 inspection --------------------------------------------------------

#[test]
fn a_transient_inspect_error_changes_nothing() {
    let mut w = settled();
    w.faults
        .inspect
        .push_back(RuntimeError::Transient("timeout".into()));
    let reports = w.pass();
    assert_eq!(w.commands("web"), vec![Command::Inspect]);
    assert!(routed(&w), "traffic untouched");
    assert!(matches!(
        reports[0].errors[0],
        RecoveryError::InspectFailed(_)
    ));
}

#[test]
fn a_confirmed_missing_container_is_withdrawn_and_its_claims_released() {
    let mut w = settled();
    w.containers.clear();
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Gone);
    assert_eq!(w.released_claims, vec![ContainerId::new("c1")]);
    assert!(!routed(&w));
    assert_eq!(reports[0].memory.generation.budget, None);
    assert!(reports[0].errors.contains(&RecoveryError::Gone));
}

// --- R8 fail closed -------------------------------------------------------

#[test]
fn a_native_restart_is_withdrawn_before_it_is_verified() {
    let mut w = settled();
    w.native_restart("c1");
    w.pass();
    let commands = w.commands("web");
    assert_eq!(&commands[..2], &[Command::Inspect, Command::Withdraw]);
    assert!(commands
        .iter()
        .any(|c| matches!(c, Command::ProbeReadiness { .. })));
    assert!(routed(&w), "republished after verification");
}

#[test]
fn a_native_restart_with_changed_binds_republishes_the_new_binds() {
    let mut w = settled();
    w.native_restart("c1");
    w.container("c1").binds = Binds::from([(8080, 31999)]);
    w.pass();
    let route = &w.routes[&ServiceName::new("web")];
    assert_eq!(route.binds, Binds::from([(8080, 31999)]));
    assert_eq!(
        w.active.services[&ServiceName::new("web")].binds,
        Binds::from([(8080, 31999)])
    );
}

/// The reason a publication is logged and counted under (R13): a new
/// execution verified ready, binds that changed under the same execution,
/// or a route this daemon cannot vouch for. Each is what operators read in
/// `stead_recovery_steps_total{reason}`.
#[test]
fn a_publication_says_why_it_was_made() {
    let publish_why = |w: &World| {
        w.log
            .iter()
            .filter(|p| is_publish(&p.command))
            .map(|p| p.why)
            .collect::<Vec<_>>()
    };
    let mut w = settled();
    w.native_restart("c1");
    w.pass();
    assert_eq!(publish_why(&w), [Some(Why::NewExecution)]);

    let mut w = settled();
    // Same execution, but ACTIVE's binds are not what it serves on.
    w.active
        .services
        .get_mut(&ServiceName::new("web"))
        .unwrap()
        .binds = Binds::from([(8080, 30999)]);
    w.pass();
    assert_eq!(publish_why(&w), [Some(Why::BindsChanged)]);

    let mut w = settled();
    // A restarted daemon: nothing of the route is remembered.
    w.memory = Default::default();
    w.pass();
    assert_eq!(publish_why(&w), [Some(Why::RouteUnvouched)]);
}

#[test]
fn a_down_container_is_withdrawn_before_it_is_started() {
    let mut w = settled();
    w.crash("c1");
    w.pass();
    let commands = w.commands("web");
    let withdraw = commands.iter().position(|c| c == &Command::Withdraw);
    let start = commands.iter().position(is_start);
    assert!(withdraw.unwrap() < start.unwrap(), "{commands:?}");
}

#[test]
fn a_failed_fail_closed_withdrawal_touches_nothing() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults
        .withdraw
        .push_back(TrafficError::Unreachable("proxy down".into()));
    let reports = w.pass();
    assert_eq!(w.commands("web"), vec![Command::Inspect, Command::Withdraw]);
    assert!(reports[0].memory.withdrawal_pending);
}

#[test]
fn a_transitional_container_keeps_its_traffic() {
    let mut w = settled();
    w.container("c1").status = ContainerStatus::Restarting;
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Transitional);
    assert!(routed(&w));
    assert_eq!(w.commands("web"), vec![Command::Inspect]);
}

// --- R9 drive by status ---------------------------------------------------

#[test]
fn an_exited_exact_id_is_started_verified_and_published() {
    let mut w = settled();
    w.crash("c1");
    let reports = w.pass();
    assert!(matches!(
        reports[0].verdict,
        Verdict::Verified {
            published: true,
            ..
        }
    ));
    assert_eq!(w.container("c1").status, ContainerStatus::Running);
    let route = w.routes[&ServiceName::new("web")].clone();
    assert_eq!(route.started_at, w.container("c1").started_at);
    assert!(reports[0].intervened);
}

#[test]
fn restarting_is_observed_and_retried_next_pass() {
    let mut w = settled();
    w.container("c1").status = ContainerStatus::Restarting;
    w.pass();
    w.crash("c1");
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_start), 1);
}

#[test]
fn paused_is_refused_without_touching_it() {
    let mut w = settled();
    w.container("c1").status = ContainerStatus::Paused;
    let reports = w.pass();
    assert_eq!(
        reports[0].errors,
        vec![RecoveryError::RefusedStatus(ContainerStatus::Paused)]
    );
    assert!(!w.commands("web").iter().any(|c| c.mutates_workload()));
    assert!(!routed(&w), "refused containers are withdrawn");
}

#[test]
fn unknown_status_is_refused_too() {
    let mut w = settled();
    w.container("c1").status = ContainerStatus::parse("");
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Failed);
    assert_eq!(w.count(is_start), 0);
}

#[test]
fn created_and_dead_containers_are_started_regardless_of_exit_code() {
    for status in [
        ContainerStatus::Created,
        ContainerStatus::Dead,
        ContainerStatus::Stopped,
    ] {
        let mut w = settled();
        w.container("c1").status = status;
        w.pass();
        assert_eq!(w.count(is_start), 1, "{status}");
    }
}

// --- R10 budget -----------------------------------------------------------

#[test]
fn crash_loop_is_charged_even_when_every_start_succeeds() {
    let mut w = settled();
    for _ in 0..4 {
        w.crash("c1");
        w.pass();
        w.advance(Duration::from_secs(10));
    }
    assert_eq!(w.count(is_start), 3, "three real attempts");
    let reports = {
        w.crash("c1");
        w.advance(Duration::from_secs(30));
        w.pass()
    };
    assert!(matches!(reports[0].verdict, Verdict::Delayed { .. }));
    assert_eq!(w.count(is_start), 3, "the 1-minute delay holds");
    w.advance(MINUTE);
    w.pass();
    assert_eq!(w.count(is_start), 4, "then one more attempt");
}

#[test]
fn the_delay_ladder_is_one_two_four_eight_fifteen_fifteen() {
    let mut w = settled();
    let mut gaps = Vec::new();
    let mut last_start: Option<jiff::Timestamp> = None;
    for _ in 0..(60 * 60) {
        w.crash("c1");
        let before = w.count(is_start);
        w.pass();
        if w.count(is_start) > before {
            if let Some(last) = last_start {
                gaps.push((w.now - last).get_seconds() / 60);
            }
            last_start = Some(w.now);
        }
        w.advance(Duration::from_secs(20));
        if gaps.len() == 8 {
            break;
        }
    }
    // Passes run every 20 s, so a gap is the delay rounded up to a pass.
    assert_eq!(gaps, vec![0, 0, 1, 2, 4, 8, 15, 15]);
}

#[test]
fn a_start_failure_is_charged() {
    let mut w = settled();
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("oci error".into()));
    let reports = w.pass();
    assert_eq!(failures(&reports[0]), 1);
    assert!(matches!(
        reports[0].errors[..],
        [RecoveryError::StartFailed(_)]
    ));
}

#[test]
fn the_runtimes_own_restart_wins_the_race_and_nothing_is_charged() {
    let mut w = settled();
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("already started".into()));
    w.faults.native_restart_races_start = true;
    let reports = w.pass();
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));
    let failures = reports[0]
        .memory
        .generation
        .budget
        .as_ref()
        .map_or(0, |b| b.failures);
    assert_eq!(failures, 0);
    // Nothing went wrong: the runtime did what the start was for (R11).
    assert_eq!(reports[0].errors, vec![], "a race won is no error");
    assert!(reports[0].start_race_lost);
}

#[test]
fn a_start_that_failed_and_left_the_container_down_reports_its_error() {
    // The kin of the race above, lost: the re-inspection finds it still
    // down, so the start's own error is the report.
    let mut w = settled();
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("already in progress".into()));
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Failed);
    assert!(!reports[0].start_race_lost);
    assert!(
        matches!(&reports[0].errors[..], [RecoveryError::StartFailed(RuntimeError::Transient(why))] if why == "already in progress"),
        "{:?}",
        reports[0].errors
    );
}

#[test]
fn a_start_failure_whose_reinspection_fails_reports_both() {
    let mut w = settled();
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("oci error".into()));
    w.faults.inspect_after_failed_start = Some(RuntimeError::Transient("daemon busy".into()));
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Failed);
    assert_eq!(failures(&reports[0]), 1, "charged: nobody says it runs");
    assert!(
        matches!(
            &reports[0].errors[..],
            [
                RecoveryError::StartFailed(_),
                RecoveryError::InspectFailed(RuntimeError::Transient(_))
            ]
        ),
        "{:?}",
        reports[0].errors
    );
}

#[test]
fn a_start_answered_not_found_forgets_and_reports_gone() {
    let mut w = settled();
    w.crash("c1");
    w.pass(); // history exists now
    w.crash("c1");
    w.advance(PASS);
    w.faults.start.push_back(RuntimeError::NotFound);
    let reports = w.pass();
    assert_eq!(reports[0].verdict, Verdict::Gone);
    assert_eq!(reports[0].memory.generation.budget, None);
}

#[test]
fn forgetting_a_generation_resets_its_budget() {
    let mut w = settled();
    for _ in 0..4 {
        w.crash("c1");
        w.pass();
    }
    // A new generation replaces c1: its memory is pruned (R16).
    w.add_service("web", "c9", 30009);
    w.pass();
    assert!(w
        .memory
        .generation(&stead::core::types::GenerationKey {
            instance: w.instance.clone(),
            service: ServiceName::new("web"),
            container: ContainerId::new("c1"),
        })
        .is_none());
}

// --- R11 start ------------------------------------------------------------

#[test]
fn revoked_bind_or_device_policy_fails_closed_before_any_runtime_mutation() {
    let mut w = settled();
    w.crash("c1");
    w.faults.policy_revoked = Some(PolicyError::Revoked(
        "device /dev/kvm no longer granted".into(),
    ));
    let reports = w.pass();
    assert_eq!(w.count(is_start), 0);
    assert!(matches!(
        reports[0].errors[..],
        [RecoveryError::PolicyRevoked(_)]
    ));
    assert!(!routed(&w));
}

#[test]
fn revoked_policy_also_blocks_an_unhealthy_restart() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.faults.policy_revoked = Some(PolicyError::Revoked("bind revoked".into()));
    w.pass();
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_restart), 0);
}

// --- R12 health -----------------------------------------------------------

#[test]
fn unhealthy_restarts_only_after_consecutive_observations() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    assert_eq!(w.count(is_restart), 0, "one observation is not enough");
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_restart), 1);
}

#[test]
fn an_interrupted_unhealthy_streak_starts_over() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    w.container("c1").health = Health::Healthy;
    w.advance(PASS);
    w.pass();
    w.container("c1").health = Health::Unhealthy;
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_restart), 0);
}

#[test]
fn a_starting_observation_also_interrupts_the_unhealthy_streak() {
    // R12 counts *consecutive* unhealthy observations: a `starting` one in
    // between (a healthcheck that has not answered yet) breaks the streak
    // as a healthy one does. Found by mutation testing: with the streak
    // left standing, the fast tests still passed, because a healthy
    // observation also clears it on its way to the stability streak.
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    w.container("c1").health = Health::Starting;
    w.advance(PASS);
    w.pass();
    w.container("c1").health = Health::Unhealthy;
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_restart), 0, "the streak started over");
    w.advance(PASS);
    w.pass();
    assert_eq!(w.count(is_restart), 1, "two in a row again");
}

#[test]
fn a_start_begins_a_new_unhealthy_streak() {
    // Found by the simulation's S12 check: a service read unhealthy up to
    // the threshold whose restart did not happen (there a deadline, here a
    // revoked policy), then found down and started: the new execution's
    // first unhealthy read was counted onto the old execution's streak and
    // restarted it at once. Consecutive means of one execution (R12).
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    w.faults.policy_revoked = Some(PolicyError::Revoked("maintenance".into()));
    w.advance(PASS);
    w.pass(); // at the threshold, but the restart is refused
    w.faults.policy_revoked = None;
    assert_eq!(w.count(is_restart), 0);
    w.crash("c1");
    w.container("c1").health_after_start = Health::Unhealthy;
    w.advance(PASS);
    w.pass(); // started; the new execution's first read is unhealthy
    assert_eq!(w.count(is_start), 1);
    assert_eq!(w.count(is_restart), 0, "one read of the new execution");
}

#[test]
fn health_starting_waits() {
    let mut w = settled();
    w.container("c1").health = Health::Starting;
    for _ in 0..5 {
        w.pass();
        w.advance(PASS);
    }
    assert_eq!(w.count(is_restart), 0);
    assert!(routed(&w));
}

#[test]
fn no_healthcheck_never_restarts() {
    let mut w = settled();
    w.container("c1").health = Health::None;
    for _ in 0..5 {
        w.pass();
        w.advance(PASS);
    }
    assert!(!w.log.iter().any(|p| p.command.mutates_workload()));
}

#[test]
fn a_failed_restart_is_charged() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    w.advance(PASS);
    w.faults
        .restart
        .push_back(RuntimeError::Transient("daemon busy".into()));
    let reports = w.pass();
    assert_eq!(failures(&reports[0]), 1);
}

#[test]
fn an_unhealthy_service_is_withdrawn_before_its_restart() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.pass();
    w.advance(PASS);
    w.log.clear();
    w.pass();
    let commands = w.commands("web");
    let withdraw = commands
        .iter()
        .position(|c| c == &Command::Withdraw)
        .unwrap();
    let restart = commands.iter().position(is_restart).unwrap();
    assert!(withdraw < restart, "{commands:?}");
    assert!(routed(&w), "verified and republished after the restart");
}

// --- R13 verify then publish ---------------------------------------------

#[test]
fn failed_readiness_persists_no_binds_and_publishes_nothing() {
    let mut w = settled();
    w.native_restart("c1");
    w.container("c1").binds = Binds::from([(8080, 32000)]);
    w.container("c1").ready = false;
    let reports = w.pass();
    assert_eq!(
        w.active.services[&ServiceName::new("web")].binds,
        Binds::from([(8080, 30001)])
    );
    assert!(!routed(&w));
    assert_eq!(failures(&reports[0]), 1);
}

#[test]
fn a_restart_during_readiness_never_publishes_the_stale_execution() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults.native_restart_during_probe = true;
    let reports = w.pass();
    assert!(reports[0].errors.contains(&RecoveryError::ExecutionChanged));
    assert!(!routed(&w));
    // Next pass verifies the new execution and publishes it.
    w.advance(PASS);
    w.pass();
    let route = w.routes[&ServiceName::new("web")].clone();
    assert_eq!(route.started_at, w.container("c1").started_at);
}

#[test]
fn active_changing_mid_pass_is_never_published() {
    let mut w = settled();
    w.native_restart("c1");
    w.containers.insert(
        ContainerId::new("c2"),
        w.containers[&ContainerId::new("c1")].clone(),
    );
    w.faults.active_switch_during_probe = Some(ContainerId::new("c2"));
    let reports = w.pass();
    assert!(reports[0]
        .errors
        .contains(&RecoveryError::GenerationChanged));
    assert!(!routed(&w));
}

/// R13: either half of the generation changing is a conflict on its own —
/// the container at the same revision, or the revision of the same
/// container (a mutant that asked for both to change survived the fast
/// tests, session 14).
#[test]
fn a_changed_container_or_revision_alone_is_a_conflict() {
    for change in ["container", "revision"] {
        let mut w = settled();
        w.native_restart("c1");
        w.containers.insert(
            ContainerId::new("c2"),
            w.containers[&ContainerId::new("c1")].clone(),
        );
        match change {
            "container" => w.faults.active_switch_during_probe = Some(ContainerId::new("c2")),
            _ => w.faults.active_revision_during_probe = Some("r2".into()),
        }
        let reports = w.pass();
        assert!(
            reports[0]
                .errors
                .contains(&RecoveryError::GenerationChanged),
            "{change}: {:?}",
            reports[0].errors
        );
        assert!(!routed(&w), "{change}");
    }
}

/// S11, R17: a fresh execution's record reaches ACTIVE before its route
/// is published, so a daemon restarted between the two never finds a
/// route it cannot vouch for.
#[test]
fn a_new_execution_is_recorded_before_it_is_published() {
    let mut w = settled();
    w.native_restart("c1");
    w.pass();
    let commands = w.commands("web");
    let record = commands
        .iter()
        .position(|c| matches!(c, Command::RecordExecution { .. }))
        .expect("recorded");
    let publish = commands.iter().position(is_publish).expect("published");
    assert!(record < publish, "{commands:?}");
}

#[test]
fn a_failed_binds_read_is_charged_and_withdrawn() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults
        .binds
        .push_back(RuntimeError::Transient("inspect failed".into()));
    let reports = w.pass();
    assert!(!routed(&w));
    assert_eq!(failures(&reports[0]), 1);
    // Withdrawn once: the fail-closed withdrawal already took the route,
    // so the failure asks the proxy nothing more (a second call only
    // costs, and could fail into a needless pending withdrawal). Both
    // skips of it survived the fast tests before this (session 14).
    let withdrawals = w.count(|c| matches!(c, Command::Withdraw));
    assert_eq!(withdrawals, 1, "{:?}", w.commands("web"));
}

#[test]
fn a_failed_publication_does_not_restart_a_healthy_container() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults
        .publish
        .push_back(TrafficError::Rejected("caddy 500".into()));
    let reports = w.pass();
    assert!(matches!(
        reports[0].errors[..],
        [RecoveryError::PublishFailed(_)]
    ));
    assert_eq!(reports[0].memory.generation.budget, None, "nothing charged");
    w.advance(PASS);
    w.pass();
    assert!(!w.log.iter().any(|p| p.command.mutates_workload()));
    assert!(routed(&w), "the next pass publishes");
}

/// Nothing to write, so ACTIVE (read under the instance lock this pass)
/// is not read again: a steady service costs the store nothing (#14).
#[test]
fn steady_state_issues_no_mutation_no_publication_and_no_store_read() {
    let mut w = settled();
    w.pass();
    assert_eq!(
        w.commands("web"),
        vec![
            Command::Inspect,
            Command::ReadHealth,
            Command::ReadBinds,
            Command::Inspect,
        ]
    );
}

#[test]
fn changed_binds_alone_are_persisted_and_republished_without_a_probe() {
    let mut w = settled();
    w.container("c1").binds = Binds::from([(8080, 30555)]);
    w.pass();
    let commands = w.commands("web");
    assert!(!commands
        .iter()
        .any(|c| matches!(c, Command::ProbeReadiness { .. })));
    assert!(commands
        .iter()
        .any(|c| matches!(c, Command::PersistBinds { .. })));
    assert_eq!(w.routes[&ServiceName::new("web")].binds[&8080], 30555);
}

#[test]
fn a_persist_failure_is_charged_and_withdraws() {
    let mut w = settled();
    w.native_restart("c1");
    w.container("c1").binds = Binds::from([(8080, 30777)]);
    w.faults
        .persist
        .push_back(StoreError::Unavailable("database locked".into()));
    let reports = w.pass();
    assert!(!routed(&w));
    assert!(reports[0]
        .errors
        .iter()
        .any(|e| matches!(e, RecoveryError::PersistFailed(_))));
}

// --- R14 stability ---------------------------------------------------------

#[test]
fn five_stable_minutes_reset_the_budget() {
    let mut w = settled();
    for _ in 0..3 {
        w.crash("c1");
        w.pass();
    }
    w.crash("c1");
    w.pass(); // charged a third time: now delayed
    w.advance(MINUTE);
    w.pass(); // started again
    assert!(w.container("c1").status == ContainerStatus::Running);
    for _ in 0..6 {
        w.advance(MINUTE);
        w.pass();
    }
    let key = stead::core::types::GenerationKey {
        instance: w.instance.clone(),
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
    };
    assert_eq!(w.memory.generation(&key).unwrap().budget, None);
}

#[test]
fn minutes_frozen_mid_pass_do_not_count_as_stable() {
    // Found by the simulation (a process paused right after an effect,
    // resuming seven minutes later): the pass that resumed judged its
    // pre-pause observation stable as of the resume and dropped a
    // crash-looping generation's history. Stability is vouched for as of
    // the inspect that saw it (R14).
    let mut w = settled();
    for _ in 0..3 {
        w.crash("c1");
        w.pass();
    }
    let key = stead::core::types::GenerationKey {
        instance: w.instance.clone(),
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
    };
    let failures = |w: &World| {
        w.memory
            .generation(&key)
            .and_then(|g| g.budget.as_ref().map(|b| b.failures))
    };
    w.advance(MINUTE);
    w.pass(); // running and healthy: the streak starts
    assert!(failures(&w).is_some());
    w.advance(MINUTE);
    w.faults.pause_before_health = Some(10 * MINUTE);
    w.pass(); // inspected a minute in, answered eleven minutes in
    assert!(
        failures(&w).is_some(),
        "a minute of observed stability dropped the history"
    );
    w.advance(MINUTE);
    w.pass(); // twelve minutes after the streak began, seen running: reset
    assert_eq!(failures(&w), None, "five observed stable minutes reset it");
}

#[test]
fn minutes_frozen_before_a_start_do_not_count_as_the_started_executions_stability() {
    // Found by the simulation (seed 78, once the world gained a service
    // without ports): a process froze between inspecting a crash-looping
    // container down and starting it; the pass that resumed found the new
    // execution healthy and dated its stability from the first inspect,
    // so the next pass, a minute later, found five "stable" minutes and
    // dropped the history: three more free attempts within seconds (R14).
    let mut w = settled();
    for _ in 0..2 {
        w.crash("c1");
        w.pass();
    }
    let key = stead::core::types::GenerationKey {
        instance: w.instance.clone(),
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
    };
    let failures = |w: &World| {
        w.memory
            .generation(&key)
            .and_then(|g| g.budget.as_ref().map(|b| b.failures))
    };
    w.crash("c1");
    w.advance(MINUTE);
    w.faults.pause_before_start = Some(10 * MINUTE);
    w.pass(); // inspected down, started ten minutes later, found healthy
    assert_eq!(failures(&w), Some(2), "the crash loop is charged");
    w.advance(MINUTE);
    w.pass(); // a minute of observed stability
    assert!(
        failures(&w).is_some(),
        "the frozen minutes before the start counted as stable"
    );
    w.advance(5 * MINUTE);
    w.pass();
    assert_eq!(failures(&w), None, "five observed stable minutes reset it");
}

#[test]
fn an_unstable_observation_breaks_the_stability_streak() {
    let mut w = settled();
    w.crash("c1");
    w.pass();
    for i in 0..10 {
        w.advance(MINUTE);
        w.container("c1").health = if i == 3 {
            Health::Starting
        } else {
            Health::Healthy
        };
        w.pass();
    }
    // 6 stable minutes after the break: reset by then.
    let key = stead::core::types::GenerationKey {
        instance: w.instance.clone(),
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
    };
    assert_eq!(w.memory.generation(&key).unwrap().budget, None);
}

#[test]
fn a_stable_observation_never_creates_history() {
    let mut w = settled();
    for _ in 0..3 {
        w.pass();
        w.advance(MINUTE);
    }
    let key = stead::core::types::GenerationKey {
        instance: w.instance.clone(),
        service: ServiceName::new("web"),
        container: ContainerId::new("c1"),
    };
    assert_eq!(w.memory.generation(&key).unwrap().budget, None);
}

// --- R15 retirement ---------------------------------------------------------

fn with_marker() -> World {
    let mut w = settled();
    let old = w.containers[&ContainerId::new("c1")].clone();
    w.containers.insert(ContainerId::new("old"), old);
    w.inhibit("web", "old", InhibitionReason::RetirementPending);
    w
}

#[test]
fn a_retirement_waits_for_a_verified_successor() {
    let mut w = with_marker();
    w.crash("c1");
    w.faults
        .start
        .push_back(RuntimeError::Transient("no space".into()));
    w.pass();
    assert!(
        w.removed.is_empty(),
        "successor not verified: keep the old one"
    );
    w.advance(PASS);
    w.pass();
    assert!(
        w.removed.is_empty(),
        "successor routed only this pass: the predecessor drains one pass"
    );
    w.advance(PASS);
    w.pass();
    assert_eq!(w.removed, vec![ContainerId::new("old")]);
    assert!(w.inhibitions.is_empty());
}

#[test]
fn a_retirement_clears_the_marker_when_active_still_names_the_container() {
    let mut w = settled();
    w.inhibit("web", "c1", InhibitionReason::RetirementPending);
    w.pass();
    assert!(w.removed.is_empty());
    assert!(w.inhibitions.is_empty());
    assert!(w.containers.contains_key(&ContainerId::new("c1")));
}

#[test]
fn a_marker_for_a_service_gone_from_active_is_retired() {
    let mut w = settled();
    let old = w.containers[&ContainerId::new("c1")].clone();
    w.containers.insert(ContainerId::new("old"), old);
    w.inhibit("api", "old", InhibitionReason::RetirementPending);
    w.pass();
    assert_eq!(w.removed, vec![ContainerId::new("old")]);
}

#[test]
fn a_successor_that_restarted_after_verification_delays_retirement() {
    let mut w = with_marker();
    // Inspection of the successor during retirement shows a different
    // execution: simulate by restarting it right after verification.
    w.faults.native_restart_during_probe = true;
    w.native_restart("c1");
    w.pass();
    assert!(w.removed.is_empty());
}

// --- R16 pruning ----------------------------------------------------------

#[test]
fn history_of_generations_no_longer_active_is_pruned() {
    let mut w = settled();
    w.crash("c1");
    w.pass();
    assert_eq!(w.memory.generations_count(), 1);
    w.active.services.clear();
    w.pass();
    assert_eq!(w.memory.generations_count(), 0);
}

#[test]
fn durable_inhibitions_are_never_pruned_by_the_pass() {
    let mut w = settled();
    w.inhibit(
        "web",
        "ghost",
        InhibitionReason::Hold("failed-deploy".into()),
    );
    w.pass();
    assert_eq!(w.inhibitions.len(), 1);
}

// --- R17 volatile memory, durable verified execution -----------------------

#[test]
fn a_restarted_daemon_rearms_one_real_attempt() {
    let mut w = settled();
    for _ in 0..4 {
        w.crash("c1");
        w.pass();
    }
    assert_eq!(w.count(is_start), 3);
    w.memory = Default::default(); // the daemon restarted
    w.crash("c1");
    w.pass();
    assert_eq!(w.count(is_start), 4);
}

#[test]
fn a_restarted_daemon_does_not_blink_traffic_for_unchanged_executions() {
    let mut w = settled();
    w.memory = Default::default();
    w.pass();
    assert!(!w.commands("web").contains(&Command::Withdraw));
    assert!(routed(&w));
}

/// A routed, verified execution whose durable record lags (an earlier
/// record failed after its publication) is recorded again, and nothing
/// more: no second publication. If the record fails again the route and
/// the verdict stand (S11 forbids routing an execution before its record,
/// not keeping one already routed); the error is reported.
#[test]
fn a_lagging_record_is_written_again_without_republishing() {
    let lagging = || {
        let mut w = settled();
        w.active
            .services
            .get_mut(&ServiceName::new("web"))
            .unwrap()
            .verified_started_at = None;
        w
    };
    let mut w = lagging();
    let reports = w.pass();
    let commands = w.commands("web");
    assert!(
        commands
            .iter()
            .any(|c| matches!(c, Command::RecordExecution { .. })),
        "{commands:?}"
    );
    assert!(!commands.iter().any(is_publish), "{commands:?}");
    assert!(matches!(reports[0].verdict, Verdict::Verified { .. }));

    let mut w = lagging();
    w.faults
        .record
        .push_back(StoreError::Unavailable("database restarting".into()));
    let reports = w.pass();
    assert!(
        matches!(reports[0].verdict, Verdict::Verified { .. }),
        "{:?}",
        reports[0]
    );
    assert!(routed(&w), "the route stands");
    assert!(
        reports[0]
            .errors
            .iter()
            .any(|e| matches!(e, RecoveryError::RecordFailed(_))),
        "{:?}",
        reports[0].errors
    );
}

/// S11, found by CI: a fresh execution is recorded as verified before it
/// is published, so a daemon restarted between the two (here: the
/// publication failed, then the daemon restarted) finds it vouched for and
/// republishes it without withdrawing or probing it again.
#[test]
fn a_restart_between_verifying_and_publishing_does_not_blink() {
    let mut w = settled();
    w.native_restart("c1");
    w.faults
        .publish
        .push_back(TrafficError::Unreachable("caddy restarting".into()));
    w.pass();
    let first = w.commands("web");
    let recorded = first
        .iter()
        .position(|c| matches!(c, Command::RecordExecution { .. }))
        .expect("the verified execution is recorded");
    let published = first
        .iter()
        .position(|c| matches!(c, Command::Publish { .. }))
        .expect("a publication was tried");
    assert!(recorded < published, "recorded first: {first:?}");
    w.memory = Default::default(); // the daemon restarted
    w.advance(PASS);
    let before = w.log.len();
    w.pass();
    let second: Vec<&Command> = w.log[before..].iter().map(|p| &p.command).collect();
    assert!(
        !second
            .iter()
            .any(|c| matches!(c, Command::Withdraw | Command::ProbeReadiness { .. })),
        "no blink, no second probe: {second:?}"
    );
    assert!(routed(&w), "republished: {second:?}");
}

#[test]
fn a_restarted_daemon_still_verifies_executions_that_changed() {
    let mut w = settled();
    w.memory = Default::default();
    w.native_restart("c1");
    w.pass();
    assert!(w.commands("web").contains(&Command::Withdraw));
}

#[test]
fn a_never_healthy_container_is_charged_and_eventually_delayed() {
    let mut w = settled();
    w.container("c1").health = Health::Unhealthy;
    w.container("c1").health_after_start = Health::Unhealthy;
    for _ in 0..12 {
        w.pass();
        w.advance(PASS);
    }
    // Every second pass would restart it without the budget; with it, the
    // third unconfirmed restart is followed by the 1-minute delay and more.
    let restarts = w.count(is_restart);
    assert!((3..6).contains(&restarts), "restarts: {restarts}");
}

// --- regressions found by the simulation ------------------------------------

#[test]
fn a_route_withdrawn_after_a_failed_verification_is_republished() {
    let mut w = settled();
    w.faults
        .binds
        .push_back(RuntimeError::Transient("inspect failed".into()));
    w.pass();
    assert!(!routed(&w), "a failed verification withdraws");
    w.advance(PASS);
    w.pass();
    assert!(routed(&w), "the unchanged execution is published again");
}

#[test]
fn one_failed_attempt_is_charged_once() {
    let mut w = settled();
    w.crash("c1");
    w.container("c1").status_after_start = ContainerStatus::Exited;
    let reports = w.pass(); // started, then readiness fails: one charge
    assert_eq!(failures(&reports[0]), 1);
    w.advance(PASS);
    let reports = w.pass(); // found down again: the attempt was already charged
    assert_eq!(failures(&reports[0]), 2);
    assert_eq!(w.count(is_start), 2);
}

// What operators and the engine read off the machine's words: the metric
// labels, the log's reasons, which commands need the lease trusted right
// now (T2), and which port a failure is counted against. Each is a table
// someone relies on, so each is pinned here.

#[test]
fn every_verdict_and_reason_has_its_own_label_and_words() {
    use std::collections::BTreeSet;
    use stead::core::recovery::Why;
    let verdicts = [
        Verdict::Verified {
            started_at: None,
            published: false,
        },
        Verdict::Verified {
            started_at: None,
            published: true,
        },
        Verdict::Transitional,
        Verdict::Delayed { next_attempt: None },
        Verdict::Gone,
        Verdict::Inhibited,
        Verdict::Stopped,
        Verdict::Failed,
    ];
    let labels: Vec<&str> = verdicts.iter().map(Verdict::label).collect();
    assert_eq!(
        labels,
        Verdict::LABELS.to_vec(),
        "one label per verdict kind"
    );
    assert_eq!(labels.iter().collect::<BTreeSet<_>>().len(), labels.len());
    let reasons: BTreeSet<&str> = Why::ALL.iter().map(|w| w.label()).collect();
    assert_eq!(reasons.len(), Why::ALL.len(), "reasons are told apart");
    let words: BTreeSet<&str> = Why::ALL.iter().map(|w| w.describe()).collect();
    assert_eq!(words.len(), Why::ALL.len());
    for why in Why::ALL {
        assert_eq!(why.to_string(), why.describe());
        if why != Why::Observe {
            assert!(why.describe().contains("(R"), "{why:?} names its rule");
        }
    }
    assert_eq!(Why::Down.describe(), "the container was down (R9)");
}

#[test]
fn outside_effects_are_exactly_the_workload_and_traffic_changes() {
    let grace = Duration::from_secs(1);
    let cases = [
        (Command::Withdraw, false, true),
        (Command::Inspect, false, false),
        (Command::ReleaseClaims, false, false),
        (Command::CheckPolicy, false, false),
        (Command::Start, true, true),
        (Command::Restart { grace }, true, true),
        (Command::Stop { grace }, true, true),
        (Command::ReadHealth, false, false),
        (Command::ReadBinds, false, false),
        (
            Command::ProbeReadiness {
                binds: Binds::new(),
                started_at: None,
            },
            false,
            false,
        ),
        (Command::ReloadActive, false, false),
        (
            Command::PersistBinds {
                binds: Binds::new(),
                revision: "r1".into(),
            },
            false,
            false,
        ),
        (
            Command::Publish {
                binds: Binds::new(),
                started_at: None,
            },
            false,
            true,
        ),
        (
            Command::RecordExecution {
                started_at: jiff::Timestamp::UNIX_EPOCH,
            },
            false,
            false,
        ),
    ];
    for (command, mutates, outside) in cases {
        assert_eq!(command.mutates_workload(), mutates, "{command:?}");
        assert_eq!(command.is_outside_effect(), outside, "{command:?}");
    }
}

#[test]
fn a_failed_port_call_is_counted_against_its_port_and_kind() {
    use stead::core::errors::{ErrorKind, PortName};
    use stead::core::recovery::Outcome;
    let gone = RuntimeError::NotFound;
    assert_eq!(
        Outcome::Started(Err(gone)).port_failure(),
        Some((PortName::Runtime, ErrorKind::NotFound))
    );
    let refused = TrafficError::Rejected("no".into());
    assert_eq!(
        Outcome::Published(Err(refused)).port_failure(),
        Some((PortName::Traffic, ErrorKind::Refused))
    );
    assert_eq!(Outcome::Started(Ok(())).port_failure(), None);
}
