//! The in-memory store: the model every SQL backend is checked against, and
//! the store of unit tests and the simulation.
//!
//! Deterministic (ordered maps, ids assigned in sequence), std-only (a std
//! `Mutex`, no tokio, no sqlx), so it builds and runs under madsim. Every
//! method takes the lock once and does all its work under it, which makes each
//! call atomic exactly as a transaction makes a SQL call atomic.
//!
//! Fault hooks for the simulation: [`MemoryStore::set_unavailable`] makes
//! every call fail as a database outage would, and
//! [`MemoryStore::fail_next_calls`] fails the next few calls only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

#[path = "store_tenancy.rs"]
mod tenancy;

use crate::mutants::{self, Mutant};
use crate::ports::{Effect, Observer};
use stead::core::event_log::{Event, EventFilter, LoggedEvent};
use stead::core::fleet::{
    Instance, InstanceId, InstanceState, ListedInstance, NewTask, RolloutState, Task, TaskId,
    TaskKind, TaskState, CANCELLED_BY_DELETION,
};
use stead::core::succession::{succession, Succession};
use stead::core::types::{
    ActiveRecord, ActiveService, Binds, ContainerId, Inhibition, InhibitionReason, InstanceName,
    ServiceKey, ServiceName, Timestamp,
};
use stead::engine::SystemClock;
use stead::ports::Clock;
use stead::ports::{
    Expired, LeaseGrant, LoadedInstance, LoadedInstances, LockGrant, LockedWrite, NewInstance,
    RolloutRecord, Rows, Store, StoreError, TypeVersion, WaysBack,
};
use stead::store::{
    fenced, lease_cutoff_us, lease_to_us, lock_admits, lock_lost, name_held_by_task, name_taken,
    normalize_duration, normalize_execution_start, normalize_timestamp, timestamp_from_us,
    timestamp_to_us, ReconcilerLeaseRow,
};

mod hosts;

/// Whether `holder` is a new incarnation of the identity that holds the
/// unexpired lease `row` (the case T1 lets take it back at once).
fn held_by_own_past(row: &ReconcilerLeaseRow, holder: &str, now_us: i64) -> bool {
    let unexpired = row.expires_at_us.is_some_and(|e| now_us < e);
    row.holder
        .as_deref()
        .is_some_and(|current| succession(current, holder) == Succession::Predecessor && unexpired)
}

