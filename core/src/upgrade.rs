//! The overlap replacement of an upgrade (C11, R15) as a sans-IO machine.
//!
//! Per service whose ACTIVE generation is not at the target version, in the
//! catalog's order: create the successor; wait (bounded, by timeouts, not
//! sleeps) for it to run; read its binds; probe its readiness; inspect it
//! again to make sure the execution that passed is still the one running;
//! then save the predecessor's `retirement-pending` marker *before*
//! switching ACTIVE to the verified successor (a crash in between leaves a
//! marker on a still-ACTIVE container, which the pass just clears). A
//! successor that fails any step is removed and ACTIVE left alone; the
//! upgrade stops there. Publication and retirement are the recovery pass's
//! (`core::pass`): the predecessor keeps serving until then.
//!
//! The worker loads the instance and ACTIVE under the instance lock, then:
//!
//! ```text
//! loop {
//!     if let Some(command) = upgrade.poll_command() {
//!         upgrade.handle(perform(command), now);   // effects need the task lease
//!     } else if upgrade.poll_timeout().is_some() {
//!         wait UPGRADE_RETRY_INTERVAL; upgrade.handle_timeout(now);
//!     } else { break }
//! }
//! upgrade.into_report()
//! ```

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use jiff::Timestamp;

use super::broken::Armed;
use super::errors::{
    failure_of, Cause, ErrorKind, PortName, ProbeError, ProvisionError, StoreError, TaskError,
};
use super::fleet::{add, InstanceState};
use super::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use super::plan::is_older;
use super::provision::{
    remove_generation, retire_dropped_service, strays, teardown_failure, WorkAnswer, WorkCommand,
};
use super::release::HelmRelease;
use super::spec::{ReadinessProbe, ServiceSpec, UpdateStrategy};
use super::types::ProbeTarget;
use super::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, GenerationKey, Inhibition, InhibitionReason,
    InstanceName, Observation, RevertTo, RuntimeError, ServiceKey, ServiceName,
};
use super::verify::{Check, Progress, Verification};

/// How long a successor may take to report running.
pub const CANDIDATE_RUNNING_WAIT_MAX: Duration = super::verify::RUNNING_WAIT_MAX;
/// The pause between inspections of a successor that is not running yet.
pub const UPGRADE_RETRY_INTERVAL: Duration = super::verify::RETRY_INTERVAL;

/// What one upgrade starts from.
#[derive(Clone, Debug)]
pub struct UpgradeInput {
    pub instance: InstanceName,
    /// Stopped intent: an overlap replacement would start and publish what
    /// must stay down (S3), so the upgrade is skipped; version drift plans
    /// it again once the instance is started.
    pub stopped: bool,
    /// The instance's lifecycle state as re-read under the lock.
    pub state: InstanceState,
    /// The catalog version every service should reach (the worker's).
    pub version: String,
    /// The version the instance's row records. A worker whose catalog is
    /// older (another process planned the upgrade under a newer catalog)
    /// skips the task rather than downgrade the instance to its version.
    pub recorded_version: String,
    /// The catalog's services, in order.
    pub services: Vec<ServiceSpec>,
    /// ACTIVE as loaded under the instance lock.
    pub active: ActiveRecord,
    /// A Helm type's release at the target version (`--atomic`): upgraded
    /// in one step by Helm instead of service by service. `None` for a
    /// Docker type.
    pub release: Option<HelmRelease>,
    /// The instance's inhibitions as loaded under the lock: a dropped
    /// service's hold left by a crashed upgrade is finished off.
    pub inhibitions: Vec<Inhibition>,
    /// The stop grace of a generation that names none.
    pub stop_grace_default: Duration,
    /// The instance's containers the runtime lists, as (service,
    /// container): every generation of a dropped service is retired, not
    /// only ACTIVE's.
    pub containers: Vec<(ServiceName, ContainerId)>,
    /// The catalog entry's spec digest, recorded with the version.
    pub spec_digest: String,
    /// The spec digest the instance's row records (the way back's).
    pub recorded_spec_digest: Option<String>,
    /// The type's bake window (#40): each predecessor's marker carries the
    /// way back until it ends. Zero: no way back, retired once its
    /// successor serves.
    pub bake: Duration,
    /// The type's rollout is halted (read by the worker just now): nothing
    /// is upgraded. What an interrupted upgrade left behind is tidied all
    /// the same (stray candidates removed, `stop-first` holds cleared) and
    /// an instance it left `upgrading` goes back to ready, so a halt never
    /// strands one.
    pub halted: bool,
    /// The target is the version an operator's `rollout undo --to` pinned
    /// the type to: going back is the point, so a version older than the
    /// instance's is not skipped.
    pub pinned: bool,
    /// The rule the mutation exercise broke, if any.
    pub broken: Armed,
}

impl UpgradeInput {
    /// Whether a service of the entry is not yet at its target revision
    /// (new to ACTIVE, or ACTIVE's generation at another version or of
    /// another spec: `ServiceSpec::revision`).
    pub fn is_behind(&self, spec: &ServiceSpec) -> bool {
        let target = spec.revision(&self.version);
        self.active
            .services
            .get(&spec.name)
            .is_none_or(|current| current.effective_revision != target)
    }
}

/// One effect the worker must perform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeCommand {
    /// Create (idempotently, by deterministic name) the successor of
    /// `spec.name` at `revision` (of `version`, which its templates read).
    Create {
        spec: ServiceSpec,
        version: String,
        revision: String,
    },
    Inspect(ContainerId),
    ReadBinds(ContainerId),
    /// Probe the readiness of the candidate's execution that was seen
    /// running, on the binds read from it.
    Probe {
        readiness: ReadinessProbe,
        target: ProbeTarget,
    },
    /// Remove a successor that failed verification.
    RemoveCandidate(GenerationKey),
    SaveMarker(Inhibition),
    SaveActive {
        service: ServiceName,
        record: ActiveService,
    },
    /// Move the instance's lifecycle state (compare-and-set on `from`).
    MoveState {
        from: InstanceState,
        to: InstanceState,
    },
    /// Record the version the instance now runs.
    SetVersion {
        version: String,
        /// The catalog spec's digest the instance now runs.
        spec_digest: String,
    },
    /// Upgrade a Helm type's release in place; Helm rolls a failure back
    /// (`--atomic`) and Kubernetes replaces the pods.
    UpgradeRelease(HelmRelease),
    /// Move a Helm type's release back to an operator's pinned version
    /// (`rollout undo --to`): `helm rollback` to the newest revision at
    /// its chart version, which restores that revision's values as well
    /// (an upgrade to it when Helm's history has none). Answered by
    /// [`UpgradeAnswer::ReleaseUpgraded`].
    RollBackRelease(HelmRelease),
    /// One step of retiring a service the new version no longer lists
    /// (`provision::retire_dropped_service`).
    Retire(WorkCommand),
}

