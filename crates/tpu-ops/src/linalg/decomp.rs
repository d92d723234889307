//! Orthogonal factorizations over the last two dims (leading dims are a
//! batch), for floats; f16 and bf16 compute in f32. On the device they are
//! XLA's `Qr`, `ProductOfElementaryHouseholderReflectors` and `Eigh`
//! custom calls, which every XLA backend expands (libtpu natively).
//!
//! - `geqrf(a)` gives LAPACK's compact QR: `R` on and above the diagonal,
//!   the Householder vectors below it, and their scales `taus`.
//! - `householder_product(a, taus)` multiplies those reflectors out: the
//!   first `n` columns of `H₀ H₁ … H_{k-1}` for an `m × n` `a`.
//! - `qr(a, mode="reduced"|"complete")` gives `Q` and `R` with `Q R = a`,
//!   with LAPACK's signs (so PyTorch's too).
//! - `eigh(a)` gives the eigenvalues (ascending) and eigenvectors (columns)
//!   of the symmetric matrix whose lower triangle is `a`'s. Each
//!   eigenvector's sign is fixed (the weighted sum of its entries, weights `1 + 1/(i+1)`, is made
//!   non-negative), so every device and
//!   the reference agree.

use ndarray::Array2;
use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::factor::{matrices, matrix, stack};
use super::{accumulator, matmul, transpose_last};
use crate::movement::triangle;
use crate::support::*;

// ---- shared lowering pieces ----

/// `x` with its last two dims `[rows, cols]` cut to the leading block.
fn block(b: &mut Builder, x: &Value, rows: usize, cols: usize) -> Value {
    let r = x.rank();
    let mut limit = x.dims().to_vec();
    limit[r - 2] = rows;
    limit[r - 1] = cols;
    if limit == x.dims() {
        return x.clone();
    }
    b.slice(x, &vec![0; r], &limit, &vec![1; r])
}

/// The first `cols` columns of the `rows × rows` identity, batched.
fn identity(b: &mut Builder, dtype: DType, batch: &[usize], rows: usize, cols: usize) -> Value {
    let dims = [batch, &[rows, cols]].concat();
    let r = dims.len();
    let i = b.iota(DType::I64, &dims, r - 2);
    let j = b.iota(DType::I64, &dims, r - 1);
    let diagonal = b.compare(Compare::Eq, &i, &j);
    let one = b.constant(dtype, dims.as_slice(), 1.0);
    let zero = b.constant(dtype, dims.as_slice(), 0.0);
    b.select(&diagonal, &one, &zero)
}

/// XLA's `Qr` custom call: the packed factorization and the taus.
fn lower_geqrf(b: &mut Builder, a: &Value) -> (Value, Value) {
    let r = a.rank();
    let (m, n) = (a.dims()[r - 2], a.dims()[r - 1]);
    let mut tau_dims = a.dims()[..r - 2].to_vec();
    tau_dims.push(m.min(n));
    let taus = TensorType::new(a.dtype(), tau_dims.as_slice());
    if a.shape().numel() == 0 {
        return (a.clone(), b.constant(a.dtype(), tau_dims.as_slice(), 0.0));
    }
    let mut out = b.op(
        "stablehlo.custom_call",
        &[a],
        &[],
        "call_target_name = \"Qr\", api_version = 1 : i32",
        vec![a.ty().clone(), taus],
    );
    let taus = out.remove(1);
    (out.remove(0), taus)
}

/// XLA's `ProductOfElementaryHouseholderReflectors`: `a` is `m × n` with
/// `m >= n >= k`, `taus` has `k` entries.
fn lower_householder(b: &mut Builder, a: &Value, taus: &Value) -> Value {
    let r = a.rank();
    let (m, n) = (a.dims()[r - 2], a.dims()[r - 1]);
    if a.shape().numel() == 0 || taus.shape().numel() == 0 {
        return identity(b, a.dtype(), &a.dims()[..r - 2], m, n);
    }
    b.op1(
        "stablehlo.custom_call",
        &[a, taus],
        "call_target_name = \"ProductOfElementaryHouseholderReflectors\", api_version = 1 : i32",
        a.ty().clone(),
    )
}

