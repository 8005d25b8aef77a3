//! Rows as the database holds them, and their checked conversion into the
//! core's types. Every field read from outside is validated here; a value
//! stead does not know becomes a [`StoreError::BadRow`] naming table, id,
//! field and value, never a panic and never a silent default. Instance and
//! service names must pass the name rule (`core::names`), and container IDs
//! must be IDs or names the runtime could be asked about.

use std::time::Duration;

use std::collections::BTreeMap;

use crate::core::fleet::{
    Instance, InstanceId, InstanceState, ListedInstance, RolloutState, Task, TaskKind, TaskState,
};
use crate::core::names::{self, NameError};
use crate::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, Inhibition, InhibitionReason, InstanceName,
    RevertTo, ServiceName, Timestamp,
};
use crate::ports::{
    LeaseGrant, LoadedInstance, LoadedInstances, RolloutRecord, Rows, StoreError, TypeVersion,
};
use crate::store::{
    duration_to_ms, execution_start_from_ns, timestamp_from_us, timestamp_to_us, ReconcilerLeaseRow,
};

/// Longest value quoted back in a [`StoreError::BadRow`]; a bad row may hold
/// anything, and an error message is no place for a megabyte of it.
const BAD_VALUE_LEN_MAX: usize = 64;

/// A name read back from a row, checked against its rule (T6): a name that
/// breaks it never reaches a container name, an admin path or a host
/// matcher, and its row is reported as bad beside the good ones.
fn check_name(
    table: &'static str,
    id: &str,
    field: &'static str,
    value: &str,
    rule: fn(&str, &str) -> Result<(), NameError>,
) -> Result<(), StoreError> {
    rule(field, value).map_err(|_| bad_row(table, id, field, value))
}

pub fn bad_row(
    table: &'static str,
    id: impl ToString,
    field: &'static str,
    value: &str,
) -> StoreError {
    StoreError::BadRow {
        table,
        id: id.to_string(),
        field,
        value: value.chars().take(BAD_VALUE_LEN_MAX).collect(),
    }
}

fn timestamp(
    table: &'static str,
    id: &str,
    field: &'static str,
    us: i64,
) -> Result<Timestamp, StoreError> {
    timestamp_from_us(us).ok_or_else(|| bad_row(table, id, field, &us.to_string()))
}

fn grace(
    table: &'static str,
    id: &str,
    field: &'static str,
    ms: i64,
) -> Result<Duration, StoreError> {
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| bad_row(table, id, field, &ms.to_string()))
}

pub fn encode_grace(grace: Option<Duration>) -> Option<i64> {
    grace.map(duration_to_ms)
}

pub fn encode_timestamp(ts: Option<Timestamp>) -> Option<i64> {
    ts.map(timestamp_to_us)
}

/// Binds are stored as a JSON object, container port → host port.
pub fn encode_parameters(parameters: &std::collections::BTreeMap<String, String>) -> String {
    serde_json::to_string(parameters).expect("a map of strings always serialises")
}

/// Host names given at create are stored as a JSON array of strings.
pub fn encode_domains(domains: &[String]) -> String {
    serde_json::to_string(domains).expect("a list of strings always serialises")
}

/// A row's given host names: a JSON array of DNS names, or the row is bad
/// (a name that is not one would be published as a route's host).
fn decode_domains(id: &str, text: &str) -> Result<Vec<String>, StoreError> {
    let bad = || bad_row("instances", id, "domains", text);
    let domains: Vec<String> = serde_json::from_str(text).map_err(|_| bad())?;
    if domains
        .iter()
        .any(|d| names::check_dns_name("domains", d).is_err())
    {
        return Err(bad());
    }
    Ok(domains)
}

pub fn encode_binds(binds: &Binds) -> String {
    serde_json::to_string(binds).expect("a map of integers always serialises")
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub struct InstanceRow {
    pub id: i64,
    pub name: String,
    pub team: String,
    pub service_type: String,
    pub version: String,
    pub state: String,
    #[serde(deserialize_with = "bool_of_int")]
    pub stopped: bool,
    pub expires_at_us: Option<i64>,
    pub maintenance_window: Option<String>,
    pub created_at_us: i64,
    pub updated_at_us: i64,
    /// A JSON object of strings.
    pub parameters: String,
    #[serde(deserialize_with = "bool_of_int")]
    pub purge_volumes: bool,
    pub spec_digest: Option<String>,
    /// A JSON array of host names.
    pub domains: String,
}

/// An instance row as a whole recovery pass lists it
/// ([`crate::ports::Store::list_for_recovery`]).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub struct ListedRow {
    pub id: i64,
    pub name: String,
    pub service_type: String,
    pub state: String,
}

