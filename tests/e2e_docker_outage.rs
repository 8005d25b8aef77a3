//! dockerd going away under a running daemon. Restarting the machine's real
//! dockerd would kill every other test's containers (and other people's), so
//! the daemon talks to dockerd through a unix-socket relay this test owns:
//! closing the relay (and every connection through it, the event stream
//! included) is, to the daemon, exactly dockerd going down; reopening it is
//! dockerd coming back. Meanwhile the container is killed for real.

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
    let name = unique("e2eoutage");
    let _cleanup = Cleanup::new(&name);
    let dir = tempfile::tempdir().unwrap();
    let relay_path = dir.path().join("docker.sock");
    let mut relay = open_relay(relay_path.clone());
    let h = Harness::start(Setup {
        extra_config: format!(
            "\n[docker]\nsocket = \"{}\"\nrequest_timeout_s = 2\n",
            relay_path.display()
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

    // dockerd "goes down", and the container dies while it is.
    relay.abort();
    let _ = relay.await;
    let _ = std::fs::remove_file(&relay_path);
    docker(&["kill", &id]).unwrap();
    let before = h.daemon.reconciler.last_tick_s();
    wait_until(
        "ticks go on without docker",
        Duration::from_secs(20),
        || async { h.daemon.reconciler.last_tick_s() >= before + 3 },
    )
    .await;

    // dockerd "comes back": the daemon notices and recovers the container.
    relay = open_relay(relay_path.clone());
    wait_until("recovered and served", Duration::from_secs(60), || async {
        h.get(&name).await == 200
    })
    .await;
    relay.abort();
}