// ---- geqrf / householder_product / qr: plans and references ----

fn geqrf_types(x: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let a = x.first().ok_or("missing input")?;
    let (batch, m, n) = matrix(a, "the input")?;
    let taus = [batch, vec![m.min(n)]].concat();
    Ok(vec![a.clone(), TensorType::new(a.dtype, taus.as_slice())])
}

fn householder_types(x: &[TensorType]) -> OpResult<TensorType> {
    let [a, taus] = x else {
        return Err("takes two inputs: the reflectors and their taus".into());
    };
    let (batch, m, n) = matrix(a, "the reflectors")?;
    let td = taus.shape.dims();
    let k = td.last().copied().unwrap_or(0);
    if td.len() != batch.len() + 1 || td[..batch.len()] != batch[..] || taus.dtype != a.dtype {
        return Err(invalid!(
            "needs taus with the reflectors' batch dims and dtype: got {a} and {taus}"
        ));
    }
    if m < n || n < k {
        return Err(invalid!(
            "needs rows >= columns >= taus: got {a} and {taus} ({m} rows, {n} columns, {k} taus)"
        ));
    }
    Ok(a.clone())
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Reduced,
    Complete,
}

fn qr_mode(attrs: &Attrs) -> OpResult<Mode> {
    match attrs.str_or("mode", "reduced")? {
        "reduced" => Ok(Mode::Reduced),
        "complete" => Ok(Mode::Complete),
        other => Err(invalid!(
            "mode must be \"reduced\" or \"complete\", got {other:?}"
        )),
    }
}

/// `(q, r)` types: `q` is `m × k` (reduced) or `m × m`, `r` is `k × n` or
/// `m × n`, with `k = min(m, n)`.
fn qr_types(x: &[TensorType], attrs: &Attrs) -> OpResult<Vec<TensorType>> {
    let a = x.first().ok_or("missing input")?;
    let (batch, m, n) = matrix(a, "the input")?;
    let k = match qr_mode(attrs)? {
        Mode::Reduced => m.min(n),
        Mode::Complete => m,
    };
    let q = [batch.clone(), vec![m, k]].concat();
    let r = [batch, vec![k, n]].concat();
    Ok(vec![
        TensorType::new(a.dtype, q.as_slice()),
        TensorType::new(a.dtype, r.as_slice()),
    ])
}

fn lower_qr(b: &mut Builder, x: &Value, mode: Mode) -> Vec<Value> {
    let dtype = x.dtype();
    let a = b.convert(x, accumulator(dtype));
    let r = a.rank();
    let (m, n) = (a.dims()[r - 2], a.dims()[r - 1]);
    let k = m.min(n);
    let (packed, taus) = lower_geqrf(b, &a);
    let q_cols = if mode == Mode::Reduced { k } else { m };
    let rows = block(b, &packed, q_cols, n);
    let upper = triangle(b, &rows, true, 0);
    // The reflectors, cut or zero-padded to the columns Q has.
    let reflectors = block(b, &packed, m, k);
    let reflectors = if q_cols > k {
        let zero = b.constant(a.dtype(), [], 0.0);
        let mut high = vec![0; r];
        high[r - 1] = (q_cols - k) as i64;
        b.pad(&reflectors, &zero, &vec![0; r], &high, &vec![0; r])
    } else {
        reflectors
    };
    let q = lower_householder(b, &reflectors, &taus);
    vec![b.convert(&q, dtype), b.convert(&upper, dtype)]
}

