//! The C++ layer (native/): PrivateUse1's device guard, hooks and
//! allocator, registered with PyTorch's C++ core when the module loads. It calls back
//! only into the Rust below, never into Python, so torch may use it where
//! an exception must not escape (a stream lookup while autograd records a
//! node) and from its own threads (the autograd engine's per-device
//! workers).

use pyo3::prelude::*;

use crate::error::{BridgeError, Result};
use crate::events::DeviceEvent;

#[cxx::bridge(namespace = "tpu_bridge")]
pub(crate) mod ffi {
    /// The torch dtypes tpu tensors hold.
    enum Dtype {
        Bool,
        I8,
        I16,
        I32,
        I64,
        U8,
        U32,
        F16,
        Bf16,
        F32,
        F64,
        C64,
        C128,
    }

    /// A tpu tensor a C++ kernel passes: its storage's address, its dtype
    /// and its view of the storage (in elements).
    struct TensorRef<'a> {
        address: usize,
        dtype: Dtype,
        sizes: &'a [i64],
        strides: &'a [i64],
        offset: i64,
    }

    /// An operand: a tpu tensor, or a number (a `Scalar`, or the value of a
    /// 0-dim CPU tensor).
    struct Operand<'a> {
        is_number: bool,
        number: f64,
        /// A complex number's imaginary part.
        imag: f64,
        tensor: TensorRef<'a>,
    }

    /// The elementwise binary ops with native C++ kernels.
    enum Binary {
        Add,
        Sub,
        Mul,
        Div,
    }

    /// What kind of error a native kernel raises: PyTorch's class for it.
    enum Failure {
        None,
        Runtime,
        NotImplemented,
        Index,
        OutOfMemory,
    }

    /// A native kernel's result: the storage a new tensor owns, or the
    /// error to raise.
    struct Output {
        address: usize,
        nbytes: usize,
        failure: Failure,
        error: String,
    }

    /// What a native op's argument holds (see `Arg`).
    enum ArgKind {
        /// None, or an undefined tensor.
        Absent,
        Tensor,
        /// A CPU tensor of one or more dims: its dtype, sizes and bytes in
        /// order (a 0-dim CPU tensor is a Number).
        HostTensor,
        /// A tensor on another device.
        OtherTensor,
        Tensors,
        /// A `Scalar`, int, float or bool, or the value of a 0-dim CPU tensor.
        Number,
        /// A `Scalar[]`: its values as floats.
        Numbers,
        Ints,
        Text,
        ScalarType,
        TpuDevice,
        OtherDevice,
    }

    /// One argument of a native op, read by its schema.
    struct Arg<'a> {
        kind: ArgKind,
        /// A number's value (its real part when complex).
        number: f64,
        /// A complex number's imaginary part.
        imag: f64,
        /// An integer or bool number exactly; a device's index (-1: none).
        integer: i64,
        /// A number's type (Bool, I64 or F64 for a Python number, the
        /// tensor's for a 0-dim CPU tensor), or the dtype a ScalarType names.
        dtype: Dtype,
        tensor: TensorRef<'a>,
        tensors: &'a [TensorRef<'a>],
        ints: &'a [i64],
        numbers: &'a [f64],
        text: &'a str,
        bytes: &'a [u8],
    }

    /// An op the Rust side implements: its overload name, the arguments
    /// PyTorch's result type is computed over, and whether its tpu tensors
    /// may be on different devices (`copy_`).
    struct NativeOpSpec {
        name: String,
        promote: Vec<usize>,
        any_devices: bool,
    }

    /// A new tensor a native op returns (undefined for a `None` result);
    /// contiguous unless `strides` are given.
    struct NewTensor {
        defined: bool,
        address: usize,
        nbytes: usize,
        device: usize,
        dtype: Dtype,
        sizes: Vec<i64>,
        strides: Vec<i64>,
    }

    /// What a native op did: its new tensors (in-place and out= results
    /// are the arguments themselves), its number result, that it declined
    /// (the op's composite runs instead), a value to copy into CPU
    /// argument 0 (`bytes`, shaped as `tensors[0]`), or the error to raise.
    struct Outcome {
        failure: Failure,
        error: String,
        declined: bool,
        download: bool,
        bytes: Vec<u8>,
        tensors: Vec<NewTensor>,
        has_number: bool,
        /// The number (its real part when complex).
        number: f64,
        /// A complex number's imaginary part.
        imag: f64,
        integer: i64,
        number_type: Dtype,
    }

    /// A storage the allocator made: its address, or why not.
    struct Allocation {
        address: usize,
        out_of_memory: bool,
        error: String,
    }

    /// One device's memory counters (see `tpu_core::memory`).
    struct MemoryCounters {
        bytes: u64,
        peak_bytes: u64,
        buffers: u64,
        peak_buffers: u64,
        allocated_bytes: u64,
        freed_bytes: u64,
        allocations: u64,
        frees: u64,
    }

    /// A device's free and total memory, when its plugin reports a limit.
    struct MemoryInfo {
        known: bool,
        free_bytes: usize,
        total_bytes: usize,
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

    unsafe extern "C++" {
        include!("torch-bridge/native/device.h");

        fn install() -> Result<()>;
        fn current_device() -> i8;
        fn set_current_device(index: i8) -> Result<()>;
        fn set_default_device(index: i8) -> Result<()>;
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
