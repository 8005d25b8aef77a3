//! The loop (C9, C10): one tick (clock reading, lease, recovery beside
//! the control checks, gauges, heartbeat), then a pause a stop or a wake
//! cuts short.

use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tracing::Instrument;

use crate::core::fleet::RolloutState;
use crate::engine::clock::ClockCheck;
use crate::ports::Anchored;

use super::{Check, LostServices, Reconciler, TickOutcome};

impl Reconciler {
    /// One tick (C9): checks, gauges, heartbeat.
    pub async fn tick(&self) -> TickOutcome {
        let traceparent = self.new_traceparent();
        let span = tracing::info_span!("tick", traceparent = %traceparent);
        crate::engine::trace::origin(&span, &traceparent);
        // tokio's clock: virtual under madsim, so the simulation stays
        // deterministic; only the gauge reads it.
        let started = tokio::time::Instant::now();
        let outcome = self.tick_inner(traceparent).instrument(span).await;
        metrics::gauge!("stead_tick_duration_seconds").set(started.elapsed().as_secs_f64());
        // The heartbeat answers "is the loop running", never "is everything
        // fine": it is set unconditionally (C3).
        let now = self.ports.clock.now();
        self.last_tick_s.store(now.as_second(), Ordering::Relaxed);
        metrics::gauge!("stead_last_tick_timestamp_seconds").set(now.as_second() as f64);
        outcome
    }

    async fn tick_inner(&self, traceparent: String) -> TickOutcome {
        let mut out = TickOutcome {
            traceparent: traceparent.clone(),
            ..Default::default()
        };
        // Read every tick, so that every reading is compared with the last.
        let reading = crate::engine::clock::anchor(
            self.ports.clock.as_ref(),
            self.ports.store.as_ref(),
            true,
        )
        .await;
        let verified = match reading {
            ClockCheck::Unanchored => {
                // Never anchored: this host's clock may be minutes off the
                // database's, and a TTL, a window or a budget timed by it
                // would be wrong for every other process. Nothing is
                // decided until the database answers (it is down, so no
                // lease could be taken either).
                tracing::warn!("the database's clock was never read; this tick decides nothing");
                return out;
            }
            ClockCheck::Steady => true,
            ClockCheck::Unverified(reading) => self.clock_unverified(reading),
        };
        out.clock_unverified = !verified;
        if !self.take_lease(verified).await {
            // What a pass of an earlier leadership found gone is not this
            // moment's truth: another leader may have repaired it since.
            *self.lost_services.lock().unwrap_or_else(|e| e.into_inner()) = LostServices::default();
            return out;
        }
        out.leader = true;
        if !self.ports.clock.settled() {
            // A step of the database's clock is in doubt: the lease is
            // renewed, and nothing is decided or done until a reading
            // settles it (said once above, not as failing checks).
            return out;
        }

        // The control checks run beside the recovery pass, not behind it:
        // a hung runtime holds up one batch of recovery (each instance to
        // its deadline), never TTL, lease expiry or drift (issue #14).
        let mut control = TickOutcome::default();
        let (pass, ()) = tokio::join!(
            self.recoverer.pass_traced(Some(&traceparent)),
            self.control_checks(traceparent.clone(), verified, &mut control)
        );
        if !pass.errors.is_empty() {
            let errors: Vec<String> = pass.errors.iter().map(ToString::to_string).collect();
            out.failed.push((Check::Recovery, errors.join("; ")));
        }
        self.learn_lost_services(&pass);
        out.recovered = pass
            .instances
            .iter()
            .filter(|(_, i)| i.driven)
            .map(|(name, _)| name.clone())
            .collect();
        for (name, instance) in &pass.instances {
            for e in &instance.errors {
                out.warnings.push(format!("recovery {name}: {e}"));
            }
        }
        out.failed.append(&mut control.failed);
        out.warnings.append(&mut control.warnings);
        out.tasks_enqueued += control.tasks_enqueued;
        for (check, _) in &out.failed {
            metrics::counter!("stead_check_failures_total", "check" => check.as_str()).increment(1);
        }
        self.log_failures(&out.failed);
        self.log_warnings(&out.warnings);
        self.gauges().await;
        self.prune_events().await;
        out
    }

