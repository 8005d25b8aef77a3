//! Helm: the release half of the `Provisioner` port, over the `helm` CLI,
//! for the service types whose catalog entry says `provisioner = "helm"`.
//!
//! Helm runs as a subprocess with an argument vector, never through a shell,
//! with a clean environment (`PATH`, `HOME`, `KUBECONFIG`, `HELM_*` and the
//! names the config passes, nothing else of the daemon's: the database
//! password stays in the daemon), every call has a timeout after which
//! the process is killed, and its output a bound ([`HELM_STDOUT_LEN_MAX`])
//! past which it is killed too. Release names, chart, namespace and version are
//! checked before they reach helm's command line, so no value can pose as a
//! flag; values go to helm on its standard input, never on disk.
//!
//! Helm's own `--create-namespace` makes a namespace without labels, in
//! which Kubernetes' Pod Security Admission enforces nothing. So stead
//! makes the namespace itself, with `kubectl apply` of a `Namespace`
//! carrying the `pod-security.kubernetes.io/*` labels of the operator's
//! `[grants] helm_pod_security` (`restricted` unless granted otherwise),
//! under the same rules as helm (argument vector, clean environment,
//! timeout, bounded output), and then installs without
//! `--create-namespace`: if the labelled namespace could not be made,
//! helm finds none and nothing is installed. An existing namespace is
//! labelled the same way before each install or upgrade.
//!
//! | port call | helm command |
//! | --- | --- |
//! | `install_or_upgrade` | `kubectl apply -f -` (the namespace with its Pod Security labels), then `helm upgrade --install <release> <chart> --version <v> --namespace <ns> --wait --timeout <t> [--atomic] --values -` |
//! | `uninstall` | `helm uninstall <release> --namespace <ns> --wait --timeout <t>` (only helm's own "release: not found" counts as uninstalled) |
//! | `list_releases` | `helm list --all --all-namespaces --max 0 -o json` (every state, no cap) |
//! | `status` | `helm status <release> --namespace <ns> -o json`, then `helm get metadata` for the chart |

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::core::grants::PodSecurity;
use crate::core::names;
use crate::core::policy::HELM_KILL_MARGIN;
use crate::ports::{
    HelmRelease, ProvisionError, Provisioner, Release, ReleaseHealth, ReleaseKind, ReleaseSpec,
    ReleaseStatus, ReleaseTarget,
};

/// Helm's own limit on release names.
pub const RELEASE_NAME_LEN_MAX: usize = names::INSTANCE_NAME_LEN_MAX;

/// The most of helm's standard output stead reads from one call. The
/// largest is `helm list -o json` over every release, a few hundred bytes
/// each, so this holds over 100,000 releases; a helm that says more is
/// killed and the call fails naming the command and the bound.
pub const HELM_STDOUT_LEN_MAX: usize = 32 * 1024 * 1024;
/// The most of helm's standard error kept (it is only quoted and searched
/// for helm's own "not found" and the words of a failure that passes,
/// `HELM_PASSING_MARKERS`); the rest is read and dropped, so helm
/// never blocks on a full pipe.
pub const HELM_STDERR_LEN_MAX: usize = 1024 * 1024;

/// Upper bound on the bytes of helm's output quoted in an error.
const OUTPUT_EXCERPT_LEN_MAX: usize = 400;

/// What helm's storage says when it has no such release, and the only
/// failure of `uninstall` that means the work is already done. ("not
/// found" alone also ends messages about a missing namespace, plugin or
/// kubeconfig, which mean nothing of the kind.)
const RELEASE_NOT_FOUND: &str = "release: not found";

/// The daemon's environment variables helm always receives (besides
/// every `HELM_*`): enough to find its binary, its config and the cluster.
pub const ENV_ALWAYS: [&str; 3] = ["PATH", "HOME", "KUBECONFIG"];

/// How to run helm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmConfig {
    /// The `helm` binary (a name looked up on `PATH`, or a path).
    pub helm_path: PathBuf,
    /// Helm's own `--timeout` for `--wait`.
    pub wait_timeout: Duration,
    /// How long past `wait_timeout` helm may run before it is killed
    /// ([`HELM_KILL_MARGIN`]; shorter only in tests).
    pub kill_margin: Duration,
    /// Names of further daemon environment variables helm receives.
    pub pass_env: Vec<String>,
    /// Variables set for helm with these values (after the passed ones).
    pub env: Vec<(String, String)>,
    /// The `kubectl` that makes a release's namespace, with the same
    /// environment as helm.
    pub kubectl_path: PathBuf,
    /// The Pod Security Standard every release's namespace enforces.
    pub pod_security: PodSecurity,
}

