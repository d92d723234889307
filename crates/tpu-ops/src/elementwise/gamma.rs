//! The error and gamma function families: `erfc`, `erfinv`, `lgamma`,
//! `digamma`, `polygamma` and the Hurwitz `zeta`, lowered to CHLO and
//! referenced against the f64 functions in [`super::special`].

use tpu_core::DType;
#[cfg(feature = "conformance")]
use tpu_core::host::HostTensor;
use tpu_core::host::Tolerance;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::binary::{infer_binary, lower_arith};
use super::special;
use super::unary::{chain, float_op, float_ref, infer_float, lower_float, transcendental};
use crate::support::*;

/// `scale * exp(sign * v²)`, the derivative of the erf family.
fn gaussian(t: &mut dyn Tape, v: Var, sign: f64, scale: f64) -> OpResult<Var> {
    let v2 = t.mul(v, v)?;
    let e = t.scale(v2, sign)?;
    let e = t.unary("exp", e)?;
    t.scale(e, scale)
}

fn polygamma_call(t: &mut dyn Tape, n: i64, x: Var) -> OpResult<Var> {
    t.call1("polygamma", &[x], Attrs::new().with("n", n))
}

float_op!("erfc",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.erfc"),
    reference: special::erfc,
    vjp: |t, a| chain(t, a, |t, x, _| gaussian(t, x, -1.0, -2.0 / std::f64::consts::PI.sqrt())),
    range: (-3.0, 5.0), tolerance: transcendental,
    torch: "torch.erfc(x[0])");

float_op!("erfinv",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.erf_inv"),
    reference: special::erfinv,
    vjp: |t, a| chain(t, a, |t, _, y| gaussian(t, y, 1.0, std::f64::consts::PI.sqrt() / 2.0)),
    range: (-0.95, 0.95), tolerance: transcendental,
    torch: "torch.erfinv(x[0])");

float_op!("lgamma",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.lgamma"),
    reference: special::lgamma,
    vjp: |t, a| chain(t, a, |t, x, _| t.unary("digamma", x)),
    range: (0.2, 6.0), tolerance: transcendental,
    torch: "torch.lgamma(x[0])");

/// chlo.digamma, with the pole at zero made explicit (-∞ at +0, +∞ at -0,
/// as in PyTorch): older XLA CPU plugins give NaN there.
fn lower_digamma(b: &mut Builder, x: &Value) -> Value {
    let d = lower_float(b, x, "chlo.digamma");
    let x = b.convert(x, d.dtype());
    let zero = b.constant(x.dtype(), x.dims(), 0.0);
    let one = b.constant(x.dtype(), x.dims(), 1.0);
    let at_zero = b.compare(Compare::Eq, &x, &zero);
    let recip = b.binary("stablehlo.divide", &one, &x);
    let pole = b.unary("stablehlo.negate", &recip);
    b.select(&at_zero, &pole, &d)
}

float_op!("digamma",
    lower: lower_digamma,
    reference: special::digamma,
    vjp: |t, a| chain(t, a, |t, x, _| polygamma_call(t, 1, x)),
    range: (0.2, 6.0), tolerance: transcendental,
    torch: "torch.digamma(x[0])");

/// The order `n` of `polygamma` (0 is digamma).
fn order(attrs: &Attrs) -> OpResult<u32> {
    let n = attrs.int("n")?;
    u32::try_from(n)
        .ok()
        .filter(|&n| n <= 64)
        .ok_or_else(|| invalid!("polygamma order n must be in 0..=64, got {n}"))
}

fn infer_polygamma(x: &[TensorType], attrs: &Attrs) -> OpResult<Vec<TensorType>> {
    order(attrs)?;
    infer_float(x, attrs)
}

/// How far negative inputs are shifted up by the recurrence before
/// chlo.polygamma, which is wrong below zero; inputs at or below `-SHIFT`
/// give NaN.
const SHIFT: usize = 32;

/// `x^-(p)` by squaring, for `p >= 1`.
fn inverse_power(b: &mut Builder, x: &Value, p: u32) -> Value {
    let one = b.constant(x.dtype(), x.dims(), 1.0);
    let mut base = b.binary("stablehlo.divide", &one, x);
    let mut acc: Option<Value> = None;
    let mut p = p;
    while p > 0 {
        if p & 1 == 1 {
            acc = Some(match acc {
                Some(a) => b.binary("stablehlo.multiply", &a, &base),
                None => base.clone(),
            });
        }
        p >>= 1;
        if p > 0 {
            base = b.binary("stablehlo.multiply", &base, &base);
        }
    }
    acc.unwrap_or(one)
}

