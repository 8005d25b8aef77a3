//! The Docker runtime against the real dockerd and the busybox test image
//! (`scripts/services up` starts one and builds the other).

// These tests wait on real services, so they read the wall clock to bound
// their waits; the crate-wide ban protects the core, not tests.
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use stead::adapters::docker::{
    DockerConfig, DockerProvisioner, DockerRuntime, NativeRestart, RuntimeEventAction,
    LABEL_MANAGED,
};
use stead::core::types::{
    ContainerId, ContainerStatus, GenerationKey, Health, InstanceName, RuntimeError, ServiceName,
    Timestamp,
};
use stead::ports::{Provisioner, Runtime, RuntimeEvent};
use support_services::docker::{
    create_request, docker, httpd_spec, is_podman, runtime, runtime_with, Cleanup, EventCounter,
    HTTP_PORT, TEST_IMAGE,
};
use support_services::unique;

/// Bound on waiting for Docker's own healthcheck to reach a verdict.
const HEALTH_WAIT_MAX: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(1);

async fn wait_for_health(runtime: &DockerRuntime, id: &ContainerId, want: Health) {
    let deadline = Instant::now() + HEALTH_WAIT_MAX;
    loop {
        let health = runtime.health(id).await.expect("health");
        if health == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "health of {id} stayed {health:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// API calls Docker itself would have needed: all of them, less those made
/// only because the engine answered otherwise (Podman's; always none
/// against Docker, see `DockerRuntime::compat_call_count`).
fn docker_calls(runtime: &DockerRuntime) -> u64 {
    runtime.api_call_count() - runtime.compat_call_count()
}

/// The generation a test's container is: the key stop and remove check.
fn generation(instance: &str, service: &str, id: &ContainerId) -> GenerationKey {
    GenerationKey {
        instance: InstanceName::new(instance),
        service: ServiceName::new(service),
        container: id.clone(),
    }
}

async fn get(port: u16) -> Result<String, reqwest::Error> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    client
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
}

#[tokio::test]
async fn create_is_idempotent_and_serves_on_a_loopback_bind() {
    let runtime = runtime().await;
    let instance = unique("dr");
    let _cleanup = Cleanup::new(&instance);
    let request = create_request(&instance, httpd_spec("web"), "r1");

    let id = runtime.create(&request).await.expect("create");
    let again = runtime.create(&request).await.expect("create again");
    assert_eq!(id, again, "create is idempotent on the deterministic name");

    let name = docker(&["inspect", "--format", "{{.Name}}", id.as_str()]).unwrap();
    assert_eq!(name, format!("/stead.{instance}.web.r1"));
    let policy = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.RestartPolicy.Name}}",
        id.as_str(),
    ]);
    assert_eq!(
        policy.unwrap(),
        "no",
        "stead does recovery itself by default"
    );

    let observation = runtime.inspect(&id).await.expect("inspect");
    assert_eq!(observation.status, ContainerStatus::Running);
    assert!(observation.started_at.is_some());

    let binds = runtime.binds(&id).await.expect("binds");
    let host_port = *binds.get(&HTTP_PORT).expect("8080 is published");
    let body = get(host_port).await.expect("GET through the bind");
    assert!(body.contains("stead test"), "{body}");

    wait_for_health(&runtime, &id, Health::Healthy).await;
}

