//! The `stead` binary as an operator meets it: `check`, `--help`, exit
//! codes, what every command prints, listings and their `--json`, a closed
//! standard output, and bad input refused with its field and value. These
//! need no Docker or Caddy (instances are written, never provisioned).

// Bounds on the commands' run time are wall-clock by nature.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

/// What one run of the binary did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn text(&self) -> String {
        format!(
            "exit {}\nstdout:\n{}stderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stead"));
    command
        .args(args)
        .env_remove("STEAD_CONFIG")
        .env_remove("STEAD_LOG");
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

fn stead(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = command(args, env).output().expect("run stead");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn example_catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/catalog.toml")
}

/// A config on a fresh SQLite file with the example catalog, no admin
/// endpoints, no daemon.
struct Setup {
    dir: tempfile::TempDir,
    config: String,
}

impl Setup {
    /// On the notes example's catalog (two services, a parameter, named
    /// volumes), with the grant of its secret's directory that
    /// `examples/notes/stead.toml` gives.
    fn notes() -> Self {
        let s = Self::new();
        let notes = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/notes/catalog.toml");
        let text = std::fs::read_to_string(&s.config).unwrap().replace(
            &example_catalog().display().to_string(),
            &notes.display().to_string(),
        ) + "[grants]\nsecret_dirs = [\"/tmp/stead-example/notes\"]\n";
        std::fs::write(&s.config, text).unwrap();
        s
    }

    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("stead.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\ncatalog = \"{}\"\nadmin_listen = \"\"\n",
                dir.path().display(),
                example_catalog().display()
            ),
        )
        .unwrap();
        let config = config.to_str().unwrap().to_owned();
        Self { dir, config }
    }

    fn run(&self, args: &[&str]) -> Run {
        let mut all = vec!["--config", self.config.as_str()];
        all.extend_from_slice(args);
        stead(&all, &[])
    }

    fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args);
        assert_eq!(run.code, 0, "{args:?}\n{}", run.text());
        run.stdout
    }

    fn url(&self) -> String {
        format!(
            "sqlite://{}?mode=rwc",
            self.dir.path().join("stead.db").display()
        )
    }
}

#[test]
fn check_accepts_the_example_files_and_resolves_the_catalog_next_to_the_config() {
    let run = stead(&["--config", "examples/stead.toml", "check"], &[]);
    assert_eq!(run.code, 0, "{}", run.text());
    let catalog = example_catalog();
    assert!(
        run.stdout.contains(&format!(
            "catalog {}: ok (1 service types: web 1)",
            catalog.display()
        )),
        "{}",
        run.text()
    );
}

#[test]
fn check_names_file_line_field_and_value_of_a_bad_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(&catalog, "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"Bad Name\"\nimage = \"x\"\n").unwrap();
    let run = stead(
        &["--config", "examples/stead.toml", "check"],
        &[("STEAD_CATALOG", catalog.to_str().unwrap())],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains(&format!(
            "{}: line 4: types.web.services[0].name = \"Bad Name\"",
            catalog.display()
        )),
        "{}",
        run.text()
    );
}

#[test]
fn check_refuses_a_helm_type_whose_calls_would_outlive_the_task_lease() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(
        &catalog,
        "[types.search]\nversion = \"1\"\nprovisioner = \"helm\"\n[types.search.helm]\nchart = \"c/s\"\nnamespace = \"t-{instance}\"\n",
    )
    .unwrap();
    let config = dir.path().join("stead.toml");
    std::fs::write(
        &config,
        "[control]\nlease_s = 120\nprovisioner_timeout_s = 60\n\
         [grants]\nhelm_charts = [\"c/s\"]\nhelm_namespace_prefix = \"t-\"\n",
    )
    .unwrap();
    let run = stead(
        &["--config", config.to_str().unwrap(), "check"],
        &[("STEAD_CATALOG", catalog.to_str().unwrap())],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    for expected in [
        "type search is provisioned by helm",
        "control.lease_s (120)",
        "helm.wait_timeout_s (300)",
    ] {
        assert!(run.stderr.contains(expected), "{expected}: {}", run.text());
    }
    // With a lease that outlives helm's call it is fine.
    std::fs::write(
        &config,
        "[control]\nlease_s = 400\n\
         [grants]\nhelm_charts = [\"c/s\"]\nhelm_namespace_prefix = \"t-\"\n",
    )
    .unwrap();
    let run = stead(
        &["--config", config.to_str().unwrap(), "check"],
        &[("STEAD_CATALOG", catalog.to_str().unwrap())],
    );
    assert_eq!(run.code, 0, "{}", run.text());
}

#[test]
fn check_refuses_a_catalog_mounting_the_docker_socket_without_a_grant() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(
        &catalog,
        "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"web\"\nimage = \"x:1\"\n\
         volumes = [{ host_path = \"/var/run/docker.sock\", path = \"/var/run/docker.sock\" }]\n",
    )
    .unwrap();
    let config = dir.path().join("stead.toml");
    std::fs::write(&config, "admin_listen = \"\"\n").unwrap();
    let check = |config_text: &str| {
        std::fs::write(&config, config_text).unwrap();
        stead(
            &["--config", config.to_str().unwrap(), "check"],
            &[("STEAD_CATALOG", catalog.to_str().unwrap())],
        )
    };
    let run = check("admin_listen = \"\"\n");
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains(&format!(
            "{}: line 6: types.web.services[0].volumes[0].host_path = \"/var/run/docker.sock\": \
             not granted: grants.host_path_prefixes in stead.toml is empty",
            catalog.display()
        )),
        "{}",
        run.text()
    );
    // A grant of another directory does not cover it, and says what is granted.
    let run = check("admin_listen = \"\"\n[grants]\nhost_path_prefixes = [\"/srv/stead\"]\n");
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr
            .contains("not under any of grants.host_path_prefixes in stead.toml (/srv/stead/)"),
        "{}",
        run.text()
    );
    // Only an operator who grants the socket's directory lets it through.
    let run = check("admin_listen = \"\"\n[grants]\nhost_path_prefixes = [\"/var/run\"]\n");
    assert_eq!(run.code, 0, "{}", run.text());
}

#[test]
fn a_bad_config_value_exits_1_naming_the_variable_that_set_it() {
    let run = stead(
        &["--config", "examples/stead.toml", "check"],
        &[("STEAD_WORKERS", "1000")],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains(
            "stead: config: environment variable STEAD_WORKERS: workers = 1000: must be between 0 and 64"
        ),
        "{}",
        run.text()
    );
}

