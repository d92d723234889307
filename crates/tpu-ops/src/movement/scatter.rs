//! Scattering ops: `scatter`, `scatter_add`, `scatter_reduce` and
//! `index_add`.

#[cfg(feature = "conformance")]
use tpu_core::DType;
use tpu_core::Shape;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::out_of_range;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::common::*;
use crate::support::ANY;
#[cfg(feature = "conformance")]
use crate::support::*;

fn three<T>(x: &[T]) -> OpResult<(&T, &T, &T)> {
    match x {
        [a, b, c] => Ok((a, b, c)),
        _ => Err("takes (input, index, src)".into()),
    }
}

fn same_dtype(x: &TensorType, src: &TensorType) -> OpResult<()> {
    if x.dtype == src.dtype {
        Ok(())
    } else {
        Err(invalid!(
            "src dtype {} must equal the input dtype {}",
            src.dtype,
            x.dtype
        ))
    }
}

// ---- scatter / scatter_add ----

/// `scatter(x, index, src; dim)`: equal ranks (0-D counts as 1-D),
/// `index.size(d) <= src.size(d)` for all d and `<= x.size(d)` for
/// `d != dim`. Only the leading `index.shape` block of `src` is used.
fn scatter_plan(
    x: &TensorType,
    idx: &TensorType,
    src: &TensorType,
    attrs: &Attrs,
) -> OpResult<usize> {
    require_index(idx.dtype, "index")?;
    same_dtype(x, src)?;
    let (xs, is, ss) = (lift(&x.shape), lift(&idx.shape), lift(&src.shape));
    if xs.rank() != is.rank() || ss.rank() != is.rank() {
        return Err(invalid!(
            "input {}, index {} and src {} must have the same number of dimensions",
            x.shape,
            idx.shape,
            src.shape
        ));
    }
    let dim = dim_attr(attrs, "dim", None, x.shape.rank())?;
    for d in 0..xs.rank() {
        if is.dims()[d] > ss.dims()[d] || (d != dim && is.dims()[d] > xs.dims()[d]) {
            return Err(invalid!(
                "index {} must be no larger than src {} in every dimension and than the input {} outside dimension {dim}",
                idx.shape,
                src.shape,
                x.shape
            ));
        }
    }
    if xs.dims()[dim] == 0 && is.numel() > 0 {
        return Err(out_of_range!(
            "index out of range: dimension {dim} of the input is empty"
        ));
    }
    Ok(dim)
}

fn scatter_lower(b: &mut Builder, x: &[Value], dim: usize, combine: Combine) -> Value {
    let (xs, is, ss) = (lift(x[0].shape()), lift(x[1].shape()), lift(x[2].shape()));
    let xl = b.reshape(&x[0], xs.dims());
    let il = b.reshape(&x[1], is.dims());
    let sl = b.reshape(&x[2], ss.dims());
    let r = is.rank();
    let upd = b.slice(&sl, &vec![0; r], is.dims(), &vec![1; r]);
    let out = scatter_elements(b, &xl, &il, &upd, dim, combine);
    b.reshape(&out, x[0].dims())
}

fn scatter_ref(x: &[HostTensor], dim: usize, combine: Combine) -> OpResult<HostTensor> {
    let (xs, is, ss) = (
        lift(&x[0].shape()),
        lift(&x[1].shape()),
        lift(&x[2].shape()),
    );
    let xl = with_shape(&x[0], xs.dims())?;
    let sl = with_shape(&x[2], ss.dims())?;
    let iv = index_values(&x[1])
        .into_shape_with_order(ndarray::IxDyn(is.dims()))
        .map_err(|e| e.to_string())?;
    let size = xs.dims()[dim];
    let out = scatter_tensor(&xl, &sl, combine, &|p, dest| {
        let Some(&i) = iv.get(p) else {
            return false;
        };
        let Some(k) = scatter_index(i, size) else {
            return false;
        };
        dest.copy_from_slice(p);
        dest[dim] = k;
        true
    })?;
    with_shape(&out, x[0].dims())
}

