//! `stead plan`'s forecast (#55): the real version-drift planner run over
//! a copy of the fleet whose clock jumps from bake to bake and window to
//! window. Each scenario renders the forecast one line per upgrade, times
//! relative to the start, so expectations read like the command's output.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use jiff::Timestamp;
use stead::core::catalog::Catalog;
use stead::core::fleet::{Instance, InstanceState, RolloutState, Task, TaskKind, TaskState};
use stead::core::grants::Grants;
use stead::core::plan::{forecast, ControlConfig, Forecast, Snapshot};
use stead::core::types::InstanceName;
use stead::ports::Release;

const NOW: &str = "2026-11-30T12:00:00Z"; // a Monday
const HORIZON: Duration = Duration::from_secs(30 * 86_400);

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// A catalog of one type `wiki` at `version`, baking `bake_ms`, its one
/// service `web` replaced as `update` says (a named volume makes it
/// `stop-first`).
fn catalog(version: &str, bake_ms: u64, volume: bool) -> Catalog {
    let volume = if volume {
        "volumes = [{ name = \"data\", path = \"/data\" }]\nstop_grace_ms = 20000\n"
    } else {
        ""
    };
    let text = format!(
        r#"
[types.wiki]
version = "{version}"
bake_ms = {bake_ms}

[[types.wiki.services]]
name = "web"
image = "registry.example/wiki:{{version}}"
ports = [8080]
{volume}
[types.wiki.services.readiness]
kind = "http"
port = 8080
timeout_ms = 2000
interval_ms = 1000
attempts_max = 10
"#
    );
    Catalog::from_toml(&text, "catalog.toml", &Grants::default()).unwrap()
}

fn instances(count: i64, version: &str, spec_digest: &str) -> Vec<Instance> {
    (1..=count)
        .map(|id| Instance {
            domains: Vec::new(),
            spec_digest: Some(spec_digest.to_owned()),
            parameters: Default::default(),
            purge_volumes: false,
            id,
            name: InstanceName::new(format!("i{id}")),
            team: "acme".to_owned(),
            service_type: "wiki".to_owned(),
            version: version.to_owned(),
            state: InstanceState::Ready,
            stopped: false,
            expires_at: None,
            maintenance_window: None,
            created_at: now(),
            updated_at: now(),
        })
        .collect()
}

fn snapshot<'a>(
    instances: Vec<Instance>,
    catalog: &'a Catalog,
    config: &'a ControlConfig,
) -> Snapshot<'a> {
    let releases = instances
        .iter()
        .map(|i| Release {
            name: i.name.to_string(),
            namespace: stead::core::release::DOCKER_RELEASE_NAMESPACE.to_owned(),
        })
        .collect();
    Snapshot {
        now: now(),
        instances,
        unreadable_instances: 0,
        tasks: Vec::new(),
        releases: Some(releases),
        catalog,
        rollouts: BTreeMap::new(),
        config,
        traceparent: None,
        lost_services: BTreeMap::new(),
        pins: Default::default(),
        undos: Default::default(),
        baking: Some(Default::default()),
    }
}

fn config(max_in_flight: u32) -> ControlConfig {
    ControlConfig {
        max_in_flight,
        ..ControlConfig::default()
    }
}

/// One line per round (`+SECONDS: name(wave) …`), then one per stop-first
/// outage and one per instance left, then the flags.
fn render(forecast: &Forecast) -> String {
    let mut out = String::new();
    if !forecast.in_flight.is_empty() {
        let names: Vec<String> = forecast.in_flight.iter().map(|n| n.to_string()).collect();
        writeln!(out, "in flight: {}", names.join(" ")).unwrap();
    }
    for round in &forecast.rounds {
        let offset = round.at.duration_since(forecast.from).as_secs();
        let upgrades: Vec<String> = round
            .upgrades
            .iter()
            .map(|u| format!("{}(w{} {}->{})", u.name, u.wave, u.from, u.to))
            .collect();
        writeln!(out, "+{offset}s: {}", upgrades.join(" ")).unwrap();
        for upgrade in &round.upgrades {
            for outage in &upgrade.outages {
                writeln!(
                    out,
                    "outage: {} {} down at most {}s",
                    upgrade.name,
                    outage.service,
                    outage.at_most.as_secs()
                )
                .unwrap();
            }
        }
    }
    for left in &forecast.left {
        writeln!(out, "left {}: {}", left.name, left.why).unwrap();
    }
    if forecast.horizon_reached {
        writeln!(out, "horizon reached").unwrap();
    }
    out
}

