//! A bounded table that forgets what was used least recently: the
//! policies' executable tables. Every executable keeps its machine code
//! mapped, so a long process that meets many shapes must let old ones go.

use std::collections::HashMap;
use std::hash::Hash;

/// How many entries a policy's executable table keeps (the runtime's
/// compile cache keeps as many, and its disk tier the rest).
pub(crate) const KEPT: usize = 1024;

/// A map of at most `capacity` entries; inserting into a full one drops
/// the entry used least recently.
pub(crate) struct Lru<K, V> {
    capacity: usize,
    clock: u64,
    entries: HashMap<K, (V, u64)>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An empty table of at most `capacity` (at least one) entries.
    pub fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            capacity: capacity.max(1),
            clock: 0,
            entries: HashMap::new(),
        }
    }

    /// The entry for `key`, marked as just used.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.clock += 1;
        let now = self.clock;
        self.entries.get_mut(key).map(|(value, used)| {
            *used = now;
            value
        })
    }

    /// Sets `key`, dropping the least recently used entry if the table is
    /// full (a scan: inserts follow a compile, which costs far more).
    pub fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        self.entries.insert(key, (value, self.clock));
    }

    /// Number of entries.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_drops_the_entry_used_least_recently() {
        let mut t = Lru::new(3);
        for k in 0..3 {
            t.insert(k, k * 10);
        }
        assert_eq!(t.get_mut(&0), Some(&mut 0)); // 1 is now the oldest
        t.insert(3, 30);
        assert_eq!(t.len(), 3);
        assert!(t.get_mut(&1).is_none());
        assert!(t.get_mut(&0).is_some() && t.get_mut(&2).is_some() && t.get_mut(&3).is_some());
        t.insert(3, 31); // replacing drops nothing
        assert_eq!(t.len(), 3);
        assert_eq!(t.get_mut(&3), Some(&mut 31));
    }
}
