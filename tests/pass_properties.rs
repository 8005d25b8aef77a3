//! Property tests of the instance pass machine (docs/rules.md R2, R15, T5;
//! S1, S5): arbitrary instances (services in and out of ACTIVE, markers on
//! predecessors and on ACTIVE's own containers, routes held or not read,
//! running or stopped intent) driven with arbitrary answers, abandoned at
//! an arbitrary step or not. The checker lives in `testkit/src/pass.rs` and is
//! shared with the cargo-fuzz target `instance_pass`.

use stead_testkit::machine;
use stead_testkit::pass;

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use machine::OutcomeSeed;
use pass::{run_pass_and_check, PassSeed, ServiceSeed};

const CASES_PASS: u32 = 4_000;

fn service_seed() -> impl Strategy<Value = ServiceSeed> {
    (
        any::<bool>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(
            |(in_active, active_binds, active_verified, marker, route, memory_verified)| {
                ServiceSeed {
                    // Mostly in ACTIVE: the retirement path needs a successor.
                    in_active: in_active || marker % 2 == 0,
                    active_binds,
                    active_verified,
                    marker,
                    route,
                    memory_verified,
                }
            },
        )
}

fn outcome_seed() -> impl Strategy<Value = OutcomeSeed> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(choice, status, execution, health, binds)| OutcomeSeed {
            choice,
            status,
            execution,
            health,
            binds,
            took_ms: 0,
        })
}

fn pass_seed() -> impl Strategy<Value = PassSeed> {
    (
        proptest::bool::weighted(0.1),
        any::<bool>(),
        proptest::collection::vec(service_seed(), 0..=3),
        prop_oneof![3 => Just(0u8), 1 => 1u8..40],
        any::<bool>(),
    )
        .prop_map(
            |(stopped, routes_read, services, abandon_after, steady)| PassSeed {
                stopped,
                routes_read,
                services,
                abandon_after,
                steady,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_PASS))]

    #[test]
    fn the_pass_retires_only_behind_a_verified_routed_successor_and_never_touches_active(
        seed in pass_seed(),
        answers in proptest::collection::vec(outcome_seed(), 1..64),
    ) {
        run_pass_and_check(&seed.build(), &answers, seed.abandon_after, seed.steady);
    }
}

/// The arbitrary runs above are not vacuous: some of them retire.
#[test]
fn arbitrary_passes_do_retire_predecessors() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut retired, mut reverted) = (0, 0);
    for _ in 0..CASES_PASS {
        let seed = pass_seed().new_tree(&mut runner).unwrap().current();
        let answers = proptest::collection::vec(outcome_seed(), 1..64)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let (r, rev) = run_pass_and_check(&seed.build(), &answers, seed.abandon_after, seed.steady);
        retired += r;
        reverted += usize::from(rev);
    }
    assert!(retired > 0, "no arbitrary pass retired anything");
    assert!(
        reverted > 0,
        "no arbitrary pass reverted a baking successor (#40)"
    );
    eprintln!("{retired} retirements and {reverted} reverts in {CASES_PASS} arbitrary passes");
}

/// A running instance of `services` services, each ACTIVE, bound,
/// verified and remembered so, each with a predecessor marked for
/// retirement; the proxy's routes not read.
fn settled_services_retiring(services: usize) -> PassSeed {
    let service = ServiceSeed {
        in_active: true,
        active_binds: 1,
        active_verified: 1,
        marker: 1,
        route: 0,
        memory_verified: 1,
    };
    PassSeed {
        stopped: false,
        routes_read: false,
        services: vec![service; services],
        abandon_after: 0,
        steady: false,
    }
}