/// LAPACK's Householder QR (`geqrf`) of one matrix: the packed factors and
/// the taus. Each reflector is `I - τ v vᵀ` with `v₀ = 1`, chosen so the
/// new diagonal entry is `-sign(α) ‖x‖` (none where the column below the
/// diagonal is already zero).
pub(crate) fn householder_qr(a: &Array2<f64>) -> (Array2<f64>, Vec<f64>) {
    let (m, n) = a.dim();
    let mut r = a.clone();
    let mut taus = vec![0.0; m.min(n)];
    for (j, tau) in taus.iter_mut().enumerate() {
        let alpha = r[(j, j)];
        let below: f64 = (j + 1..m).map(|i| r[(i, j)] * r[(i, j)]).sum();
        if below == 0.0 {
            continue;
        }
        let norm = (alpha * alpha + below).sqrt();
        let beta = if alpha >= 0.0 { -norm } else { norm };
        *tau = (beta - alpha) / beta;
        let scale = 1.0 / (alpha - beta);
        for i in j + 1..m {
            r[(i, j)] *= scale;
        }
        r[(j, j)] = beta;
        for c in j + 1..n {
            let dot = r[(j, c)] + (j + 1..m).map(|i| r[(i, j)] * r[(i, c)]).sum::<f64>();
            r[(j, c)] -= *tau * dot;
            for i in j + 1..m {
                r[(i, c)] -= *tau * dot * r[(i, j)];
            }
        }
    }
    (r, taus)
}

/// The first `a.ncols()` columns of `H₀ … H_{k-1}` (LAPACK's `orgqr`).
fn householder_product(a: &Array2<f64>, taus: &[f64]) -> Array2<f64> {
    let (m, n) = a.dim();
    let mut q = Array2::from_shape_fn((m, n), |(i, j)| if i == j { 1.0 } else { 0.0 });
    for (j, &tau) in taus.iter().enumerate().rev() {
        let v = |i: usize| match i {
            _ if i < j => 0.0,
            _ if i == j => 1.0,
            _ => a[(i, j)],
        };
        for c in 0..n {
            let dot: f64 = (j..m).map(|i| v(i) * q[(i, c)]).sum();
            for i in j..m {
                q[(i, c)] -= tau * dot * v(i);
            }
        }
    }
    q
}

fn qr_ref(x: &HostTensor, mode: Mode) -> Vec<HostTensor> {
    let dims = x.dims();
    let r = dims.len();
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let k = m.min(n);
    let q_cols = if mode == Mode::Reduced { k } else { m };
    let (mut qs, mut rs) = (Vec::new(), Vec::new());
    for a in matrices(&x.to_f64()) {
        let (packed, taus) = householder_qr(&a);
        let reflectors =
            Array2::from_shape_fn(
                (m, q_cols),
                |(i, j)| {
                    if j < k { packed[(i, j)] } else { 0.0 }
                },
            );
        qs.push(householder_product(&reflectors, &taus));
        rs.push(Array2::from_shape_fn((q_cols, n), |(i, j)| {
            if j >= i { packed[(i, j)] } else { 0.0 }
        }));
    }
    let batch = &dims[..r - 2];
    vec![
        HostTensor::float(x.dtype(), stack(qs, &[batch, &[m, q_cols]].concat())),
        HostTensor::float(x.dtype(), stack(rs, &[batch, &[q_cols, n]].concat())),
    ]
}

// ---- qr backward ----

/// `tril(m) + tril(m, -1)ᵀ`: the lower triangle copied onto the upper.
fn copy_lower_up(t: &mut dyn Tape, m: Var) -> OpResult<Var> {
    let lower = t.call1("tril", &[m], Attrs::new())?;
    let strict = t.call1("tril", &[m], Attrs::new().with("diagonal", -1i64))?;
    let strict_t = transpose_last(t, strict)?;
    t.add(lower, strict_t)
}

