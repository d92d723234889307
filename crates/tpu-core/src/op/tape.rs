//! The interface backward rules are written against: a tape that can call
//! any registered op on symbolic values. The same rule then runs on the host
//! reference (for finite-difference checks), under autograd on any device,
//! and inside fused graphs.

use crate::invalid;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Attrs, OpError, OpResult};
use crate::stablehlo::TensorType;
use crate::{DType, Shape};

/// A value on a [`Tape`]: which tape made it, and where on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Var {
    tape: u64,
    index: usize,
}

impl Var {
    /// Its position on its tape, counting from 0 in the order values were
    /// put on it.
    pub fn index(self) -> usize {
        self.index
    }
}

/// The values of one tape. Each store has its own identity, so a [`Var`]
/// from another tape is an error rather than another tape's value.
#[derive(Debug)]
pub struct TapeValues<T> {
    id: u64,
    values: Vec<T>,
}

impl<T> Default for TapeValues<T> {
    fn default() -> TapeValues<T> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        TapeValues {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            values: Vec::new(),
        }
    }
}

impl<T> TapeValues<T> {
    /// Stores `value`, returning the [`Var`] that names it.
    pub fn push(&mut self, value: T) -> Var {
        self.values.push(value);
        Var {
            tape: self.id,
            index: self.values.len() - 1,
        }
    }

    /// The value `v` names, or an error if `v` is from another tape.
    pub fn get(&self, v: Var) -> OpResult<&T> {
        self.values
            .get(v.index)
            .filter(|_| v.tape == self.id)
            .ok_or_else(|| {
                OpError::invalid(format!(
                    "value #{} is not on this tape (it is from another one)",
                    v.index
                ))
            })
    }

    /// How many values are stored.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The values, in the order they were stored.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.values.iter()
    }
}

/// Something that records or evaluates op calls.
pub trait Tape {
    /// Calls op `op` on `inputs`.
    fn call(&mut self, op: &str, inputs: &[Var], attrs: Attrs) -> OpResult<Vec<Var>>;
    /// The type of `v`, or an error if `v` is not on this tape.
    fn ty(&self, v: Var) -> OpResult<TensorType>;
}

/// What a backward rule sees of the forward call.
pub struct VjpArgs<'a> {
    /// The forward inputs.
    pub inputs: &'a [Var],
    /// The forward outputs.
    pub outputs: &'a [Var],
    /// The gradient of each output (zeros where the output is unused).
    pub grads: &'a [Var],
    /// The forward attributes.
    pub attrs: &'a Attrs,
}

impl dyn Tape + '_ {
    /// Calls a single-output op.
    pub fn call1(&mut self, op: &str, inputs: &[Var], attrs: Attrs) -> OpResult<Var> {
        let mut outs = self.call(op, inputs, attrs)?;
        match outs.len() {
            1 => Ok(outs.remove(0)),
            n => Err(invalid!(
                "op `{op}` returned {n} outputs where one was expected"
            )),
        }
    }

    /// A tensor shaped like `like`, filled with `value`.
    pub fn full_like(&mut self, like: Var, value: f64) -> OpResult<Var> {
        let ty = self.ty(like)?;
        self.full(ty.dtype, &ty.shape, value)
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(&mut self, dtype: DType, shape: &Shape, value: f64) -> OpResult<Var> {
        let attrs = Attrs::new()
            .with("shape", shape.dims())
            .with("dtype", dtype)
            .with("value", value);
        self.call1("full", &[], attrs)
    }

    /// `a + b`.
    pub fn add(&mut self, a: Var, b: Var) -> OpResult<Var> {
        self.call1("add", &[a, b], Attrs::new())
    }

    /// `a - b`.
    pub fn sub(&mut self, a: Var, b: Var) -> OpResult<Var> {
        self.call1("sub", &[a, b], Attrs::new())
    }

    /// `a * b`.
    pub fn mul(&mut self, a: Var, b: Var) -> OpResult<Var> {
        self.call1("mul", &[a, b], Attrs::new())
    }

    /// `a / b`.
    pub fn div(&mut self, a: Var, b: Var) -> OpResult<Var> {
        self.call1("div", &[a, b], Attrs::new())
    }

    /// `-a`.
    pub fn neg(&mut self, a: Var) -> OpResult<Var> {
        self.call1("neg", &[a], Attrs::new())
    }

    /// `a * value`.
    pub fn scale(&mut self, a: Var, value: f64) -> OpResult<Var> {
        let c = self.full_like(a, value)?;
        self.mul(a, c)
    }

    /// Unary op `op` of `a`.
    pub fn unary(&mut self, op: &str, a: Var) -> OpResult<Var> {
        self.call1(op, &[a], Attrs::new())
    }

    /// `a` cast to `dtype`.
    pub fn cast(&mut self, a: Var, dtype: DType) -> OpResult<Var> {
        if self.ty(a)?.dtype == dtype {
            return Ok(a);
        }
        self.call1("cast", &[a], Attrs::new().with("dtype", dtype))
    }

    /// The complex conjugate of `a` (`a` itself when real): gradients of
    /// complex products carry the other factor's conjugate.
    pub fn conj(&mut self, a: Var) -> OpResult<Var> {
        if !self.ty(a)?.dtype.is_complex() {
            return Ok(a);
        }
        self.call1("conj", &[a], Attrs::new())
    }

    /// `a` reshaped to `shape`.
    pub fn reshape(&mut self, a: Var, shape: &Shape) -> OpResult<Var> {
        if self.ty(a)?.shape == *shape {
            return Ok(a);
        }
        self.call1("reshape", &[a], Attrs::new().with("shape", shape.dims()))
    }

    /// `a` broadcast to `shape` (NumPy rules).
    pub fn broadcast_to(&mut self, a: Var, shape: &Shape) -> OpResult<Var> {
        if self.ty(a)?.shape == *shape {
            return Ok(a);
        }
        self.call1(
            "broadcast_to",
            &[a],
            Attrs::new().with("shape", shape.dims()),
        )
    }

    /// Sum of `a` over `dims`, keeping them as size 1 when `keepdim`.
    pub fn sum(&mut self, a: Var, dims: &[usize], keepdim: bool) -> OpResult<Var> {
        let attrs = Attrs::new().with("dims", dims).with("keepdim", keepdim);
        self.call1("sum", &[a], attrs)
    }

    /// Undoes NumPy broadcasting: sums `grad` down to `shape`, the shape of
    /// the input that was broadcast.
    pub fn sum_to(&mut self, grad: Var, shape: &Shape) -> OpResult<Var> {
        let gshape = self.ty(grad)?.shape;
        if gshape == *shape {
            return Ok(grad);
        }
        let lead = gshape.rank().saturating_sub(shape.rank());
        let dims: Vec<usize> = (0..gshape.rank())
            .filter(|&d| d < lead || (shape.dims()[d - lead] == 1 && gshape.dims()[d] != 1))
            .collect();
        let summed = if dims.is_empty() {
            grad
        } else {
            self.sum(grad, &dims, true)?
        };
        self.reshape(summed, shape)
    }
}
