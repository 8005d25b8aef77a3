//! What of the host a catalog may give a container is the operator's to
//! grant, in `stead.toml`'s `[grants]` (issue #41, item 1): the catalog
//! author can use only what is granted. A catalog asking for more is
//! refused when it is loaded, naming its field and the missing grant; a
//! reload asking for more is refused and the running catalog kept. The
//! same holds for memory above `[limits]`'s `memory_max_mb` (item 5).

use stead::core::catalog::{Catalog, CatalogError};
use stead::core::grants::{Grant, Grants};
use stead::daemon::{Daemon, ReloadMode};

/// A one-service type at `version` with `extra` lines in its service
/// (`extra` starts on line 6).
fn web(version: &str, extra: &str) -> String {
    format!(
        "[types.web]\nversion = \"{version}\"\n[[types.web.services]]\nname = \"web\"\n\
         image = \"x:1\"\n{extra}"
    )
}

fn grants(host_path_prefixes: &[&str], secret_dirs: &[&str], env_passthrough: &[&str]) -> Grants {
    let owned = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    Grants::new(
        &owned(host_path_prefixes),
        &owned(secret_dirs),
        &owned(env_passthrough),
    )
    .unwrap()
}

/// Loads `extra` in a service under `grants` and returns the refusal.
fn refusal(extra: &str, grants: &Grants) -> CatalogError {
    Catalog::from_toml(&web("1", extra), "catalog.toml", grants)
        .expect_err("more than granted must be refused")
}

const DOCKER_SOCKET: &str =
    "volumes = [{ host_path = \"/var/run/docker.sock\", path = \"/var/run/docker.sock\" }]\n";

#[test]
fn a_catalog_bind_mounting_the_docker_socket_without_a_grant_is_refused_naming_the_field_and_the_missing_grant(
) {
    let error = refusal(DOCKER_SOCKET, &Grants::default());
    assert_eq!(
        error.to_string(),
        "catalog.toml: line 6: types.web.services[0].volumes[0].host_path = \
         \"/var/run/docker.sock\": not granted: grants.host_path_prefixes in stead.toml is \
         empty (the operator grants it there)"
    );
    assert!(
        matches!(
            error,
            CatalogError::NotGranted {
                grant: Grant::HostPath,
                ..
            }
        ),
        "{error:?}"
    );
    let error = refusal(DOCKER_SOCKET, &grants(&["/srv/stead"], &[], &[]));
    assert_eq!(
        error.to_string(),
        "catalog.toml: line 6: types.web.services[0].volumes[0].host_path = \
         \"/var/run/docker.sock\": not under any of grants.host_path_prefixes in stead.toml \
         (/srv/stead/)"
    );
}

#[test]
fn a_catalog_that_lists_host_path_prefixes_itself_is_refused_saying_it_moved_to_stead_toml() {
    let text = format!("host_path_prefixes = [\"/\"]\n{}", web("1", DOCKER_SOCKET));
    let error = Catalog::from_toml(&text, "catalog.toml", &Grants::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(
            "catalog.toml: line 1: host_path_prefixes = \"set\": has moved to stead.toml: the \
             operator grants bind-mount directories in [grants] host_path_prefixes"
        ),
        "{error}"
    );
    // Even when the operator grants what it lists: the key itself is refused.
    let granted = grants(&["/var/run"], &[], &[]);
    let text = format!("host_path_prefixes = [\"/var/run\"]\n{}", web("1", ""));
    let error = Catalog::from_toml(&text, "catalog.toml", &granted).unwrap_err();
    assert!(
        error.to_string().contains("has moved to stead.toml"),
        "{error}"
    );
}