/// The gradient of `a = q r` for square `r`:
/// `(gq + q copyltu(r grᵀ - gqᵀ q)) r⁻ᵀ`.
fn qr_square_vjp(t: &mut dyn Tape, q: Var, r: Var, gq: Var, gr: Var) -> OpResult<Var> {
    let grt = transpose_last(t, gr)?;
    let rgr = matmul(t, r, grt)?;
    let gqt = transpose_last(t, gq)?;
    let gqq = matmul(t, gqt, q)?;
    let m = t.sub(rgr, gqq)?;
    let m = copy_lower_up(t, m)?;
    let qm = matmul(t, q, m)?;
    let rhs = t.add(gq, qm)?;
    // x rᵀ = rhs: a right solve with r's upper triangle, transposed.
    let attrs = Attrs::new()
        .with("left", false)
        .with("lower", false)
        .with("transpose_a", true);
    t.call1("triangular_solve", &[r, rhs], attrs)
}

fn narrow(t: &mut dyn Tape, x: Var, dim: i64, start: usize, length: usize) -> OpResult<Var> {
    let attrs = Attrs::new()
        .with("dim", dim)
        .with("start", start)
        .with("length", length);
    t.call1("narrow", &[x], attrs)
}

/// Tall or square `a` differentiate through [`qr_square_vjp`] (with `r`
/// `n × n`); a wide `a = [x | y]` splits as `x = q u`, `y = q v`.
fn qr_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let ty = t.ty(a.inputs[0])?;
    let (_, m, n) = matrix(&ty, "the input")?;
    if qr_mode(a.attrs)? == Mode::Complete && m > n {
        return Err(invalid!(
            "the gradient of qr with mode=\"complete\" is not defined for a tall matrix ({ty}): Q's extra columns are not unique"
        ));
    }
    if ty.shape.numel() == 0 {
        return Ok(vec![Some(t.full_like(a.inputs[0], 0.0)?)]);
    }
    let (q, r, gq, gr) = (a.outputs[0], a.outputs[1], a.grads[0], a.grads[1]);
    if m >= n {
        return Ok(vec![Some(qr_square_vjp(t, q, r, gq, gr)?)]);
    }
    let u = narrow(t, r, -1, 0, m)?;
    let gu = narrow(t, gr, -1, 0, m)?;
    let gv = narrow(t, gr, -1, m, n - m)?;
    let y = narrow(t, a.inputs[0], -1, m, n - m)?;
    let gvt = transpose_last(t, gv)?;
    let ygv = matmul(t, y, gvt)?;
    let gq = t.add(gq, ygv)?;
    let gx = qr_square_vjp(t, q, u, gq, gu)?;
    let gy = matmul(t, q, gv)?;
    let g = t.call1("concat", &[gx, gy], Attrs::new().with("dim", -1i64))?;
    Ok(vec![Some(g)])
}

// ---- eigh ----

/// The weight of row `i` in the sum whose sign fixes an eigenvector's:
/// `1 + 1/(i+1)`, decreasing so that no symmetric pattern cancels it.
fn sign_weight(i: usize) -> f64 {
    1.0 + 1.0 / (i as f64 + 1.0)
}

fn eigh_types(x: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let a = x.first().ok_or("missing input")?;
    let (batch, m, n) = matrix(a, "the input")?;
    if m != n {
        return Err(invalid!("needs square matrices, got shape {}", a.shape));
    }
    let w = [batch, vec![n]].concat();
    Ok(vec![TensorType::new(a.dtype, w.as_slice()), a.clone()])
}

/// Machine epsilon of the dtype the device computes in.
fn epsilon(d: DType) -> f64 {
    if d == DType::F64 {
        f64::EPSILON
    } else {
        f64::from(f32::EPSILON)
    }
}

