//! LU factorization with partial pivoting, as LAPACK's `getrf` computes it,
//! over the last two dims (leading dims are a batch); floats, f16 and bf16
//! in f32.
//!
//! - `lu_factor(a)` gives the packed factors (`U` on and above the
//!   diagonal, `L`'s multipliers below it, its unit diagonal implied) and
//!   the 1-based `i32` pivots: step `i` swapped rows `i` and `pivots[i] - 1`.
//!   Each step picks the first row of largest magnitude; a column with no
//!   nonzero candidate is left as it is, as LAPACK does.
//! - `lu_pivots_to_permutation(pivots, rows)` replays those swaps on
//!   `0..rows`: row `i` of `P A = L U` is row `perm[i]` of `a`.
//!
//! On the device each is one `stablehlo.while` over the steps, a step
//! masking whole matrices with iotas, so every batch entry pivots on its
//! own and the program's size does not grow with the matrix.

use ndarray::{Array2, ArrayD, IxDyn};
use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::accumulator;
use super::factor::{matrices, matrix, stack};
use crate::support::*;

/// `dims`-shaped booleans: `iota(dim) <dir> i` for the scalar `i`.
fn mask(b: &mut Builder, dims: &[usize], dim: usize, dir: Compare, i: &Value) -> Value {
    let iota = b.iota(DType::I64, dims, dim);
    let i = b.broadcast_in_dim(i, dims, &[]);
    b.compare(dir, &iota, &i)
}

/// The sum of `x` where `keep` holds, over `dim`.
fn pick(b: &mut Builder, x: &Value, keep: &Value, dim: usize) -> Value {
    let zero = b.constant(x.dtype(), x.shape().clone(), 0.0);
    let kept = b.select(keep, x, &zero);
    b.reduce(&kept, 0.0, &[dim], "stablehlo.add")
}

/// `x` (dims `dims` less `dim`) broadcast back along `dim`.
fn spread(b: &mut Builder, x: &Value, dims: &[usize], dim: usize) -> Value {
    let keep: Vec<usize> = (0..dims.len()).filter(|&d| d != dim).collect();
    b.broadcast_in_dim(x, dims, &keep)
}

/// One elimination step `k` of LU with partial pivoting on `a`
/// (`[batch.., m, n]`), recording the pivot in `pivots`.
fn lu_step(b: &mut Builder, k: &Value, a: &Value, pivots: &Value) -> Vec<Value> {
    let dims = a.dims().to_vec();
    let r = dims.len();
    let (rows, cols) = (r - 2, r - 1);
    let m = dims[rows];
    // The pivot: the first row >= k of largest magnitude in column k.
    let in_col = mask(b, &dims, cols, Compare::Eq, k);
    let col = pick(b, a, &in_col, cols);
    let col_dims = col.dims().to_vec();
    let candidate = mask(b, &col_dims, rows, Compare::Ge, k);
    let magnitude = b.unary("stablehlo.abs", &col);
    let none = b.constant(col.dtype(), col_dims.as_slice(), -1.0);
    let magnitude = b.select(&candidate, &magnitude, &none);
    let largest = b.reduce(&magnitude, f64::NEG_INFINITY, &[rows], "stablehlo.maximum");
    let largest = spread(b, &largest, &col_dims, rows);
    let is_largest = b.compare(Compare::Eq, &magnitude, &largest);
    let row_ids = b.iota(DType::I64, &col_dims, rows);
    let past_end = b.int_constant(DType::I64, col_dims.as_slice(), m as i64);
    let ids = b.select(&is_largest, &row_ids, &past_end);
    let p = b.reduce(&ids, m as f64, &[rows], "stablehlo.minimum");
    // Swap rows k and p.
    let at_k = mask(b, &dims, rows, Compare::Eq, k);
    let p_rows = spread_rows(b, &p, &dims);
    let p_full = spread(b, &p_rows, &dims, cols);
    let row_ids_full = b.iota(DType::I64, &dims, rows);
    let at_p = b.compare(Compare::Eq, &row_ids_full, &p_full);
    let row_k = pick(b, a, &at_k, rows);
    let row_p = pick(b, a, &at_p, rows);
    let row_k_full = spread(b, &row_k, &dims, rows);
    let row_p_full = spread(b, &row_p, &dims, rows);
    let swapped = b.select(&at_p, &row_k_full, a);
    let a = b.select(&at_k, &row_p_full, &swapped);
    // Multipliers below the pivot (none where the pivot is zero), stored
    // in column k; the trailing block takes the rank-one update.
    let at_col_k = mask(b, row_p.dims(), rows, Compare::Eq, k);
    let pivot = pick(b, &row_p, &at_col_k, rows);
    let col = pick(b, &a, &in_col, cols);
    let pivot = spread(b, &pivot, &col_dims, rows);
    let quotient = b.binary("stablehlo.divide", &col, &pivot);
    let zero = b.constant(col.dtype(), col_dims.as_slice(), 0.0);
    let nonzero = b.compare(Compare::Ne, &pivot, &zero);
    let below = mask(b, &col_dims, rows, Compare::Gt, k);
    let use_it = b.binary("stablehlo.and", &below, &nonzero);
    let l = b.select(&use_it, &quotient, &zero);
    let l_full = spread(b, &l, &dims, cols);
    let update = b.binary("stablehlo.multiply", &l_full, &row_p_full);
    let right = mask(b, &dims, cols, Compare::Gt, k);
    let zeros = b.constant(a.dtype(), dims.as_slice(), 0.0);
    let update = b.select(&right, &update, &zeros);
    let a = b.binary("stablehlo.subtract", &a, &update);
    let below_full = spread(b, &below, &dims, cols);
    let store = b.binary("stablehlo.and", &in_col, &below_full);
    let a = b.select(&store, &l_full, &a);
    // pivots[k] = p + 1.
    let piv_dims = pivots.dims().to_vec();
    let at = mask(b, &piv_dims, piv_dims.len() - 1, Compare::Eq, k);
    let one = b.int_constant(DType::I64, p.shape().clone(), 1);
    let p1 = b.binary("stablehlo.add", &p, &one);
    let p1 = b.convert(&p1, DType::I32);
    let p1 = spread(b, &p1, &piv_dims, piv_dims.len() - 1);
    let pivots = b.select(&at, &p1, pivots);
    vec![a, pivots]
}

