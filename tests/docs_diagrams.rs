//! The diagrams in the documentation are Mermaid blocks (GitHub renders
//! them) that must not rot. Each block says what it is checked against on
//! a `%% check:` line:
//!
//! - `lifecycle`: its states are exactly `InstanceState::ALL` and its
//!   arrows exactly the steps `InstanceState::can_become` allows;
//! - `ladder`: each failure's next start is what `RecoveryPolicy::default()`
//!   says, and the reset window its `stable_window`;
//! - `recovery`: it names the rules of the recovery machine, R4 to R13;
//! - `paths`: every `src/...` path it names exists;
//! - `keys`: every config key it names is one `stead.toml` accepts;
//! - `commands`: every `stead ...` command it shows is one the CLI has.
//!
//! And every rule the repository quotes (R1–R17, C1–C11, T1–T7, S1–S11,
//! L1–L5) is defined in `docs/rules.md`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use stead::core::fleet::InstanceState;
use stead::core::policy::RecoveryPolicy;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every Markdown file a reader meets: the README and `docs/`.
fn documents() -> Vec<(String, String)> {
    let mut files = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(ROOT).unwrap().display().to_string(), text)
        })
        .collect()
}

/// A Mermaid block: where it is, its checks, its text.
struct Diagram {
    file: String,
    checks: Vec<String>,
    text: String,
}

fn diagrams() -> Vec<Diagram> {
    let mut out = Vec::new();
    for (file, doc) in documents() {
        let mut rest = doc.as_str();
        while let Some(start) = rest.find("```mermaid\n") {
            let body = &rest[start + "```mermaid\n".len()..];
            let end = body.find("```").expect("unterminated mermaid block");
            let text = body[..end].to_owned();
            let checks = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("%% check:"))
                .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .collect();
            out.push(Diagram {
                file: file.clone(),
                checks,
                text,
            });
            rest = &body[end + 3..];
        }
    }
    out
}

fn with_check(check: &str) -> Vec<Diagram> {
    let found: Vec<Diagram> = diagrams()
        .into_iter()
        .filter(|d| d.checks.iter().any(|c| c == check))
        .collect();
    assert!(!found.is_empty(), "no diagram is checked for {check}");
    found
}

#[test]
fn every_diagram_says_what_it_is_checked_against_and_reads_as_mermaid() {
    let known = [
        "lifecycle",
        "ladder",
        "recovery",
        "paths",
        "keys",
        "commands",
    ];
    let all = diagrams();
    assert!(
        all.len() >= 8,
        "components, request path, lifecycle, recovery, ladder, three topologies"
    );
    for d in &all {
        assert!(
            !d.checks.is_empty(),
            "{}: a diagram without %% check:\n{}",
            d.file,
            d.text
        );
        for c in &d.checks {
            assert!(known.contains(&c.as_str()), "{}: unknown check {c}", d.file);
        }
        let kind = d
            .text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("%%"))
            .unwrap_or("");
        assert!(
            kind.starts_with("flowchart ") || kind == "stateDiagram-v2",
            "{}: not a diagram kind this test knows: {kind}",
            d.file
        );
        // Cheap syntax sanity: quotes and brackets balance on each line.
        for line in d.text.lines() {
            assert_eq!(
                line.matches('"').count() % 2,
                0,
                "{}: unbalanced quote: {line}",
                d.file
            );
            for (open, close) in [('[', ']'), ('(', ')'), ('{', '}')] {
                let outside: String = line.split('"').step_by(2).collect();
                assert_eq!(
                    outside.matches(open).count(),
                    outside.matches(close).count(),
                    "{}: unbalanced {open}{close}: {line}",
                    d.file
                );
            }
        }
    }
}

