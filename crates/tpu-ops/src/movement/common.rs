//! Helpers shared by the movement ops: index dtypes and out-of-range
//! policy, element remapping for references, gather/scatter lowerings, and
//! tape shortcuts for backward rules.

use ndarray::{ArrayD, Dimension, IxDyn};
use tpu_core::host::{HostData, HostTensor};
use tpu_core::invalid;
#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::{Attrs, IndexBound, OpResult, Tape, Var};
use tpu_core::stablehlo::{Builder, TensorType, Value, dim_list, i64_array, int_range};
use tpu_core::{Complex, DType, Shape};

/// Dtypes accepted for index inputs.
pub(crate) const INDEX_DTYPES: &[DType] = &[DType::I64, DType::I32];

/// An error unless `d` is an index dtype.
pub(crate) fn require_index(d: DType, what: &str) -> OpResult<()> {
    if INDEX_DTYPES.contains(&d) {
        Ok(())
    } else {
        Err(invalid!("{what} must be int64 or int32, got {d}"))
    }
}

/// The `dim` attribute (default `default`), normalised against `rank`
/// (rank 0 accepts 0 and -1).
pub(crate) fn dim_attr(
    attrs: &Attrs,
    key: &str,
    default: Option<i64>,
    rank: usize,
) -> OpResult<usize> {
    let d = match default {
        Some(v) => attrs.int_or(key, v)?,
        None => attrs.int(key)?,
    };
    crate::support::normalize_dim_scalar_ok(d, rank)
}

/// A shape with rank 0 lifted to `[1]` (PyTorch's "ensure non-empty dims").
pub(crate) fn lift(shape: &Shape) -> Shape {
    if shape.rank() == 0 {
        Shape::new(vec![1])
    } else {
        shape.clone()
    }
}

// ---- Out-of-range policy for data-dependent indices. ----
//
// Index values cannot be checked by inference, and the conformance suite
// requires the reference to succeed whenever inference accepts. So the
// references follow what the lowerings do on device (XLA semantics): a
// gathered index is clamped into range, a scattered update whose index is out
// of range is dropped. Samples only ever use in-range indices.

/// Where a gathered index `i` reads from along a dimension of `size >= 1`.
pub(crate) fn gather_index(i: i64, size: usize) -> usize {
    i.clamp(0, size.saturating_sub(1) as i64) as usize
}

/// Where a scattered index `i` writes along a dimension of `size`, or
/// `None` when the update is dropped.
pub(crate) fn scatter_index(i: i64, size: usize) -> Option<usize> {
    (0..size as i64).contains(&i).then_some(i as usize)
}

// ---- References. ----

/// An array of shape `out` whose element at each index is `a[src]`, where
/// `src(index, &mut src)` fills the source index and returns true, or
/// `fill` where it returns false (or the source is out of bounds).
pub(crate) fn remap<T: Copy>(
    a: &ArrayD<T>,
    out: &[usize],
    fill: T,
    src: &dyn Fn(&[usize], &mut Vec<usize>) -> bool,
) -> ArrayD<T> {
    let mut buf = vec![0usize; a.ndim()];
    ArrayD::from_shape_fn(IxDyn(out), |ix| {
        buf.resize(a.ndim(), 0);
        if src(ix.slice(), &mut buf) {
            a.get(IxDyn(&buf)).copied().unwrap_or(fill)
        } else {
            fill
        }
    })
}

/// The integer a float `value` becomes in `dtype` as a StableHLO constant
/// (truncated and saturated).
pub(crate) fn int_fill(dtype: DType, value: f64) -> i64 {
    if dtype == DType::Bool {
        return i64::from(value != 0.0);
    }
    let (lo, hi) = int_range(dtype);
    if value.is_nan() {
        0
    } else {
        (value as i64).clamp(lo, hi)
    }
}

/// [`remap`] on a tensor of any dtype, keeping its dtype.
pub(crate) fn remap_tensor(
    x: &HostTensor,
    out: &[usize],
    fill: f64,
    src: &dyn Fn(&[usize], &mut Vec<usize>) -> bool,
) -> HostTensor {
    match x.data() {
        HostData::Float(a) => HostTensor::float(x.dtype(), remap(a, out, fill, src)),
        HostData::Int(a) => {
            HostTensor::int(x.dtype(), remap(a, out, int_fill(x.dtype(), fill), src))
        }
        HostData::Complex(a) => {
            HostTensor::complex(x.dtype(), remap(a, out, Complex::new(fill, 0.0), src))
        }
    }
}