#[test]
fn a_secret_file_outside_every_secret_dir_is_refused() {
    let granted = grants(&[], &["/etc/stead/secrets"], &[]);
    for (path, expect) in [
        (
            "/root/.kube/config",
            "types.web.services[0].secrets[0].file = \"/root/.kube/config\": not inside any of \
             grants.secret_dirs in stead.toml (/etc/stead/secrets/)",
        ),
        (
            "/etc/stead/secrets-other/db",
            "types.web.services[0].secrets[0].file = \"/etc/stead/secrets-other/db\": not inside",
        ),
        (
            "/etc/stead/secrets",
            "types.web.services[0].secrets[0].file = \"/etc/stead/secrets\": not inside",
        ),
        (
            "/etc/stead/secrets/../../shadow",
            "types.web.services[0].secrets[0].file = \"/etc/stead/secrets/../../shadow\": must \
             be an absolute path with no '.', '..' or empty component",
        ),
    ] {
        let extra = format!("secrets = [{{ env = \"DB_PASSWORD\", file = \"{path}\" }}]\n");
        let error = refusal(&extra, &granted).to_string();
        assert!(
            error.starts_with("catalog.toml: line 6: ") && error.contains(expect),
            "\nexpected: {expect}\nactual:   {error}"
        );
    }
    let extra = "secrets = [{ env = \"DB_PASSWORD\", file = \"/etc/stead/secrets/db\" }]\n";
    let error = refusal(extra, &Grants::default()).to_string();
    assert!(
        error.contains("not granted: grants.secret_dirs in stead.toml is empty"),
        "{error}"
    );
}

#[test]
fn from_env_of_a_variable_stead_uses_is_refused_even_when_the_config_tries_to_grant_it() {
    // The config cannot grant it: stead.toml is refused naming the entry.
    for name in ["STEAD_DATABASE_URL", "KUBECONFIG"] {
        let doc = format!("[grants]\nenv_passthrough = [\"{name}\"]\n");
        let error = stead::config::daemon::parse(&doc, "stead.toml", &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            format!(
                "stead.toml: line 2: grants.env_passthrough[0] = \"{name}\": is a variable stead \
                 itself uses (STEAD_* and KUBECONFIG are never passed to a container)"
            )
        );
    }
    // And the catalog cannot take it, whatever else is granted.
    let granted = grants(&[], &[], &["NOTES_DB_PASSWORD"]);
    for name in ["STEAD_DATABASE_URL", "STEAD_CONFIG", "KUBECONFIG"] {
        let extra = format!("secrets = [{{ env = \"X\", from_env = \"{name}\" }}]\n");
        let error = refusal(&extra, &granted).to_string();
        assert_eq!(
            error,
            format!(
                "catalog.toml: line 6: types.web.services[0].secrets[0].from_env = \"{name}\": is \
                 a variable stead itself uses (STEAD_* and KUBECONFIG are never passed to a \
                 container)"
            )
        );
    }
}

#[test]
fn a_from_env_name_not_passed_through_is_refused_naming_what_is() {
    let granted = grants(&[], &[], &["NOTES_DB_PASSWORD"]);
    let extra = "secrets = [{ env = \"X\", from_env = \"AWS_SECRET_ACCESS_KEY\" }]\n";
    assert_eq!(
        refusal(extra, &granted).to_string(),
        "catalog.toml: line 6: types.web.services[0].secrets[0].from_env = \
         \"AWS_SECRET_ACCESS_KEY\": not one of grants.env_passthrough in stead.toml \
         (NOTES_DB_PASSWORD)"
    );
}

#[test]
fn a_granted_host_path_secret_file_and_variable_pass() {
    let granted = grants(
        &["/srv/stead"],
        &["/etc/stead/secrets"],
        &["NOTES_DB_PASSWORD"],
    );
    let extra = "volumes = [\n  { host_path = \"/srv/stead\", path = \"/all\" },\n  \
                 { host_path = \"/srv/stead/notes/seed\", path = \"/seed\", read_only = true },\n]\n\
                 secrets = [\n  { env = \"A\", file = \"/etc/stead/secrets/notes/db\" },\n  \
                 { env = \"B\", from_env = \"NOTES_DB_PASSWORD\" },\n]\n";
    let catalog = Catalog::from_toml(&web("1", extra), "catalog.toml", &granted)
        .unwrap_or_else(|e| panic!("{e}"));
    let run = &catalog.get("web").unwrap().services[0].run;
    assert_eq!(run.mounts.len(), 2);
    assert_eq!(run.secrets.len(), 2);
}