/// `p` (`[batch..]`) broadcast to `dims` less the last dim.
fn spread_rows(b: &mut Builder, p: &Value, dims: &[usize]) -> Value {
    let r = dims.len();
    spread(b, p, &dims[..r - 1], r - 2)
}

fn lu_types(x: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let a = x.first().ok_or("missing input")?;
    let (batch, m, n) = matrix(a, "the input")?;
    let pivots = [batch, vec![m.min(n)]].concat();
    Ok(vec![
        a.clone(),
        TensorType::new(DType::I32, pivots.as_slice()),
    ])
}

fn lower_lu(b: &mut Builder, x: &Value) -> Vec<Value> {
    let dtype = x.dtype();
    let a = b.convert(x, accumulator(dtype));
    let r = a.rank();
    let k = a.dims()[r - 2].min(a.dims()[r - 1]);
    let piv_dims = [&a.dims()[..r - 2], &[k]].concat();
    let pivots = b.int_constant(DType::I32, piv_dims.as_slice(), 0);
    if a.shape().numel() == 0 {
        return vec![x.clone(), pivots];
    }
    let steps = b.int_constant(DType::I64, [], k as i64);
    let out = b.fori_loop(0, &steps, &[&a, &pivots], |b, i, v| {
        lu_step(b, i, &v[0], &v[1])
    });
    vec![b.convert(&out[0], dtype), out[1].clone()]
}

/// `getrf` on one matrix: the packed factors and 1-based pivots.
fn lu_f64(mut a: Array2<f64>) -> (Array2<f64>, Vec<i64>) {
    let (m, n) = a.dim();
    let mut pivots = Vec::with_capacity(m.min(n));
    for k in 0..m.min(n) {
        let mut p = k;
        for i in k + 1..m {
            if a[(i, k)].abs() > a[(p, k)].abs() {
                p = i;
            }
        }
        pivots.push(p as i64 + 1);
        for j in 0..n {
            a.swap((k, j), (p, j));
        }
        let pivot = a[(k, k)];
        if pivot == 0.0 {
            continue;
        }
        for i in k + 1..m {
            let l = a[(i, k)] / pivot;
            a[(i, k)] = l;
            for j in k + 1..n {
                a[(i, j)] -= l * a[(k, j)];
            }
        }
    }
    (a, pivots)
}

