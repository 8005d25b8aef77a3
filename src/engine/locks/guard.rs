//! A held instance lock ([`InstanceGuard`]): how long it is trusted, what
//! its writes carry, and its release.

use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;

use super::{forget_unused, LocalLocks};
use crate::core::fleet::InstanceId;
use crate::engine::clock::Trust;
use crate::ports::{Clock, LockGrant, Store};

/// A held instance lock. Release it with [`InstanceGuard::release`]; one
/// dropped unreleased (its holder was cancelled, or its process died)
/// leaves its row to expire by the database's clock, as a killed process
/// would: a guard never acts from a destructor.
pub struct InstanceGuard {
    pub(super) local: OwnedMutexGuard<()>,
    /// Where the in-process lock came from, to forget it once released.
    pub(super) locals: Arc<LocalLocks>,
    pub(super) store: Arc<dyn Store>,
    pub(super) instance: InstanceId,
    /// Shared by every guard of one batch.
    pub(super) holder: Arc<str>,
    /// Until when the store's row is trusted to be this guard's: like a
    /// lease, it expires by the database's clock, so a holder paused past
    /// it must not act on the instance (another process may hold it now).
    pub(super) trusted_until: Trust,
    pub(super) clock: Arc<dyn Clock>,
}

impl InstanceGuard {
    pub fn instance(&self) -> InstanceId {
        self.instance
    }

    /// Whether the lock is still trusted to be this guard's right now.
    pub fn trusted(&self) -> bool {
        self.trusted_until.holds(self.clock.as_ref())
    }

    /// Until when the lock is trusted.
    pub fn trusted_until(&self) -> Trust {
        self.trusted_until
    }

    /// What the guard's writes to the instance carry, so the store makes
    /// them only while the lock is still this guard's
    /// ([`Store::write_under_lock`]).
    pub fn grant(&self) -> LockGrant {
        LockGrant {
            instance: self.instance,
            holder: self.holder.to_string(),
        }
    }

    /// Releases the store's row, then the in-process lock.
    pub async fn release(self) {
        if let Err(e) = self
            .store
            .unlock_instances(&[self.instance], &self.holder)
            .await
        {
            // The row expires by itself; until then the instance is busy.
            tracing::warn!(instance = self.instance, error = %e, "instance lock not released; it will expire");
        }
        let Self {
            local,
            locals,
            instance,
            ..
        } = self;
        drop(local);
        forget_unused(&locals, &[instance]);
    }
}
