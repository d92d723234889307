//! Triangular solves and the Cholesky factorization over the last two dims
//! (leading dims are a batch, equal in both operands), for floats; f16 and
//! bf16 compute in f32.
//!
//! - `triangular_solve(a, b, left=true, lower=true, transpose_a=false,
//!   unit_diagonal=false)` solves `op(T) x = b` (`x op(T) = b` when not
//!   `left`), where `T` is `a`'s lower or upper triangle (unit diagonal if
//!   asked) and `op` transposes when `transpose_a`. The other triangle is
//!   never read.
//! - `cholesky(a)` gives the lower-triangular `L` with `L Lᵀ = (a + aᵀ) / 2`;
//!   where that is not positive definite the whole matrix is NaN.

use ndarray::{Array2, ArrayD, IxDyn};
use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::{accumulator, matmul, transpose_last};
use crate::support::*;

/// `(batch, rows, cols)` of a matrix operand.
pub(super) fn matrix(t: &TensorType, what: &str) -> OpResult<(Vec<usize>, usize, usize)> {
    let d = t.shape.dims();
    if d.len() < 2 {
        return Err(invalid!(
            "{what} must have at least 2 dimensions, got shape {}",
            t.shape
        ));
    }
    require_dtype(t.dtype, FLOATS, what)?;
    Ok((d[..d.len() - 2].to_vec(), d[d.len() - 2], d[d.len() - 1]))
}

/// The matrices of a batch (the last two dims), in order.
pub(super) fn matrices(x: &ArrayD<f64>) -> Vec<Array2<f64>> {
    let r = x.ndim();
    let (m, n) = (x.shape()[r - 2], x.shape()[r - 1]);
    let values: Vec<f64> = x.iter().copied().collect();
    if m * n == 0 {
        // Empty matrices: as many as the batch dims hold.
        let count = x.shape()[..r - 2].iter().product();
        return vec![Array2::zeros((m, n)); count];
    }
    values
        .chunks(m * n)
        .map(|c| {
            Array2::from_shape_vec((m, n), c.to_vec())
                .unwrap_or_else(|_| unreachable!("chunk is m × n"))
        })
        .collect()
}

/// The inverse of [`matrices`].
pub(super) fn stack(mats: Vec<Array2<f64>>, dims: &[usize]) -> ArrayD<f64> {
    let values: Vec<f64> = mats.iter().flat_map(|m| m.iter().copied()).collect();
    ArrayD::from_shape_vec(IxDyn(dims), values)
        .unwrap_or_else(|_| unreachable!("batch of matrices fills the shape"))
}

// ---- triangular_solve ----

#[derive(Clone, Copy)]
struct Solve {
    left: bool,
    lower: bool,
    transpose: bool,
    unit: bool,
}

fn solve_plan(x: &[TensorType], attrs: &Attrs) -> OpResult<Solve> {
    let [a, b] = x else {
        return Err("takes two inputs: the triangular matrix and the right-hand side".into());
    };
    let (ab, n, n2) = matrix(a, "the matrix")?;
    let (bb, r, c) = matrix(b, "the right-hand side")?;
    let plan = Solve {
        left: attrs.bool_or("left", true)?,
        lower: attrs.bool_or("lower", true)?,
        transpose: attrs.bool_or("transpose_a", false)?,
        unit: attrs.bool_or("unit_diagonal", false)?,
    };
    let shared = if plan.left { r } else { c };
    if n != n2 || ab != bb || shared != n || a.dtype != b.dtype {
        return Err(invalid!(
            "needs a square matrix and a right-hand side with the same batch dims, dtype and {} {n}: got {} and {}",
            if plan.left { "rows" } else { "columns" },
            a,
            b
        ));
    }
    Ok(plan)
}

fn lower_solve(b: &mut Builder, a: &Value, rhs: &Value, p: Solve) -> Value {
    let dtype = a.dtype();
    let (a, rhs) = (
        b.convert(a, accumulator(dtype)),
        b.convert(rhs, accumulator(dtype)),
    );
    let transpose = if p.transpose {
        "TRANSPOSE"
    } else {
        "NO_TRANSPOSE"
    };
    let attrs = format!(
        "left_side = {}, lower = {}, unit_diagonal = {}, transpose_a = #stablehlo<transpose {transpose}>",
        p.left, p.lower, p.unit
    );
    let x = b.op1(
        "stablehlo.triangular_solve",
        &[&a, &rhs],
        &attrs,
        rhs.ty().clone(),
    );
    b.convert(&x, dtype)
}

