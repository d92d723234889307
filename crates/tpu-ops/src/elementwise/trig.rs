//! Inverse trigonometric and hyperbolic functions, lowered to CHLO (which
//! XLA expands with care near the branch points) and referenced against
//! Rust's `f64`.

#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::{Arity, Flags, OpResult, Tape, Torch, Var};
use tpu_core::stablehlo::{Builder, Compare, Value};

use super::unary::{
    C64, chain, float_op, float_or_complex_ref, infer_float, lower_float, transcendental,
};
use crate::support::*;

/// `1 / sqrt(s)` where `s` is `sign * x² + offset`.
fn rsqrt_of(t: &mut dyn Tape, x: Var, sign: f64, offset: f64) -> OpResult<Var> {
    let s = one_plus(t, x, sign, offset)?;
    t.unary("rsqrt", s)
}

/// `sign * x² + offset`.
fn one_plus(t: &mut dyn Tape, x: Var, sign: f64, offset: f64) -> OpResult<Var> {
    let x2 = t.mul(x, x)?;
    let x2 = t.scale(x2, sign)?;
    let c = t.full_like(x, offset)?;
    t.add(x2, c)
}

float_op!("sinh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.sinh"),
    reference: f64::sinh,
    complex: |z: C64| z.sinh(),
    vjp: |t, a| chain(t, a, |t, x, _| t.unary("cosh", x)),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.sinh(x[0])");

float_op!("cosh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.cosh"),
    reference: f64::cosh,
    complex: |z: C64| z.cosh(),
    vjp: |t, a| chain(t, a, |t, x, _| t.unary("sinh", x)),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.cosh(x[0])");

float_op!("asin",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.asin"),
    reference: f64::asin,
    complex: |z: C64| z.asin(),
    vjp: |t, a| chain(t, a, |t, x, _| rsqrt_of(t, x, -1.0, 1.0)),
    range: (-0.95, 0.95), tolerance: transcendental,
    torch: "torch.asin(x[0])");

float_op!("acos",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.acos"),
    reference: f64::acos,
    complex: |z: C64| z.acos(),
    vjp: |t, a| chain(t, a, |t, x, _| {
        let d = rsqrt_of(t, x, -1.0, 1.0)?;
        t.neg(d)
    }),
    range: (-0.95, 0.95), tolerance: transcendental,
    torch: "torch.acos(x[0])");

/// `atan(x)`. Real: as atan2(x, 1), with the 1 computed as (x == x) rather
/// than a constant: the XLA CPU plugin gets chlo.atan and atan2 of a
/// constant 1 wrong for |x| > 1 (it returns x or ±π/2), and NaN stays NaN
/// this way. Complex: `(i/2) (log(1 - iz) - log(1 + iz))`.
fn lower_atan(b: &mut Builder, x: &Value) -> Value {
    let x = b.convert(x, to_float(x.dtype()));
    if x.dtype().is_complex() {
        let part = x.dtype().real_part();
        let zero = b.constant(part, x.dims(), 0.0);
        let one = b.constant(part, x.dims(), 1.0);
        let half = b.constant(part, x.dims(), 0.5);
        let i = b.complex(&zero, &one);
        let half_i = b.complex(&zero, &half);
        let one = b.complex(&one, &zero);
        let iz = b.binary("stablehlo.multiply", &i, &x);
        let below = b.binary("stablehlo.subtract", &one, &iz);
        let above = b.binary("stablehlo.add", &one, &iz);
        let below = b.unary("stablehlo.log", &below);
        let above = b.unary("stablehlo.log", &above);
        let diff = b.binary("stablehlo.subtract", &below, &above);
        return b.binary("stablehlo.multiply", &half_i, &diff);
    }
    let finite_or_inf = b.compare(Compare::Eq, &x, &x);
    let one = b.convert(&finite_or_inf, x.dtype());
    b.binary("stablehlo.atan2", &x, &one)
}

float_op!("atan",
    lower: lower_atan,
    reference: f64::atan,
    complex: |z: C64| z.atan(),
    vjp: |t, a| {
        let d = one_plus(t, a.inputs[0], 1.0, 1.0)?;
        let d = t.conj(d)?;
        Ok(vec![Some(t.div(a.grads[0], d)?)])
    },
    range: (-4.0, 4.0), tolerance: transcendental,
    torch: "torch.atan(x[0])");

float_op!("asinh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.asinh"),
    reference: f64::asinh,
    complex: |z: C64| z.asinh(),
    vjp: |t, a| chain(t, a, |t, x, _| rsqrt_of(t, x, 1.0, 1.0)),
    range: (-4.0, 4.0), tolerance: transcendental,
    torch: "torch.asinh(x[0])");

float_op!("acosh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.acosh"),
    reference: f64::acosh,
    complex: |z: C64| z.acosh(),
    vjp: |t, a| chain(t, a, |t, x, _| rsqrt_of(t, x, 1.0, -1.0)),
    range: (1.1, 5.0), tolerance: transcendental,
    torch: "torch.acosh(x[0])");

float_op!("atanh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.atanh"),
    reference: f64::atanh,
    complex: |z: C64| z.atanh(),
    vjp: |t, a| {
        let d = one_plus(t, a.inputs[0], -1.0, 1.0)?;
        let d = t.conj(d)?;
        Ok(vec![Some(t.div(a.grads[0], d)?)])
    },
    range: (-0.9, 0.9), tolerance: transcendental,
    torch: "torch.atanh(x[0])");
