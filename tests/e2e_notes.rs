//! The notes example (examples/notes) on a whole daemon against the real
//! dockerd, Caddy and SQLite: a row written through the web service
//! survives an upgrade of the instance to a new catalog version (the
//! database's named volume is kept), the database password (a secret)
//! appears nowhere in stead's database files, its log or `stead status
//! --json`; and a version that drops a service ends with it neither
//! running nor routed, its volume kept.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{wait_until, CapturedLog, Harness, Setup};
use stead::core::types::{InstanceName, ServiceName};
use support_services::docker::{docker, Cleanup};
use support_services::unique;

const CONVERGE: Duration = Duration::from_secs(90);
const EXAMPLE_SECRET_PATH: &str = "/tmp/stead-example/notes/db-password";

/// Builds the example's image (idempotent).
fn build_image() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("examples/notes/build-image"))
        .output()
        .expect("run examples/notes/build-image");
    assert!(
        out.status.success(),
        "build-image failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The example catalog at `version`, reading its secret from `secret`.
fn notes_catalog(version: &str, secret: &std::path::Path) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("examples/notes/catalog.toml")).unwrap();
    assert!(text.contains(EXAMPLE_SECRET_PATH) && text.contains("version = \"1\""));
    text.replace(EXAMPLE_SECRET_PATH, &secret.display().to_string())
        .replace("version = \"1\"", &format!("version = \"{version}\""))
}

struct Web {
    client: reqwest::Client,
    listen: String,
    host: String,
}

impl Web {
    fn new(h: &Harness, instance: &str) -> Web {
        Web {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
            listen: h.listen.clone(),
            host: format!("web.{instance}.localhost"),
        }
    }

    /// The body of a 200 answer to `path`, or `None`.
    async fn get(&self, path: &str) -> Option<String> {
        let response = self
            .client
            .get(format!("http://{}{path}", self.listen))
            .header("host", &self.host)
            .send()
            .await
            .ok()?;
        if response.status() != 200 {
            return None;
        }
        response.text().await.ok()
    }

    async fn post(&self, path: &str, body: &str) -> Option<String> {
        let response = self
            .client
            .post(format!("http://{}{path}", self.listen))
            .header("host", &self.host)
            .body(body.to_owned())
            .send()
            .await
            .ok()?;
        if response.status() != 200 {
            return None;
        }
        response.text().await.ok()
    }
}

