//! Provisioning and deprovisioning (C11, T4) as sans-IO machines, in one
//! command vocabulary the worker performs through its ports.
//!
//! [`Provision`]: install-or-upgrade the release, then one container per
//! service of the catalog entry and ACTIVE naming it. Idempotent: a service
//! whose ACTIVE container still exists keeps it (the recovery pass owns its
//! health), containers are created by deterministic name, and ACTIVE is
//! written only when it changes. A worker installs its own catalog's
//! version, the only one it has: it refuses an instance whose recorded
//! version is newer, and records its version on one created at an older
//! one (split roles reload the catalog at different moments).
//!
//! [`Deprovision`]: per ACTIVE service withdraw, stop, remove, release its
//! claims and drop it from ACTIVE; then stop and remove every predecessor a
//! `retirement-pending` marker names and clear every inhibition; then
//! uninstall the release. Any failure stops the machine; the task is
//! retried and the machine, re-run on what is left, picks up from there.
//!
//! Both are driven the same way:
//!
//! ```text
//! while let Some(command) = machine.poll_command() {
//!     // effects need the task lease and the instance lock trusted now
//!     machine.handle(perform(command));
//! }
//! machine.into_result()
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use super::errors::{
    failure_of, Cause, ErrorKind, PortFailure, PortName, ProvisionError, StoreError, TaskError,
    TrafficError,
};
use super::fleet::InstanceState;
use super::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use super::plan::is_older;
use super::release::{ReleaseKind, ReleaseSpec, ReleaseTarget};
use super::spec::ServiceSpec;
use super::types::Timestamp;
use super::types::{
    ActiveRecord, ActiveService, ContainerId, GenerationKey, Inhibition, InhibitionReason,
    InstanceName, Observation, RuntimeError, ServiceKey, ServiceName,
};

/// One effect (or read) a worker's protocol asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkCommand {
    /// Install or upgrade the instance's release (for a Docker type, the
    /// containers that follow are the release).
    Install(ReleaseSpec),
    Uninstall(ReleaseTarget),
    Inspect(ContainerId),
    /// Create the container of `spec` at `revision` (`ServiceSpec::revision`
    /// of `version`, which its templates read as `{version}`).
    Create {
        spec: ServiceSpec,
        version: String,
        revision: String,
    },
    SaveActive {
        service: ServiceName,
        record: ActiveService,
    },
    Withdraw(ServiceKey),
    Stop {
        generation: GenerationKey,
        grace: Duration,
    },
    Remove(GenerationKey),
    ReleaseClaims(ContainerId),
    RemoveActive(ServiceName),
    /// Save a hold (an inhibition) on a generation.
    Inhibit(Inhibition),
    /// Remove the instance's named volumes (`delete --purge-volumes`).
    PurgeVolumes,
    ClearInhibition(Inhibition),
    /// Record on the instance the catalog version (and spec digest) it was
    /// just provisioned at, which is not the one its row named.
    RecordVersion {
        version: String,
        spec_digest: String,
    },
}

impl WorkCommand {
    /// Whether it changes the world (the task lease and instance lock must
    /// be trusted when it is issued).
    pub fn is_effect(&self) -> bool {
        !matches!(self, Self::Inspect(_))
    }

    /// The step it performs, as a failure's subject names it.
    pub fn step(&self) -> String {
        match self {
            Self::Install(_) => "install the release".to_owned(),
            Self::Uninstall(_) => "uninstall the release".to_owned(),
            Self::Inspect(container) => format!("inspect {container}"),
            Self::Create { spec, .. } => format!("create {}", spec.name),
            Self::SaveActive { service, .. } => format!("save ACTIVE of {service}"),
            Self::Withdraw(key) => format!("withdraw {}", key.service),
            Self::Stop { generation, .. } => format!("stop {}", generation.container),
            Self::Remove(generation) => format!("remove {}", generation.container),
            Self::ReleaseClaims(container) => format!("release the claims of {container}"),
            Self::RemoveActive(service) => format!("remove {service} from ACTIVE"),
            Self::Inhibit(marker) => format!("hold {}", marker.container),
            Self::PurgeVolumes => "purge the named volumes".to_owned(),
            Self::ClearInhibition(marker) => format!("clear the hold on {}", marker.container),
            Self::RecordVersion { version, .. } => format!("record version {version}"),
        }
    }
}