/// `x` with its shape replaced (same element count).
pub(crate) fn with_shape(x: &HostTensor, shape: &[usize]) -> OpResult<HostTensor> {
    crate::support::reshape_to(x, &Shape::new(shape.to_vec()))
}

/// The values of an index tensor.
pub(crate) fn index_values(idx: &HostTensor) -> ArrayD<i64> {
    idx.to_i64()
}

/// How scattered values combine with what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    /// The update replaces the value.
    Replace,
    /// The update is added (bool: or).
    Add,
    /// The value is multiplied by the update (bool: and).
    Mul,
    /// The larger of the two stays (NaN wins; bool: or).
    Max,
    /// The smaller of the two stays (NaN wins; bool: and).
    Min,
}

impl Combine {
    /// `scatter_reduce`'s `reduce` keyword.
    pub(crate) fn from_reduce(reduce: &str) -> OpResult<Combine> {
        match reduce {
            "sum" => Ok(Combine::Add),
            "prod" => Ok(Combine::Mul),
            "amax" => Ok(Combine::Max),
            "amin" => Ok(Combine::Min),
            other => Err(invalid!(
                "reduce must be \"sum\", \"prod\", \"amax\" or \"amin\", got {other:?}"
            )),
        }
    }

    fn floats(self, a: f64, b: f64) -> f64 {
        match self {
            Combine::Replace => b,
            Combine::Add => a + b,
            Combine::Mul => a * b,
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            Combine::Max => a.max(b),
            Combine::Min => a.min(b),
        }
    }

    fn ints(self, a: i64, b: i64) -> i64 {
        match self {
            Combine::Replace => b,
            Combine::Add => a.wrapping_add(b),
            Combine::Mul => a.wrapping_mul(b),
            Combine::Max => a.max(b),
            Combine::Min => a.min(b),
        }
    }
}

/// Scatters `updates` into a copy of `x`: for each position `p` of the
/// updates, `dest(p, &mut d)` fills the destination index of `x` and returns
/// false to drop the update.
pub(crate) fn scatter_tensor(
    x: &HostTensor,
    updates: &HostTensor,
    combine: Combine,
    dest: &dyn Fn(&[usize], &mut Vec<usize>) -> bool,
) -> OpResult<HostTensor> {
    fn run<T: Copy>(
        mut out: ArrayD<T>,
        upd: &ArrayD<T>,
        dest: &dyn Fn(&[usize], &mut Vec<usize>) -> bool,
        combine: impl Fn(T, T) -> T,
    ) -> ArrayD<T> {
        let mut buf = vec![0usize; out.ndim()];
        for (ix, &u) in upd.indexed_iter() {
            buf.resize(out.ndim(), 0);
            if !dest(ix.slice(), &mut buf) {
                continue;
            }
            if let Some(slot) = out.get_mut(IxDyn(&buf)) {
                *slot = combine(*slot, u);
            }
        }
        out
    }
    let dtype = x.dtype();
    let updates = updates.cast(dtype);
    Ok(match (x.data(), updates.data()) {
        (HostData::Float(a), HostData::Float(u)) => {
            HostTensor::float(dtype, run(a.clone(), u, dest, |p, q| combine.floats(p, q)))
        }
        (HostData::Int(a), HostData::Int(u)) => {
            HostTensor::int(dtype, run(a.clone(), u, dest, |p, q| combine.ints(p, q)))
        }
        // Replacing and adding are what complex tensors scatter by.
        (HostData::Complex(a), HostData::Complex(u)) => match combine {
            Combine::Replace => HostTensor::complex(dtype, run(a.clone(), u, dest, |_, q| q)),
            Combine::Add => HostTensor::complex(dtype, run(a.clone(), u, dest, |p, q| p + q)),
            _ => return Err(crate::support::complex_unsupported()),
        },
        _ => return Err("scatter operands disagree in kind".into()),
    })
}

