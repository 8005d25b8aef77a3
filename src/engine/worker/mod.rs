//! Workers (C11): claim due tasks with a lease, keep the lease alive while
//! working, run idempotent handlers, and finish with done, retry (bounded,
//! with backoff) or failed. Handlers hold the instance lock, so the
//! recovery pass skips an instance while a worker mutates it (R3).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use tracing::Instrument;

use crate::core::broken::Armed;
use crate::core::errors::{Cause, ErrorKind, TaskError};
use crate::core::fleet::{Task, TaskRetryPolicy};
use crate::core::policy::trust_margin;
use crate::core::types::InstanceName;

pub(super) mod bake;
mod end;
mod finish;
mod handle;
mod perform;
mod protocols;

use end::log_end;
pub use end::TaskEnd;

use super::clock::{Sent, Trust};
use super::event_log::EventSink;
use super::locks::InstanceLocks;
use super::{Ports, SharedCatalog};
use crate::ports::{LockGrant, LockedWrite, StoreError};

/// How a worker behaves.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Recorded as `locked_by`; unique per worker.
    pub id: String,
    /// Task lease; renewed every third of it while a handler runs.
    pub lease: Duration,
    pub retry: TaskRetryPolicy,
    /// Pause when no task is due.
    pub idle_poll: Duration,
    /// Stop grace of a deprovisioned container that names none of its own
    /// (the recovery policy's `stop_grace_default`).
    pub stop_grace_default: Duration,
    /// A rule deliberately broken, armed as data by the simulation's
    /// mutation exercise (`stead_testkit::mutants`, `docs/simulation.md`);
    /// always `None` in the daemon.
    pub broken: Armed,
}

pub struct Worker {
    ports: Ports,
    catalog: SharedCatalog,
    config: WorkerConfig,
    locks: Arc<InstanceLocks>,
    /// Until when the lease of the task in hand is trusted (T2): a worker
    /// paused past it (a stopped VM, a long GC) must not act on resuming,
    /// since the task may be another worker's by then. Set at claim,
    /// moved on by each renewal, checked before every effect.
    trusted_until: std::sync::Mutex<Option<Trust>>,
    /// Until when the instance lock of the task in hand is trusted (T3).
    lock_trusted_until: std::sync::Mutex<Option<Trust>>,
    /// The instance lock of the task in hand, which its writes to the
    /// instance carry ([`Worker::write_locked`]).
    held_lock: std::sync::Mutex<Option<LockGrant>>,
    /// Set once the store refused a write of the task in hand because its
    /// instance lock is no longer this worker's: the task ends as a lost
    /// lease.
    lock_lost: AtomicBool,
    /// Where each task's end is logged durably too (#42).
    events: EventSink,
}

impl Worker {
    pub fn new(
        ports: Ports,
        catalog: impl Into<SharedCatalog>,
        config: WorkerConfig,
        locks: Arc<InstanceLocks>,
    ) -> Self {
        Self {
            ports,
            catalog: catalog.into(),
            config,
            locks,
            trusted_until: std::sync::Mutex::new(None),
            lock_trusted_until: std::sync::Mutex::new(None),
            held_lock: std::sync::Mutex::new(None),
            lock_lost: AtomicBool::new(false),
            events: EventSink::off(),
        }
    }

    /// The same worker, writing each task's end to the event log through
    /// `sink` (#42).
    pub fn with_events(self, sink: EventSink) -> Self {
        Self {
            events: sink,
            ..self
        }
    }