impl Default for HelmConfig {
    fn default() -> Self {
        Self {
            helm_path: PathBuf::from("helm"),
            wait_timeout: Duration::from_secs(300),
            kill_margin: HELM_KILL_MARGIN,
            pass_env: Vec::new(),
            env: Vec::new(),
            kubectl_path: PathBuf::from("kubectl"),
            pod_security: PodSecurity::default(),
        }
    }
}

impl HelmConfig {
    /// Bound on one helm process: its wait plus the margin helm needs to
    /// report a timed-out wait. It is killed past it.
    pub fn call_timeout(&self) -> Duration {
        self.wait_timeout + self.kill_margin
    }

    /// Whether the daemon's variable `name` is passed to helm.
    pub fn passes(&self, name: &str) -> bool {
        ENV_ALWAYS.contains(&name)
            || name.starts_with("HELM_")
            || self.pass_env.iter().any(|n| n == name)
    }
}

/// The Helm releases of the `Provisioner` port.
#[derive(Clone, Debug)]
pub struct HelmProvisioner {
    config: HelmConfig,
}

/// One row of `helm list -o json`; the other fields are not needed.
#[derive(Deserialize)]
struct ListedRelease {
    name: String,
    namespace: String,
}

/// What stead reads of `helm status -o json`.
#[derive(Deserialize)]
struct StatusOutput {
    info: StatusInfo,
    #[serde(default)]
    version: u64,
    chart: Option<StatusChart>,
}

/// One revision of `helm history -o json`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Revision {
    pub revision: u64,
    pub status: String,
    /// The chart and its version, as `search-1.2.3`.
    pub chart: String,
}

/// Parses `helm history -o json`.
pub fn parse_history(stdout: &str) -> Result<Vec<Revision>, ProvisionError> {
    serde_json::from_str(stdout.trim()).map_err(|e| {
        ProvisionError::Failed(format!(
            "helm history -o json: output is not a list of revisions with revision, status \
             and chart ({e}): {:?}",
            excerpt(stdout)
        ))
    })
}

/// Where a roll back to a chart version goes, by the release's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RollBack {
    /// The newest revision is that version, deployed: nothing to do.
    Already,
    /// The newest revision that ran that version (deployed or superseded,
    /// never a failed or pending one).
    To(u64),
    /// The history has no such revision (pruned, or never installed).
    NotInHistory,
}

impl RollBack {
    pub fn of(history: &[Revision], chart_version: &str) -> RollBack {
        let suffix = format!("-{chart_version}");
        let at_version = |r: &&Revision| r.chart.ends_with(&suffix);
        let newest = history.iter().max_by_key(|r| r.revision);
        if newest.is_some_and(|r| at_version(&r) && r.status == "deployed") {
            return RollBack::Already;
        }
        history
            .iter()
            .filter(at_version)
            .filter(|r| matches!(r.status.as_str(), "deployed" | "superseded"))
            .map(|r| r.revision)
            .max()
            .map_or(RollBack::NotInHistory, RollBack::To)
    }
}

/// The revision a bake's revert goes back to, away from the chart version
/// that went bad: the newest revision that ran another chart version
/// (deployed or superseded). Not simply the previous revision: a retried
/// upgrade installs the bad version again, so the one before the newest
/// may be bad too. `None` when the history has none (a spec change at the
/// same chart version): then the previous revision.
pub fn revision_away_from(history: &[Revision], bad_chart_version: &str) -> Option<u64> {
    let suffix = format!("-{bad_chart_version}");
    history
        .iter()
        .filter(|r| !r.chart.ends_with(&suffix))
        .filter(|r| matches!(r.status.as_str(), "deployed" | "superseded"))
        .map(|r| r.revision)
        .max()
}

/// What stead reads of `helm get metadata -o json`.
#[derive(Deserialize)]
struct MetadataOutput {
    chart: String,
    version: String,
}

