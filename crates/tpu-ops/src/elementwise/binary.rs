//! Binary arithmetic with NumPy broadcasting and PyTorch type promotion.

use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};
use tpu_core::{Complex, DType};
use tpu_core::{invalid, op_def};

use crate::support::*;

fn two_types(inputs: &[TensorType]) -> OpResult<(&TensorType, &TensorType)> {
    match inputs {
        [a, b] => Ok((a, b)),
        _ => Err("takes two inputs".into()),
    }
}

/// Output type of a broadcasting op on `allowed` dtypes; `float` forces a
/// float result (true division).
pub(crate) fn infer_binary(
    inputs: &[TensorType],
    allowed: &[DType],
    float: bool,
) -> OpResult<TensorType> {
    let (a, b) = two_types(inputs)?;
    require_dtype(a.dtype, allowed, "first input")?;
    require_dtype(b.dtype, allowed, "second input")?;
    let shape = broadcast_shapes(&a.shape, &b.shape)?;
    let dtype = promote(a, b);
    Ok(TensorType::new(
        if float { to_float(dtype) } else { dtype },
        shape,
    ))
}

/// Both operands converted to `dtype` and broadcast to `shape`.
pub(crate) fn operands(
    b: &mut Builder,
    x: &[Value],
    dtype: DType,
    shape: &[usize],
) -> (Value, Value) {
    let l = b.convert(&x[0], dtype);
    let r = b.convert(&x[1], dtype);
    (b.broadcast_to(&l, shape), b.broadcast_to(&r, shape))
}

pub(crate) fn lower_arith(
    b: &mut Builder,
    x: &[Value],
    float: bool,
    lower: impl Fn(&mut Builder, &Value, &Value) -> Value,
) -> Vec<Value> {
    let dtype = promote(x[0].ty(), x[1].ty());
    let dtype = if float { to_float(dtype) } else { dtype };
    let shape = broadcast_shapes(x[0].shape(), x[1].shape()).unwrap_or_default();
    let (l, r) = operands(b, x, dtype, shape.dims());
    vec![lower(b, &l, &r)]
}

/// How an op combines complex numbers, for ops that take them.
type ComplexFn = Option<fn(Complex<f64>, Complex<f64>) -> Complex<f64>>;

fn arith_ref(
    x: &[HostTensor],
    float: bool,
    ff: impl Fn(f64, f64) -> f64,
    fi: impl Fn(i64, i64) -> i64,
    fc: ComplexFn,
) -> OpResult<Vec<HostTensor>> {
    let dtype = promote(&x[0].ty(), &x[1].ty());
    let dtype = if float { to_float(dtype) } else { dtype };
    if let (true, Some(fc)) = (dtype.is_complex(), fc) {
        let shape = broadcast_shapes(&x[0].shape(), &x[1].shape())?;
        let (a, b) = (x[0].to_complex(), x[1].to_complex());
        let values = zip_complex(&a, &b, shape.dims(), fc)?;
        return Ok(vec![HostTensor::complex(dtype, values)]);
    }
    Ok(vec![binary(&x[0], &x[1], dtype, dtype, ff, fi)?])
}

/// Reduces a broadcast gradient to an input's shape and dtype.
pub(crate) fn grad_for(t: &mut dyn Tape, g: Var, input: Var) -> OpResult<Option<Var>> {
    let ty = t.ty(input)?;
    if !ty.dtype.is_inexact() {
        return Ok(None);
    }
    let g = t.sum_to(g, &ty.shape)?;
    Ok(Some(t.cast(g, ty.dtype)?))
}

fn grads(t: &mut dyn Tape, a: &VjpArgs<'_>, ga: Var, gb: Var) -> OpResult<Vec<Option<Var>>> {
    Ok(vec![
        grad_for(t, ga, a.inputs[0])?,
        grad_for(t, gb, a.inputs[1])?,
    ])
}

