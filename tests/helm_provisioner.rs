//! The Helm provisioner against `tests/fixtures/fake-helm`, a stand-in that
//! implements Helm 3's CLI contract (flags, JSON shapes, exit codes, error
//! texts, paging and the 256 default cap, pending and failed states,
//! `--wait` and `--atomic`) over a state file, since there is no cluster or
//! real helm on these machines. `tests/fixtures/fake-kubectl` stands in
//! for the one kubectl command the adapter runs (a release's namespace,
//! applied with its Pod Security labels) over the same state. Each test
//! has its own state folder.

// The timeout test measures how long a kill took.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stead::adapters::helm::{HelmConfig, HelmProvisioner};
use stead::core::grants::PodSecurity;
use stead::ports::{
    ErrorKind, HelmRelease, PortFailure, Provisioner, Release, ReleaseHealth, ReleaseKind,
    ReleaseSpec, ReleaseTarget,
};

fn fake_helm_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-helm")
}

/// `kubectl apply -f -` of a Namespace, sharing fake-helm's state.
fn fake_kubectl_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-kubectl")
}

struct FakeHelm {
    dir: tempfile::TempDir,
}

impl FakeHelm {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary folder"),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("calls.jsonl")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn config(&self, extra: &[(&str, &str)]) -> HelmConfig {
        let mut env = vec![
            (
                "FAKE_HELM_LOG".to_owned(),
                self.log_path().display().to_string(),
            ),
            (
                "FAKE_HELM_STATE".to_owned(),
                self.state_dir().display().to_string(),
            ),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        HelmConfig {
            helm_path: fake_helm_path(),
            wait_timeout: Duration::from_secs(5),
            kill_margin: Duration::from_secs(5),
            pass_env: Vec::new(),
            env,
            kubectl_path: fake_kubectl_path(),
            pod_security: PodSecurity::default(),
        }
    }

    /// The labels fake-kubectl applied to `namespace`, if it made it.
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        let text = std::fs::read_to_string(self.state_dir().join("namespaces.json")).ok()?;
        let all: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_str(&text).unwrap();
        all.get(namespace).cloned()
    }

    fn provisioner(&self, extra: &[(&str, &str)]) -> HelmProvisioner {
        HelmProvisioner::new(self.config(extra)).expect("valid config")
    }

    /// Every recorded call: its argument vector and the names of the
    /// environment variables helm received.
    fn calls(&self) -> Vec<(Vec<String>, Vec<String>)> {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        log.lines()
            .map(|line| {
                let call: Value = serde_json::from_str(line).expect("a JSON line");
                let strings = |key: &str| -> Vec<String> {
                    call[key]
                        .as_array()
                        .expect("an array")
                        .iter()
                        .map(|v| v.as_str().expect("a string").to_owned())
                        .collect()
                };
                (strings("argv"), strings("env"))
            })
            .collect()
    }

    fn argvs(&self) -> Vec<Vec<String>> {
        self.calls().into_iter().map(|(argv, _)| argv).collect()
    }

    /// Writes releases straight into the fake's state, as Helm's storage
    /// would hold them.
    fn seed(&self, releases: Vec<Value>) {
        std::fs::create_dir_all(self.state_dir()).unwrap();
        let mut namespaces: Vec<Value> = releases.iter().map(|r| r["namespace"].clone()).collect();
        namespaces.push(json!("default"));
        std::fs::write(
            self.state_dir().join("releases.json"),
            json!({"namespaces": namespaces, "releases": releases}).to_string(),
        )
        .unwrap();
    }

    /// Runs the fake directly (not through stead), for its own contract.
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(fake_helm_path())
            .args(args)
            .env("FAKE_HELM_STATE", self.state_dir())
            .output()
            .expect("fake-helm runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn helm_release(name: &str, namespace: &str, chart_version: &str, atomic: bool) -> HelmRelease {
    HelmRelease {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        chart: "charts/shop".to_owned(),
        chart_version: chart_version.to_owned(),
        values: json!({"host": format!("{name}.example.org"), "replicas": 2}),
        atomic,
    }
}