#[derive(Deserialize)]
struct StatusInfo {
    status: String,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct StatusChart {
    metadata: ChartMetadata,
}

#[derive(Deserialize)]
struct ChartMetadata {
    name: String,
    #[serde(default)]
    version: String,
}

/// What a history read makes of a release helm does not know.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    NoHistory,
    Error,
}

impl HelmProvisioner {
    /// Validates the config: errors name the field and the value.
    pub fn new(config: HelmConfig) -> Result<Self, ProvisionError> {
        if config.wait_timeout.is_zero() {
            return Err(ProvisionError::Refused(
                "helm wait_timeout = 0s: helm would not wait for the release at all".into(),
            ));
        }
        Ok(Self { config })
    }

    pub fn config(&self) -> &HelmConfig {
        &self.config
    }

    /// Helm's `--timeout` as a Go duration, in whole seconds rounded up.
    /// `helm status -o json` of `release`; `None` when helm's storage has
    /// no such release. Shared by `stead status` and a bake's check.
    async fn release_status(
        &self,
        release: &Release,
    ) -> Result<Option<ReleaseStatus>, ProvisionError> {
        let args = [
            "status",
            &release.name,
            "--namespace",
            &release.namespace,
            "-o",
            "json",
        ];
        match self.run(&args, None).await {
            Ok(stdout) => parse_status(&stdout).map(Some),
            Err(HelmFailure::Exit { stderr, .. }) if stderr.contains(RELEASE_NOT_FOUND) => Ok(None),
            Err(failure) => Err(failure.into_error(&format!(
                "status of release {} in {}",
                release.name, release.namespace
            ))),
        }
    }

    /// `helm history -o json` of `release`: its revisions; a release
    /// helm does not know is an error, or no history (`missing`).
    async fn history(
        &self,
        name: &str,
        namespace: &str,
        missing: Missing,
    ) -> Result<Vec<Revision>, ProvisionError> {
        let args = ["history", name, "--namespace", namespace, "-o", "json"];
        match self.run(&args, None).await {
            Ok(stdout) => parse_history(&stdout),
            Err(HelmFailure::Exit { stderr, .. })
                if missing == Missing::NoHistory && stderr.contains(RELEASE_NOT_FOUND) =>
            {
                Ok(Vec::new())
            }
            Err(failure) => {
                Err(failure.into_error(&format!("history of release {name} in {namespace}")))
            }
        }
    }

    fn wait_timeout_arg(&self) -> String {
        let t = self.config.wait_timeout;
        format!("{}s", t.as_secs() + u64::from(t.subsec_nanos() > 0))
    }

    /// The environment helm runs with: the allowed part of the daemon's,
    /// then the configured values.
    fn environment(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(name, _)| name.to_str().is_some_and(|n| self.config.passes(n)))
            .collect();
        env.extend(
            self.config
                .env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        env
    }

    /// Runs helm with `args`, `stdin` on its standard input; `Ok(stdout)`
    /// on exit 0, else an error with the exit status and an excerpt of
    /// stderr. Killed past the call timeout.
    async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<String, HelmFailure> {
        self.run_program(Program::Helm, args, stdin).await
    }

