//! The first invariant of docs/ARCHITECTURE.md ("Invariants"): the
//! core (`stead-core`, `core/`) is pure.
//!
//! The core must not know about async, tokio, SQL, Docker, HTTP, the file
//! system, the network, processes, threads, clocks, global randomness or
//! logging. Being its own crate, it cannot name the engine, the ports or the
//! adapters at all, and a crate it does not depend on it cannot call: the
//! dependency check below holds its dependency tree to a reviewed list.
//! What a crate boundary cannot forbid is the standard library's I/O, clocks
//! and printing: clippy's `disallowed-methods` (clippy.toml) catches the
//! calls it can resolve, and the text scan catches the rest, naming the file
//! and line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What `core/src` must never mention outside comments, and why: what the
/// standard library offers without a dependency. (A crate is kept out by
/// the dependency check at the end of this file.)
const FORBIDDEN: &[(&str, &str)] = &[
    ("async", "the core is synchronous; the engine owns async"),
    ("await", "the core is synchronous; the engine owns async"),
    ("madsim", "no cfg(madsim) branches in the core"),
    ("std::fs", "no file system in the core"),
    ("std::net", "no network in the core"),
    ("std::process", "no subprocesses in the core"),
    ("std::thread", "the core never sleeps or spawns"),
    ("std::env", "configuration comes in as values"),
    ("std::io", "the core never returns io::Error"),
    ("Instant::now", "time is an argument"),
    ("SystemTime::now", "time is an argument"),
    ("Timestamp::now", "time is an argument"),
    ("thread_rng", "randomness comes from a seeded generator"),
    ("rand::rng(", "randomness comes from a seeded generator"),
    ("rand::random", "randomness comes from a seeded generator"),
    ("OsRng", "randomness comes from a seeded generator"),
    ("println!", "no output side effects"),
    ("eprintln!", "no output side effects"),
    ("print!", "no output side effects"),
    ("dbg!", "no output side effects"),
    (
        "thread_local",
        "no hidden state: everything the core reads is an argument",
    ),
    (
        "mutants::active",
        "a broken rule reaches the core as data (RecoveryPolicy::broken), not a global switch",
    ),
    (
        "mutants::armed",
        "a broken rule reaches the core as data (RecoveryPolicy::broken), not a global switch",
    ),
];

/// Modules that a grouped `use std::{…}` must not name.
const FORBIDDEN_STD_MODULES: &[&str] = &["fs", "net", "process", "thread", "env", "io"];

/// One forbidden mention: where and what.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    line: usize,
    token: &'static str,
    why: &'static str,
}