fn lower_eigh(b: &mut Builder, x: &Value) -> Vec<Value> {
    let dtype = x.dtype();
    let a = b.convert(x, accumulator(dtype));
    let r = a.rank();
    let n = a.dims()[r - 1];
    let w_dims = &a.dims()[..r - 1];
    if a.shape().numel() == 0 {
        let w = b.constant(dtype, w_dims, 0.0);
        return vec![w, x.clone()];
    }
    let w_ty = TensorType::new(a.dtype(), w_dims);
    // lower, sorted ascending, at most 100 Jacobi sweeps, converged when
    // the off-diagonal norm is below epsilon times the whole norm.
    let config = format!("1,1,100,{:e}", epsilon(a.dtype()));
    let mut out = b.op(
        "stablehlo.custom_call",
        &[&a],
        &[],
        &format!(
            "call_target_name = \"Eigh\", backend_config = \"{config}\", api_version = 1 : i32"
        ),
        vec![a.ty().clone(), w_ty],
    );
    let (w, v) = (out.remove(1), out.remove(0));
    // Flip each column whose weighted sum is negative.
    let rows = b.iota(a.dtype(), &[n], 0);
    let one = b.constant(a.dtype(), [n], 1.0);
    let shifted = b.binary("stablehlo.add", &rows, &one);
    let inverse = b.binary("stablehlo.divide", &one, &shifted);
    let weights = b.binary("stablehlo.add", &inverse, &one);
    let weights = b.broadcast_in_dim(&weights, a.dims(), &[r - 2]);
    let weighted = b.binary("stablehlo.multiply", &v, &weights);
    let sums = b.reduce(&weighted, 0.0, &[r - 2], "stablehlo.add");
    let zero = b.constant(a.dtype(), w_dims, 0.0);
    let negative = b.compare(Compare::Lt, &sums, &zero);
    let minus = b.constant(a.dtype(), w_dims, -1.0);
    let plus = b.constant(a.dtype(), w_dims, 1.0);
    let signs = b.select(&negative, &minus, &plus);
    let batch: Vec<usize> = (0..r - 2).chain([r - 1]).collect();
    let signs = b.broadcast_in_dim(&signs, a.dims(), &batch);
    let v = b.binary("stablehlo.multiply", &v, &signs);
    vec![b.convert(&w, dtype), b.convert(&v, dtype)]
}

/// Cyclic Jacobi on the symmetric matrix `a`'s lower triangle gives: the
/// eigenvalues ascending and the eigenvectors as columns, signs fixed.
fn jacobi_eigh(a: &Array2<f64>) -> (Vec<f64>, Array2<f64>) {
    let n = a.nrows();
    let mut s = Array2::from_shape_fn((n, n), |(i, j)| a[(i.max(j), i.min(j))]);
    let mut v = Array2::from_shape_fn((n, n), |(i, j)| if i == j { 1.0 } else { 0.0 });
    let total: f64 = s.iter().map(|x| x * x).sum();
    for _ in 0..100 {
        let off: f64 = s
            .indexed_iter()
            .filter(|((i, j), _)| i != j)
            .map(|(_, x)| x * x)
            .sum();
        // Converged (or NaN, which no sweep mends).
        if off <= total * 1e-32 || off.is_nan() {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if s[(p, q)] == 0.0 {
                    continue;
                }
                let theta = (s[(q, q)] - s[(p, p)]) / (2.0 * s[(p, q)]);
                let t = theta.signum() / (theta.abs() + theta.hypot(1.0));
                let c = 1.0 / t.hypot(1.0);
                let sn = t * c;
                let rotate = |m: &mut Array2<f64>, cols: bool| {
                    for k in 0..n {
                        let (x, y) = if cols {
                            ((k, p), (k, q))
                        } else {
                            ((p, k), (q, k))
                        };
                        let (mx, my) = (m[x], m[y]);
                        m[x] = c * mx - sn * my;
                        m[y] = sn * mx + c * my;
                    }
                };
                rotate(&mut s, true);
                rotate(&mut s, false);
                rotate(&mut v, true);
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| s[(i, i)].total_cmp(&s[(j, j)]));
    let w = order.iter().map(|&i| s[(i, i)]).collect();
    let mut vectors = Array2::zeros((n, n));
    for (col, &src) in order.iter().enumerate() {
        let sum: f64 = (0..n).map(|i| v[(i, src)] * sign_weight(i)).sum();
        let sign = if sum < 0.0 { -1.0 } else { 1.0 };
        for i in 0..n {
            vectors[(i, col)] = sign * v[(i, src)];
        }
    }
    (w, vectors)
}

fn eigh_ref(x: &HostTensor) -> Vec<HostTensor> {
    let dims = x.dims();
    let r = dims.len();
    let (mut ws, mut vs) = (Vec::new(), Vec::new());
    for a in matrices(&x.to_f64()) {
        let (w, v) = jacobi_eigh(&a);
        ws.extend(w);
        vs.push(v);
    }
    let w = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&dims[..r - 1]), ws)
        .unwrap_or_else(|_| unreachable!("n eigenvalues per matrix"));
    vec![
        HostTensor::float(x.dtype(), w),
        HostTensor::float(x.dtype(), stack(vs, dims)),
    ]
}

