//! The control loop (C1–C10): one tick runs every check behind its own
//! error boundary, then the gauges, then the heartbeat, all in one span
//! whose `traceparent` every enqueued task carries. The loop ticks first,
//! then sleeps a fixed interval that a stop signal interrupts.
//!
//! This file holds the reconciler's state and its small accessors; each
//! part of a tick lives in its own file below.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::core::event_log::Event;
use crate::core::plan::ControlConfig;
use crate::core::succession::TwinWatch;
use crate::core::types::{InstanceName, Timestamp};

use super::recovery::Recoverer;
use super::{Ports, SharedCatalog};

mod apply;
mod control;
mod halted;
mod leadership;
mod lost;
mod outcome;
mod reports;
mod run;
mod versions;

pub use outcome::{Check, TickOutcome};

use lost::LostServices;

/// The singleton reconciler. Its lease is the recoverer's: one lease
/// covers every effect of the reconciler, recovery included (T2).
pub struct Reconciler {
    ports: Ports,
    catalog: SharedCatalog,
    config: ControlConfig,
    recoverer: Arc<Recoverer>,
    /// Whether this replica held the lease at its last tick; a change is
    /// logged once (taken, lost, waited for).
    leader: std::sync::atomic::AtomicBool,
    rng: Mutex<ChaCha8Rng>,
    /// Unix seconds of the last finished tick (0 before the first).
    last_tick_s: AtomicI64,
    /// Cuts the pause between ticks short (a reloaded catalog).
    wake: tokio::sync::Notify,
    /// The holder last logged as keeping this standby waiting.
    waiting_for: Mutex<Option<String>>,
    /// T1: what this standby saw of a twin holding the lease (the same
    /// identity at another site), and the twin it last reported alive.
    twin_watch: Mutex<(TwinWatch, Option<String>)>,
    /// Each check's reports at its last run, so each is logged once; with
    /// whether it names an orphan release (those stand while withheld).
    reported: Mutex<BTreeMap<Check, BTreeMap<String, bool>>>,
    /// What the last full recovery pass found gone (R7), per instance:
    /// drift reprovisions those services at the next tick's planning.
    lost_services: Mutex<LostServices>,
    /// The checks that failed at the last tick this replica led, with
    /// why: a failure that lasts is logged once when it begins and once
    /// when it ends.
    failing: Mutex<BTreeSet<(Check, String)>>,
    /// The bad rows the last snapshot skipped, logged the same way.
    bad_rows: Mutex<BTreeSet<String>>,
    /// The warnings of the last tick this replica led (a container gone,
    /// a runtime that does not answer), logged the same way.
    warned: Mutex<BTreeSet<String>>,
    /// How long the event log keeps an event (#42); unset: the leader's
    /// tick prunes nothing.
    event_retention: std::sync::OnceLock<Duration>,
    /// The type definitions (type, version, spec digest) this replica
    /// recorded as leader or found recorded, so each is written once.
    recorded_versions: Mutex<BTreeSet<(String, String, String)>>,
}

impl Reconciler {
    /// `seed` feeds trace ids; the daemon draws it from the OS, the
    /// simulation from its run seed.
    pub fn new(
        ports: Ports,
        catalog: impl Into<SharedCatalog>,
        config: ControlConfig,
        recoverer: Arc<Recoverer>,
        seed: u64,
    ) -> Self {
        Self {
            ports,
            catalog: catalog.into(),
            config,
            recoverer,
            leader: std::sync::atomic::AtomicBool::new(false),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            last_tick_s: AtomicI64::new(0),
            wake: tokio::sync::Notify::new(),
            waiting_for: Mutex::new(None),
            twin_watch: Mutex::new((TwinWatch::default(), None)),
            reported: Mutex::new(BTreeMap::new()),
            failing: Mutex::new(BTreeSet::new()),
            bad_rows: Mutex::new(BTreeSet::new()),
            warned: Mutex::new(BTreeSet::new()),
            lost_services: Mutex::new(LostServices::new()),
            event_retention: std::sync::OnceLock::new(),
            recorded_versions: Mutex::new(BTreeSet::new()),
        }
    }

    /// From now on, each tick this replica leads deletes the events older
    /// than `retention`, in bounded batches (#42). Set once.
    pub fn keep_events_for(&self, retention: Duration) {
        let _ = self.event_retention.set(retention);
    }

    /// Writes `event` to the event log (#42), never waiting for it.
    fn emit(&self, event: Event) {
        self.recoverer.events().emit(event);
    }

    /// An event about the instance named `name` (as the tick names it: a
    /// name the snapshot knows, else its id), stamped for a store call
    /// that records it with its change; `None` when events are off.
    fn stamped_about(&self, name: &str, event: Event) -> Option<Event> {
        let event = match crate::core::names::check_instance_name("instance", name) {
            Ok(()) => event.instance(&InstanceName::new(name)),
            Err(_) => event,
        };
        self.recoverer.events().stamp(event)
    }

    /// Whether this replica held the reconciler lease at its last tick:
    /// what only one replica should do (deliver webhooks) asks here.
    pub fn leads(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Starts the next tick now instead of after the pause (or right after
    /// the running one). Level-triggered: the tick does not know why.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn recoverer(&self) -> &Recoverer {
        &self.recoverer
    }

    /// Unix seconds of the last finished tick; 0 before the first.
    pub fn last_tick_s(&self) -> i64 {
        self.last_tick_s.load(Ordering::Relaxed)
    }

    /// Whether this replica holds a lease it trusts right now.
    pub fn holds_lease(&self) -> bool {
        self.recoverer.lease().current().is_some()
    }

    /// A W3C trace context for a new tick.
    fn new_traceparent(&self) -> String {
        new_traceparent(&mut *self.rng.lock().expect("rng poisoned"))
    }

    /// The time the reconciler believes it is (for status output).
    pub fn now(&self) -> Timestamp {
        self.ports.clock.now()
    }
}

/// A fresh W3C `traceparent` (version 00, sampled) from `rng`; ids are
/// never all zero, which the spec forbids.
pub fn new_traceparent(rng: &mut impl Rng) -> String {
    let trace: u128 = rng.random::<u128>() | 1;
    let span: u64 = rng.random::<u64>() | 1;
    format!("00-{trace:032x}-{span:016x}-01")
}
