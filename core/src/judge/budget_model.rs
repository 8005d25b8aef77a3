//! A reference model of the crash-loop budget, written from the text of
//! docs/rules.md R10, R12 and R14 alone: it never calls `core::budget`, so
//! the judge that uses it ([`super::recovery`]) and the test kit's
//! differential check (`stead_testkit::model`) hold the budget to the
//! rules' words, not to itself.

use std::time::Duration;

use super::super::budget::BudgetEntry;
use super::super::policy::RecoveryPolicy;
use super::super::types::Timestamp;

/// The history R10 keeps for a generation that has needed recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
struct History {
    /// Consecutive failures.
    failures: u32,
    /// "An attempt is allowed iff now >= next_attempt."
    next_attempt: Option<Timestamp>,
    /// Start of the continuously stable streak (R14).
    stable_since: Option<Timestamp>,
    /// A start or restart not yet confirmed.
    attempt_pending: bool,
    /// Consecutive unhealthy observations (R12).
    unhealthy_streak: u32,
}

/// The budget of one generation as docs/rules.md describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetModel {
    history: Option<History>,
}

/// `t + d`, saturating; the model's own arithmetic.
pub fn later(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

impl BudgetModel {
    /// The model of a remembered entry (what a recovery starts from).
    pub fn from_entry(entry: Option<&BudgetEntry>) -> Self {
        Self {
            history: entry.map(|e| History {
                failures: e.failures,
                next_attempt: e.next_attempt,
                stable_since: e.stable_since,
                attempt_pending: e.attempt_pending,
                unhealthy_streak: e.unhealthy_streak,
            }),
        }
    }

    /// The model as the engine's remembered entry, to compare whole.
    pub fn entry(&self) -> Option<BudgetEntry> {
        self.history.as_ref().map(|h| BudgetEntry {
            failures: h.failures,
            next_attempt: h.next_attempt,
            stable_since: h.stable_since,
            unhealthy_streak: h.unhealthy_streak,
            attempt_pending: h.attempt_pending,
        })
    }

    pub fn allow(&self, now: Timestamp) -> bool {
        match &self.history {
            None => true,
            Some(h) => h.next_attempt.is_none_or(|next| now >= next),
        }
    }

    pub fn next_attempt(&self) -> Option<Timestamp> {
        self.history.as_ref().and_then(|h| h.next_attempt)
    }

    pub fn failures(&self) -> u32 {
        self.history.as_ref().map_or(0, |h| h.failures)
    }

    pub fn attempt_pending(&self) -> bool {
        self.history.as_ref().is_some_and(|h| h.attempt_pending)
    }

    pub fn has_history(&self) -> bool {
        self.history.is_some()
    }

    fn history(&mut self) -> &mut History {
        self.history.get_or_insert(History {
            failures: 0,
            next_attempt: None,
            stable_since: None,
            attempt_pending: false,
            unhealthy_streak: 0,
        })
    }

    /// "Each failure increments failures and clears the stability streak;
    /// from the third consecutive failure on, next_attempt = now +
    /// delays[min(failures-3, 4)]" — with the policy's free attempts and
    /// ladder in place of 3 and the five default delays.
    pub fn failure(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        let h = self.history();
        h.failures = h.failures.saturating_add(1);
        h.stable_since = None;
        // The failure is that of the unconfirmed attempt, if any: one
        // attempt is charged exactly once.
        h.attempt_pending = false;
        if h.failures >= policy.free_attempts {
            let rung = (h.failures - policy.free_attempts) as usize;
            let delay = policy.delays[rung.min(policy.delays.len() - 1)];
            h.next_attempt = Some(later(now, delay));
        }
    }

    /// "Found down again while a previous intervention is still unconfirmed
    /// is a crash loop: charge a failure first" — the charge consumes the
    /// unconfirmed attempt.
    pub fn charge_unconfirmed(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        self.failure(policy, now);
        self.history().attempt_pending = false;
    }

    /// What the recovery machine does with a generation found down: charge
    /// an unconfirmed attempt if the budget would otherwise allow, then ask
    /// the budget again. Returns whether a start may run.
    pub fn found_down(&mut self, policy: &RecoveryPolicy, now: Timestamp) -> bool {
        if self.allow(now) && self.attempt_pending() {
            self.charge_unconfirmed(policy, now);
        }
        self.allow(now)
    }

    /// A start or restart ran and awaits confirmation. It is not a stable
    /// observation, so it invalidates the streak ("any other outcome").
    pub fn attempt(&mut self) {
        let h = self.history();
        h.attempt_pending = true;
        h.stable_since = None;
    }

    /// R12: "`unhealthy` → streak + 1"; the streak is the generation's
    /// history too. Returns the streak.
    pub fn unhealthy(&mut self) -> u32 {
        let h = self.history();
        h.unhealthy_streak = h.unhealthy_streak.saturating_add(1);
        h.unhealthy_streak
    }

    /// R12: `healthy`, a new execution, or a start or restart clears the
    /// streak.
    pub fn clear_unhealthy(&mut self) {
        if let Some(h) = &mut self.history {
            h.unhealthy_streak = 0;
        }
    }

    pub fn unhealthy_streak(&self) -> u32 {
        self.history.as_ref().map_or(0, |h| h.unhealthy_streak)
    }

    /// R14: "a stable observation starts or continues the streak and, once
    /// it has lasted the stable window, drops the generation's history ...
    /// A stable observation never creates history."
    pub fn stable(&mut self, policy: &RecoveryPolicy, now: Timestamp) {
        let Some(h) = &mut self.history else {
            return;
        };
        // A stable observation is not an unhealthy one: the consecutive
        // unhealthy streak is over.
        h.unhealthy_streak = 0;
        match h.stable_since {
            None => h.stable_since = Some(now),
            Some(since) if later(since, policy.stable_window) <= now => self.history = None,
            Some(_) => {}
        }
    }

    /// "Any other outcome invalidates the streak."
    pub fn unstable(&mut self) {
        if let Some(h) = &mut self.history {
            h.stable_since = None;
        }
    }

    /// "Forgetting the generation resets it."
    pub fn forget(&mut self) {
        self.history = None;
    }
}