/// Both inputs cast to the output's dtype (so derivative math is in one type).
fn promoted(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<(Var, Var)> {
    let dt = t.ty(a.outputs[0])?.dtype;
    Ok((t.cast(a.inputs[0], dt)?, t.cast(a.inputs[1], dt)?))
}

macro_rules! arith_op {
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, hlo: $hlo:literal,
     reference: ($ff:expr, $fi:expr, $fc:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        arith_op!($name, dtypes: $dtypes, float: $float,
            lower: |b: &mut Builder, l: &Value, r: &Value| b.binary($hlo, l, r),
            reference: ($ff, $fi, $fc), vjp: $vjp, samples: $samples, arbitrary: $arb, torch: $torch);
    };
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, hlo: $hlo:literal,
     reference: ($ff:expr, $fi:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        arith_op!($name, dtypes: $dtypes, float: $float,
            lower: |b: &mut Builder, l: &Value, r: &Value| b.binary($hlo, l, r),
            reference: ($ff, $fi), vjp: $vjp, samples: $samples, arbitrary: $arb, torch: $torch);
    };
    // `lower` gets both operands promoted and broadcast.
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, lower: $lower:expr,
     reference: ($ff:expr, $fi:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        arith_op!($name, dtypes: $dtypes, float: $float, lower: $lower,
            reference: ($ff, $fi, None), vjp: $vjp, samples: $samples, arbitrary: $arb, torch: $torch);
    };
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, lower: $lower:expr,
     reference: ($ff:expr, $fi:expr, $fc:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        arith_op!($name, dtypes: $dtypes, float: $float,
            lower_inputs: |b: &mut Builder, x: &[Value]| lower_arith(b, x, $float, $lower),
            reference: ($ff, $fi, $fc), vjp: $vjp, samples: $samples, arbitrary: $arb, torch: $torch);
    };
    // `lower_inputs` gets the op's inputs as they are.
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, lower_inputs: $lower:expr,
     reference: ($ff:expr, $fi:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        arith_op!($name, dtypes: $dtypes, float: $float, lower_inputs: $lower,
            reference: ($ff, $fi, None), vjp: $vjp, samples: $samples, arbitrary: $arb, torch: $torch);
    };
    ($name:literal, dtypes: $dtypes:expr, float: $float:expr, lower_inputs: $lower:expr,
     reference: ($ff:expr, $fi:expr, $fc:expr), vjp: $vjp:expr, samples: $samples:expr, arbitrary: $arb:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE,
                dtypes: $dtypes,
                infer: |x, _| Ok(vec![infer_binary(x, $dtypes, $float)?]),
                lower: |b, x, _| Ok($lower(b, x)),
                reference: |x, _| arith_ref(x, $float, $ff, $fi, $fc),
                vjp: Some($vjp),
                samples: $samples,
                arbitrary: $arb,
                torch: Torch::Expr($torch),
            }
        }
    };
}

arith_op!("add", dtypes: ANY, float: false, hlo: "stablehlo.add",
    reference: (|x, y| x + y, |x: i64, y: i64| x.wrapping_add(y), Some(|x, y| x + y)),
    vjp: |t, a| grads(t, a, a.grads[0], a.grads[0]),
    samples: || with_complex(binary_samples), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC_OR_COMPLEX),
    torch: "torch.add(x[0], x[1])");

arith_op!("sub", dtypes: NUMERIC_OR_COMPLEX, float: false, hlo: "stablehlo.subtract",
    reference: (|x, y| x - y, |x: i64, y: i64| x.wrapping_sub(y), Some(|x, y| x - y)),
    vjp: |t, a| {
        let gb = t.neg(a.grads[0])?;
        grads(t, a, a.grads[0], gb)
    },
    samples: || with_complex(binary_samples), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC_OR_COMPLEX),
    torch: "torch.sub(x[0], x[1])");

arith_op!("mul", dtypes: ANY, float: false, hlo: "stablehlo.multiply",
    reference: (|x, y| x * y, |x: i64, y: i64| x.wrapping_mul(y), Some(|x, y| x * y)),
    vjp: |t, a| {
        let (x, y) = promoted(t, a)?;
        let (x, y) = (t.conj(x)?, t.conj(y)?);
        let ga = t.mul(a.grads[0], y)?;
        let gb = t.mul(a.grads[0], x)?;
        grads(t, a, ga, gb)
    },
    samples: || with_complex(binary_samples), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC_OR_COMPLEX),
    torch: "torch.mul(x[0], x[1])");

