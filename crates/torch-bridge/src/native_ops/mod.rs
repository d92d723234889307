//! Native aten kernels written in Rust. Each is a function of its
//! arguments as the schema gives them ([`Call`]), registered for
//! PrivateUse1 by one boxed C++ kernel (`native/boxed.cc`) that reads the
//! dispatcher's stack, computes PyTorch's result type over the arguments a
//! kernel names and pushes what the kernel returns ([`Done`]). No Python
//! runs on this path; ops without a kernel here keep their Python one.

mod elementwise;
mod foreach;
mod nn;
mod optim;
mod reductions;
mod tensors;

use std::sync::{Arc, OnceLock};

use tpu_core::op::{AsOp, Attrs, OpErrorKind};
use tpu_core::{DType, Tensor};

use crate::error::{BridgeError, Result};
use crate::ffi;
use crate::kernels::{call1, cast};
use crate::kernels::{number, scalar};
use crate::layout::Layout;
use crate::storage::{self, Padded, Storage};
use crate::torch::View;

/// A kernel: what it does with one call's arguments.
pub type Kernel = Box<dyn Fn(&Call<'_>) -> Result<Done> + Send + Sync>;

/// An op with a native kernel.
pub struct NativeOp {
    /// Its overload name (`lerp_.Scalar`).
    pub name: &'static str,
    /// The arguments PyTorch's result type is computed over
    /// ([`Call::promoted`]); empty when the kernel does not ask for it.
    pub promote: &'static [usize],
    /// Whether its tpu tensors may be on different devices.
    pub any_devices: bool,
    /// The kernel.
    pub kernel: Kernel,
}

/// Shorthand for a table entry.
pub fn op(
    name: &'static str,
    promote: &'static [usize],
    kernel: impl Fn(&Call<'_>) -> Result<Done> + Send + Sync + 'static,
) -> NativeOp {
    NativeOp {
        name,
        promote,
        any_devices: false,
        kernel: Box::new(kernel),
    }
}

/// A result value: a tensor, or one held padded to a shape bucket.
pub enum Value {
    /// A plain value.
    Plain(Tensor),
    /// A value padded along one dim ([`crate::buckets`]).
    Padded(Padded),
    /// A new, unwritten storage viewed with `sizes` and `strides`.
    Unwritten {
        storage: Arc<Storage>,
        sizes: Vec<usize>,
        strides: Vec<usize>,
    },
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Plain(t)
    }
}

/// What a kernel did.
pub enum Done {
    /// New tensors, one per returned tensor that is not an argument
    /// (`None`: an undefined tensor).
    Values(Vec<Option<Value>>),
    /// A number (`_local_scalar_dense`), read from a 0-dim value.
    Number(Tensor),
    /// An integer result known without the device.
    Integer(i64),
    /// It wrote its results into the arguments it returns.
    Written,
    /// It does not apply: the op's composite runs instead.
    Declined,
    /// A value for C++ to copy into CPU tensor argument 0.
    Download(Tensor),
}

impl Done {
    /// One new tensor.
    pub fn one(value: impl Into<Value>) -> Done {
        Done::Values(vec![Some(value.into())])
    }
}

/// Every op with a native kernel, in the order C++ registers them.
fn table() -> &'static [NativeOp] {
    static TABLE: OnceLock<Vec<NativeOp>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut ops = Vec::new();
        elementwise::register(&mut ops);
        reductions::register(&mut ops);
        nn::register(&mut ops);
        optim::register(&mut ops);
        foreach::register(&mut ops);
        tensors::register(&mut ops);
        ops
    })
}

/// The ops C++ registers, by index into the table.
pub fn specs() -> Vec<ffi::NativeOpSpec> {
    table()
        .iter()
        .map(|op| ffi::NativeOpSpec {
            name: op.name.to_string(),
            promote: op.promote.to_vec(),
            any_devices: op.any_devices,
        })
        .collect()
}

/// The ops with a native kernel here.
pub fn names() -> Vec<&'static str> {
    table().iter().map(|op| op.name).collect()
}