impl UpgradeCommand {
    /// Whether the command changes the workload or the database (it needs
    /// the task lease and the instance lock trusted now). Returning the
    /// instance to ready is not one: it must happen even when the upgrade
    /// stops for a lost lease, and it only compares and sets a state.
    pub fn is_effect(&self) -> bool {
        !matches!(
            self,
            Self::Inspect(_)
                | Self::ReadBinds(_)
                | Self::Probe { .. }
                | Self::MoveState {
                    to: InstanceState::Ready,
                    ..
                }
        )
    }
}

/// The result of performing an [`UpgradeCommand`], variant for variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeAnswer {
    Created(Result<ContainerId, RuntimeError>),
    Inspected(Result<Observation, RuntimeError>),
    Binds(Result<Binds, RuntimeError>),
    Probed(Result<(), ProbeError>),
    Removed(Result<(), RuntimeError>),
    MarkerSaved(Result<(), StoreError>),
    ActiveSaved(Result<(), StoreError>),
    StateMoved(Result<(), StoreError>),
    VersionSet(Result<(), StoreError>),
    ReleaseUpgraded(Result<(), ProvisionError>),
    Retired(WorkAnswer),
}

impl UpgradeAnswer {
    /// The port and kind of the failure this answer reports, if any.
    pub fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Created(r) => failure_of(r),
            Self::Inspected(r) => failure_of(r),
            Self::Binds(r) => failure_of(r),
            Self::Removed(r) => failure_of(r),
            Self::Probed(r) => failure_of(r),
            Self::MarkerSaved(r)
            | Self::ActiveSaved(r)
            | Self::StateMoved(r)
            | Self::VersionSet(r) => failure_of(r),
            Self::ReleaseUpgraded(r) => failure_of(r),
            Self::Retired(answer) => answer.port_failure(),
        }
    }
}

/// Where the successor in hand stands.
#[derive(Clone, Debug)]
enum Step {
    /// `stop-first` (#40): hold the predecessor, withdraw the service,
    /// stop the predecessor; then create.
    Prepare(VecDeque<WorkCommand>),
    Create,
    /// The successor created, verified before ACTIVE may name it.
    Verify(Verification),
    /// Remove a successor that failed verification, for `error`.
    Remove {
        candidate: ContainerId,
        error: Cause,
    },
    /// `stop-first`: ACTIVE could not be switched to the verified
    /// successor, whose predecessor is stopped: the successor goes (then
    /// [`Step::Release`]), failing with `error`.
    Unswitch {
        candidate: ContainerId,
        error: TaskError,
    },
    /// `stop-first`: the failed service's predecessor may start again
    /// (the recovery pass starts, verifies and publishes it): clear the
    /// hold this upgrade put on it, then fail with `error`.
    Release(TaskError),
    /// The removed candidate was a container an earlier attempt had
    /// switched to and put back under a retirement marker (its name is
    /// this revision's, so the create adopted it): the marker goes with it
    /// (`error` then as after any removal), else it would outlive its
    /// container and name the next one created under that name, which the
    /// recovery pass would then retire (simulation seed 424, S1).
    ForgetMarker {
        marker: Inhibition,
        error: TaskError,
    },
    SaveMarker {
        candidate: ContainerId,
        started_at: Timestamp,
        binds: Binds,
    },
    SaveActive {
        candidate: ContainerId,
        started_at: Timestamp,
        binds: Binds,
    },
}

/// Where the whole upgrade stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Ready → Upgrading, when the instance is ready.
    Begin,
    /// Stray generations of the services it keeps are stopped and removed
    /// first: a candidate an interrupted upgrade left behind would run
    /// beside the new one, on the same volumes (#40).
    Sweep,
    Services,
    /// A service failed after others were switched: put those back.
    Revert,
    /// Every service of the new version serves: retire those it dropped.
    Drop,
    SetVersion,
    /// Upgrading → Ready, whether the services were switched or not: the
    /// instance serves either way, the new version or the old untouched.
    Finish,
    Done,
}

/// The machine. See the module docs.
#[derive(Debug)]
pub struct Upgrade {
    instance: InstanceName,
    phase: Phase,
    state: InstanceState,
    skipped_stopped: bool,
    /// This worker's catalog is older than the instance's version.
    skipped_older_catalog: bool,
    version: String,
    spec_digest: String,
    active: ActiveRecord,
    pending: VecDeque<ServiceSpec>,
    /// A Helm release still to upgrade (taken when its command is issued).
    release: Option<HelmRelease>,
    /// The upgrade is of a Helm release (whether issued yet or not).
    had_release: bool,
    current: Option<(ServiceSpec, Step)>,
    /// The steps retiring dropped services, in order.
    retiring: VecDeque<WorkCommand>,
    /// The steps removing stray generations of kept services, in order.
    sweeping: VecDeque<WorkCommand>,
    outstanding: Option<UpgradeCommand>,
    /// The services switched, with the successor each now serves: first
    /// the `resumed` an earlier run of this upgrade switched.
    switched: Vec<(ServiceName, ActiveService)>,
    resumed: usize,
    /// How many services were behind when this run began.
    behind: usize,
    /// All or nothing per instance (#40): once a later service fails, the
    /// steps putting every switched one back, in reverse order.
    reverting: VecDeque<UpgradeCommand>,
    reverted: bool,
    /// The instance's version and digest before, and the bake window.
    recorded_version: String,
    recorded_spec_digest: Option<String>,
    bake: Duration,
    /// The holds on ACTIVE's generations, which their markers replace.
    holds: Vec<Inhibition>,
    /// The retirement markers the instance had when the upgrade began.
    markers: Vec<Inhibition>,
    /// The services replaced `stop-first`.
    stop_first: BTreeSet<ServiceName>,
    /// The `stop-first` hold this upgrade put on the predecessor of the
    /// service in hand, which a failure clears.
    stop_first_hold: Option<Inhibition>,
    /// The predecessor of the `stop-first` service in hand was stopped.
    predecessor_stopped: bool,
    halted: bool,
    /// Moving to an operator's pinned version (`UpgradeInput::pinned`).
    pinned: bool,
    broken: Armed,
    stop_grace_default: Duration,
    error: Option<TaskError>,
    now: Option<Timestamp>,
}

