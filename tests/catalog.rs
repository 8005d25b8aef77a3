//! The catalog file: loading, conversion into service specs, and errors
//! that name the file, the field and the value.

use std::time::Duration;

use stead::core::catalog::{Catalog, CatalogError};
use stead::core::fleet::RolloutState;
use stead::core::grants::Grants;
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
    let catalog = Catalog::from_toml(GOOD, "catalog.toml", &helm_grants()).unwrap();
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
    let error = Catalog::from_toml(&text, "catalog.toml", &helm_grants())
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
    check("kind = \"http\"", "kind = \"grpc\"", "catalog.toml: line 11: types.wiki.services[0].readiness.kind = \"grpc\": must be \"http\", \"tcp\", \"log\" or \"none\"");
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
    let error = Catalog::from_toml(text, "c.toml", &helm_grants()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 3: types.empty.services = 0: a service type needs 1 to 32 services"
    );
}

#[test]
fn an_oversized_catalog_is_refused_before_parsing() {
    let text = "#".repeat(stead::core::catalog::CATALOG_LEN_MAX + 1);
    assert!(matches!(
        Catalog::from_toml(&text, "big.toml", &helm_grants()),
        Err(CatalogError::TooLarge { .. })
    ));
}

#[test]
fn an_empty_catalog_is_valid_and_empty() {
    assert!(Catalog::from_toml("", "empty.toml", &helm_grants())
        .unwrap()
        .is_empty());
}

/// A carriage return without its line feed is explained and located, not
/// reported as a blank (found by the `config` fuzz target,
/// `fuzz/regressions/config/lone-carriage-return`, when toml 0.8 gave it no
/// message).
#[test]
fn a_lone_carriage_return_is_explained_and_located() {
    let error = Catalog::from_toml("[types.wiki]\n\r", "c.toml", &helm_grants()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 2, column 2: carriage return must be followed by newline, expected newline"
    );
    let error = Catalog::from_toml("\r", "c.toml", &helm_grants()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "c.toml: line 1, column 2: carriage return must be followed by newline, expected newline"
    );
}

/// The operator's grants for these catalogs (#54): the Helm charts they
/// name and the prefix of their namespaces. Nothing of the host.
fn helm_grants() -> Grants {
    Grants::default()
        .with_helm(
            &[
                "oci://registry.example/charts/".to_owned(),
                "c/s".to_owned(),
            ],
            Some("t-"),
        )
        .unwrap()
}

const HELM: &str = r#"
[types.search]
version = "2.1.0"
provisioner = "helm"

[types.search.helm]
chart = "oci://registry.example/charts/search"
namespace = "t-search-{instance}"

[types.search.helm.values]
replicas = 2
ingress = { host = "{instance}.search.example", team = "{team}" }
"#;

#[test]
fn a_helm_type_names_its_chart_version_namespace_and_values() {
    use stead::core::release::{Provisioning, ReleaseParams, DOCKER_RELEASE_NAMESPACE};
    let catalog = Catalog::from_toml(&format!("{GOOD}{HELM}"), "c.toml", &helm_grants()).unwrap();
    assert!(catalog.get("wiki").unwrap().is_docker());
    let search = catalog.get("search").unwrap();
    assert!(
        search.services.is_empty(),
        "Kubernetes runs a helm type's pods"
    );
    let Provisioning::Helm(chart) = &search.provisioning else {
        panic!("a helm type");
    };
    assert_eq!(
        chart.chart_version, "2.1.0",
        "the catalog version by default"
    );
    let params = ReleaseParams {
        instance: "acme",
        team: "blue",
        service_type: "search",
        version: "2.1.0",
        parameters: &stead::core::release::NO_PARAMETERS,
    };
    let release = chart.release_of(&params, true).unwrap();
    assert_eq!(release.namespace, "t-search-acme");
    assert_eq!(release.values["ingress"]["host"], "acme.search.example");
    assert_eq!(release.values["ingress"]["team"], "blue");
    assert_eq!(release.values["replicas"], 2);
    // A Docker type's release lives where the Docker provisioner lists it.
    let wiki = &catalog.get("wiki").unwrap().provisioning;
    assert_eq!(
        wiki.target_of(&params).unwrap().release.namespace,
        DOCKER_RELEASE_NAMESPACE
    );
    // An explicit chart version, and a namespace per instance.
    let text = "[types.s]\nversion = \"7\"\nprovisioner = \"helm\"\n[types.s.helm]\nchart = \"c/s\"\nchart_version = \"0.7.1\"\nnamespace = \"t-{instance}\"\n";
    let catalog = Catalog::from_toml(text, "c.toml", &helm_grants()).unwrap();
    let Provisioning::Helm(chart) = &catalog.get("s").unwrap().provisioning else {
        panic!("a helm type");
    };
    assert_eq!(chart.chart_version, "0.7.1");
    assert_eq!(chart.namespace_of(&params).unwrap(), "t-acme");
}