/// Casts each tensor to `dtype` and joins them along `dim`.
pub(crate) fn concat_tensors(xs: &[HostTensor], dim: usize, dtype: DType) -> OpResult<HostTensor> {
    let err = |e: ndarray::ShapeError| format!("cannot join the inputs: {e}");
    if dtype.is_complex() {
        let arrays: Vec<_> = xs.iter().map(|x| x.cast(dtype).to_complex()).collect();
        let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
        let out = ndarray::concatenate(ndarray::Axis(dim), &views).map_err(err)?;
        Ok(HostTensor::complex(dtype, out))
    } else if dtype.is_float() {
        let arrays: Vec<ArrayD<f64>> = xs.iter().map(|x| x.cast(dtype).to_f64()).collect();
        let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
        let out = ndarray::concatenate(ndarray::Axis(dim), &views).map_err(err)?;
        Ok(HostTensor::float(dtype, out))
    } else {
        let arrays: Vec<ArrayD<i64>> = xs.iter().map(|x| x.cast(dtype).to_i64()).collect();
        let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
        let out = ndarray::concatenate(ndarray::Axis(dim), &views).map_err(err)?;
        Ok(HostTensor::int(dtype, out))
    }
}

// ---- Lowerings. ----

/// A tensor of `ty` filled with zeros (for empty results).
pub(crate) fn zeros(b: &mut Builder, ty: &TensorType) -> Value {
    b.constant(ty.dtype, ty.shape.clone(), 0.0)
}

/// Full coordinates for an element-wise gather/scatter along `dim`: for each
/// position `p` of `idx` (rank r), the vector `(p_0, .., idx[p], .., p_{r-1})`,
/// as an `idx.shape + [r]` i64 tensor.
fn element_coords(b: &mut Builder, idx: &Value, dim: usize) -> Value {
    let r = idx.rank();
    let mut shape = idx.dims().to_vec();
    shape.push(1);
    let idx64 = b.convert(idx, DType::I64);
    let cols: Vec<Value> = (0..r)
        .map(|d| {
            if d == dim {
                b.reshape(&idx64, &shape)
            } else {
                b.iota(DType::I64, &shape, d)
            }
        })
        .collect();
    let refs: Vec<&Value> = cols.iter().collect();
    b.concatenate(&refs, r)
}

/// `out[p] = x[p with dim replaced by idx[p]]`, for `x` and `idx` of equal
/// rank >= 1; the result has `idx`'s shape. Out-of-range indices clamp.
pub(crate) fn gather_elements(b: &mut Builder, x: &Value, idx: &Value, dim: usize) -> Value {
    let out = TensorType::new(x.dtype(), idx.shape().clone());
    if out.shape.numel() == 0 {
        return zeros(b, &out);
    }
    let r = x.rank();
    let coords = element_coords(b, idx, dim);
    let all: Vec<usize> = (0..r).collect();
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {}, start_index_map = {}, index_vector_dim = {r}>, slice_sizes = {}, indices_are_sorted = false",
        dim_list(&all),
        dim_list(&all),
        i64_array(vec![1i64; r])
    );
    b.op1("stablehlo.gather", &[x, &coords], &attrs, out)
}

/// Gathers whole slices along `dim`: the result is `x`'s shape with `dim`
/// replaced by `idx`'s shape (`idx` of any rank). Out-of-range indices clamp.
pub(crate) fn gather_slices(b: &mut Builder, x: &Value, idx: &Value, dim: usize) -> Value {
    let k = idx.rank();
    let r = x.rank();
    let mut shape: Vec<usize> = x.dims()[..dim].to_vec();
    shape.extend_from_slice(idx.dims());
    shape.extend_from_slice(&x.dims()[dim + 1..]);
    let out = TensorType::new(x.dtype(), shape);
    if out.shape.numel() == 0 {
        return zeros(b, &out);
    }
    let idx64 = b.convert(idx, DType::I64);
    // Output dims: x's dims before `dim`, then the index dims, then the rest.
    let offset_dims: Vec<usize> = (0..dim).chain(dim + k..r - 1 + k).collect();
    let mut slice_sizes: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
    slice_sizes[dim] = 1;
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [{dim}], start_index_map = [{dim}], index_vector_dim = {k}>, slice_sizes = {}, indices_are_sorted = false",
        dim_list(&offset_dims),
        i64_array(slice_sizes)
    );
    b.op1("stablehlo.gather", &[x, &idx64], &attrs, out)
}

/// The dtype a scatter combines in: f16/bf16 accumulate in f32.
fn scatter_compute(d: DType, combine: Combine) -> DType {
    if matches!(combine, Combine::Add | Combine::Mul) && matches!(d, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        d
    }
}

