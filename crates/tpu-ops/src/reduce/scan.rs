//! Scans along one dim besides `cumsum`: `cummax` / `cummin` (values and
//! the i64 index of the last extreme so far, NaN counting as the extreme,
//! as in PyTorch) and `logcumsumexp` (floats; f16 and bf16 accumulate in
//! f32). All lower to [`prefix_scan`].

use ndarray::ArrayD;
use tpu_core::DType;
use tpu_core::host::{HostData, HostTensor, Tolerance};
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::kit::*;
use crate::support::*;

/// Inclusive scan of `x` along `dim` with an associative `combine(later,
/// earlier)` whose identity is `identity`: log-step shift-and-combine,
/// O(n log n) work in log n steps.
pub(crate) fn prefix_scan(
    b: &mut Builder,
    x: &Value,
    dim: usize,
    identity: f64,
    combine: impl Fn(&mut Builder, &Value, &Value) -> Value,
) -> Value {
    if x.rank() == 0 {
        return x.clone();
    }
    let n = x.dims()[dim];
    let fill = b.constant(x.dtype(), [], identity);
    let zeros = vec![0i64; x.rank()];
    let mut y = x.clone();
    let mut k = 1;
    while k < n {
        let mut limit = x.dims().to_vec();
        limit[dim] = n - k;
        let head = b.slice(&y, &vec![0; x.rank()], &limit, &vec![1; x.rank()]);
        let mut low = zeros.clone();
        low[dim] = k as i64;
        let shifted = b.pad(&head, &fill, &low, &zeros, &zeros);
        y = combine(b, &y, &shifted);
        k *= 2;
    }
    y
}

fn scan_dim(rank: usize, attrs: &Attrs) -> OpResult<usize> {
    normalize_dim_scalar_ok(attrs.int("dim")?, rank)
}

// ---- cummax / cummin ----

fn lower_cumextreme(b: &mut Builder, x: &Value, dim: usize, largest: bool) -> Vec<Value> {
    let (identity, op) = match (x.dtype(), largest) {
        (DType::Bool, true) => (0.0, "or"),
        (DType::Bool, false) => (1.0, "and"),
        (d, true) => (lowest(d), "maximum"),
        (d, false) => (highest(d), "minimum"),
    };
    if x.rank() == 0 {
        return vec![x.clone(), b.constant(DType::I64, [], 0.0)];
    }
    let values = prefix_scan(b, x, dim, identity, |b, y, s| {
        let r = bin(b, op, y, s);
        if y.dtype().is_float() {
            nan_first(b, y, s, &r)
        } else {
            r
        }
    });
    // The last position so far whose value is the running extreme (or NaN):
    // a running max of those positions.
    let mut hit = b.compare(Compare::Eq, x, &values);
    if x.dtype().is_float() {
        let nan = b.compare(Compare::Ne, x, x);
        hit = bin(b, "or", &hit, &nan);
    }
    let positions = b.iota(DType::I64, x.dims(), dim);
    let zero = b.constant(DType::I64, x.dims(), 0.0);
    let candidates = b.select(&hit, &positions, &zero);
    let indices = prefix_scan(b, &candidates, dim, 0.0, |b, y, s| bin(b, "maximum", y, s));
    vec![values, indices]
}

/// `r`, unless `y` or `s` is NaN: then that NaN (XLA's maximum and minimum
/// need not propagate NaN).
fn nan_first(b: &mut Builder, y: &Value, s: &Value, r: &Value) -> Value {
    let y_nan = b.compare(Compare::Ne, y, y);
    let s_nan = b.compare(Compare::Ne, s, s);
    let r = b.select(&s_nan, s, r);
    b.select(&y_nan, y, &r)
}

/// One fiber's running extreme and its index: a new value takes over when
/// it is at least as extreme, or NaN.
fn running_extreme<T: Copy + PartialOrd>(
    v: &[T],
    largest: bool,
    nan: impl Fn(T) -> bool,
) -> (Vec<T>, Vec<i64>) {
    let mut values = Vec::with_capacity(v.len());
    let mut indices = Vec::with_capacity(v.len());
    let mut best: Option<(T, i64)> = None;
    for (i, &x) in v.iter().enumerate() {
        let take = match best {
            None => true,
            Some((b, _)) => nan(x) || (!nan(b) && if largest { x >= b } else { x <= b }),
        };
        if take {
            best = Some((x, i as i64));
        }
        let (b, j) = best.unwrap_or((x, i as i64));
        values.push(b);
        indices.push(j);
    }
    (values, indices)
}

