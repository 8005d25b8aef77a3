//! The read side of the CLI: `stead status`, `stead instance list`,
//! `stead task list`. Each builds a serialisable view (what `--json`
//! prints) from the store, the runtime and the proxy, and renders it as a
//! table for people (relative times, conditions spelled out).
//!
//! Budgets live in the daemon's memory only (R17): a status built by the
//! CLI has none; the daemon's `/status` endpoint (`stead status --live`)
//! fills them in.

use crate::adapters::caddy::CaddyTraffic;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::catalog::Catalog;
use crate::core::event_log::{Event, EventFilter, EventKind};
use crate::core::fleet::{Instance, InstanceState, RolloutState, Task, TaskKind, TaskState};
use crate::core::memory::RecoveryMemory;
use crate::core::plan::{is_behind, spec_changed};
use crate::core::release::{Provisioning, ReleaseParams};
use crate::core::types::{
    ContainerStatus, GenerationKey, Inhibition, InstanceName, Observation, RuntimeError,
    ServiceName, Timestamp,
};
use crate::core::window::{next_run_after, Window};
use crate::ports::{Provisioner, Runtime, Store};

use super::human::{relative, table};

/// One row of `stead status`: one service of one instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatusRow {
    pub instance: String,
    pub state: String,
    pub intent: String,
    pub version: String,
    pub service: String,
    /// The container ACTIVE names (the generation), shortened.
    pub container: String,
    /// What the runtime says of that container.
    pub runtime: String,
    /// Whether it serves: `serving`, `down (exited)`, `stopped`, ...
    pub condition: String,
    /// Consecutive failures in the budget; `None` without the daemon's memory.
    pub failures: Option<u32>,
    /// RFC 3339: the crash-loop budget's backoff ends then (R10); `None`
    /// when nothing is delayed. From the daemon's memory, or without it
    /// from the last delay the event log recorded, while it lasts.
    pub next_attempt: Option<String>,
    /// The exit code of the container's last execution, while it is down.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// RFC 3339: when that execution ended, if the runtime says.
    #[serde(default)]
    pub exited_at: Option<String>,
    /// The last budget decision the event log recorded of this generation
    /// (a delay: the failed attempt, its exit code or readiness error, the
    /// backoff), as its sentence.
    #[serde(default)]
    pub last_decision: Option<String>,
    /// RFC 3339: when that decision was made.
    #[serde(default)]
    pub last_decision_at: Option<String>,
    /// `published` or `withdrawn` as the proxy says, or why it could not.
    pub publication: String,
    pub binds: String,
    pub inhibitions: Vec<String>,
    pub expires_at: Option<String>,
    /// Public host names (#54) of the service that another live instance
    /// holds until it is deleted: the service is not served under them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts_refused: Vec<super::reserved_hosts::RefusedHost>,
}

/// One instance of a Helm type: its release as Helm reports it
/// (Kubernetes runs and recovers it, so there are no containers of
/// stead's to show).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReleaseRow {
    pub instance: String,
    pub state: String,
    pub version: String,
    pub namespace: String,
    /// Helm's status (`deployed`, `pending-upgrade`, `failed`, ...),
    /// `missing` when Helm does not know the release, or why it could not
    /// be asked.
    pub release: String,
    pub revision: Option<u64>,
    pub chart: String,
    pub description: String,
}

/// An instance behind its type's catalog version, and where its upgrade is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PendingUpgrade {
    pub instance: String,
    pub from: String,
    pub to: String,
    /// `queued (due ...)`, `running`, or why none is planned yet.
    pub progress: String,
}

/// A catalog service type as the fleet sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypeStatus {
    pub service_type: String,
    /// The catalog's version (the daemon's loaded catalog with `--live`,
    /// else the file's).
    pub version: String,
    pub instances: u32,
    /// `active`, or `halted: <reason>`.
    pub rollout: String,
    pub pending: Vec<PendingUpgrade>,
}

/// Who leads the control loop.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeaseStatus {
    pub holder: String,
    pub expires_at: String,
}

/// The whole status view plus what could not be read.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    /// When it was built (RFC 3339); relative times are relative to this.
    pub generated_at: String,
    /// `database` (read by the CLI) or `daemon` (its `/status`).
    pub source: String,
    /// The database it was read from, without a password.
    pub database: String,
    pub rows: Vec<StatusRow>,
    /// Instances of Helm types, one row each.
    #[serde(default)]
    pub releases: Vec<ReleaseRow>,
    pub catalog: Vec<TypeStatus>,
    /// Halted rollouts of types no longer in the catalog, too.
    pub halted_rollouts: Vec<String>,
    pub reconciler: Option<LeaseStatus>,
    /// Whether budgets came from a running daemon's memory.
    pub budgets_live: bool,
    pub errors: Vec<String>,
}