/// `G = V (diag(gw) + F ∘ (Vᵀ gV)) Vᵀ` with `F_ij = 1 / (w_j - w_i)` off
/// the diagonal; the input's gradient is `G` folded onto the lower
/// triangle, the only one the op reads.
fn eigh_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (w, v, gw, gv) = (a.outputs[0], a.outputs[1], a.grads[0], a.grads[1]);
    let ty = t.ty(v)?;
    let n = ty.shape.dims().last().copied().unwrap_or(0);
    let row = t.call1("unsqueeze", &[w], Attrs::new().with("dim", -2i64))?;
    let col = t.call1("unsqueeze", &[w], Attrs::new().with("dim", -1i64))?;
    let gaps = t.sub(row, col)?;
    let eye = t.call1(
        "eye",
        &[],
        Attrs::new().with("n", n).with("dtype", ty.dtype),
    )?;
    let ones = t.full_like(gaps, 1.0)?;
    let eye_like = t.broadcast_to(eye, &ty.shape)?;
    let off = t.sub(ones, eye_like)?;
    // 1 / gap off the diagonal, 0 on it (the diagonal gap, 0, becomes 1 first).
    let safe = t.add(gaps, eye_like)?;
    let f = t.div(off, safe)?;
    let vt = transpose_last(t, v)?;
    let vgv = matmul(t, vt, gv)?;
    let inner = t.mul(f, vgv)?;
    let gw_row = t.call1("unsqueeze", &[gw], Attrs::new().with("dim", -2i64))?;
    let diag = t.mul(gw_row, eye_like)?;
    let inner = t.add(inner, diag)?;
    let left = matmul(t, v, inner)?;
    let g = matmul(t, left, vt)?;
    let lower = t.call1("tril", &[g], Attrs::new())?;
    let gt = transpose_last(t, g)?;
    let upper = t.call1("tril", &[gt], Attrs::new().with("diagonal", -1i64))?;
    Ok(vec![Some(t.add(lower, upper)?)])
}

// ---- samples ----

/// Dims of a small batch: none, or one or two dims of 1 or 2.
#[cfg(feature = "conformance")]
fn batch(g: &mut Gen) -> Vec<usize> {
    (0..g.below(3)).map(|_| 1 + g.below(2)).collect()
}

#[cfg(feature = "conformance")]
fn float_tensor(dtype: DType, dims: Vec<usize>, values: Vec<f64>) -> HostTensor {
    HostTensor::from_f64(dtype, dims, values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"))
}

/// Random `m × n` matrices (full rank with probability one). "complete"
/// only where it has a gradient (`m <= n`); `tests.rs` checks tall ones.
#[cfg(feature = "conformance")]
fn qr_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let (m, n) = (1 + g.below(4), 1 + g.below(4));
    let dims = [batch(g), vec![m, n]].concat();
    let a = g.tensor_in(dtype, &dims.as_slice().into(), -2.0, 2.0);
    let mut attrs = Attrs::new();
    if g.bool() {
        let complete = m <= n && g.bool();
        attrs.set("mode", if complete { "complete" } else { "reduced" });
    }
    Sample::new(vec![a], attrs)
}

