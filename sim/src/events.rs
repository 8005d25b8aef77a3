//! E1 (#42): every intervention of a recovery pass the checker observes
//! has its row in the event log, and every such row its intervention.
//!
//! The checker tells the [`EventLedger`] each effect a recovery pass made
//! (who: `<identity>#<incarnation>`, the writer its events name); at the end
//! of a seed the runner reads the whole event log back from the store and
//! [`EventLedger::judge`] matches the two, per writer, kind, instance,
//! service and container.
//!
//! Judged exactly, both ways: Start (R9), Restart (R12), Publish (R13), and
//! Stop for stop intent (R4: the instance's intent is stopped and the
//! container is the one ACTIVE names). Judged one way (every row has its
//! effect; not every effect has a row): Stop otherwise (a retirement's or a
//! revert's stop of a predecessor or successor is recorded as one Retire or
//! Revert row, not as a Stop) and Withdraw (only a *notable* withdrawal is a
//! row: re-asserting a withdrawal nobody used is not). Not judged: Retire,
//! Revert and the decisions that are not effects on the runtime or the
//! proxy (enqueue, crash-loop delay, lease, task ends).
//!
//! An effect without its row is excused only where the design loses it,
//! and each excuse is counted:
//! - `gone`: the runtime was asked to start or restart a container already
//!   removed: the effect is reported, the call answers not-found, and the
//!   pass rightly logs no start.
//! - `killed`: its process wrote no batch after the row could have been
//!   emitted (the effect's instant plus [`ANSWER_SLACK`], or its node's
//!   resume after a pause that caught the answer, plus the slack), and was
//!   killed: its sink died with it, the events still buffered lost.
//! - `buffered`: the same, but the process is alive at the judgement: its
//!   row is still in the buffer.
//! - `dropped`: the writer's sink reported events dropped (the buffer was
//!   full); at most as many effects are excused as it dropped.
//!
//! Each process flushes its sink at the end of each of its ticks, inline
//! (`topology.rs`), not from a task of its own as the daemon does: madsim
//! picks the next task to poll at random, so a flusher task woken by every
//! event would change every seed's schedule, and the runs the other
//! invariants were judged on with them. A flush of the in-memory store
//! never yields; it is skipped while the store is down (a failed write
//! would sleep between attempts). A worker-only process has no tick: its
//! few events of its own (a worker's revert or undo) stay buffered, and
//! are not judged.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use madsim::task::NodeId;

use stead::core::event_log::{EventKind, LoggedEvent};
use stead::core::types::{ContainerId, InstanceName, ServiceName, Timestamp};

/// How long after an effect its row may still not be emitted: the slowest
/// answer the faults give an outside call is 3 s.
pub const ANSWER_SLACK: Duration = Duration::from_secs(5);

/// What a row and its effect are matched on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    writer: String,
    kind: EventKind,
    instance: InstanceName,
    service: ServiceName,
    /// `None` where the effect does not name one (a withdrawal).
    container: Option<ContainerId>,
}

/// One recovery intervention the checker observed.
#[derive(Clone, Debug)]
struct Intervention {
    at: Timestamp,
    /// Whether its row is due (judged both ways) or only allowed.
    exact: bool,
    /// The container had been removed: the call answers not-found.
    gone: bool,
}

/// One process incarnation, as the event log sees it.
#[derive(Clone, Debug, Default)]
struct Incarnation {
    /// When it last wrote its buffer to the store.
    flushed: Option<Timestamp>,
    /// When its node resumed from each pause.
    thawed: Vec<Timestamp>,
    /// Its node is paused now.
    frozen: bool,
    /// When it was killed.
    killed: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct Ledger {
    interventions: BTreeMap<Key, Vec<Intervention>>,
    removed: BTreeMap<ContainerId, Timestamp>,
    /// Each node's running incarnation (its writer).
    running: BTreeMap<NodeId, String>,
    incarnations: BTreeMap<String, Incarnation>,
}

impl Ledger {
    fn of(&mut self, node: NodeId) -> Option<&mut Incarnation> {
        let writer = self.running.get(&node)?;
        self.incarnations.get_mut(writer)
    }
}

/// The recovery interventions of one run, by writer.
#[derive(Debug, Default)]
pub struct EventLedger {
    ledger: Mutex<Ledger>,
}

/// What [`EventLedger::judge`] found.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Effects matched with their rows, and rows judged.
    pub matched: u64,
    pub rows: u64,
    /// Effects without their row, by excuse.
    pub excused: BTreeMap<&'static str, u64>,
    pub violations: Vec<String>,
}

