//! What `torch.tpu` reports: devices, memory, metrics and the eager mode.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tpu_core::Runtime;

use crate::error::{BridgeError, Result};
use crate::kernels;

fn runtime() -> Result<&'static Runtime> {
    Ok(Runtime::global()?)
}

/// Number of `tpu` devices (0 when no plugin loads).
#[pyfunction]
pub fn device_count() -> usize {
    Runtime::global().map_or(0, |r| r.client().device_count())
}

/// Why the runtime cannot start, or `None` when it can.
#[pyfunction]
pub fn unavailable_reason() -> Option<String> {
    Runtime::global().err().map(|e| e.to_string())
}

/// The platform and device kind of device `index` (`"cpu"`, `"TPU v5 lite"`).
#[pyfunction]
pub fn device_name(index: usize) -> PyResult<String> {
    let r = runtime()?;
    let devices = r.client().devices();
    let d = devices.get(index).ok_or_else(|| {
        BridgeError::Core(tpu_core::Error::DeviceOutOfRange {
            index,
            count: devices.len(),
            platform: r.client().platform_name().to_string(),
        })
    })?;
    Ok(d.kind.clone())
}

/// A one-line description naming the plugin and platform.
#[pyfunction]
pub fn describe(index: usize) -> PyResult<String> {
    Ok(runtime()?.describe(index).map_err(BridgeError::from)?)
}

/// The platform name of the plugin (`cpu`, `tpu`).
#[pyfunction]
pub fn platform() -> PyResult<String> {
    Ok(runtime()?.client().platform_name().to_string())
}

/// Device memory of `index` as the plugin reports it: bytes in use, peak
/// and limit (each where it gives one). tpu-rs's own counters reach torch
/// through the allocator (`native/allocator.cc`).
#[pyfunction]
pub fn memory_stats(py: Python<'_>, index: usize) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    if let Some(stats) = runtime()?
        .client()
        .memory_stats(index)
        .map_err(BridgeError::from)?
    {
        out.set_item("device_bytes_in_use", stats.bytes_in_use)?;
        out.set_item("device_peak_bytes_in_use", stats.peak_bytes_in_use)?;
        out.set_item("device_bytes_limit", stats.bytes_limit)?;
    }
    Ok(out)
}

/// `(free, total)` bytes of device `index`: the plugin's limit less what is
/// in use where it reports one; on the XLA CPU plugin, whose device memory is
/// the host's, the host's available and total memory.
pub fn memory_info(index: usize) -> Option<(u64, u64)> {
    let client = Runtime::global().ok()?.client();
    let stats = client.memory_stats(index).ok().flatten();
    if let Some((limit, in_use)) = stats.and_then(|s| Some((s.bytes_limit?, s.bytes_in_use))) {
        return Some((limit.saturating_sub(in_use), limit));
    }
    (client.platform_name() == "cpu")
        .then(host_memory)
        .flatten()
}

/// The host's available and total memory from `/proc/meminfo` (Linux).
fn host_memory() -> Option<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// The runtime's counters: compiles, cache hits, executions, graphs cut
/// and recompiles (total and by reason), transfer bytes, live and peak
/// device bytes.
#[pyfunction]
pub fn metrics(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let m = tpu_core::metrics::metrics();
    let out = PyDict::new(py);
    out.set_item("compiles", m.compiles)?;
    out.set_item("cache_hits", m.cache_hits)?;
    out.set_item("disk_cache_hits", m.disk_hits)?;
    out.set_item("compile_seconds", m.compile_time.as_secs_f64())?;
    out.set_item("executions", m.executions)?;
    out.set_item("graphs_cut", m.total_cuts())?;
    let by_reason = PyDict::new(py);
    for (reason, n) in &m.graphs_cut {
        by_reason.set_item(reason.name(), n)?;
    }
    out.set_item("graphs_cut_by_reason", by_reason)?;
    out.set_item("recompiles", m.total_recompiles())?;
    let by_reason = PyDict::new(py);
    for (reason, n) in &m.recompiles_by_reason {
        by_reason.set_item(reason.name(), n)?;
    }
    out.set_item("recompiles_by_reason", by_reason)?;
    out.set_item("host_to_device_bytes", m.host_to_device_bytes)?;
    out.set_item("device_to_host_bytes", m.device_to_host_bytes)?;
    out.set_item("live_bytes", m.live_device_bytes)?;
    out.set_item("peak_bytes", m.peak_device_bytes)?;
    Ok(out)
}

/// The eager mode in force: `strict`, `debug` or `defer_and_fuse`.
#[pyfunction]
pub fn eager_mode() -> PyResult<&'static str> {
    Ok(kernels::policy_name()?)
}

/// Switches the eager mode (pending work runs first).
#[pyfunction]
pub fn set_eager_mode(mode: &str) -> PyResult<()> {
    Ok(kernels::set_policy(mode)?)
}

/// Runs everything pending on the device.
/// Other Python threads run meanwhile.
#[pyfunction]
pub fn synchronize(py: Python<'_>) -> PyResult<()> {
    Ok(py.detach(|| crate::profile::from_python(kernels::synchronize))?)
}

/// Launches every call still waiting for its program to compile (the
/// interpreter's exit runs this, so no compile outlives it).
#[pyfunction]
pub fn launch_queued(py: Python<'_>) {
    py.detach(tpu_eager::launch_queued);
}

/// Compiles the programs recorded in `record` (by a run with
/// `TPU_RS_RECORD_PROGRAMS`) into the compile cache, `threads` at a time
/// (0: one per core): programs, compiled, already cached, the errors of
/// those that failed, seconds.
#[pyfunction]
pub fn warm_cache(
    py: Python<'_>,
    record: std::path::PathBuf,
    threads: usize,
) -> PyResult<(usize, u64, u64, Vec<String>, f64)> {
    let report = py
        .detach(|| tpu_core::program_record::warm(&record, threads))
        .map_err(crate::error::BridgeError::from)?;
    Ok((
        report.programs,
        report.compiled,
        report.cached,
        report.failed,
        report.seconds,
    ))
}

/// Starts everything pending on the device, without waiting for it (the
/// compiles it needs let other Python threads run).
#[pyfunction]
pub fn flush(py: Python<'_>) -> PyResult<()> {
    Ok(py.detach(|| crate::profile::from_python(kernels::start))?)
}
