//! `Idempotency-Key` on `POST /v1/instances`: a create sent again with the
//! same key (a client retrying after a lost answer) answers the instance
//! the first one made, and makes nothing; the same key with another body
//! is refused. The create itself is idempotent by name too (`exists_ok`),
//! so a retry after a daemon restart, when this memory is gone, still
//! makes no second instance.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Keys remembered at most; the oldest are forgotten first.
pub const KEYS_MAX: usize = 10_000;
/// Longest key accepted, in bytes.
pub const KEY_LEN_MAX: usize = 255;

/// What one key was used for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Used {
    /// A hash of the request's body.
    pub fingerprint: u64,
    /// The instance it created.
    pub instance: String,
}

#[derive(Default)]
pub struct Idempotency {
    /// (token, key, use), oldest first.
    used: Mutex<VecDeque<(i64, String, Used)>>,
}

impl Idempotency {
    pub fn lookup(&self, token: i64, key: &str) -> Option<Used> {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.iter()
            .rev()
            .find(|(t, k, _)| *t == token && k == key)
            .map(|(_, _, u)| u.clone())
    }

    pub fn remember(&self, token: i64, key: &str, use_: Used) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if used.len() >= KEYS_MAX {
            used.pop_front();
        }
        used.push_back((token, key.to_owned(), use_));
    }
}

/// The fingerprint of a request body: equal bodies, equal fingerprints
/// (std's hasher with its fixed keys, so it is the same every run).
pub fn fingerprint(body: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    hasher.finish()
}

/// Whether `key` is one the API takes: 1 to 255 visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= KEY_LEN_MAX && key.bytes().all(|b| b.is_ascii_graphic())
}
