//! A record of the programs a run builds, and warming a cache from it.
//!
//! With `TPU_RS_RECORD_PROGRAMS=FILE`, each program a process builds
//! (compiled, or loaded from the disk tier) is appended to `FILE` with its
//! compile options. [`warm`] compiles every recorded program into the
//! runtime's cache on several threads at once, without running the model:
//! to fill the shared cache folder of a multi-host job before it starts,
//! or to rebuild a cache after a plugin upgrade invalidated its entries.
//!
//! A record is a header line and the program's text:
//! `// tpu-rs program: replicas=1 partitions=1 spmd=0 devices=0 bytes=N`.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::pjrt::CompileOptions;
use crate::runtime::Runtime;

const HEADER: &str = "// tpu-rs program: ";

/// One program a run built, with the options it was compiled with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordedProgram {
    /// The StableHLO text.
    pub program: String,
    /// Replicas, partitions, placement.
    pub options: CompileOptions,
}

impl RecordedProgram {
    /// The record's text, as [`read`] reads it.
    pub fn encode(&self) -> String {
        encode(&self.program, &self.options)
    }
}

/// Appends the programs a process builds to one file.
pub(crate) struct Recorder {
    path: PathBuf,
    file: Mutex<File>,
}

impl Recorder {
    /// The recorder `TPU_RS_RECORD_PROGRAMS` asks for, if any.
    pub fn from_env() -> Result<Option<Recorder>> {
        let Some(path) = crate::settings::env("TPU_RS_RECORD_PROGRAMS")? else {
            return Ok(None);
        };
        let path = PathBuf::from(path);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| record_error(&path, &format!("cannot open it: {e}")))?;
        Ok(Some(Recorder {
            path,
            file: Mutex::new(file),
        }))
    }

    /// Appends one program, in one write so that processes recording into
    /// the same file do not interleave.
    pub fn append(&self, program: &str, options: &CompileOptions) {
        let record = encode(program, options);
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = file.write_all(record.as_bytes()) {
            tracing::warn!(path = %self.path.display(), error = %e, "TPU_RS_RECORD_PROGRAMS: cannot write");
        }
    }
}

fn encode(program: &str, options: &CompileOptions) -> String {
    let devices = match &options.device_assignment {
        Some(d) => d.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
        None => "auto".into(),
    };
    format!(
        "{HEADER}replicas={} partitions={} spmd={} devices={devices} bytes={}\n{program}\n",
        options.num_replicas,
        options.num_partitions,
        u8::from(options.use_spmd_partitioning),
        program.len(),
    )
}

fn record_error(path: &Path, reason: &str) -> Error {
    Error::ProgramRecord {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// The distinct programs recorded in `path`, in the order first recorded.
pub fn read(path: &Path) -> Result<Vec<RecordedProgram>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| record_error(path, &format!("cannot read it: {e}")))?;
    let mut rest = text.as_str();
    let mut seen = HashSet::new();
    let mut programs = Vec::new();
    while !rest.is_empty() {
        let at = text.len() - rest.len();
        let bad = |why: &str| record_error(path, &format!("the record at byte {at} {why}"));
        let (header, body) = rest
            .strip_prefix(HEADER)
            .and_then(|r| r.split_once('\n'))
            .ok_or_else(|| bad("does not start with a program header"))?;
        let (options, bytes) = parse_header(header).ok_or_else(|| bad("has a bad header"))?;
        let program = body
            .get(..bytes)
            .filter(|_| body[bytes..].starts_with('\n'))
            .ok_or_else(|| bad("is cut short"))?;
        rest = &body[bytes + 1..];
        let recorded = RecordedProgram {
            program: program.to_string(),
            options,
        };
        if seen.insert(recorded.clone()) {
            programs.push(recorded);
        }
    }
    Ok(programs)
}

fn parse_header(header: &str) -> Option<(CompileOptions, usize)> {
    let field = |name: &str| {
        header
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
    };
    let number = |name: &str| field(name)?.parse::<usize>().ok();
    let device_assignment = match field("devices")? {
        "auto" => None,
        list => Some(
            list.split(',')
                .map(|d| d.parse().ok())
                .collect::<Option<Vec<usize>>>()?,
        ),
    };
    let options = CompileOptions {
        num_replicas: number("replicas")?,
        num_partitions: number("partitions")?,
        use_spmd_partitioning: match field("spmd")? {
            "0" => false,
            "1" => true,
            _ => return None,
        },
        device_assignment,
    };
    Some((options, number("bytes")?))
}

/// What [`warm`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WarmReport {
    /// Distinct programs in the record.
    pub programs: usize,
    /// Programs compiled now.
    pub compiled: u64,
    /// Programs the cache already held (in memory or on disk).
    pub cached: u64,
    /// Programs that failed to compile (on this plugin, or with more
    /// devices than this host has), each with its error.
    pub failed: Vec<String>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Compiles every program recorded in `path` into the runtime's cache
/// (on disk unless the disk tier is off), `threads` at a time (0: one per
/// core).
pub fn warm(path: &Path, threads: usize) -> Result<WarmReport> {
    let programs = read(path)?;
    let runtime = Runtime::global()?;
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
    .min(programs.len().max(1));
    let started = Instant::now();
    let before = runtime.cache().stats();
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(p) = programs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = runtime.compile(&p.program, &p.options) {
                        failed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(e.to_string());
                    }
                }
            });
        }
    });
    let after = runtime.cache().stats();
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    let compiled = after.compiles - before.compiles;
    Ok(WarmReport {
        programs: programs.len(),
        compiled,
        cached: (programs.len() as u64).saturating_sub(compiled + failed.len() as u64),
        failed,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tpu-rs-record-{name}-{}", std::process::id()))
    }

    #[test]
    fn records_read_back_distinct_and_in_order() {
        let path = scratch("round-trip");
        let sharded = CompileOptions {
            num_replicas: 2,
            num_partitions: 2,
            use_spmd_partitioning: true,
            device_assignment: Some(vec![3, 2, 1, 0]),
        };
        let a = "module @a {\n  func.func @main() {}\n}";
        let b = "module @b {}\n// bytes=3 ends with a newline\n";
        let text = [
            encode(a, &CompileOptions::default()),
            encode(b, &sharded),
            encode(a, &CompileOptions::default()),
            encode(a, &CompileOptions::on_device(1)),
        ]
        .concat();
        std::fs::write(&path, text).unwrap();
        let read = read(&path).unwrap();
        let got: Vec<(&str, &CompileOptions)> = read
            .iter()
            .map(|r| (r.program.as_str(), &r.options))
            .collect();
        assert_eq!(
            got,
            [
                (a, &CompileOptions::default()),
                (b, &sharded),
                (a, &CompileOptions::on_device(1)),
            ]
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file_and_where() {
        let path = scratch("damaged");
        let whole = encode("module @a {}", &CompileOptions::default());
        for (text, expected) in [
            (whole[..whole.len() - 4].to_string(), "cut short"),
            (format!("{whole}garbage\n"), "program header"),
            (whole.replace("spmd=0", "spmd=2"), "bad header"),
        ] {
            std::fs::write(&path, &text).unwrap();
            let err = read(&path).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        let _ = std::fs::remove_file(&path);
    }
}