/// The update region of a scatter.
fn update_region(b: &mut Builder, dtype: DType, combine: Combine) -> String {
    match combine {
        Combine::Add if dtype == DType::Bool => b.scalar_region("stablehlo.or", dtype),
        Combine::Add => b.scalar_region("stablehlo.add", dtype),
        Combine::Mul | Combine::Min if dtype == DType::Bool => {
            b.scalar_region("stablehlo.and", dtype)
        }
        Combine::Max if dtype == DType::Bool => b.scalar_region("stablehlo.or", dtype),
        Combine::Mul => b.scalar_region("stablehlo.multiply", dtype),
        Combine::Max => b.scalar_region("stablehlo.maximum", dtype),
        Combine::Min => b.scalar_region("stablehlo.minimum", dtype),
        Combine::Replace => {
            let scalar = TensorType::new(dtype, Shape::scalar());
            let region: Result<String, std::convert::Infallible> = b
                .region(&[scalar.clone(), scalar], |_, args| {
                    Ok(vec![args[1].clone()])
                });
            match region {
                Ok(text) => text,
                Err(never) => match never {},
            }
        }
    }
}

/// Runs `stablehlo.scatter` with the given dimension numbers.
fn scatter_op(
    b: &mut Builder,
    x: &Value,
    indices: &Value,
    updates: &Value,
    combine: Combine,
    numbers: &str,
) -> Value {
    let out_dtype = x.dtype();
    let compute = scatter_compute(out_dtype, combine);
    let xc = b.convert(x, compute);
    let uc = b.convert(updates, compute);
    let region = update_region(b, compute, combine);
    let attrs = format!(
        "scatter_dimension_numbers = #stablehlo.scatter<{numbers}>, indices_are_sorted = false, unique_indices = false"
    );
    let mut outs = b.op(
        "stablehlo.scatter",
        &[&xc, indices, &uc],
        &[region],
        &attrs,
        vec![xc.ty().clone()],
    );
    let r = outs.remove(0);
    b.convert(&r, out_dtype)
}

/// `out = x; out[p with dim replaced by idx[p]] (op)= upd[p]` for every
/// position `p` of `idx`; `x`, `idx` and `upd` share a rank >= 1 and `upd`
/// has `idx`'s shape. Out-of-range updates are dropped.
pub(crate) fn scatter_elements(
    b: &mut Builder,
    x: &Value,
    idx: &Value,
    upd: &Value,
    dim: usize,
    combine: Combine,
) -> Value {
    if x.shape().numel() == 0 || idx.shape().numel() == 0 {
        return x.clone();
    }
    let r = x.rank();
    let coords = element_coords(b, idx, dim);
    let all: Vec<usize> = (0..r).collect();
    let numbers = format!(
        "inserted_window_dims = {}, scatter_dims_to_operand_dims = {}, index_vector_dim = {r}",
        dim_list(&all),
        dim_list(&all)
    );
    scatter_op(b, x, &coords, upd, combine, &numbers)
}

/// Scatters whole slices along `dim`: `out = x; out[.., idx[i], ..] (op)=
/// upd[.., i, ..]` for a rank-1 `idx`. Out-of-range updates are dropped.
pub(crate) fn scatter_slices(
    b: &mut Builder,
    x: &Value,
    idx: &Value,
    upd: &Value,
    dim: usize,
    combine: Combine,
) -> Value {
    if x.shape().numel() == 0 || upd.shape().numel() == 0 {
        return x.clone();
    }
    let r = x.rank();
    let idx64 = b.convert(idx, DType::I64);
    let window: Vec<usize> = (0..r).filter(|&d| d != dim).collect();
    let numbers = format!(
        "update_window_dims = {}, inserted_window_dims = [{dim}], scatter_dims_to_operand_dims = [{dim}], index_vector_dim = 1",
        dim_list(&window)
    );
    scatter_op(b, x, &idx64, upd, combine, &numbers)
}

// ---- Backward rules. ----

/// Zeros shaped and typed like `like`.
pub(crate) fn zeros_like(t: &mut dyn Tape, like: Var) -> OpResult<Var> {
    t.full_like(like, 0.0)
}

