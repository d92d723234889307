//! Building blocks shared by the reductions (and the nn family): lowering
//! pieces, reference grouping, tape helpers and sample generators.

use ndarray::{ArrayD, Axis, IxDyn};
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Attrs, OpResult, Tape, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::out_of_range;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value, int_range};
use tpu_core::{DType, Shape};

use crate::support::*;

#[cfg(feature = "conformance")]
pub(crate) use super::sum::reduce_sample;
pub(crate) use super::sum::{accumulator, reduce_args};

/// The first input type of an op.
pub(crate) fn first(inputs: &[TensorType]) -> OpResult<&TensorType> {
    inputs.first().ok_or_else(|| "missing input".into())
}

/// The dims of a rank-`rank` tensor that a reduction over `dims` keeps.
pub(crate) fn kept_dims(rank: usize, dims: &[usize]) -> Vec<usize> {
    (0..rank).filter(|d| !dims.contains(d)).collect()
}

/// Number of elements a reduction over `dims` combines.
pub(crate) fn count(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product()
}

/// An error when a reduced dimension is empty (max, min, argmax have no
/// identity there).
pub(crate) fn require_nonempty(shape: &Shape, dims: &[usize], what: &str) -> OpResult<()> {
    match dims.iter().find(|&&d| shape.dims()[d] == 0) {
        Some(d) => Err(out_of_range!(
            "{what} of an empty set: dimension {d} of {shape} has size 0"
        )),
        None => Ok(()),
    }
}

// ---- Lowering. ----

/// Broadcasts `v` (the result of reducing `dims` without keepdim) back to
/// `full`.
pub(crate) fn expand(b: &mut Builder, v: &Value, full: &[usize], dims: &[usize]) -> Value {
    let keep = kept_dims(full.len(), dims);
    b.broadcast_in_dim(v, full, &keep)
}

/// Sum over `dims` in `x`'s dtype.
pub(crate) fn sum_in(b: &mut Builder, x: &Value, dims: &[usize]) -> Value {
    b.reduce(x, 0.0, dims, "stablehlo.add")
}

/// The smallest value of `dtype` (-inf for floats).
pub(crate) fn lowest(dtype: DType) -> f64 {
    if dtype.is_float() {
        f64::NEG_INFINITY
    } else {
        int_range(dtype).0 as f64
    }
}

/// The largest value of `dtype` (+inf for floats).
pub(crate) fn highest(dtype: DType) -> f64 {
    if dtype.is_float() {
        f64::INFINITY
    } else {
        int_range(dtype).1 as f64
    }
}

/// Maximum over `dims` (logical or for bool); NaN where a group holds one.
pub(crate) fn max_in(b: &mut Builder, x: &Value, dims: &[usize]) -> Value {
    if x.dtype() == DType::Bool {
        return b.reduce(x, 0.0, dims, "stablehlo.or");
    }
    let r = b.reduce(x, lowest(x.dtype()), dims, "stablehlo.maximum");
    with_nan(b, x, r, |b, nan| b.reduce(nan, 0.0, dims, "stablehlo.or"))
}

/// Minimum over `dims` (logical and for bool); NaN where a group holds one.
pub(crate) fn min_in(b: &mut Builder, x: &Value, dims: &[usize]) -> Value {
    if x.dtype() == DType::Bool {
        return b.reduce(x, 1.0, dims, "stablehlo.and");
    }
    let r = b.reduce(x, highest(x.dtype()), dims, "stablehlo.minimum");
    with_nan(b, x, r, |b, nan| b.reduce(nan, 0.0, dims, "stablehlo.or"))
}