fn spec(name: &str, chart_version: &str) -> ReleaseSpec {
    ReleaseSpec::Helm(helm_release(name, name, chart_version, false))
}

fn target(name: &str, namespace: &str) -> ReleaseTarget {
    ReleaseTarget {
        kind: ReleaseKind::Helm,
        release: Release {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        },
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn install_runs_helm_with_an_argument_vector_and_values_on_stdin() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[]);
    helm.install_or_upgrade(&spec("shop-1", "1.2.3"))
        .await
        .expect("install");
    assert_eq!(
        fake.argvs(),
        [strings(&[
            "upgrade",
            "--install",
            "shop-1",
            "charts/shop",
            "--version",
            "1.2.3",
            "--namespace",
            "shop-1",
            "--wait",
            "--timeout",
            "5s",
            "--values",
            "-",
        ])]
    );
    // The values reached helm (on its standard input, never on disk).
    let (ok, stdout, stderr) = fake.run(&["status", "shop-1", "-n", "shop-1", "-o", "json"]);
    assert!(ok, "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["config"]["host"], "shop-1.example.org");
    assert_eq!(status["config"]["replicas"], 2);
    assert_eq!(status["info"]["status"], "deployed");
}

/// #54: helm's `--create-namespace` would make a namespace in which Pod
/// Security Admission enforces nothing; stead makes it itself, labelled,
/// before helm installs into it.
#[tokio::test]
async fn a_release_namespace_is_made_with_pod_security_labels_before_helm_installs() {
    let fake = FakeHelm::new();
    fake.provisioner(&[])
        .install_or_upgrade(&spec("shop-1", "1.2.3"))
        .await
        .expect("install");
    let labels = fake
        .namespace_labels("shop-1")
        .expect("the namespace was made");
    for kind in ["enforce", "warn", "audit"] {
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{kind}")],
            "restricted"
        );
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{kind}-version")],
            "latest"
        );
    }
    // A level the operator granted relabels the namespace on the next
    // upgrade.
    let baseline = HelmProvisioner::new(HelmConfig {
        pod_security: PodSecurity::Baseline,
        ..fake.config(&[])
    })
    .unwrap();
    baseline
        .install_or_upgrade(&spec("shop-1", "1.2.4"))
        .await
        .expect("upgrade");
    let labels = fake.namespace_labels("shop-1").unwrap();
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
}

#[tokio::test]
async fn without_its_labelled_namespace_a_release_is_never_installed() {
    let fake = FakeHelm::new();
    let error = fake
        .provisioner(&[("FAKE_KUBECTL_MODE", "fail")])
        .install_or_upgrade(&spec("shop-1", "1.2.3"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
    let text = error.to_string();
    assert!(text.contains("namespace shop-1: kubectl apply"), "{text}");
    assert!(fake.argvs().is_empty(), "helm ran: {:?}", fake.argvs());
    assert_eq!(fake.namespace_labels("shop-1"), None);
    // And helm alone, without stead's namespace, creates none.
    let (ok, _, stderr) = fake.run(&[
        "upgrade",
        "--install",
        "shop-1",
        "charts/shop",
        "-n",
        "shop-1",
    ]);
    assert!(!ok && stderr.contains("not found"), "{stderr}");
}

#[tokio::test]
async fn a_version_drift_upgrade_is_atomic_and_a_failed_one_is_rolled_back_by_helm() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[("FAKE_HELM_FAIL_CHART_VERSIONS", "2.0.0")]);
    helm.install_or_upgrade(&spec("shop-1", "1.0.0"))
        .await
        .expect("install");
    let upgrade = ReleaseSpec::Helm(helm_release("shop-1", "shop-1", "2.0.0", true));
    let error = helm.install_or_upgrade(&upgrade).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error:?}");
    let text = error.to_string();
    assert!(text.contains("release shop-1 in shop-1"), "{text}");
    assert!(text.contains("rolled back"), "helm's own words: {text}");
    let argv = fake.argvs().pop().unwrap();
    assert!(argv.contains(&"--atomic".to_owned()), "{argv:?}");
    assert!(
        argv.windows(2).any(|w| w == ["--version", "2.0.0"]),
        "{argv:?}"
    );
    // Helm rolled back: the release serves the old chart again.
    let status = helm
        .status(&target("shop-1", "shop-1"))
        .await
        .unwrap()
        .expect("the release exists");
    assert_eq!(status.status, "deployed");
    assert!(status.chart.ends_with("-1.0.0"), "{status:?}");
}