    /// Runs `program` as [`HelmProvisioner::run`] runs helm.
    async fn run_program(
        &self,
        program: Program,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, HelmFailure> {
        let (path, name) = match program {
            Program::Helm => (&self.config.helm_path, "helm"),
            Program::Kubectl => (&self.config.kubectl_path, "kubectl"),
        };
        let mut command = Command::new(path);
        command
            .args(args)
            .env_clear()
            .envs(self.environment())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropping the future on timeout kills the process.
            .kill_on_drop(true);
        let what = format!("{name} {}", args.first().copied().unwrap_or_default());
        let mut child = command
            .spawn()
            .map_err(|e| HelmFailure::Other(format!("{what}: cannot run {path:?}: {e}")))?;
        let limit = self.config.call_timeout();
        let (stdout_pipe, stderr_pipe) = match (child.stdout.take(), child.stderr.take()) {
            (Some(stdout), Some(stderr)) => (stdout, stderr),
            _ => unreachable!("both pipes are set up above"),
        };
        let output = tokio::time::timeout(limit, async {
            let write_stdin = async {
                if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                    // Dropped after writing: helm reads to the end of
                    // input. A helm that failed before reading closes the
                    // pipe; its exit status and stderr say why, so the
                    // write's error is not the story.
                    let _ = pipe.write_all(input).await;
                }
                Ok::<(), HelmFailure>(())
            };
            let read_stdout = async {
                read_at_most(stdout_pipe, HELM_STDOUT_LEN_MAX)
                    .await
                    .map_err(|e| HelmFailure::Other(format!("{what}: standard output: {e}")))
            };
            let read_stderr = async {
                read_keeping(stderr_pipe, HELM_STDERR_LEN_MAX)
                    .await
                    .map_err(|e| HelmFailure::Other(format!("{what}: standard error: {e}")))
            };
            // The first failure (an output over its bound) ends the call;
            // `child` is then dropped, which kills helm.
            let ((), stdout, stderr) = tokio::try_join!(write_stdin, read_stdout, read_stderr)?;
            let status = child
                .wait()
                .await
                .map_err(|e| HelmFailure::Other(format!("{what}: {e}")))?;
            Ok::<_, HelmFailure>((status, stdout, stderr))
        })
        .await
        .map_err(|_| {
            HelmFailure::Other(format!(
                "{what}: killed after the call timeout of {limit:?} (helm's wait of {:?} plus {:?})",
                self.config.wait_timeout, self.config.kill_margin
            ))
        })?;
        let (status, stdout, stderr) = output?;
        let stdout = String::from_utf8_lossy(&stdout).into_owned();
        if status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&stderr);
        Err(HelmFailure::Exit {
            stderr: stderr.to_string(),
            message: format!("{what}: {status}: {}", excerpt(&stderr)),
        })
    }

    /// `kubectl apply` of `namespace` with the Pod Security labels of
    /// the configured level: made if missing, labelled if not.
    async fn apply_namespace(&self, namespace: &str) -> Result<(), ProvisionError> {
        check_dns_label("namespace", namespace)?;
        let manifest = namespace_manifest(namespace, self.config.pod_security);
        self.run_program(Program::Kubectl, &["apply", "-f", "-"], Some(&manifest))
            .await
            .map(drop)
            .map_err(|f| f.into_error(&format!("namespace {namespace}")))
    }

    async fn upgrade(&self, release: &HelmRelease) -> Result<(), ProvisionError> {
        check_release(&release.name)?;
        check_dns_label("namespace", &release.namespace)?;
        check_arg("chart", &release.chart)?;
        check_arg("chart_version", &release.chart_version)?;
        self.apply_namespace(&release.namespace).await?;
        let timeout = self.wait_timeout_arg();
        let mut args = vec![
            "upgrade",
            "--install",
            &release.name,
            &release.chart,
            "--version",
            &release.chart_version,
            "--namespace",
            &release.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ];
        if release.atomic {
            args.push("--atomic");
        }
        args.extend(["--values", "-"]);
        let values = serde_json::to_vec(&release.values).map_err(|e| {
            ProvisionError::Refused(format!("values of release {}: {e}", release.name))
        })?;
        self.run(&args, Some(&values)).await.map(drop).map_err(|f| {
            f.into_error(&format!(
                "release {} in {}",
                release.name, release.namespace
            ))
        })
    }
}

/// Which program a call runs.
#[derive(Clone, Copy, Debug)]
enum Program {
    Helm,
    Kubectl,
}

/// The `Namespace` stead applies before installing into it: its name and
/// the Pod Security labels of `level`, as JSON (which `kubectl apply`
/// reads as it reads YAML).
pub fn namespace_manifest(namespace: &str, level: PodSecurity) -> Vec<u8> {
    let labels: serde_json::Map<String, serde_json::Value> = level
        .namespace_labels()
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.into()))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": namespace, "labels": labels },
    }))
    .expect("a map of strings serialises")
}