/// A failure of a provisioning step that is not the runtime's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Traffic(#[from] TrafficError),
}

impl WorkError {
    /// The port and kind of the failure.
    pub fn port_failure(&self) -> (PortName, ErrorKind) {
        match self {
            Self::Provision(e) => e.failure(),
            Self::Store(e) => e.failure(),
            Self::Traffic(e) => e.failure(),
        }
    }
}

impl From<WorkError> for Cause {
    fn from(error: WorkError) -> Self {
        match error {
            WorkError::Provision(e) => e.into(),
            WorkError::Store(e) => e.into(),
            WorkError::Traffic(e) => e.into(),
        }
    }
}

/// The result of performing a [`WorkCommand`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum WorkAnswer {
    /// Install, uninstall, the store writes and the withdrawal.
    Done(Result<(), WorkError>),
    Inspected(Result<Observation, RuntimeError>),
    Created(Result<ContainerId, RuntimeError>),
    Stopped(Result<(), RuntimeError>),
    Removed(Result<(), RuntimeError>),
    Purged(Result<Vec<String>, RuntimeError>),
}

impl WorkAnswer {
    /// The port and kind of the failure this answer reports, if any.
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Done(r) => r.as_ref().err().map(WorkError::port_failure),
            Self::Created(r) => failure_of(r),
            Self::Inspected(r) => failure_of(r),
            Self::Stopped(r) | Self::Removed(r) => failure_of(r),
            Self::Purged(r) => failure_of(r),
        }
    }
}

/// The failure a teardown step's answer reports, if any: the judgement
/// deprovisioning and the retirement of a dropped service share. The
/// step it failed is `command.step()`.
pub(crate) fn teardown_failure(command: &WorkCommand, answer: WorkAnswer) -> Option<Cause> {
    match (command, answer) {
        // A container already stopped or gone is what a stop wants.
        (WorkCommand::Stop { .. }, WorkAnswer::Stopped(result)) => match result {
            Ok(()) | Err(RuntimeError::NotFound) => None,
            Err(e) => Some(e.into()),
        },
        (WorkCommand::Remove(_), WorkAnswer::Removed(result)) => result.err().map(Cause::from),
        (_, WorkAnswer::Done(result)) => result.err().map(Cause::from),
        (WorkCommand::PurgeVolumes, WorkAnswer::Purged(result)) => result.err().map(Cause::from),
        (command, answer) => panic!("answer {answer:?} does not answer {command:?}"),
    }
}

/// The retirement of a service a new catalog version no longer lists, in
/// the order that never leaves it routed or revivable: hold it, then
/// withdraw its traffic, stop and remove it (its named volumes stay),
/// release its claims, drop it from ACTIVE, then clear the hold. The hold
/// comes first: a withdrawal that fails ends the attempt, and until the
/// retry a recovery pass must neither publish the service again (it would
/// republish a route it believes lost) nor start it; held, it withdraws
/// the service itself and starts nothing (R5). Re-run after a crash at any
/// step, the upgrade finds either the service still in ACTIVE (and starts
/// over, every step being idempotent) or only its hold and container left,
/// which the upgrade's plan finishes off (`core::upgrade`).
pub(crate) fn retire_dropped_service(
    instance: &InstanceName,
    service: &ServiceName,
    record: &ActiveService,
    grace: Duration,
    now: jiff::Timestamp,
) -> Vec<WorkCommand> {
    let generation = GenerationKey {
        instance: instance.clone(),
        service: service.clone(),
        container: record.container.clone(),
    };
    let hold = Inhibition {
        service: service.clone(),
        container: record.container.clone(),
        reason: InhibitionReason::Hold(InhibitionReason::SERVICE_DROPPED.to_owned()),
        operation: "upgrade".into(),
        created_at: now,
        stop_grace: record.stop_grace,
        revert_to: None,
    };
    vec![
        WorkCommand::Inhibit(hold.clone()),
        WorkCommand::Withdraw(ServiceKey {
            instance: instance.clone(),
            service: service.clone(),
        }),
        WorkCommand::Stop {
            generation: generation.clone(),
            grace,
        },
        WorkCommand::Remove(generation),
        WorkCommand::ReleaseClaims(record.container.clone()),
        WorkCommand::RemoveActive(service.clone()),
        WorkCommand::ClearInhibition(hold),
    ]
}