/// The gradient of `src`: the output gradient gathered at the scattered
/// positions, zero-padded to `src`'s shape.
fn src_grad(t: &mut dyn Tape, a: &VjpArgs<'_>, dim: usize) -> OpResult<Option<Var>> {
    let (idx, src) = (a.inputs[1], a.inputs[2]);
    let st = t.ty(src)?;
    if !st.dtype.is_inexact() {
        return Ok(None);
    }
    let attrs = Attrs::new().with("dim", dim as i64);
    let g = t.call1("gather", &[a.grads[0], idx], attrs)?;
    let g = t.reshape(g, &lift(&t.ty(idx)?.shape))?;
    let g = pad_to(t, g, &lift(&st.shape))?;
    Ok(Some(t.reshape(g, &st.shape)?))
}

fn scatter_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, combine: Combine) -> OpResult<Vec<Option<Var>>> {
    let (x, idx, src) = (a.inputs[0], a.inputs[1], a.inputs[2]);
    let dim = scatter_plan(&t.ty(x)?, &t.ty(idx)?, &t.ty(src)?, a.attrs)?;
    let gx = if !t.ty(x)?.dtype.is_inexact() {
        None
    } else if combine == Combine::Add {
        Some(a.grads[0])
    } else {
        let zeros = zeros_like(t, src)?;
        let attrs = Attrs::new().with("dim", dim as i64);
        Some(t.call1("scatter", &[a.grads[0], idx, zeros], attrs)?)
    };
    Ok(vec![gx, None, src_grad(t, a, dim)?])
}

/// A scatter sample: `unique` gives distinct indices along `dim` (so
/// `scatter` is deterministic).
#[cfg(feature = "conformance")]
fn scatter_sample(g: &mut Gen, dtypes: &[DType], unique: bool) -> Sample {
    let dtype = g.pick(dtypes);
    let xs = g.shape(0, 3);
    let rank = xs.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank.max(1)).unwrap_or(0);
    let lifted = lift(&xs);
    let size = lifted.dims()[d];
    let is: Vec<usize> = lifted
        .dims()
        .iter()
        .enumerate()
        .map(|(k, &s)| match (k == d, size) {
            (true, 0) => 0,
            (true, _) if unique => g.below(size + 1),
            (true, _) => g.below(6),
            (false, _) => g.below(s + 1),
        })
        .collect();
    let ss: Vec<usize> = is.iter().map(|&n| n + g.below(2)).collect();
    let (is, ss) = if rank == 0 && g.bool() {
        (Shape::scalar(), Shape::scalar())
    } else {
        (Shape::new(is), Shape::new(ss))
    };
    let idx = if unique {
        unique_indices(g, &lift(&is), d, size)
    } else {
        random_indices(g, &is, 0, size as i64)
    };
    let idx = with_shape(&idx, is.dims()).unwrap_or(idx);
    let inputs = vec![g.tensor(dtype, &xs), idx, g.tensor(dtype, &ss)];
    Sample::new(inputs, Attrs::new().with("dim", dim))
}

fn infer_scatter(x: &[TensorType], attrs: &Attrs) -> OpResult<Vec<TensorType>> {
    let (a, i, s) = three(x)?;
    scatter_plan(a, i, s, attrs)?;
    Ok(vec![a.clone()])
}

fn lower_scatter(
    b: &mut Builder,
    x: &[Value],
    attrs: &Attrs,
    combine: Combine,
) -> OpResult<Vec<Value>> {
    let dim = scatter_plan(x[0].ty(), x[1].ty(), x[2].ty(), attrs)?;
    Ok(vec![scatter_lower(b, x, dim, combine)])
}

fn reference_scatter(
    x: &[HostTensor],
    attrs: &Attrs,
    combine: Combine,
) -> OpResult<Vec<HostTensor>> {
    let (a, i, s) = three(x)?;
    let dim = scatter_plan(&a.ty(), &i.ty(), &s.ty(), attrs)?;
    Ok(vec![scatter_ref(x, dim, combine)?])
}

