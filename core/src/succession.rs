//! T1: which process may take over from which, decided from holder names
//! alone, and how a waiting process tells a live twin from a dead
//! predecessor.
//!
//! A lease, lock or task holder reads `<identity>#<incarnation>`, optionally
//! followed by `/<actor>`. A daemon's incarnation is `<site>.<nonce>`: the
//! **site** names the exact identity lock the process holds (the kernel's
//! boot and the lock file's device and inode, `daemon/identity.rs`), the
//! nonce this run. The kernel lets one process at a time hold that lock, so
//! an incarnation asking at the site another incarnation recorded holds the
//! lock the other held: the other is gone, and its lease and locks are taken
//! back at once ([`Succession::Predecessor`]).
//!
//! Two incarnations of one identity at *different* sites prove nothing about
//! each other ([`Succession::Twin`]): a copied `state_dir` or a cloned VM
//! image (both may be alive and would both act), or the same daemon after a
//! reboot or moved to another host (gone). A twin waits for the lease like
//! any standby, and never clears the other's locks. What tells the two
//! cases apart is liveness: a holder that renews the lease after a twin
//! first saw it is alive ([`TwinWatch`]); that is a configuration error,
//! reported, while the twin keeps waiting, so at most one of them acts.
//!
//! An incarnation without a site (the simulation's and tests', written
//! before sites existed) is trusted as before: two site-less incarnations of
//! one identity are predecessor and successor, as their caller promises.

use jiff::Timestamp;

/// Separates an incarnation's site from its nonce.
pub const SITE_SEPARATOR: char = '.';

/// The identity part of a holder (`<identity>#<incarnation>[/<actor>]`):
/// what stays the same when a daemon restarts on the same data directory.
pub fn identity_of(holder: &str) -> &str {
    holder
        .split_once('#')
        .map_or(holder, |(identity, _)| identity)
}

/// The incarnation part of a holder, without any actor; `None` for a
/// holder that names no incarnation.
pub(crate) fn incarnation_of(holder: &str) -> Option<&str> {
    let (_, rest) = holder.split_once('#')?;
    Some(
        rest.split_once('/')
            .map_or(rest, |(incarnation, _)| incarnation),
    )
}

/// The site of a holder's incarnation (`<site>.<nonce>`); `None` for an
/// incarnation without one.
pub(crate) fn site_of(holder: &str) -> Option<&str> {
    let incarnation = incarnation_of(holder)?;
    incarnation
        .split_once(SITE_SEPARATOR)
        .map(|(site, _)| site)
        .filter(|site| !site.is_empty())
}

/// How the holder of a lease relates to a process asking for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Succession {
    /// The asker holds it already: a renewal.
    Renewal,
    /// An earlier incarnation of the asker's identity at the asker's site:
    /// provably gone (the asker holds its identity lock now). Taken back at
    /// once, under a new epoch.
    Predecessor,
    /// Another incarnation of the asker's identity at another site: maybe
    /// alive (a copied `state_dir`, a cloned image), maybe gone (a reboot).
    /// Waited for like a stranger.
    Twin,
    /// Another identity.
    Stranger,
}

/// T1: what `asking` may do about a lease (or lock) `current` holds.
pub fn succession(current: &str, asking: &str) -> Succession {
    if current == asking {
        return Succession::Renewal;
    }
    if identity_of(current) != identity_of(asking) {
        return Succession::Stranger;
    }
    if site_of(current) == site_of(asking) {
        Succession::Predecessor
    } else {
        Succession::Twin
    }
}

/// The holder prefix of every incarnation that `holder` provably succeeds:
/// its own site's (`<identity>#<site>.`), or, for a holder without a site,
/// its identity's (`<identity>#`). A restarted daemon releases the instance
/// locks and requeues the tasks of holders with this prefix, and of no
/// others: a twin's are left to expire.
pub fn predecessors_prefix(holder: &str) -> String {
    match site_of(holder) {
        Some(site) => format!("{}#{site}{SITE_SEPARATOR}", identity_of(holder)),
        None => format!("{}#", identity_of(holder)),
    }
}

/// The lease as a waiting process reads it: holder, epoch and expiry by
/// the database's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenLease {
    pub holder: String,
    pub epoch: i64,
    pub expires_at: Timestamp,
}

/// What a waiting process concludes about the lease's holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TwinVerdict {
    /// The holder is not a twin of this process (or nobody holds it).
    NoTwin,
    /// A twin holds it and has not renewed since this process first saw it:
    /// it may be a predecessor that is gone (a reboot). Wait for expiry.
    Unproven,
    /// A twin holds it and renewed it after this process first saw it: two
    /// live processes share one identity.
    Alive { identity: String, holder: String },
}

/// T1: a waiting process's memory of the twin holding the lease, fed every
/// reading of the lease while it waits. The tell of a live twin is a
/// renewal after this process first saw its lease: the expiry moved later
/// under the same holder and epoch. Both expiries are the database's clock
/// (T2), so no host clock takes part.
#[derive(Clone, Debug, Default)]
pub struct TwinWatch {
    first: Option<SeenLease>,
}

