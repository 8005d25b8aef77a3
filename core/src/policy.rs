//! `RecoveryPolicy`: every tunable of the recovery pass, validated once.

use super::broken::Armed;
use std::time::Duration;

/// Most delays the ladder may hold; keeps the budget's arithmetic bounded.
pub(crate) const DELAYS_COUNT_MAX: usize = 16;
/// Longest delay the ladder may hold.
pub(crate) const DELAY_MAX: Duration = Duration::from_secs(24 * 3600);
/// Most consecutive unhealthy observations a threshold may ask for.
pub(crate) const UNHEALTHY_THRESHOLD_MAX: u32 = 100;
/// Most free (undelayed) attempts a policy may grant.
pub(crate) const FREE_ATTEMPTS_MAX: u32 = 100;

/// The part of the reconciler lease a holder never trusts (T2): a grant of
/// `ttl` is acted on for `ttl - LEASE_MARGIN` from the moment it was asked
/// for, which covers clock-rate drift and the gap between checking the
/// lease and the effect it guards.
pub const LEASE_MARGIN: Duration = Duration::from_secs(10);
/// What one instance's recovery may need beyond its deadline (releasing its
/// lock, reporting) under the lease it started with.
pub const INSTANCE_LEASE_SLACK: Duration = Duration::from_secs(5);

/// How much longer than its task lease a worker's instance lock lasts, so
/// the lock never lapses under a live handler (which the lease bounds).
pub const WORKER_LOCK_SLACK: Duration = Duration::from_secs(5);

/// How long the reconciler lease must still hold for a tick's planners to
/// write.
pub const PLANNERS_LEASE_NEED: Duration = Duration::from_secs(30);

/// The part of a lease or lock of length `ttl` its holder never trusts: a
/// quarter of it, at most [`LEASE_MARGIN`], so even the shortest leaves
/// room to work between renewals (every third of it).
pub fn trust_margin(ttl: Duration) -> Duration {
    (ttl / 4).min(LEASE_MARGIN)
}

/// The reconciler lease's length (C2, T2): it outlives a tick by a wide
/// margin, so a live leader keeps it, and it lasts two instance recoveries
/// beyond its margin, so the pass renews it at most once per instance's
/// worth of work and never starts an instance it could not finish under
/// How many instances a pass recovers at once by default: enough that a
/// slow runtime's latency overlaps (32 calls in flight), few enough that a
/// batch's locks are held briefly.
pub(crate) const INSTANCES_AT_ONCE_DEFAULT: usize = 32;
/// Bound on [`RecoveryPolicy::instances_at_once`].
pub const INSTANCES_AT_ONCE_MAX: usize = 1024;

/// the lease.
pub fn reconciler_lease_ttl(tick_interval: Duration, instance_deadline: Duration) -> Duration {
    let ticks = tick_interval * 3 + Duration::from_secs(30);
    let instances = (instance_deadline + INSTANCE_LEASE_SLACK) * 2 + LEASE_MARGIN;
    ticks.max(instances)
}

/// The tunables of the recovery pass (R10, R12, R14, R2, R4). Construct with
/// [`RecoveryPolicy::default`] or validate a hand-built one with
/// [`RecoveryPolicy::validated`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryPolicy {
    /// Consecutive failures that are real attempts before delays begin (3).
    pub free_attempts: u32,
    /// Delays after the free attempts: 1, 2, 4, 8, 15 minutes; the last one
    /// repeats.
    pub delays: Vec<Duration>,
    /// How long a generation must stay continuously stable before its
    /// history is dropped (5 minutes).
    pub stable_window: Duration,
    /// Consecutive unhealthy observations before a restart (2).
    pub unhealthy_threshold: u32,
    /// Bound on one instance's whole recovery (2 minutes).
    pub instance_deadline: Duration,
    /// How many instances a pass recovers at once (32): their locks and
    /// rows are read in one round trip each, and their passes run
    /// concurrently, each under its own deadline.
    pub instances_at_once: usize,
    /// Stop grace when neither the service nor a marker records one.
    pub stop_grace_default: Duration,
    /// A rule deliberately broken, armed as data by the mutation exercise
    /// (`testkit/src/mutants.rs`, `docs/simulation.md`); always `None` in a real
    /// policy. The core reads it here and from no global state.
    /// Never recorded: a replay runs the rules unbroken.
    #[serde(skip)]
    pub broken: Armed,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        Self {
            free_attempts: 3,
            delays: vec![minutes(1), minutes(2), minutes(4), minutes(8), minutes(15)],
            stable_window: minutes(5),
            unhealthy_threshold: 2,
            instance_deadline: minutes(2),
            instances_at_once: INSTANCES_AT_ONCE_DEFAULT,
            stop_grace_default: Duration::from_secs(10),
            broken: Armed::default(),
        }
    }
}