/// Symmetric matrices `Q diag(λ) Qᵀ` with eigenvalues at least 0.75
/// apart, so the eigenvectors are well defined in every dtype; the upper
/// triangle holds noise the op must not read.
#[cfg(feature = "conformance")]
fn eigh_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let n = 1 + g.below(4);
    let batch = batch(g);
    let count: usize = batch.iter().product();
    let mut values = Vec::with_capacity(count * n * n);
    for _ in 0..count {
        let basis = Array2::from_shape_fn((n, n), |_| g.uniform(-1.0, 1.0));
        let (packed, taus) = householder_qr(&basis);
        let q = householder_product(&packed, &taus);
        let mut lambda = g.uniform(-2.0, 0.0);
        let mut spectrum = Vec::with_capacity(n);
        for _ in 0..n {
            spectrum.push(lambda);
            lambda += g.uniform(0.75, 1.5);
        }
        for i in 0..n {
            for j in 0..n {
                let s: f64 = (0..n).map(|k| q[(i, k)] * spectrum[k] * q[(j, k)]).sum();
                values.push(if j > i { g.uniform(-5.0, 5.0) } else { s });
            }
        }
    }
    let dims = [batch, vec![n, n]].concat();
    Sample::new(vec![float_tensor(dtype, dims, values)], Attrs::new())
}

#[cfg(feature = "conformance")]
fn geqrf_sample(g: &mut Gen) -> Sample {
    let mut s = qr_sample(g);
    s.attrs = Attrs::new();
    s
}

/// The packed reflectors and taus of a random tall matrix, sometimes with
/// fewer taus than columns.
#[cfg(feature = "conformance")]
fn householder_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let n = 1 + g.below(3);
    let m = n + g.below(3);
    let k = n - g.below(n);
    let batch = batch(g);
    let count: usize = batch.iter().product();
    let (mut a, mut taus) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let basis = Array2::from_shape_fn((m, n), |_| g.uniform(-2.0, 2.0));
        let (packed, t) = householder_qr(&basis);
        a.extend(packed.iter().copied());
        taus.extend(&t[..k]);
    }
    let a = float_tensor(dtype, [batch.clone(), vec![m, n]].concat(), a);
    let taus = float_tensor(dtype, [batch, vec![k]].concat(), taus);
    Sample::new(vec![a, taus], Attrs::new())
}

fn tolerance(d: DType) -> Tolerance {
    Tolerance::for_dtype(d).scaled(10.0)
}

/// XLA's Jacobi sweeps stop at about 1e-10 in f64, which can leave an
/// eigenvector's entries 1.5e-8 off even with eigenvalues 0.75 apart (the
/// sample of seed 7214770041336859243).
fn eigh_tolerance(d: DType) -> Tolerance {
    match d {
        DType::F64 => Tolerance::new(1e-7, 1e-7),
        _ => tolerance(d),
    }
}