#[test]
fn helm_type_errors_name_the_file_the_field_and_the_value() {
    let cases = [
        (
            HELM.replace("provisioner = \"helm\"", "provisioner = \"k8s\""),
            "c.toml: line 4: types.search.provisioner = \"k8s\": must be \"docker\" or \"helm\"",
        ),
        (
            HELM.replace("namespace = \"t-search-{instance}\"", "namespace = \"{tenant}\""),
            "c.toml: line 8: types.search.helm.namespace = \"{tenant}\": unknown placeholder {tenant}",
        ),
        (
            HELM.replace("namespace = \"t-search-{instance}\"", "namespace = \"Search_{instance}\""),
            "c.toml: line 8: types.search.helm.namespace = \"Search_i\"",
        ),
        // #41: never a Kubernetes system namespace, never one that moves
        // with the version.
        (
            HELM.replace("namespace = \"t-search-{instance}\"", "namespace = \"kube-{instance}\""),
            "c.toml: line 8: types.search.helm.namespace = \"kube-i\"",
        ),
        (
            HELM.replace("namespace = \"t-search-{instance}\"", "namespace = \"default\""),
            "c.toml: line 8: types.search.helm.namespace = \"default\"",
        ),
        (
            HELM.replace("namespace = \"t-search-{instance}\"", "namespace = \"s-{version}\""),
            "c.toml: line 8: types.search.helm.namespace = \"s-{version}\": a namespace cannot depend on {version}",
        ),
        (
            HELM.replace("team = \"{team}\"", "team = \"{owner}\""),
            "c.toml: line 12: types.search.helm.values.ingress.team = \"{owner}\": unknown placeholder {owner}",
        ),
        (
            HELM.replace("chart = \"oci", "chart = \"--post-renderer=oci"),
            "c.toml: line 7: types.search.helm.chart = \"--post-renderer=oci://registry.example/charts/search\": must not start with '-'",
        ),
        (
            HELM.replace("provisioner = \"helm\"\n", ""),
            "c.toml: line 5: types.search.helm = \"set\": only a type with provisioner = \"helm\" takes a helm table",
        ),
        (
            format!("{HELM}[[types.search.services]]\nname = \"x\"\nimage = \"x\"\n"),
            "c.toml: line 13: types.search.services = 1: a helm type has no services",
        ),
        (
            "[types.s]\nversion = \"1\"\nprovisioner = \"helm\"\n".to_owned(),
            "c.toml: types.s.helm = \"missing\": a helm type needs a helm table",
        ),
    ];
    for (text, expect) in cases {
        let error = Catalog::from_toml(&text, "c.toml", &helm_grants())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(expect),
            "\nexpected: {expect}\nactual:   {error}"
        );
    }
}

