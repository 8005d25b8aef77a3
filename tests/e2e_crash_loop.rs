//! End-to-end (#43 item 3): a crash loop an operator can read. A service
//! whose command exits at once, on the real dockerd, under a short budget:
//! every budget decision is one info line naming the service, the failed
//! attempt, the container's exit code and the next attempt, and `stead
//! instance show` (the binary, beside the running daemon) names the exit
//! code and the backoff's end.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{catalog, stead_cli, wait_until, CapturedLog, Harness, Setup};
use support_services::docker::Cleanup;
use support_services::unique;

/// Bound on seeing the budget's decisions: two free attempts, then
/// backoffs of 2 and 3 seconds, each attempt a pass or two.
const DECISIONS_WITHIN: Duration = Duration::from_secs(90);

/// The exit code the service's command ends with.
const EXIT_CODE: i64 = 3;

/// How many budget decisions the test reads: the free attempt's and at
/// least two backoffs.
const DECISIONS_MIN: usize = 3;

/// The log's budget lines of `instance`, in order.
fn budget_lines(log: &CapturedLog, instance: &str) -> Vec<String> {
    let needle = format!("crash loop: {instance}/{}", e2e::SERVICE);
    log.text()
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_budget_decision_of_a_crash_loop_is_one_info_line_with_its_exit_code() {
    let log = CapturedLog::install();
    let name = unique("e2ecrash");
    let _cleanup = Cleanup::new(&name);
    let h = Harness::start(Setup {
        catalog: catalog("1", &format!("exit {EXIT_CODE}"))
            .replace("attempts_max = 100", "attempts_max = 5"),
        extra_config: "[recovery]\nfree_attempts = 2\ndelays_s = [2, 3]\n".to_owned(),
        ..Setup::default()
    })
    .await;
    h.create(&name, None).await;
    wait_until("the budget's decisions", DECISIONS_WITHIN, || async {
        budget_lines(&log, &name)
            .iter()
            .filter(|l| l.contains("backoff until"))
            .count()
            >= DECISIONS_MIN - 1
    })
    .await;
    let lines = budget_lines(&log, &name);
    assert!(lines.len() >= DECISIONS_MIN, "{lines:#?}");
    let mut attempts = Vec::new();
    for line in &lines {
        assert!(line.contains(" INFO "), "at info: {line}");
        assert!(
            line.contains(&format!("exited with code {EXIT_CODE}"))
                && line.contains(&format!("exit_code={EXIT_CODE}")),
            "names the exit code: {line}"
        );
        assert!(
            line.contains("next_attempt=")
                || (line.contains("next attempt now") && !line.contains("backoff")),
            "names the next attempt: {line}"
        );
        let attempt: u32 = line
            .split("attempt=")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("names the attempt: {line}"));
        attempts.push(attempt);
    }
    // One line per decision: each names a later attempt than the last,
    // never the same delay again on a pass that only finds it in force.
    assert!(
        attempts.windows(2).all(|w| w[0] < w[1]),
        "{attempts:?}\n{lines:#?}"
    );
    // The operator's view: the binary, from the database and the runtime
    // alone, names the exit code and when the backoff ends.
    let config = h.cli_config();
    let mut shown = String::new();
    wait_until(
        "instance show names the next attempt",
        DECISIONS_WITHIN,
        || {
            let (code, out) = stead_cli(&config, &["instance", "show", &name]);
            assert_eq!(code, 0, "{out}");
            shown = out;
            let named = shown.contains(&format!("last exit: code {EXIT_CODE}"))
                && shown.contains("backoff until")
                && shown.contains(&format!("exited with code {EXIT_CODE}"));
            async move { named }
        },
    )
    .await;
    assert!(
        shown.contains(&format!("condition: down (exited, code {EXIT_CODE})"))
            || shown.contains("condition: recovering")
            || shown.contains("condition: running"),
        "{shown}"
    );
    let budget = shown
        .lines()
        .find(|l| l.trim_start().starts_with("budget:"))
        .unwrap_or_else(|| panic!("a budget line: {shown}"));
    assert!(
        budget.contains("backoff until") && !budget.contains("window"),
        "a backoff is named as one: {shown}"
    );
    eprintln!("{}\n{shown}", lines.join("\n"));
}