/// Replaces comments and the contents of string and char literals with
/// spaces, keeping line structure, so only code is checked.
fn strip_comments_and_literals(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(source.len(), |n| i + n);
            out.extend(std::iter::repeat_n(' ', end - i));
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(source.len(), |n| i + n + 2);
            source[i..end].chars().for_each(|c| blank(&mut out, c));
            i = end;
        } else if rest.starts_with('"') {
            // Skip to the closing quote, honouring backslash escapes.
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(bytes.len());
            out.push('"');
            source[i + 1..end.saturating_sub(1).max(i + 1)]
                .chars()
                .for_each(|c| blank(&mut out, c));
            if end > i + 1 {
                out.push('"');
            }
            i = end;
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `token` occurs in `line` as a whole word (for identifiers) or
/// anywhere (for paths and macros, which carry their own punctuation).
fn mentions(line: &str, token: &str) -> bool {
    let starts_ident = token.bytes().next().is_some_and(is_ident_byte);
    let ends_ident = token.bytes().last().is_some_and(is_ident_byte);
    line.match_indices(token).any(|(at, _)| {
        let before = line.as_bytes()[..at].last().copied();
        let after = line.as_bytes().get(at + token.len()).copied();
        let clean_before = !starts_ident || !before.is_some_and(is_ident_byte);
        let clean_after = !ends_ident || !after.is_some_and(is_ident_byte);
        // `print!` inside `println!`/`eprintln!` is reported once, by them.
        clean_before && clean_after
    })
}

/// Every forbidden mention in one file's source.
fn violations(source: &str) -> Vec<Violation> {
    let code = strip_comments_and_literals(source);
    let mut found = Vec::new();
    for (index, line) in code.lines().enumerate() {
        for &(token, why) in FORBIDDEN {
            if mentions(line, token) {
                found.push(Violation {
                    line: index + 1,
                    token,
                    why,
                });
            }
        }
    }
    // `use std::{fs, time::Duration}` names a module without `std::fs`.
    for (at, _) in code.match_indices("std::{") {
        let group_end = code[at..].find('}').map_or(code.len(), |n| at + n);
        let group = &code[at + "std::{".len()..group_end];
        let line = code[..at].matches('\n').count() + 1;
        for module in FORBIDDEN_STD_MODULES {
            if mentions(group, module) {
                found.push(Violation {
                    line,
                    token: "std::{…}",
                    why: "a grouped import names a forbidden std module",
                });
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_core_mentions_no_async_io_clock_randomness_or_logging() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("core/src"), &mut files);
    assert!(
        files.len() >= 8,
        "expected the core's modules under core/src, found {files:?}"
    );
    let mut report = String::new();
    for file in &files {
        let source = std::fs::read_to_string(file).expect("readable source");
        for v in violations(&source) {
            let relative = file.strip_prefix(&root).unwrap_or(file);
            writeln!(
                report,
                "{}:{}: mentions `{}`: {}",
                relative.display(),
                v.line,
                v.token,
                v.why
            )
            .expect("write to string");
        }
    }
    assert!(
        report.is_empty(),
        "core/src must stay pure (docs/ARCHITECTURE.md, \"Invariants\"):\n{report}"
    );
}

/// What no file of the shipped crates (`src/`, `core/src/`) may mention: the test
/// support lives in `stead-testkit` (`testkit/`), and a broken rule reaches
/// the core and the engine only as data (`RecoveryPolicy::broken`,
/// `WorkerConfig::broken`).
const TEST_SUPPORT: &[&str] = &[
    "stead_testkit",
    "thread_local",
    "mutants",
    "MemoryStore",
    "MemoryRuntime",
    "FakeContainer",
];

#[test]
fn the_shipped_crate_holds_no_fake_world_in_memory_port_or_mutant_switch() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("core/src"), &mut files);
    let mut report = String::new();
    for file in &files {
        let code =
            strip_comments_and_literals(&std::fs::read_to_string(file).expect("readable source"));
        for (index, line) in code.lines().enumerate() {
            for token in TEST_SUPPORT.iter().filter(|t| mentions(line, t)) {
                let relative = file.strip_prefix(&root).unwrap_or(file);
                writeln!(report, "{}:{}: {token}", relative.display(), index + 1)
                    .expect("write to string");
            }
        }
    }
    assert!(
        report.is_empty(),
        "test support belongs in testkit/, not in the shipped crate:\n{report}"
    );
    // And the crate depends on the kit only to build its tests.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let dependencies = manifest
        .split("\n[")
        .filter(|table| !table.starts_with("dev-dependencies]"))
        .collect::<Vec<_>>()
        .join("\n[");
    assert!(
        !dependencies.contains("stead-testkit"),
        "stead-testkit may only be a dev-dependency of stead"
    );
}

#[test]
fn the_scanner_finds_planted_violations_and_ignores_comments_and_strings() {
    let check = |source: &str, expect: &[(usize, &str)]| {
        let got: Vec<(usize, &str)> = violations(source)
            .iter()
            .map(|v| (v.line, v.token))
            .collect();
        assert_eq!(got, expect, "source:\n{source}");
    };
    check("fn f() {}\n", &[]);
    check("// tokio, async, Instant::now\nfn f() {}\n", &[]);
    check("/* std::fs\n println! */ fn f() {}\n", &[]);
    check("const A: &str = \"tokio::spawn std::fs\";\n", &[]);
    check("let s = \"a \\\" tokio\"; \n", &[]);
    check(
        "fn f() { let _ = std::time::Instant::now(); }\n",
        &[(1, "Instant::now")],
    );
    check("\nasync fn f() {}\n", &[(2, "async")]);
    check("fn f() { g().await }\n", &[(1, "await")]);
    check("use std::thread::sleep;\n", &[(1, "std::thread")]);
    check("fn f() { println!(\"x\"); }\n", &[(1, "println!")]);
    check("fn f() { eprintln!(\"x\"); }\n", &[(1, "eprintln!")]);
    check("fn f() { dbg!(1); }\n", &[(1, "dbg!")]);
    check("fn f() { let r = rand::rng(); }\n", &[(1, "rand::rng(")]);
    check("use std::{fmt,\n  fs::File};\n", &[(1, "std::{…}")]);
    check("use std::{fmt, time::Duration};\n", &[]);
    // Identifiers only match whole words: `awaited` and `async_free` are fine.
    check("fn awaited() {} fn async_free() {}\n", &[]);
    check(
        "fn f() { let t = jiff::Timestamp::now(); }\n",
        &[(1, "Timestamp::now")],
    );
}

/// The clippy half of the enforcement: the disallowed methods must stay
/// configured, so a resolvable call fails `clippy -D warnings` with a reason.
#[test]
fn clippy_disallows_clock_sleep_and_global_rng_calls() {
    let config = std::fs::read_to_string(repo_root().join("clippy.toml")).expect("clippy.toml");
    let code = strip_comments_and_literals(&config.replace('#', "//"));
    assert!(
        code.contains("disallowed-methods"),
        "clippy.toml lost its disallowed-methods table"
    );
    for path in [
        "std::time::Instant::now",
        "std::time::SystemTime::now",
        "jiff::Timestamp::now",
        "rand::rng",
        "std::thread::sleep",
    ] {
        let entry = format!("path = \"{path}\"");
        assert!(
            config.contains(&entry),
            "clippy.toml no longer disallows `{path}`"
        );
    }
}

/// Where each `Result<T, E>` of `code` names `String` as its error type:
/// the 1-based lines. Generic arguments nest (`Result<Vec<String>, E>` is
/// not one); an arrow's `>` (`Result<impl Fn() -> T, E>`) closes nothing.
fn string_errors(code: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (start, _) in code.match_indices("Result<") {
        let after = &code[start + "Result<".len()..];
        let (mut depth, mut comma, mut previous) = (0usize, None, ' ');
        for (i, c) in after.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                ')' | ']' => depth = depth.saturating_sub(1),
                '>' if previous == '-' => {}
                '>' if depth > 0 => depth -= 1,
                '>' => {
                    let error = comma.map(|at: usize| after[at + 1..i].trim());
                    if error.is_some_and(|e| e.trim_end_matches(',').trim_end() == "String") {
                        found.push(code[..start].lines().count().max(1));
                    }
                    break;
                }
                ',' if depth == 0 && comma.is_none() => comma = Some(i),
                _ => {}
            }
            previous = c;
        }
    }
    found
}

