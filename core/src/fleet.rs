//! The fleet model shared by the control loop, the store and the workers:
//! instances, tasks, and the lifecycles they move through. Transitions are
//! checked here, in one place, and nowhere else.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::errors::ErrorKind;
use super::types::{InstanceName, Intent, Timestamp};

/// Lifecycle of an instance.
///
/// ```text
/// provisioning ──> ready ──> upgrading ──> ready
///      │             │            │
///      └──> failed <─┴────────────┘
/// any live state ──> deleting ──> deleted
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InstanceState {
    Provisioning,
    Ready,
    Upgrading,
    Deleting,
    Deleted,
    Failed,
}

impl InstanceState {
    pub const ALL: [InstanceState; 6] = [
        Self::Provisioning,
        Self::Ready,
        Self::Upgrading,
        Self::Deleting,
        Self::Deleted,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
            Self::Upgrading => "upgrading",
            Self::Deleting => "deleting",
            Self::Deleted => "deleted",
            Self::Failed => "failed",
        }
    }

    pub fn parse(word: &str) -> Result<Self, UnknownWord> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| UnknownWord::new("instance state", word))
    }

    /// Whether the lifecycle allows `self → to`. Staying put is allowed.
    pub fn can_become(self, to: InstanceState) -> bool {
        use InstanceState::*;
        if self == to {
            return true;
        }
        match (self, to) {
            (Deleted, _) => false,
            (_, Deleting) => true,
            (Deleting, Deleted) => true,
            (Deleting, _) => false,
            (Provisioning, Ready | Failed) => true,
            (Ready, Upgrading | Provisioning | Failed) => true,
            (Upgrading, Ready | Failed) => true,
            (Failed, Provisioning | Upgrading | Ready) => true,
            _ => false,
        }
    }
}

impl InstanceState {
    /// The checked step `self → to`: every state change of an instance goes
    /// through here (or [`InstanceState::can_become`]), so the lifecycle has
    /// one home.
    pub(crate) fn transition_to(
        self,
        to: InstanceState,
    ) -> Result<InstanceState, IllegalTransition> {
        if self.can_become(to) {
            Ok(to)
        } else {
            Err(IllegalTransition {
                lifecycle: "instance",
                from: self.as_str(),
                to: to.as_str(),
            })
        }
    }
}

/// What a finished protocol (a provision ends `ready`, a deprovision
/// `deleted`) does to its instance, read again just before: nothing when it
/// is there already (a retried handler is idempotent), a compare-and-set
/// from the state read when the lifecycle allows the step, else an error.
pub fn settle_state(
    current: InstanceState,
    to: InstanceState,
) -> Result<Option<InstanceState>, IllegalTransition> {
    if current == to {
        return Ok(None);
    }
    current.transition_to(to).map(|_| Some(current))
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a task asks a worker to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskKind {
    Provision,
    Reprovision,
    Upgrade,
    Deprovision,
}

impl TaskKind {
    pub const ALL: [TaskKind; 4] = [
        Self::Provision,
        Self::Reprovision,
        Self::Upgrade,
        Self::Deprovision,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provision => "provision",
            Self::Reprovision => "reprovision",
            Self::Upgrade => "upgrade",
            Self::Deprovision => "deprovision",
        }
    }

    pub fn parse(word: &str) -> Result<Self, UnknownWord> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| UnknownWord::new("task kind", word))
    }

    /// T4: whether a task of this kind still has work to do on an instance
    /// in `state`, as a handler finds it under the instance lock. Deleted
    /// stays deleted: a provision, reprovision or upgrade that was queued,
    /// parked behind a window or running when the instance went to
    /// `deleting` does nothing, so no container or ACTIVE row comes back. A
    /// deprovision has nothing left once the instance is `deleted`.
    pub fn applies_to(self, state: InstanceState) -> bool {
        match self {
            Self::Deprovision => state != InstanceState::Deleted,
            Self::Provision | Self::Reprovision | Self::Upgrade => {
                !matches!(state, InstanceState::Deleting | InstanceState::Deleted)
            }
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle of a task: `queued → running → done | failed`, and
/// `running → queued` on retry or lease expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskState {
    Queued,
    Running,
    Done,
    Failed,
}

impl TaskState {
    pub const ALL: [TaskState; 4] = [Self::Queued, Self::Running, Self::Done, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    pub fn parse(word: &str) -> Result<Self, UnknownWord> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| UnknownWord::new("task state", word))
    }

    /// Queued or running: the task still holds its (instance, kind) slot.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    pub fn can_become(self, to: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, to),
            (Queued, Running) | (Running, Queued) | (Running, Done) | (Running, Failed)
        )
    }
}

impl TaskState {
    /// The checked step `self → to` of a task.
    pub fn transition_to(self, to: TaskState) -> Result<TaskState, IllegalTransition> {
        if self.can_become(to) {
            Ok(to)
        } else {
            Err(IllegalTransition {
                lifecycle: "task",
                from: self.as_str(),
                to: to.as_str(),
            })
        }
    }
}

