//! Steady fleets for scale benchmarks and round-trip tests: every instance
//! ready, every container running with a recorded verified execution, and
//! every route published, so a recovery pass over them changes nothing
//! (the state a healthy daemon's passes spend most of their life in).

use std::time::Duration;

use stead::core::fleet::InstanceState;
use stead::core::spec::{ReadinessProbe, ServiceSpec};
use stead::core::types::{ActiveService, InstanceName, ServiceKey, ServiceName, Timestamp};
use stead::ports::{CreateContainer, NewInstance, Route, Runtime, Store, Traffic};

use crate::ports::{MemoryRuntime, MemoryTraffic};

/// What one steady fleet is made of.
#[derive(Clone, Copy, Debug)]
pub struct FleetShape {
    pub instances: usize,
    pub services_per_instance: usize,
}

impl FleetShape {
    pub fn services(&self) -> usize {
        self.instances * self.services_per_instance
    }
}

/// The name of instance `i` of a steady fleet.
pub fn instance_name(i: usize) -> InstanceName {
    InstanceName::new(format!("i{i}"))
}

fn spec(service: usize) -> ServiceSpec {
    ServiceSpec {
        name: ServiceName::new(format!("s{service}")),
        image: "steady".to_owned(),
        command: Vec::new(),
        ports: vec![8080],
        healthcheck: None,
        readiness: ReadinessProbe::None,
        stop_grace: Duration::ZERO,
        update: Default::default(),
        domains: Vec::new(),
        tenant_domains: false,
        run: Default::default(),
    }
}

/// Builds `shape` into the store, the runtime and the traffic plane: each
/// instance ready, each service's container created, started, recorded in
/// ACTIVE with the execution it runs, and routed. Fails on the first
/// refused call, naming it.
pub async fn build_steady_fleet(
    shape: FleetShape,
    store: &dyn Store,
    runtime: &MemoryRuntime,
    traffic: &MemoryTraffic,
    now: Timestamp,
) -> Result<(), String> {
    for i in 0..shape.instances {
        let name = instance_name(i);
        let new = NewInstance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            name: name.clone(),
            team: "steady".into(),
            service_type: "steady".into(),
            version: "1".into(),
            expires_at: None,
            maintenance_window: None,
        };
        let instance = store
            .create_instance(&new, now)
            .await
            .map_err(|e| format!("create {name}: {e}"))?;
        for s in 0..shape.services_per_instance {
            let spec = spec(s);
            let service = spec.name.clone();
            let request = CreateContainer {
                instance: name.clone(),
                instance_id: 1,
                env: Vec::new(),
                spec,
                revision: "r1".into(),
            };
            let id = runtime
                .create(&request)
                .await
                .map_err(|e| format!("container of {name}/{service}: {e}"))?;
            runtime
                .start(&id)
                .await
                .map_err(|e| format!("start {id}: {e}"))?;
            let observed = runtime
                .inspect(&id)
                .await
                .map_err(|e| format!("inspect {id}: {e}"))?;
            let binds = runtime
                .binds(&id)
                .await
                .map_err(|e| format!("binds {id}: {e}"))?;
            let record = ActiveService {
                container: id.clone(),
                effective_revision: "r1".into(),
                binds: binds.clone(),
                stop_grace: Some(Duration::ZERO),
                verified_started_at: observed.started_at,
            };
            store
                .save_active_service(&name, &service, &record)
                .await
                .map_err(|e| format!("ACTIVE of {name}/{service}: {e}"))?;
            let route = Route {
                service: ServiceKey {
                    instance: name.clone(),
                    service,
                },
                container: id,
                binds,
                verified_started_at: observed.started_at,
                public_hosts: Vec::new(),
            };
            traffic
                .publish(&route)
                .await
                .map_err(|e| format!("route of {name}: {e}"))?;
        }
        store
            .set_instance_state(
                instance.id,
                InstanceState::Provisioning,
                InstanceState::Ready,
                now,
            )
            .await
            .map_err(|e| format!("{name} ready: {e}"))?;
    }
    Ok(())
}
