//! dockerd going away under a running daemon, and coming back.
//!
//! Where the dockerd is the tests' own (`scripts/services up` started it
//! and recorded its pid; `scripts/test` then sets
//! `STEAD_TEST_RESTART_DOCKERD=1`, as CI always does), the test really
//! restarts it: `scripts/services stop-dockerd` stops every container on
//! the engine, the event stream and API go away, and `start-dockerd` brings
//! a fresh dockerd back. Anywhere else (a developer's own dockerd, which a
//! test must never restart) the daemon talks to dockerd through a
//! unix-socket relay this test owns: closing it (and every connection
//! through it, the event stream included) is, to the daemon, dockerd going
//! down, and the served container is killed for real meanwhile.

mod e2e;
mod support_services;

use std::path::PathBuf;
use std::time::Duration;

use e2e::{wait_until, Harness, Setup};
use support_services::docker::{docker, Cleanup};
use support_services::unique;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// Accepts on `path` and relays every connection to dockerd.
fn open_relay(path: PathBuf) -> JoinHandle<()> {
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind relay socket");
    tokio::spawn(async move {
        // Dropping this task (abort) drops the connections' handles, not
        // the connections: abort them explicitly on the way out.
        struct AbortAll(Vec<JoinHandle<()>>);
        impl Drop for AbortAll {
            fn drop(&mut self) {
                for c in &self.0 {
                    c.abort();
                }
            }
        }
        let mut guard = AbortAll(Vec::new());
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let task = tokio::spawn(async move {
                if let Ok(mut server) = UnixStream::connect(DOCKER_SOCKET).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
            guard.0.push(task);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_keeps_ticking_through_a_docker_outage_and_recovers() {
    let restart = std::env::var("STEAD_TEST_RESTART_DOCKERD").is_ok_and(|v| v == "1");
    let name = unique("e2eoutage");
    let _cleanup = Cleanup::new(&name);
    let dir = tempfile::tempdir().unwrap();
    let relay_path = dir.path().join("docker.sock");
    let mut relay = (!restart).then(|| open_relay(relay_path.clone()));
    let socket = if restart {
        PathBuf::from(DOCKER_SOCKET)
    } else {
        relay_path.clone()
    };
    let h = Harness::start(Setup {
        extra_config: format!(
            "\n[docker]\nsocket = \"{}\"\nrequest_timeout_s = 2\n",
            socket.display()
        ),
        ..Setup::default()
    })
    .await;
    h.create(&name, None).await;
    wait_until("served", Duration::from_secs(60), || async {
        h.get(&name).await == 200
    })
    .await;
    let id = h.active_container(&name).await.unwrap();

    // dockerd goes down, and the container dies with it.
    if restart {
        eprintln!("outage: restarting the tests' own dockerd");
        services(&["stop-dockerd"]).await;
    } else {
        eprintln!("outage: cutting the relay to a dockerd the tests do not own");
        if let Some(relay) = relay.take() {
            relay.abort();
            let _ = relay.await;
        }
        let _ = std::fs::remove_file(&relay_path);
        docker(&["kill", &id]).unwrap();
    }
    let before = h.daemon().reconciler.last_tick_s();
    wait_until(
        "ticks go on without docker",
        Duration::from_secs(20),
        || async { h.daemon().reconciler.last_tick_s() >= before + 3 },
    )
    .await;

    // dockerd comes back: the daemon notices and recovers the container.
    if restart {
        services(&["start-dockerd"]).await;
    } else {
        relay = Some(open_relay(relay_path.clone()));
    }
    wait_until("recovered and served", Duration::from_secs(90), || async {
        h.get(&name).await == 200
    })
    .await;
    assert_eq!(
        h.active_container(&name).await.as_deref(),
        Some(id.as_str()),
        "the same generation was started again, not replaced"
    );
    if let Some(relay) = relay {
        relay.abort();
    }
}

/// Runs `scripts/services` with an argument vector, off the runtime.
async fn services(args: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/services");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&script).args(&args).output()
    })
    .await
    .unwrap()
    .expect("run scripts/services");
    assert!(
        output.status.success(),
        "scripts/services failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