/// Stop and remove one generation that is neither ACTIVE's nor routed (a
/// dropped service's predecessor or leftover candidate).
pub(crate) fn remove_generation(
    instance: &InstanceName,
    service: &ServiceName,
    container: &ContainerId,
    grace: Duration,
) -> Vec<WorkCommand> {
    let generation = GenerationKey {
        instance: instance.clone(),
        service: service.clone(),
        container: container.clone(),
    };
    vec![
        WorkCommand::Stop {
            generation: generation.clone(),
            grace,
        },
        WorkCommand::Remove(generation),
    ]
}

/// The containers of `service` the runtime lists that are neither
/// ACTIVE's nor under a durable record that `counts` (a
/// `retirement-pending` predecessor, which the recovery pass retires; an
/// operator's hold, which is theirs): a candidate a crashed or abandoned
/// task left behind, at whatever revision. Provisioning and upgrades
/// remove them before they create the service's next container.
pub(crate) fn strays<'a>(
    service: &'a ServiceName,
    active: &'a ActiveRecord,
    inhibitions: &'a [Inhibition],
    containers: &'a [(ServiceName, ContainerId)],
    counts: impl Fn(&Inhibition) -> bool + 'a,
) -> impl Iterator<Item = &'a ContainerId> + 'a {
    let active = active.services.get(service).map(|a| &a.container);
    containers
        .iter()
        .filter(move |(s, container)| {
            s == service
                && active != Some(container)
                && !inhibitions
                    .iter()
                    .any(|h| &h.service == service && &h.container == container && counts(h))
        })
        .map(|(_, container)| container)
}

/// What provisioning starts from.
#[derive(Clone, Debug)]
pub struct ProvisionInput {
    pub instance: InstanceName,
    /// The version of the worker's catalog entry, which the release and the
    /// containers below are made from (the only one it can install).
    pub version: String,
    /// That entry's spec digest.
    pub spec_digest: String,
    /// The version and digest the instance's row records (what it was
    /// created or last upgraded at, by another process's catalog perhaps).
    pub recorded_version: String,
    pub recorded_digest: Option<String>,
    /// What to install first; a Helm release has no containers of stead's.
    pub release: ReleaseSpec,
    /// The catalog's services (a Docker type's containers).
    pub services: Vec<ServiceSpec>,
    /// ACTIVE as loaded under the instance lock.
    pub active: ActiveRecord,
    /// The instance's containers the runtime lists, as (service,
    /// container), and its durable records: a container an earlier attempt
    /// created but never recorded in ACTIVE is removed before its service's
    /// is created again (at another revision, after a catalog change, it
    /// would run beside it, on the same volumes).
    pub containers: Vec<(ServiceName, ContainerId)>,
    pub inhibitions: Vec<Inhibition>,
    /// The entry is the version an operator's `rollout undo --to` pinned
    /// the type to: it is what the type runs now, so a row recording a
    /// newer one is not a newer catalog's and is not refused.
    pub pinned: bool,
}

#[derive(Debug)]
enum ProvisionStep {
    Install,
    Next,
    /// Strays of a service removed, then its container created.
    Sweep(ServiceSpec, VecDeque<WorkCommand>),
    Inspect(ServiceSpec, ContainerId),
    Create(ServiceSpec),
    Save,
    Record,
    Done,
}

/// The provisioning machine. See the module docs.
#[derive(Debug)]
pub struct Provision {
    instance: InstanceName,
    version: String,
    spec_digest: String,
    /// The row's version and digest differ from the ones installed.
    record_differs: bool,
    /// A container of ACTIVE was kept (it still existed): a Docker
    /// instance is then partly of the recorded version.
    kept: bool,
    release: ReleaseSpec,
    active: ActiveRecord,
    pending: VecDeque<ServiceSpec>,
    containers: Vec<(ServiceName, ContainerId)>,
    inhibitions: Vec<Inhibition>,
    step: ProvisionStep,
    to_save: Option<(ServiceName, ActiveService)>,
    outstanding: Option<WorkCommand>,
    error: Option<TaskError>,
}

