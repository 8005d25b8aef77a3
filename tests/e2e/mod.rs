//! The end-to-end harness: a whole daemon (reconciler, workers, Docker
//! events, admin off) wired by `stead::daemon` against the real dockerd, a
//! private Caddy and a SQLite file, with a one-second tick.
#![allow(dead_code)]
// Each test binary uses a different part.
// Latency and deadlines in tests are wall-clock by nature.
#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stead::core::types::InstanceName;
use stead::daemon::{config, Daemon, Role};
use stead::engine::SystemClock;
use stead::ops::{CreateRequest, Ops};
use stead::ports::Clock;
use tokio::sync::watch;

use crate::support_services::caddy::CaddyProcess;
use crate::support_services::docker::docker;
use crate::support_services::free_port;

/// The service type every test uses, and its one service.
pub const TYPE: &str = "web";
pub const SERVICE: &str = "http";

/// A busybox httpd whose healthcheck fails while `/tmp/sick` exists; the
/// file is removed at every start, so a restart cures it. Predecessors
/// retire as soon as their successors serve (no bake window, #40).
pub fn catalog(version: &str, command: &str) -> String {
    catalog_baking(version, command, 0)
}

/// [`catalog`] with a bake window of `bake_ms` (#40).
pub fn catalog_baking(version: &str, command: &str, bake_ms: u64) -> String {
    format!(
        r#"
[types.web]
version = "{version}"
bake_ms = {bake_ms}

[[types.web.services]]
name = "http"
image = "stead-test/busybox:1"
command = ["sh", "-c", "{command}"]
ports = [8080]
stop_grace_ms = 1000

[types.web.services.healthcheck]
command = ["sh", "-c", "test ! -e /tmp/sick && wget -q -O- http://127.0.0.1:8080/ >/dev/null"]
interval_ms = 500
# Generous against a loaded CI machine: one slow check must not make a
# healthy container look unhealthy (that restart would be correct, and
# would fail tests that measure something else). /tmp/sick still turns a
# container unhealthy within 1.5 s, since `test` fails at once.
timeout_ms = 5000
retries = 3

[types.web.services.readiness]
kind = "http"
port = 8080
path = "/"
timeout_ms = 1000
interval_ms = 100
attempts_max = 100
"#
    )
}

pub const HTTPD: &str = "busybox rm -f /tmp/sick; exec httpd -f -p 8080 -h /www";

pub struct Harness {
    /// `None` only while a restart replaces it: the old daemon is dropped
    /// first, since a daemon holds its state directory's identity (T1).
    daemon: Option<Arc<Daemon>>,
    pub caddy: CaddyProcess,
    pub listen: String,
    pub dir: tempfile::TempDir,
    role: Role,
    stop: Option<watch::Sender<bool>>,
    run: Option<tokio::task::JoinHandle<()>>,
    http: reqwest::Client,
}

/// Options a test varies.
pub struct Setup {
    pub catalog: String,
    pub docker_events: bool,
    pub tick_interval_s: u64,
    /// Appended to the config file (e.g. a `[recovery]` table).
    pub extra_config: String,
    /// Extra keys of the `[control]` table (e.g. `max_in_flight = 4`).
    pub control_extra: String,
    /// A migrated database; `None` uses a SQLite file in the state dir.
    pub database_url: Option<String>,
    /// Extra keys of the `[helm]` table (e.g. `path`, `env`).
    pub helm_extra: String,
    /// What the harness's own daemon runs.
    pub role: Role,
    /// Top-level keys put before every table (e.g. `api_listen`).
    pub top_config: String,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            catalog: catalog("1", HTTPD),
            docker_events: true,
            tick_interval_s: 1,
            extra_config: String::new(),
            control_extra: String::new(),
            database_url: None,
            helm_extra: String::new(),
            role: Role::All,
            top_config: String::new(),
        }
    }
}

impl Harness {
    /// A config file for the CLI beside the harness's daemon: its state
    /// directory (so its SQLite database), catalog and Caddy.
    pub fn cli_config(&self) -> std::path::PathBuf {
        let path = self.dir.path().join("cli.toml");
        let doc = format!(
            r#"
state_dir = "{state}"
catalog = "{catalog}"
admin_listen = ""
[caddy]
admin = "{admin}"
listen = "{listen}"
"#,
            state = self.dir.path().display(),
            catalog = self.daemon().config.catalog.display(),
            admin = self.caddy.admin_addr,
            listen = self.listen,
        );
        std::fs::write(&path, doc).expect("write the CLI's config");
        path
    }

