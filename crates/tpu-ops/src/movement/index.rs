//! Gathering ops: `gather`, `index_select`, `take_along_dim`, `embedding`
//! and `one_hot`.

use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, IndexBound, OpResult, Tape, Torch, Var};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::out_of_range;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};
use tpu_core::{DType, Shape};

use super::common::*;
use crate::support::*;

fn two<'a, T>(x: &'a [T], what: &str) -> OpResult<(&'a T, &'a T)> {
    match x {
        [a, b] => Ok((a, b)),
        _ => Err(invalid!("takes ({what})")),
    }
}

/// An error when a non-empty index selects along an empty dimension.
fn check_nonempty(size: usize, count: usize, dim: usize) -> OpResult<()> {
    if size == 0 && count > 0 {
        Err(out_of_range!(
            "index out of range: dimension {dim} is empty but {count} indices are given"
        ))
    } else {
        Ok(())
    }
}

// ---- gather ----

/// `gather(x, index; dim)`: equal ranks (rank 0 counts as 1), `index.size(d)
/// <= x.size(d)` for `d != dim`; the result has the index's shape.
fn gather_plan(x: &TensorType, idx: &TensorType, attrs: &Attrs) -> OpResult<usize> {
    require_index(idx.dtype, "index")?;
    let (xs, is) = (lift(&x.shape), lift(&idx.shape));
    if xs.rank() != is.rank() {
        return Err(invalid!(
            "index {} must have as many dimensions as the input {}",
            idx.shape,
            x.shape
        ));
    }
    let dim = dim_attr(attrs, "dim", None, x.shape.rank())?;
    for d in 0..xs.rank() {
        if d != dim && is.dims()[d] > xs.dims()[d] {
            return Err(invalid!(
                "index {} is larger than the input {} in dimension {d}",
                idx.shape,
                x.shape
            ));
        }
    }
    check_nonempty(xs.dims()[dim], is.numel(), dim)?;
    Ok(dim)
}

fn gather_lower(b: &mut Builder, x: &Value, idx: &Value, dim: usize) -> Value {
    let xl = b.reshape(x, lift(x.shape()).dims());
    let il = b.reshape(idx, lift(idx.shape()).dims());
    let r = gather_elements(b, &xl, &il, dim);
    b.reshape(&r, idx.dims())
}

fn gather_ref(x: &HostTensor, idx: &HostTensor, dim: usize) -> OpResult<HostTensor> {
    let x = with_shape(x, lift(&x.shape()).dims())?;
    let iv = index_values(idx);
    let iv = iv
        .into_shape_with_order(ndarray::IxDyn(lift(&idx.shape()).dims()))
        .map_err(|e| e.to_string())?;
    let size = x.dims()[dim];
    let out = remap_tensor(&x, iv.shape(), 0.0, &|ix, src| {
        src.copy_from_slice(ix);
        src[dim] = gather_index(iv.get(ix).copied().unwrap_or(0), size);
        true
    });
    with_shape(&out, idx.dims())
}

/// The gradient of an element gather: the output gradient added back at
/// the gathered positions.
fn gather_vjp(t: &mut dyn Tape, x: Var, idx: Var, g: Var, dim: usize) -> OpResult<Option<Var>> {
    if !t.ty(x)?.dtype.is_inexact() {
        return Ok(None);
    }
    let zeros = zeros_like(t, x)?;
    let attrs = Attrs::new().with("dim", dim as i64);
    Ok(Some(t.call1("scatter_add", &[zeros, idx, g], attrs)?))
}

#[cfg(feature = "conformance")]
fn gather_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let xs = g.shape(0, 4);
    let rank = xs.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let lifted = lift(&xs);
    let mut is: Vec<usize> = lifted
        .dims()
        .iter()
        .enumerate()
        .map(|(k, &s)| if k == d { g.below(6) } else { g.below(s + 1) })
        .collect();
    if lifted.dims()[d] == 0 {
        is[d] = 0;
    }
    let is = if rank == 0 && g.bool() {
        Shape::scalar()
    } else {
        Shape::new(is)
    };
    let idx = random_indices(g, &is, 0, lifted.dims()[d] as i64);
    Sample::new(
        vec![g.tensor(dtype, &xs), idx],
        Attrs::new().with("dim", dim),
    )
}