/// Why a helm output pipe could not be read.
#[derive(Debug, thiserror::Error)]
enum PipeError {
    #[error("is larger than {len_max} bytes, the most stead reads from helm; helm was killed")]
    TooLarge { len_max: usize },
    #[error("cannot read: {0}")]
    Read(#[from] std::io::Error),
}

/// Reads `pipe` to its end, failing as soon as it holds more than
/// `len_max` bytes.
async fn read_at_most(pipe: impl AsyncRead + Unpin, len_max: usize) -> Result<Vec<u8>, PipeError> {
    let mut bytes = Vec::new();
    pipe.take(len_max as u64 + 1)
        .read_to_end(&mut bytes)
        .await?;
    if bytes.len() > len_max {
        return Err(PipeError::TooLarge { len_max });
    }
    Ok(bytes)
}

/// Reads `pipe` to its end, keeping its first `len_max` bytes.
async fn read_keeping(
    mut pipe: impl AsyncRead + Unpin,
    len_max: usize,
) -> Result<Vec<u8>, PipeError> {
    let mut bytes = Vec::new();
    (&mut pipe)
        .take(len_max as u64)
        .read_to_end(&mut bytes)
        .await?;
    tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await?;
    Ok(bytes)
}

/// How a helm call failed: a non-zero exit (with helm's stderr, which the
/// caller may interpret) or anything else.
enum HelmFailure {
    Exit { stderr: String, message: String },
    Other(String),
}

/// What helm's standard error says when it ran but could not reach the
/// cluster, or found another helm operation on the release under way:
/// failures that pass, unlike a chart or values the cluster rejected or a
/// release that never became ready, which fail the same way again.
const HELM_PASSING_MARKERS: [&str; 7] = [
    "kubernetes cluster unreachable",
    // kubectl's words for a cluster out of reach.
    "unable to connect to the server",
    "the connection to the server",
    "another operation (install/upgrade/rollback) is in progress",
    "connection refused",
    "i/o timeout",
    "tls handshake timeout",
];

impl HelmFailure {
    /// `Failed` (a permanent kind: the task fails at once) for a helm that
    /// ran and failed, `Unavailable` (retried) for one that could not run,
    /// or whose failure says the cluster or the release was busy or out of
    /// reach.
    fn into_error(self, release: &str) -> ProvisionError {
        match self {
            Self::Exit { stderr, message } => {
                let said = stderr.to_ascii_lowercase();
                let message = format!("{release}: {message}");
                if HELM_PASSING_MARKERS.iter().any(|m| said.contains(m)) {
                    ProvisionError::Unavailable(message)
                } else {
                    ProvisionError::Failed(message)
                }
            }
            Self::Other(message) => ProvisionError::Unavailable(format!("{release}: {message}")),
        }
    }
}

/// The release a target names, checked before it reaches helm's command
/// line. Only Helm releases come here (the daemon routes Docker's
/// elsewhere).
fn helm_release(target: &ReleaseTarget) -> Result<&Release, ProvisionError> {
    if target.kind == ReleaseKind::Docker {
        return Err(ProvisionError::Refused(format!(
            "release {} is a Docker release; helm does not manage it",
            target.release.name
        )));
    }
    let release = &target.release;
    check_release(&release.name)?;
    check_dns_label("namespace", &release.namespace)?;
    Ok(release)
}

#[async_trait]
impl Provisioner for HelmProvisioner {
    #[tracing::instrument(name = "helm.install_or_upgrade", level = "debug", skip_all)]
    async fn install_or_upgrade(&self, release: &ReleaseSpec) -> Result<(), ProvisionError> {
        match release {
            ReleaseSpec::Helm(helm) => self.upgrade(helm).await,
            ReleaseSpec::Docker { name } => Err(ProvisionError::Refused(format!(
                "release {name} is a Docker release; helm does not install it"
            ))),
        }
    }

    /// `helm rollback` to the newest revision at `release`'s chart
    /// version, waited for; an upgrade to it (`--atomic`) when the
    /// release's history has none (pruned by `--history-max`). A release
    /// already there is left alone.
    #[tracing::instrument(name = "helm.roll_back", level = "debug", skip_all, fields(release = %release.name))]
    async fn roll_back(&self, release: &HelmRelease) -> Result<(), ProvisionError> {
        check_release(&release.name)?;
        check_dns_label("namespace", &release.namespace)?;
        check_arg("chart_version", &release.chart_version)?;
        let subject = format!("release {} in {}", release.name, release.namespace);
        // Never installed: no history, and an upgrade installs it at the
        // version.
        let history = self
            .history(&release.name, &release.namespace, Missing::NoHistory)
            .await?;
        let revision = match RollBack::of(&history, &release.chart_version) {
            RollBack::Already => return Ok(()),
            RollBack::To(revision) => revision,
            RollBack::NotInHistory => {
                tracing::info!(
                    release = %release.name,
                    namespace = %release.namespace,
                    chart_version = %release.chart_version,
                    "no revision of this chart version in the release's history: upgrading to it"
                );
                return self.upgrade(release).await;
            }
        };
        let revision = revision.to_string();
        let timeout = self.wait_timeout_arg();
        let args = [
            "rollback",
            &release.name,
            &revision,
            "--namespace",
            &release.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ];
        self.run(&args, None)
            .await
            .map(drop)
            .map_err(|f| f.into_error(&format!("rollback of {subject} to revision {revision}")))
    }

