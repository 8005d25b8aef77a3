//! Docker's event stream wired into the engine's wake-ups (T7): one
//! follower and a fixed number of draining workers, all in the daemon's
//! task set, so shutdown waits for them and their number is bounded.

use std::sync::Arc;

use tokio::sync::watch;

use crate::engine::events::{drain, follow, EVENT_WORKERS_DEFAULT};
use crate::ports::RuntimeEvents;

use super::{Daemon, Tasks};

/// Spawns the follower into `tasks`: Docker's events wake their instances.
pub fn spawn_follower(daemon: &Arc<Daemon>, tasks: &mut Tasks, stop: &watch::Receiver<bool>) {
    let source: Arc<dyn RuntimeEvents> = Arc::new(daemon.docker.clone());
    tasks.spawn(
        "docker events follower",
        follow(
            source,
            daemon.ports.runtime.clone(),
            daemon.ports.clock.clone(),
            daemon.wake.clone(),
            stop.clone(),
        ),
    );
}

/// Spawns the workers that drain the wake-up queue into `tasks`: fed by
/// the follower and by the recovery pass itself (a delayed service's
/// backoff expiring), so they run with or without Docker's events.
pub fn spawn_drainers(daemon: &Arc<Daemon>, tasks: &mut Tasks, stop: &watch::Receiver<bool>) {
    for n in 0..EVENT_WORKERS_DEFAULT {
        tasks.spawn(
            format!("wake drainer {n}"),
            drain(
                daemon.recoverer.clone(),
                daemon.ports.store.clone(),
                daemon.wake.clone(),
                stop.clone(),
            ),
        );
    }
}