inventory::submit! {
    op_def! {
        name: "gather",
        arity: Arity::Exactly(2),
        dtypes: ANY,
        indices: |x, attrs| index_into(&x[0], gather_plan(&x[0], &x[1], attrs)),
        infer: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            gather_plan(a, i, attrs)?;
            Ok(vec![TensorType::new(a.dtype, i.shape.clone())])
        },
        lower: |b, x, attrs| {
            let dim = gather_plan(x[0].ty(), x[1].ty(), attrs)?;
            Ok(vec![gather_lower(b, &x[0], &x[1], dim)])
        },
        reference: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            let dim = gather_plan(&a.ty(), &i.ty(), attrs)?;
            Ok(vec![gather_ref(a, i, dim)?])
        },
        vjp: Some(|t, a| {
            let dim = gather_plan(&t.ty(a.inputs[0])?, &t.ty(a.inputs[1])?, a.attrs)?;
            Ok(vec![gather_vjp(t, a.inputs[0], a.inputs[1], a.grads[0], dim)?, None])
        }),
        samples: || (0..12).map(|i| gather_sample(&mut Gen::new(i))).collect(),
        arbitrary: gather_sample,
        torch: Torch::Expr(r#"torch.gather(x[0], a["dim"], x[1])"#),
    }
}

// ---- take_along_dim ----

/// How `take_along_dim` runs: as a gather of `x` broadcast to `x_shape`
/// with the index broadcast to `idx_shape` along `dim`, or (no `dim`) of
/// both flattened; `out` is the result shape.
struct TakePlan {
    dim: Option<usize>,
    x_shape: Shape,
    idx_shape: Shape,
    out: Shape,
}

fn broadcast_except(a: &Shape, b: &Shape, dim: usize) -> OpResult<Shape> {
    let mut with = a.dims().to_vec();
    with[dim] = b.dims()[dim];
    broadcast_shapes(&Shape::new(with), b)
}

fn take_plan(x: &TensorType, idx: &TensorType, attrs: &Attrs) -> OpResult<TakePlan> {
    require_index(idx.dtype, "index")?;
    let Some(d) = attrs.int_opt("dim")? else {
        let (n, m) = (x.shape.numel(), idx.shape.numel());
        check_nonempty(n, m, 0)?;
        return Ok(TakePlan {
            dim: None,
            x_shape: Shape::new(vec![n]),
            idx_shape: Shape::new(vec![m]),
            out: Shape::new(vec![m]),
        });
    };
    if x.shape.rank() != idx.shape.rank() {
        return Err(invalid!(
            "input {} and index {} must have the same number of dimensions",
            x.shape,
            idx.shape
        ));
    }
    let dim = normalize_dim_scalar_ok(d, x.shape.rank())?;
    let (xs, is) = (lift(&x.shape), lift(&idx.shape));
    let idx_shape = broadcast_except(&xs, &is, dim)?;
    let x_shape = broadcast_except(&is, &xs, dim)?;
    check_nonempty(x_shape.dims()[dim], idx_shape.numel(), dim)?;
    let out = if x.shape.rank() == 0 {
        Shape::scalar()
    } else {
        idx_shape.clone()
    };
    Ok(TakePlan {
        dim: Some(dim),
        x_shape,
        idx_shape,
        out,
    })
}