#[tokio::test]
async fn list_managed_is_one_labelled_call_with_instance_and_service() {
    let runtime = runtime().await;
    let instance = unique("dl");
    let _cleanup = Cleanup::new(&instance);
    let web = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create web");
    let worker = runtime
        .create(&create_request(&instance, httpd_spec("worker"), "r1"))
        .await
        .expect("create worker");

    let calls_before = docker_calls(&runtime);
    let listed = runtime.list_managed().await.expect("list");
    // Against Podman a second read follows when any managed container (of
    // any test) is stopping: counted apart, by compat_call_count.
    assert_eq!(
        docker_calls(&runtime) - calls_before,
        1,
        "one API call per list"
    );
    let mine: Vec<_> = listed
        .iter()
        .filter(|c| c.instance.as_str() == instance)
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    for (id, service) in [(&web, "web"), (&worker, "worker")] {
        let found = mine.iter().find(|c| &c.id == id).expect("listed");
        assert_eq!(found.service.as_str(), service);
        assert_eq!(found.status, ContainerStatus::Running);
    }

    let labelled = runtime.list_labelled().await.expect("list labelled");
    let found = labelled.iter().find(|c| c.id == web).expect("listed");
    assert_eq!(found.revision.as_deref(), Some("r1"));
    assert_eq!(found.name, format!("stead.{instance}.web.r1"));
}

#[tokio::test]
async fn services_whose_dashed_names_collide_get_two_containers() {
    let runtime = runtime().await;
    // Instance `<u>-api` with service `web`, and instance `<u>` with service
    // `api-web`: the old scheme named both `stead-<u>-api-web-r1`.
    let base = unique("dx");
    let dashed = format!("{base}-api");
    let _cleanup = (Cleanup::new(&base), Cleanup::new(&dashed));
    let first = create_request(&dashed, httpd_spec("web"), "r1");
    let second = create_request(&base, httpd_spec("api-web"), "r1");

    let a = runtime.create(&first).await.expect("create a");
    let b = runtime.create(&second).await.expect("create b");
    assert_ne!(a, b, "two services, two containers");
    // Idempotence still finds each one's own container.
    assert_eq!(runtime.create(&first).await.expect("again a"), a);
    assert_eq!(runtime.create(&second).await.expect("again b"), b);

    let labelled = runtime.list_labelled().await.expect("list labelled");
    for (id, instance, service) in [(&a, &dashed, "web"), (&b, &base, "api-web")] {
        let found = labelled.iter().find(|c| &c.id == id).expect("listed");
        assert_eq!(
            (found.instance.as_str(), found.service.as_str()),
            (instance.as_str(), service)
        );
        assert_eq!(found.name, format!("stead.{instance}.{service}.r1"));
        assert_eq!(found.status, ContainerStatus::Running);
    }
}

#[tokio::test]
async fn a_revision_docker_names_refuse_is_encoded_into_the_name() {
    let runtime = runtime().await;
    let instance = unique("dz");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "1.2+build/7"))
        .await
        .expect("create");
    let name = docker(&["inspect", "--format", "{{.Name}}", id.as_str()]).unwrap();
    assert_eq!(name, format!("/stead.{instance}.web.1.2_2bbuild_2f7"));
    let revision = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"stead.revision\"}}",
        id.as_str(),
    ]);
    assert_eq!(revision.unwrap(), "1.2+build/7", "the label keeps it as is");
}

#[tokio::test]
async fn stop_start_restart_change_the_execution() {
    let runtime = runtime().await;
    let instance = unique("ds");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    let first = runtime.inspect(&id).await.unwrap();
    let key = generation(&instance, "web", &id);

    runtime.stop(&key, GRACE).await.expect("stop");
    let stopped = runtime.inspect(&id).await.unwrap();
    assert_eq!(stopped.status, ContainerStatus::Exited);
    assert!(
        runtime.binds(&id).await.unwrap().is_empty(),
        "a stopped container has no binds"
    );
    runtime
        .stop(&key, GRACE)
        .await
        .expect("stopping a stopped container is fine");

    runtime.start(&id).await.expect("start");
    let started = runtime.inspect(&id).await.unwrap();
    assert_eq!(started.status, ContainerStatus::Running);
    assert!(
        started.started_at > first.started_at,
        "a start is a new execution"
    );
    runtime
        .start(&id)
        .await
        .expect("starting a running container is fine");

    runtime.restart(&id, GRACE).await.expect("restart");
    let restarted = runtime.inspect(&id).await.unwrap();
    assert_eq!(restarted.status, ContainerStatus::Running);
    assert!(
        restarted.started_at > started.started_at,
        "a restart is a new execution"
    );
    assert!(runtime.binds(&id).await.unwrap().contains_key(&HTTP_PORT));
}