/// A state change the lifecycle forbids (a bug, or a row another tool
/// moved under us); the caller reports it and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{lifecycle} cannot go from {from} to {to}")]
pub struct IllegalTransition {
    pub lifecycle: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word read from outside (a row, a file) that names no known variant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {field} {value:?}")]
pub struct UnknownWord {
    pub field: &'static str,
    pub value: String,
}

impl UnknownWord {
    pub(crate) fn new(field: &'static str, value: &str) -> Self {
        Self {
            field,
            value: value.chars().take(64).collect(),
        }
    }
}

/// Database identity of an instance.
pub type InstanceId = i64;
/// Database identity of a task.
pub type TaskId = i64;

/// One tenant's deployment as the database records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: InstanceId,
    /// Unique; also the release name.
    pub name: InstanceName,
    pub team: String,
    pub service_type: String,
    pub version: String,
    pub state: InstanceState,
    /// Operator intent: `true` means keep every container stopped.
    pub stopped: bool,
    pub expires_at: Option<Timestamp>,
    /// Raw window spec; parsed (and possibly rejected) by the planner.
    pub maintenance_window: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Values given at `instance create --set key=value`, for the
    /// catalog's `{param.key}` templates.
    pub parameters: BTreeMap<String, String>,
    /// Public host names its creator gave at create (#54), each within the
    /// team's `domain_suffixes`; served by the type's service that takes
    /// them (`tenant_domains`). Empty for most instances.
    pub domains: Vec<String>,
    /// `instance delete --purge-volumes` asked for its named volumes to go
    /// with it.
    pub purge_volumes: bool,
    /// The digest of the catalog spec it was last provisioned or upgraded
    /// to (`CatalogEntry::spec_digest`); `None` for rows from before stead
    /// recorded it, which count as current until the next version.
    pub spec_digest: Option<String>,
}

impl Instance {
    /// What recovery keeps this instance at. An instance being deleted is
    /// kept withdrawn and stopped, like stopped intent, while its
    /// deprovision runs: reviving (or republishing) what is being torn down
    /// would undo the deprovision's withdrawal whenever one of its steps
    /// failed and is retried.
    pub fn intent(&self) -> Intent {
        if self.stopped || self.state == InstanceState::Deleting {
            Intent::Stopped
        } else {
            Intent::Running
        }
    }
}

/// One instance as a whole recovery pass lists it: what the pass plans
/// by (which instances to drive, which to forget, whose routes are gone,
/// which Kubernetes recovers). The rest of the row is read under the
/// instance's lock, so a fleet's listing stays a few words per instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedInstance {
    pub id: InstanceId,
    pub name: InstanceName,
    pub service_type: String,
    pub state: InstanceState,
}

impl From<&Instance> for ListedInstance {
    fn from(instance: &Instance) -> Self {
        Self {
            id: instance.id,
            name: instance.name.clone(),
            service_type: instance.service_type.clone(),
            state: instance.state,
        }
    }
}

/// One row of the durable task queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: TaskId,
    pub kind: TaskKind,
    pub instance: InstanceId,
    pub state: TaskState,
    pub run_after: Timestamp,
    pub locked_by: Option<String>,
    pub locked_at: Option<Timestamp>,
    pub attempts: u32,
    pub reason: String,
    pub last_error: Option<String>,
    /// W3C trace context of the tick (or request) that enqueued it.
    pub traceparent: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Task {
    /// T4: deleting an instance (by an operator or its TTL) cancels its
    /// queued tasks in the same transaction as the state change, so nothing
    /// queued for it runs after the deletion was decided. The deprovision
    /// itself is kept, and a running task is its worker's to finish (its
    /// handler re-reads the instance under the instance lock).
    pub fn cancelled_by_deletion(&self) -> bool {
        self.state == TaskState::Queued && self.kind != TaskKind::Deprovision
    }
}

/// What a cancelled task records as its `last_error`. There is no
/// `cancelled` state: a cancelled task is `failed` with this error, which
/// needs no schema change and frees its (instance, kind) slot like any
/// finished task.
pub const CANCELLED_BY_DELETION: &str = "cancelled: the instance is being deleted";

/// Every cancelled task's `last_error` starts with this; what follows says
/// why (an operator, a halted rollout, a deletion).
pub const CANCELLED: &str = "cancelled: ";

/// What a task cancelled by `stead task cancel` records.
pub const CANCELLED_BY_OPERATOR: &str = "cancelled: by an operator (stead task cancel)";

/// What a queued upgrade cancelled by its type's halted rollout records.
pub const CANCELLED_BY_HALT: &str = "cancelled: the rollout of its service type was halted";

/// A task to be inserted; the store assigns id, state and timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewTask {
    pub kind: TaskKind,
    pub instance: InstanceId,
    pub run_after: Timestamp,
    pub reason: String,
    pub traceparent: Option<String>,
}

/// A live release as the provisioner sees it (what drift compares the
/// database against).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub name: String,
    pub namespace: String,
}

/// Rollout switch per catalog service type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RolloutState {
    Active,
    Halted,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Halted => "halted",
        }
    }

    pub fn parse(word: &str) -> Result<Self, UnknownWord> {
        match word {
            "active" => Ok(Self::Active),
            "halted" => Ok(Self::Halted),
            _ => Err(UnknownWord::new("rollout state", word)),
        }
    }
}