inventory::submit! {
    op_def! {
        name: "scatter",
        arity: Arity::Exactly(3),
        dtypes: ANY,
        indices: |x, attrs| index_into(&x[0], scatter_plan(&x[0], &x[1], &x[2], attrs)),
        infer: infer_scatter,
        lower: |b, x, attrs| lower_scatter(b, x, attrs, Combine::Replace),
        reference: |x, attrs| reference_scatter(x, attrs, Combine::Replace),
        vjp: Some(|t, a| scatter_vjp(t, a, Combine::Replace)),
        samples: || (0..12).map(|i| scatter_sample(&mut Gen::new(i), ANY, true)).collect(),
        arbitrary: |g| scatter_sample(g, ANY, true),
        // Only the index-shaped block of src takes part: it is cut out first,
        // as PyTorch's backward requires.
        torch: Torch::Expr(r#"torch.scatter(x[0], a["dim"], x[1], x[2][tuple(map(slice, x[1].shape))])"#),
    }
}

inventory::submit! {
    op_def! {
        name: "scatter_add",
        arity: Arity::Exactly(3),
        dtypes: ANY,
        indices: |x, attrs| index_into(&x[0], scatter_plan(&x[0], &x[1], &x[2], attrs)),
        infer: infer_scatter,
        lower: |b, x, attrs| lower_scatter(b, x, attrs, Combine::Add),
        reference: |x, attrs| reference_scatter(x, attrs, Combine::Add),
        vjp: Some(|t, a| scatter_vjp(t, a, Combine::Add)),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..12).map(|i| scatter_sample(&mut Gen::new(i), ANY, false)).collect(),
        arbitrary: |g| scatter_sample(g, ANY, false),
        // Only the index-shaped block of src takes part: it is cut out first,
        // as PyTorch's backward requires.
        torch: Torch::Expr(r#"torch.scatter_add(x[0], a["dim"], x[1], x[2][tuple(map(slice, x[1].shape))])"#),
    }
}

/// `scatter_reduce`'s combination, from its `reduce` attribute (default
/// `"sum"`).
fn reduce_attr(attrs: &Attrs) -> OpResult<Combine> {
    Combine::from_reduce(attrs.str_or("reduce", "sum")?)
}

#[cfg(feature = "conformance")]
fn reduce_sample(g: &mut Gen) -> Sample {
    let mut s = scatter_sample(g, REAL, false);
    s.attrs
        .set("reduce", g.pick(&["sum", "prod", "amax", "amin"]));
    s
}

// `scatter_reduce(x, index, src; dim, reduce)`: `scatter_add` with the
// product, the maximum or the minimum in place of the sum; the scattered
// values combine with what `x` holds there (PyTorch's `include_self=True`).
inventory::submit! {
    op_def! {
        name: "scatter_reduce",
        arity: Arity::Exactly(3),
        indices: |x, attrs| index_into(&x[0], scatter_plan(&x[0], &x[1], &x[2], attrs)),
        // No Rust backward rule yet: PyTorch computes its own through the
        // bridge.
        flags: Flags::NOT_DIFFERENTIABLE,
        infer: |x, attrs| {
            reduce_attr(attrs)?;
            infer_scatter(x, attrs)
        },
        lower: |b, x, attrs| lower_scatter(b, x, attrs, reduce_attr(attrs)?),
        reference: |x, attrs| reference_scatter(x, attrs, reduce_attr(attrs)?),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..16).map(|i| reduce_sample(&mut Gen::new(40 + i))).collect(),
        arbitrary: reduce_sample,
        torch: Torch::Expr(r#"torch.scatter_reduce(x[0], a["dim"], x[1], x[2][tuple(map(slice, x[1].shape))], a.get("reduce", "sum"))"#),
    }
}

// ---- index_add ----

/// `index_add(x, index, src; dim)`: a 0-D or 1-D index of `n` entries and
/// `src` shaped like `x` with `dim` resized to `n`.
fn index_add_plan(
    x: &TensorType,
    idx: &TensorType,
    src: &TensorType,
    attrs: &Attrs,
) -> OpResult<usize> {
    require_index(idx.dtype, "index")?;
    same_dtype(x, src)?;
    if idx.shape.rank() > 1 {
        return Err(out_of_range!(
            "index must be 0-D or 1-D, got shape {}",
            idx.shape
        ));
    }
    let dim = dim_attr(attrs, "dim", None, x.shape.rank())?;
    let n = idx.shape.numel();
    let xs = lift(&x.shape);
    let mut want = xs.dims().to_vec();
    want[dim] = n;
    let want = Shape::new(want);
    let ok = lift(&src.shape) == want && (x.shape.rank() > 0 || src.shape.rank() == 0);
    if !ok {
        return Err(invalid!(
            "src {} must be shaped like the input {} with dimension {dim} of size {n}",
            src.shape,
            x.shape
        ));
    }
    if xs.dims()[dim] == 0 && n > 0 {
        return Err(out_of_range!(
            "index out of range: dimension {dim} of the input is empty"
        ));
    }
    Ok(dim)
}

#[cfg(feature = "conformance")]
fn index_add_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let xs = g.shape(0, 3);
    let rank = xs.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank.max(1)).unwrap_or(0);
    let lifted = lift(&xs);
    let size = lifted.dims()[d];
    let n = match (rank, size) {
        (_, 0) => 0,
        (0, _) => 1,
        _ => g.below(8),
    };
    let is = if (rank == 0 || n == 1) && g.bool() {
        Shape::scalar()
    } else {
        Shape::new(vec![n])
    };
    let mut ss = lifted.dims().to_vec();
    ss[d] = n;
    let ss = if rank == 0 {
        Shape::scalar()
    } else {
        Shape::new(ss)
    };
    let idx = random_indices(g, &is, 0, size as i64);
    let inputs = vec![g.tensor(dtype, &xs), idx, g.tensor(dtype, &ss)];
    Sample::new(inputs, Attrs::new().with("dim", dim))
}

