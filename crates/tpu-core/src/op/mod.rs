//! Ops: the record every op submits ([`OpDef`]), the registry that collects
//! them, the tape interface backward rules are written against, and the
//! dispatcher that runs an op on the host reference or on a PJRT device.
//!
//! An op crate submits records with `inventory::submit!`; nothing else needs
//! to change for an op to reach every layer.

mod attrs;
mod dispatch;
mod error;
mod host_tape;
mod registry;
mod sample_gen;
mod tape;

pub use attrs::{Attr, Attrs};
pub use dispatch::{
    MAX_TENSOR_BYTES, check_indices, check_inputs, run_reference, single_op_program,
    single_op_program_over, tensor_bytes,
};
pub use error::{OpError, OpErrorKind, OpResult};
pub use host_tape::HostTape;
pub use registry::{AsOp, OpId, OpName, Registry, registry};
pub use sample_gen::Gen;
pub use tape::{Tape, TapeValues, Var, VjpArgs};

use crate::DType;
use crate::host::{HostTensor, Tolerance};
use crate::stablehlo::{Builder, TensorType, Value};

/// Shape and dtype inference: pure, and the first thing every call runs.
pub type InferFn = fn(&[TensorType], &Attrs) -> OpResult<Vec<TensorType>>;
/// StableHLO lowering of one call, given already-inferred inputs.
pub type LowerFn = fn(&mut Builder, &[Value], &Attrs) -> OpResult<Vec<Value>>;
/// The CPU reference: deliberately simple, computed in f64 / i64.
pub type ReferenceFn = fn(&[HostTensor], &Attrs) -> OpResult<Vec<HostTensor>>;
/// The backward rule, written in terms of other ops.
pub type VjpFn = fn(&mut dyn Tape, &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>>;
/// The inputs of a call that hold indices, with their valid range.
pub type IndicesFn = fn(&[TensorType], &Attrs) -> Vec<IndexBound>;

/// An input holding indices into something of known size. Out of range,
/// the device clamps them (a gather reads the nearest row) or drops them
/// (a scatter writes nothing), as XLA defines; Debug reads them back before
/// the op runs and raises instead, as PyTorch does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexBound {
    /// Which input.
    pub input: usize,
    /// Valid indices are `0..size`.
    pub size: usize,
    /// What they index, for the error: `dimension 1`, `classes`.
    pub what: String,
    /// A value allowed besides the range (a loss's `ignore_index`).
    pub ignore: Option<i64>,
}

impl IndexBound {
    /// Indices in input `input` into `size` entries of `what`.
    pub fn new(input: usize, size: usize, what: impl Into<String>) -> IndexBound {
        IndexBound {
            input,
            size,
            what: what.into(),
            ignore: None,
        }
    }

    /// The first index of `indices` outside the range, if any.
    pub fn first_outside(&self, indices: impl IntoIterator<Item = i64>) -> Option<i64> {
        let size = i64::try_from(self.size).unwrap_or(i64::MAX);
        indices
            .into_iter()
            .find(|&i| !(0..size).contains(&i) && Some(i) != self.ignore)
    }
}

/// How many inputs an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exactly(usize),
    /// At least this many (concat, stack).
    AtLeast(usize),
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (prefix, n) = match *self {
            Arity::Exactly(n) => ("", n),
            Arity::AtLeast(n) => ("at least ", n),
        };
        let noun = if n == 1 { "input" } else { "inputs" };
        write!(f, "{prefix}{n} {noun}")
    }
}

impl Arity {
    /// True when `n` inputs are acceptable.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

/// Properties of an op that policies and tests rely on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u32);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// Output element `i` depends only on input elements `i` (after broadcasting).
    pub const ELEMENTWISE: Flags = Flags(1);
    /// Reduces over dimensions.
    pub const REDUCTION: Flags = Flags(1 << 1);
    /// Only moves or reinterprets data (reshape, transpose, slice).
    pub const VIEW: Flags = Flags(1 << 2);
    /// Needs its inputs on the host (its output shape depends on values).
    pub const HOST_SYNC: Flags = Flags(1 << 3);
    /// Draws random numbers from an explicit key.
    pub const RANDOM: Flags = Flags(1 << 4);
    /// Must not be fused into a larger graph.
    pub const NOT_FUSIBLE: Flags = Flags(1 << 5);
    /// Has float inputs and outputs but no gradient (argmax-like).
    pub const NOT_DIFFERENTIABLE: Flags = Flags(1 << 6);

