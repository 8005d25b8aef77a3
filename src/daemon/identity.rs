//! A daemon's identity (T1): who it is across restarts on the same data
//! directory, and the guarantee that no two processes are it at once.
//!
//! The identity is a name kept in `<state_dir>/identity`, made once from
//! the host name and random bits. A process is that identity only while it
//! holds an exclusive lock on `<state_dir>/identity.lock`, which the kernel
//! drops the instant the process dies, however it dies. Each run adds a
//! fresh incarnation, so lease and lock holders read
//! `<identity>#<incarnation>`: a restarted daemon is recognised as the same
//! identity yet never confused with its predecessor (whose fenced writes
//! are rejected).
//!
//! The lock proves a predecessor gone only where it is the same lock: a
//! copied `state_dir` or a cloned VM image has the identity file without
//! the lock. So the incarnation reads `<site>.<nonce>`, the site naming
//! this very lock (the kernel's boot id and the lock file's device and
//! inode): only a predecessor at the same site is taken over at once (its
//! reconciler lease, its instance locks, its running tasks); an incarnation
//! at another site is a twin, waited for (`core::succession`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::core::succession::SITE_SEPARATOR;
use crate::engine::lease::ProcessIdentity;

/// Longest identity name accepted from the file.
const IDENTITY_LEN_MAX: usize = 80;
/// An in-process restart (tests) may find its predecessor's lock for a
/// moment while the predecessor is being dropped; a real second process
/// keeps it, and is refused after this.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(3);
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// Why the identity could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("state_dir {dir}: {what}: {source}")]
    Io {
        dir: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state_dir {dir}: another stead process{pid} is this daemon's identity; two daemons cannot share a data directory (give each its own state_dir)"
    )]
    Taken { dir: PathBuf, pid: String },
    #[error("state_dir {dir}: identity file holds {value:?}, not an identity (letters, digits and '-', at most {IDENTITY_LEN_MAX}); remove it to make a new one")]
    Bad { dir: PathBuf, value: String },
}

/// The identity this process holds; the lock is held until it is dropped.
#[derive(Debug)]
pub struct Identity {
    pub process: ProcessIdentity,
    _lock: File,
}

impl Identity {
    /// Takes the identity of `state_dir` (creating it on first use) with a
    /// new incarnation drawn from `seed`.
    pub async fn take(state_dir: &Path, seed: u64) -> Result<Identity, IdentityError> {
        let io = |what: &'static str| {
            move |source| IdentityError::Io {
                dir: state_dir.to_owned(),
                what,
                source,
            }
        };
        std::fs::create_dir_all(state_dir).map_err(io("create"))?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(state_dir.join("identity.lock"))
            .map_err(io("open identity.lock"))?;
        let mut waited = Duration::ZERO;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if waited < LOCK_WAIT_MAX => {
                    tokio::time::sleep(LOCK_RETRY).await;
                    waited += LOCK_RETRY;
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(IdentityError::Taken {
                        dir: state_dir.to_owned(),
                        pid: holder_pid(&lock),
                    })
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock identity.lock")(e)),
            }
        }
        // Say who holds it, for the error the next taker would see.
        lock.set_len(0).map_err(io("write identity.lock"))?;
        (&lock)
            .write_all(std::process::id().to_string().as_bytes())
            .map_err(io("write identity.lock"))?;
        let identity = read_or_make(state_dir, seed)?;
        let nonce = (seed >> 32) as u32 ^ std::process::id();
        Ok(Identity {
            process: ProcessIdentity {
                identity,
                incarnation: format!("{}{SITE_SEPARATOR}{nonce:08x}", lock_site(&lock, seed)),
            },
            _lock: lock,
        })
    }
}

/// Where the kernel's boot id is read (Linux; containers share the host's).
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// A boot id is a UUID (36 characters and a newline).
const BOOT_ID_LEN_MAX: u64 = 64;
/// Hex digits of a site: 48 bits, so two sites of one identity never meet
/// by chance.
const SITE_HEX_LEN: usize = 12;

/// The site of the identity lock this process holds (T1): a digest of the
/// kernel's boot id and the lock file's device and inode. Two processes
/// with one site held the very same lock, one after the other, on one
/// running kernel; a copy of the directory (another inode) or a clone of
/// the machine (another boot) has another site. Without a boot id or the
/// file's metadata nothing can be proven, so the site is this run's own
/// (drawn from `seed`) and no later incarnation will match it: its restart
/// waits for the lease to expire.
fn lock_site(lock: &File, seed: u64) -> String {
    use sha2::Digest;
    use std::os::unix::fs::MetadataExt;
    let boot_id = crate::config::read_bounded(Path::new(BOOT_ID_PATH), BOOT_ID_LEN_MAX);
    let (boot_id, meta) = match (boot_id, lock.metadata()) {
        (Ok(boot_id), Ok(meta)) if !boot_id.trim().is_empty() => (boot_id, meta),
        _ => {
            tracing::warn!(
                "cannot tell this identity lock from a copy (no {BOOT_ID_PATH}): a restart \
                 of this daemon will wait for its own reconciler lease to expire"
            );
            return format!("{:0width$x}", seed & 0xffff_ffff_ffff, width = SITE_HEX_LEN);
        }
    };
    let digest = sha2::Sha256::digest(format!("{}:{}:{}", boot_id.trim(), meta.dev(), meta.ino()));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..SITE_HEX_LEN].to_owned()
}