/// Every file under `dir` (the state directory: the SQLite database, its
/// journal, the identity) whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path) {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_survives_an_upgrade_and_the_secret_is_nowhere_to_be_seen() {
    let log = CapturedLog::install();
    build_image();
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("db-password");
    // Distinctive, so a grep cannot match anything else.
    let password = format!("pw{}x{}", std::process::id(), unique("s"));
    std::fs::write(&secret, format!("{password}\n")).unwrap();

    let instance = unique("notes");
    let _cleanup = Cleanup::new(&instance);
    let mut h = Harness::start(Setup {
        catalog: notes_catalog("1", &secret),
        // The operator grants the directory the secret is read from.
        extra_config: format!(
            "[grants]\nsecret_dirs = [\"{}\"]\n",
            secrets.path().display()
        ),
        ..Setup::default()
    })
    .await;
    h.ops()
        .create(&stead::ops::CreateRequest {
            domains: Vec::new(),
            name: instance.clone(),
            service_type: "notes".into(),
            team: "e2e".into(),
            version: None,
            ttl: None,
            maintenance_window: None,
            exists_ok: false,
            parameters: [("title".to_owned(), "Shopping".to_owned())].into(),
        })
        .await
        .expect("create the notes instance");
    let web = Web::new(&h, &instance);
    let page_v1 = format!("Shopping of {instance}, version 1");
    wait_until("the notes web page at version 1", CONVERGE, || async {
        web.get("/")
            .await
            .is_some_and(|page| page.contains(&page_v1))
    })
    .await;
    let row = format!("remember the milk {}", unique("r"));
    wait_until(
        "the row is written through web into db",
        CONVERGE,
        || async {
            web.post("/cgi-bin/notes", &row)
                .await
                .is_some_and(|rows| rows.contains(&row))
        },
    )
    .await;
    let store = h.daemon().ports.store.clone();
    let db_before = store
        .load_active(&InstanceName::new(&instance))
        .await
        .unwrap()
        .services[&ServiceName::new("db")]
        .container
        .clone();

    // Version 2: the daemon starts again on the new catalog and version
    // drift upgrades the instance, service by service.
    h.restart_with_catalog(&notes_catalog("2", &secret)).await;
    wait_until("the notes web page at version 2", CONVERGE, || async {
        web.get("/")
            .await
            .is_some_and(|page| page.contains("version 2"))
    })
    .await;
    wait_until(
        "db replaced by its version-2 successor",
        CONVERGE,
        || async {
            let active = store
                .load_active(&InstanceName::new(&instance))
                .await
                .unwrap();
            active
                .services
                .get(&ServiceName::new("db"))
                .is_some_and(|db| {
                    db.container != db_before && db.effective_revision.starts_with("2.")
                })
        },
    )
    .await;
    let rows = web
        .get("/cgi-bin/notes")
        .await
        .expect("the rows, through web");
    assert!(
        rows.contains(&row),
        "the row written at version 1 is read back at version 2: {rows:?}"
    );
    // A change of spec at the same version is an upgrade too; only the
    // service whose spec changed gets a successor.
    let db_v2 = store
        .load_active(&InstanceName::new(&instance))
        .await
        .unwrap()
        .services[&ServiceName::new("db")]
        .container
        .clone();
    let respelled = notes_catalog("2", &secret).replace("{param.title} of", "{param.title} for");
    h.restart_with_catalog(&respelled).await;
    let page_respelled = format!("Shopping for {instance}, version 2");
    wait_until("web's new spec at the same version", CONVERGE, || async {
        web.get("/")
            .await
            .is_some_and(|page| page.contains(&page_respelled))
    })
    .await;
    let active = store
        .load_active(&InstanceName::new(&instance))
        .await
        .unwrap();
    assert_eq!(
        active.services[&ServiceName::new("db")].container,
        db_v2,
        "db's spec did not change: it keeps its container"
    );
    let rows = web
        .get("/cgi-bin/notes")
        .await
        .expect("the rows, through web");
    assert!(rows.contains(&row), "{rows:?}");
    let volume = format!("stead.{instance}.db.data");
    assert!(docker(&["volume", "inspect", &volume]).is_ok());

    // The secret reached the containers (the rows above needed it) and
    // nothing of stead's.
    let status = stead::daemon::status::status(stead::daemon::status::StatusSources {
        store: h.daemon().ports.store.as_ref(),
        runtime: h.daemon().ports.runtime.as_ref(),
        catalog: &h.daemon().catalog.current(),
        memory: None,
        caddy_admin: Some(&h.caddy.admin_addr),
        provisioner: Some(h.daemon().ports.provisioner.as_ref()),
        database: String::new(),
        now: h.daemon().ports.clock.now(),
    })
    .await;
    let status_json = serde_json::to_string(&status).unwrap();
    assert!(status_json.contains(&instance), "status lists the instance");
    assert!(
        !status_json.contains(&password),
        "the secret is in stead status --json"
    );
    h.shutdown().await;
    let in_files = files_containing(h.dir.path(), &password);
    assert!(in_files.is_empty(), "the secret is in {in_files:?}");
    let text = log.text();
    assert!(
        text.contains(&instance),
        "the log was captured ({} bytes)",
        text.len()
    );
    assert!(
        !text.contains(&password),
        "the secret is in the daemon's log"
    );
    let labels = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=stead.instance={instance}"),
        "--format",
        "{{.Labels}}",
    ])
    .unwrap();
    assert!(!labels.is_empty() && !labels.contains(&password));
}