/// A daemon on a fresh SQLite file in `dir`, granting `/srv/stead` only.
/// No Docker answers: its socket is a stale one nobody listens on (none is
/// needed to load and reload a catalog).
async fn daemon_granting_srv_stead(dir: &std::path::Path, catalog: &std::path::Path) -> Daemon {
    drop(std::os::unix::net::UnixListener::bind(dir.join("no-docker.sock")).unwrap());
    let doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{dir}/no-docker.sock\"\n\
         [grants]\nhost_path_prefixes = [\"/srv/stead\"]\n",
        dir = dir.display(),
        catalog = catalog.display(),
    );
    let config = stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap();
    Daemon::build(config)
        .await
        .unwrap_or_else(|e| panic!("daemon builds: {e}"))
}

#[tokio::test]
async fn a_reload_of_a_catalog_asking_for_more_than_granted_is_refused_and_the_old_catalog_stays() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    let granted_mount = "volumes = [{ host_path = \"/srv/stead/web\", path = \"/data\" }]\n";
    std::fs::write(&catalog, web("1", granted_mount)).unwrap();
    let daemon = daemon_granting_srv_stead(dir.path(), &catalog).await;
    let version = |daemon: &Daemon| daemon.catalog.current().get("web").unwrap().version.clone();
    assert_eq!(version(&daemon), "1");

    std::fs::write(&catalog, web("2", DOCKER_SOCKET)).unwrap();
    let error = daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .expect_err("a reload asking for the Docker socket must be refused");
    assert!(
        error.to_string().contains(
            "types.web.services[0].volumes[0].host_path = \"/var/run/docker.sock\": not under \
             any of grants.host_path_prefixes in stead.toml (/srv/stead/)"
        ),
        "{error}"
    );
    assert_eq!(version(&daemon), "1", "the running catalog is kept");

    // A catalog within the grants is taken.
    std::fs::write(&catalog, web("2", granted_mount)).unwrap();
    daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(version(&daemon), "2");
}

#[tokio::test]
async fn a_daemon_does_not_start_on_a_catalog_asking_for_more_than_granted() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(&catalog, web("1", DOCKER_SOCKET)).unwrap();
    let doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n",
        dir = dir.path().display(),
        catalog = catalog.display(),
    );
    let config = stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap();
    let Err(error) = Daemon::build(config).await else {
        panic!("a daemon must not start on the Docker socket ungranted");
    };
    assert!(
        error
            .to_string()
            .contains("not granted: grants.host_path_prefixes in stead.toml is empty"),
        "{error}"
    );
}

#[tokio::test]
async fn a_reload_asking_for_more_memory_than_the_operators_maximum_is_refused_and_the_old_catalog_stays(
) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(&catalog, web("1", "memory_mb = 512\n")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("no-docker.sock")).unwrap());
    let doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{dir}/no-docker.sock\"\n\
         [limits]\nmemory_max_mb = 512\n",
        dir = dir.path().display(),
        catalog = catalog.display(),
    );
    let config = stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap();
    let daemon = Daemon::build(config)
        .await
        .unwrap_or_else(|e| panic!("daemon builds: {e}"));
    let version = |daemon: &Daemon| daemon.catalog.current().get("web").unwrap().version.clone();
    assert_eq!(version(&daemon), "1", "memory at the maximum is taken");

    std::fs::write(&catalog, web("2", "memory_mb = 513\n")).unwrap();
    let error = daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .expect_err("a reload above the maximum must be refused");
    assert!(
        error.to_string().contains(
            "line 6: types.web.services[0].memory_mb = 513: more than limits.memory_max_mb = 512 \
             in stead.toml"
        ),
        "{error}"
    );
    assert_eq!(version(&daemon), "1", "the running catalog is kept");
}

