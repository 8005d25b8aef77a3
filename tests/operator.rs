//! The operator's first hour, end to end: the `stead` binary and
//! `scripts/quickstart` as a newcomer runs them, against the real dockerd,
//! a private Caddy and a SQLite file. What is checked is what the operator
//! sees: what the quickstart prints and leaves running, the daemon's log
//! lines, its metrics, and a catalog reloaded without a restart.

// Deadlines in these tests are wall-clock by nature.
#![allow(clippy::disallowed_methods)]

mod support_services;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support_services::caddy::CaddyProcess;
use support_services::docker::{docker, Cleanup};
use support_services::{free_port, unique};

const STEAD: &str = env!("CARGO_BIN_EXE_stead");
const CONVERGE: Duration = Duration::from_secs(60);

/// A catalog of one type, `web`, at `version`: a busybox httpd with a
/// fast healthcheck and readiness probe.
fn catalog(version: &str) -> String {
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

[types.web.services.healthcheck]
command = ["wget", "-q", "-O-", "http://127.0.0.1:8080/"]
interval_ms = 500
timeout_ms = 2000
retries = 1

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

/// Polls `probe` every 100 ms until it holds; panics naming `what` after
/// `limit`.
fn wait_until(what: &str, limit: Duration, mut probe: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if probe() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: not within {limit:?}");
}

/// GET / through Caddy for `host`: the status code, 0 when nothing answered.
fn get(listen: &str, host: &str) -> u16 {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "2",
        ])
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("http://{listen}/"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn admin_answers(addr: &str) -> bool {
    Command::new("curl")
        .args(["-fsS", "--max-time", "2", &format!("http://{addr}/config/")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A child's output, collected as it comes.
struct Captured(Arc<Mutex<String>>, Option<std::thread::JoinHandle<()>>);

impl Captured {
    fn follow(stream: impl Read + Send + 'static) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        let reader = std::thread::spawn(move || {
            let mut stream = stream;
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Captured(text, Some(reader))
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Everything, once the writer closed the stream (bounded by the
    /// writer's own exit, which the caller waited for).
    fn finish(mut self) -> String {
        if let Some(reader) = self.1.take() {
            reader.join().expect("reader thread");
        }
        self.text()
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) with a pid (or process group) of a child this test
    // started.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid} {signal}");
}

/// Waits (bounded) for `child` to exit; its status code.
fn wait_exit(child: &mut Child, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code().unwrap_or(-1);
        }
        assert!(start.elapsed() < limit, "did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// --- the quickstart ------------------------------------------------------

/// `scripts/quickstart` with its state, ports and instance name private to
/// this test, and the test's binary.
struct Quickstart {
    state: tempfile::TempDir,
    instance: String,
    listen: String,
    admin_listen: String,
}

impl Quickstart {
    fn command(&self, caddy_admin: &str) -> Command {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut command = Command::new(root.join("scripts/quickstart"));
        command
            .current_dir(root)
            .env_remove("STEAD_CONFIG")
            .env("STEAD_BIN", STEAD)
            .env("STEAD_QUICKSTART_INSTANCE", &self.instance)
            .env("STEAD_STATE_DIR", self.state.path())
            .env("STEAD_CADDY__ADMIN", caddy_admin)
            .env("STEAD_CADDY__LISTEN", &self.listen)
            .env("STEAD_ADMIN_LISTEN", &self.admin_listen)
            .env("STEAD_CONTROL__TICK_INTERVAL_S", "1");
        command
    }

    /// Runs it until the instance is served; its output.
    fn run_until_served(&self, caddy_admin: &str) -> String {
        let out = self
            .command(caddy_admin)
            .env("STEAD_QUICKSTART_EXIT_WHEN_SERVED", "1")
            .output()
            .expect("run scripts/quickstart");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "quickstart failed:\n{text}");
        assert!(
            text.contains(&format!(
                "quickstart: serving: curl -H 'Host: http.{}.localhost'",
                self.instance
            )),
            "{text}"
        );
        text
    }

    fn stead(&self, args: &[&str]) -> String {
        let out = Command::new(STEAD)
            .args(["--config", "examples/stead.toml"])
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("STEAD_CONFIG")
            .env("STEAD_STATE_DIR", self.state.path())
            .output()
            .expect("run stead");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn the_quickstart_runs_twice_after_a_delete_and_after_ctrl_c_stopping_only_what_it_started() {
    let instance = unique("qs");
    let _cleanup = Cleanup::new(&instance);
    let caddy = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(CaddyProcess::start());
    let qs = Quickstart {
        state: tempfile::tempdir().unwrap(),
        instance: instance.clone(),
        listen: format!("127.0.0.1:{}", free_port()),
        admin_listen: format!("127.0.0.1:{}", free_port()),
    };

    let first = qs.run_until_served(&caddy.admin_addr);
    assert!(
        first.contains(&format!("created {instance} (web 1")),
        "{first}"
    );
    assert!(
        first.contains("Caddy already answers") && !first.contains("stopping the Caddy"),
        "a Caddy it did not start is used and left alone:\n{first}"
    );
    let second = qs.run_until_served(&caddy.admin_addr);
    assert!(
        second.contains(&format!("{instance} already exists (web 1, ready)")),
        "{second}"
    );
    assert!(
        admin_answers(&caddy.admin_addr),
        "the test's Caddy still runs"
    );

    let deleted = qs.stead(&["instance", "delete", &instance]);
    assert!(
        deleted.starts_with(&format!("deleting {instance}")),
        "{deleted}"
    );
    let third = qs.run_until_served(&caddy.admin_addr);
    assert!(
        third.contains(&format!(
            "{instance} is still being deleted; finishing that first"
        )),
        "{third}"
    );
    assert!(
        third.contains(&format!("created {instance} (web 1")),
        "{third}"
    );
    let listed = qs.stead(&["instance", "list", "--all", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(rows.len(), 1, "the deleted row gave its name up:\n{listed}");

    // Without a Caddy it starts one, and on Ctrl-C stops the daemon and
    // that Caddy, and only that.
    let own_caddy = format!("127.0.0.1:{}", free_port());
    let mut child = qs
        .command(&own_caddy)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/quickstart");
    let out = Captured::follow(child.stdout.take().unwrap());
    let err = Captured::follow(child.stderr.take().unwrap());
    wait_until("served", CONVERGE, || {
        out.text().contains("quickstart: serving")
    });
    // "serving" can come before the daemon is up: the test's own Caddy
    // still routes the instance from the runs before, so the script's
    // first probe succeeds at once. Ctrl-C is meant for a running daemon.
    wait_until("the daemon leads", CONVERGE, || {
        err.text().contains("reconciler lease taken by")
    });
    assert!(admin_answers(&own_caddy));
    signal(-(child.id() as i32), libc::SIGINT);
    let code = wait_exit(&mut child, Duration::from_secs(30));
    let (out, err) = (out.finish(), err.finish());
    let text = out + &err;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("stopping the Caddy it started"), "{text}");
    assert!(text.contains("reconciler lease released"), "{text}");
    assert!(!admin_answers(&own_caddy), "its own Caddy is stopped");
    assert!(admin_answers(&caddy.admin_addr), "the test's Caddy is not");
    let pid = Command::new("pgrep")
        .args(["-f", &format!("{STEAD} --config examples/stead.toml run")])
        .output()
        .unwrap();
    assert!(pid.stdout.is_empty(), "no daemon left running");
}

// --- a daemon as a process ------------------------------------------------

/// `stead run` as a process with its own config, SQLite file and admin
/// port, against a private Caddy; its standard error captured.
struct DaemonProcess {
    dir: tempfile::TempDir,
    config: PathBuf,
    catalog: PathBuf,
    admin: String,
    listen: String,
    child: Child,
    log: Captured,
    _caddy: CaddyProcess,
}

impl DaemonProcess {
    async fn start() -> Self {
        Self::start_after(|_| {}).await
    }

    /// [`DaemonProcess::start`], with `prepare` run on the config file
    /// after it is written and before the daemon starts.
    async fn start_after(prepare: impl FnOnce(&Path)) -> Self {
        let caddy = CaddyProcess::start().await;
        let dir = tempfile::tempdir().unwrap();
        let catalog = dir.path().join("catalog.toml");
        std::fs::write(&catalog, catalog_text("1")).unwrap();
        let admin = format!("127.0.0.1:{}", free_port());
        let listen = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("stead.toml");
        std::fs::write(
            &config,
            format!(
                r#"state_dir = "{state}"
catalog = "catalog.toml"
admin_listen = "{admin}"
worker_idle_poll_ms = 100
[control]
tick_interval_s = 1
lease_s = 10
provisioner_timeout_s = 5
[caddy]
admin = "{caddy}"
listen = "{listen}"
"#,
                state = dir.path().display(),
                caddy = caddy.admin_addr,
            ),
        )
        .unwrap();
        prepare(&config);
        let (child, log) = spawn_daemon(&config, None);
        let mut daemon = Self {
            dir,
            config,
            catalog,
            admin,
            listen,
            child,
            log,
            _caddy: caddy,
        };
        daemon.wait_for_lease();
        daemon
    }

    /// Waits for the lease; a daemon that exited instead fails the test at
    /// once, with its log (not after the whole wait).
    fn wait_for_lease(&mut self) {
        let (child, log) = (&mut self.child, &self.log);
        wait_until("the daemon leads", CONVERGE, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the daemon exited ({status}) before leading:\n{}",
                    log.text()
                );
            }
            log.text().contains("reconciler lease taken")
        });
    }

    /// Stops the daemon (SIGTERM) and starts a new process on the same
    /// config and database, logging at `filter`; returns the old log.
    fn restart(&mut self, filter: &str) -> String {
        assert_eq!(self.stop(), 0);
        let old = self.finish_log();
        let (child, log) = spawn_daemon(&self.config, Some(filter));
        self.child = child;
        self.log = log;
        self.wait_for_lease();
        old
    }

    /// Runs the CLI against this daemon's config.
    fn stead(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(STEAD)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env_remove("STEAD_CONFIG")
            .output()
            .expect("run stead");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.stead(args);
        assert_eq!(code, 0, "{args:?}\n{out}{err}");
        out
    }

    fn served(&self, instance: &str) -> bool {
        get(&self.listen, &format!("http.{instance}.localhost")) == 200
    }

    fn container(&self, instance: &str) -> String {
        let out = docker(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=stead.instance={instance}"),
        ])
        .unwrap();
        out.lines().next().expect("a container").to_owned()
    }

    fn metrics(&self) -> String {
        let out = Command::new("curl")
            .args([
                "-fsS",
                "--max-time",
                "5",
                &format!("http://{}/metrics", self.admin),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The whole log, once the process has exited.
    fn finish_log(&mut self) -> String {
        std::mem::replace(&mut self.log, Captured(Default::default(), None)).finish()
    }

    /// SIGTERM and a bounded wait.
    fn stop(&mut self) -> i32 {
        signal(self.child.id() as i32, libc::SIGTERM);
        wait_exit(&mut self.child, Duration::from_secs(30))
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

/// `stead run` on `config`; its standard error followed.
fn spawn_daemon(config: &Path, filter: Option<&str>) -> (Child, Captured) {
    let mut command = Command::new(STEAD);
    command
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_remove("STEAD_CONFIG")
        .env_remove("STEAD_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(filter) = filter {
        command.env("STEAD_LOG", filter);
    }
    let mut child = command.spawn().expect("run stead");
    let log = Captured::follow(child.stderr.take().unwrap());
    (child, log)
}

fn catalog_text(version: &str) -> String {
    catalog(version)
}

/// Lines of `log` that mention `needle`.
fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_container_logs_its_withdrawal_start_and_publication_and_a_restart_does_not_blink()
{
    let name = unique("oplog");
    let _cleanup = Cleanup::new(&name);
    let mut d = DaemonProcess::start().await;
    d.ok(&["instance", "create", &name, "--type", "web"]);
    wait_until("served", CONVERGE, || d.served(&name));
    let id = d.container(&name);
    let before = d.log.text().len();

    docker(&["kill", &id]).unwrap();
    wait_until("withdrawn", Duration::from_secs(10), || {
        get(&d.listen, &format!("http.{name}.localhost")) == 404
    });
    wait_until("served again", CONVERGE, || d.served(&name));
    // Traffic flows as soon as Caddy has the route; the daemon logs the
    // publication once Caddy's answer is back, a moment later.
    let published = format!("published {name}/http");
    wait_until("publication logged", Duration::from_secs(10), || {
        d.log.text()[before..].contains(&published)
    });
    let log = d.log.text()[before..].to_owned();
    let withdrew = lines_with(&log, &format!("withdrew {name}/http"));
    let started = lines_with(
        &log,
        &format!("started {name}/http: the container was exited"),
    );
    let published = lines_with(&log, &format!("published {name}/http"));
    for (what, lines) in [
        ("withdrawal", &withdrew),
        ("start", &started),
        ("publication", &published),
    ] {
        assert!(!lines.is_empty(), "no {what} line:\n{log}");
        assert!(
            lines.iter().all(|l| l.contains(" INFO ")),
            "{what} not at info:\n{log}"
        );
    }
    assert!(
        withdrew[0].contains("(R8)"),
        "why it was withdrawn: {}",
        withdrew[0]
    );
    assert!(!log.contains('\u{1b}'), "no colours into a pipe:\n{log}");

    // Every series has # HELP, and the counters an alert needs exist.
    let metrics = d.metrics();
    let mut typed = 0;
    for line in metrics.lines().filter(|l| l.starts_with("# TYPE ")) {
        typed += 1;
        let metric = line.split_whitespace().nth(2).unwrap();
        assert!(
            metrics.contains(&format!("# HELP {metric} ")),
            "{metric}:\n{metrics}"
        );
    }
    assert!(typed >= 15, "{metrics}");
    assert!(
        metrics.contains("stead_publication_failures_total{reason=\"new_execution\"} 0"),
        "{metrics}"
    );
    let starts: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("stead_starts_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(starts >= 1.0, "{metrics}");

    // A restarted daemon republishes the unchanged execution without
    // withdrawing it first (R17): no blink of traffic.
    let log = d.restart("stead=debug");
    assert!(log.contains("reconciler lease released"), "{log}");
    let republished = format!("published {name}/http");
    wait_until("republished", CONVERGE, || {
        d.log.text().contains(&republished)
    });
    let log = d.log.text();
    let line = lines_with(&log, &republished)[0].to_owned();
    assert!(line.contains("its route was not known to be up"), "{line}");
    assert!(
        lines_with(&log, &format!("{name}/http"))
            .iter()
            .all(|l| !l.contains("withdr")),
        "an unchanged execution was withdrawn after a restart:\n{log}"
    );
    assert_eq!(d.stop(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_edit_is_refused_when_bad_and_with_sighup_plans_the_upgrade_without_a_restart() {
    let name = unique("opreload");
    let _cleanup = Cleanup::new(&name);
    let mut d = DaemonProcess::start().await;
    d.ok(&["instance", "create", &name, "--type", "web"]);
    wait_until("served", CONVERGE, || d.served(&name));

    // A bad edit is refused by `stead reload` and the running catalog kept.
    std::fs::write(
        &d.catalog,
        catalog_text("2").replace("ports = [8080]", "ports = [0]"),
    )
    .unwrap();
    let (code, out, err) = d.stead(&["reload"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("reload refused; the daemon keeps catalog web 1")
            && err.contains("types.web.services[0].ports[0] = 0"),
        "{err}"
    );
    let check = d.stead(&["check"]);
    assert_eq!(check.0, 1, "check sees the bad file too: {check:?}");

    // A good edit and SIGHUP: reloaded, and the next tick plans the upgrade.
    std::fs::write(&d.catalog, catalog_text("2")).unwrap();
    let noted = d.ok(&["check"]);
    assert!(
        noted.contains("runs catalog"),
        "check says the daemon is behind: {noted}"
    );
    signal(d.child.id() as i32, libc::SIGHUP);
    wait_until("reloaded", Duration::from_secs(10), || {
        d.log.text().contains("catalog reloaded: web 1 -> 2")
    });
    wait_until("upgrade planned", Duration::from_secs(20), || {
        d.log.text().contains(&format!("upgrade of {name}"))
    });
    wait_until("upgraded", CONVERGE, || {
        let shown = d.ok(&["instance", "show", &name]);
        shown.contains("version: 2") && d.served(&name)
    });
    let status: serde_json::Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(status["catalog"][0]["version"], "2");
    assert_eq!(status["catalog"][0]["pending"], serde_json::json!([]));
    let live: serde_json::Value =
        serde_json::from_str(&d.ok(&["status", "--live", "--json"])).unwrap();
    assert_eq!(live["source"], "daemon");
    assert_eq!(live["budgets_live"], true);
    let tasks = d.ok(&["task", "list", "--all"]);
    assert!(tasks.contains("upgrade"), "{tasks}");
    assert_eq!(d.stop(), 0);
}

/// What a database says of its fleet through the CLI, read from the
/// database alone: the instances, the tasks, each instance's ACTIVE
/// services, and each type's rollout.
fn fleet(d: &DaemonProcess, names: &[&str]) -> Vec<serde_json::Value> {
    let json = |args: &[&str]| -> serde_json::Value { serde_json::from_str(&d.ok(args)).unwrap() };
    let mut fleet = vec![
        json(&["instance", "list", "--all", "--json"]),
        json(&["task", "list", "--all", "--json"]),
        json(&["status", "--json"])["catalog"].clone(),
    ];
    for name in names {
        fleet.push(json(&["instance", "show", name, "--json"])["services"].clone());
    }
    fleet
}

/// `stead backup` of a SQLite fleet while its daemon runs, and `stead
/// restore` of it into a new database: a daemon on the restored database
/// serves the same instances from the same containers, with the same
/// versions, tasks and rollout. A restore over a database its daemon
/// still leads is refused, and so is a backup over an existing file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_backed_up_while_its_daemon_runs_is_served_again_from_the_restored_database() {
    let (a, b) = (unique("bka"), unique("bkb"));
    let _cleanup = (Cleanup::new(&a), Cleanup::new(&b));
    let mut d = DaemonProcess::start().await;
    d.ok(&["instance", "create", &a, "--type", "web"]);
    d.ok(&[
        "instance", "create", &b, "--type", "web", "--ttl-s", "86400",
    ]);
    wait_until("both served", CONVERGE, || d.served(&a) && d.served(&b));
    wait_until("provisions done", CONVERGE, || {
        !d.ok(&["task", "list"]).contains("provision")
    });
    d.ok(&[
        "rollout",
        "halt",
        "web",
        "--reason",
        "frozen for the backup",
    ]);
    let containers = (d.container(&a), d.container(&b));
    let before = fleet(&d, &[&a, &b]);

    let backup = d.dir.path().join("backups/stead-backup.db");
    std::fs::create_dir(backup.parent().unwrap()).unwrap();
    let backup_arg = backup.to_str().unwrap();
    let said = d.ok(&["backup", backup_arg]);
    assert!(
        said.contains(&format!("to {backup_arg}: 2 instance(s), schema ")),
        "{said}"
    );
    assert_eq!(
        std::fs::read_dir(backup.parent().unwrap()).unwrap().count(),
        1,
        "the backup alone, no partial file or WAL beside it"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&backup).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a backup is its owner's only");
    }
    let (code, out, err) = d.stead(&["backup", backup_arg]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        err.contains("already exists; choose another file, or pass --force"),
        "{err}"
    );
    let (code, out, err) = d.stead(&["restore", backup_arg, "--force"]);
    assert_eq!(code, 4, "a restore under a running daemon: {out}{err}");
    assert!(
        err.contains("holds the reconciler lease") && err.contains("stop every stead process"),
        "{err}"
    );
    assert!(d.served(&a), "the refused restore changed nothing");
    assert_eq!(fleet(&d, &[&a, &b]), before, "the fleet held still");
    assert_eq!(d.stop(), 0);

    let restored = DaemonProcess::start_after(|config| {
        let out = Command::new(STEAD)
            .arg("--config")
            .arg(config)
            .args(["restore", backup_arg])
            .env_remove("STEAD_CONFIG")
            .output()
            .expect("run stead restore");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("2 instance(s), schema "), "{text}");
    })
    .await;
    wait_until("served from the restored database", CONVERGE, || {
        restored.served(&a) && restored.served(&b)
    });
    assert_eq!(fleet(&restored, &[&a, &b]), before);
    assert_eq!(
        (restored.container(&a), restored.container(&b)),
        containers,
        "the same containers, adopted, not made again"
    );
    let status: serde_json::Value =
        serde_json::from_str(&restored.ok(&["status", "--json"])).unwrap();
    assert!(
        status.to_string().contains("frozen for the backup"),
        "the halted rollout came back with its reason: {status}"
    );
}
