//! The dashboard and alerting rules stead ships (`deploy/`) name only
//! metrics stead exports, so a renamed or removed metric cannot leave a
//! panel blank or an alert silent. The names come from the table the
//! daemon registers (`stead::daemon::metrics::METRICS`), not from a copy.
//! Every alert also carries `for`, a severity, a summary, a description and
//! a `runbook_url` whose anchor is a heading of `docs/operations.md`.
//!
//! promtool checks the rules' syntax and behaviour (`scripts/test`); this
//! test needs no Prometheus and reads the YAML as lines, since every rule's
//! `expr:` is one line (checked below).

use std::collections::BTreeSet;

use serde_json::Value;
use stead::daemon::metrics::{Kind, METRICS};

const DASHBOARD: &str = include_str!("../deploy/grafana/stead.json");
const ALERTS: &str = include_str!("../deploy/prometheus/alerts.yml");
const OPERATIONS: &str = include_str!("../docs/operations.md");

/// Bound on the PromQL expressions one asset may hold, so a walk over a
/// malformed file stays short.
const EXPRS_MAX: usize = 1_000;

/// PromQL words that are not metric names: binary and set operators,
/// modifiers, aggregations (which may precede `by (...)` rather than `(`)
/// and the literals.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "inf",
    "nan",
];

/// Modifiers whose parenthesised list holds label names, not expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Every series name stead exports. Counters and gauges are exported under
/// their own names (counters carry `_total` in the table already); stead
/// has no histograms or summaries, so no `_bucket`, `_sum` or `_count`
/// series exist. A new `Kind` fails to compile here until it says which
/// series it derives.
fn exported() -> BTreeSet<&'static str> {
    METRICS
        .iter()
        .map(|metric| match metric.kind {
            Kind::Counter | Kind::Gauge => metric.name,
        })
        .collect()
}

/// `expr` without what cannot hold a metric name: quoted strings, label
/// matchers (`{...}`, whose values may hold braces) and ranges (`[...]`),
/// each replaced by a space.
fn bare(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    // What closes each open quote or bracket, innermost last.
    let mut closing: Vec<char> = Vec::new();
    for c in expr.chars() {
        match closing.last() {
            Some(&end) if c == end => {
                closing.pop();
                if closing.is_empty() {
                    out.push(' ');
                }
            }
            Some('"' | '\'' | '`') => {}
            Some(_) if matches!(c, '"' | '\'' | '`') => closing.push(c),
            Some(_) => {}
            None => match c {
                '"' | '\'' | '`' => closing.push(c),
                '{' => closing.push('}'),
                '[' => closing.push(']'),
                _ => out.push(c),
            },
        }
    }
    assert!(closing.is_empty(), "unbalanced quote or bracket in {expr}");
    out
}

/// The metric names `expr` (PromQL) selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let text = bare(expr);
    let word_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.');
    let mut names = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(word_char) {
        let tail = &rest[start..];
        let end = tail.find(|c| !word_char(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        let after = tail[end..].trim_start();
        rest = &tail[end..];
        if LABEL_LISTS.contains(&word) && after.starts_with('(') {
            // `sum by (port, kind)`: the list holds label names.
            let close = after.find(')').expect("a closed label list");
            rest = &after[close + 1..];
        } else if !(word.starts_with(|c: char| c.is_ascii_digit() || c == '.')
            || after.starts_with('(')
            || KEYWORDS.contains(&word))
        {
            names.insert(word.to_owned());
        }
    }
    names
}

/// The names `exprs` select that stead does not export, sorted.
fn unknown_metrics(exprs: &[String]) -> Vec<String> {
    let exported = exported();
    let mut unknown = BTreeSet::new();
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr} names no metric");
        unknown.extend(names.into_iter().filter(|n| !exported.contains(n.as_str())));
    }
    unknown.into_iter().collect()
}