inventory::submit! {
    op_def! {
        name: "geqrf",
        arity: Arity::Exactly(1),
        flags: Flags::NOT_DIFFERENTIABLE,
        dtypes: FLOATS,
        infer: |x, _| geqrf_types(x),
        lower: |b, x, _| {
            let dtype = x[0].dtype();
            let a = b.convert(&x[0], accumulator(dtype));
            let (packed, taus) = lower_geqrf(b, &a);
            Ok(vec![b.convert(&packed, dtype), b.convert(&taus, dtype)])
        },
        reference: |x, _| {
            let x = one(x)?;
            let dims = x.dims();
            let r = dims.len();
            let (mut packed, mut taus) = (Vec::new(), Vec::new());
            for a in matrices(&x.to_f64()) {
                let (p, t) = householder_qr(&a);
                packed.push(p);
                taus.extend(t);
            }
            let tau_dims = [&dims[..r - 2], &[dims[r - 2].min(dims[r - 1])]].concat();
            Ok(vec![
                HostTensor::float(x.dtype(), stack(packed, dims)),
                tensor_f64(x.dtype(), &tau_dims, taus)?,
            ])
        },
        tolerance,
        samples: || (0..12).map(|i| geqrf_sample(&mut Gen::new(1800 + i))).collect(),
        arbitrary: geqrf_sample,
        torch: Torch::Expr("torch.geqrf(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "householder_product",
        arity: Arity::Exactly(2),
        flags: Flags::NOT_DIFFERENTIABLE,
        dtypes: FLOATS,
        infer: |x, _| Ok(vec![householder_types(x)?]),
        lower: |b, x, _| {
            let dtype = x[0].dtype();
            let a = b.convert(&x[0], accumulator(dtype));
            let taus = b.convert(&x[1], accumulator(dtype));
            let q = lower_householder(b, &a, &taus);
            Ok(vec![b.convert(&q, dtype)])
        },
        reference: |x, _| {
            householder_types(&[x[0].ty(), x[1].ty()])?;
            let k = x[1].dims().last().copied().unwrap_or(0);
            let taus = x[1].to_f64();
            let taus: Vec<f64> = taus.iter().copied().collect();
            let q = matrices(&x[0].to_f64())
                .iter()
                .enumerate()
                .map(|(i, a)| householder_product(a, &taus[i * k..(i + 1) * k]))
                .collect();
            Ok(vec![HostTensor::float(x[0].dtype(), stack(q, x[0].dims()))])
        },
        tolerance,
        samples: || (0..12).map(|i| householder_sample(&mut Gen::new(1850 + i))).collect(),
        arbitrary: householder_sample,
        torch: Torch::Expr("torch.linalg.householder_product(x[0], x[1])"),
    }
}

inventory::submit! {
    op_def! {
        name: "qr",
        arity: Arity::Exactly(1),
        dtypes: FLOATS,
        infer: qr_types,
        lower: |b, x, attrs| Ok(lower_qr(b, &x[0], qr_mode(attrs)?)),
        reference: |x, attrs| {
            let x = one(x)?;
            matrix(&x.ty(), "the input")?;
            Ok(qr_ref(x, qr_mode(attrs)?))
        },
        vjp: Some(qr_vjp),
        tolerance,
        samples: || (0..12).map(|i| qr_sample(&mut Gen::new(1900 + i))).collect(),
        arbitrary: qr_sample,
        torch: Torch::Expr(r#"torch.linalg.qr(x[0], mode=a.get("mode", "reduced"))"#),
    }
}

inventory::submit! {
    op_def! {
        name: "eigh",
        arity: Arity::Exactly(1),
        dtypes: FLOATS,
        infer: |x, _| eigh_types(x),
        lower: |b, x, _| Ok(lower_eigh(b, &x[0])),
        reference: |x, _| {
            let x = one(x)?;
            eigh_types(&[x.ty()])?;
            Ok(eigh_ref(x))
        },
        vjp: Some(eigh_vjp),
        tolerance: eigh_tolerance,
        samples: || (0..12).map(|i| eigh_sample(&mut Gen::new(1950 + i))).collect(),
        arbitrary: eigh_sample,
        torch: Torch::Expr(r#"(lambda w, v: (w, v * torch.where((v * (1 + 1 / torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)).unsqueeze(-1)).sum(-2, keepdim=True) < 0, -1.0, 1.0).to(v.dtype)))(*torch.linalg.eigh(x[0].tril() + x[0].tril(-1).mT))"#),
    }
}