impl EventLedger {
    /// A recovery pass of `writer` made an effect that the event log
    /// records as `kind`; `exact`: one row is due for it, not only allowed.
    #[allow(clippy::too_many_arguments)]
    pub fn intervened(
        &self,
        writer: &str,
        kind: EventKind,
        instance: &InstanceName,
        service: &ServiceName,
        container: Option<&ContainerId>,
        exact: bool,
        at: Timestamp,
    ) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        let gone = container.is_some_and(|c| ledger.removed.contains_key(c));
        let key = Key {
            writer: writer.to_owned(),
            kind,
            instance: instance.clone(),
            service: service.clone(),
            container: container.cloned(),
        };
        ledger
            .interventions
            .entry(key)
            .or_default()
            .push(Intervention { at, exact, gone });
    }

    /// `writer` runs on `node` from now on.
    pub fn started(&self, node: NodeId, writer: &str) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        ledger.running.insert(node, writer.to_owned());
        ledger
            .incarnations
            .insert(writer.to_owned(), Incarnation::default());
    }

    /// `node`'s process wrote its buffered events at `at`.
    pub fn flushed(&self, node: NodeId, at: Timestamp) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        if let Some(i) = ledger.of(node) {
            i.flushed = Some(at);
        }
    }

    /// `node` is paused.
    pub fn frozen(&self, node: NodeId) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        if let Some(i) = ledger.of(node) {
            i.frozen = true;
        }
    }

    /// `node` resumed at `at`.
    pub fn thawed(&self, node: NodeId, at: Timestamp) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        if let Some(i) = ledger.of(node).filter(|i| i.frozen) {
            i.frozen = false;
            i.thawed.push(at);
        }
    }

    /// `node`'s incarnation is killed at `at`: its sink dies with it.
    pub fn killed(&self, node: NodeId, at: Timestamp) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        if let Some(i) = ledger.of(node) {
            i.killed = Some(at);
        }
        ledger.running.remove(&node);
    }

    /// `id` was removed (by a process or by hand): a later start of it
    /// answers not-found.
    pub fn removed(&self, id: &ContainerId, at: Timestamp) {
        let mut ledger = self.ledger.lock().expect("poisoned");
        ledger.removed.entry(id.clone()).or_insert(at);
    }

    /// Matches the rows of `events` against the interventions observed.
    /// `dropped`: per writer, the
    /// events its sink dropped.
    pub fn judge(&self, events: &[LoggedEvent], dropped: &BTreeMap<String, u64>) -> Judgement {
        let ledger = self.ledger.lock().expect("poisoned");
        let incarnations = &ledger.incarnations;
        let mut judgement = Judgement::default();
        let mut rows: BTreeMap<Key, u64> = BTreeMap::new();
        for logged in events {
            let event = &logged.event;
            let judged = matches!(
                event.kind,
                EventKind::Start
                    | EventKind::Restart
                    | EventKind::Stop
                    | EventKind::Publish
                    | EventKind::Withdraw
            );
            let (true, Some(instance), Some(service)) = (judged, &event.instance, &event.service)
            else {
                continue;
            };
            let key = Key {
                writer: event.writer.clone(),
                kind: event.kind,
                instance: instance.clone(),
                service: service.clone(),
                container: (event.kind != EventKind::Withdraw)
                    .then(|| event.container.clone())
                    .flatten(),
            };
            *rows.entry(key).or_default() += 1;
        }
        let mut dropped = dropped.clone();
        let empty = Vec::new();
        let keys: std::collections::BTreeSet<&Key> =
            rows.keys().chain(ledger.interventions.keys()).collect();
        for key in keys {
            let n_rows = rows.get(key).copied().unwrap_or(0);
            let effects = ledger.interventions.get(key).unwrap_or(&empty);
            judgement.rows += n_rows;
            // No row without its effect.
            if n_rows > effects.len() as u64 {
                judgement.violations.push(format!(
                    "E1 every intervention has its event: {n_rows} {} row(s) by {} for {}/{} {:?}, \
                     but {} such effect(s) by its recovery",
                    key.kind,
                    key.writer,
                    key.instance,
                    key.service,
                    key.container.as_ref().map(ContainerId::as_str),
                    effects.len()
                ));
                continue;
            }
            // No effect due a row without one. The rows are written in
            // order, so those missing are of the latest effects.
            let exact = effects.iter().filter(|e| e.exact).count() as u64;
            let mut missing = exact.saturating_sub(n_rows);
            judgement.matched += exact.min(n_rows);
            for effect in effects.iter().rev().filter(|e| e.exact) {
                if missing == 0 {
                    break;
                }
                missing -= 1;
                let excuse = excuse(key, effect, incarnations.get(&key.writer), &mut dropped);
                match excuse {
                    Some(excuse) => *judgement.excused.entry(excuse).or_default() += 1,
                    None => judgement.violations.push(
                        format!(
                        "E1 every intervention has its event: {} of {}/{} {:?} by {} at {} has no \
                         {} row ({n_rows} row(s) for {} such effect(s))",
                        key.kind,
                        key.instance,
                        key.service,
                        key.container.as_ref().map(ContainerId::as_str),
                        key.writer,
                        effect.at,
                        key.kind,
                        effects.len()
                    ) + &format!("; its process: {:?}", incarnations.get(&key.writer)),
                    ),
                }
            }
        }
        judgement
    }
}