/// `op(T)` as a dense matrix, and whether it is lower triangular.
fn effective(a: &Array2<f64>, p: Solve) -> (Array2<f64>, bool) {
    let n = a.nrows();
    let t = Array2::from_shape_fn((n, n), |(i, j)| match () {
        _ if i == j && p.unit => 1.0,
        _ if (p.lower && j <= i) || (!p.lower && j >= i) => a[(i, j)],
        _ => 0.0,
    });
    if p.transpose {
        (t.t().to_owned(), !p.lower)
    } else {
        (t, p.lower)
    }
}

/// Solves `t x = b` for triangular `t` by substitution.
fn substitute(t: &Array2<f64>, lower: bool, b: &Array2<f64>) -> Array2<f64> {
    let n = t.nrows();
    let mut x = b.clone();
    let order: Vec<usize> = if lower {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    for col in 0..b.ncols() {
        for &i in &order {
            let mut s = b[(i, col)];
            for &j in order.iter().take_while(|&&j| j != i) {
                s -= t[(i, j)] * x[(j, col)];
            }
            x[(i, col)] = s / t[(i, i)];
        }
    }
    x
}

fn solve_ref(a: &HostTensor, rhs: &HostTensor, p: Solve) -> HostTensor {
    let x = matrices(&a.to_f64())
        .iter()
        .zip(matrices(&rhs.to_f64()))
        .map(|(a, b)| {
            let (t, lower) = effective(a, p);
            if p.left {
                substitute(&t, lower, &b)
            } else {
                // x t = b  <=>  tᵀ xᵀ = bᵀ.
                substitute(&t.t().to_owned(), !lower, &b.t().to_owned())
                    .t()
                    .to_owned()
            }
        })
        .collect();
    HostTensor::float(rhs.dtype(), stack(x, rhs.dims()))
}

/// The part of a gradient the triangle `T` owns.
fn own_triangle(t: &mut dyn Tape, g: Var, p: Solve) -> OpResult<Var> {
    let diagonal = match (p.lower, p.unit) {
        (true, false) | (false, false) => 0i64,
        (true, true) => -1,
        (false, true) => 1,
    };
    t.call1(
        if p.lower { "tril" } else { "triu" },
        &[g],
        Attrs::new().with("diagonal", diagonal),
    )
}

/// `gb` solves the transposed system; `g op(T) = -x gbᵀ`-style outer
/// products give `T`'s gradient, restricted to the triangle it reads.
fn solve_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let types = [t.ty(a.inputs[0])?, t.ty(a.inputs[1])?];
    let p = solve_plan(&types, a.attrs)?;
    let (m, x, gx) = (a.inputs[0], a.outputs[0], a.grads[0]);
    let mut back = a.attrs.clone();
    back.set("transpose_a", !p.transpose);
    let gb = t.call1("triangular_solve", &[m, gx], back)?;
    let outer = match (p.left, p.transpose) {
        (true, false) => {
            let xt = transpose_last(t, x)?;
            matmul(t, gb, xt)?
        }
        (true, true) => {
            let gbt = transpose_last(t, gb)?;
            matmul(t, x, gbt)?
        }
        (false, false) => {
            let xt = transpose_last(t, x)?;
            matmul(t, xt, gb)?
        }
        (false, true) => {
            let gbt = transpose_last(t, gb)?;
            matmul(t, gbt, x)?
        }
    };
    let ga = t.neg(outer)?;
    Ok(vec![Some(own_triangle(t, ga, p)?), Some(gb)])
}

