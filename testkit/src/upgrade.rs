//! Drives one `Upgrade` (the overlap replacement, `core/upgrade.rs`) with
//! arbitrary answers and checks its safety properties (docs/rules.md C11, R15,
//! S1, S5):
//!
//! - ACTIVE is switched only to a successor this upgrade created, saw
//!   running, read the binds of, probed ready on those binds, and saw
//!   still running the same execution afterwards; the record carries that
//!   execution and those binds;
//! - a service ACTIVE already had gets its predecessor's
//!   `retirement-pending` marker saved before ACTIVE switches, naming the
//!   predecessor — so either the predecessor or a verified successor is
//!   always what ACTIVE names and what the pass may route;
//! - a removal only ever targets this upgrade's own candidate, never a
//!   container ACTIVE names;
//! - a `stop-first` service (#40) with a predecessor gets, before its
//!   successor is created, a `stop-first` hold on the predecessor, its
//!   route withdrawn and the predecessor stopped; ACTIVE switches before
//!   the predecessor's marker replaces the hold; the hold is cleared only
//!   when no candidate of it may run; a revert stops the successor before
//!   ACTIVE names the predecessor again, and clears its record after;
//! - the upgrade ends within its bound, and a completed one switched every
//!   service that was behind;
//! - a service ACTIVE names that the new version dropped is retired only
//!   after every listed service was switched, in the order hold, withdraw,
//!   stop, remove, release claims, drop from ACTIVE, clear the hold; no
//!   retirement step touches a listed service; and a completed upgrade
//!   dropped every such service from ACTIVE before recording its version.
//!
//! Shared by the cargo-fuzz target `upgrade` and by
//! `tests/upgrade_properties.rs` (as `stead_testkit::…`).

use std::collections::BTreeMap;
use std::time::Duration;

use stead::core::errors::{ProbeError, ProvisionError, StoreError};
use stead::core::fleet::InstanceState;
use stead::core::provision::{WorkAnswer, WorkCommand};
use stead::core::spec::{ReadinessProbe, ServiceSpec, UpdateStrategy};
use stead::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, ContainerStatus, Inhibition, InhibitionReason,
    InstanceName, Observation, RuntimeError, ServiceName, Timestamp,
};
use stead::core::upgrade::{
    Upgrade, UpgradeAnswer, UpgradeCommand, UpgradeInput, CANDIDATE_RUNNING_WAIT_MAX,
    UPGRADE_RETRY_INTERVAL,
};

use crate::machine::{base, binds, execution, OutcomeSeed};

/// One service of the catalog entry, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpgradeServiceSeed {
    /// `% 3` — 0: not in ACTIVE; 1: in ACTIVE at an old version; 2:
    /// already at the target version. `/ 3 % 2`: behind by spec, not by
    /// version. `/ 6 % 2`: replaced `stop-first` (#40).
    pub active: u8,
}

const SERVICES: [&str; 3] = ["web", "api", "worker"];
/// A fourth seed puts this service, which the catalog no longer lists,
/// into ACTIVE: the upgrade must retire it.
const DROPPED: &str = "legacy";
/// The dropped service's leftovers besides ACTIVE's generation.
const ORPHAN: &str = "legacy-candidate-of-a-crash";
const PREDECESSOR: &str = "legacy-predecessor";

/// Builds the input: up to three services; the instance stopped or not,
/// ready or already upgrading (a retried task).
pub fn upgrade_input(services: &[UpgradeServiceSeed], stopped: bool, ready: bool) -> UpgradeInput {
    let mut active = ActiveRecord::default();
    let mut specs = Vec::new();
    for (i, seed) in services.iter().take(SERVICES.len()).enumerate() {
        let name = ServiceName::new(SERVICES[i]);
        let spec = ServiceSpec {
            name: name.clone(),
            image: "img".into(),
            command: Vec::new(),
            ports: vec![8080],
            healthcheck: None,
            readiness: ReadinessProbe::None,
            stop_grace: Duration::from_secs(5),
            update: if (seed.active / 6) % 2 == 1 {
                UpdateStrategy::StopFirst
            } else {
                UpdateStrategy::Overlap
            },
            domains: Vec::new(),
            tenant_domains: false,
            run: Default::default(),
        };
        // Behind by version, behind by spec at the same version (another
        // spec's digest), or at the target revision already.
        let revision = match (seed.active % 3, (seed.active / 3) % 2) {
            (2, _) => spec.revision("2"),
            (_, 0) => spec.revision("1"),
            _ => "2.00000000".to_owned(),
        };
        specs.push(spec);
        if seed.active % 3 != 0 {
            active.services.insert(
                name,
                ActiveService {
                    container: ContainerId::new(format!("{}-old", SERVICES[i])),
                    effective_revision: revision,
                    binds: binds(1),
                    stop_grace: None,
                    verified_started_at: execution(1),
                },
            );
        }
    }
    let mut containers: Vec<(ServiceName, ContainerId)> = active
        .services
        .iter()
        .map(|(s, a)| (s.clone(), a.container.clone()))
        .collect();
    let mut inhibitions = Vec::new();
    if services
        .get(SERVICES.len())
        .is_some_and(|seed| seed.active % 3 != 0)
    {
        // A candidate a crashed upgrade left behind, and a predecessor
        // still marked for retirement: both go with the dropped service.
        for leftover in [ORPHAN, PREDECESSOR] {
            containers.push((ServiceName::new(DROPPED), ContainerId::new(leftover)));
        }
        inhibitions.push(stead::core::types::Inhibition {
            service: ServiceName::new(DROPPED),
            container: ContainerId::new(PREDECESSOR),
            reason: InhibitionReason::RetirementPending,
            operation: "upgrade".into(),
            created_at: Timestamp::UNIX_EPOCH,
            stop_grace: None,
            revert_to: None,
        });
        containers.push((
            ServiceName::new(DROPPED),
            ContainerId::new(format!("{DROPPED}-old")),
        ));
        active.services.insert(
            ServiceName::new(DROPPED),
            ActiveService {
                container: ContainerId::new(format!("{DROPPED}-old")),
                effective_revision: "1".into(),
                binds: binds(1),
                stop_grace: None,
                verified_started_at: execution(1),
            },
        );
    }
    UpgradeInput {
        inhibitions,
        containers,
        spec_digest: "digest".into(),
        recorded_spec_digest: Some("digest-1".into()),
        bake: Duration::from_secs(300),
        halted: false,
        pinned: false,
        broken: Default::default(),
        stop_grace_default: Duration::from_secs(10),
        instance: InstanceName::new("app"),
        stopped,
        state: if ready {
            InstanceState::Ready
        } else {
            InstanceState::Upgrading
        },
        version: "2".into(),
        recorded_version: "1".into(),
        services: specs,
        active,
        release: None,
    }
}

