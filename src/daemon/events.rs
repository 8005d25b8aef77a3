//! Docker's event stream wired into the engine's wake-ups (T7): one
//! follower and a fixed number of draining workers, all in the daemon's
//! task set, so shutdown waits for them and their number is bounded.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::engine::events::{drain, follow, EVENT_WORKERS_DEFAULT};
use crate::ports::RuntimeEvents;

use super::Daemon;

/// Spawns the follower and the workers into `tasks`.
pub fn spawn(daemon: &Arc<Daemon>, tasks: &mut JoinSet<()>, stop: &watch::Receiver<bool>) {
    let source: Arc<dyn RuntimeEvents> = Arc::new(daemon.docker.clone());
    tasks.spawn(follow(
        source,
        daemon.ports.runtime.clone(),
        daemon.ports.clock.clone(),
        daemon.wake.clone(),
        stop.clone(),
    ));
    for _ in 0..EVENT_WORKERS_DEFAULT {
        tasks.spawn(drain(
            daemon.recoverer.clone(),
            daemon.ports.store.clone(),
            daemon.wake.clone(),
            stop.clone(),
        ));
    }
}
