//! One lock per instance, across processes (R3, T3).
//!
//! Two layers: an in-process mutex per instance, so this process's own
//! actors (the periodic pass, a targeted pass, its workers) exclude each
//! other without a round trip; and a lock row in the store, so processes
//! exclude each other (a reconciler and separate worker processes, an
//! operator's command). The store's lock expires by the database's clock:
//! a process that dies holding one blocks the instance for the lock's
//! length at most, and the same identity restarted clears it at once.
//!
//! Recovery only ever tries ([`InstanceLocks::try_lock`]) and skips a busy
//! instance; workers and operator commands wait, bounded
//! ([`InstanceLocks::lock`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

mod guard;

pub use guard::InstanceGuard;

use super::clock::{Sent, Trust};

use crate::core::fleet::InstanceId;
use crate::core::hash::FastMap;
use crate::core::policy::trust_margin;
use crate::ports::{Clock, LoadedInstances, Store, StoreError};

/// Pause between tries of a waiting [`InstanceLocks::lock`].
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// The in-process lock of each instance this process holds, waits for or
/// has just released.
pub(super) type LocalLocks = Mutex<FastMap<InstanceId, Arc<tokio::sync::Mutex<()>>>>;

/// Per-instance locks of one process.
pub struct InstanceLocks {
    local: Arc<LocalLocks>,
    store: Arc<dyn Store>,
    /// What the locks' trust is timed by.
    clock: Arc<dyn Clock>,
}

/// Why a lock was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error("instance {instance} stayed locked by another process for {waited:?}")]
    Busy {
        instance: InstanceId,
        waited: Duration,
    },
    #[error("instance lock: {0}")]
    Store(#[from] StoreError),
}

