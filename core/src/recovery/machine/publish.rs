//! The end of a recovery that verified its execution: ACTIVE read again,
//! the binds persisted, the execution recorded and routed (R13, R17, S11).

use jiff::Timestamp;

use super::ServiceRecovery;
use crate::errors::StoreError;
use crate::recovery::command::Outcome;
use crate::recovery::phase::{Phase, Route, Verifying};
use crate::recovery::report::{RecoveryError, Verdict};
use crate::types::ActiveService;

impl ServiceRecovery<'_> {
    /// The answers once the execution is verified: ACTIVE read again, the
    /// binds persisted, the execution recorded and routed.
    pub(super) fn on_verified(&mut self, phase: Phase, outcome: Outcome, now: Timestamp) -> Phase {
        match (phase, outcome) {
            (Phase::ReloadActive(v), Outcome::ActiveReloaded(result)) => {
                self.on_active_reloaded(v, result, now)
            }
            (Phase::PersistBinds(v), Outcome::BindsPersisted(result)) => match result {
                Ok(true) => self.decide_publication(v),
                Ok(false) => self.verification_failed(RecoveryError::GenerationChanged, now),
                Err(e) => self.verification_failed(RecoveryError::PersistFailed(e), now),
            },
            (Phase::Publish(v), Outcome::Published(result)) => match result {
                Ok(()) => {
                    self.route = Route::Vouched;
                    if self.needs_record(&v) {
                        // Only with the rule broken on purpose (S11).
                        Phase::RecordAfterPublish(v)
                    } else {
                        self.finish_verified(v, true)
                    }
                }
                Err(e) => {
                    // Not charged, not withdrawn: the workload is fine, the
                    // proxy is not. The next pass finds the route missing
                    // and publishes the recorded execution again (T5).
                    self.errors.push(RecoveryError::PublishFailed(e));
                    self.budget.invalidate_stable();
                    Phase::Done(Verdict::Failed)
                }
            },
            (Phase::RecordExecution(v), Outcome::ExecutionRecorded(result)) => match result {
                Ok(()) => {
                    self.active.verified_started_at = v.started_at();
                    if self.needs_publication(&v) {
                        Phase::Publish(v)
                    } else {
                        self.finish_verified(v, false)
                    }
                }
                Err(e) if self.needs_publication(&v) => {
                    // S11: never routed before it is durably verified, so a
                    // restart at any instant cannot blink it. Left withdrawn;
                    // the next pass verifies and records again.
                    self.errors.push(RecoveryError::RecordFailed(e));
                    self.budget.invalidate_stable();
                    Phase::Done(Verdict::Failed)
                }
                Err(e) => {
                    self.errors.push(RecoveryError::RecordFailed(e));
                    self.finish_verified(v, false)
                }
            },
            (Phase::RecordAfterPublish(v), Outcome::ExecutionRecorded(result)) => {
                match result {
                    Ok(()) => self.active.verified_started_at = v.started_at(),
                    Err(e) => self.errors.push(RecoveryError::RecordFailed(e)),
                }
                self.finish_verified(v, true)
            }
            (phase, outcome) => unreachable!("{outcome:?} answered in phase {phase:?}"),
        }
    }

    pub(super) fn on_active_reloaded(
        &mut self,
        v: Verifying,
        result: Result<Option<ActiveService>, StoreError>,
        now: Timestamp,
    ) -> Phase {
        match result {
            Ok(Some(current))
                if current.container == self.active.container
                    && current.effective_revision == self.active.effective_revision =>
            {
                if current.binds != v.binds {
                    Phase::PersistBinds(v)
                } else {
                    self.decide_publication(v)
                }
            }
            Ok(_) => self.verification_failed(RecoveryError::GenerationChanged, now),
            Err(e) => self.verification_failed(RecoveryError::ReloadFailed(e), now),
        }
    }

    /// R13: publish if started, restarted, fresh, or the binds changed;
    /// S11: record the verified execution in ACTIVE first, so what is routed
    /// is always what a restarted daemon finds vouched for (R17) and a
    /// restart at any instant never blinks it.
    pub(super) fn decide_publication(&mut self, v: Verifying) -> Phase {
        let record_first = !crate::broken!(self.policy.broken, PublishBeforeRecord);
        if self.needs_record(&v) && (record_first || !self.needs_publication(&v)) {
            Phase::RecordExecution(v)
        } else if self.needs_publication(&v) {
            Phase::Publish(v)
        } else {
            self.finish_verified(v, false)
        }
    }

    /// Whether verifying this execution will write anything (binds, a
    /// route, the record): only then is ACTIVE read again first.
    pub(super) fn writes_pending(&self, v: &Verifying) -> bool {
        self.needs_publication(v) || self.needs_record(v)
    }

    /// R13: whether the route must be (re)published: the execution is new
    /// (started, restarted or fresh), this daemon cannot vouch for the
    /// route, or the binds changed. None of these changes between the
    /// decision and the publication, so it is asked, not stored. A service
    /// without binds has nothing to route: it is verified and never
    /// published (the proxy refuses a route without an upstream).
    pub(super) fn needs_publication(&self, v: &Verifying) -> bool {
        (!v.binds.is_empty() || crate::broken!(self.policy.broken, PublishPortless))
            && (v.exec.new || self.route == Route::Unvouched || v.binds != self.active.binds)
    }

    /// Whether ACTIVE's durable record is not yet the execution verified.
    pub(super) fn needs_record(&self, v: &Verifying) -> bool {
        let started_at = v.started_at();
        started_at.is_some() && started_at != self.active.verified_started_at
    }

    /// Verified: `published` says whether this pass had to publish it.
    pub(super) fn finish_verified(&mut self, v: Verifying, published: bool) -> Phase {
        self.verified_started_at = v.started_at();
        if v.binds.is_empty() {
            // Nothing to route, so nothing this daemon cannot vouch for.
            self.route = Route::Vouched;
        }
        if v.stable {
            // Stable as of the observation, not of now: a process frozen
            // between its inspect and this answer saw nothing of the
            // frozen minutes, so they must not count as stable (R14).
            self.budget.observe_stable(self.policy, v.exec.at);
        } else {
            self.budget.invalidate_stable();
        }
        Phase::Done(Verdict::Verified {
            started_at: v.started_at(),
            published,
        })
    }
}