#[test]
fn a_change_of_chart_or_provisioner_is_reported_on_reload() {
    use stead::core::catalog::CatalogChange;
    let before = Catalog::from_toml(HELM, "c.toml", &helm_grants()).unwrap();
    let bumped =
        Catalog::from_toml(&HELM.replace("2.1.0", "2.2.0"), "c.toml", &helm_grants()).unwrap();
    assert!(matches!(
        bumped.changes_from(&before)[..],
        [CatalogChange::Version { .. }]
    ));
    let values = Catalog::from_toml(
        &HELM.replace("replicas = 2", "replicas = 3"),
        "c.toml",
        &helm_grants(),
    )
    .unwrap();
    assert!(matches!(
        values.changes_from(&before)[..],
        [CatalogChange::SpecWithoutVersion { .. }]
    ));
    let docker = Catalog::from_toml(
        "[types.search]\nversion = \"2.1.0\"\n[[types.search.services]]\nname = \"w\"\nimage = \"w\"\n",
        "c.toml", &helm_grants(),
    )
    .unwrap();
    let changes = docker.changes_from(&before);
    assert!(
        matches!(
            changes[..],
            [CatalogChange::Provisioner {
                from: "helm",
                to: "docker",
                ..
            }]
        ),
        "{changes:?}"
    );
    assert!(
        changes[0].to_string().contains("keep their helm release"),
        "{}",
        changes[0]
    );
}

// --- reload hazards ----------------------------------------------------------

/// A catalog of `notes` (Docker: `web` mounting the named volume `data`,
/// `db` mounting `pg`) and `search` (Helm), both at version 1.
const LIVE: &str = r#"
[types.notes]
version = "1"

[[types.notes.services]]
name = "web"
image = "notes:1"
volumes = [{ name = "data", path = "/data" }]

[[types.notes.services]]
name = "db"
image = "postgres:16"
volumes = [{ name = "pg", path = "/var/lib/postgresql/data" }]

[types.search]
version = "1"
provisioner = "helm"

[types.search.helm]
chart = "oci://registry.example/charts/search"
namespace = "t-search-{instance}"
"#;

/// `notes` as a Helm type.
const NOTES_ON_HELM: &str = r#"
[types.notes]
version = "1"
provisioner = "helm"

[types.notes.helm]
chart = "oci://registry.example/charts/notes"
namespace = "t-notes-{instance}"
"#;

/// Reloading `LIVE` edited by `edit` (each pair replaced in turn) while
/// `live` types have instances finds exactly the hazards `expect`.
fn check_hazards(edit: &[(&str, &str)], live: &[&str], expect: &[&str]) {
    use stead::core::catalog::reload_hazards;
    let before = Catalog::from_toml(LIVE, "c.toml", &helm_grants()).unwrap();
    let text = edit.iter().fold(LIVE.to_owned(), |text, (from, to)| {
        assert!(text.contains(from), "the edit {from:?} changes nothing");
        text.replace(from, to)
    });
    let after =
        Catalog::from_toml(&text, "c.toml", &helm_grants()).unwrap_or_else(|e| panic!("{e}"));
    let live = live.iter().map(|t| (*t).to_owned()).collect();
    let hazards: Vec<String> = reload_hazards(&before, &after, &live)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(hazards, expect, "edit {edit:?}, live {live:?}");
}

#[test]
fn renaming_a_service_of_a_type_with_live_instances_is_a_hazard() {
    check_hazards(
        &[("name = \"db\"", "name = \"database\"")],
        &["notes"],
        &[
            "types.notes.services: db -> database while it has live instances (a rename: \
           every instance would start database on empty volumes)",
        ],
    );
}

#[test]
fn renaming_a_named_volume_of_a_type_with_live_instances_is_a_hazard() {
    check_hazards(
        &[("name = \"pg\"", "name = \"pgdata\"")],
        &["notes"],
        &[
            "types.notes.services.db.volumes: named volume pg -> pgdata at \
           /var/lib/postgresql/data while it has live instances (every instance would lose \
           the data in pg)",
        ],
    );
}