/// An answer of the right kind for `command`, picked by `seed`. Mostly
/// healthy (so upgrades do complete), with every failure reachable.
fn answer_for(command: &UpgradeCommand, seed: &OutcomeSeed) -> UpgradeAnswer {
    let fails = seed.choice.is_multiple_of(8);
    match command {
        UpgradeCommand::Create { spec, .. } => UpgradeAnswer::Created(if fails {
            Err(RuntimeError::Transient("pull failed".into()))
        } else {
            Ok(ContainerId::new(format!("{}-new", spec.name)))
        }),
        UpgradeCommand::Inspect(_) => UpgradeAnswer::Inspected(match seed.choice % 16 {
            0 => Err(RuntimeError::NotFound),
            1 => Err(RuntimeError::Transient("timeout".into())),
            2 => Ok(Observation {
                status: ContainerStatus::Exited,
                started_at: execution(seed.execution),
                exit: None,
            }),
            3 => Ok(Observation {
                status: ContainerStatus::Starting,
                started_at: None,
                exit: None,
            }),
            _ => Ok(Observation {
                status: ContainerStatus::Running,
                // Mostly one execution, so confirmations often match.
                started_at: if seed.execution < 200 {
                    execution(2)
                } else {
                    execution(seed.execution)
                },
                exit: None,
            }),
        }),
        UpgradeCommand::UpgradeRelease(_) | UpgradeCommand::RollBackRelease(_) => {
            UpgradeAnswer::ReleaseUpgraded(if fails {
                Err(ProvisionError::Failed("rolled back".into()))
            } else {
                Ok(())
            })
        }
        UpgradeCommand::ReadBinds(_) => UpgradeAnswer::Binds(if fails {
            Err(RuntimeError::Transient("timeout".into()))
        } else {
            Ok(binds(seed.binds))
        }),
        UpgradeCommand::Probe { .. } => UpgradeAnswer::Probed(if fails {
            Err(ProbeError::Unreachable("connection refused".into()))
        } else {
            Ok(())
        }),
        UpgradeCommand::RemoveCandidate(_) => UpgradeAnswer::Removed(Ok(())),
        UpgradeCommand::SaveMarker(_) => UpgradeAnswer::MarkerSaved(if fails {
            Err(StoreError::Unavailable("store down".into()))
        } else {
            Ok(())
        }),
        UpgradeCommand::SaveActive { .. } => UpgradeAnswer::ActiveSaved(if fails {
            Err(StoreError::Unavailable("store down".into()))
        } else {
            Ok(())
        }),
        UpgradeCommand::Retire(step) => UpgradeAnswer::Retired(match step {
            WorkCommand::Stop { .. } => WorkAnswer::Stopped(match seed.choice % 16 {
                0 => Err(RuntimeError::NotFound),
                1 => Err(RuntimeError::Transient("timeout".into())),
                _ => Ok(()),
            }),
            WorkCommand::Remove(_) => WorkAnswer::Removed(if fails {
                Err(RuntimeError::Transient("timeout".into()))
            } else {
                Ok(())
            }),
            _ => WorkAnswer::Done(if fails {
                Err(StoreError::Unavailable("store down".into()).into())
            } else {
                Ok(())
            }),
        }),
        UpgradeCommand::MoveState { .. } => UpgradeAnswer::StateMoved(if seed.choice % 16 == 5 {
            Err(StoreError::Conflict("changed state concurrently".into()))
        } else {
            Ok(())
        }),
        UpgradeCommand::SetVersion { .. } => UpgradeAnswer::VersionSet(if seed.choice % 16 == 6 {
            Err(StoreError::Unavailable("store down".into()))
        } else {
            Ok(())
        }),
    }
}