/// `r`, a maximum or minimum of `x` over groups, with NaN where `any`
/// (reducing `x`'s NaN mask the same way) finds one: XLA's CPU reductions
/// skip NaN where PyTorch propagates it.
pub(crate) fn with_nan(
    b: &mut Builder,
    x: &Value,
    r: Value,
    any: impl FnOnce(&mut Builder, &Value) -> Value,
) -> Value {
    if !x.dtype().is_float() {
        return r;
    }
    let nan = b.compare(Compare::Ne, x, x);
    let hit = any(b, &nan);
    let quiet = b.constant(r.dtype(), r.shape().clone(), f64::NAN);
    b.select(&hit, &quiet, &r)
}

/// A splat of `value` shaped like `like`.
pub(crate) fn splat(b: &mut Builder, like: &Value, value: f64) -> Value {
    b.constant(like.dtype(), like.dims(), value)
}

/// `a op b` for two values of one type.
pub(crate) fn bin(b: &mut Builder, op: &str, x: &Value, y: &Value) -> Value {
    b.binary(&format!("stablehlo.{op}"), x, y)
}

/// `x * value`.
pub(crate) fn scale_by(b: &mut Builder, x: &Value, value: f64) -> Value {
    let c = splat(b, x, value);
    bin(b, "multiply", x, &c)
}

/// `x - mean(x)` over `dims` (in `x`'s dtype, an accumulator), and that
/// mean reduced. Centred twice (the corrected two-pass method): the mean of
/// the first deviations, which holds the rounding error of the first mean,
/// is taken off as well, so a large mean with a small spread (1e4 and 1e-2
/// in f32) keeps its deviations and variance accurate.
pub(crate) fn centre(b: &mut Builder, x: &Value, dims: &[usize]) -> (Value, Value) {
    let inv_n = 1.0 / count(x.dims(), dims) as f64;
    let s = sum_in(b, x, dims);
    let first = scale_by(b, &s, inv_n);
    let fb = expand(b, &first, x.dims(), dims);
    let d = bin(b, "subtract", x, &fb);
    let sd = sum_in(b, &d, dims);
    let residual = scale_by(b, &sd, inv_n);
    let rb = expand(b, &residual, x.dims(), dims);
    let mean = bin(b, "add", &first, &residual);
    (bin(b, "subtract", &d, &rb), mean)
}

/// Numerically stable softmax pieces along `dims` of float `x`: returns
/// `(x - max, log(sum(exp(x - max))))`, the second reduced (no keepdim).
pub(crate) fn shifted_logsum(b: &mut Builder, x: &Value, dims: &[usize]) -> (Value, Value) {
    let m = max_in(b, x, dims);
    let mb = expand(b, &m, x.dims(), dims);
    let z = bin(b, "subtract", x, &mb);
    let e = b.unary("stablehlo.exponential", &z);
    let s = sum_in(b, &e, dims);
    let ls = b.unary("stablehlo.log", &s);
    (z, ls)
}

/// `log_softmax` of float `x` along `dims`.
pub(crate) fn log_softmax_in(b: &mut Builder, x: &Value, dims: &[usize]) -> Value {
    let (z, ls) = shifted_logsum(b, x, dims);
    let lb = expand(b, &ls, x.dims(), dims);
    bin(b, "subtract", &z, &lb)
}

/// `softmax` of float `x` along `dims`.
pub(crate) fn softmax_in(b: &mut Builder, x: &Value, dims: &[usize]) -> Value {
    let m = max_in(b, x, dims);
    let mb = expand(b, &m, x.dims(), dims);
    let z = bin(b, "subtract", x, &mb);
    let e = b.unary("stablehlo.exponential", &z);
    let s = sum_in(b, &e, dims);
    let sb = expand(b, &s, x.dims(), dims);
    bin(b, "divide", &e, &sb)
}

/// Boolean `x != 0`.
pub(crate) fn nonzero(b: &mut Builder, x: &Value) -> Value {
    if x.dtype() == DType::Bool {
        return x.clone();
    }
    let zero = splat(b, x, 0.0);
    b.compare(Compare::Ne, x, &zero)
}

// ---- References. ----

