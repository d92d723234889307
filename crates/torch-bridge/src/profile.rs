//! Profiling from Python: traces attributed to the user's Python lines,
//! recompile warnings through Python's `warnings`, and the report.

use std::sync::OnceLock;

use pyo3::create_exception;
use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use tpu_core::profile::{self, CallSite};
use tpu_core::recompile;

use crate::error::BridgeError;

create_exception!(
    _C,
    RecompileWarning,
    PyUserWarning,
    "The same op or graph keeps compiling new programs (its input shapes change)."
);

/// The folders of torch and of this package: frames there are not the user's.
fn library_dirs(py: Python<'_>) -> &'static [String] {
    static DIRS: OnceLock<Vec<String>> = OnceLock::new();
    DIRS.get_or_init(|| {
        ["torch", "torch_tpu_rs"]
            .iter()
            .filter_map(|name| {
                let file: String = py
                    .import(*name)
                    .ok()?
                    .getattr("__file__")
                    .ok()?
                    .extract()
                    .ok()?;
                let dir = std::path::Path::new(&file).parent()?;
                Some(format!("{}{}", dir.display(), std::path::MAIN_SEPARATOR))
            })
            .collect()
    })
}

/// Installed code — the standard library and every site-packages folder —
/// besides torch and this package: a warning the user can act on points
/// past it, at the user's own line (`model.generate(...)`, not a line
/// inside transformers).
fn installed_dirs(py: Python<'_>) -> &'static [String] {
    static DIRS: OnceLock<Vec<String>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs = library_dirs(py).to_vec();
        let folders = py.import("site").and_then(|site| {
            let mut folders: Vec<String> = site.call_method0("getsitepackages")?.extract()?;
            folders.push(site.call_method0("getusersitepackages")?.extract()?);
            let paths = py.import("sysconfig")?.call_method0("get_paths")?;
            folders.push(paths.get_item("stdlib")?.extract()?);
            Ok::<_, PyErr>(folders)
        });
        let sep = std::path::MAIN_SEPARATOR;
        dirs.extend(
            folders
                .unwrap_or_default()
                .into_iter()
                .map(|d| format!("{d}{sep}")),
        );
        dirs
    })
}

/// The innermost frame outside torch and this package from `frame` outwards.
fn user_frame(dirs: &[String], mut frame: Bound<'_, PyAny>) -> Option<CallSite> {
    loop {
        let file: String = frame
            .getattr("f_code")
            .ok()?
            .getattr("co_filename")
            .ok()?
            .extract()
            .ok()?;
        if !dirs.iter().any(|d| file.starts_with(d.as_str())) {
            let line: u32 = frame.getattr("f_lineno").ok()?.extract().unwrap_or(0);
            return Some(CallSite::new(&file, line));
        }
        frame = frame.getattr("f_back").ok().filter(|f| !f.is_none())?;
    }
}

/// The user's line behind the current call: the innermost Python frame
/// outside torch and this package. Torch's autograd threads, which run
/// backward, have none: theirs is the main thread's (waiting in
/// `backward()`), else a name saying so.
fn python_site(py: Python<'_>) -> Option<CallSite> {
    let dirs = library_dirs(py);
    let sys = py.import("sys").ok()?;
    // A thread with no Python frames (an autograd worker running a native
    // kernel) has none of its own: `_getframe` raises there.
    let own = sys.call_method1("_getframe", (0,)).ok();
    if let Some(site) = own.and_then(|frame| user_frame(dirs, frame)) {
        return Some(site);
    }
    let main = py
        .import("threading")
        .ok()?
        .call_method0("main_thread")
        .ok()?
        .getattr("ident")
        .ok()?;
    let main_frame = sys
        .call_method0("_current_frames")
        .ok()?
        .get_item(main)
        .ok();
    main_frame
        .and_then(|frame| user_frame(dirs, frame))
        .or_else(|| Some(CallSite::new("<no frame outside torch>", 0)))
}

/// Runs `f` attributed to the calling Python line, when sites are wanted
/// (a trace is recorded or graphs are dumped); then shows recompile
/// warnings `f` raised. Called with the GIL held, by every op entry.
pub fn from_python<R>(f: impl FnOnce() -> R) -> R {
    let result = if profile::sites_wanted() {
        match Python::attach(python_site) {
            Some(site) => profile::at(site, f),
            None => f(),
        }
    } else {
        f()
    };
    if recompile::warnings_pending() {
        Python::attach(show_warnings);
    }
    result
}

/// Issues collected recompile warnings as [`RecompileWarning`]s at the
/// user's line: outside installed code where the call came from the user's
/// script, else outside torch.
fn show_warnings(py: Python<'_>) {
    let own = py
        .import("sys")
        .and_then(|sys| sys.call_method1("_getframe", (0,)));
    let site = own
        .ok()
        .and_then(|frame| user_frame(installed_dirs(py), frame))
        .or_else(|| python_site(py));
    for warning in recompile::take_warnings() {
        let site = site.unwrap_or(warning.site);
        let shown = py.import("warnings").and_then(|w| {
            w.call_method1(
                "warn_explicit",
                (
                    warning.message.as_str(),
                    py.get_type::<RecompileWarning>(),
                    site.file(),
                    site.line(),
                ),
            )
        });
        if let Err(e) = shown {
            // A filter that turns warnings into errors: the error goes to
            // stderr here, since the op itself succeeded.
            e.print(py);
        }
    }
}

/// Starts recording a Chrome trace into `path`.
#[pyfunction]
pub fn profile_start(path: std::path::PathBuf) -> PyResult<()> {
    Ok(profile::start(path).map_err(BridgeError::from)?)
}

/// Stops recording; the trace's path, or `None` when none was recorded.
#[pyfunction]
pub fn profile_stop() -> Option<std::path::PathBuf> {
    profile::stop()
}

/// Whether a trace is being recorded.
#[pyfunction]
pub fn profile_recording() -> bool {
    profile::recording()
}

/// The process's report: the recorded trace's summary and the counters.
#[pyfunction]
pub fn metrics_report() -> String {
    tpu_core::metrics::report()
}
