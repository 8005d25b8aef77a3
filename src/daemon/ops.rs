//! Operator commands. They write intent and rows — instances, tasks,
//! inhibitions, rollout switches — and never touch containers: the daemon's
//! loops act on what these rows say. `status` reads the store, inspects the
//! containers ACTIVE names, and shows the budget when the daemon's memory
//! is at hand (budgets are volatile by design, R17).

use std::time::Duration;

use serde::Serialize;

use crate::core::catalog::Catalog;
use crate::core::fleet::{Instance, InstanceState, NewTask, RolloutState, TaskKind};
use crate::core::memory::RecoveryMemory;
use crate::core::types::{
    GenerationKey, Inhibition, InhibitionReason, InstanceName, ServiceName, Timestamp,
};
use crate::ports::{NewInstance, Runtime, Store};

/// The reason `inhibit` records when none is given.
pub const OPERATOR_HOLD: &str = "operator-hold";

/// What an operator command needs.
pub struct Ops<'a> {
    pub store: &'a dyn Store,
    pub catalog: &'a Catalog,
    pub now: Timestamp,
}

/// `stead instance create`.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    pub name: String,
    pub service_type: String,
    pub team: String,
    /// Defaults to the catalog's version of the type.
    pub version: Option<String>,
    pub ttl: Option<Duration>,
    pub maintenance_window: Option<String>,
}

fn check_instance_name(name: &str) -> Result<(), String> {
    crate::core::names::check_instance_name("instance name", name).map_err(|e| e.to_string())
}

impl Ops<'_> {
    async fn find(&self, name: &str) -> Result<Instance, String> {
        self.store
            .instance(&InstanceName::new(name))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no instance named {name:?}"))
    }

    /// Writes the instance row and its provision task.
    pub async fn create(&self, request: &CreateRequest) -> Result<Instance, String> {
        check_instance_name(&request.name)?;
        let entry = self.catalog.get(&request.service_type).ok_or_else(|| {
            let known: Vec<&str> = self
                .catalog
                .entries()
                .map(|e| e.service_type.as_str())
                .collect();
            format!(
                "service type {:?} is not in the catalog (known: {})",
                request.service_type,
                known.join(", ")
            )
        })?;
        if let Some(window) = &request.maintenance_window {
            crate::core::window::Window::parse(window)
                .map_err(|e| format!("window {window:?}: {e}"))?;
        }
        let expires_at = match request.ttl {
            None => None,
            Some(ttl) => Some(
                self.now
                    .checked_add(jiff::SignedDuration::try_from(ttl).map_err(|e| e.to_string())?)
                    .map_err(|e| format!("ttl {ttl:?}: {e}"))?,
            ),
        };
        let new = NewInstance {
            name: InstanceName::new(&request.name),
            team: request.team.clone(),
            service_type: request.service_type.clone(),
            version: request
                .version
                .clone()
                .unwrap_or_else(|| entry.version.clone()),
            expires_at,
            maintenance_window: request.maintenance_window.clone(),
        };
        let instance = self
            .store
            .create_instance(&new, self.now)
            .await
            .map_err(|e| e.to_string())?;
        self.enqueue(&instance, TaskKind::Provision, "operator: instance create")
            .await?;
        Ok(instance)
    }

    async fn enqueue(
        &self,
        instance: &Instance,
        kind: TaskKind,
        reason: &str,
    ) -> Result<(), String> {
        let task = NewTask {
            kind,
            instance: instance.id,
            run_after: self.now,
            reason: reason.to_owned(),
            traceparent: Some(operator_traceparent()),
        };
        self.store
            .enqueue(&task, self.now, None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Sets the stopped intent; the recovery pass stops (or starts) the
    /// containers and rebuilds publication.
    pub async fn set_stopped(&self, name: &str, stopped: bool) -> Result<(), String> {
        let instance = self.find(name).await?;
        self.store
            .set_instance_stopped(instance.id, stopped, self.now)
            .await
            .map_err(|e| e.to_string())
    }

    /// Moves the instance to `deleting` with a deprovision task, in one
    /// transaction (the same path TTL expiry takes).
    pub async fn delete(&self, name: &str) -> Result<(), String> {
        let instance = self.find(name).await?;
        if matches!(
            instance.state,
            InstanceState::Deleting | InstanceState::Deleted
        ) {
            return Ok(());
        }
        let task = NewTask {
            kind: TaskKind::Deprovision,
            instance: instance.id,
            run_after: self.now,
            reason: "operator: instance delete".into(),
            traceparent: Some(operator_traceparent()),
        };
        self.store
            .expire_instance(instance.id, instance.state, &task, self.now, None)
            .await
            .map_err(|e| e.to_string())?
            .map(drop)
            .ok_or_else(|| {
                format!("{name} changed state meanwhile, or a deprovision is already queued; retry")
            })
    }

    /// Records a hold on the generation ACTIVE names for `service` now.
    pub async fn inhibit(&self, name: &str, service: &str, reason: &str) -> Result<(), String> {
        if reason == InhibitionReason::RETIREMENT_PENDING {
            return Err(format!("reason {reason:?} is reserved for upgrades"));
        }
        let instance = self.find(name).await?;
        let active = self
            .store
            .load_active(&instance.name)
            .await
            .map_err(|e| e.to_string())?;
        let service_name = ServiceName::new(service);
        let record = active
            .services
            .get(&service_name)
            .ok_or_else(|| format!("{name} has no active service {service:?}"))?;
        let inhibition = Inhibition {
            service: service_name,
            container: record.container.clone(),
            reason: InhibitionReason::parse(reason),
            operation: "operator".into(),
            created_at: self.now,
            stop_grace: record.stop_grace,
        };
        self.store
            .save_inhibition(&instance.name, &inhibition)
            .await
            .map_err(|e| e.to_string())
    }

    /// Clears every hold (not retirement markers) on `service`.
    pub async fn release(&self, name: &str, service: &str) -> Result<u32, String> {
        let instance = self.find(name).await?;
        let mut n = 0;
        for inhibition in self
            .store
            .load_inhibitions(&instance.name)
            .await
            .map_err(|e| e.to_string())?
        {
            if inhibition.service.as_str() == service
                && inhibition.reason != InhibitionReason::RetirementPending
            {
                self.store
                    .clear_inhibition(
                        &instance.name,
                        &inhibition.service,
                        &inhibition.container,
                        None,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                n += 1;
            }
        }
        Ok(n)
    }

    pub async fn set_rollout(
        &self,
        service_type: &str,
        state: RolloutState,
        reason: &str,
    ) -> Result<(), String> {
        if self.catalog.get(service_type).is_none() {
            return Err(format!(
                "service type {service_type:?} is not in the catalog"
            ));
        }
        self.store
            .set_rollout(service_type, state, reason, self.now, None)
            .await
            .map_err(|e| e.to_string())
    }
}

/// One row of `stead status`: one service of one instance.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct StatusRow {
    pub instance: String,
    pub state: String,
    pub intent: String,
    pub version: String,
    pub service: String,
    /// The container ACTIVE names (the generation).
    pub container: String,
    pub runtime: String,
    /// `failures`, or `-` when the daemon's memory is not at hand.
    pub failures: Option<u32>,
    pub next_attempt: Option<String>,
    /// `published` when verified binds are recorded, else `withdrawn`.
    pub publication: String,
    pub binds: String,
    pub inhibitions: Vec<String>,
    pub expires_at: Option<String>,
}

/// The whole status table plus what could not be read.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Status {
    pub rows: Vec<StatusRow>,
    pub halted_rollouts: Vec<String>,
    /// Whether budgets came from a running daemon's memory.
    pub budgets_live: bool,
    pub errors: Vec<String>,
}

