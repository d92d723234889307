//! The PyTorch bridge of tpu-rs: the native half of the `torch_tpu_rs`
//! Python package, which gives PyTorch a `tpu` device.
//!
//! Python registers aten kernels for the device (see `python/`); each one
//! calls in here with torch tensors. A torch storage on `tpu` carries a
//! [`Storage`] holding a tpu-rs tensor; ops run through the tpu-rs
//! dispatcher under the chosen eager mode, and writes rebind storages.
//!
//! Modules depend one way, from the bottom up: plain data (`layout`,
//! `address`, `error`, and `ffi`: what the C++ layer and the Rust side
//! exchange, with the C++ device guard); the record of a compiled graph's
//! run being traced (`recording`) and of values written (`writes`); op calls under the
//! bridge's policy (`kernels`); storages (`storage`, `dlpack`); conversion
//! between torch tensors and ours (`torch`, `args`); and on top, what
//! Python and the C++ layer call (`ops`, `replay`, `random`, `buckets`,
//! `native_ops`, then `native_kernels`, then `native`, the entry points
//! C++ calls; `device`, `dist`).
#![warn(missing_docs)]

// `op!`: ops named in code are interned once per call site.
#[macro_use]
extern crate tpu_core;

mod address;
mod allocator;
mod args;
mod buckets;
mod device;
mod dist;
mod dlpack;
mod error;
mod events;
mod ffi;
mod kernels;
mod layout;
mod native;
mod native_kernels;
mod native_ops;
mod ops;
mod profile;
mod random;
mod recording;
mod replay;
mod storage;
mod torch;
mod writes;

use pyo3::prelude::*;

pub use error::{BridgeError, TpuError};
pub use layout::Layout;
pub use storage::Storage;

/// An unwritten tpu tensor of `size` and `dtype` (contiguous) on
/// `tpu:device`.
#[pyfunction]
#[pyo3(signature = (size, dtype, device=0))]
fn empty<'py>(
    py: Python<'py>,
    size: Vec<usize>,
    dtype: &Bound<'py, PyAny>,
    device: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(torch::empty(py, &size, torch::dtype_of(dtype)?, device)?)
}

/// The names of every op in the tpu-rs registry.
#[pyfunction]
fn op_names() -> PyResult<Vec<&'static str>> {
    Ok(tpu_ops::registry().map_err(BridgeError::from)?.names())
}

/// The aten overloads with a native kernel written in Rust
/// (`native_ops`), in registration order.
#[pyfunction]
fn native_op_names() -> Vec<&'static str> {
    native_ops::names()
}

/// The Python module `torch_tpu_rs._C`.
#[pymodule]
#[pyo3(name = "_C")]
fn c_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tpu_eager::link();
    native::install()?;
    m.add("TpuError", m.py().get_type::<TpuError>())?;
    m.add("TpuIndexError", error::index_error(m.py())?)?;
    m.add(
        "TpuNotImplementedError",
        error::not_implemented_error(m.py())?,
    )?;
    m.add(
        "RecompileWarning",
        m.py().get_type::<profile::RecompileWarning>(),
    )?;
    // Shown through Python's warnings, at the user's line.
    tpu_core::recompile::collect_warnings();
    m.add_class::<storage::Handle>()?;
    m.add_class::<replay::Replay>()?;
    m.add_function(wrap_pyfunction!(replay::record_start, m)?)?;
    m.add_function(wrap_pyfunction!(replay::record_stop, m)?)?;
    m.add_class::<dist::DistStore>()?;
    m.add_class::<dist::DistGroup>()?;
    m.add_function(wrap_pyfunction!(dist::local_ip_towards, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(op_names, m)?)?;
    m.add_function(wrap_pyfunction!(native_op_names, m)?)?;
    m.add_function(wrap_pyfunction!(ops::run, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::concat, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::padded_keys, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::shape_buckets, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::set_shape_buckets, m)?)?;
    m.add_function(wrap_pyfunction!(ops::run_into, m)?)?;
    m.add_function(wrap_pyfunction!(ops::copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(ops::to_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(ops::from_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(ops::vjp, m)?)?;
    m.add_function(wrap_pyfunction!(random::manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(random::manual_seed_all, m)?)?;
    m.add_function(wrap_pyfunction!(random::initial_seed, m)?)?;
    m.add_function(wrap_pyfunction!(random::rng_state, m)?)?;
    m.add_function(wrap_pyfunction!(random::set_rng_state, m)?)?;
    m.add_function(wrap_pyfunction!(random::fill_random, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(native::current_device, m)?)?;
    m.add_function(wrap_pyfunction!(native::set_device, m)?)?;
    m.add_function(wrap_pyfunction!(native::set_default_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_name, m)?)?;
    m.add_function(wrap_pyfunction!(device::describe, m)?)?;
    m.add_function(wrap_pyfunction!(device::platform, m)?)?;
    m.add_function(wrap_pyfunction!(device::memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(device::metrics, m)?)?;
    m.add_function(wrap_pyfunction!(device::eager_mode, m)?)?;
    m.add_function(wrap_pyfunction!(device::set_eager_mode, m)?)?;
    m.add_function(wrap_pyfunction!(device::synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(device::flush, m)?)?;
    m.add_function(wrap_pyfunction!(device::launch_queued, m)?)?;
    m.add_function(wrap_pyfunction!(device::warm_cache, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_start, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_stop, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_recording, m)?)?;
    m.add_function(wrap_pyfunction!(profile::metrics_report, m)?)?;
    Ok(())
}