fn take_lower(b: &mut Builder, x: &Value, idx: &Value, p: &TakePlan) -> Value {
    let (xs, is) = (lift(x.shape()), lift(idx.shape()));
    let xl = b.reshape(
        x,
        if p.dim.is_some() {
            xs.dims()
        } else {
            p.x_shape.dims()
        },
    );
    let il = b.reshape(
        idx,
        if p.dim.is_some() {
            is.dims()
        } else {
            p.idx_shape.dims()
        },
    );
    let xb = b.broadcast_in_dim(&xl, p.x_shape.dims(), &(0..xl.rank()).collect::<Vec<_>>());
    let ib = b.broadcast_in_dim(&il, p.idx_shape.dims(), &(0..il.rank()).collect::<Vec<_>>());
    let r = gather_elements(b, &xb, &ib, p.dim.unwrap_or(0));
    b.reshape(&r, p.out.dims())
}

fn take_ref(x: &HostTensor, idx: &HostTensor, p: &TakePlan) -> OpResult<HostTensor> {
    let dim = p.dim.unwrap_or(0);
    let (xs, is) = match p.dim {
        Some(_) => (lift(&x.shape()), lift(&idx.shape())),
        None => (p.x_shape.clone(), p.idx_shape.clone()),
    };
    let x = with_shape(x, xs.dims())?;
    let iv = index_values(idx)
        .into_shape_with_order(ndarray::IxDyn(is.dims()))
        .map_err(|e| e.to_string())?;
    let iv = broadcast_array(&iv, p.idx_shape.dims())?;
    let size = p.x_shape.dims()[dim];
    let out = remap_tensor(&x, p.idx_shape.dims(), 0.0, &|ix, src| {
        for (k, s) in src.iter_mut().enumerate() {
            *s = if xs.dims()[k] == 1 { 0 } else { ix[k] };
        }
        src[dim] = gather_index(iv.get(ix).copied().unwrap_or(0), size);
        true
    });
    with_shape(&out, p.out.dims())
}

fn take_vjp(t: &mut dyn Tape, x: Var, idx: Var, g: Var, attrs: &Attrs) -> OpResult<Option<Var>> {
    let (xt, it) = (t.ty(x)?, t.ty(idx)?);
    if !xt.dtype.is_inexact() {
        return Ok(None);
    }
    let p = take_plan(&xt, &it, attrs)?;
    let dim = p.dim.unwrap_or(0);
    let xs = if p.dim.is_some() {
        lift(&xt.shape)
    } else {
        p.x_shape.clone()
    };
    let is = if p.dim.is_some() {
        lift(&it.shape)
    } else {
        p.idx_shape.clone()
    };
    let idx = t.reshape(idx, &is)?;
    let idx = t.broadcast_to(idx, &p.idx_shape)?;
    let g = t.reshape(g, &p.idx_shape)?;
    let zeros = t.full(xt.dtype, &p.x_shape, 0.0)?;
    let attrs = Attrs::new().with("dim", dim as i64);
    let gx = t.call1("scatter_add", &[zeros, idx, g], attrs)?;
    let gx = t.sum_to(gx, &xs)?;
    Ok(Some(t.reshape(gx, &xt.shape)?))
}

#[cfg(feature = "conformance")]
fn take_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(REAL);
    let xs = g.shape(0, 3);
    let rank = xs.rank();
    let (dim, size, is) = if g.below(4) == 0 {
        let is = g.shape(0, 3);
        (
            None,
            xs.numel(),
            if xs.numel() == 0 {
                Shape::new(vec![0])
            } else {
                is
            },
        )
    } else {
        let dim = random_dim(g, rank);
        let d = normalize_dim(dim, rank).unwrap_or(0);
        let lifted = lift(&xs);
        // Index dims: broadcastable against x's, any size along `dim`.
        let is: Vec<usize> = lifted
            .dims()
            .iter()
            .enumerate()
            .map(|(k, &s)| match (k == d, g.below(3)) {
                (true, _) => g.below(5),
                (false, 0) => 1,
                _ => s,
            })
            .collect();
        let is = if rank == 0 {
            Shape::scalar()
        } else {
            Shape::new(is)
        };
        let size = lifted.dims()[d];
        let is = if size == 0 {
            let mut dims = lifted.dims().to_vec();
            dims[d] = 0;
            Shape::new(dims)
        } else {
            is
        };
        (Some(dim), size, is)
    };
    let idx = random_indices(g, &is, 0, size as i64);
    let mut attrs = Attrs::new();
    if let Some(d) = dim {
        attrs.set("dim", d);
    }
    Sample::new(vec![g.tensor(dtype, &xs), idx], attrs)
}