#[test]
fn the_lifecycle_diagram_is_the_instance_state_machine() {
    for d in with_check("lifecycle") {
        let mut states = BTreeSet::new();
        let mut arrows = BTreeSet::new();
        for line in d.text.lines() {
            let Some((from, rest)) = line.split_once("-->") else {
                continue;
            };
            let to = rest.split(':').next().unwrap().trim();
            let from = from.trim();
            for s in [from, to] {
                if s != "[*]" {
                    states.insert(s.to_owned());
                }
            }
            if from != "[*]" && to != "[*]" {
                assert!(
                    arrows.insert((from.to_owned(), to.to_owned())),
                    "{line} twice"
                );
            }
        }
        let expected_states: BTreeSet<String> = InstanceState::ALL
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        assert_eq!(states, expected_states, "{}", d.file);
        let mut expected_arrows = BTreeSet::new();
        for from in InstanceState::ALL {
            for to in InstanceState::ALL {
                if from != to && from.can_become(to) {
                    expected_arrows.insert((from.as_str().to_owned(), to.as_str().to_owned()));
                }
            }
        }
        assert_eq!(arrows, expected_arrows, "{}", d.file);
    }
}

#[test]
fn the_budget_ladder_diagram_is_the_default_policy() {
    let policy = RecoveryPolicy::default();
    for d in with_check("ladder") {
        let mut seen = 0;
        for line in d.text.lines() {
            for node in line.split('"').skip(1).step_by(2) {
                let Some(rest) = node.strip_prefix("failure ") else {
                    if let Some(minutes) =
                        node.strip_suffix(" stable minutes: history dropped (R14)")
                    {
                        let minutes: u64 = minutes.parse().expect("minutes");
                        assert_eq!(minutes * 60, policy.stable_window.as_secs(), "{node}");
                        seen += 1;
                    }
                    continue;
                };
                let (n, next) = rest.split_once(": next start ").expect(node);
                let (n, and_later) = match n.strip_suffix('+') {
                    Some(n) => (n.parse::<u32>().unwrap(), true),
                    None => (n.parse::<u32>().unwrap(), false),
                };
                let shown = match next {
                    "at once" => None,
                    later => Some(
                        later
                            .strip_prefix("in ")
                            .and_then(|m| m.strip_suffix(" min"))
                            .and_then(|m| m.parse::<u64>().ok())
                            .expect(node)
                            * 60,
                    ),
                };
                let failures = if and_later { n..=n + 5 } else { n..=n };
                for f in failures {
                    assert_eq!(
                        shown,
                        policy.delay_after(f).map(|d| d.as_secs()),
                        "{}: after failure {f}: {node}",
                        d.file
                    );
                }
                seen += 1;
            }
        }
        assert!(seen >= 8, "{}: the ladder and its reset", d.file);
    }
}

#[test]
fn the_recovery_diagram_names_every_rule_of_the_machine() {
    for d in with_check("recovery") {
        for rule in 4..=13 {
            assert!(
                d.text.contains(&format!("R{rule})")),
                "{}: R{rule} missing",
                d.file
            );
        }
    }
}

#[test]
fn every_path_a_diagram_names_exists() {
    for d in with_check("paths") {
        let paths: Vec<&str> = d
            .text
            .split(|c: char| c.is_whitespace() || c == '"' || c == '<' || c == '>')
            .filter(|w| w.starts_with("src/"))
            .collect();
        assert!(!paths.is_empty(), "{}", d.file);
        for path in paths {
            assert!(
                Path::new(ROOT).join(path).exists(),
                "{}: {path} does not exist",
                d.file
            );
        }
    }
}

#[test]
fn every_config_key_a_diagram_names_exists() {
    use stead::config::daemon::KEYS;
    for d in with_check("keys") {
        let tables = ["caddy.", "docker.", "control.", "recovery.", "helm."];
        let keys: Vec<&str> = d
            .text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '/'))
            .filter(|w| tables.iter().any(|t| w.starts_with(t)))
            .collect();
        assert!(!keys.is_empty(), "{}", d.file);
        for key in keys {
            assert!(KEYS.contains(&key), "{}: {key} is not a config key", d.file);
        }
    }
}

#[test]
fn every_command_a_diagram_shows_exists() {
    let run_help = help(&["run"]);
    for d in with_check("commands") {
        let mut n = 0;
        for line in d.text.lines() {
            for label in line.split('"').skip(1).step_by(2) {
                let command = label.split("<br/>").next().unwrap();
                let Some(args) = command.strip_prefix("stead ") else {
                    continue;
                };
                let words: Vec<&str> = args.split_whitespace().collect();
                let subcommand: Vec<&str> = words
                    .iter()
                    .copied()
                    .take_while(|w| !w.starts_with('-'))
                    .collect();
                help(&subcommand);
                if let Some(i) = words.iter().position(|w| *w == "--role") {
                    let role = words[i + 1];
                    assert!(run_help.contains(role), "{}: no role {role}", d.file);
                }
                n += 1;
            }
        }
        assert!(n > 0, "{}: no stead command", d.file);
    }
}