fn cumextreme_ref(x: &HostTensor, dim: usize, largest: bool) -> OpResult<Vec<HostTensor>> {
    let indices_of = |idx: ArrayD<f64>| HostTensor::int(DType::I64, idx.mapv(|i| i as i64));
    match x.data() {
        HostData::Float(a) => {
            let scan = |v: &[f64]| running_extreme(v, largest, f64::is_nan);
            let values = along(a, dim, |v| scan(v).0);
            let idx = along(a, dim, |v| {
                scan(v).1.into_iter().map(|i| i as f64).collect()
            });
            Ok(vec![HostTensor::float(x.dtype(), values), indices_of(idx)])
        }
        HostData::Complex(_) => Err(complex_unsupported()),
        HostData::Int(a) => {
            let scan = |v: &[i64]| running_extreme(v, largest, |_| false);
            let values = along(a, dim, |v| scan(v).0);
            let idx = along(a, dim, |v| scan(v).1);
            Ok(vec![
                HostTensor::int(x.dtype(), values),
                HostTensor::int(DType::I64, idx),
            ])
        }
    }
}

/// The gradient flows to the index each output took its value from.
fn cumextreme_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = a.inputs[0];
    let ty = t.ty(x)?;
    if !ty.dtype.is_float() {
        return Ok(vec![None]);
    }
    let dim = scan_dim(ty.shape.rank(), a.attrs)?;
    let zeros = t.full_like(x, 0.0)?;
    let attrs = Attrs::new().with("dim", dim as i64);
    Ok(vec![Some(t.call1(
        "scatter_add",
        &[zeros, a.outputs[1], a.grads[0]],
        attrs,
    )?)])
}

/// Integers and bools keep their ties (the later index wins); floats are
/// distinct, so finite differences never cross a tie, and sometimes hold a
/// NaN.
#[cfg(feature = "conformance")]
fn cumextreme_sample(g: &mut Gen) -> Sample {
    let mut s = dim_sample(g, REAL, -3.0, 3.0);
    let x = &s.inputs[0];
    if x.dtype().is_float() {
        let n = x.shape().numel();
        let mut order: Vec<usize> = (0..n).collect();
        for k in (1..n).rev() {
            order.swap(k, g.below(k + 1));
        }
        let nan_at = if g.bool() {
            g.below(n.max(1))
        } else {
            usize::MAX
        };
        let values = order
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                if i == nan_at {
                    f64::NAN
                } else {
                    p as f64 * 0.25 - n as f64 * 0.125
                }
            })
            .collect();
        s.inputs[0] = HostTensor::from_f64(x.dtype(), x.shape(), values)
            .unwrap_or_else(|| unreachable!("value count matches the shape"));
    }
    s
}

