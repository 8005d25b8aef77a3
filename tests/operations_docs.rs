//! The runbook of `docs/operations.md` ("Alerts runbook") and its
//! "Reading the event log" cannot drift from what stead ships: every alert
//! of `deploy/prometheus/alerts.yml` has its entry, and every `stead`
//! command they show exists, with every flag shown, as the binary's own
//! `--help` says.

use std::collections::BTreeSet;
use std::process::Command;

const OPERATIONS: &str = include_str!("../docs/operations.md");
const ALERTS: &str = include_str!("../deploy/prometheus/alerts.yml");

/// The text of `doc` from the heading `start` (a whole line) to the next
/// heading of the same or a higher level.
fn section<'a>(doc: &'a str, start: &str) -> &'a str {
    let level = start.chars().take_while(|c| *c == '#').count();
    let at = doc
        .find(&format!("\n{start}\n"))
        .unwrap_or_else(|| panic!("docs/operations.md has no heading {start:?}"))
        + 1;
    let body = &doc[at + start.len()..];
    let mut offset = 0;
    let mut fenced = false;
    for line in body.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        offset += line.len();
    }
    &doc[at..at + start.len() + offset]
}

/// The alert names of a rules file (`- alert: Name` lines).
fn alerts(rules: &str) -> Vec<&str> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect()
}

/// Every `stead ...` command of `text`: inline code spans that start with
/// `stead ` (a span may wrap a line), and `$ stead ...` lines of code
/// blocks; each cut at a pipe, a redirection or a comment.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            if let Some(command) = line.trim().strip_prefix("$ ") {
                out.push(command.to_owned());
            }
        } else {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    // Inline spans: the text between each pair of backticks.
    out.extend(
        prose
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|span| span.split_whitespace().collect::<Vec<_>>().join(" ")),
    );
    out.into_iter()
        .filter(|c| c.starts_with("stead "))
        .map(|c| {
            let end = c.find(['|', '>', '#', ';', '&']).unwrap_or(c.len());
            c[..end].trim().to_owned()
        })
        .collect()
}

/// `stead ARGS --help`: its exit status and output.
fn help(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_stead"))
        .args(args)
        .arg("--help")
        .env_remove("STEAD_CONFIG")
        .output()
        .expect("run the stead binary");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// Why `command` is not a command stead has, if it is not: its words
/// before the first flag must name a command (positional values such as
/// `NAME` are taken by it), and each `--flag` must be one of its options
/// or a global one.
fn refused(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().skip(1).collect();
    let path_len = words
        .iter()
        .position(|w| w.starts_with('-'))
        .unwrap_or(words.len());
    // A placeholder (`NAME`, `TYPE`) stands for a value the command
    // checks before it reads `--help`: a valid one stands in for it.
    let path: Vec<&str> = words[..path_len]
        .iter()
        .map(|w| {
            if w.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                "demo"
            } else {
                w
            }
        })
        .collect();
    let (ok, text) = help(&path);
    if !ok {
        return Some(format!("`{command}`: not a command: {text}"));
    }
    let (_, global) = help(&[]);
    for flag in words[path_len..].iter().filter(|w| w.starts_with("--")) {
        let flag = flag.split('=').next().unwrap_or(flag);
        let named = |help: &str| {
            help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
                .any(|w| w == flag)
        };
        if !named(&text) && !named(&global) {
            return Some(format!("`{command}`: no option {flag}:\n{text}"));
        }
    }
    None
}

#[test]
fn the_runbook_has_an_entry_for_every_alert_that_ships() {
    let runbook = section(OPERATIONS, "## Alerts runbook");
    let names = alerts(ALERTS);
    assert!(names.len() >= 9, "{names:?}");
    let entries: BTreeSet<&str> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .collect();
    for name in &names {
        assert!(
            entries.contains(name),
            "alert {name} has no `### {name}` entry in the runbook"
        );
        assert!(
            ALERTS.contains(&format!("docs/operations.md#{}", name.to_lowercase())),
            "alert {name}'s runbook_url is not its entry"
        );
    }
    // And no entry for an alert that does not ship.
    for entry in &entries {
        assert!(names.contains(entry), "runbook entry {entry} is no alert");
    }
    // Every entry says what to do, with at least one command.
    for name in &names {
        let entry = section(runbook, &format!("### {name}"));
        assert!(
            entry.contains("\n1. ") && entry.contains('`'),
            "{name}: no steps with commands:\n{entry}"
        );
    }
}

#[test]
fn every_stead_command_of_the_runbook_and_the_event_log_guide_exists_with_its_flags() {
    let mut shown = commands(section(OPERATIONS, "## Alerts runbook"));
    let guide = section(OPERATIONS, "### Reading the event log");
    shown.extend(commands(guide));
    for needed in ["stead events", "stead timeline", "stead instance why"] {
        assert!(
            shown.iter().any(|c| c.starts_with(needed)),
            "{needed} is not shown: {shown:#?}"
        );
    }
    assert!(shown.len() >= 20, "{shown:#?}");
    let refusals: Vec<String> = shown.iter().filter_map(|c| refused(c)).collect();
    assert!(refusals.is_empty(), "{}", refusals.join("\n\n"));
}

#[test]
fn a_command_stead_does_not_have_or_a_flag_it_does_not_take_is_refused() {
    assert!(refused("stead events --instance demo --since 1h --json").is_none());
    assert!(refused("stead instance why NAME --live").is_none());
    assert!(refused("stead --config FILE status").is_none());
    assert!(refused("stead rollout explode TYPE").is_some_and(|r| r.contains("not a command")));
    assert!(refused("stead instance explain NAME").is_some_and(|r| r.contains("not a command")));
    assert!(refused("stead events --colour").is_some_and(|r| r.contains("no option --colour")));
    assert_eq!(
        commands(
            "run `stead events\n--kind halt` then\n```text\n$ stead timeline demo   # why\n```\n"
        ),
        ["stead timeline demo", "stead events --kind halt"]
    );
}