/// An op's samples over the real numeric dtypes, then over complex ones.
#[cfg(feature = "conformance")]
fn with_complex(samples: fn(&[DType]) -> Vec<Sample>) -> Vec<Sample> {
    let mut all = samples(NUMERIC);
    all.extend(samples(COMPLEX));
    all
}

/// Divisors away from zero.
#[cfg(feature = "conformance")]
fn nonzero_divisor(mut s: Sample) -> Sample {
    let d = &s.inputs[1];
    if d.dtype().is_complex() {
        // |re| >= 0.5 keeps |d| >= 0.5.
        let re = d.to_complex().mapv(|v| {
            let re = if v.re.abs() < 0.5 {
                0.5 + v.re.abs()
            } else {
                v.re
            };
            Complex::new(re, v.im)
        });
        s.inputs[1] = HostTensor::complex(d.dtype(), re);
        return s;
    }
    let fixed = map_same(
        d,
        |v| if v.abs() < 0.5 { 0.5 + v.abs() } else { v },
        |v| if v == 0 { 3 } else { v },
    );
    s.inputs[1] = fixed;
    s
}

/// `x / y` as IEEE division. XLA's simplifier rewrites a division by a
/// broadcast divisor into a multiplication by its reciprocal, off by an ulp
/// for a fifth to a half of quotients (`x / 0.3`); behind a barrier the
/// broadcast divisor is materialized and divided by, as PyTorch does.
fn lower_div(b: &mut Builder, x: &[Value]) -> Vec<Value> {
    let dtype = to_float(promote(x[0].ty(), x[1].ty()));
    let shape = broadcast_shapes(x[0].shape(), x[1].shape()).unwrap_or_default();
    let (l, r) = operands(b, x, dtype, shape.dims());
    let r = if x[1].shape().dims() != shape.dims() {
        b.op1("stablehlo.optimization_barrier", &[&r], "", r.ty().clone())
    } else {
        r
    };
    vec![b.binary("stablehlo.divide", &l, &r)]
}

arith_op!("div", dtypes: NUMERIC_OR_COMPLEX, float: true, lower_inputs: lower_div,
    reference: (|x, y| x / y, |_, _| 0, Some(|x, y| x / y)),
    vjp: |t, a| {
        let (_, y) = promoted(t, a)?;
        let y = t.conj(y)?;
        let ga = t.div(a.grads[0], y)?;
        // d(x/y)/dy = -(x/y)/y
        let q = t.conj(a.outputs[0])?;
        let q = t.div(q, y)?;
        let gq = t.mul(a.grads[0], q)?;
        let gb = t.neg(gq)?;
        grads(t, a, ga, gb)
    },
    samples: || with_complex(binary_samples).into_iter().map(nonzero_divisor).collect(),
    arbitrary: |g: &mut Gen| nonzero_divisor(binary_arbitrary(g, NUMERIC_OR_COMPLEX)),
    torch: "torch.div(x[0], x[1])");

#[cfg(feature = "conformance")]
fn positive_base(mut s: Sample) -> Sample {
    let base = &s.inputs[0];
    s.inputs[0] = map_same(base, |v| v.abs() + 0.5, |v| v.abs() % 4);
    let exp = &s.inputs[1];
    s.inputs[1] = map_same(exp, |v| v.clamp(-2.5, 2.5), |v| v.abs() % 4);
    s
}

/// Complex exponents scaled down: `x^y = exp(y log x)` carries the error of
/// `y log x` into the result's phase, so large exponents test rounding,
/// not the op.
#[cfg(feature = "conformance")]
fn small_exponent(mut s: Sample) -> Sample {
    let y = &s.inputs[1];
    s.inputs[1] = HostTensor::complex(y.dtype(), y.to_complex().mapv(|v| v * 0.25));
    s
}

