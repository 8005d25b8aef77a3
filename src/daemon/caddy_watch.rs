//! Caddy as a neighbour (#43): a Caddy reloaded with another config
//! (`systemctl reload caddy` after the Caddyfile changed, a `caddy reload`,
//! a `POST /load`) or restarted without `--resume` no longer holds stead's
//! servers or routes. Every tick notices and republishes (T5), but a tick
//! may be a minute away; this watcher reads whether stead's servers are
//! there every `caddy.watch_interval_ms` (one small read of each server's
//! `listen`) and wakes the reconciler the moment they are gone, so the
//! verified routes are back within seconds.
//!
//! It decides nothing and writes nothing to Caddy: the tick it wakes makes
//! sure of the plane and republishes exactly what it would have at its
//! usual time, without a probe. It runs while this replica leads, logs
//! each loss once and counts it (`stead_caddy_config_lost_total`); an
//! unreachable Caddy is the tick's to report, not the watcher's.

use std::sync::Arc;

use tokio::sync::watch;

use super::Daemon;

/// Polls Caddy until `stop` turns true.
pub async fn run(daemon: Arc<Daemon>, mut stop: watch::Receiver<bool>) {
    let interval = daemon.config.caddy.watch_interval;
    // Whether the last read found stead's servers gone, so a loss is
    // logged, counted and woken for once, however many reads see it.
    let mut lost = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => {}
            _ = tokio::time::sleep(interval) => {}
        }
        if *stop.borrow() {
            return;
        }
        if !daemon.reconciler.holds_lease() {
            lost = false;
            continue;
        }
        match daemon.caddy.servers_present().await {
            Ok(true) => {
                if lost {
                    tracing::info!("stead's servers are back in caddy");
                }
                lost = false;
            }
            Ok(false) if !lost => {
                lost = true;
                ::metrics::counter!("stead_caddy_config_lost_total").increment(1);
                tracing::warn!(
                    admin = %daemon.config.caddy.admin,
                    "caddy no longer holds stead's servers (reloaded with another config, or restarted without --resume); republishing now, not at the next tick"
                );
                daemon.reconciler.wake();
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "caddy watch: no answer"),
        }
    }
}
