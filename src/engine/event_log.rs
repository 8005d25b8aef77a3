//! Writing the event log (#42) without ever making a pass wait for it.
//!
//! The engine hands each [`Event`] to an [`EventSink`]: a bounded buffer
//! (`try_send`, never an await) in front of an [`EventFlusher`] task that
//! writes what the buffer holds to the store in batches. A slow or absent
//! store fills the buffer, and then events are dropped and counted
//! (`stead_events_dropped_total`), never waited for. Not to be confused
//! with `engine::events`, which follows the runtime's (Docker's) events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::core::event_log::Event;
use crate::core::types::Timestamp;
use crate::ports::Store;

/// Most events waiting to be written; more are dropped and counted.
pub const EVENT_BUFFER_MAX: usize = 4096;
/// Most events one write sends to the store.
pub const EVENT_BATCH_MAX: usize = 256;
/// How many times a batch is offered to the store before it is dropped
/// (and counted): the buffer behind it must keep moving.
pub const EVENT_WRITE_ATTEMPTS_MAX: u32 = 3;
/// The pause between two attempts at one batch.
const EVENT_WRITE_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Most events retention deletes in one statement, and most statements
/// per tick: pruning never holds the table long.
pub const EVENT_PRUNE_BATCH_MAX: u32 = 1000;
pub const EVENT_PRUNE_BATCHES_PER_TICK_MAX: u32 = 10;

const _: () = assert!(EVENT_BATCH_MAX <= EVENT_BUFFER_MAX);
const _: () = assert!(EVENT_WRITE_ATTEMPTS_MAX >= 1);

/// Where the engine puts the events it emits. Cheap to clone; a sink
/// made [`EventSink::off`] discards everything (tests, the simulation,
/// commands that write nothing).
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    buffer: mpsc::Sender<Event>,
    /// The process every event is written by (T1).
    writer: String,
    dropped: AtomicU64,
}

impl EventSink {
    /// A sink that keeps nothing.
    pub fn off() -> Self {
        Self::default()
    }

    /// A sink holding at most `capacity` events for `writer`, and the
    /// flusher that empties it into a store.
    pub fn new(writer: impl Into<String>, capacity: usize) -> (Self, EventFlusher) {
        assert!(capacity >= 1, "an event buffer holds at least one event");
        let (buffer, pending) = mpsc::channel(capacity);
        let inner = Arc::new(Inner {
            buffer,
            writer: writer.into(),
            dropped: AtomicU64::new(0),
        });
        let flusher = EventFlusher {
            pending,
            sink: inner.clone(),
        };
        (Self { inner: Some(inner) }, flusher)
    }

    /// Whether emitted events go anywhere: a caller may skip building one
    /// when not.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// `event` stamped with this process as its writer, for a store call
    /// that writes it in the transaction of the change it records; `None`
    /// when this sink is off (record nothing).
    pub fn stamp(&self, mut event: Event) -> Option<Event> {
        let inner = self.inner.as_ref()?;
        event.writer.clone_from(&inner.writer);
        Some(event)
    }

    /// Queues `event` for writing, stamped with this process as its
    /// writer. Never waits: a full buffer drops it and counts the drop.
    /// Returns whether it was queued.
    pub fn emit(&self, mut event: Event) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        event.writer.clone_from(&inner.writer);
        match inner.buffer.try_send(event) {
            Ok(()) => true,
            Err(_) => {
                inner.count_dropped(1);
                false
            }
        }
    }

    /// Events this sink dropped so far (a full buffer, or a batch the
    /// store refused every time).
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }
}

impl Inner {
    fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        metrics::counter!("stead_events_dropped_total").increment(n);
    }
}

/// Empties an [`EventSink`]'s buffer into the store, a batch at a time.
#[derive(Debug)]
pub struct EventFlusher {
    pending: mpsc::Receiver<Event>,
    sink: Arc<Inner>,
}