#[test]
fn a_device_given_as_config_fails_within_a_second_with_a_clear_error() {
    let started = Instant::now();
    let run = stead(&["--config", "/dev/zero", "check"], &[]);
    let took = started.elapsed();
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(
        run.stderr.trim(),
        "stead: config: /dev/zero: is a character device, not a regular file; stead reads its \
         configuration from regular files only"
    );
}

#[test]
fn a_fifo_given_as_config_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stead.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let started = Instant::now();
    let run = stead(&["--config", fifo.to_str().unwrap(), "check"], &[]);
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        run.stderr
            .contains("is a FIFO (named pipe), not a regular file"),
        "{}",
        run.text()
    );
}

#[test]
fn an_in_memory_database_is_refused_at_load() {
    let run = stead(
        &["--config", "examples/stead.toml", "check"],
        &[("STEAD_DATABASE_URL", "sqlite::memory:")],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains("an in-memory SQLite database is lost"),
        "{}",
        run.text()
    );
}

#[test]
fn help_lists_every_command_and_a_closed_pipe_is_not_an_error() {
    let run = stead(&["--help"], &[]);
    assert_eq!(run.code, 0);
    for command in [
        "run", "tick", "migrate", "status", "check", "reload", "plan", "instance", "task",
        "rollout", "events", "timeline",
    ] {
        assert!(
            run.stdout.contains(command),
            "{command} missing:\n{}",
            run.stdout
        );
    }
    let quiet = closed_pipe(&["--help"]);
    assert_eq!(quiet.code, 0, "{}", quiet.text());
}

#[test]
fn a_wrong_command_line_exits_2() {
    let run = stead(&["instance", "frobnicate"], &[]);
    assert_eq!(run.code, 2, "{}", run.text());
    let ttl = stead(
        &["instance", "create", "a", "--type", "web", "--ttl-s", "0"],
        &[],
    );
    assert_eq!(ttl.code, 2, "{}", ttl.text());
    assert!(
        ttl.stderr.contains("0 s: must be between 60 s and"),
        "{}",
        ttl.text()
    );
}

/// Runs stead with its standard output's reading end closed before it
/// writes anything, as `| head -1` and `| grep -q` leave it.
fn closed_pipe(args: &[&str]) -> Run {
    let mut child = command(args, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run stead");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for stead");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn a_listing_into_a_closed_pipe_exits_0_quietly() {
    let s = Setup::new();
    for name in ["alpha", "beta", "gamma"] {
        s.ok(&["instance", "create", name, "--type", "web"]);
    }
    for args in [
        ["instance", "list"].as_slice(),
        &["instance", "list", "--json"],
        &["task", "list"],
        &["instance", "show", "alpha"],
    ] {
        let mut all = vec!["--config", s.config.as_str()];
        all.extend_from_slice(args);
        let run = closed_pipe(&all);
        assert_eq!(run.code, 0, "{args:?}\n{}", run.text());
        assert!(!run.stderr.contains("panicked"), "{}", run.text());
    }
    // And through a real shell pipe, as the issue reported it.
    let shell = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; '{}' --config '{}' instance list | head -1",
            env!("CARGO_BIN_EXE_stead"),
            s.config
        ))
        .output()
        .unwrap();
    assert!(shell.status.success(), "{shell:?}");
}

#[test]
fn every_mutating_command_says_what_it_did() {
    let s = Setup::new();
    let created = s.ok(&[
        "instance", "create", "demo", "--type", "web", "--team", "ops",
    ]);
    assert_eq!(
        created.trim(),
        "created demo (web 1, team ops); provision queued as task 1"
    );
    let again = s.ok(&["instance", "create", "demo", "--type", "web", "--exists-ok"]);
    assert_eq!(
        again.trim(),
        "demo already exists (web 1, provisioning); nothing to do"
    );
    let taken = s.run(&["instance", "create", "demo", "--type", "web"]);
    assert_eq!(taken.code, 4, "{}", taken.text());
    assert!(
        taken
            .stderr
            .contains("an instance named demo already exists"),
        "{}",
        taken.text()
    );
    assert!(s
        .ok(&["instance", "stop", "demo"])
        .contains("demo: stopped intent recorded"));
    assert!(s
        .ok(&["instance", "stop", "demo"])
        .contains("already stopped; nothing to do"));
    assert!(s
        .ok(&["instance", "start", "demo"])
        .contains("demo: running intent recorded"));
    assert_eq!(
        s.ok(&["instance", "release", "demo", "--service", "http"])
            .trim(),
        "released 0 hold(s) on demo/http"
    );
    assert!(s
        .ok(&["rollout", "halt", "web", "--reason", "bad build"])
        .contains("web: rollout halted (bad build)"));
    assert!(s
        .ok(&["rollout", "resume", "web"])
        .contains("web: rollout resumed"));
    // Nothing bakes (demo was never upgraded): undo halts and says so.
    let undo = s.ok(&["rollout", "undo", "web"]);
    assert!(
        undo.contains("web: rollout halted (operator: rollout undo)")
            && undo.contains("nothing to undo for demo"),
        "{undo}"
    );
    assert!(s
        .ok(&["rollout", "resume", "web"])
        .contains("web: rollout resumed"));
    // No daemon ran here: nothing is recorded to go back to, and an undo
    // to an unknown version is refused, naming what is recorded, with
    // nothing changed.
    assert!(s
        .ok(&["rollout", "versions", "web"])
        .contains("web: no version recorded yet"));
    let unknown = s.run(&["rollout", "undo", "web", "--to", "0.9"]);
    assert_eq!(unknown.code, 3, "{}", unknown.text());
    assert!(
        unknown
            .stderr
            .contains("version \"0.9\" of type web is not recorded (recorded: none)"),
        "{}",
        unknown.text()
    );
    assert!(!s.ok(&["status"]).contains("halted"));
    assert_eq!(
        s.ok(&["instance", "delete", "demo"]).trim(),
        "deleting demo: deprovision queued as task 2; cancelled queued task(s) 1 (T4, docs/rules.md#t4)"
    );
    assert_eq!(
        s.ok(&["instance", "delete", "demo"]).trim(),
        "demo is already being deleted"
    );
    let migrated = s.ok(&["migrate"]);
    let known = std::fs::read_dir("migrations/sqlite")
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count();
    assert!(
        migrated.contains(&format!(
            "schema up to date ({known} migration(s), none applied now)"
        )),
        "{migrated}"
    );
}

#[test]
fn a_fresh_database_is_migrated_and_says_which_migrations_it_applied() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("new.db").display());
    let run = stead(
        &["--config", "examples/stead.toml", "migrate"],
        &[("STEAD_DATABASE_URL", &url)],
    );
    assert_eq!(run.code, 0, "{}", run.text());
    assert!(
        run.stdout
            .contains("applied migration 20261130000001 initial"),
        "{}",
        run.text()
    );
}

