//! #40's bar for `stop-first`: a service with a named volume is upgraded
//! while its own loop appends to a file on the volume. At no instant do two
//! containers of it run (replayed from the engine's own `start` and `die`
//! events, streamed from before the instance existed), and the file is
//! intact afterwards: the old version's lines, unbroken, then the new
//! one's, never interleaved. A service with a volume and no `update` is
//! replaced the same way; one that asks for `overlap` is seen running two
//! containers at once by the very same replay, so the replay can see an
//! overlap when there is one. A successor that never becomes ready gives
//! the volume back to its predecessor, and a daemon or a worker process
//! killed mid-upgrade leaves no second writer behind: the recovery pass
//! that finds the stopped predecessor while the candidate runs leaves it
//! down.
//!
//! Also checked: both versions mount the instance's named volume, the
//! daemons log no warning or error about the instance, and they retire
//! the predecessor once.

mod e2e;
mod support;
mod support_services;

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::{inspect, wait_until, CapturedLog, Harness, Peer, Setup};
use stead::core::fleet::InstanceState;
use stead::core::types::{InstanceName, ServiceName};
use stead::daemon::Role;
use support_services::docker::{docker, Cleanup, ContainerEvent, EventLog};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(90);
const TYPE: &str = "store";
const SERVICE: &str = "writer";
/// Lines the version-1 writer appends before the upgrade starts (about a
/// second of writing).
const LINES_BEFORE_UPGRADE_MIN: usize = 10;
/// Lines the version-2 writer appends before the file is read.
const LINES_AFTER_UPGRADE_MIN: usize = 10;

/// Appends `<version> <count>` to `/data/log` every 100 ms, from one up,
/// and leaves at once on SIGTERM (a shell as PID 1 ignores it otherwise).
/// A writer that restarted would count from one again; two at once would
/// interleave their versions.
const WRITER: &str = "trap 'exit 0' TERM; echo writer: ready; i=0; \
    while true; do i=$((i+1)); echo $VERSION $i >> /data/log; sleep 0.1; done";

/// One service writing to its named volume `data`; `update` as given (or
/// absent). No bake window: the predecessor is retired at once.
fn writer_catalog(version: &str, update: Option<&str>) -> String {
    catalog_running(version, update, WRITER)
}