impl TwinWatch {
    /// Judges `seen` (`None`: nobody holds the lease) for the process
    /// `me` (its lease holder name).
    #[must_use]
    pub fn observe(&mut self, me: &str, seen: Option<&SeenLease>) -> TwinVerdict {
        let Some(seen) = seen.filter(|s| succession(&s.holder, me) == Succession::Twin) else {
            self.first = None;
            return TwinVerdict::NoTwin;
        };
        match &self.first {
            Some(first) if first.holder == seen.holder && first.epoch == seen.epoch => {
                if seen.expires_at > first.expires_at {
                    TwinVerdict::Alive {
                        identity: identity_of(&seen.holder).to_owned(),
                        holder: seen.holder.clone(),
                    }
                } else {
                    TwinVerdict::Unproven
                }
            }
            _ => {
                self.first = Some(seen.clone());
                TwinVerdict::Unproven
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_split_into_identity_incarnation_site_and_actor() {
        assert_eq!(identity_of("host-1#ab12.42/w3"), "host-1");
        assert_eq!(identity_of("plain"), "plain");
        assert_eq!(incarnation_of("host-1#ab12.42/w3"), Some("ab12.42"));
        assert_eq!(incarnation_of("plain"), None);
        assert_eq!(site_of("host-1#ab12.42/w3"), Some("ab12"));
        assert_eq!(site_of("host-1#42/w3"), None);
        assert_eq!(site_of("host-1#.42"), None);
    }

    fn check(current: &str, asking: &str, expect: Succession) {
        assert_eq!(succession(current, asking), expect, "{current} -> {asking}");
    }

    #[test]
    fn only_an_incarnation_at_the_same_site_succeeds_at_once() {
        check("h#s1.a", "h#s1.a", Succession::Renewal);
        check("h#s1.a", "h#s1.b", Succession::Predecessor);
        check("h#s1.a", "h#s2.b", Succession::Twin);
        check("h#s2.b", "h#s1.a", Succession::Twin);
        check("h#s1.a", "g#s1.b", Succession::Stranger);
        // Holders without a site keep the rule they had before sites.
        check("h#a", "h#b", Succession::Predecessor);
        // One with a site and one without prove nothing about each other.
        check("h#a", "h#s1.b", Succession::Twin);
        check("h#s1.a", "h#b", Succession::Twin);
    }

    #[test]
    fn a_restart_clears_only_its_own_sites_incarnations() {
        assert_eq!(predecessors_prefix("h#s1.b/recovery"), "h#s1.");
        assert_eq!(predecessors_prefix("h#b"), "h#");
        let prefix = predecessors_prefix("h#s1.b");
        assert!("h#s1.a/w0".starts_with(&prefix));
        assert!(!"h#s2.a/w0".starts_with(&prefix), "a twin's locks stay");
        assert!(!"h#s10.a/w0".starts_with(&prefix), "sites are whole");
    }

    fn seen(holder: &str, epoch: i64, expires_s: i64) -> SeenLease {
        SeenLease {
            holder: holder.to_owned(),
            epoch,
            expires_at: Timestamp::from_second(1_800_000_000 + expires_s).unwrap(),
        }
    }

    #[test]
    fn a_twin_that_renews_after_it_was_first_seen_is_alive() {
        let mut watch = TwinWatch::default();
        let me = "h#s2.b";
        assert_eq!(
            watch.observe(me, Some(&seen("h#s1.a", 3, 100))),
            TwinVerdict::Unproven
        );
        assert_eq!(
            watch.observe(me, Some(&seen("h#s1.a", 3, 100))),
            TwinVerdict::Unproven,
            "not renewed: maybe gone (a reboot)"
        );
        assert_eq!(
            watch.observe(me, Some(&seen("h#s1.a", 3, 160))),
            TwinVerdict::Alive {
                identity: "h".to_owned(),
                holder: "h#s1.a".to_owned()
            }
        );
    }

    #[test]
    fn a_new_holder_or_epoch_starts_the_watch_again() {
        let mut watch = TwinWatch::default();
        let me = "h#s3.c";
        let _ = watch.observe(me, Some(&seen("h#s1.a", 3, 100)));
        assert_eq!(
            watch.observe(me, Some(&seen("h#s2.b", 4, 200))),
            TwinVerdict::Unproven,
            "another twin took over: its renewal is not seen yet"
        );
        assert_eq!(
            watch.observe(me, Some(&seen("h#s2.b", 5, 300))),
            TwinVerdict::Unproven,
            "a new epoch is a new lease, not a renewal"
        );
    }

    #[test]
    fn strangers_predecessors_and_a_vacant_lease_are_no_twins() {
        let mut watch = TwinWatch::default();
        let me = "h#s1.b";
        for other in ["g#s9.a", "h#s1.a", "h#s1.b"] {
            assert_eq!(
                watch.observe(me, Some(&seen(other, 1, 100))),
                TwinVerdict::NoTwin
            );
            assert_eq!(
                watch.observe(me, Some(&seen(other, 1, 200))),
                TwinVerdict::NoTwin
            );
        }
        assert_eq!(watch.observe(me, None), TwinVerdict::NoTwin);
    }
}
