//! The reconciler lease (C2) as a tick sees it: taking, renewing,
//! waiting for another holder, releasing, and watching for a twin (T1).

use std::sync::atomic::Ordering;

use crate::core::event_log::{Event, EventKind};
use crate::core::succession::{SeenLease, TwinVerdict};
use crate::engine::lease::LeaseAnswer;
use crate::ports::LeaseGrant;

use super::Reconciler;

impl Reconciler {
    /// C2: take or renew the singleton lease; says so once when this
    /// replica takes it, loses it, or waits for another's, naming the
    /// holder and its expiry.
    ///
    /// On a clock nothing vouches for (`verified` false) it renews its own
    /// lease, or takes one nobody holds or its own identity held, but
    /// takes over no other holder's: that lease may look expired only
    /// because the database's clock jumped.
    pub(super) async fn take_lease(&self, verified: bool) -> bool {
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
}