inventory::submit! {
    op_def! {
        name: "index_add",
        arity: Arity::Exactly(3),
        dtypes: ANY,
        indices: |x, attrs| index_into(&x[0], index_add_plan(&x[0], &x[1], &x[2], attrs)),
        infer: |x, attrs| {
            let (a, i, s) = three(x)?;
            index_add_plan(a, i, s, attrs)?;
            Ok(vec![a.clone()])
        },
        lower: |b, x, attrs| {
            let dim = index_add_plan(x[0].ty(), x[1].ty(), x[2].ty(), attrs)?;
            let xs = lift(x[0].shape());
            let xl = b.reshape(&x[0], xs.dims());
            let n = x[1].shape().numel();
            let il = b.reshape(&x[1], &[n]);
            let mut ss = xs.dims().to_vec();
            ss[dim] = n;
            let sl = b.reshape(&x[2], &ss);
            let out = scatter_slices(b, &xl, &il, &sl, dim, Combine::Add);
            Ok(vec![b.reshape(&out, x[0].dims())])
        },
        reference: |x, attrs| {
            let (a, i, s) = three(x)?;
            let dim = index_add_plan(&a.ty(), &i.ty(), &s.ty(), attrs)?;
            let xs = lift(&a.shape());
            let xl = with_shape(a, xs.dims())?;
            let iv: Vec<i64> = index_values(i).iter().copied().collect();
            let mut ss = xs.dims().to_vec();
            ss[dim] = iv.len();
            let sl = with_shape(s, &ss)?;
            let size = xs.dims()[dim];
            let out = scatter_tensor(&xl, &sl, Combine::Add, &|p, dest| {
                let Some(k) = iv.get(p[dim]).and_then(|&i| scatter_index(i, size)) else {
                    return false;
                };
                dest.copy_from_slice(p);
                dest[dim] = k;
                true
            })?;
            Ok(vec![with_shape(&out, a.dims())?])
        },
        vjp: Some(|t, a| {
            let (x, idx, src) = (a.inputs[0], a.inputs[1], a.inputs[2]);
            let dim = index_add_plan(&t.ty(x)?, &t.ty(idx)?, &t.ty(src)?, a.attrs)?;
            let gx = grad_as(t, a.grads[0], x)?;
            let st = t.ty(src)?;
            let gs = if st.dtype.is_inexact() {
                let attrs = Attrs::new().with("dim", dim as i64);
                let g = t.call1("index_select", &[a.grads[0], idx], attrs)?;
                Some(t.reshape(g, &st.shape)?)
            } else {
                None
            };
            Ok(vec![gx, None, gs])
        }),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..12).map(|i| index_add_sample(&mut Gen::new(i))).collect(),
        arbitrary: index_add_sample,
        torch: Torch::Expr(r#"torch.index_add(x[0], a["dim"], x[1], x[2])"#),
    }
}