fn holder_pid(lock: &File) -> String {
    let mut text = String::new();
    let _ = lock.take(32).read_to_string(&mut text);
    let pid = text.trim();
    if pid.is_empty() {
        String::new()
    } else {
        format!(" (pid {pid})")
    }
}

fn read_or_make(state_dir: &Path, seed: u64) -> Result<String, IdentityError> {
    let path = state_dir.join("identity");
    let io = |what: &'static str| {
        move |source| IdentityError::Io {
            dir: state_dir.to_owned(),
            what,
            source,
        }
    };
    match File::open(&path) {
        Ok(file) => {
            let mut text = String::new();
            file.take(IDENTITY_LEN_MAX as u64 + 2)
                .read_to_string(&mut text)
                .map_err(io("read identity"))?;
            let value = text.trim();
            if is_identity(value) {
                Ok(value.to_owned())
            } else {
                Err(IdentityError::Bad {
                    dir: state_dir.to_owned(),
                    value: value.chars().take(IDENTITY_LEN_MAX + 2).collect(),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let identity = format!("{}-{:08x}", host_label(), seed as u32);
            // Written aside and renamed, so a crash never leaves half a name.
            let aside = state_dir.join("identity.new");
            std::fs::write(&aside, format!("{identity}\n")).map_err(io("write identity"))?;
            std::fs::rename(&aside, &path).map_err(io("write identity"))?;
            Ok(identity)
        }
        Err(e) => Err(io("open identity")(e)),
    }
}

/// Longest host name read from `/etc/hostname` (a DNS name is at most 253).
const HOSTNAME_LEN_MAX: u64 = 255;

fn is_identity(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= IDENTITY_LEN_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The host name as a label: what the identity starts with, so operators
/// recognise it in `locked_by` and lease rows.
fn host_label() -> String {
    let host = crate::config::read_bounded(Path::new("/etc/hostname"), HOSTNAME_LEN_MAX)
        .unwrap_or_default();
    let label: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    let label = label.trim_matches('-');
    if label.is_empty() {
        "stead".to_owned()
    } else {
        label.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_restart_keeps_the_identity_and_changes_the_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        let first = Identity::take(dir.path(), 1).await.unwrap();
        let name = first.process.identity.clone();
        drop(first);
        let second = Identity::take(dir.path(), 2 << 32).await.unwrap();
        assert_eq!(second.process.identity, name);
        assert_ne!(
            second.process.holder(),
            format!("{name}#{:08x}", std::process::id())
        );
    }

    #[tokio::test]
    async fn a_restart_keeps_its_site_and_a_copied_state_dir_gets_another() {
        use crate::core::succession::{succession, Succession};
        let dir = tempfile::tempdir().unwrap();
        let first = Identity::take(dir.path(), 1).await.unwrap();
        let first_holder = first.process.holder();
        drop(first);
        let restarted = Identity::take(dir.path(), 2 << 32).await.unwrap();
        assert_eq!(
            succession(&first_holder, &restarted.process.holder()),
            Succession::Predecessor,
            "{first_holder} -> {}",
            restarted.process.holder()
        );
        let copy = tempfile::tempdir().unwrap();
        for file in ["identity", "identity.lock"] {
            std::fs::copy(dir.path().join(file), copy.path().join(file)).unwrap();
        }
        let twin = Identity::take(copy.path(), 3 << 32).await.unwrap();
        assert_eq!(twin.process.identity, restarted.process.identity);
        assert_eq!(
            succession(&restarted.process.holder(), &twin.process.holder()),
            Succession::Twin,
            "a copy holds another lock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn two_holders_of_one_data_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Identity::take(dir.path(), 1).await.unwrap();
        let second = Identity::take(dir.path(), 2).await;
        let error = second.expect_err("the identity is taken");
        assert!(
            error.to_string().contains("another stead process"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_bad_identity_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("identity"), "x/../../y").unwrap();
        let error = Identity::take(dir.path(), 1).await.unwrap_err();
        assert!(error.to_string().contains("\"x/../../y\""), "{error}");
    }
}