/// An in-memory [`Store`]. Cheap to create; share it behind an `Arc`.
pub struct MemoryStore {
    state: Mutex<State>,
    /// Told whenever binds reach ACTIVE, so the simulation can check S7.
    observer: Option<Arc<dyn Observer>>,
    /// The database's clock: leases, instance locks and fences are timed
    /// by it, never by the caller's (T2).
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            observer: None,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Tokens and quota charges (#54): `tenancy.rs`.
    tenancy: tenancy::TenancyState,
    unavailable: bool,
    /// Calls left to fail before the store answers again.
    failing_calls: u32,
    /// An instance row that does not decode (another tool wrote a value
    /// stead does not know), and which of its fields: listed and loaded as
    /// a bad row where a read decodes that field.
    garbled: Option<(InstanceId, Garbled)>,
    n_calls: u64,
    instances: BTreeMap<InstanceId, Instance>,
    /// The index the SQL stores keep on `instances.name`: names never
    /// change, and a deleted instance's row leaves with its name.
    names: BTreeMap<InstanceName, InstanceId>,
    active: BTreeMap<(InstanceId, ServiceName), ActiveService>,
    inhibitions: BTreeMap<(InstanceId, ServiceName, ContainerId), Inhibition>,
    tasks: BTreeMap<TaskId, Task>,
    rollouts: BTreeMap<String, RolloutRecord>,
    /// (type, version) → its recording; the history's order is each
    /// recording's time, then its version, as the SQL stores order it.
    type_versions: BTreeMap<(String, String, String), TypeVersion>,
    lease: Option<ReconcilerLeaseRow>,
    /// T3: instance → (holder, expiry by the store's clock).
    /// The holder is shared by every row it holds, as a pass takes
    /// thousands at once.
    instance_locks: BTreeMap<InstanceId, (Arc<str>, i64)>,
    next_instance_id: InstanceId,
    next_task_id: TaskId,
    /// The event log, in id order.
    events: Vec<LoggedEvent>,
    next_event_id: i64,
    /// Each webhook's cursor: the last event id it was sent or passed over.
    webhook_cursors: BTreeMap<String, i64>,
    /// Public host names (#54): host → its reservation.
    host_reservations: BTreeMap<String, hosts::HostRow>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that reports every write of binds into ACTIVE as
    /// [`Effect::BindsSaved`].
    pub fn observed(observer: Arc<dyn Observer>) -> Self {
        Self {
            observer: Some(observer),
            ..Self::default()
        }
    }

    /// The same store timed by `clock` (the simulation's true time, which
    /// each simulated process sees only through its own skewed clock).
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    fn now_us(&self) -> i64 {
        timestamp_to_us(self.clock.now())
    }

    fn binds_saved(&self, id: &ContainerId, binds: &Binds) {
        if !binds.is_empty() {
            self.tell(|| Effect::BindsSaved {
                id: id.clone(),
                binds: binds.clone(),
            });
        }
    }

    fn tell(&self, effect: impl FnOnce() -> Effect) {
        if let Some(observer) = &self.observer {
            observer.effect(&effect());
        }
    }

    /// Takes the free, expired or own locks of `instances` for `holder`
    /// (T3); the ids taken.
    fn lock_in(
        &self,
        state: &mut State,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Vec<InstanceId> {
        let now_us = self.now_us();
        let expires_at_us = now_us.saturating_add(lease_to_us(ttl));
        let mut unique = instances.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let held_by: Arc<str> = Arc::from(holder);
        unique.retain(|id| {
            if !state.instances.contains_key(id) {
                return false;
            }
            let free = state
                .instance_locks
                .get(id)
                .is_none_or(|(h, expires)| &**h == holder || *expires <= now_us);
            if free {
                state
                    .instance_locks
                    .insert(*id, (held_by.clone(), expires_at_us));
            }
            free
        });
        unique
    }

    /// Tells the observer of the locks taken, once the state is let go.
    fn tell_locked(
        &self,
        state: std::sync::MutexGuard<'_, State>,
        locked: &[InstanceId],
        holder: &str,
    ) {
        if self.observer.is_none() {
            return;
        }
        let names: Vec<InstanceName> = locked
            .iter()
            .filter_map(|id| state.instances.get(id).map(|i| i.name.clone()))
            .collect();
        drop(state);
        for instance in names {
            self.tell(|| Effect::InstanceLocked {
                instance,
                holder: holder.to_owned(),
            });
        }
    }

    /// Fault hook: while `true`, every call returns
    /// [`StoreError::Unavailable`] and changes nothing.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    /// Whether [`MemoryStore::set_unavailable`] holds the store down now.
    pub fn is_unavailable(&self) -> bool {
        self.lock().unavailable
    }

    /// Fault hook: the next `n` calls fail with [`StoreError::Unavailable`]
    /// and change nothing; later calls succeed.
    pub fn fail_next_calls(&self, n: u32) {
        self.lock().failing_calls = n;
    }

    /// Fault hook: while set, an instance's row does not decode, as if
    /// another tool had written a value stead does not know into one of
    /// its fields. Every read that decodes that field reports the row
    /// among its bad rows (a load under the lock fails with the same
    /// error); every other row reads as before. `None` mends it.
    pub fn garble_instance_row(&self, garbled: Option<(InstanceId, Garbled)>) {
        self.lock().garbled = garbled;
    }

    /// How many calls reached the store (failed ones included); lets a
    /// simulation check that a tick touched the store at all.
    pub fn n_calls(&self) -> u64 {
        self.lock().n_calls
    }

    /// The reconciler lease as it stands (for checkers), `None` when vacant.
    pub fn lease_now(&self) -> Option<LeaseGrant> {
        self.lock().lease_row().grant()
    }

    /// Who holds an instance's lock and until when, by the store's clock
    /// (for checkers); expired rows still show.
    pub fn instance_lock_of(&self, name: &InstanceName) -> Option<(String, Timestamp)> {
        let state = self.lock();
        let id = state.instance_id(name)?;
        let (holder, expires_us) = state.instance_locks.get(&id)?;
        Some((
            holder.to_string(),
            stead::store::timestamp_from_us(*expires_us)?,
        ))
    }

    /// ACTIVE's record of one service, without the fault hooks (for
    /// checkers).
    pub fn active_now(&self, service: &ServiceKey) -> Option<ActiveService> {
        let state = self.lock();
        let id = state.instance_id(&service.instance)?;
        state.active.get(&(id, service.service.clone())).cloned()
    }

    /// An instance's inhibitions and markers, without the fault hooks (for
    /// checkers).
    pub fn inhibitions_now(&self, name: &InstanceName) -> Vec<Inhibition> {
        let state = self.lock();
        let Some(id) = state.instance_id(name) else {
            return Vec::new();
        };
        state
            .inhibitions
            .iter()
            .filter(|((i, _, _), _)| *i == id)
            .map(|(_, h)| h.clone())
            .collect()
    }

    /// An instance by name, without the fault hooks (for checkers).
    /// Every instance as it stands, for checkers.
    pub fn all_instances(&self) -> Vec<Instance> {
        self.lock().instances.values().cloned().collect()
    }

    /// Every recorded type version as it stands, for checkers.
    pub fn type_versions_now(&self) -> Vec<TypeVersion> {
        self.lock().type_versions.values().cloned().collect()
    }

    pub fn instance_now(&self, name: &InstanceName) -> Option<Instance> {
        let state = self.lock();
        let id = state.instance_id(name)?;
        state.instances.get(&id).cloned()
    }

    /// The store's clock (the database's).
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// A type's rollout switch and the version a type's recording holds,
    /// without the fault hooks (for checkers).
    pub fn rollout_now(&self, service_type: &str) -> Option<(RolloutRecord, Option<TypeVersion>)> {
        let state = self.lock();
        let record = state.rollouts.get(service_type)?.clone();
        // The newest definition of the pinned version, as the daemon
        // reads a pin back.
        let recorded = record.pinned.as_ref().and_then(|version| {
            state
                .type_versions
                .values()
                .filter(|r| r.service_type == service_type && r.version == *version)
                .max_by_key(|r| r.recorded_at)
                .cloned()
        });
        Some((record, recorded))
    }

    /// The instances with a successor baking at `at` (for checkers: the
    /// bakes that hold slots of `max_in_flight`, #55), read without
    /// counting as a call.
    pub fn baking_at(&self, at: Timestamp) -> BTreeSet<InstanceId> {
        self.lock()
            .inhibitions
            .iter()
            .filter(|(_, marker)| marker.bakes_at(at).is_some())
            .map(|((id, _, _), _)| *id)
            .collect()
    }

    /// Every task, in id order, whatever its state (for checkers: "no task is
    /// lost" needs done and failed tasks too).
    pub fn all_tasks(&self) -> Vec<Task> {
        self.lock().tasks.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, never a
        // half-applied call (each call validates before it mutates), so the
        // state is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the lock for one call, applying the fault hooks first.
    /// `Store::expire_instance`, and with `purge_volumes` the purge flag
    /// too, under one hold of the state: all or nothing, as the SQL
    /// transaction.
    fn expire(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
        purge_volumes: bool,
    ) -> Result<Option<Expired>, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        // All or nothing, like the SQL transaction: check both preconditions
        // before changing anything.
        let cas_holds = state.instances.get(&id).is_some_and(|i| i.state == from);
        if !cas_holds || state.has_active_task(task) {
            return Ok(None);
        }
        let Some(task_id) = state.insert_task(task, now)? else {
            return Ok(None);
        };
        let now = normalize_timestamp(now);
        let mut cancelled = Vec::new();
        // The mutant breaks both halves of T4 (see `mutants.rs`): with its
        // queued tasks cancelled here, a handler that forgot to refuse a
        // deleted instance would almost never meet one.
        let cancel = !mutants::active(Mutant::ReviveDeletedInstance);
        for t in state.tasks.values_mut() {
            if cancel && t.instance == id && t.cancelled_by_deletion() {
                t.state = TaskState::Failed;
                t.last_error = Some(CANCELLED_BY_DELETION.to_owned());
                t.updated_at = now;
                cancelled.push(t.id);
            }
        }
        let instance = state.instance_mut(id)?;
        instance.state = InstanceState::Deleting;
        instance.purge_volumes |= purge_volumes;
        instance.updated_at = now;
        let name = instance.name.clone();
        drop(state);
        self.tell(|| Effect::InstanceState {
            instance: name,
            state: InstanceState::Deleting,
        });
        Ok(Some(Expired {
            task: task_id,
            cancelled,
        }))
    }

    /// One write to an instance ([`LockedWrite`]) as its store method
    /// makes it: fenced by the reconciler lease if `fence` is given (T2),
    /// made only while `lock` is held if it is given (T3,
    /// [`Store::write_under_lock`]); both checked under the one hold of
    /// the state that makes the write, as a SQL transaction would.
    fn instance_write(
        &self,
        write: LockedWrite<'_>,
        fence: Option<&LeaseGrant>,
        lock: Option<&LockGrant>,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        if fence.is_some() {
            state.check_fence(fence, self.now_us())?;
        }
        if let Some(lock) = lock {
            let row = state
                .instance_locks
                .get(&lock.instance)
                .map(|(holder, expires)| (&**holder, *expires));
            if !lock_admits(row, lock, self.now_us()) {
                return Err(lock_lost(lock));
            }
        }
        match write {
            LockedWrite::State { id, from, to, now } => {
                let moved = match state.instances.get_mut(&id) {
                    Some(instance) if instance.state == from => {
                        instance.state = to;
                        instance.updated_at = normalize_timestamp(now);
                        Some(instance.name.clone())
                    }
                    _ => None,
                };
                drop(state);
                if let Some(instance) = &moved {
                    self.tell(|| Effect::InstanceState {
                        instance: instance.clone(),
                        state: to,
                    });
                }
                Ok(moved.is_some())
            }
            LockedWrite::Version { id, version, now } => {
                let instance = state.instance_mut(id)?;
                instance.version = version.to_owned();
                instance.updated_at = normalize_timestamp(now);
                Ok(true)
            }
            LockedWrite::SpecDigest { id, digest, now } => {
                let instance = state.instance_mut(id)?;
                instance.spec_digest = Some(digest.to_owned());
                instance.updated_at = normalize_timestamp(now);
                Ok(true)
            }
            LockedWrite::SaveActive {
                instance,
                service,
                active,
            } => {
                let id = state.require_instance_id(instance)?;
                state
                    .active
                    .insert((id, service.clone()), normalize_active(active));
                drop(state);
                self.tell(|| Effect::ActiveSaved {
                    service: service_key(instance, service),
                    container: active.container.clone(),
                    under_lease: fence.is_some(),
                });
                self.binds_saved(&active.container, &active.binds);
                Ok(true)
            }
            LockedWrite::RemoveActive { instance, service } => {
                if let Some(id) = state.instance_id(instance) {
                    state.active.remove(&(id, service.clone()));
                }
                drop(state);
                self.tell(|| Effect::ActiveRemoved {
                    service: service_key(instance, service),
                });
                Ok(true)
            }
            LockedWrite::ReleaseClaims {
                instance,
                container,
            } => {
                let Some(id) = state.instance_id(instance) else {
                    return Ok(true);
                };
                let first = (id, ServiceName::least());
                for (_, active) in state
                    .active
                    .range_mut(first..)
                    .take_while(|((i, _), _)| *i == id)
                {
                    if &active.container == container {
                        active.binds.clear();
                    }
                }
                Ok(true)
            }
            LockedWrite::SaveInhibition {
                instance,
                inhibition,
            } => {
                let id = state.require_instance_id(instance)?;
                let key = (id, inhibition.service.clone(), inhibition.container.clone());
                state
                    .inhibitions
                    .insert(key, normalize_inhibition(inhibition));
                drop(state);
                self.tell(|| Effect::InhibitionSaved {
                    service: service_key(instance, &inhibition.service),
                    container: inhibition.container.clone(),
                    retirement: inhibition.reason == InhibitionReason::RetirementPending,
                    dropped: inhibition.reason.as_str() == InhibitionReason::SERVICE_DROPPED,
                    under_lease: fence.is_some(),
                    kept_until: (inhibition.reason == InhibitionReason::RetirementPending
                        && inhibition.operation == stead::core::bake::REVERT_OPERATION)
                        .then(|| {
                            // As stored: the pass reads it back so.
                            stead::core::fleet::add(
                                normalize_timestamp(inhibition.created_at),
                                stead::core::bake::KEEP_REVERTED,
                            )
                        }),
                });
                Ok(true)
            }
            LockedWrite::ClearInhibition {
                instance,
                service,
                container,
            } => {
                if let Some(id) = state.instance_id(instance) {
                    state
                        .inhibitions
                        .remove(&(id, service.clone(), container.clone()));
                }
                drop(state);
                self.tell(|| Effect::InhibitionCleared {
                    service: service_key(instance, service),
                    container: container.clone(),
                });
                Ok(true)
            }
        }
    }

    fn call(&self) -> Result<std::sync::MutexGuard<'_, State>, StoreError> {
        let mut state = self.lock();
        state.n_calls += 1;
        if state.unavailable {
            return Err(StoreError::Unavailable(
                "memory store set unavailable".into(),
            ));
        }
        if state.failing_calls > 0 {
            state.failing_calls -= 1;
            return Err(StoreError::Unavailable(
                "memory store injected failure".into(),
            ));
        }
        Ok(state)
    }
}

/// What a SQL store reports for an instance row it cannot decode.
/// Which field of a garbled instance row does not decode
/// ([`MemoryStore::garble_instance_row`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbled {
    /// The state, which a recovery pass lists by: the row is bad in every
    /// listing and every load.
    Listed,
    /// The parameters, which only whole rows carry: a recovery pass lists
    /// the instance ([`Store::list_for_recovery`]), and its load and the
    /// whole listing report the row as bad.
    Unlisted,
}

