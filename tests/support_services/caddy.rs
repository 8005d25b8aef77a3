//! Caddy for tests: a private `caddy run` per test, its admin API on a free
//! loopback port, its state in a temporary folder, killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;

/// Bound on waiting for a fresh Caddy to answer on its admin port.
const ADMIN_WAIT_TRIES_MAX: u32 = 100; // x 100 ms

pub struct CaddyProcess {
    pub admin_addr: String,
    child: Child,
    // Kept for its Drop: Caddy's config, data and autosave live here.
    _dir: tempfile::TempDir,
}

impl CaddyProcess {
    /// Starts Caddy or fails the test saying why (not installed, did not
    /// answer): these tests run against the real proxy or not at all.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary folder for caddy");
        let admin_addr = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("caddy.json");
        let json = format!(r#"{{"admin": {{"listen": "{admin_addr}"}}}}"#);
        std::fs::write(&config, json).expect("write caddy config");
        let child = Command::new("caddy")
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("XDG_CONFIG_HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run caddy ({e}); run `scripts/services up` first"));
        let process = Self {
            admin_addr,
            child,
            _dir: dir,
        };
        process.wait_for_admin().await;
        process
    }

    async fn wait_for_admin(&self) {
        let client = reqwest::Client::new();
        let url = format!("http://{}/config/", self.admin_addr);
        for _ in 0..ADMIN_WAIT_TRIES_MAX {
            if client.get(&url).send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("caddy did not answer on {} within 10 s", self.admin_addr);
    }
}

impl Drop for CaddyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
