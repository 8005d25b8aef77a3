//! The control loop (C1–C10): one tick runs every check behind its own
//! error boundary, then the gauges, then the heartbeat, all in one span
//! whose `traceparent` every enqueued task carries. The loop ticks first,
//! then sleeps a fixed interval that a stop signal interrupts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;
use tracing::Instrument;

use crate::core::catalog::{Catalog, CatalogEntry};
use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::RolloutState;
use crate::core::plan::{
    task_lease, ControlConfig, Decision, Level, Plan, Planner, Report, Snapshot,
};
use crate::core::policy::PLANNERS_LEASE_NEED;
use crate::core::recovery::RecoveryError;
use crate::core::succession::{SeenLease, TwinVerdict, TwinWatch};
use crate::core::types::{InstanceName, ServiceName, Timestamp};
use crate::ports::{Anchored, LeaseGrant, NotifyError, StoreError};

use super::clock::ClockCheck;
use super::lease::LeaseAnswer;
use super::recovery::Recoverer;
use super::{Ports, SharedCatalog};

/// Bound on one courtesy notification.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// The checks of one tick, in order. Each is its own error boundary (C3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    Recovery,
    Drift,
    LeaseExpiry,
    Ttl,
    VersionDrift,
}

impl Check {
    pub const ALL: [Check; 5] = [
        Check::Recovery,
        Check::Drift,
        Check::LeaseExpiry,
        Check::Ttl,
        Check::VersionDrift,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Check::Recovery => "recovery",
            Check::Drift => "drift",
            Check::LeaseExpiry => "lease_expiry",
            Check::Ttl => "ttl",
            Check::VersionDrift => "version_drift",
        }
    }
}

/// What one tick did.
#[derive(Debug, Default)]
pub struct TickOutcome {
    /// `false` when another replica holds the reconciler lease (C2): no
    /// check ran, only the heartbeat.
    pub leader: bool,
    /// Checks that failed, with why.
    pub failed: Vec<(Check, String)>,
    /// Errors inside checks that did not fail as a whole (one instance's
    /// recovery, a notification).
    pub warnings: Vec<String>,
    pub tasks_enqueued: u32,
    pub traceparent: String,
    /// Instances the recovery pass drove (loaded under their lock), in
    /// listing order: what the pass's memory now says of them was pruned
    /// this tick (R16).
    pub recovered: Vec<InstanceName>,
    /// The tick's reading of the database's clock was one nothing vouched
    /// for (a first reading, or a jump): it expired no TTL, requeued no
    /// task and took over no lease (#41).
    pub clock_unverified: bool,
}

