//! The status page (#42, item 6): the admin listener of a daemon over a
//! real SQLite store serves the fleet (`GET /`) and one instance (`GET
//! /instances/{name}`) as HTML; with a token file, every endpoint that
//! shows or changes the fleet demands the token. Then headless Chromium
//! (Debian's `chromium`, which `scripts/services` installs) renders both
//! pages: screenshots go to `target/artifacts/` (or `$STEAD_ARTIFACTS_DIR`)
//! for CI to keep, and the rendered DOM shows a name with HTML in it as
//! text. No Docker or Caddy answers: the page says so, as `/status` does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod support_services;

use sqlx::Connection;
use stead::core::event_log::{Event, EventKind};
use stead::core::fleet::{InstanceState, RolloutState};
use stead::core::types::{ActiveService, ContainerId, InstanceName, ServiceName};
use stead::daemon::{admin, Daemon, Role};
use stead::ports::NewInstance;
use support_services::chromium::{artifacts_dir, chromium};
use tokio::sync::watch;

/// An instance name that is markup: the store refuses to read it back as
/// a name (T6), so the page shows it inside the bad row's error.
const HOSTILE_NAME: &str = "<b id=\"injected\">evil</b>";
/// The token of the tests that set one.
const TOKEN: &str = "s3cret-token-0123456789abcdef";

/// A daemon's admin listener on a free loopback port, until dropped.
struct Served {
    url: String,
    _stop: watch::Sender<bool>,
    daemon: Arc<Daemon>,
    _dir: tempfile::TempDir,
    /// A Docker socket that takes connections and never answers, when the
    /// test asked for a hung engine.
    _hung_docker: Option<std::os::unix::net::UnixListener>,
}

const CATALOG: &str = "[types.wiki]\nversion = \"2\"\n[[types.wiki.services]]\nname = \"web\"\n\
    image = \"wiki:2\"\n[[types.wiki.services]]\nname = \"db\"\nimage = \"pg:16\"\n\
    [types.blog]\nversion = \"1\"\n[[types.blog.services]]\nname = \"web\"\nimage = \"blog:1\"\n";

/// A port nothing listens on (taken, then given back).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A daemon on a fresh SQLite file with `wiki1` (two services in ACTIVE,
/// one version behind), `wiki2` (no container yet), `blog1` (its type's
/// rollout halted), an instance whose name is markup, and a few events of
/// `wiki1`. Its admin listener requires `token` when one is given.
async fn serve(token: Option<&str>) -> Served {
    serve_with(token, false).await
}

/// [`serve`]; with `hung_docker`, the Docker socket takes every connection
/// and never answers (a hung engine), within a 12 s request timeout:
/// longer than a status render may take.
async fn serve_with(token: Option<&str>, hung_docker: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("catalog.toml"), CATALOG).unwrap();
    let docker = std::os::unix::net::UnixListener::bind(root.join("no-docker.sock")).unwrap();
    let hung_docker = hung_docker.then_some(docker);
    let mut doc = format!(
        "state_dir = \"{dir}\"\ncatalog = \"{dir}/catalog.toml\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{dir}/no-docker.sock\"\nrequest_timeout_s = 12\n\
         [caddy]\nadmin = \"127.0.0.1:{caddy}\"\n",
        dir = root.display(),
        caddy = closed_port(),
    );
    if let Some(token) = token {
        std::fs::write(root.join("admin.token"), format!("{token}\n")).unwrap();
        doc = format!(
            "admin_token_file = \"{}/admin.token\"\n{doc}",
            root.display()
        );
    }
    let config = stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap();
    let token = config
        .admin_token_file
        .as_deref()
        .map(|path| stead::config::admin_token::AdminToken::read(path).unwrap());
    let daemon = Arc::new(
        Daemon::build(config)
            .await
            .unwrap_or_else(|e| panic!("daemon builds: {e}")),
    );
    populate(&daemon).await;
    let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(admin::serve(
        daemon.clone(),
        listener,
        Role::All,
        token,
        stopped,
    ));
    Served {
        url,
        _stop: stop,
        daemon,
        _dir: dir,
        _hung_docker: hung_docker,
    }
}

