//! A catalog reload must not silently damage live instances (issue #41,
//! item 7): a reload that drops a type with live instances, moves one
//! between Docker and Helm, or renames a service or a named volume of one
//! is refused and the running catalog kept, unless the operator forces it
//! (`stead reload --force`). Driven through `Daemon::reload_catalog`, the
//! path SIGHUP and `POST /reload` take, on a SQLite store.

use std::path::Path;

use stead::core::fleet::InstanceState;
use stead::core::types::InstanceName;
use stead::daemon::{Daemon, ReloadError, ReloadMode};
use stead::ports::NewInstance;

/// `web` (one service mounting the named volume `volume` at `/data`) and
/// `blog`, both at `version`.
fn catalog(version: &str, volume: &str) -> String {
    format!(
        "[types.web]\nversion = \"{version}\"\n[[types.web.services]]\nname = \"web\"\n\
         image = \"x:1\"\nvolumes = [{{ name = \"{volume}\", path = \"/data\" }}]\n\
         [types.blog]\nversion = \"{version}\"\n[[types.blog.services]]\nname = \"blog\"\n\
         image = \"y:1\"\n"
    )
}

/// A daemon on a fresh SQLite file in `dir`. No Docker answers: its socket
/// is a stale one nobody listens on (none is needed to reload a catalog).
async fn daemon(dir: &Path, catalog: &Path) -> Daemon {
    daemon_with(dir, catalog, "").await
}

/// [`daemon`], its config ending with `more`.
async fn daemon_with(dir: &Path, catalog: &Path, more: &str) -> Daemon {
    drop(std::os::unix::net::UnixListener::bind(dir.join("no-docker.sock")).unwrap());
    let doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{dir}/no-docker.sock\"\n{more}",
        dir = dir.display(),
        catalog = catalog.display(),
    );
    let config = stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap();
    Daemon::build(config)
        .await
        .unwrap_or_else(|e| panic!("daemon builds: {e}"))
}