fn garbled_row((id, garbled): (InstanceId, Garbled)) -> StoreError {
    let (field, value) = match garbled {
        Garbled::Listed => ("state", "garbled"),
        Garbled::Unlisted => ("parameters", "{garbled"),
    };
    StoreError::BadRow {
        table: "instances",
        id: id.to_string(),
        field,
        value: value.to_owned(),
    }
}

impl State {
    /// `Store::create_instance` under the lock the caller holds.
    fn create(&mut self, new: &NewInstance, now: Timestamp) -> Result<Instance, StoreError> {
        if let Some(id) = self.instance_id(&new.name) {
            self.free_deleted_name(id)?;
        }
        self.next_instance_id += 1;
        let now = normalize_timestamp(now);
        let instance = Instance {
            parameters: new.parameters.clone(),
            purge_volumes: false,
            spec_digest: new.spec_digest.clone(),
            domains: new.domains.clone(),
            id: self.next_instance_id,
            name: new.name.clone(),
            team: new.team.clone(),
            service_type: new.service_type.clone(),
            version: new.version.clone(),
            state: InstanceState::Provisioning,
            stopped: false,
            expires_at: new.expires_at.map(normalize_timestamp),
            maintenance_window: new.maintenance_window.clone(),
            created_at: now,
            updated_at: now,
        };
        self.names.insert(instance.name.clone(), instance.id);
        self.instances.insert(instance.id, instance.clone());
        Ok(instance)
    }
}

impl State {
    /// Appends one event under the next id, at the store's precision.
    fn push_event(&mut self, mut event: Event) {
        self.next_event_id += 1;
        event.at = normalize_timestamp(event.at);
        event.until = event.until.map(normalize_timestamp);
        // The team of the instance it is about, as the SQL stores read it.
        event.team = event
            .instance
            .as_ref()
            .and_then(|name| self.names.get(name))
            .and_then(|id| self.instances.get(id))
            .map(|instance| instance.team.clone());
        self.events.push(LoggedEvent {
            id: self.next_event_id,
            event,
        });
    }
}

impl State {
    fn instance_id(&self, name: &InstanceName) -> Option<InstanceId> {
        self.names.get(name).copied()
    }

    /// Every instance row by id, each as `row` makes it; the garbled row
    /// (if any, and if the listing reads its garbled field: every field
    /// when `whole`) reported as bad instead.
    fn listed<T>(&self, whole: bool, row: impl Fn(&Instance) -> T) -> Rows<T> {
        let garbled = self.garbled.filter(|(id, field)| {
            self.instances.contains_key(id) && (whole || *field == Garbled::Listed)
        });
        // Sized once: a fleet's listing would otherwise regrow (and copy)
        // its vector a dozen times.
        let mut rows = Vec::with_capacity(self.instances.len());
        rows.extend(
            self.instances
                .values()
                .filter(|i| garbled.is_none_or(|(id, _)| id != i.id))
                .map(row),
        );
        Rows {
            rows,
            bad: garbled.map(garbled_row).into_iter().collect(),
        }
    }