    pub async fn start(setup: Setup) -> Harness {
        // Logs show with `--nocapture`; `STEAD_LOG` picks the level.
        let filter = tracing_subscriber::EnvFilter::try_from_env("STEAD_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
        let caddy = CaddyProcess::start().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let listen = format!("127.0.0.1:{}", free_port());
        let catalog_path = dir.path().join("catalog.toml");
        std::fs::write(&catalog_path, &setup.catalog).expect("write catalog");
        let doc = format!(
            r#"
state_dir = "{state}"
catalog = "{catalog}"
admin_listen = ""
workers = 2
worker_idle_poll_ms = 100
docker_events = {events}
shutdown_grace_s = 10
[control]
tick_interval_s = {tick}
# The shortest lease allowed, so a task abandoned by a killed daemon is
# requeued within seconds (C6).
lease_s = 10
provisioner_timeout_s = 5
{control_extra}
[caddy]
admin = "{admin}"
listen = "{listen}"
[helm]
# Short enough for the ten-second task lease above (the lease must outlive
# a whole helm call).
wait_timeout_s = 2
kill_margin_s = 1
{helm_extra}
"#,
            state = dir.path().display(),
            catalog = catalog_path.display(),
            events = setup.docker_events,
            tick = setup.tick_interval_s,
            admin = caddy.admin_addr,
            control_extra = setup.control_extra,
            helm_extra = setup.helm_extra,
        );
        let database = setup
            .database_url
            .as_ref()
            .map(|url| format!("database_url = \"{url}\"\n"))
            .unwrap_or_default();
        // Top-level keys must come before the first table.
        let doc = database + &setup.top_config + &doc + &setup.extra_config;
        let config = config::parse(&doc, "e2e", &[]).expect("valid e2e config");
        let daemon = Arc::new(Daemon::build(config).await.expect("daemon builds"));
        let mut harness = Harness {
            daemon: Some(daemon),
            caddy,
            listen,
            dir,
            role: setup.role,
            stop: None,
            run: None,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(2))
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        };
        harness.resume();
        harness
    }

    /// The running daemon.
    pub fn daemon(&self) -> &Arc<Daemon> {
        self.daemon.as_ref().expect("a daemon outside a restart")
    }

    /// Starts the daemon's loops (again).
    pub fn resume(&mut self) {
        let (tx, rx) = watch::channel(false);
        let daemon = self.daemon().clone();
        let role = self.role;
        self.run = Some(tokio::spawn(async move {
            daemon
                .run(role, rx)
                .await
                .expect("the daemon runs until stopped")
        }));
        self.stop = Some(tx);
    }

    /// Another daemon on the same database, Caddy and catalog: its own
    /// state directory (so its own identity, memory and in-process locks),
    /// running `role` (a standby, or the other half of split roles).
    pub async fn peer(&self, role: Role) -> Peer {
        self.peer_with(role, |_| {}).await
    }

    /// [`Harness::peer`] with its config changed by `edit` first (e.g.
    /// its own webhook receiver).
    pub async fn peer_with(
        &self,
        role: Role,
        edit: impl FnOnce(&mut config::DaemonConfig),
    ) -> Peer {
        let dir = tempfile::tempdir().expect("peer state dir");
        let mut config = self.daemon().config.clone();
        config.state_dir = dir.path().to_owned();
        edit(&mut config);
        let daemon = Arc::new(Daemon::build(config).await.expect("peer builds"));
        let (tx, rx) = watch::channel(false);
        let run = {
            let daemon = daemon.clone();
            tokio::spawn(async move {
                daemon
                    .run(role, rx)
                    .await
                    .expect("the daemon runs until stopped")
            })
        };
        Peer {
            daemon,
            stop: Some(tx),
            run: Some(run),
            _dir: dir,
        }
    }

