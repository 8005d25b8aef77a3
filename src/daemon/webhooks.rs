//! Webhook delivery (#42): one task per configured webhook reads the
//! event log after the webhook's durable cursor and posts each event it
//! wants, in id order, moving the cursor only once the receiver
//! acknowledged. A daemon killed mid-delivery sends that event again from
//! the cursor when it comes back: at least once, never lost, each body
//! carrying the event's id for the receiver to dedupe.
//!
//! **Architecture Invariant:** delivery never touches a tick, a pass or a
//! task: it runs beside them, reads only what the event log already holds,
//! and a receiver that hangs, fails or closes the connection costs it a
//! bounded request and a backoff, nothing else. What to post next, when
//! to pass over a gap, and how long to back off is `core::webhook`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::adapters::webhook::{WebhookClient, WebhookTarget};
use crate::core::event_log::{EventFilter, EventKind, LoggedEvent};
use crate::core::webhook::{
    backoff_after, Next, Sequencer, EVENT_GAP_MARGIN, WEBHOOK_BACKOFF_BASE, WEBHOOK_BACKOFF_MAX,
};
use crate::ports::{Clock, Store, StoreError};

/// Most events one read of the log returns.
pub const EVENTS_PER_READ_MAX: u32 = 100;
/// The outcomes of `stead_webhook_deliveries_total`.
pub const DELIVERY_OUTCOMES: [&str; 2] = ["delivered", "failed"];

/// How a webhook's task paces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryPacing {
    /// The first pause after a failure; doubled per failure in a row.
    pub backoff_base: Duration,
    /// The longest pause after failures.
    pub backoff_max: Duration,
    /// How often the log is read again when nothing is new.
    pub idle_poll: Duration,
    /// How long a missing event id is waited for (`core::webhook`).
    pub gap_grace: Duration,
}

impl Default for DeliveryPacing {
    fn default() -> Self {
        Self {
            backoff_base: WEBHOOK_BACKOFF_BASE,
            backoff_max: WEBHOOK_BACKOFF_MAX,
            idle_poll: Duration::from_secs(1),
            gap_grace: super::config::DatabaseSettings::default().call_timeout + EVENT_GAP_MARGIN,
        }
    }
}

/// Whether this process should deliver now: only the replica that leads
/// does, so a standby does not post every event a second time.
pub type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// One webhook's delivery task.
pub struct WebhookNotifier {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    client: WebhookClient,
    kinds: Vec<EventKind>,
    /// Only these teams' events, when not empty (#54).
    teams: Vec<String>,
    pacing: DeliveryPacing,
    gate: Gate,
}

/// Where one webhook's task stands between two steps.
struct Progress {
    /// `None` until the stored cursor was read (again).
    sequencer: Option<Sequencer>,
    /// Failures in a row, of a post or of the store.
    failures: u32,
}

