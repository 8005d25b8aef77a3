//! Rooms a reader can hold (issue #45): no file of the engine over 300
//! lines, no function of the shipped crates (`src/`, `core/src/`) over 100.
//! A reader enters the engine through its files and a rule through its
//! function; past these sizes they stop being read whole.

use std::path::{Path, PathBuf};

const ENGINE_FILE_LINES_MAX: usize = 300;
const FUNCTION_LINES_MAX: usize = 100;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// Whether `line` opens a function: `fn name` after any visibility and
/// qualifiers, at the start of the line's code.
fn opens_function(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        if let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    for prefix in ["const ", "async ", "unsafe "] {
        if let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// Every function in `source` longer than `max` lines, as (first line,
/// name, length): from its `fn` line to the line closing it at the same
/// indentation (rustfmt's layout, which `cargo fmt --check` holds the tree
/// to). A declaration without a body (a trait's method ends in `;` before
/// any `{`) is no function here.
fn long_functions(source: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = opens_function(line) else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        // The signature ends at the first line ending in `{` or `;`.
        let Some(sig_end) = (start..lines.len()).find(|&i| {
            let t = lines[i].trim_end();
            t.ends_with('{') || t.ends_with(';') || t.ends_with('}')
        }) else {
            continue;
        };
        let t = lines[sig_end].trim_end();
        if t.ends_with(';') || (sig_end == start && t.ends_with('}')) {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(end) = (sig_end..lines.len()).find(|&i| lines[i].trim_end() == close) else {
            continue;
        };
        let length = end - start + 1;
        if length > max {
            found.push((start + 1, name.to_owned(), length));
        }
    }
    found
}

#[test]
fn no_function_of_the_shipped_crates_is_over_a_hundred_lines() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("core/src"), &mut files);
    assert!(
        files.len() > 50,
        "expected the crates' sources, found {}",
        files.len()
    );
    let mut report = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).expect("readable source");
        for (line, name, length) in long_functions(&source, FUNCTION_LINES_MAX) {
            let relative = file.strip_prefix(&root).unwrap_or(file);
            report.push(format!(
                "{}:{line}: fn {name} is {length} lines",
                relative.display()
            ));
        }
    }
    assert!(
        report.is_empty(),
        "split these by what each part does (at most {FUNCTION_LINES_MAX} lines):\n{}",
        report.join("\n")
    );
}

#[test]
fn no_file_of_the_engine_is_over_three_hundred_lines() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("src/engine"), &mut files);
    assert!(
        files.len() > 10,
        "expected the engine's files, found {files:?}"
    );
    let report: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file)
                .expect("readable source")
                .lines()
                .count();
            (lines > ENGINE_FILE_LINES_MAX).then(|| {
                let relative = file.strip_prefix(&root).unwrap_or(file);
                format!("{}: {lines} lines", relative.display())
            })
        })
        .collect();
    assert!(
        report.is_empty(),
        "split these by concern (at most {ENGINE_FILE_LINES_MAX} lines):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_measure_finds_long_functions_and_passes_over_declarations() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let long = format!("pub fn long(a: u8) -> u8 {{\n{}}}\n", body(101));
    assert_eq!(
        long_functions(&long, 100),
        vec![(1, "long".to_owned(), 103)]
    );
    let short = format!("fn short() {{\n{}}}\n", body(98));
    assert!(long_functions(&short, 100).is_empty());
    let wrapped = format!(
        "impl X {{\n    pub(crate) async fn wrapped(\n        a: u8,\n    ) -> u8 {{\n{}    }}\n}}\n",
        body(100)
    );
    assert_eq!(
        long_functions(&wrapped, 100),
        vec![(2, "wrapped".to_owned(), 104)]
    );
    let declaration = format!(
        "trait T {{\n    fn declared(\n        a: u8,\n    ) -> u8;\n{}}}\n",
        body(200)
    );
    assert!(long_functions(&declaration, 100).is_empty());
    assert!(long_functions("fn one() {}\n", 0).is_empty());
}