/// #54: a catalog a reload would refuse is refused at start too (judged
/// against what live instances run, as recorded), reported by `check`,
/// and applied only with `run --force-catalog`.
#[test]
fn a_catalog_a_reload_would_refuse_is_refused_at_start_unless_forced() {
    let s = Setup::new();
    s.ok(&["instance", "create", "a", "--type", "web"]);
    // The first start records the version live instances run.
    let first = s.run(&["tick"]);
    assert!(
        !first.stderr.contains("refused at start"),
        "{}",
        first.text()
    );
    // The service renamed: every instance would start it on empty volumes.
    let renamed = s.dir.path().join("renamed.toml");
    let text = std::fs::read_to_string(example_catalog())
        .unwrap()
        .replace("name = \"http\"", "name = \"www\"");
    std::fs::write(&renamed, text).unwrap();
    let config = std::fs::read_to_string(&s.config).unwrap().replace(
        &example_catalog().display().to_string(),
        &renamed.display().to_string(),
    );
    std::fs::write(&s.config, config).unwrap();

    let check = s.run(&["check"]);
    assert_eq!(check.code, 1, "{}", check.text());
    assert!(
        check.stderr.contains("types.web.services: http -> www")
            && check.stderr.contains("--force-catalog"),
        "{}",
        check.text()
    );
    let refused = s.run(&["tick"]);
    assert_eq!(refused.code, 1, "{}", refused.text());
    assert!(
        refused
            .stderr
            .contains("refused at start, as a reload would be")
            && refused.stderr.contains("http -> www"),
        "{}",
        refused.text()
    );
    let forced = s.run(&["run", "--once", "--role", "reconciler", "--force-catalog"]);
    assert!(
        !forced.stderr.contains("refused at start"),
        "{}",
        forced.text()
    );
    assert!(
        forced.stderr.contains("catalog forced at start"),
        "{}",
        forced.text()
    );
    // Forced once, it is what live instances run now: no longer a hazard
    // (`check` judges as the start does).
    let after = s.run(&["check"]);
    assert_eq!(after.code, 0, "{}", after.text());
}

/// #54: the database stead creates, and the state directory it creates
/// for it, are the owner's alone; so is a backup.
#[test]
fn the_state_directory_database_and_backups_are_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state_arg = state.display().to_string();
    let run = stead(
        &["--config", "examples/stead.toml", "migrate"],
        &[("STEAD_STATE_DIR", &state_arg)],
    );
    assert_eq!(run.code, 0, "{}", run.text());
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700, "{}", state.display());
    let database = state.join("stead.db");
    assert_eq!(mode(&database), 0o600, "{}", database.display());
    let backup = dir.path().join("backup.db");
    let backup_arg = backup.display().to_string();
    let run = stead(
        &["--config", "examples/stead.toml", "backup", &backup_arg],
        &[("STEAD_STATE_DIR", &state_arg)],
    );
    assert_eq!(run.code, 0, "{}", run.text());
    assert_eq!(mode(&backup), 0o600, "{}", backup.display());
}

#[test]
fn bad_arguments_are_refused_naming_field_and_value_and_exit_2() {
    let s = Setup::new();
    let version = s.run(&[
        "instance",
        "create",
        "a",
        "--type",
        "web",
        "--version",
        "99",
    ]);
    assert_eq!(version.code, 2, "{}", version.text());
    assert!(
        version
            .stderr
            .contains("--version \"99\": the catalog has web at version \"1\" only"),
        "{}",
        version.text()
    );
    let name = s.run(&["instance", "create", "Bad_Name", "--type", "web"]);
    assert_eq!(name.code, 2, "{}", name.text());
    assert!(
        name.stderr
            .contains("instance name = \"Bad_Name\": must be a DNS label"),
        "{}",
        name.text()
    );
    let kind = s.run(&["instance", "create", "a", "--type", "wbe"]);
    assert_eq!(kind.code, 2, "{}", kind.text());
    assert!(
        kind.stderr
            .contains("service type \"wbe\" is not in the catalog (known: web)"),
        "{}",
        kind.text()
    );
    let window = s.run(&[
        "instance",
        "create",
        "a",
        "--type",
        "web",
        "--window",
        "sunday 3-5",
    ]);
    assert_eq!(window.code, 2, "{}", window.text());
    assert!(
        window.stderr.contains("--window \"sunday 3-5\""),
        "{}",
        window.text()
    );
    let missing = s.run(&["instance", "stop", "nope"]);
    assert_eq!(missing.code, 3, "not found: {}", missing.text());
    assert!(
        missing.stderr.contains("no instance named \"nope\""),
        "{}",
        missing.text()
    );
}

#[test]
fn each_kind_of_refusal_has_its_own_exit_code() {
    let s = Setup::new();
    s.ok(&["instance", "create", "a", "--type", "web"]);
    // The name is taken: a conflict (4), and nothing changed.
    let taken = s.run(&["instance", "create", "a", "--type", "web"]);
    assert_eq!(taken.code, 4, "{}", taken.text());
    assert!(
        taken.stderr.contains("an instance named a already exists"),
        "{}",
        taken.text()
    );
    // Safe to run twice: with --exists-ok the same request succeeds.
    s.ok(&["instance", "create", "a", "--type", "web", "--exists-ok"]);
    // No such service on an existing instance: not found (3).
    let service = s.run(&["instance", "inhibit", "a", "--service", "nope"]);
    assert_eq!(service.code, 3, "{}", service.text());
    // The holds upgrades take are theirs alone.
    for reason in ["retirement-pending", "service-dropped"] {
        let reserved = s.run(&[
            "instance",
            "inhibit",
            "a",
            "--service",
            "web",
            "--reason",
            reason,
        ]);
        assert!(
            reserved.stderr.contains("is reserved for upgrades"),
            "{reason}: {}",
            reserved.text()
        );
    }
    // An instance being deleted refuses a change of intent: a conflict.
    s.ok(&["instance", "delete", "a"]);
    let deleting = s.run(&["instance", "stop", "a"]);
    assert_eq!(deleting.code, 4, "{}", deleting.text());
    assert!(
        deleting.stderr.contains("a is deleting"),
        "{}",
        deleting.text()
    );
}