/// Runs op `index` of the table on `args`.
pub fn run(
    index: usize,
    args: &[ffi::Arg<'_>],
    promoted: ffi::Dtype,
    default_float: ffi::Dtype,
) -> ffi::Outcome {
    let Some(op) = table().get(index) else {
        return failed(
            BridgeError::internal(format!("no native op {index}")),
            "?",
            args,
        );
    };
    let call = match (dtype(promoted), dtype(default_float)) {
        (Ok(promoted), Ok(default_float)) => Call {
            op: op.name,
            args,
            promoted: (!op.promote.is_empty()).then_some(promoted),
            default_float,
            device: std::cell::OnceCell::new(),
        },
        (Err(e), _) | (_, Err(e)) => return failed(e, op.name, args),
    };
    match (op.kernel)(&call).and_then(outcome) {
        Ok(out) => out,
        Err(e) => failed(e, op.name, args),
    }
}

fn outcome(done: Done) -> Result<ffi::Outcome> {
    let mut out = nothing_done();
    match done {
        Done::Values(values) => {
            for value in values {
                out.tensors.push(match value {
                    Some(v) => new_tensor(v)?,
                    None => no_tensor(ffi::Dtype::F32, Vec::new()),
                });
            }
        }
        Done::Number(value) => {
            crate::recording::note_unreplayable("a value is read back to the host");
            // The wait (a deferred graph's run) is the calling line's.
            let host = crate::profile::from_python(|| value.to_host())?;
            out.has_number = true;
            out.number_type = code(host.dtype());
            out.number = host.to_f64().iter().next().copied().unwrap_or(0.0);
            if host.dtype().is_complex() {
                out.imag = host.to_complex().iter().next().map_or(0.0, |z| z.im);
            }
            out.integer = host.to_i64().iter().next().copied().unwrap_or(0);
        }
        Done::Integer(i) => {
            out.has_number = true;
            out.number_type = ffi::Dtype::I64;
            out.integer = i;
            out.number = i as f64;
        }
        Done::Written => {}
        Done::Declined => out.declined = true,
        Done::Download(value) => {
            let host = crate::profile::from_python(|| crate::torch::host_copy(&value))?;
            out.download = true;
            out.bytes = host.bytes().to_vec();
            let sizes = host.shape().dims().iter().map(|&n| n as i64).collect();
            out.tensors.push(no_tensor(code(host.dtype()), sizes));
        }
    }
    Ok(out)
}

fn new_tensor(value: Value) -> Result<ffi::NewTensor> {
    let (storage, sizes, strides) = match value {
        Value::Plain(t) => {
            let sizes = t.shape().dims().to_vec();
            (Storage::holding(t)?, sizes, Vec::new())
        }
        Value::Padded(p) => {
            let sizes = p.shape();
            (Storage::holding_padded(p)?, sizes, Vec::new())
        }
        Value::Unwritten {
            storage,
            sizes,
            strides,
        } => (storage, sizes, strides),
    };
    hand_over(&storage);
    Ok(ffi::NewTensor {
        defined: true,
        address: storage.address() as usize,
        nbytes: storage.nbytes(),
        device: storage.device(),
        dtype: code(storage.dtype()),
        sizes: sizes.iter().map(|&n| n as i64).collect(),
        strides: strides.iter().map(|&n| n as i64).collect(),
    })
}

/// Keeps `storage` alive for the C++ tensor about to own it (until its
/// DataPtr's deleter releases it).
pub fn hand_over(storage: &Arc<Storage>) {
    crate::allocator::adopt(storage.clone());
}

/// A returned tensor known by its dtype and sizes only: an undefined result
/// (`None`), or a downloaded value's shape.
fn no_tensor(dtype: ffi::Dtype, sizes: Vec<i64>) -> ffi::NewTensor {
    ffi::NewTensor {
        defined: false,
        address: 0,
        nbytes: 0,
        device: 0,
        dtype,
        sizes,
        strides: Vec::new(),
    }
}

/// An error for C++ to raise, naming the op and its device, with the class
/// PyTorch raises for its kind.
fn failed(e: BridgeError, op: &str, args: &[ffi::Arg<'_>]) -> ffi::Outcome {
    let device = args
        .iter()
        .find(|a| a.kind == ffi::ArgKind::Tensor)
        .and_then(|a| storage::find(a.tensor.address as u64))
        .map_or(0, |s| s.device());
    let text = e.to_string();
    let error = if text.starts_with("op `") {
        text
    } else {
        format!("op `{op}` on tpu:{device}: {text}")
    };
    ffi::Outcome {
        failure: failure(&e),
        error,
        ..nothing_done()
    }
}

/// An outcome with nothing in it yet.
fn nothing_done() -> ffi::Outcome {
    ffi::Outcome {
        failure: ffi::Failure::None,
        error: String::new(),
        declined: false,
        download: false,
        bytes: Vec::new(),
        tensors: Vec::new(),
        has_number: false,
        number: 0.0,
        imag: 0.0,
        integer: 0,
        number_type: ffi::Dtype::F64,
    }
}

/// PyTorch's exception class for an error.
pub fn failure(e: &BridgeError) -> ffi::Failure {
    match e {
        _ if e.is_out_of_memory() => ffi::Failure::OutOfMemory,
        BridgeError::Unsupported(_) => ffi::Failure::NotImplemented,
        BridgeError::Index(_) => ffi::Failure::Index,
        BridgeError::Core(core) => match core.op_error_kind() {
            Some(OpErrorKind::OutOfRange) => ffi::Failure::Index,
            Some(OpErrorKind::Unsupported) => ffi::Failure::NotImplemented,
            _ => ffi::Failure::Runtime,
        },
        _ => ffi::Failure::Runtime,
    }
}

/// tpu-rs's dtype for one of torch's.
pub fn dtype(d: ffi::Dtype) -> Result<DType> {
    Ok(match d {
        ffi::Dtype::Bool => DType::Bool,
        ffi::Dtype::I8 => DType::I8,
        ffi::Dtype::I16 => DType::I16,
        ffi::Dtype::I32 => DType::I32,
        ffi::Dtype::I64 => DType::I64,
        ffi::Dtype::U8 => DType::U8,
        ffi::Dtype::U32 => DType::U32,
        ffi::Dtype::F16 => DType::F16,
        ffi::Dtype::Bf16 => DType::BF16,
        ffi::Dtype::F32 => DType::F32,
        ffi::Dtype::F64 => DType::F64,
        ffi::Dtype::C64 => DType::C64,
        ffi::Dtype::C128 => DType::C128,
        _ => return Err(BridgeError::internal("an unknown dtype code")),
    })
}

/// torch's code for a tpu-rs dtype (tpu storages hold only these).
fn code(d: DType) -> ffi::Dtype {
    match d {
        DType::Bool => ffi::Dtype::Bool,
        DType::I8 => ffi::Dtype::I8,
        DType::I16 => ffi::Dtype::I16,
        DType::I32 => ffi::Dtype::I32,
        DType::I64 => ffi::Dtype::I64,
        DType::U8 => ffi::Dtype::U8,
        DType::U32 => ffi::Dtype::U32,
        DType::F16 => ffi::Dtype::F16,
        DType::BF16 => ffi::Dtype::Bf16,
        DType::F64 => ffi::Dtype::F64,
        DType::C64 => ffi::Dtype::C64,
        DType::C128 => ffi::Dtype::C128,
        _ => ffi::Dtype::F32,
    }
}

/// A tensor's view of its storage.
pub fn layout(t: &ffi::TensorRef<'_>) -> Layout {
    Layout {
        size: t.sizes.iter().map(|&n| n as usize).collect(),
        stride: t.strides.iter().map(|&n| n as usize).collect(),
        offset: t.offset as usize,
    }
}

/// The live storage a tpu tensor views.
pub fn storage_of(t: &ffi::TensorRef<'_>) -> Result<Arc<Storage>> {
    storage::find(t.address as u64)
        .ok_or_else(|| BridgeError::internal(format!("no live tpu storage at {:#x}", t.address)))
}

/// A tpu tensor as a [`View`].
pub fn view(t: &ffi::TensorRef<'_>) -> Result<View> {
    Ok(View {
        storage: storage_of(t)?,
        layout: layout(t),
        dtype: dtype(t.dtype)?,
    })
}

/// The value a tpu tensor holds.
pub fn read(t: &ffi::TensorRef<'_>) -> Result<Tensor> {
    storage::read_as(&*storage_of(t)?, &layout(t), dtype(t.dtype)?)
}

/// Whether a value of `from` may be written into a tensor of `to` (PyTorch's
/// `can_cast`: no float into an integer, nothing else into a bool).
pub fn can_cast(from: DType, to: DType) -> bool {
    if from.is_float() && !to.is_float() {
        return false;
    }
    !(from != DType::Bool && to == DType::Bool)
}

/// One call's arguments, by schema position.
pub struct Call<'a> {
    /// The op's overload name.
    pub op: &'static str,
    args: &'a [ffi::Arg<'a>],
    promoted: Option<DType>,
    /// PyTorch's default float dtype.
    pub default_float: DType,
    /// [`Call::device`], once looked up (kernels ask for it per constant).
    device: std::cell::OnceCell<usize>,
}