async fn populate(daemon: &Daemon) {
    let store = daemon.ports.store.as_ref();
    let now = daemon.ports.clock.now();
    for (name, service_type, version) in [
        ("wiki1", "wiki", "1"),
        ("wiki2", "wiki", "2"),
        ("blog1", "blog", "1"),
        ("evil1", "wiki", "2"),
    ] {
        let new = NewInstance {
            domains: Vec::new(),
            name: InstanceName::new(name),
            team: "default".into(),
            service_type: service_type.into(),
            version: version.into(),
            expires_at: None,
            maintenance_window: None,
            parameters: Default::default(),
            spec_digest: None,
        };
        let instance = store
            .create_instance(&new, now)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if name != "blog1" {
            store
                .set_instance_state(
                    instance.id,
                    InstanceState::Provisioning,
                    InstanceState::Ready,
                    now,
                )
                .await
                .unwrap();
        }
    }
    // No stead command writes such a name (T6); a hand-edited row can.
    let mut db = sqlx::SqliteConnection::connect(&daemon.config.database_url)
        .await
        .unwrap();
    sqlx::query("UPDATE instances SET name = ?1 WHERE name = 'evil1'")
        .bind(HOSTILE_NAME)
        .execute(&mut db)
        .await
        .unwrap();
    let wiki1 = InstanceName::new("wiki1");
    for (service, container) in [("web", "c0ffee000001"), ("db", "c0ffee000002")] {
        let active = ActiveService {
            container: ContainerId::new(container),
            effective_revision: "1".into(),
            binds: [(8080, 32768)].into(),
            stop_grace: None,
            verified_started_at: None,
        };
        store
            .save_active_service(&wiki1, &ServiceName::new(service), &active)
            .await
            .unwrap();
    }
    store
        .set_rollout(
            "blog",
            RolloutState::Halted,
            "upgrade of blog9 failed",
            now,
            None,
        )
        .await
        .unwrap();
    let events = [
        Event::new(EventKind::Start, now, "R9", "started the exited container")
            .instance(&wiki1)
            .service(&ServiceName::new("web")),
        Event::new(EventKind::Publish, now, "R13", "published after readiness")
            .instance(&wiki1)
            .service(&ServiceName::new("web")),
    ];
    let events = events.map(|mut e| {
        e.writer = "test#1".into();
        e
    });
    store.append_events(&events).await.unwrap();
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// GETs `path`: the status and the body.
async fn get(served: &Served, path: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client().get(format!("{}{path}", served.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let code = response.status().as_u16();
    (code, response.text().await.unwrap())
}

fn assert_contains_all(body: &str, expected: &[&str]) {
    for expect in expected {
        assert!(body.contains(expect), "{expect}\n---\n{body}");
    }
}

#[tokio::test]
async fn the_fleet_page_shows_instances_whether_served_and_rollouts_per_type() {
    let served = serve(None).await;
    let (code, body) = get(&served, "/", None).await;
    assert_eq!(code, 200, "{body}");
    assert_contains_all(
        &body,
        &[
            "<a href=\"/instances/wiki1\">wiki1</a></td><td>ready</td><td>running</td><td>1</td>\
             <td>db, web</td><td class=\"bad\">no</td>",
            "<a href=\"/instances/wiki2\">wiki2</a></td><td>ready</td><td>running</td><td>2</td>\
             <td></td><td class=\"bad\">no: no container yet</td>",
            "<a href=\"/instances/blog1\">blog1</a></td><td>provisioning</td>",
            "<td>blog</td><td>1</td><td>1</td><td class=\"bad\">halted: upgrade of blog9 failed</td>",
            "<td>wiki</td><td>2</td><td>2</td><td class=\"ok\">active</td>",
            "<a href=\"/instances/wiki1\">wiki1</a> 1 → 2: planned at the next tick",
            // The bad row's error quotes the name as Rust does.
            "bad row in instances (id 4): name = &quot;&lt;b id=\\&quot;injected\\&quot;&gt;\
             evil&lt;/b&gt;&quot;",
        ],
    );
    assert!(!body.contains("<b id="), "markup from a name: {body}");
}

#[tokio::test]
async fn an_instance_page_shows_its_services_budgets_why_and_timeline() {
    let served = serve(None).await;
    let (code, body) = get(&served, "/instances/wiki1", None).await;
    assert_eq!(code, 200, "{body}");
    assert_contains_all(
        &body,
        &[
            "<h1>wiki1</h1>",
            "<td>web</td><td>c0ffee000001</td>",
            "<td>db</td><td>c0ffee000002</td>",
            "unknown (runtime did not answer: ",
            "<td class=\"ok\">clear</td>",
            "(caddy unreachable)",
            "<ul id=\"why\"><li>wiki1/db is unknown (runtime did not answer: ",
            "its upgrade from 1 to 2 (wiki): planned at the next tick",
            "<pre id=\"timeline\">wiki1: 2 event(s) from",
            "started the exited container",
            "published after readiness",
        ],
    );
    let (code, body) = get(&served, "/instances/nosuch", None).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("<code id=\"name\">nosuch</code>"), "{body}");
    let (code, body) = get(&served, "/instances/%3Cb%20id%3D%22x%22%3E", None).await;
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains("<code id=\"name\">&lt;b id=&quot;x&quot;&gt;</code>"),
        "{body}"
    );
}

#[tokio::test]
async fn with_a_token_every_fleet_endpoint_demands_it_and_metrics_and_health_stay_open() {
    let served = serve(Some(TOKEN)).await;
    for path in ["/", "/instances/wiki1", "/status", "/catalog"] {
        for presented in [None, Some("wrong-token-0123456789abcdef")] {
            let (code, body) = get(&served, path, presented).await;
            assert_eq!(code, 401, "{path}: {body}");
            assert!(!body.contains("wiki"), "{path} leaks: {body}");
        }
        let (code, body) = get(&served, path, Some(TOKEN)).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    let reload = client()
        .post(format!("{}/reload", served.url))
        .header(admin::RELOAD_HEADER, admin::RELOAD_HEADER_VALUE)
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 401);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (code, body) = get(&served, path, None).await;
        assert_ne!(code, 401, "{path}: {body}");
    }
}