/// The two examples run one after the other, in the README's order, on one
/// state directory: `scripts/quickstart` gives each its own default
/// instance name, and creating both (twice, as reruns do) succeeds.
#[test]
fn the_quickstart_examples_have_their_own_instances_and_compose() {
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/quickstart"))
            .unwrap();
    let names: Vec<&str> = script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("default_instance="))
        .collect();
    assert_eq!(
        names.len(),
        2,
        "one default instance per example: {names:?}"
    );
    assert_ne!(names[0], names[1], "the examples' instances must differ");
    let (web, notes) = (Setup::new(), Setup::notes());
    // The notes example's config, on the web example's database.
    let text = std::fs::read_to_string(&notes.config).unwrap().replace(
        &notes.dir.path().display().to_string(),
        &web.dir.path().display().to_string(),
    );
    let notes_config = web.dir.path().join("notes.toml");
    std::fs::write(&notes_config, text).unwrap();
    let notes_config = notes_config.to_str().unwrap();
    for _ in 0..2 {
        web.ok(&[
            "instance",
            "create",
            names[0],
            "--type",
            "web",
            "--exists-ok",
        ]);
        let run = stead(
            &[
                "--config",
                notes_config,
                "instance",
                "create",
                names[1],
                "--type",
                "notes",
                "--exists-ok",
            ],
            &[],
        );
        assert_eq!(run.code, 0, "{}", run.text());
    }
    let listed = web.ok(&["instance", "list"]);
    assert!(
        listed.contains(names[0]) && listed.contains(names[1]),
        "{listed}"
    );
    // A name another example's instance took is refused with the way out.
    let taken = stead(
        &[
            "--config",
            notes_config,
            "instance",
            "create",
            names[0],
            "--type",
            "notes",
            "--exists-ok",
        ],
        &[],
    );
    assert_eq!(taken.code, 4, "{}", taken.text());
    assert!(
        taken.stderr.contains("already exists with service type")
            && taken.stderr.contains("choose another name")
            && taken
                .stderr
                .contains(&format!("`stead instance delete {}`", names[0])),
        "{}",
        taken.text()
    );
}

#[test]
fn every_command_naming_a_missing_instance_exits_3_naming_it() {
    let s = Setup::new();
    // Another instance exists, so the store is not simply empty.
    s.ok(&["instance", "create", "a", "--type", "web"]);
    let commands: [&[&str]; 12] = [
        &["timeline", "nope"],
        &["events", "--instance", "nope"],
        &["instance", "show", "nope"],
        &["instance", "why", "nope"],
        &["instance", "show", "nope", "--json"],
        &["instance", "stop", "nope"],
        &["instance", "start", "nope"],
        &["instance", "retry", "nope"],
        &["instance", "delete", "nope"],
        &["instance", "delete", "nope", "--purge-volumes"],
        &["instance", "inhibit", "nope", "--service", "http"],
        &["instance", "release", "nope", "--service", "http"],
    ];
    for args in commands {
        let run = s.run(args);
        assert_eq!(run.code, 3, "{args:?}: {}", run.text());
        assert!(
            run.stderr.contains("no instance named \"nope\""),
            "{args:?}: {}",
            run.text()
        );
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.text());
    }
}

/// A command against a Postgres database that was never migrated, or was
/// migrated by an older stead, names the database and says to run
/// `stead migrate`, with its own exit status; after the migration the same
/// command works. (SQLite is migrated whenever it is opened, so only a
/// Postgres database can be behind.)
#[tokio::test]
async fn a_postgres_database_without_the_current_schema_says_to_run_migrate_and_exits_7() {
    use sqlx::Connection;
    let url = support::fresh_postgres_database().await;
    let database = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let commands: [&[&str]; 3] = [
        &["instance", "list"],
        &["instance", "show", "demo"],
        &["task", "list"],
    ];
    let expect_no_schema = |when: &str| {
        for args in commands {
            let mut all = vec!["--config", "examples/stead.toml"];
            all.extend_from_slice(args);
            let run = stead(&all, &[("STEAD_DATABASE_URL", &url)]);
            assert_eq!(run.code, 7, "{when}, {args:?}: {}", run.text());
            assert!(
                run.stderr
                    .contains("has no stead schema (or an older one): run `stead migrate`")
                    && run.stderr.contains(database),
                "{when}, {args:?}: {}",
                run.text()
            );
        }
    };
    let migrate = || {
        let run = stead(
            &["--config", "examples/stead.toml", "migrate"],
            &[("STEAD_DATABASE_URL", &url)],
        );
        assert_eq!(run.code, 0, "{}", run.text());
    };
    expect_no_schema("never migrated");
    migrate();
    let listed = stead(
        &["--config", "examples/stead.toml", "instance", "list"],
        &[("STEAD_DATABASE_URL", &url)],
    );
    assert_eq!(listed.code, 0, "{}", listed.text());
    // As an older stead left it: its newest migration not applied.
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    connection.close().await.unwrap();
    expect_no_schema("one migration behind");
}

#[tokio::test]
async fn deleted_instances_are_listed_only_with_all_and_their_names_are_reused() {
    use stead::core::fleet::InstanceState;
    use stead::core::types::InstanceName;
    let s = Setup::new();
    s.ok(&["instance", "create", "old", "--type", "web"]);
    s.ok(&["instance", "create", "kept", "--type", "web"]);
    s.ok(&["instance", "delete", "old"]);
    // The deprovision's end, as a worker does it: the instance marked
    // deleted, the task done.
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    let old = store
        .instance(&InstanceName::new("old"))
        .await
        .unwrap()
        .unwrap();
    let now = old.updated_at;
    let claimed = store.claim("w", now, 10).await.unwrap();
    let deprovision = claimed
        .iter()
        .find(|t| t.instance == old.id)
        .expect("the deprovision is due");
    assert!(store
        .set_instance_state(old.id, InstanceState::Deleting, InstanceState::Deleted, now)
        .await
        .unwrap());
    assert!(store.complete(deprovision.id, "w", now).await.unwrap());
    let names = |json: &str| -> Vec<String> {
        let rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        rows.iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&s.ok(&["instance", "list", "--json"])), ["kept"]);
    assert_eq!(
        names(&s.ok(&["instance", "list", "--all", "--json"])),
        ["old", "kept"]
    );
    let table = s.ok(&["instance", "list"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(!table.contains("old"), "{table}");
    let reused = s.ok(&["instance", "create", "old", "--type", "web"]);
    assert!(reused.starts_with("created old (web 1"), "{reused}");
}

#[test]
fn the_task_list_shows_the_queue_with_attempts_and_errors() {
    let s = Setup::new();
    s.ok(&["instance", "create", "demo", "--type", "web"]);
    s.ok(&["instance", "delete", "demo"]);
    let queue = s.ok(&["task", "list"]);
    assert!(queue.starts_with("ID  KIND"), "{queue}");
    assert!(
        queue.contains("deprovision  demo      queued  0"),
        "{queue}"
    );
    assert!(
        !queue
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("provision")),
        "the cancelled provision is finished:\n{queue}"
    );
    let all: Vec<serde_json::Value> =
        serde_json::from_str(&s.ok(&["task", "list", "--all", "--json"])).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[1]["kind"], "provision");
    assert_eq!(all[1]["state"], "failed");
    assert_eq!(
        all[1]["last_error"],
        stead::core::fleet::CANCELLED_BY_DELETION
    );
    assert_eq!(all[0]["attempts"], 0);
}