impl Upgrade {
    pub fn new(input: UpgradeInput) -> Self {
        let pending = input
            .services
            .iter()
            .filter(|spec| input.is_behind(spec))
            .cloned()
            .collect();
        // What an earlier run of this upgrade switched before it was cut
        // short (a crash, a lost lease): all or nothing holds across runs.
        let resumed = resumed_switches(&input);
        let (holds, markers) = records_of(&input, &resumed);
        let behind = if input.release.is_some() || input.halted {
            0
        } else {
            input.services.iter().filter(|s| input.is_behind(s)).count()
        };
        let stop_first = input
            .services
            .iter()
            .filter(|spec| spec.update == UpdateStrategy::StopFirst)
            .map(|spec| spec.name.clone())
            .collect();
        let skipped_stopped = input.stopped;
        let skipped_older_catalog =
            !input.pinned && is_older(&input.version, &input.recorded_version);
        let (retiring, sweeping) = if input.release.is_some() {
            (VecDeque::new(), VecDeque::new())
        } else if input.halted {
            (VecDeque::new(), sweeping_plan(&input))
        } else {
            (retiring_plan(&input), sweeping_plan(&input))
        };
        let halted = input.halted && !skipped_stopped && !skipped_older_catalog;
        Self {
            instance: input.instance,
            phase: if skipped_stopped || skipped_older_catalog {
                Phase::Done
            } else if halted {
                // Nothing upgraded: the state is left as it is until the
                // tidy-up ends (an instance left upgrading goes to ready).
                Phase::Sweep
            } else {
                Phase::Begin
            },
            state: input.state,
            skipped_stopped,
            skipped_older_catalog,
            version: input.version,
            spec_digest: input.spec_digest,
            active: active_before(input.active, &resumed),
            // A Helm type has no services of stead's to replace.
            pending: if input.release.is_some() || halted {
                VecDeque::new()
            } else {
                pending
            },
            behind,
            had_release: input.release.is_some(),
            release: input.release.filter(|_| !halted),
            current: None,
            retiring,
            sweeping,
            outstanding: None,
            switched: resumed
                .iter()
                .map(|r| (r.service.clone(), r.successor.clone()))
                .collect(),
            resumed: resumed.len(),
            reverting: VecDeque::new(),
            reverted: false,
            recorded_version: input.recorded_version,
            recorded_spec_digest: input.recorded_spec_digest,
            bake: input.bake,
            holds,
            markers,
            stop_first,
            stop_first_hold: None,
            predecessor_stopped: false,
            halted,
            pinned: input.pinned,
            broken: input.broken,
            stop_grace_default: input.stop_grace_default,
            error: None,
            now: None,
        }
    }

    fn generation(&self, service: &ServiceName, container: &ContainerId) -> GenerationKey {
        GenerationKey {
            instance: self.instance.clone(),
            service: service.clone(),
            container: container.clone(),
        }
    }

    /// How a service's replacement begins: an overlap creates the
    /// successor at once; `stop-first` (#40) first holds its predecessor
    /// (so that nothing starts it again beside a candidate, also across a
    /// crash), withdraws the service and stops the predecessor. A service
    /// new to ACTIVE has no predecessor to stop.
    fn first_step(&mut self, spec: &ServiceSpec) -> Step {
        self.stop_first_hold = None;
        self.predecessor_stopped = false;
        let Some(current) = self
            .active
            .services
            .get(&spec.name)
            .filter(|_| self.stop_first.contains(&spec.name))
            .filter(|_| !crate::broken!(self.broken, OverlapStopFirst))
        else {
            return Step::Create;
        };
        let mut steps = VecDeque::new();
        // An operator's hold keeps it down already (R5), and is theirs to
        // clear: the upgrade writes none of its own.
        if !self.holds.iter().any(|h| h.container == current.container) {
            let hold = Inhibition {
                service: spec.name.clone(),
                container: current.container.clone(),
                reason: InhibitionReason::Hold(InhibitionReason::STOP_FIRST.to_owned()),
                operation: "upgrade".into(),
                created_at: self.now.unwrap_or(Timestamp::UNIX_EPOCH),
                stop_grace: current.stop_grace,
                revert_to: None,
            };
            steps.push_back(WorkCommand::Inhibit(hold.clone()));
            self.stop_first_hold = Some(hold);
        }
        steps.push_back(WorkCommand::Withdraw(ServiceKey {
            instance: self.instance.clone(),
            service: spec.name.clone(),
        }));
        steps.push_back(WorkCommand::Stop {
            generation: self.generation(&spec.name, &current.container),
            grace: current.stop_grace.unwrap_or(self.stop_grace_default),
        });
        Step::Prepare(steps)
    }

