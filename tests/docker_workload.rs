//! What real applications need from the Docker runtime, against the real
//! dockerd: environment and secrets, named volumes that outlive their
//! containers, the instance network, limits, user, entrypoint, labels and
//! bind mounts (`src/adapters/docker/workload.rs`).

// These tests wait on real services, so they read the wall clock to bound
// their waits; the crate-wide ban protects the core, not tests.
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::collections::BTreeMap;
use std::time::Duration;

use stead::adapters::docker::{volume_name, DockerConfig, DockerProvisioner, DockerRuntime};
use stead::core::limits::{ContainerLimits, RawLimits};
use stead::core::release::{ReleaseKind, ReleaseParams, ReleaseTarget};
use stead::core::spec::{Mount, MountSource, RunSpec, SecretEnv, SecretSource, ServiceSpec};
use stead::core::types::{ContainerId, GenerationKey, InstanceName, RuntimeError, ServiceName};
use stead::ports::{CreateContainer, Provisioner, Release, Runtime};
use support_services::docker::{
    config, create_request, docker, httpd_spec, is_podman, runtime, runtime_with, Cleanup,
};
use support_services::unique;

/// A service that runs `script` under sh and then sleeps, so a test can
/// read what it wrote with `docker exec`.
fn script_spec(service: &str, script: &str) -> ServiceSpec {
    let mut spec = httpd_spec(service);
    spec.command = vec![
        "sh".into(),
        "-c".into(),
        format!("{script}; exec sleep 600"),
    ];
    spec.healthcheck = None;
    spec.ports = Vec::new();
    spec
}

fn request(instance: &str, instance_id: i64, spec: ServiceSpec, revision: &str) -> CreateContainer {
    let params = ReleaseParams {
        instance,
        team: "team",
        service_type: "app",
        version: revision,
        parameters: &stead::core::release::NO_PARAMETERS,
    };
    let env = spec
        .run
        .render_env(&spec.name, &params)
        .expect("env renders");
    CreateContainer {
        instance_id,
        env,
        ..create_request(instance, spec, revision)
    }
}

/// What `cat path` prints inside the container, once the file exists.
async fn read_inside(id: &ContainerId, path: &str) -> String {
    for _ in 0..100 {
        if let Ok(text) = docker(&["exec", id.as_str(), "busybox", "cat", path]) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{path} never appeared in {id}");
}

fn generation(instance: &str, service: &str, id: &ContainerId) -> GenerationKey {
    GenerationKey {
        instance: InstanceName::new(instance),
        service: ServiceName::new(service),
        container: id.clone(),
    }
}

#[tokio::test]
async fn env_and_secrets_reach_the_container_and_nothing_else() {
    let runtime = runtime().await;
    let instance = unique("wkenv");
    let _cleanup = Cleanup::new(&instance);
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("db-password");
    std::fs::write(&secret_file, "file-s3cret-9f2\n").unwrap();
    // A variable of this test process: the runtime reads the daemon's own
    // environment, which is ours here.
    let env_name = format!("STEAD_TEST_SECRET_{}", std::process::id());
    std::env::set_var(&env_name, "env-s3cret-4c7");

    let mut spec = script_spec("app", "echo \"$GREETING|$DB_PASSWORD|$API_KEY\" > /tmp/out");
    spec.run.env = BTreeMap::from([("GREETING".into(), "hello {instance}".into())]);
    spec.run.secrets = vec![
        SecretEnv {
            env: "DB_PASSWORD".into(),
            source: SecretSource::File(secret_file.display().to_string()),
        },
        SecretEnv {
            env: "API_KEY".into(),
            source: SecretSource::DaemonEnv(env_name.clone()),
        },
    ];
    let id = runtime
        .create(&request(&instance, 1, spec, "1"))
        .await
        .expect("create");
    assert_eq!(
        read_inside(&id, "/tmp/out").await,
        format!("hello {instance}|file-s3cret-9f2|env-s3cret-4c7"),
        "the rendered env and both secrets (without the file's newline) reach the process"
    );
    let labels = docker(&[
        "inspect",
        "--format",
        "{{json .Config.Labels}}",
        id.as_str(),
    ])
    .unwrap();
    assert!(
        !labels.contains("s3cret"),
        "no secret in the container's labels: {labels}"
    );
    std::env::remove_var(&env_name);
}

#[tokio::test]
async fn a_missing_secret_fails_the_create_naming_it_and_creates_nothing() {
    let runtime = runtime().await;
    let instance = unique("wkmiss");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = script_spec("db", "true");
    spec.run.secrets = vec![SecretEnv {
        env: "DB_PASSWORD".into(),
        source: SecretSource::File("/nonexistent/stead/db-password".into()),
    }];
    let Err(RuntimeError::Refused(message)) =
        runtime.create(&request(&instance, 1, spec, "1")).await
    else {
        panic!("a create whose secret is missing must be refused");
    };
    assert!(message.contains("secret DB_PASSWORD"), "{message}");
    assert!(
        message.contains("/nonexistent/stead/db-password"),
        "{message}"
    );
    assert!(message.contains(&format!("{instance}/db")), "{message}");
    let filter = format!("label=stead.instance={instance}");
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &filter]).unwrap(),
        "",
        "nothing was created"
    );
}

