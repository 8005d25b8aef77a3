//! Property tests of the overlap-replacement machine (`core/upgrade.rs`;
//! docs/rules.md C11, R15, S1, S5): arbitrary catalog entries (services new,
//! behind, or already at the target version) driven with arbitrary answers.
//! The checker lives in `testkit/src/upgrade.rs` and is shared with the
//! cargo-fuzz target `upgrade`.

use stead_testkit::machine;
use stead_testkit::upgrade;

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use machine::OutcomeSeed;
use upgrade::{run_upgrade_and_check, upgrade_input, UpgradeServiceSeed};

const CASES_UPGRADE: u32 = 4_000;

fn services() -> impl Strategy<Value = Vec<UpgradeServiceSeed>> {
    proptest::collection::vec(
        any::<u8>().prop_map(|active| UpgradeServiceSeed { active }),
        0..=4,
    )
}

fn answers() -> impl Strategy<Value = Vec<OutcomeSeed>> {
    proptest::collection::vec(
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(choice, execution, binds)| {
            OutcomeSeed {
                choice,
                execution,
                binds,
                ..OutcomeSeed::default()
            }
        }),
        1..64,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES_UPGRADE))]

    #[test]
    fn an_upgrade_switches_active_only_to_verified_successors_behind_a_marker(
        services in services(),
        answers in answers(),
        stopped in proptest::bool::weighted(0.1),
        ready in proptest::bool::weighted(0.8),
    ) {
        run_upgrade_and_check(&upgrade_input(&services, stopped, ready), &answers);
    }
}

/// The runs above are not vacuous: many switch services.
#[test]
fn arbitrary_upgrades_do_switch_services() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut switched = 0;
    for _ in 0..CASES_UPGRADE {
        let s = services().new_tree(&mut runner).unwrap().current();
        let a = answers().new_tree(&mut runner).unwrap().current();
        let (stopped, ready) = (false, true);
        switched += run_upgrade_and_check(&upgrade_input(&s, stopped, ready), &a);
    }
    assert!(switched > 0, "no arbitrary upgrade switched a service");
    eprintln!("{switched} services switched in {CASES_UPGRADE} arbitrary upgrades");
}

/// A worker whose catalog is older than the instance's version (another
/// process planned the upgrade under a newer catalog) skips the task: it
/// issues nothing at all rather than downgrade services, retire ones the
/// newer version added, or record its older version. At the same version,
/// or an older recorded one, the upgrade runs.
#[test]
fn a_worker_with_an_older_catalog_downgrades_nothing() {
    let services = [
        UpgradeServiceSeed { active: 0 },
        UpgradeServiceSeed { active: 1 },
    ];
    let mut input = upgrade_input(&services, false, true);
    input.recorded_version = "3".into();
    let mut upgrade = stead::core::upgrade::Upgrade::new(input.clone());
    assert!(upgrade.skipped_older_catalog());
    assert_eq!(upgrade.poll_command(), None, "nothing issued");
    assert!(
        upgrade.into_report().is_ok(),
        "done, for version drift to plan again"
    );
    for recorded in ["1", "2", "blue"] {
        input.recorded_version = recorded.into();
        let mut upgrade = stead::core::upgrade::Upgrade::new(input.clone());
        assert!(!upgrade.skipped_older_catalog(), "recorded {recorded}");
        assert!(
            upgrade.poll_command().is_some(),
            "recorded {recorded}: upgraded"
        );
    }
}

/// The `stop-first` checks are not vacuous: with the rule broken (the
/// mutation exercise's `OverlapStopFirst`: the successor created while the
/// predecessor runs), the checker fails the same upgrade it passes whole.
#[test]
fn the_checker_catches_a_stop_first_service_replaced_by_overlap() {
    // In ACTIVE, behind by version, replaced stop-first.
    let services = [UpgradeServiceSeed { active: 7 }];
    let healthy = [OutcomeSeed {
        choice: 4,
        ..OutcomeSeed::default()
    }];
    let mut input = upgrade_input(&services, false, true);
    assert_eq!(run_upgrade_and_check(&input, &healthy), 1, "switched whole");
    input.broken = Some(stead::core::broken::Mutant::OverlapStopFirst);
    let caught = std::panic::catch_unwind(|| run_upgrade_and_check(&input, &healthy))
        .expect_err("an overlap of a stop-first service passed the checker");
    let message = caught.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("stop-first web created before its predecessor was held"),
        "{message}"
    );
}