    /// A `stop-first` service failed with nothing of it left running but
    /// its stopped predecessor: clear the hold this upgrade put on it (the
    /// recovery pass then starts, verifies and publishes it), then fail.
    ///
    /// Once the predecessor was stopped, the failure is final: a retry
    /// would stop it again, an outage per attempt, for a version that just
    /// failed (the rollout halts at once instead).
    fn release_or_fail(&self, error: TaskError) -> Result<Step, TaskError> {
        let error = if self.predecessor_stopped && !error.is_permanent() {
            let message = format!(
                "{} (not retried: each attempt of a stop-first upgrade stops the service; \
                 the rollout halts instead)",
                error.cause
            );
            TaskError::new(
                &self.instance,
                error.step,
                Cause::verdict(ErrorKind::Failed, message),
            )
        } else {
            error
        };
        if self.stop_first_hold.is_some() {
            Ok(Step::Release(error))
        } else {
            Err(error)
        }
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Whether the upgrade was skipped because the instance is stopped.
    pub fn skipped_stopped(&self) -> bool {
        self.skipped_stopped
    }

    /// Whether the upgrade was skipped because this worker's catalog is
    /// older than the instance's version: nothing is downgraded, and
    /// version drift plans it again for a worker with the newer catalog.
    pub fn skipped_older_catalog(&self) -> bool {
        self.skipped_older_catalog
    }

    /// A Helm release upgraded by a rollout with a bake window: its version
    /// is recorded only once the bake held (the worker's, after this
    /// machine). Recorded before, a retry after a crash or a lost lease
    /// mid-bake would take the new version for the old, and a revert
    /// would record it "again" while rolling the release back (simulation
    /// seed 54, H2). Unrecorded, the instance is behind its release only
    /// while its task runs, and a retry bakes again.
    pub fn version_after_bake(&self) -> bool {
        self.had_release && !self.bake.is_zero() && !self.pinned && !self.halted
    }

    /// Where an upgrade goes once its services are done: finished (a
    /// halted tidy-up, or a failure with nothing switched), on to retire
    /// what the new version drops, or putting back what it switched.
    fn after_services(&mut self) -> Phase {
        if self.error.is_none() && self.halted {
            Phase::Finish
        } else if self.error.is_none() {
            Phase::Drop
        } else if self.switched.is_empty() && !crate::broken!(self.broken, DropOnFailedUpgrade) {
            Phase::Finish
        } else if self.switched.is_empty() {
            Phase::Drop
        } else if self.behind == 0 {
            // An earlier run switched every service: the new version
            // serves whole (this run failed tidying up), and the retry
            // finishes it.
            Phase::Finish
        } else {
            self.reverting = revert_plan(
                &self.instance,
                &self.active,
                &self.holds,
                &self.switched,
                &self.stop_first,
                self.stop_grace_default,
                self.now.unwrap_or(Timestamp::UNIX_EPOCH),
            );
            Phase::Revert
        }
    }

    /// The lifecycle commands around the services, or `None` while the
    /// services phase has commands of its own.
    fn phase_command(&mut self) -> Option<UpgradeCommand> {
        loop {
            match self.phase {
                Phase::Begin => {
                    if self.state == InstanceState::Ready {
                        return Some(UpgradeCommand::MoveState {
                            from: InstanceState::Ready,
                            to: InstanceState::Upgrading,
                        });
                    }
                    self.phase = Phase::Sweep;
                }
                Phase::Sweep => match self.sweeping.pop_front().filter(|_| self.error.is_none()) {
                    Some(step) => return Some(UpgradeCommand::Retire(step)),
                    None => self.phase = Phase::Services,
                },
                Phase::Services => {
                    if self.error.is_none() {
                        if let Some(release) = self.release.take() {
                            return Some(if self.pinned {
                                UpgradeCommand::RollBackRelease(release)
                            } else {
                                UpgradeCommand::UpgradeRelease(release)
                            });
                        }
                    }
                    if self.error.is_none() && (self.current.is_some() || !self.pending.is_empty())
                    {
                        return None;
                    }
                    self.phase = self.after_services();
                }
                Phase::Revert => match self.reverting.pop_front() {
                    Some(command) => return Some(command),
                    None => {
                        self.reverted = true;
                        self.phase = Phase::Finish;
                    }
                },
                Phase::Drop => {
                    if self.error.is_some() && !crate::broken!(self.broken, DropOnFailedUpgrade) {
                        self.phase = Phase::Finish;
                        continue;
                    }
                    match self.retiring.pop_front() {
                        Some(WorkCommand::Withdraw(_))
                            if crate::broken!(self.broken, KeepDroppedRoute) =>
                        {
                            continue;
                        }
                        Some(mut step) => {
                            // The hold says when it was taken.
                            if let (WorkCommand::Inhibit(hold), Some(now)) = (&mut step, self.now) {
                                hold.created_at = now;
                            }
                            return Some(UpgradeCommand::Retire(step));
                        }
                        None if self.error.is_some() || self.version_after_bake() => {
                            self.phase = Phase::Finish
                        }
                        None => self.phase = Phase::SetVersion,
                    }
                }
                Phase::SetVersion => {
                    return Some(UpgradeCommand::SetVersion {
                        version: self.version.clone(),
                        spec_digest: self.spec_digest.clone(),
                    })
                }
                Phase::Finish => {
                    if self.state != InstanceState::Upgrading {
                        // A halted tidy-up of an instance that was ready.
                        self.phase = Phase::Done;
                        continue;
                    }
                    return Some(UpgradeCommand::MoveState {
                        from: InstanceState::Upgrading,
                        to: InstanceState::Ready,
                    });
                }
                Phase::Done => return None,
            }
        }
    }

    /// The next effect, or `None` while waiting ([`Self::poll_timeout`])
    /// or once done.
    pub fn poll_command(&mut self) -> Option<UpgradeCommand> {
        assert!(self.outstanding.is_none(), "poll_command before the answer");
        if let Some(command) = self.phase_command() {
            self.outstanding = Some(command.clone());
            return Some(command);
        }
        if self.phase != Phase::Services {
            return None;
        }
        if self.current.is_none() {
            let spec = self.pending.pop_front()?;
            let step = self.first_step(&spec);
            self.current = Some((spec, step));
        }
        let (spec, step) = self.current.as_ref().expect("a service in hand");
        let command = match step {
            Step::Prepare(steps) => {
                UpgradeCommand::Retire(steps.front().expect("a step to prepare").clone())
            }
            Step::Release(_) => UpgradeCommand::Retire(WorkCommand::ClearInhibition(
                self.stop_first_hold.clone().expect("a hold to release"),
            )),
            Step::ForgetMarker { marker, .. } => {
                UpgradeCommand::Retire(WorkCommand::ClearInhibition(marker.clone()))
            }
            Step::Create => UpgradeCommand::Create {
                spec: spec.clone(),
                version: self.version.clone(),
                revision: spec.revision(&self.version),
            },
            Step::Verify(verification) => match verification.check() {
                Check::Inspect(container) => UpgradeCommand::Inspect(container),
                Check::ReadBinds(container) => UpgradeCommand::ReadBinds(container),
                Check::Probe { readiness, target } => UpgradeCommand::Probe { readiness, target },
                Check::Wait => return None,
            },
            Step::Remove { candidate, .. } | Step::Unswitch { candidate, .. } => {
                UpgradeCommand::RemoveCandidate(self.generation(&spec.name, candidate))
            }
            Step::SaveMarker { .. } => {
                let current = &self.active.services[&spec.name];
                let now = self.now.unwrap_or(Timestamp::UNIX_EPOCH);
                UpgradeCommand::SaveMarker(Inhibition {
                    service: spec.name.clone(),
                    container: current.container.clone(),
                    reason: InhibitionReason::RetirementPending,
                    operation: "upgrade".into(),
                    created_at: now,
                    stop_grace: current.stop_grace,
                    revert_to: (!self.bake.is_zero()).then(|| RevertTo {
                        revision: current.effective_revision.clone(),
                        binds: current.binds.clone(),
                        version: self.recorded_version.clone(),
                        spec_digest: self.recorded_spec_digest.clone(),
                        until: add(now, self.bake),
                        hold: hold_on(&self.holds, &current.container),
                        stop_first: self.stop_first.contains(&spec.name),
                        undone: false,
                    }),
                })
            }
            Step::SaveActive {
                candidate,
                started_at,
                binds,
            } => UpgradeCommand::SaveActive {
                service: spec.name.clone(),
                record: ActiveService {
                    container: candidate.clone(),
                    effective_revision: spec.revision(&self.version),
                    binds: binds.clone(),
                    stop_grace: Some(spec.stop_grace),
                    verified_started_at: Some(*started_at),
                },
            },
        };
        self.outstanding = Some(command.clone());
        Some(command)
    }

    /// While the successor is not running yet: when to look again.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        match &self.current {
            Some((_, Step::Verify(verification)))
                if verification.check() == Check::Wait
                    && self.phase == Phase::Services
                    && self.error.is_none() =>
            {
                Some(add(
                    self.now.unwrap_or(Timestamp::UNIX_EPOCH),
                    UPGRADE_RETRY_INTERVAL,
                ))
            }
            _ => None,
        }
    }

    /// The wait [`Self::poll_timeout`] named has passed (on the driver's
    /// timer): inspect the successor again.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.now = Some(now);
        if let Some((_, Step::Verify(verification))) = &mut self.current {
            verification.waited();
        }
    }

    /// Feeds the answer to the last command.
    pub fn handle(&mut self, answer: UpgradeAnswer, now: Timestamp) {
        self.now = Some(now);
        let command = self
            .outstanding
            .take()
            .expect("an answer without a command");
        if self.on_phase_answer(&command, &answer) {
            return;
        }
        let Some((spec, step)) = self.current.take() else {
            panic!("{command:?} answered with no service in hand")
        };
        let next = match self.on_service_answer(&spec, step, command, answer) {
            // The service is done: the next one is taken on the next poll.
            None => return,
            Some(next) => next,
        };
        match next {
            Ok(step) => self.current = Some((spec, step)),
            Err(e) => self.error = Some(e),
        }
    }

    /// A failure of `step` for `cause`, on this upgrade's instance.
    fn fail(&self, step: String, cause: Cause) -> TaskError {
        TaskError::new(&self.instance, step, cause)
    }

    /// The answers that belong to a phase, not to the service in hand:
    /// the state moves, the Helm release, the revert, the sweep and the
    /// retirement of dropped services, the version. Whether it was one.
    fn on_phase_answer(&mut self, command: &UpgradeCommand, answer: &UpgradeAnswer) -> bool {
        match (command, answer) {
            (UpgradeCommand::MoveState { from, to }, UpgradeAnswer::StateMoved(result)) => {
                if self.phase == Phase::Begin {
                    match result {
                        Ok(()) => {
                            self.state = *to;
                            self.phase = Phase::Sweep;
                        }
                        Err(e) => {
                            let step = format!("move the instance from {from} to {to}");
                            self.error = Some(self.fail(step, e.clone().into()));
                            self.phase = Phase::Done;
                        }
                    }
                } else {
                    // Best effort: a failure leaves the instance upgrading,
                    // and the next upgrade or provision moves it on.
                    self.phase = Phase::Done;
                }
            }
            (
                UpgradeCommand::UpgradeRelease(release) | UpgradeCommand::RollBackRelease(release),
                UpgradeAnswer::ReleaseUpgraded(result),
            ) => {
                // Helm rolled a failed upgrade back (`--atomic`): the
                // instance keeps serving its old version, as a Docker
                // upgrade whose successor failed does.
                if let Err(e) = result {
                    let how = if self.pinned { "rollback" } else { "upgrade" };
                    let step = format!(
                        "helm {how} of release {} in {} to chart {} {}",
                        release.name, release.namespace, release.chart, release.chart_version
                    );
                    self.error = Some(self.fail(step, e.clone().into()));
                }
            }
            _ if self.phase == Phase::Revert => {
                // A write that failed leaves that service switched, its
                // successor baking under its marker's way back: the pass
                // reverts it if it fails, so the revert goes on. The task
                // fails either way, with the error that started it. But a
                // `stop-first` successor that may still run keeps ACTIVE:
                // its predecessor must not start beside it.
                if let (
                    UpgradeCommand::Retire(stop @ WorkCommand::Stop { .. }),
                    UpgradeAnswer::Retired(answer),
                ) = (command, answer)
                {
                    if teardown_failure(stop, answer.clone()).is_some() {
                        self.reverting.clear();
                    }
                }
            }
            (UpgradeCommand::Retire(step), UpgradeAnswer::Retired(answer))
                if self.phase != Phase::Services =>
            {
                if let Some(cause) = teardown_failure(step, answer.clone()) {
                    let step = if self.phase == Phase::Sweep {
                        format!("remove a stray generation: {}", step.step())
                    } else {
                        format!("retire a dropped service: {}", step.step())
                    };
                    self.error = Some(self.fail(step, cause));
                }
            }
            (UpgradeCommand::SetVersion { .. }, UpgradeAnswer::VersionSet(result)) => {
                if let Err(e) = result {
                    let step = format!("record version {}", self.version);
                    self.error = Some(self.fail(step, e.clone().into()));
                }
                self.phase = Phase::Finish;
            }
            _ => return false,
        }
        true
    }

    /// The answer to the service in hand's `step`: its next step, the
    /// error that stops the upgrade, or `None` once the service is done.
    fn on_service_answer(
        &mut self,
        spec: &ServiceSpec,
        step: Step,
        command: UpgradeCommand,
        answer: UpgradeAnswer,
    ) -> Option<Result<Step, TaskError>> {
        let name = &spec.name;
        Some(match (step, answer) {
            (Step::Prepare(mut steps), UpgradeAnswer::Retired(answer)) => {
                let done = steps.pop_front().expect("a step was issued");
                match teardown_failure(&done, answer) {
                    // Stopped or not, the predecessor was never replaced.
                    Some(cause) => self.release_or_fail(
                        self.fail(format!("replace {name} stop-first: {}", done.step()), cause),
                    ),
                    None if steps.is_empty() => {
                        self.predecessor_stopped = true;
                        Ok(Step::Create)
                    }
                    None => Ok(Step::Prepare(steps)),
                }
            }
            (Step::Release(error), UpgradeAnswer::Retired(_)) => {
                // Cleared or not: a hold left behind is the next upgrade's
                // sweep's to clear (the rollout halts on this failure).
                self.stop_first_hold = None;
                Err(error)
            }
            (Step::Create, UpgradeAnswer::Created(result)) => match result {
                Ok(candidate) => Ok(Step::Verify(Verification::new(
                    candidate,
                    spec.readiness.clone(),
                    "candidate",
                ))),
                Err(e) => {
                    // A refused or impossible creation made nothing; any
                    // other failure might have (a timeout), so a
                    // `stop-first` predecessor stays held until the
                    // retry's sweep has removed what it finds.
                    let made_nothing =
                        matches!(e, RuntimeError::Refused(_) | RuntimeError::NotFound);
                    let error = self.fail(format!("create successor of {name}"), e.into());
                    if made_nothing {
                        self.release_or_fail(error)
                    } else {
                        Err(error)
                    }
                }
            },
            (Step::Verify(verification), answer) => {
                Ok(self.on_verification(name, verification, &command, answer))
            }
            (Step::Remove { candidate, error }, UpgradeAnswer::Removed(removed)) => {
                // Removed or not (the next upgrade's sweep tidies up), the
                // upgrade stops here with ACTIVE untouched.
                let error = self.fail(format!("successor of {name} not ready"), error);
                self.after_removal(&candidate, removed, error)
            }
            (Step::Unswitch { candidate, error }, UpgradeAnswer::Removed(removed)) => {
                self.after_removal(&candidate, removed, error)
            }
            (Step::ForgetMarker { error, .. }, UpgradeAnswer::Retired(_)) => {
                // Cleared or not: the failure stands either way (a marker
                // left behind names no container until one is created
                // under its name, and the next attempt clears it then).
                self.release_or_fail(error)
            }
            (step @ (Step::SaveMarker { .. } | Step::SaveActive { .. }), answer) => {
                return self.on_switch_answer(name, step, command, answer);
            }
            (step, answer) => {
                panic!("answer {answer:?} does not answer {command:?} (step {step:?})")
            }
        })
    }

    /// The successor's verification went on by one answer: its next step.
    fn on_verification(
        &self,
        name: &ServiceName,
        mut verification: Verification,
        command: &UpgradeCommand,
        answer: UpgradeAnswer,
    ) -> Step {
        let progress = match answer {
            UpgradeAnswer::Inspected(inspected) => verification.inspected(inspected),
            UpgradeAnswer::Binds(read) => verification.binds(read),
            UpgradeAnswer::Probed(result) => verification.probed(result),
            answer => panic!("{answer:?} does not answer {command:?}"),
        };
        let candidate = verification.container().clone();
        match progress {
            Progress::Going => Step::Verify(verification),
            // Removed whatever went wrong: what was created must
            // not be left behind, not even on a spurious answer.
            Progress::Failed(error) => Step::Remove { candidate, error },
            Progress::Verified { started_at, binds }
                if self.active.services.contains_key(name) && !self.stop_first.contains(name) =>
            {
                Step::SaveMarker {
                    candidate,
                    started_at,
                    binds,
                }
            }
            Progress::Verified { started_at, binds } => Step::SaveActive {
                candidate,
                started_at,
                binds,
            },
        }
    }

    /// The switch of a verified successor: its marker saved, or ACTIVE.
    /// `None` once the service is done.
    fn on_switch_answer(
        &mut self,
        name: &ServiceName,
        step: Step,
        command: UpgradeCommand,
        answer: UpgradeAnswer,
    ) -> Option<Result<Step, TaskError>> {
        Some(match (step, answer) {
            (
                Step::SaveMarker {
                    candidate,
                    started_at,
                    binds,
                },
                UpgradeAnswer::MarkerSaved(result),
            ) => match result {
                // `stop-first` switched first: the service is done.
                Ok(()) if self.stop_first.contains(name) => return None,
                Ok(()) => Ok(Step::SaveActive {
                    candidate,
                    started_at,
                    binds,
                }),
                Err(e) => Err(self.fail(format!("save the retirement marker of {name}"), e.into())),
            },
            (
                Step::SaveActive {
                    candidate,
                    started_at,
                    binds,
                },
                UpgradeAnswer::ActiveSaved(result),
            ) => {
                let stop_first =
                    self.stop_first.contains(name) && self.active.services.contains_key(name);
                match result {
                    Ok(()) => {
                        let UpgradeCommand::SaveActive { record, .. } = command else {
                            unreachable!("ActiveSaved answers SaveActive")
                        };
                        self.switched.push((name.clone(), record));
                        if !stop_first {
                            return None;
                        }
                        // `stop-first` marks its predecessor only now: a
                        // marker on ACTIVE's stopped container, left by a
                        // crash, is cleared by the pass (R15), which would
                        // start it beside the running candidate. Held
                        // until then, it stays down.
                        Ok(Step::SaveMarker {
                            candidate,
                            started_at,
                            binds,
                        })
                    }
                    Err(e) => {
                        let error = self.fail(format!("switch ACTIVE of {name}"), e.into());
                        if stop_first {
                            Ok(Step::Unswitch { candidate, error })
                        } else {
                            Err(error)
                        }
                    }
                }
            }
            (step, answer) => {
                panic!("answer {answer:?} does not answer {command:?} (step {step:?})")
            }
        })
    }

    /// After removing a candidate: gone, a retirement marker naming it is
    /// forgotten and a `stop-first` predecessor may start again; perhaps
    /// still running, the marker and the hold stay (the next upgrade's
    /// sweep removes it first, then clears the hold).
    fn after_removal(
        &self,
        candidate: &ContainerId,
        removed: Result<(), RuntimeError>,
        error: TaskError,
    ) -> Result<Step, TaskError> {
        match removed {
            Ok(()) | Err(RuntimeError::NotFound) => {
                match self.markers.iter().find(|m| &m.container == candidate) {
                    Some(marker) => Ok(Step::ForgetMarker {
                        marker: marker.clone(),
                        error,
                    }),
                    None => self.release_or_fail(error),
                }
            }
            Err(_) => Err(error),
        }
    }

    /// Abandons the upgrade (the task lease or lock is no longer trusted):
    /// nothing more is issued; ACTIVE is as the last saved command left it.
    pub fn abandon(&mut self, why: Abandon) {
        self.outstanding = None;
        self.error
            .get_or_insert_with(|| TaskError::abandoned(&self.instance, why));
        // Mid-services (or mid-sweep, mid-retirement) the instance still
        // goes back to ready; elsewhere nothing more is issued.
        self.phase = if matches!(
            self.phase,
            Phase::Sweep | Phase::Services | Phase::Revert | Phase::Drop
        ) {
            Phase::Finish
        } else {
            Phase::Done
        };
    }

    /// The services an earlier run of this upgrade switched (found from
    /// their markers' way back), each with the predecessor a failure of
    /// this run puts back.
    pub fn resumed(&self) -> Vec<(ServiceName, ActiveService)> {
        self.switched[..self.resumed]
            .iter()
            .map(|(name, _)| (name.clone(), self.active.services[name].clone()))
            .collect()
    }

    /// Whether the services switched before a failure were put back.
    pub fn reverted(&self) -> bool {
        self.reverted
    }

    /// The services switched to their successors, or the error that
    /// stopped the upgrade with the services it had switched (put back:
    /// [`Self::reverted`]).
    pub fn into_report(self) -> Result<Vec<ServiceName>, (Vec<ServiceName>, TaskError)> {
        // What this run switched: an earlier run's are its own to report.
        let switched = self
            .switched
            .into_iter()
            .skip(self.resumed)
            .map(|(name, _)| name)
            .collect();
        match self.error {
            None => Ok(switched),
            Some(e) => Err((switched, e)),
        }
    }
}