#[tokio::test]
async fn a_named_volume_outlives_its_containers_and_only_purge_removes_it() {
    let runtime = runtime().await;
    let instance = unique("wkvol");
    let _cleanup = Cleanup::new(&instance);
    let spec = |revision: &str| {
        let mut spec = script_spec("db", &format!("echo {revision} >> /data/rows"));
        spec.run.mounts = vec![Mount {
            source: MountSource::Volume("data".into()),
            target: "/data".into(),
            read_only: false,
        }];
        spec
    };
    let first = runtime
        .create(&request(&instance, 7, spec("r1"), "r1"))
        .await
        .expect("create r1");
    assert_eq!(read_inside(&first, "/data/rows").await, "r1");
    runtime
        .remove(&generation(&instance, "db", &first))
        .await
        .expect("remove r1");

    // An upgrade's successor (another revision) mounts the same volume.
    let second = runtime
        .create(&request(&instance, 7, spec("r2"), "r2"))
        .await
        .expect("create r2");
    let mut rows = String::new();
    for _ in 0..100 {
        rows = read_inside(&second, "/data/rows").await;
        if rows.lines().count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rows, "r1\nr2", "the data written by r1 survived into r2");
    let name = volume_name(
        &InstanceName::new(&instance),
        &ServiceName::new("db"),
        "data",
    );
    assert_eq!(
        runtime
            .instance_volumes(&InstanceName::new(&instance))
            .await
            .unwrap(),
        vec![name.clone()]
    );

    // Uninstalling the release removes the containers and keeps the volume.
    let provisioner = DockerProvisioner::new(runtime.clone());
    provisioner
        .uninstall(&ReleaseTarget {
            kind: ReleaseKind::Docker,
            release: Release {
                name: instance.clone(),
                namespace: DockerProvisioner::NAMESPACE.to_owned(),
            },
        })
        .await
        .expect("uninstall");
    assert!(
        docker(&["volume", "inspect", &name]).is_ok(),
        "uninstall keeps the volume"
    );

    // A later instance under the same name (another row id) is refused the
    // earlier one's data.
    let Err(RuntimeError::Refused(message)) = runtime
        .create(&request(&instance, 8, spec("r3"), "r3"))
        .await
    else {
        panic!("a kept volume of an earlier instance must not be mounted");
    };
    assert!(
        message.contains("kept from an earlier instance"),
        "{message}"
    );
    assert!(message.contains(&name), "{message}");

    // #41: deleting that later instance with --purge-volumes purges only
    // its own volumes, never the data kept from the earlier one.
    assert_eq!(
        runtime
            .purge_instance_volumes(&InstanceName::new(&instance), 8)
            .await
            .expect("purge of the later row"),
        Vec::<String>::new()
    );
    assert!(
        docker(&["volume", "inspect", &name]).is_ok(),
        "the earlier instance's kept data survives another row's purge"
    );
    let purged = runtime
        .purge_instance_volumes(&InstanceName::new(&instance), 7)
        .await
        .expect("purge");
    assert_eq!(purged, vec![name.clone()]);
    assert!(docker(&["volume", "inspect", &name]).is_err(), "purged");
    assert_eq!(
        runtime
            .purge_instance_volumes(&InstanceName::new(&instance), 7)
            .await
            .unwrap(),
        Vec::<String>::new(),
        "a second purge finds nothing and succeeds"
    );
}