    /// What [`Store::load_instances`] reads of `ids`.
    fn load(&self, ids: &[InstanceId]) -> LoadedInstances {
        let mut loaded = LoadedInstances::default();
        for id in ids {
            let Some(instance) = self.instances.get(id) else {
                continue;
            };
            if let Some(garbled) = self.garbled.filter(|(garbled, _)| garbled == id) {
                loaded.insert(*id, Err(garbled_row(garbled)));
                continue;
            }
            // Inserted one by one, as a SQL store decodes rows: `collect`
            // would gather and sort a vector first.
            let mut active = ActiveRecord::default();
            active.services.extend(
                State::of_instance(&self.active, *id, (*id, ServiceName::least()), |k| k.0)
                    .map(|((_, service), record)| (service.clone(), record.clone())),
            );
            let inhibitions = State::of_instance(
                &self.inhibitions,
                *id,
                (*id, ServiceName::least(), ContainerId::least()),
                |(i, _, _)| *i,
            )
            .map(|(_, inhibition)| inhibition.clone())
            .collect();
            loaded.insert(
                *id,
                Ok(LoadedInstance {
                    instance: instance.clone(),
                    active,
                    inhibitions,
                }),
            );
        }
        loaded
    }

    /// Every row keyed by instance `id` in `map`, whose keys start with it.
    fn of_instance<K: Ord, V>(
        map: &BTreeMap<K, V>,
        id: InstanceId,
        first: K,
        key_id: impl Fn(&K) -> InstanceId,
    ) -> impl Iterator<Item = (&K, &V)> {
        map.range(first..).take_while(move |(k, _)| key_id(k) == id)
    }

    fn require_instance_id(&self, name: &InstanceName) -> Result<InstanceId, StoreError> {
        self.instance_id(name)
            .ok_or_else(|| StoreError::NotFound(format!("instance {name}")))
    }

    fn instance_mut(&mut self, id: InstanceId) -> Result<&mut Instance, StoreError> {
        self.instances
            .get_mut(&id)
            .ok_or_else(|| StoreError::NotFound(format!("instance {id}")))
    }

    /// Frees the name instance `id` holds if it is deleted and has no
    /// active task, removing it and everything of it, as the SQL stores do;
    /// a conflict otherwise.
    fn free_deleted_name(&mut self, id: InstanceId) -> Result<(), StoreError> {
        let instance = &self.instances[&id];
        if instance.state != InstanceState::Deleted {
            return Err(name_taken(&instance.name, id, instance.state));
        }
        if self
            .tasks
            .values()
            .any(|t| t.instance == id && t.state.is_active())
        {
            return Err(name_held_by_task(&instance.name, id));
        }
        self.tasks.retain(|_, t| t.instance != id);
        self.active.retain(|(i, _), _| *i != id);
        self.inhibitions.retain(|(i, _, _), _| *i != id);
        self.host_reservations.retain(|_, r| r.instance() != id);
        if let Some(gone) = self.instances.get(&id) {
            self.names.remove(&gone.name);
        }
        self.instance_locks.remove(&id);
        self.instances.remove(&id);
        Ok(())
    }

    fn check_fence(&self, fence: Option<&LeaseGrant>, now_us: i64) -> Result<(), StoreError> {
        match fence {
            Some(grant) if !self.lease_row().admits(grant, now_us) => Err(fenced(grant)),
            _ => Ok(()),
        }
    }

    fn lease_row(&self) -> ReconcilerLeaseRow {
        self.lease.clone().unwrap_or(ReconcilerLeaseRow::VACANT)
    }

    fn has_active_task(&self, task: &NewTask) -> bool {
        self.tasks
            .values()
            .any(|t| t.instance == task.instance && t.kind == task.kind && t.state.is_active())
    }

    /// The partial unique index and the foreign key, as the databases apply
    /// them: `Ok(None)` on a duplicate active task.
    fn insert_task(
        &mut self,
        task: &NewTask,
        now: Timestamp,
    ) -> Result<Option<TaskId>, StoreError> {
        if !self.instances.contains_key(&task.instance) {
            return Err(StoreError::NotFound(format!("instance {}", task.instance)));
        }
        if self.has_active_task(task) {
            return Ok(None);
        }
        self.next_task_id += 1;
        let id = self.next_task_id;
        let now = normalize_timestamp(now);
        self.tasks.insert(
            id,
            Task {
                id,
                kind: task.kind,
                instance: task.instance,
                state: TaskState::Queued,
                run_after: normalize_timestamp(task.run_after),
                locked_by: None,
                locked_at: None,
                attempts: 0,
                reason: task.reason.clone(),
                last_error: None,
                traceparent: task.traceparent.clone(),
                created_at: now,
                updated_at: now,
            },
        );
        Ok(Some(id))
    }

    /// The task `id` if `worker` holds its lease right now.
    fn held_task(&mut self, id: TaskId, worker: &str) -> Option<&mut Task> {
        self.tasks
            .get_mut(&id)
            .filter(|t| t.state == TaskState::Running && t.locked_by.as_deref() == Some(worker))
    }

    /// Ends the lease of a held task in `state`. `false` if not held.
    fn finish(
        &mut self,
        id: TaskId,
        worker: &str,
        state: TaskState,
        error: Option<&str>,
        now: Timestamp,
    ) -> bool {
        let Some(task) = self.held_task(id, worker) else {
            return false;
        };
        task.state = state;
        task.locked_by = None;
        task.locked_at = None;
        if let Some(error) = error {
            task.last_error = Some(error.to_owned());
        }
        task.updated_at = normalize_timestamp(now);
        true
    }
}

fn normalize_active(active: &ActiveService) -> ActiveService {
    ActiveService {
        stop_grace: active.stop_grace.map(normalize_duration),
        verified_started_at: active
            .verified_started_at
            .and_then(normalize_execution_start),
        ..active.clone()
    }
}