#[tokio::test]
async fn remove_deletes_and_not_found_counts_as_removed() {
    let runtime = runtime().await;
    let instance = unique("dm");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    let key = generation(&instance, "web", &id);
    runtime
        .remove(&key)
        .await
        .expect("remove a running container");
    assert_eq!(runtime.inspect(&id).await, Err(RuntimeError::NotFound));
    runtime.remove(&key).await.expect("removing twice is fine");
}

#[tokio::test]
async fn an_absent_container_is_not_found_for_every_call() {
    let runtime = runtime().await;
    let id = ContainerId::new(unique("absent"));
    let key = generation("absent", "web", &id);
    assert_eq!(runtime.inspect(&id).await, Err(RuntimeError::NotFound));
    assert_eq!(runtime.start(&id).await, Err(RuntimeError::NotFound));
    assert_eq!(runtime.stop(&key, GRACE).await, Err(RuntimeError::NotFound));
    assert_eq!(
        runtime.restart(&id, GRACE).await,
        Err(RuntimeError::NotFound)
    );
    assert_eq!(runtime.health(&id).await, Err(RuntimeError::NotFound));
    assert_eq!(runtime.binds(&id).await, Err(RuntimeError::NotFound));
    assert_eq!(runtime.remove(&key).await, Ok(()));
}

#[tokio::test]
async fn a_killed_container_is_observed_exited() {
    let runtime = runtime().await;
    let instance = unique("dk");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    docker(&["kill", id.as_str()]).expect("docker kill");
    let observation = runtime.inspect(&id).await.unwrap();
    assert_eq!(observation.status, ContainerStatus::Exited);
    assert!(observation.started_at.is_some(), "it did run once");
}

#[tokio::test]
async fn remove_refuses_a_container_stead_does_not_own() {
    let runtime = runtime().await;
    let name = unique("foreign");
    let mut cleanup = Cleanup::new(&name);
    cleanup.extra.push(name.clone());
    let id = docker(&["run", "-d", "--name", &name, TEST_IMAGE]).expect("docker run");

    let refused = runtime
        .remove(&generation(&name, "web", &ContainerId::new(id.clone())))
        .await;
    let Err(RuntimeError::Refused(message)) = refused else {
        panic!("removing a foreign container must fail, got {refused:?}");
    };
    assert!(message.contains(LABEL_MANAGED), "{message}");
    let status = docker(&["inspect", "--format", "{{.State.Status}}", &id]);
    assert_eq!(
        status.unwrap(),
        "running",
        "the foreign container is untouched"
    );
}

#[tokio::test]
async fn stop_and_remove_refuse_a_container_of_another_generation() {
    let runtime = runtime().await;
    let instance = unique("dg");
    let other = format!("{instance}-api");
    let _cleanup = (Cleanup::new(&instance), Cleanup::new(&other));
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");

    for (key, label, found) in [
        (generation(&other, "web", &id), "stead.instance", &instance),
        (
            generation(&instance, "api", &id),
            "stead.service",
            &"web".to_owned(),
        ),
    ] {
        let stopped = runtime.stop(&key, GRACE).await;
        let removed = runtime.remove(&key).await;
        for (operation, result) in [("stop", stopped), ("remove", removed)] {
            let Err(RuntimeError::Refused(message)) = result else {
                panic!("{operation} with {key:?} must be refused, got {result:?}");
            };
            assert!(
                message.contains(&format!("refusing to {operation} container {id}"))
                    && message.contains(&format!("label {label} is Some({found:?})")),
                "{message}"
            );
        }
    }
    let status = docker(&["inspect", "--format", "{{.State.Status}}", id.as_str()]);
    assert_eq!(status.unwrap(), "running", "the container survived");

    let mine = generation(&instance, "web", &id);
    runtime
        .stop(&mine, GRACE)
        .await
        .expect("its own key stops it");
    runtime.remove(&mine).await.expect("and removes it");
    assert_eq!(runtime.inspect(&id).await, Err(RuntimeError::NotFound));
}