arith_op!("pow", dtypes: NUMERIC_OR_COMPLEX, float: false, hlo: "stablehlo.power",
    reference: (f64::powf, |x: i64, y: i64| x.wrapping_pow(y.clamp(0, 63) as u32), Some(|x: Complex<f64>, y: Complex<f64>| x.powc(y))),
    vjp: |t, a| {
        let (x, y) = promoted(t, a)?;
        // d/dx x^y = y x^(y-1) = y * out / x ;  d/dy = ln(x) * out (each
        // conjugated for complex inputs)
        let yo = t.mul(y, a.outputs[0])?;
        let dx = t.div(yo, x)?;
        let dx = t.conj(dx)?;
        let ga = t.mul(a.grads[0], dx)?;
        let lx = t.unary("log", x)?;
        let dy = t.mul(lx, a.outputs[0])?;
        let dy = t.conj(dy)?;
        let gb = t.mul(a.grads[0], dy)?;
        grads(t, a, ga, gb)
    },
    samples: || {
        let mut s: Vec<Sample> = binary_samples(NUMERIC).into_iter().map(positive_base).collect();
        s.extend(binary_samples(COMPLEX).into_iter().map(small_exponent));
        s
    },
    arbitrary: |g: &mut Gen| {
        if g.below(4) == 0 {
            small_exponent(binary_arbitrary(g, COMPLEX))
        } else {
            positive_base(binary_arbitrary(g, NUMERIC))
        }
    },
    torch: "torch.pow(x[0], x[1])");

/// Routes the gradient to whichever input `pick` (a comparison) selects.
fn select_grads(t: &mut dyn Tape, a: &VjpArgs<'_>, pick: &str) -> OpResult<Vec<Option<Var>>> {
    let (x, y) = promoted(t, a)?;
    let mask = t.call1(pick, &[x, y], Attrs::new())?;
    route_grads(t, a, mask)
}

/// Routes the gradient to the first input where `mask` holds, to the second
/// elsewhere.
fn route_grads(t: &mut dyn Tape, a: &VjpArgs<'_>, mask: Var) -> OpResult<Vec<Option<Var>>> {
    let zero = t.full_like(a.grads[0], 0.0)?;
    let ga = t.call1("where", &[mask, a.grads[0], zero], Attrs::new())?;
    let gb = t.call1("where", &[mask, zero, a.grads[0]], Attrs::new())?;
    grads(t, a, ga, gb)
}

arith_op!("maximum", dtypes: REAL, float: false, hlo: "stablehlo.maximum",
    reference: (|x: f64, y: f64| if x.is_nan() || y.is_nan() { f64::NAN } else { x.max(y) }, |x: i64, y: i64| x.max(y)),
    vjp: |t, a| select_grads(t, a, "gt"),
    samples: || binary_samples(NUMERIC), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC),
    torch: "torch.maximum(x[0], x[1])");

arith_op!("minimum", dtypes: REAL, float: false, hlo: "stablehlo.minimum",
    reference: (|x: f64, y: f64| if x.is_nan() || y.is_nan() { f64::NAN } else { x.min(y) }, |x: i64, y: i64| x.min(y)),
    vjp: |t, a| select_grads(t, a, "lt"),
    samples: || binary_samples(NUMERIC), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC),
    torch: "torch.minimum(x[0], x[1])");

arith_op!("atan2", dtypes: NUMERIC, float: true, hlo: "stablehlo.atan2",
    reference: (f64::atan2, |_, _| 0),
    vjp: |t, a| {
        let (x, y) = promoted(t, a)?;
        let x2 = t.mul(x, x)?;
        let y2 = t.mul(y, y)?;
        let r2 = t.add(x2, y2)?;
        let gy = t.div(a.grads[0], r2)?;
        let ga = t.mul(gy, y)?;
        let gxb = t.mul(gy, x)?;
        let gb = t.neg(gxb)?;
        grads(t, a, ga, gb)
    },
    samples: || binary_samples(FLOATS).into_iter().map(nonzero_divisor).collect(),
    arbitrary: |g: &mut Gen| nonzero_divisor(binary_arbitrary(g, NUMERIC)),
    torch: "torch.atan2(x[0], x[1])");