fn lu_ref(x: &HostTensor) -> OpResult<Vec<HostTensor>> {
    let dims = x.dims();
    let r = dims.len();
    let (mut lus, mut pivots) = (Vec::new(), Vec::new());
    for a in matrices(&x.to_f64()) {
        let (lu, p) = lu_f64(a);
        lus.push(lu);
        pivots.extend(p);
    }
    let piv_dims = [&dims[..r - 2], &[dims[r - 2].min(dims[r - 1])]].concat();
    let pivots =
        ArrayD::from_shape_vec(IxDyn(&piv_dims), pivots).map_err(|e| format!("pivots: {e}"))?;
    Ok(vec![
        HostTensor::float(x.dtype(), stack(lus, dims)),
        HostTensor::int(DType::I32, pivots),
    ])
}

// ---- lu_pivots_to_permutation ----

fn permutation_type(x: &[TensorType], attrs: &Attrs) -> OpResult<TensorType> {
    let p = x.first().ok_or("missing input")?;
    require_index_dtype(p.dtype, &[DType::I32], "the pivots")?;
    let d = p.shape.dims();
    let k = *d.last().ok_or("the pivots need at least 1 dimension")?;
    let rows = attrs.int("rows")?;
    if rows < k as i64 {
        return Err(invalid!(
            "needs rows >= the pivots' length {k}, got rows = {rows}"
        ));
    }
    let dims = [&d[..d.len() - 1], &[rows as usize]].concat();
    Ok(TensorType::new(DType::I64, dims.as_slice()))
}

fn lower_permutation(b: &mut Builder, pivots: &Value, out: &TensorType) -> Value {
    let dims = out.shape.dims().to_vec();
    let last = dims.len() - 1;
    let perm = b.iota(DType::I64, &dims, last);
    let k = pivots.dims()[last];
    if out.shape.numel() == 0 || k == 0 {
        return perm;
    }
    let pivots = b.convert(pivots, DType::I64);
    let steps = b.int_constant(DType::I64, [], k as i64);
    let out = b.fori_loop(0, &steps, &[&perm, &pivots], |b, i, v| {
        let (perm, pivots) = (&v[0], &v[1]);
        // Swap perm[i] and perm[pivots[i] - 1] (pivots out of range swap nothing).
        let at_i = mask(b, pivots.dims(), last, Compare::Eq, i);
        let zero = b.int_constant(DType::I64, pivots.shape().clone(), 0);
        let target = b.select(&at_i, pivots, &zero);
        let target = b.reduce(&target, 0.0, &[last], "stablehlo.add");
        let one = b.int_constant(DType::I64, target.shape().clone(), 1);
        let target = b.binary("stablehlo.subtract", &target, &one);
        let target = spread(b, &target, &dims, last);
        let ids = b.iota(DType::I64, &dims, last);
        let at_t = b.compare(Compare::Eq, &ids, &target);
        let at_i = mask(b, &dims, last, Compare::Eq, i);
        let zeros = b.int_constant(DType::I64, dims.as_slice(), 0);
        let vi = b.select(&at_i, perm, &zeros);
        let vi = b.reduce(&vi, 0.0, &[last], "stablehlo.add");
        let vt = b.select(&at_t, perm, &zeros);
        let vt = b.reduce(&vt, 0.0, &[last], "stablehlo.add");
        let any_t = b.convert(&at_t, DType::I64);
        let any_t = b.reduce(&any_t, 0.0, &[last], "stablehlo.add");
        let none = b.int_constant(DType::I64, any_t.shape().clone(), 0);
        let valid = b.compare(Compare::Ne, &any_t, &none);
        let vt = b.select(&valid, &vt, &vi);
        let vi = spread(b, &vi, &dims, last);
        let vt = spread(b, &vt, &dims, last);
        let swapped = b.select(&at_t, &vi, perm);
        let valid = spread(b, &valid, &dims, last);
        let at_i = b.binary("stablehlo.and", &at_i, &valid);
        vec![b.select(&at_i, &vt, &swapped), pivots.clone()]
    });
    out[0].clone()
}

