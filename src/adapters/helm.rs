//! Helm: the `Provisioner` port over the `helm` CLI.
//!
//! Helm runs as a subprocess with an argument vector, never through a shell,
//! and every call has a timeout after which the process is killed. Release
//! names, chart, namespace and version are checked before they reach helm's
//! command line, so no value can pose as a flag.
//!
//! | port call | helm command |
//! | --- | --- |
//! | `install_or_upgrade` | `helm upgrade --install <release> <chart> --version <v> --namespace <ns> --wait --timeout <t>` |
//! | `uninstall` | `helm uninstall <release> --namespace <ns> --wait --timeout <t>` (a release helm does not know counts as uninstalled) |
//! | `list_releases` | `helm list -o json --all-namespaces` |

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tokio::process::Command;

use crate::core::names;
use crate::ports::{ProvisionError, Provisioner, Release};

/// Helm's own limit on release names.
pub const RELEASE_NAME_LEN_MAX: usize = names::INSTANCE_NAME_LEN_MAX;

/// Upper bound on the bytes of helm's output quoted in an error.
const OUTPUT_EXCERPT_LEN_MAX: usize = 400;

/// How to run helm and what to install.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelmConfig {
    /// The `helm` binary (a name looked up on `PATH`, or a path).
    pub helm_path: PathBuf,
    /// The chart every release installs (`repo/chart`, a path or an OCI URL).
    pub chart: String,
    /// The namespace releases are installed into.
    pub namespace: String,
    /// Helm's own `--timeout` for `--wait`.
    pub wait_timeout: Duration,
    /// Bound on one helm process; it is killed past it. Must exceed
    /// `wait_timeout` (checked by [`HelmProvisioner::new`]).
    pub call_timeout: Duration,
    /// Extra environment for helm (e.g. `KUBECONFIG`, `HELM_CACHE_HOME`).
    pub env: Vec<(String, String)>,
}

impl Default for HelmConfig {
    fn default() -> Self {
        Self {
            helm_path: PathBuf::from("helm"),
            chart: String::new(),
            namespace: "default".to_owned(),
            wait_timeout: Duration::from_secs(300),
            call_timeout: Duration::from_secs(330),
            env: Vec::new(),
        }
    }
}

/// The `Provisioner` port over the `helm` CLI.
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

impl HelmProvisioner {
    /// Validates the config: errors name the field and the value.
    pub fn new(config: HelmConfig) -> Result<Self, ProvisionError> {
        check_arg("chart", &config.chart)?;
        check_dns_label("namespace", &config.namespace)?;
        if config.call_timeout <= config.wait_timeout {
            return Err(ProvisionError::Refused(format!(
                "helm call_timeout = {:?} must exceed wait_timeout = {:?}, or helm is killed while it waits",
                config.call_timeout, config.wait_timeout
            )));
        }
        Ok(Self { config })
    }

    pub fn config(&self) -> &HelmConfig {
        &self.config
    }

    /// Helm's `--timeout` as a Go duration, in whole seconds rounded up.
    fn wait_timeout_arg(&self) -> String {
        let t = self.config.wait_timeout;
        format!("{}s", t.as_secs() + u64::from(t.subsec_nanos() > 0))
    }

    /// Runs helm with `args`; `Ok(stdout)` on exit 0, else an error with the
    /// exit status and an excerpt of stderr. Killed past `call_timeout`.
    async fn run(&self, args: &[&str]) -> Result<String, HelmFailure> {
        let mut command = Command::new(&self.config.helm_path);
        command
            .args(args)
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropping the future on timeout kills the process.
            .kill_on_drop(true);
        let what = format!("helm {}", args.first().copied().unwrap_or_default());
        let child = command.spawn().map_err(|e| {
            HelmFailure::Other(format!(
                "{what}: cannot run {:?}: {e}",
                self.config.helm_path
            ))
        })?;
        let output = tokio::time::timeout(self.config.call_timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                HelmFailure::Other(format!(
                    "{what}: killed after the call timeout of {:?}",
                    self.config.call_timeout
                ))
            })?
            .map_err(|e| HelmFailure::Other(format!("{what}: {e}")))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(HelmFailure::Exit {
            stderr: stderr.to_string(),
            message: format!("{what}: {}: {}", output.status, excerpt(&stderr)),
        })
    }
}

/// How a helm call failed: a non-zero exit (with helm's stderr, which the
/// caller may interpret) or anything else.
enum HelmFailure {
    Exit { stderr: String, message: String },
    Other(String),
}

impl HelmFailure {
    fn into_error(self) -> ProvisionError {
        match self {
            Self::Exit { message, .. } => ProvisionError::Failed(message),
            Self::Other(message) => ProvisionError::Unavailable(message),
        }
    }
}

#[async_trait]
impl Provisioner for HelmProvisioner {
    async fn install_or_upgrade(&self, release: &str, version: &str) -> Result<(), ProvisionError> {
        check_release(release)?;
        check_arg("version", version)?;
        let timeout = self.wait_timeout_arg();
        let args = [
            "upgrade",
            "--install",
            release,
            &self.config.chart,
            "--version",
            version,
            "--namespace",
            &self.config.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ];
        self.run(&args)
            .await
            .map(drop)
            .map_err(HelmFailure::into_error)
    }

    async fn uninstall(&self, release: &str) -> Result<(), ProvisionError> {
        check_release(release)?;
        let timeout = self.wait_timeout_arg();
        let args = [
            "uninstall",
            release,
            "--namespace",
            &self.config.namespace,
            "--wait",
            "--timeout",
            &timeout,
        ];
        match self.run(&args).await {
            Ok(_) => Ok(()),
            // Deprovisioning is idempotent: helm's "release: not found" means
            // the work is already done.
            Err(HelmFailure::Exit { stderr, .. }) if stderr.contains("not found") => Ok(()),
            Err(failure) => Err(failure.into_error()),
        }
    }

    async fn list_releases(&self) -> Result<Vec<Release>, ProvisionError> {
        let stdout = self
            .run(&["list", "-o", "json", "--all-namespaces"])
            .await
            .map_err(HelmFailure::into_error)?;
        parse_list(&stdout)
    }
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
