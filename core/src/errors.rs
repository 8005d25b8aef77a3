//! What each port's failures are, as types.
//!
//! Every port says what kind of failure it met, not only a message: the
//! core decides on the kind (a container confirmed gone is not a timeout),
//! the engine wraps it naming the instance and service, metrics count it by
//! [`ErrorKind`], and operator commands turn it into an exit code. The
//! message stays for the operator: it names what was asked and what came
//! back.
//!
//! The runtime's error, [`RuntimeError`], lives with the observations it
//! answers (`core::types`); the others are here, since the core's outcomes
//! carry them.

use std::fmt;

use super::fleet::IllegalTransition;
use super::release::TemplateError;
use super::types::RuntimeError;

/// What a failure lets the caller conclude, across every port. A port uses
/// only the kinds it can really tell apart.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum ErrorKind {
    /// The thing asked about is confirmed not to exist.
    NotFound,
    /// Another change got there first (a uniqueness or compare-and-set
    /// precondition, an operation already in progress).
    Conflict,
    /// Refused for what was asked: bad input, a container or row that is
    /// not stead's, a grant withdrawn. Retrying the same thing fails again.
    Refused,
    /// A fault that changes nothing and may pass: a timeout, a 500.
    Transient,
    /// The service behind the port could not be reached at all.
    Unavailable,
    /// The writer's reconciler lease (T2) or instance lock (T3) is no
    /// longer its own.
    Fenced,
    /// A row written by something else does not parse.
    BadRow,
    /// Answered, but not ready (a readiness probe's verdict).
    NotReady,
    /// The command it ran failed (a Helm release that did not install).
    Failed,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Refused,
        ErrorKind::Transient,
        ErrorKind::Unavailable,
        ErrorKind::Fenced,
        ErrorKind::BadRow,
        ErrorKind::NotReady,
        ErrorKind::Failed,
    ];

    /// The metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::Refused => "refused",
            Self::Transient => "transient",
            Self::Unavailable => "unavailable",
            Self::Fenced => "fenced",
            Self::BadRow => "bad_row",
            Self::NotReady => "not_ready",
            Self::Failed => "failed",
        }
    }

    /// Whether a task that failed with this kind fails for good at once:
    /// doing the same thing again is certain to fail again, so retries
    /// would only delay the verdict (and, for an upgrade, the halt of its
    /// rollout, C8). Every other kind may pass, or is a race the retry
    /// re-reads the world for, and is retried with backoff.
    ///
    /// `NotFound` is not permanent: what a task finds gone was removed by
    /// something else (an operator, a concurrent delete), and a retried
    /// machine plans around what is left. `Conflict` and `Fenced` are
    /// another writer's move; `NotReady` a successor that may yet start.
    pub fn is_permanent(self) -> bool {
        match self {
            Self::Refused | Self::BadRow | Self::Failed => true,
            Self::NotFound
            | Self::Conflict
            | Self::Transient
            | Self::Unavailable
            | Self::Fenced
            | Self::NotReady => false,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which port a failure came through: the other metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortName {
    Runtime,
    Traffic,
    Store,
    Probe,
    Policy,
    Provisioner,
    Notifier,
}

impl PortName {
    pub const ALL: [PortName; 7] = [
        PortName::Runtime,
        PortName::Traffic,
        PortName::Store,
        PortName::Probe,
        PortName::Policy,
        PortName::Provisioner,
        PortName::Notifier,
    ];

    /// The kinds of failure this port can report.
    pub fn kinds(self) -> &'static [ErrorKind] {
        use ErrorKind::*;
        match self {
            Self::Runtime => &[NotFound, Conflict, Refused, Transient],
            Self::Traffic => &[Unavailable, Refused],
            Self::Store => &[Unavailable, BadRow, Conflict, Fenced, NotFound],
            Self::Probe => &[Unavailable, NotReady, Refused],
            Self::Policy => &[Refused, Unavailable],
            Self::Provisioner => &[NotFound, Refused, Failed, Unavailable],
            Self::Notifier => &[Unavailable],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runtime => "runtime",
            Self::Traffic => "traffic",
            Self::Store => "store",
            Self::Probe => "probe",
            Self::Policy => "policy",
            Self::Provisioner => "provisioner",
            Self::Notifier => "notifier",
        }
    }
}

/// A typed port failure: its port and kind, for metrics and exit codes.
pub trait PortFailure: std::error::Error {
    const PORT: PortName;
    fn kind(&self) -> ErrorKind;

    /// The port and kind together, as metrics label a failure.
    fn failure(&self) -> (PortName, ErrorKind)
    where
        Self: Sized,
    {
        (Self::PORT, self.kind())
    }
}

/// The port and kind of the failure `result` carries, if it failed.
pub(crate) fn failure_of<T, E: PortFailure>(
    result: &Result<T, E>,
) -> Option<(PortName, ErrorKind)> {
    result.as_ref().err().map(PortFailure::failure)
}

impl PortFailure for RuntimeError {
    const PORT: PortName = PortName::Runtime;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound => ErrorKind::NotFound,
            Self::Conflict(_) => ErrorKind::Conflict,
            Self::Refused(_) => ErrorKind::Refused,
            Self::Transient(_) => ErrorKind::Transient,
        }
    }
}

