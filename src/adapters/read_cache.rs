//! The Docker adapter's read cache: what makes a steady pass cost one list
//! call instead of an inspect per container (docs/operations.md, "What a
//! steady pass costs against Docker").
//!
//! One inspect answers all three reads a pass makes of a container (its
//! execution, its health, its binds). Those answers stay true until Docker
//! reports a change, and Docker reports every change that matters on its
//! event stream: a new execution (`start`), its end (`die`), a health
//! verdict (`health_status`), removal (`destroy`). So while stead follows
//! the stream, an answer is served from the cache until
//!
//! - an event names the container,
//! - stead itself starts, stops, restarts, creates or removes it,
//! - the pass's one labelled list call shows a different status or no
//!   container at all,
//! - the stream drops (everything is forgotten: dockerd may have restarted,
//!   and its replay would not cover that), or
//! - the entry is older than [`READ_CACHE_MAX_AGE`], which bounds what a
//!   lost event could ever cost.
//!
//! Without the event stream nothing is cached, and every read inspects.
//!
//! A read that raced an invalidation must not refill the cache with what it
//! saw before the change: each fill carries the ticket taken before its
//! inspect and is dropped when an invalidation came in between.
//!
//! The invalidation marks are pruned at each list call to the containers
//! it lists (#41): every container ever seen, stead's or removed, would
//! otherwise keep one for the life of the process. A pruned mark reads as
//! the mark of the last invalidation before the prune, so a ticket taken
//! before an invalidation still never matches after it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::types::{Binds, ContainerId, ContainerStatus, Health, Observation};

/// Longest time an answer is served without a fresh inspect.
pub const READ_CACHE_MAX_AGE: Duration = Duration::from_secs(300);

/// Everything one inspect says about a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspected {
    pub observation: Observation,
    pub health: Health,
    pub binds: Binds,
}

/// Proof of what the cache looked like before an inspect began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    global: u64,
    container: u64,
}

#[derive(Debug, Default)]
struct State {
    following: bool,
    /// Bumped whenever everything is forgotten.
    global: u64,
    /// Counts invalidations; each sets its container's mark to the count.
    invalidations: u64,
    /// The mark of each container invalidated since the last prune.
    epochs: HashMap<ContainerId, u64>,
    /// The mark of a container not in `epochs`: the count at the last
    /// prune, at least that of any mark pruned.
    pruned_at: u64,
    entries: HashMap<ContainerId, (Inspected, Instant)>,
}

impl State {
    fn ticket(&self, id: &ContainerId) -> Ticket {
        Ticket {
            global: self.global,
            container: self.epochs.get(id).copied().unwrap_or(self.pruned_at),
        }
    }

    fn invalidate(&mut self, id: &ContainerId) {
        self.entries.remove(id);
        self.invalidations += 1;
        self.epochs.insert(id.clone(), self.invalidations);
    }
}

/// Shared by a runtime and its clones.
#[derive(Debug, Default)]
pub struct ReadCache {
    state: Mutex<State>,
}