/// What [`status`] reads from.
pub struct StatusSources<'a> {
    pub store: &'a dyn Store,
    pub runtime: &'a dyn Runtime,
    pub catalog: &'a Catalog,
    /// The running daemon's memory (budgets are volatile, R17).
    pub memory: Option<&'a RecoveryMemory>,
    pub caddy_admin: Option<&'a str>,
    /// Asked for the status of Helm types' releases (`helm status`).
    pub provisioner: Option<&'a dyn Provisioner>,
    pub database: String,
    pub now: Timestamp,
}

/// Builds the status view.
/// One inhibition as `status` shows it: `reason:container`, and for a
/// predecessor kept while its successor bakes (#40), the way back and
/// until when it holds.
fn inhibition_label(i: &Inhibition) -> String {
    let container: String = i.container.as_str().chars().take(12).collect();
    match &i.revert_to {
        Some(back) => format!(
            "{}:{container} (way back to {} until {})",
            i.reason.as_str(),
            back.version,
            back.until.round(jiff::Unit::Second).unwrap_or(back.until)
        ),
        None => format!("{}:{container}", i.reason.as_str()),
    }
}

impl Status {
    /// A report with nothing in it yet, saying where it comes from.
    fn empty(from: &StatusSources<'_>) -> Status {
        Status {
            generated_at: from.now.to_string(),
            source: if from.memory.is_some() {
                "daemon"
            } else {
                "database"
            }
            .to_owned(),
            database: from.database.clone(),
            budgets_live: from.memory.is_some(),
            ..Default::default()
        }
    }
}

pub async fn status(from: StatusSources<'_>) -> Status {
    let mut status = Status::empty(&from);
    match from.store.reconciler_lease().await {
        Ok(lease) => {
            status.reconciler = lease.map(|g| LeaseStatus {
                holder: g.holder,
                expires_at: g.expires_at.to_string(),
            })
        }
        Err(e) => status.errors.push(format!("reconciler lease: {e}")),
    }
    let instances = match from.store.list_instances().await {
        Ok(rows) => {
            status.errors.extend(rows.bad.iter().map(|e| e.to_string()));
            rows.rows
        }
        Err(e) => {
            status.errors.push(format!("instances: {e}"));
            return status;
        }
    };
    let live: Vec<&Instance> = instances
        .iter()
        .filter(|i| i.state != InstanceState::Deleted)
        .collect();
    fleet_by_type(&from, &live, &mut status).await;
    let caddy = caddy_client(from.caddy_admin);
    for instance in &live {
        match from.catalog.get(&instance.service_type) {
            Some(entry) if !entry.is_docker() => {
                release_row(&from, &entry.provisioning, instance, &mut status).await
            }
            _ => instance_rows(&from, instance, caddy.as_ref(), &mut status).await,
        }
    }
    super::reserved_hosts::mark_refused_hosts(&from, &live, &mut status).await;
    status
}

/// The status of one instance alone (`stead instance show`): its rows as
/// [`status`] builds them, without reading the rest of the fleet.
pub async fn instance_status(from: StatusSources<'_>, instance: &Instance) -> Status {
    let mut status = Status::empty(&from);
    let caddy = caddy_client(from.caddy_admin);
    match from.catalog.get(&instance.service_type) {
        Some(entry) if !entry.is_docker() => {
            release_row(&from, &entry.provisioning, instance, &mut status).await
        }
        _ => instance_rows(&from, instance, caddy.as_ref(), &mut status).await,
    }
    super::reserved_hosts::mark_refused_hosts(&from, &[instance], &mut status).await;
    status
}

/// A Helm type's instance: where its release lives and what Helm says.
async fn release_row(
    from: &StatusSources<'_>,
    provisioning: &Provisioning,
    instance: &Instance,
    status: &mut Status,
) {
    let mut row = ReleaseRow {
        instance: instance.name.to_string(),
        state: instance.state.as_str().to_owned(),
        version: instance.version.clone(),
        namespace: "-".into(),
        release: "-".into(),
        revision: None,
        chart: "-".into(),
        description: String::new(),
    };
    match provisioning.target_of(&ReleaseParams::of(instance, &instance.version)) {
        Err(e) => row.release = format!("cannot be located: {e}"),
        Ok(target) => {
            row.namespace = target.release.namespace.clone();
            row.release = match from.provisioner {
                None => "not asked (no provisioner)".into(),
                Some(p) => match p.status(&target).await {
                    Ok(Some(s)) => {
                        row.revision = Some(s.revision);
                        row.chart = s.chart;
                        row.description = s.description;
                        s.status
                    }
                    Ok(None) => "missing".into(),
                    Err(e) => format!("unknown ({e})"),
                },
            };
        }
    }
    status.releases.push(row);
}