/// Why `effect` (of `key`) may have no row, if the design loses it.
fn excuse(
    key: &Key,
    effect: &Intervention,
    incarnation: Option<&Incarnation>,
    dropped: &mut BTreeMap<String, u64>,
) -> Option<&'static str> {
    if effect.gone && matches!(key.kind, EventKind::Start | EventKind::Restart) {
        return Some("gone");
    }
    let incarnation = incarnation?;
    let slack = jiff::SignedDuration::try_from(ANSWER_SLACK).expect("a few seconds");
    // By when its row was surely emitted: its answer came within the slack,
    // unless a pause caught the process first (then after a resume). Which
    // resume a paused pass's answer waited for cannot be told (a process
    // paused twice may handle it after the second), so the latest resume
    // since the effect and before the last write counts (fifty-instance
    // seed 2: a publish answered after the second of two pauses).
    let last_write = incarnation.flushed.unwrap_or(effect.at);
    let thawed = incarnation
        .thawed
        .iter()
        .filter(|t| **t >= effect.at && **t <= last_write)
        .max();
    let emitted = *thawed.unwrap_or(&effect.at).max(&effect.at);
    let emitted = emitted.checked_add(slack).ok()?;
    let written_since = incarnation.flushed.is_some_and(|f| f >= emitted);
    if !written_since {
        return Some(match incarnation.killed {
            Some(_) => "killed",
            None => "buffered",
        });
    }
    if let Some(n) = dropped.get_mut(&key.writer).filter(|n| **n > 0) {
        *n -= 1;
        return Some("dropped");
    }
    None
}

/// E1, at the end of a seed: reads the whole event log back and judges it
/// against the interventions the checker observed; the excuses are
/// counted as checks of their own (`E1 excused: …`).
pub async fn judge_log(
    checker: &crate::checker::Checker,
    store: &dyn stead::ports::Store,
    slots: &[std::sync::Arc<crate::topology::Slot>],
) {
    use stead::core::event_log::{EventFilter, EVENTS_READ_MAX};
    let mut events = Vec::new();
    loop {
        let filter = EventFilter {
            after_id: Some(events.last().map_or(0, |e: &LoggedEvent| e.id)),
            limit: EVENTS_READ_MAX,
            ..EventFilter::default()
        };
        let read = match store.events(&filter).await {
            Ok(read) => read.rows,
            Err(e) => {
                checker.record_violation(format!(
                    "E1 every intervention has its event: the event log could not be read: {e}"
                ));
                return;
            }
        };
        let done = read.len() < EVENTS_READ_MAX as usize;
        events.extend(read);
        if done {
            break;
        }
    }
    let mut dropped = BTreeMap::new();
    for (writer, n) in slots.iter().flat_map(|s| s.events_dropped()) {
        *dropped.entry(writer).or_default() += n;
    }
    let judgement = checker.events.judge(&events, &dropped);
    checker.judged_times("E1 every intervention has its event", judgement.matched);
    checker.judged_times("E1 rows judged", judgement.rows);
    for (excuse, n) in &judgement.excused {
        checker.judged_times(excuse_name(excuse), *n);
    }
    for violation in judgement.violations {
        checker.record_violation(violation);
    }
}

fn excuse_name(excuse: &str) -> &'static str {
    match excuse {
        "gone" => "E1 excused: started after its removal",
        "killed" => "E1 excused: killed before its flush",
        "dropped" => "E1 excused: dropped by its sink",
        _ => "E1 excused: still buffered at the end",
    }
}
