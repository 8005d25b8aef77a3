//! Property tests of the provisioning and deprovisioning machines
//! (`core/provision.rs`; DESIGN.md C11, T4, S8) under arbitrary answers.

use std::time::Duration;

use proptest::prelude::*;
use stead::core::errors::StoreError;
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Provisioning never replaces a service whose ACTIVE container exists,
    /// saves ACTIVE only naming what it just created (and only when that
    /// changes it), installs first, and stops at the first failure.
    #[test]
    fn provisioning_repairs_only_what_is_missing(
        mask in 0u8..8,
        answers in proptest::collection::vec(any::<u8>(), 1..32),
    ) {
        let active = active(mask);
        let mut machine = Provision::new(ProvisionInput {
            instance: InstanceName::new("app"),
            version: "2".into(),
            release: ReleaseSpec::Docker { name: "app".into() },
            services: SERVICES.iter().map(|n| spec(n)).collect(),
            active: active.clone(),
        });
        let mut issued = Vec::new();
        let mut created: Option<ContainerId> = None;
        let mut exists: Option<ServiceName> = None;
        let mut failed = false;
        while let Some(command) = machine.poll_command() {
            prop_assert!(!failed, "a command after a failure: {command:?}");
            prop_assert!(issued.len() < 4 * SERVICES.len() + 1, "unbounded");
            if issued.is_empty() {
                prop_assert!(matches!(command, WorkCommand::Install(_)), "install first");
            }
            match &command {
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
                }
                (WorkCommand::Create { .. }, WorkAnswer::Created(Ok(id))) => created = Some(id.clone()),
                (_, WorkAnswer::Done(Err(_)) | WorkAnswer::Created(Err(_))) => failed = true,
                (WorkCommand::Inspect(_), WorkAnswer::Inspected(Err(RuntimeError::Transient(_)))) => failed = true,
                _ => {}
            }
            machine.handle(reply);
            issued.push(command);
        }
        prop_assert_eq!(machine.into_result().is_err(), failed);
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
            machine.handle(reply);
        }
        let completed = machine.into_result().is_ok();
        prop_assert_eq!(completed, ok_so_far);
        if completed {
            prop_assert_eq!(purged, purge_volumes, "a completed deprovision purged exactly when asked");
        }
    }
}