/// Well-conditioned triangles: a diagonal of magnitude 2 to 3.
#[cfg(feature = "conformance")]
fn solve_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let n = 1 + g.below(4);
    let k = 1 + g.below(3);
    let batch: Vec<usize> = (0..g.below(3)).map(|_| 1 + g.below(2)).collect();
    let mut attrs = Attrs::new();
    for name in ["left", "lower", "transpose_a", "unit_diagonal"] {
        if g.bool() {
            attrs.set(name, g.bool());
        }
    }
    let left = attrs.bool_or("left", true).unwrap_or(true);
    let a_dims = [batch.clone(), vec![n, n]].concat();
    let b_dims = [batch, if left { vec![n, k] } else { vec![k, n] }].concat();
    let a = g.tensor_in(dtype, &a_dims.as_slice().into(), -0.5, 0.5);
    let values: Vec<f64> = a
        .to_f64()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let diagonal = i % (n * n) % (n + 1) == 0;
            if diagonal {
                (2.0 + v.abs()).copysign(v)
            } else {
                v
            }
        })
        .collect();
    let a = HostTensor::from_f64(dtype, a_dims, values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"));
    let b = g.tensor_in(dtype, &b_dims.as_slice().into(), -2.0, 2.0);
    Sample::new(vec![a, b], attrs)
}

inventory::submit! {
    op_def! {
        name: "triangular_solve",
        arity: Arity::Exactly(2),
        dtypes: FLOATS,
        infer: |x, attrs| {
            solve_plan(x, attrs)?;
            Ok(vec![x[1].clone()])
        },
        lower: |b, x, attrs| {
            let p = solve_plan(&[x[0].ty().clone(), x[1].ty().clone()], attrs)?;
            Ok(vec![lower_solve(b, &x[0], &x[1], p)])
        },
        reference: |x, attrs| {
            let p = solve_plan(&[x[0].ty(), x[1].ty()], attrs)?;
            Ok(vec![solve_ref(&x[0], &x[1], p)])
        },
        vjp: Some(solve_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..12).map(|i| solve_sample(&mut Gen::new(1600 + i))).collect(),
        arbitrary: solve_sample,
        torch: Torch::Expr(r#"torch.linalg.solve_triangular(x[0], x[1], upper=not a.get("lower", True), left=a.get("left", True), unitriangular=a.get("unit_diagonal", False)) if not a.get("transpose_a", False) else torch.linalg.solve_triangular(x[0].mT, x[1], upper=a.get("lower", True), left=a.get("left", True), unitriangular=a.get("unit_diagonal", False))"#),
    }
}

// ---- cholesky ----

fn cholesky_type(x: &[TensorType]) -> OpResult<TensorType> {
    let t = x.first().ok_or("missing input")?;
    let (_, n, m) = matrix(t, "the input")?;
    if n != m {
        return Err(invalid!("needs square matrices, got shape {}", t.shape));
    }
    Ok(t.clone())
}

fn lower_cholesky(b: &mut Builder, x: &Value) -> Value {
    let dtype = x.dtype();
    let a = b.convert(x, accumulator(dtype));
    let r = a.rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let at = b.transpose(&a, &perm);
    let sum = b.binary("stablehlo.add", &a, &at);
    let half = b.constant(a.dtype(), a.dims(), 0.5);
    let sym = b.binary("stablehlo.multiply", &sum, &half);
    let l = b.op1(
        "stablehlo.cholesky",
        &[&sym],
        "lower = true",
        sym.ty().clone(),
    );
    // Keep the lower triangle; NaN out matrices whose diagonal is not positive.
    let n = a.dims()[r - 1];
    let rows = b.iota(DType::I64, &[n, n], 0);
    let cols = b.iota(DType::I64, &[n, n], 1);
    let below = b.compare(Compare::Le, &cols, &rows);
    let below = b.broadcast_in_dim(&below, a.dims(), &[r - 2, r - 1]);
    let zero = b.constant(a.dtype(), a.dims(), 0.0);
    let l = b.select(&below, &l, &zero);
    let diag = b.compare(Compare::Eq, &cols, &rows);
    let diag = b.broadcast_in_dim(&diag, a.dims(), &[r - 2, r - 1]);
    let positive = b.compare(Compare::Gt, &l, &zero);
    let bad = b.unary("stablehlo.not", &positive);
    let bad = b.binary("stablehlo.and", &bad, &diag);
    let any_bad = b.reduce(&bad, 0.0, &[r - 2, r - 1], "stablehlo.or");
    let batch: Vec<usize> = (0..r - 2).collect();
    let any_bad = b.broadcast_in_dim(&any_bad, a.dims(), &batch);
    let nan = b.constant(a.dtype(), a.dims(), f64::NAN);
    let l = b.select(&any_bad, &nan, &l);
    b.convert(&l, dtype)
}

fn cholesky_f64(a: Array2<f64>) -> Array2<f64> {
    let n = a.nrows();
    let s = (&a + &a.t()) * 0.5;
    let mut l = Array2::<f64>::zeros((n, n));
    for j in 0..n {
        let d = s[(j, j)] - (0..j).map(|k| l[(j, k)] * l[(j, k)]).sum::<f64>();
        if d.is_nan() || d <= 0.0 {
            return Array2::from_elem((n, n), f64::NAN);
        }
        l[(j, j)] = d.sqrt();
        for i in j + 1..n {
            l[(i, j)] =
                (s[(i, j)] - (0..j).map(|k| l[(i, k)] * l[(j, k)]).sum::<f64>()) / l[(j, j)];
        }
    }
    l
}

/// With `Φ` the lower triangle with its diagonal halved:
/// `S = L⁻ᵀ Φ(Lᵀ ḡ) L⁻¹`, and the input's gradient is `(S + Sᵀ) / 2`.
fn cholesky_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (l, g) = (a.outputs[0], a.grads[0]);
    let lt = transpose_last(t, l)?;
    let p = matmul(t, lt, g)?;
    let strict = t.call1("tril", &[p], Attrs::new().with("diagonal", -1i64))?;
    let whole = t.call1("tril", &[p], Attrs::new())?;
    let phi = t.add(strict, whole)?;
    let phi = t.scale(phi, 0.5)?;
    // L⁻ᵀ Φ, then (L⁻ᵀ Φ) L⁻¹ as a right solve.
    let left = Attrs::new().with("transpose_a", true);
    let s = t.call1("triangular_solve", &[l, phi], left)?;
    let right = Attrs::new().with("left", false);
    let s = t.call1("triangular_solve", &[l, s], right)?;
    let st = transpose_last(t, s)?;
    let sym = t.add(s, st)?;
    Ok(vec![Some(t.scale(sym, 0.5)?)])
}

