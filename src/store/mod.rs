//! Durable state and the task queue: implementations of the [`Store`] port.
//!
//! - `stead_testkit::store::MemoryStore` (`testkit/`, never shipped) is the
//!   model: deterministic, std-only, used by the tests and the madsim
//!   simulation, and the reference the SQL stores are differentially tested
//!   against (`tests/store_differential.rs`).
//! - `sql` (feature `io`, never under madsim) holds [`sql::SqliteStore`] (the
//!   embedded default) and [`sql::PostgresStore`] (production, many hosts).
//!
//! Rules shared by every backend live here, once: how time and durations are
//! normalised to what the database keeps, and who gets the reconciler lease.
//!
//! [`Store`]: crate::ports::Store

use std::time::Duration;

use crate::core::fleet::{InstanceId, InstanceState};
pub use crate::core::succession::identity_of;
use crate::core::succession::{succession, Succession};
use crate::core::types::{InstanceName, Timestamp};
use crate::ports::{LeaseGrant, LockGrant, StoreError};

#[cfg(all(feature = "io", not(madsim)))]
pub mod sql;

/// Why a recorded version of a type could not be read back (#40).
#[derive(Debug, thiserror::Error)]
pub enum RecordedVersionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "version {version:?} of type {service_type} is not recorded (recorded: {known}); \
         stead records each version of a type its daemon loads"
    )]
    NotRecorded {
        service_type: String,
        version: String,
        /// The versions that are, oldest first, or "none".
        known: String,
    },
    #[error(transparent)]
    Invalid(#[from] crate::core::catalog::CatalogError),
}

/// The recorded definition of `version`: the one with `spec_digest` when
/// given and recorded (what an instance at that version was made from),
/// else the version's newest (a pin names a version, not a digest; an
/// instance from before definitions were kept per digest has none).
pub fn recorded_definition<'r>(
    recorded: &'r [crate::ports::TypeVersion],
    version: &str,
    spec_digest: Option<&str>,
) -> Option<&'r crate::ports::TypeVersion> {
    let at_version = || recorded.iter().filter(move |r| r.version == version);
    spec_digest
        .and_then(|digest| at_version().find(|r| r.spec_digest == digest))
        .or_else(|| at_version().max_by_key(|r| r.recorded_at))
}

/// `version` of `service_type` as a daemon recorded it when it loaded it
/// (`rollout undo --to`), read back through `catalog`'s parser and grants
/// (`Catalog::recorded_entry`): what the operator's command, the tick's
/// version drift and the worker all take a pin to mean. With
/// `spec_digest`, that very definition when recorded
/// ([`recorded_definition`]).
pub async fn recorded_entry(
    store: &dyn crate::ports::Store,
    catalog: &crate::core::catalog::Catalog,
    service_type: &str,
    version: &str,
    spec_digest: Option<&str>,
) -> Result<crate::core::catalog::CatalogEntry, RecordedVersionError> {
    let recorded = store.type_versions(service_type).await?;
    let Some(found) = recorded_definition(&recorded, version, spec_digest) else {
        let mut known: Vec<&str> = recorded.iter().map(|r| r.version.as_str()).collect();
        known.dedup();
        return Err(RecordedVersionError::NotRecorded {
            service_type: service_type.to_owned(),
            version: version.to_owned(),
            known: if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        });
    };
    Ok(catalog.recorded_entry(service_type, version, &found.source)?)
}

/// Which backend a connection URL names. Lives here rather than in `sql`
/// so that validating a configured URL needs no database driver (the
/// daemon config is parsed, and fuzzed, without the `io` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// `sqlite:` URLs (e.g. `sqlite:///var/lib/stead/stead.db?mode=rwc`) and
    /// `postgres://` / `postgresql://` URLs.
    pub fn of_url(url: &str) -> Result<Backend, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            let scheme: String = url
                .split(':')
                .next()
                .unwrap_or("")
                .chars()
                .take(32)
                .collect();
            Err(StoreError::Unavailable(format!(
                "database URL scheme {scheme:?} is neither sqlite: nor postgres://"
            )))
        }
    }
}