/// `g` padded along `dim` with `lo` / `hi` zeros (negative: cropped).
pub(crate) fn pad_dim(t: &mut dyn Tape, g: Var, dim: usize, lo: i64, hi: i64) -> OpResult<Var> {
    if lo == 0 && hi == 0 {
        return Ok(g);
    }
    let rank = t.ty(g)?.shape.rank();
    let mut pad = vec![0i64; 2 * (rank - dim)];
    let k = 2 * (rank - 1 - dim);
    pad[k] = lo;
    pad[k + 1] = hi;
    t.call1(
        "pad",
        &[g],
        Attrs::new().with("pad", pad).with("value", 0.0),
    )
}

/// `g` padded with zeros at the end of each dim up to `shape`.
pub(crate) fn pad_to(t: &mut dyn Tape, g: Var, shape: &Shape) -> OpResult<Var> {
    let have = t.ty(g)?.shape;
    if have == *shape {
        return Ok(g);
    }
    let rank = shape.rank();
    let mut pad = Vec::with_capacity(2 * rank);
    for d in (0..rank).rev() {
        pad.push(0);
        pad.push(shape.dims()[d] as i64 - have.dims()[d] as i64);
    }
    t.call1(
        "pad",
        &[g],
        Attrs::new().with("pad", pad).with("value", 0.0),
    )
}

/// The gradient `g` cast to the dtype of `input`, or `None` for
/// non-float inputs.
pub(crate) fn grad_as(t: &mut dyn Tape, g: Var, input: Var) -> OpResult<Option<Var>> {
    let ty = t.ty(input)?;
    if !ty.dtype.is_inexact() {
        return Ok(None);
    }
    Ok(Some(t.cast(g, ty.dtype)?))
}

// ---- Samples. ----

/// Indices of `shape` into a dimension of `size`, distinct along `dim`
/// within each fiber (requires `shape[dim] <= size`).
#[cfg(feature = "conformance")]
pub(crate) fn unique_indices(g: &mut Gen, shape: &Shape, dim: usize, size: usize) -> HostTensor {
    let dtype = index_dtype(g);
    let dims = shape.dims();
    let n = dims.get(dim).copied().unwrap_or(1);
    let mut values = vec![0i64; shape.numel()];
    let inner: usize = dims.get(dim + 1..).map_or(1, |s| s.iter().product());
    let outer: usize = dims.get(..dim).map_or(1, |s| s.iter().product());
    for o in 0..outer {
        for i in 0..inner {
            // A random injection of 0..n into 0..size (partial Fisher-Yates).
            let mut pool: Vec<i64> = (0..size as i64).collect();
            for k in 0..n.min(size) {
                let j = k + g.below(size - k);
                pool.swap(k, j);
                values[(o * n + k) * inner + i] = pool[k];
            }
        }
    }
    HostTensor::from_i64(dtype, shape.clone(), values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"))
}

/// A random index dtype, mostly i64.
#[cfg(feature = "conformance")]
pub(crate) fn index_dtype(g: &mut Gen) -> DType {
    if g.below(4) == 0 {
        DType::I32
    } else {
        DType::I64
    }
}

/// A random subset of the dims of `rank`, each maybe written negatively.
#[cfg(feature = "conformance")]
pub(crate) fn random_dims(g: &mut Gen, rank: usize) -> Vec<i64> {
    let r = rank as i64;
    let mut out = Vec::new();
    for d in 0..r {
        if g.bool() {
            out.push(if g.bool() { d - r } else { d });
        }
    }
    out
}

/// A random dim of `rank` (rank 0: 0 or -1), maybe written negatively.
#[cfg(feature = "conformance")]
pub(crate) fn random_dim(g: &mut Gen, rank: usize) -> i64 {
    let r = rank.max(1) as i64;
    let d = g.below(r as usize) as i64;
    if g.bool() { d - r } else { d }
}

/// In-range indices `lo..hi` of a random index dtype.
#[cfg(feature = "conformance")]
pub(crate) fn random_indices(g: &mut Gen, shape: &Shape, lo: i64, hi: i64) -> HostTensor {
    let dtype = index_dtype(g);
    g.indices(dtype, shape, lo, hi)
}

/// The bound of an index input (input 1) into dimension `dim` of `x`
/// (a 0-D `x` counts as 1-D), when the call's plan found the dimension.
pub(crate) fn index_into(x: &TensorType, dim: OpResult<usize>) -> Vec<IndexBound> {
    dim.map(|d| {
        let size = lift(&x.shape).dims()[d];
        vec![IndexBound::new(1, size, format!("dimension {d}"))]
    })
    .unwrap_or_default()
}