    /// Stops the loops as SIGTERM would, and waits for them.
    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        if let Some(run) = self.run.take() {
            tokio::time::timeout(Duration::from_secs(20), run)
                .await
                .expect("daemon stops within its shutdown bound")
                .expect("daemon task");
        }
    }

    /// Abandons the running loops without any shutdown, as SIGKILL would:
    /// in-flight handlers stop wherever they are, memory is lost, leases
    /// stay held until they expire.
    pub async fn kill(&mut self) {
        self.stop.take();
        if let Some(run) = self.run.take() {
            run.abort();
            let _ = run.await;
        }
    }

    /// Stops the daemon, writes a new catalog and starts a fresh daemon
    /// (new memory) on the same database, Caddy and config.
    pub async fn restart_with_catalog(&mut self, catalog: &str) {
        self.shutdown().await;
        let config = self.daemon().config.clone();
        std::fs::write(&config.catalog, catalog).expect("write catalog");
        // The old daemon goes first: it holds the state directory's
        // identity, which the new one takes over (T1).
        self.daemon = None;
        let daemon = Daemon::build(config).await.expect("daemon rebuilds");
        self.daemon = Some(Arc::new(daemon));
        self.resume();
    }

    pub fn ops(&self) -> Ops<'_> {
        Ops::new(
            self.daemon().ports.store.as_ref(),
            self.daemon().catalog.current(),
            SystemClock.now(),
            stead::daemon::os_seed(),
        )
    }

    pub async fn create(&self, name: &str, ttl: Option<Duration>) {
        self.create_typed(name, TYPE, ttl).await;
    }

    /// Creates an instance of a given service type of the catalog.
    pub async fn create_typed(&self, name: &str, service_type: &str, ttl: Option<Duration>) {
        self.ops()
            .create(&CreateRequest {
                domains: Vec::new(),
                parameters: Default::default(),
                name: name.to_owned(),
                service_type: service_type.to_owned(),
                team: "e2e".to_owned(),
                version: None,
                ttl,
                maintenance_window: None,
                exists_ok: false,
            })
            .await
            .expect("create instance");
    }

    /// GET / through Caddy: the status code, or 0 when Caddy did not answer.
    pub async fn get(&self, instance: &str) -> u16 {
        let url = format!("http://{}/", self.listen);
        match self
            .http
            .get(&url)
            .header("host", format!("{SERVICE}.{instance}.localhost"))
            .send()
            .await
        {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        }
    }

    /// The container ACTIVE names for the service, if any.
    pub async fn active_container(&self, instance: &str) -> Option<String> {
        let active = self
            .daemon()
            .ports
            .store
            .load_active(&InstanceName::new(instance))
            .await
            .ok()?;
        active
            .services
            .values()
            .next()
            .map(|s| s.container.as_str().to_owned())
    }
}

/// A second daemon of a harness (see [`Harness::peer`]).
pub struct Peer {
    pub daemon: Arc<Daemon>,
    stop: Option<watch::Sender<bool>>,
    run: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// Abandons its loops without any shutdown, as SIGKILL would (see
    /// [`Harness::kill`]).
    pub async fn kill(&mut self) {
        self.stop.take();
        if let Some(run) = self.run.take() {
            run.abort();
            let _ = run.await;
        }
    }

    /// Stops it as SIGTERM would, and waits for it.
    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        if let Some(run) = self.run.take() {
            tokio::time::timeout(Duration::from_secs(20), run)
                .await
                .expect("peer stops within its shutdown bound")
                .expect("peer task");
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
    }
}

/// Every line the daemon logs, at debug level, to grep (for a secret, a
/// warning, a retirement).
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    /// Installed before the harness's own subscriber (which then stays
    /// out): this test binary's whole log goes here.
    pub fn install() -> CapturedLog {
        let log = CapturedLog::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("stead=debug,info"))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .init();
        log
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Polls `probe` every 50 ms until it holds; panics naming `what` after
/// `limit`. Returns how long it took.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if probe().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {limit:?}");
}

/// `docker inspect --format <format> <id>`.
pub fn inspect(id: &str, format: &str) -> Result<String, String> {
    docker(&["inspect", "--format", format, id])
}

/// `stead run` as its own process, on the config file `dir/stead.toml`,
/// logging (at info) to `dir/daemon.log`. Killed with SIGKILL and reaped
/// when dropped, so a failed assertion leaves no process behind.
pub struct DaemonProcess(std::process::Child);

impl DaemonProcess {
    pub fn spawn(dir: &std::path::Path) -> DaemonProcess {
        use std::process::{Command, Stdio};
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .expect("daemon log");
        let child = Command::new(env!("CARGO_BIN_EXE_stead"))
            .arg("--config")
            .arg(dir.join("stead.toml"))
            .arg("run")
            .env("STEAD_LOG", "info")
            .env_remove("STEAD_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start the stead binary");
        DaemonProcess(child)
    }

    /// SIGKILL (`kill -9`): no shutdown, the lease, locks and anything in
    /// flight are left behind. Waits until the process is reaped.
    pub fn kill_9(&mut self) {
        self.0.kill().expect("kill -9 the daemon");
        self.0.wait().expect("reap the daemon");
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the daemons run on `dir` logged (`DaemonProcess`).
pub fn daemon_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
}

/// The `stead` binary on `dir/stead.toml` with `args`: its standard
/// output; fails the test, with its standard error, unless it succeeds.
pub fn cli(dir: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stead"))
        .arg("--config")
        .arg(dir.join("stead.toml"))
        .args(args)
        .env_remove("STEAD_CONFIG")
        .env_remove("STEAD_LOG")
        .output()
        .expect("run the stead binary");
    assert!(
        output.status.success(),
        "stead {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("stead prints UTF-8")
}

/// Runs the `stead` binary on `config`: its exit status and everything it
/// printed (standard output, then standard error).
pub fn stead_cli(config: &std::path::Path, args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stead"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("STEAD_CONFIG")
        .env_remove("STEAD_LOG")
        .output()
        .expect("run the stead binary");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}