fn lower_polygamma(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Vec<Value>> {
    let n = order(attrs)?;
    if n == 0 {
        return Ok(vec![lower_digamma(b, &x[0])]);
    }
    // f16 and bf16 compute in f32: the shifted sum needs the digits.
    let out_dtype = to_float(x[0].dtype());
    let dt = if out_dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let x = b.convert(&x[0], dt);
    let dims = x.dims().to_vec();
    let order_n = b.constant(dt, &dims[..], f64::from(n));
    let direct = b.binary("chlo.polygamma", &order_n, &x);
    // Below zero: ψ⁽ⁿ⁾(x) = ψ⁽ⁿ⁾(x + M) - (-1)ⁿ n! Σ_{k<M} (x + k)^-(n+1).
    let shift = b.constant(dt, &dims[..], SHIFT as f64);
    let up = b.binary("stablehlo.add", &x, &shift);
    let mut shifted = b.binary("chlo.polygamma", &order_n, &up);
    let factorial: f64 = (1..=n).map(f64::from).product();
    let sign = if n % 2 == 0 { -1.0 } else { 1.0 };
    let coefficient = b.constant(dt, &dims[..], sign * factorial);
    for k in 0..SHIFT {
        let offset = b.constant(dt, &dims[..], k as f64);
        let xk = b.binary("stablehlo.add", &x, &offset);
        let term = inverse_power(b, &xk, n + 1);
        let term = b.binary("stablehlo.multiply", &coefficient, &term);
        shifted = b.binary("stablehlo.add", &shifted, &term);
    }
    let zero = b.constant(dt, &dims[..], 0.0);
    let negative = b.compare(Compare::Lt, &x, &zero);
    let out = b.select(&negative, &shifted, &direct);
    let floor = b.constant(dt, &dims[..], -(SHIFT as f64));
    let too_low = b.compare(Compare::Le, &x, &floor);
    let nan = b.constant(dt, &dims[..], f64::NAN);
    let out = b.select(&too_low, &nan, &out);
    Ok(vec![b.convert(&out, out_dtype)])
}

fn polygamma_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let n = i64::from(order(a.attrs)?);
    chain(t, a, |t, x, _| polygamma_call(t, n + 1, x))
}

/// PyTorch's own f64 polygamma is good to about 1e-9, not to the last ulp.
fn polygamma_tolerance(d: DType) -> Tolerance {
    if d == DType::F64 {
        Tolerance::new(1e-9, 1e-8)
    } else {
        transcendental(d)
    }
}

/// Keeps negative inputs at least 0.2 from the poles at the integers.
#[cfg(feature = "conformance")]
fn off_the_poles(mut sample: Sample) -> Sample {
    let x = &sample.inputs[0];
    let moved = x.to_f64().mapv(|v| {
        if v >= 0.3 {
            return v;
        }
        let whole = v.floor();
        whole + 0.5 + (v - whole - 0.5) * 0.6
    });
    sample.inputs[0] = HostTensor::float(x.dtype(), moved);
    sample
}