    /// Both sets of flags.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// True when every flag of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// One set of inputs and attributes for an op, for tests and docs.
#[cfg(feature = "conformance")]
#[derive(Clone, Debug)]
pub struct Sample {
    /// The inputs.
    pub inputs: Vec<HostTensor>,
    /// The attributes.
    pub attrs: Attrs,
}

#[cfg(feature = "conformance")]
impl Sample {
    /// A sample from its parts.
    pub fn new(inputs: Vec<HostTensor>, attrs: Attrs) -> Sample {
        Sample { inputs, attrs }
    }
}

/// The op's PyTorch counterpart, which the parity test runs on PyTorch CPU
/// and compares with the op's reference and backward rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Torch {
    /// A Python expression computing the op's outputs (a tuple when there
    /// are several) from `x`, the list of input tensors, and `a`, the dict
    /// of attributes given in the call; `torch` and `F`
    /// (`torch.nn.functional`) are in scope.
    Expr(&'static str),
    /// No PyTorch function computes the same thing, and why.
    Unmatched(&'static str),
}

/// Everything every layer needs to know about one op.
pub struct OpDef {
    /// Stable name, e.g. `"add"`.
    pub name: &'static str,
    /// Number of inputs.
    pub arity: Arity,
    /// Properties.
    pub flags: Flags,
    /// Dtypes the op accepts (for its main input), for tests and docs. A
    /// complex input or output is refused unless its dtype is listed here,
    /// so an op opts into complex numbers explicitly.
    pub dtypes: &'static [DType],
    /// Shape and dtype inference.
    pub infer: InferFn,
    /// StableHLO lowering.
    pub lower: LowerFn,
    /// CPU reference.
    pub reference: ReferenceFn,
    /// Backward rule; `None` for ops without a gradient.
    pub vjp: Option<VjpFn>,
    /// Inputs holding indices, which Debug checks (none by default).
    pub indices: IndicesFn,
    /// How close the device result must be to the reference, per dtype.
    pub tolerance: fn(DType) -> Tolerance,
    /// Hand-picked inputs, awkward sizes included.
    #[cfg(feature = "conformance")]
    pub samples: fn() -> Vec<Sample>,
    /// A random valid call, for property tests.
    #[cfg(feature = "conformance")]
    pub arbitrary: fn(&mut Gen) -> Sample,
    /// The PyTorch function it matches, for the parity test.
    pub torch: Torch,
    /// Where the record is defined (`file:line`), for duplicate errors.
    pub location: &'static str,
}

inventory::collect!(OpDef);

impl OpDef {
    /// What a record written with [`op_def!`](crate::op_def) leaves out: no
    /// flags, every real dtype, no gradient, the dtype's default tolerance. The
    /// name, arity, inference, lowering and reference are always given; the
    /// placeholders here only say that one was not.
    pub const DEFAULT: OpDef = OpDef {
        name: "",
        arity: Arity::Exactly(0),
        flags: Flags::NONE,
        dtypes: &DType::REAL,
        infer: |_, _| Err(OpError::unsupported("the op record gives no inference")),
        lower: |_, _, _| Err(OpError::unsupported("the op record gives no lowering")),
        reference: |_, _| Err(OpError::unsupported("the op record gives no reference")),
        vjp: None,
        indices: |_, _| Vec::new(),
        tolerance: Tolerance::for_dtype,
        #[cfg(feature = "conformance")]
        samples: Vec::new,
        #[cfg(feature = "conformance")]
        arbitrary: |_| Sample::new(vec![], Attrs::new()),
        torch: Torch::Unmatched("the op record names no PyTorch counterpart"),
        location: "",
    };
}

/// An [`OpDef`] that states only what differs from [`OpDef::DEFAULT`], with
/// its `file:line` filled in:
///
/// ```ignore
/// inventory::submit! {
///     op_def! {
///         name: "neg",
///         arity: Arity::Exactly(1),
///         flags: Flags::ELEMENTWISE,
///         infer: |x, _| Ok(vec![x[0].clone()]),
///         lower: |b, x, _| Ok(vec![b.unary("stablehlo.negate", &x[0])]),
///         reference: neg_reference,
///         vjp: Some(|t, a| Ok(vec![Some(t.neg(a.grads[0])?)])),
///         torch: Torch::Expr("torch.neg(x[0])"),
///     }
/// }
/// ```
#[macro_export]
macro_rules! op_def {
    (@fields [$($done:tt)*]) => {{
        // A record may state every field; the update is then a no-op.
        #[allow(clippy::needless_update)]
        let def = $crate::op::OpDef {
            $($done)*
            location: concat!(file!(), ":", line!()),
            ..$crate::op::OpDef::DEFAULT
        };
        def
    }};
    // Sample generators exist only in builds with the `conformance`
    // feature (of the crate that defines the record).
    (@fields [$($done:tt)*] samples : $value:expr $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* #[cfg(feature = "conformance")] samples: $value,] $($($rest)*)?)
    };
    (@fields [$($done:tt)*] arbitrary : $value:expr $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* #[cfg(feature = "conformance")] arbitrary: $value,] $($($rest)*)?)
    };
    (@fields [$($done:tt)*] samples $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* #[cfg(feature = "conformance")] samples: samples,] $($($rest)*)?)
    };
    (@fields [$($done:tt)*] arbitrary $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* #[cfg(feature = "conformance")] arbitrary: arbitrary,] $($($rest)*)?)
    };
    (@fields [$($done:tt)*] $field:ident : $value:expr $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* $field: $value,] $($($rest)*)?)
    };
    (@fields [$($done:tt)*] $field:ident $(, $($rest:tt)*)?) => {
        $crate::op_def!(@fields [$($done)* $field,] $($($rest)*)?)
    };
    ($($fields:tt)+) => {
        $crate::op_def!(@fields [] $($fields)+)
    };
}

impl std::fmt::Debug for OpDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpDef")
            .field("name", &self.name)
            .field("arity", &self.arity)
            .field("location", &self.location)
            .finish()
    }
}