    /// A reading of the database's clock that nothing vouches for: says
    /// why, and stops trusting the lease in hand until the store confirms
    /// it. Returns whether the tick may go on as if verified (only when
    /// the mutation exercise breaks the rule).
    fn clock_unverified(&self, reading: Anchored) -> bool {
        match reading {
            Anchored::Jumped(by) => {
                metrics::counter!("stead_clock_jumps_total", "cause" => "database").increment(1);
                tracing::warn!(
                    jump_ms = by.as_millis() as i64,
                    "the database's clock is {by:#} off where this process's clocks put it (it \
                     stepped); this process keeps its own reckoning until a reading a minute \
                     later agrees, checks its lease with the store, and this tick expires no \
                     TTL, requeues no task and takes over no lease"
                );
                self.recoverer.lease().distrust();
            }
            Anchored::StoodStill(by) => {
                metrics::counter!("stead_clock_jumps_total", "cause" => "stood_still").increment(1);
                tracing::warn!(
                    stood_still_ms = by.as_millis() as i64,
                    "this process stood still for {by:#} while the world went on (a suspended \
                     host or a paused VM: its monotonic clock stopped); it checks its lease with \
                     the store, and this tick expires no TTL, requeues no task and takes over no \
                     lease"
                );
                self.recoverer.lease().distrust();
            }
            // Every start: said once, quietly.
            Anchored::First | Anchored::Steady => tracing::info!(
                "first reading of the database's clock: TTL expiries, task requeues and lease \
                 takeovers wait for the next tick's reading to agree with it"
            ),
        }
        crate::broken!(self.config.broken, IgnoreClockJump)
    }

    /// Queue depth and instances by state; diagnostics, never a failed
    /// tick (C3).
    async fn gauges(&self) {
        let store = &self.ports.store;
        match store.queue_depth().await {
            Ok(depth) => metrics::gauge!("stead_queue_depth").set(depth as f64),
            Err(e) => tracing::warn!(error = %e, "gauge queue_depth"),
        }
        match store.instance_counts().await {
            Ok(counts) => {
                for (state, n) in counts {
                    metrics::gauge!("stead_instances", "state" => state.as_str()).set(n as f64);
                }
            }
            Err(e) => tracing::warn!(error = %e, "gauge instances"),
        }
        let delayed = self.recoverer.delays_in_force();
        metrics::gauge!("stead_budget_delays_in_force").set(delayed as f64);
        self.halted_gauge().await;
    }

    /// `stead_rollout_halted{service_type}`: 1 for each type whose rollout
    /// is halted (by the store's switch or the catalog file), 0 for every
    /// other type the catalog lists or the store has a switch for, so an
    /// alert sees a halt as long as it lasts, whatever halted it (#55).
    async fn halted_gauge(&self) {
        let records = match self.ports.store.rollout_records().await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "gauge rollout_halted");
                return;
            }
        };
        let catalog = self.catalog.current();
        let mut halted: std::collections::BTreeMap<&str, bool> = catalog
            .entries()
            .map(|e| (e.service_type.as_str(), e.rollout == RolloutState::Halted))
            .collect();
        for record in &records {
            *halted.entry(record.service_type.as_str()).or_default() |=
                record.state == RolloutState::Halted;
        }
        for (service_type, halted) in halted {
            metrics::gauge!("stead_rollout_halted", "service_type" => service_type.to_owned())
                .set(if halted { 1.0 } else { 0.0 });
        }
    }

    /// Retention of the event log, of the finished tasks it names and of
    /// the type versions no live instance, pin or newest record holds:
    /// never fails the tick (C3).
    async fn prune_events(&self) {
        let Some(retention) = self.event_retention.get() else {
            return;
        };
        let now = self.ports.clock.now();
        let store = self.ports.store.as_ref();
        if let Err(e) = crate::engine::event_log::prune(store, now, *retention).await {
            tracing::warn!(error = %e, "pruning the event log failed; tried again next tick");
        }
        if let Err(e) = crate::engine::event_log::prune_finished_tasks(store, now, *retention).await
        {
            tracing::warn!(error = %e, "pruning finished tasks failed; tried again next tick");
        }
        if let Err(e) = crate::engine::event_log::prune_type_versions(store, now, *retention).await
        {
            tracing::warn!(error = %e, "pruning type versions failed; tried again next tick");
        }
    }

    /// C10: tick first, then sleep a fixed interval; a slow tick delays
    /// the next one, never overlaps it. `stop` interrupts the sleep.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        loop {
            let outcome = self.tick().await;
            if !outcome.ok() {
                tracing::warn!(
                    failed = outcome.failed.len(),
                    "tick finished with failed checks"
                );
            }
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                // In order, not at random: the simulation must replay exactly.
                biased;
                _ = tokio::time::sleep(self.config.tick_interval) => {}
                _ = self.wake.notified() => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                break;
            }
        }
        self.release_lease().await;
    }
}
