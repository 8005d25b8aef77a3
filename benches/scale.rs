//! Issue #14: what one steady recovery pass costs as the fleet grows. Steady
//! fleets (two services per instance, every container running with a
//! recorded verified execution, every route published: a pass changes
//! nothing) of 1k, 10k and 100k instances over the in-memory store, 1k and
//! 10k over SQLite and Postgres, each recovered by the real `Recoverer`
//! over in-memory ports. Printed: time per pass (the median of several),
//! per service, the growth exponent between sizes (1.0 is linear), the
//! store's round trips per pass, and the bytes the recovery retains per
//! service, counted by a global allocator. Then a 1,000-instance pass
//! against a runtime answering every call in 2 ms, batched (the default
//! `recovery.instances_at_once`) against one instance at a time.
//!
//!     cargo bench --bench scale
//!
//! `STEAD_BENCH_SCALE_MAX` caps the largest fleet (default 100000);
//! `STEAD_BENCH_AT_ONCE` sets `recovery.instances_at_once` (default 32);
//! `STEAD_BENCH_PASSES` the timed passes per size (so that a profile of
//! the run is mostly passes, not the fleet's building);
//! `STEAD_BENCH_SCALE_BACKENDS` picks runs (default
//! `memory,sqlite,postgres,slow`); `STEAD_BENCH_METRICS=1` installs the
//! daemon's Prometheus recorder first, so every counter the pass bumps
//! costs what it costs in the daemon (without it, the `metrics` macros
//! find no recorder and do almost nothing).
//! Outside `cargo bench` (the CI smoke run) it runs the 1k in-memory fleet
//! once and checks the pass is steady.

// A benchmark measures wall time.
#![allow(clippy::disallowed_methods)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use stead::core::policy::{reconciler_lease_ttl, RecoveryPolicy, LEASE_MARGIN};
use stead::engine::lease::LeaseGuard;
use stead::engine::recovery::{InstanceLocks, Recoverer};
use stead::engine::{Ports, SystemClock};
use stead::ports::{Clock, Store};
use stead_testkit::fleet::{build_steady_fleet, FleetShape};
use stead_testkit::ports::{
    Fault, FaultInjector, Hooks, MemoryNotifier, MemoryPolicy, MemoryProbe, MemoryProvisioner,
    MemoryRuntime, MemoryTraffic, Op,
};
use stead_testkit::store::MemoryStore;

/// The daemon's allocator (`src/bin/stead/main.rs`: mimalloc), counting
/// live heap bytes, for what the recovery retains between passes. Counted
/// only while [`COUNTING`] is set: the timed passes run without the
/// counter's atomic operations on every allocation, which are the
/// benchmark's cost, not stead's.
struct Counting;

/// What the daemon allocates with.
static DAEMONS: mimalloc::MiMalloc = mimalloc::MiMalloc;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