/// A live (provisioning) instance of `service_type`, as `instance create`
/// writes it.
async fn live_instance(daemon: &Daemon, name: &str, service_type: &str) {
    let new = NewInstance {
        domains: Vec::new(),
        name: InstanceName::new(name),
        team: "default".into(),
        service_type: service_type.into(),
        version: "1".into(),
        expires_at: None,
        maintenance_window: None,
        parameters: Default::default(),
        spec_digest: None,
    };
    daemon
        .ports
        .store
        .create_instance(&new, daemon.ports.clock.now())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

fn version(daemon: &Daemon, service_type: &str) -> Option<String> {
    daemon
        .catalog
        .current()
        .get(service_type)
        .map(|e| e.version.clone())
}

#[tokio::test]
async fn a_reload_renaming_a_named_volume_of_live_instances_is_refused_and_applied_when_forced() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.toml");
    std::fs::write(&file, catalog("1", "data")).unwrap();
    let daemon = daemon(dir.path(), &file).await;
    live_instance(&daemon, "notes", "web").await;

    std::fs::write(&file, catalog("2", "files")).unwrap();
    let error = daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .expect_err("renaming the volume of a live instance must be refused");
    assert!(matches!(error, ReloadError::Hazards(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "1 change(s) would damage live instances: types.web.services.web.volumes: named \
         volume data -> files at /data while it has live instances (every instance would \
         lose the data in data); undo them, or apply them anyway with `stead reload --force`"
    );
    assert_eq!(
        version(&daemon, "web").as_deref(),
        Some("1"),
        "the running catalog is kept"
    );
    assert_eq!(version(&daemon, "blog").as_deref(), Some("1"));

    let reloaded = daemon
        .reload_catalog(ReloadMode::Forced)
        .await
        .unwrap_or_else(|e| panic!("a forced reload applies: {e}"));
    assert_eq!(reloaded.forced.len(), 1, "{:?}", reloaded.forced);
    assert_eq!(version(&daemon, "web").as_deref(), Some("2"));
    assert_eq!(reloaded.changes.len(), 2, "{:?}", reloaded.changes);
}

#[tokio::test]
async fn a_reload_dropping_a_type_is_refused_only_while_it_has_live_instances() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.toml");
    let both = catalog("1", "data");
    std::fs::write(&file, &both).unwrap();
    let daemon = daemon(dir.path(), &file).await;
    live_instance(&daemon, "notes", "web").await;
    let blog_at = both.find("[types.blog]").unwrap();

    // `blog` has no instance: dropping it is a plain change.
    std::fs::write(&file, &both[..blog_at]).unwrap();
    let reloaded = daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(reloaded.forced.is_empty());
    assert_eq!(version(&daemon, "blog"), None);

    // `web` has one: dropping it is refused, naming the type.
    std::fs::write(&file, &both[blog_at..]).unwrap();
    let error = daemon
        .reload_catalog(ReloadMode::Guarded)
        .await
        .expect_err("dropping a type with a live instance must be refused");
    assert!(
        error.to_string().contains(
            "types.web: removed while it has live instances (they would lose their grant; \
             delete them first)"
        ),
        "{error}"
    );
    assert_eq!(
        version(&daemon, "web").as_deref(),
        Some("1"),
        "the running catalog is kept"
    );
    assert_eq!(version(&daemon, "blog"), None);
}

/// `stead plan` (#55): the daemon reads the file as a reload would and
/// forecasts its rollout with the real planners over the fleet in the
/// database; it changes nothing, and names the hazards a reload would
/// refuse.
#[tokio::test]
async fn a_plan_forecasts_the_rollout_in_waves_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.toml");
    let baking = |text: String| text.replace("[types.blog]\n", "[types.blog]\nbake_ms = 60000\n");
    std::fs::write(&file, baking(catalog("1", "data"))).unwrap();
    let daemon = daemon_with(dir.path(), &file, "[control]\nmax_in_flight = 4\n").await;
    let digest = daemon
        .catalog
        .current()
        .get("blog")
        .unwrap()
        .spec_digest
        .clone();
    let store = &daemon.ports.store;
    let now = daemon.ports.clock.now();
    for name in ["b1", "b2", "b3", "b4"] {
        live_instance(&daemon, name, "blog").await;
        let instance = store
            .instance(&InstanceName::new(name))
            .await
            .unwrap()
            .unwrap();
        store
            .set_instance_spec_digest(instance.id, &digest, now)
            .await
            .unwrap();
        assert!(store
            .set_instance_state(
                instance.id,
                InstanceState::Provisioning,
                InstanceState::Ready,
                now
            )
            .await
            .unwrap());
    }

    // The same file: nothing would change, nothing would start.
    let same = daemon.plan_catalog().await;
    assert!(!same.refused(), "{same:?}");
    assert!(same.changes.is_empty(), "{:?}", same.changes);
    assert!(same.forecast.as_ref().unwrap().rounds.is_empty());

    // Version 2: blog rolls out one, two, then the last one, each wave a
    // bake (60 s) after the one before.
    std::fs::write(&file, baking(catalog("2", "data"))).unwrap();
    let plan = daemon.plan_catalog().await;
    assert!(!plan.refused(), "{plan:?}");
    let forecast = plan.forecast.as_ref().expect("a forecast");
    let waves: Vec<(i64, Vec<&str>)> = forecast
        .rounds
        .iter()
        .map(|r| {
            (
                r.at.as_second() - forecast.from.as_second(),
                r.upgrades.iter().map(|u| u.instance.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        waves,
        [(0, vec!["b1"]), (60, vec!["b2", "b3"]), (120, vec!["b4"])]
    );
    let text = plan.text();
    assert!(text.contains("blog  3     b4        1 -> 2"), "{text}");
    assert!(text.contains("\n  blog 1 -> 2\n"), "{text}");
    assert_eq!(
        version(&daemon, "blog").as_deref(),
        Some("1"),
        "nothing reloaded"
    );
    let rows = store.list_instances().await.unwrap().rows;
    assert!(rows.iter().all(|i| i.version == "1"), "nothing upgraded");
    assert!(
        store.active_tasks().await.unwrap().rows.is_empty(),
        "nothing enqueued"
    );

    // Dropping blog, which has live instances: a reload would refuse it,
    // and the plan says so.
    std::fs::write(
        &file,
        baking(catalog("2", "data"))
            .split("[types.blog]")
            .next()
            .unwrap(),
    )
    .unwrap();
    let refused = daemon.plan_catalog().await;
    assert!(refused.refused());
    assert!(
        refused.hazards[0].starts_with("types.blog: removed while it has live instances"),
        "{:?}",
        refused.hazards
    );
    assert!(
        refused.text().contains("a reload would be refused"),
        "{}",
        refused.text()
    );

    // A file that does not parse: no plan, and why.
    std::fs::write(&file, "[types.blog\n").unwrap();
    let broken = daemon.plan_catalog().await;
    assert!(broken.refused() && broken.forecast.is_none());
    assert!(broken.text().contains("no plan:"), "{}", broken.text());
}
