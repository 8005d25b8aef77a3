//! The provisioner port's contract, run against the in-memory double and
//! the Helm adapter over `tests/fixtures/fake-helm` (a stand-in that keeps
//! Helm 3's CLI contract: there is no cluster or helm here) alike (issue
//! #44, "doubles that cannot lie"): the same calls must get the same
//! answers and error kinds, and leave the same releases at the same
//! revisions and chart versions.
//!
//! Documented differences (docs/simulation.md, "The port contracts"):
//! - The double serves Docker releases too (the daemon routes those to the
//!   Docker provisioner; the Helm adapter refuses them), so no call here
//!   names one.
//! - The double's install never fails by itself: a chart that never
//!   becomes ready (`failed` from helm) exists only as the simulation's
//!   injected fault, which the double reports as `unavailable`.
//! - Status is compared by word, revision and chart version: the chart's
//!   name and helm's description are helm's own.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use stead::adapters::helm::{HelmConfig, HelmProvisioner};
use stead::ports::{
    HelmRelease, PortFailure, ProvisionError, Provisioner, Release, ReleaseHealth, ReleaseKind,
    ReleaseSpec, ReleaseTarget,
};
use stead_testkit::ports::{Hooks, MemoryProvisioner};

const RELEASE: &str = "shop-1";
const NAMESPACE: &str = "shop-1";
/// The chart version whose chart tests fail, for both implementations.
const TESTS_FAIL: &str = "3.0.0";