/// Symmetric positive-definite matrices `B Bᵀ + n I`, and sometimes one
/// that is not (a negative diagonal entry).
#[cfg(feature = "conformance")]
fn cholesky_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let n = 1 + g.below(4);
    let count: usize = (0..g.below(3)).map(|_| 1 + g.below(2)).product();
    let batch: Vec<usize> = if count > 1 { vec![count] } else { vec![] };
    let indefinite = g.below(6) == 0;
    let mut values = Vec::with_capacity(count * n * n);
    for _ in 0..count {
        let m: Vec<f64> = (0..n * n).map(|_| g.uniform(-1.0, 1.0)).collect();
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|k| m[i * n + k] * m[j * n + k]).sum();
                let shift = if i == j {
                    n as f64 * if indefinite && i == n - 1 { -2.0 } else { 1.0 }
                } else {
                    0.0
                };
                values.push(dot + shift);
            }
        }
    }
    let dims = [batch, vec![n, n]].concat();
    let x = HostTensor::from_f64(dtype, dims, values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"));
    Sample::new(vec![x], Attrs::new())
}

inventory::submit! {
    op_def! {
        name: "cholesky",
        arity: Arity::Exactly(1),
        dtypes: FLOATS,
        infer: |x, _| Ok(vec![cholesky_type(x)?]),
        lower: |b, x, _| Ok(vec![lower_cholesky(b, &x[0])]),
        reference: |x, _| {
            let x = one(x)?;
            let l = matrices(&x.to_f64()).into_iter().map(cholesky_f64).collect();
            Ok(vec![HostTensor::float(x.dtype(), stack(l, x.dims()))])
        },
        vjp: Some(cholesky_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..12).map(|i| cholesky_sample(&mut Gen::new(1700 + i))).collect(),
        arbitrary: cholesky_sample,
        torch: Torch::Expr(r#"torch.linalg.cholesky_ex((x[0] + x[0].mT) / 2)[0].masked_fill(torch.linalg.cholesky_ex((x[0] + x[0].mT) / 2)[1].reshape(x[0].shape[:-2] + (1, 1)) != 0, float("nan"))"#),
    }
}
