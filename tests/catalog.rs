//! The catalog file: loading, conversion into service specs, and errors
//! that name the file, the field and the value.

use std::time::Duration;

use stead::core::catalog::{Catalog, CatalogError};
use stead::core::fleet::RolloutState;
use stead::core::spec::ReadinessProbe;

const GOOD: &str = r#"
[types.wiki]
version = "1.4.2"

[[types.wiki.services]]
name = "web"
image = "registry.example/wiki:1.4.2"
ports = [8080, 9090]

[types.wiki.services.readiness]
kind = "http"
port = 8080

[types.db]
version = "16.1"
security = true
rollout = "halted"

[[types.db.services]]
name = "postgres"
image = "postgres:16.1"
ports = [5432]
stop_grace_ms = 60000

[types.db.services.healthcheck]
command = ["pg_isready"]

[types.db.services.readiness]
kind = "tcp"
port = 5432
timeout_ms = 500
"#;

#[test]
fn a_catalog_converts_into_service_specs_with_defaults() {
    let catalog = Catalog::from_toml(GOOD, "catalog.toml").unwrap();
    let names: Vec<&str> = catalog.entries().map(|e| e.service_type.as_str()).collect();
    assert_eq!(names, ["db", "wiki"]);
    let wiki = catalog.get("wiki").unwrap();
    assert_eq!((wiki.security, wiki.rollout), (false, RolloutState::Active));
    let web = &wiki.services[0];
    assert_eq!(web.stop_grace, Duration::from_secs(10));
    assert_eq!(web.healthcheck, None);
    assert_eq!(
        web.readiness,
        ReadinessProbe::Http {
            port: 8080,
            path: "/".into(),
            timeout: Duration::from_secs(2),
            interval: Duration::from_secs(1),
            attempts_max: 30,
        }
    );
    let db = catalog.get("db").unwrap();
    assert_eq!((db.security, db.rollout), (true, RolloutState::Halted));
    let postgres = &db.services[0];
    assert_eq!(postgres.stop_grace, Duration::from_secs(60));
    assert_eq!(postgres.healthcheck.as_ref().unwrap().retries, 3);
    assert!(matches!(
        postgres.readiness,
        ReadinessProbe::Tcp { port: 5432, timeout, .. } if timeout == Duration::from_millis(500)
    ));
}

/// Data-driven: replacing `from` by `to` in the good catalog gives `expect`.
fn check(from: &str, to: &str, expect: &str) {
    assert!(GOOD.contains(from), "{from:?} not in the catalog");
    let text = GOOD.replace(from, to);
    let error = Catalog::from_toml(&text, "catalog.toml")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(expect),
        "\nexpected: {expect}\nactual:   {error}"
    );
}

#[test]
fn catalog_errors_name_the_file_the_line_the_field_and_the_value() {
    check(
        "ports = [8080, 9090]",
        "ports = [8080, 70000]",
        "catalog.toml: line 8: types.wiki.services[0].ports[1] = 70000: must be a port between 1 and 65535",
    );
    check(
        "ports = [8080, 9090]",
        "ports = [8080, 8080]",
        "catalog.toml: line 8: types.wiki.services[0].ports[1] = 8080: duplicate port",
    );
    check("port = 8080", "port = 8081", "catalog.toml: line 12: types.wiki.services[0].readiness.port = 8081: the probe must dial one of the service's ports");
    check("kind = \"http\"", "kind = \"grpc\"", "catalog.toml: line 11: types.wiki.services[0].readiness.kind = \"grpc\": must be \"http\", \"tcp\" or \"none\"");
    check("timeout_ms = 500", "timeout_ms = -1", "catalog.toml: line 31: types.db.services[0].readiness.timeout_ms = -1: must be between 1 and 3600000 milliseconds");
    check(
        "stop_grace_ms = 60000",
        "stop_grace_ms = 99999999",
        "catalog.toml: line 23: types.db.services[0].stop_grace_ms = 99999999",
    );
    check(
        "rollout = \"halted\"",
        "rollout = \"paused\"",
        "catalog.toml: line 17: types.db.rollout = \"paused\": must be \"active\" or \"halted\"",
    );
    check(
        "version = \"1.4.2\"",
        "version = \"\"",
        "catalog.toml: line 3: types.wiki.version = \"\": must be 1 to 64 bytes",
    );
    check(
        "name = \"web\"",
        "name = \"Web Server\"",
        "catalog.toml: line 6: types.wiki.services[0].name = \"Web Server\"",
    );
    check(
        "name = \"web\"",
        "name = \"web-\"",
        "catalog.toml: line 6: types.wiki.services[0].name = \"web-\": must be a DNS label: 1 to 63 of a-z, 0-9 and '-', beginning and ending with a letter or digit",
    );
    check(
        "types.wiki",
        "types.Wiki",
        "catalog.toml: line 2: types.Wiki = \"Wiki\"",
    );
    check(
        "image = \"postgres:16.1\"",
        "image = \"postgres 16\"",
        "catalog.toml: line 21: types.db.services[0].image = \"postgres 16\"",
    );
    check(
        "command = [\"pg_isready\"]",
        "command = []",
        "catalog.toml: line 26: types.db.services[0].healthcheck.command = []: must name a program to run",
    );
    check(
        "kind = \"tcp\"",
        "kind = \"tcp\"\npath = \"/x\"",
        "catalog.toml: line 30: types.db.services[0].readiness.path = \"/x\": a tcp probe has no path",
    );
    check(
        "image = \"registry.example/wiki:1.4.2\"",
        "imgae = \"registry.example/wiki:1.4.2\"",
        "catalog.toml: line 7, column 1: types.wiki.services[0].imgae: unknown field `imgae`",
    );
    check(
        "ports = [8080, 9090]",
        "ports = \"8080\"",
        "catalog.toml: line 8, column 9: types.wiki.services[0].ports: invalid type",
    );
    check("version = \"16.1\"", "", "catalog.toml: ");
}

#[test]
fn a_service_type_needs_services() {
    let text = "[types.empty]\nversion = \"1\"\nservices = []\n";
    let error = Catalog::from_toml(text, "c.toml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 3: types.empty.services = 0: a service type needs 1 to 32 services"
    );
}

#[test]
fn an_oversized_catalog_is_refused_before_parsing() {
    let text = "#".repeat(stead::core::catalog::CATALOG_LEN_MAX + 1);
    assert!(matches!(
        Catalog::from_toml(&text, "big.toml"),
        Err(CatalogError::TooLarge { .. })
    ));
}

#[test]
fn an_empty_catalog_is_valid_and_empty() {
    assert!(Catalog::from_toml("", "empty.toml").unwrap().is_empty());
}

/// A carriage return without its line feed is explained and located, not
/// reported as a blank (found by the `config` fuzz target,
/// `fuzz/regressions/config/lone-carriage-return`, when toml 0.8 gave it no
/// message).
#[test]
fn a_lone_carriage_return_is_explained_and_located() {
    let error = Catalog::from_toml("[types.wiki]\n\r", "c.toml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 2, column 2: carriage return must be followed by newline, expected newline"
    );
    let error = Catalog::from_toml("\r", "c.toml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 1, column 2: carriage return must be followed by newline, expected newline"
    );
}