#[test]
fn status_reads_the_configured_database_without_a_daemon() {
    let s = Setup::new();
    s.ok(&["instance", "create", "demo", "--type", "web"]);
    let status: serde_json::Value = serde_json::from_str(&s.ok(&["status", "--json"])).unwrap();
    assert_eq!(status["source"], "database");
    assert_eq!(status["database"], s.url().as_str());
    assert_eq!(status["rows"][0]["instance"], "demo");
    assert_eq!(status["rows"][0]["condition"], "no container yet");
    assert_eq!(status["catalog"][0]["service_type"], "web");
    assert_eq!(status["catalog"][0]["version"], "1");
    let live = s.run(&["status", "--live"]);
    assert_eq!(live.code, 1, "{}", live.text());
    assert!(
        live.stderr.contains("admin endpoints are off"),
        "{}",
        live.text()
    );
}

#[test]
fn an_unopenable_sqlite_file_is_named_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir/stead.db");
    let url = format!("sqlite://{}?mode=rwc", missing.display());
    let run = stead(
        &["--config", "examples/stead.toml", "instance", "list"],
        &[("STEAD_DATABASE_URL", &url)],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains(&format!(
            "SQLite database {}: cannot open:",
            missing.display()
        )) && run.stderr.contains(&format!(
            "(its directory {}: No such file or directory",
            missing.parent().unwrap().display()
        )),
        "{}",
        run.text()
    );
}

#[test]
fn postgres_on_a_closed_port_fails_at_once_naming_host_port_and_the_os_error() {
    // A port that was free a moment ago: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://stead@127.0.0.1:{port}/stead");
    let started = Instant::now();
    let run = stead(
        &["--config", "examples/stead.toml", "instance", "list"],
        &[("STEAD_DATABASE_URL", &url)],
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        run.stderr.contains(&format!(
            "Postgres at 127.0.0.1:{port} (database stead, user stead): cannot connect: Connection refused"
        )),
        "{}",
        run.text()
    );
}