impl Provision {
    /// Where a successful provision leaves its instance.
    pub const SETTLES_AT: InstanceState = InstanceState::Ready;

    pub fn new(input: ProvisionInput) -> Self {
        // Kubernetes runs a Helm release's pods: stead creates no
        // container for it, whatever the services say.
        let pending = match input.release {
            ReleaseSpec::Docker { .. } => input.services.into(),
            ReleaseSpec::Helm(_) => VecDeque::new(),
        };
        // A worker whose catalog is older than the version the instance was
        // created at (another process saw the catalog's bump first) would
        // install an older release under a newer version's name, which the
        // rollout, upgrading only instances behind, would never correct. It
        // refuses; the task is retried, by then under the new catalog.
        // Another process's catalog got there first: a conflict, retried.
        let error =
            (!input.pinned && is_older(&input.version, &input.recorded_version)).then(|| {
                TaskError::new(
                    &input.instance,
                    "provision",
                    Cause::verdict(
                        ErrorKind::Conflict,
                        format!(
                            "this worker's catalog has version {} of its type, behind the \
                         instance's {}: not provisioned until the catalog is reloaded",
                            input.version, input.recorded_version
                        ),
                    ),
                )
            });
        let record_differs = input.recorded_version != input.version
            || input.recorded_digest.as_deref() != Some(input.spec_digest.as_str());
        // A service ACTIVE names that this version does not list stays of
        // the recorded version, as a kept container does.
        let kept = input
            .active
            .services
            .keys()
            .any(|name| !pending.iter().any(|spec: &ServiceSpec| &spec.name == name));
        Self {
            instance: input.instance,
            version: input.version,
            spec_digest: input.spec_digest,
            record_differs,
            kept,
            release: input.release,
            active: input.active,
            pending,
            containers: input.containers,
            inhibitions: input.inhibitions,
            step: ProvisionStep::Install,
            to_save: None,
            outstanding: None,
            error,
        }
    }

    pub fn poll_command(&mut self) -> Option<WorkCommand> {
        assert!(self.outstanding.is_none(), "poll_command before the answer");
        loop {
            if self.error.is_some() {
                return None;
            }
            let command = match &self.step {
                ProvisionStep::Install => WorkCommand::Install(self.release.clone()),
                ProvisionStep::Next => {
                    let Some(spec) = self.pending.pop_front() else {
                        self.step = if self.records_version() {
                            ProvisionStep::Record
                        } else {
                            ProvisionStep::Done
                        };
                        continue;
                    };
                    // Repair what is missing, never churn what exists.
                    self.step = match self.active.services.get(&spec.name) {
                        Some(current) => {
                            let container = current.container.clone();
                            ProvisionStep::Inspect(spec, container)
                        }
                        None => self.create_step(spec),
                    };
                    continue;
                }
                ProvisionStep::Sweep(_, plan) => plan.front().expect("a step to sweep").clone(),
                ProvisionStep::Inspect(_, container) => WorkCommand::Inspect(container.clone()),
                ProvisionStep::Create(spec) => WorkCommand::Create {
                    spec: spec.clone(),
                    version: self.version.clone(),
                    revision: spec.revision(&self.version),
                },
                ProvisionStep::Save => {
                    let (service, record) = self.to_save.clone().expect("a record to save");
                    WorkCommand::SaveActive { service, record }
                }
                ProvisionStep::Record => WorkCommand::RecordVersion {
                    version: self.version.clone(),
                    spec_digest: self.spec_digest.clone(),
                },
                ProvisionStep::Done => return None,
            };
            self.outstanding = Some(command.clone());
            return Some(command);
        }
    }

