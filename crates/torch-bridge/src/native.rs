//! The C++ layer (native/): PrivateUse1's device guard, hooks and
//! allocator, registered with PyTorch's C++ core when the module loads. It calls back
//! only into the Rust below, never into Python, so torch may use it where
//! an exception must not escape (a stream lookup while autograd records a
//! node) and from its own threads (the autograd engine's per-device
//! workers).

use pyo3::prelude::*;

use crate::error::{BridgeError, Result};
use crate::events::DeviceEvent;
use crate::ffi;

#[cxx::bridge(namespace = "tpu_bridge")]
mod entry {
    unsafe extern "C++" {
        include!("torch-bridge/src/ffi.rs.h");

        type Dtype = crate::ffi::Dtype;
        type Binary = crate::ffi::Binary;
        type TensorRef<'a> = crate::ffi::TensorRef<'a>;
        type Operand<'a> = crate::ffi::Operand<'a>;
        type Arg<'a> = crate::ffi::Arg<'a>;
        type Output = crate::ffi::Output;
        type Outcome = crate::ffi::Outcome;
        type NativeOpSpec = crate::ffi::NativeOpSpec;
        type Allocation = crate::ffi::Allocation;
        type MemoryCounters = crate::ffi::MemoryCounters;
        type MemoryInfo = crate::ffi::MemoryInfo;
    }

    extern "Rust" {
        fn device_count() -> usize;
        fn synchronize() -> Result<()>;

        /// A recorded event: see `events.rs`.
        type DeviceEvent;
        fn record_event(device: i8, timing: bool) -> Result<Box<DeviceEvent>>;
        fn query(self: &DeviceEvent) -> Result<bool>;
        fn wait(self: &DeviceEvent) -> Result<()>;
        fn elapsed_ms(self: &DeviceEvent, end: &DeviceEvent) -> Result<f64>;

        fn resize_storage(address: usize, nbytes: usize) -> Result<()>;
        fn allocate_storage(nbytes: usize, device: i8) -> Allocation;
        fn release_storage(address: usize);
        fn device_memory(device: i8) -> MemoryCounters;
        fn reset_memory_peaks(device: i8);
        fn reset_memory_totals(device: i8);
        fn memory_info(device: i8) -> MemoryInfo;

        fn native_ops() -> Vec<NativeOpSpec>;
        fn run_native_op(
            index: usize,
            args: &[Arg],
            promoted: Dtype,
            default_float: Dtype,
        ) -> Outcome;

        #[cxx_name = "binary"]
        fn native_binary(op: Binary, a: &Operand, b: &Operand, alpha: f64, dtype: Dtype) -> Output;

        #[cxx_name = "binary_into"]
        fn native_binary_into(
            op: Binary,
            a: &Operand,
            b: &Operand,
            alpha: f64,
            dtype: Dtype,
            out: &TensorRef,
        ) -> Output;

        #[cxx_name = "matmul"]
        fn native_matmul(
            a: &Operand,
            b: &Operand,
            bias: &Operand,
            has_bias: bool,
            alpha: f64,
            beta: f64,
            dtype: Dtype,
        ) -> Output;
    }
}

fn native_ops() -> Vec<ffi::NativeOpSpec> {
    crate::native_ops::specs()
}

