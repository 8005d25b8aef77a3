//! Property tests of the provisioning and deprovisioning machines
//! (`core/provision.rs`; docs/rules.md C11, T4, S8) under arbitrary answers.

use std::time::Duration;

use proptest::prelude::*;
use stead::core::errors::{StoreError, TaskError};
use stead::core::provision::{
    Deprovision, DeprovisionInput, Provision, ProvisionInput, WorkAnswer, WorkCommand, WorkError,
};
use stead::core::release::ReleaseSpec;
use stead::core::spec::{ReadinessProbe, ServiceSpec};
use stead::core::types::{
    ActiveRecord, ActiveService, ContainerId, ContainerStatus, Inhibition, InhibitionReason,
    InstanceName, Observation, RuntimeError, ServiceName, Timestamp,
};

const SERVICES: [&str; 3] = ["web", "api", "worker"];

fn spec(name: &str) -> ServiceSpec {
    ServiceSpec {
        name: ServiceName::new(name),
        image: "img".into(),
        command: Vec::new(),
        ports: vec![8080],
        healthcheck: None,
        readiness: ReadinessProbe::None,
        stop_grace: Duration::from_secs(5),
        update: Default::default(),
        domains: Vec::new(),
        tenant_domains: false,
        run: Default::default(),
    }
}

/// ACTIVE with the services whose bit is set in `mask`.
fn active(mask: u8) -> ActiveRecord {
    let mut active = ActiveRecord::default();
    for (i, name) in SERVICES.iter().enumerate() {
        if mask & (1 << i) != 0 {
            active.services.insert(
                ServiceName::new(*name),
                ActiveService {
                    container: ContainerId::new(format!("stead.app.{name}.1")),
                    effective_revision: "1".into(),
                    binds: Default::default(),
                    stop_grace: None,
                    verified_started_at: None,
                },
            );
        }
    }
    active
}

fn runtime(choice: u8) -> Result<(), RuntimeError> {
    match choice % 8 {
        0 => Err(RuntimeError::NotFound),
        1 => Err(RuntimeError::Transient("timeout".into())),
        _ => Ok(()),
    }
}

fn done(choice: u8) -> Result<(), WorkError> {
    if choice % 8 == 2 {
        Err(StoreError::Unavailable("store down".into()).into())
    } else {
        Ok(())
    }
}

fn answer(command: &WorkCommand, choice: u8) -> WorkAnswer {
    match command {
        WorkCommand::Inspect(_) => WorkAnswer::Inspected(match choice % 8 {
            0 => Err(RuntimeError::NotFound),
            1 => Err(RuntimeError::Transient("timeout".into())),
            _ => Ok(Observation {
                status: ContainerStatus::Running,
                started_at: Some(Timestamp::UNIX_EPOCH),
                exit: None,
            }),
        }),
        WorkCommand::Create { spec, revision, .. } => WorkAnswer::Created(match choice % 8 {
            1 => Err(RuntimeError::Transient("pull failed".into())),
            // Sometimes the deterministic name is ACTIVE's own.
            3 => Ok(ContainerId::new(format!("stead.app.{}.1", spec.name))),
            _ => Ok(ContainerId::new(format!(
                "stead.app.{}.{revision}",
                spec.name
            ))),
        }),
        WorkCommand::Stop { .. } => WorkAnswer::Stopped(runtime(choice)),
        WorkCommand::Remove(_) => WorkAnswer::Removed(runtime(choice).or_else(|e| match e {
            RuntimeError::NotFound => Ok(()),
            e => Err(e),
        })),
        WorkCommand::PurgeVolumes => WorkAnswer::Purged(match choice % 8 {
            1 => Err(RuntimeError::Transient("volume in use".into())),
            _ => Ok(vec!["stead.app.web.data".into()]),
        }),
        _ => WorkAnswer::Done(done(choice)),
    }
}

/// A Docker provision at version 2 (digest `d2`) of a row that records
/// the same.
fn docker_input(active: ActiveRecord) -> ProvisionInput {
    ProvisionInput {
        instance: InstanceName::new("app"),
        version: "2".into(),
        spec_digest: "d2".into(),
        recorded_version: "2".into(),
        recorded_digest: Some("d2".into()),
        pinned: false,
        release: ReleaseSpec::Docker { name: "app".into() },
        services: SERVICES.iter().map(|n| spec(n)).collect(),
        active,
        containers: Vec::new(),
        inhibitions: Vec::new(),
    }
}