fn check(forecast: &Forecast, expected: &str) {
    let expected: String = expected
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(render(forecast), expected);
}

#[test]
fn a_rollout_is_forecast_in_waves_one_bake_apart() {
    let old = catalog("1.0", 300_000, false);
    let new = catalog("2.0", 300_000, false);
    let config = config(10);
    let fleet = instances(8, "1.0", &old.get("wiki").unwrap().spec_digest);
    let forecast = forecast(&snapshot(fleet, &new, &config), HORIZON);
    check(
        &forecast,
        "+0s: i1(w1 1.0->2.0)
         +300s: i2(w2 1.0->2.0) i3(w2 1.0->2.0)
         +600s: i4(w3 1.0->2.0) i5(w3 1.0->2.0) i6(w3 1.0->2.0) i7(w3 1.0->2.0)
         +900s: i8(w4 1.0->2.0)",
    );
    assert_eq!(
        forecast.rounds[0].upgrades[0].reason,
        "version drift: 1.0 -> 2.0"
    );
}

#[test]
fn the_fleet_limit_caps_each_wave() {
    let old = catalog("1.0", 300_000, false);
    let new = catalog("2.0", 300_000, false);
    let config = config(2);
    let fleet = instances(6, "1.0", &old.get("wiki").unwrap().spec_digest);
    check(
        &forecast(&snapshot(fleet, &new, &config), HORIZON),
        "+0s: i1(w1 1.0->2.0)
         +300s: i2(w2 1.0->2.0) i3(w2 1.0->2.0)
         +600s: i4(w3 1.0->2.0) i5(w3 1.0->2.0)
         +900s: i6(w4 1.0->2.0)",
    );
}

/// Without a bake the waves still widen one after the other, at once.
#[test]
fn without_a_bake_the_waves_follow_each_other_at_once() {
    let old = catalog("1.0", 0, false);
    let new = catalog("2.0", 0, false);
    let config = config(10);
    let fleet = instances(5, "1.0", &old.get("wiki").unwrap().spec_digest);
    check(
        &forecast(&snapshot(fleet, &new, &config), HORIZON),
        "+0s: i1(w1 1.0->2.0)
         +0s: i2(w2 1.0->2.0) i3(w2 1.0->2.0)
         +0s: i4(w3 1.0->2.0) i5(w3 1.0->2.0)",
    );
}

/// A stop-first service's outage: the predecessor's stop grace (20 s) and
/// the readiness probe's longest wait (10 attempts of 2 s, 1 s apart).
#[test]
fn a_stop_first_upgrade_says_how_long_its_service_is_down_at_most() {
    let old = catalog("1.0", 0, true);
    let new = catalog("2.0", 0, true);
    let config = config(1);
    let fleet = instances(1, "1.0", &old.get("wiki").unwrap().spec_digest);
    check(
        &forecast(&snapshot(fleet, &new, &config), HORIZON),
        "+0s: i1(w1 1.0->2.0)
         outage: i1 web down at most 49s",
    );
}

/// A spec change at the same version is an upgrade like another; an
/// instance already on the catalog's spec is left out without a word.
#[test]
fn a_changed_spec_is_forecast_and_a_current_instance_is_not() {
    let old = catalog("1.0", 0, false);
    let new = catalog("1.0", 0, true);
    let config = config(10);
    let mut fleet = instances(2, "1.0", &old.get("wiki").unwrap().spec_digest);
    fleet[1].spec_digest = Some(new.get("wiki").unwrap().spec_digest.clone());
    let forecast = forecast(&snapshot(fleet, &new, &config), HORIZON);
    // The new spec adds a named volume: the upgrade is stop-first.
    check(
        &forecast,
        "+0s: i1(w1 1.0->1.0)
         outage: i1 web down at most 49s",
    );
    assert!(forecast.rounds[0].upgrades[0]
        .reason
        .starts_with("spec drift"));
}