/// `fmax`/`fmin`: NaN only where both are NaN, else `pick` of the others.
fn lower_nan_ignoring(b: &mut Builder, l: &Value, r: &Value, pick: &str) -> Value {
    let m = b.binary(pick, l, r);
    let l_nan = b.compare(Compare::Ne, l, l);
    let r_nan = b.compare(Compare::Ne, r, r);
    let m = b.select(&r_nan, l, &m);
    b.select(&l_nan, r, &m)
}

/// Routes the gradient to `x` where it was picked (`pick`, or `y` is NaN).
fn nan_ignoring_grads(t: &mut dyn Tape, a: &VjpArgs<'_>, pick: &str) -> OpResult<Vec<Option<Var>>> {
    let (x, y) = promoted(t, a)?;
    let better = t.call1(pick, &[x, y], Attrs::new())?;
    let y_nan = t.call1("isnan", &[y], Attrs::new())?;
    let mask = t.call1("logical_or", &[better, y_nan], Attrs::new())?;
    route_grads(t, a, mask)
}

arith_op!("fmax", dtypes: NUMERIC, float: false,
    lower: |b: &mut Builder, l: &Value, r: &Value| lower_nan_ignoring(b, l, r, "stablehlo.maximum"),
    reference: (f64::max, |x: i64, y: i64| x.max(y)),
    vjp: |t, a| nan_ignoring_grads(t, a, "gt"),
    samples: || binary_samples(NUMERIC), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC),
    torch: "torch.fmax(x[0], x[1])");

arith_op!("fmin", dtypes: NUMERIC, float: false,
    lower: |b: &mut Builder, l: &Value, r: &Value| lower_nan_ignoring(b, l, r, "stablehlo.minimum"),
    reference: (f64::min, |x: i64, y: i64| x.min(y)),
    vjp: |t, a| nan_ignoring_grads(t, a, "lt"),
    samples: || binary_samples(NUMERIC), arbitrary: |g: &mut Gen| binary_arbitrary(g, NUMERIC),
    torch: "torch.fmin(x[0], x[1])");

/// `sqrt(l² + r²)` as `big · sqrt(1 + (small / big)²)`, which neither
/// overflows nor underflows where the result is representable.
fn lower_hypot(b: &mut Builder, l: &Value, r: &Value) -> Value {
    let (dt, dims) = (l.dtype(), l.dims().to_vec());
    let (la, ra) = (b.unary("stablehlo.abs", l), b.unary("stablehlo.abs", r));
    let big = b.binary("stablehlo.maximum", &la, &ra);
    let small = b.binary("stablehlo.minimum", &la, &ra);
    let zero = b.constant(dt, &dims[..], 0.0);
    let one = b.constant(dt, &dims[..], 1.0);
    let big_is_zero = b.compare(Compare::Eq, &big, &zero);
    let divisor = b.select(&big_is_zero, &one, &big);
    let q = b.binary("stablehlo.divide", &small, &divisor);
    let q2 = b.binary("stablehlo.multiply", &q, &q);
    let s = b.binary("stablehlo.add", &one, &q2);
    let s = b.unary("stablehlo.sqrt", &s);
    let h = b.binary("stablehlo.multiply", &big, &s);
    // An infinite side wins even over NaN, as in C's hypot.
    let inf = b.constant(dt, &dims[..], f64::INFINITY);
    let l_inf = b.compare(Compare::Eq, &la, &inf);
    let r_inf = b.compare(Compare::Eq, &ra, &inf);
    let h = b.select(&l_inf, &inf, &h);
    b.select(&r_inf, &inf, &h)
}

arith_op!("hypot", dtypes: FLOATS, float: true,
    lower: lower_hypot,
    reference: (f64::hypot, |_, _| 0),
    vjp: |t, a| {
        // d/dx sqrt(x² + y²) = x / h.
        let (x, y) = promoted(t, a)?;
        let gh = t.div(a.grads[0], a.outputs[0])?;
        let ga = t.mul(gh, x)?;
        let gb = t.mul(gh, y)?;
        grads(t, a, ga, gb)
    },
    samples: || binary_samples(FLOATS).into_iter().map(nonzero_divisor).collect(),
    arbitrary: |g: &mut Gen| nonzero_divisor(binary_arbitrary(g, FLOATS)),
    torch: "torch.hypot(x[0], x[1])");