/// Whether the proxy at `listen` answers 200 for `service` of `instance`.
async fn is_served(client: &reqwest::Client, listen: &str, instance: &str, service: &str) -> bool {
    client
        .get(format!("http://{listen}/"))
        .header("host", format!("{service}.{instance}.localhost"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// Version 1 runs http and a sidecar with a named volume; version 2 only
/// http.
fn dropping_catalog(version: &str, with_sidecar: bool) -> String {
    let sidecar = if with_sidecar {
        r#"
[[types.web.services]]
name = "sidecar"
image = "stead-test/busybox:1"
command = ["httpd", "-f", "-p", "8080", "-h", "/www"]
ports = [8080]
volumes = [{ name = "cache", path = "/cache" }]
stop_grace_ms = 1000
"#
    } else {
        ""
    };
    format!(
        r#"
[types.web]
version = "{version}"

[[types.web.services]]
name = "http"
image = "stead-test/busybox:1"
command = ["httpd", "-f", "-p", "8080", "-h", "/www"]
ports = [8080]
stop_grace_ms = 1000
{sidecar}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_drops_a_service_stops_and_unroutes_it_and_keeps_its_volume() {
    let instance = unique("drop");
    let _cleanup = Cleanup::new(&instance);
    let mut h = Harness::start(Setup {
        catalog: dropping_catalog("1", true),
        ..Setup::default()
    })
    .await;
    h.create(&instance, None).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let listen = h.listen.clone();
    let served = |service: &'static str| is_served(&client, &listen, &instance, service);
    wait_until("both services served", CONVERGE, || async {
        served("http").await && served("sidecar").await
    })
    .await;
    let filter = format!("label=stead.instance={instance}");
    let sidecar_filter = "label=stead.service=sidecar".to_owned();

    h.restart_with_catalog(&dropping_catalog("2", false)).await;
    wait_until("the sidecar is gone from the runtime", CONVERGE, || async {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &filter,
            "--filter",
            &sidecar_filter,
        ])
        .is_ok_and(|ids| ids.is_empty())
    })
    .await;
    assert!(!served("sidecar").await, "the sidecar is no longer routed");
    assert!(served("http").await, "http serves throughout");
    // ACTIVE lets go of the sidecar once its container is removed: the
    // row goes after the container (a removal that fails keeps it named),
    // so it is awaited, not read at the instant the container vanished.
    let store = h.daemon().ports.store.clone();
    let active_services = || async {
        store
            .load_active(&InstanceName::new(&instance))
            .await
            .unwrap()
            .services
            .keys()
            .map(|s| s.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    wait_until("ACTIVE names only http", CONVERGE, || async {
        active_services().await == ["http"]
    })
    .await;
    assert!(
        docker(&[
            "volume",
            "inspect",
            &format!("stead.{instance}.sidecar.cache")
        ])
        .is_ok(),
        "the dropped service's volume is kept"
    );
    // A few more ticks: no pass revives it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &filter,
            "--filter",
            &sidecar_filter
        ])
        .unwrap(),
        ""
    );
    h.shutdown().await;
}

/// #40's bar: one container of a two-service instance removed by hand (a
/// disk lost, a `docker rm -f`) comes back by itself: the pass sees it gone
/// while the instance's other container runs, drift reprovisions that one
/// service, and it is served again — within seconds, while `http` serves
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_removed_by_hand_is_back_and_served_by_itself() {
    let instance = unique("rmhand");
    let _cleanup = Cleanup::new(&instance);
    let h = Harness::start(Setup {
        catalog: dropping_catalog("1", true),
        ..Setup::default()
    })
    .await;
    h.create(&instance, None).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let listen = h.listen.clone();
    let served = |service: &'static str| is_served(&client, &listen, &instance, service);
    wait_until("both services served", CONVERGE, || async {
        served("http").await && served("sidecar").await
    })
    .await;
    let store = h.daemon().ports.store.clone();
    let sidecar = ServiceName::new("sidecar");
    let gone = store
        .load_active(&InstanceName::new(&instance))
        .await
        .unwrap()
        .services[&sidecar]
        .container
        .clone();
    docker(&["rm", "-f", gone.as_str()]).unwrap();
    let took = wait_until("the sidecar back and served", CONVERGE, || async {
        let back = store
            .load_active(&InstanceName::new(&instance))
            .await
            .ok()
            .and_then(|a| a.services.get(&sidecar).map(|s| s.container.clone()));
        back.is_some_and(|c| c != gone) && served("sidecar").await
    })
    .await;
    assert!(
        took < Duration::from_secs(20),
        "the sidecar came back in {took:?}"
    );
    assert!(served("http").await, "http serves throughout");
    let filter = format!("label=stead.instance={instance}");
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &filter])
            .unwrap()
            .lines()
            .count(),
        2,
        "one container per service"
    );
}

