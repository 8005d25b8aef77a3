//! #40's bar for `stop-first`: a service with a named volume is upgraded
//! while its own loop appends to a file on the volume. At no instant do two
//! containers of it run (replayed from the engine's own `start` and `die`
//! events, streamed from before the instance existed), and the file is
//! intact afterwards: the old version's lines, unbroken, then the new
//! one's, never interleaved. A service with a volume and no `update` is
//! replaced the same way; one that asks for `overlap` is seen running two
//! containers at once by the very same replay, so the replay can see an
//! overlap when there is one.
//!
//! Also checked: both versions mount the instance's named volume, the
//! daemons log no warning or error about the instance, and they retire
//! the predecessor once.

mod e2e;
mod support_services;

use std::collections::BTreeSet;
use std::time::Duration;

use e2e::{inspect, wait_until, CapturedLog, Harness, Setup};
use stead::core::fleet::InstanceState;
use stead::core::types::{InstanceName, ServiceName};
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
command = ["sh", "-c", "{WRITER}"]
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
    let log = CapturedLog::install();
    let instance = unique("stopfirst");
    let _cleanup = Cleanup::new(&instance);
    let mut h = Harness::start(Setup {
        catalog: writer_catalog("1", update),
        ..Setup::default()
    })
    .await;
    let events = EventLog::follow(&instance, &["start", "die"]);
    h.create_typed(&instance, TYPE, None).await;
    let name = InstanceName::new(&instance);
    let store = h.daemon().ports.store.clone();
    let writer_at = |version: &'static str| {
        let store = store.clone();
        let name = name.clone();
        async move {
            let active = store.load_active(&name).await.ok()?;
            let writer = active.services.get(&ServiceName::new(SERVICE))?;
            writer
                .effective_revision
                .starts_with(&format!("{version}."))
                .then(|| writer.container.as_str().to_owned())
        }
    };
    wait_until("version 1 writes to its volume", CONVERGE, || async {
        let Some(old) = writer_at("1").await else {
            return false;
        };
        read_log(&old).is_some_and(|log| log.lines().count() >= LINES_BEFORE_UPGRADE_MIN)
    })
    .await;
    let old = writer_at("1").await.expect("version 1 is ACTIVE");
    let log_before = read_log(&old).expect("version 1's log");
    let volume = format!("stead.{instance}.{SERVICE}.data");
    assert_eq!(
        mounted(&old),
        volume,
        "version 1 writes to the named volume"
    );

    h.restart_with_catalog(&writer_catalog("2", update)).await;
    let filter = format!("label=stead.instance={instance}");
    wait_until(
        "version 2 ACTIVE, ready, alone and writing",
        CONVERGE,
        || async {
            let Some(new) = writer_at("2").await else {
                return false;
            };
            let ready = store
                .instance(&name)
                .await
                .ok()
                .flatten()
                .is_some_and(|row| row.version == "2" && row.state == InstanceState::Ready);
            let alone = docker(&["ps", "-aq", "--filter", &filter])
                .is_ok_and(|ids| ids.lines().count() == 1);
            let written = read_log(&new).is_some_and(|log| {
                log.lines().filter(|l| l.starts_with("2 ")).count() >= LINES_AFTER_UPGRADE_MIN
            });
            ready && alone && written
        },
    )
    .await;
    let new = writer_at("2").await.expect("version 2 is ACTIVE");
    let log_after = read_log(&new).expect("version 2's log");
    assert_eq!(mounted(&new), volume, "version 2 writes to the same volume");
    h.shutdown().await;
    Upgraded {
        events: events.events(),
        log_before,
        log_after,
        old,
        new,
        log: log.text(),
        instance,
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

/// The data is intact: what version 1 wrote is still there, unchanged, and
/// each version's lines count 1, 2, 3, … without a gap or a repeat (one
/// writer, started once), version 1's all before version 2's.
fn assert_log_intact(upgraded: &Upgraded) {
    let (before, after) = (&upgraded.log_before, &upgraded.log_after);
    assert!(
        after.starts_with(before.as_str()),
        "what version 1 wrote before the upgrade is kept as it was:\nbefore:\n{before}\nafter:\n{after}"
    );
    let lines = parse_log(after);
    let old_n = lines.iter().take_while(|(v, _)| v == "1").count();
    let (old, new) = lines.split_at(old_n);
    assert!(
        old.len() >= LINES_BEFORE_UPGRADE_MIN,
        "version 1's lines come first: {after}"
    );
    assert!(
        new.len() >= LINES_AFTER_UPGRADE_MIN && new.iter().all(|(v, _)| v == "2"),
        "then version 2's only, never version 1's again: {after}"
    );
    for part in [old, new] {
        let counts: Vec<u64> = part.iter().map(|(_, n)| *n).collect();
        let expected: Vec<u64> = (1..=part.len() as u64).collect();
        assert_eq!(
            counts, expected,
            "one writer per version, started once: {after}"
        );
    }
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