#[tokio::test]
async fn services_of_one_instance_reach_each_other_by_name_and_no_one_else_does() {
    let runtime = runtime().await;
    let instance = unique("wknet");
    let other = unique("wknetb");
    let _cleanup = (Cleanup::new(&instance), Cleanup::new(&other));
    let on_network = |mut spec: ServiceSpec| {
        spec.run.instance_network = true;
        spec
    };
    let db = runtime
        .create(&request(&instance, 1, on_network(httpd_spec("db")), "1"))
        .await
        .expect("create db");
    let web = runtime
        .create(&request(
            &instance,
            1,
            on_network(script_spec("web", "true")),
            "1",
        ))
        .await
        .expect("create web");
    let stranger = runtime
        .create(&request(
            &other,
            2,
            on_network(script_spec("web", "true")),
            "1",
        ))
        .await
        .expect("create another instance's web");

    // (busybox wget's `-T` crashes the test image's static build: no -T.)
    let mut answer = Err(String::new());
    for _ in 0..50 {
        answer = docker(&["exec", web.as_str(), "wget", "-q", "-O-", "http://db:8080/"]);
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answer.as_deref().is_ok_and(|a| a.contains("stead test")),
        "web reaches db by its service name: {answer:?}"
    );
    let refused = docker(&[
        "exec",
        stranger.as_str(),
        "wget",
        "-q",
        "-O-",
        "http://db:8080/",
    ]);
    assert!(
        refused.is_err(),
        "another instance cannot resolve db: {refused:?}"
    );

    for (service, id) in [("db", &db), ("web", &web)] {
        runtime
            .remove(&generation(&instance, service, id))
            .await
            .expect("remove");
    }
    runtime
        .remove_network(&InstanceName::new(&instance))
        .await
        .expect("remove network");
    assert!(docker(&["network", "inspect", &format!("stead.{instance}")]).is_err());
    runtime
        .remove_network(&InstanceName::new(&instance))
        .await
        .expect("removing an absent network succeeds");
}

/// The address of `id` on its first network.
fn address_of(id: &ContainerId) -> String {
    let address = docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        id.as_str(),
    ])
    .expect("inspect the address");
    address
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{id} has no address"))
        .to_owned()
}

/// Whether a TCP connection from inside `from` to `address:port` opens
/// (busybox nc, bounded by its own timeout).
fn connects(from: &ContainerId, address: &str, port: u16) -> bool {
    let port = port.to_string();
    docker(&[
        "exec",
        from.as_str(),
        "busybox",
        "nc",
        "-w",
        "2",
        address,
        &port,
    ])
    .is_ok()
}

/// Bit 13 of the effective capability set (`CAP_NET_RAW`), read from
/// inside the container.
fn has_net_raw(id: &ContainerId) -> bool {
    let status = docker(&["exec", id.as_str(), "busybox", "cat", "/proc/self/status"])
        .expect("read /proc/self/status");
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .expect("CapEff line");
    let bits = u64::from_str_radix(effective.trim(), 16).expect("hex capability set");
    bits & (1 << 13) != 0
}