fn run_native_op(
    index: usize,
    args: &[ffi::Arg<'_>],
    promoted: ffi::Dtype,
    default_float: ffi::Dtype,
) -> ffi::Outcome {
    crate::native_ops::run(index, args, promoted, default_float)
}

fn device_count() -> usize {
    crate::device::device_count()
}

fn synchronize() -> Result<()> {
    crate::kernels::synchronize()
}

fn record_event(device: i8, timing: bool) -> Result<Box<DeviceEvent>> {
    crate::events::record(device.max(0) as usize, timing)
}

fn resize_storage(address: usize, nbytes: usize) -> Result<()> {
    crate::storage::resize(address as u64, nbytes)
}

fn allocate_storage(nbytes: usize, device: i8) -> ffi::Allocation {
    match crate::allocator::allocate(nbytes, device.max(0) as usize) {
        Ok(address) => ffi::Allocation {
            address: address as usize,
            out_of_memory: false,
            error: String::new(),
        },
        Err(e) => ffi::Allocation {
            address: 0,
            out_of_memory: e.is_out_of_memory(),
            error: e.to_string(),
        },
    }
}

fn release_storage(address: usize) {
    crate::allocator::release(address as u64);
}

fn device_memory(device: i8) -> ffi::MemoryCounters {
    // Counted as CUDA counts: every call made so far has its outputs.
    tpu_eager::launch_queued();
    let m = tpu_core::memory::device_memory(device.max(0) as usize);
    ffi::MemoryCounters {
        bytes: m.bytes,
        peak_bytes: m.peak_bytes,
        buffers: m.buffers,
        peak_buffers: m.peak_buffers,
        allocated_bytes: m.allocated_bytes,
        freed_bytes: m.freed_bytes,
        allocations: m.allocations,
        frees: m.frees,
    }
}

fn reset_memory_peaks(device: i8) {
    tpu_core::memory::reset_peaks(device.max(0) as usize);
}

fn reset_memory_totals(device: i8) {
    tpu_core::memory::reset_totals(device.max(0) as usize);
}

fn memory_info(device: i8) -> ffi::MemoryInfo {
    match crate::device::memory_info(device.max(0) as usize) {
        Some((free, total)) => ffi::MemoryInfo {
            known: true,
            free_bytes: free as usize,
            total_bytes: total as usize,
        },
        None => ffi::MemoryInfo {
            known: false,
            free_bytes: 0,
            total_bytes: 0,
        },
    }
}

fn native_binary(
    op: ffi::Binary,
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    alpha: f64,
    dtype: ffi::Dtype,
) -> ffi::Output {
    crate::native_kernels::output(crate::native_kernels::binary(op, a, b, alpha, dtype).map(Some))
}

fn native_binary_into(
    op: ffi::Binary,
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    alpha: f64,
    dtype: ffi::Dtype,
    out: &ffi::TensorRef<'_>,
) -> ffi::Output {
    let written = crate::native_kernels::binary_into(op, a, b, alpha, dtype, out);
    crate::native_kernels::output(written.map(|()| None))
}

#[allow(clippy::too_many_arguments)]
fn native_matmul(
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    bias: &ffi::Operand<'_>,
    has_bias: bool,
    alpha: f64,
    beta: f64,
    dtype: ffi::Dtype,
) -> ffi::Output {
    let bias = has_bias.then_some(bias);
    let made = crate::native_kernels::matmul(a, b, bias, alpha, beta, dtype);
    crate::native_kernels::output(made.map(Some))
}

/// Registers the `tpu` device with PyTorch's C++ core.
pub fn install() -> Result<()> {
    ffi::install().map_err(|e| BridgeError::Device(e.what().to_string()))
}

/// The calling thread's current tpu device.
#[pyfunction]
pub fn current_device() -> usize {
    ffi::current_device().max(0) as usize
}

/// Makes `index` the current tpu device of this thread and of every thread
/// that has not chosen one (the process's own device under torchrun).
#[pyfunction]
pub fn set_default_device(index: usize) -> PyResult<()> {
    let index = i8::try_from(index).unwrap_or(i8::MAX);
    ffi::set_default_device(index).map_err(|e| BridgeError::Device(e.what().to_string()))?;
    Ok(())
}

/// Makes `index` the calling thread's current tpu device.
#[pyfunction]
pub fn set_device(index: usize) -> PyResult<()> {
    let index = i8::try_from(index).unwrap_or(i8::MAX);
    ffi::set_current_device(index).map_err(|e| BridgeError::Device(e.what().to_string()))?;
    Ok(())
}