#[tokio::test]
async fn a_container_without_healthcheck_reports_no_health() {
    let runtime = runtime().await;
    let instance = unique("dh");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = httpd_spec("web");
    spec.healthcheck = None;
    let id = runtime
        .create(&create_request(&instance, spec, "r1"))
        .await
        .expect("create");
    assert_eq!(runtime.health(&id).await, Ok(Health::None));
}

#[tokio::test]
async fn a_failing_healthcheck_turns_unhealthy() {
    let runtime = runtime().await;
    let instance = unique("du");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = httpd_spec("web");
    // Nothing listens on 9, so wget fails every time.
    spec.healthcheck.as_mut().unwrap().command = ["wget", "-q", "-O-", "http://127.0.0.1:9/"]
        .map(str::to_owned)
        .to_vec();
    let id = runtime
        .create(&create_request(&instance, spec, "r1"))
        .await
        .expect("create");
    wait_for_health(&runtime, &id, Health::Unhealthy).await;
}

#[tokio::test]
async fn a_missing_image_gives_an_error_naming_it() {
    let runtime = runtime().await;
    let instance = unique("di");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = httpd_spec("web");
    spec.image = "stead-test/no-such-image:1".to_owned();
    let result = runtime.create(&create_request(&instance, spec, "r1")).await;
    let Err(RuntimeError::Transient(message)) = result else {
        panic!("a missing image must fail, got {result:?}");
    };
    assert!(message.contains("stead-test/no-such-image:1"), "{message}");
}

#[tokio::test]
async fn unless_stopped_is_available_for_the_native_restart_race() {
    let config = DockerConfig {
        native_restart: NativeRestart::UnlessStopped,
        ..support_services::docker::config()
    };
    let runtime = runtime_with(config).await;
    let instance = unique("dn");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    let policy = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.RestartPolicy.Name}}",
        id.as_str(),
    ]);
    assert_eq!(policy.unwrap(), "unless-stopped");
}

#[tokio::test]
async fn events_yield_die_after_a_kill() {
    let runtime = runtime().await;
    let instance = unique("de");
    let _cleanup = Cleanup::new(&instance);
    let mut events = runtime.events(stead::core::types::Timestamp::now());
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    wait_for_health(&runtime, &id, Health::Healthy).await;
    docker(&["kill", id.as_str()]).expect("docker kill");

    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = events.next().await {
            let event = event.expect("event stream");
            if event.container != id {
                continue;
            }
            assert_eq!(event.instance.as_str(), instance);
            assert_eq!(event.service.as_str(), "web");
            seen.push(event.action);
            if event.action == RuntimeEventAction::Die {
                return;
            }
        }
    })
    .await;
    assert!(found.is_ok(), "no die event within 10 s; saw {seen:?}");
    assert_eq!(seen.first(), Some(&RuntimeEventAction::Start), "{seen:?}");
    assert!(
        seen.contains(&RuntimeEventAction::HealthStatus(Health::Healthy)),
        "health events pass the filter too: {seen:?}"
    );
}

