//! Readiness of kind `log` in the catalog: what it parses into, its
//! defaults, and errors that name the file, the line, the field and the
//! value.

use std::time::Duration;

use stead::core::catalog::{Catalog, LOG_PATTERN_LEN_MAX};
use stead::core::grants::Grants;
use stead::core::spec::ReadinessProbe;

const GOOD: &str = r#"
[types.ledger]
version = "16.1"

[[types.ledger.services]]
name = "db"
image = "registry.example/ledger-db:16.1"
ports = [5432]

[types.ledger.services.readiness]
kind = "log"
pattern = "ready to accept connections"
"#;

fn readiness(text: &str) -> ReadinessProbe {
    let catalog = Catalog::from_toml(text, "catalog.toml", &Grants::default())
        .unwrap_or_else(|e| panic!("{e}"));
    catalog.get("ledger").unwrap().services[0].readiness.clone()
}

/// Data-driven: replacing `from` by `to` in the good catalog gives `expect`.
fn check(from: &str, to: &str, expect: &str) {
    assert!(GOOD.contains(from), "{from:?} not in the catalog");
    let text = GOOD.replace(from, to);
    let error = Catalog::from_toml(&text, "catalog.toml", &Grants::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(expect),
        "\nexpected: {expect}\nactual:   {error}"
    );
}

#[test]
fn a_log_probe_takes_its_pattern_and_waits_a_minute_by_default() {
    assert_eq!(
        readiness(GOOD),
        ReadinessProbe::Log {
            pattern: "ready to accept connections".into(),
            timeout: Duration::from_secs(60),
        }
    );
    let text = GOOD.replace("kind = \"log\"", "kind = \"log\"\ntimeout_ms = 1500");
    assert_eq!(
        readiness(&text),
        ReadinessProbe::Log {
            pattern: "ready to accept connections".into(),
            timeout: Duration::from_millis(1500),
        }
    );
}

#[test]
fn a_pattern_of_exactly_the_longest_length_is_taken() {
    let longest = "x".repeat(LOG_PATTERN_LEN_MAX);
    let text = GOOD.replace("ready to accept connections", &longest);
    assert!(matches!(readiness(&text), ReadinessProbe::Log { pattern, .. } if pattern == longest));
}

#[test]
fn log_probe_errors_name_the_file_the_line_the_field_and_the_value() {
    // A missing field has no line to name.
    check(
        "pattern = \"ready to accept connections\"\n",
        "",
        "catalog.toml: types.ledger.services[0].readiness.pattern = \"missing\": a log probe needs the text its line contains",
    );
    check(
        "\"ready to accept connections\"",
        "\"\"",
        "catalog.toml: line 12: types.ledger.services[0].readiness.pattern = \"\": must be 1 to 256 bytes on one line",
    );
    check(
        "\"ready to accept connections\"",
        &format!("\"{}\"", "x".repeat(LOG_PATTERN_LEN_MAX + 1)),
        "catalog.toml: line 12: types.ledger.services[0].readiness.pattern = \"xxxx",
    );
    check(
        "\"ready to accept connections\"",
        "\"ready\\naccepting\"",
        "catalog.toml: line 12: types.ledger.services[0].readiness.pattern = \"ready\\naccepting\": must be 1 to 256 bytes on one line",
    );
    check(
        "\"ready to accept connections\"",
        "\"ready\\r\"",
        "catalog.toml: line 12: types.ledger.services[0].readiness.pattern = \"ready\\r\": must be 1 to 256 bytes on one line",
    );
    check(
        "kind = \"log\"",
        "kind = \"log\"\ntimeout_ms = 0",
        "catalog.toml: line 12: types.ledger.services[0].readiness.timeout_ms = 0: must be between 1 and 3600000 milliseconds",
    );
}

#[test]
fn a_log_probe_refuses_what_only_a_network_probe_takes() {
    for (field, value) in [
        ("port", "5432"),
        ("path", "\"/\""),
        ("interval_ms", "100"),
        ("attempts_max", "3"),
    ] {
        check(
            "kind = \"log\"",
            &format!("kind = \"log\"\n{field} = {value}"),
            &format!(
                "catalog.toml: line 12: types.ledger.services[0].readiness.{field} = \"set\": \
                 a readiness probe of kind \"log\" takes only pattern and timeout_ms"
            ),
        );
    }
}

#[test]
fn only_a_log_probe_takes_a_pattern() {
    check(
        "kind = \"log\"",
        "kind = \"tcp\"\nport = 5432",
        "catalog.toml: line 13: types.ledger.services[0].readiness.pattern = \"ready to accept connections\": only a readiness probe of kind \"log\" takes a pattern",
    );
    check(
        "kind = \"log\"",
        "kind = \"none\"",
        "catalog.toml: line 12: types.ledger.services[0].readiness.pattern = \"set\": a readiness probe of kind \"none\" takes no other fields",
    );
}
