//! The compile cache: each distinct program is compiled once per client.
//! An in-memory LRU tier, and an on-disk tier of serialized executables
//! ([`DiskCache`], on by default) that a later process loads instead of
//! compiling.

mod disk;
pub mod record;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::pjrt::{Client, CompileOptions, Executable};
use crate::profile;

pub use disk::DiskCache;
use record::Recorder;

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
    disk: Option<DiskCache>,
    recorder: Option<Recorder>,
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
            recorder: None,
            entries: Mutex::default(),
            compiles: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
        }
    }

    /// A cache that also keeps serialized executables in `disk`.
    pub fn with_disk(capacity: usize, disk: DiskCache) -> CompileCache {
        CompileCache {
            disk: Some(disk),
            ..CompileCache::new(capacity)
        }
    }

    /// The on-disk tier's folder, if any.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(DiskCache::dir)
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
        let mut span = profile::span("compile", "compile");
        if span.recording() {
            span.arg("program", program_name(program));
        }
        if let Some(hit) = self.lookup(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            crate::metrics::record_cache_hit();
            span.arg("cache", "memory");
            return Ok(hit);
        }
        if let Some(recorder) = &self.recorder {
            recorder.append(program, options);
        }
        if let Some(executable) = self.load_from_disk(client, &key) {
            self.disk_hits.fetch_add(1, Ordering::Relaxed);
            crate::metrics::record_disk_hit();
            span.arg("cache", "disk");
            let executable = Arc::new(executable);
            self.insert(key, executable.clone());
            return Ok(executable);
        }
        span.arg("cache", "compiled");
        let started = Instant::now();
        let executable = Arc::new(client.compile(program, options)?);
        crate::metrics::record_compile(started.elapsed());
        let nanos = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.compile_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(program = %executable.signature().name, ms = nanos / 1_000_000, "compiled");
        self.store_on_disk(client, &key, &executable);
        self.insert(key, executable.clone());
        Ok(executable)
    }

    /// The text that names `key` exactly on disk: plugin, options, program.
    fn identity(key: &CacheKey) -> String {
        format!("{}\n{:?}\n{}", key.plugin, key.options, key.program)
    }

    /// The disk tier, where `client`'s plugin can use one.
    fn disk_for(&self, client: &Client) -> Option<&DiskCache> {
        self.disk
            .as_ref()
            .filter(|_| client.plugin().serializes_safely())
    }

    fn load_from_disk(&self, client: &Client, key: &CacheKey) -> Option<Executable> {
        let disk = self.disk_for(client)?;
        let bytes = disk.load(&Self::identity(key))?;
        match client.deserialize(&bytes, &key.program, &key.options) {
            Ok(exe) => Some(exe),
            Err(e) => {
                tracing::warn!(
                    "ignoring an unloadable cache entry in {}: {e}",
                    disk.dir().display()
                );
                None
            }
        }
    }

    fn store_on_disk(&self, client: &Client, key: &CacheKey, executable: &Executable) {
        let Some(disk) = self.disk_for(client) else {
            return;
        };
        let stored = executable
            .serialize()
            .map_err(std::io::Error::other)
            .and_then(|bytes| disk.store(&Self::identity(key), &bytes));
        if let Err(e) = stored {
            tracing::warn!(
                "could not write a cache entry in {}: {e}",
                disk.dir().display()
            );
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

impl CompileCache {
    /// 1024 executables in memory, plus the disk tier the environment
    /// selects ([`DiskCache::from_env`]), recording the programs it builds
    /// where `TPU_RS_RECORD_PROGRAMS` asks (see [`record`]).
    pub fn from_env() -> Result<CompileCache> {
        let cache = match DiskCache::from_env()? {
            Some(disk) => CompileCache::with_disk(1024, disk),
            None => CompileCache::new(1024),
        };
        Ok(CompileCache {
            recorder: Recorder::from_env()?,
            ..cache
        })
    }
}

/// The module name of a program (`module @name`), for the trace.
fn program_name(program: &str) -> String {
    program
        .split_once("module @")
        .and_then(|(_, rest)| rest.split(|c: char| c.is_whitespace() || c == '{').next())
        .unwrap_or("main")
        .to_string()
}