/// #40, `rollout undo --to` of a Helm type: `helm rollback` to the newest
/// revision at the pinned chart version, which brings that revision's
/// values back too (not today's); a release already there is left alone;
/// a version its history no longer has is reached by an upgrade.
#[tokio::test]
async fn a_roll_back_goes_to_the_newest_revision_at_the_version_with_its_values() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[]);
    helm.install_or_upgrade(&spec("shop-1", "1.0.0"))
        .await
        .expect("install");
    let mut bad = helm_release("shop-1", "shop-1", "2.0.0", true);
    bad.values = json!({"host": "shop-1.example.org", "replicas": 9});
    helm.install_or_upgrade(&ReleaseSpec::Helm(bad))
        .await
        .expect("upgrade");

    let mut back = helm_release("shop-1", "shop-1", "1.0.0", true);
    back.values = json!({"rendered": "today"});
    helm.roll_back(&back).await.expect("roll back");
    assert_eq!(
        fake.argvs().pop().unwrap(),
        strings(&[
            "rollback",
            "shop-1",
            "1",
            "--namespace",
            "shop-1",
            "--wait",
            "--timeout",
            "5s"
        ])
    );
    let (ok, stdout, stderr) = fake.run(&["status", "shop-1", "-n", "shop-1", "-o", "json"]);
    assert!(ok, "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["version"], 3, "a new revision: {status}");
    assert_eq!(status["info"]["status"], "deployed");
    assert_eq!(
        status["config"]["replicas"], 2,
        "revision 1's values: {status}"
    );

    let calls = fake.argvs().len();
    helm.roll_back(&back).await.expect("again");
    assert_eq!(
        fake.argvs().len(),
        calls + 1,
        "only the history was read: {:?}",
        fake.argvs()
    );

    let never = helm_release("shop-1", "shop-1", "0.9.0", true);
    helm.roll_back(&never).await.expect("upgraded to it");
    let argv = fake.argvs().pop().unwrap();
    assert_eq!(argv[0], "upgrade", "{argv:?}");
    assert!(
        argv.windows(2).any(|w| w == ["--version", "0.9.0"]),
        "{argv:?}"
    );
}

#[tokio::test]
async fn listing_sees_every_release_in_every_state_past_helms_default_cap() {
    let fake = FakeHelm::new();
    let states = [
        "deployed",
        "failed",
        "pending-install",
        "pending-upgrade",
        "uninstalling",
    ];
    let seeded: Vec<Value> = (0..300)
        .map(|n| {
            json!({
                "name": format!("app-{n:03}"),
                "namespace": format!("ns-{}", n % 7),
                "status": states[n % states.len()],
                "chart_version": "1.0.0",
                "revision": 1,
            })
        })
        .collect();
    fake.seed(seeded);
    // The fake is faithful to helm's defaults: 256 at most, only deployed
    // and failed ones.
    let (ok, stdout, _) = fake.run(&["list", "-A", "-o", "json"]);
    assert!(ok);
    let default: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    assert!(default.len() < 300, "helm's default listing is partial");
    let (_, stdout, _) = fake.run(&["list", "-A", "--all", "-o", "json"]);
    let capped: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(capped.len(), 256, "helm's default --max");

    let helm = fake.provisioner(&[]);
    let releases = helm.list_releases().await.expect("list");
    assert_eq!(releases.len(), 300, "every release, every state, no cap");
    assert!(releases.contains(&Release {
        name: "app-002".into(),
        namespace: "ns-2".into(),
    }));
    assert_eq!(
        fake.argvs(),
        [strings(&[
            "list",
            "--all",
            "--all-namespaces",
            "--max",
            "0",
            "-o",
            "json"
        ])]
    );
}