/// Why a store operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum StoreError {
    /// The database is unreachable or the statement failed; retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A row written by another tool does not parse. Names table, row, field
    /// and value so an operator can fix it.
    #[error("bad row in {table} (id {id}): {field} = {value:?}")]
    BadRow {
        table: &'static str,
        id: String,
        field: &'static str,
        value: String,
    },
    /// A compare-and-set or uniqueness precondition did not hold.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The writer's reconciler lease is no longer current.
    #[error("fenced: reconciler lease epoch {epoch} is no longer current")]
    Fenced { epoch: i64 },
    /// The writer's instance lock is no longer its own (T3): it expired,
    /// and maybe another process holds it now. Nothing was written.
    #[error(
        "fenced: the lock of instance {instance} is no longer held by {holder} \
         (expired or taken over); nothing was written"
    )]
    LockLost {
        instance: crate::fleet::InstanceId,
        holder: String,
    },
    #[error("not found: {0}")]
    NotFound(String),
}

impl PortFailure for StoreError {
    const PORT: PortName = PortName::Store;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Unavailable(_) => ErrorKind::Unavailable,
            Self::BadRow { .. } => ErrorKind::BadRow,
            Self::Conflict(_) => ErrorKind::Conflict,
            Self::Fenced { .. } | Self::LockLost { .. } => ErrorKind::Fenced,
            Self::NotFound(_) => ErrorKind::NotFound,
        }
    }
}

/// A failure of the traffic plane.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum TrafficError {
    /// The proxy did not answer (down, restarting, timed out).
    #[error("traffic: {0}")]
    Unreachable(String),
    /// The proxy answered and refused what was asked, or what stead was
    /// asked to route cannot be routed (no binds, a bad address).
    #[error("traffic: {0}")]
    Rejected(String),
}

impl PortFailure for TrafficError {
    const PORT: PortName = PortName::Traffic;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Unreachable(_) => ErrorKind::Unavailable,
            Self::Rejected(_) => ErrorKind::Refused,
        }
    }
}

/// A failure of the release provisioner (Helm).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProvisionError {
    /// The release does not exist.
    #[error("provisioner: {0}")]
    NotFound(String),
    /// Refused before running anything: a name or value it cannot pass on.
    #[error("provisioner: {0}")]
    Refused(String),
    /// The provisioner ran and failed (a non-zero exit, with its message).
    #[error("provisioner: {0}")]
    Failed(String),
    /// The provisioner could not be run or did not finish in time.
    #[error("provisioner: {0}")]
    Unavailable(String),
}

impl PortFailure for ProvisionError {
    const PORT: PortName = PortName::Provisioner;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Refused(_) => ErrorKind::Refused,
            Self::Failed(_) => ErrorKind::Failed,
            Self::Unavailable(_) => ErrorKind::Unavailable,
        }
    }
}

