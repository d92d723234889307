//! `sort` (stable; values and i64 indices) and `topk`.

use std::cmp::Ordering;
use tpu_core::invalid;
use tpu_core::op_def;

use ndarray::{ArrayD, Axis, IxDyn};
use tpu_core::host::{HostData, HostTensor};
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};
use tpu_core::{DType, Shape};

use super::common::*;
use crate::support::*;

/// PyTorch's order: NaN above everything, NaNs equal.
fn cmp_f64(a: &f64, b: &f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

/// For each fiber along `dim` of `a` (rank >= 1), the positions of its
/// first `k` elements in stable sorted order.
fn sort_positions<T: Copy>(
    a: &ArrayD<T>,
    dim: usize,
    k: usize,
    descending: bool,
    cmp: fn(&T, &T) -> Ordering,
) -> ArrayD<i64> {
    let mut shape = a.shape().to_vec();
    shape[dim] = k;
    let mut out = ArrayD::<i64>::zeros(IxDyn(&shape));
    for (lane, mut dst) in a.lanes(Axis(dim)).into_iter().zip(out.lanes_mut(Axis(dim))) {
        let vals: Vec<T> = lane.to_vec();
        let mut order: Vec<usize> = (0..vals.len()).collect();
        order.sort_by(|&i, &j| {
            if descending {
                cmp(&vals[j], &vals[i])
            } else {
                cmp(&vals[i], &vals[j])
            }
        });
        for (o, &i) in dst.iter_mut().zip(&order) {
            *o = i as i64;
        }
    }
    out
}

/// Values and indices of the first `k` sorted elements along `dim`.
fn sorted_ref(x: &HostTensor, dim: usize, k: usize, descending: bool) -> OpResult<Vec<HostTensor>> {
    let shape = x.shape();
    let xl = with_shape(x, lift(&shape).dims())?;
    let pos = match xl.data() {
        HostData::Float(a) => sort_positions(a, dim, k, descending, cmp_f64),
        HostData::Int(a) => sort_positions(a, dim, k, descending, i64::cmp),
        HostData::Complex(_) => return Err(complex_unsupported()),
    };
    let values = remap_tensor(&xl, pos.shape(), 0.0, &|ix, src| {
        src.copy_from_slice(ix);
        src[dim] = pos.get(ix).copied().unwrap_or(0) as usize;
        true
    });
    let mut out_shape = shape.dims().to_vec();
    if let Some(s) = out_shape.get_mut(dim) {
        *s = k;
    }
    let indices = HostTensor::int(DType::I64, pos);
    Ok(vec![
        with_shape(&values, &out_shape)?,
        with_shape(&indices, &out_shape)?,
    ])
}

/// `isnan(v)` as `v != v`.
fn is_nan(b: &mut Builder, v: &Value) -> Value {
    b.compare(Compare::Ne, v, v)
}

/// Stable sort along `dim` (rank >= 1, non-empty): values and i64 indices.
fn sort_lower(b: &mut Builder, x: &Value, dim: usize, descending: bool) -> OpResult<Vec<Value>> {
    let iota = b.iota(DType::I64, x.dims(), dim);
    let scalar = TensorType::new(x.dtype(), Shape::scalar());
    let index = TensorType::new(DType::I64, Shape::scalar());
    let float = x.dtype().is_float();
    let region = b.region(
        &[scalar.clone(), scalar, index.clone(), index],
        |b, args| {
            let (p, q) = if descending {
                (&args[1], &args[0])
            } else {
                (&args[0], &args[1])
            };
            // p before q when p < q, NaN counting as largest.
            let mut before = b.compare(Compare::Lt, p, q);
            if float {
                let p_nan = is_nan(b, p);
                let q_nan = is_nan(b, q);
                let p_num = b.unary("stablehlo.not", &p_nan);
                let nan_last = b.binary("stablehlo.and", &q_nan, &p_num);
                before = b.binary("stablehlo.or", &before, &nan_last);
            }
            Ok::<_, String>(vec![before])
        },
    )?;
    let attrs = format!("dimension = {dim} : i64, is_stable = true");
    Ok(b.op(
        "stablehlo.sort",
        &[x, &iota],
        &[region],
        &attrs,
        vec![x.ty().clone(), iota.ty().clone()],
    ))
}

/// Lowers the first `k` sorted elements along `dim` of `x` (any rank).
fn sorted_lower(
    b: &mut Builder,
    x: &Value,
    dim: usize,
    k: usize,
    descending: bool,
) -> OpResult<Vec<Value>> {
    let mut out_shape = x.dims().to_vec();
    if let Some(s) = out_shape.get_mut(dim) {
        *s = k;
    }
    if TensorType::new(x.dtype(), out_shape.clone()).shape.numel() == 0 || x.rank() == 0 {
        let values = if x.rank() == 0 {
            x.clone()
        } else {
            b.constant(x.dtype(), out_shape.clone(), 0.0)
        };
        let indices = b.constant(DType::I64, out_shape, 0.0);
        return Ok(vec![values, indices]);
    }
    let mut sorted = sort_lower(b, x, dim, descending)?;
    if k < x.dims()[dim] {
        let r = x.rank();
        let mut limit = x.dims().to_vec();
        limit[dim] = k;
        for v in sorted.iter_mut() {
            *v = b.slice(v, &vec![0; r], &limit, &vec![1; r]);
        }
    }
    Ok(sorted)
}

/// The gradient of sorted values: added back at the positions they came
/// from (indices are output 1).
fn sorted_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, dim: usize) -> OpResult<Vec<Option<Var>>> {
    let x = a.inputs[0];
    if !t.ty(x)?.dtype.is_float() {
        return Ok(vec![None]);
    }
    let zeros = zeros_like(t, x)?;
    let attrs = Attrs::new().with("dim", dim as i64);
    let g = t.call1("scatter_add", &[zeros, a.outputs[1], a.grads[0]], attrs)?;
    Ok(vec![Some(g)])
}