inventory::submit! {
    op_def! {
        name: "polygamma",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: FLOATS,
        infer: infer_polygamma,
        lower: lower_polygamma,
        reference: |x, attrs| {
            let (x, n) = (one(x)?, order(attrs)?);
            let out = to_float(x.dtype());
            let f = |v: f64| if v <= -(SHIFT as f64) { f64::NAN } else { special::polygamma(n, v) };
            Ok(vec![map_float(&x.cast(out), out, f)])
        },
        vjp: Some(polygamma_vjp),
        tolerance: polygamma_tolerance,
        samples: || {
            let mut s = unary_samples(FLOATS, 0.3, 6.0);
            // Negative inputs, which take the shifted path.
            s.extend(unary_samples(FLOATS, -9.7, -0.3).into_iter().map(off_the_poles));
            for (i, sample) in s.iter_mut().enumerate() {
                sample.attrs.set("n", (i % 4) as i64);
            }
            s
        },
        arbitrary: |g: &mut Gen| {
            let mut s = off_the_poles(unary_arbitrary(g, FLOATS, -6.0, 6.0));
            s.attrs.set("n", g.below(4) as i64);
            s
        },
        torch: Torch::Expr(r#"torch.polygamma(a["n"], x[0])"#),
    }
}

// ---- zeta ----

/// `chlo.zeta`'s result `z` with the domain's edges made explicit (the
/// plugins disagree there): NaN for `x < 1`; +inf at `x = 1`, at the poles
/// `q = 0, -1, ...`, and where the convergent sum (`x > 1`, `q > 0`)
/// overflows to NaN.
fn lower_zeta_edges(b: &mut Builder, x: &Value, q: &Value, z: &Value) -> Value {
    let (dt, dims) = (x.dtype(), x.dims().to_vec());
    let one = b.constant(dt, &dims[..], 1.0);
    let zero = b.constant(dt, &dims[..], 0.0);
    let below_one = b.compare(Compare::Lt, x, &one);
    let at_one = b.compare(Compare::Eq, x, &one);
    let above_one = b.compare(Compare::Gt, x, &one);
    let q_floor = b.unary("stablehlo.floor", q);
    let q_integer = b.compare(Compare::Eq, q, &q_floor);
    let q_not_positive = b.compare(Compare::Le, q, &zero);
    let pole = b.binary("stablehlo.and", &q_integer, &q_not_positive);
    let pole = b.binary("stablehlo.and", &pole, &above_one);
    let q_positive = b.compare(Compare::Gt, q, &zero);
    let nan = b.compare(Compare::Ne, z, z);
    let overflow = b.binary("stablehlo.and", &above_one, &q_positive);
    let overflow = b.binary("stablehlo.and", &overflow, &nan);
    let infinite = b.binary("stablehlo.or", &at_one, &pole);
    let infinite = b.binary("stablehlo.or", &infinite, &overflow);
    let inf = b.constant(dt, &dims[..], f64::INFINITY);
    let not_a_number = b.constant(dt, &dims[..], f64::NAN);
    let z = b.select(&infinite, &inf, z);
    b.select(&below_one, &not_a_number, &z)
}

/// Broadcasting pairs with `x` in (1, 6] and `q` in (0, 4], plus the poles
/// and the domain edges (`x = 1`, `x < 1`, `q` a non-positive integer,
/// negative `q` with fractional and integer `x`).
#[cfg(feature = "conformance")]
fn zeta_samples() -> Vec<Sample> {
    let mut samples: Vec<Sample> = binary_samples(FLOATS)
        .into_iter()
        .map(|mut s| {
            s.inputs[0] = map_float(&s.inputs[0], s.inputs[0].dtype(), |v| {
                1.25 + (v.abs() % 4.5)
            });
            s.inputs[1] = map_float(&s.inputs[1], s.inputs[1].dtype(), |v| {
                0.25 + (v.abs() % 3.5)
            });
            s
        })
        .collect();
    let x = [2.0, 2.0, 2.0, 1.0, 0.5, 3.0, 2.5, 4.0, 7.0, 1.5];
    let q = [1.0, 0.0, -1.0, 1.0, 1.0, -1.5, -1.5, 0.5, 30.0, 0.001];
    for &dtype in &[DType::F32, DType::F64] {
        let t = |v: &[f64]| HostTensor::from_f64(dtype, [v.len()], v.to_vec());
        if let (Some(x), Some(q)) = (t(&x), t(&q)) {
            samples.push(Sample::new(vec![x, q], Attrs::new()));
        }
    }
    samples
}

inventory::submit! {
    op_def! {
        name: "zeta",
        arity: Arity::Exactly(2),
        // PyTorch has no gradient for `x`, and this op none for either.
        flags: Flags::ELEMENTWISE.union(Flags::NOT_DIFFERENTIABLE),
        dtypes: FLOATS,
        infer: |x, _| Ok(vec![infer_binary(x, FLOATS, true)?]),
        lower: |b, x, _| Ok(lower_arith(b, x, true, |b, s, q| {
            // chlo.zeta in f32 for f16 and bf16, whose range it overflows.
            let dtype = s.dtype();
            let wide = if matches!(dtype, DType::F16 | DType::BF16) { DType::F32 } else { dtype };
            let (s, q) = (b.convert(s, wide), b.convert(q, wide));
            let z = b.binary("chlo.zeta", &s, &q);
            let z = lower_zeta_edges(b, &s, &q, &z);
            b.convert(&z, dtype)
        })),
        reference: |x, _| {
            let dtype = promote(&x[0].ty(), &x[1].ty());
            Ok(vec![binary(&x[0], &x[1], dtype, dtype, special::zeta, |_, _| 0)?])
        },
        tolerance: |d| transcendental(d).scaled(4.0),
        samples: zeta_samples,
        arbitrary: |g: &mut Gen| binary_arbitrary(g, FLOATS),
        torch: Torch::Expr("torch.special.zeta(x[0], x[1])"),
    }
}