/// DNS rebinding (#54): a page whose own name resolves to 127.0.0.1 makes
/// the browser send its name as `Host`; no endpoint answers it, a reload
/// with the header and a forced one included.
#[tokio::test]
async fn a_request_for_a_host_the_listener_does_not_serve_is_refused_everywhere() {
    let served = serve(None).await;
    let port = served.url.rsplit(':').next().unwrap().to_owned();
    for host in ["evil.example".to_owned(), format!("evil.example:{port}")] {
        for path in [
            "/", "/status", "/catalog", "/metrics", "/healthz", "/readyz",
        ] {
            let response = client()
                .get(format!("{}{path}", served.url))
                .header("host", &host)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 421, "{host}{path}");
            let body = response.text().await.unwrap();
            assert!(!body.contains("wiki"), "{path} leaks: {body}");
        }
        let reload = client()
            .post(format!("{}/reload?force=true", served.url))
            .header("host", &host)
            .header(admin::RELOAD_HEADER, admin::RELOAD_HEADER_VALUE)
            .send()
            .await
            .unwrap();
        assert_eq!(reload.status().as_u16(), 421, "{host}: a forced reload");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let response = client()
            .get(format!("{}/status", served.url))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{host}");
    }
}

/// `/readyz` through the listener: every request of a burst is answered
/// (the store is read at most once a second: `admin::tests`).
#[tokio::test]
async fn readyz_answers_every_request_of_a_burst() {
    let served = serve(None).await;
    for _ in 0..20 {
        let (code, body) = get(&served, "/readyz", None).await;
        assert_ne!(code, 421, "{body}");
        assert!(
            body.starts_with("ready") || body.contains("lease"),
            "{body}"
        );
    }
}

