//! What a real application's services declare in the catalog (environment,
//! secrets, volumes, limits, user, entrypoint, labels, networks), and the
//! errors bad declarations get: each names the file, the field and the
//! value, and never quotes a secret (there is none in the file to quote).

use std::collections::BTreeMap;

use stead::core::catalog::Catalog;
use stead::core::grants::Grants;
use stead::core::limits::{ContainerLimits, RawLimits};
use stead::core::release::ReleaseParams;
use stead::core::spec::{Mount, MountSource, RunSpec, SecretEnv, SecretSource};
use stead::core::types::ServiceName;

const APP: &str = r#"
[types.notes]
version = "1"

[[types.notes.services]]
name = "db"
image = "example/db:1"
entrypoint = ["/bin/sh", "-c"]
command = ["exec db --data /data"]
user = "999:999"
memory_mb = 256
cpus = 0.5
env = { DB_NAME = "notes_{instance}" }
secrets = [
  { env = "DB_PASSWORD", file = "/etc/stead/secrets/notes-db" },
  { env = "DB_ADMIN_TOKEN", from_env = "NOTES_ADMIN_TOKEN" },
]
volumes = [
  { name = "data", path = "/data" },
  { host_path = "/srv/stead/notes/seed", path = "/seed", read_only = true },
]
labels = { "com.example.tier" = "storage" }
networks = ["backups"]

[[types.notes.services]]
name = "web"
image = "example/web:1"
ports = [8080]
"#;

/// What the operator's `stead.toml` grants [`APP`]: its bind mount's
/// directory, its secret file's directory, its daemon variable and its
/// extra network.
fn app_grants() -> Grants {
    Grants::new(
        &["/srv/stead".to_owned()],
        &["/etc/stead/secrets".to_owned()],
        &["NOTES_ADMIN_TOKEN".to_owned()],
    )
    .unwrap()
    .with_networks(&["backups".to_owned(), "shared-cache".to_owned()])
    .unwrap()
}

#[test]
fn a_real_applications_services_convert_into_run_specs() {
    let catalog = Catalog::from_toml(APP, "catalog.toml", &app_grants()).unwrap();
    let notes = catalog.get("notes").unwrap();
    let db = &notes.services[0];
    assert_eq!(
        *db.run,
        RunSpec {
            env: BTreeMap::from([("DB_NAME".into(), "notes_{instance}".into())]),
            secrets: vec![
                SecretEnv {
                    env: "DB_PASSWORD".into(),
                    source: SecretSource::File("/etc/stead/secrets/notes-db".into()),
                },
                SecretEnv {
                    env: "DB_ADMIN_TOKEN".into(),
                    source: SecretSource::DaemonEnv("NOTES_ADMIN_TOKEN".into()),
                },
            ],
            mounts: vec![
                Mount {
                    source: MountSource::Volume("data".into()),
                    target: "/data".into(),
                    read_only: false,
                },
                Mount {
                    source: MountSource::HostPath("/srv/stead/notes/seed".into()),
                    target: "/seed".into(),
                    read_only: true,
                },
            ],
            memory_bytes: Some(256 * 1024 * 1024),
            nano_cpus: Some(500_000_000),
            user: Some("999:999".into()),
            entrypoint: vec!["/bin/sh".into(), "-c".into()],
            labels: BTreeMap::from([("com.example.tier".into(), "storage".into())]),
            networks: vec!["backups".into()],
            cap_add: Vec::new(),
            instance_network: true,
        }
    );
    assert_eq!(db.run.volumes().collect::<Vec<_>>(), ["data"]);
    assert!(
        notes.services[1].run.instance_network,
        "every service of a multi-service type joins the instance network"
    );
    let params = ReleaseParams {
        instance: "acme",
        team: "t",
        service_type: "notes",
        version: "1",
        parameters: &stead::core::release::NO_PARAMETERS,
    };
    assert_eq!(
        db.run.render_env(&ServiceName::new("db"), &params).unwrap(),
        vec![("DB_NAME".to_owned(), "notes_acme".to_owned())]
    );
}

#[test]
fn a_lone_service_does_not_join_an_instance_network() {
    let one =
        "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"web\"\nimage = \"x:1\"\n";
    let catalog = Catalog::from_toml(one, "catalog.toml", &Grants::default()).unwrap();
    assert!(!catalog.get("web").unwrap().services[0].run.instance_network);
}

fn check(from: &str, to: &str, expect: &str) {
    assert!(APP.contains(from), "{from:?} not in the catalog");
    let text = APP.replacen(from, to, 1);
    let error = Catalog::from_toml(&text, "catalog.toml", &app_grants())
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("catalog.toml: ") && error.contains(expect),
        "\nexpected: {expect}\nactual:   {error}"
    );
}