/// Python's modulo: the result takes the divisor's sign.
fn py_rem_f(x: f64, y: f64) -> f64 {
    let r = x % y;
    if r != 0.0 && (r < 0.0) != (y < 0.0) {
        r + y
    } else {
        r
    }
}

fn py_rem_i(x: i64, y: i64) -> i64 {
    if y == 0 {
        return 0;
    }
    let r = x.wrapping_rem(y);
    if r != 0 && (r < 0) != (y < 0) {
        r + y
    } else {
        r
    }
}

/// Where a truncating division's remainder `rem` is nonzero with a sign
/// other than the divisor `r`'s: there floor division is one lower and
/// the floored remainder is `rem + r`.
fn floor_fix(b: &mut Builder, rem: &Value, r: &Value) -> Value {
    let zero = b.constant(rem.dtype(), rem.shape().clone(), 0.0);
    let nonzero = b.compare(Compare::Ne, rem, &zero);
    let rem_neg = b.compare(Compare::Lt, rem, &zero);
    let div_neg = b.compare(Compare::Lt, r, &zero);
    let differ = b.compare(Compare::Ne, &rem_neg, &div_neg);
    b.binary("stablehlo.and", &nonzero, &differ)
}

fn lower_remainder(b: &mut Builder, x: &[Value]) -> Vec<Value> {
    let dtype = promote(x[0].ty(), x[1].ty());
    let shape = broadcast_shapes(x[0].shape(), x[1].shape()).unwrap_or_default();
    let (l, r) = operands(b, x, dtype, shape.dims());
    let rem = b.binary("stablehlo.remainder", &l, &r);
    let fix = floor_fix(b, &rem, &r);
    let shifted = b.binary("stablehlo.add", &rem, &r);
    vec![b.select(&fix, &shifted, &rem)]
}

/// C's `fmod`: the remainder of the truncated quotient, with the sign of
/// `x`. Exact in every float format, unlike `x - trunc(x / y) * y`.
fn lower_fmod(b: &mut Builder, x: &[Value]) -> Vec<Value> {
    let dtype = promote(x[0].ty(), x[1].ty());
    let shape = broadcast_shapes(x[0].shape(), x[1].shape()).unwrap_or_default();
    let (l, r) = operands(b, x, dtype, shape.dims());
    vec![b.binary("stablehlo.remainder", &l, &r)]
}

fn fmod_i(x: i64, y: i64) -> i64 {
    if y == 0 { 0 } else { x.wrapping_rem(y) }
}

/// Rounds toward zero, keeping the sign of a zero result.
fn trunc(b: &mut Builder, x: &Value) -> Value {
    let mag = b.unary("stablehlo.abs", x);
    let mag = b.unary("stablehlo.floor", &mag);
    let sign = b.unary("stablehlo.sign", x);
    b.binary("stablehlo.multiply", &sign, &mag)
}

/// `x / y` rounded toward negative infinity (`floor`) or zero (`trunc`).
#[derive(Clone, Copy, PartialEq)]
enum Rounding {
    Floor,
    Trunc,
}

fn rounding(attrs: &Attrs) -> OpResult<Rounding> {
    match attrs.str_or("rounding", "floor")? {
        "floor" => Ok(Rounding::Floor),
        "trunc" => Ok(Rounding::Trunc),
        other => Err(invalid!(
            "rounding must be \"floor\" or \"trunc\", got {other:?}"
        )),
    }
}

