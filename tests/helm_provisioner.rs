//! The Helm provisioner against `tests/fixtures/fake-helm`, a stand-in that
//! records its arguments and answers like helm (helm is not installable here).

// The timeout test measures how long a kill took.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stead::adapters::helm::{HelmConfig, HelmProvisioner};
use stead::ports::{ErrorKind, PortFailure, Provisioner, Release};

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
        self.dir.path().join("argv.log")
    }

    fn config(&self, mode: &str) -> HelmConfig {
        let helm = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-helm");
        HelmConfig {
            helm_path: helm,
            chart: "stead-charts/app".to_owned(),
            namespace: "tenants".to_owned(),
            wait_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            env: vec![
                (
                    "FAKE_HELM_LOG".to_owned(),
                    self.log_path().display().to_string(),
                ),
                (
                    "FAKE_HELM_STATE".to_owned(),
                    self.dir.path().join("state").display().to_string(),
                ),
                ("FAKE_HELM_MODE".to_owned(), mode.to_owned()),
            ],
        }
    }

    fn provisioner(&self, mode: &str) -> HelmProvisioner {
        HelmProvisioner::new(self.config(mode)).expect("valid config")
    }

    /// Every recorded call, each as its argument vector.
    fn calls(&self) -> Vec<Vec<String>> {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let mut calls = Vec::new();
        let mut current = Vec::new();
        for line in log.lines() {
            if line == "--end--" {
                calls.push(std::mem::take(&mut current));
            } else {
                current.push(line.to_owned());
            }
        }
        calls
    }
}

fn release(name: &str) -> Release {
    Release {
        name: name.to_owned(),
        namespace: "tenants".to_owned(),
    }
}

#[tokio::test]
async fn install_or_upgrade_runs_helm_with_an_argument_vector() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner("ok");
    helm.install_or_upgrade("shop", "1.2.3")
        .await
        .expect("install");
    assert_eq!(
        fake.calls(),
        [[
            "upgrade",
            "--install",
            "shop",
            "stead-charts/app",
            "--version",
            "1.2.3",
            "--namespace",
            "tenants",
            "--wait",
            "--timeout",
            "5s"
        ]
        .map(str::to_owned)
        .to_vec()]
    );
}

#[tokio::test]
async fn list_reports_installed_releases_and_uninstall_removes_them() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner("ok");
    assert_eq!(helm.list_releases().await.expect("list"), Vec::new());
    helm.install_or_upgrade("shop", "1.0.0").await.unwrap();
    helm.install_or_upgrade("blog", "2.0.0").await.unwrap();
    helm.install_or_upgrade("shop", "1.1.0").await.unwrap();
    assert_eq!(
        helm.list_releases().await.unwrap(),
        [release("blog"), release("shop")]
    );

    helm.uninstall("shop").await.expect("uninstall");
    assert_eq!(helm.list_releases().await.unwrap(), [release("blog")]);
    helm.uninstall("shop")
        .await
        .expect("uninstalling a release helm does not know is done already");

    let calls = fake.calls();
    let list = ["list", "-o", "json", "--all-namespaces"].map(str::to_owned);
    assert_eq!(calls[0], list);
    let uninstall = [
        "uninstall",
        "shop",
        "--namespace",
        "tenants",
        "--wait",
        "--timeout",
        "5s",
    ]
    .map(str::to_owned);
    assert!(calls.contains(&uninstall.to_vec()), "{calls:?}");
}

#[tokio::test]
async fn a_hung_helm_is_killed_at_the_call_timeout() {
    let fake = FakeHelm::new();
    let config = HelmConfig {
        wait_timeout: Duration::from_millis(100),
        call_timeout: Duration::from_millis(500),
        ..fake.config("sleep")
    };
    let helm = HelmProvisioner::new(config).unwrap();
    let began = Instant::now();
    let error = helm.install_or_upgrade("shop", "1.0.0").await.unwrap_err();
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "killed, not waited for"
    );
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}");
    assert!(
        error.to_string().contains("killed after the call timeout"),
        "{error}"
    );
    assert_eq!(fake.calls().len(), 1, "the process did start");
}

#[tokio::test]
async fn malformed_list_output_is_a_clear_error() {
    let fake = FakeHelm::new();
    let error = fake
        .provisioner("garbage")
        .list_releases()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error:?}");
    assert!(error.to_string().contains("helm list -o json"), "{error}");
    assert!(
        error.to_string().contains("this is not json"),
        "the output is quoted: {error}"
    );
}

#[tokio::test]
async fn a_failing_helm_reports_its_exit_and_stderr() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner("fail");
    for error in [
        helm.install_or_upgrade("shop", "1.0.0").await.unwrap_err(),
        helm.uninstall("shop").await.unwrap_err(),
        helm.list_releases().await.unwrap_err(),
    ] {
        assert_eq!(error.kind(), ErrorKind::Failed, "{error:?}");
        assert!(error.to_string().contains("exit status: 1"), "{error}");
        assert!(error.to_string().contains("cluster unreachable"), "{error}");
    }
}

#[tokio::test]
async fn bad_names_never_reach_helm() {
    let fake = FakeHelm::new();
    let helm = fake.provisioner("ok");
    let error = helm
        .install_or_upgrade("--dry-run", "1.0.0")
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Refused, "{error:?}");
    assert!(
        error.to_string().contains("release = \"--dry-run\""),
        "{error}"
    );
    let error = helm
        .install_or_upgrade("shop", "--devel")
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("version = \"--devel\""),
        "{error}"
    );
    assert!(fake.calls().is_empty(), "helm never ran");
}

#[tokio::test]
async fn config_is_validated_naming_the_field() {
    let fake = FakeHelm::new();
    let short = HelmConfig {
        call_timeout: Duration::from_secs(1),
        ..fake.config("ok")
    };
    let error = HelmProvisioner::new(short).unwrap_err();
    assert!(error.to_string().contains("call_timeout"), "{error}");
    let bad = HelmConfig {
        namespace: "Not Valid".to_owned(),
        ..fake.config("ok")
    };
    let error = HelmProvisioner::new(bad).unwrap_err();
    assert!(
        error.to_string().contains("namespace = \"Not Valid\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_missing_helm_binary_is_a_clear_error() {
    let fake = FakeHelm::new();
    let config = HelmConfig {
        helm_path: fake.dir.path().join("no-such-helm"),
        ..fake.config("ok")
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