/// The catalog's types: version, instances, rollout, pending upgrades.
async fn fleet_by_type(from: &StatusSources<'_>, live: &[&Instance], status: &mut Status) {
    let records = match from.store.rollout_records().await {
        Ok(r) => r,
        Err(e) => {
            status.errors.push(format!("rollouts: {e}"));
            Vec::new()
        }
    };
    let halted: BTreeMap<&str, String> = records
        .iter()
        .filter(|r| r.state == RolloutState::Halted)
        .map(|r| {
            let why = match &r.pinned {
                Some(version) => format!("{}; pinned to version {version}", r.reason),
                None => r.reason.clone(),
            };
            (r.service_type.as_str(), why)
        })
        .collect();
    status.halted_rollouts = halted
        .iter()
        .map(|(t, why)| format!("{t}: {why}"))
        .collect();
    let tasks = match from.store.active_tasks().await {
        Ok(rows) => rows.rows,
        Err(e) => {
            status.errors.push(format!("tasks: {e}"));
            Vec::new()
        }
    };
    for entry in from.catalog.entries() {
        let of_type: Vec<&&Instance> = live
            .iter()
            .filter(|i| i.service_type == entry.service_type)
            .collect();
        let rollout = if entry.rollout == RolloutState::Halted {
            "halted (in the catalog file)".to_owned()
        } else if let Some(why) = halted.get(entry.service_type.as_str()) {
            format!("halted: {why}")
        } else {
            "active".to_owned()
        };
        let pending = of_type
            .iter()
            .filter(|i| is_behind(&i.version, &entry.version) || spec_changed(i, entry))
            .map(|i| PendingUpgrade {
                instance: i.name.to_string(),
                from: i.version.clone(),
                to: entry.version.clone(),
                progress: upgrade_progress(i, &tasks, &rollout, entry.security, from.now),
            })
            .collect();
        status.catalog.push(TypeStatus {
            service_type: entry.service_type.clone(),
            version: entry.version.clone(),
            instances: of_type.len() as u32,
            rollout,
            pending,
        });
    }
}

/// Where an instance's upgrade is: its task, or why there is none yet.
/// A queued upgrade due later is a retry (the planner enqueues upgrades
/// only inside their window, due at once): its backoff, or the window its
/// retry waits for, is what it waits on.
fn upgrade_progress(
    instance: &Instance,
    tasks: &[Task],
    rollout: &str,
    security: bool,
    now: Timestamp,
) -> String {
    let upgrade = tasks
        .iter()
        .find(|t| t.instance == instance.id && t.kind == TaskKind::Upgrade);
    let window_opens = instance
        .maintenance_window
        .as_deref()
        .filter(|_| !security)
        .and_then(|spec| Window::parse(spec).ok())
        .map(|window| next_run_after(&window, now))
        .filter(|opens| *opens > now);
    match upgrade {
        Some(t) if t.state == TaskState::Running => format!("running (task {})", t.id),
        Some(t) if t.run_after > now && t.attempts == 0 => {
            format!("queued (task {}), due {}", t.id, relative(t.run_after, now))
        }
        Some(t) if t.run_after > now => format!(
            "queued (task {}), retry due {} after {} failed attempt(s): {}",
            t.id,
            relative(t.run_after, now),
            t.attempts,
            t.last_error.as_deref().unwrap_or("no error recorded")
        ),
        Some(t) => format!("queued (task {})", t.id),
        None if rollout != "active" => format!("not planned: rollout {rollout}"),
        None if instance.stopped => "not planned: the instance is stopped".to_owned(),
        None if instance.state != InstanceState::Ready => {
            format!("not planned while {}", instance.state)
        }
        None => match window_opens {
            Some(opens) => format!(
                "waits for its maintenance window, which opens {}",
                relative(opens, now)
            ),
            None => "planned at the next tick (at most max_in_flight at a time)".to_owned(),
        },
    }
}