/// What the upgrade verified of one service's candidate so far.
#[derive(Default)]
struct Seen {
    candidate: Option<ContainerId>,
    running: Option<Timestamp>,
    binds: Option<Binds>,
    probed: bool,
    confirmed: bool,
    marker_saved: bool,
}

/// Runs the upgrade over `answers` (cycled) and panics on any violated
/// property. Returns how many services were switched.
pub fn run_upgrade_and_check(input: &UpgradeInput, answers: &[OutcomeSeed]) -> usize {
    let default = OutcomeSeed::default();
    run_upgrade_and_check_with(input, |_, command, issued, reverting| {
        let seed = if answers.is_empty() || reverting {
            &default
        } else {
            &answers[(issued - 1) % answers.len()]
        };
        Some(answer_for(command, seed))
    })
    .expect("no crash")
}

/// Runs the upgrade, answering each command with what `answer` gives
/// (it sees the machine, for the exhaustive explorer's state count, the
/// number of commands issued so far and whether the command is a step of
/// putting back what it switched, other than a `stop-first` one), and panics on any violated property. `None`
/// from `answer` is a crash of the driver after the command took effect,
/// before its answer came: the run stops there, without the end-of-run
/// checks, and returns `None`. Otherwise returns how many services were
/// switched.
pub fn run_upgrade_and_check_with(
    input: &UpgradeInput,
    mut answer: impl FnMut(&Upgrade, &UpgradeCommand, usize, bool) -> Option<UpgradeAnswer>,
) -> Option<usize> {
    let mut upgrade = Upgrade::new(input.clone());
    // What an earlier run of this upgrade switched: a failure of this run
    // puts them back too (all or nothing across runs), each to the
    // predecessor its marker's way back names.
    let resumed: BTreeMap<ServiceName, ActiveService> = upgrade.resumed().into_iter().collect();
    let tries =
        (CANDIDATE_RUNNING_WAIT_MAX.as_millis() / UPGRADE_RETRY_INTERVAL.as_millis()) as usize;
    let bound = input.services.len() * (tries + 8) + 3 + 7 + 5;
    // Stops, removals and clears of the dropped services' other
    // generations, by container.
    let mut leftovers: BTreeMap<ContainerId, Vec<&'static str>> = BTreeMap::new();
    let dropped: Vec<&ServiceName> = input
        .active
        .services
        .keys()
        .filter(|name| !input.services.iter().any(|spec| &spec.name == *name))
        .collect();
    // Per dropped service, the retirement steps seen so far, in order.
    let mut retired: BTreeMap<ServiceName, Vec<&'static str>> = BTreeMap::new();
    let mut seen: BTreeMap<ServiceName, Seen> = BTreeMap::new();
    let mut in_hand: Option<ServiceName> = None;
    let mut switched = Vec::new();
    let mut issued = 0usize;
    // What the sweep did to each stray container.
    let mut swept: BTreeMap<ContainerId, Vec<&'static str>> = BTreeMap::new();
    let mut began = input.state != InstanceState::Ready;
    let mut version_set = false;
    let mut finished = false;
    let mut first = true;
    // #40: once a later service failed, the switched ones are put back.
    let mut reverting = false;
    let mut revert_marked: Vec<ServiceName> = Vec::new();
    let mut restored: Vec<ServiceName> = Vec::new();
    // #40 stop-first: what was done to each such service, in order.
    let mut stop_first = StopFirstSeen::default();
    loop {
        let Some(command) = upgrade.poll_command() else {
            if upgrade.poll_timeout().is_some() {
                upgrade.handle_timeout(base());
                continue;
            }
            break;
        };
        issued += 1;
        assert!(
            issued <= bound,
            "the upgrade issued more than {bound} commands"
        );
        assert!(
            !input.stopped,
            "a stopped instance's upgrade issued {command:?} (S3)"
        );
        assert!(
            !finished,
            "a command after the instance went back to ready: {command:?}"
        );
        if first && input.state == InstanceState::Ready {
            assert!(
                matches!(
                    command,
                    UpgradeCommand::MoveState {
                        to: InstanceState::Upgrading,
                        ..
                    }
                ),
                "a ready instance is marked upgrading first, not {command:?}"
            );
        }
        first = false;
        if let UpgradeCommand::Retire(step) = &command {
            if let Some(kind) = sweep_step(input, step).filter(|_| seen.is_empty()) {
                // What an interrupted upgrade left of a listed service (a
                // candidate, a hold of its own), tidied before any
                // candidate is created: never ACTIVE's container nor one a
                // marker or an operator's hold keeps; stopped before it is
                // removed.
                let answer = answer(&upgrade, &command, issued, false)?;
                if let (Some(container), UpgradeAnswer::Retired(answered)) =
                    (kind.container(), &answer)
                {
                    let done = swept.entry(container.clone()).or_default();
                    if matches!(kind, Sweep::Remove(_)) {
                        assert!(
                            done.contains(&"stop"),
                            "swept {container} before stopping it"
                        );
                    }
                    if matches!(
                        answered,
                        WorkAnswer::Stopped(Ok(()) | Err(RuntimeError::NotFound))
                    ) {
                        done.push("stop");
                    }
                }
                upgrade.handle(answer, base());
                continue;
            }
            if let WorkCommand::ClearInhibition(marker) = step {
                // A candidate the create adopted under an earlier attempt's
                // retirement marker (names are by revision) was removed:
                // its marker goes with it (#40, simulation seed 424).
                let removed_candidate =
                    seen.get(&marker.service).and_then(|s| s.candidate.as_ref())
                        == Some(&marker.container);
                if marker.reason == InhibitionReason::RetirementPending
                    && removed_candidate
                    && input.inhibitions.contains(marker)
                {
                    let answer = answer(&upgrade, &command, issued, false)?;
                    upgrade.handle(answer, base());
                    continue;
                }
            }
            if let Some(service) = listed_service(input, step) {
                stop_first.check(input, &service, step, &seen, &switched, &restored);
                let answer = answer(&upgrade, &command, issued, false)?;
                if let UpgradeAnswer::Retired(answered) = &answer {
                    stop_first.done(&service, step, answered, &seen);
                }
                upgrade.handle(answer, base());
                continue;
            }
        }
        if let UpgradeCommand::SaveMarker(marker) = &command {
            if reverts(marker) {
                reverting = true;
            }
        }
        if reverting && !matches!(command, UpgradeCommand::MoveState { .. }) {
            match &command {
                UpgradeCommand::SaveMarker(hold) if !reverts(hold) => {
                    let resumed_predecessor = resumed
                        .get(&hold.service)
                        .is_some_and(|p| p.container == hold.container);
                    assert!(
                        (input.inhibitions.contains(hold) || resumed_predecessor)
                            && restored.contains(&hold.service)
                            && (input.active.names_container(&hold.container)
                                || resumed_predecessor),
                        "while reverting, only a put-back predecessor's own hold is saved \
                         again: {hold:?}"
                    );
                }
                UpgradeCommand::SaveMarker(marker) => {
                    assert!(
                        switched.contains(&marker.service) || resumed.contains_key(&marker.service),
                        "a revert marker on {}, which was not switched",
                        marker.service
                    );
                    let successor = match seen.get(&marker.service) {
                        Some(seen) => seen.candidate.as_ref(),
                        None => input
                            .active
                            .services
                            .get(&marker.service)
                            .map(|a| &a.container),
                    };
                    assert_eq!(
                        Some(&marker.container),
                        successor,
                        "the revert marker must name the successor"
                    );
                    assert_eq!(
                        marker.revert_to, None,
                        "a reverted successor has no way back"
                    );
                    revert_marked.push(marker.service.clone());
                }
                UpgradeCommand::SaveActive { service, record } => {
                    assert!(
                        revert_marked.contains(service),
                        "ACTIVE of {service} put back before its successor's marker"
                    );
                    assert!(
                        !is_stop_first(input, service)
                            || stop_first.successor_stopped.contains(service),
                        "ACTIVE of stop-first {service} put back while its successor may run"
                    );
                    assert_eq!(
                        Some(record),
                        resumed
                            .get(service)
                            .or_else(|| input.active.services.get(service)),
                        "a revert puts back exactly the predecessor's record"
                    );
                    restored.push(service.clone());
                }
                UpgradeCommand::Retire(WorkCommand::RemoveActive(service)) => {
                    assert!(revert_marked.contains(service));
                    assert!(
                        !input.active.services.contains_key(service),
                        "{service} had a predecessor to put back"
                    );
                    restored.push(service.clone());
                }
                other => panic!("{other:?} while reverting"),
            }
            let answer = answer(&upgrade, &command, issued, true)?;
            upgrade.handle(answer, base());
            continue;
        }
        match &command {
            UpgradeCommand::MoveState {
                to: InstanceState::Ready,
                ..
            } => finished = true,
            UpgradeCommand::MoveState { .. } => {}
            UpgradeCommand::SetVersion { version: v, .. } => {
                assert_eq!(v, &input.version);
                let behind = input
                    .services
                    .iter()
                    .filter(|spec| input.is_behind(spec))
                    .count();
                assert_eq!(
                    switched.len(),
                    behind,
                    "the version recorded before every service was switched"
                );
                for service in &dropped {
                    assert_eq!(
                        retired.get(*service).map(Vec::as_slice),
                        Some(RETIREMENT.as_slice()),
                        "the version recorded before dropped {service} was retired"
                    );
                }
                version_set = true;
            }
            _ => assert!(
                began,
                "{command:?} before the instance was marked upgrading"
            ),
        }
        match &command {
            UpgradeCommand::Create {
                spec,
                version,
                revision,
            } => {
                assert_eq!(version, &input.version);
                assert_eq!(revision, &spec.revision(&input.version));
                if is_stop_first(input, &spec.name)
                    && input.active.services.contains_key(&spec.name)
                {
                    assert!(
                        stop_first.held.contains(&spec.name)
                            && stop_first.withdrawn.contains(&spec.name)
                            && stop_first.stopped.contains(&spec.name),
                        "the successor of stop-first {} created before its predecessor was \
                         held, withdrawn and stopped",
                        spec.name
                    );
                }
                assert!(
                    input.is_behind(spec),
                    "replaced {} which is already at the target version",
                    spec.name
                );
                in_hand = Some(spec.name.clone());
                seen.insert(spec.name.clone(), Seen::default());
            }
            UpgradeCommand::Retire(step) if is_leftover(input, step) => {
                let (service, container, kind) = leftover_step(step);
                assert!(
                    !input.services.iter().any(|spec| spec.name == service),
                    "a leftover of {service}, which the catalog lists, touched: {step:?}"
                );
                assert!(
                    input
                        .containers
                        .contains(&(service.clone(), container.clone()))
                        || kind == "clear hold",
                    "{kind} of {container}, which the runtime did not list for {service}"
                );
                assert_eq!(
                    retired
                        .get(&service)
                        .map(Vec::len)
                        .unwrap_or(RETIREMENT.len()),
                    RETIREMENT.len(),
                    "{kind} of {container} before ACTIVE's generation of {service} was retired"
                );
                let done = leftovers.entry(container.clone()).or_default();
                if kind == "remove" {
                    assert_eq!(
                        done.as_slice(),
                        ["stop"],
                        "{container} removed before it was stopped"
                    );
                }
                if kind == "clear hold" {
                    assert!(
                        !input
                            .containers
                            .contains(&(service.clone(), container.clone()))
                            || done.as_slice() == ["stop", "remove"],
                        "the hold on {container} cleared while it may still run"
                    );
                }
            }
            UpgradeCommand::Retire(step) => {
                let (service, kind) = retirement_step(step);
                assert!(
                    dropped.contains(&&service),
                    "a retirement step for {service}, which the catalog lists: {step:?}"
                );
                let behind = input
                    .services
                    .iter()
                    .filter(|spec| input.is_behind(spec))
                    .count();
                assert_eq!(
                    switched.len(),
                    behind,
                    "{service} retired before every listed service was switched"
                );
                let done = retired.entry(service.clone()).or_default();
                assert_eq!(
                    RETIREMENT.get(done.len()),
                    Some(&kind),
                    "retirement of {service} out of order: {kind} after {done:?}"
                );
                if let WorkCommand::Stop { generation, .. } | WorkCommand::Remove(generation) = step
                {
                    assert_eq!(
                        Some(&generation.container),
                        input.active.services.get(&service).map(|a| &a.container),
                        "a retirement step aimed at another container than ACTIVE's {service}"
                    );
                }
            }
            UpgradeCommand::RemoveCandidate(generation) => {
                assert!(
                    !input.active.names_container(&generation.container),
                    "removed ACTIVE's container {}",
                    generation.container
                );
                let s = &seen[&generation.service];
                assert_eq!(
                    s.candidate.as_ref(),
                    Some(&generation.container),
                    "removed something it did not create"
                );
            }
            UpgradeCommand::SaveMarker(marker) => {
                let current = &input.active.services[&marker.service];
                assert_eq!(
                    marker.container, current.container,
                    "the marker must name the predecessor"
                );
                let back = marker.revert_to.as_ref().filter(|_| !input.bake.is_zero());
                assert_eq!(
                    back.map(|b| (&b.revision, &b.binds, &b.version, &b.spec_digest)),
                    (!input.bake.is_zero()).then_some((
                        &current.effective_revision,
                        &current.binds,
                        &input.recorded_version,
                        &input.recorded_spec_digest
                    )),
                    "a baking upgrade's marker carries the predecessor's way back"
                );
                assert_eq!(marker.reason, InhibitionReason::RetirementPending);
                assert!(
                    seen[&marker.service].confirmed,
                    "marker saved before the successor was verified"
                );
                if is_stop_first(input, &marker.service) {
                    assert!(
                        switched.contains(&marker.service),
                        "the marker of stop-first {} replaced its hold before ACTIVE switched",
                        marker.service
                    );
                    assert!(
                        back.is_none_or(|b| b.stop_first),
                        "the way back of stop-first {} does not say so",
                        marker.service
                    );
                }
            }
            UpgradeCommand::SaveActive { service, record } => {
                let s = &seen[service];
                assert!(
                    s.confirmed,
                    "ACTIVE switched to an unverified successor of {service}"
                );
                assert_eq!(Some(&record.container), s.candidate.as_ref());
                assert_eq!(record.verified_started_at, s.running);
                assert_eq!(Some(&record.binds), s.binds.as_ref());
                assert_eq!(
                    record.effective_revision,
                    input
                        .services
                        .iter()
                        .find(|spec| &spec.name == service)
                        .expect("a listed service")
                        .revision(&input.version)
                );
                if input.active.services.contains_key(service) && is_stop_first(input, service) {
                    assert!(
                        stop_first.stopped.contains(service),
                        "ACTIVE of stop-first {service} switched before its predecessor stopped"
                    );
                } else if input.active.services.contains_key(service) {
                    assert!(
                        s.marker_saved,
                        "ACTIVE of {service} switched before its predecessor's marker was saved"
                    );
                }
            }
            _ => {}
        }
        let answer = answer(&upgrade, &command, issued, false)?;
        if let UpgradeCommand::MoveState {
            to: InstanceState::Upgrading,
            ..
        } = &command
        {
            began = matches!(answer, UpgradeAnswer::StateMoved(Ok(())));
        }
        if let (UpgradeCommand::Retire(step), UpgradeAnswer::Retired(answered)) =
            (&command, &answer)
        {
            let ok = match answered {
                WorkAnswer::Stopped(r) => matches!(r, Ok(()) | Err(RuntimeError::NotFound)),
                WorkAnswer::Removed(r) => r.is_ok(),
                WorkAnswer::Done(r) => r.is_ok(),
                _ => false,
            };
            if is_leftover(input, step) {
                let (_, container, kind) = leftover_step(step);
                if ok {
                    leftovers.entry(container).or_default().push(kind);
                }
            } else {
                let (service, _) = retirement_step(step);
                if ok {
                    retired
                        .entry(service)
                        .or_default()
                        .push(retirement_step(step).1);
                } else {
                    // The step failed: it is not done (the upgrade stops here).
                    retired.entry(service).or_default();
                }
            }
        }
        if matches!(
            command,
            UpgradeCommand::MoveState { .. }
                | UpgradeCommand::SetVersion { .. }
                | UpgradeCommand::Retire(_)
        ) {
            upgrade.handle(answer, base());
            continue;
        }
        let service = in_hand.clone().expect("a service in hand");
        if let (UpgradeCommand::RemoveCandidate(_), UpgradeAnswer::Removed(r)) = (&command, &answer)
        {
            if matches!(r, Ok(()) | Err(RuntimeError::NotFound)) {
                stop_first.candidate_gone.insert(service.clone());
            }
        }
        let s = seen.get_mut(&service).expect("seen");
        match (&command, &answer) {
            (UpgradeCommand::Create { .. }, UpgradeAnswer::Created(Ok(id))) => {
                s.candidate = Some(id.clone())
            }
            (UpgradeCommand::Inspect(_), UpgradeAnswer::Inspected(Ok(obs))) => {
                if s.probed {
                    s.confirmed =
                        obs.status == ContainerStatus::Running && obs.started_at == s.running;
                } else if obs.status == ContainerStatus::Running && obs.started_at.is_some() {
                    s.running = obs.started_at;
                }
            }
            (UpgradeCommand::ReadBinds(_), UpgradeAnswer::Binds(Ok(b))) => {
                s.binds = Some(b.clone())
            }
            (UpgradeCommand::Probe { target, .. }, UpgradeAnswer::Probed(Ok(()))) => {
                assert_eq!(
                    Some(&target.binds),
                    s.binds.as_ref(),
                    "probed other binds than were read"
                );
                assert_eq!(
                    (Some(&target.container), target.started_at),
                    (s.candidate.as_ref(), s.running),
                    "probed another execution than the candidate's seen running"
                );
                s.probed = true;
            }
            (UpgradeCommand::SaveMarker(_), UpgradeAnswer::MarkerSaved(Ok(()))) => {
                s.marker_saved = true
            }
            (UpgradeCommand::SaveMarker(marker), UpgradeAnswer::MarkerSaved(Err(_)))
                if is_stop_first(input, &marker.service) =>
            {
                // After the switch: the upgrade fails there, and puts
                // back what it switched, this service too.
                stop_first.marker_failed = true;
            }
            (UpgradeCommand::SaveActive { service, .. }, UpgradeAnswer::ActiveSaved(Ok(()))) => {
                switched.push(service.clone())
            }
            _ => {}
        }
        upgrade.handle(answer, base());
    }
    match upgrade.into_report() {
        Ok(done) if input.stopped => {
            assert!(done.is_empty());
            Some(0)
        }
        Ok(done) => {
            assert!(version_set, "a completed upgrade recorded its version");
            assert!(
                finished,
                "a completed upgrade returned the instance to ready"
            );
            assert_eq!(done, switched);
            let behind = input
                .services
                .iter()
                .filter(|spec| input.is_behind(spec))
                .count();
            assert_eq!(
                done.len(),
                behind,
                "a completed upgrade switched every service behind"
            );
            for service in &dropped {
                assert_eq!(
                    retired.get(*service).map(Vec::as_slice),
                    Some(RETIREMENT.as_slice()),
                    "a completed upgrade retired dropped {service} fully"
                );
            }
            for (service, container) in &input.containers {
                if dropped.contains(&service) && !input.active.names_container(container) {
                    let steps = leftovers
                        .get(container)
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    assert!(
                        steps.starts_with(&["stop", "remove"]),
                        "a completed upgrade left {container} of dropped {service}: {steps:?}"
                    );
                }
            }
            for hold in &input.inhibitions {
                if dropped.contains(&&hold.service) {
                    assert!(
                        leftovers
                            .get(&hold.container)
                            .is_some_and(|steps| steps.contains(&"clear hold")),
                        "a completed upgrade left the hold on {}",
                        hold.container
                    );
                }
            }
            Some(done.len())
        }
        Err((done, _)) => {
            assert_eq!(done, switched);
            let behind = input
                .services
                .iter()
                .filter(|spec| input.is_behind(spec))
                .count();
            if !finished || (done.len() == behind && !stop_first.marker_failed) {
                // Abandoned before the end (nothing more was issued), or
                // failed after every service was switched (retiring a
                // dropped one, recording the version): the new version
                // serves whole and the task is retried.
                assert!(restored.is_empty(), "put back a whole new version");
                return Some(done.len());
            }
            let mut put_back = restored.clone();
            put_back.sort();
            let mut all = switched.clone();
            all.extend(resumed.keys().cloned());
            all.sort();
            if stop_first.revert_cut {
                // A stop-first successor that may still run keeps ACTIVE.
                assert!(put_back.iter().all(|s| all.contains(s)));
            } else {
                assert_eq!(
                    put_back, all,
                    "a failed upgrade puts back every service it switched (all or nothing)"
                );
            }
            Some(done.len())
        }
    }
}