/// Integers divide exactly (the quotient of a truncating division, one
/// less where the remainder's sign differs from the divisor's under
/// `floor`); floats round their quotient.
fn lower_rounded_div(b: &mut Builder, x: &[Value], mode: Rounding) -> Value {
    let dtype = promote(x[0].ty(), x[1].ty());
    let shape = broadcast_shapes(x[0].shape(), x[1].shape()).unwrap_or_default();
    let (l, r) = operands(b, x, dtype, shape.dims());
    // XLA rewrites `a / pow(b, c)` as `a * pow(b, -c)`, which is 0 for
    // integers: the barrier keeps an integer divisor computed in the same
    // program out of that rewrite.
    let r = if dtype.is_float() {
        r
    } else {
        b.op1("stablehlo.optimization_barrier", &[&r], "", r.ty().clone())
    };
    if dtype.is_float() {
        // A half-precision quotient rounds to 8 or 11 bits, which can carry
        // it across an integer (2.99 -> 3.0): divide in f32, where the
        // quotient of two half values stays on its side.
        let wide = if dtype.size_in_bytes() < 4 {
            DType::F32
        } else {
            dtype
        };
        let (l, r) = (b.convert(&l, wide), b.convert(&r, wide));
        let plain = b.binary("stablehlo.divide", &l, &r);
        // The quotient the plugin computes may be off by an ulp (a division
        // by a broadcast divisor can become a multiplication by its
        // reciprocal): 2 / 2 as 0.99999994 floors to 0. The exact remainder
        // (fmod) makes `l - rem` an exact multiple of `r`, whose quotient
        // is an integer up to that ulp, so rounding it to the nearest
        // integer gives the truncated quotient exactly.
        let rem = b.binary("stablehlo.remainder", &l, &r);
        let zero = b.constant(wide, shape.dims(), 0.0);
        let rounded = match mode {
            Rounding::Floor => {
                let whole = b.binary("stablehlo.subtract", &l, &rem);
                let q = b.binary("stablehlo.divide", &whole, &r);
                let q = b.unary("stablehlo.round_nearest_even", &q);
                let fix = floor_fix(b, &rem, &r);
                let one = b.constant(wide, shape.dims(), 1.0);
                let lower = b.binary("stablehlo.subtract", &q, &one);
                b.select(&fix, &lower, &q)
            }
            Rounding::Trunc => {
                // PyTorch truncates the rounded quotient (a quotient just
                // under an integer may round up to it), so the quotient
                // must be rounded once and correctly: through float64 for
                // narrower floats (double rounding of a quotient is
                // harmless when the wide format has 2p + 2 bits), and an
                // exact multiple takes the exact integer.
                let q = if wide == DType::F64 {
                    plain.clone()
                } else {
                    let (l64, r64) = (b.convert(&l, DType::F64), b.convert(&r, DType::F64));
                    let q64 = b.binary("stablehlo.divide", &l64, &r64);
                    b.convert(&q64, wide)
                };
                let exact = b.unary("stablehlo.round_nearest_even", &plain);
                let multiple = b.compare(Compare::Eq, &rem, &zero);
                let q = b.select(&multiple, &exact, &q);
                trunc(b, &q)
            }
        };
        // Zero or infinite operands (and NaN) keep the plain quotient's
        // rounding: inf, nan and signed zeros as IEEE division gives them.
        // `x - x` is 0 exactly when `x` is finite.
        let finite = |b: &mut Builder, x: &Value| {
            let d = b.binary("stablehlo.subtract", x, x);
            b.compare(Compare::Eq, &d, &zero)
        };
        let finite_l = finite(b, &l);
        let finite_r = finite(b, &r);
        let r_nonzero = b.compare(Compare::Ne, &r, &zero);
        let ordinary = b.binary("stablehlo.and", &finite_l, &finite_r);
        let ordinary = b.binary("stablehlo.and", &ordinary, &r_nonzero);
        let plain = match mode {
            Rounding::Floor => b.unary("stablehlo.floor", &plain),
            Rounding::Trunc => trunc(b, &plain),
        };
        let rounded = b.select(&ordinary, &rounded, &plain);
        return b.convert(&rounded, dtype);
    }
    let q = b.binary("stablehlo.divide", &l, &r);
    if mode == Rounding::Trunc {
        return q;
    }
    let rem = b.binary("stablehlo.remainder", &l, &r);
    let fix = floor_fix(b, &rem, &r);
    let one = b.constant(dtype, shape.dims(), 1.0);
    let lower = b.binary("stablehlo.subtract", &q, &one);
    b.select(&fix, &lower, &q)
}