/// The values of `a` grouped by the reduction over `dims`: one group per
/// position of the kept dims (row-major), each holding the reduced values in
/// row-major order. Also returns the kept dims' sizes.
pub(crate) fn groups<T: Clone>(a: &ArrayD<T>, dims: &[usize]) -> (Vec<usize>, Vec<Vec<T>>) {
    let rank = a.ndim();
    let keep = kept_dims(rank, dims);
    let mut order = keep.clone();
    order.extend_from_slice(dims);
    let kept_shape: Vec<usize> = keep.iter().map(|&d| a.shape()[d]).collect();
    let outer: usize = kept_shape.iter().product();
    let inner = count(a.shape(), dims);
    if inner == 0 {
        return (kept_shape, vec![Vec::new(); outer]);
    }
    let permuted = a.view().permuted_axes(IxDyn(&order));
    let flat: Vec<T> = permuted.iter().cloned().collect();
    let chunks = flat.chunks(inner).map(<[T]>::to_vec).collect();
    (kept_shape, chunks)
}

/// A float tensor of the reduced shape from one value per group.
pub(crate) fn float_result(
    dtype: DType,
    kept_shape: &[usize],
    values: Vec<f64>,
    out: &Shape,
) -> OpResult<HostTensor> {
    reshape_to(&tensor_f64(dtype, kept_shape, values)?, out)
}

/// The reference of a float reduction: `f` of each group of reduced
/// values (in f64), as a `dtype` tensor of the reduced shape.
pub(crate) fn reduce_f64(
    x: &HostTensor,
    attrs: &Attrs,
    dtype: DType,
    f: impl Fn(&[f64]) -> f64,
) -> OpResult<HostTensor> {
    let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
    let (kept, gs) = groups(&x.to_f64(), &dims);
    let values = gs.iter().map(|g| f(g)).collect();
    float_result(
        dtype,
        &kept,
        values,
        &reduced_shape(&x.shape(), &dims, keepdim),
    )
}

/// An integer tensor of the reduced shape from one value per group.
pub(crate) fn int_result(
    dtype: DType,
    kept_shape: &[usize],
    values: Vec<i64>,
    out: &Shape,
) -> OpResult<HostTensor> {
    let n = values.len();
    let t = HostTensor::from_i64(dtype, kept_shape.to_vec(), values)
        .ok_or_else(|| invalid!("{n} values do not fill {kept_shape:?}"))?;
    reshape_to(&t, out)
}

/// Maps every lane of `a` along `dim` through `f` (same length out); a
/// rank-0 array is one lane of one value.
pub(crate) fn along<T: Clone>(a: &ArrayD<T>, dim: usize, f: impl Fn(&[T]) -> Vec<T>) -> ArrayD<T> {
    if a.ndim() == 0 {
        let v: Vec<T> = a.iter().cloned().collect();
        let r = f(&v);
        let mut out = a.clone();
        for (o, x) in out.iter_mut().zip(r) {
            *o = x;
        }
        return out;
    }
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(dim)) {
        let v: Vec<T> = lane.iter().cloned().collect();
        for (o, x) in lane.iter_mut().zip(f(&v)) {
            *o = x;
        }
    }
    out
}

/// Maximum that propagates NaN.
pub(crate) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Minimum that propagates NaN.
pub(crate) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// `log(sum(exp(v)))`, shifted by the maximum (0 when it is infinite, as
/// PyTorch does); -inf for no values.
pub(crate) fn logsumexp_of(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, nan_max);
    let m = if m.is_infinite() { 0.0 } else { m };
    v.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m
}

/// Softmax of one lane, shifted by its maximum.
pub(crate) fn softmax_of(v: &[f64]) -> Vec<f64> {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, nan_max);
    let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Log-softmax of one lane, shifted by its maximum.
pub(crate) fn log_softmax_of(v: &[f64]) -> Vec<f64> {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, nan_max);
    let ls = v.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    v.iter().map(|x| x - m - ls).collect()
}

