//! The reconciler's singleton lease as one process holds it (C2, T1, T2).
//!
//! The store times the lease by the database's clock; this process cannot
//! read that clock whenever it likes, so it keeps its own conservative view
//! on its host's clocks: a grant obtained by a request sent at local
//! instant `sent` is trusted until `sent + ttl - margin`, by the monotonic
//! clock and by the wall clock both (`clock::Trust`: the monotonic clock
//! stands still while the host is suspended). The database
//! processed the request after `sent`, so its expiry lies later than that
//! in any frame; the margin covers clock-rate drift and the time between
//! checking the lease and the effect it guards. Every effect the reconciler
//! makes (each instance of a pass, each targeted pass, each planner's
//! writes) asks [`LeaseGuard::ensure`] first, which renews when the grant
//! would not last the work ahead, and answers `None` once the lease is
//! lost; store writes carry the grant as a fence, checked by the database.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::clock::{Sent, Trust};
use crate::ports::{Clock, LeaseGrant, Store, StoreError};

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
    /// Until when the grant is trusted.
    trusted: Trust,
}

/// One process's view of the singleton lease.
pub struct LeaseGuard {
    holder: String,
    ttl: Duration,
    margin: Duration,
    clock: Arc<dyn Clock>,
    /// Whether `clock` is the engine's, following the database's: then a
    /// grant is trusted no longer than its expiry as that clock places it.
    follows_database: bool,
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
    /// Timed by the host's own clocks (`SystemClock`) until
    /// [`Self::timed_by`] says otherwise.
    pub fn new(holder: String, ttl: Duration, margin: Duration) -> Self {
        assert!(margin < ttl, "lease margin {margin:?} >= ttl {ttl:?}");
        Self {
            holder,
            ttl,
            margin,
            clock: Arc::new(super::SystemClock),
            follows_database: false,
            held: Mutex::new(None),
        }
    }

    /// The same guard, timing its trust by `clock`'s monotonic and host
    /// clocks (the process's engine clock).
    pub fn timed_by(self, clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            follows_database: true,
            ..self
        }
    }

    /// How long a grant obtained by a request sent at `sent` is trusted:
    /// its length less the margin, and, when the database's clock stood
    /// behind this process's reckoning as it granted (a step back it may
    /// take back later, #41), no longer than its expiry as this process
    /// places it.
    fn trust_for(&self, grant: &LeaseGrant, sent_at: crate::core::types::Timestamp) -> Duration {
        let mut length = self.ttl;
        if self.follows_database {
            let left = grant.expires_at.duration_since(sent_at);
            length = length.min(Duration::try_from(left).unwrap_or(Duration::ZERO));
        }
        length.saturating_sub(self.margin)
    }

    /// Trusts the grant in hand no longer: the next [`Self::ensure`] asks
    /// the store again (after a reading of the database's clock that
    /// jumped, #41).
    pub fn distrust(&self) {
        if let Some(held) = self.lock().as_mut() {
            held.trusted = Trust::from(Sent::now(self.clock.as_ref()), Duration::ZERO);
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
        let sent = Sent::now(self.clock.as_ref());
        let sent_at = self.clock.now();
        match store.acquire_reconciler_lease(&self.holder, self.ttl).await {
            Ok(Some(grant)) => {
                *self.lock() = Some(Held {
                    trusted: Trust::from(sent, self.trust_for(&grant, sent_at)),
                    grant: grant.clone(),
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
        let clock = self.clock.as_ref();
        if !clock.settled() {
            // This process stood still or the database's clock stepped:
            // what it is about to do was decided on a view that may be
            // stale, and the next reading of the clock says more (#41).
            return None;
        }
        if let Some(held) = self.lock().clone() {
            if held.trusted.lasts(clock, need) {
                return Some(held.grant);
            }
        }
        match self.acquire(store).await {
            LeaseAnswer::Held(grant) => {
                let trusted = self
                    .lock()
                    .as_ref()
                    .is_some_and(|h| h.trusted.lasts(clock, need));
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
            .filter(|held| held.trusted.holds(self.clock.as_ref()))
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