/// One call of the contract, on release `shop-1` in `shop-1` unless it
/// says otherwise.
enum Call {
    Install(&'static str),
    /// Install of a release and namespace given by name.
    InstallAs(&'static str, &'static str, &'static str),
    Uninstall,
    UninstallIn(&'static str),
    List,
    Status,
    StatusIn(&'static str),
    /// A bake's check.
    Check(Tests),
    /// `rollout undo --to` the version.
    RollBack(&'static str),
    /// A bake's revert away from the version.
    RollBackFrom(&'static str),
    /// A bake's revert from the first version to the second, the one the
    /// instance records.
    RevertTo(&'static str, &'static str),
}

/// Whether a bake's check runs the chart's tests (`helm test`).
#[derive(Clone, Copy)]
enum Tests {
    Run,
    Skip,
}

/// The calls, each with the answer every implementation must give: `ok`,
/// the error's kind, the releases listed, a status as `word rN version`
/// (or `none`), a check's `healthy` or `bad`.
fn contract() -> Vec<(Call, &'static str)> {
    use Call::*;
    use Tests::*;
    vec![
        (List, ""),
        (Status, "none"),
        (Install("1.0.0"), "ok"),
        (List, "shop-1/shop-1"),
        (Status, "deployed r1 1.0.0"),
        // Installing an installed release upgrades it in place.
        (Install("1.0.0"), "ok"),
        (Install("2.0.0"), "ok"),
        (Status, "deployed r3 2.0.0"),
        (StatusIn("elsewhere"), "none"),
        (Check(Skip), "healthy"),
        (Check(Run), "healthy"),
        // Back to a version of its history: a new revision at it.
        (RollBack("1.0.0"), "ok"),
        (Status, "deployed r4 1.0.0"),
        // Already there: nothing to do, no new revision.
        (RollBack("1.0.0"), "ok"),
        (Status, "deployed r4 1.0.0"),
        // Away from a version gone bad: the newest revision at another.
        (RollBackFrom("1.0.0"), "ok"),
        (Status, "deployed r5 2.0.0"),
        // Back to the version the instance records, not merely away from
        // the bad one: to its newest revision (r4), not r5's chart.
        (Install("3.0.0"), "ok"),
        (RevertTo("3.0.0", "1.0.0"), "ok"),
        (Status, "deployed r7 1.0.0"),
        // The recorded version at the bad one's chart (only its values
        // differ): a new revision at it.
        (RevertTo("1.0.0", "1.0.0"), "ok"),
        (Status, "deployed r8 1.0.0"),
        // A version whose chart tests fail is bad only when they run.
        (Install(TESTS_FAIL), "ok"),
        (Check(Skip), "healthy"),
        (Check(Run), "bad"),
        // A release of that name in another namespace is another release.
        (UninstallIn("elsewhere"), "ok"),
        (List, "shop-1/shop-1"),
        (Uninstall, "ok"),
        (List, ""),
        (Status, "none"),
        // Uninstalling what is gone succeeds: deprovisioning is idempotent.
        (Uninstall, "ok"),
        (Check(Skip), "bad"),
        (RollBackFrom("1.0.0"), "failed"),
        // A bake's revert of a release gone meanwhile installs the
        // recorded version; an undo to it then finds it there.
        (RevertTo("2.0.0", "1.0.0"), "ok"),
        (Status, "deployed r1 1.0.0"),
        // Undo to a version of a release that is gone installs it there.
        (RollBack("1.0.0"), "ok"),
        (Status, "deployed r1 1.0.0"),
        // Names helm would refuse never reach it.
        (InstallAs("Shop_2", "shop-2", "1.0.0"), "refused"),
        (InstallAs("shop-2", "shop 2", "1.0.0"), "refused"),
        (List, "shop-1/shop-1"),
    ]
}

fn helm(name: &str, namespace: &str, chart_version: &str) -> HelmRelease {
    HelmRelease {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        chart: "charts/shop".to_owned(),
        chart_version: chart_version.to_owned(),
        values: json!({"host": format!("{name}.example.org")}),
        atomic: true,
    }
}

fn target(namespace: &str) -> ReleaseTarget {
    ReleaseTarget {
        kind: ReleaseKind::Helm,
        release: Release {
            name: RELEASE.to_owned(),
            namespace: namespace.to_owned(),
        },
    }
}

fn done(result: Result<(), ProvisionError>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => e.kind().to_string(),
    }
}

async fn status(provisioner: &dyn Provisioner, namespace: &str) -> String {
    match provisioner.status(&target(namespace)).await {
        Ok(None) => "none".to_owned(),
        Ok(Some(status)) => {
            // The chart as `name-version`: the version is what both know.
            let version = status.chart.rsplit('-').next().unwrap_or_default();
            format!("{} r{} {version}", status.status, status.revision)
        }
        Err(e) => e.kind().to_string(),
    }
}

async fn run(provisioner: &dyn Provisioner) -> Vec<String> {
    let mut answers = Vec::new();
    for (call, _) in contract() {
        let answer = match call {
            Call::Install(version) => done(
                provisioner
                    .install_or_upgrade(&ReleaseSpec::Helm(helm(RELEASE, NAMESPACE, version)))
                    .await,
            ),
            Call::InstallAs(name, namespace, version) => done(
                provisioner
                    .install_or_upgrade(&ReleaseSpec::Helm(helm(name, namespace, version)))
                    .await,
            ),
            Call::Uninstall => done(provisioner.uninstall(&target(NAMESPACE)).await),
            Call::UninstallIn(namespace) => done(provisioner.uninstall(&target(namespace)).await),
            Call::List => match provisioner.list_releases().await {
                Ok(releases) => {
                    let mut listed: Vec<String> = releases
                        .iter()
                        .map(|r| format!("{}/{}", r.namespace, r.name))
                        .collect();
                    listed.sort();
                    listed.join(" ")
                }
                Err(e) => e.kind().to_string(),
            },
            Call::Status => status(provisioner, NAMESPACE).await,
            Call::StatusIn(namespace) => status(provisioner, namespace).await,
            Call::Check(tests) => {
                let tests = matches!(tests, Tests::Run);
                match provisioner.check_release(&target(NAMESPACE), tests).await {
                    Ok(ReleaseHealth::Healthy) => "healthy".to_owned(),
                    Ok(ReleaseHealth::Bad(_)) => "bad".to_owned(),
                    Err(e) => e.kind().to_string(),
                }
            }
            Call::RollBack(version) => done(
                provisioner
                    .roll_back(&helm(RELEASE, NAMESPACE, version))
                    .await,
            ),
            Call::RollBackFrom(version) => done(
                provisioner
                    .roll_back_from(&target(NAMESPACE), version, None)
                    .await,
            ),
            Call::RevertTo(bad, back) => done(
                provisioner
                    .roll_back_from(
                        &target(NAMESPACE),
                        bad,
                        Some(&helm(RELEASE, NAMESPACE, back)),
                    )
                    .await,
            ),
        };
        answers.push(answer);
    }
    answers
}

fn assert_contract(answers: Vec<String>) {
    let expected: Vec<&str> = contract().into_iter().map(|(_, answer)| answer).collect();
    assert_eq!(answers.len(), expected.len());
    let broken: Vec<String> = answers
        .iter()
        .zip(&expected)
        .enumerate()
        .filter(|(_, (got, want))| got != *want)
        .map(|(n, (got, want))| format!("call {n}: answered {got:?}, the contract says {want:?}"))
        .collect();
    assert!(
        broken.is_empty(),
        "the provisioner contract is broken:\n{}",
        broken.join("\n")
    );
}

#[tokio::test]
async fn the_memory_double_keeps_the_provisioner_contract() {
    let provisioner = MemoryProvisioner::new(NAMESPACE, Hooks::default());
    provisioner.go_bad(TESTS_FAIL);
    assert_contract(run(&provisioner).await);
}

#[tokio::test]
async fn the_helm_adapter_keeps_the_provisioner_contract() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let provisioner = HelmProvisioner::new(HelmConfig {
        helm_path: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-helm"),
        kubectl_path: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-kubectl"),
        pod_security: Default::default(),
        wait_timeout: Duration::from_secs(5),
        kill_margin: Duration::from_secs(5),
        pass_env: Vec::new(),
        env: vec![
            (
                "FAKE_HELM_STATE".to_owned(),
                dir.path().join("state").display().to_string(),
            ),
            (
                "FAKE_HELM_FAIL_TEST_CHART_VERSIONS".to_owned(),
                TESTS_FAIL.to_owned(),
            ),
        ],
    })
    .expect("valid config");
    assert_contract(run(&provisioner).await);
}