impl MachineCommand for UpgradeCommand {
    fn is_effect(&self) -> bool {
        UpgradeCommand::is_effect(self)
    }
}

impl Machine for Upgrade {
    type Command = UpgradeCommand;
    type Answer = UpgradeAnswer;
    type Report = Result<Vec<ServiceName>, (Vec<ServiceName>, TaskError)>;

    fn poll_command(&mut self) -> Option<UpgradeCommand> {
        Upgrade::poll_command(self)
    }

    fn handle(&mut self, answer: UpgradeAnswer, now: Timestamp) {
        Upgrade::handle(self, answer, now)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Upgrade::poll_timeout(self)
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        Upgrade::handle_timeout(self, now)
    }

    fn abandon(&mut self, why: Abandon) {
        Upgrade::abandon(self, why)
    }

    fn into_report(self) -> Self::Report {
        Upgrade::into_report(self)
    }
}

/// The steps putting the switched services back, last switched first
/// (#40: an upgrade is all or nothing per instance). Per service, the
/// successor gets a `retirement-pending` marker with no way back before
/// ACTIVE names the predecessor again (a crash between the two leaves a
/// marker on ACTIVE's container, which the pass clears, and the successor
/// baking); the recovery pass then verifies and publishes the predecessor
/// and retires the successor, as after any upgrade. A service the new
/// version added has no predecessor: it leaves ACTIVE.
///
/// A `stop-first` successor is stopped before ACTIVE names its predecessor
/// again (never two on its volumes; a stop that fails ends the revert
/// there), and the predecessor's record (this upgrade's hold or marker) is
/// cleared after, so the pass starts it.
fn revert_plan(
    instance: &InstanceName,
    before: &ActiveRecord,
    holds: &[Inhibition],
    switched: &[(ServiceName, ActiveService)],
    stop_first: &BTreeSet<ServiceName>,
    stop_grace_default: Duration,
    now: Timestamp,
) -> VecDeque<UpgradeCommand> {
    let mut plan = VecDeque::new();
    for (service, successor) in switched.iter().rev() {
        let stop_first = stop_first.contains(service);
        plan.push_back(UpgradeCommand::SaveMarker(revert_marker(
            service, successor, stop_first, now,
        )));
        // (A service the upgrade added has no predecessor to start.)
        let stop_first = stop_first && before.services.contains_key(service);
        if stop_first {
            plan.push_back(UpgradeCommand::Retire(WorkCommand::Stop {
                generation: GenerationKey {
                    instance: instance.clone(),
                    service: service.clone(),
                    container: successor.container.clone(),
                },
                grace: successor.stop_grace.unwrap_or(stop_grace_default),
            }));
        }
        let Some(predecessor) = before.services.get(service) else {
            plan.push_back(UpgradeCommand::Retire(WorkCommand::RemoveActive(
                service.clone(),
            )));
            continue;
        };
        plan.push_back(UpgradeCommand::SaveActive {
            service: service.clone(),
            record: predecessor.clone(),
        });
        if stop_first {
            plan.push_back(UpgradeCommand::Retire(WorkCommand::ClearInhibition(
                Inhibition {
                    service: service.clone(),
                    container: predecessor.container.clone(),
                    reason: InhibitionReason::Hold(InhibitionReason::STOP_FIRST.to_owned()),
                    operation: "upgrade".into(),
                    created_at: now,
                    stop_grace: predecessor.stop_grace,
                    revert_to: None,
                },
            )));
        }
        if let Some(hold) = holds.iter().find(|h| h.container == predecessor.container) {
            // Its marker replaced the operator's hold: put it back.
            plan.push_back(UpgradeCommand::SaveMarker(hold.clone()));
        }
    }
    plan
}