fn permutation_ref(pivots: &HostTensor, out: &TensorType) -> OpResult<HostTensor> {
    let dims = out.shape.dims();
    let rows = dims[dims.len() - 1];
    let p = pivots.to_i64();
    let k = pivots.dims().last().copied().unwrap_or(0);
    let p: Vec<i64> = p.iter().copied().collect();
    let count = out.shape.numel().checked_div(rows).unwrap_or(0);
    let mut values = Vec::with_capacity(count * rows);
    for batch in 0..count {
        let mut perm: Vec<i64> = (0..rows as i64).collect();
        for i in 0..k {
            let t = p[batch * k + i] - 1;
            if (0..rows as i64).contains(&t) {
                perm.swap(i, t as usize);
            }
        }
        values.extend(perm);
    }
    let values = ArrayD::from_shape_vec(IxDyn(dims), values).map_err(|e| e.to_string())?;
    Ok(HostTensor::int(DType::I64, values))
}

// ---- samples ----

/// Random matrices, sometimes with an all-zero column (a zero pivot).
#[cfg(feature = "conformance")]
fn lu_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let (m, n) = (1 + g.below(4), 1 + g.below(4));
    let batch: Vec<usize> = (0..g.below(3)).map(|_| 1 + g.below(2)).collect();
    let dims = [batch, vec![m, n]].concat();
    let mut a = g.tensor_in(dtype, &dims.as_slice().into(), -2.0, 2.0);
    if g.below(4) == 0 {
        let zero_col = g.below(n);
        let values: Vec<f64> = a
            .to_f64()
            .iter()
            .enumerate()
            .map(|(i, &v)| if i % n == zero_col { 0.0 } else { v })
            .collect();
        a = HostTensor::from_f64(dtype, dims, values)
            .unwrap_or_else(|| unreachable!("value count matches the shape"));
    }
    Sample::new(vec![a], Attrs::new())
}

/// LAPACK-style pivots (`pivots[i] - 1 >= i`) for a few rows.
#[cfg(feature = "conformance")]
fn permutation_sample(g: &mut Gen) -> Sample {
    let rows = 1 + g.below(5);
    let k = 1 + g.below(rows);
    let batch: Vec<usize> = (0..g.below(3)).map(|_| 1 + g.below(2)).collect();
    let count: usize = batch.iter().product();
    let values: Vec<i64> = (0..count * k)
        .map(|j| (j % k + g.below(rows - j % k)) as i64 + 1)
        .collect();
    let dims = [batch, vec![k]].concat();
    let pivots = HostTensor::from_i64(DType::I32, dims, values)
        .unwrap_or_else(|| unreachable!("value count matches the shape"));
    Sample::new(vec![pivots], Attrs::new().with("rows", rows))
}

inventory::submit! {
    op_def! {
        name: "lu_factor",
        arity: Arity::Exactly(1),
        flags: Flags::NOT_DIFFERENTIABLE,
        dtypes: FLOATS,
        infer: |x, _| lu_types(x),
        lower: |b, x, _| Ok(lower_lu(b, &x[0])),
        reference: |x, _| {
            let x = one(x)?;
            lu_types(&[x.ty()])?;
            lu_ref(x)
        },
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..12).map(|i| lu_sample(&mut Gen::new(2000 + i))).collect(),
        arbitrary: lu_sample,
        torch: Torch::Expr("torch.linalg.lu_factor_ex(x[0])[:2]"),
    }
}

inventory::submit! {
    op_def! {
        name: "lu_pivots_to_permutation",
        arity: Arity::Exactly(1),
        dtypes: &[DType::I32],
        infer: |x, attrs| Ok(vec![permutation_type(x, attrs)?]),
        lower: |b, x, attrs| {
            let out = permutation_type(&[x[0].ty().clone()], attrs)?;
            Ok(vec![lower_permutation(b, &x[0], &out)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let out = permutation_type(&[x.ty()], attrs)?;
            Ok(vec![permutation_ref(x, &out)?])
        },
        tolerance: |_| Tolerance::EXACT,
        samples: || (0..12).map(|i| permutation_sample(&mut Gen::new(2050 + i))).collect(),
        arbitrary: permutation_sample,
        torch: Torch::Expr(r#"torch.lu_unpack(torch.zeros(x[0].shape[:-1] + (a["rows"], x[0].shape[-1]), dtype=torch.float64), x[0], unpack_data=False)[0].mT.argmax(-1)"#),
    }
}