/// Every PromQL expression of a Grafana dashboard: each target's `expr`
/// (rows nest panels, so the walk is recursive), and the metric of each
/// `label_values(METRIC, label)` variable query.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        assert!(out.len() <= EXPRS_MAX, "more than {EXPRS_MAX} expressions");
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr", Value::String(expr)) => out.push(expr.clone()),
                        ("query" | "definition", Value::String(query)) => {
                            if let Some(args) = query
                                .strip_prefix("label_values(")
                                .and_then(|q| q.strip_suffix(')'))
                            {
                                let metric = args.rsplit_once(',').map_or(args, |(m, _)| m);
                                out.push(metric.trim().to_owned());
                            }
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// The value of every `key: value` line of `yaml`, unquoted.
fn yaml_values<'a>(yaml: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}:");
    yaml.lines()
        .map(str::trim_start)
        .map(|l| l.strip_prefix("- ").unwrap_or(l))
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().trim_matches('"').trim_matches('\''))
        .collect()
}

/// The anchors GitHub gives the headings of `markdown` (outside code
/// blocks): lower case, spaces to `-`, other punctuation dropped.
fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let title = heading.trim_start_matches('#').trim();
            let anchor: String = title
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => {
                        Some(c.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect();
            anchors.insert(anchor);
        }
    }
    anchors
}

/// Checks that `expr` selects exactly the metric names `expect`.
fn check(expr: &str, expect: &[&str]) {
    let names = metric_names(expr);
    let expect: BTreeSet<String> = expect.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(names, expect, "{expr}");
}

#[test]
fn promql_metric_names_are_told_from_functions_labels_and_keywords() {
    check(
        "time() - stead_last_tick_timestamp_seconds > 180",
        &["stead_last_tick_timestamp_seconds"],
    );
    check(
        r#"sum by (port, kind) (rate(stead_port_errors_total{job=~"$job"}[$__rate_interval]))"#,
        &["stead_port_errors_total"],
    );
    check(
        "min_over_time(stead_queue_depth[30m]) > 0 unless on() sum(increase(stead_tasks_total[30m])) > 0",
        &["stead_queue_depth", "stead_tasks_total"],
    );
    check(
        r#"sum without (instance) (up{job="a}b"}) * on (job) group_left (version) build_info"#,
        &["up", "build_info"],
    );
    check(
        "rate(stead_starts_total[5m] offset 1h) * 1e3 / 0.5",
        &["stead_starts_total"],
    );
}

#[test]
fn a_dashboard_naming_a_metric_stead_does_not_export_is_refused() {
    let dashboard = serde_json::json!({
        "panels": [{
            "type": "row",
            "panels": [{"targets": [
                {"expr": "sum(rate(stead_recoveries_total[5m]))"},
                {"expr": "stead_queue_depth_total"},
            ]}],
        }, {
            "targets": [{"expr": r#"up{job="stead"} * on (job) stead_reconciler_lease_held"#}],
        }],
        "templating": {"list": [{"query": "label_values(stead_restart_count, job)"}]},
    });
    assert_eq!(
        unknown_metrics(&dashboard_exprs(&dashboard)),
        ["stead_queue_depth_total", "stead_restart_count", "up"]
    );
}

#[test]
fn the_grafana_dashboard_names_only_metrics_stead_exports() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("stead.json is JSON");
    assert_eq!(dashboard["schemaVersion"].as_u64(), Some(39));
    assert_eq!(dashboard["__inputs"][0]["name"], "DS_PROMETHEUS");
    let exprs = dashboard_exprs(&dashboard);
    assert!(exprs.len() > 10, "{exprs:?}");
    assert_eq!(unknown_metrics(&exprs), Vec::<String>::new());
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            panel["datasource"]["uid"], "${DS_PROMETHEUS}",
            "{}",
            panel["title"]
        );
    }
}