/// Whether the catalog replaces `service` `stop-first`.
fn is_stop_first(input: &UpgradeInput, service: &ServiceName) -> bool {
    input
        .services
        .iter()
        .any(|spec| &spec.name == service && spec.update == UpdateStrategy::StopFirst)
}

/// A sweep's step: what an interrupted upgrade left of a listed service.
enum Sweep<'a> {
    Stop(&'a ContainerId),
    Remove(&'a ContainerId),
    ClearHold,
}

impl Sweep<'_> {
    fn container(&self) -> Option<&ContainerId> {
        match self {
            Sweep::Stop(c) | Sweep::Remove(c) => Some(c),
            Sweep::ClearHold => None,
        }
    }
}

/// Whether `marker` is one a revert puts on the successor it took a
/// service away from (`revert`, or `revert-stop-first`: not kept, #55).
pub fn reverts(marker: &Inhibition) -> bool {
    marker.operation == "revert" || marker.operation == "revert-stop-first"
}

/// Whether `hold` is one an upgrade sets (`stop-first`, a dropped
/// service's), not an operator's.
fn upgrades_hold(hold: &Inhibition) -> bool {
    matches!(&hold.reason, InhibitionReason::Hold(r)
        if r == InhibitionReason::STOP_FIRST || r == InhibitionReason::SERVICE_DROPPED)
}