/// Why a readiness probe did not pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProbeError {
    /// Nothing answered on the backend (refused, timed out).
    #[error("{0}")]
    Unreachable(String),
    /// Something answered, but not ready (an HTTP status outside 2xx).
    #[error("{0}")]
    NotReady(String),
    /// The probe cannot be run as configured (no bind for its port, a bad
    /// path): failing again is certain until the catalog changes.
    #[error("{0}")]
    Misconfigured(String),
}

impl PortFailure for ProbeError {
    const PORT: PortName = PortName::Probe;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Unreachable(_) => ErrorKind::Unavailable,
            Self::NotReady(_) => ErrorKind::NotReady,
            Self::Misconfigured(_) => ErrorKind::Refused,
        }
    }
}

/// Why a grant check did not pass (R11).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PolicyError {
    /// The service is no longer granted (gone from the catalog).
    #[error("{0}")]
    Revoked(String),
    /// The grants could not be read; nothing is granted meanwhile.
    #[error("{0}")]
    Unavailable(String),
}

impl PortFailure for PolicyError {
    const PORT: PortName = PortName::Policy;
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Revoked(_) => ErrorKind::Refused,
            Self::Unavailable(_) => ErrorKind::Unavailable,
        }
    }
}

/// A notification that could not be delivered (never fatal).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("notifier: {0}")]
pub struct NotifyError(pub String);

impl PortFailure for NotifyError {
    const PORT: PortName = PortName::Notifier;
    fn kind(&self) -> ErrorKind {
        ErrorKind::Unavailable
    }
}

/// What made a task's step fail: a port's failure, kept typed, or a
/// verdict stead reached on what the ports answered, of the kind it names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Cause {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// A template of the catalog entry does not render: the same entry
    /// never will.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The instance is in a state the task cannot settle it from.
    #[error(transparent)]
    Transition(#[from] IllegalTransition),
    /// stead's own verdict (a successor that exited, a catalog behind the
    /// instance's version, a lease no longer trusted).
    #[error("{message}")]
    Verdict { kind: ErrorKind, message: String },
}

impl Cause {
    pub fn verdict(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Verdict {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Runtime(e) => e.kind(),
            Self::Store(e) => e.kind(),
            Self::Traffic(e) => e.kind(),
            Self::Provision(e) => e.kind(),
            Self::Probe(e) => e.kind(),
            Self::Template(_) => ErrorKind::Refused,
            Self::Transition(_) => ErrorKind::Conflict,
            Self::Verdict { kind, .. } => *kind,
        }
    }

    /// The port the failure came through; `None` for stead's own verdicts.
    pub fn port(&self) -> Option<PortName> {
        match self {
            Self::Runtime(_) => Some(RuntimeError::PORT),
            Self::Store(_) => Some(StoreError::PORT),
            Self::Traffic(_) => Some(TrafficError::PORT),
            Self::Provision(_) => Some(ProvisionError::PORT),
            Self::Probe(_) => Some(ProbeError::PORT),
            Self::Template(_) | Self::Transition(_) | Self::Verdict { .. } => None,
        }
    }
}

/// Why a task failed, with its subject: the instance and the step that
/// failed ("create web", "load ACTIVE"), the port through
/// [`TaskError::port`], and the typed cause kept as its source. The
/// worker decides on [`TaskError::kind`]: a permanent one fails the task
/// at once (`TaskRetryPolicy::after_error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{instance}: {step}: {cause}")]
pub struct TaskError {
    /// The instance's name, or `instance {id}` before its row was read.
    pub instance: String,
    /// What the task was doing, naming the service when there is one.
    pub step: String,
    /// Boxed: the port errors are large, and a task error is returned
    /// through every layer.
    #[source]
    pub cause: Box<Cause>,
}

impl TaskError {
    pub fn new(
        instance: impl fmt::Display,
        step: impl Into<String>,
        cause: impl Into<Cause>,
    ) -> Self {
        Self {
            instance: instance.to_string(),
            step: step.into(),
            cause: Box::new(cause.into()),
        }
    }