#[tokio::test]
async fn parameters_are_checked_against_the_catalog_and_stored() {
    use stead::core::types::InstanceName;
    let s = Setup::notes();
    let unknown = s.run(&[
        "instance",
        "create",
        "a",
        "--type",
        "notes",
        "--set",
        "colour=red",
    ]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("--set: parameter colour: service type notes declares no such parameter (declared: title)"),
        "{}",
        unknown.text()
    );
    let malformed = s.run(&[
        "instance", "create", "a", "--type", "notes", "--set", "title",
    ]);
    assert_ne!(malformed.code, 0);
    assert!(
        malformed.stderr.contains("expected NAME=VALUE"),
        "{}",
        malformed.text()
    );
    let twice = s.run(&[
        "instance", "create", "a", "--type", "notes", "--set", "title=x", "--set", "title=y",
    ]);
    assert!(
        twice.stderr.contains("--set title: given twice"),
        "{}",
        twice.text()
    );
    let control = s.run(&[
        "instance",
        "create",
        "a",
        "--type",
        "notes",
        "--set",
        "title=a\nb",
    ]);
    assert!(
        control.stderr.contains("without control characters"),
        "{}",
        control.text()
    );

    s.ok(&[
        "instance",
        "create",
        "a",
        "--type",
        "notes",
        "--set",
        "title=Shopping list",
    ]);
    let shown = s.ok(&["instance", "show", "a"]);
    assert!(
        shown.contains("parameters: title=\"Shopping list\""),
        "{shown}"
    );
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    let a = store
        .instance(&InstanceName::new("a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        a.parameters,
        std::collections::BTreeMap::from([("title".to_owned(), "Shopping list".to_owned())])
    );
}

#[tokio::test]
async fn a_plain_delete_keeps_named_volumes_and_says_so_and_purge_asks_for_them() {
    use stead::core::types::InstanceName;
    let s = Setup::notes();
    s.ok(&["instance", "create", "a", "--type", "notes"]);
    s.ok(&["instance", "create", "b", "--type", "notes"]);
    let kept = s.ok(&["instance", "delete", "a"]);
    assert!(
        kept.contains("its named volumes (db/data) are kept with their data; `stead instance delete a --purge-volumes` removes them"),
        "{kept}"
    );
    let purged = s.ok(&["instance", "delete", "b", "--purge-volumes"]);
    assert!(
        purged.contains("its named volumes (db/data) are removed with it"),
        "{purged}"
    );
    // Asked again while the deprovision has not run: still purged, once.
    s.ok(&["instance", "delete", "a", "--purge-volumes"]);
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    let shown = s.ok(&["instance", "show", "b", "--json"]);
    assert!(shown.contains("\"purge_volumes\": true"), "{shown}");
    for name in ["a", "b"] {
        let row = store
            .instance(&InstanceName::new(name))
            .await
            .unwrap()
            .unwrap();
        assert!(row.purge_volumes, "{name}");
    }
}

// --- the admin endpoints of a running daemon ---------------------------

/// Bound on a daemon's start, and on its exit when it refuses to start.
const DAEMON_START: Duration = Duration::from_secs(30);

/// A loopback port nobody listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `stead run` on `setup`'s config with its admin endpoints on `admin`.
/// Docker and Caddy are pointed at addresses where nothing answers (a
/// socket file nobody accepts on, a closed port), so the daemon touches no
/// engine or proxy of the machine.
fn spawn_run(setup: &Setup, admin: &str) -> std::process::Child {
    let socket = setup.dir.path().join("no-docker.sock");
    if !socket.exists() {
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    }
    let caddy = format!("127.0.0.1:{}", free_port());
    command(
        &["--config", setup.config.as_str(), "run"],
        &[
            ("STEAD_ADMIN_LISTEN", admin),
            ("STEAD_DOCKER__SOCKET", socket.to_str().unwrap()),
            ("STEAD_CADDY__ADMIN", &caddy),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run stead")
}

/// A running `stead run`, stopped (by its own process id) when dropped.
struct RunningDaemon {
    child: std::process::Child,
    admin: String,
}

impl RunningDaemon {
    fn start(setup: &Setup) -> Self {
        let admin = format!("127.0.0.1:{}", free_port());
        let child = spawn_run(setup, &admin);
        let daemon = Self { child, admin };
        let start = Instant::now();
        while http(&daemon.admin, "GET /healthz HTTP/1.1\r\n\r\n").is_none() {
            assert!(
                start.elapsed() < DAEMON_START,
                "the admin port never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: the head of `request`
/// (a request line and headers, each ending in CRLF, then an empty line)
/// gets `Host` and `Connection: close` added. The whole answer, or `None`
/// when nothing listens.
fn http(addr: &str, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(DAEMON_START)).unwrap();
    let (line, rest) = request.split_once("\r\n").unwrap();
    let full = format!("{line}\r\nHost: {addr}\r\nConnection: close\r\n{rest}");
    stream.write_all(full.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

#[test]
fn run_refuses_to_start_when_another_process_holds_its_admin_port() {
    let setup = Setup::new();
    // Another local process took the port first: it would answer /healthz
    // and /metrics in stead's name.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = squatter.local_addr().unwrap().to_string();
    let mut child = spawn_run(&setup, &admin);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DAEMON_START {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "stead ran beside another process on its admin port:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("admin_listen = \"{admin}\": cannot listen"))
            && stderr.contains("Address already in use"),
        "{stderr}"
    );
}

#[test]
fn reload_refuses_a_post_without_its_header_and_the_cli_sends_it() {
    let setup = Setup::new();
    let daemon = RunningDaemon::start(&setup);
    // What a web page can make a browser send without a preflight.
    let cross_site = http(
        &daemon.admin,
        "POST /reload HTTP/1.1\r\nOrigin: https://evil.example\r\n\
         Content-Type: text/plain\r\nContent-Length: 0\r\n\r\n",
    )
    .expect("the daemon answers");
    assert!(cross_site.starts_with("HTTP/1.1 403"), "{cross_site}");
    assert!(
        cross_site.contains("POST /reload needs the header x-stead-request: reload"),
        "{cross_site}"
    );
    let asked = http(
        &daemon.admin,
        "POST /reload HTTP/1.1\r\nX-Stead-Request: reload\r\nContent-Length: 0\r\n\r\n",
    )
    .expect("the daemon answers");
    assert!(asked.starts_with("HTTP/1.1 200"), "{asked}");
    let run = stead(
        &["--config", setup.config.as_str(), "reload"],
        &[("STEAD_ADMIN_LISTEN", daemon.admin.as_str())],
    );
    assert_eq!(run.code, 0, "{}", run.text());
    assert!(run.stdout.starts_with("reloaded "), "{}", run.text());
}

/// `stead plan` and `stead reload --plan` ask the running daemon what a
/// reload would do (#55) and change nothing; `--plan` with `--force` is a
/// usage error.
#[test]
fn plan_asks_the_daemon_what_a_reload_would_do() {
    let setup = Setup::new();
    let daemon = RunningDaemon::start(&setup);
    let env = [("STEAD_ADMIN_LISTEN", daemon.admin.as_str())];
    let run = stead(&["--config", setup.config.as_str(), "plan"], &env);
    assert_eq!(run.code, 0, "{}", run.text());
    assert!(
        run.stdout.contains("no change against the running catalog")
            && run.stdout.contains("no upgrade would start"),
        "{}",
        run.text()
    );
    let json = stead(
        &[
            "--config",
            setup.config.as_str(),
            "reload",
            "--plan",
            "--json",
        ],
        &env,
    );
    assert_eq!(json.code, 0, "{}", json.text());
    let answer: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(answer["changes"], serde_json::json!([]), "{answer}");
    assert_eq!(answer["hazards"], serde_json::json!([]), "{answer}");
    assert!(answer["forecast"]["rounds"].is_array(), "{answer}");
    let both = stead(
        &[
            "--config",
            setup.config.as_str(),
            "reload",
            "--plan",
            "--force",
        ],
        &env,
    );
    assert_eq!(both.code, 2, "{}", both.text());
}

#[test]
fn with_a_token_file_the_fleet_endpoints_demand_it_and_the_cli_presents_it() {
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    let setup = Setup::new();
    let plain = std::fs::read_to_string(&setup.config).unwrap();
    let token_file = setup.dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let guarded = format!("admin_token_file = \"{}\"\n{plain}", token_file.display());
    std::fs::write(&setup.config, guarded).unwrap();
    let daemon = RunningDaemon::start(&setup);
    let bare = http(&daemon.admin, "GET /status HTTP/1.1\r\n\r\n").expect("the daemon answers");
    assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
    let page = http(
        &daemon.admin,
        &format!("GET / HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"),
    )
    .expect("the daemon answers");
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("<h1>Fleet</h1>"),
        "{page}"
    );
    let env = [("STEAD_ADMIN_LISTEN", daemon.admin.as_str())];
    for args in [&["status", "--live"][..], &["reload"][..], &["plan"][..]] {
        let mut all = vec!["--config", setup.config.as_str()];
        all.extend_from_slice(args);
        let run = stead(&all, &env);
        assert_eq!(run.code, 0, "{args:?}: {}", run.text());
    }
    // A stead.toml without the token file is told what it lacks.
    let without = setup.dir.path().join("without-token.toml");
    std::fs::write(&without, plain).unwrap();
    let run = stead(
        &["--config", without.to_str().unwrap(), "status", "--live"],
        &env,
    );
    assert_eq!(run.code, 1, "{}", run.text());
    assert!(
        run.stderr.contains("refused (401)") && run.stderr.contains("set admin_token_file"),
        "{}",
        run.text()
    );
}

#[test]
fn reload_refuses_a_catalog_that_would_damage_live_instances_until_forced() {
    let setup = Setup::new();
    let catalog = setup.dir.path().join("catalog.toml");
    let original = std::fs::read_to_string(example_catalog()).unwrap();
    std::fs::write(&catalog, &original).unwrap();
    let text = std::fs::read_to_string(&setup.config).unwrap().replace(
        &example_catalog().display().to_string(),
        catalog.to_str().unwrap(),
    );
    std::fs::write(&setup.config, text).unwrap();
    setup.ok(&["instance", "create", "site", "--type", "web"]);
    let daemon = RunningDaemon::start(&setup);
    let reload = |args: &[&str]| {
        let mut all = vec!["--config", setup.config.as_str(), "reload"];
        all.extend_from_slice(args);
        stead(&all, &[("STEAD_ADMIN_LISTEN", daemon.admin.as_str())])
    };

    // A renamed service: every instance would start it on empty volumes.
    let renamed = original
        .replace("version = \"1\"", "version = \"2\"")
        .replace("name = \"http\"", "name = \"www\"");
    std::fs::write(&catalog, renamed).unwrap();
    let answer = http(
        &daemon.admin,
        "POST /reload HTTP/1.1\r\nX-Stead-Request: reload\r\nContent-Length: 0\r\n\r\n",
    )
    .expect("the daemon answers");
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    let refused = reload(&[]);
    assert_eq!(refused.code, 1, "{}", refused.text());
    assert!(
        refused
            .stderr
            .contains("reload refused; the daemon keeps catalog web 1")
            && refused.stderr.contains(
                "types.web.services: http -> www while it has live instances (a rename: every \
                 instance would start www on empty volumes)"
            )
            && refused.stderr.contains("`stead reload --force`"),
        "{}",
        refused.text()
    );

    let forced = reload(&["--force"]);
    assert_eq!(forced.code, 0, "{}", forced.text());
    assert!(
        forced
            .stdout
            .contains("forced: types.web.services: http -> www")
            && forced.stdout.contains("web 1 -> 2"),
        "{}",
        forced.text()
    );
}

// --- the event log (#42) ---------------------------------------------------

/// Writes `events` into the setup's database as a daemon's flusher would,
/// the database migrated first.
async fn log_events(s: &Setup, events: &[stead::core::event_log::Event]) {
    s.ok(&["migrate"]);
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    store.append_events(events).await.unwrap();
}

fn an_event(
    kind: stead::core::event_log::EventKind,
    ago_s: i64,
    instance: &str,
    trace: Option<&str>,
) -> stead::core::event_log::Event {
    use stead::core::types::{InstanceName, ServiceName};
    use stead::ports::Clock;
    let at = stead::engine::SystemClock.now() - jiff::SignedDuration::from_secs(ago_s);
    let mut event =
        stead::core::event_log::Event::new(kind, at, "R9", format!("{kind} of {instance}/web"))
            .instance(&InstanceName::new(instance))
            .service(&ServiceName::new("web"));
    event.trace_id = trace.map(str::to_owned);
    event.writer = "host-1#a".into();
    event
}

#[tokio::test]
async fn events_are_listed_filtered_by_instance_kind_and_since_and_as_json_lines() {
    use stead::core::event_log::EventKind;
    let s = Setup::new();
    log_events(
        &s,
        &[
            an_event(EventKind::Start, 3600, "wiki1", None),
            an_event(EventKind::Publish, 120, "wiki1", Some("aaaa")),
            an_event(EventKind::Restart, 60, "wiki2", Some("bbbb")),
            an_event(EventKind::Start, 30, "wiki1", Some("cccc")),
        ],
    )
    .await;
    let all = s.ok(&["events"]);
    assert_eq!(all.lines().count(), 4, "{all}");
    assert!(
        all.lines().next().unwrap().contains("start")
            && all
                .lines()
                .next()
                .unwrap()
                .contains("wiki1/web  R9  start of wiki1/web"),
        "oldest first, with subject, rule and sentence:\n{all}"
    );
    let wiki1 = s.ok(&["events", "--instance", "wiki1"]);
    assert_eq!(wiki1.lines().count(), 3, "{wiki1}");
    assert!(!wiki1.contains("wiki2"), "{wiki1}");
    let starts = s.ok(&["events", "--kind", "start", "--since", "10m"]);
    assert_eq!(
        starts.lines().count(),
        1,
        "the hour-old start is left out:\n{starts}"
    );
    let newest = s.ok(&["events", "--limit", "2"]);
    assert!(
        newest.contains("restart") && newest.lines().count() == 2,
        "the newest two:\n{newest}"
    );
    let json = s.ok(&["events", "--json", "--instance", "wiki2"]);
    let objects: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objects.len(), 1, "{json}");
    assert_eq!(objects[0]["kind"], "restart");
    assert_eq!(objects[0]["instance"], "wiki2");
    assert_eq!(objects[0]["service"], "web");
    assert_eq!(objects[0]["reason"], "R9");
    assert_eq!(objects[0]["trace_id"], "bbbb");
    assert_eq!(objects[0]["writer"], "host-1#a");
    let none = s.ok(&["events", "--kind", "drift"]);
    assert_eq!(none.trim(), "no events");
    // A name no instance ever had is not found, as everywhere.
    let nobody = s.run(&["events", "--instance", "nobody"]);
    assert_eq!(nobody.code, 3, "{}", nobody.text());
}

#[test]
fn bad_event_filters_are_refused_naming_flag_and_value_and_exit_2() {
    let s = Setup::new();
    for (args, expect) in [
        (&["events", "--since", "10x"][..], "\"10x\": unknown unit"),
        (
            &["events", "--since", "0s"][..],
            "\"0s\": must be more than zero",
        ),
        (&["events", "--since", "ten"][..], "\"ten\""),
        (
            &["events", "--kind", "reboot"][..],
            "\"reboot\": not an event kind",
        ),
        (
            &["events", "--instance", "Not_A_Name"][..],
            "\"Not_A_Name\": not an instance name",
        ),
        (
            &["timeline", "Not_A_Name"][..],
            "\"Not_A_Name\": not an instance name",
        ),
        (&["events", "--limit", "0"][..], "--limit"),
    ] {
        let run = s.run(args);
        assert_eq!(run.code, 2, "{args:?}\n{}", run.text());
        assert!(
            run.stderr.contains(expect),
            "{args:?}: {expect}\n{}",
            run.text()
        );
    }
}

#[tokio::test]
async fn a_timeline_groups_one_instances_events_by_pass_with_the_time_between() {
    use stead::core::event_log::EventKind;
    let s = Setup::new();
    log_events(
        &s,
        &[
            an_event(EventKind::Withdraw, 600, "wiki1", Some("aaaaaaaaaaaa")),
            an_event(EventKind::Restart, 600, "wiki1", Some("aaaaaaaaaaaa")),
            an_event(EventKind::Start, 300, "wiki2", Some("bbbbbbbbbbbb")),
            an_event(EventKind::Publish, 60, "wiki1", Some("cccccccccccc")),
        ],
    )
    .await;
    let timeline = s.ok(&["timeline", "wiki1"]);
    assert!(timeline.starts_with("wiki1: 3 event(s) from"), "{timeline}");
    assert_eq!(timeline.matches("pass at ").count(), 2, "{timeline}");
    assert!(timeline.contains("(trace aaaaaaaa)"), "{timeline}");
    assert!(timeline.contains("... 9 min later"), "{timeline}");
    assert!(!timeline.contains("wiki2"), "{timeline}");
    let nobody = s.run(&["timeline", "nobody"]);
    assert_eq!(nobody.code, 3, "{}", nobody.text());
    assert!(
        nobody.stderr.contains("no instance named \"nobody\""),
        "{}",
        nobody.text()
    );
}

#[tokio::test]
async fn events_follow_prints_what_is_written_after_it_started() {
    use std::io::BufRead;
    use stead::core::event_log::EventKind;
    let s = Setup::new();
    log_events(&s, &[an_event(EventKind::Start, 10, "wiki1", None)]).await;
    let mut child = command(
        &["--config", &s.config, "events", "--follow", "--json"],
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if lines_tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let first = lines_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the logged event");
    assert!(first.contains("\"kind\":\"start\""), "{first}");
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    store
        .append_events(&[an_event(EventKind::Publish, 0, "wiki1", None)])
        .await
        .unwrap();
    let next = lines_rx.recv_timeout(Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    let next = next.expect("the event written after it started");
    assert!(next.contains("\"kind\":\"publish\""), "{next}");
}

#[tokio::test]
async fn instance_why_says_what_an_instance_waits_for_from_what_status_reads() {
    use stead::core::types::InstanceName;
    let s = Setup::new();
    s.ok(&["instance", "create", "demo", "--type", "web"]);
    let said = s.ok(&["instance", "why", "demo"]);
    assert!(
        said.contains("demo has no container yet: it is provisioning"),
        "{said}"
    );
    // Behind the catalog's version, with the type's rollout halted: the
    // upgrade it waits for is not planned, and why.
    let store = stead::store::sql::connect(&s.url()).await.unwrap();
    let demo = store
        .instance(&InstanceName::new("demo"))
        .await
        .unwrap()
        .unwrap();
    store
        .set_instance_version(demo.id, "0", demo.created_at)
        .await
        .unwrap();
    s.ok(&["rollout", "halt", "web", "--reason", "bad build"]);
    let said = s.ok(&["instance", "why", "demo"]);
    assert!(
        said.contains("its upgrade from 0 to 1 (web): not planned: rollout halted: bad build"),
        "{said}"
    );
    let live = s.run(&["instance", "why", "demo", "--live"]);
    assert_eq!(live.code, 1, "no daemon to ask: {}", live.text());
}

#[test]
fn an_operators_enqueues_cancels_and_halts_are_events_naming_the_operator() {
    let s = Setup::new();
    s.ok(&["instance", "create", "demo", "--type", "web"]);
    s.ok(&["instance", "delete", "demo"]);
    s.ok(&["rollout", "halt", "web", "--reason", "bad build"]);
    let json = s.ok(&["events", "--json"]);
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["enqueue", "enqueue", "cancel", "halt"], "{json}");
    assert!(
        events[0]["message"]
            .as_str()
            .unwrap()
            .contains("provision queued as task 1"),
        "{json}"
    );
    assert_eq!(events[2]["instance"], "demo");
    assert!(events[3]["instance"].is_null(), "a halt is about a type");
    for event in &events {
        assert_eq!(event["reason"], "operator");
        assert!(
            event["writer"].as_str().unwrap().starts_with("operator:"),
            "{event}"
        );
    }
}

/// `stead backup` and `stead restore` refuse, each with its exit status,
/// what would lose data or make a database stead cannot read: an existing
/// file, a database that exists (without `--force`), a file that is not a
/// stead database or is one of a newer stead, and Postgres, whose own tools
/// they name. What they accept round-trips the rows.
#[tokio::test]
async fn backup_and_restore_refuse_what_would_lose_data_each_with_its_exit_status() {
    use sqlx::Connection;
    let s = Setup::new();
    s.ok(&[
        "instance", "create", "kept", "--type", "web", "--team", "blue",
    ]);
    let listed = s.ok(&["instance", "list", "--all", "--json"]);
    let file = s.dir.path().join("backup.db");
    let file_arg = file.to_str().unwrap();
    let said = s.ok(&["backup", file_arg]);
    assert!(said.contains("1 instance(s), schema "), "{said}");

    let again = s.run(&["backup", file_arg]);
    assert_eq!(again.code, 4, "{}", again.text());
    assert!(again.stderr.contains("already exists"), "{}", again.text());
    s.ok(&["backup", file_arg, "--force"]);

    let over = s.run(&["restore", file_arg]);
    assert_eq!(over.code, 4, "{}", over.text());
    assert!(
        over.stderr
            .contains("a database exists there; pass --force to replace it"),
        "{}",
        over.text()
    );

    s.ok(&["instance", "create", "later", "--type", "web"]);
    let restored = s.ok(&["restore", file_arg, "--force"]);
    assert!(restored.contains("1 instance(s)"), "{restored}");
    assert_eq!(s.ok(&["instance", "list", "--all", "--json"]), listed);

    let junk = s.dir.path().join("junk.db");
    std::fs::write(&junk, "not a database at all, just some text\n".repeat(200)).unwrap();
    let other = s.dir.path().join("other.db");
    let mut connection =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", other.display()))
            .await
            .unwrap();
    sqlx::raw_sql("CREATE TABLE notes (body TEXT)")
        .execute(&mut connection)
        .await
        .unwrap();
    connection.close().await.unwrap();
    let newer = s.dir.path().join("newer.db");
    std::fs::copy(&file, &newer).unwrap();
    let mut connection = sqlx::SqliteConnection::connect(&format!("sqlite://{}", newer.display()))
        .await
        .unwrap();
    sqlx::raw_sql(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (29991231000001, 'from the future', TRUE, x'00', 0)",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    connection.close().await.unwrap();
    for (path, says) in [
        (&junk, "not a readable SQLite database"),
        (&other, "not a stead database"),
        (
            &newer,
            "has migration 29991231000001, which this stead does not know",
        ),
    ] {
        let run = s.run(&["restore", path.to_str().unwrap(), "--force"]);
        assert_eq!(run.code, 1, "{}", run.text());
        assert!(
            run.stderr.contains(path.to_str().unwrap()) && run.stderr.contains(says),
            "{}",
            run.text()
        );
    }
    assert_eq!(
        s.ok(&["instance", "list", "--all", "--json"]),
        listed,
        "the refused restores left the database alone"
    );

    let postgres = [(
        "STEAD_DATABASE_URL",
        "postgres://stead:secret@db.invalid/stead",
    )];
    for (command, tool) in [("backup", "pg_dump"), ("restore", "pg_restore")] {
        let mut args = vec!["--config", s.config.as_str(), command, file_arg];
        if command == "backup" {
            args.push("--force");
        }
        let run = stead(&args, &postgres);
        assert_eq!(run.code, 8, "{}", run.text());
        assert!(
            run.stderr.contains(tool) && !run.stderr.contains("secret"),
            "{}",
            run.text()
        );
    }
}