fn out_types(x: &TensorType, dim: usize, k: usize) -> Vec<TensorType> {
    let mut dims = x.shape.dims().to_vec();
    if let Some(s) = dims.get_mut(dim) {
        *s = k;
    }
    vec![
        TensorType::new(x.dtype, dims.clone()),
        TensorType::new(DType::I64, dims),
    ]
}

// ---- sort ----

/// `sort(dim=-1, descending=false)`; `stable` is accepted (always stable).
fn sort_plan(x: &TensorType, attrs: &Attrs) -> OpResult<(usize, usize, bool)> {
    let dim = dim_attr(attrs, "dim", Some(-1), x.shape.rank())?;
    let descending = attrs.bool_or("descending", false)?;
    attrs.bool_or("stable", true)?;
    let k = lift(&x.shape).dims()[dim];
    Ok((dim, k, descending))
}

/// Input values: floats are distinct within each fiber along `dim` (a
/// shuffled grid of quarters, exact in bf16), so finite differences never
/// straddle a tie; integers keep their ties (the sort is stable).
#[cfg(feature = "conformance")]
fn sort_input(g: &mut Gen, dtype: DType, shape: &Shape, dim: usize) -> HostTensor {
    if !dtype.is_float() {
        return g.tensor(dtype, shape);
    }
    let dims = lift(shape).dims().to_vec();
    let n = dims[dim];
    let inner: usize = dims[dim + 1..].iter().product();
    let outer: usize = dims[..dim].iter().product();
    let mut values = vec![0.0; shape.numel()];
    for o in 0..outer {
        for i in 0..inner {
            let mut perm: Vec<usize> = (0..n).collect();
            for k in (1..n).rev() {
                perm.swap(k, g.below(k + 1));
            }
            for (k, &p) in perm.iter().enumerate() {
                values[(o * n + k) * inner + i] = (p as f64 - (n / 2) as f64) * 0.25;
            }
        }
    }
    HostTensor::from_f64(dtype, shape.clone(), values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"))
}

#[cfg(feature = "conformance")]
fn sort_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(REAL);
    let shape = g.shape(0, 3);
    let dim = random_dim(g, shape.rank());
    let d = normalize_dim_scalar_ok(dim, shape.rank()).unwrap_or(0);
    let mut attrs = Attrs::new();
    if g.below(3) != 0 || d + 1 < shape.rank() {
        attrs.set("dim", dim);
    }
    if g.bool() {
        attrs.set("descending", g.bool());
    }
    Sample::new(vec![sort_input(g, dtype, &shape, d)], attrs)
}