#[tokio::test]
async fn uninstall_removes_and_only_helms_release_not_found_counts_as_done() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[]);
    helm.install_or_upgrade(&spec("shop-1", "1.0.0"))
        .await
        .unwrap();
    helm.install_or_upgrade(&spec("blog-1", "1.0.0"))
        .await
        .unwrap();
    helm.uninstall(&target("shop-1", "shop-1"))
        .await
        .expect("uninstall");
    assert_eq!(
        helm.list_releases().await.unwrap(),
        [Release {
            name: "blog-1".into(),
            namespace: "blog-1".into(),
        }]
    );
    helm.uninstall(&target("shop-1", "shop-1"))
        .await
        .expect("a release helm no longer knows is uninstalled already");
    assert!(fake.argvs().contains(&strings(&[
        "uninstall",
        "shop-1",
        "--namespace",
        "shop-1",
        "--wait",
        "--timeout",
        "5s",
    ])));

    // Other failures that merely say "not found" are errors naming the
    // release: the release may well live on.
    let script = fake.dir.path().join("helm-missing-plugin");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'Error: uninstall: failed to delete release: namespaces \"blog-1\" not found' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let odd = HelmProvisioner::new(HelmConfig {
        helm_path: script,
        ..fake.config(&[])
    })
    .unwrap();
    let error = odd
        .uninstall(&target("blog-1", "blog-1"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error:?}");
    assert!(
        error.to_string().contains("release blog-1 in blog-1"),
        "{error}"
    );
}

#[tokio::test]
async fn status_reports_helms_word_or_none_for_an_unknown_release() {
    let fake = FakeHelm::new();
    fake.seed(vec![json!({
        "name": "shop-1", "namespace": "shop-1", "status": "pending-upgrade",
        "chart_version": "1.1.0", "revision": 3,
    })]);
    let helm = fake.provisioner(&[]);
    let status = helm
        .status(&target("shop-1", "shop-1"))
        .await
        .unwrap()
        .expect("known");
    assert_eq!(
        (status.status.as_str(), status.revision),
        ("pending-upgrade", 3)
    );
    assert!(status.chart.ends_with("-1.1.0"), "{status:?}");
    assert_eq!(helm.status(&target("nope", "nope")).await.unwrap(), None);
}