#[test]
fn bad_declarations_name_the_field_and_the_value() {
    check(
        "DB_NAME = ",
        "DB-NAME = ",
        "types.notes.services[0].env.DB-NAME = \"DB-NAME\": an environment variable's name",
    );
    check(
        "\"notes_{instance}\"",
        "\"notes_{tenant}\"",
        "types.notes.services[0].env.DB_NAME = \"notes_{tenant}\": unknown placeholder {tenant}",
    );
    check(
        "file = \"/etc/stead/secrets/notes-db\"",
        "file = \"/etc/stead/secrets/notes-db\", from_env = \"X\"",
        "types.notes.services[0].secrets[0] = \"DB_PASSWORD\": a secret takes exactly one of `file` or `from_env`",
    );
    check(
        "file = \"/etc/stead/secrets/notes-db\"",
        "file = \"secrets/notes-db\"",
        "types.notes.services[0].secrets[0].file = \"secrets/notes-db\": must be an absolute path",
    );
    check(
        "env = \"DB_ADMIN_TOKEN\"",
        "env = \"DB_NAME\"",
        "types.notes.services[0].secrets[1].env = \"DB_NAME\": this variable is already set",
    );
    check(
        "host_path = \"/srv/stead/notes/seed\"",
        "host_path = \"/etc/shadow\"",
        "types.notes.services[0].volumes[1].host_path = \"/etc/shadow\": not under any of grants.host_path_prefixes in stead.toml (/srv/stead/)",
    );
    check(
        "host_path = \"/srv/stead/notes/seed\"",
        "host_path = \"/srv/stead/../../etc\"",
        "types.notes.services[0].volumes[1].host_path = \"/srv/stead/../../etc\"",
    );
    check(
        "host_path = \"/srv/stead/notes/seed\"",
        "host_path = \"/srv/steady\"",
        "types.notes.services[0].volumes[1].host_path = \"/srv/steady\"",
    );
    check(
        "{ name = \"data\", path = \"/data\" }",
        "{ name = \"data\", path = \"data\" }",
        "types.notes.services[0].volumes[0].path = \"data\": must be an absolute path",
    );
    check(
        "path = \"/seed\"",
        "path = \"/data\"",
        "types.notes.services[0].volumes[1].path = \"/data\": duplicate mount path",
    );
    check(
        "{ name = \"data\", path = \"/data\" }",
        "{ name = \"Data\", path = \"/data\" }",
        "types.notes.services[0].volumes[0].name = \"Data\": must be a DNS label",
    );
    check(
        "{ name = \"data\", path = \"/data\" }",
        "{ path = \"/data\" }",
        "types.notes.services[0].volumes[0] = \"/data\": a volume takes exactly one of `name`",
    );
    check(
        "memory_mb = 256",
        "memory_mb = 2",
        "types.notes.services[0].memory_mb = 2: must be between 6 and 1048576",
    );
    check(
        "cpus = 0.5",
        "cpus = -1",
        "types.notes.services[0].cpus = -1.0: must be between 0.01 and 1024",
    );
    check(
        "cpus = 0.5",
        "cpus = nan",
        "types.notes.services[0].cpus = NaN: must be between 0.01 and 1024",
    );
    check(
        "user = \"999:999\"",
        "user = \"root; rm -rf /\"",
        "types.notes.services[0].user = \"root; rm -rf /\": must be a user or user:group",
    );
    check(
        "\"com.example.tier\" = ",
        "\"stead.managed\" = ",
        "types.notes.services[0].labels.stead.managed = \"stead.managed\": labels starting with \"stead.\" are stead's own",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"host\"]",
        "types.notes.services[0].networks[0] = \"host\": must be an existing network's name (letters, digits, '_', '.', '-'; at most 63 bytes), not host, none, bridge or default, and not one of stead's own",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"stead_isolated\"]",
        "types.notes.services[0].networks[0] = \"stead_isolated\": must be an existing network's name",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"elsewhere\"]",
        "types.notes.services[0].networks[0] = \"elsewhere\": not one of grants.networks in stead.toml (backups, shared-cache)",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"backups\"]\ncap_add = [\"NET_ADMIN\"]",
        "types.notes.services[0].cap_add[0] = \"NET_ADMIN\": not granted: grants.capabilities in stead.toml is empty",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"backups\"]\ncap_add = [\"CAP_NET_RAW\"]",
        "types.notes.services[0].cap_add[0] = \"CAP_NET_RAW\": must be a capability's name",
    );
    check(
        "networks = [\"backups\"]",
        "networks = [\"stead.other\"]",
        "types.notes.services[0].networks[0] = \"stead.other\"",
    );
    check(
        "entrypoint = [\"/bin/sh\", \"-c\"]",
        "entrypoint = \"/bin/sh\"",
        "types.notes.services[0].entrypoint: invalid type",
    );
}