fn caddy_client(admin: Option<&str>) -> Option<CaddyTraffic> {
    CaddyTraffic::new(crate::adapters::caddy::CaddyConfig {
        admin_addr: admin?.to_owned(),
        request_timeout: std::time::Duration::from_secs(3),
        ..Default::default()
    })
    .ok()
}

/// How many of the newest tasks are searched for a failed instance's
/// failed provision.
const FAILED_REASON_TASKS_MAX: u32 = 1_000;

/// One row per service of `instance` (one row when it has none yet, and
/// one saying why for a failed one).
async fn instance_rows(
    from: &StatusSources<'_>,
    instance: &Instance,
    caddy: Option<&CaddyTraffic>,
    status: &mut Status,
) {
    let active = match from.store.load_active(&instance.name).await {
        Ok(a) => a,
        Err(e) => {
            status.errors.push(format!("{}: {e}", instance.name));
            return;
        }
    };
    let inhibitions = from
        .store
        .load_inhibitions(&instance.name)
        .await
        .unwrap_or_default();
    let base = base_row(instance);
    if instance.state == InstanceState::Failed {
        // #40: why it failed, from its last provision, and the way out.
        let why = failed_reason(from, instance).await;
        let mut row = base;
        row.condition = format!("failed: {why} (`stead instance retry {}`)", instance.name);
        status.rows.push(row);
        return;
    }
    if active.services.is_empty() {
        status.rows.push(base);
        return;
    }
    let decisions = budget_decisions(from, &instance.name, status).await;
    for (service, record) in &active.services {
        let observed = from.runtime.inspect(&record.container).await;
        let key = GenerationKey {
            instance: instance.name.clone(),
            service: service.clone(),
            container: record.container.clone(),
        };
        let budget = from
            .memory
            .and_then(|m| m.generation(&key))
            .and_then(|g| g.budget.clone());
        let mut row = base.clone();
        row.service = service.to_string();
        row.container = record.container.as_str().chars().take(12).collect();
        row.failures = from
            .memory
            .map(|_| budget.as_ref().map_or(0, |b| b.failures));
        let decision = decisions
            .iter()
            .rev()
            .find(|e| e.container.as_ref() == Some(&record.container));
        row.next_attempt = match (from.memory, decision) {
            (Some(_), _) => budget.and_then(|b| b.next_attempt),
            // The daemon's memory is not at hand: the last delay recorded,
            // while it lasts.
            (None, Some(e)) => e.until.filter(|until| *until > from.now),
            (None, None) => None,
        }
        .map(|t| t.to_string());
        row.last_decision = decision.map(|e| e.message.clone());
        row.last_decision_at = decision.map(|e| e.at.to_string());
        row.publication = publication(caddy, &instance.name, service).await;
        row.runtime = match &observed {
            Ok(obs) => obs.status.to_string(),
            Err(e) => format!("({e})"),
        };
        if let Ok(Observation {
            exit: Some(exit), ..
        }) = &observed
        {
            row.exit_code = Some(exit.code);
            row.exited_at = exit.finished_at.map(|t| t.to_string());
        }
        row.condition = condition(instance, &observed, &row.publication);
        row.binds = record
            .binds
            .iter()
            .map(|(c, h)| format!("{c}->{h}"))
            .collect::<Vec<_>>()
            .join(",");
        row.inhibitions = inhibitions
            .iter()
            .filter(|i| &i.service == service)
            .map(inhibition_label)
            .collect();
        status.rows.push(row);
    }
}

/// The row of `instance` before any of its services is looked at: what
/// its own row says, and the services' columns empty.
fn base_row(instance: &Instance) -> StatusRow {
    StatusRow {
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
        condition: "no container yet".into(),
        failures: None,
        next_attempt: None,
        exit_code: None,
        exited_at: None,
        last_decision: None,
        last_decision_at: None,
        publication: "-".into(),
        binds: "-".into(),
        inhibitions: Vec::new(),
        expires_at: instance.expires_at.map(|t| t.to_string()),
        hosts_refused: Vec::new(),
    }
}

/// #40: why a failed instance failed, from its last failed provision.
async fn failed_reason(from: &StatusSources<'_>, instance: &Instance) -> String {
    from.store
        .tasks(true, FAILED_REASON_TASKS_MAX)
        .await
        .ok()
        .and_then(|tasks| {
            tasks.rows.into_iter().find(|t| {
                t.instance == instance.id
                    && t.kind == TaskKind::Provision
                    && t.state == TaskState::Failed
            })
        })
        .and_then(|t| t.last_error)
        .unwrap_or_else(|| "its provision failed".to_owned())
}

