//! Log readiness against the real dockerd and the busybox test image
//! (`scripts/services up` starts one and builds the other): a line counts
//! only in the logs of the execution probed, and only once it was printed.

// These tests wait on real services, so they read the wall clock to bound
// their waits; the crate-wide ban protects the core, not tests.
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::time::{Duration, Instant};

use stead::adapters::docker::{DockerConfig, DockerRuntime, NativeRestart};
use stead::adapters::probe::{NetAndLogProbe, NetProbe};
use stead::core::spec::{ReadinessProbe, ServiceSpec};
use stead::core::types::{Binds, ContainerId, ContainerStatus, ServiceName, Timestamp};
use stead::ports::{Probe, ProbeError, ProbeTarget, Runtime};
use support_services::docker::{
    create_request, docker, runtime, runtime_with, Cleanup, TEST_IMAGE,
};
use support_services::unique;

/// Bound on waiting for a container to reach a state.
const STATE_WAIT_MAX: Duration = Duration::from_secs(30);

/// A service running `script` under busybox sh, ready on a log line.
fn script_spec(service: &str, script: &str, pattern: &str) -> ServiceSpec {
    ServiceSpec {
        name: ServiceName::new(service),
        image: TEST_IMAGE.to_owned(),
        command: ["sh", "-c", script].map(str::to_owned).to_vec(),
        ports: Vec::new(),
        healthcheck: None,
        readiness: log(pattern, Duration::from_secs(60)),
        stop_grace: Duration::from_secs(1),
        update: Default::default(),
        domains: Vec::new(),
        tenant_domains: false,
        run: Default::default(),
    }
}

fn log(pattern: &str, timeout: Duration) -> ReadinessProbe {
    ReadinessProbe::Log {
        pattern: pattern.to_owned(),
        timeout,
    }
}

/// The daemon's probe, over this runtime.
fn probe(runtime: &DockerRuntime) -> NetAndLogProbe {
    NetAndLogProbe::new(NetProbe::new().unwrap(), runtime.clone())
}

fn target(container: &ContainerId, started_at: Timestamp) -> ProbeTarget {
    ProbeTarget {
        container: container.clone(),
        started_at: Some(started_at),
        binds: Binds::new(),
    }
}