/// `stead <subcommand> --help`, which must succeed.
fn help(subcommand: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stead"))
        .args(subcommand)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stead {subcommand:?} is not a command: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Rule names as the repository quotes them: R, C, T, S or L and a number,
/// standing alone.
fn rule_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if !matches!(b, b'R' | b'C' | b'T' | b'S' | b'L') {
            continue;
        }
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
            continue;
        }
        let digits: String = text[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let after = bytes.get(i + 1 + digits.len());
        let standalone = after.is_none_or(|a| !(a.is_ascii_alphanumeric() || *a == b'_'));
        if !digits.is_empty() && digits.len() <= 2 && standalone {
            names.insert(format!("{}{digits}", b as char));
        }
    }
    names
}

#[test]
fn every_rule_the_repository_quotes_is_defined_in_rules_md() {
    let rules = std::fs::read_to_string(Path::new(ROOT).join("docs/rules.md")).unwrap();
    let defined = |name: &str| {
        let n = name.to_ascii_lowercase();
        rules.contains(&format!("<a id=\"{n}\"></a>**{name} "))
            || rules.contains(&format!("- **{name}** "))
    };
    let in_range = |name: &str| {
        let n: u32 = name[1..].parse().unwrap();
        match &name[..1] {
            "R" => (1..=17).contains(&n),
            "C" => (1..=11).contains(&n),
            "T" => (1..=7).contains(&n),
            "S" => (1..=11).contains(&n),
            _ => (1..=5).contains(&n),
        }
    };
    for name in [
        "R1", "R17", "C1", "C11", "T1", "T7", "S1", "S11", "L1", "L5",
    ] {
        assert!(defined(name), "docs/rules.md does not define {name}");
    }
    let mut sources: Vec<(String, String)> = documents();
    for dir in ["src", "scripts"] {
        collect(&Path::new(ROOT).join(dir), &mut sources);
    }
    for (file, text) in sources {
        for name in rule_names(&text) {
            // Other things look like rule names (S3 buckets, T0 times);
            // only the families' ranges are rules.
            if in_range(&name) {
                assert!(
                    defined(&name),
                    "{file} quotes {name}, which docs/rules.md does not define"
                );
            }
        }
    }
}

fn collect(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            out.push((path.display().to_string(), text));
        }
    }
}

#[test]
fn every_rules_link_points_at_an_anchor() {
    let rules = std::fs::read_to_string(Path::new(ROOT).join("docs/rules.md")).unwrap();
    let mut sources = documents();
    collect(&Path::new(ROOT).join("src"), &mut sources);
    for (file, text) in sources {
        for (i, _) in text.match_indices("rules.md#") {
            let anchor: String = text[i + "rules.md#".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            assert!(
                rules.contains(&format!("<a id=\"{anchor}\"></a>")),
                "{file}: rules.md#{anchor} has no anchor"
            );
        }
    }
}

#[test]
fn every_file_the_docs_and_scripts_name_exists() {
    let mut sources = documents();
    collect(&Path::new(ROOT).join("scripts"), &mut sources);
    let mut named = 0;
    for (file, text) in sources {
        for word in text.split(|c: char| c.is_whitespace() || "`'\"(),:;|".contains(c)) {
            let path = word.trim_end_matches('.');
            let is_file = [
                "tests/",
                "src/",
                "benches/",
                "scripts/",
                "examples/",
                "docs/",
            ]
            .iter()
            .any(|dir| path.starts_with(dir))
                && [".rs", ".md", ".toml", ".sql"]
                    .iter()
                    .any(|ext| path.ends_with(ext))
                && !path.contains('*')
                && !path.contains('<');
            if is_file {
                named += 1;
                assert!(
                    Path::new(ROOT).join(path).exists(),
                    "{file} names {path}, which does not exist"
                );
            }
        }
    }
    assert!(named > 20, "{named}");
}
