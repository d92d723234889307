//! The bottom of the boundary with the C++ layer (native/): the plain data
//! both sides exchange and the functions C++ provides (the device guard),
//! shared through `cxx`. The kernels that read them (`native_ops`,
//! `native_kernels`) and the entry points C++ calls (`native`) sit above.

#[cxx::bridge(namespace = "tpu_bridge")]
mod types {
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

    impl Vec<NativeOpSpec> {}

    unsafe extern "C++" {
        include!("torch-bridge/native/device.h");

        fn install() -> Result<()>;
        fn current_device() -> i8;
        fn set_current_device(index: i8) -> Result<()>;
        fn set_default_device(index: i8) -> Result<()>;
    }
}

pub(crate) use types::*;
