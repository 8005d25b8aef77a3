//! Headless Chromium (Debian's `chromium`, which `scripts/services`
//! installs) for the tests that render the status page (#42): the DOM it
//! builds, or a screenshot kept in the CI artifacts.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one Chromium run may take.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(90);

/// Where screenshots go: `$STEAD_ARTIFACTS_DIR`, else `target/artifacts/`.
pub fn artifacts_dir() -> PathBuf {
    let dir = std::env::var_os("STEAD_ARTIFACTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Runs headless Chromium with `args` then `url` (its own profile in a
/// temporary directory, so runs in parallel never share one); its
/// standard output. Fails, saying how to get it, when there is none.
pub async fn chromium(args: &[&str], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CHROMIUM_DEADLINE, run).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "chromium is not installed: the status page is tested in headless Chromium; \
             install Debian's package (`apt-get install -y chromium`, which scripts/services does)"
        ),
        Ok(Err(e)) => panic!("chromium could not run: {e}"),
        Err(_) => panic!("chromium {args:?} {url} took longer than {CHROMIUM_DEADLINE:?}"),
    };
    assert!(
        output.status.success(),
        "chromium {args:?} {url}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The DOM headless Chromium builds from `url`, serialised.
pub async fn dump_dom(url: &str) -> String {
    chromium(&["--dump-dom"], url).await
}