    pub fn handle(&mut self, answer: WorkAnswer, _now: Timestamp) {
        let command = self
            .outstanding
            .take()
            .expect("an answer without a command");
        let step = std::mem::replace(&mut self.step, ProvisionStep::Next);
        match (step, answer) {
            (ProvisionStep::Sweep(spec, mut plan), answer) => {
                let done = plan.pop_front().expect("a step was issued");
                if let Some(cause) = teardown_failure(&done, answer) {
                    self.fail(&command, cause);
                } else if plan.is_empty() {
                    self.step = ProvisionStep::Create(spec);
                } else {
                    self.step = ProvisionStep::Sweep(spec, plan);
                }
            }
            (ProvisionStep::Install, WorkAnswer::Done(result)) => {
                if let Err(e) = result {
                    self.fail(&command, e);
                }
            }
            (ProvisionStep::Inspect(spec, _), WorkAnswer::Inspected(result)) => match result {
                Ok(_) => self.kept = true,
                Err(RuntimeError::NotFound) => self.step = self.create_step(spec),
                Err(e) => self.fail(&command, e),
            },
            (ProvisionStep::Create(spec), WorkAnswer::Created(result)) => match result {
                Ok(id) => {
                    let unchanged = self
                        .active
                        .services
                        .get(&spec.name)
                        .is_some_and(|s| s.container == id);
                    if !unchanged {
                        self.to_save = Some((
                            spec.name.clone(),
                            ActiveService {
                                effective_revision: spec.revision(&self.version),
                                container: id,
                                binds: Default::default(),
                                stop_grace: Some(spec.stop_grace),
                                verified_started_at: None,
                            },
                        ));
                        self.step = ProvisionStep::Save;
                    }
                }
                Err(e) => self.fail(&command, e),
            },
            (ProvisionStep::Save, WorkAnswer::Done(result)) => {
                self.to_save = None;
                if let Err(e) = result {
                    self.fail(&command, e);
                }
            }
            (ProvisionStep::Record, WorkAnswer::Done(result)) => {
                self.step = ProvisionStep::Done;
                if let Err(e) = result {
                    self.fail(&command, e);
                }
            }
            (step, answer) => {
                panic!("answer {answer:?} does not answer {command:?} (step {step:?})")
            }
        }
    }

    /// The service's container is to be created: first, its strays go.
    fn create_step(&self, spec: ServiceSpec) -> ProvisionStep {
        let plan: VecDeque<WorkCommand> = strays(
            &spec.name,
            &self.active,
            &self.inhibitions,
            &self.containers,
            |_| true,
        )
        .flat_map(|container| {
            remove_generation(&self.instance, &spec.name, container, spec.stop_grace)
        })
        .collect();
        if plan.is_empty() {
            ProvisionStep::Create(spec)
        } else {
            ProvisionStep::Sweep(spec, plan)
        }
    }

    /// Whether the version installed is recorded on the instance: when its
    /// row names another, and the instance is now entirely of the version
    /// installed. A Helm release is installed whole. A Docker instance with
    /// a container kept (or a service the version dropped) is partly of the
    /// recorded version, so that stays: the rollout upgrades what is
    /// behind, and keeps what this provision already made at the target.
    fn records_version(&self) -> bool {
        self.record_differs && !self.kept
    }

    /// `command` failed: the machine stops, naming the instance and step.
    fn fail(&mut self, command: &WorkCommand, cause: impl Into<Cause>) {
        self.error = Some(TaskError::new(&self.instance, command.step(), cause));
    }

    /// Stops issuing commands (the task lease or lock is not trusted).
    pub fn abandon(&mut self, why: Abandon) {
        self.outstanding = None;
        self.error
            .get_or_insert_with(|| TaskError::abandoned(&self.instance, why));
    }

    pub fn into_report(self) -> Result<(), TaskError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What deprovisioning starts from.
#[derive(Clone, Debug)]
pub struct DeprovisionInput {
    pub instance: InstanceName,
    /// The release to uninstall last.
    pub release: ReleaseTarget,
    pub active: ActiveRecord,
    pub inhibitions: Vec<Inhibition>,
    /// The stop grace of a generation that names none.
    pub stop_grace_default: Duration,
    /// `delete --purge-volumes`: remove the named volumes after the
    /// release (a Docker release's only; a chart's storage is the chart's).
    pub purge_volumes: bool,
}

/// The deprovisioning machine. See the module docs.
#[derive(Debug)]
pub struct Deprovision {
    instance: InstanceName,
    /// Every command still to issue, in order; each is issued only once
    /// the one before it succeeded.
    plan: VecDeque<WorkCommand>,
    outstanding: Option<WorkCommand>,
    error: Option<TaskError>,
}

impl Deprovision {
    /// Where a successful deprovision leaves its instance.
    pub const SETTLES_AT: InstanceState = InstanceState::Deleted;

