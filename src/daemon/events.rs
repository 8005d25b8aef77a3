//! Docker's event stream as a hint: a `die`, `health_status` or `destroy`
//! of a managed container triggers an immediate recovery of that one
//! instance. Every event also drops the container's cached inspect answer
//! (the stream is what makes that cache sound). The periodic level-triggered pass stays the safety net; a lost
//! event (stream dropped, instance busy) costs at most one tick interval.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{watch, Semaphore};

use crate::adapters::docker::{RuntimeEvent, RuntimeEventAction};
use crate::core::types::InstanceName;

use super::Daemon;

/// Pause before resubscribing after the stream ended or failed.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(1);
/// Targeted passes running at once; further events wait for a permit.
const TARGETED_PASSES_MAX: usize = 16;
/// A targeted pass that finds the instance busy (a worker or the periodic
/// pass holds its lock) tries again this many times, this far apart.
const BUSY_RETRIES_MAX: u32 = 20;
const BUSY_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Follows the event stream until `stop`, resubscribing when it ends.
pub async fn follow(daemon: Arc<Daemon>, mut stop: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(TARGETED_PASSES_MAX));
    let mut since = daemon.ports.clock.now();
    while !*stop.borrow() {
        let mut stream = daemon.docker.events(since);
        tracing::debug!("subscribed to docker events");
        // Events since `since` are replayed, so answers cached from now on
        // are invalidated by every later change (see `read_cache.rs`).
        let cache = daemon.docker.read_cache();
        cache.set_following(true);
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = stop.changed() => {
                    cache.set_following(false);
                    return;
                }
            };
            match item {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "docker event stream failed; resubscribing");
                    break;
                }
                Some(Ok(event)) => {
                    cache.invalidate(&event.container);
                    // Resubscribing replays from here, so nothing between
                    // the drop and the new subscription is lost.
                    since = daemon.ports.clock.now();
                    if triggers_pass(&event) {
                        metrics::counter!("stead_docker_events_total").increment(1);
                        let daemon = daemon.clone();
                        let permits = permits.clone();
                        tokio::spawn(async move {
                            let Ok(_permit) = permits.acquire().await else {
                                return;
                            };
                            targeted_pass(&daemon, &event.instance).await;
                        });
                    }
                }
            }
        }
        // The stream dropped: dockerd may have restarted, and its replay
        // would not cover that. Nothing cached is trusted any more.
        cache.set_following(false);
        tokio::select! {
            _ = tokio::time::sleep(RESUBSCRIBE_DELAY) => {}
            _ = stop.changed() => return,
        }
    }
}

fn triggers_pass(event: &RuntimeEvent) -> bool {
    matches!(
        event.action,
        RuntimeEventAction::Die | RuntimeEventAction::HealthStatus(_) | RuntimeEventAction::Destroy
    )
}

/// Loads the instance and recovers it alone, retrying briefly while busy.
pub async fn targeted_pass(daemon: &Daemon, name: &InstanceName) {
    let instance = match daemon.ports.store.instance(name).await {
        Ok(Some(instance)) => instance,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(instance = %name, error = %e, "targeted pass: load failed");
            return;
        }
    };
    for _ in 0..BUSY_RETRIES_MAX {
        let outcome = daemon.recoverer.recover_instance(&instance).await;
        if !outcome.skipped_busy {
            for e in &outcome.errors {
                tracing::warn!(instance = %name, "targeted pass: {e}");
            }
            return;
        }
        tokio::time::sleep(BUSY_RETRY_DELAY).await;
    }
}