inventory::submit! {
    op_def! {
        name: "take_along_dim",
        arity: Arity::Exactly(2),
        indices: |x, attrs| match take_plan(&x[0], &x[1], attrs) {
            Ok(TakePlan { dim: Some(d), x_shape, .. }) => {
                vec![IndexBound::new(1, x_shape.dims()[d], format!("dimension {d}"))]
            }
            Ok(p) => vec![IndexBound::new(1, p.x_shape.numel(), "the flattened input")],
            Err(_) => Vec::new(),
        },
        infer: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            Ok(vec![TensorType::new(a.dtype, take_plan(a, i, attrs)?.out)])
        },
        lower: |b, x, attrs| {
            let p = take_plan(x[0].ty(), x[1].ty(), attrs)?;
            Ok(vec![take_lower(b, &x[0], &x[1], &p)])
        },
        reference: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            let p = take_plan(&a.ty(), &i.ty(), attrs)?;
            Ok(vec![take_ref(a, i, &p)?])
        },
        vjp: Some(|t, a| {
            Ok(vec![take_vjp(t, a.inputs[0], a.inputs[1], a.grads[0], a.attrs)?, None])
        }),
        samples: || (0..12).map(|i| take_sample(&mut Gen::new(i))).collect(),
        arbitrary: take_sample,
        // PyTorch's take_along_dim rejects a 0-D input with a dim; gather does
        // the same there.
        torch: Torch::Expr(r#"torch.take_along_dim(x[0], x[1].long(), a["dim"]) if "dim" in a and x[0].dim() else torch.take_along_dim(x[0], x[1].long()) if "dim" not in a else torch.gather(x[0], 0, x[1])"#),
    }
}

// ---- index_select ----

/// `index_select(x, index; dim)`: a 0-D or 1-D index; the result is `x`
/// with `dim` resized to the index count (a 0-D `x` takes one index).
fn select_plan(x: &TensorType, idx: &TensorType, attrs: &Attrs) -> OpResult<(usize, Shape)> {
    require_index(idx.dtype, "index")?;
    if idx.shape.rank() > 1 {
        return Err(out_of_range!(
            "index must be 0-D or 1-D, got shape {}",
            idx.shape
        ));
    }
    let dim = dim_attr(attrs, "dim", None, x.shape.rank())?;
    let n = idx.shape.numel();
    if x.shape.rank() == 0 {
        if n != 1 {
            return Err(invalid!("a 0-D input takes exactly one index, got {n}"));
        }
        return Ok((dim, Shape::scalar()));
    }
    check_nonempty(x.shape.dims()[dim], n, dim)?;
    let mut dims = x.shape.dims().to_vec();
    dims[dim] = n;
    Ok((dim, Shape::new(dims)))
}

#[cfg(feature = "conformance")]
fn index_select_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let xs = g.shape(0, 4);
    let rank = xs.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim_scalar_ok(dim, rank).unwrap_or(0);
    let size = lift(&xs).dims()[d];
    let is = match (rank, g.below(4)) {
        (0, _) | (_, 0) => Shape::scalar(),
        _ => Shape::new(vec![g.below(8)]),
    };
    let is = if size == 0 { Shape::new(vec![0]) } else { is };
    let idx = random_indices(g, &is, 0, size as i64);
    Sample::new(
        vec![g.tensor(dtype, &xs), idx],
        Attrs::new().with("dim", dim),
    )
}