/// The checker is not blind: a run where retirement must happen does
/// retire, so the properties above are about real retirements.
#[test]
fn a_verified_routed_successor_lets_the_predecessor_go() {
    use stead::core::pass::InstancePass;
    let case = settled_services_retiring(1).build();
    let mut pass = InstancePass::new(&case.policy, case.input.clone());
    let mut retired = false;
    let mut whys = Vec::new();
    while let Some(command) = pass.poll_command() {
        use stead::core::pass::{InstanceAnswer as A, InstanceCommand as C};
        use stead::core::recovery::{Command, Outcome};
        use stead::core::types::{ContainerStatus, Observation};
        if matches!(command, C::Service { .. }) {
            // What the engine's log and step counters say of the step.
            whys.push(pass.why());
        }
        let running = Observation {
            status: ContainerStatus::Running,
            started_at: machine::execution(1),
            exit: None,
        };
        let answer = match &command {
            C::Service { command, .. } => A::Service(match command {
                Command::Inspect => Outcome::Inspected(Ok(running)),
                Command::ReadHealth => Outcome::Health(Ok(stead::core::types::Health::Healthy)),
                Command::ReadBinds => Outcome::Binds(Ok(machine::binds(1))),
                Command::CheckPolicy => Outcome::PolicyChecked(Ok(())),
                Command::ProbeReadiness { .. } => Outcome::Readiness(Ok(())),
                Command::ReloadActive => Outcome::ActiveReloaded(Ok(Some(
                    case.input.active.services.values().next().unwrap().clone(),
                ))),
                other => panic!("a steady verified service needs no {other:?}"),
            }),
            C::InspectSuccessor(_) => A::SuccessorInspected(Ok(running)),
            C::InspectPredecessor(_) => panic!("nothing bakes: no predecessor inspected"),
            C::ReadRoutes => A::RoutesRead(Ok(case
                .input
                .active
                .services
                .keys()
                .map(|s| {
                    (
                        stead::core::types::ServiceKey {
                            instance: case.input.instance.clone(),
                            service: s.clone(),
                        },
                        30001,
                    )
                })
                .collect())),
            C::StopPredecessor { .. } => A::PredecessorStopped(Ok(())),
            C::RemovePredecessor(_) => {
                retired = true;
                A::PredecessorRemoved(Ok(()))
            }
            C::ReleaseClaims(_) => A::ClaimsReleased(Ok(())),
            C::ClearMarker(_) => A::MarkerCleared(Ok(())),
            C::WithdrawStale(_) => A::StaleWithdrawn(Ok(())),
            C::Revert { .. } => panic!("nothing bakes: no revert"),
        };
        pass.handle(answer, machine::base());
    }
    let report = pass.into_report();
    assert!(retired, "no retirement: {:?}", report.errors);
    assert_eq!(report.retired.len(), 1);
    assert_eq!(
        whys.first(),
        Some(&Some(stead::core::recovery::Why::Observe)),
        "a service's steps say why: {whys:?}"
    );
    assert!(whys.iter().all(Option::is_some), "{whys:?}");
}

/// A pass abandoned before its retirements tells the operator exactly
/// how many it left: none in hand yet, so every marker counts, once.
#[test]
fn an_abandoned_pass_counts_the_retirements_it_left() {
    use stead::core::pass::{Abandon, InstancePass, PassError};
    let case = settled_services_retiring(2).build();
    let markers = case
        .input
        .inhibitions
        .iter()
        .filter(|i| i.reason == stead::core::types::InhibitionReason::RetirementPending)
        .count();
    assert_eq!(markers, 2, "a marker per service");
    let mut pass = InstancePass::new(&case.policy, case.input.clone());
    assert!(
        pass.poll_command().is_some(),
        "the first service's first step"
    );
    pass.abandon(Abandon::Deadline);
    let left: Vec<_> = pass
        .into_report()
        .errors
        .into_iter()
        .filter_map(|e| match e {
            PassError::RetirementsLeft { pending, .. } => Some(pending),
            _ => None,
        })
        .collect();
    assert_eq!(left, vec![2], "both retirements left, counted once");
    // With no marker, nothing is said to be left.
    let mut unmarked = settled_services_retiring(2);
    for service in &mut unmarked.services {
        service.marker = 0;
    }
    let case = unmarked.build();
    let mut pass = InstancePass::new(&case.policy, case.input.clone());
    assert!(pass.poll_command().is_some());
    pass.abandon(Abandon::Deadline);
    let report = pass.into_report();
    assert!(
        !report
            .errors
            .iter()
            .any(|e| matches!(e, PassError::RetirementsLeft { .. })),
        "{:?}",
        report.errors
    );
}

// The instance pass's own tables, pinned: which of its commands need the
// lease trusted right now (T2), which port a failure is counted against,
// what an abandoned retirement tells the operator, and when a delayed
// instance asks to be woken (R10, issue #14).

mod tables {
    use std::time::Duration;