fn rounded_div_i(x: i64, y: i64, mode: Rounding) -> i64 {
    if y == 0 {
        return 0;
    }
    let q = x.wrapping_div(y);
    let r = x.wrapping_rem(y);
    if mode == Rounding::Floor && r != 0 && (r < 0) != (y < 0) {
        q - 1
    } else {
        q
    }
}

fn rounded_div_f(x: f64, y: f64, mode: Rounding) -> f64 {
    match mode {
        Rounding::Floor => (x / y).floor(),
        Rounding::Trunc => (x / y).trunc(),
    }
}

inventory::submit! {
    op_def! {
        name: "rounded_div",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE.union(Flags::NOT_DIFFERENTIABLE),
        dtypes: NUMERIC,
        infer: |x, attrs| {
            rounding(attrs)?;
            Ok(vec![infer_binary(x, NUMERIC, false)?])
        },
        lower: |b, x, attrs| Ok(vec![lower_rounded_div(b, x, rounding(attrs)?)]),
        reference: |x, attrs| {
            let mode = rounding(attrs)?;
            arith_ref(x, false, |a, b| rounded_div_f(a, b, mode), |a, b| rounded_div_i(a, b, mode), None)
        },
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || {
            let mut all: Vec<Sample> = binary_samples(NUMERIC).into_iter().map(nonzero_divisor).collect();
            for s in all.iter_mut().skip(1).step_by(2) {
                s.attrs = Attrs::new().with("rounding", "trunc");
            }
            all
        },
        arbitrary: |g: &mut Gen| {
            let mut s = nonzero_divisor(binary_arbitrary(g, NUMERIC));
            if g.bool() {
                s.attrs = Attrs::new().with("rounding", "trunc");
            }
            s
        },
        torch: Torch::Expr(r#"torch.div(x[0], x[1], rounding_mode=a.get("rounding", "floor"))"#),
    }
}

inventory::submit! {
    op_def! {
        name: "remainder",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: |x, _| Ok(vec![infer_binary(x, NUMERIC, false)?]),
        lower: |b, x, _| Ok(lower_remainder(b, x)),
        reference: |x, _| arith_ref(x, false, py_rem_f, py_rem_i, None),
        vjp: Some(|t, a| {
            // d/dx = 1, d/dy = -floor(x / y)
            let (x, y) = promoted(t, a)?;
            let q = t.div(x, y)?;
            let fq = t.unary("floor", q)?;
            let gq = t.mul(a.grads[0], fq)?;
            let gb = t.neg(gq)?;
            grads(t, a, a.grads[0], gb)
        }),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || binary_samples(NUMERIC).into_iter().map(nonzero_divisor).collect(),
        arbitrary: |g: &mut Gen| nonzero_divisor(binary_arbitrary(g, NUMERIC)),
        torch: Torch::Expr("torch.remainder(x[0], x[1])"),
    }
}

inventory::submit! {
    op_def! {
        name: "fmod",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: |x, _| Ok(vec![infer_binary(x, NUMERIC, false)?]),
        lower: |b, x, _| Ok(lower_fmod(b, x)),
        reference: |x, _| arith_ref(x, false, |a, b| a % b, fmod_i, None),
        vjp: Some(|t, a| {
            // d/dx = 1, d/dy = -trunc(x / y)
            let (x, y) = promoted(t, a)?;
            let q = t.call1("rounded_div", &[x, y], Attrs::new().with("rounding", "trunc"))?;
            let gq = t.mul(a.grads[0], q)?;
            let gb = t.neg(gq)?;
            grads(t, a, a.grads[0], gb)
        }),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || binary_samples(NUMERIC).into_iter().map(nonzero_divisor).collect(),
        arbitrary: |g: &mut Gen| nonzero_divisor(binary_arbitrary(g, NUMERIC)),
        torch: Torch::Expr("torch.fmod(x[0], x[1])"),
    }
}