/// The holds on ACTIVE's generations (with those a resumed service's
/// marker replaced), which their markers replace, and the retirement
/// markers. An interrupted upgrade's hold (`stop-first`, or a dropped
/// service's that the catalog lists again) is stead's, not an operator's:
/// the sweep clears it, nothing carries it forward.
fn records_of(input: &UpgradeInput, resumed: &[Resumed]) -> (Vec<Inhibition>, Vec<Inhibition>) {
    let holds = input
        .inhibitions
        .iter()
        .filter(|h| {
            h.reason != InhibitionReason::RetirementPending
                && !h.reason.is_upgrades()
                && input.active.names_container(&h.container)
        })
        .cloned()
        .chain(resumed.iter().filter_map(|r| r.hold.clone()))
        .collect();
    let markers = input
        .inhibitions
        .iter()
        .filter(|h| h.reason == InhibitionReason::RetirementPending)
        .cloned()
        .collect();
    (holds, markers)
}

/// ACTIVE as this upgrade found it: a resumed service's predecessor,
/// which a failure puts back, in place of its successor.
fn active_before(mut active: ActiveRecord, resumed: &[Resumed]) -> ActiveRecord {
    for r in resumed {
        active
            .services
            .insert(r.service.clone(), r.predecessor.clone());
    }
    active
}