/// The newest budget decisions (crash-loop delays, R10) the event log
/// holds of `instance`, oldest first; none if it cannot be read (said in
/// the status's errors).
async fn budget_decisions(
    from: &StatusSources<'_>,
    instance: &InstanceName,
    status: &mut Status,
) -> Vec<Event> {
    let filter = EventFilter {
        instance: Some(instance.clone()),
        kind: Some(EventKind::CrashLoopDelay),
        limit: BUDGET_DECISIONS_READ_MAX,
        ..EventFilter::default()
    };
    match from.store.events(&filter).await {
        Ok(rows) => rows.rows.into_iter().map(|logged| logged.event).collect(),
        Err(e) => {
            status
                .errors
                .push(format!("{instance}: the event log's budget decisions: {e}"));
            Vec::new()
        }
    }
}

/// How many of an instance's newest budget decisions a status reads: the
/// last one of each service is among them unless one service made that
/// many since another's last.
const BUDGET_DECISIONS_READ_MAX: u32 = 64;

/// Whether a service serves, in one word or two. A `ready` instance whose
/// container is down says `down (exited, code 3)`: the state is the
/// lifecycle, this is the present. What the runtime answered is said
/// exactly: a container it says does not exist was removed, which is not
/// a runtime that did not answer.
fn condition(
    instance: &Instance,
    observed: &Result<Observation, RuntimeError>,
    publication: &str,
) -> String {
    let obs = match observed {
        Err(RuntimeError::NotFound) => return "gone (container removed)".to_owned(),
        Err(e) => return format!("unknown (runtime did not answer: {e})"),
        Ok(obs) => obs,
    };
    match obs.status {
        ContainerStatus::Running if instance.stopped => "stopping".to_owned(),
        _ if instance.stopped => "stopped".to_owned(),
        ContainerStatus::Running if publication == "published" => "serving".to_owned(),
        ContainerStatus::Running if publication == "withdrawn" => "running, not routed".to_owned(),
        ContainerStatus::Running => "running".to_owned(),
        s if s.is_transitional() => format!("recovering ({s})"),
        s => match obs.exit {
            Some(exit) => format!("down ({s}, code {})", exit.code),
            None => format!("down ({s})"),
        },
    }
}

/// Whether Caddy holds the service's route right now (`published`), does
/// not (`withdrawn`), or could not say.
async fn publication(
    caddy: Option<&CaddyTraffic>,
    instance: &InstanceName,
    service: &ServiceName,
) -> String {
    let Some(caddy) = caddy else {
        return "-".into();
    };
    let key = crate::core::types::ServiceKey {
        instance: instance.clone(),
        service: service.clone(),
    };
    match caddy.route_status(&key).await {
        Ok(s) if s.is_success() => "published".into(),
        Ok(s) if s.as_u16() == 404 => "withdrawn".into(),
        Ok(s) => format!("(caddy {})", s.as_u16()),
        Err(_) => "(caddy unreachable)".into(),
    }
}

/// A timestamp string of the view, relative to when it was built.
fn when(t: &Option<String>, now: Option<Timestamp>) -> String {
    match (t.as_deref().map(str::parse::<Timestamp>), now) {
        (Some(Ok(t)), Some(now)) => relative(t, now),
        (Some(_), _) => t.clone().unwrap_or_default(),
        (None, _) => "-".into(),
    }
}

/// A row's last exit: `code 3, 12 s ago`; `-` while it runs.
pub fn last_exit(row: &StatusRow, now: Option<Timestamp>) -> String {
    match (row.exit_code, &row.exited_at) {
        (Some(code), Some(_)) => format!("code {code}, {}", when(&row.exited_at, now)),
        (Some(code), None) => format!("code {code}"),
        (None, _) => "-".into(),
    }
}

/// A crash-loop backoff's end: `backoff until in 58 s` (R10); `-` when
/// nothing is delayed.
pub fn backoff(next_attempt: &Option<String>, now: Option<Timestamp>) -> String {
    match next_attempt {
        Some(_) => format!("backoff until {}", when(next_attempt, now)),
        None => "-".into(),
    }
}