/// Builds the status view. `memory` is the running daemon's (budgets are
/// volatile); without it budget columns are empty.
pub async fn status(
    store: &dyn Store,
    runtime: &dyn Runtime,
    memory: Option<&RecoveryMemory>,
    caddy_admin: Option<&str>,
) -> Status {
    let caddy = caddy_admin.and_then(|admin| {
        reqwest::Client::builder()
            .no_proxy()
            // Caddy answers a route id whose path it cleans (`..`) with a
            // redirect elsewhere in its config: never follow it.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(3))
            .build()
            .ok()
            .map(|client| (client, admin.to_owned()))
    });
    let mut status = Status {
        budgets_live: memory.is_some(),
        ..Default::default()
    };
    match store.rollouts().await {
        Ok(r) => {
            status.halted_rollouts = r
                .into_iter()
                .filter(|(_, s)| *s == RolloutState::Halted)
                .map(|(t, _)| t)
                .collect()
        }
        Err(e) => status.errors.push(format!("rollouts: {e}")),
    }
    let instances = match store.list_instances().await {
        Ok(rows) => {
            status.errors.extend(rows.bad.iter().map(|e| e.to_string()));
            rows.rows
        }
        Err(e) => {
            status.errors.push(format!("instances: {e}"));
            return status;
        }
    };
    for instance in instances
        .iter()
        .filter(|i| i.state != InstanceState::Deleted)
    {
        let active = match store.load_active(&instance.name).await {
            Ok(a) => a,
            Err(e) => {
                status.errors.push(format!("{}: {e}", instance.name));
                continue;
            }
        };
        let inhibitions = store
            .load_inhibitions(&instance.name)
            .await
            .unwrap_or_default();
        let base = StatusRow {
            instance: instance.name.to_string(),
            state: instance.state.as_str().to_owned(),
            intent: if instance.stopped {
                "stopped"
            } else {
                "running"
            }
            .to_owned(),
            version: instance.version.clone(),
            service: "-".into(),
            container: "-".into(),
            runtime: "-".into(),
            failures: None,
            next_attempt: None,
            publication: "-".into(),
            binds: "-".into(),
            inhibitions: Vec::new(),
            expires_at: instance.expires_at.map(|t| t.to_string()),
        };
        if active.services.is_empty() {
            status.rows.push(base);
            continue;
        }
        for (service, record) in &active.services {
            let runtime_state = match runtime.inspect(&record.container).await {
                Ok(obs) => obs.status.to_string(),
                Err(e) => format!("({e})"),
            };
            let key = GenerationKey {
                instance: instance.name.clone(),
                service: service.clone(),
                container: record.container.clone(),
            };
            let budget = memory
                .and_then(|m| m.generation(&key))
                .and_then(|g| g.budget.clone());
            let mut row = base.clone();
            row.service = service.to_string();
            row.container = record.container.as_str().chars().take(12).collect();
            row.runtime = runtime_state;
            row.failures = memory.map(|_| budget.as_ref().map_or(0, |b| b.failures));
            row.next_attempt = budget.and_then(|b| b.next_attempt).map(|t| t.to_string());
            row.publication = publication(caddy.as_ref(), &instance.name, service).await;
            row.binds = record
                .binds
                .iter()
                .map(|(c, h)| format!("{c}->{h}"))
                .collect::<Vec<_>>()
                .join(",");
            row.inhibitions = inhibitions
                .iter()
                .filter(|i| &i.service == service)
                .map(|i| {
                    format!(
                        "{}:{}",
                        i.reason.as_str(),
                        i.container.as_str().chars().take(12).collect::<String>()
                    )
                })
                .collect();
            status.rows.push(row);
        }
    }
    status
}