/// #54's walls: a lone service reaches no other instance's container, on
/// any network, and cannot open raw sockets unless its catalog adds the
/// capability back.
#[tokio::test]
async fn no_instance_reaches_another_and_no_container_keeps_net_raw() {
    if is_podman() {
        // Podman's compatible API accepts the wall and ignores it: stead
        // refuses to create there unless the operator turned walls off.
        let walled = runtime_with(DockerConfig {
            isolation: stead::adapters::docker::Isolation::Shared,
            ..config()
        })
        .await;
        let instance = unique("wkwallp");
        let _cleanup = Cleanup::new(&instance);
        let refused = walled
            .create(&request(&instance, 1, httpd_spec("web"), "1"))
            .await
            .expect_err("no container on a network that does not wall it");
        assert!(
            matches!(&refused, RuntimeError::Refused(m) if m.contains("enable_icc") && m.contains("docker.isolation")),
            "{refused:?}"
        );
        return;
    }
    let runtime = runtime().await;
    let (a, b, pair) = (unique("wkwalla"), unique("wkwallb"), unique("wkwallc"));
    let _cleanup = (Cleanup::new(&a), Cleanup::new(&b), Cleanup::new(&pair));
    let lone = |instance: &str, id: i64| request(instance, id, httpd_spec("web"), "1");
    let a_web = runtime.create(&lone(&a, 1)).await.expect("create a");
    let b_web = runtime.create(&lone(&b, 2)).await.expect("create b");
    let mut db = httpd_spec("db");
    db.run.instance_network = true;
    let pair_db = runtime
        .create(&request(&pair, 3, db, "1"))
        .await
        .expect("create a service with a peer");

    // Each answers on its own loopback: the wall is not a dead port.
    for id in [&a_web, &b_web, &pair_db] {
        let mut up = false;
        for _ in 0..50 {
            up = connects(id, "127.0.0.1", 8080);
            if up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(up, "{id} answers on its own port");
    }
    assert!(
        !connects(&a_web, &address_of(&b_web), 8080),
        "a lone service reaches another lone service on the shared network"
    );
    assert!(
        !connects(&a_web, &address_of(&pair_db), 8080),
        "a lone service reaches another instance's network"
    );
    assert!(
        !connects(&pair_db, &address_of(&a_web), 8080),
        "an instance network reaches a lone service"
    );
    assert!(!has_net_raw(&a_web), "NET_RAW is dropped by default");
    assert!(!has_net_raw(&pair_db), "NET_RAW is dropped by default");

    // The catalog may add it back where the operator granted it (the
    // catalog checks the grant; the runtime applies what the spec says).
    let raw = unique("wkwallr");
    let _cleanup_raw = Cleanup::new(&raw);
    let mut with_raw = httpd_spec("web");
    with_raw.run.cap_add = vec!["NET_RAW".into()];
    let raw_web = runtime
        .create(&request(&raw, 4, with_raw, "1"))
        .await
        .expect("create with NET_RAW added back");
    assert!(has_net_raw(&raw_web), "cap_add gives NET_RAW back");
}

#[tokio::test]
async fn a_catalog_network_is_joined_by_its_exact_name_never_an_id_prefix() {
    let runtime = runtime().await;
    let instance = unique("wkjoin");
    let shared = unique("wkshared");
    let id = docker(&["network", "create", &shared]).expect("create a network to join");
    let id = id.trim().to_owned();
    // Declared before the containers' cleanup, so dropped after it: a
    // network with a container on it cannot be removed (it leaked so, one
    // per run, until Docker's address pools ran out).
    let _network = NetworkCleanup(shared.clone());
    let _cleanup = Cleanup::new(&instance);
    // An ID prefix names the network to Docker, never to stead.
    let mut by_prefix = script_spec("web", "true");
    by_prefix.run.networks = vec![id[..12].to_owned()];
    let refused = runtime
        .create(&request(&instance, 1, by_prefix, "1"))
        .await
        .expect_err("an ID prefix is not a network's name");
    assert!(
        matches!(&refused, RuntimeError::Refused(m) if m.contains("exact name")),
        "{refused:?}"
    );
    let mut by_name = script_spec("web", "true");
    by_name.run.networks = vec![shared.clone()];
    let joined = runtime
        .create(&request(&instance, 1, by_name, "2"))
        .await
        .expect("join by name");
    let networks = docker(&[
        "inspect",
        "--format",
        "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}",
        joined.as_str(),
    ])
    .unwrap();
    assert!(
        networks.split_whitespace().any(|n| n == shared),
        "{networks}"
    );
}

/// Removes a test's own network on drop.
struct NetworkCleanup(String);

impl Drop for NetworkCleanup {
    fn drop(&mut self) {
        let _ = docker(&["network", "rm", &self.0]);
    }
}

#[tokio::test]
async fn a_network_stead_does_not_own_is_neither_joined_nor_removed() {
    let runtime = runtime().await;
    let instance = unique("wkforeign");
    let network = format!("stead.{instance}");
    docker(&["network", "create", &network]).expect("create a foreign network");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = httpd_spec("db");
    spec.run.instance_network = true;
    let Err(RuntimeError::Refused(message)) =
        runtime.create(&request(&instance, 1, spec, "1")).await
    else {
        panic!("a foreign network under the instance's name must be refused");
    };
    assert!(message.contains("not this instance's"), "{message}");
    runtime
        .remove_network(&InstanceName::new(&instance))
        .await
        .expect("leaving it is not an error");
    assert!(
        docker(&["network", "inspect", &network]).is_ok(),
        "left alone"
    );
    docker(&["network", "rm", &network]).unwrap();
}

#[tokio::test]
async fn limits_user_entrypoint_labels_and_bind_mounts_are_applied() {
    let runtime: DockerRuntime = runtime().await;
    let instance = unique("wkrun");
    let _cleanup = Cleanup::new(&instance);
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("config"), "from-the-host").unwrap();
    let mut spec = httpd_spec("app");
    spec.healthcheck = None;
    spec.ports = Vec::new();
    spec.run = Box::new(RunSpec {
        memory_bytes: Some(64 * 1024 * 1024),
        nano_cpus: Some(500_000_000),
        user: Some("65534:65534".into()),
        entrypoint: vec!["/bin/sh".into(), "-c".into()],
        labels: BTreeMap::from([("com.example.tier".into(), "backend".into())]),
        mounts: vec![Mount {
            source: MountSource::HostPath(host.path().display().to_string()),
            target: "/etc/app".into(),
            read_only: true,
        }],
        ..RunSpec::default()
    });
    spec.command = vec!["id -u > /tmp/uid; exec sleep 600".into()];
    let id = runtime
        .create(&request(&instance, 1, spec, "1"))
        .await
        .expect("create");
    let inspected = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.NanoCpus}} {{.Config.User}} {{json .Config.Entrypoint}} {{index .Config.Labels \"com.example.tier\"}} {{index .Config.Labels \"stead.managed\"}}",
        id.as_str(),
    ])
    .unwrap();
    assert_eq!(
        inspected,
        "67108864 512 500000000 65534:65534 [\"/bin/sh\",\"-c\"] backend true"
    );
    assert_eq!(read_inside(&id, "/etc/app/config").await, "from-the-host");
    let written = docker(&["exec", id.as_str(), "sh", "-c", "echo x > /etc/app/new"]);
    assert!(written.is_err(), "a read-only bind mount refuses writes");
}

