//! The on-disk tier of the compile cache: one file per serialized
//! executable, in a folder capped in bytes, least recently used first out.
//!
//! On by default under the user's cache folder, so a second process loads
//! what the first compiled. `TPU_RS_CACHE_DIR` moves it (empty turns it
//! off) and `TPU_RS_CACHE_MAX_BYTES` sets the cap.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The default cap on the folder's size.
const DEFAULT_MAX_BYTES: u64 = 2 << 30;

/// File extension of cache entries; nothing else in the folder is touched.
const EXTENSION: &str = "pjrt";

/// A folder of serialized executables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl DiskCache {
    /// A cache in `dir` holding at most `max_bytes` of entries.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> DiskCache {
        DiskCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The folder the environment selects: `TPU_RS_CACHE_DIR` when set
    /// (empty: no disk tier), else `tpu-rs/executables` under
    /// `$XDG_CACHE_HOME` or `~/.cache`; capped by `TPU_RS_CACHE_MAX_BYTES`.
    pub fn from_env() -> Option<DiskCache> {
        let dir = match std::env::var_os("TPU_RS_CACHE_DIR") {
            Some(dir) if dir.is_empty() => return None,
            Some(dir) => PathBuf::from(dir),
            None => crate::pjrt::discovery::user_cache_dir()?
                .join("tpu-rs")
                .join("executables"),
        };
        let max_bytes = std::env::var("TPU_RS_CACHE_MAX_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES);
        Some(DiskCache::new(dir, max_bytes))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cap on the folder's size, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The entry stored under `identity` (the exact text naming a program,
    /// its options and its plugin), marked as just used.
    pub fn load(&self, identity: &str) -> Option<Vec<u8>> {
        let path = self.path(identity);
        let bytes = std::fs::read(&path).ok()?;
        // Layout: identity length (u64 LE), identity, executable bytes. A
        // hash collision or a stale file fails the identity check.
        let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
        let stored = bytes.get(8..8usize.checked_add(len)?)?;
        if stored != identity.as_bytes() {
            return None;
        }
        // The modification time is the entry's last use, for eviction.
        if let Ok(file) = std::fs::File::open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(bytes[8 + len..].to_vec())
    }

    /// Stores `executable` under `identity`, then evicts the least recently
    /// used entries until the folder fits its cap.
    pub fn store(&self, identity: &str, executable: &[u8]) -> std::io::Result<()> {
        let path = self.path(identity);
        std::fs::create_dir_all(&self.dir)?;
        let mut data = (identity.len() as u64).to_le_bytes().to_vec();
        data.extend_from_slice(identity.as_bytes());
        data.extend_from_slice(executable);
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, data)?;
        std::fs::rename(&tmp, &path)?;
        self.evict(&path)
    }

    /// Removes the oldest entries (never `keep`) while the folder is over
    /// its cap.
    fn evict(&self, keep: &Path) -> std::io::Result<()> {
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(&self.dir)?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == EXTENSION))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            // Another process may have removed it already.
            if std::fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
            }
        }
        Ok(())
    }

    fn path(&self, identity: &str) -> PathBuf {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        identity.hash(&mut hasher);
        self.dir
            .join(format!("{:016x}.{EXTENSION}", hasher.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tpu-rs-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn entries_round_trip_and_other_identities_miss() {
        let dir = scratch("round-trip");
        let cache = DiskCache::new(&dir, 1 << 20);
        cache.store("program a", b"bytes of a").unwrap();
        assert_eq!(cache.load("program a").as_deref(), Some(&b"bytes of a"[..]));
        assert_eq!(cache.load("program b"), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_least_recently_used_entries_go_first_when_over_the_cap() {
        let dir = scratch("evict");
        let entry = vec![7u8; 1000];
        // Room for about three entries (each is the payload plus a header).
        let cache = DiskCache::new(&dir, 3500);
        let age = |name: &str, secs: u64| {
            let file = std::fs::File::open(cache.path(name)).unwrap();
            let when = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            file.set_modified(when).unwrap();
        };
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            cache.store(name, &entry).unwrap();
            age(name, 1_000 + i as u64);
        }
        // `a` is the oldest entry, but it was just used: `b` goes instead.
        assert!(cache.load("a").is_some());
        cache.store("d", &entry).unwrap();
        assert!(cache.load("b").is_none(), "b should have been evicted");
        for name in ["a", "c", "d"] {
            assert!(cache.load(name).is_some(), "{name} was evicted");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_entry_larger_than_the_cap_is_kept_alone() {
        let dir = scratch("huge");
        let cache = DiskCache::new(&dir, 10);
        cache.store("small", b"x").unwrap();
        cache.store("huge", &[0u8; 100]).unwrap();
        assert!(cache.load("huge").is_some());
        assert!(cache.load("small").is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