impl TickOutcome {
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The store's refusals of one check's decisions, in order; a fenced or
/// unavailable store ends the check at its first refusal.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
struct ApplyFailed {
    check: Check,
    errors: Vec<StoreError>,
}

impl ApplyFailed {
    /// Each refusal named by its check, as the tick's failure lists it.
    fn describe(&self) -> String {
        let each: Vec<String> = self
            .errors
            .iter()
            .map(|e| format!("{}: {e}", self.check.as_str()))
            .collect();
        each.join("; ")
    }
}

/// The singleton reconciler. Its lease is the recoverer's: one lease
/// covers every effect of the reconciler, recovery included (T2).
pub struct Reconciler {
    ports: Ports,
    catalog: SharedCatalog,
    config: ControlConfig,
    recoverer: Arc<Recoverer>,
    /// Whether this replica held the lease at its last tick; a change is
    /// logged once (taken, lost, waited for).
    leader: std::sync::atomic::AtomicBool,
    rng: Mutex<ChaCha8Rng>,
    /// Unix seconds of the last finished tick (0 before the first).
    last_tick_s: AtomicI64,
    /// Cuts the pause between ticks short (a reloaded catalog).
    wake: tokio::sync::Notify,
    /// The holder last logged as keeping this standby waiting.
    waiting_for: Mutex<Option<String>>,
    /// T1: what this standby saw of a twin holding the lease (the same
    /// identity at another site), and the twin it last reported alive.
    twin_watch: Mutex<(TwinWatch, Option<String>)>,
    /// Each check's reports at its last run, so each is logged once; with
    /// whether it names an orphan release (those stand while withheld).
    reported: Mutex<BTreeMap<Check, BTreeMap<String, bool>>>,
    /// What the last full recovery pass found gone (R7), per instance:
    /// drift reprovisions those services at the next tick's planning.
    lost_services: Mutex<LostServices>,
    /// The checks that failed at the last tick this replica led, with
    /// why: a failure that lasts is logged once when it begins and once
    /// when it ends.
    failing: Mutex<BTreeSet<(Check, String)>>,
    /// The bad rows the last snapshot skipped, logged the same way.
    bad_rows: Mutex<BTreeSet<String>>,
    /// The warnings of the last tick this replica led (a container gone,
    /// a runtime that does not answer), logged the same way.
    warned: Mutex<BTreeSet<String>>,
    /// How long the event log keeps an event (#42); unset: the leader's
    /// tick prunes nothing.
    event_retention: std::sync::OnceLock<Duration>,
}

/// What full passes confirmed gone (R7), per instance, with when that
/// instance's pass began (nothing it saw is older).
type LostServices = BTreeMap<InstanceName, (Timestamp, BTreeSet<ServiceName>)>;

/// How old a pass's word on lost containers may be when the planners use
/// it, in ticks: a process frozen since (a VM pause) must look again
/// rather than reprovision on what another may have repaired meanwhile.
const LOST_SERVICES_AGE_TICKS_MAX: u32 = 2;

impl Reconciler {
    /// `seed` feeds trace ids; the daemon draws it from the OS, the
    /// simulation from its run seed.
    pub fn new(
        ports: Ports,
        catalog: impl Into<SharedCatalog>,
        config: ControlConfig,
        recoverer: Arc<Recoverer>,
        seed: u64,
    ) -> Self {
        Self {
            ports,
            catalog: catalog.into(),
            config,
            recoverer,
            leader: std::sync::atomic::AtomicBool::new(false),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            last_tick_s: AtomicI64::new(0),
            wake: tokio::sync::Notify::new(),
            waiting_for: Mutex::new(None),
            twin_watch: Mutex::new((TwinWatch::default(), None)),
            reported: Mutex::new(BTreeMap::new()),
            failing: Mutex::new(BTreeSet::new()),
            bad_rows: Mutex::new(BTreeSet::new()),
            warned: Mutex::new(BTreeSet::new()),
            lost_services: Mutex::new(LostServices::new()),
            event_retention: std::sync::OnceLock::new(),
        }
    }

    /// From now on, each tick this replica leads deletes the events older
    /// than `retention`, in bounded batches (#42). Set once.
    pub fn keep_events_for(&self, retention: Duration) {
        let _ = self.event_retention.set(retention);
    }

    /// Retention of the event log and of the finished tasks it names:
    /// never fails the tick (C3).
    async fn prune_events(&self) {
        let Some(retention) = self.event_retention.get() else {
            return;
        };
        let now = self.ports.clock.now();
        let store = self.ports.store.as_ref();
        if let Err(e) = super::event_log::prune(store, now, *retention).await {
            tracing::warn!(error = %e, "pruning the event log failed; tried again next tick");
        }
        if let Err(e) = super::event_log::prune_finished_tasks(store, now, *retention).await {
            tracing::warn!(error = %e, "pruning finished tasks failed; tried again next tick");
        }
    }

    /// Learns from a full pass which services' containers it confirmed
    /// gone. Only what this pass saw counts: an instance it did not drive
    /// (busy, no lease) may have been repaired meanwhile, by the very
    /// reprovision that kept it busy.
    fn learn_lost_services(&self, pass: &super::recovery::PassOutcome) {
        let lost: LostServices = pass
            .instances
            .iter()
            .filter_map(|(name, instance)| {
                let began_at = instance.began_at.filter(|_| instance.driven)?;
                let gone: BTreeSet<ServiceName> = instance
                    .reports
                    .iter()
                    .filter(|r| r.errors.iter().any(|e| matches!(e, RecoveryError::Gone)))
                    .map(|r| r.key.service.clone())
                    .collect();
                (!gone.is_empty()).then(|| (name.clone(), (began_at, gone)))
            })
            .collect();
        *self.lost_services.lock().unwrap_or_else(|e| e.into_inner()) = lost;
    }