impl ReadCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data, each method leaves it consistent: a panic elsewhere
        // cannot leave half an update behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer, if the stream is followed and it is fresh.
    pub fn get(&self, id: &ContainerId) -> Option<Inspected> {
        let state = self.lock();
        if !state.following {
            return None;
        }
        let (inspected, at) = state.entries.get(id)?;
        (at.elapsed() < READ_CACHE_MAX_AGE).then(|| inspected.clone())
    }

    /// Taken before an inspect; hand it back to [`ReadCache::fill`].
    pub fn ticket(&self, id: &ContainerId) -> Ticket {
        self.lock().ticket(id)
    }

    /// Stores what an inspect saw, unless something changed since the
    /// ticket was taken or the stream is not followed.
    pub fn fill(&self, id: &ContainerId, ticket: Ticket, inspected: Inspected) {
        let mut state = self.lock();
        if state.following && state.ticket(id) == ticket {
            state
                .entries
                .insert(id.clone(), (inspected, Instant::now()));
        }
    }

    /// Something happened to `id`: the next read inspects.
    pub fn invalidate(&self, id: &ContainerId) {
        self.lock().invalidate(id);
    }

    /// Whether the event stream is followed. Turning it off (the stream
    /// dropped) forgets everything; turning it on starts empty.
    pub fn set_following(&self, following: bool) {
        self.lock().following = following;
        self.forget_all();
    }

    /// Drops every answer and voids every outstanding ticket.
    pub fn forget_all(&self) {
        let mut state = self.lock();
        state.entries.clear();
        state.epochs.clear();
        state.global += 1;
    }

    /// Applies the pass's one list call: drops every entry whose container
    /// is missing from the list or shows another status.
    pub fn reconcile(&self, listed: &HashMap<ContainerId, ContainerStatus>) {
        let mut state = self.lock();
        let stale: Vec<ContainerId> = state
            .entries
            .iter()
            .filter(|(id, (inspected, _))| listed.get(*id) != Some(&inspected.observation.status))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            state.invalidate(id);
        }
        // A mark matters only while an inspect of its container may be
        // running: keep those of the listed containers, prune the rest.
        let before = state.epochs.len();
        state.epochs.retain(|id, _| listed.contains_key(id));
        if state.epochs.len() < before {
            state.pruned_at = state.invalidations;
        }
    }

    /// Invalidation marks held (for tests): at most one per container
    /// listed by the last list call, plus those invalidated since.
    pub fn marks(&self) -> usize {
        self.lock().epochs.len()
    }

    /// Entries currently served (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ContainerId {
        ContainerId::new(s)
    }

    fn running() -> Inspected {
        Inspected {
            observation: Observation {
                status: ContainerStatus::Running,
                started_at: Some("2026-11-30T00:00:00Z".parse().unwrap()),
                exit: None,
            },
            health: Health::Healthy,
            binds: Binds::from([(8080, 32768)]),
        }
    }

    #[test]
    fn nothing_is_cached_unless_the_stream_is_followed() {
        let cache = ReadCache::default();
        let t = cache.ticket(&id("a"));
        cache.fill(&id("a"), t, running());
        assert_eq!(cache.get(&id("a")), None);
        cache.set_following(true);
        let t = cache.ticket(&id("a"));
        cache.fill(&id("a"), t, running());
        assert_eq!(cache.get(&id("a")), Some(running()));
    }

    #[test]
    fn an_invalidation_during_an_inspect_drops_its_fill() {
        let cache = ReadCache::default();
        cache.set_following(true);
        let t = cache.ticket(&id("a"));
        cache.invalidate(&id("a")); // a `die` arrives mid-inspect
        cache.fill(&id("a"), t, running());
        assert_eq!(cache.get(&id("a")), None);
        let t = cache.ticket(&id("a"));
        cache.fill(&id("a"), t, running());
        assert_eq!(cache.get(&id("a")), Some(running()));
    }

    #[test]
    fn a_dropped_stream_forgets_everything_and_old_tickets() {
        let cache = ReadCache::default();
        cache.set_following(true);
        let before = cache.ticket(&id("a"));
        let t = cache.ticket(&id("b"));
        cache.fill(&id("b"), t, running());
        cache.set_following(false);
        cache.set_following(true);
        assert!(cache.is_empty());
        cache.fill(&id("a"), before, running());
        assert_eq!(cache.get(&id("a")), None, "a ticket from before the drop");
    }

    #[test]
    fn the_list_call_drops_changed_and_missing_containers() {
        let cache = ReadCache::default();
        cache.set_following(true);
        for name in ["same", "exited", "gone"] {
            let t = cache.ticket(&id(name));
            cache.fill(&id(name), t, running());
        }
        let listed = HashMap::from([
            (id("same"), ContainerStatus::Running),
            (id("exited"), ContainerStatus::Exited),
        ]);
        cache.reconcile(&listed);
        assert_eq!(cache.get(&id("same")), Some(running()));
        assert_eq!(cache.get(&id("exited")), None);
        assert_eq!(cache.get(&id("gone")), None);
    }

    #[test]
    fn the_list_call_prunes_the_marks_of_containers_it_does_not_list() {
        let cache = ReadCache::default();
        cache.set_following(true);
        // Events of a thousand containers come and go (another tenant's
        // churn, stead's own recreates): each leaves a mark.
        for n in 0..1000 {
            cache.invalidate(&id(&format!("gone{n}")));
        }
        cache.invalidate(&id("kept"));
        assert_eq!(cache.marks(), 1001);
        cache.reconcile(&HashMap::from([(id("kept"), ContainerStatus::Running)]));
        assert_eq!(cache.marks(), 1, "only the listed container keeps its mark");
    }

    #[test]
    fn a_fill_raced_by_an_invalidation_stays_dropped_after_its_mark_is_pruned() {
        let cache = ReadCache::default();
        cache.set_following(true);
        // Never invalidated yet: the ticket holds the default mark.
        let before = cache.ticket(&id("a"));
        cache.invalidate(&id("a")); // a `die` arrives mid-inspect
                                    // The list call does not show it (removed meanwhile): pruned.
        cache.reconcile(&HashMap::new());
        assert_eq!(cache.marks(), 0);
        cache.fill(&id("a"), before, running());
        assert_eq!(cache.get(&id("a")), None, "a ticket from before the event");
        // A ticket taken after the prune fills.
        let after = cache.ticket(&id("a"));
        cache.fill(&id("a"), after, running());
        assert_eq!(cache.get(&id("a")), Some(running()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_entry_is_inspected_again() {
        let cache = ReadCache::default();
        cache.set_following(true);
        let t = cache.ticket(&id("a"));
        cache.fill(&id("a"), t, running());
        tokio::time::advance(READ_CACHE_MAX_AGE - Duration::from_secs(1)).await;
        assert!(cache.get(&id("a")).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&id("a")), None);
    }
}