/// The state and name of instance row `id`, checked as every read of the
/// row checks them, a recovery pass's listing included (T6).
fn state_and_name(
    id: &str,
    state: &str,
    name: String,
) -> Result<(InstanceState, InstanceName), StoreError> {
    const T: &str = "instances";
    let state = InstanceState::parse(state).map_err(|_| bad_row(T, id, "state", state))?;
    check_name(T, id, "name", &name, names::check_instance_name)?;
    Ok((state, InstanceName::new(name)))
}

impl ListedRow {
    pub fn decode(self) -> Result<ListedInstance, StoreError> {
        let (state, name) = state_and_name(&self.id.to_string(), &self.state, self.name)?;
        Ok(ListedInstance {
            id: self.id,
            name,
            service_type: self.service_type,
            state,
        })
    }
}

impl InstanceRow {
    pub fn decode(self) -> Result<Instance, StoreError> {
        const T: &str = "instances";
        let id = self.id.to_string();
        let (state, name) = state_and_name(&id, &self.state, self.name)?;
        Ok(Instance {
            id: self.id,
            name,
            team: self.team,
            service_type: self.service_type,
            version: self.version,
            state,
            stopped: self.stopped,
            expires_at: self
                .expires_at_us
                .map(|us| timestamp(T, &id, "expires_at_us", us))
                .transpose()?,
            maintenance_window: self.maintenance_window,
            created_at: timestamp(T, &id, "created_at_us", self.created_at_us)?,
            updated_at: timestamp(T, &id, "updated_at_us", self.updated_at_us)?,
            parameters: serde_json::from_str(&self.parameters)
                .map_err(|_| bad_row(T, &id, "parameters", &self.parameters))?,
            purge_volumes: self.purge_volumes,
            spec_digest: self.spec_digest,
            domains: decode_domains(&id, &self.domains)?,
        })
    }
}

/// A row of the event log.
#[derive(Debug, sqlx::FromRow)]
pub struct EventRow {
    pub id: i64,
    pub at_us: i64,
    pub kind: String,
    pub instance: Option<String>,
    pub service: Option<String>,
    pub container: Option<String>,
    pub reason: String,
    pub message: String,
    pub until_us: Option<i64>,
    pub trace_id: Option<String>,
    pub task_id: Option<i64>,
    pub writer: String,
    pub team: Option<String>,
}