fn count(delta: isize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { DAEMONS.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { DAEMONS.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { DAEMONS.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SERVICES_PER_INSTANCE: usize = 2;

/// Every runtime call answers after this long (the slow-runtime run).
const SLOW_CALL: Duration = Duration::from_millis(2);

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

/// One steady fleet with its recovery, ready to pass.
struct Fleet {
    recoverer: Recoverer,
    memory: Option<Arc<MemoryStore>>,
    shape: FleetShape,
}

/// Answers every runtime call after [`SLOW_CALL`].
struct SlowRuntime;

impl FaultInjector for SlowRuntime {
    fn decide(&self, op: Op, _subject: &str) -> Fault {
        match op {
            Op::Inspect | Op::Health | Op::Binds | Op::Start | Op::Stop | Op::Restart => {
                Fault::Slow(SLOW_CALL)
            }
            _ => Fault::Proceed,
        }
    }
}

async fn fleet(
    store: Arc<dyn Store>,
    memory: Option<Arc<MemoryStore>>,
    shape: FleetShape,
    policy: RecoveryPolicy,
    slow: bool,
) -> Fleet {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let quiet = Hooks::default();
    let runtime_hooks = if slow {
        Hooks {
            faults: Arc::new(SlowRuntime),
            ..Hooks::default()
        }
    } else {
        quiet.clone()
    };
    let runtime = Arc::new(MemoryRuntime::new(clock.clone(), runtime_hooks));
    let traffic = Arc::new(MemoryTraffic::new(quiet.clone()));
    build_steady_fleet(shape, store.as_ref(), &runtime, &traffic, now())
        .await
        .unwrap_or_else(|e| panic!("building the fleet: {e}"));
    let ports = Ports {
        clock,
        runtime: runtime.clone(),
        traffic,
        store: store.clone(),
        probe: Arc::new(MemoryProbe::new(runtime, quiet.clone())),
        policy: Arc::new(MemoryPolicy::default()),
        provisioner: Arc::new(MemoryProvisioner::new("stead", quiet.clone())),
        notifier: Arc::new(MemoryNotifier::new(quiet)),
    };
    // A lease long enough that no pass renews it mid-measurement.
    let ttl = reconciler_lease_ttl(Duration::from_secs(3600), policy.instance_deadline);
    let recoverer = Recoverer::new(
        ports,
        policy,
        Default::default(),
        Arc::new(InstanceLocks::new(store.clone())),
        "bench/recovery".into(),
        Arc::new(LeaseGuard::new("bench".into(), ttl, LEASE_MARGIN)),
    );
    Fleet {
        recoverer,
        memory,
        shape,
    }
}

/// One pass, checked steady: (wall time, store round trips if counted).
async fn pass(fleet: &Fleet) -> (Duration, Option<u64>) {
    let calls = fleet.memory.as_ref().map(|m| m.n_calls());
    let began = Instant::now();
    let outcome = fleet.recoverer.pass().await;
    let took = began.elapsed();
    assert_eq!(
        outcome.error_count(),
        0,
        "pass errors: {:?}",
        outcome.errors
    );
    let reports: Vec<_> = outcome.outcomes().flat_map(|i| &i.reports).collect();
    assert_eq!(reports.len(), fleet.shape.services(), "every service seen");
    assert!(reports.iter().all(|r| !r.intervened), "a steady pass");
    let trips = fleet
        .memory
        .as_ref()
        .zip(calls)
        .map(|(m, before)| m.n_calls() - before);
    (took, trips)
}

/// The process's CPU time (every thread's, user and system) and context
/// switches so far: over SQLite most of a pass is the store's threads
/// handing work to one another, which wall time on a shared 2-core machine
/// shows only noisily.
#[derive(Clone, Copy)]
struct Usage {
    cpu: Duration,
    switches: i64,
}

impl Usage {
    fn now() -> Self {
        // SAFETY: getrusage only writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        assert_eq!(rc, 0, "getrusage");
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        Self {
            cpu: time(usage.ru_utime) + time(usage.ru_stime),
            switches: usage.ru_nvcsw + usage.ru_nivcsw,
        }
    }
}

/// A measured size: instances and median pass time.
struct Row {
    instances: usize,
    pass: Duration,
}

async fn measure(backend: &str, instances: usize, passes: usize) -> Row {
    let passes = std::env::var("STEAD_BENCH_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(passes)
        .max(1);
    let shape = FleetShape {
        instances,
        services_per_instance: SERVICES_PER_INSTANCE,
    };
    let built = Instant::now();
    // A SQL store's temporary database lives as long as its TestStore.
    let sql = match backend {
        "memory" => None,
        "sqlite" => Some(support::sqlite().await),
        _ => Some(support::postgres().await),
    };
    let (store, memory): (Arc<dyn Store>, Option<Arc<MemoryStore>>) = match &sql {
        None => {
            let m = Arc::new(MemoryStore::new());
            (m.clone(), Some(m))
        }
        Some(sql) => (sql.store.clone(), None),
    };
    let policy = RecoveryPolicy {
        instances_at_once: at_once(),
        ..Default::default()
    };
    let fleet = fleet(store, memory, shape, policy, false).await;
    let build = built.elapsed();
    // What the recovery keeps between passes: the first pass fills its
    // memory; what is still live after a second is what it retains. Every
    // allocation and free in between is counted (an allocation freed later
    // would otherwise count as retained).
    COUNTING.store(true, Ordering::Relaxed);
    let live_before = LIVE.load(Ordering::Relaxed);
    pass(&fleet).await;
    pass(&fleet).await;
    let retained = LIVE.load(Ordering::Relaxed) - live_before;
    COUNTING.store(false, Ordering::Relaxed);
    let mut times = Vec::with_capacity(passes);
    let mut trips = None;
    let before = Usage::now();
    for _ in 0..passes {
        let (took, t) = pass(&fleet).await;
        times.push(took);
        trips = t;
    }
    let after = Usage::now();
    times.sort();
    let median = times[passes / 2];
    let services = shape.services();
    println!(
        "{backend:>8} {instances:>7} instances {services:>7} services: pass {:>9.1} ms, \
         {:>6.2} µs/service, {} round trips, {:>5} B/service retained (built in {:.1} s); \
         per pass {:.1} ms of CPU, {} context switches",
        median.as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e6 / services as f64,
        trips.map_or("-".to_owned(), |t| t.to_string()),
        retained / services as isize,
        build.as_secs_f64(),
        (after.cpu - before.cpu).as_secs_f64() * 1e3 / passes as f64,
        (after.switches - before.switches) / passes as i64,
    );
    Row {
        instances,
        pass: median,
    }
}

/// `recovery.instances_at_once` for the steady runs:
/// `STEAD_BENCH_AT_ONCE`, else the default.
fn at_once() -> usize {
    std::env::var("STEAD_BENCH_AT_ONCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RecoveryPolicy::default().instances_at_once)
}

/// The growth exponent between each pair of neighbouring sizes, and over
/// the whole range when there are more than two: a small fleet fits the
/// caches, so one step can grow faster than the whole range does.
fn growth(rows: &[Row]) {
    let line = |a: &Row, b: &Row| {
        let exponent = (b.pass.as_secs_f64() / a.pass.as_secs_f64()).ln()
            / (b.instances as f64 / a.instances as f64).ln();
        println!(
            "    growth {} -> {} instances: time x{:.1} for size x{}, exponent {exponent:.2}",
            a.instances,
            b.instances,
            b.pass.as_secs_f64() / a.pass.as_secs_f64(),
            b.instances / a.instances
        );
    };
    for pair in rows.windows(2) {
        line(&pair[0], &pair[1]);
    }
    if let [first, _, .., last] = rows {
        line(first, last);
    }
}

async fn slow_runtime() {
    let mut results = Vec::new();
    for (instances, at_once) in [
        (1_000, RecoveryPolicy::default().instances_at_once),
        (100, 1),
    ] {
        let policy = RecoveryPolicy {
            instances_at_once: at_once,
            ..Default::default()
        };
        let shape = FleetShape {
            instances,
            services_per_instance: SERVICES_PER_INSTANCE,
        };
        let store = Arc::new(MemoryStore::new());
        let f = fleet(store.clone(), Some(store), shape, policy, true).await;
        pass(&f).await;
        let (took, _) = pass(&f).await;
        println!(
            "  slow runtime ({} ms a call): {instances:>5} instances, {at_once:>2} at once: pass {:.2} s ({:.2} ms/instance)",
            SLOW_CALL.as_millis(),
            took.as_secs_f64(),
            took.as_secs_f64() * 1e3 / instances as f64
        );
        results.push(took.as_secs_f64() / instances as f64);
    }
    println!(
        "  batched / one at a time, per instance: {:.3}",
        results[0] / results[1]
    );
}

fn main() {
    // As the daemon's `main` does (MIMALLOC_PURGE_DELAY in the
    // environment overrides it, for an A/B run).
    stead::daemon::allocator::tune();
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if !full {
        // The CI smoke run: one small steady fleet, checked.
        runtime.block_on(measure("memory", 1_000, 1));
        println!("scale: the full run is `cargo bench --bench scale`");
        return;
    }
    if std::env::var_os("STEAD_BENCH_METRICS").is_some() {
        let _ = stead::daemon::metrics::handle();
    }
    let max = std::env::var("STEAD_BENCH_SCALE_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(100_000);
    let backends = std::env::var("STEAD_BENCH_SCALE_BACKENDS")
        .unwrap_or_else(|_| "memory,sqlite,postgres,slow".to_owned());
    let wanted = |b: &str| backends.split(',').any(|w| w == b);
    runtime.block_on(async {
        println!(
            "steady passes, {SERVICES_PER_INSTANCE} services per instance, {} instances at \
             once, allocator purge delay {} ms, median of several:",
            at_once(),
            stead::daemon::allocator::purge_delay_ms()
        );
        let mut rows = Vec::new();
        for n in [1_000, 10_000, 100_000].into_iter().filter(|n| *n <= max) {
            if wanted("memory") {
                rows.push(measure("memory", n, if n >= 100_000 { 3 } else { 7 }).await);
            }
        }
        growth(&rows);
        for backend in ["sqlite", "postgres"].into_iter().filter(|b| wanted(b)) {
            let mut rows = Vec::new();
            for n in [1_000, 10_000].into_iter().filter(|n| *n <= max) {
                rows.push(measure(backend, n, 5).await);
            }
            growth(&rows);
        }
        if wanted("slow") {
            slow_runtime().await;
        }
    });
}