/// [`writer_catalog`] with another shell `command`.
fn catalog_running(version: &str, update: Option<&str>, command: &str) -> String {
    let update = update
        .map(|u| format!("update = \"{u}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[types.{TYPE}]
version = "{version}"
bake_ms = 0

[[types.{TYPE}.services]]
name = "{SERVICE}"
image = "stead-test/busybox:1"
command = ["sh", "-c", "{command}"]
env = {{ VERSION = "{{version}}" }}
volumes = [{{ name = "data", path = "/data" }}]
stop_grace_ms = 5000
{update}
[types.{TYPE}.services.readiness]
kind = "log"
pattern = "writer: ready"
timeout_ms = 30000
"#
    )
}

/// A daemon whose instance runs version 1 of the writer, which has
/// written for a while; the instance's `start` and `die` events recorded
/// from before it was created.
struct Writing {
    h: Harness,
    /// The worker process beside a reconciler-only harness.
    worker: Option<Peer>,
    events: EventLog,
    log: CapturedLog,
    instance: String,
    /// Version 1's container.
    old: String,
    /// `/data/log` as version 1 had written it.
    log_before: String,
    /// The Docker name of the writer's named volume.
    volume: String,
    _cleanup: Cleanup,
}

impl Writing {
    /// On a daemon of its own, with the catalog at version 1.
    async fn start(update: Option<&str>) -> Writing {
        Self::start_on(Setup {
            catalog: writer_catalog("1", update),
            ..Setup::default()
        })
        .await
    }

    /// As [`Writing::start`] on `setup`; a reconciler-only one gets a
    /// worker process beside it.
    async fn start_on(setup: Setup) -> Writing {
        let log = CapturedLog::install();
        let instance = unique("stopfirst");
        let cleanup = Cleanup::new(&instance);
        let works = setup.role.works();
        let h = Harness::start(setup).await;
        let worker = if works {
            None
        } else {
            Some(h.peer(Role::Worker).await)
        };
        let events = EventLog::follow(&instance, &["start", "die"]);
        h.create_typed(&instance, TYPE, None).await;
        let mut writing = Writing {
            h,
            worker,
            events,
            log,
            instance,
            old: String::new(),
            log_before: String::new(),
            volume: String::new(),
            _cleanup: cleanup,
        };
        wait_until("version 1 writes to its volume", CONVERGE, || async {
            let Some(old) = writing.writer_at("1").await else {
                return false;
            };
            read_log(&old).is_some_and(|log| log.lines().count() >= LINES_BEFORE_UPGRADE_MIN)
        })
        .await;
        writing.old = writing.writer_at("1").await.expect("version 1 is ACTIVE");
        writing.log_before = read_log(&writing.old).expect("version 1's log");
        writing.volume = format!("stead.{}.{SERVICE}.data", writing.instance);
        assert_eq!(
            mounted(&writing.old),
            writing.volume,
            "version 1 writes to the named volume"
        );
        writing
    }

    /// The writer's container ACTIVE names, if at `version`.
    async fn writer_at(&self, version: &str) -> Option<String> {
        let store = &self.h.daemon().ports.store;
        let active = store
            .load_active(&InstanceName::new(&self.instance))
            .await
            .ok()?;
        let writer = active.services.get(&ServiceName::new(SERVICE))?;
        writer
            .effective_revision
            .starts_with(&format!("{version}."))
            .then(|| writer.container.as_str().to_owned())
    }

    /// The instance's row says `version` and `ready`.
    async fn is_ready_at(&self, version: &str) -> bool {
        let store = &self.h.daemon().ports.store;
        store
            .instance(&InstanceName::new(&self.instance))
            .await
            .ok()
            .flatten()
            .is_some_and(|row| row.version == version && row.state == InstanceState::Ready)
    }

    /// How many containers of the instance exist, running or not.
    fn containers(&self) -> usize {
        let filter = format!("label=stead.instance={}", self.instance);
        docker(&["ps", "-aq", "--filter", &filter])
            .map(|ids| ids.lines().count())
            .unwrap_or(usize::MAX)
    }
}

/// What one upgrade from version 1 to 2 left to judge.
struct Upgraded {
    /// Every `start` and `die` of the instance's containers, from before
    /// the instance was created, in the engine's order.
    events: Vec<ContainerEvent>,
    /// `/data/log` just before the catalog moved to version 2.
    log_before: String,
    /// `/data/log` once version 2 had written for a while.
    log_after: String,
    old: String,
    new: String,
    instance: String,
    /// The daemons' log, at debug level.
    log: String,
}

/// Creates the instance at version 1, lets it write, upgrades it to
/// version 2 and lets that write; the events are recorded throughout.
async fn upgrade_while_writing(update: Option<&str>) -> Upgraded {
    let mut w = Writing::start(update).await;
    w.h.restart_with_catalog(&writer_catalog("2", update)).await;
    wait_until(
        "version 2 ACTIVE, ready, alone and writing",
        CONVERGE,
        || async {
            let Some(new) = w.writer_at("2").await else {
                return false;
            };
            let written = read_log(&new).is_some_and(|log| {
                log.lines().filter(|l| l.starts_with("2 ")).count() >= LINES_AFTER_UPGRADE_MIN
            });
            w.is_ready_at("2").await && w.containers() == 1 && written
        },
    )
    .await;
    let new = w.writer_at("2").await.expect("version 2 is ACTIVE");
    let log_after = read_log(&new).expect("version 2's log");
    assert_eq!(
        mounted(&new),
        w.volume,
        "version 2 writes to the same volume"
    );
    w.h.shutdown().await;
    Upgraded {
        events: w.events.events(),
        log_before: w.log_before.clone(),
        log_after,
        old: w.old.clone(),
        new,
        log: w.log.text(),
        instance: w.instance.clone(),
    }
}

/// The names of the volumes `container` mounts.
fn mounted(container: &str) -> String {
    inspect(container, "{{range .Mounts}}{{.Name}} {{end}}")
        .expect("inspect the writer")
        .trim()
        .to_owned()
}

/// `/data/log` as `container` sees it, or `None` if it cannot be read (the
/// image links no `cat`).
fn read_log(container: &str) -> Option<String> {
    docker(&["exec", container, "busybox", "cat", "/data/log"])
        .ok()
        .map(|log| log + "\n")
}

/// The most containers running at once, replaying `events` in order from
/// none running; and those running at the end.
fn replay(events: &[ContainerEvent]) -> (usize, BTreeSet<String>) {
    let mut running = BTreeSet::new();
    let mut most = 0;
    for event in events {
        match event.action.as_str() {
            "start" => {
                running.insert(event.container.clone());
            }
            "die" => {
                running.remove(&event.container);
            }
            _ => continue,
        }
        most = most.max(running.len());
    }
    (most, running)
}

/// The events one per line, with times relative to the first, for a
/// failure's message.
fn timeline(events: &[ContainerEvent]) -> String {
    let origin = events.first().map_or(0, |e| e.time_ns);
    events
        .iter()
        .map(|e| {
            let ms = (e.time_ns - origin) as f64 / 1e6;
            let id = &e.container[..12.min(e.container.len())];
            format!("{ms:>10.1} ms {:<6} {id} {}", e.action, e.revision)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The containers each `action` of the writer's was about, in order.
fn containers_with(events: &[ContainerEvent], action: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.action == action)
        .map(|e| e.container.clone())
        .collect()
}

/// Never two writers at once: each started once, the old one died before
/// the new one started, and the new one alone runs at the end.
fn assert_never_two_running(upgraded: &Upgraded) {
    let events = &upgraded.events;
    assert!(
        events.iter().all(|e| e.service == SERVICE),
        "only the writer's containers:\n{}",
        timeline(events)
    );
    let starts = containers_with(events, "start");
    assert_eq!(
        starts,
        [upgraded.old.clone(), upgraded.new.clone()],
        "version 1 started once, then version 2 once:\n{}",
        timeline(events)
    );
    let (most, running) = replay(events);
    assert_eq!(
        most,
        1,
        "at most one writer runs at any instant:\n{}",
        timeline(events)
    );
    assert_eq!(
        running,
        BTreeSet::from([upgraded.new.clone()]),
        "version 2 alone runs at the end:\n{}",
        timeline(events)
    );
    let old_died = events
        .iter()
        .find(|e| e.action == "die" && e.container == upgraded.old)
        .expect("version 1 died");
    let new_started = events
        .iter()
        .find(|e| e.action == "start" && e.container == upgraded.new)
        .expect("version 2 started");
    eprintln!(
        "the writer was down for {:.1} ms between version 1's death and version 2's start",
        (new_started.time_ns - old_died.time_ns) as f64 / 1e6
    );
}

/// The daemons said nothing was wrong with the instance, and that they
/// retired its predecessor, once.
fn assert_logged_quietly(upgraded: &Upgraded) {
    let about: Vec<&str> = upgraded
        .log
        .lines()
        .filter(|l| l.contains(&upgraded.instance))
        .collect();
    let complaints: Vec<&&str> = about
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        complaints.is_empty(),
        "no warning or error about the instance: {complaints:#?}"
    );
    let retired = about
        .iter()
        .filter(|l| l.contains("retired a superseded container"))
        .count();
    assert_eq!(retired, 1, "version 1 is retired once: {about:#?}");
}

/// `<version> <count>` per line.
fn parse_log(log: &str) -> Vec<(String, u64)> {
    log.lines()
        .map(|line| {
            let (version, count) = line.split_once(' ').unwrap_or_else(|| {
                panic!("a line of the log is not `<version> <count>`: {line:?}")
            });
            let count = count
                .parse()
                .unwrap_or_else(|_| panic!("a line's count is not a number: {line:?}"));
            (version.to_owned(), count)
        })
        .collect()
}

/// The log as runs of one writer each: a version and how many lines it
/// wrote, counting 1, 2, 3, … (a new run starts where a count starts at 1
/// again). Panics on a line that neither continues the last run nor
/// starts one: a lost, repeated or interleaved write.
fn writer_runs(log: &str) -> Vec<(String, u64)> {
    let mut runs: Vec<(String, u64)> = Vec::new();
    for (version, count) in parse_log(log) {
        match runs.last_mut() {
            Some((v, n)) if *v == version && count == *n + 1 => *n = count,
            _ if count == 1 => runs.push((version, 1)),
            _ => panic!(
                "`{version} {count}` neither continues the last writer's lines nor starts \
                 a writer's (a lost, repeated or interleaved write):\n{log}"
            ),
        }
    }
    runs
}

/// What version 1 wrote before the upgrade is still there, unchanged, and
/// the whole log is runs of one writer at a time ([`writer_runs`]).
fn kept_runs(before: &str, after: &str) -> Vec<(String, u64)> {
    assert!(
        after.starts_with(before),
        "what version 1 wrote before the upgrade is kept as it was:\nbefore:\n{before}\nafter:\n{after}"
    );
    writer_runs(after)
}

/// The data is intact: version 1's lines, unbroken, then version 2's,
/// each writer started once and never beside the other.
fn assert_log_intact(upgraded: &Upgraded) {
    let runs = kept_runs(&upgraded.log_before, &upgraded.log_after);
    let shape: Vec<(&str, bool)> = runs
        .iter()
        .map(|(version, n)| {
            let enough = match version.as_str() {
                "1" => *n >= LINES_BEFORE_UPGRADE_MIN as u64,
                _ => *n >= LINES_AFTER_UPGRADE_MIN as u64,
            };
            (version.as_str(), enough)
        })
        .collect();
    assert_eq!(
        shape,
        [("1", true), ("2", true)],
        "one run of version 1, then one of version 2 (runs {runs:?}):\n{}",
        upgraded.log_after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_first_upgrade_never_runs_two_writers_and_keeps_the_data() {
    let upgraded = upgrade_while_writing(Some("stop-first")).await;
    assert_never_two_running(&upgraded);
    assert_log_intact(&upgraded);
    assert_logged_quietly(&upgraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_a_named_volume_is_replaced_stop_first_by_default() {
    let upgraded = upgrade_while_writing(None).await;
    assert_never_two_running(&upgraded);
    assert_log_intact(&upgraded);
    assert_logged_quietly(&upgraded);
}

/// The replay's own check: an `overlap` upgrade (asked for, despite the
/// volume) is seen with both writers running at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlap_upgrade_is_seen_running_two_writers_at_once() {
    let upgraded = upgrade_while_writing(Some("overlap")).await;
    let events = &upgraded.events;
    let (most, running) = replay(events);
    assert_eq!(
        most,
        2,
        "the successor starts before its predecessor stops:\n{}",
        timeline(events)
    );
    assert_eq!(running, BTreeSet::from([upgraded.new.clone()]));
}

/// Writes one line and exits: never ready.
const BROKEN: &str = "echo $VERSION 1 >> /data/log; exit 3";

/// A `stop-first` successor that never becomes ready: the upgrade stopped
/// version 1 first, so on the failure it removes the candidate and clears
/// its hold, and the recovery pass starts version 1 again, only once the
/// candidate is gone. Each retry of the task (not ready is not permanent)
/// does the same: whatever the attempts, the data is version 1's runs with
/// one candidate line between each two, and never two writers run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stop_first_upgrade_starts_the_predecessor_again_once_the_candidate_is_gone() {
    let mut w = Writing::start(Some("stop-first")).await;
    w.h.restart_with_catalog(&catalog_running("2", Some("stop-first"), BROKEN))
        .await;
    wait_until(
        "version 1 writing again after a failed attempt, alone",
        CONVERGE,
        || async {
            let again = read_log(&w.old).is_some_and(|log| {
                let runs = writer_runs(&log);
                runs.len() >= 3
                    && runs
                        .last()
                        .is_some_and(|(v, n)| v == "1" && *n >= LINES_AFTER_UPGRADE_MIN as u64)
            });
            again
                && w.writer_at("1").await.as_deref() == Some(w.old.as_str())
                && w.is_ready_at("1").await
                && w.containers() == 1
        },
    )
    .await;
    let log_after = read_log(&w.old).expect("version 1's log");
    w.h.shutdown().await;

    let events = w.events.events();
    let starts = containers_with(&events, "start");
    let alternates = starts.len() >= 3
        && starts.len() % 2 == 1
        && starts
            .iter()
            .enumerate()
            .all(|(i, c)| (i % 2 == 0) == (*c == w.old));
    assert!(
        alternates,
        "version 1, then a candidate and version 1 again per attempt:\n{}",
        timeline(&events)
    );
    let (most, running) = replay(&events);
    assert_eq!(
        most,
        1,
        "at most one writer runs at any instant:\n{}",
        timeline(&events)
    );
    assert_eq!(
        running,
        BTreeSet::from([w.old.clone()]),
        "version 1 alone runs at the end:\n{}",
        timeline(&events)
    );
    let runs = kept_runs(&w.log_before, &log_after);
    let alternates = runs.len() == starts.len()
        && runs.iter().enumerate().all(|(i, (version, n))| {
            if i % 2 == 0 {
                version == "1"
            } else {
                version == "2" && *n == 1
            }
        });
    assert!(
        alternates,
        "version 1's runs, one candidate line between each two (runs {runs:?}):\n{log_after}"
    );
    let text = w.log.text();
    assert!(
        text.lines()
            .any(|l| l.contains(&w.instance) && l.contains("successor of writer not ready")),
        "the failure is logged, naming the service"
    );
}

/// [`WRITER`], ready only after three seconds: its candidate runs a while
/// before the upgrade switches to it.
fn slow_writer() -> String {
    WRITER.replace("echo writer: ready;", "(sleep 3; echo writer: ready) &")
}

/// Killed (-9) while a `stop-first` candidate runs and its predecessor is
/// stopped, the daemon restarts: nothing starts version 1 beside the
/// candidate, the retried upgrade removes the candidate first and creates
/// another. Never two writers; version 1 never writes again. (The same
/// identity restarted takes its task back before any recovery pass (T1);
/// the next test leaves the instance to the pass for a while.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_stop_first_upgrade_it_never_runs_two_writers() {
    let mut w = Writing::start(Some("stop-first")).await;
    let slow = slow_writer();
    w.h.restart_with_catalog(&catalog_running("2", Some("stop-first"), &slow))
        .await;
    let filter = format!("label=stead.instance={}", w.instance);
    let running = || {
        docker(&["ps", "-q", "--no-trunc", "--filter", &filter])
            .map(|ids| ids.lines().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    wait_until(
        "the candidate runs, version 1 stopped",
        CONVERGE,
        || async { running().iter().any(|id| *id != w.old) && !running().contains(&w.old) },
    )
    .await;
    w.h.kill().await;
    let candidate = running();
    // The candidate writes on alone, with no daemon, for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    w.h.restart_with_catalog(&catalog_running("2", Some("stop-first"), &slow))
        .await;
    wait_until(
        "version 2 ACTIVE, ready, alone and writing",
        CONVERGE,
        || async {
            let Some(new) = w.writer_at("2").await else {
                return false;
            };
            let written = read_log(&new).is_some_and(|log| {
                writer_runs(&log)
                    .last()
                    .is_some_and(|(v, n)| v == "2" && *n >= LINES_AFTER_UPGRADE_MIN as u64)
            });
            w.is_ready_at("2").await && w.containers() == 1 && written
        },
    )
    .await;
    let new = w.writer_at("2").await.expect("version 2 is ACTIVE");
    let log_after = read_log(&new).expect("version 2's log");
    w.h.shutdown().await;

    let events = w.events.events();
    let (most, running) = replay(&events);
    assert_eq!(
        most,
        1,
        "at most one writer runs at any instant (the candidate at the kill: {candidate:?}):\n{}",
        timeline(&events)
    );
    assert_eq!(
        running,
        BTreeSet::from([new.clone()]),
        "version 2 alone runs at the end:\n{}",
        timeline(&events)
    );
    let starts = containers_with(&events, "start");
    assert!(
        candidate.len() == 1 && starts == [w.old.clone(), candidate[0].clone(), new.clone()],
        "version 1, the candidate running at the kill ({candidate:?}), then its replacement \
         (version 1 never again):\n{}",
        timeline(&events)
    );
    let runs = kept_runs(&w.log_before, &log_after);
    let versions: Vec<&str> = runs.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(
        versions,
        ["1", "2", "2"],
        "version 1's lines, the candidate's, its replacement's (runs {runs:?}):\n{log_after}"
    );
}

/// Killed (-9), a worker process leaves a `stop-first` candidate running
/// and its predecessor stopped, and no worker takes the task back for a
/// while: the reconciler's recovery pass, once the dead worker's instance
/// lock has expired, must not start the predecessor beside the candidate
/// (its `stop-first` hold keeps it down). A new worker then retries the
/// upgrade: the candidate removed first, another created. Never two
/// writers; version 1 never writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_leaves_the_stop_first_predecessor_down_for_the_reconciler() {
    let url = support::fresh_postgres_database().await;
    stead::store::sql::migrate(&url).await.expect("migrate");
    let mut w = Writing::start_on(Setup {
        catalog: writer_catalog("1", Some("stop-first")),
        database_url: Some(url),
        role: Role::Reconciler,
        ..Setup::default()
    })
    .await;
    let slow = catalog_running("2", Some("stop-first"), &slow_writer());
    w.h.restart_with_catalog(&slow).await;
    // A worker built on the old catalog would skip the upgrade.
    w.worker.take().expect("a worker").shutdown().await;
    let mut worker = w.h.peer(Role::Worker).await;
    let filter = format!("label=stead.instance={}", w.instance);
    let running = || {
        docker(&["ps", "-q", "--no-trunc", "--filter", &filter])
            .map(|ids| ids.lines().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    wait_until(
        "the candidate runs, version 1 stopped",
        CONVERGE,
        || async { running().iter().any(|id| *id != w.old) && !running().contains(&w.old) },
    )
    .await;
    worker.kill().await;
    let candidate = running();
    // The dead worker's instance lock expires after its task lease and
    // a slack; then a few ticks of the recovery pass on the unlocked
    // instance.
    let lock = w.h.daemon().config.control.lease + stead::core::policy::WORKER_LOCK_SLACK;
    tokio::time::sleep(lock + Duration::from_secs(4)).await;
    assert_eq!(
        running(),
        candidate,
        "the recovery pass started nothing beside the candidate"
    );
    w.worker = Some(w.h.peer(Role::Worker).await);
    wait_until(
        "version 2 ACTIVE, ready, alone and writing",
        CONVERGE,
        || async {
            let Some(new) = w.writer_at("2").await else {
                return false;
            };
            let written = read_log(&new).is_some_and(|log| {
                writer_runs(&log)
                    .last()
                    .is_some_and(|(v, n)| v == "2" && *n >= LINES_AFTER_UPGRADE_MIN as u64)
            });
            w.is_ready_at("2").await && w.containers() == 1 && written
        },
    )
    .await;
    let new = w.writer_at("2").await.expect("version 2 is ACTIVE");
    let log_after = read_log(&new).expect("version 2's log");
    w.worker.take().expect("a worker").shutdown().await;
    w.h.shutdown().await;

    let events = w.events.events();
    let (most, running) = replay(&events);
    assert_eq!(
        most,
        1,
        "at most one writer runs at any instant (the candidate at the kill: {candidate:?}):\n{}",
        timeline(&events)
    );
    assert_eq!(
        running,
        BTreeSet::from([new.clone()]),
        "version 2 alone runs at the end:\n{}",
        timeline(&events)
    );
    let starts = containers_with(&events, "start");
    assert!(
        candidate.len() == 1 && starts == [w.old.clone(), candidate[0].clone(), new.clone()],
        "version 1, the candidate running at the kill ({candidate:?}), then its replacement \
         (version 1 never again):\n{}",
        timeline(&events)
    );
    let runs = kept_runs(&w.log_before, &log_after);
    let versions: Vec<&str> = runs.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(
        versions,
        ["1", "2", "2"],
        "version 1's lines, the candidate's, its replacement's (runs {runs:?}):\n{log_after}"
    );
}