#[tokio::test]
async fn every_container_gets_the_operators_memory_pids_log_rotation_and_no_new_privileges() {
    let limits = ContainerLimits::new(&RawLimits {
        memory_default_mb: Some(96),
        pids_limit: Some(100),
        log_max_size_mb: Some(5),
        log_max_files: Some(2),
        ..Default::default()
    })
    .unwrap();
    let runtime = runtime_with(stead::adapters::docker::DockerConfig { limits, ..config() }).await;
    let instance = unique("wklim");
    let _cleanup = Cleanup::new(&instance);
    // The catalog names no memory: the operator's default applies.
    let spec = script_spec("app", "cat /proc/self/status > /tmp/status");
    let id = runtime
        .create(&request(&instance, 1, spec, "1"))
        .await
        .expect("create");
    let inspected = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{json .HostConfig.SecurityOpt}} {{.HostConfig.LogConfig.Type}} {{json .HostConfig.LogConfig.Config}}",
        id.as_str(),
    ])
    .unwrap();
    if is_podman() {
        // Podman 4.3 keeps one log file, truncated at max-size, ignores
        // max-file, and its compatible inspect shows no log options: its
        // own inspect has the size (docs/operations.md, "Podman").
        assert_eq!(
            inspected,
            "100663296 100 [\"no-new-privileges\"] json-file null"
        );
        assert_eq!(podman_log_size(&id), "5MB");
    } else {
        assert_eq!(
            inspected,
            "100663296 100 [\"no-new-privileges\"] json-file {\"max-file\":\"2\",\"max-size\":\"5m\"}"
        );
    }
    let status = read_inside(&id, "/tmp/status").await;
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["NoNewPrivs:", "1"])),
        "the process runs with no_new_privs: {status}"
    );
}