// --- headless Chromium ----------------------------------------------------

/// Screenshots `url` into the artifacts as `name`, and checks the PNG is
/// a real picture (a PNG, and more than a blank page's few bytes).
async fn screenshot(url: &str, name: &str) -> PathBuf {
    let path = artifacts_dir().join(name);
    let _ = std::fs::remove_file(&path);
    let arg = format!("--screenshot={}", path.display());
    chromium(&[&arg, "--window-size=1280,900"], url).await;
    let png = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    assert!(
        png.len() > 10_000,
        "{}: {} bytes, too few for a rendered page",
        path.display(),
        png.len()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_the_fleet_and_an_instance_page_into_screenshots() {
    let served = serve(None).await;
    screenshot(&served.url, "status-page-fleet.png").await;
    screenshot(
        &format!("{}/instances/wiki1", served.url),
        "status-page-instance.png",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_name_with_html_in_it_as_text() {
    let served = serve(None).await;
    let fleet = chromium(&["--dump-dom"], &served.url).await;
    assert!(fleet.contains("id=\"instances\""), "not the fleet: {fleet}");
    // Serialised back from the DOM, the name is a text node: its `<` come
    // back as entities, and no element has the injected id.
    assert!(
        fleet.contains(r#"name = "&lt;b id=\"injected\"&gt;evil&lt;/b&gt;""#),
        "{fleet}"
    );
    assert!(!fleet.contains("<b id="), "{fleet}");
    let url = format!("{}/instances/%3Cb%20id%3D%22injected%22%3E", served.url);
    let missing = chromium(&["--dump-dom"], &url).await;
    assert!(
        missing.contains("<code id=\"name\">&lt;b id=\"injected\"&gt;</code>"),
        "{missing}"
    );
    assert!(!missing.contains("<b id="), "{missing}");
}

/// #41 item 6: a loop of status requests cannot pile renders onto the
/// store. While Docker hangs (every render waits on it), a burst of 32
/// requests to `/status` and the status pages runs one render; the 31
/// others are answered 503 with `Retry-After` at once, not queued, and the
/// store keeps answering the daemon meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_status_requests_while_docker_hangs_runs_one_render_and_refuses_the_rest() {
    let served = Arc::new(serve_with(None, true).await);
    let began = tokio::time::Instant::now();
    let requests: Vec<_> = (0..32)
        .map(|n| {
            let served = served.clone();
            let path = ["/status", "/", "/instances/wiki1"][n % 3];
            tokio::spawn(async move {
                let response = client()
                    .get(format!("{}{path}", served.url))
                    .send()
                    .await
                    .unwrap();
                let code = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = response.text().await.unwrap();
                (code, retry_after, body, began.elapsed())
            })
        })
        .collect();
    // The store answers while the burst runs: the renders hold none of
    // its connections waiting on Docker.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let store = served.daemon.ports.store.as_ref();
    let depth = tokio::time::timeout(Duration::from_secs(2), store.queue_depth())
        .await
        .expect("the store answers during the burst");
    assert_eq!(depth.unwrap(), 0);
    let mut busy = 0;
    let mut timed_out = 0;
    for request in requests {
        let (code, retry_after, body, took) = request.await.unwrap();
        assert_eq!(code, 503, "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
        if body.contains("busy: 1 request(s) of this kind already running") {
            assert!(
                took < Duration::from_secs(5),
                "a refusal waits for nothing, took {took:?}"
            );
            busy += 1;
        } else {
            assert!(body.contains("took longer than 10000 ms"), "{body}");
            timed_out += 1;
        }
    }
    assert_eq!((busy, timed_out), (31, 1));
}