impl WebhookNotifier {
    /// A task posting the events of `kinds` to `target`, paced by `pacing`.
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        target: WebhookTarget,
        kinds: Vec<EventKind>,
        pacing: DeliveryPacing,
    ) -> Result<Self, crate::adapters::webhook::PostError> {
        assert!(!kinds.is_empty(), "a webhook wants at least one kind");
        let client = WebhookClient::new(target)?;
        for outcome in DELIVERY_OUTCOMES {
            metrics::counter!(
                "stead_webhook_deliveries_total",
                "webhook" => client.name().to_owned(),
                "outcome" => outcome
            )
            .increment(0);
        }
        Ok(Self {
            store,
            clock,
            client,
            kinds,
            teams: Vec::new(),
            pacing,
            gate: Arc::new(|| true),
        })
    }

    /// Delivers only the events about instances of `teams` (none: all).
    pub fn for_teams(mut self, teams: Vec<String>) -> Self {
        self.teams = teams;
        self
    }

    /// Delivers only while `gate` says so.
    pub fn gated(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    pub fn name(&self) -> &str {
        self.client.name()
    }

    /// The webhook's cursor, set at the newest event logged now if it has
    /// none: a new webhook is sent what happens from its first start on,
    /// not the log's history. Called before the daemon's loops start, so
    /// nothing they log is passed over.
    pub async fn start_cursor(&self) -> Result<i64, StoreError> {
        if let Some(cursor) = self.store.webhook_cursor(self.name()).await? {
            return Ok(cursor);
        }
        let newest = self
            .store
            .events(&EventFilter {
                limit: 1,
                ..EventFilter::default()
            })
            .await?
            .rows
            .last()
            .map_or(0, |e| e.id);
        let now = self.clock.now();
        if self
            .store
            .advance_webhook_cursor(self.name(), None, newest, now)
            .await?
        {
            return Ok(newest);
        }
        // Another process set it first: theirs stands.
        self.store
            .webhook_cursor(self.name())
            .await?
            .ok_or_else(|| {
                StoreError::Conflict("the webhook's cursor was deleted as it was set".into())
            })
    }

    /// Delivers until `stop` turns true. A step under way when it does
    /// runs to its end: a post the receiver acknowledges gets its cursor
    /// stored, so a graceful stop (SIGTERM) sends nothing twice. Each step
    /// is bounded (the post by the webhook's `timeout`, each store call by
    /// the database's), and the daemon's shutdown bound abandons whatever
    /// outlasts it; only then (or at a kill) is an acknowledged event
    /// posted again at the next start.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let mut progress = Progress {
            sequencer: None,
            failures: 0,
        };
        loop {
            if *stop.borrow() {
                return;
            }
            let pause = self.step(&mut progress).await;
            if pause.is_zero() {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                changed = stop.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One step: read after the cursor, then post one event or move the
    /// cursor past what nobody wants. Returns the pause before the next.
    async fn step(&self, progress: &mut Progress) -> Duration {
        if !(self.gate)() {
            progress.sequencer = None; // Another replica may move it meanwhile.
            return self.pacing.idle_poll;
        }
        let sequencer = match &mut progress.sequencer {
            Some(sequencer) => sequencer,
            None => match self.start_cursor().await {
                Ok(cursor) => progress.sequencer.insert(
                    Sequencer::new(cursor, &self.kinds, self.pacing.gap_grace)
                        .for_teams(&self.teams),
                ),
                Err(e) => return self.failed(progress, None, &format!("reading its cursor: {e}")),
            },
        };
        let filter = EventFilter {
            after_id: Some(sequencer.cursor()),
            limit: EVENTS_PER_READ_MAX,
            ..EventFilter::default()
        };
        let events = match self.store.events(&filter).await {
            Ok(read) => read.rows,
            Err(e) => return self.failed(progress, None, &format!("reading the event log: {e}")),
        };
        let now = self.clock.now();
        match sequencer.next(&events, now) {
            Next::Idle => self.pacing.idle_poll,
            Next::AwaitGap { until } => {
                let wait = now.duration_until(until).unsigned_abs();
                wait.clamp(Duration::from_millis(1), self.pacing.idle_poll)
            }
            Next::PassOver { to } => self.advance(progress, to, None).await,
            Next::Deliver(logged) => self.deliver(progress, logged).await,
        }
    }

    async fn deliver(&self, progress: &mut Progress, logged: &LoggedEvent) -> Duration {
        match self.client.post(logged).await {
            Ok(()) => {
                self.count("delivered");
                self.advance(progress, logged.id, Some(logged)).await
            }
            Err(e) => {
                self.count("failed");
                self.failed(progress, Some(logged), &e.to_string())
            }
        }
    }

    /// Stores the cursor at `to` (after `delivered`, if any) and moves
    /// the sequencer with it.
    async fn advance(
        &self,
        progress: &mut Progress,
        to: i64,
        delivered: Option<&LoggedEvent>,
    ) -> Duration {
        let sequencer = progress
            .sequencer
            .as_mut()
            .expect("the cursor is read before it moves");
        let from = Some(sequencer.cursor());
        let now = self.clock.now();
        match self
            .store
            .advance_webhook_cursor(self.name(), from, to, now)
            .await
        {
            Ok(true) => {
                match delivered {
                    Some(_) => sequencer.delivered(to),
                    None => sequencer.passed_over(to),
                }
                progress.failures = 0;
                Duration::ZERO
            }
            Ok(false) => {
                tracing::info!(
                    webhook = self.name(),
                    "another process moved this webhook's cursor; reading it again"
                );
                progress.sequencer = None;
                Duration::ZERO
            }
            Err(e) => {
                // An acknowledged event whose cursor was not stored is
                // posted again: at least once.
                self.failed(progress, delivered, &format!("storing its cursor: {e}"))
            }
        }
    }

    /// Logs a failure naming the webhook, and returns the backoff.
    fn failed(
        &self,
        progress: &mut Progress,
        event: Option<&LoggedEvent>,
        error: &str,
    ) -> Duration {
        progress.failures = progress.failures.saturating_add(1);
        let pause = backoff_after(
            progress.failures,
            self.pacing.backoff_base,
            self.pacing.backoff_max,
        );
        tracing::warn!(
            webhook = self.name(),
            event = event.map(|e| e.id),
            kind = event.map(|e| e.event.kind.as_str()),
            failures = progress.failures,
            retry_in_ms = pause.as_millis() as u64,
            "webhook {} not delivered: {error}",
            self.name()
        );
        pause
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(
            "stead_webhook_deliveries_total",
            "webhook" => self.name().to_owned(),
            "outcome" => outcome
        )
        .increment(1);
    }
}