#[test]
fn memory_above_the_operators_maximum_is_refused_naming_the_field_and_the_bound() {
    let limits = ContainerLimits::new(&RawLimits {
        memory_max_mb: Some(128),
        memory_default_mb: Some(64),
        ..Default::default()
    })
    .unwrap();
    let grants = app_grants().with_limits(limits);
    let error = Catalog::from_toml(APP, "catalog.toml", &grants)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            "types.notes.services[0].memory_mb = 256: more than limits.memory_max_mb = 128 in \
             stead.toml"
        ),
        "{error}"
    );
    let at_the_max = APP.replace("memory_mb = 256", "memory_mb = 128");
    let catalog = Catalog::from_toml(&at_the_max, "catalog.toml", &grants).unwrap();
    assert_eq!(
        catalog.get("notes").unwrap().services[0].run.memory_bytes,
        Some(128 * 1024 * 1024)
    );
}

const PARAMETERS: &str = r#"
[types.shop]
version = "1"

[types.shop.parameters.domain]
description = "where the shop answers"

[types.shop.parameters.plan]
default = "small"

[[types.shop.services]]
name = "web"
image = "example/shop:1"
env = { DOMAIN = "{param.domain}", PLAN = "{param.plan}" }
"#;

#[test]
fn parameters_are_declared_checked_and_filled_with_defaults() {
    use std::collections::BTreeMap;
    let catalog = Catalog::from_toml(PARAMETERS, "catalog.toml", &Grants::default()).unwrap();
    let shop = catalog.get("shop").unwrap();
    let given = BTreeMap::from([("domain".to_owned(), "shop.example".to_owned())]);
    shop.check_parameters(&given).unwrap();
    let filled = shop.parameters_of(&given);
    assert_eq!(
        filled,
        BTreeMap::from([
            ("domain".to_owned(), "shop.example".to_owned()),
            ("plan".to_owned(), "small".to_owned()),
        ])
    );
    let params = ReleaseParams {
        instance: "s1",
        team: "t",
        service_type: "shop",
        version: "1",
        parameters: &filled,
    };
    assert_eq!(
        shop.services[0]
            .run
            .render_env(&ServiceName::new("web"), &params)
            .unwrap(),
        vec![
            ("DOMAIN".to_owned(), "shop.example".to_owned()),
            ("PLAN".to_owned(), "small".to_owned()),
        ]
    );
    let missing = shop.check_parameters(&BTreeMap::new()).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "parameter domain: required by service type shop (give it with --set domain=VALUE)"
    );
    let unknown = shop
        .check_parameters(&BTreeMap::from([
            ("domain".to_owned(), "x".to_owned()),
            ("size".to_owned(), "9".to_owned()),
        ]))
        .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains("declares no such parameter (declared: domain, plan)"),
        "{unknown}"
    );
}

#[test]
fn a_template_may_use_only_declared_parameters() {
    let text = PARAMETERS.replace("{param.plan}", "{param.tier}");
    let error = Catalog::from_toml(&text, "catalog.toml", &Grants::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("types.shop.services[0].env.PLAN = \"{param.tier}\": unknown placeholder {param.tier}; known: {instance}, {team}, {service_type}, {version}, {param.domain}, {param.plan}"),
        "{error}"
    );
    let text = PARAMETERS.replace(
        "[types.shop.parameters.plan]",
        "[types.shop.parameters.Plan]",
    );
    let error = Catalog::from_toml(&text, "catalog.toml", &Grants::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("types.shop.parameters.Plan = \"Plan\": a parameter's name is a-z"),
        "{error}"
    );
}

#[test]
fn a_helm_namespace_cannot_use_parameters_but_its_values_can() {
    let helm = |namespace: &str| {
        format!(
            "[types.search]\nversion = \"1\"\nprovisioner = \"helm\"\n\
             [types.search.parameters.size]\ndefault = \"2\"\n\
             [types.search.helm]\nchart = \"c/search\"\nnamespace = \"{namespace}\"\n\
             values = {{ replicas = \"{{param.size}}\" }}\n"
        )
    };
    let grants = Grants::default()
        .with_helm(&["c/search".to_owned()], Some("ns-"))
        .unwrap();
    Catalog::from_toml(&helm("ns-{instance}"), "catalog.toml", &grants).unwrap();
    let error = Catalog::from_toml(&helm("ns-{param.size}"), "catalog.toml", &grants)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            "types.search.helm.namespace = \"ns-{param.size}\": a namespace cannot use parameters"
        ),
        "{error}"
    );
}