/// Errors with a type and a subject (issue #45): no function of the
/// shipped crate fails with a bare `String`, which callers could only
/// match on by its words. The CLI's last word is `CliError`.
#[test]
fn no_function_of_the_shipped_crate_fails_with_a_bare_string() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("core/src"), &mut files);
    let mut report = String::new();
    for file in &files {
        let code =
            strip_comments_and_literals(&std::fs::read_to_string(file).expect("readable source"));
        for line in string_errors(&code) {
            let relative = file.strip_prefix(&root).unwrap_or(file);
            writeln!(report, "{}:{line}", relative.display()).expect("write to string");
        }
    }
    assert!(
        report.is_empty(),
        "a failure is a typed error (core::errors), not a String:\n{report}"
    );
}

#[test]
fn the_string_error_scanner_finds_only_a_string_in_the_error_place() {
    let check = |code: &str, expect: &[usize]| {
        assert_eq!(string_errors(code), expect, "code:\n{code}");
    };
    check("fn f() -> Result<(), String> {}", &[1]);
    check("fn f()\n-> Result<Vec<String>, String> {}", &[2]);
    check("fn f() -> Result<BTreeMap<&str, String>, E> {}", &[]);
    check("fn f() -> Result<(Arc<dyn S>, C),\n    String,\n> {}", &[1]);
    check("fn f() -> Result<impl Fn() -> String, E> {}", &[]);
    check("fn f() -> io::Result<String> {}", &[]);
}

/// The crates `stead-core` may depend on, directly: data types, parsing and
/// digests, each reviewed. A new one is a decision, made here.
const CORE_DIRECT_DEPENDENCIES: &[&str] = &[
    "foldhash",
    "jiff",
    "serde",
    "serde_json",
    "sha2",
    "thiserror",
    "toml",
];

/// What nothing in the core's dependency tree may be: async runtimes,
/// storage, the container runtime, HTTP, logging, global randomness.
const CORE_FORBIDDEN_CRATES: &[&str] = &[
    "tokio",
    "madsim",
    "madsim-tokio",
    "futures",
    "futures-util",
    "async-trait",
    "mio",
    "sqlx",
    "sqlx-core",
    "bollard",
    "reqwest",
    "hyper",
    "axum",
    "tracing",
    "log",
    "rand",
    "getrandom",
    "libc",
];

/// The names of the packages in `stead-core`'s normal dependency tree, as
/// cargo resolves it when building the core alone (`cargo tree`), down to
/// `depth` (1: its direct dependencies).
fn core_dependencies(depth: Option<u32>) -> Vec<String> {
    let mut command = std::process::Command::new(env!("CARGO"));
    command
        .current_dir(repo_root())
        .args(["tree", "--locked", "-p", "stead-core", "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"]);
    if let Some(depth) = depth {
        command.args(["--depth", &depth.to_string()]);
    }
    let output = command.output().expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "stead-core")
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_core_crate_depends_on_nothing_async_stored_networked_or_logging() {
    let closure = core_dependencies(None);
    let direct = core_dependencies(Some(1));
    assert!(
        closure.iter().any(|name| name == "jiff"),
        "the closure was not read: {closure:?}"
    );
    let forbidden: Vec<_> = closure
        .iter()
        .filter(|name| CORE_FORBIDDEN_CRATES.contains(&name.as_str()))
        .collect();
    assert!(
        forbidden.is_empty(),
        "stead-core's dependency tree holds {forbidden:?}; the core stays pure \
         (docs/ARCHITECTURE.md, \"Invariants\")"
    );
    let unreviewed: Vec<_> = direct
        .iter()
        .filter(|name| !CORE_DIRECT_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(
        unreviewed.is_empty(),
        "stead-core depends on {unreviewed:?}, which tests/core_purity.rs has not \
         reviewed (CORE_DIRECT_DEPENDENCIES)"
    );
}
