//! End-to-end (#44 item 2): the flight recorder on the real dockerd and
//! Caddy. A daemon with `[flight_recorder]` on records a crash loop and a
//! steady instance through a Caddy restart (its route republished, T5);
//! `stead replay` (the binary) re-runs each instance's file with the same
//! decisions and every rule kept, and names the pass and step of a
//! recording edited to start a container without withdrawing its traffic
//! first: where the replay parts from it, and the rule it breaks (R8).

mod e2e;
mod support;
mod support_services;

use std::path::PathBuf;
use std::time::Duration;

use e2e::{catalog, stead_cli, wait_until, Harness, Setup, HTTPD};
use support_services::docker::Cleanup;
use support_services::unique;

/// Bound on each stage: a few one-second ticks and the budget's 1 s and
/// 2 s delays.
const STAGE_WITHIN: Duration = Duration::from_secs(30);

/// The whole lines of an instance's recording so far (the writer appends
/// each line in one write; a last line still being written is left out).
fn recorded(h: &Harness, instance: &str) -> Vec<String> {
    let path = h
        .dir
        .path()
        .join("flight")
        .join(format!("{instance}.jsonl"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    whole.lines().map(str::to_owned).collect()
}

/// How many steps of `lines` are the service command `command`.
fn count(lines: &[String], command: &str) -> usize {
    lines
        .iter()
        .map(|l| l.matches(&format!("\"command\":\"{command}\"")).count())
        .sum::<usize>()
        + lines
            .iter()
            .map(|l| l.matches(&format!("\"command\":{{\"{command}\"")).count())
            .sum::<usize>()
}

/// Writes `lines` to a file of the test's directory.
fn copy(h: &Harness, name: &str, lines: &[String]) -> PathBuf {
    let path = h.dir.path().join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("write a copy");
    path
}

fn is(step: &serde_json::Value, command: &str) -> bool {
    step["command"]["Service"]["command"] == command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_crash_loop_and_caddy_restart_replay_with_the_same_decisions() {
    let steady = unique("e2efls");
    let crashy = unique("e2eflc");
    let _cleanup = [Cleanup::new(&steady), Cleanup::new(&crashy)];
    let crashing = catalog("1", "exit 3")
        .replace("types.web", "types.crashy")
        .replace("attempts_max = 100", "attempts_max = 5");
    let mut h = Harness::start(Setup {
        catalog: catalog("1", HTTPD) + &crashing,
        extra_config: "[recovery]\nfree_attempts = 2\ndelays_s = [1, 2]\n\
                       [flight_recorder]\nenabled = true\npasses_per_instance = 1000\n"
            .to_owned(),
        ..Setup::default()
    })
    .await;
    h.create(&steady, None).await;
    h.create_typed(&crashy, "crashy", None).await;
    wait_until("steady served", STAGE_WITHIN, || async {
        h.get(&steady).await == 200
    })
    .await;
    // Two free attempts and the first delayed one: three starts by
    // recovery, each after its withdrawal (R8).
    wait_until("three recorded starts", STAGE_WITHIN, || async {
        count(&recorded(&h, &crashy), "Start") >= 3
    })
    .await;
    let recreated_before = h.daemon().caddy.servers_created();
    h.caddy.restart_without_resume().await;
    wait_until(
        "the route back after Caddy's restart",
        STAGE_WITHIN,
        || async { h.get(&steady).await == 200 },
    )
    .await;
    assert!(
        h.daemon().caddy.servers_created() > recreated_before,
        "Caddy did not lose its routes: the test proved nothing"
    );
    // The republication is in the recording too: a publish after the
    // first one.
    wait_until("the republication recorded", STAGE_WITHIN, || async {
        count(&recorded(&h, &steady), "Publish") >= 2
    })
    .await;
    h.shutdown().await;

    let config = h.cli_config();
    for instance in [&steady, &crashy] {
        let lines = recorded(&h, instance);
        let file = copy(&h, &format!("{instance}.replay.jsonl"), &lines);
        let (code, out) = stead_cli(&config, &["replay", file.to_str().unwrap()]);
        assert_eq!(code, 0, "{instance}: {out}");
        assert!(
            out.contains(&format!("replayed {} pass(es)", lines.len()))
                && out.contains("same decisions")
                && out.contains("every recorded decision kept the rules"),
            "{out}"
        );
        eprintln!("{out}");
    }

    // The crash loop's recording, its first withdrawal before a start
    // deleted: the replayed machine withdraws there all the same.
    let lines = recorded(&h, &crashy);
    let mut values: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (pass, at) = values
        .iter()
        .enumerate()
        .find_map(|(p, v)| {
            let steps = v["steps"].as_array()?;
            let start = steps.iter().position(|s| is(s, "Start"))?;
            let withdraw = steps[..start].iter().rposition(|s| is(s, "Withdraw"))?;
            Some((p, withdraw))
        })
        .expect("a pass that withdraws, then starts");
    let next = values[pass]["steps"][at + 1]["command"]["Service"]["command"].clone();
    values[pass]["steps"].as_array_mut().unwrap().remove(at);
    let edited: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    let file = copy(&h, "edited.jsonl", &edited);
    let (code, out) = stead_cli(&config, &["replay", file.to_str().unwrap()]);
    assert_eq!(code, 1, "a divergence: {out}");
    assert!(
        out.contains(&format!("replayed {pass} pass(es)"))
            && out.contains(&format!(
                "pass {} (instance {crashy}), step {}",
                pass + 1,
                at + 1
            ))
            && out.contains("the replay decided `withdraw the route of service http")
            // The recorded decisions, as edited, are judged too: the
            // step after the deleted withdrawal goes on before failing
            // closed, which breaks R8 there.
            && out.contains(&format!(
                "pass {} (instance {crashy}), step {}: recorded `",
                pass + 1,
                at + 1
            ))
            && out.contains("breaks R8: "),
        "pass {} step {} (recorded next: {next}): {out}",
        pass + 1,
        at + 1
    );
    eprintln!("{out}");

    // Not a recording: named by its line, exit 2.
    let file = copy(
        &h,
        "bad.jsonl",
        &[lines[0].clone(), "{\"format\":1}".to_owned()],
    );
    let (code, out) = stead_cli(&config, &["replay", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("line 2: missing field `policy`"), "{out}");
}