    /// A bake's check (#40): the release must be `deployed` (anything
    /// else: another operation failed on it or still hangs), and with
    /// `tests` its chart's tests must pass (`helm test`; a chart with none
    /// passes). A helm that cannot be reached is an error, not a verdict.
    #[tracing::instrument(name = "helm.check_release", level = "debug", skip_all)]
    async fn check_release(
        &self,
        target: &ReleaseTarget,
        tests: bool,
    ) -> Result<ReleaseHealth, ProvisionError> {
        let release = helm_release(target)?;
        let subject = format!("release {} in {}", release.name, release.namespace);
        let Some(status) = self.release_status(release).await? else {
            return Ok(ReleaseHealth::Bad(format!("{subject} is gone")));
        };
        if status.status != "deployed" {
            return Ok(ReleaseHealth::Bad(format!(
                "{subject} is {} at revision {}: {}",
                status.status, status.revision, status.description
            )));
        }
        if !tests {
            return Ok(ReleaseHealth::Healthy);
        }
        let timeout = self.wait_timeout_arg();
        let test = [
            "test",
            &release.name,
            "--namespace",
            &release.namespace,
            "--timeout",
            &timeout,
        ];
        match self.run(&test, None).await {
            Ok(_) => Ok(ReleaseHealth::Healthy),
            // A test that ran and failed is a verdict; a cluster that cannot
            // be reached is not.
            Err(failure) => match failure.into_error(&format!("helm test of {subject}")) {
                ProvisionError::Failed(message) => Ok(ReleaseHealth::Bad(message)),
                other => Err(other),
            },
        }
    }

    /// Back to `back_to` (the recorded version's release): `roll_back` to
    /// its chart version, or an upgrade to it when only its values
    /// differ from the bad revision's. With no recorded version to go
    /// back to: `helm rollback` to the newest revision at another chart
    /// version than `bad_chart_version` ([`revision_away_from`]), or with
    /// no revision named (the previous one) when the history has none.
    /// Waited for.
    #[tracing::instrument(name = "helm.roll_back_from", level = "debug", skip_all)]
    async fn roll_back_from(
        &self,
        target: &ReleaseTarget,
        bad_chart_version: &str,
        back_to: Option<&HelmRelease>,
    ) -> Result<(), ProvisionError> {
        let release = helm_release(target)?;
        if let Some(back_to) = back_to {
            if back_to.name != release.name || back_to.namespace != release.namespace {
                return Err(ProvisionError::Refused(format!(
                    "the revert of release {} in {} names release {} in {}",
                    release.name, release.namespace, back_to.name, back_to.namespace
                )));
            }
            // The same chart with other values: the newest revision at
            // that chart is the bad one, so an upgrade puts the recorded
            // values back.
            if back_to.chart_version == bad_chart_version {
                return self.upgrade(back_to).await;
            }
            return self.roll_back(back_to).await;
        }
        let subject = format!("release {} in {}", release.name, release.namespace);
        let history = self
            .history(&release.name, &release.namespace, Missing::Error)
            .await?;
        let revision = revision_away_from(&history, bad_chart_version).map(|r| r.to_string());
        let timeout = self.wait_timeout_arg();
        let mut args = vec!["rollback", &release.name];
        if let Some(revision) = &revision {
            args.push(revision);
        }
        args.extend([
            "--namespace",
            &release.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ]);
        let to = revision
            .as_deref()
            .map_or("its previous revision".to_owned(), |r| {
                format!("revision {r}")
            });
        self.run(&args, None)
            .await
            .map(drop)
            .map_err(|f| f.into_error(&format!("rollback of {subject} to {to}")))
    }