/// Runs a provision with every answer a success; its commands and result.
fn provision_all_ok(input: ProvisionInput) -> (Vec<WorkCommand>, Result<(), TaskError>) {
    let mut machine = Provision::new(input);
    let mut issued = Vec::new();
    while let Some(command) = machine.poll_command() {
        // 4: found (Inspect) and created under a fresh name (Create).
        machine.handle(answer(&command, 4), Timestamp::UNIX_EPOCH);
        issued.push(command);
    }
    (issued, machine.into_report())
}

fn recorded_version(issued: &[WorkCommand]) -> Option<(&str, &str)> {
    issued.iter().find_map(|c| match c {
        WorkCommand::RecordVersion {
            version,
            spec_digest,
        } => Some((version.as_str(), spec_digest.as_str())),
        _ => None,
    })
}

/// An operator created the instance at version 1 under the catalog it had;
/// the worker's catalog is at 2 by the time it provisions: what it installs
/// is 2, and 2 is what the row must say, or the rollout (which upgrades only
/// instances behind) would take it for the version it is not.
#[test]
fn a_provision_at_a_newer_catalog_version_records_it() {
    let (issued, result) = provision_all_ok(ProvisionInput {
        recorded_version: "1".into(),
        recorded_digest: Some("d1".into()),
        ..docker_input(ActiveRecord::default())
    });
    assert_eq!(result, Ok(()));
    assert_eq!(recorded_version(&issued), Some(("2", "d2")));
    assert!(
        matches!(issued.last(), Some(WorkCommand::RecordVersion { .. })),
        "recorded last, once the whole instance is of it: {issued:?}"
    );
    let created: Vec<_> = issued
        .iter()
        .filter_map(|c| match c {
            WorkCommand::Create { version, .. } => Some(version.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        created, ["2"; 3],
        "every container of the version installed"
    );
    // A Helm release is installed whole, containers or not.
    let helm = ReleaseSpec::Helm(stead::core::release::HelmRelease {
        name: "app".into(),
        namespace: "app".into(),
        chart: "charts/app".into(),
        chart_version: "2".into(),
        values: serde_json::json!({}),
        atomic: false,
    });
    let (issued, result) = provision_all_ok(ProvisionInput {
        recorded_version: "1".into(),
        release: helm,
        ..docker_input(ActiveRecord::default())
    });
    assert_eq!(result, Ok(()));
    assert_eq!(recorded_version(&issued), Some(("2", "d2")));
}

/// The seed that found it (780): the operator saw the catalog's bump to 2
/// and created the instance at 2; a worker still on 1 took the task. It
/// must not install 1 under 2's name: it refuses, naming both versions,
/// before touching anything, and the task is retried.
#[test]
fn a_worker_whose_catalog_is_behind_the_instance_refuses_to_provision_it() {
    let (issued, result) = provision_all_ok(ProvisionInput {
        version: "1".into(),
        spec_digest: "d1".into(),
        ..docker_input(ActiveRecord::default())
    });
    assert_eq!(issued, Vec::new(), "nothing installed or created");
    let error = result.expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains("version 1")
            && message.contains("instance's 2")
            && message.contains("app"),
        "{error}"
    );
    assert!(
        !error.is_permanent(),
        "retried, by then under the new catalog"
    );
}

/// A reprovision that kept a container (or an ACTIVE service the version
/// no longer lists) leaves the row's version: the instance is partly of
/// it, and the rollout upgrades what is behind.
#[test]
fn a_partly_kept_instance_keeps_its_recorded_version() {
    let behind = |active| ProvisionInput {
        recorded_version: "1".into(),
        recorded_digest: Some("d1".into()),
        ..docker_input(active)
    };
    let (issued, result) = provision_all_ok(behind(active(0b001)));
    assert_eq!(result, Ok(()));
    assert_eq!(recorded_version(&issued), None, "web was kept: {issued:?}");
    let mut dropped = ActiveRecord::default();
    dropped.services.insert(
        ServiceName::new("cron"),
        active(0b001).services.into_values().next().unwrap(),
    );
    let (issued, _) = provision_all_ok(behind(dropped));
    assert_eq!(
        recorded_version(&issued),
        None,
        "cron is of the old version"
    );
    // Nothing differs: nothing to record.
    let (issued, _) = provision_all_ok(docker_input(ActiveRecord::default()));
    assert_eq!(recorded_version(&issued), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Provisioning never replaces a service whose ACTIVE container exists,
    /// saves ACTIVE only naming what it just created (and only when that
    /// changes it), installs first, and stops at the first failure.
    #[test]
    fn provisioning_repairs_only_what_is_missing(
        mask in 0u8..8,
        recorded in 1u32..4,
        same_digest in any::<bool>(),
        answers in proptest::collection::vec(any::<u8>(), 1..32),
    ) {
        let active = active(mask);
        let mut machine = Provision::new(ProvisionInput {
            recorded_version: recorded.to_string(),
            recorded_digest: same_digest.then(|| "d2".into()),
            ..docker_input(active.clone())
        });
        let mut issued = Vec::new();
        let mut created: Option<ContainerId> = None;
        let mut exists: Option<ServiceName> = None;
        let mut kept = false;
        let mut failed = false;
        while let Some(command) = machine.poll_command() {
            prop_assert!(!failed, "a command after a failure: {command:?}");
            prop_assert!(recorded <= 2, "provisioned by a catalog behind the instance");
            prop_assert!(issued.len() < 4 * SERVICES.len() + 2, "unbounded");
            prop_assert!(
                !matches!(issued.last(), Some(WorkCommand::RecordVersion { .. })),
                "a command after the version was recorded"
            );
            if issued.is_empty() {
                prop_assert!(matches!(command, WorkCommand::Install(_)), "install first");
            }
            match &command {
                WorkCommand::RecordVersion { version, spec_digest } => {
                    prop_assert_eq!((version.as_str(), spec_digest.as_str()), ("2", "d2"));
                    prop_assert!(recorded != 2 || !same_digest, "recorded what the row says already");
                    prop_assert!(!kept, "recorded a version a kept container does not run");
                }
                WorkCommand::Create { spec, .. } => {
                    prop_assert_ne!(exists.as_ref(), Some(&spec.name), "replaced a live container");
                }
                WorkCommand::SaveActive { service, record } => {
                    prop_assert_eq!(Some(&record.container), created.as_ref());
                    prop_assert_ne!(
                        active.services.get(service).map(|s| &s.container),
                        Some(&record.container),
                        "rewrote ACTIVE unchanged"
                    );
                }
                _ => {}
            }
            let choice = answers[issued.len() % answers.len()];
            let reply = answer(&command, choice);
            exists = None;
            match (&command, &reply) {
                (WorkCommand::Inspect(id), WorkAnswer::Inspected(Ok(_))) => {
                    exists = active.services.iter().find(|(_, s)| &s.container == id).map(|(n, _)| n.clone());
                    kept = true;
                }
                (WorkCommand::Create { .. }, WorkAnswer::Created(Ok(id))) => created = Some(id.clone()),
                (_, WorkAnswer::Done(Err(_)) | WorkAnswer::Created(Err(_))) => failed = true,
                (WorkCommand::Inspect(_), WorkAnswer::Inspected(Err(RuntimeError::Transient(_)))) => failed = true,
                _ => {}
            }
            machine.handle(reply, Timestamp::UNIX_EPOCH);
            issued.push(command);
        }
        let refused = recorded > 2;
        prop_assert_eq!(machine.into_report().is_err(), failed || refused);
        let differs = recorded != 2 || !same_digest;
        if !failed && !refused {
            prop_assert_eq!(
                matches!(issued.last(), Some(WorkCommand::RecordVersion { .. })),
                differs && !kept,
                "the version installed is recorded exactly when it differs and nothing was kept"
            );
        }
    }

    /// Deprovisioning removes only what is stopped, drops a service from
    /// ACTIVE only once its container is removed and its claims released,
    /// uninstalls only when everything before succeeded, and purges the
    /// named volumes last, only when asked and only once uninstalled.
    #[test]
    fn deprovisioning_takes_everything_down_in_order(
        purge_volumes in any::<bool>(),
        mask in 0u8..8,
        markers in 0u8..8,
        answers in proptest::collection::vec(any::<u8>(), 1..48),
    ) {
        let active = active(mask);
        let inhibitions: Vec<Inhibition> = SERVICES
            .iter()
            .enumerate()
            .filter(|(i, _)| markers & (1 << i) != 0)
            .map(|(i, name)| Inhibition {
                service: ServiceName::new(*name),
                container: ContainerId::new(format!("stead.app.{name}.0")),
                reason: if i == 2 { InhibitionReason::Hold("operator-hold".into()) } else { InhibitionReason::RetirementPending },
                operation: "test".into(),
                created_at: Timestamp::UNIX_EPOCH,
                stop_grace: None,
                revert_to: None,
            })
            .collect();
        let mut machine = Deprovision::new(DeprovisionInput {
            instance: InstanceName::new("app"),
            release: ReleaseSpec::Docker { name: "app".into() }.target(),
            active: active.clone(),
            inhibitions: inhibitions.clone(),
            stop_grace_default: Duration::from_secs(10),
            purge_volumes,
        });
        let mut uninstalled = false;
        let mut purged = false;
        let mut stopped = Vec::new();
        let mut removed = Vec::new();
        let mut released = Vec::new();
        let mut n = 0;
        let mut ok_so_far = true;
        while let Some(command) = machine.poll_command() {
            prop_assert!(ok_so_far, "a command after a failure: {command:?}");
            match &command {
                WorkCommand::Remove(g) => prop_assert!(stopped.contains(&g.container), "removed unstopped {}", g.container),
                WorkCommand::ReleaseClaims(c) => prop_assert!(removed.contains(c)),
                WorkCommand::RemoveActive(s) => prop_assert!(released.contains(&active.services[s].container)),
                WorkCommand::Stop { generation, .. } => {
                    let ours = active.names_container(&generation.container)
                        || inhibitions.iter().any(|m| m.container == generation.container && m.reason == InhibitionReason::RetirementPending);
                    prop_assert!(ours, "stopped {} which nothing of the instance names", generation.container);
                }
                WorkCommand::PurgeVolumes => {
                    prop_assert!(purge_volumes, "purged without being asked");
                    prop_assert!(uninstalled, "purged before the release was uninstalled");
                }
                WorkCommand::Uninstall(_) => prop_assert_eq!(removed.len(), active.services.len() + inhibitions.iter().filter(|m| m.reason == InhibitionReason::RetirementPending).count()),
                _ => {}
            }
            let reply = answer(&command, answers[n % answers.len()]);
            n += 1;
            match (&command, &reply) {
                (WorkCommand::Stop { generation, .. }, WorkAnswer::Stopped(r)) => {
                    if matches!(r, Ok(()) | Err(RuntimeError::NotFound)) { stopped.push(generation.container.clone()) } else { ok_so_far = false }
                }
                (WorkCommand::Remove(g), WorkAnswer::Removed(r)) => {
                    if r.is_ok() { removed.push(g.container.clone()) } else { ok_so_far = false }
                }
                (WorkCommand::ReleaseClaims(c), WorkAnswer::Done(Ok(()))) => released.push(c.clone()),
                (WorkCommand::Uninstall(_), WorkAnswer::Done(Ok(()))) => uninstalled = true,
                (WorkCommand::PurgeVolumes, WorkAnswer::Purged(r)) => {
                    if r.is_ok() { purged = true } else { ok_so_far = false }
                }
                (_, WorkAnswer::Done(Err(_))) => ok_so_far = false,
                _ => {}
            }
            machine.handle(reply, Timestamp::UNIX_EPOCH);
        }
        let completed = machine.into_report().is_ok();
        prop_assert_eq!(completed, ok_so_far);
        if completed {
            prop_assert_eq!(purged, purge_volumes, "a completed deprovision purged exactly when asked");
        }
    }
}

/// #40: a container an earlier attempt created but never recorded in
/// ACTIVE (the process died, or its lease lapsed, between the two) is
/// stopped and removed before its service's container is created again: at
/// another revision (the catalog changed meanwhile) it would run beside the
/// new one, on the same volumes. A predecessor under a marker is the
/// recovery pass's and stays.
#[test]
fn a_provision_removes_what_an_earlier_attempt_left_before_creating_again() {
    let service = ServiceName::new(SERVICES[0]);
    let stray = ContainerId::new("stead.app.web.1.deadbeef");
    let kept = ContainerId::new("stead.app.web.0.cafe");
    let marker = stead::core::types::Inhibition {
        service: service.clone(),
        container: kept.clone(),
        reason: stead::core::types::InhibitionReason::RetirementPending,
        operation: "upgrade".into(),
        created_at: stead::core::types::Timestamp::UNIX_EPOCH,
        stop_grace: None,
        revert_to: None,
    };
    let (issued, result) = provision_all_ok(ProvisionInput {
        containers: vec![
            (service.clone(), stray.clone()),
            (service.clone(), kept.clone()),
        ],
        inhibitions: vec![marker],
        ..docker_input(ActiveRecord::default())
    });
    result.expect("provisioned");
    let touched = |id: &ContainerId| {
        issued
            .iter()
            .filter_map(|c| match c {
                WorkCommand::Stop { generation, .. } if &generation.container == id => Some("stop"),
                WorkCommand::Remove(generation) if &generation.container == id => Some("remove"),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(touched(&stray), ["stop", "remove"]);
    assert!(touched(&kept).is_empty(), "the marked predecessor stays");
    let removed = issued
        .iter()
        .position(|c| matches!(c, WorkCommand::Remove(g) if g.container == stray))
        .unwrap();
    let created = issued
        .iter()
        .position(|c| matches!(c, WorkCommand::Create { spec, .. } if spec.name == service))
        .unwrap();
    assert!(
        removed < created,
        "removed before the service is created again"
    );
}