/// One service's detail lines under `stead instance show`: whether it is
/// up, how its last execution ended, its crash-loop budget and the last
/// budget decision, each exact and with its time.
pub fn render_service(row: &StatusRow, now: Timestamp) -> String {
    let now_opt = Some(now);
    let at = |t: &Option<String>| match t {
        Some(text) => format!(" at {text} ({})", when(t, now_opt)),
        None => String::new(),
    };
    let mut out = format!("  condition: {}\n", row.condition);
    if let Some(code) = row.exit_code {
        out.push_str(&format!("  last exit: code {code}{}\n", at(&row.exited_at)));
    }
    let failures = match row.failures {
        Some(n) => format!("{n} failure(s) in a row"),
        None => "failures: in the running daemon's memory only (R17)".to_owned(),
    };
    out.push_str(&match &row.next_attempt {
        Some(next) => format!(
            "  budget: {failures}; backoff until {next} ({}), the next attempt then (R10)\n",
            when(&row.next_attempt, now_opt)
        ),
        None => format!("  budget: {failures}; no backoff, the next attempt is not delayed\n"),
    });
    if let Some(decision) = &row.last_decision {
        out.push_str(&format!(
            "  last budget decision{}: {decision}\n",
            at(&row.last_decision_at)
        ));
    }
    out
}

/// The tables `stead status` prints.
pub fn render_status(status: &Status) -> String {
    let now = status.generated_at.parse::<Timestamp>().ok();
    let mut rows = vec![[
        "INSTANCE",
        "STATE",
        "INTENT",
        "VERSION",
        "SERVICE",
        "GENERATION",
        "RUNTIME",
        "CONDITION",
        "LAST EXIT",
        "PUBLICATION",
        "FAILURES",
        "NEXT ATTEMPT",
        "INHIBITIONS",
        "EXPIRES",
    ]
    .map(str::to_owned)
    .to_vec()];
    for r in &status.rows {
        rows.push(vec![
            r.instance.clone(),
            r.state.clone(),
            r.intent.clone(),
            r.version.clone(),
            r.service.clone(),
            r.container.clone(),
            r.runtime.clone(),
            r.condition.clone(),
            last_exit(r, now),
            r.publication.clone(),
            r.failures.map_or("-".into(), |f| f.to_string()),
            backoff(&r.next_attempt, now),
            if r.inhibitions.is_empty() {
                "-".into()
            } else {
                r.inhibitions.join(" ")
            },
            when(&r.expires_at, now),
        ]);
    }
    let mut out = if status.rows.is_empty() {
        "no instances (create one with `stead instance create NAME --type TYPE`)\n".to_owned()
    } else {
        table(&rows)
    };
    if !status.releases.is_empty() {
        out.push('\n');
        out.push_str(&render_releases(status));
    }
    out.push('\n');
    out.push_str(&render_catalog(status));
    match &status.reconciler {
        Some(lease) => out.push_str(&format!(
            "reconciler: {} (lease until {})\n",
            lease.holder,
            when(&Some(lease.expires_at.clone()), now)
        )),
        None => out.push_str("reconciler: none holds the lease (no daemon running?)\n"),
    }
    if !status.budgets_live {
        out.push_str(
            "budgets: not shown; they live in the daemon's memory only (R17, docs/rules.md#r17); \
             `stead status --live` asks the running daemon\n",
        );
    }
    for e in &status.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

fn render_releases(status: &Status) -> String {
    let mut rows = vec![[
        "INSTANCE",
        "STATE",
        "VERSION",
        "NAMESPACE",
        "RELEASE",
        "REVISION",
        "CHART",
        "HELM SAYS",
    ]
    .map(str::to_owned)
    .to_vec()];
    for r in &status.releases {
        rows.push(vec![
            r.instance.clone(),
            r.state.clone(),
            r.version.clone(),
            r.namespace.clone(),
            r.release.clone(),
            r.revision.map_or("-".into(), |n| n.to_string()),
            r.chart.clone(),
            if r.description.is_empty() {
                "-".into()
            } else {
                r.description.clone()
            },
        ]);
    }
    format!(
        "Helm releases (Kubernetes recovers these):\n{}",
        table(&rows)
    )
}

fn render_catalog(status: &Status) -> String {
    let mut rows = vec![[
        "TYPE",
        "CATALOG VERSION",
        "INSTANCES",
        "ROLLOUT",
        "PENDING UPGRADES",
    ]
    .map(str::to_owned)
    .to_vec()];
    for t in &status.catalog {
        rows.push(vec![
            t.service_type.clone(),
            t.version.clone(),
            t.instances.to_string(),
            t.rollout.clone(),
            t.pending.len().to_string(),
        ]);
    }
    let mut out = table(&rows);
    for t in &status.catalog {
        for p in &t.pending {
            out.push_str(&format!(
                "  upgrade {} {} -> {}: {}\n",
                p.instance, p.from, p.to, p.progress
            ));
        }
    }
    for halted in &status.halted_rollouts {
        out.push_str(&format!("halted rollout {halted}\n"));
    }
    out
}

/// One instance as `stead instance list --json` prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InstanceView {
    pub id: i64,
    pub name: String,
    pub service_type: String,
    pub team: String,
    pub version: String,
    pub state: String,
    pub intent: String,
    pub expires_at: Option<String>,
    pub maintenance_window: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// Given at `instance create --set` (not secrets: those never reach
    /// the store).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// `instance delete --purge-volumes` was asked for.
    #[serde(default)]
    pub purge_volumes: bool,
    /// Public host names given at `instance create --domain` (#54).
    #[serde(default)]
    pub domains: Vec<String>,
}