    #[tracing::instrument(name = "helm.uninstall", level = "debug", skip_all)]
    async fn uninstall(&self, target: &ReleaseTarget) -> Result<(), ProvisionError> {
        let release = helm_release(target)?;
        let timeout = self.wait_timeout_arg();
        let args = [
            "uninstall",
            &release.name,
            "--namespace",
            &release.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ];
        match self.run(&args, None).await {
            Ok(_) => Ok(()),
            // Deprovisioning is idempotent: helm's own "release: not found"
            // means the work is already done.
            Err(HelmFailure::Exit { stderr, .. }) if stderr.contains(RELEASE_NOT_FOUND) => Ok(()),
            Err(failure) => Err(failure.into_error(&format!(
                "uninstall of release {} in {}",
                release.name, release.namespace
            ))),
        }
    }

    #[tracing::instrument(name = "helm.list_releases", level = "debug", skip_all)]
    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError> {
        // `--all`: pending, failed and uninstalling releases exist too (a
        // release mid-upgrade must not look missing); `--max 0`: no cap
        // (helm's default is 256).
        let stdout = self
            .run(
                &[
                    "list",
                    "--all",
                    "--all-namespaces",
                    "--max",
                    "0",
                    "-o",
                    "json",
                ],
                None,
            )
            .await
            .map_err(|f| f.into_error("list of releases"))?;
        parse_list(&stdout)
    }

    #[tracing::instrument(name = "helm.status", level = "debug", skip_all)]
    async fn status(
        &self,
        target: &ReleaseTarget,
    ) -> Result<Option<ReleaseStatus>, ProvisionError> {
        let release = helm_release(target)?;
        let Some(mut status) = self.release_status(release).await? else {
            return Ok(None);
        };
        // `helm status` strips the chart from its output; `get metadata`
        // (helm 3.13+) names it. Without it the chart is just not shown.
        let metadata = [
            "get",
            "metadata",
            &release.name,
            "--namespace",
            &release.namespace,
            "-o",
            "json",
        ];
        if let Ok(stdout) = self.run(&metadata, None).await {
            if let Ok(m) = serde_json::from_str::<MetadataOutput>(stdout.trim()) {
                status.chart = format!("{}-{}", m.chart, m.version);
            }
        }
        Ok(Some(status))
    }
}

/// Parses `helm status -o json`.
pub fn parse_status(stdout: &str) -> Result<ReleaseStatus, ProvisionError> {
    let parsed: StatusOutput = serde_json::from_str(stdout.trim()).map_err(|e| {
        ProvisionError::Failed(format!(
            "helm status -o json: output is not a release with info.status ({e}): {:?}",
            excerpt(stdout)
        ))
    })?;
    Ok(ReleaseStatus {
        status: parsed.info.status,
        revision: parsed.version,
        chart: parsed
            .chart
            .map(|c| format!("{}-{}", c.metadata.name, c.metadata.version))
            .unwrap_or_default(),
        description: parsed.info.description,
    })
}

/// Parses `helm list -o json`. Helm prints `[]` for no releases; anything
/// that is not a JSON array of `{name, namespace, …}` is an error quoting it.
pub fn parse_list(stdout: &str) -> Result<Vec<Release>, ProvisionError> {
    let listed: Vec<ListedRelease> = serde_json::from_str(stdout.trim()).map_err(|e| {
        ProvisionError::Failed(format!(
            "helm list -o json: output is not a JSON array of releases with name and namespace ({e}): {:?}",
            excerpt(stdout)
        ))
    })?;
    let mut releases: Vec<Release> = listed
        .into_iter()
        .map(|r| Release {
            name: r.name,
            namespace: r.namespace,
        })
        .collect();
    releases.sort();
    Ok(releases)
}

/// Helm release names are DNS-1123 labels of at most 53 characters: the
/// instance-name rule, since a release is named after its instance.
fn check_release(release: &str) -> Result<(), ProvisionError> {
    names::check_instance_name("release", release)
        .map_err(|e| ProvisionError::Refused(e.to_string()))
}

fn check_dns_label(field: &str, value: &str) -> Result<(), ProvisionError> {
    names::check_dns_label(field, value).map_err(|e| ProvisionError::Refused(e.to_string()))
}

/// A free-form argument must be present, must not read as a flag and must
/// not carry whitespace or control characters.
fn check_arg(field: &str, value: &str) -> Result<(), ProvisionError> {
    let valid = !value.is_empty()
        && !value.starts_with('-')
        && !value.chars().any(|c| c.is_whitespace() || c.is_control());
    if valid {
        Ok(())
    } else {
        Err(ProvisionError::Refused(format!(
            "{field} = {value:?} is not a valid helm argument (empty, starts with '-', or has whitespace)"
        )))
    }
}

fn excerpt(text: &str) -> String {
    let text = text.trim();
    if text.len() <= OUTPUT_EXCERPT_LEN_MAX {
        return text.to_owned();
    }
    let mut end = OUTPUT_EXCERPT_LEN_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roll_back_goes_to_the_newest_good_revision_at_the_version() {
        let revision = |revision, status: &str, chart: &str| Revision {
            revision,
            status: status.into(),
            chart: chart.into(),
        };
        let history = [
            revision(1, "superseded", "shop-1.0"),
            revision(2, "superseded", "shop-1.0"),
            revision(3, "failed", "shop-1.1"),
            revision(4, "superseded", "shop-1.1"),
            revision(5, "deployed", "shop-2.0"),
        ];
        assert_eq!(RollBack::of(&history, "1.0"), RollBack::To(2));
        assert_eq!(RollBack::of(&history, "1.1"), RollBack::To(4));
        assert_eq!(RollBack::of(&history, "2.0"), RollBack::Already);
        // A version matches whole: "0" is no revision's.
        assert_eq!(RollBack::of(&history, "0"), RollBack::NotInHistory);
        assert_eq!(RollBack::of(&history[..3], "1.1"), RollBack::NotInHistory);
        assert_eq!(RollBack::of(&[], "1.0"), RollBack::NotInHistory);
        let parsed = parse_history(
            r#"[{"revision":1,"updated":"x","status":"deployed","chart":"shop-1.0","app_version":"","description":"Install complete"}]"#,
        )
        .unwrap();
        assert_eq!(parsed, [revision(1, "deployed", "shop-1.0")]);
        let error = parse_history("Error: nope").unwrap_err().to_string();
        assert!(error.contains("helm history -o json"), "{error}");
    }

    #[test]
    fn list_output_parses_and_ignores_other_fields() {
        let json = r#"[{"name":"b","namespace":"ns","revision":"2","status":"deployed"},
                       {"name":"a","namespace":"ns","chart":"c-1.0.0"}]"#;
        let releases = parse_list(json).unwrap();
        let names: Vec<_> = releases.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(parse_list("[]\n").unwrap(), Vec::new());
    }