/// A service an earlier run of this very upgrade switched: ACTIVE names
/// its successor at the target revision, and its predecessor, still there,
/// waits under this upgrade's marker with the way back (a bake window).
#[derive(Debug)]
struct Resumed {
    service: ServiceName,
    successor: ActiveService,
    predecessor: ActiveService,
    /// An operator's hold its marker replaced.
    hold: Option<Inhibition>,
}

/// The services an earlier run of this upgrade switched before it was
/// cut short, so that a failure of this run puts them back too (all or
/// nothing per instance, across crashes: the explorer's finding of #44).
/// Only where the way back was kept: without a bake window the pass
/// retires a predecessor as soon as its successor serves.
fn resumed_switches(input: &UpgradeInput) -> Vec<Resumed> {
    input
        .services
        .iter()
        .filter(|spec| !input.is_behind(spec))
        .filter_map(|spec| {
            let successor = input.active.services.get(&spec.name)?;
            let (marker, to) = input.inhibitions.iter().find_map(|m| {
                let to = m.revert_to.as_ref()?;
                (m.service == spec.name
                    && m.reason == InhibitionReason::RetirementPending
                    && m.operation == "upgrade"
                    && m.container != successor.container
                    && to.version == input.recorded_version
                    && !to.undone
                    && input.containers.iter().any(|(_, c)| *c == m.container))
                .then_some((m, to))
            })?;
            Some(Resumed {
                service: spec.name.clone(),
                successor: successor.clone(),
                predecessor: ActiveService {
                    container: marker.container.clone(),
                    effective_revision: to.revision.clone(),
                    binds: to.binds.clone(),
                    stop_grace: marker.stop_grace,
                    // Stopped while it baked: started and verified afresh.
                    verified_started_at: None,
                },
                hold: to.hold.as_ref().map(|hold| Inhibition {
                    reason: InhibitionReason::Hold(hold.clone()),
                    operation: "operator".into(),
                    revert_to: None,
                    ..marker.clone()
                }),
            })
        })
        .collect()
}

