//! Where in the user's program an op or a graph cut came from.

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;
use std::panic::Location;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A source location: a Rust caller (`#[track_caller]`) or a Python frame
/// an embedder reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallSite {
    file: &'static str,
    line: u32,
    /// 0 where the language gives none (Python frames).
    column: u32,
}

impl CallSite {
    /// A site in a file that is not Rust source (a Python frame), or with
    /// line 0 a place that is not a file; the name is kept for the rest of
    /// the process.
    pub fn new(file: &str, line: u32) -> CallSite {
        CallSite {
            file: intern(file),
            line,
            column: 0,
        }
    }

    /// The file.
    pub fn file(&self) -> &'static str {
        self.file
    }

    /// The line, from 1.
    pub fn line(&self) -> u32 {
        self.line
    }
}

impl From<&'static Location<'static>> for CallSite {
    fn from(location: &'static Location<'static>) -> CallSite {
        CallSite {
            file: location.file(),
            line: location.line(),
            column: location.column(),
        }
    }
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => f.write_str(self.file),
            (line, 0) => write!(f, "{}:{line}", self.file),
            (line, column) => write!(f, "{}:{line}:{column}", self.file),
        }
    }
}

/// File names of Python frames: few, and kept for the process.
fn intern(file: &str) -> &'static str {
    static FILES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    let files = files.get_or_insert_with(HashSet::new);
    if let Some(&known) = files.get(file) {
        return known;
    }
    let leaked: &'static str = Box::leak(file.to_owned().into_boxed_str());
    files.insert(leaked);
    leaked
}

thread_local! {
    static CURRENT: Cell<Option<CallSite>> = const { Cell::new(None) };
}

static WANTED: AtomicBool = AtomicBool::new(false);

/// Asks embedders to report their callers' sites with [`at`] (a Python
/// frame costs a walk of the stack, so the bridge does it only when a
/// trace is recorded or graphs are dumped).
pub fn want_sites() {
    WANTED.store(true, Ordering::Relaxed);
}

/// Whether callers' sites are wanted (see [`want_sites`]).
pub fn sites_wanted() -> bool {
    WANTED.load(Ordering::Relaxed)
}

/// Runs `f` with `site` as this thread's current site: ops it calls and
/// graph cuts it causes are attributed to `site`. Nests; the outermost
/// site wins, so a user's call is not replaced by a library's inner one.
pub fn at<R>(site: impl Into<CallSite>, f: impl FnOnce() -> R) -> R {
    let outer = CURRENT.with(Cell::get);
    if outer.is_some() {
        return f();
    }
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(None));
        }
    }
    CURRENT.with(|c| c.set(Some(site.into())));
    let _restore = Restore;
    f()
}

/// This thread's current site, set by [`at`].
pub fn current_site() -> Option<CallSite> {
    CURRENT.with(Cell::get)
}

/// The site of an op called from `caller`: the current site if one is set.
pub fn call_site(caller: &'static Location<'static>) -> CallSite {
    current_site().unwrap_or_else(|| caller.into())
}
