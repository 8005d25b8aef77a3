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

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    listener.local_addr().expect("local address").port()
}
