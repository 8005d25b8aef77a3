//! The runtime's events as early wake-ups of recovery (T7).
//!
//! [`follow`] reads the event stream, shows every event to the runtime (a
//! caching runtime drops what it made stale) and wakes the instance of each
//! event that can change what recovery would do. [`drain`], run by a fixed
//! number of workers inside the daemon's task set, recovers woken
//! instances one at a time each: bursts coalesce in the [`WakeQueue`]'s one
//! slot per instance, work is bounded by the number of workers, shutdown
//! waits for them, and they act only while this process holds the
//! reconciler lease. The periodic pass stays the safety net: a lost,
//! dropped or coalesced event costs at most one tick.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::core::errors::PortFailure;
use crate::core::pass::is_recovered;
use crate::ports::{Clock, Runtime, RuntimeEvents, Store};

use super::recovery::Recoverer;
use super::wake::{Wake, WakeQueue};

/// Workers draining the wake-up queue by default.
pub const EVENT_WORKERS_DEFAULT: usize = 4;
/// Pause before subscribing again after the stream ended or failed.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(1);
/// How long a subscription may take to answer. A runtime port whose
/// subscribe accepts the request and never answers would otherwise hold
/// the follower forever, long after the runtime recovered: events would be
/// lost until the daemon restarted, every recovery a tick late. (Docker's
/// subscribe is lazy, its request goes out on the first read; a stream
/// that stays silent is, to the follower, a quiet fleet.)
pub const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// A woken instance that was busy (a worker or another pass held it) is
/// tried again this much later.
const BUSY_RETRY: Duration = Duration::from_millis(500);

/// Follows the event stream until `stop`, subscribing again whenever it
/// ends; each subscription replays from the last event seen.
pub async fn follow(
    source: Arc<dyn RuntimeEvents>,
    runtime: Arc<dyn Runtime>,
    clock: Arc<dyn Clock>,
    queue: Arc<WakeQueue>,
    mut stop: watch::Receiver<bool>,
) {
    let mut since = clock.now();
    while !*stop.borrow() {
        let subscribed = tokio::select! {
            // In order, not at random: the simulation must replay exactly.
            biased;
            s = tokio::time::timeout(SUBSCRIBE_TIMEOUT, source.subscribe(since)) => s,
            _ = stopped(&mut stop) => return,
        };
        match subscribed {
            Err(_) => tracing::warn!(
                timeout = ?SUBSCRIBE_TIMEOUT,
                "runtime events: subscribe did not answer in time; retrying"
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "runtime events: subscribe failed; retrying"),
            Ok(Ok(mut subscription)) => {
                runtime.events_followed(true);
                loop {
                    let item = tokio::select! {
                        // In order, not at random: the simulation must replay exactly.
                        biased;
                        item = subscription.next_event() => item,
                        _ = stopped(&mut stop) => {
                            runtime.events_followed(false);
                            return;
                        }
                    };
                    let event = match item {
                        None => break,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "runtime event stream failed; subscribing again");
                            break;
                        }
                        Some(Ok(event)) => event,
                    };
                    runtime.event_seen(&event);
                    since = clock.now();
                    if event.action.wakes_recovery() {
                        metrics::counter!("stead_docker_events_total").increment(1);
                        if queue.wake(&event.instance, Instant::now()) == Wake::Full {
                            metrics::counter!("stead_wakeups_dropped_total").increment(1);
                        }
                    }
                }
                // The stream dropped: the runtime may have restarted, and a
                // replay would not cover that. Nothing cached is trusted.
                runtime.events_followed(false);
            }
        }
        tokio::select! {
            // In order, not at random: the simulation must replay exactly.
            biased;
            _ = tokio::time::sleep(RESUBSCRIBE_DELAY) => {}
            _ = stopped(&mut stop) => return,
        }
    }
}

/// One worker: recovers woken instances until `stop`. A standby (no lease)
/// leaves them to the leader; a busy instance is woken again shortly.
pub async fn drain(
    recoverer: Arc<Recoverer>,
    store: Arc<dyn Store>,
    queue: Arc<WakeQueue>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let name = tokio::select! {
            // In order, not at random: the simulation must replay exactly.
            biased;
            name = queue.next() => name,
            _ = stopped(&mut stop) => return,
        };
        if recoverer.lease().current().is_none() {
            continue;
        }
        let instance = match store.instance(&name).await {
            Ok(Some(instance)) if is_recovered(instance.state) => instance,
            Ok(_) => continue,
            Err(e) => {
                let (port, kind) = e.failure();
                super::count_port_failure(port, kind);
                tracing::warn!(instance = %name, error = %e, "woken instance not loaded");
                continue;
            }
        };
        let outcome = recoverer.recover_instance(&instance).await;
        if outcome.skipped_busy {
            queue.wake(&name, Instant::now() + BUSY_RETRY);
        }
        for e in &outcome.errors {
            tracing::warn!(instance = %name, "targeted pass: {e}");
        }
    }
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