inventory::submit! {
    op_def! {
        name: "sort",
        arity: Arity::Exactly(1),
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let (dim, k, _) = sort_plan(t, attrs)?;
            Ok(out_types(t, dim, k))
        },
        lower: |b, x, attrs| {
            let (dim, k, desc) = sort_plan(x[0].ty(), attrs)?;
            sorted_lower(b, &x[0], dim, k, desc)
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let (dim, k, desc) = sort_plan(&x.ty(), attrs)?;
            sorted_ref(x, dim, k, desc)
        },
        vjp: Some(|t, a| {
            let (dim, _, _) = sort_plan(&t.ty(a.inputs[0])?, a.attrs)?;
            sorted_vjp(t, a, dim)
        }),
        samples: || (0..12).map(|i| sort_sample(&mut Gen::new(i))).collect(),
        arbitrary: sort_sample,
        torch: Torch::Expr(r#"torch.sort(x[0], dim=a.get("dim", -1), descending=a.get("descending", False), stable=True)"#),
    }
}

// ---- topk ----

/// `topk(k, dim=-1, largest=true)`: `0 <= k <= size` (a 0-D input takes
/// `k = 1`); results are sorted; `sorted` is accepted.
fn topk_plan(x: &TensorType, attrs: &Attrs) -> OpResult<(usize, usize, bool)> {
    let dim = dim_attr(attrs, "dim", Some(-1), x.shape.rank())?;
    let largest = attrs.bool_or("largest", true)?;
    attrs.bool_or("sorted", true)?;
    let k = attrs.int("k")?;
    let size = lift(&x.shape).dims()[dim] as i64;
    let lo = if x.shape.rank() == 0 { 1 } else { 0 };
    if k < lo || k > size {
        return Err(invalid!(
            "k = {k} is out of range for dimension {dim} of size {size}"
        ));
    }
    Ok((dim, k as usize, largest))
}

#[cfg(feature = "conformance")]
fn topk_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(REAL);
    let shape = g.shape(0, 3);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim_scalar_ok(dim, rank).unwrap_or(0);
    let size = lift(&shape).dims()[d];
    let k = if rank == 0 { 1 } else { g.below(size + 1) };
    let mut attrs = Attrs::new().with("k", k as i64);
    if g.below(4) != 0 || d + 1 != rank {
        attrs.set("dim", dim);
    }
    if g.bool() {
        attrs.set("largest", g.bool());
    }
    Sample::new(vec![sort_input(g, dtype, &shape, d)], attrs)
}

inventory::submit! {
    op_def! {
        name: "topk",
        arity: Arity::Exactly(1),
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let (dim, k, _) = topk_plan(t, attrs)?;
            Ok(out_types(t, dim, k))
        },
        lower: |b, x, attrs| {
            let (dim, k, largest) = topk_plan(x[0].ty(), attrs)?;
            sorted_lower(b, &x[0], dim, k, largest)
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let (dim, k, largest) = topk_plan(&x.ty(), attrs)?;
            sorted_ref(x, dim, k, largest)
        },
        vjp: Some(|t, a| {
            let (dim, _, _) = topk_plan(&t.ty(a.inputs[0])?, a.attrs)?;
            sorted_vjp(t, a, dim)
        }),
        samples: || (0..12).map(|i| topk_sample(&mut Gen::new(i))).collect(),
        arbitrary: topk_sample,
        // A stable sort cut to k: torch.topk orders ties arbitrarily (and takes no bool).
        torch: Torch::Expr(r#"tuple(t.narrow(a.get("dim", -1), 0, a["k"]) if t.dim() else t for t in torch.sort(x[0], dim=a.get("dim", -1), descending=a.get("largest", True), stable=True))"#),
    }
}
