//! Docker for tests: a connected runtime (or a clear failure), the test image,
//! a busybox httpd spec, and cleanup of everything a test labelled.

use std::process::Command;
use std::time::Duration;

use stead::adapters::docker::{DockerConfig, DockerRuntime, LABEL_INSTANCE};
use stead::core::spec::{Healthcheck, ReadinessProbe, ServiceSpec};
use stead::core::types::{InstanceName, ServiceName};
use stead::ports::CreateContainer;

/// Built by `scripts/services up` with `docker import` from busybox-static.
pub const TEST_IMAGE: &str = "stead-test/busybox:1";
/// The port busybox httpd listens on inside the test containers.
pub const HTTP_PORT: u16 = 8080;

/// A runtime connected to the local dockerd. Fails the test, saying how to
/// fix it, when dockerd does not answer or the test image is missing: these
/// tests run against the real engine or not at all.
pub async fn runtime() -> DockerRuntime {
    runtime_with(DockerConfig::default()).await
}

pub async fn runtime_with(config: DockerConfig) -> DockerRuntime {
    let runtime = DockerRuntime::connect(config).await.unwrap_or_else(|e| {
        panic!("dockerd is not reachable ({e}); run `scripts/services up` first")
    });
    let image = docker(&["image", "inspect", "--format", "{{.Id}}", TEST_IMAGE]);
    assert!(
        image.is_ok(),
        "test image {TEST_IMAGE} is missing; run `scripts/services up` first"
    );
    runtime
}

/// A service running busybox httpd on 8080 with a real wget healthcheck.
pub fn httpd_spec(service: &str) -> ServiceSpec {
    ServiceSpec {
        name: ServiceName::new(service),
        image: TEST_IMAGE.to_owned(),
        command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
            .map(str::to_owned)
            .to_vec(),
        ports: vec![HTTP_PORT],
        healthcheck: Some(Healthcheck {
            command: ["wget", "-q", "-O-", "http://127.0.0.1:8080/"]
                .map(str::to_owned)
                .to_vec(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            retries: 2,
        }),
        readiness: ReadinessProbe::None,
        stop_grace: Duration::from_secs(1),
    }
}

pub fn create_request(instance: &str, spec: ServiceSpec, revision: &str) -> CreateContainer {
    CreateContainer {
        instance: InstanceName::new(instance),
        spec,
        revision: revision.to_owned(),
    }
}

/// Runs the docker CLI with an argument vector (as an operator would).
/// Returns stdout, or the stderr on failure.
pub fn docker(args: &[&str]) -> Result<String, String> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| format!("run docker {args:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// Removes, on drop, every container labelled with the instance and every
/// container named in `extra`, so a failing test leaves nothing behind.
pub struct Cleanup {
    pub instance: String,
    pub extra: Vec<String>,
}

impl Cleanup {
    pub fn new(instance: &str) -> Self {
        Self {
            instance: instance.to_owned(),
            extra: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_INSTANCE}={}", self.instance);
        let ids = docker(&["ps", "-aq", "--filter", &filter]).unwrap_or_default();
        let mut targets: Vec<&str> = ids.split_whitespace().collect();
        targets.extend(self.extra.iter().map(String::as_str));
        if !targets.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(targets);
            let _ = docker(&args);
        }
    }
}