/// `step`, if it is a sweep's: the stop or removal of a container of a
/// listed service that the runtime lists and that neither ACTIVE nor any
/// marker or operator's hold names (a candidate a crash left behind), or
/// the clearing of an upgrade's own hold the input carries.
fn sweep_step<'a>(input: &UpgradeInput, step: &'a WorkCommand) -> Option<Sweep<'a>> {
    let listed = |service: &ServiceName| input.services.iter().any(|s| &s.name == service);
    let stray = |service: &ServiceName, container: &ContainerId| {
        listed(service)
            && input
                .containers
                .contains(&(service.clone(), container.clone()))
            && !input.active.names_container(container)
            && !input
                .inhibitions
                .iter()
                .any(|h| &h.container == container && !upgrades_hold(h))
    };
    match step {
        WorkCommand::Stop { generation, .. }
            if stray(&generation.service, &generation.container) =>
        {
            Some(Sweep::Stop(&generation.container))
        }
        WorkCommand::Remove(generation) if stray(&generation.service, &generation.container) => {
            Some(Sweep::Remove(&generation.container))
        }
        WorkCommand::ClearInhibition(hold)
            if listed(&hold.service) && upgrades_hold(hold) && input.inhibitions.contains(hold) =>
        {
            Some(Sweep::ClearHold)
        }
        _ => None,
    }
}