impl From<&Instance> for InstanceView {
    fn from(i: &Instance) -> Self {
        Self {
            id: i.id,
            name: i.name.to_string(),
            service_type: i.service_type.clone(),
            team: i.team.clone(),
            version: i.version.clone(),
            state: i.state.to_string(),
            intent: if i.stopped { "stopped" } else { "running" }.to_owned(),
            expires_at: i.expires_at.map(|t| t.to_string()),
            maintenance_window: i.maintenance_window.clone(),
            created_at: i.created_at.to_string(),
            updated_at: i.updated_at.to_string(),
            parameters: i.parameters.clone(),
            purge_volumes: i.purge_volumes,
            domains: i.domains.clone(),
        }
    }
}

/// `stead instance list`.
pub fn render_instances(instances: &[InstanceView], now: Timestamp) -> String {
    let mut rows = vec![[
        "NAME", "TYPE", "TEAM", "VERSION", "INTENT", "STATE", "EXPIRES", "CREATED",
    ]
    .map(str::to_owned)
    .to_vec()];
    for i in instances {
        rows.push(vec![
            i.name.clone(),
            i.service_type.clone(),
            i.team.clone(),
            i.version.clone(),
            i.intent.clone(),
            i.state.clone(),
            when(&i.expires_at, Some(now)),
            when(&Some(i.created_at.clone()), Some(now)),
        ]);
    }
    table(&rows)
}

/// One task as `stead task list --json` prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskView {
    pub id: i64,
    pub kind: String,
    pub instance: String,
    pub instance_id: i64,
    pub state: String,
    pub attempts: u32,
    pub run_after: String,
    pub locked_by: Option<String>,
    pub locked_at: Option<String>,
    pub reason: String,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl TaskView {
    /// `names` maps instance ids to names (a deleted instance whose name was
    /// reused is gone; its id is shown instead).
    pub fn new(t: &Task, names: &BTreeMap<i64, String>) -> Self {
        Self {
            id: t.id,
            kind: t.kind.to_string(),
            instance: names
                .get(&t.instance)
                .cloned()
                .unwrap_or_else(|| format!("#{}", t.instance)),
            instance_id: t.instance,
            state: t.state.to_string(),
            attempts: t.attempts,
            run_after: t.run_after.to_string(),
            locked_by: t.locked_by.clone(),
            locked_at: t.locked_at.map(|x| x.to_string()),
            reason: t.reason.clone(),
            last_error: t.last_error.clone(),
            traceparent: t.traceparent.clone(),
            created_at: t.created_at.to_string(),
            updated_at: t.updated_at.to_string(),
        }
    }
}

/// Longest last error shown in the task table (`--json` has all of it).
const TASK_ERROR_LEN_MAX: usize = 80;

