//! The on-disk tier of the compile cache: one file per serialized
//! executable, in a folder capped in bytes, least recently used first out.
//!
//! A store costs the same in a folder of 50,000 entries as in an empty one:
//! the folder is scanned (for its size, and to evict) only once per tenth
//! of the cap written, not per entry (see [`Usage`]).
//!
//! On by default under the user's cache folder, so a second process loads
//! what the first compiled. `TPU_RS_CACHE_DIR` moves it (empty turns it
//! off) and `TPU_RS_CACHE_MAX_BYTES` sets the cap.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::settings;

/// The default cap on the folder's size.
const DEFAULT_MAX_BYTES: u64 = 2 << 30;

/// File extension of cache entries; nothing else in the folder is touched.
const EXTENSION: &str = "pjrt";

/// First bytes of every entry, naming its layout.
const MAGIC: &[u8; 8] = b"tpurs-x1";

/// A folder of serialized executables. Loading one runs its code, so the
/// folder must be this user's alone, and every entry carries a checksum
/// that is verified before its bytes reach the plugin.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    usage: Mutex<Usage>,
}

/// The folder's size as this process knows it: what the last scan counted,
/// plus what this process has written since. Other processes' writes show
/// at the next scan, which comes once this process has written a tenth of
/// the cap (or its count passes the cap): so the folder stays within the
/// cap plus a tenth per process writing at once, and scans cost O(1) per
/// store, amortized.
#[derive(Debug, Default)]
struct Usage {
    scanned: Option<u64>,
    written: u64,
    scans: u64,
}

impl DiskCache {
    /// A cache in `dir` holding at most `max_bytes` of entries. Creates the
    /// folder (mode 0700) if needed; refuses one that another user owns or
    /// that others can write to.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<DiskCache> {
        let dir = dir.into();
        let unsafe_dir = |reason: String| Error::UnsafeCacheDir {
            dir: dir.clone(),
            reason,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| unsafe_dir(format!("cannot create it: {e}")))?;
        let meta = std::fs::metadata(&dir).map_err(|e| unsafe_dir(e.to_string()))?;
        if !meta.is_dir() {
            return Err(unsafe_dir("it is not a folder".into()));
        }
        if let Some(me) = current_uid()
            && meta.uid() != me
        {
            return Err(unsafe_dir(format!(
                "it belongs to user {}, not to this process's user {me}",
                meta.uid()
            )));
        }
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "other users can write to it (mode {:o})",
                mode & 0o777
            )));
        }
        Ok(DiskCache {
            dir,
            max_bytes,
            usage: Mutex::default(),
        })
    }

    /// The folder the environment selects: `TPU_RS_CACHE_DIR` when set
    /// (empty: no disk tier), else `tpu-rs/executables` under
    /// `$XDG_CACHE_HOME` or `~/.cache`; capped by `TPU_RS_CACHE_MAX_BYTES`.
    pub fn from_env() -> Result<Option<DiskCache>> {
        let dir = match std::env::var_os("TPU_RS_CACHE_DIR") {
            Some(dir) if dir.is_empty() => return Ok(None),
            Some(dir) => PathBuf::from(dir),
            None => match crate::pjrt::discovery::user_cache_dir() {
                Some(dir) => dir.join("tpu-rs").join("executables"),
                None => return Ok(None),
            },
        };
        let max_bytes =
            settings::bytes(&settings::env, "TPU_RS_CACHE_MAX_BYTES")?.unwrap_or(DEFAULT_MAX_BYTES);
        DiskCache::open(dir, max_bytes).map(Some)
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
    /// its options and its plugin), marked as just used. A missing, stale,
    /// truncated or corrupt entry is a miss.
    pub fn load(&self, identity: &str) -> Option<Vec<u8>> {
        let path = self.path(identity);
        let file = std::fs::read(&path).ok()?;
        let executable = DiskCache::decode_entry(identity, &file)?.to_vec();
        // The modification time is the entry's last use, for eviction.
        if let Ok(file) = std::fs::File::open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(executable)
    }

    /// Stores `executable` under `identity`; when the folder is over its
    /// cap, evicts the least recently used entries down to nine tenths of
    /// it (so the next evictions are a tenth of the cap away).
    pub fn store(&self, identity: &str, executable: &[u8]) -> std::io::Result<()> {
        let path = self.path(identity);
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let entry = DiskCache::encode_entry(identity, executable);
        std::io::Write::write_all(&mut file, &entry)?;
        drop(file);
        std::fs::rename(&tmp, &path)?;
        self.account(entry.len() as u64, &path)
    }

    /// Counts `len` bytes written; scans the folder (evicting if it is over
    /// the cap) when this process has never scanned it, has written a
    /// tenth of the cap since the last scan, or counts it over the cap.
    fn account(&self, len: u64, keep: &Path) -> std::io::Result<()> {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.written += len;
        if let Some(scanned) = usage.scanned
            && usage.written <= self.max_bytes / 10
            && scanned + usage.written <= self.max_bytes
        {
            return Ok(());
        }
        usage.scans += 1;
        usage.scanned = Some(self.evict(keep)?);
        usage.written = 0;
        Ok(())
    }

    /// The folder's scans so far (by this handle).
    #[cfg(test)]
    fn scans(&self) -> u64 {
        self.usage.lock().unwrap().scans
    }

    /// Removes the oldest entries (never `keep`) when the folder is over its
    /// cap, down to nine tenths of it; the bytes left.
    fn evict(&self, keep: &Path) -> std::io::Result<u64> {
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(&self.dir)?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == EXTENSION))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        if total <= self.max_bytes {
            return Ok(total);
        }
        let low_water = self.max_bytes - self.max_bytes / 10;
        entries.sort();
        for (_, len, path) in entries {
            if total <= low_water {
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
        Ok(total)
    }

    /// An entry's bytes: magic, identity length (u64 LE), identity, SHA-256 of
    /// the executable, executable.
    pub fn encode_entry(identity: &str, executable: &[u8]) -> Vec<u8> {
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(&(identity.len() as u64).to_le_bytes());
        data.extend_from_slice(identity.as_bytes());
        data.extend_from_slice(&Sha256::digest(executable));
        data.extend_from_slice(executable);
        data
    }

    /// The executable in an entry's bytes, if they are an intact entry for
    /// `identity` (a hash collision or a stale file fails the identity check,
    /// a truncated or altered one the checksum).
    pub fn decode_entry<'a>(identity: &str, file: &'a [u8]) -> Option<&'a [u8]> {
        let rest = file.strip_prefix(MAGIC)?;
        let (len, rest) = rest.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        let stored = rest.get(..len)?;
        if stored != identity.as_bytes() {
            return None;
        }
        let (checksum, executable) = rest[len..].split_first_chunk::<32>()?;
        (Sha256::digest(executable).as_slice() == checksum).then_some(executable)
    }

    fn path(&self, identity: &str) -> PathBuf {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        identity.hash(&mut hasher);
        self.dir
            .join(format!("{:016x}.{EXTENSION}", hasher.finish()))
    }
}