/// Timestamps are kept as integer microseconds since the Unix epoch in both
/// SQL backends. Integers round-trip exactly (no float, no timezone, no text
/// format to parse), compare correctly in SQL, and an `i64` of microseconds
/// spans jiff's whole range (±10,000 years), which nanoseconds would not.
/// Sub-microsecond precision is dropped; the in-memory model drops it too so
/// every backend observes the same values.
pub fn timestamp_to_us(ts: Timestamp) -> i64 {
    ts.as_microsecond()
}

/// The inverse of [`timestamp_to_us`]; `None` when the integer is outside
/// the representable range (a row written by another tool).
pub fn timestamp_from_us(us: i64) -> Option<Timestamp> {
    // Split by hand: jiff's `from_microsecond` rejects the fractional last
    // second of its range, which `as_microsecond` happily produces.
    let seconds = us.div_euclid(1_000_000);
    let nanos = i32::try_from(us.rem_euclid(1_000_000) * 1_000).ok()?;
    Timestamp::new(seconds, nanos).ok()
}

/// The start of an execution is the one timestamp kept to the nanosecond:
/// it is an identity, compared for equality with what the runtime reports
/// (Docker reports nanoseconds), not a scheduling time. Truncated to
/// microseconds, a restarted daemon and an upgrade's successor would never
/// recognise their verified execution (R17) and would withdraw traffic from
/// a container that never changed. `None` outside the ±292 years an `i64`
/// of nanoseconds spans: such an execution is simply not recorded as
/// verified, and is verified again.
pub fn execution_start_to_ns(ts: Timestamp) -> Option<i64> {
    i64::try_from(ts.as_nanosecond()).ok()
}

/// The inverse of [`execution_start_to_ns`].
pub fn execution_start_from_ns(ns: i64) -> Option<Timestamp> {
    Timestamp::from_nanosecond(i128::from(ns)).ok()
}

/// An execution start as the store will give it back.
pub fn normalize_execution_start(ts: Timestamp) -> Option<Timestamp> {
    execution_start_to_ns(ts).and_then(execution_start_from_ns)
}

/// `ts` as the store will give it back.
pub fn normalize_timestamp(ts: Timestamp) -> Timestamp {
    timestamp_from_us(timestamp_to_us(ts)).expect("a valid timestamp stays valid in microseconds")
}

/// Grace periods are kept as whole milliseconds (`stop_grace_ms`).
pub fn duration_to_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `d` as the store will give it back.
pub fn normalize_duration(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration_to_ms(d)).unwrap_or(u64::MAX))
}