macro_rules! cumextreme_op {
    ($name:literal, $largest:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                infer: |x, attrs| {
                    let t = first(x)?;
                    scan_dim(t.shape.rank(), attrs)?;
                    Ok(vec![t.clone(), TensorType::new(DType::I64, t.shape.clone())])
                },
                lower: |b, x, attrs| {
                    let dim = scan_dim(x[0].rank(), attrs)?;
                    Ok(lower_cumextreme(b, &x[0], dim, $largest))
                },
                reference: |x, attrs| {
                    let x = one(x)?;
                    cumextreme_ref(x, scan_dim(x.shape().rank(), attrs)?, $largest)
                },
                vjp: Some(cumextreme_vjp),
                samples: || (0..12).map(|i| cumextreme_sample(&mut Gen::new(1300 + i))).collect(),
                arbitrary: cumextreme_sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

cumextreme_op!("cummax", true, torch: r#"tuple(torch.cummax(x[0], a["dim"]))"#);
cumextreme_op!("cummin", false, torch: r#"tuple(torch.cummin(x[0], a["dim"]))"#);

// ---- logcumsumexp ----

/// `log(exp(a) + exp(b))`, exact for equal (also infinite) arguments.
fn logaddexp(b: &mut Builder, x: &Value, y: &Value) -> Value {
    let m = bin(b, "maximum", x, y);
    let same = b.compare(Compare::Eq, x, y);
    let diff = bin(b, "subtract", x, y);
    let diff = b.unary("stablehlo.abs", &diff);
    let zero = splat(b, x, 0.0);
    let d = b.select(&same, &zero, &diff);
    let d = b.unary("stablehlo.negate", &d);
    let e = b.unary("stablehlo.exponential", &d);
    let l = b.unary("stablehlo.log_plus_one", &e);
    bin(b, "add", &m, &l)
}

fn lower_logcumsumexp(b: &mut Builder, x: &Value, dim: usize) -> Value {
    let xc = b.convert(x, accumulator(x.dtype()));
    let y = prefix_scan(b, &xc, dim, f64::NEG_INFINITY, logaddexp);
    b.convert(&y, x.dtype())
}

fn logaddexp_f64(a: f64, b: f64) -> f64 {
    if a == b {
        a + std::f64::consts::LN_2
    } else {
        a.max(b) + (-(a - b).abs()).exp().ln_1p()
    }
}

fn logcumsumexp_ref(x: &HostTensor, dim: usize) -> OpResult<HostTensor> {
    let a = x.to_f64();
    let y = along(&a, dim, |v| {
        let mut s = f64::NEG_INFINITY;
        v.iter()
            .map(|&x| {
                s = if x.is_nan() || s.is_nan() {
                    f64::NAN
                } else {
                    logaddexp_f64(s, x)
                };
                s
            })
            .collect()
    });
    Ok(HostTensor::float(x.dtype(), y))
}

/// `dx[j] = sum_{i >= j} g[i] exp(x[j] - y[i])`, summed in log space for
/// the positive and the negative parts of `g` separately, so it neither
/// overflows nor loses the small terms.
fn logcumsumexp_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (x, y, g) = (a.inputs[0], a.outputs[0], a.grads[0]);
    let ty = t.ty(x)?;
    let dim = scan_dim(ty.shape.rank(), a.attrs)?;
    let flip = Attrs::new().with("dims", vec![dim as i64]);
    let scan = Attrs::new().with("dim", dim as i64);
    let log_g = t.unary("abs", g)?;
    let log_g = t.unary("log", log_g)?;
    let log_g = t.sub(log_g, y)?;
    let zero = t.full_like(g, 0.0)?;
    let none = t.full_like(g, f64::NEG_INFINITY)?;
    let part = |t: &mut dyn Tape, sign: &str| -> OpResult<Var> {
        let keep = t.call1(sign, &[g, zero], Attrs::new())?;
        let terms = t.call1("where", &[keep, log_g, none], Attrs::new())?;
        let r = t.call1("flip", &[terms], flip.clone())?;
        let r = t.call1("logcumsumexp", &[r], scan.clone())?;
        let r = t.call1("flip", &[r], flip.clone())?;
        let r = t.add(r, x)?;
        t.unary("exp", r)
    };
    let pos = part(t, "gt")?;
    let neg = part(t, "lt")?;
    Ok(vec![Some(t.sub(pos, neg)?)])
}

#[cfg(feature = "conformance")]
fn logcumsumexp_sample(g: &mut Gen) -> Sample {
    let spread = g.pick(&[3.0, 30.0]);
    dim_sample(g, FLOATS, -spread, spread)
}

inventory::submit! {
    op_def! {
        name: "logcumsumexp",
        arity: Arity::Exactly(1),
        dtypes: FLOATS,
        infer: |x, attrs| {
            let t = first(x)?;
            require_dtype(t.dtype, FLOATS, "input (logcumsumexp needs a float dtype)")?;
            scan_dim(t.shape.rank(), attrs)?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, attrs| Ok(vec![lower_logcumsumexp(b, &x[0], scan_dim(x[0].rank(), attrs)?)]),
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![logcumsumexp_ref(x, scan_dim(x.shape().rank(), attrs)?)?])
        },
        vjp: Some(logcumsumexp_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..12).map(|i| logcumsumexp_sample(&mut Gen::new(1340 + i))).collect(),
        arbitrary: logcumsumexp_sample,
        torch: Torch::Expr(r#"torch.logcumsumexp(x[0], a["dim"])"#),
    }
}