/// The user this process runs as: the owner of `/proc/self`, where Linux
/// shows it (elsewhere the ownership check is skipped).
fn current_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
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
        let cache = DiskCache::open(&dir, 1 << 20).unwrap();
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
        let cache = DiskCache::open(&dir, 3500).unwrap();
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

    fn folder_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn stores_scan_the_folder_once_per_tenth_of_the_cap() {
        let dir = scratch("scans");
        let cache = DiskCache::open(&dir, 1 << 20).unwrap();
        for i in 0..200 {
            let old = std::fs::File::create(dir.join(format!("old{i}.pjrt"))).unwrap();
            old.set_len(1000).unwrap();
        }
        // 50 entries of about 1 KB: under a tenth of the 1 MiB cap.
        for i in 0..50 {
            cache.store(&format!("p{i}"), &[1u8; 1000]).unwrap();
        }
        assert_eq!(cache.scans(), 1);
        // Another 60 KB passes the tenth: one more scan.
        for i in 50..110 {
            cache.store(&format!("p{i}"), &[1u8; 1000]).unwrap();
        }
        assert_eq!(cache.scans(), 2);
        assert!(cache.load("p0").is_some() && cache.load("p109").is_some());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn two_writers_keep_the_folder_within_the_cap_and_a_tenth_each() {
        let dir = scratch("two-writers");
        let cap = 100_000;
        let (a, b) = (
            DiskCache::open(&dir, cap).unwrap(),
            DiskCache::open(&dir, cap).unwrap(),
        );
        let entry = [2u8; 1000];
        let slack = cap / 10 + 1100;
        for i in 0..400 {
            let writer = if i % 2 == 0 { &a } else { &b };
            writer.store(&format!("p{i}"), &entry).unwrap();
            let size = folder_bytes(&dir);
            assert!(size <= cap + 2 * slack, "{size} bytes after {i} stores");
        }
        // Evictions happened (400 KB went in) and kept the newest entries.
        assert!(folder_bytes(&dir) < 400_000);
        assert!(a.load("p398").is_some() && b.load("p399").is_some());
        assert!(a.load("p0").is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_entry_larger_than_the_cap_is_kept_alone() {
        let dir = scratch("huge");
        let cache = DiskCache::open(&dir, 10).unwrap();
        cache.store("small", b"x").unwrap();
        cache.store("huge", &[0u8; 100]).unwrap();
        assert!(cache.load("huge").is_some());
        assert!(cache.load("small").is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn truncated_altered_and_old_entries_are_misses() {
        let dir = scratch("corrupt");
        let cache = DiskCache::open(&dir, 1 << 20).unwrap();
        cache.store("p", b"executable bytes").unwrap();
        let good = std::fs::read(cache.path("p")).unwrap();
        let mut altered = good.clone();
        *altered.last_mut().unwrap() ^= 1;
        let mut old_layout = 1u64.to_le_bytes().to_vec();
        old_layout.extend_from_slice(b"pexecutable bytes");
        for bad in [
            &good[..good.len() - 1],
            &good[..20],
            &altered[..],
            &old_layout[..],
            &[],
        ] {
            std::fs::write(cache.path("p"), bad).unwrap();
            assert_eq!(cache.load("p"), None);
        }
        std::fs::write(cache.path("p"), &good).unwrap();
        assert_eq!(cache.load("p").as_deref(), Some(&b"executable bytes"[..]));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_folder_is_private_and_others_folders_are_refused() {
        let dir = scratch("private");
        DiskCache::open(&dir, 1 << 20).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = DiskCache::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(
            err.contains("other users can write") && err.contains("TPU_RS_CACHE_DIR"),
            "{err}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        DiskCache::open(&dir, 1 << 20).unwrap();
        // Handing the folder to another user needs root; CI runs as root.
        if current_uid() == Some(0) {
            std::os::unix::fs::chown(&dir, Some(4242), None).unwrap();
            let err = DiskCache::open(&dir, 1 << 20).unwrap_err().to_string();
            assert!(err.contains("belongs to user 4242"), "{err}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn entries_are_readable_by_their_owner_only() {
        let dir = scratch("entry-mode");
        let cache = DiskCache::open(&dir, 1 << 20).unwrap();
        cache.store("p", b"x").unwrap();
        let mode = std::fs::metadata(cache.path("p"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