/// #40: each type's recorded source (what `rollout undo --to` reads back)
/// parses to the very entry the catalog holds, the Helm type's values and
/// every kind of field included; and read back against grants withdrawn
/// since, a recorded bind mount is refused as any catalog's would be.
#[test]
fn a_recorded_type_reads_back_to_the_same_entry_and_under_todays_grants() {
    let helm = r#"
[types.search]
version = "3.1"
provisioner = "helm"

[types.search.helm]
chart = "charts/search"
namespace = "t-{instance}"
values = { replicas = 2, host = "{instance}.example", nested = { a = [1, 2] } }
"#;
    let text = format!(
        "{}{helm}",
        web(
            "1.4",
            "volumes = [{ host_path = \"/srv/stead/data\", path = \"/data\" }]\n\
             env = { MODE = \"a b\", QUOTE = \"it's \\\"x\\\"\" }\n\
             secrets = [{ env = \"TOKEN\", file = \"/etc/stead/secrets/t\" }]"
        )
    );
    let granted = grants(&["/srv/stead"], &["/etc/stead/secrets"], &[])
        .with_helm(&["charts/search".to_owned()], Some("t-"))
        .unwrap();
    let catalog = Catalog::from_toml(&text, "catalog.toml", &granted).unwrap();
    for entry in catalog.entries() {
        let source = catalog.source_of(&entry.service_type).unwrap();
        let back = catalog
            .recorded_entry(&entry.service_type, &entry.version, source)
            .unwrap();
        assert_eq!(&back, entry, "{source}");
    }
    let web_source = catalog.source_of("web").unwrap();
    let wrong = catalog.recorded_entry("web", "9", web_source).unwrap_err();
    assert!(
        wrong
            .to_string()
            .contains("does not define version 9 of type web"),
        "{wrong}"
    );
    let withdrawn = Catalog::from_toml("", "catalog.toml", &Grants::default()).unwrap();
    let refused = withdrawn
        .recorded_entry("web", "1.4", web_source)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("the recorded version 1.4 of type web")
            && refused.contains("not granted: grants."),
        "{refused}"
    );
    let search_source = catalog.source_of("search").unwrap();
    let refused = withdrawn
        .recorded_entry("search", "3.1", search_source)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(
            "types.search.helm.chart = \"charts/search\": not granted: grants.helm_charts"
        ),
        "{refused}"
    );
}

/// A Helm type named `search` with `helm` lines in its helm table (they
/// start on line 5).
fn helm_type(helm: &str) -> String {
    format!("[types.search]\nversion = \"1\"\nprovisioner = \"helm\"\n[types.search.helm]\n{helm}")
}

fn helm_grants(charts: &[&str], namespace_prefix: &str) -> Grants {
    let charts: Vec<String> = charts.iter().map(|c| (*c).to_owned()).collect();
    Grants::default()
        .with_helm(&charts, Some(namespace_prefix))
        .unwrap()
}

fn helm_refusal(helm: &str, grants: &Grants) -> String {
    Catalog::from_toml(&helm_type(helm), "catalog.toml", grants)
        .expect_err("more than granted must be refused")
        .to_string()
}