    pub fn new(input: DeprovisionInput) -> Self {
        let name = &input.instance;
        let grace = |g: Option<Duration>| g.unwrap_or(input.stop_grace_default);
        let mut plan = VecDeque::new();
        for (service, record) in &input.active.services {
            let generation = GenerationKey {
                instance: name.clone(),
                service: service.clone(),
                container: record.container.clone(),
            };
            plan.push_back(WorkCommand::Withdraw(ServiceKey {
                instance: name.clone(),
                service: service.clone(),
            }));
            plan.push_back(WorkCommand::Stop {
                generation: generation.clone(),
                grace: grace(record.stop_grace),
            });
            plan.push_back(WorkCommand::Remove(generation));
            plan.push_back(WorkCommand::ReleaseClaims(record.container.clone()));
            plan.push_back(WorkCommand::RemoveActive(service.clone()));
        }
        for marker in &input.inhibitions {
            if marker.reason == InhibitionReason::RetirementPending {
                let generation = GenerationKey {
                    instance: name.clone(),
                    service: marker.service.clone(),
                    container: marker.container.clone(),
                };
                plan.push_back(WorkCommand::Stop {
                    generation: generation.clone(),
                    grace: grace(marker.stop_grace),
                });
                plan.push_back(WorkCommand::Remove(generation));
            }
            plan.push_back(WorkCommand::ClearInhibition(marker.clone()));
        }
        plan.push_back(WorkCommand::Uninstall(input.release.clone()));
        if input.purge_volumes && input.release.kind == ReleaseKind::Docker {
            plan.push_back(WorkCommand::PurgeVolumes);
        }
        Self {
            instance: input.instance,
            plan,
            outstanding: None,
            error: None,
        }
    }

    pub fn poll_command(&mut self) -> Option<WorkCommand> {
        assert!(self.outstanding.is_none(), "poll_command before the answer");
        if self.error.is_some() {
            return None;
        }
        let command = self.plan.pop_front()?;
        self.outstanding = Some(command.clone());
        Some(command)
    }

    pub fn handle(&mut self, answer: WorkAnswer, _now: Timestamp) {
        let command = self
            .outstanding
            .take()
            .expect("an answer without a command");
        if let Some(cause) = teardown_failure(&command, answer) {
            self.error = Some(TaskError::new(&self.instance, command.step(), cause));
        }
    }

    /// Stops issuing commands (the task lease or lock is not trusted).
    pub fn abandon(&mut self, why: Abandon) {
        self.outstanding = None;
        self.error
            .get_or_insert_with(|| TaskError::abandoned(&self.instance, why));
    }

    pub fn into_report(self) -> Result<(), TaskError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl MachineCommand for WorkCommand {
    fn is_effect(&self) -> bool {
        WorkCommand::is_effect(self)
    }
}

impl Machine for Provision {
    type Command = WorkCommand;
    type Answer = WorkAnswer;
    type Report = Result<(), TaskError>;

    fn poll_command(&mut self) -> Option<WorkCommand> {
        Provision::poll_command(self)
    }

    fn handle(&mut self, answer: WorkAnswer, now: Timestamp) {
        Provision::handle(self, answer, now)
    }

    fn abandon(&mut self, why: Abandon) {
        Provision::abandon(self, why)
    }

    fn into_report(self) -> Result<(), TaskError> {
        Provision::into_report(self)
    }
}

impl Machine for Deprovision {
    type Command = WorkCommand;
    type Answer = WorkAnswer;
    type Report = Result<(), TaskError>;

    fn poll_command(&mut self) -> Option<WorkCommand> {
        Deprovision::poll_command(self)
    }

    fn handle(&mut self, answer: WorkAnswer, now: Timestamp) {
        Deprovision::handle(self, answer, now)
    }

    fn abandon(&mut self, why: Abandon) {
        Deprovision::abandon(self, why)
    }

    fn into_report(self) -> Result<(), TaskError> {
        Deprovision::into_report(self)
    }
}

impl MachineAnswer for WorkAnswer {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        WorkAnswer::port_failure(self)
    }
}