/// A bake's check (#40): `deployed` and passing chart tests are healthy;
/// another status or a failed test is a verdict (bad); a cluster that
/// cannot be reached is an error, not a verdict. `roll_back_previous` goes
/// to the newest revision at another chart version.
#[tokio::test]
async fn a_bake_checks_status_and_tests_and_rolls_back_away_from_the_bad_chart() {
    let fake = FakeHelm::new();
    fake.seed(vec![
        json!({"name": "good", "namespace": "good", "chart_version": "2.0.0", "revision": 2,
               "history": [{"revision": 1, "status": "superseded", "chart_version": "1.0.0"}]}),
        json!({"name": "stuck", "namespace": "stuck", "status": "pending-upgrade",
               "chart_version": "2.0.0", "revision": 2}),
        json!({"name": "bad", "namespace": "bad", "chart_version": "3.0.0", "revision": 2,
               "history": [{"revision": 1, "status": "superseded", "chart_version": "1.0.0"}]}),
    ]);
    let helm = fake.provisioner(&[("FAKE_HELM_FAIL_TEST_CHART_VERSIONS", "3.0.0")]);
    let check = |name: &'static str, tests: bool| {
        let helm = &helm;
        async move { helm.check_release(&target(name, name), tests).await }
    };
    assert_eq!(check("good", false).await.unwrap(), ReleaseHealth::Healthy);
    assert_eq!(check("good", true).await.unwrap(), ReleaseHealth::Healthy);
    assert!(
        matches!(check("stuck", false).await.unwrap(),
            ReleaseHealth::Bad(why) if why.contains("pending-upgrade")),
        "a release not deployed is bad"
    );
    // Its status is deployed: only the chart's test finds it bad.
    assert_eq!(check("bad", false).await.unwrap(), ReleaseHealth::Healthy);
    assert!(
        matches!(check("bad", true).await.unwrap(),
            ReleaseHealth::Bad(why) if why.contains("bad-test failed")),
        "a failed chart test is bad"
    );
    assert!(matches!(
        check("nope", false).await.unwrap(),
        ReleaseHealth::Bad(why) if why.contains("gone")
    ));
    let test_call = fake
        .argvs()
        .into_iter()
        .find(|a| a.first().is_some_and(|c| c == "test"))
        .expect("helm test ran");
    assert_eq!(test_call[1], "good", "{test_call:?}");
    assert!(
        test_call.contains(&"--namespace".to_owned()),
        "{test_call:?}"
    );

    helm.roll_back_from(&target("bad", "bad"), "3.0.0", None)
        .await
        .unwrap();
    let status = helm
        .status(&target("bad", "bad"))
        .await
        .unwrap()
        .expect("known");
    assert_eq!((status.status.as_str(), status.revision), ("deployed", 3));
    assert!(
        status.chart.ends_with("-1.0.0"),
        "back at chart 1: {status:?}"
    );
    let rollback = fake
        .argvs()
        .into_iter()
        .find(|a| a.first().is_some_and(|c| c == "rollback"))
        .expect("helm rollback ran");
    assert_eq!(
        rollback[..3],
        ["rollback", "bad", "1"],
        "to revision 1, at chart 1: {rollback:?}"
    );

    // A cluster that cannot be reached gives no verdict.
    let unreachable = fake.provisioner(&[("FAKE_HELM_MODE", "fail")]);
    let error = unreachable
        .check_release(&target("good", "good"), true)
        .await
        .expect_err("no verdict");
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
}

#[tokio::test]
async fn helm_gets_a_clean_environment() {
    let fake = FakeHelm::new();
    // Some variable of this test process that helm must not see (the
    // daemon's would include its database password).
    let (private, _) = std::env::vars()
        .find(|(k, _)| {
            !matches!(k.as_str(), "PATH" | "HOME" | "KUBECONFIG") && !k.starts_with("HELM_")
        })
        .expect("the test process has some variable");
    let helm = fake.provisioner(&[]);
    helm.list_releases().await.unwrap();
    let (_, env) = fake.calls().pop().unwrap();
    assert!(!env.contains(&private), "{private} leaked to helm: {env:?}");
    assert!(env.contains(&"PATH".to_owned()), "{env:?}");
    assert!(
        env.contains(&"FAKE_HELM_STATE".to_owned()),
        "configured values pass"
    );
    for name in &env {
        let allowed = [
            "PATH",
            "HOME",
            "KUBECONFIG",
            "FAKE_HELM_STATE",
            "FAKE_HELM_LOG",
        ]
        .contains(&name.as_str())
            || name.starts_with("HELM_");
        // Python itself may add nothing; whatever arrives was allowed.
        assert!(allowed, "{name} reached helm: {env:?}");
    }
    // A name the config passes does reach it.
    let passing = HelmProvisioner::new(HelmConfig {
        pass_env: vec![private.clone()],
        ..fake.config(&[])
    })
    .unwrap();
    passing.list_releases().await.unwrap();
    let (_, env) = fake.calls().pop().unwrap();
    assert!(env.contains(&private), "{env:?}");
}

#[tokio::test]
async fn a_hung_helm_is_killed_at_the_call_timeout() {
    let fake = FakeHelm::new();
    let config = HelmConfig {
        wait_timeout: Duration::from_millis(100),
        kill_margin: Duration::from_millis(400),
        ..fake.config(&[("FAKE_HELM_MODE", "sleep")])
    };
    let helm = HelmProvisioner::new(config).unwrap();
    let began = Instant::now();
    let error = helm
        .install_or_upgrade(&spec("shop-1", "1.0.0"))
        .await
        .unwrap_err();
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "killed, not waited for"
    );
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
    assert!(
        error.to_string().contains("killed after the call timeout"),
        "{error}"
    );
}