#[test]
fn a_named_volume_dropped_from_a_service_with_live_instances_is_a_hazard() {
    check_hazards(
        &[("volumes = [{ name = \"data\", path = \"/data\" }]\n", "")],
        &["notes"],
        &[
            "types.notes.services.web.volumes: named volume data -> none at /data while it \
           has live instances (every instance would lose the data in data)",
        ],
    );
}

#[test]
fn dropping_a_type_with_live_instances_is_a_hazard() {
    let search_at = LIVE.find("[types.search]").unwrap();
    check_hazards(
        &[(&LIVE[search_at..], "")],
        &["notes", "search"],
        &[
            "types.search: removed while it has live instances (they would lose their grant; \
           delete them first)",
        ],
    );
}

#[test]
fn moving_a_type_with_live_instances_between_docker_and_helm_is_a_hazard() {
    let search_at = LIVE.find("[types.search]").unwrap();
    check_hazards(
        &[(&LIVE[..search_at], NOTES_ON_HELM)],
        &["notes"],
        &[
            "types.notes: provisioner docker -> helm while it has live instances (they keep \
           their docker release, which nothing would recover)",
        ],
    );
}

#[test]
fn every_hazard_of_one_reload_is_reported_in_type_order() {
    let search_at = LIVE.find("[types.search]").unwrap();
    check_hazards(
        &[
            (&LIVE[search_at..], ""),
            ("name = \"web\"", "name = \"www\""),
            ("name = \"pg\"", "name = \"pgdata\""),
        ],
        &["notes", "search"],
        &[
            "types.notes.services: web -> www while it has live instances (a rename: every \
             instance would start www on empty volumes)",
            "types.notes.services.db.volumes: named volume pg -> pgdata at \
             /var/lib/postgresql/data while it has live instances (every instance would lose \
             the data in pg)",
            "types.search: removed while it has live instances (they would lose their grant; \
             delete them first)",
        ],
    );
}

#[test]
fn changes_that_keep_live_instances_whole_are_no_hazard() {
    let search_at = LIVE.find("[types.search]").unwrap();
    let db_at = LIVE
        .find("[[types.notes.services]]\nname = \"db\"")
        .unwrap();
    let with_cache = "[[types.notes.services]]\nname = \"cache\"\nimage = \"redis:7\"\n\
                      volumes = [{ name = \"redis\", path = \"/data\" }]\n\n";
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("a new version and image", &[("version = \"1\"", "version = \"2\""), ("notes:1", "notes:2")]),
        // The existing "dropped service" path: retired on upgrade.
        ("a service removed alone", &[(&LIVE[db_at..search_at], "")]),
        ("a service added alone", &[("[types.search]", &format!("{with_cache}[types.search]"))]),
        ("a named volume added", &[(
            "volumes = [{ name = \"data\", path = \"/data\" }]",
            "volumes = [{ name = \"data\", path = \"/data\" }, { name = \"logs\", path = \"/logs\" }]",
        )]),
        ("a named volume moved to another path", &[("path = \"/data\"", "path = \"/srv\"")]),
        ("a new type", &[("[types.search]", "[types.blog]\nversion = \"1\"\n[[types.blog.services]]\nname = \"w\"\nimage = \"w\"\n\n[types.search]")]),
    ];
    for (why, edit) in cases {
        println!("{why}");
        check_hazards(edit, &["notes", "search"], &[]);
    }
}

#[test]
fn a_type_without_live_instances_may_change_in_any_way() {
    let search_at = LIVE.find("[types.search]").unwrap();
    check_hazards(
        &[
            (&LIVE[search_at..], ""),
            ("name = \"db\"", "name = \"database\""),
            ("name = \"data\"", "name = \"files\""),
        ],
        &[],
        &[],
    );
    check_hazards(&[(&LIVE[..search_at], NOTES_ON_HELM)], &["search"], &[]);
}