/// `stead task list`.
pub fn render_tasks(tasks: &[TaskView], now: Timestamp) -> String {
    let mut rows = vec![[
        "ID",
        "KIND",
        "INSTANCE",
        "STATE",
        "ATTEMPTS",
        "RUN AFTER",
        "LOCKED BY",
        "REASON",
        "LAST ERROR",
    ]
    .map(str::to_owned)
    .to_vec()];
    for t in tasks {
        let mut error = t.last_error.clone().unwrap_or_else(|| "-".into());
        if error.chars().count() > TASK_ERROR_LEN_MAX {
            error = error.chars().take(TASK_ERROR_LEN_MAX).collect::<String>() + "…";
        }
        rows.push(vec![
            t.id.to_string(),
            t.kind.clone(),
            t.instance.clone(),
            t.state.clone(),
            t.attempts.to_string(),
            when(&Some(t.run_after.clone()), Some(now)),
            t.locked_by.clone().unwrap_or_else(|| "-".into()),
            t.reason.clone(),
            error,
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baking_predecessor_shows_its_way_back_and_until_when() {
        use crate::core::types::{ContainerId, InhibitionReason, RevertTo};
        let until: Timestamp = "2026-12-05T10:05:00.123Z".parse().unwrap();
        let marker = Inhibition {
            service: ServiceName::new("web"),
            container: ContainerId::new("0123456789abcdef"),
            reason: InhibitionReason::RetirementPending,
            operation: "upgrade".into(),
            created_at: until,
            stop_grace: None,
            revert_to: Some(RevertTo {
                revision: "1.abc".into(),
                binds: Default::default(),
                version: "1".into(),
                spec_digest: None,
                until,
                hold: None,
                stop_first: false,
                undone: false,
            }),
        };
        assert_eq!(
            inhibition_label(&marker),
            "retirement-pending:0123456789ab (way back to 1 until 2026-12-05T10:05:00Z)"
        );
        let plain = Inhibition {
            revert_to: None,
            ..marker
        };
        assert_eq!(inhibition_label(&plain), "retirement-pending:0123456789ab");
    }

    fn instance(state: InstanceState, stopped: bool) -> Instance {
        let at: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
        Instance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            purge_volumes: false,
            id: 1,
            name: InstanceName::new("demo"),
            team: "t".into(),
            service_type: "web".into(),
            version: "1".into(),
            state,
            stopped,
            expires_at: None,
            maintenance_window: None,
            created_at: at,
            updated_at: at,
        }
    }

    fn seen(status: ContainerStatus, exit_code: Option<i64>) -> Result<Observation, RuntimeError> {
        Ok(Observation {
            status,
            started_at: None,
            exit: exit_code.map(|code| crate::core::types::Exit {
                code,
                finished_at: None,
            }),
        })
    }

    #[test]
    fn a_ready_instance_whose_container_is_down_says_so() {
        let ready = instance(InstanceState::Ready, false);
        assert_eq!(
            condition(&ready, &seen(ContainerStatus::Exited, None), "withdrawn"),
            "down (exited)"
        );
        assert_eq!(
            condition(&ready, &seen(ContainerStatus::Exited, Some(3)), "withdrawn"),
            "down (exited, code 3)"
        );
        assert_eq!(
            condition(&ready, &seen(ContainerStatus::Running, None), "published"),
            "serving"
        );
        assert_eq!(
            condition(&ready, &seen(ContainerStatus::Running, None), "withdrawn"),
            "running, not routed"
        );
        let stopped = instance(InstanceState::Ready, true);
        assert_eq!(
            condition(&stopped, &seen(ContainerStatus::Exited, None), "withdrawn"),
            "stopped"
        );
    }

    #[test]
    fn a_removed_container_is_not_a_runtime_that_did_not_answer() {
        let ready = instance(InstanceState::Ready, false);
        assert_eq!(
            condition(&ready, &Err(RuntimeError::NotFound), "-"),
            "gone (container removed)"
        );
        assert_eq!(
            condition(
                &ready,
                &Err(RuntimeError::Transient("timed out".into())),
                "-"
            ),
            "unknown (runtime did not answer: runtime error: timed out)"
        );
    }

    #[test]
    fn the_status_table_says_when_not_at_what_time() {
        let status = Status {
            generated_at: "2026-11-30T00:00:00Z".into(),
            rows: vec![StatusRow {
                instance: "demo".into(),
                state: "ready".into(),
                intent: "running".into(),
                version: "1".into(),
                service: "http".into(),
                container: "abc".into(),
                runtime: "exited".into(),
                condition: "down (exited)".into(),
                failures: Some(3),
                next_attempt: Some("2026-11-30T00:00:58Z".into()),
                exit_code: Some(3),
                exited_at: Some("2026-11-29T23:59:58Z".into()),
                last_decision: None,
                last_decision_at: None,
                publication: "withdrawn".into(),
                binds: "8080->32768".into(),
                inhibitions: vec![],
                expires_at: None,
                hosts_refused: vec![],
            }],
            budgets_live: true,
            halted_rollouts: vec!["web: upgrade of demo failed".into()],
            ..Default::default()
        };
        let text = render_status(&status);
        assert!(text.contains("backoff until in 58 s"), "{text}");
        assert!(text.contains("code 3, 2 s ago"), "{text}");
        assert!(text.contains("down (exited)"), "{text}");
        assert!(
            text.contains("halted rollout web: upgrade of demo failed"),
            "{text}"
        );
    }
}