/// The reason of the hold on `container` among `holds`, if any.
pub(crate) fn hold_on(holds: &[Inhibition], container: &ContainerId) -> Option<String> {
    holds
        .iter()
        .find(|h| &h.container == container)
        .map(|h| h.reason.as_str().to_owned())
}

/// The marker a revert leaves on the successor it replaces: retired as
/// soon as the predecessor serves again, with no way back of its own.
pub(crate) fn revert_marker(
    service: &ServiceName,
    successor: &ActiveService,
    stop_first: bool,
    now: Timestamp,
) -> Inhibition {
    Inhibition {
        service: service.clone(),
        container: successor.container.clone(),
        reason: InhibitionReason::RetirementPending,
        // A `stop-first` successor mounts the service's volumes: kept, it
        // is one `docker start` from a second writer beside the live one
        // (#55). Its last lines are in the revert's event all the same.
        operation: if stop_first {
            crate::bake::REVERT_STOP_FIRST_OPERATION.into()
        } else {
            crate::bake::REVERT_OPERATION.into()
        },
        created_at: now,
        stop_grace: successor.stop_grace,
        revert_to: None,
    }
}

/// The steps removing every generation of a service the catalog still
/// lists that is neither ACTIVE's nor under a durable record (a
/// `retirement-pending` predecessor, which the recovery pass retires; an
/// operator's hold, which is theirs): a candidate a crashed or abandoned
/// upgrade left behind, at whatever revision. Stopped first, then removed.
/// Then every hold an interrupted upgrade left on a listed service
/// (`stop-first`; a dropped service's, listed again) is cleared: with no
/// candidate left, its generation may start again (one on a generation
/// ACTIVE no longer names goes with that generation).
fn sweeping_plan(input: &UpgradeInput) -> VecDeque<WorkCommand> {
    let mut plan = VecDeque::new();
    for spec in &input.services {
        let stray = strays(
            &spec.name,
            &input.active,
            &input.inhibitions,
            &input.containers,
            |h| !h.reason.is_upgrades(),
        );
        for container in stray {
            plan.extend(remove_generation(
                &input.instance,
                &spec.name,
                container,
                spec.stop_grace,
            ));
        }
        plan.extend(
            input
                .inhibitions
                .iter()
                .filter(|h| h.service == spec.name && h.reason.is_upgrades())
                .map(|hold| WorkCommand::ClearInhibition(hold.clone())),
        );
    }
    plan
}

/// The steps retiring every service the catalog's services no longer list:
/// ACTIVE's generation in the safe order (`retire_dropped_service`); then
/// every other container of the service the runtime still has (a
/// retirement-pending predecessor, a candidate a crashed upgrade left
/// behind), stopped and removed; then every hold left on the service
/// cleared. A service that only left holds or containers behind (a crash
/// after it left ACTIVE) is finished off the same way.
fn retiring_plan(input: &UpgradeInput) -> VecDeque<WorkCommand> {
    let listed = |service: &ServiceName| input.services.iter().any(|s| &s.name == service);
    let now = Timestamp::UNIX_EPOCH;
    let mut dropped: Vec<&ServiceName> = input
        .active
        .services
        .keys()
        .chain(input.inhibitions.iter().map(|h| &h.service))
        .chain(input.containers.iter().map(|(service, _)| service))
        .filter(|service| !listed(service))
        .collect();
    dropped.sort();
    dropped.dedup();
    let mut plan = VecDeque::new();
    for service in dropped {
        let active = input.active.services.get(service);
        if let Some(record) = active {
            let grace = record.stop_grace.unwrap_or(input.stop_grace_default);
            plan.extend(retire_dropped_service(
                &input.instance,
                service,
                record,
                grace,
                now,
            ));
        }
        for (_, container) in input
            .containers
            .iter()
            .filter(|(s, c)| s == service && active.is_none_or(|a| &a.container != c))
        {
            let grace = input
                .inhibitions
                .iter()
                .find(|h| &h.container == container)
                .and_then(|h| h.stop_grace)
                .unwrap_or(input.stop_grace_default);
            plan.extend(remove_generation(
                &input.instance,
                service,
                container,
                grace,
            ));
        }
        for hold in input.inhibitions.iter().filter(|h| &h.service == service) {
            let ours = active.is_some_and(|a| a.container == hold.container)
                && hold.reason.as_str() == InhibitionReason::SERVICE_DROPPED;
            if !ours {
                plan.push_back(WorkCommand::ClearInhibition(hold.clone()));
            }
        }
    }
    plan
}

impl MachineAnswer for UpgradeAnswer {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        UpgradeAnswer::port_failure(self)
    }
}