#[tokio::test]
async fn docker_provisioner_lists_instances_as_releases_and_uninstalls_them() {
    let runtime = runtime().await;
    let instance = unique("dp");
    let _cleanup = Cleanup::new(&instance);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    let provisioner = DockerProvisioner::new(runtime.clone());

    let releases = provisioner.list_releases().await.expect("list releases");
    let mine: Vec<_> = releases.iter().filter(|r| r.name == instance).collect();
    assert_eq!(mine.len(), 1, "one release per instance: {releases:?}");

    let target = stead::core::release::Provisioning::Docker
        .spec_of(
            &stead::core::release::ReleaseParams {
                instance: &instance,
                team: "t",
                service_type: "s",
                version: "1",
                parameters: &stead::core::release::NO_PARAMETERS,
            },
            false,
        )
        .expect("a docker release");
    assert_eq!(
        target.target().release.namespace,
        DockerProvisioner::NAMESPACE
    );
    provisioner
        .uninstall(&target.target())
        .await
        .expect("uninstall");
    assert_eq!(runtime.inspect(&id).await, Err(RuntimeError::NotFound));
    // Installing is the worker's Runtime::create; the provisioner's half is
    // a no-op that must not fail the worker.
    provisioner
        .install_or_upgrade(&target)
        .await
        .expect("install is a no-op for docker");
}

#[tokio::test]
async fn an_unreachable_socket_fails_naming_it() {
    let config = DockerConfig {
        socket_path: "/nonexistent/stead-test.sock".into(),
        ..DockerConfig::default()
    };
    let Err(RuntimeError::Transient(message)) = DockerRuntime::connect(config).await else {
        panic!("connecting to a missing socket must fail");
    };
    assert!(
        message.contains("/nonexistent/stead-test.sock"),
        "{message}"
    );
    assert!(message.contains("scripts/services up"), "{message}");
}

/// Keeps the read cache sound as the daemon's event follower does.
fn follow_events_into_cache(runtime: &DockerRuntime) -> tokio::task::JoinHandle<()> {
    let since = stead::core::types::Timestamp::now();
    tokio::spawn(runtime.clone().follow_into_cache(since))
}

/// Reads a pass makes of a steady container, as the recovery machine does.
async fn steady_reads(runtime: &DockerRuntime, id: &ContainerId) -> ContainerStatus {
    let observation = runtime.inspect(id).await.expect("inspect");
    runtime.health(id).await.expect("health");
    runtime.binds(id).await.expect("binds");
    runtime.inspect(id).await.expect("reinspect");
    observation.status
}