// ---- Tape helpers for backward rules. ----

/// Attributes `dims` + `keepdim` of a reduction call.
pub(crate) fn dims_attrs(dims: &[usize], keepdim: bool) -> Attrs {
    Attrs::new().with("dims", dims).with("keepdim", keepdim)
}

/// `g`, the gradient of a reduction over `dims` (with or without keepdim),
/// broadcast back to `shape`.
pub(crate) fn unreduce(t: &mut dyn Tape, g: Var, shape: &Shape, dims: &[usize]) -> OpResult<Var> {
    let kept = reduced_shape(shape, dims, true);
    let g = t.reshape(g, &kept)?;
    t.broadcast_to(g, shape)
}

/// What the backward rule of a reduction of a float input starts from:
/// the input, its type, the reduced dims, and the output and its gradient
/// broadcast back to the input's shape.
pub(crate) struct Unreduced {
    pub x: Var,
    pub ty: TensorType,
    pub dims: Vec<usize>,
    pub y: Var,
    pub g: Var,
}

/// [`Unreduced`] of a reduction's call, or `None` for a non-float input
/// (which has no gradient).
pub(crate) fn unreduced(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Option<Unreduced>> {
    let x = a.inputs[0];
    let ty = t.ty(x)?;
    if !ty.dtype.is_float() {
        return Ok(None);
    }
    let (dims, _) = reduce_args(&ty.shape, a.attrs)?;
    let y = unreduce(t, a.outputs[0], &ty.shape, &dims)?;
    let g = unreduce(t, a.grads[0], &ty.shape, &dims)?;
    Ok(Some(Unreduced { x, ty, dims, y, g }))
}

/// Calls a reduction op `op` over `dims`.
pub(crate) fn reduce_call(
    t: &mut dyn Tape,
    op: &str,
    x: Var,
    dims: &[usize],
    keepdim: bool,
) -> OpResult<Var> {
    t.call1(op, &[x], dims_attrs(dims, keepdim))
}

/// Calls a binary elementwise op.
pub(crate) fn call2(t: &mut dyn Tape, op: &str, a: Var, b: Var) -> OpResult<Var> {
    t.call1(op, &[a, b], Attrs::new())
}

/// `where(cond, a, b)`.
pub(crate) fn select(t: &mut dyn Tape, cond: Var, a: Var, b: Var) -> OpResult<Var> {
    t.call1("where", &[cond, a, b], Attrs::new())
}

// ---- Samples. ----

/// A reduction sample whose reduced dims are all non-empty.
#[cfg(feature = "conformance")]
pub(crate) fn reduce_sample_nonempty(g: &mut Gen, dtypes: &[DType]) -> Sample {
    let mut s = reduce_sample(g, dtypes);
    let x = &s.inputs[0];
    let ok = reduce_args(&x.shape(), &s.attrs)
        .map(|(dims, _)| dims.iter().all(|&d| x.dims()[d] > 0))
        .unwrap_or(false);
    if !ok {
        let shape = Shape::new(x.dims().iter().map(|&d| d.max(1)).collect::<Vec<_>>());
        s.inputs[0] = g.tensor(x.dtype(), &shape);
    }
    s
}

/// A sample of a one-dim op (`dim` attribute), rank 0 to 4.
#[cfg(feature = "conformance")]
pub(crate) fn dim_sample(g: &mut Gen, dtypes: &[DType], lo: f64, hi: f64) -> Sample {
    let dtype = g.pick(dtypes);
    let shape = g.shape(0, 4);
    let x = g.tensor_in(dtype, &shape, lo, hi);
    let rank = shape.rank().max(1) as i64;
    let d = g.below(rank as usize) as i64;
    let d = if g.bool() { d - rank } else { d };
    Sample::new(vec![x], Attrs::new().with("dim", d))
}