/// Waits until the container runs and `accept` takes its execution start.
async fn running(
    runtime: &DockerRuntime,
    id: &ContainerId,
    accept: impl Fn(Timestamp) -> bool,
) -> Timestamp {
    let deadline = Instant::now() + STATE_WAIT_MAX;
    loop {
        let observed = runtime.inspect(id).await.expect("inspect");
        if let (ContainerStatus::Running, Some(started_at)) = (observed.status, observed.started_at)
        {
            if accept(started_at) {
                return started_at;
            }
        }
        assert!(Instant::now() < deadline, "{id} stayed {observed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn logs(id: &ContainerId) -> String {
    docker(&["logs", id.as_str()]).expect("docker logs")
}

fn timed_out(error: &ProbeError, timeout_secs: &str, pattern: &str) -> bool {
    matches!(error, ProbeError::NotReady(_))
        && error.to_string().contains(&format!(
            "timed out after {timeout_secs} s waiting for a log line containing {pattern:?}"
        ))
}

#[tokio::test]
async fn a_log_ready_container_is_ready_only_once_it_printed_its_line() {
    let runtime = runtime().await;
    let instance = unique("lr");
    let _cleanup = Cleanup::new(&instance);
    let pattern = "ready to serve";
    let script = "echo starting; sleep 4; echo 'now ready to serve'; sleep 300";
    let id = runtime
        .create(&create_request(
            &instance,
            script_spec("app", script, pattern),
            "r1",
        ))
        .await
        .expect("create");
    let started_at = running(&runtime, &id, |_| true).await;
    let probe = probe(&runtime);

    let early = probe
        .ready(
            &log(pattern, Duration::from_secs(1)),
            &target(&id, started_at),
        )
        .await
        .unwrap_err();
    assert!(timed_out(&early, "1", pattern), "{early}");
    assert!(early.to_string().contains(id.as_str()), "{early}");
    assert!(!logs(&id).contains(pattern), "the line came early");

    let began = Instant::now();
    probe
        .ready(
            &log(pattern, Duration::from_secs(30)),
            &target(&id, started_at),
        )
        .await
        .expect("ready once the line is printed");
    assert!(logs(&id).contains(pattern), "ready before the line");
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_line_of_the_previous_execution_does_not_make_the_next_one_ready() {
    // Docker restarts it at once (100 ms), so both executions' lines often
    // share a second, which `since` cannot tell apart.
    let runtime = runtime_with(DockerConfig {
        native_restart: NativeRestart::UnlessStopped,
        ..DockerConfig::default()
    })
    .await;
    let instance = unique("lr");
    let _cleanup = Cleanup::new(&instance);
    // The container's filesystem outlives its executions: the first one
    // prints the line and dies, every later one only starts again.
    let script = "if [ -e /tmp/printed ]; then echo starting again; sleep 300; \
                  else touch /tmp/printed; echo ready; exit 1; fi";
    let id = runtime
        .create(&create_request(
            &instance,
            script_spec("app", script, "ready"),
            "r1",
        ))
        .await
        .expect("create");
    let deadline = Instant::now() + STATE_WAIT_MAX;
    while !logs(&id).contains("starting again") {
        assert!(Instant::now() < deadline, "never restarted: {}", logs(&id));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started_at = running(&runtime, &id, |_| true).await;
    assert!(
        logs(&id).contains("ready"),
        "the first execution's line is kept"
    );

    let probe = probe(&runtime);
    let error = probe
        .ready(
            &log("ready", Duration::from_secs(3)),
            &target(&id, started_at),
        )
        .await
        .unwrap_err();
    assert!(timed_out(&error, "3", "ready"), "{error}");

    // And an execution that is no longer the container's is never ready.
    let earlier = started_at - Duration::from_millis(1);
    let error = probe
        .ready(
            &log("starting", Duration::from_secs(3)),
            &target(&id, earlier),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, ProbeError::NotReady(_)), "{error:?}");
    assert!(error.to_string().contains("restarted"), "{error}");
}

#[tokio::test]
async fn a_line_printed_at_once_by_a_restarted_execution_counts() {
    // Docker records StartedAt after the process began: a line printed at
    // once can be stamped before it, and must count all the same.
    let runtime = runtime_with(DockerConfig {
        native_restart: NativeRestart::UnlessStopped,
        ..DockerConfig::default()
    })
    .await;
    let instance = unique("lr");
    let _cleanup = Cleanup::new(&instance);
    let script = "if [ -e /tmp/ran ]; then echo ready at once; sleep 300; \
                  else touch /tmp/ran; echo first; exit 1; fi";
    let id = runtime
        .create(&create_request(
            &instance,
            script_spec("app", script, "ready"),
            "r1",
        ))
        .await
        .expect("create");
    let deadline = Instant::now() + STATE_WAIT_MAX;
    while !logs(&id).contains("ready at once") {
        assert!(Instant::now() < deadline, "never restarted: {}", logs(&id));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started_at = running(&runtime, &id, |_| true).await;
    probe(&runtime)
        .ready(
            &log("ready", Duration::from_secs(5)),
            &target(&id, started_at),
        )
        .await
        .expect("the restarted execution's own line counts");
}

#[tokio::test]
async fn lines_longer_than_dockers_pieces_are_searched_without_gathering_them() {
    let runtime = runtime().await;
    let instance = unique("lr");
    let _cleanup = Cleanup::new(&instance);
    // Docker cuts a line into pieces of 16 KiB, each stamped on its own:
    // "SEAM" is cut in two ("SE" ends the first piece). "LAST" comes on
    // the line after one of 1 MiB.
    let script = "busybox head -c 16382 /dev/zero | busybox tr '\\0' a; printf SEAM; \
                  busybox head -c 100000 /dev/zero | busybox tr '\\0' b; echo; \
                  busybox head -c 1048576 /dev/zero | busybox tr '\\0' c; echo; \
                  echo LAST; sleep 300";
    let id = runtime
        .create(&create_request(
            &instance,
            script_spec("app", script, "LAST"),
            "r1",
        ))
        .await
        .expect("create");
    let started_at = running(&runtime, &id, |_| true).await;
    let probe = probe(&runtime);
    let timeout = Duration::from_secs(30);
    for pattern in ["SEAM", "LAST"] {
        probe
            .ready(&log(pattern, timeout), &target(&id, started_at))
            .await
            .unwrap_or_else(|e| panic!("{pattern}: {e}"));
    }
    // The pattern is not where the pieces join in the plain text of the
    // logs: each piece carries its own timestamp.
    let stamped = docker(&["logs", "--timestamps", id.as_str()]).expect("docker logs");
    assert!(!stamped.contains("SEAM"), "not cut where expected");
    // Pieces are joined, lines are not: "bc" would lie across a line end.
    let error = probe
        .ready(&log("bc", Duration::from_secs(2)), &target(&id, started_at))
        .await
        .unwrap_err();
    assert!(timed_out(&error, "2", "bc"), "{error}");
}