impl EventRow {
    pub fn decode(self) -> Result<crate::core::event_log::LoggedEvent, StoreError> {
        use crate::core::event_log::{Event, EventKind, LoggedEvent};
        const T: &str = "events";
        let id = self.id.to_string();
        let kind = EventKind::parse(&self.kind).map_err(|_| bad_row(T, &id, "kind", &self.kind))?;
        if let Some(name) = &self.instance {
            check_name(T, &id, "instance", name, names::check_instance_name)?;
        }
        if let Some(name) = &self.service {
            check_name(T, &id, "service", name, names::check_dns_label)?;
        }
        if let Some(container) = &self.container {
            check_name(T, &id, "container", container, names::check_container_ref)?;
        }
        Ok(LoggedEvent {
            id: self.id,
            event: Event {
                at: timestamp(T, &id, "at_us", self.at_us)?,
                kind,
                instance: self.instance.map(InstanceName::new),
                service: self.service.map(ServiceName::new),
                container: self.container.map(ContainerId::new),
                reason: self.reason,
                message: self.message,
                until: self
                    .until_us
                    .map(|us| timestamp(T, &id, "until_us", us))
                    .transpose()?,
                task: self.task_id,
                trace_id: self.trace_id,
                writer: self.writer,
                team: self.team,
            },
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub struct TaskRow {
    pub id: i64,
    pub kind: String,
    pub instance_id: i64,
    pub state: String,
    pub run_after_us: i64,
    pub locked_by: Option<String>,
    pub locked_at_us: Option<i64>,
    pub attempts: i64,
    pub reason: String,
    pub last_error: Option<String>,
    pub traceparent: Option<String>,
    pub created_at_us: i64,
    pub updated_at_us: i64,
}

impl TaskRow {
    pub fn decode(self) -> Result<Task, StoreError> {
        const T: &str = "tasks";
        let id = self.id.to_string();
        let kind = TaskKind::parse(&self.kind).map_err(|_| bad_row(T, &id, "kind", &self.kind))?;
        let state =
            TaskState::parse(&self.state).map_err(|_| bad_row(T, &id, "state", &self.state))?;
        let attempts = u32::try_from(self.attempts)
            .map_err(|_| bad_row(T, &id, "attempts", &self.attempts.to_string()))?;
        Ok(Task {
            id: self.id,
            kind,
            instance: self.instance_id,
            state,
            run_after: timestamp(T, &id, "run_after_us", self.run_after_us)?,
            locked_by: self.locked_by,
            locked_at: self
                .locked_at_us
                .map(|us| timestamp(T, &id, "locked_at_us", us))
                .transpose()?,
            attempts,
            reason: self.reason,
            last_error: self.last_error,
            traceparent: self.traceparent,
            created_at: timestamp(T, &id, "created_at_us", self.created_at_us)?,
            updated_at: timestamp(T, &id, "updated_at_us", self.updated_at_us)?,
        })
    }
}

/// Sorts claimed tasks into claim order: `RETURNING` promises no order.
pub fn claim_order(tasks: &mut [Task]) {
    tasks.sort_by_key(|t| (t.run_after, t.id));
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub struct ActiveRow {
    pub instance_id: i64,
    pub service: String,
    pub container_id: String,
    pub effective_revision: String,
    pub backend_binds: String,
    pub stop_grace_ms: Option<i64>,
    pub verified_started_at_ns: Option<i64>,
}

impl ActiveRow {
    pub fn decode(self) -> Result<(ServiceName, ActiveService), StoreError> {
        const T: &str = "active_services";
        let id = format!("{}/{}", self.instance_id, self.service);
        check_name(T, &id, "service", &self.service, names::check_dns_label)?;
        check_name(
            T,
            &id,
            "container_id",
            &self.container_id,
            names::check_container_ref,
        )?;
        let binds: Binds = serde_json::from_str(&self.backend_binds)
            .map_err(|_| bad_row(T, &id, "backend_binds", &self.backend_binds))?;
        let active = ActiveService {
            container: ContainerId::new(self.container_id),
            effective_revision: self.effective_revision,
            binds,
            stop_grace: self
                .stop_grace_ms
                .map(|ms| grace(T, &id, "stop_grace_ms", ms))
                .transpose()?,
            verified_started_at: self
                .verified_started_at_ns
                .map(|ns| {
                    execution_start_from_ns(ns)
                        .ok_or_else(|| bad_row(T, &id, "verified_started_at_ns", &ns.to_string()))
                })
                .transpose()?,
        };
        Ok((ServiceName::new(self.service), active))
    }
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub struct InhibitionRow {
    pub instance_id: i64,
    pub service: String,
    pub container_id: String,
    pub reason: String,
    pub operation: String,
    pub created_at_us: i64,
    pub stop_grace_ms: Option<i64>,
    pub revert_to: Option<String>,
}

impl InhibitionRow {
    pub fn decode(self) -> Result<Inhibition, StoreError> {
        const T: &str = "inhibitions";
        let id = format!(
            "{}/{}/{}",
            self.instance_id, self.service, self.container_id
        );
        check_name(T, &id, "service", &self.service, names::check_dns_label)?;
        check_name(
            T,
            &id,
            "container_id",
            &self.container_id,
            names::check_container_ref,
        )?;
        Ok(Inhibition {
            created_at: timestamp(T, &id, "created_at_us", self.created_at_us)?,
            stop_grace: self
                .stop_grace_ms
                .map(|ms| grace(T, &id, "stop_grace_ms", ms))
                .transpose()?,
            service: ServiceName::new(self.service),
            container: ContainerId::new(self.container_id),
            reason: InhibitionReason::parse(&self.reason),
            operation: self.operation,
            revert_to: self
                .revert_to
                .map(|json| {
                    serde_json::from_str(&json).map_err(|_| bad_row(T, &id, "revert_to", &json))
                })
                .transpose()?,
        })
    }
}

/// The way back of a baking upgrade's marker, as its JSON column.
pub fn encode_revert_to(revert_to: Option<&RevertTo>) -> Option<String> {
    revert_to.map(|r| serde_json::to_string(r).expect("a RevertTo always serializes"))
}

/// Inhibitions in key order (service, container), whatever the database's
/// collation: byte order, like the in-memory model.
pub fn inhibition_order(inhibitions: &mut [Inhibition]) {
    inhibitions.sort_by(|a, b| (&a.service, &a.container).cmp(&(&b.service, &b.container)));
}

pub fn decode_rollout(
    service_type: String,
    state: String,
) -> Result<(String, RolloutState), StoreError> {
    let rollout = RolloutState::parse(&state)
        .map_err(|_| bad_row("rollouts", &service_type, "state", &state))?;
    Ok((service_type, rollout))
}

pub fn decode_rollout_record(
    (service_type, state, reason, updated_at_us, pinned): (
        String,
        String,
        String,
        i64,
        Option<String>,
    ),
) -> Result<RolloutRecord, StoreError> {
    let (service_type, state) = decode_rollout(service_type, state)?;
    let updated_at = timestamp("rollouts", &service_type, "updated_at_us", updated_at_us)?;
    Ok(RolloutRecord {
        service_type,
        state,
        reason,
        updated_at,
        pinned,
    })
}

pub fn decode_type_version(
    (service_type, version, spec_digest, source, recorded_at_us): (
        String,
        String,
        String,
        String,
        i64,
    ),
) -> Result<TypeVersion, StoreError> {
    let key = format!("{service_type} {version}");
    let recorded_at = timestamp("type_versions", &key, "recorded_at_us", recorded_at_us)?;
    Ok(TypeVersion {
        service_type,
        version,
        spec_digest,
        source,
        recorded_at,
    })
}

/// A `host_reservations` row joined with its instance's name (#54): every
/// name checked against its rule, since a host becomes a matcher and a
/// certificate's subject (T6).
pub fn decode_host_reservation(
    (host, instance, service, created_at_us): (String, String, String, i64),
) -> Result<crate::core::hosts::HostReservation, StoreError> {
    const T: &str = "host_reservations";
    check_name(T, &host, "host", &host, names::check_dns_name)?;
    check_name(T, &host, "instance", &instance, names::check_instance_name)?;
    check_name(T, &host, "service", &service, names::check_dns_label)?;
    let created_at = timestamp(T, &host, "created_at_us", created_at_us)?;
    Ok(crate::core::hosts::HostReservation {
        host,
        instance: InstanceName::new(instance),
        service: ServiceName::new(service),
        created_at,
    })
}

/// The lease row as read, with the database's clock at the read (`now_us`):
/// every lease decision is timed by the database, never by a host (T2).
#[derive(Debug, sqlx::FromRow)]
pub struct LeaseRow {
    pub holder: Option<String>,
    pub epoch: i64,
    pub expires_at_us: Option<i64>,
    pub now_us: i64,
}

impl LeaseRow {
    /// The row and the database's time it was read at.
    pub fn decode(self) -> (ReconcilerLeaseRow, i64) {
        (
            ReconcilerLeaseRow {
                holder: self.holder,
                epoch: self.epoch,
                expires_at_us: self.expires_at_us,
            },
            self.now_us,
        )
    }
}

/// The grant a freshly written lease row represents. Only fails if the row
/// was not written by [`ReconcilerLeaseRow::acquire`].
pub fn lease_grant(row: &ReconcilerLeaseRow) -> Result<LeaseGrant, StoreError> {
    row.grant().ok_or_else(|| {
        bad_row(
            "reconciler_lease",
            1,
            "expires_at_us",
            &format!("{:?}", row.expires_at_us),
        )
    })
}

/// Splits decoded rows into good rows and per-row errors.
pub fn collect_rows<T>(decoded: impl Iterator<Item = Result<T, StoreError>>) -> Rows<T> {
    let mut rows = Rows {
        rows: Vec::new(),
        bad: Vec::new(),
    };
    for row in decoded {
        match row {
            Ok(row) => rows.rows.push(row),
            Err(error) => rows.bad.push(error),
        }
    }
    rows
}

/// Every known state with its count (zero when absent), for the gauges.
/// Unknown states are left out here; `list_instances` reports those rows.
pub fn count_states(rows: Vec<(String, i64)>) -> BTreeMap<InstanceState, u64> {
    let mut counts: BTreeMap<InstanceState, u64> =
        InstanceState::ALL.into_iter().map(|s| (s, 0)).collect();
    for (state, n) in rows {
        if let Ok(state) = InstanceState::parse(&state) {
            counts.insert(state, u64::try_from(n).unwrap_or(0));
        }
    }
    counts
}

pub fn found_or(found: bool, id: InstanceId) -> Result<(), StoreError> {
    if found {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("instance {id}")))
    }
}

pub fn instance_found_or(found: bool, name: &InstanceName) -> Result<(), StoreError> {
    if found {
        Ok(())
    } else {
        Err(StoreError::NotFound(format!("instance {name}")))
    }
}

/// A boolean column as SQLite's JSON functions render it: the integer 0
/// or 1 (the columns' CHECK constraints admit nothing else).
fn bool_of_int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match <i64 as serde::Deserialize>::deserialize(d)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(serde::de::Error::custom(format!(
            "{other} is not a boolean (0 or 1)"
        ))),
    }
}

/// A row as read: its columns, or why they could not be read, with the
/// id of the instance it belongs to (so only that instance fails).
pub type ReadRow<T> = Result<T, (InstanceId, StoreError)>;

/// The rows of one batch of instances: their instance rows, ACTIVE rows
/// and inhibitions.
pub type BatchRows = (
    Vec<ReadRow<InstanceRow>>,
    Vec<ReadRow<ActiveRow>>,
    Vec<ReadRow<InhibitionRow>>,
);

/// Rows sqlx decoded (a row it cannot decode fails the whole read).
pub fn read_rows<T>(rows: Vec<T>) -> Vec<ReadRow<T>> {
    rows.into_iter().map(Ok).collect()
}

/// The instance a row belongs to, and the row or why it could not be read.
fn with_owner<T>(
    row: ReadRow<T>,
    instance_id: fn(&T) -> InstanceId,
) -> (InstanceId, Result<T, StoreError>) {
    match row {
        Ok(row) => (instance_id(&row), Ok(row)),
        Err((id, e)) => (id, Err(e)),
    }
}

/// [`LoadedInstances`] from the three batch reads: each instance with its
/// own ACTIVE and inhibitions, or the first of its rows that did not
/// decode.
pub fn assemble_loaded(
    instances: Vec<ReadRow<InstanceRow>>,
    active: Vec<ReadRow<ActiveRow>>,
    inhibitions: Vec<ReadRow<InhibitionRow>>,
) -> LoadedInstances {
    let mut loaded: LoadedInstances = instances
        .into_iter()
        .map(|row| {
            let (id, row) = with_owner(row, |row| row.id);
            let instance = row
                .and_then(InstanceRow::decode)
                .map(|instance| LoadedInstance {
                    instance,
                    active: ActiveRecord::default(),
                    inhibitions: Vec::new(),
                });
            (id, instance)
        })
        .collect();
    for row in active {
        let (id, row) = with_owner(row, |row| row.instance_id);
        if let Some(Ok(entry)) = loaded.get_mut(&id) {
            match row.and_then(ActiveRow::decode) {
                Ok((service, record)) => {
                    entry.active.services.insert(service, record);
                }
                Err(e) => {
                    loaded.insert(id, Err(e));
                }
            }
        }
    }
    for row in inhibitions {
        let (id, row) = with_owner(row, |row| row.instance_id);
        if let Some(Ok(entry)) = loaded.get_mut(&id) {
            match row.and_then(InhibitionRow::decode) {
                Ok(inhibition) => entry.inhibitions.push(inhibition),
                Err(e) => {
                    loaded.insert(id, Err(e));
                }
            }
        }
    }
    for entry in loaded.values_mut().flatten() {
        inhibition_order(&mut entry.inhibitions);
    }
    loaded
}