/// The listed service a teardown step touches, if it touches one: only a
/// `stop-first` replacement (or its revert) does; the input has no stray
/// generations of listed services and no holds on them to sweep.
fn listed_service(input: &UpgradeInput, step: &WorkCommand) -> Option<ServiceName> {
    let service = match step {
        WorkCommand::Inhibit(hold) | WorkCommand::ClearInhibition(hold) => hold.service.clone(),
        WorkCommand::Withdraw(key) => key.service.clone(),
        WorkCommand::Stop { generation, .. } | WorkCommand::Remove(generation) => {
            generation.service.clone()
        }
        _ => return None,
    };
    input
        .services
        .iter()
        .any(|spec| spec.name == service)
        .then_some(service)
}

/// What a `stop-first` replacement did, per service (#40).
#[derive(Default)]
struct StopFirstSeen {
    held: std::collections::BTreeSet<ServiceName>,
    withdrawn: std::collections::BTreeSet<ServiceName>,
    /// The predecessor stopped (or found gone).
    stopped: std::collections::BTreeSet<ServiceName>,
    /// The candidate removed (or found gone).
    candidate_gone: std::collections::BTreeSet<ServiceName>,
    /// A revert stopped the successor.
    successor_stopped: std::collections::BTreeSet<ServiceName>,
    /// A revert could not stop a successor: it ends there, that service
    /// and those after it left switched (baking under their markers).
    revert_cut: bool,
    /// A `stop-first` predecessor's marker, saved after the switch, failed.
    marker_failed: bool,
}