fn normalize_inhibition(inhibition: &Inhibition) -> Inhibition {
    Inhibition {
        created_at: normalize_timestamp(inhibition.created_at),
        stop_grace: inhibition.stop_grace.map(normalize_duration),
        ..inhibition.clone()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_instance(
        &self,
        new: &NewInstance,
        now: Timestamp,
    ) -> Result<Instance, StoreError> {
        self.call()?.create(new, now)
    }

    async fn instance(&self, name: &InstanceName) -> Result<Option<Instance>, StoreError> {
        let state = self.call()?;
        Ok(state
            .instance_id(name)
            .and_then(|id| state.instances.get(&id))
            .cloned())
    }

    async fn instance_by_id(&self, id: InstanceId) -> Result<Option<Instance>, StoreError> {
        Ok(self.call()?.instances.get(&id).cloned())
    }

    async fn list_instances(&self) -> Result<Rows<Instance>, StoreError> {
        let state = self.call()?;
        Ok(state.listed(true, Instance::clone))
    }

    async fn live_service_types(&self) -> Result<BTreeSet<String>, StoreError> {
        let state = self.call()?;
        Ok(state
            .instances
            .values()
            .filter(|i| i.state != InstanceState::Deleted)
            .map(|i| i.service_type.clone())
            .collect())
    }

    async fn list_for_recovery(&self) -> Result<Rows<ListedInstance>, StoreError> {
        let state = self.call()?;
        Ok(state.listed(false, |i| ListedInstance::from(i)))
    }

    async fn set_instance_state(
        &self,
        id: InstanceId,
        from: InstanceState,
        to: InstanceState,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.instance_write(LockedWrite::State { id, from, to, now }, None, None)
    }

    async fn set_instance_stopped(
        &self,
        id: InstanceId,
        stopped: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut state = self.call()?;
        let instance = state.instance_mut(id)?;
        instance.stopped = stopped;
        instance.updated_at = normalize_timestamp(now);
        Ok(())
    }

    async fn set_instance_spec_digest(
        &self,
        id: InstanceId,
        digest: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::SpecDigest { id, digest, now };
        self.instance_write(write, None, None).map(drop)
    }

    async fn set_purge_volumes(&self, id: InstanceId, now: Timestamp) -> Result<(), StoreError> {
        let mut state = self.call()?;
        let instance = state.instance_mut(id)?;
        instance.purge_volumes = true;
        instance.updated_at = normalize_timestamp(now);
        Ok(())
    }

    async fn set_instance_version(
        &self,
        id: InstanceId,
        version: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::Version { id, version, now };
        self.instance_write(write, None, None).map(drop)
    }

    async fn load_active(&self, instance: &InstanceName) -> Result<ActiveRecord, StoreError> {
        let state = self.call()?;
        let Some(id) = state.instance_id(instance) else {
            return Ok(ActiveRecord::default());
        };
        let services = state
            .active
            .range((id, ServiceName::least())..)
            .take_while(|((i, _), _)| *i == id)
            .map(|((_, service), active)| (service.clone(), active.clone()))
            .collect();
        Ok(ActiveRecord { services })
    }

    async fn save_active_service(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        active: &ActiveService,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::SaveActive {
            instance,
            service,
            active,
        };
        self.instance_write(write, None, None).map(drop)
    }

    async fn remove_active_service(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::RemoveActive { instance, service };
        self.instance_write(write, None, None).map(drop)
    }

    async fn persist_binds(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        revision: &str,
        binds: &Binds,
        fence: Option<&LeaseGrant>,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        let Some(id) = state.instance_id(instance) else {
            return Ok(false);
        };
        let saved = match state.active.get_mut(&(id, service.clone())) {
            Some(active)
                if &active.container == container && active.effective_revision == revision =>
            {
                active.binds = binds.clone();
                true
            }
            _ => false,
        };
        drop(state);
        if saved {
            self.binds_saved(container, binds);
        }
        Ok(saved)
    }

    async fn record_verified_execution(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        started_at: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        let Some(id) = state.instance_id(instance) else {
            return Ok(());
        };
        if let Some(active) = state.active.get_mut(&(id, service.clone())) {
            if &active.container == container {
                active.verified_started_at = normalize_execution_start(started_at);
            }
        }
        Ok(())
    }

    async fn release_claims(
        &self,
        instance: &InstanceName,
        container: &ContainerId,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::ReleaseClaims {
            instance,
            container,
        };
        self.instance_write(write, fence, None).map(drop)
    }

    async fn load_instances(&self, ids: &[InstanceId]) -> Result<LoadedInstances, StoreError> {
        let state = self.call()?;
        Ok(State::load(&state, ids))
    }

    async fn ways_back(&self, now: Timestamp) -> Result<WaysBack, StoreError> {
        let state = self.call()?;
        let mut ways = WaysBack::default();
        for ((id, _, _), marker) in &state.inhibitions {
            if marker.bakes_at(now).is_some() {
                ways.baking.insert(*id);
            }
            if marker.revert_to.as_ref().is_some_and(|back| back.undone) {
                ways.undone.insert(*id);
            }
        }
        Ok(ways)
    }

    async fn load_inhibitions(
        &self,
        instance: &InstanceName,
    ) -> Result<Vec<Inhibition>, StoreError> {
        let state = self.call()?;
        let Some(id) = state.instance_id(instance) else {
            return Ok(Vec::new());
        };
        Ok(State::of_instance(
            &state.inhibitions,
            id,
            (id, ServiceName::least(), ContainerId::least()),
            |(i, _, _)| *i,
        )
        .map(|(_, inhibition)| inhibition.clone())
        .collect())
    }

    async fn save_inhibition(
        &self,
        instance: &InstanceName,
        inhibition: &Inhibition,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::SaveInhibition {
            instance,
            inhibition,
        };
        self.instance_write(write, None, None).map(drop)
    }

    async fn clear_inhibition(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        container: &ContainerId,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError> {
        let write = LockedWrite::ClearInhibition {
            instance,
            service,
            container,
        };
        self.instance_write(write, fence, None).map(drop)
    }

    async fn write_under_lock(
        &self,
        lock: &LockGrant,
        write: LockedWrite<'_>,
    ) -> Result<bool, StoreError> {
        self.instance_write(write, None, Some(lock))
    }

    async fn write_under_lease(
        &self,
        lease: &LeaseGrant,
        write: LockedWrite<'_>,
    ) -> Result<bool, StoreError> {
        self.instance_write(write, Some(lease), None)
    }

    async fn enqueue(
        &self,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Option<TaskId>, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        let refused_for = state
            .tasks
            .values()
            .find(|t| t.instance == task.instance && t.kind == task.kind && t.state.is_active())
            .map(|t| (t.id, t.created_at));
        let inserted = state.insert_task(task, now);
        drop(state);
        if inserted.is_ok() {
            self.tell(|| Effect::Enqueue {
                instance: task.instance,
                kind: task.kind,
                fenced: fence.is_some(),
                refused_for,
            });
        }
        inserted
    }

    async fn claim(
        &self,
        worker: &str,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        let mut state = self.call()?;
        let now = normalize_timestamp(now);
        let mut due: Vec<(Timestamp, TaskId)> = state
            .tasks
            .values()
            .filter(|t| t.state == TaskState::Queued && t.run_after <= now)
            .map(|t| (t.run_after, t.id))
            .collect();
        due.sort();
        let mut claimed = Vec::new();
        for (_, id) in due.into_iter().take(limit as usize) {
            let task = state.tasks.get_mut(&id).expect("id came from the map");
            task.state = TaskState::Running;
            task.locked_by = Some(worker.to_owned());
            task.locked_at = Some(now);
            task.attempts = task.attempts.saturating_add(1);
            task.updated_at = now;
            claimed.push(task.clone());
        }
        Ok(claimed)
    }

    async fn extend_lease(
        &self,
        id: TaskId,
        worker: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        let now = normalize_timestamp(now);
        Ok(match state.held_task(id, worker) {
            Some(task) => {
                task.locked_at = Some(now);
                task.updated_at = now;
                true
            }
            None => false,
        })
    }

    async fn complete(&self, id: TaskId, worker: &str, now: Timestamp) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        let done = state.finish(id, worker, TaskState::Done, None, now);
        let task = state.tasks.get(&id).cloned();
        drop(state);
        if let Some(task) = task.filter(|_| done) {
            self.tell(|| Effect::TaskDone {
                task: id,
                instance: task.instance,
                reason: task.reason.clone(),
            });
        }
        Ok(done)
    }

    async fn retry(
        &self,
        id: TaskId,
        worker: &str,
        run_after: Timestamp,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        let requeued = state.finish(id, worker, TaskState::Queued, Some(error), now);
        let retried = requeued.then(|| {
            let task = state.tasks.get_mut(&id).expect("just finished");
            task.run_after = normalize_timestamp(run_after);
            (task.instance, task.kind, task.run_after)
        });
        drop(state);
        if let Some((instance, kind, run_after)) = retried {
            self.tell(|| Effect::TaskRetried {
                task: id,
                instance,
                kind,
                run_after,
            });
        }
        Ok(requeued)
    }

    async fn fail(
        &self,
        id: TaskId,
        worker: &str,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        Ok(state.finish(id, worker, TaskState::Failed, Some(error), now))
    }

    async fn reset_expired_leases(
        &self,
        now: Timestamp,
        lease: Duration,
        fence: Option<&LeaseGrant>,
    ) -> Result<u64, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        let cutoff_us = lease_cutoff_us(timestamp_to_us(now), lease_to_us(lease));
        let now = normalize_timestamp(now);
        let mut n_reset = 0;
        let mut broken = Vec::new();
        for task in state.tasks.values_mut() {
            let expired = task.state == TaskState::Running
                && task
                    .locked_at
                    .is_some_and(|at| timestamp_to_us(at) < cutoff_us);
            if expired {
                broken.extend(task.locked_at.map(|at| (task.id, at)));
                task.state = TaskState::Queued;
                task.locked_by = None;
                task.locked_at = None;
                task.updated_at = now;
                n_reset += 1;
            }
        }
        drop(state);
        for (task, locked_at) in broken {
            self.tell(|| Effect::LeaseBroken { task, locked_at });
        }
        self.tell(|| Effect::LeaseSweep {
            now,
            freed: n_reset,
        });
        Ok(n_reset)
    }

    async fn active_tasks(&self) -> Result<Rows<Task>, StoreError> {
        let state = self.call()?;
        Ok(Rows {
            rows: state
                .tasks
                .values()
                .filter(|t| t.state.is_active())
                .cloned()
                .collect(),
            bad: Vec::new(),
        })
    }

    async fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        Ok(self.call()?.tasks.get(&id).cloned())
    }

    async fn expire_instance(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Option<Expired>, StoreError> {
        self.expire(id, from, task, now, fence, false)
    }

    async fn expire_instance_purging(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
    ) -> Result<Option<Expired>, StoreError> {
        self.expire(id, from, task, now, None, true)
    }

    async fn tasks(&self, include_finished: bool, limit: u32) -> Result<Rows<Task>, StoreError> {
        let state = self.call()?;
        Ok(Rows {
            rows: state
                .tasks
                .values()
                .rev()
                .filter(|t| include_finished || t.state.is_active())
                .take(limit as usize)
                .cloned()
                .collect(),
            bad: Vec::new(),
        })
    }

    async fn queue_depth(&self) -> Result<u64, StoreError> {
        let state = self.call()?;
        Ok(state
            .tasks
            .values()
            .filter(|t| t.state == TaskState::Queued)
            .count() as u64)
    }

    async fn instance_counts(&self) -> Result<BTreeMap<InstanceState, u64>, StoreError> {
        let state = self.call()?;
        let mut counts: BTreeMap<InstanceState, u64> =
            InstanceState::ALL.into_iter().map(|s| (s, 0)).collect();
        for instance in state.instances.values() {
            *counts.entry(instance.state).or_default() += 1;
        }
        Ok(counts)
    }

    async fn rollouts(&self) -> Result<BTreeMap<String, RolloutState>, StoreError> {
        Ok(self
            .call()?
            .rollouts
            .iter()
            .map(|(service_type, r)| (service_type.clone(), r.state))
            .collect())
    }

    async fn rollout_records(&self) -> Result<Vec<RolloutRecord>, StoreError> {
        Ok(self.call()?.rollouts.values().cloned().collect())
    }

    async fn set_rollout(
        &self,
        service_type: &str,
        rollout: RolloutState,
        reason: &str,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<(), StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        // Any change of the switch lifts an undo's pin.
        let record = RolloutRecord {
            service_type: service_type.to_owned(),
            state: rollout,
            reason: reason.to_owned(),
            updated_at: normalize_timestamp(now),
            pinned: None,
        };
        state.rollouts.insert(service_type.to_owned(), record);
        drop(state);
        self.tell(|| Effect::RolloutSet {
            service_type: service_type.to_owned(),
            halted: rollout == RolloutState::Halted,
        });
        Ok(())
    }

    async fn pin_rollout(
        &self,
        service_type: &str,
        version: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut state = self.call()?;
        let record = RolloutRecord {
            service_type: service_type.to_owned(),
            state: RolloutState::Halted,
            reason: reason.to_owned(),
            updated_at: normalize_timestamp(now),
            pinned: Some(version.to_owned()),
        };
        state.rollouts.insert(service_type.to_owned(), record);
        drop(state);
        self.tell(|| Effect::RolloutSet {
            service_type: service_type.to_owned(),
            halted: true,
        });
        self.tell(|| Effect::RolloutPinned {
            service_type: service_type.to_owned(),
            version: version.to_owned(),
        });
        Ok(())
    }

    async fn record_type_version(
        &self,
        recorded: &TypeVersion,
        fence: Option<&LeaseGrant>,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        let key = (
            recorded.service_type.clone(),
            recorded.version.clone(),
            recorded.spec_digest.clone(),
        );
        if state.type_versions.contains_key(&key) {
            return Ok(false);
        }
        state.type_versions.insert(
            key,
            TypeVersion {
                recorded_at: normalize_timestamp(recorded.recorded_at),
                ..recorded.clone()
            },
        );
        Ok(true)
    }

    async fn type_versions(&self, service_type: &str) -> Result<Vec<TypeVersion>, StoreError> {
        let state = self.call()?;
        let mut versions: Vec<TypeVersion> = state
            .type_versions
            .values()
            .filter(|r| r.service_type == service_type)
            .cloned()
            .collect();
        versions.sort_by(|a, b| {
            (a.recorded_at, &a.version, &a.spec_digest).cmp(&(
                b.recorded_at,
                &b.version,
                &b.spec_digest,
            ))
        });
        Ok(versions)
    }

    async fn reserve_hosts(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
        hosts: &[String],
        now: Timestamp,
        fence: Option<&LeaseGrant>,
    ) -> Result<Vec<stead::core::hosts::HostReservation>, StoreError> {
        let mut state = self.call()?;
        state.check_fence(fence, self.now_us())?;
        state.reserve_hosts(instance, service, hosts, now)
    }

    async fn host_reservations(
        &self,
    ) -> Result<Vec<stead::core::hosts::HostReservation>, StoreError> {
        Ok(self.call()?.host_reservations())
    }

    async fn database_now(&self) -> Result<Timestamp, StoreError> {
        drop(self.call()?);
        Ok(self.clock.now())
    }

    async fn acquire_reconciler_lease(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseGrant>, StoreError> {
        let mut state = self.call()?;
        let now_us = self.now_us();
        let row = state.lease_row();
        if mutants::active(Mutant::StrangerAfterRestart) && held_by_own_past(&row, holder, now_us) {
            // Broken on purpose: the restarted daemon waits out its own
            // lease like a stranger would.
            return Ok(None);
        }
        // The holder this lease would go from, if a twin of the asker.
        let twin = row
            .holder
            .as_deref()
            .filter(|current| succession(current, holder) == Succession::Twin)
            .map(|current| (current.to_owned(), row.expires_at_us));
        let next = if twin.is_some() && mutants::active(Mutant::TwinTakesOver) {
            // Broken on purpose: the twin takes the lease at once, as a
            // restart at the holder's own site would.
            ReconcilerLeaseRow::VACANT
                .acquire(holder, now_us, lease_to_us(ttl))
                .map(|taken| ReconcilerLeaseRow {
                    epoch: row.epoch + 1,
                    ..taken
                })
        } else {
            row.acquire(holder, now_us, lease_to_us(ttl))
        };
        let Some(next) = next else {
            return Ok(None);
        };
        let grant = next.grant();
        state.lease = Some(next);
        drop(state);
        if let Some((from, expires_at_us)) = twin {
            self.tell(|| Effect::LeaseTakenByTwin {
                holder: holder.to_owned(),
                from,
                from_expires_at: expires_at_us.and_then(timestamp_from_us),
                at: timestamp_from_us(now_us).unwrap_or(Timestamp::MAX),
            });
        }
        Ok(grant)
    }

    async fn release_reconciler_lease(&self, grant: &LeaseGrant) -> Result<(), StoreError> {
        let mut state = self.call()?;
        state.lease = Some(state.lease_row().release(grant));
        Ok(())
    }

    async fn try_lock_instances(
        &self,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<InstanceId>, StoreError> {
        if mutants::active(Mutant::SkipInstanceLockRow) {
            // Broken on purpose: every taker is told it holds the lock, and
            // no row is written, as if processes took only their own
            // in-process lock.
            drop(self.call()?);
            return Ok(instances.to_vec());
        }
        let mut state = self.call()?;
        let locked = self.lock_in(&mut state, instances, holder, ttl);
        self.tell_locked(state, &locked, holder);
        Ok(locked)
    }

    async fn try_lock_and_load(
        &self,
        instances: &[InstanceId],
        holder: &str,
        ttl: Duration,
    ) -> Result<(Vec<InstanceId>, Result<LoadedInstances, StoreError>), StoreError> {
        // One call, as the SQL stores make it one statement: the locks
        // taken and the rows of those taken read in the same moment.
        let mut state = self.call()?;
        if mutants::active(Mutant::SkipInstanceLockRow) {
            // Broken on purpose, as in `try_lock_instances`.
            let loaded = State::load(&state, instances);
            return Ok((instances.to_vec(), Ok(loaded)));
        }
        let locked = self.lock_in(&mut state, instances, holder, ttl);
        let loaded = State::load(&state, &locked);
        self.tell_locked(state, &locked, holder);
        Ok((locked, Ok(loaded)))
    }

    async fn unlock_instances(
        &self,
        instances: &[InstanceId],
        holder: &str,
    ) -> Result<(), StoreError> {
        let mut state = self.call()?;
        let mut names = Vec::new();
        for id in instances {
            if state
                .instance_locks
                .get(id)
                .is_some_and(|(h, _)| &**h == holder)
            {
                state.instance_locks.remove(id);
                if let (Some(i), Some(_)) = (state.instances.get(id), &self.observer) {
                    names.push(i.name.clone());
                }
            }
        }
        drop(state);
        for instance in names {
            self.tell(|| Effect::InstanceUnlocked {
                instance,
                holder: holder.to_owned(),
            });
        }
        Ok(())
    }

    async fn clear_instance_locks_of(&self, prefix: &str) -> Result<u64, StoreError> {
        let mut state = self.call()?;
        let before = state.instance_locks.len();
        state
            .instance_locks
            .retain(|_, (holder, _)| !holder.starts_with(prefix));
        Ok((before - state.instance_locks.len()) as u64)
    }

    async fn cancel_queued_task(
        &self,
        id: TaskId,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        let now = normalize_timestamp(now);
        let upgrading: BTreeSet<InstanceId> = state
            .instances
            .values()
            .filter(|i| i.state == InstanceState::Upgrading)
            .map(|i| i.id)
            .collect();
        match state.tasks.get_mut(&id) {
            Some(task)
                if task.state == TaskState::Queued
                    && !(task.kind == TaskKind::Upgrade && upgrading.contains(&task.instance)) =>
            {
                task.state = TaskState::Failed;
                task.last_error = Some(reason.to_owned());
                task.updated_at = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn cancel_queued_upgrades(
        &self,
        service_type: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError> {
        let mut state = self.call()?;
        let now = normalize_timestamp(now);
        let of_type: BTreeSet<InstanceId> = state
            .instances
            .values()
            .filter(|i| i.service_type == service_type && i.state != InstanceState::Upgrading)
            .map(|i| i.id)
            .collect();
        let mut cancelled = Vec::new();
        for task in state.tasks.values_mut() {
            if task.state == TaskState::Queued
                && task.kind == TaskKind::Upgrade
                && task.attempts == 0
                && of_type.contains(&task.instance)
            {
                task.state = TaskState::Failed;
                task.last_error = Some(reason.to_owned());
                task.updated_at = now;
                cancelled.push(task.id);
            }
        }
        Ok(cancelled)
    }

    async fn requeue_tasks_of(
        &self,
        prefix: &str,
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError> {
        let mut state = self.call()?;
        let now = normalize_timestamp(now);
        let mut requeued = Vec::new();
        for task in state.tasks.values_mut() {
            let held = task.state == TaskState::Running
                && task
                    .locked_by
                    .as_deref()
                    .is_some_and(|by| by.starts_with(prefix));
            if held {
                requeued.push((task.id, task.locked_by.take().unwrap_or_default()));
                task.state = TaskState::Queued;
                task.locked_at = None;
                task.updated_at = now;
            }
        }
        drop(state);
        requeued.sort();
        for (task, holder) in &requeued {
            self.tell(|| Effect::TaskReclaimed {
                task: *task,
                holder: holder.clone(),
            });
        }
        Ok(requeued.into_iter().map(|(task, _)| task).collect())
    }

    async fn reconciler_lease(&self) -> Result<Option<LeaseGrant>, StoreError> {
        Ok(self.call()?.lease_row().grant())
    }

    async fn append_events(&self, events: &[Event]) -> Result<(), StoreError> {
        let mut state = self.call()?;
        for event in events {
            state.push_event(event.clone());
        }
        Ok(())
    }

    /// The enqueue is one call; its event is kept with it, past the fault
    /// hooks, as a SQL transaction keeps both or neither.
    async fn enqueue_recorded(
        &self,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
        event: &Event,
    ) -> Result<Option<TaskId>, StoreError> {
        let id = self.enqueue(task, now, fence).await?;
        if let Some(id) = id {
            self.lock().push_event(event.clone().task(id));
        }
        Ok(id)
    }

    async fn finish_task_recorded(
        &self,
        id: TaskId,
        worker: &str,
        finish: stead::ports::TaskFinish<'_>,
        now: Timestamp,
        event: &Event,
    ) -> Result<bool, StoreError> {
        use stead::ports::TaskFinish;
        let held = match finish {
            TaskFinish::Done => self.complete(id, worker, now).await?,
            TaskFinish::Retry { run_after, error } => {
                self.retry(id, worker, run_after, error, now).await?
            }
            TaskFinish::Fail { error } => self.fail(id, worker, error, now).await?,
        };
        if held {
            self.lock().push_event(event.clone().task(id));
        }
        Ok(held)
    }

    async fn expire_instance_recorded(
        &self,
        id: InstanceId,
        from: InstanceState,
        task: &NewTask,
        now: Timestamp,
        fence: Option<&LeaseGrant>,
        event: &Event,
    ) -> Result<Option<Expired>, StoreError> {
        let expired = self.expire_instance(id, from, task, now, fence).await?;
        if let Some(expired) = &expired {
            self.lock().push_event(event.clone().task(expired.task));
        }
        Ok(expired)
    }

    async fn events(&self, filter: &EventFilter) -> Result<Rows<LoggedEvent>, StoreError> {
        let state = self.call()?;
        let admitted = state.events.iter().filter(|e| filter.admits(e));
        let limit = filter.limit as usize;
        let rows: Vec<LoggedEvent> = if filter.after_id.is_some() {
            admitted.take(limit).cloned().collect()
        } else {
            let mut newest: Vec<LoggedEvent> = admitted.rev().take(limit).cloned().collect();
            newest.reverse();
            newest
        };
        Ok(Rows {
            rows,
            bad: Vec::new(),
        })
    }

    async fn webhook_cursor(&self, webhook: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.call()?.webhook_cursors.get(webhook).copied())
    }

    async fn advance_webhook_cursor(
        &self,
        webhook: &str,
        from: Option<i64>,
        to: i64,
        _now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut state = self.call()?;
        if state.webhook_cursors.get(webhook).copied() != from {
            return Ok(false);
        }
        state.webhook_cursors.insert(webhook.to_owned(), to);
        Ok(true)
    }

    async fn prune_events(&self, before: Timestamp, batch_max: u32) -> Result<u64, StoreError> {
        let mut state = self.call()?;
        let mut old: Vec<(Timestamp, i64)> = state
            .events
            .iter()
            .filter(|e| e.event.at < before)
            .map(|e| (e.event.at, e.id))
            .collect();
        old.sort_unstable();
        old.truncate(batch_max as usize);
        let pruned: BTreeSet<i64> = old.into_iter().map(|(_, id)| id).collect();
        state.events.retain(|e| !pruned.contains(&e.id));
        Ok(pruned.len() as u64)
    }

    async fn prune_type_versions(&self, before: Timestamp) -> Result<u64, StoreError> {
        let mut state = self.call()?;
        let before = normalize_timestamp(before);
        let newest: BTreeMap<String, Timestamp> =
            state
                .type_versions
                .values()
                .fold(BTreeMap::new(), |mut newest, r| {
                    let at = newest
                        .entry(r.service_type.clone())
                        .or_insert(r.recorded_at);
                    *at = (*at).max(r.recorded_at);
                    newest
                });
        let doomed: Vec<(String, String, String)> = state
            .type_versions
            .iter()
            .filter(|(_, r)| {
                r.recorded_at < before
                    && r.recorded_at < newest[&r.service_type]
                    && !state.instances.values().any(|i| {
                        i.service_type == r.service_type
                            && i.version == r.version
                            && i.state != InstanceState::Deleted
                    })
                    && !state.rollouts.get(&r.service_type).is_some_and(|rollout| {
                        rollout.pinned.as_deref() == Some(r.version.as_str())
                    })
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &doomed {
            state.type_versions.remove(key);
        }
        Ok(doomed.len() as u64)
    }

    async fn prune_finished_tasks(
        &self,
        before: Timestamp,
        batch_max: u32,
    ) -> Result<u64, StoreError> {
        let mut state = self.call()?;
        let before = normalize_timestamp(before);
        let mut old: Vec<(Timestamp, TaskId)> = state
            .tasks
            .values()
            .filter(|t| !t.state.is_active() && t.updated_at < before)
            .map(|t| (t.updated_at, t.id))
            .collect();
        old.sort_unstable();
        old.truncate(batch_max as usize);
        for (_, id) in &old {
            state.tasks.remove(id);
        }
        Ok(old.len() as u64)
    }
}

fn service_key(instance: &InstanceName, service: &ServiceName) -> ServiceKey {
    ServiceKey {
        instance: instance.clone(),
        service: service.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_instance(name: &str) -> NewInstance {
        NewInstance {
            domains: Vec::new(),
            spec_digest: None,
            parameters: Default::default(),
            name: InstanceName::new(name),
            team: "t".into(),
            service_type: "wiki".into(),
            version: "1".into(),
            expires_at: None,
            maintenance_window: None,
        }
    }

    #[tokio::test]
    async fn injected_failures_change_nothing_and_then_stop() {
        let store = MemoryStore::new();
        let now = Timestamp::UNIX_EPOCH;
        store.fail_next_calls(2);
        for _ in 0..2 {
            let failed = store.create_instance(&new_instance("a"), now).await;
            assert!(matches!(failed, Err(StoreError::Unavailable(_))));
        }
        assert!(store.create_instance(&new_instance("a"), now).await.is_ok());
        store.set_unavailable(true);
        assert!(store.list_instances().await.is_err());
        store.set_unavailable(false);
        assert_eq!(store.list_instances().await.unwrap().rows.len(), 1);
        assert_eq!(store.n_calls(), 5);
    }

    #[tokio::test]
    async fn all_tasks_keeps_finished_tasks_for_checkers() {
        let store = MemoryStore::new();
        let now = Timestamp::UNIX_EPOCH;
        let instance = store
            .create_instance(&new_instance("a"), now)
            .await
            .unwrap();
        let task = NewTask {
            kind: stead::core::fleet::TaskKind::Provision,
            instance: instance.id,
            run_after: now,
            reason: "r".into(),
            traceparent: None,
        };
        let id = store.enqueue(&task, now, None).await.unwrap().unwrap();
        store.claim("w", now, 1).await.unwrap();
        assert!(store.complete(id, "w", now).await.unwrap());
        assert!(store.active_tasks().await.unwrap().rows.is_empty());
        assert_eq!(store.all_tasks().len(), 1);
    }
}