/// `domains` (#43): templates read into each service, in the order
/// written, and not part of the spec's digest (where a service is
/// published replaces no container).
#[test]
fn a_services_domains_are_read_and_change_no_digest() {
    let with = GOOD.replace(
        "ports = [8080, 9090]\n",
        "ports = [8080, 9090]\ndomains = [\"wiki.example.com\", \"{instance}.wiki.example.com\"]\n",
    );
    let catalog = Catalog::from_toml(&with, "catalog.toml", &helm_grants()).unwrap();
    let web = &catalog.get("wiki").unwrap().services[0];
    let domains: Vec<&str> = web.domains.iter().map(|d| d.as_str()).collect();
    assert_eq!(domains, ["wiki.example.com", "{instance}.wiki.example.com"]);
    assert_eq!(
        web.domains[1].render(&"team-a".into(), &web.name),
        "team-a.wiki.example.com"
    );
    let without = Catalog::from_toml(GOOD, "catalog.toml", &helm_grants()).unwrap();
    assert_eq!(
        catalog.get("wiki").unwrap().spec_digest,
        without.get("wiki").unwrap().spec_digest
    );
}

#[test]
fn a_malformed_or_shared_domain_is_refused_naming_its_field() {
    let at = "ports = [8080, 9090]\n";
    for (domains, expect) in [
        (
            r#"["Wiki.example.com"]"#,
            r#"catalog.toml: line 9: types.wiki.services[0].domains[0] = "Wiki.example.com": must be a DNS name"#,
        ),
        (
            r#"["{instance}-wiki.example.com"]"#,
            r#"catalog.toml: line 9: types.wiki.services[0].domains[0] = "{instance}-wiki.example.com": label "{instance}-wiki": a placeholder"#,
        ),
        (
            r#"["{team}.example.com"]"#,
            r#"catalog.toml: line 9: types.wiki.services[0].domains[0] = "{team}.example.com": label "{team}""#,
        ),
        (
            r#"["a.example.com", "a.example.com"]"#,
            r#"catalog.toml: line 9: types.wiki.services[0].domains[1] = "a.example.com": duplicate domain"#,
        ),
    ] {
        check(at, &format!("{at}domains = {domains}\n"), expect);
    }
    // One literal host on two types: every instance of both would claim it.
    let shared = GOOD
        .replace(at, &format!("{at}domains = [\"shop.example.com\"]\n"))
        .replace(
            "ports = [5432]\n",
            "ports = [5432]\ndomains = [\"shop.example.com\"]\n",
        );
    let error = Catalog::from_toml(&shared, "catalog.toml", &helm_grants())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            r#"types.wiki.services[0].domains[0] = "shop.example.com": types.db.services[0].domains[0] claims the same host name"#
        ),
        "{error}"
    );
}

#[test]
fn at_most_one_service_of_a_type_takes_the_names_given_at_create() {
    let toml = "[types.shop]\nversion = \"1\"\n\
        [[types.shop.services]]\nname = \"web\"\nimage = \"w\"\ntenant_domains = true\n\
        [[types.shop.services]]\nname = \"api\"\nimage = \"a\"\ntenant_domains = true\n";
    let error = Catalog::from_toml(toml, "catalog.toml", &Grants::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            "types.shop.services[1].tenant_domains = true: types.shop.services[0] takes the \
             instance's given domains already"
        ),
        "{error}"
    );
    let one = toml.replacen("tenant_domains = true\n", "", 1);
    let catalog = Catalog::from_toml(&one, "catalog.toml", &Grants::default()).unwrap();
    let services = &catalog.get("shop").unwrap().services;
    assert_eq!(
        services
            .iter()
            .map(|s| s.tenant_domains)
            .collect::<Vec<_>>(),
        [false, true]
    );
}