inventory::submit! {
    op_def! {
        name: "index_select",
        arity: Arity::Exactly(2),
        dtypes: ANY,
        indices: |x, attrs| index_into(&x[0], select_plan(&x[0], &x[1], attrs).map(|p| p.0)),
        infer: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            Ok(vec![TensorType::new(a.dtype, select_plan(a, i, attrs)?.1)])
        },
        lower: |b, x, attrs| {
            let (dim, _) = select_plan(x[0].ty(), x[1].ty(), attrs)?;
            if x[0].rank() == 0 {
                return Ok(vec![x[0].clone()]);
            }
            let idx = b.reshape(&x[1], &[x[1].shape().numel()]);
            Ok(vec![gather_slices(b, &x[0], &idx, dim)])
        },
        reference: |x, attrs| {
            let (a, i) = two(x, "input, index")?;
            let (dim, out) = select_plan(&a.ty(), &i.ty(), attrs)?;
            if a.shape().rank() == 0 {
                return Ok(vec![a.clone()]);
            }
            let iv: Vec<i64> = index_values(i).iter().copied().collect();
            let size = a.dims()[dim];
            Ok(vec![remap_tensor(a, out.dims(), 0.0, &|ix, src| {
                src.copy_from_slice(ix);
                src[dim] = gather_index(iv.get(ix[dim]).copied().unwrap_or(0), size);
                true
            })])
        },
        vjp: Some(|t, a| {
            let x = a.inputs[0];
            if !t.ty(x)?.dtype.is_inexact() {
                return Ok(vec![None, None]);
            }
            let zeros = zeros_like(t, x)?;
            let g = t.call1("index_add", &[zeros, a.inputs[1], a.grads[0]], a.attrs.clone())?;
            Ok(vec![Some(g), None])
        }),
        samples: || (0..12).map(|i| index_select_sample(&mut Gen::new(i))).collect(),
        arbitrary: index_select_sample,
        torch: Torch::Expr(r#"torch.index_select(x[0], a["dim"], x[1])"#),
    }
}

// ---- embedding ----

/// `embedding(weight, indices)`: rows of a 2-D weight; the result is
/// `indices.shape + [embedding_dim]`.
fn embedding_plan(w: &TensorType, idx: &TensorType) -> OpResult<Shape> {
    require_index(idx.dtype, "indices")?;
    if w.shape.rank() != 2 {
        return Err(invalid!("weight must be 2-D, got shape {}", w.shape));
    }
    check_nonempty(w.shape.dims()[0], idx.shape.numel(), 0)?;
    let mut dims = idx.shape.dims().to_vec();
    dims.push(w.shape.dims()[1]);
    Ok(Shape::new(dims))
}

#[cfg(feature = "conformance")]
fn embedding_sample(g: &mut Gen) -> Sample {
    let dtype = if g.below(4) == 0 {
        g.pick(REAL)
    } else {
        g.pick(FLOATS)
    };
    let v = g.dim_nonzero().min(40);
    let w = Shape::new(vec![v, g.dim().min(16)]);
    let is = g.shape(0, 3);
    let idx = random_indices(g, &is, 0, v as i64);
    Sample::new(vec![g.tensor(dtype, &w), idx], Attrs::new())
}