    /// A task's machine told to stop ([`super::machine::Abandon`]).
    pub fn abandoned(instance: impl fmt::Display, why: super::machine::Abandon) -> Self {
        match why {
            super::machine::Abandon::MandateLost => Self::new(
                instance,
                "act under the task lease",
                Cause::verdict(
                    ErrorKind::Fenced,
                    "the task lease is no longer trusted; stopping before acting",
                ),
            ),
            super::machine::Abandon::Deadline => Self::new(
                instance,
                "finish within its deadline",
                Cause::verdict(ErrorKind::Transient, why.describe()),
            ),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.cause.kind()
    }

    pub fn port(&self) -> Option<PortName> {
        self.cause.port()
    }

    pub fn is_permanent(&self) -> bool {
        self.kind().is_permanent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_bad_row_and_failed_are_the_only_permanent_kinds() {
        let permanent: Vec<ErrorKind> = ErrorKind::ALL
            .into_iter()
            .filter(|kind| kind.is_permanent())
            .collect();
        assert_eq!(
            permanent,
            [ErrorKind::Refused, ErrorKind::BadRow, ErrorKind::Failed]
        );
    }

    #[test]
    fn a_task_error_names_its_instance_step_and_port_and_keeps_its_cause() {
        let error = TaskError::new(
            "a1",
            "create web",
            RuntimeError::Refused("image \"x:9\" cannot be pulled".into()),
        );
        assert_eq!(
            error.to_string(),
            "a1: create web: runtime refused: image \"x:9\" cannot be pulled"
        );
        assert_eq!(error.kind(), ErrorKind::Refused);
        assert_eq!(error.port(), Some(PortName::Runtime));
        assert!(error.is_permanent());
        let source = std::error::Error::source(&error).expect("a source");
        assert_eq!(source.to_string(), error.cause.to_string());
    }

    #[test]
    fn a_verdict_has_the_kind_it_names_and_no_port() {
        let error = TaskError::new(
            "a1",
            "verify the successor of web",
            Cause::verdict(ErrorKind::NotReady, "candidate is exited"),
        );
        assert_eq!(error.kind(), ErrorKind::NotReady);
        assert_eq!(error.port(), None);
        assert!(!error.is_permanent());
    }

    fn kind_of<E: PortFailure>(error: E) -> (PortName, ErrorKind) {
        (E::PORT, error.kind())
    }

    #[test]
    fn every_failure_has_a_kind_its_port_declares() {
        let s = || "x".to_owned();
        let every = [
            kind_of(RuntimeError::NotFound),
            kind_of(RuntimeError::Conflict(s())),
            kind_of(RuntimeError::Refused(s())),
            kind_of(RuntimeError::Transient(s())),
            kind_of(StoreError::Unavailable(s())),
            kind_of(StoreError::BadRow {
                table: "t",
                id: s(),
                field: "f",
                value: s(),
            }),
            kind_of(StoreError::Conflict(s())),
            kind_of(StoreError::Fenced { epoch: 1 }),
            kind_of(StoreError::NotFound(s())),
            kind_of(TrafficError::Unreachable(s())),
            kind_of(TrafficError::Rejected(s())),
            kind_of(ProvisionError::NotFound(s())),
            kind_of(ProvisionError::Refused(s())),
            kind_of(ProvisionError::Failed(s())),
            kind_of(ProvisionError::Unavailable(s())),
            kind_of(ProbeError::Unreachable(s())),
            kind_of(ProbeError::NotReady(s())),
            kind_of(ProbeError::Misconfigured(s())),
            kind_of(PolicyError::Revoked(s())),
            kind_of(PolicyError::Unavailable(s())),
            kind_of(NotifyError(s())),
        ];
        for (port, kind) in every {
            assert!(
                port.kinds().contains(&kind),
                "{} reports {kind} but does not declare it",
                port.as_str()
            );
        }
        // And every declared kind is reported by some failure.
        for port in PortName::ALL {
            for kind in port.kinds() {
                assert!(
                    every.contains(&(port, *kind)),
                    "{} declares {kind} but nothing reports it",
                    port.as_str()
                );
            }
        }
    }
}
