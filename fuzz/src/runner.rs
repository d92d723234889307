//! A bounded fuzzing loop for stable Rust: replays a target's corpus, then
//! runs mutations of it for a fixed time. It has no coverage feedback (that
//! is what cargo-fuzz adds on nightly), but runs the same targets on every
//! test run. A failing input is saved so the target's binary replays it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Target;

/// Longer than this on one input counts as a hang.
const HANG: Duration = Duration::from_secs(60);

/// Inputs grow up to this many bytes.
const MAX_LEN: usize = 4096;

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// Corpus files replayed.
    pub replayed: usize,
    /// Mutated inputs run after them.
    pub explored: usize,
}

/// An input that broke the target's property.
#[derive(Debug)]
pub struct Failure {
    /// The panic message.
    pub message: String,
    /// Where the input was saved.
    pub saved: PathBuf,
}

/// Runs `target` on every file in `corpus`, then on mutations of them until
/// `budget` has passed. Inputs come from a generator seeded with `seed`, so
/// a run can be repeated.
pub fn run(
    name: &str,
    target: Target,
    corpus: &Path,
    budget: Duration,
    seed: u64,
) -> Result<Report, Failure> {
    let mut entries: Vec<Vec<u8>> = std::fs::read_dir(corpus)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect();
    entries.sort();
    let watchdog = Watchdog::start(name);
    let attempt = |data: &[u8]| -> Result<(), Failure> {
        watchdog.begin(data);
        let outcome = catch_unwind(AssertUnwindSafe(|| target(data)));
        watchdog.end();
        outcome.map_err(|panic| Failure {
            message: panic_message(&*panic),
            saved: save_failure(name, data),
        })
    };
    for entry in &entries {
        attempt(entry)?;
    }
    let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    let start = Instant::now();
    let mut explored = 0;
    while start.elapsed() < budget {
        let input = mutate(&mut rng, &entries);
        attempt(&input)?;
        explored += 1;
    }
    Ok(Report {
        replayed: entries.len(),
        explored,
    })
}

/// A new input: a corpus entry (or nothing) with a few random edits.
fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = match corpus.len() {
        0 => Vec::new(),
        n => corpus[rng.below(n)].clone(),
    };
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        let last = data.len().saturating_sub(1);
        match rng.below(6) {
            0 if !data.is_empty() => data[at.min(last)] ^= 1 << rng.below(8),
            1 if !data.is_empty() => data[at.min(last)] = rng.byte(),
            2 => {
                let bytes: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.byte()).collect();
                data.splice(at..at, bytes);
            }
            3 if !data.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            4 => {
                let edge: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, 0xfe, b'-', b'9'];
                let width = 1 << rng.below(4);
                let byte = edge[rng.below(edge.len())];
                data.splice(at..at, std::iter::repeat_n(byte, width));
            }
            _ if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                let len = rng.below(other.len() - from + 1);
                data.splice(at..at, other[from..from + len].iter().copied());
            }
            _ => data.push(rng.byte()),
        }
    }
    data.truncate(MAX_LEN);
    data
}

/// Aborts the process, naming the saved input, when one input runs longer
/// than [`HANG`]: a hang must fail the run, not stall it.
/// The input being run, and when it began.
type Running = Arc<Mutex<Option<(Instant, Vec<u8>)>>>;

struct Watchdog {
    current: Running,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(name: &str) -> Watchdog {
        let current: Running = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let (watched, stop, name) = (current.clone(), done.clone(), name.to_string());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let slot = watched.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((began, data)) = slot.as_ref()
                    && began.elapsed() > HANG
                {
                    let saved = save_failure(&name, data);
                    eprintln!("fuzz target `{name}` hung on {}", saved.display());
                    std::process::abort();
                }
            }
        });
        Watchdog { current, done }
    }

    fn begin(&self, data: &[u8]) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), data.to_vec()));
    }

    fn end(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Saves a failing input under `target/fuzz-failures/<target>/`.
fn save_failure(name: &str, data: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/fuzz-failures")
        .join(name);
    let _ = std::fs::create_dir_all(&dir);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let path = dir.join(format!("crash-{hash:016x}"));
    let _ = std::fs::write(&path, data);
    path
}

/// SplitMix64: small, fast, and the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}