    /// `Ok` while the lease of the task in hand and its instance's lock
    /// are both trusted; otherwise `instance`'s task stops, fenced.
    fn allowed(&self, instance: &InstanceName) -> Result<(), TaskError> {
        // Both timed by the clock the instance locks are (the engine's).
        let clock = self.locks.clock();
        let trusted = |until: &std::sync::Mutex<Option<Trust>>| {
            until
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|until| until.holds(clock))
        };
        let trusted = trusted(&self.trusted_until) && trusted(&self.lock_trusted_until);
        if trusted || crate::broken!(self.config.broken, ActOnExpiredLease) {
            Ok(())
        } else {
            Err(TaskError::new(
                instance,
                "act under the task lease",
                Cause::verdict(
                    ErrorKind::Fenced,
                    "the task lease is no longer trusted; stopping before acting",
                ),
            ))
        }
    }

    /// A write to the instance of the task in hand, which the store makes
    /// only while this worker's lock of it still holds (T3): a worker
    /// paused past its lock never overwrites what the lock's next holder
    /// wrote. Refused, the lock is lost: the refused write is not retried,
    /// no further effect is made under the lock ([`Self::allowed`] says
    /// no from then on), and the task ends as a lost lease, its lease left
    /// to run out and requeue it.
    pub(super) async fn write_locked(&self, write: LockedWrite<'_>) -> Result<bool, StoreError> {
        let lock = self
            .held_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(lock) = lock else {
            return Err(StoreError::Conflict(
                "a worker wrote to an instance without holding its lock".to_owned(),
            ));
        };
        let written = self.ports.store.write_under_lock(&lock, write).await;
        if let Err(e @ StoreError::LockLost { .. }) = &written {
            *self
                .lock_trusted_until
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None;
            self.lock_lost.store(true, Ordering::Relaxed);
            tracing::warn!(
                instance = lock.instance,
                holder = %lock.holder,
                error = %e,
                "instance lock lost mid-task: the store refused the worker's write; the task \
                 stops without retrying it, and its lease runs out and requeues it"
            );
        }
        written
    }

    /// The lease, asked for at `sent`, is trusted for its length less the
    /// margin from then.
    fn trust_lease_from(&self, sent: Sent) {
        let until = Trust::from(sent, self.config.lease - trust_margin(self.config.lease));
        *self.trusted_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
    }

    /// Claims and runs tasks until `stop`; a running handler is allowed to
    /// finish (its own calls are bounded), then the loop exits.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.work_once().await {
                Some(_) => continue,
                None => {
                    tokio::select! {
                        // In order, not at random: the simulation must replay exactly.
                        biased;
                        _ = tokio::time::sleep(self.config.idle_poll) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }

    /// Claims one due task and runs it. `None` when nothing was due (or the
    /// store is down).
    pub async fn work_once(&self) -> Option<(Task, TaskEnd)> {
        let clock =
            super::clock::anchor(self.ports.clock.as_ref(), self.ports.store.as_ref(), false);
        if !clock.await.follows_database() {
            // A host clock minutes ahead would claim tasks before they are
            // due (an upgrade before its window): none until the database
            // has answered once.
            return None;
        }
        let now = self.ports.clock.now();
        let sent = Sent::now(self.locks.clock());
        let claimed = match self.ports.store.claim(&self.config.id, now, 1).await {
            Ok(tasks) => tasks,
            Err(e) => {
                tracing::warn!(error = %e, "claim failed");
                return None;
            }
        };
        let task = claimed.into_iter().next()?;
        self.trust_lease_from(sent);
        let span = tracing::info_span!(
            "task",
            id = task.id,
            kind = task.kind.as_str(),
            traceparent = task.traceparent.as_deref().unwrap_or("")
        );
        crate::engine::trace::child(&span, task.traceparent.as_deref());
        // The span goes with the task's future, never held entered across
        // an await: tasks that run at once on one thread would otherwise
        // log under each other's trace ids (#43).
        let end = async {
            // The instance's name, for the line below; the handler reads
            // the instance again under its lock.
            let instance = match self.ports.store.instance_by_id(task.instance).await {
                Ok(Some(i)) => i.name.to_string(),
                _ => format!("instance {}", task.instance),
            };
            tracing::info!(
                instance = %instance,
                attempt = task.attempts,
                "task {} {} of {instance} started (attempt {}): {}",
                task.id, task.kind, task.attempts, task.reason
            );
            let end = self.run_task(&task, &instance).await;
            *self.trusted_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
            log_end(&task, &instance, &end);
            end
        }
        .instrument(span)
        .await;
        metrics::counter!("stead_tasks_total", "kind" => task.kind.as_str(), "outcome" => end.label())
            .increment(1);
        Some((task, end))
    }

    /// Renews the lease every third of it; returns only if it was lost.
    async fn keep_lease(&self, task: &Task) {
        loop {
            tokio::time::sleep(self.config.lease / 3).await;
            let now = self.ports.clock.now();
            let sent = Sent::now(self.locks.clock());
            match self
                .ports
                .store
                .extend_lease(task.id, &self.config.id, now)
                .await
            {
                Ok(true) => self.trust_lease_from(sent),
                Ok(false) => return,
                // A store blip is not a lost lease; try again next time.
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
        }
    }
}
