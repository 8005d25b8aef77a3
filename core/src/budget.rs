//! The crash-loop budget of one generation (R10), its unhealthy streak
//! (R12) and its stability streak (R14).
//!
//! A generation with no history is the common case and costs nothing: the
//! budget is `None` until something goes wrong, and a stable observation
//! never creates history (R14).

use jiff::Timestamp;

use super::fleet::add;
use super::policy::RecoveryPolicy;

/// Recorded history of a generation that has needed recovery.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BudgetEntry {
    /// Consecutive failures since the history was last dropped.
    pub failures: u32,
    /// No attempt may run before this instant.
    pub next_attempt: Option<Timestamp>,
    /// Start of the current continuously stable streak.
    pub stable_since: Option<Timestamp>,
    /// Consecutive unhealthy observations.
    pub unhealthy_streak: u32,
    /// A start or restart that no stable observation has confirmed yet. A
    /// generation found down again meanwhile is crash-looping (R10).
    pub attempt_pending: bool,
}

/// The budget of one generation. Time is always an argument.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    entry: Option<BudgetEntry>,
}

impl Budget {
    pub fn from_entry(entry: Option<BudgetEntry>) -> Self {
        Self { entry }
    }

    pub fn into_entry(self) -> Option<BudgetEntry> {
        self.entry
    }

    /// Whether one real attempt may run at `now`.
    pub fn allow(&self, now: Timestamp) -> bool {
        match &self.entry {
            None => true,
            Some(e) => e.next_attempt.is_none_or(|next| now >= next),
        }
    }

    pub fn next_attempt(&self) -> Option<Timestamp> {
        self.entry.as_ref().and_then(|e| e.next_attempt)
    }

    pub fn failures(&self) -> u32 {
        self.entry.as_ref().map_or(0, |e| e.failures)
    }

    pub fn attempt_pending(&self) -> bool {
        self.entry.as_ref().is_some_and(|e| e.attempt_pending)
    }

    /// Charges one failure; from the policy's free attempts on, delays the
    /// next attempt along the ladder. Clears the stability streak, and
    /// consumes any unconfirmed attempt: that attempt is what failed, and
    /// one attempt is charged exactly once.
    pub fn record_failure(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        let entry = self.entry.get_or_insert_with(BudgetEntry::default);
        entry.failures = entry.failures.saturating_add(1);
        entry.stable_since = None;
        entry.attempt_pending = false;
        if let Some(delay) = policy.delay_after(entry.failures) {
            entry.next_attempt = Some(add(now, delay));
        }
    }

    /// The generation was found down (or unhealthy again) while an
    /// intervention was unconfirmed: that intervention failed. Charging it
    /// consumes the pending flag, so once the delay passes the next attempt
    /// really runs instead of the same attempt being charged every pass.
    pub fn charge_unconfirmed_attempt(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        self.record_failure(policy, now);
    }

    /// Records a start or restart awaiting confirmation. An intervention is
    /// not a stable observation, so it also breaks the stability streak
    /// (R14): only five stable minutes *after* it may confirm it.
    pub fn mark_attempt(&mut self) {
        let entry = self.entry.get_or_insert_with(BudgetEntry::default);
        entry.attempt_pending = true;
        entry.stable_since = None;
    }

    /// One more consecutive unhealthy observation; returns the streak.
    pub fn observe_unhealthy(&mut self) -> u32 {
        let entry = self.entry.get_or_insert_with(BudgetEntry::default);
        entry.unhealthy_streak = entry.unhealthy_streak.saturating_add(1);
        entry.unhealthy_streak
    }

    pub fn clear_unhealthy(&mut self) {
        if let Some(e) = &mut self.entry {
            e.unhealthy_streak = 0;
        }
    }

    /// A verified, stable observation: starts or continues the streak, and
    /// once it lasted the stable window drops the whole history. Never
    /// creates history.
    pub fn observe_stable(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        let Some(entry) = &mut self.entry else {
            return;
        };
        entry.unhealthy_streak = 0;
        match entry.stable_since {
            None => entry.stable_since = Some(now),
            Some(since) => {
                if add(since, policy.stable_window) <= now {
                    self.entry = None;
                }
            }
        }
    }

    /// Any outcome other than a stable observation breaks the streak
    /// without charging a failure.
    pub fn invalidate_stable(&mut self) {
        if let Some(e) = &mut self.entry {
            e.stable_since = None;
        }
    }

    pub fn forget(&mut self) {
        self.entry = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn three_free_failures_then_the_ladder() {
        let p = RecoveryPolicy::default();
        let mut b = Budget::default();
        for _ in 0..2 {
            b.record_failure(&p, at(0));
            assert!(b.allow(at(0)));
        }
        b.record_failure(&p, at(0));
        assert!(!b.allow(at(59)));
        assert!(b.allow(at(60)));
        b.record_failure(&p, at(60));
        assert_eq!(b.next_attempt(), Some(at(180)));
    }

    #[test]
    fn stable_never_creates_history() {
        let p = RecoveryPolicy::default();
        let mut b = Budget::default();
        b.observe_stable(&p, at(0));
        assert_eq!(b.clone().into_entry(), None);
    }

    #[test]
    fn five_stable_minutes_drop_history_and_failures_reset_the_streak() {
        let p = RecoveryPolicy::default();
        let mut b = Budget::default();
        b.record_failure(&p, at(0));
        b.observe_stable(&p, at(10));
        b.record_failure(&p, at(100));
        b.observe_stable(&p, at(110));
        b.observe_stable(&p, at(110 + 299));
        assert_eq!(b.failures(), 2);
        b.observe_stable(&p, at(110 + 300));
        assert_eq!(b.clone().into_entry(), None);
        assert!(Duration::from_secs(300) == p.stable_window);
    }
}
