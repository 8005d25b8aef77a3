//! The reconciler's singleton lease as one process holds it (C2, T1, T2).
//!
//! The store times the lease by the database's clock; this process cannot
//! read that clock whenever it likes, so it keeps its own conservative view
//! on the monotonic clock: a grant obtained by a request sent at local
//! instant `sent` is trusted until `sent + ttl - margin`. The database
//! processed the request after `sent`, so its expiry lies later than that
//! in any frame; the margin covers clock-rate drift and the time between
//! checking the lease and the effect it guards. Every effect the reconciler
//! makes (each instance of a pass, each targeted pass, each planner's
//! writes) asks [`LeaseGuard::ensure`] first, which renews when the grant
//! would not last the work ahead, and answers `None` once the lease is
//! lost; store writes carry the grant as a fence, checked by the database.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::ports::{LeaseGrant, Store, StoreError};

/// Who a process is, for leases and locks (T1): a stable identity (kept in
/// the data directory by the daemon) and this run's incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub identity: String,
    pub incarnation: String,
}

impl ProcessIdentity {
    /// The lease holder: `<identity>#<incarnation>`. A new incarnation of
    /// the same identity at the same site takes the reconciler lease back
    /// at once (`core::succession`).
    pub fn holder(&self) -> String {
        format!("{}#{}", self.identity, self.incarnation)
    }

    /// One actor inside this process (`recovery`, `w0`, …), as an instance
    /// lock or task lease holder: `<identity>#<incarnation>/<actor>`.
    pub fn actor(&self, actor: &str) -> String {
        format!("{}/{actor}", self.holder())
    }

    /// The prefix every holder of any incarnation of this identity starts
    /// with, twins at other sites included.
    pub fn identity_prefix(&self) -> String {
        format!("{}#", self.identity)
    }

    /// The prefix of the holders this process provably succeeds (T1): the
    /// earlier incarnations at its own site, which held the identity lock
    /// it holds now (`core::succession::predecessors_prefix`). A restarted
    /// process releases their locks and requeues their tasks, and leaves a
    /// twin's alone.
    pub fn predecessors_prefix(&self) -> String {
        crate::core::succession::predecessors_prefix(&self.holder())
    }
}

/// What [`LeaseGuard`] knows about its grant.
#[derive(Clone, Debug)]
struct Held {
    grant: LeaseGrant,
    /// Local instant until which the grant is trusted.
    trusted_until: Instant,
}

/// One process's view of the singleton lease.
pub struct LeaseGuard {
    holder: String,
    ttl: Duration,
    margin: Duration,
    held: Mutex<Option<Held>>,
}

/// What happened when the lease was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Held (taken, renewed or still trusted).
    Held(LeaseGrant),
    /// Another holder's lease is unexpired.
    HeldElsewhere,
    /// The store did not answer; nothing is trusted.
    Unavailable(String),
}

impl LeaseGuard {
    /// `ttl` must exceed `margin` (asserted: a lease trusted for no time at
    /// all would let nothing run).
    pub fn new(holder: String, ttl: Duration, margin: Duration) -> Self {
        assert!(margin < ttl, "lease margin {margin:?} >= ttl {ttl:?}");
        Self {
            holder,
            ttl,
            margin,
            held: Mutex::new(None),
        }
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes or renews the lease now.
    pub async fn acquire(&self, store: &dyn Store) -> LeaseAnswer {
        let sent = Instant::now();
        match store.acquire_reconciler_lease(&self.holder, self.ttl).await {
            Ok(Some(grant)) => {
                *self.lock() = Some(Held {
                    grant: grant.clone(),
                    trusted_until: sent + (self.ttl - self.margin),
                });
                LeaseAnswer::Held(grant)
            }
            Ok(None) => {
                *self.lock() = None;
                LeaseAnswer::HeldElsewhere
            }
            Err(e) => {
                *self.lock() = None;
                LeaseAnswer::Unavailable(e.to_string())
            }
        }
    }

    /// The grant, if it is trusted for at least `need` more: renewed first
    /// when it would not last that long. `None` when the lease is lost or
    /// the store cannot say: the caller must not act.
    pub async fn ensure(&self, store: &dyn Store, need: Duration) -> Option<LeaseGrant> {
        if let Some(held) = self.lock().clone() {
            if Instant::now() + need <= held.trusted_until {
                return Some(held.grant);
            }
        }
        match self.acquire(store).await {
            LeaseAnswer::Held(grant) => {
                let trusted = self
                    .lock()
                    .as_ref()
                    .is_some_and(|h| Instant::now() + need <= h.trusted_until);
                // A lease shorter than the work ahead is no lease for it.
                trusted.then_some(grant)
            }
            LeaseAnswer::HeldElsewhere | LeaseAnswer::Unavailable(_) => None,
        }
    }

    /// The grant while it is trusted right now, without asking the store.
    pub fn current(&self) -> Option<LeaseGrant> {
        self.lock()
            .as_ref()
            .filter(|held| Instant::now() < held.trusted_until)
            .map(|held| held.grant.clone())
    }

    /// Gives the lease up (graceful shutdown), so another replica, or this
    /// identity's next incarnation, need not wait for it to expire.
    pub async fn release(&self, store: &dyn Store) -> Result<(), StoreError> {
        let held = self.lock().take();
        match held {
            Some(held) => store.release_reconciler_lease(&held.grant).await,
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}
