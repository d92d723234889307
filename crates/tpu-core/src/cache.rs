//! The compile cache: each distinct program is compiled once per client.
//! An in-memory LRU tier, and an optional on-disk tier of serialized
//! executables (`TPU_RS_CACHE_DIR`) that a later process loads instead of
//! compiling.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::pjrt::{Client, CompileOptions, Executable};

/// What identifies a compiled program: the program text (which carries its
/// input types), the options (replicas, partitions, placement), and the
/// client with its plugin identity and API version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    client: u64,
    plugin: Arc<str>,
    program: Arc<str>,
    options: CompileOptions,
}

struct Slot {
    executable: Arc<Executable>,
    last_used: u64,
}

#[derive(Default)]
struct Entries {
    slots: HashMap<CacheKey, Slot>,
    clock: u64,
}

/// Counters of a [`CompileCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Programs compiled (misses).
    pub compiles: u64,
    /// Lookups served from the cache.
    pub hits: u64,
    /// Executables dropped to stay within capacity.
    pub evictions: u64,
    /// Misses served by loading a serialized executable from disk.
    pub disk_hits: u64,
    /// Total time spent compiling.
    pub compile_time: Duration,
}

/// An in-memory LRU cache of executables.
pub struct CompileCache {
    capacity: usize,
    disk: Option<PathBuf>,
    entries: Mutex<Entries>,
    compiles: AtomicU64,
    hits: AtomicU64,
    evictions: AtomicU64,
    disk_hits: AtomicU64,
    compile_nanos: AtomicU64,
}

impl CompileCache {
    /// A cache holding at most `capacity` executables (at least one).
    pub fn new(capacity: usize) -> CompileCache {
        CompileCache {
            capacity: capacity.max(1),
            disk: None,
            entries: Mutex::default(),
            compiles: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
        }
    }

    /// A cache that also keeps serialized executables in `dir`.
    pub fn with_disk(capacity: usize, dir: impl Into<PathBuf>) -> CompileCache {
        CompileCache {
            disk: Some(dir.into()),
            ..CompileCache::new(capacity)
        }
    }

    /// The on-disk tier's folder, if any.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_deref()
    }

    /// The cached executable for `program`, compiling it on a miss.
    pub fn get_or_compile(
        &self,
        client: &Client,
        program: &str,
        options: &CompileOptions,
    ) -> Result<Arc<Executable>> {
        let key = CacheKey {
            client: client.id(),
            plugin: client.identity().into(),
            program: program.into(),
            options: options.clone(),
        };
        if let Some(hit) = self.lookup(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            crate::metrics::record_cache_hit();
            return Ok(hit);
        }
        if let Some(executable) = self.load_from_disk(client, &key) {
            self.disk_hits.fetch_add(1, Ordering::Relaxed);
            crate::metrics::record_disk_hit();
            let executable = Arc::new(executable);
            self.insert(key, executable.clone());
            return Ok(executable);
        }
        let started = Instant::now();
        let executable = Arc::new(client.compile(program, options)?);
        crate::metrics::record_compile(started.elapsed());
        let nanos = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.compile_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(program = %executable.signature().name, ms = nanos / 1_000_000, "compiled");
        self.store_on_disk(&key, &executable);
        self.insert(key, executable.clone());
        Ok(executable)
    }

    /// The on-disk file of `key` and the text that identifies it exactly.
    fn disk_entry(&self, key: &CacheKey) -> Option<(PathBuf, String)> {
        let dir = self.disk.as_ref()?;
        let identity = format!("{}\n{:?}\n{}", key.plugin, key.options, key.program);
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        identity.hash(&mut hasher);
        Some((dir.join(format!("{:016x}.pjrt", hasher.finish())), identity))
    }

    fn load_from_disk(&self, client: &Client, key: &CacheKey) -> Option<Executable> {
        let (path, identity) = self.disk_entry(key)?;
        let bytes = std::fs::read(&path).ok()?;
        // Layout: identity length (u64 LE), identity, executable bytes. A
        // hash collision or a stale file fails the identity check.
        let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
        let stored = bytes.get(8..8 + len)?;
        if stored != identity.as_bytes() {
            return None;
        }
        match client.deserialize(&bytes[8 + len..], &key.program, &key.options) {
            Ok(exe) => Some(exe),
            Err(e) => {
                tracing::warn!("ignoring unloadable cache entry {}: {e}", path.display());
                None
            }
        }
    }

    fn store_on_disk(&self, key: &CacheKey, executable: &Executable) {
        let Some((path, identity)) = self.disk_entry(key) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            let bytes = executable.serialize().map_err(std::io::Error::other)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut data = (identity.len() as u64).to_le_bytes().to_vec();
            data.extend_from_slice(identity.as_bytes());
            data.extend_from_slice(&bytes);
            // Write then rename, so a concurrent reader never sees half a file.
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, data)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!("could not write cache entry {}: {e}", path.display());
        }
    }

    fn lookup(&self, key: &CacheKey) -> Option<Arc<Executable>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.clock += 1;
        let now = entries.clock;
        entries.slots.get_mut(key).map(|slot| {
            slot.last_used = now;
            slot.executable.clone()
        })
    }

    fn insert(&self, key: CacheKey, executable: Arc<Executable>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.clock += 1;
        let now = entries.clock;
        if entries.slots.len() >= self.capacity && !entries.slots.contains_key(&key) {
            let oldest = entries
                .slots
                .iter()
                .min_by_key(|(_, slot)| slot.last_used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                entries.slots.remove(&oldest);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        entries.slots.insert(
            key,
            Slot {
                executable,
                last_used: now,
            },
        );
    }

    /// Number of cached executables.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every cached executable (counters are kept).
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .clear();
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            compiles: self.compiles.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compile_time: Duration::from_nanos(self.compile_nanos.load(Ordering::Relaxed)),
        }
    }
}

impl Default for CompileCache {
    /// 1024 executables in memory, plus `TPU_RS_CACHE_DIR` on disk when set.
    fn default() -> CompileCache {
        match std::env::var_os("TPU_RS_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => CompileCache::with_disk(1024, dir),
            _ => CompileCache::new(1024),
        }
    }
}