/// The table `stead status` prints.
pub fn render_table(status: &Status) -> String {
    let header = [
        "INSTANCE",
        "STATE",
        "INTENT",
        "VERSION",
        "SERVICE",
        "GENERATION",
        "RUNTIME",
        "FAILURES",
        "NEXT ATTEMPT",
        "PUBLICATION",
        "INHIBITIONS",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in &status.rows {
        rows.push(vec![
            r.instance.clone(),
            r.state.clone(),
            r.intent.clone(),
            r.version.clone(),
            r.service.clone(),
            r.container.clone(),
            r.runtime.clone(),
            r.failures.map_or("-".into(), |f| f.to_string()),
            r.next_attempt.clone().unwrap_or_else(|| "-".into()),
            r.publication.clone(),
            if r.inhibitions.is_empty() {
                "-".into()
            } else {
                r.inhibitions.join(" ")
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if !status.halted_rollouts.is_empty() {
        out.push_str(&format!(
            "halted rollouts: {}\n",
            status.halted_rollouts.join(", ")
        ));
    }
    if !status.budgets_live {
        out.push_str("budgets: daemon not reachable; budgets live in its memory only (R17)\n");
    }
    for e in &status.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

/// Whether Caddy holds the service's route right now (`published`), does
/// not (`withdrawn`), or could not say.
async fn publication(
    caddy: Option<&(reqwest::Client, String)>,
    instance: &InstanceName,
    service: &ServiceName,
) -> String {
    let Some((client, admin)) = caddy else {
        return "-".into();
    };
    let key = crate::core::types::ServiceKey {
        instance: instance.clone(),
        service: service.clone(),
    };
    let Ok(url) = crate::adapters::caddy::CaddyTraffic::route_id_url(admin, &key) else {
        return "(caddy address invalid)".into();
    };
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => "published".into(),
        Ok(r) if r.status().as_u16() == 404 => "withdrawn".into(),
        Ok(r) => format!("(caddy {})", r.status().as_u16()),
        Err(_) => "(caddy unreachable)".into(),
    }
}

/// The trace an operator's command starts: its tasks carry it, so a
/// worker's spans join the command's trace as the tick's tasks join the
/// tick's. Logged, so the command's output can be matched to them.
fn operator_traceparent() -> String {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(super::os_seed());
    let traceparent = crate::engine::tick::new_traceparent(&mut rng);
    tracing::info!(%traceparent, "operator command");
    traceparent
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn operator_tasks_carry_a_fresh_traceparent() {
        let store = MemoryStore::new();
        let catalog = Catalog::from_toml(
            "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"http\"\nimage = \"i\"\n",
            "catalog.toml",
        )
        .unwrap();
        let ops = Ops {
            store: &store,
            catalog: &catalog,
            now: "2026-11-30T00:00:00Z".parse().unwrap(),
        };
        for name in ["blog", "wiki"] {
            let request = CreateRequest {
                name: name.into(),
                service_type: "web".into(),
                team: "t".into(),
                version: None,
                ttl: None,
                maintenance_window: None,
            };
            ops.create(&request).await.unwrap();
        }
        ops.delete("blog").await.unwrap();
        let tasks = store.all_tasks();
        assert_eq!(tasks.len(), 3);
        let mut seen = std::collections::BTreeSet::new();
        for task in &tasks {
            let tp = task.traceparent.as_deref().expect("a traceparent");
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!(parts.len(), 4, "{tp}");
            assert_eq!((parts[0], parts[3]), ("00", "01"), "{tp}");
            assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{tp}");
            assert!(seen.insert(parts[1].to_owned()), "one trace per command");
        }
    }
}