inventory::submit! {
    op_def! {
        name: "embedding",
        arity: Arity::Exactly(2),
        indices: |x, _| match embedding_plan(&x[0], &x[1]) {
            Ok(_) => vec![IndexBound::new(1, x[0].shape.dims()[0], "the embedding's rows")],
            Err(_) => Vec::new(),
        },
        infer: |x, _| {
            let (w, i) = two(x, "weight, indices")?;
            Ok(vec![TensorType::new(w.dtype, embedding_plan(w, i)?)])
        },
        lower: |b, x, _| {
            embedding_plan(x[0].ty(), x[1].ty())?;
            Ok(vec![gather_slices(b, &x[0], &x[1], 0)])
        },
        reference: |x, _| {
            let (w, i) = two(x, "weight, indices")?;
            let out = embedding_plan(&w.ty(), &i.ty())?;
            let iv = index_values(i);
            let (k, rows) = (iv.ndim(), w.dims()[0]);
            Ok(vec![remap_tensor(w, out.dims(), 0.0, &|ix, src| {
                src[0] = gather_index(iv.get(&ix[..k]).copied().unwrap_or(0), rows);
                src[1] = ix[k];
                true
            })])
        },
        vjp: Some(|t, a| {
            let (w, idx) = (a.inputs[0], a.inputs[1]);
            let wt = t.ty(w)?;
            if !wt.dtype.is_inexact() {
                return Ok(vec![None, None]);
            }
            let n = t.ty(idx)?.shape.numel();
            let flat = t.reshape(idx, &Shape::new(vec![n]))?;
            let g = t.reshape(a.grads[0], &Shape::new(vec![n, wt.shape.dims()[1]]))?;
            let zeros = zeros_like(t, w)?;
            let attrs = Attrs::new().with("dim", 0i64);
            Ok(vec![Some(t.call1("index_add", &[zeros, flat, g], attrs)?), None])
        }),
        samples: || (0..10).map(|i| embedding_sample(&mut Gen::new(i))).collect(),
        arbitrary: embedding_sample,
        torch: Torch::Expr("F.embedding(x[1], x[0])"),
    }
}

// ---- one_hot ----

fn one_hot_plan(idx: &TensorType, attrs: &Attrs) -> OpResult<(usize, Shape)> {
    require_index(idx.dtype, "indices")?;
    let c = attrs.int("num_classes")?;
    if c <= 0 || c > 1 << 20 {
        return Err(invalid!("num_classes must be in 1..=2^20, got {c}"));
    }
    let mut dims = idx.shape.dims().to_vec();
    dims.push(c as usize);
    Ok((c as usize, Shape::new(dims)))
}

#[cfg(feature = "conformance")]
fn one_hot_sample(g: &mut Gen) -> Sample {
    let c = 1 + g.below(12);
    let is = g.shape(0, 3);
    let idx = random_indices(g, &is, 0, c as i64);
    Sample::new(vec![idx], Attrs::new().with("num_classes", c as i64))
}

inventory::submit! {
    op_def! {
        name: "one_hot",
        arity: Arity::Exactly(1),
        indices: |x, attrs| match one_hot_plan(&x[0], attrs) {
            Ok((classes, _)) => vec![IndexBound::new(0, classes, "classes")],
            Err(_) => Vec::new(),
        },
        dtypes: INDEX_DTYPES,
        infer: |x, attrs| {
            let i = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(DType::I64, one_hot_plan(i, attrs)?.1)])
        },
        lower: |b, x, attrs| {
            let (_, out) = one_hot_plan(x[0].ty(), attrs)?;
            let k = x[0].rank();
            let classes = b.iota(DType::I64, out.dims(), k);
            let idx = b.convert(&x[0], DType::I64);
            let idx = b.broadcast_in_dim(&idx, out.dims(), &(0..k).collect::<Vec<_>>());
            let hit = b.compare(Compare::Eq, &idx, &classes);
            Ok(vec![b.convert(&hit, DType::I64)])
        },
        reference: |x, attrs| {
            let i = one(x)?;
            let (_, out) = one_hot_plan(&i.ty(), attrs)?;
            let iv = index_values(i);
            let k = iv.ndim();
            let a = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(out.dims()), |ix| {
                use ndarray::Dimension;
                let ix = ix.slice();
                i64::from(iv.get(&ix[..k]).is_some_and(|&v| v == ix[k] as i64))
            });
            Ok(vec![HostTensor::int(DType::I64, a)])
        },
        samples: || (0..8).map(|i| one_hot_sample(&mut Gen::new(i))).collect(),
        arbitrary: one_hot_sample,
        torch: Torch::Expr(r#"F.one_hot(x[0].long(), a["num_classes"])"#),
    }
}