/// #40's bar, found by a new user on this example: two upgrades in a row
/// leave exactly one container per service (old `db` containers used to
/// run on, three on one volume), each predecessor's retirement is logged,
/// and no warning repeats tick after tick. (No bake window here: with one,
/// each predecessor is kept, stopped, until it ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upgrades_in_a_row_leave_one_container_per_service() {
    let log = CapturedLog::install();
    build_image();
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("db-password");
    std::fs::write(&secret, format!("pw{}\n", unique("s"))).unwrap();
    let catalog = |version: &str| {
        notes_catalog(version, &secret).replacen(
            &format!("version = \"{version}\""),
            &format!("version = \"{version}\"\nbake_ms = 0"),
            1,
        )
    };
    let instance = unique("notes2up");
    let _cleanup = Cleanup::new(&instance);
    let mut h = Harness::start(Setup {
        catalog: catalog("1"),
        extra_config: format!(
            "[grants]\nsecret_dirs = [\"{}\"]\n",
            secrets.path().display()
        ),
        ..Setup::default()
    })
    .await;
    h.ops()
        .create(&stead::ops::CreateRequest {
            domains: Vec::new(),
            name: instance.clone(),
            service_type: "notes".into(),
            team: "e2e".into(),
            version: None,
            ttl: None,
            maintenance_window: None,
            exists_ok: false,
            parameters: [("title".to_owned(), "Errands".to_owned())].into(),
        })
        .await
        .expect("create the notes instance");
    let web = Web::new(&h, &instance);
    let filter = format!("label=stead.instance={instance}");
    for version in ["1", "2", "3"] {
        if version != "1" {
            h.restart_with_catalog(&catalog(version)).await;
        }
        let page = format!("version {version}");
        wait_until(
            &format!("version {version} served, one container per service"),
            CONVERGE,
            || async {
                web.get("/").await.is_some_and(|p| p.contains(&page))
                    && docker(&["ps", "-aq", "--filter", &filter])
                        .is_ok_and(|ids| ids.lines().count() == 2)
            },
        )
        .await;
    }
    let active = h
        .daemon()
        .ports
        .store
        .load_active(&InstanceName::new(&instance))
        .await
        .unwrap();
    assert!(
        active
            .services
            .values()
            .all(|s| s.effective_revision.starts_with("3.")),
        "{active:?}"
    );
    let text = log.text();
    let retired = text
        .lines()
        .filter(|l| l.contains("retired a superseded container") && l.contains(&instance))
        .count();
    assert_eq!(retired, 4, "web and db, retired after each of two upgrades");
    let mut warnings: std::collections::BTreeMap<String, usize> = Default::default();
    for line in text.lines().filter(|l| l.contains(" WARN ")) {
        // The message, without the timestamp and the span's fields.
        let message = line.split(": ").skip(1).collect::<Vec<_>>().join(": ");
        *warnings.entry(message).or_default() += 1;
    }
    let repeated: Vec<_> = warnings.iter().filter(|(_, n)| **n > 2).collect();
    assert!(
        repeated.is_empty(),
        "warnings repeated tick after tick: {repeated:#?}"
    );
}