impl EventFlusher {
    /// Writes what is buffered now, in batches; returns how many events
    /// the store took. A batch the store refuses
    /// [`EVENT_WRITE_ATTEMPTS_MAX`] times is dropped and counted.
    pub async fn flush(&mut self, store: &dyn Store) -> usize {
        let mut written = 0;
        let mut batch = Vec::with_capacity(EVENT_BATCH_MAX);
        loop {
            while batch.len() < EVENT_BATCH_MAX {
                match self.pending.try_recv() {
                    Ok(event) => batch.push(event),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return written;
            }
            written += self.write(store, &mut batch).await;
        }
    }

    /// Writes until `stop` turns true (then what is left, once) or every
    /// sink is gone.
    pub async fn run(&mut self, store: &dyn Store, mut stop: watch::Receiver<bool>) {
        let mut batch = Vec::with_capacity(EVENT_BATCH_MAX);
        loop {
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                n = self.pending.recv_many(&mut batch, EVENT_BATCH_MAX) => {
                    if n == 0 {
                        return;
                    }
                    self.write(store, &mut batch).await;
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        self.flush(store).await;
    }

    /// One batch, offered up to [`EVENT_WRITE_ATTEMPTS_MAX`] times; the
    /// batch is empty afterwards. Returns how many were written.
    async fn write(&self, store: &dyn Store, batch: &mut Vec<Event>) -> usize {
        for attempt in 1..=EVENT_WRITE_ATTEMPTS_MAX {
            match store.append_events(batch).await {
                Ok(()) => {
                    let n = batch.len();
                    metrics::counter!("stead_events_written_total").increment(n as u64);
                    batch.clear();
                    return n;
                }
                Err(e) if attempt == EVENT_WRITE_ATTEMPTS_MAX => {
                    tracing::warn!(
                        error = %e,
                        events = batch.len(),
                        "the event log could not be written; these events are dropped"
                    );
                }
                Err(_) => tokio::time::sleep(EVENT_WRITE_RETRY_PAUSE).await,
            }
        }
        self.sink.count_dropped(batch.len() as u64);
        batch.clear();
        0
    }
}

/// The instant `retention` before `now`: what was written earlier is past
/// it. `None` when no such instant exists (a retention longer than the
/// timestamps' range), and then nothing is pruned.
fn retention_cutoff(now: Timestamp, retention: Duration) -> Option<Timestamp> {
    let retention = jiff::SignedDuration::try_from(retention).ok()?;
    now.checked_sub(retention).ok()
}

/// Retention: deletes events older than `retention` before `now`, in at
/// most [`EVENT_PRUNE_BATCHES_PER_TICK_MAX`] batches of
/// [`EVENT_PRUNE_BATCH_MAX`]. Returns how many went.
pub async fn prune(
    store: &dyn Store,
    now: Timestamp,
    retention: Duration,
) -> Result<u64, crate::ports::StoreError> {
    let Some(before) = retention_cutoff(now, retention) else {
        return Ok(0);
    };
    let mut pruned = 0;
    for _ in 0..EVENT_PRUNE_BATCHES_PER_TICK_MAX {
        let n = store.prune_events(before, EVENT_PRUNE_BATCH_MAX).await?;
        pruned += n;
        if n < u64::from(EVENT_PRUNE_BATCH_MAX) {
            break;
        }
    }
    if pruned > 0 {
        metrics::counter!("stead_events_pruned_total").increment(pruned);
    }
    Ok(pruned)
}

/// Retention of the type versions (#54): those recorded longer than
/// `retention` before `now` that no live instance runs, no rollout is
/// pinned to and that are not their type's newest ([`Store::prune_type_versions`]).
/// Returns how many went; says so when any did.
///
/// [`Store::prune_type_versions`]: crate::ports::Store::prune_type_versions
pub async fn prune_type_versions(
    store: &dyn Store,
    now: Timestamp,
    retention: Duration,
) -> Result<u64, crate::ports::StoreError> {
    let Some(before) = retention_cutoff(now, retention) else {
        return Ok(0);
    };
    let pruned = store.prune_type_versions(before).await?;
    if pruned > 0 {
        tracing::info!(
            pruned,
            "type versions older than the event retention, run by no live instance and pinned \
             by no rollout, were pruned (rollout undo --to can no longer reach them)"
        );
    }
    Ok(pruned)
}

/// Retention of the task queue (#41): deletes the finished tasks last
/// changed longer than `retention` before `now` (the event log's, which
/// names them), in batches as [`prune`]; queued and running tasks stay.
/// Returns how many went.
pub async fn prune_finished_tasks(
    store: &dyn Store,
    now: Timestamp,
    retention: Duration,
) -> Result<u64, crate::ports::StoreError> {
    let Some(before) = retention_cutoff(now, retention) else {
        return Ok(0);
    };
    let mut pruned = 0;
    for _ in 0..EVENT_PRUNE_BATCHES_PER_TICK_MAX {
        let n = store
            .prune_finished_tasks(before, EVENT_PRUNE_BATCH_MAX)
            .await?;
        pruned += n;
        if n < u64::from(EVENT_PRUNE_BATCH_MAX) {
            break;
        }
    }
    if pruned > 0 {
        metrics::counter!("stead_tasks_pruned_total").increment(pruned);
    }
    Ok(pruned)
}

/// A sink that keeps nothing, for whoever was given none.
pub static EVENTS_OFF: EventSink = EventSink { inner: None };