    use stead::core::errors::{ErrorKind, PortName, StoreError, TrafficError};
    use stead::core::memory::InstanceMemory;
    use stead::core::pass::{Abandon, InstanceAnswer, InstanceCommand, InstanceReport, PassError};
    use stead::core::recovery::{Outcome, Report, ServiceMemory, Verdict};
    use stead::core::types::{
        ContainerId, GenerationKey, InstanceName, RuntimeError, ServiceKey, ServiceName, Timestamp,
    };

    fn key() -> GenerationKey {
        GenerationKey {
            instance: InstanceName::new("a"),
            service: ServiceName::new("web"),
            container: ContainerId::new("c1"),
        }
    }

    #[test]
    fn only_stop_remove_and_stale_withdrawals_of_the_pass_are_outside_effects() {
        let service = ServiceKey {
            instance: InstanceName::new("a"),
            service: ServiceName::new("web"),
        };
        let cases = [
            (
                InstanceCommand::Service {
                    key: key().into(),
                    command: stead::core::recovery::Command::Start,
                },
                true,
            ),
            (
                InstanceCommand::Service {
                    key: key().into(),
                    command: stead::core::recovery::Command::Inspect,
                },
                false,
            ),
            (
                InstanceCommand::InspectSuccessor(ContainerId::new("c2")),
                false,
            ),
            (InstanceCommand::ReadRoutes, false),
            (
                InstanceCommand::StopPredecessor {
                    generation: key(),
                    grace: Duration::from_secs(1),
                },
                true,
            ),
            (InstanceCommand::RemovePredecessor(key()), true),
            (InstanceCommand::ReleaseClaims(key()), false),
            (InstanceCommand::ClearMarker(key()), false),
            (InstanceCommand::WithdrawStale(service), true),
        ];
        for (command, outside) in cases {
            assert_eq!(command.is_outside_effect(), outside, "{command:?}");
        }
    }

    #[test]
    fn a_failed_answer_is_counted_against_its_port() {
        let unavailable = TrafficError::Unreachable("down".into());
        assert_eq!(
            InstanceAnswer::StaleWithdrawn(Err(unavailable)).port_failure(),
            Some((PortName::Traffic, ErrorKind::Unavailable))
        );
        assert_eq!(
            InstanceAnswer::MarkerCleared(Err(StoreError::Unavailable("db down".into())))
                .port_failure(),
            Some((PortName::Store, ErrorKind::Unavailable))
        );
        assert_eq!(
            InstanceAnswer::Service(Outcome::Inspected(Err(RuntimeError::NotFound))).port_failure(),
            Some((PortName::Runtime, ErrorKind::NotFound))
        );
        assert_eq!(
            InstanceAnswer::PredecessorRemoved(Ok(())).port_failure(),
            None
        );
    }

    #[test]
    fn retirements_left_behind_say_why() {
        let left = |why| {
            PassError::RetirementsLeft {
                instance: InstanceName::new("a"),
                pending: 2,
                why,
            }
            .to_string()
        };
        assert_eq!(
            left(Abandon::Deadline),
            "a: 2 retirement(s) left for the next pass: deadline exceeded"
        );
        assert!(left(Abandon::MandateLost).contains("no longer trusted"));
    }

    #[test]
    fn a_delayed_instance_asks_to_be_woken_at_its_earliest_next_attempt() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let report = |verdict| Report {
            key: key(),
            verdict,
            errors: Vec::new(),
            memory: ServiceMemory::default(),
            intervened: false,
            start_race_lost: false,
            exit: None,
        };
        let instance = |reports| InstanceReport {
            reports,
            retired: Vec::new(),
            withdrawn_stale: Vec::new(),
            reverted: None,
            errors: Vec::new(),
            memory: InstanceMemory::default(),
        };
        let delayed = |s| Verdict::Delayed {
            next_attempt: Some(at(s)),
        };
        assert_eq!(
            instance(vec![
                report(delayed(200)),
                report(Verdict::Failed),
                report(delayed(100))
            ])
            .wake_at(),
            Some(at(100))
        );
        assert_eq!(instance(vec![report(Verdict::Failed)]).wake_at(), None);
        assert_eq!(
            instance(vec![report(Verdict::Delayed { next_attempt: None })]).wake_at(),
            None
        );
    }
}