#[test]
fn the_alerting_rules_name_only_metrics_stead_exports() {
    let exprs: Vec<String> = yaml_values(ALERTS, "expr")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let n_alerts = yaml_values(ALERTS, "alert").len();
    assert!(n_alerts >= 6, "{n_alerts} alerts");
    assert_eq!(exprs.len(), n_alerts, "one expr per alert");
    for expr in &exprs {
        assert!(
            !expr.is_empty() && !expr.starts_with(['|', '>']),
            "write each expr on one line, so this test reads it: {expr:?}"
        );
    }
    assert_eq!(unknown_metrics(&exprs), Vec::<String>::new());
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_in_the_operations_guide() {
    let n_alerts = yaml_values(ALERTS, "alert").len();
    for key in ["for", "severity", "summary", "description", "runbook_url"] {
        assert_eq!(
            yaml_values(ALERTS, key).len(),
            n_alerts,
            "alerts lack {key}"
        );
    }
    let anchors = heading_anchors(OPERATIONS);
    for url in yaml_values(ALERTS, "runbook_url") {
        let (page, anchor) = url.split_once('#').expect("runbook_url has an anchor");
        assert_eq!(page, "docs/operations.md");
        assert!(
            anchors.contains(anchor),
            "docs/operations.md has no heading for #{anchor}"
        );
    }
}

// --- the package's files -----------------------------------------------

const UNIT: &str = include_str!("../deploy/systemd/stead.service");
const CARGO_TOML: &str = include_str!("../Cargo.toml");

/// The body of the fenced block of `lang` that follows `heading` in
/// `markdown`.
fn block_after(markdown: &str, heading: &str, lang: &str) -> Option<String> {
    let from = markdown.find(heading)?;
    let open = format!("```{lang}\n");
    let start = from + markdown[from..].find(&open)? + open.len();
    let end = start + markdown[start..].find("```\n")?;
    Some(markdown[start..end].to_owned())
}

/// `docs/operations.md` shows the unit the `.deb` installs, as it is: an
/// edit to one without the other fails here.
#[test]
fn the_operations_guide_shows_the_shipped_systemd_unit_verbatim() {
    let shown = block_after(OPERATIONS, "### A systemd unit\n", "ini")
        .expect("an ini block under \"A systemd unit\" in docs/operations.md");
    assert_eq!(
        shown, UNIT,
        "docs/operations.md's unit differs from deploy/systemd/stead.service"
    );
    assert!(block_after(OPERATIONS, "## No such heading\n", "ini").is_none());
}

/// #54: the unit keeps what stead writes private and the daemon within
/// its state directory, without privileges it does not need.
#[test]
fn the_unit_is_hardened() {
    let directives: Vec<&str> = UNIT.lines().map(str::trim).collect();
    for wanted in [
        "UMask=0077",
        "StateDirectoryMode=0700",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
    ] {
        assert!(
            directives.contains(&wanted),
            "deploy/systemd/stead.service lacks {wanted}"
        );
    }
}

/// The unit runs the binary where the package puts it, and the package
/// installs the unit where the docs and `scripts/package --check` look.
#[test]
fn the_unit_runs_the_packaged_binary_and_the_package_installs_the_unit() {
    let execs: Vec<&str> = UNIT
        .lines()
        .filter(|l| l.starts_with("ExecStart"))
        .collect();
    assert_eq!(execs.len(), 2, "{UNIT}");
    assert!(
        execs.iter().all(|l| l.contains("=/usr/bin/stead ")),
        "{execs:?}"
    );
    for asset in [
        r#"["target/release/stead", "usr/bin/", "755"]"#,
        r#"["deploy/systemd/stead.service", "lib/systemd/system/stead.service", "644"]"#,
        r#"["deploy/debian/stead.toml", "etc/stead/stead.toml", "644"]"#,
    ] {
        assert!(
            CARGO_TOML.contains(asset),
            "Cargo.toml's [package.metadata.deb] assets lack {asset}"
        );
    }
    assert!(OPERATIONS.contains("| `/lib/systemd/system/stead.service` |"));
}
