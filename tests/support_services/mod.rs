//! Helpers shared by the tests that talk to real services (Docker, Caddy).
//! Each test crate includes this with `mod support_services;` and uses what it
//! needs, hence the `dead_code` allowance.
#![allow(dead_code)]
// Test names use the wall clock for uniqueness across runs.
#![allow(clippy::disallowed_methods)]

pub mod caddy;
pub mod chromium;
pub mod docker;
pub mod webhook_receiver;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A name no other test run shares: process ID, a per-process counter and
/// the clock's low bits, so concurrent runs and reruns never collide.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}{}x{n}x{nanos:x}", std::process::id())
}

/// A loopback port that was free a moment ago, and that no other test
/// process of this machine is handed while this one lives. The kernel may
/// give two processes the same ephemeral port once each released it, and
/// Caddy binds its listeners with `SO_REUSEPORT`: two tests' servers then
/// share the port and the kernel splits the connections between them (CI
/// once saw every other HTTPS request of `e2e_https` answered in plain
/// HTTP by another test's server). Each port handed out is claimed by an
/// advisory lock on a file named after it, held until the process exits.
pub fn free_port() -> u16 {
    static CLAIMED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("stead-test-ports");
    std::fs::create_dir_all(&dir).expect("create the test ports' lock directory");
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
        let port = listener.local_addr().expect("local address").port();
        drop(listener);
        let claim = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
            .expect("open a test port's lock file");
        if claim.try_lock().is_ok() {
            CLAIMED.lock().expect("poisoned").push(claim);
            return port;
        }
    }
}