/// Runs `input` with `mutant` armed and returns the checker's complaint.
fn caught_with(
    mut input: stead::core::upgrade::UpgradeInput,
    answers: &[OutcomeSeed],
    mutant: stead::core::broken::Mutant,
) -> String {
    input.broken = Some(mutant);
    let caught = std::panic::catch_unwind(|| run_upgrade_and_check(&input, answers))
        .expect_err("the broken rule passed the checker");
    caught.downcast_ref::<String>().cloned().unwrap_or_default()
}

/// #44: what a failed upgrade may touch. Its first service fails to be
/// created, nothing was switched: the service the new version drops must
/// stay (the old version still serves). With the rule broken
/// (`DropOnFailedUpgrade`) the checker fails it.
#[test]
fn the_checker_catches_a_failed_upgrade_that_drops_a_service() {
    let services = [UpgradeServiceSeed { active: 1 }; 4];
    let failing = [OutcomeSeed::default(); 64];
    let input = upgrade_input(&services, false, false);
    assert_eq!(
        run_upgrade_and_check(&input, &failing),
        0,
        "nothing switched"
    );
    let message = caught_with(
        input,
        &failing,
        stead::core::broken::Mutant::DropOnFailedUpgrade,
    );
    assert!(
        message.contains("retired before every listed service was switched"),
        "{message}"
    );
}

/// #44: the route of a service the new version drops must go before its
/// container does. With the withdrawal skipped (`KeepDroppedRoute`) the
/// checker fails the same upgrade it passes whole.
#[test]
fn the_checker_catches_a_dropped_service_whose_route_stays() {
    let services = [UpgradeServiceSeed { active: 1 }; 4];
    let healthy = [OutcomeSeed {
        choice: 4,
        ..OutcomeSeed::default()
    }];
    let input = upgrade_input(&services, false, true);
    assert_eq!(run_upgrade_and_check(&input, &healthy), 3, "switched whole");
    let message = caught_with(
        input,
        &healthy,
        stead::core::broken::Mutant::KeepDroppedRoute,
    );
    assert!(
        message.contains("retirement of legacy out of order: stop after [\"hold\"]"),
        "{message}"
    );
}

/// The commands a Helm release's upgrade issues, every one answered well.
fn helm_upgrade_commands(bake: std::time::Duration) -> Vec<String> {
    use stead::core::upgrade::{Upgrade, UpgradeAnswer, UpgradeCommand};
    let mut input = upgrade_input(&[], false, true);
    input.services.clear();
    input.bake = bake;
    input.release = Some(stead::core::release::HelmRelease {
        name: "s1".into(),
        namespace: "s1".into(),
        chart: "charts/search".into(),
        chart_version: "2".into(),
        values: serde_json::json!({}),
        atomic: true,
    });
    let mut upgrade = Upgrade::new(input);
    let mut issued = Vec::new();
    while let Some(command) = upgrade.poll_command() {
        let answer = match &command {
            UpgradeCommand::MoveState { .. } => UpgradeAnswer::StateMoved(Ok(())),
            UpgradeCommand::UpgradeRelease(_) => UpgradeAnswer::ReleaseUpgraded(Ok(())),
            UpgradeCommand::SetVersion { .. } => UpgradeAnswer::VersionSet(Ok(())),
            other => panic!("a helm upgrade issued {other:?}"),
        };
        issued.push(
            format!("{command:?}")
                .split([' ', '('])
                .next()
                .unwrap()
                .to_owned(),
        );
        upgrade.handle(answer, machine::base());
    }
    issued
}

/// #40: a Helm release upgraded with a bake window records its version
/// only once the bake held (the worker's, after the machine): recorded
/// before, a retry after a lost lease mid-bake took the new version for
/// the old, and its revert recorded it "again" while rolling the release
/// back (simulation seed 54, H2). Without a bake it is recorded at once.
#[test]
fn a_baked_helm_upgrade_leaves_its_version_to_the_bake() {
    let baked = helm_upgrade_commands(std::time::Duration::from_secs(60));
    assert!(!baked.iter().any(|c| c == "SetVersion"), "{baked:?}");
    assert!(baked.iter().any(|c| c == "UpgradeRelease"), "{baked:?}");
    let unbaked = helm_upgrade_commands(std::time::Duration::ZERO);
    assert!(unbaked.iter().any(|c| c == "SetVersion"), "{unbaked:?}");
}
