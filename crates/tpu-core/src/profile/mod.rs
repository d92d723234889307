//! What runs, as a Chrome trace that opens in Perfetto or
//! `chrome://tracing`: spans for op dispatch, compiles (with the cache tier
//! that served them), program launches and transfers; instant events for
//! graph cuts and recompiles, with the user's source line; a counter of
//! live device bytes.
//!
//! Off unless `TPU_RS_PROFILE=FILE`, [`record`] or [`start`] turns it on.
//! While off, every probe is one relaxed atomic load (the `profile` bench
//! of tpu-core measures it against an op's dispatch).

mod site;
pub mod summary;
mod trace;

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

pub use site::{CallSite, at, call_site, current_site, sites_wanted, want_sites};
pub use summary::Summary;
pub use trace::{Detail, Event, Phase};

use crate::error::{Error, Result};
use trace::TraceFile;

static ON: AtomicBool = AtomicBool::new(false);
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);
/// The summary of the last recording, kept after it stops for reports.
static LAST: Mutex<Option<Summary>> = Mutex::new(None);

/// Events are written in batches of this many (and at every host read).
const BATCH: usize = 4096;

struct Recorder {
    file: TraceFile,
    pending: Vec<Event>,
    named_threads: HashSet<u64>,
    summary: Summary,
}

impl Recorder {
    fn push(&mut self, event: Event) {
        if self.named_threads.insert(event.tid) {
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {}", event.tid), str::to_owned);
            self.pending.push(Event {
                phase: Phase::ThreadName,
                cat: String::new(),
                name: "thread_name".into(),
                ts: 0.0,
                dur: 0.0,
                tid: event.tid,
                args: vec![("name".into(), Detail::Str(name))],
            });
        }
        self.summary.add(&event);
        self.pending.push(event);
        if self.pending.len() >= BATCH {
            self.write();
        }
    }

    fn write(&mut self) {
        if let Err(e) = self.file.append(&self.pending) {
            tracing::warn!(path = %self.file.path().display(), error = %e, "cannot write the profile trace");
        }
        self.pending.clear();
    }
}

/// Whether a trace is being recorded.
#[inline]
pub fn recording() -> bool {
    ON.load(Ordering::Relaxed)
}

fn now_us() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e6
}

fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id)
}

fn push(event: Event) {
    if let Some(recorder) = RECORDER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        recorder.push(event);
    }
}

/// A span being timed; recorded when dropped. Inert when no trace is
/// being recorded.
#[must_use = "a span measures until it is dropped"]
pub struct Span {
    open: Option<Box<Open>>,
}

struct Open {
    cat: &'static str,
    name: Cow<'static, str>,
    start: f64,
    args: Vec<(String, Detail)>,
}

impl Span {
    /// Whether this span will be recorded (so details are worth computing).
    pub fn recording(&self) -> bool {
        self.open.is_some()
    }

    /// Attaches a detail.
    pub fn arg(&mut self, key: &'static str, value: impl Into<Detail>) {
        if let Some(open) = &mut self.open {
            open.args.push((key.into(), value.into()));
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            let end = now_us();
            push(Event {
                phase: Phase::Complete,
                cat: open.cat.into(),
                name: open.name.into_owned(),
                ts: open.start,
                dur: end - open.start,
                tid: thread_id(),
                args: open.args,
            });
        }
    }
}

/// Starts a span of category `cat` (`op`, `compile`, `execute`, `transfer`).
#[inline]
pub fn span(cat: &'static str, name: impl Into<Cow<'static, str>>) -> Span {
    if !recording() {
        return Span { open: None };
    }
    Span {
        open: Some(Box::new(Open {
            cat,
            name: name.into(),
            start: now_us(),
            args: Vec::new(),
        })),
    }
}

/// Records a moment of category `cat` (`cut`, `recompile`); `args` is only
/// called while recording.
#[inline]
pub fn instant(
    cat: &'static str,
    name: impl Into<Cow<'static, str>>,
    args: impl FnOnce() -> Vec<(&'static str, Detail)>,
) {
    if !recording() {
        return;
    }
    push(Event {
        phase: Phase::Instant,
        cat: cat.into(),
        name: name.into().into_owned(),
        ts: now_us(),
        dur: 0.0,
        tid: thread_id(),
        args: args().into_iter().map(|(k, v)| (k.into(), v)).collect(),
    });
}

/// Records a new value of counter `name`.
#[inline]
pub fn counter(name: &'static str, value: u64) {
    if !recording() {
        return;
    }
    push(Event {
        phase: Phase::Counter,
        cat: "memory".into(),
        name: name.into(),
        ts: now_us(),
        dur: 0.0,
        tid: thread_id(),
        args: vec![("bytes".into(), Detail::from(value))],
    });
}

/// Starts recording a trace into `path`; fails if one is being recorded.
pub fn start(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let mut recorder = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(running) = recorder.as_ref() {
        return Err(Error::Profile {
            path: path.display().to_string(),
            reason: format!(
                "a trace is already being recorded into {}",
                running.file.path().display()
            ),
        });
    }
    let file = TraceFile::create(path).map_err(|e| Error::Profile {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    *recorder = Some(Recorder {
        file,
        pending: Vec::new(),
        named_threads: HashSet::new(),
        summary: Summary::default(),
    });
    drop(recorder);
    want_sites();
    now_us();
    ON.store(true, Ordering::Relaxed);
    crate::metrics::note_live_bytes();
    Ok(())
}

/// Stops recording and completes the file; returns its path, or `None`
/// when nothing was being recorded.
pub fn stop() -> Option<PathBuf> {
    ON.store(false, Ordering::Relaxed);
    let mut recorder = RECORDER.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    recorder.write();
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(recorder.summary.clone());
    Some(recorder.file.path().to_owned())
}

/// Writes the events recorded so far (the file stays complete JSON).
/// Host reads do this, so a program that ends after reading a result
/// leaves its whole trace even without [`stop`].
pub fn flush() {
    if !recording() {
        return;
    }
    if let Some(recorder) = RECORDER.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        recorder.write();
    }
}

/// Records a trace of `f` into `path`.
pub fn record<R>(path: impl AsRef<Path>, f: impl FnOnce() -> R) -> Result<R> {
    start(path)?;
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            stop();
        }
    }
    let _stop = Stop;
    Ok(f())
}

/// Starts the trace `TPU_RS_PROFILE` names, once per process; the runtime
/// calls this when it starts.
pub fn start_from_env() -> Result<()> {
    static STARTED: OnceLock<Result<()>> = OnceLock::new();
    STARTED
        .get_or_init(|| match crate::settings::env("TPU_RS_PROFILE")? {
            Some(path) => start(path),
            None => Ok(()),
        })
        .clone()
}

/// The summary of the trace being recorded, else of the last one.
pub fn recorded_summary() -> Option<Summary> {
    if let Some(recorder) = RECORDER.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Some(recorder.summary.clone());
    }
    LAST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
