//! The wake-up queue (T7): which instances should be recovered before the
//! next tick, and when.
//!
//! One slot per instance, the earliest wake-up winning: a burst of events
//! for one instance coalesces into one pending pass, and the queue never
//! holds more instances than its capacity (an event for an instance that
//! finds it full is dropped, which only costs that instance the wait for
//! the periodic, level-triggered pass). A fixed number of workers drain it
//! ([`super::events::drain`]); the periodic pass serves the slots that came
//! due by the time it loads their instance ([`WakeQueue::served`]), so an
//! instance is recovered once whichever of the two gets there first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::types::InstanceName;

/// Instances the queue holds at most by default: far more than one daemon
/// recovers, so it fills only under a pathological event storm.
pub const WAKE_QUEUE_CAPACITY_DEFAULT: usize = 100_000;

/// What [`WakeQueue::wake`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A new slot.
    Queued,
    /// The instance already waited; the earlier of the two times stays.
    Coalesced,
    /// The queue is full; nothing queued (the periodic pass covers it).
    Full,
}

#[derive(Default)]
struct Slots {
    /// Instance → when it is due.
    due: HashMap<InstanceName, Instant>,
    /// The same, ordered by due time.
    order: BTreeSet<(Instant, InstanceName)>,
}

/// A bounded set of instances due for recovery.
pub struct WakeQueue {
    slots: Mutex<Slots>,
    changed: Notify,
    capacity: usize,
}

impl WakeQueue {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a wake queue holds at least one instance");
        Self {
            slots: Mutex::default(),
            changed: Notify::new(),
            capacity,
        }
    }

    /// Asks for `instance` to be recovered at `at` (or earlier, if it
    /// already waits for an earlier time).
    pub fn wake(&self, instance: &InstanceName, at: Instant) -> Wake {
        let mut slots = self.lock();
        let outcome = match slots.due.get(instance).copied() {
            Some(due) if due <= at => return Wake::Coalesced,
            Some(due) => {
                slots.order.remove(&(due, instance.clone()));
                Wake::Coalesced
            }
            None if slots.due.len() >= self.capacity => return Wake::Full,
            None => Wake::Queued,
        };
        slots.due.insert(instance.clone(), at);
        slots.order.insert((at, instance.clone()));
        drop(slots);
        self.changed.notify_waiters();
        outcome
    }

    /// The periodic pass recovered `instance` from a fresh load taken at
    /// `at`: a wake-up due by then asked for nothing more, so its slot is
    /// freed (one scheduler: the tick serves what is due, the workers what
    /// comes due between ticks). A later wake-up stays. Returns whether a
    /// slot was freed.
    pub fn served(&self, instance: &InstanceName, at: Instant) -> bool {
        let mut slots = self.lock();
        match slots.due.get(instance).copied() {
            Some(due) if due <= at => {
                slots.due.remove(instance);
                slots.order.remove(&(due, instance.clone()));
                true
            }
            _ => false,
        }
    }

    /// How many instances wait.
    pub fn len(&self) -> usize {
        self.lock().due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next instance whose time has come, waiting for it.
    pub async fn next(&self) -> InstanceName {
        loop {
            // Registered before looking, so a wake in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let first = self.lock().order.first().cloned();
            match first {
                Some((due, instance)) if due <= Instant::now() => {
                    let mut slots = self.lock();
                    if slots.order.remove(&(due, instance.clone())) {
                        slots.due.remove(&instance);
                        return instance;
                    }
                }
                Some((due, _)) => {
                    tokio::select! {
                        // In order, not at random: the simulation must replay exactly.
                        biased;
                        _ = tokio::time::sleep_until(due) => {}
                        _ = &mut changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_burst_for_one_instance_coalesces_and_the_earliest_time_wins() {
        let queue = WakeQueue::new(10);
        let now = Instant::now();
        let a = InstanceName::new("a");
        assert_eq!(queue.wake(&a, now + Duration::from_secs(5)), Wake::Queued);
        assert_eq!(
            queue.wake(&a, now + Duration::from_secs(9)),
            Wake::Coalesced
        );
        assert_eq!(
            queue.wake(&a, now + Duration::from_secs(1)),
            Wake::Coalesced
        );
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next().await, a);
        assert_eq!(Instant::now(), now + Duration::from_secs(1));
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn instances_come_out_in_due_order_and_a_full_queue_drops() {
        let queue = WakeQueue::new(2);
        let now = Instant::now();
        let (a, b, c) = (
            InstanceName::new("a"),
            InstanceName::new("b"),
            InstanceName::new("c"),
        );
        queue.wake(&a, now + Duration::from_secs(3));
        queue.wake(&b, now + Duration::from_secs(2));
        assert_eq!(queue.wake(&c, now), Wake::Full);
        assert_eq!(queue.next().await, b);
        assert_eq!(queue.next().await, a);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_serves_what_was_due_and_leaves_later_wake_ups() {
        let queue = WakeQueue::new(10);
        let now = Instant::now();
        let (due, later) = (InstanceName::new("due"), InstanceName::new("later"));
        queue.wake(&due, now);
        queue.wake(&later, now + Duration::from_secs(30));
        assert!(queue.served(&due, now + Duration::from_secs(1)));
        assert!(!queue.served(&later, now + Duration::from_secs(1)));
        assert!(!queue.served(&InstanceName::new("none"), now));
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next().await, later);
        assert_eq!(Instant::now(), now + Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_for_an_earlier_instance() {
        let queue = std::sync::Arc::new(WakeQueue::new(10));
        let now = Instant::now();
        queue.wake(&InstanceName::new("late"), now + Duration::from_secs(60));
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.next().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.wake(&InstanceName::new("soon"), Instant::now());
        assert_eq!(waiter.await.unwrap(), InstanceName::new("soon"));
        assert_eq!(Instant::now(), now + Duration::from_secs(1));
    }
}