/// Windows: an instance waits for its next opening (the next Sunday 02:00
/// from Monday noon), a security release for none; one whose window does
/// not parse, a stopped one and one that is not ready are left, each with
/// why.
#[test]
fn windows_are_waited_for_and_what_never_moves_is_named() {
    let old = catalog("1.0", 0, false);
    let new = catalog("2.0", 0, false);
    let config = config(10);
    let mut fleet = instances(5, "1.0", &old.get("wiki").unwrap().spec_digest);
    fleet[0].maintenance_window = Some("sun 02:00-03:00".into());
    fleet[1].maintenance_window = Some("someday".into());
    fleet[2].stopped = true;
    fleet[3].state = InstanceState::Failed;
    let forecast = forecast(&snapshot(fleet, &new, &config), HORIZON);
    let rendered = render(&forecast);
    assert!(
        rendered.starts_with(
            "+0s: i5(w1 1.0->2.0)\n\
             +482400s: i1(w2 1.0->2.0)\n"
        ),
        "{rendered}"
    );
    assert!(
        rendered.contains("left i2: its maintenance window does not parse"),
        "{rendered}"
    );
    assert!(
        rendered.contains("left i3: it is stopped: it is upgraded once started\n"),
        "{rendered}"
    );
    assert!(
        rendered.contains("left i4: it is failed, not ready\n"),
        "{rendered}"
    );
    assert!(!forecast.horizon_reached);
}

/// A window that opens after the horizon: the forecast stops there and
/// says so.
#[test]
fn a_window_past_the_horizon_stops_the_forecast_and_says_so() {
    let old = catalog("1.0", 0, false);
    let new = catalog("2.0", 0, false);
    let config = config(10);
    let mut fleet = instances(1, "1.0", &old.get("wiki").unwrap().spec_digest);
    fleet[0].maintenance_window = Some("sun 02:00-03:00".into());
    check(
        &forecast(&snapshot(fleet, &new, &config), Duration::from_secs(86_400)),
        "left i1: its maintenance window opens at 2026-12-06T02:00:00Z, past the forecast's end
         horizon reached",
    );
}

/// A halted type moves nowhere; the forecast says how to resume it.
#[test]
fn a_halted_type_is_left_with_the_command_that_resumes_it() {
    let old = catalog("1.0", 0, false);
    let new = catalog("2.0", 0, false);
    let config = config(10);
    let fleet = instances(1, "1.0", &old.get("wiki").unwrap().spec_digest);
    let mut snap = snapshot(fleet, &new, &config);
    snap.rollouts.insert("wiki".into(), RolloutState::Halted);
    check(
        &forecast(&snap, HORIZON),
        "left i1: the rollout of wiki is halted (`stead rollout resume wiki`)",
    );
}

/// What is in flight at the start holds its slot and its type's wave until
/// its bake ends, and then counts as done: the next wave is two.
#[test]
fn an_upgrade_in_flight_holds_the_first_wave_until_its_bake_ends() {
    let old = catalog("1.0", 300_000, false);
    let new = catalog("2.0", 300_000, false);
    let config = config(10);
    let mut fleet = instances(4, "1.0", &old.get("wiki").unwrap().spec_digest);
    fleet[0].state = InstanceState::Upgrading;
    let mut snap = snapshot(fleet, &new, &config);
    snap.tasks.push(Task {
        id: 1,
        kind: TaskKind::Upgrade,
        instance: 1,
        state: TaskState::Running,
        run_after: now(),
        locked_by: Some("w0".into()),
        locked_at: Some(now()),
        attempts: 1,
        reason: "version drift: 0.9 -> 1.0".into(),
        last_error: None,
        traceparent: None,
        created_at: now(),
        updated_at: now(),
    });
    check(
        &forecast(&snap, HORIZON),
        "in flight: i1
         +300s: i2(w1 1.0->2.0) i3(w1 1.0->2.0)
         +600s: i4(w2 1.0->2.0)",
    );
}