/// A lease length in whole microseconds, rounded *up*: a lease is never
/// broken before it expired, so rounding may only make it longer.
pub fn lease_to_us(lease: Duration) -> i64 {
    let us = lease.as_nanos().div_ceil(1_000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// C6: a running task locked at `locked_at_us` has outlived a lease of
/// `lease_us` at `now_us` only when strictly more than the lease has passed
/// ("older than the lease"). At exactly `locked_at + lease` it is still held.
/// Every backend expresses this as `locked_at_us < lease_cutoff_us(..)`.
pub fn lease_cutoff_us(now_us: i64, lease_us: i64) -> i64 {
    now_us.saturating_sub(lease_us)
}

/// The conflict every backend reports for a name a live instance holds.
pub fn name_taken(name: &InstanceName, id: InstanceId, state: InstanceState) -> StoreError {
    StoreError::Conflict(format!(
        "instance name {name} is taken by instance {id} ({state})"
    ))
}

/// The conflict for the name of a deleted instance a task still works on.
pub fn name_held_by_task(name: &InstanceName, id: InstanceId) -> StoreError {
    StoreError::Conflict(format!(
        "instance name {name} is still held by deleted instance {id}, which has a queued or \
         running task; it is free once that task finishes"
    ))
}

/// The reconciler lease row: one per database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerLeaseRow {
    /// `None` when nobody holds it (never taken, or released).
    pub holder: Option<String>,
    /// Incremented on each change of holder; fenced writes compare it.
    pub epoch: i64,
    pub expires_at_us: Option<i64>,
}

impl ReconcilerLeaseRow {
    /// The row as created by the migrations.
    pub const VACANT: ReconcilerLeaseRow = ReconcilerLeaseRow {
        holder: None,
        epoch: 0,
        expires_at_us: None,
    };

    /// C2: who holds the lease after `holder` asks for it at `now`. Returns
    /// the new row, or `None` while another holder's lease is unexpired.
    ///
    /// - The current holder renews; its epoch stays (nobody else wrote in
    ///   between, so its fenced writes stay valid).
    /// - Anyone takes a vacant or expired lease (`expires_at <= now`: the
    ///   lease covers `[taken, expires_at)`), and the epoch increments so the
    ///   previous holder's fenced writes are rejected from then on.
    /// - A new incarnation of the current holder's identity at the same
    ///   site (the same daemon restarted on the same identity lock, T1:
    ///   [`Succession::Predecessor`]) takes it back at once, unexpired or
    ///   not, and the epoch increments: the identity's file lock proves the
    ///   old incarnation is gone.
    /// - An incarnation of the same identity at another site (a copied
    ///   `state_dir`, a cloned image, or a reboot: [`Succession::Twin`])
    ///   waits for expiry like a stranger: nothing proves the holder gone,
    ///   and a live one would otherwise lose and retake the lease every
    ///   tick while both act.
    ///
    /// `now_us` is the database's clock, never the caller's (T2).
    pub fn acquire(&self, holder: &str, now_us: i64, ttl_us: i64) -> Option<ReconcilerLeaseRow> {
        // Clamped so the grant stays a representable timestamp.
        let expires_at_us = Some(
            now_us
                .saturating_add(ttl_us)
                .min(timestamp_to_us(Timestamp::MAX)),
        );
        let succession = self
            .holder
            .as_deref()
            .map(|current| succession(current, holder));
        if succession == Some(Succession::Renewal) {
            return Some(ReconcilerLeaseRow {
                holder: self.holder.clone(),
                epoch: self.epoch,
                expires_at_us,
            });
        }
        let restarted = succession == Some(Succession::Predecessor);
        let vacant = self.holder.is_none() || self.expires_at_us.is_none_or(|e| e <= now_us);
        (vacant || restarted).then(|| ReconcilerLeaseRow {
            holder: Some(holder.to_owned()),
            epoch: self.epoch + 1,
            expires_at_us,
        })
    }

    /// Whether a fenced write carrying `grant` may proceed at `now_us` (the
    /// database's clock): the grant's holder and epoch are still the current
    /// ones and the lease has not expired. An expired lease nobody took over
    /// admits nothing either: its holder may be a process that was paused
    /// past its lease and does not know it yet.
    pub fn admits(&self, grant: &LeaseGrant, now_us: i64) -> bool {
        self.holder.as_deref() == Some(grant.holder.as_str())
            && self.epoch == grant.epoch
            && self.expires_at_us.is_some_and(|e| now_us < e)
    }

    /// The row after `grant` releases it; unchanged for a stale grant, so a
    /// release is idempotent and can never free someone else's lease.
    pub fn release(&self, grant: &LeaseGrant) -> ReconcilerLeaseRow {
        if self.holder.as_deref() == Some(grant.holder.as_str()) && self.epoch == grant.epoch {
            ReconcilerLeaseRow {
                holder: None,
                epoch: self.epoch,
                expires_at_us: None,
            }
        } else {
            self.clone()
        }
    }

    /// The grant this row represents, if held.
    pub fn grant(&self) -> Option<LeaseGrant> {
        let holder = self.holder.clone()?;
        let expires_at = timestamp_from_us(self.expires_at_us?)?;
        Some(LeaseGrant {
            holder,
            epoch: self.epoch,
            expires_at,
        })
    }
}

/// The error a fenced write returns when its grant is stale.
pub fn fenced(grant: &LeaseGrant) -> StoreError {
    StoreError::Fenced { epoch: grant.epoch }
}

/// The error a write under an instance lock returns once the lock is no
/// longer its holder's (T3, [`crate::ports::Store::write_under_lock`]).
pub fn lock_lost(lock: &LockGrant) -> StoreError {
    StoreError::LockLost {
        instance: lock.instance,
        holder: lock.holder.clone(),
    }
}

/// C6 for instance locks: whether the lock row `(holder, expires_at_us)`
/// still admits `lock`'s writes at `now_us` (the database's clock). At its
/// expiry it no longer does, as a lease: another may take it from then.
pub fn lock_admits(row: Option<(&str, i64)>, lock: &LockGrant, now_us: i64) -> bool {
    row.is_some_and(|(holder, expires_at_us)| holder == lock.holder && now_us < expires_at_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_changes_hands_only_after_expiry_and_bumps_the_epoch() {
        let a = ReconcilerLeaseRow::VACANT.acquire("a", 0, 10).unwrap();
        assert_eq!(a.epoch, 1);
        assert_eq!(a.acquire("b", 9, 10), None);
        let renewed = a.acquire("a", 9, 10).unwrap();
        assert_eq!(renewed.epoch, 1);
        let b = renewed.acquire("b", 19, 10).unwrap();
        assert_eq!((b.holder.as_deref(), b.epoch), (Some("b"), 2));
        assert!(!b.admits(&a.grant().unwrap(), 19));
    }

    #[test]
    fn a_restarted_identity_takes_its_lease_back_at_once_under_a_new_epoch() {
        let old = ReconcilerLeaseRow::VACANT
            .acquire("host-1#a", 0, 100)
            .unwrap();
        assert_eq!(
            old.acquire("host-2#b", 10, 100),
            None,
            "another identity waits"
        );
        let new = old
            .acquire("host-1#b", 10, 100)
            .expect("taken back at once");
        assert_eq!((new.holder.as_deref(), new.epoch), (Some("host-1#b"), 2));
        assert!(
            !new.admits(&old.grant().unwrap(), 10),
            "the old incarnation is fenced"
        );
        assert!(new.admits(&new.grant().unwrap(), 10));
    }

    #[test]
    fn a_twin_at_another_site_waits_for_expiry_and_never_takes_the_lease_back() {
        let live = ReconcilerLeaseRow::VACANT
            .acquire("host-1#s1.a", 0, 100)
            .unwrap();
        assert_eq!(
            live.acquire("host-1#s2.b", 10, 100),
            None,
            "a copied state_dir's daemon waits while the holder's lease lasts"
        );
        let renewed = live.acquire("host-1#s1.a", 50, 100).unwrap();
        assert_eq!(renewed.epoch, 1, "the live holder keeps its epoch");
        assert_eq!(renewed.acquire("host-1#s2.b", 149, 100), None);
        let twin = renewed
            .acquire("host-1#s2.b", 150, 100)
            .expect("taken once expired, like any standby");
        assert_eq!(twin.epoch, 2);
        assert_eq!(
            twin.acquire("host-1#s1.a", 160, 100),
            None,
            "nor does the first take it back from the twin"
        );
        let restarted = twin
            .acquire("host-1#s2.c", 160, 100)
            .expect("the twin's own restart takes it back at once");
        assert_eq!(restarted.epoch, 3);
    }

    #[test]
    fn an_expired_lease_admits_no_write_even_before_anyone_takes_it() {
        let row = ReconcilerLeaseRow::VACANT.acquire("a#1", 0, 10).unwrap();
        let grant = row.grant().unwrap();
        assert!(row.admits(&grant, 9));
        assert!(!row.admits(&grant, 10));
    }

    #[test]
    fn identity_ignores_incarnation_and_actor() {
        assert_eq!(identity_of("host-1#42/w3"), "host-1");
        assert_eq!(identity_of("plain"), "plain");
    }

    #[test]
    fn lease_rounding_never_shortens_a_lease() {
        assert_eq!(lease_to_us(Duration::from_nanos(1)), 1);
        assert_eq!(lease_to_us(Duration::from_micros(5)), 5);
    }
}
