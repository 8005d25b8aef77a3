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
    dir: tempfile::TempDir,
}

impl CaddyProcess {
    /// Starts Caddy or fails the test saying why (not installed, did not
    /// answer): these tests run against the real proxy or not at all.
    pub async fn start() -> Self {
        Self::start_with_admin(|_| format!("127.0.0.1:{}", free_port())).await
    }

    /// Caddy with its admin API on a unix socket in its folder
    /// (`unix//…/admin.sock`), and on no TCP port.
    pub async fn start_on_unix_socket() -> Self {
        Self::start_with_admin(|dir| format!("unix/{}", dir.join("admin.sock").display())).await
    }

    async fn start_with_admin(admin: impl FnOnce(&std::path::Path) -> String) -> Self {
        let dir = tempfile::tempdir().expect("temporary folder for caddy");
        let admin_addr = admin(dir.path());
        let config = dir.path().join("caddy.json");
        let json = format!(r#"{{"admin": {{"listen": "{admin_addr}"}}}}"#);
        std::fs::write(&config, json).expect("write caddy config");
        let child = Self::spawn(dir.path());
        let process = Self {
            admin_addr,
            child,
            dir,
        };
        process.wait_for_admin().await;
        process
    }

    fn spawn(dir: &std::path::Path) -> Child {
        Command::new("caddy")
            .arg("run")
            .arg("--config")
            .arg(dir.join("caddy.json"))
            .env("XDG_CONFIG_HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("HOME", dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run caddy ({e}); run `scripts/services up` first"))
    }

    /// `caddy stop` then `caddy run` without `--resume`: Caddy comes back
    /// on the same admin port with its startup config only, every route
    /// and stead's server gone.
    pub async fn restart_without_resume(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.dir.path());
        self.wait_for_admin().await;
    }

    async fn wait_for_admin(&self) {
        if let Some(socket) = self.admin_addr.strip_prefix("unix/") {
            for _ in 0..ADMIN_WAIT_TRIES_MAX {
                if tokio::net::UnixStream::connect(socket).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("caddy did not answer on {socket} within 10 s");
        }
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