impl StopFirstSeen {
    fn check(
        &self,
        input: &UpgradeInput,
        service: &ServiceName,
        step: &WorkCommand,
        seen: &BTreeMap<ServiceName, Seen>,
        switched: &[ServiceName],
        restored: &[ServiceName],
    ) {
        assert!(
            is_stop_first(input, service),
            "{step:?} touches {service}, which is replaced by overlap"
        );
        let predecessor = input.active.services.get(service).map(|a| &a.container);
        let candidate = seen.get(service).and_then(|s| s.candidate.as_ref());
        match step {
            WorkCommand::Inhibit(hold) => {
                assert!(hold.reason.is_stop_first(), "{hold:?}");
                assert_eq!(Some(&hold.container), predecessor, "held another container");
                assert!(candidate.is_none(), "held after the candidate was created");
            }
            WorkCommand::Withdraw(_) => {
                assert!(
                    self.held.contains(service),
                    "{service} withdrawn before it was held"
                );
            }
            WorkCommand::Stop { generation, .. } if Some(&generation.container) == predecessor => {
                assert!(
                    self.withdrawn.contains(service),
                    "the predecessor of {service} stopped while routed"
                );
            }
            WorkCommand::Stop { generation, .. } => {
                assert_eq!(Some(&generation.container), candidate, "stopped a stranger");
                assert!(
                    switched.contains(service),
                    "a revert stopped {service}, which was not switched"
                );
            }
            WorkCommand::ClearInhibition(record) if restored.contains(service) => {
                assert_eq!(Some(&record.container), predecessor);
            }
            WorkCommand::ClearInhibition(hold) => {
                assert!(hold.reason.is_stop_first(), "cleared {hold:?}");
                assert!(
                    candidate.is_none() || self.candidate_gone.contains(service),
                    "the hold on {service}'s predecessor cleared while its candidate may run"
                );
                assert!(
                    !switched.contains(service),
                    "cleared the hold of a switched service"
                );
            }
            other => panic!("{other:?} of listed service {service}"),
        }
    }