impl InstanceLocks {
    /// Trust timed by the host's own clocks (`SystemClock`) until
    /// [`Self::timed_by`] says otherwise.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            local: Arc::default(),
            store,
            clock: Arc::new(super::SystemClock),
        }
    }

    /// The same locks, their trust timed by `clock`'s monotonic and host
    /// clocks (the process's engine clock).
    pub fn timed_by(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// What the locks' trust is timed by.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    fn local(&self, instance: InstanceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        local.entry(instance).or_default().clone()
    }

    /// Takes the lock if nobody holds it, in this process or another;
    /// `Ok(None)` when the instance is busy (R3: skipped, never waited on).
    pub async fn try_lock(
        &self,
        instance: InstanceId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<InstanceGuard>, StoreError> {
        let local = self.try_local(&[instance]);
        if local.is_empty() {
            return Ok(None);
        }
        let sent = Sent::now(self.clock.as_ref());
        let locked = self
            .store
            .try_lock_instances(&[instance], holder, ttl)
            .await?;
        Ok(self.guards(local, &locked, holder, sent, ttl).pop())
    }

    /// [`Self::try_lock`] for a batch, and the rows of the instances taken
    /// read under their locks, in one round trip where the store can
    /// ([`Store::try_lock_and_load`]): a recovery pass takes its batches
    /// so. The guards of the instances taken, in the order given; busy
    /// ones are left out (R3). Release them with
    /// [`InstanceLocks::release_all`]; an `Err` of the rows leaves them to
    /// be released too.
    pub async fn try_lock_and_load_batch(
        &self,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<(Vec<InstanceGuard>, Result<LoadedInstances, StoreError>), StoreError> {
        let local = self.try_local(instances);
        if local.is_empty() {
            return Ok((Vec::new(), Ok(LoadedInstances::default())));
        }
        let ids: Vec<InstanceId> = local.iter().map(|(id, _)| *id).collect();
        let sent = Sent::now(self.clock.as_ref());
        let (locked, loaded) = self.store.try_lock_and_load(&ids, holder, ttl).await?;
        Ok((self.guards(local, &locked, holder, sent, ttl), loaded))
    }

    /// The in-process locks of `instances` that are free, taken (the map
    /// locked once for the whole batch).
    fn try_local(&self, instances: &[InstanceId]) -> Vec<(InstanceId, OwnedMutexGuard<()>)> {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        instances
            .iter()
            .filter_map(|&id| {
                let mutex = local.entry(id).or_default().clone();
                Some((id, mutex.try_lock_owned().ok()?))
            })
            .collect()
    }

    /// How many instances have an in-process lock entry (held, waited
    /// for, or not yet forgotten).
    pub fn local_entries(&self) -> usize {
        self.local.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Guards for the instances the store locked (in-process locks of the
    /// rest are dropped), trusted from when the request was sent.
    fn guards(
        &self,
        local: Vec<(InstanceId, OwnedMutexGuard<()>)>,
        locked: &[InstanceId],
        holder: &str,
        sent: Sent,
        ttl: Duration,
    ) -> Vec<InstanceGuard> {
        let mut locked = locked.to_vec();
        locked.sort_unstable();
        let holder: Arc<str> = Arc::from(holder);
        let trusted_until = Trust::from(sent, ttl - trust_margin(ttl));
        let (taken, busy): (Vec<_>, Vec<_>) = local
            .into_iter()
            .partition(|(id, _)| locked.binary_search(id).is_ok());
        let busy: Vec<InstanceId> = busy.into_iter().map(|(id, _)| id).collect();
        forget_unused(&self.local, &busy);
        taken
            .into_iter()
            .map(|(instance, local)| InstanceGuard {
                local,
                locals: self.local.clone(),
                store: self.store.clone(),
                instance,
                holder: holder.clone(),
                trusted_until,
                clock: self.clock.clone(),
            })
            .collect()
    }

    /// Releases the guards of one holder in one round trip to the store,
    /// then their in-process locks.
    pub async fn release_all(guards: Vec<InstanceGuard>) {
        let Some(first) = guards.first() else {
            return;
        };
        let ids: Vec<InstanceId> = guards.iter().map(|g| g.instance).collect();
        if let Err(e) = first.store.unlock_instances(&ids, &first.holder).await {
            // The rows expire by themselves; until then the instances are busy.
            tracing::warn!(instances = ?ids, error = %e, "instance locks not released; they will expire");
        }
        let locals = first.locals.clone();
        drop(guards);
        forget_unused(&locals, &ids);
    }

    /// Waits for the lock, at most `wait_max`.
    pub async fn lock(
        &self,
        instance: InstanceId,
        holder: &str,
        ttl: Duration,
        wait_max: Duration,
    ) -> Result<InstanceGuard, LockError> {
        let began = Instant::now();
        let busy = || LockError::Busy {
            instance,
            waited: began.elapsed(),
        };
        let local = tokio::time::timeout(wait_max, self.local(instance).lock_owned())
            .await
            .map_err(|_| busy())?;
        loop {
            let sent = Sent::now(self.clock.as_ref());
            let locked = self
                .store
                .try_lock_instances(&[instance], holder, ttl)
                .await?;
            if locked.contains(&instance) {
                return Ok(InstanceGuard {
                    local,
                    locals: self.local.clone(),
                    store: self.store.clone(),
                    instance,
                    holder: Arc::from(holder),
                    trusted_until: Trust::from(sent, ttl - trust_margin(ttl)),
                    clock: self.clock.clone(),
                });
            }
            if began.elapsed() + LOCK_RETRY_INTERVAL > wait_max {
                return Err(busy());
            }
            tokio::time::sleep(LOCK_RETRY_INTERVAL).await;
        }
    }
}

/// Forgets the in-process locks of `instances` that nobody holds or waits
/// for, so that the map does not keep every instance this process ever
/// locked (deleted ones included). Safe under the map's mutex: a holder or
/// a waiter has a clone of the entry, and clones are only made under it.
pub(super) fn forget_unused(locals: &LocalLocks, instances: &[InstanceId]) {
    let mut local = locals.lock().unwrap_or_else(|e| e.into_inner());
    for id in instances {
        if local.get(id).is_some_and(|m| Arc::strong_count(m) == 1) {
            local.remove(id);
        }
    }
}
