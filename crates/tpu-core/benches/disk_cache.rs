//! Compiling into a disk cache that already holds many entries: the
//! per-program time into folders of 0, 10,000 and 50,000 entries, and each
//! one's ratio to the empty folder's, in one run.
//!
//! `cargo bench -p tpu-core --bench disk_cache` (plugin from
//! `TPU_RS_PLUGIN`; `DISK_CACHE_PROGRAMS` sets how many programs each
//! folder gets, 1,000 by default). The entries already there are sparse
//! files of a typical entry's size, so the folder costs no disk space.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tpu_core::pjrt::discovery;
use tpu_core::{Client, ClientOptions, CompileCache, CompileOptions, DiskCache, Plugin};

/// The size of a typical entry (a serialized single-op program).
const ENTRY_BYTES: u64 = 20_000;

/// The default cap on the folder (as `TPU_RS_CACHE_MAX_BYTES` unset).
const CAP: u64 = 2 << 30;

fn program(i: usize) -> String {
    format!(
        "func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {{
  %c = stablehlo.constant dense<{i}.0> : tensor<8xf32>
  %0 = stablehlo.add %a, %c : tensor<8xf32>
  return %0 : tensor<8xf32>
}}"
    )
}

/// A fresh folder holding `entries` old entries.
fn folder(root: &Path, entries: usize) -> PathBuf {
    let dir = root.join(format!("entries-{entries}"));
    let _ = std::fs::remove_dir_all(&dir);
    DiskCache::open(&dir, CAP).expect("cache folder");
    for i in 0..entries {
        let file = std::fs::File::create(dir.join(format!("old{i:012x}.pjrt"))).unwrap();
        file.set_len(ENTRY_BYTES).unwrap();
    }
    dir
}

/// Compiles `programs` new programs into `dir`; the time per program.
fn compile_into(client: &Client, dir: &Path, programs: usize, offset: usize) -> Duration {
    let cache = CompileCache::with_disk(programs + 1, DiskCache::open(dir, CAP).unwrap());
    let options = CompileOptions::default();
    let started = Instant::now();
    for i in 0..programs {
        cache
            .get_or_compile(client, &program(offset + i), &options)
            .expect("compiles");
    }
    started.elapsed() / programs as u32
}

fn main() {
    let programs: usize = std::env::var("DISK_CACHE_PROGRAMS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    let path = discovery::default_plugin().expect("a PJRT plugin");
    let client = Client::new(Plugin::load(&path).unwrap(), &ClientOptions::default()).unwrap();
    let root = std::env::temp_dir().join(format!("tpu-rs-disk-bench-{}", std::process::id()));
    // Warm the compiler (its first compile pays one-time setup).
    client
        .compile(&program(usize::MAX), &CompileOptions::default())
        .unwrap();
    println!("{programs} programs compiled into a cache folder already holding N entries");
    println!("{:>8}  {:>12}  {:>14}", "N", "ms/program", "vs empty");
    let mut empty = None;
    for (round, entries) in [0, 10_000, 50_000].into_iter().enumerate() {
        let dir = folder(&root, entries);
        let each = compile_into(&client, &dir, programs, round * programs);
        let base = *empty.get_or_insert(each);
        println!(
            "{entries:>8}  {:>12.2}  {:>13.2}x",
            each.as_secs_f64() * 1e3,
            each.as_secs_f64() / base.as_secs_f64()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    let _ = std::fs::remove_dir_all(&root);
}