/// Follows the event stream as the daemon's follower does (every event
/// shown to the runtime, which drops its cached answer) and records what
/// the stream passed on, so a test can wait until it has seen something.
struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<Vec<RuntimeEvent>>>,
    /// What ended the stream each time it ended (it is followed again).
    errors: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// From now; with `cache`, the runtime's read cache follows the stream.
    /// A stream that ends is followed again from the start, replayed, as
    /// the daemon's follower does (its cache untrusted in between); what
    /// ended it is kept for the failure message.
    fn follow(runtime: &DockerRuntime, cache: bool) -> Recorder {
        let from = Timestamp::now();
        let runtime = runtime.clone();
        let seen: std::sync::Arc<std::sync::Mutex<Vec<RuntimeEvent>>> = std::sync::Arc::default();
        let errors: std::sync::Arc<std::sync::Mutex<Vec<String>>> = std::sync::Arc::default();
        let (record, failed) = (std::sync::Arc::clone(&seen), std::sync::Arc::clone(&errors));
        let mut events = runtime.events(from);
        if cache {
            runtime.events_followed(true);
        }
        let task = tokio::spawn(async move {
            loop {
                let ended = loop {
                    match events.next().await {
                        Some(Ok(event)) => {
                            runtime.event_seen(&event);
                            let mut seen = record.lock().expect("recorder lock");
                            if !seen.contains(&event) {
                                seen.push(event);
                            }
                        }
                        Some(Err(e)) => break e.to_string(),
                        None => break "the stream ended".to_owned(),
                    }
                };
                failed.lock().expect("recorder lock").push(ended);
                if cache {
                    runtime.events_followed(false);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                events = runtime.events(from);
                if cache {
                    runtime.events_followed(true);
                }
            }
        });
        Recorder { seen, errors, task }
    }

    /// The actions passed on so far for one container.
    fn actions(&self, id: &ContainerId) -> Vec<RuntimeEventAction> {
        let seen = self.seen.lock().expect("recorder lock");
        seen.iter()
            .filter(|e| &e.container == id)
            .map(|e| e.action)
            .collect()
    }

    /// Waits (bounded) until the stream has passed on `action` for `id`.
    async fn wait_for(&self, id: &ContainerId, action: RuntimeEventAction) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.actions(id).contains(&action) {
            assert!(
                Instant::now() < deadline,
                "the stream passed on no {action:?} for {id} within 30 s: {:?} (it ended: {:?})",
                self.actions(id),
                self.errors.lock().expect("recorder lock")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_steady_pass_costs_one_list_call_while_events_are_followed() {
    let runtime = runtime().await;
    let instance = unique("dc");
    let _cleanup = Cleanup::new(&instance);
    let follower = Recorder::follow(&runtime, true);
    let mut ids = Vec::new();
    for service in ["a", "b", "c"] {
        let request = create_request(&instance, httpd_spec(service), "r1");
        ids.push(runtime.create(&request).await.expect("create"));
    }
    // Once the stream has passed on each one's healthy verdict, nothing
    // changes: Docker sends no more health events, and Podman's (one per
    // check) are dropped by the stream for repeating that verdict.
    for id in &ids {
        follower
            .wait_for(id, RuntimeEventAction::HealthStatus(Health::Healthy))
            .await;
    }
    // The first pass fills the cache: one inspect per container.
    runtime.begin_pass().await.expect("begin pass");
    for id in &ids {
        steady_reads(&runtime, id).await;
    }
    let before = docker_calls(&runtime);
    runtime.begin_pass().await.expect("begin pass");
    for id in &ids {
        assert_eq!(steady_reads(&runtime, id).await, ContainerStatus::Running);
    }
    assert_eq!(
        docker_calls(&runtime) - before,
        1,
        "a steady pass is one list call"
    );
    if is_podman() {
        assert!(
            runtime.compat_call_count() >= 3,
            "each container's healthy verdict came from an inspect of a verdict-less event"
        );
    } else {
        assert_eq!(runtime.compat_call_count(), 0, "docker needs no extra call");
    }
}

/// Docker sends a health event when the verdict changes; Podman 4.3 sends
/// one after every check run, without the verdict. Either way stead hears
/// of each verdict once.
#[tokio::test]
async fn health_events_reach_stead_once_per_verdict() {
    let runtime = runtime().await;
    let instance = unique("dy");
    let _cleanup = Cleanup::new(&instance);
    let raw = EventCounter::follow_action(&instance, "health_status");
    let recorder = Recorder::follow(&runtime, false);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    wait_for_health(&runtime, &id, Health::Healthy).await;
    // Four more check intervals (0.5 s each) with the verdict unchanged.
    if is_podman() {
        let deadline = Instant::now() + Duration::from_secs(20);
        while raw.count() < 5 {
            assert!(
                Instant::now() < deadline,
                "podman sent {} health events in 20 s; it sends one per check run",
                raw.count()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let engine_sent = raw.count();
    docker(&["kill", id.as_str()]).expect("docker kill");
    // Everything up to the die: the stream keeps the engine's order.
    recorder.wait_for(&id, RuntimeEventAction::Die).await;
    let verdicts: Vec<Health> = recorder
        .actions(&id)
        .into_iter()
        .filter_map(|action| match action {
            RuntimeEventAction::HealthStatus(health) => Some(health),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts.last(), Some(&Health::Healthy), "{verdicts:?}");
    assert!(
        verdicts.windows(2).all(|pair| pair[0] != pair[1]),
        "a verdict was passed on twice in a row: {verdicts:?}"
    );
    if is_podman() {
        // Starting then healthy, or healthy alone when the first inspect
        // came after the first check recorded its verdict.
        assert!(
            verdicts.len() <= 2,
            "{engine_sent} health events became {verdicts:?}"
        );
        assert!(
            runtime.compat_call_count() >= engine_sent as u64,
            "one inspect per verdict-less event: {} for {engine_sent}",
            runtime.compat_call_count()
        );
    } else {
        assert_eq!(engine_sent, 1, "docker sends one, when the verdict changes");
        assert_eq!(verdicts, [Health::Healthy]);
        assert_eq!(runtime.compat_call_count(), 0);
    }
}

/// During a stop's grace the process still runs: Docker says `running`,
/// Podman 4.3 says `stopping`, a word of no Docker API version. stead reads
/// it as running, and a list showing it still answers.
#[tokio::test]
async fn a_stopping_container_reads_as_running_until_it_stops() {
    let runtime = runtime().await;
    let instance = unique("dt");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = httpd_spec("web");
    // Says when SIGTERM comes and outlives it, so the stop takes its grace.
    spec.command = [
        "sh",
        "-c",
        "trap 'echo got TERM' TERM; while :; do sleep 1; done",
    ]
    .map(str::to_owned)
    .to_vec();
    spec.healthcheck = None;
    spec.ports = Vec::new();
    let id = runtime
        .create(&create_request(&instance, spec, "r1"))
        .await
        .expect("create");
    let key = generation(&instance, "web", &id);
    let stopping = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.stop(&key, Duration::from_secs(8)).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !docker(&["logs", id.as_str()])
        .unwrap_or_default()
        .contains("got TERM")
    {
        assert!(Instant::now() < deadline, "no SIGTERM within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let engine_says = docker(&["inspect", "--format", "{{.State.Status}}", id.as_str()]);
    let expected = if is_podman() { "stopping" } else { "running" };
    assert_eq!(engine_says.unwrap(), expected);

    let compat_before = runtime.compat_call_count();
    let listed = runtime.list_labelled().await.expect("list while it stops");
    let found = listed.iter().find(|c| c.id == id).expect("listed");
    assert_eq!(found.status, ContainerStatus::Running);
    let observed = runtime.inspect(&id).await.expect("inspect while it stops");
    assert_eq!(observed.status, ContainerStatus::Running);
    let rereads = runtime.compat_call_count() - compat_before;
    assert!(
        !stopping.is_finished(),
        "the stop ended before the reads; they saw no stopping container"
    );
    if is_podman() {
        assert_eq!(rereads, 2, "the list and the inspect are each read again");
    } else {
        assert_eq!(rereads, 0);
    }

    stopping.await.expect("stop task").expect("stop");
    let stopped = runtime.inspect(&id).await.expect("inspect");
    assert_eq!(stopped.status, ContainerStatus::Exited);
}

#[tokio::test]
async fn a_kill_drops_the_cached_answer_by_event_and_by_the_list_call() {
    let runtime = runtime().await;
    let instance = unique("dv");
    let _cleanup = Cleanup::new(&instance);
    let follower = follow_events_into_cache(&runtime);
    let id = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    assert_eq!(steady_reads(&runtime, &id).await, ContainerStatus::Running);
    docker(&["kill", id.as_str()]).expect("docker kill");
    // By the event: the next read inspects and sees the crash.
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime.inspect(&id).await.unwrap().status == ContainerStatus::Running {
        assert!(
            Instant::now() < deadline,
            "the die event never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // By the list call, with no follower to tell: restart it, let the
    // cache answer "exited", and kill again with the stream gone.
    follower.abort();
    let _ = follower.await;
    runtime.read_cache().set_following(true);
    runtime.start(&id).await.expect("start");
    assert_eq!(steady_reads(&runtime, &id).await, ContainerStatus::Running);
    docker(&["kill", id.as_str()]).expect("docker kill");
    assert_eq!(
        runtime.inspect(&id).await.unwrap().status,
        ContainerStatus::Running,
        "without an event, the cached answer stands until the pass's list"
    );
    runtime.begin_pass().await.expect("begin pass");
    assert_eq!(
        runtime.inspect(&id).await.unwrap().status,
        ContainerStatus::Exited
    );
}