/// Bounded retry with exponential backoff for failed task handlers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskRetryPolicy {
    /// Attempts before a task is failed for good.
    pub attempts_max: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for TaskRetryPolicy {
    fn default() -> Self {
        Self {
            attempts_max: 5,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(600),
        }
    }
}

/// What a worker does with a task whose handler failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Requeue with `run_after`.
    RetryAt(Timestamp),
    /// Out of attempts, or the failure is permanent.
    Fail,
}

impl TaskRetryPolicy {
    /// `attempts` counts the attempt that just failed (1 after the first).
    pub(crate) fn after_failure(&self, attempts: u32, now: Timestamp) -> RetryDecision {
        if attempts >= self.attempts_max {
            return RetryDecision::Fail;
        }
        let shift = attempts.saturating_sub(1).min(20);
        let delay = self
            .backoff_base
            .saturating_mul(1u32 << shift)
            .min(self.backoff_max);
        RetryDecision::RetryAt(add(now, delay))
    }

    /// As [`Self::after_failure`], deciding by the failure's kind first: a
    /// permanent one ([`ErrorKind::is_permanent`]: an image that cannot be
    /// pulled, a refused request) fails the task on this attempt, since
    /// every retry would fail alike.
    pub fn after_error(&self, attempts: u32, kind: ErrorKind, now: Timestamp) -> RetryDecision {
        if kind.is_permanent() {
            return RetryDecision::Fail;
        }
        self.after_failure(attempts, now)
    }
}

/// `ts + d`, saturating at the end of representable time instead of
/// panicking (inputs may come from outside).
pub fn add(ts: Timestamp, d: Duration) -> Timestamp {
    let signed = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    ts.checked_add(signed).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protocol_settles_its_instance_once_and_only_along_the_lifecycle() {
        use InstanceState::*;
        assert_eq!(settle_state(Provisioning, Ready), Ok(Some(Provisioning)));
        assert_eq!(
            settle_state(Ready, Ready),
            Ok(None),
            "a retry is idempotent"
        );
        assert_eq!(settle_state(Deleting, Deleted), Ok(Some(Deleting)));
        assert_eq!(settle_state(Deleted, Deleted), Ok(None));
        let refused = settle_state(Deleting, Ready).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "instance cannot go from deleting to ready"
        );
        assert!(settle_state(Deleted, Ready).is_err());
    }

    #[test]
    fn deleted_is_terminal() {
        for to in InstanceState::ALL {
            if to != InstanceState::Deleted {
                assert!(!InstanceState::Deleted.can_become(to), "deleted -> {to}");
            }
        }
    }

    #[test]
    fn every_word_round_trips() {
        for s in InstanceState::ALL {
            assert_eq!(InstanceState::parse(s.as_str()), Ok(s));
        }
        for k in TaskKind::ALL {
            assert_eq!(TaskKind::parse(k.as_str()), Ok(k));
        }
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Ok(s));
        }
        let err = TaskKind::parse("explode").unwrap_err();
        assert_eq!(err.to_string(), "unknown task kind \"explode\"");
    }

    #[test]
    fn illegal_transitions_are_named() {
        assert_eq!(
            TaskState::Done
                .transition_to(TaskState::Queued)
                .unwrap_err()
                .to_string(),
            "task cannot go from done to queued"
        );
        assert_eq!(
            InstanceState::Ready.transition_to(InstanceState::Deleting),
            Ok(InstanceState::Deleting)
        );
        assert!(InstanceState::Deleting
            .transition_to(InstanceState::Ready)
            .is_err());
        assert_eq!(
            TaskState::Running.transition_to(TaskState::Queued),
            Ok(TaskState::Queued)
        );
    }

    #[test]
    fn retry_backs_off_then_fails() {
        let policy = TaskRetryPolicy::default();
        let now = Timestamp::UNIX_EPOCH;
        assert_eq!(
            policy.after_failure(1, now),
            RetryDecision::RetryAt(add(now, Duration::from_secs(10)))
        );
        assert_eq!(
            policy.after_failure(3, now),
            RetryDecision::RetryAt(add(now, Duration::from_secs(40)))
        );
        assert_eq!(policy.after_failure(5, now), RetryDecision::Fail);
    }

    #[test]
    fn a_permanent_failure_fails_on_its_first_attempt_and_a_transient_one_backs_off() {
        let policy = TaskRetryPolicy::default();
        let now = Timestamp::UNIX_EPOCH;
        for kind in ErrorKind::ALL {
            let decision = policy.after_error(1, kind, now);
            if kind.is_permanent() {
                assert_eq!(decision, RetryDecision::Fail, "{kind}");
            } else {
                assert_eq!(
                    decision,
                    RetryDecision::RetryAt(add(now, Duration::from_secs(10))),
                    "{kind}"
                );
            }
        }
        assert_eq!(
            policy.after_error(5, ErrorKind::Unavailable, now),
            RetryDecision::Fail,
            "out of attempts"
        );
    }
}
