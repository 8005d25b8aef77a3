//! Hashed indexes for lookups a pass or a tick makes once per instance.
//!
//! std's SipHash resists hash flooding, which buys nothing here: the keys
//! are instance ids and names from stead's own database, runtime and
//! provisioner. foldhash's fixed-seed hasher is several times faster and
//! the same in every process and every run, so the simulation stays
//! reproducible; what iterates one of these maps must not depend on its
//! order (sort first, as `RecoveryMemory`'s listings do).

use std::collections::{HashMap, HashSet};

/// The fixed-seed hasher every index uses.
pub(crate) type FixedHash = foldhash::fast::FixedState;

/// A hashed map with [`FixedHash`].
pub type FastMap<K, V> = HashMap<K, V, FixedHash>;

/// A hashed set with [`FixedHash`].
pub(crate) type FastSet<T> = HashSet<T, FixedHash>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(value: T) -> u64 {
        FixedHash::default().hash_one(value)
    }

    fn distinct(hashes: impl IntoIterator<Item = u64>) -> usize {
        hashes.into_iter().collect::<HashSet<_>>().len()
    }

    /// The indexes stay linear in the fleet only while the hasher spreads
    /// the keys they use: instance ids, names (short ones end in a partial
    /// word) and (name, namespace) pairs. A hasher that gives many keys one
    /// value keeps every answer right and makes a 10,000-instance tick or
    /// pass quadratic, which no rule would notice.
    #[test]
    fn the_index_hasher_spreads_ids_names_and_pairs() {
        assert_eq!(distinct((0..1000i64).map(hash)), 1000, "instance ids");
        assert_eq!(distinct((0..1000u64).map(hash)), 1000, "words");
        assert_eq!(distinct((0..1000usize).map(hash)), 1000, "sizes");
        assert_eq!(distinct((0..=255u8).map(hash)), 256, "bytes");
        let short = (0..1000).map(|i| hash(format!("wiki{i}").as_str()));
        assert_eq!(distinct(short), 1000, "names shorter than a word");
        let long = (0..1000).map(|i| hash(format!("tenant-release-{i:04}").as_str()));
        assert_eq!(distinct(long), 1000, "names of whole words and a rest");
        assert_ne!(
            hash(("ab", "c")),
            hash(("a", "bc")),
            "a pair's parts are delimited"
        );
    }
}