/// The log size limit Podman's own inspect reports (its compatible API
/// shows none).
fn podman_log_size(id: &ContainerId) -> String {
    let socket = support_services::docker::socket_path();
    let output = std::process::Command::new("podman")
        .arg("--url")
        .arg(format!("unix://{}", socket.display()))
        .args([
            "inspect",
            "--format",
            "{{.HostConfig.LogConfig.Size}}",
            id.as_str(),
        ])
        .output()
        .expect("the podman client runs");
    assert!(output.status.success(), "podman inspect: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The test image with a `VOLUME /scratch` declared, as many published
/// images declare one: each container of it gets an anonymous volume.
/// Made from the test image's filesystem by `docker import`, once.
fn image_with_anonymous_volume() -> String {
    const IMAGE: &str = "stead-test/busybox-anon:1";
    if docker(&["image", "inspect", "--format", "{{.Id}}", IMAGE]).is_ok() {
        return IMAGE.to_owned();
    }
    let base = httpd_spec("x").image;
    let donor = unique("wkanon-donor");
    docker(&["create", "--name", &donor, &base, "true"]).expect("create the donor");
    let dir = tempfile::tempdir().expect("temp dir");
    let tar = dir.path().join("rootfs.tar");
    let tar = tar.to_str().expect("a UTF-8 temp path");
    let exported = docker(&["export", "-o", tar, &donor]);
    let _ = docker(&["rm", "-f", &donor]);
    exported.expect("export the test image's filesystem");
    // `import` with a change, not `commit`: Podman's compatible API
    // refuses the docker CLI's commit.
    docker(&["import", "--change", "VOLUME [\"/scratch\"]", tar, IMAGE])
        .expect("import the image with a VOLUME");
    IMAGE.to_owned()
}

/// #41 item 8: removing a container removes the anonymous volumes its
/// image declared (`v: true`), so an image with a `VOLUME` cannot fill
/// the host's disk one upgrade or recreate at a time; the instance's named
/// volume, mounted beside it, is kept.
#[tokio::test]
async fn removing_a_container_removes_its_anonymous_volumes_and_keeps_named_ones() {
    let runtime = runtime().await;
    let instance = unique("wkanon");
    let _cleanup = Cleanup::new(&instance);
    let mut spec = script_spec("app", "echo kept > /data/f; echo scratch > /scratch/f");
    spec.image = image_with_anonymous_volume();
    spec.run.mounts = vec![Mount {
        source: MountSource::Volume("data".into()),
        target: "/data".into(),
        read_only: false,
    }];
    let id = runtime
        .create(&request(&instance, 9, spec, "r1"))
        .await
        .expect("create");
    assert_eq!(read_inside(&id, "/scratch/f").await, "scratch");
    let named = volume_name(
        &InstanceName::new(&instance),
        &ServiceName::new("app"),
        "data",
    );
    let mounted = docker(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Destination}}={{.Name}} {{end}}",
        id.as_str(),
    ])
    .expect("inspect the mounts");
    let anonymous = mounted
        .split_whitespace()
        .find_map(|m| m.strip_prefix("/scratch="))
        .unwrap_or_else(|| panic!("no volume at /scratch: {mounted}"))
        .to_owned();
    assert_ne!(anonymous, named);
    assert!(docker(&["volume", "inspect", &anonymous]).is_ok());
    runtime
        .remove(&generation(&instance, "app", &id))
        .await
        .expect("remove");
    assert!(
        docker(&["volume", "inspect", &anonymous]).is_err(),
        "the anonymous volume {anonymous} outlived its container"
    );
    assert!(
        docker(&["volume", "inspect", &named]).is_ok(),
        "the named volume {named} must be kept"
    );
}
