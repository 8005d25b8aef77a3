//! The `stead` binary's offline commands: `check` and `--help`.

use std::process::Command;

fn stead(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stead"));
    command.args(args).env_remove("STEAD_CONFIG");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run stead");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn check_accepts_the_example_files() {
    let (ok, out) = stead(&["--config", "examples/stead.toml", "check"], &[]);
    assert!(ok, "{out}");
    assert!(out.contains("catalog examples/catalog.toml: ok"), "{out}");
}

#[test]
fn check_names_file_field_and_value_of_a_bad_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    std::fs::write(&catalog, "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"Bad Name\"\nimage = \"x\"\n").unwrap();
    let (ok, out) = stead(
        &["--config", "examples/stead.toml", "check"],
        &[("STEAD_CATALOG", catalog.to_str().unwrap())],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("catalog.toml")
            && out.contains("types.web.services[0].name")
            && out.contains("Bad Name"),
        "{out}"
    );
}

#[test]
fn check_names_the_field_of_a_bad_config_value() {
    let (ok, out) = stead(
        &["--config", "examples/stead.toml", "check"],
        &[("STEAD_WORKERS", "1000")],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("workers = 1000"), "{out}");
}

#[test]
fn help_lists_every_command() {
    let (ok, out) = stead(&["--help"], &[]);
    assert!(ok);
    for command in [
        "run", "tick", "migrate", "status", "check", "instance", "rollout",
    ] {
        assert!(
            out.contains(command),
            "{command} missing from --help:\n{out}"
        );
    }
}