    fn done(
        &mut self,
        service: &ServiceName,
        step: &WorkCommand,
        answered: &WorkAnswer,
        seen: &BTreeMap<ServiceName, Seen>,
    ) {
        let ok = match answered {
            WorkAnswer::Stopped(r) => matches!(r, Ok(()) | Err(RuntimeError::NotFound)),
            WorkAnswer::Done(r) => r.is_ok(),
            _ => false,
        };
        let candidate = seen.get(service).and_then(|s| s.candidate.as_ref());
        if !ok {
            if matches!(step, WorkCommand::Stop { generation, .. } if Some(&generation.container) == candidate)
            {
                self.revert_cut = true;
            }
            return;
        }
        let into = match step {
            WorkCommand::Inhibit(_) => &mut self.held,
            WorkCommand::Withdraw(_) => &mut self.withdrawn,
            WorkCommand::Stop { generation, .. } if Some(&generation.container) == candidate => {
                &mut self.successor_stopped
            }
            WorkCommand::Stop { .. } => &mut self.stopped,
            _ => return,
        };
        into.insert(service.clone());
    }
}

/// The retirement of a dropped service, step by step, in its only order.
const RETIREMENT: [&str; 7] = [
    "hold",
    "withdraw",
    "stop",
    "remove",
    "release claims",
    "drop from ACTIVE",
    "clear hold",
];

/// The service a retirement step is about, and which step it is.
fn retirement_step(step: &WorkCommand) -> (ServiceName, &'static str) {
    match step {
        WorkCommand::Withdraw(key) => (key.service.clone(), "withdraw"),
        WorkCommand::Inhibit(hold) => {
            assert_eq!(hold.reason.as_str(), InhibitionReason::SERVICE_DROPPED);
            (hold.service.clone(), "hold")
        }
        WorkCommand::Stop { generation, .. } => (generation.service.clone(), "stop"),
        WorkCommand::Remove(generation) => (generation.service.clone(), "remove"),
        WorkCommand::ReleaseClaims(container) => (
            ServiceName::new(
                container
                    .as_str()
                    .strip_suffix("-old")
                    .expect("the test's containers are named <service>-old"),
            ),
            "release claims",
        ),
        WorkCommand::RemoveActive(service) => (service.clone(), "drop from ACTIVE"),
        WorkCommand::ClearInhibition(hold) => (hold.service.clone(), "clear hold"),
        other => panic!("not a retirement step: {other:?}"),
    }
}

/// Whether a retirement step is about a generation of a dropped service
/// other than ACTIVE's, or a hold other than the retirement's own.
fn is_leftover(input: &UpgradeInput, step: &WorkCommand) -> bool {
    match step {
        WorkCommand::Stop { generation, .. } | WorkCommand::Remove(generation) => {
            !input.active.names_container(&generation.container)
        }
        WorkCommand::ClearInhibition(hold) => {
            hold.reason.as_str() != InhibitionReason::SERVICE_DROPPED
        }
        _ => false,
    }
}

/// A leftover step's service, container and kind.
fn leftover_step(step: &WorkCommand) -> (ServiceName, ContainerId, &'static str) {
    match step {
        WorkCommand::Stop { generation, .. } => (
            generation.service.clone(),
            generation.container.clone(),
            "stop",
        ),
        WorkCommand::Remove(generation) => (
            generation.service.clone(),
            generation.container.clone(),
            "remove",
        ),
        WorkCommand::ClearInhibition(hold) => {
            (hold.service.clone(), hold.container.clone(), "clear hold")
        }
        other => panic!("not a leftover step: {other:?}"),
    }
}