impl<'a> Call<'a> {
    fn arg(&self, i: usize) -> Result<&ffi::Arg<'a>> {
        self.args
            .get(i)
            .ok_or_else(|| BridgeError::internal(format!("`{}` has no argument {i}", self.op)))
    }

    /// Argument `i`, which must be of `kind` (`what` names it).
    fn arg_of(&self, i: usize, kind: ffi::ArgKind, what: &str) -> Result<&ffi::Arg<'a>> {
        let a = self.arg(i)?;
        if a.kind != kind {
            return Err(self.expected(i, what));
        }
        Ok(a)
    }

    fn expected(&self, i: usize, what: &str) -> BridgeError {
        BridgeError::internal(format!("`{}` argument {i} is not {what}", self.op))
    }

    /// Whether argument `i` is given (not None).
    pub fn has(&self, i: usize) -> bool {
        self.args
            .get(i)
            .is_some_and(|a| a.kind != ffi::ArgKind::Absent)
    }

    /// Whether argument `i` is a tpu tensor.
    pub fn is_tensor(&self, i: usize) -> bool {
        self.args
            .get(i)
            .is_some_and(|a| a.kind == ffi::ArgKind::Tensor)
    }

    /// Tpu tensor argument `i`.
    pub fn tensor_ref(&self, i: usize) -> Result<&ffi::TensorRef<'a>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Tensor => Ok(&a.tensor),
            ffi::ArgKind::HostTensor | ffi::ArgKind::OtherTensor => {
                Err(BridgeError::Device(format!(
                    "Expected all tensors to be on the same device, but found at least two devices, \
                 tpu:{} and cpu!",
                    self.device().unwrap_or(0)
                )))
            }
            _ => Err(self.expected(i, "a tpu tensor")),
        }
    }

    /// The sizes and strides of tensor argument `i` (tpu or CPU).
    pub fn layout_of(&self, i: usize) -> Result<&ffi::TensorRef<'a>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Tensor | ffi::ArgKind::HostTensor => Ok(&a.tensor),
            _ => Err(self.expected(i, "a tensor")),
        }
    }

    /// The value of tpu tensor argument `i`.
    pub fn tensor(&self, i: usize) -> Result<Tensor> {
        read(self.tensor_ref(i)?)
    }

    /// The value of tensor argument `i` when given.
    pub fn tensor_opt(&self, i: usize) -> Result<Option<Tensor>> {
        if !self.has(i) {
            return Ok(None);
        }
        self.tensor(i).map(Some)
    }

    /// Whether argument `i` is a CPU tensor of one or more dims.
    pub fn is_host_tensor(&self, i: usize) -> bool {
        self.args
            .get(i)
            .is_some_and(|a| a.kind == ffi::ArgKind::HostTensor)
    }

    /// CPU tensor argument `i` uploaded to the call's device.
    pub fn upload(&self, i: usize, device: usize) -> Result<Tensor> {
        let a = self.arg_of(i, ffi::ArgKind::HostTensor, "a CPU tensor")?;
        let shape: Vec<usize> = a.tensor.sizes.iter().map(|&n| n as usize).collect();
        let host =
            tpu_core::HostBuffer::from_bytes(a.bytes.to_vec(), dtype(a.tensor.dtype)?, shape)?;
        crate::torch::upload_host(&host, device)
    }

    /// Tpu tensor list argument `i`.
    pub fn tensors(&self, i: usize) -> Result<&'a [ffi::TensorRef<'a>]> {
        Ok(self
            .arg_of(i, ffi::ArgKind::Tensors, "a tensor list")?
            .tensors)
    }

    /// The dtype of argument `i`: a tensor's, or a number's type.
    pub fn dtype(&self, i: usize) -> Result<DType> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Tensor | ffi::ArgKind::HostTensor => dtype(a.tensor.dtype),
            ffi::ArgKind::Number => dtype(a.dtype),
            _ => Err(self.expected(i, "a tensor or a number")),
        }
    }

    /// The sizes of tpu tensor argument `i`.
    pub fn sizes(&self, i: usize) -> Result<Vec<usize>> {
        Ok(self
            .tensor_ref(i)?
            .sizes
            .iter()
            .map(|&n| n as usize)
            .collect())
    }

    /// Number argument `i`.
    pub fn number(&self, i: usize) -> Result<f64> {
        let a = self.arg_of(i, ffi::ArgKind::Number, "a number")?;
        if a.dtype == ffi::Dtype::C64 || a.dtype == ffi::Dtype::C128 {
            return Err(self.expected(i, "a real number"));
        }
        Ok(a.number)
    }

    /// Number argument `i` as its real and imaginary parts.
    pub fn complex_number(&self, i: usize) -> Result<(f64, f64)> {
        let a = self.arg_of(i, ffi::ArgKind::Number, "a number")?;
        Ok((a.number, a.imag))
    }

    /// Integer (or bool) argument `i`.
    pub fn int(&self, i: usize) -> Result<i64> {
        let a = self.arg(i)?;
        if a.kind != ffi::ArgKind::Number || a.dtype == ffi::Dtype::F64 {
            return Err(self.expected(i, "an integer"));
        }
        Ok(a.integer)
    }

    /// Integer argument `i`, or `default` when it is None.
    pub fn int_or(&self, i: usize, default: i64) -> Result<i64> {
        if self.has(i) {
            self.int(i)
        } else {
            Ok(default)
        }
    }

    /// Bool argument `i`, or `default` when it is None.
    pub fn flag_or(&self, i: usize, default: bool) -> Result<bool> {
        Ok(self.int_or(i, i64::from(default))? != 0)
    }

    /// Integer list argument `i` (`None` when it is None).
    pub fn ints(&self, i: usize) -> Result<Option<&'a [i64]>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Absent => Ok(None),
            ffi::ArgKind::Ints => Ok(Some(a.ints)),
            _ => Err(self.expected(i, "an integer list")),
        }
    }

    /// A `Scalar[]` argument's values.
    pub fn numbers(&self, i: usize) -> Result<&'a [f64]> {
        Ok(self
            .arg_of(i, ffi::ArgKind::Numbers, "a number list")?
            .numbers)
    }

    /// A dims argument (one dim, or a list) as a list (`None` when None).
    pub fn dims(&self, i: usize) -> Result<Option<Vec<i64>>> {
        if self.arg(i)?.kind == ffi::ArgKind::Number {
            return Ok(Some(vec![self.int(i)?]));
        }
        Ok(self.ints(i)?.map(<[i64]>::to_vec))
    }

    /// The dtype a ScalarType argument names (`None` when it is None).
    pub fn scalar_type(&self, i: usize) -> Result<Option<DType>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Absent => Ok(None),
            ffi::ArgKind::ScalarType => dtype(a.dtype).map(Some),
            _ => Err(self.expected(i, "a dtype")),
        }
    }

    /// String argument `i` (`None` when it is None).
    pub fn text(&self, i: usize) -> Result<Option<&'a str>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Absent => Ok(None),
            ffi::ArgKind::Text => Ok(Some(a.text)),
            _ => Err(self.expected(i, "a string")),
        }
    }

    /// Device argument `i`: `None` when None, `Some(None)` for another
    /// device type, `Some(Some(index))` for tpu (index -1: the current one).
    pub fn device_arg(&self, i: usize) -> Result<Option<Option<i64>>> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Absent => Ok(None),
            ffi::ArgKind::TpuDevice => Ok(Some(Some(a.integer))),
            ffi::ArgKind::OtherDevice => Ok(Some(None)),
            _ => Err(self.expected(i, "a device")),
        }
    }

    /// PyTorch's result type over the op's `promote` arguments.
    pub fn promoted(&self) -> Result<DType> {
        self.promoted
            .ok_or_else(|| BridgeError::internal(format!("`{}` promotes no arguments", self.op)))
    }

    /// The device of the first tpu tensor argument (lists included).
    pub fn device(&self) -> Result<usize> {
        if let Some(&device) = self.device.get() {
            return Ok(device);
        }
        for a in self.args {
            let t = match a.kind {
                ffi::ArgKind::Tensor => &a.tensor,
                ffi::ArgKind::Tensors if !a.tensors.is_empty() => &a.tensors[0],
                _ => continue,
            };
            let device = storage_of(t)?.device();
            return Ok(*self.device.get_or_init(|| device));
        }
        Err(BridgeError::internal(format!(
            "`{}` has no tpu tensor argument",
            self.op
        )))
    }

    /// Argument `i` in `dtype`: a tensor cast to it, or a number made in it
    /// on the call's device.
    pub fn operand(&self, i: usize, dtype: DType) -> Result<Tensor> {
        let a = self.arg(i)?;
        match a.kind {
            ffi::ArgKind::Tensor | ffi::ArgKind::HostTensor | ffi::ArgKind::OtherTensor => {
                cast(self.tensor(i)?, dtype)
            }
            ffi::ArgKind::Number => number(dtype, a.number, a.imag, self.device()?),
            _ => Err(self.expected(i, "a tensor or a number")),
        }
    }

    /// A number in `dtype` on the call's device.
    pub fn constant(&self, dtype: DType, value: f64) -> Result<Tensor> {
        scalar(dtype, value, self.device()?)
    }

    /// Writes `value` into tpu tensor argument `i`, as an in-place op does:
    /// its dtype must cast to the tensor's and its shape broadcast to it.
    pub fn write(&self, i: usize, value: Tensor) -> Result<Done> {
        let t = self.tensor_ref(i)?;
        let target = dtype(t.dtype)?;
        if !can_cast(value.dtype(), target) {
            return Err(error(format!(
                "result type {} can't be cast to the desired output type {target}",
                value.dtype()
            )));
        }
        let shape = value.shape().dims();
        let fits = shape.len() <= t.sizes.len()
            && shape
                .iter()
                .rev()
                .zip(t.sizes.iter().rev())
                .all(|(&v, &s)| v as i64 == s || v == 1);
        if !fits {
            return Err(error(format!(
                "output with shape {:?} doesn't match the broadcast shape {shape:?}",
                t.sizes
            )));
        }
        store_into(t, value)?;
        Ok(Done::Written)
    }
}

/// Writes `value` through tpu tensor `t` (cast to its dtype, broadcast to
/// its shape), as `copy_` does.
pub fn store_into(t: &ffi::TensorRef<'_>, value: Tensor) -> Result<()> {
    view(t)?.write(value)
}

/// `op(inputs)` with no attributes.
pub fn apply<O: AsOp + ?Sized>(op: &O, inputs: &[Tensor]) -> Result<Tensor> {
    call1(op, inputs, &Attrs::new())
}

/// `op(inputs)` with `attrs`.
pub fn apply_with<O: AsOp + ?Sized>(op: &O, inputs: &[Tensor], attrs: Attrs) -> Result<Tensor> {
    call1(op, inputs, &attrs)
}

/// `x` with the same elements in `shape`.
pub fn reshape(x: Tensor, shape: &[usize]) -> Result<Tensor> {
    apply_with(op!("reshape"), &[x], Attrs::new().with("shape", shape))
}

/// A runtime error with PyTorch's message.
pub fn error(message: impl Into<String>) -> BridgeError {
    BridgeError::Invalid(message.into())
}