/// #54: without `[grants] helm_charts` no Helm type loads at all.
#[test]
fn a_helm_type_without_a_chart_grant_is_refused_naming_the_field_and_the_grant() {
    let helm = "chart = \"oci://evil.example/x\"\nnamespace = \"t-{instance}\"\n";
    let error = Catalog::from_toml(&helm_type(helm), "catalog.toml", &Grants::default())
        .expect_err("no chart is granted by default");
    assert!(
        matches!(
            error,
            CatalogError::NotGranted {
                grant: Grant::HelmChart,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "catalog.toml: line 5: types.search.helm.chart = \"oci://evil.example/x\": not granted: \
         grants.helm_charts in stead.toml is empty (the operator grants it there)"
    );
    let granted = helm_grants(&["oci://registry.example/charts/"], "t-");
    assert_eq!(
        helm_refusal(helm, &granted),
        "catalog.toml: line 5: types.search.helm.chart = \"oci://evil.example/x\": neither one of \
         nor under any of grants.helm_charts in stead.toml (oci://registry.example/charts/)"
    );
}

#[test]
fn a_chart_prefix_grants_the_charts_under_it_and_never_a_neighbour_or_an_escape() {
    let granted = helm_grants(
        &[
            "oci://registry.example/charts/",
            "/srv/charts/",
            "bitnami/postgresql",
        ],
        "t-",
    );
    for chart in [
        "oci://registry.example/charts/search",
        "/srv/charts/search",
        "/srv/charts/search-1.0.0.tgz",
        "bitnami/postgresql",
    ] {
        let helm = format!("chart = \"{chart}\"\nnamespace = \"t-{{instance}}\"\n");
        Catalog::from_toml(&helm_type(&helm), "catalog.toml", &granted)
            .unwrap_or_else(|e| panic!("{chart} is granted: {e}"));
    }
    for (chart, why) in [
        (
            "oci://registry.example/charts-evil/search",
            "neither one of nor under any of",
        ),
        (
            "oci://registry.example/charts",
            "neither one of nor under any of",
        ),
        ("bitnami/postgresql-ha", "neither one of nor under any of"),
        ("/srv/charts-evil/search", "neither one of nor under any of"),
        (
            "/srv/charts/../secrets/x",
            "a local chart must be a clean absolute path",
        ),
        (
            "./charts/search",
            "a local chart must be a clean absolute path",
        ),
        (
            "oci://registry.example/charts/../x",
            "must have no '.', '..' or empty path segment",
        ),
        ("oci://registry.example/charts/%2e%2e/x", "'%'"),
    ] {
        let helm = format!("chart = \"{chart}\"\nnamespace = \"t-{{instance}}\"\n");
        let error = helm_refusal(&helm, &granted);
        assert!(
            error.starts_with(&format!(
                "catalog.toml: line 5: types.search.helm.chart = \"{chart}\": "
            )) && error.contains(why),
            "{chart}: {error}"
        );
    }
}

#[test]
fn a_helm_namespace_must_begin_with_the_granted_prefix_in_every_rendering() {
    let granted = helm_grants(&["c/search"], "t-");
    let error = helm_refusal(
        "chart = \"c/search\"\nnamespace = \"shop-{instance}\"\n",
        &granted,
    );
    assert_eq!(
        error,
        "catalog.toml: line 6: types.search.helm.namespace = \"shop-{instance}\": does not begin, \
         before any placeholder, with the namespace prefix of grants.helm_namespace_prefix in \
         stead.toml (\"t-\")"
    );
    // The default namespace, one per instance, carries no prefix.
    let error = helm_refusal("chart = \"c/search\"\n", &granted);
    assert!(
        error.starts_with(
            "catalog.toml: types.search.helm.namespace = \"{instance}\": does not begin"
        ),
        "{error}"
    );
    // The sample instance's team is "t", so "{team}-x" renders "t-x" for
    // it; another team's would not carry the prefix.
    let error = helm_refusal("chart = \"c/search\"\nnamespace = \"{team}-x\"\n", &granted);
    assert!(error.contains("grants.helm_namespace_prefix"), "{error}");
    // A prefix that is only part of the literal text is still the start.
    let error = helm_refusal(
        "chart = \"c/search\"\nnamespace = \"t{instance}\"\n",
        &granted,
    );
    assert!(error.contains("grants.helm_namespace_prefix"), "{error}");
    for namespace in ["t-{instance}", "t-{team}-{instance}", "t-shared"] {
        let helm = format!("chart = \"c/search\"\nnamespace = \"{namespace}\"\n");
        Catalog::from_toml(&helm_type(&helm), "catalog.toml", &granted)
            .unwrap_or_else(|e| panic!("{namespace} carries the prefix: {e}"));
    }
}