/// A policy value out of bounds; names the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("recovery policy: {field} = {value}: {reason}")]
pub struct PolicyError {
    pub field: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl RecoveryPolicy {
    /// Checks every bound; the error names the first offending field.
    pub fn validated(self) -> Result<Self, PolicyError> {
        let fail = |field, value: String, reason| {
            Err(PolicyError {
                field,
                value,
                reason,
            })
        };
        if self.free_attempts == 0 || self.free_attempts > FREE_ATTEMPTS_MAX {
            return fail(
                "free_attempts",
                self.free_attempts.to_string(),
                "must be between 1 and 100",
            );
        }
        if self.delays.is_empty() || self.delays.len() > DELAYS_COUNT_MAX {
            return fail(
                "delays",
                format!("{:?}", self.delays),
                "must hold between 1 and 16 delays",
            );
        }
        for (i, pair) in self.delays.windows(2).enumerate() {
            if pair[1] < pair[0] {
                return fail(
                    "delays",
                    format!("{:?} at index {}", pair[1], i + 1),
                    "must not decrease",
                );
            }
        }
        if self.delays[0].is_zero() || *self.delays.last().expect("non-empty") > DELAY_MAX {
            return fail(
                "delays",
                format!("{:?}", self.delays),
                "each delay must be positive and at most 24h",
            );
        }
        if self.stable_window.is_zero() || self.stable_window > DELAY_MAX {
            return fail(
                "stable_window",
                format!("{:?}", self.stable_window),
                "must be positive and at most 24h",
            );
        }
        if self.unhealthy_threshold == 0 || self.unhealthy_threshold > UNHEALTHY_THRESHOLD_MAX {
            return fail(
                "unhealthy_threshold",
                self.unhealthy_threshold.to_string(),
                "must be between 1 and 100",
            );
        }
        if self.instance_deadline.is_zero() || self.instance_deadline > DELAY_MAX {
            return fail(
                "instance_deadline",
                format!("{:?}", self.instance_deadline),
                "must be positive and at most 24h",
            );
        }
        if self.instances_at_once == 0 || self.instances_at_once > INSTANCES_AT_ONCE_MAX {
            return fail(
                "instances_at_once",
                self.instances_at_once.to_string(),
                "must be between 1 and 1024",
            );
        }
        if self.stop_grace_default > Duration::from_secs(3600) {
            return fail(
                "stop_grace_default",
                format!("{:?}", self.stop_grace_default),
                "must be at most 1h",
            );
        }
        Ok(self)
    }

    /// The delay charged by the `failures`-th consecutive failure, if any.
    pub fn delay_after(&self, failures: u32) -> Option<Duration> {
        if failures < self.free_attempts {
            return None;
        }
        let index = ((failures - self.free_attempts) as usize).min(self.delays.len() - 1);
        Some(self.delays[index])
    }
}

/// How long past its own `--timeout` a helm process may run before it is
/// killed, by default (`helm.kill_margin_s`): helm reports a timed-out
/// wait, and `--atomic` rolls back, in this margin.
pub const HELM_KILL_MARGIN: Duration = Duration::from_secs(30);

/// How much longer than a helm call's bound a task lease must be: the
/// worker still records the outcome and moves the instance after helm
/// returns, under the same lease.
pub const TASK_LEASE_SAFETY_MARGIN: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_follow_the_ladder() {
        let p = RecoveryPolicy::default().validated().unwrap();
        let minutes: Vec<Option<u64>> = (1..=9)
            .map(|f| p.delay_after(f).map(|d| d.as_secs() / 60))
            .collect();
        assert_eq!(
            minutes,
            [
                None,
                None,
                Some(1),
                Some(2),
                Some(4),
                Some(8),
                Some(15),
                Some(15),
                Some(15)
            ]
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        let check = |p: RecoveryPolicy, field: &str| {
            let err = p.validated().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().contains(field));
        };
        check(
            RecoveryPolicy {
                free_attempts: 0,
                ..Default::default()
            },
            "free_attempts",
        );
        check(
            RecoveryPolicy {
                delays: vec![],
                ..Default::default()
            },
            "delays",
        );
        check(
            RecoveryPolicy {
                delays: vec![Duration::from_secs(60), Duration::from_secs(30)],
                ..Default::default()
            },
            "delays",
        );
        check(
            RecoveryPolicy {
                unhealthy_threshold: 0,
                ..Default::default()
            },
            "unhealthy_threshold",
        );
        check(
            RecoveryPolicy {
                stable_window: Duration::ZERO,
                ..Default::default()
            },
            "stable_window",
        );
        check(
            RecoveryPolicy {
                instance_deadline: Duration::ZERO,
                ..Default::default()
            },
            "instance_deadline",
        );
    }
}