#[tokio::test]
async fn malformed_output_is_a_clear_error() {
    let fake = FakeHelm::new();
    let error = fake
        .provisioner(&[("FAKE_HELM_MODE", "garbage")])
        .list_releases()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error:?}");
    assert!(error.to_string().contains("helm list -o json"), "{error}");
    assert!(
        error.to_string().contains("this is not json"),
        "quoted: {error}"
    );
    let error = stead::adapters::helm::parse_status("{\"info\": 3}").unwrap_err();
    assert!(error.to_string().contains("helm status -o json"), "{error}");
}

#[tokio::test]
async fn a_failing_helm_reports_its_exit_and_stderr() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[("FAKE_HELM_MODE", "fail")]);
    let t = target("shop-1", "shop-1");
    for error in [
        helm.install_or_upgrade(&spec("shop-1", "1.0.0"))
            .await
            .unwrap_err(),
        helm.uninstall(&t).await.unwrap_err(),
        helm.list_releases().await.unwrap_err(),
        helm.status(&t).await.unwrap_err(),
    ] {
        // Helm (or, for an install, kubectl making the namespace first)
        // ran and failed, but only because the cluster was out of reach:
        // a failure that passes, so the task is retried (issue #45).
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
        let text = error.to_string();
        assert!(text.contains("exit status: 1"), "{error}");
        assert!(
            text.contains("cluster unreachable")
                || text.contains("Unable to connect to the server"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn bad_names_never_reach_helm() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner(&[]);
    let cases = [
        (
            helm_release("--dry-run", "a", "1.0.0", false),
            "release = \"--dry-run\"",
        ),
        (
            helm_release("shop-1", "a", "--devel", false),
            "chart_version = \"--devel\"",
        ),
        (
            helm_release("shop-1", "Not Valid", "1.0.0", false),
            "namespace = \"Not Valid\"",
        ),
        (
            HelmRelease {
                chart: "--post-renderer=x".into(),
                ..helm_release("shop-1", "a", "1.0.0", false)
            },
            "chart = \"--post-renderer=x\"",
        ),
    ];
    for (release, expect) in cases {
        let error = helm
            .install_or_upgrade(&ReleaseSpec::Helm(release))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Refused, "{error:?}");
        assert!(error.to_string().contains(expect), "{error}");
    }
    let docker = ReleaseSpec::Docker {
        name: "shop-1".into(),
    };
    let error = helm.install_or_upgrade(&docker).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Refused, "{error:?}");
    assert!(fake.calls().is_empty(), "helm never ran");
}

#[tokio::test]
async fn a_missing_helm_binary_is_a_clear_error() {
    let fake = FakeHelm::new();
    let config = HelmConfig {
        helm_path: fake.dir.path().join("no-such-helm"),
        ..fake.config(&[])
    };
    let error = HelmProvisioner::new(config)
        .unwrap()
        .list_releases()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
    assert!(error.to_string().contains("cannot run"), "{error}");
    assert!(error.to_string().contains("no-such-helm"), "{error}");
}

#[tokio::test]
async fn an_oversized_helm_output_is_refused_naming_the_command_and_the_bound() {
    use stead::adapters::helm::HELM_STDOUT_LEN_MAX;
    let fake = FakeHelm::new();
    // A helm (or something posing as it) that prints more than stead reads.
    let script = fake.dir.path().join("helm-chatty");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec head -c {} /dev/zero\n",
            HELM_STDOUT_LEN_MAX + 1024 * 1024
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let helm = HelmProvisioner::new(HelmConfig {
        helm_path: script,
        ..fake.config(&[])
    })
    .unwrap();
    let error = helm.list_releases().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "provisioner: list of releases: helm list: standard output: is larger than \
             {HELM_STDOUT_LEN_MAX} bytes, the most stead reads from helm; helm was killed"
        )
    );
}