    /// What the last full pass confirmed gone, where it looked recently
    /// enough to act on at `now`.
    fn recently_lost(&self, now: Timestamp) -> BTreeMap<InstanceName, BTreeSet<ServiceName>> {
        let oldest = now
            - jiff::SignedDuration::try_from(
                self.config.tick_interval * LOST_SERVICES_AGE_TICKS_MAX,
            )
            .unwrap_or(jiff::SignedDuration::MAX);
        self.lost_services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (seen_at, _))| *seen_at >= oldest)
            .map(|(name, (_, services))| (name.clone(), services.clone()))
            .collect()
    }

    /// Writes `event` to the event log (#42), never waiting for it.
    fn emit(&self, event: Event) {
        self.recoverer.events().emit(event);
    }

    /// An event about the instance named `name` (as the tick names it: a
    /// name the snapshot knows, else its id), stamped for a store call
    /// that records it with its change; `None` when events are off.
    fn stamped_about(&self, name: &str, event: Event) -> Option<Event> {
        let event = match crate::core::names::check_instance_name("instance", name) {
            Ok(()) => event.instance(&InstanceName::new(name)),
            Err(_) => event,
        };
        self.recoverer.events().stamp(event)
    }

    /// Whether this replica held the reconciler lease at its last tick:
    /// what only one replica should do (deliver webhooks) asks here.
    pub fn leads(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Starts the next tick now instead of after the pause (or right after
    /// the running one). Level-triggered: the tick does not know why.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn recoverer(&self) -> &Recoverer {
        &self.recoverer
    }

    /// Unix seconds of the last finished tick; 0 before the first.
    pub fn last_tick_s(&self) -> i64 {
        self.last_tick_s.load(Ordering::Relaxed)
    }

    /// Whether this replica holds a lease it trusts right now.
    pub fn holds_lease(&self) -> bool {
        self.recoverer.lease().current().is_some()
    }

    /// A W3C trace context for a new tick.
    fn new_traceparent(&self) -> String {
        new_traceparent(&mut *self.rng.lock().expect("rng poisoned"))
    }

    /// One tick (C9): checks, gauges, heartbeat.
    pub async fn tick(&self) -> TickOutcome {
        let traceparent = self.new_traceparent();
        let span = tracing::info_span!("tick", traceparent = %traceparent);
        super::trace::origin(&span, &traceparent);
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
        let reading =
            super::clock::anchor(self.ports.clock.as_ref(), self.ports.store.as_ref(), true).await;
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

    /// The four control checks (C5-C8) over one snapshot, under the lease;
    /// on a clock nothing vouches for, neither TTL expiry (C7) nor task
    /// requeue (C6).
    async fn control_checks(&self, traceparent: String, verified: bool, out: &mut TickOutcome) {
        // One catalog for the whole tick, even if it is reloaded meanwhile.
        let catalog = self.catalog.current();
        match self.snapshot(&catalog, traceparent).await {
            Err(e) => {
                for check in &Check::ALL[1..] {
                    out.failed.push((*check, format!("snapshot: {e}")));
                }
            }
            Ok((snapshot, releases_error)) => {
                // The planners' writes are quick; the lease must outlast them.
                match self
                    .recoverer
                    .lease()
                    .ensure(self.ports.store.as_ref(), PLANNERS_LEASE_NEED)
                    .await
                {
                    Some(fence) => {
                        self.run_planners(&snapshot, releases_error, &fence, verified, out)
                            .await
                    }
                    None => {
                        for check in &Check::ALL[1..] {
                            out.failed
                                .push((*check, "reconciler lease lost".to_owned()));
                        }
                    }
                }
            }
        }
    }

    /// C2: take or renew the singleton lease; says so once when this
    /// replica takes it, loses it, or waits for another's, naming the
    /// holder and its expiry.
    ///
    /// On a clock nothing vouches for (`verified` false) it renews its own
    /// lease, or takes one nobody holds or its own identity held, but
    /// takes over no other holder's: that lease may look expired only
    /// because the database's clock jumped.
    async fn take_lease(&self, verified: bool) -> bool {
        let lease = self.recoverer.lease();
        if !verified && !self.leader.load(Ordering::Relaxed) {
            if let Some(other) = self.held_by_another().await {
                tracing::info!(
                    "not taking the reconciler lease from {other} on a clock reading nothing \
                     vouches for; the next tick looks again"
                );
                self.leader.store(false, Ordering::Relaxed);
                metrics::gauge!("stead_reconciler_lease_held").set(0.0);
                return false;
            }
        }
        let answer = lease.acquire(self.ports.store.as_ref()).await;
        let leader = matches!(answer, LeaseAnswer::Held(_));
        let was = self.leader.swap(leader, Ordering::Relaxed);
        metrics::gauge!("stead_reconciler_lease_held").set(if leader { 1.0 } else { 0.0 });
        match (&answer, was) {
            (LeaseAnswer::Held(grant), false) => {
                *self.waiting_for.lock().expect("waiting_for poisoned") = None;
                self.watch_for_twin(None);
                tracing::info!(
                    "reconciler lease taken by {} (epoch {}; renewed every tick, it expires at {} \
                     unless renewed)",
                    grant.holder,
                    grant.epoch,
                    grant.expires_at
                );
                self.emit(
                    Event::new(
                        EventKind::LeaseTaken,
                        self.ports.clock.now(),
                        "C2",
                        format!(
                            "reconciler lease taken by {} (epoch {})",
                            grant.holder, grant.epoch
                        ),
                    )
                    .until(grant.expires_at),
                );
            }
            (LeaseAnswer::HeldElsewhere, lost) => self.log_waiting(lost).await,
            (LeaseAnswer::Unavailable(e), _) => {
                tracing::error!(error = %e, "reconciler lease unavailable; not acting")
            }
            (LeaseAnswer::Held(_), true) => {}
        }
        leader
    }

    /// The holder of the reconciler lease row when it is another
    /// identity's (expired or not); `None` when the row is free, this
    /// identity's, or cannot be read (the acquire then says why).
    async fn held_by_another(&self) -> Option<String> {
        let row = self.ports.store.reconciler_lease().await.ok()??;
        let own = self.recoverer.lease().holder();
        let identity = own.split('#').next().unwrap_or(own);
        let same_identity = row.holder.split('#').next() == Some(identity);
        (!same_identity).then_some(row.holder)
    }

    /// Who holds the lease this replica waits for: logged when this replica
    /// loses it, and when it first waits for a holder.
    async fn log_waiting(&self, lost: bool) {
        let (holder, until) = match self.ports.store.reconciler_lease().await {
            Ok(Some(other)) => {
                self.watch_for_twin(Some(&other));
                (other.holder, format!(" until {}", other.expires_at))
            }
            Ok(None) => {
                self.watch_for_twin(None);
                ("nobody (just released)".to_owned(), String::new())
            }
            Err(e) => (format!("unknown ({e})"), String::new()),
        };
        let mut waiting = self.waiting_for.lock().expect("waiting_for poisoned");
        if lost {
            tracing::warn!(
                "reconciler lease lost: now held by {holder}{until}; this replica stops acting \
                 and waits"
            );
            self.emit(Event::new(
                EventKind::LeaseLost,
                self.ports.clock.now(),
                "C2",
                format!("reconciler lease lost: now held by {holder}{until}"),
            ));
        } else if waiting.as_deref() != Some(holder.as_str()) {
            tracing::info!("waiting for the reconciler lease, held by {holder}{until}");
        }
        *waiting = Some(holder);
    }

    /// T1: feeds what this replica read of the lease (`None`: it holds it,
    /// or nobody does) to its twin watch, and reports a live twin once: an
    /// error naming the identity and both incarnations, and the metrics
    /// `stead_identity_twins_total` (each twin found) and
    /// `stead_identity_twin` (1 while one holds the lease). This replica
    /// keeps waiting: the twin's lease is never taken over at once.
    fn watch_for_twin(&self, seen: Option<&LeaseGrant>) {
        let me = self.recoverer.lease().holder();
        let seen = seen.map(|grant| SeenLease {
            holder: grant.holder.clone(),
            epoch: grant.epoch,
            expires_at: grant.expires_at,
        });
        let mut guard = self.twin_watch.lock().unwrap_or_else(|e| e.into_inner());
        let (watch, reported) = &mut *guard;
        match watch.observe(me, seen.as_ref()) {
            TwinVerdict::Alive { identity, holder } => {
                if reported.as_deref() != Some(holder.as_str()) {
                    tracing::error!(
                        identity = %identity,
                        holder = %holder,
                        this = %me,
                        "two live processes share identity {identity}: {holder} holds the \
                         reconciler lease and renewed it after {me} started (copied state_dir?); \
                         this process stays a standby and leaves {holder}'s locks and tasks \
                         alone (T1). Give each daemon its own state_dir: stop this one, delete \
                         the identity file in its state_dir, and start it again"
                    );
                    metrics::counter!("stead_identity_twins_total").increment(1);
                    metrics::gauge!("stead_identity_twin").set(1.0);
                    *reported = Some(holder);
                }
            }
            TwinVerdict::NoTwin | TwinVerdict::Unproven => {
                if reported.take().is_some() {
                    metrics::gauge!("stead_identity_twin").set(0.0);
                }
            }
        }
    }

    /// Whether this replica found a live twin holding the lease (T1): the
    /// twin's holder name, while it lasts.
    pub fn live_twin(&self) -> Option<String> {
        self.twin_watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Reads what the planners need. Listing releases may fail on its own:
    /// drift then plans nothing, the other checks go on (C3).
    async fn snapshot<'c>(
        &'c self,
        catalog: &'c Catalog,
        traceparent: String,
    ) -> Result<(Snapshot<'c>, Option<String>), StoreError> {
        let store = &self.ports.store;
        let instances = store.list_instances().await?;
        let tasks = store.active_tasks().await?;
        let records = store.rollout_records().await?;
        let rollouts = records
            .iter()
            .map(|r| (r.service_type.clone(), r.state))
            .collect();
        let pins = self.pins(catalog, &records).await;
        // When the rows were read, at the store's precision: the planners
        // judge them at this instant. Taken after the release listing
        // (which may take the provisioner's whole timeout) a task's row
        // would be judged at a moment it no longer described: its lease
        // run out though its worker had renewed or finished it since, and
        // a planner at a finer `now` than the store applies its decision
        // with sees a lease run out a fraction of a microsecond early. The
        // simulation's C6 check found both (a sweep that freed nothing).
        let now = crate::store::normalize_timestamp(self.ports.clock.now());
        self.log_bad_rows(instances.bad.iter().chain(tasks.bad.iter()));
        // Bounded like every outside call: a hung provisioner must not hang
        // the tick (found by the simulation).
        let listed = tokio::time::timeout(
            self.config.provisioner_timeout,
            self.ports.provisioner.list_releases(),
        )
        .await;
        let (releases, releases_error) = match listed {
            Ok(Ok(r)) => (Some(r), None),
            Ok(Err(e)) => (None, Some(e.to_string())),
            Err(_) => (None, Some("timed out".to_owned())),
        };
        Ok((
            Snapshot {
                now,
                unreadable_instances: instances.bad.len(),
                instances: instances.rows,
                tasks: tasks.rows,
                releases,
                catalog,
                rollouts,
                config: &self.config,
                traceparent: Some(traceparent),
                lost_services: self.recently_lost(now),
                pins,
            },
            releases_error,
        ))
    }

    /// The entries undos pinned halted types to (`rollout undo --to`), as
    /// the daemon recorded them, read through this catalog's grants. A pin
    /// that cannot be read moves nothing, and says why.
    async fn pins(
        &self,
        catalog: &Catalog,
        records: &[crate::ports::RolloutRecord],
    ) -> BTreeMap<String, CatalogEntry> {
        let mut pins = BTreeMap::new();
        for record in records.iter().filter(|r| r.state == RolloutState::Halted) {
            let Some(version) = &record.pinned else {
                continue;
            };
            if catalog.get(&record.service_type).is_none() {
                continue;
            }
            let entry = crate::store::recorded_entry(
                self.ports.store.as_ref(),
                catalog,
                &record.service_type,
                version,
            )
            .await;
            match entry {
                Ok(entry) => {
                    pins.insert(record.service_type.clone(), entry);
                }
                Err(why) => tracing::error!(
                    service_type = %record.service_type,
                    version = %version,
                    "the type is pinned to a version that cannot be read this tick ({why}); \
                     nothing moves to it: `stead rollout resume` lifts the pin"
                ),
            }
        }
        pins
    }

    async fn run_planners(
        &self,
        snapshot: &Snapshot<'_>,
        releases_error: Option<String>,
        fence: &LeaseGrant,
        verified: bool,
        out: &mut TickOutcome,
    ) {
        // The snapshot's indexes are built once for the four planners;
        // each check is carried out before the next is planned.
        let planner = Planner::new(snapshot);
        match &releases_error {
            Some(e) => out
                .failed
                .push((Check::Drift, format!("list releases: {e}"))),
            None => {
                let plan = planner.drift();
                self.carry_out(Check::Drift, plan, snapshot, fence, out)
                    .await;
            }
        }
        // Both break another's claim by the clock: a reading that jumped
        // would requeue live tasks and expire every instance at once.
        if verified {
            let plan = planner.lease_expiry();
            self.carry_out(Check::LeaseExpiry, plan, snapshot, fence, out)
                .await;
            let plan = planner.ttl();
            self.carry_out(Check::Ttl, plan, snapshot, fence, out).await;
        }
        let plan = planner.version_drift();
        self.carry_out(Check::VersionDrift, plan, snapshot, fence, out)
            .await;
    }

    /// Logs one check's reports and carries out its decisions; a failure
    /// fails that check alone (C3).
    async fn carry_out(
        &self,
        check: Check,
        plan: Plan,
        snapshot: &Snapshot<'_>,
        fence: &LeaseGrant,
        out: &mut TickOutcome,
    ) {
        self.log_reports(check, &plan.reports);
        if let Err(e) = self
            .apply(check, &plan.decisions, fence, out, snapshot)
            .await
        {
            out.failed.push((check, e.to_string()));
        }
    }

    /// Logs each failed check once when it begins to fail (or fails for a
    /// new reason) and once at info when it passes again, not every tick.
    fn log_failures(&self, failed: &[(Check, String)]) {
        let now: BTreeSet<(Check, String)> = failed.iter().cloned().collect();
        let mut before = self.failing.lock().expect("failing poisoned");
        for (check, why) in now.difference(&before) {
            tracing::error!(check = check.as_str(), error = %why, "check failed");
        }
        let still: BTreeSet<Check> = now.iter().map(|(check, _)| *check).collect();
        let mended: BTreeSet<Check> = before
            .iter()
            .map(|(check, _)| *check)
            .filter(|check| !still.contains(check))
            .collect();
        for check in mended {
            tracing::info!(
                check = check.as_str(),
                "check {} passes again",
                check.as_str()
            );
        }
        *before = now;
    }

    /// Logs each warning once when a tick first has it and once at info
    /// when a tick no longer does, not every tick: a container that stays
    /// gone or a runtime that stays silent is one condition, not one per
    /// second.
    fn log_warnings(&self, warnings: &[String]) {
        let now: BTreeSet<String> = warnings.iter().cloned().collect();
        let mut before = self.warned.lock().expect("warned poisoned");
        for warning in now.difference(&before) {
            tracing::warn!("{warning}");
        }
        for warning in before.difference(&now) {
            tracing::info!("no longer the case: {warning}");
        }
        *before = now;
    }

    /// Logs each bad row once when a snapshot first skips it and once at
    /// info when it reads again (mended or deleted), not every tick.
    fn log_bad_rows<'e>(&self, bad: impl Iterator<Item = &'e StoreError>) {
        let now: BTreeSet<String> = bad.map(ToString::to_string).collect();
        let mut before = self.bad_rows.lock().expect("bad_rows poisoned");
        for error in now.difference(&before) {
            tracing::error!(error = %error, "skipped a bad row");
        }
        for error in before.difference(&now) {
            tracing::info!("no longer the case: skipped a bad row ({error})");
        }
        *before = now;
    }

    /// Logs a planner's reports once per change: each when it first
    /// appears, at its level, and once at info when it no longer does. The
    /// counts an operator alerts on stay visible as gauges, each set by the
    /// check that reports it (to zero when it reports none). While drift
    /// withholds its judgement of orphans, what it last said of them
    /// stands: neither the gauge nor the log claims they went away.
    fn log_reports(&self, check: Check, reports: &[Report]) {
        let withheld = reports
            .iter()
            .any(|r| matches!(r, Report::OrphansWithheld { .. }));
        for (owner, gauge, counts) in REPORT_GAUGES {
            if owner == check && !(withheld && gauge == ORPHAN_GAUGE) {
                let n = reports.iter().filter(|r| counts(r)).count();
                metrics::gauge!(gauge).set(n as f64);
            }
        }
        let mut now: BTreeMap<String, (Level, bool)> = reports
            .iter()
            .map(|r| {
                let orphan = matches!(r, Report::OrphanRelease { .. });
                (r.to_string(), (r.level(), orphan))
            })
            .collect();
        let mut reported = self.reported.lock().expect("reported poisoned");
        let before = reported.entry(check).or_default();
        if withheld {
            for (text, _) in before.iter().filter(|(_, orphan)| **orphan) {
                now.entry(text.clone()).or_insert((Level::Error, true));
            }
        }
        for (text, (level, orphan)) in &now {
            if before.contains_key(text) {
                continue;
            }
            if *orphan {
                // Recorded as it is first logged, so a webhook can page
                // for it (#42); it stands until drift stops reporting it.
                self.recoverer.events().emit(Event::new(
                    EventKind::OrphanRelease,
                    self.ports.clock.now(),
                    "C5",
                    text.as_str(),
                ));
            }
            match level {
                Level::Error => tracing::error!(check = check.as_str(), "{text}"),
                Level::Warn => tracing::warn!(check = check.as_str(), "{text}"),
                Level::Info => tracing::info!(check = check.as_str(), "{text}"),
            }
        }
        for text in before.keys().filter(|t| !now.contains_key(*t)) {
            tracing::info!(check = check.as_str(), "no longer the case: {text}");
        }
        *before = now
            .into_iter()
            .map(|(text, (_, orphan))| (text, orphan))
            .collect();
    }

    /// Carries out decisions through the store; never decides anything.
    async fn apply(
        &self,
        check: Check,
        decisions: &[Decision],
        fence: &LeaseGrant,
        out: &mut TickOutcome,
        snapshot: &Snapshot<'_>,
    ) -> Result<(), ApplyFailed> {
        let store = &self.ports.store;
        let now = self.ports.clock.now();
        let mut errors = Vec::new();
        let mut lease_reset = false;
        let name = |id: i64| {
            snapshot
                .instances
                .iter()
                .find(|i| i.id == id)
                .map_or_else(|| format!("instance {id}"), |i| i.name.to_string())
        };
        for decision in decisions {
            let result = match decision {
                Decision::Enqueue(task) => {
                    let instance = name(task.instance);
                    let when = if task.run_after > now {
                        format!(", due {}", task.run_after)
                    } else {
                        String::new()
                    };
                    let (kind, rule) = match check {
                        Check::Drift => (EventKind::Drift, "C5"),
                        Check::VersionDrift => (EventKind::Enqueue, "C8"),
                        _ => (EventKind::Enqueue, check.as_str()),
                    };
                    // Recorded in the enqueue's own transaction (#42).
                    let event = self.stamped_about(
                        &instance,
                        Event::new(
                            kind,
                            now,
                            rule,
                            format!("queued {} of {instance}{when}: {}", task.kind, task.reason),
                        )
                        .traced(task.traceparent.as_deref()),
                    );
                    let queued = match &event {
                        Some(event) => store.enqueue_recorded(task, now, Some(fence), event).await,
                        None => store.enqueue(task, now, Some(fence)).await,
                    };
                    queued.map(|id| {
                        if let Some(id) = id {
                            out.tasks_enqueued += 1;
                            tracing::info!(
                                instance = %instance,
                                task = id,
                                "queued task {id} {} of {instance}{when}: {}",
                                task.kind,
                                task.reason
                            );
                        }
                    })
                }
                Decision::Expire {
                    instance,
                    from,
                    task,
                } => {
                    let id = *instance;
                    let instance = name(id);
                    // Recorded in the expiry's own transaction (#42).
                    let event = self.stamped_about(
                        &instance,
                        Event::new(
                            EventKind::TtlExpiry,
                            now,
                            "C7",
                            format!(
                                "deleting {instance}: deprovision queued, its other queued \
                                 tasks cancelled: {}",
                                task.reason
                            ),
                        )
                        .traced(task.traceparent.as_deref()),
                    );
                    let expired = match &event {
                        Some(event) => {
                            store
                                .expire_instance_recorded(id, *from, task, now, Some(fence), event)
                                .await
                        }
                        None => {
                            store
                                .expire_instance(id, *from, task, now, Some(fence))
                                .await
                        }
                    };
                    expired.map(|expired| {
                        if let Some(expired) = expired {
                            out.tasks_enqueued += 1;
                            tracing::info!(
                                instance = %instance,
                                task = expired.task,
                                "deleting {instance}: deprovision queued as task {}, {} queued \
                                 task(s) cancelled: {}",
                                expired.task,
                                expired.cancelled.len(),
                                task.reason
                            );
                        }
                    })
                }
                Decision::RequeueExpiredLease { .. } if lease_reset => Ok(()),
                Decision::RequeueExpiredLease { .. } => {
                    lease_reset = true;
                    store
                        .reset_expired_leases(now, task_lease(&self.config), Some(fence))
                        .await
                        .map(|n| tracing::warn!(tasks_freed = n, "expired leases requeued"))
                }
                Decision::Notify(notice) => {
                    // A courtesy: a failure never aborts the sweep (C5).
                    let sent = tokio::time::timeout(
                        NOTIFY_TIMEOUT,
                        self.ports.notifier.notify(notice.event, &notice.message),
                    )
                    .await
                    .unwrap_or_else(|_| Err(NotifyError("timed out".to_owned())));
                    if let Err(e) = sent {
                        out.warnings.push(format!("notify {}: {e}", notice.event));
                    }
                    Ok(())
                }
                Decision::HaltRollout {
                    service_type,
                    reason,
                } => store
                    .set_rollout(service_type, RolloutState::Halted, reason, now, Some(fence))
                    .await
                    .map(|()| {
                        tracing::warn!(
                            service_type = %service_type,
                            "rollout of {service_type} halted (C8): {reason}"
                        );
                        self.emit(
                            Event::new(
                                EventKind::Halt,
                                now,
                                "C8",
                                format!("rollout of {service_type} halted: {reason}"),
                            )
                            .traced(snapshot.traceparent.as_deref()),
                        );
                    }),
            };
            if result.is_ok() {
                metrics::counter!("stead_decisions_total", "decision" => decision.label())
                    .increment(1);
            }
            if let Err(e) = result {
                let stop = matches!(e, StoreError::Fenced { .. } | StoreError::Unavailable(_));
                errors.push(e);
                if stop {
                    break;
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApplyFailed { check, errors })
        }
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

    /// Gives up the singleton lease, so another replica (or the next
    /// one-shot `stead tick`) need not wait for it to expire.
    pub async fn release_lease(&self) {
        match self
            .recoverer
            .lease()
            .release(self.ports.store.as_ref())
            .await
        {
            Ok(()) => {
                if self.leader.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "reconciler lease released by {}",
                        self.recoverer.lease().holder()
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconciler lease not released; it will expire"),
        }
    }

    /// The time the reconciler believes it is (for status output).
    pub fn now(&self) -> Timestamp {
        self.ports.clock.now()
    }
}

/// A fresh W3C `traceparent` (version 00, sampled) from `rng`; ids are
/// never all zero, which the spec forbids.
pub fn new_traceparent(rng: &mut impl Rng) -> String {
    let trace: u128 = rng.random::<u128>() | 1;
    let span: u64 = rng.random::<u64>() | 1;
    format!("00-{trace:032x}-{span:016x}-01")
}

/// A gauge counting one kind of a check's reports.
type ReportGauge = (Check, &'static str, fn(&crate::core::plan::Report) -> bool);

/// Drift's count of orphan releases (C5).
const ORPHAN_GAUGE: &str = "stead_orphan_releases";

/// The reports an operator alerts on, each counted by the check that
/// reports it.
const REPORT_GAUGES: [ReportGauge; 2] = [
    (Check::Drift, ORPHAN_GAUGE, |r| {
        matches!(r, crate::core::plan::Report::OrphanRelease { .. })
    }),
    (Check::VersionDrift, "stead_unknown_type_instances", |r| {
        matches!(r, crate::core::plan::Report::UnknownServiceType { .. })
    }),
];