    #[test]
    fn malformed_list_output_is_an_error_quoting_it() {
        for bad in ["", "Error: oops", r#"{"name":"a"}"#, r#"[{"name":"a"}]"#] {
            let error = parse_list(bad).unwrap_err();
            assert!(matches!(error, ProvisionError::Failed(_)), "{error:?}");
            assert!(error.to_string().contains("not a JSON array"), "{error}");
        }
    }

    #[test]
    fn a_helm_that_could_not_reach_the_cluster_is_unavailable_and_one_that_failed_is_failed() {
        let exit = |stderr: &str| HelmFailure::Exit {
            stderr: stderr.to_owned(),
            message: stderr.to_owned(),
        };
        let passing = [
            "Error: Kubernetes cluster unreachable: Get \"https://k8s:6443/version\": dial tcp: connection refused",
            "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
        ];
        for stderr in passing {
            let error = exit(stderr).into_error("shop");
            assert!(matches!(error, ProvisionError::Unavailable(_)), "{error:?}");
        }
        let failing = [
            "Error: UPGRADE FAILED: release shop failed, and has been rolled back due to atomic being set: timed out waiting for the condition",
            "Error: INSTALLATION FAILED: chart \"nope\" version \"9\" not found",
        ];
        for stderr in failing {
            let error = exit(stderr).into_error("shop");
            assert!(matches!(error, ProvisionError::Failed(_)), "{error:?}");
            assert!(
                error.to_string().starts_with("provisioner: shop: "),
                "{error}"
            );
        }
    }

    #[test]
    fn arguments_that_could_pose_as_flags_are_refused() {
        assert!(check_release("--post-renderer=x").is_err());
        assert!(check_release("Shop").is_err());
        assert!(check_release(&"a".repeat(54)).is_err());
        assert!(check_release("shop-1").is_ok());
        let error = check_arg("version", "--devel").unwrap_err();
        assert!(matches!(error, ProvisionError::Refused(_)), "{error:?}");
        assert!(
            error.to_string().contains("version = \"--devel\""),
            "{error}"
        );
        assert!(check_arg("version", "1.2.3").is_ok());
    }
}
