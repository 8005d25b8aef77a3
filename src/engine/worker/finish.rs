//! Running a claimed task to its end and recording it: done, retried
//! after a backoff, deferred (an upgrade whose retry falls outside its
//! window ends, #55), or failed for good (C11), each with its event in the
//! same transaction (#42).

use std::sync::atomic::Ordering;

use crate::core::errors::TaskError;
use crate::core::fleet::{RetryDecision, Task, TaskKind};
use crate::core::plan::{upgrade_retry, UpgradeRetry};
use crate::core::types::Timestamp;
use crate::ports::TaskFinish;

use super::end::end_event;
use super::{TaskEnd, Worker};

impl Worker {
    /// Runs `task` (of the instance named `instance`) and records how it
    /// ended, with its event (#42) in the same transaction.
    pub(super) async fn run_task(&self, task: &Task, instance: &str) -> TaskEnd {
        self.lock_lost.store(false, Ordering::Relaxed);
        let work = self.handle(task);
        let keep_lease = self.keep_lease(task);
        let result = tokio::select! {
            // In order, not at random: the simulation must replay exactly.
            biased;
            r = work => r,
            _ = keep_lease => return TaskEnd::LeaseLost,
        };
        if self.lock_lost.load(Ordering::Relaxed) {
            // Whatever the handler made of the refusal, the task is the
            // lock's next holder's to tell: nothing is recorded here.
            return TaskEnd::LeaseLost;
        }
        let now = self.ports.clock.now();
        match result {
            Ok(()) => {
                let done = TaskFinish::Done;
                let _ = self.finish(task, instance, done, &TaskEnd::Done, now).await;
                TaskEnd::Done
            }
            // A permanent failure (an image that cannot be pulled, a
            // refused request) fails at once; any other is retried with
            // backoff until the attempts run out.
            Err(error) => match self
                .config
                .retry
                .after_error(task.attempts, error.kind(), now)
            {
                RetryDecision::RetryAt(at) => {
                    let at = match self.retry_of(task, at).await {
                        UpgradeRetry::At(at) => at,
                        UpgradeRetry::Deferred { opens_at } => {
                            return self.defer(task, instance, error, opens_at, now).await
                        }
                    };
                    let message = error.to_string();
                    let end = TaskEnd::Retried(error);
                    let retry = TaskFinish::Retry {
                        run_after: at,
                        error: &message,
                    };
                    let _ = self.finish(task, instance, retry, &end, now).await;
                    end
                }
                // Only a failure the store recorded as this worker's halts
                // the rollout (C8). A worker frozen past its task lease
                // finds the task requeued and maybe running elsewhere:
                // its verdict is stale, and a halt on it would stop a
                // rollout no upgrade failed (found by the simulation).
                RetryDecision::Fail => {
                    let message = error.to_string();
                    let end = TaskEnd::Failed(error.clone());
                    let fail = TaskFinish::Fail { error: &message };
                    match self.finish(task, instance, fail, &end, now).await {
                        Ok(true) => {
                            self.after_final_failure(task, &error).await;
                            TaskEnd::Failed(error)
                        }
                        Ok(false) => TaskEnd::LeaseLost,
                        Err(e) => {
                            tracing::warn!(
                                task = task.id,
                                "task {} failed for good but the store did not record it ({e}); \
                             its lease expires and the next attempt decides again",
                                task.id
                            );
                            TaskEnd::Failed(error)
                        }
                    }
                }
            },
        }
    }

    /// Finishes `task` in the store as `finish` says. With the event log
    /// on, the end's event goes in the same transaction (both or neither);
    /// a lost lease records nothing, as the worker that holds the task now
    /// tells its end.
    async fn finish(
        &self,
        task: &Task,
        instance: &str,
        finish: TaskFinish<'_>,
        end: &TaskEnd,
        now: Timestamp,
    ) -> Result<bool, crate::ports::StoreError> {
        let store = &self.ports.store;
        let worker = self.config.id.as_str();
        let event = end_event(task, instance, end, now).and_then(|e| self.events.stamp(e));
        if let Some(event) = event {
            return store
                .finish_task_recorded(task.id, worker, finish, now, &event)
                .await;
        }
        match finish {
            TaskFinish::Done => store.complete(task.id, worker, now).await,
            TaskFinish::Retry { run_after, error } => {
                store.retry(task.id, worker, run_after, error, now).await
            }
            TaskFinish::Fail { error } => store.fail(task.id, worker, error, now).await,
        }
    }

    /// When a failed task runs again, its backoff having ended at
    /// `backoff_ends`: an upgrade only inside its instance's maintenance
    /// window, as its first run (`core::plan::upgrade_retry`).
    async fn retry_of(&self, task: &Task, backoff_ends: Timestamp) -> UpgradeRetry {
        if task.kind != TaskKind::Upgrade {
            return UpgradeRetry::At(backoff_ends);
        }
        let Ok(Some(instance)) = self.ports.store.instance_by_id(task.instance).await else {
            return UpgradeRetry::At(backoff_ends);
        };
        let security = self.entry(&instance).is_ok_and(|entry| entry.security);
        match upgrade_retry(backoff_ends, &instance, security) {
            UpgradeRetry::Deferred { opens_at }
                if crate::broken!(self.config.broken, ParkRetryBehindWindow) =>
            {
                UpgradeRetry::At(opens_at)
            }
            retry => retry,
        }
    }

    /// Ends an upgrade whose retry would fall outside its window (#55):
    /// failed, so it holds no slot, with no halt (it had attempts left);
    /// version drift queues it again inside the window's next opening.
    async fn defer(
        &self,
        task: &Task,
        instance: &str,
        error: TaskError,
        opens_at: Timestamp,
        now: Timestamp,
    ) -> TaskEnd {
        let message = format!(
            "{error}; its maintenance window closes before the retry, so the task ends and the \
             upgrade is queued again when the window next opens ({opens_at})"
        );
        let end = TaskEnd::Deferred(error, opens_at);
        let fail = TaskFinish::Fail { error: &message };
        match self.finish(task, instance, fail, &end, now).await {
            Ok(false) => TaskEnd::LeaseLost,
            _ => end,
        }
    }
}
