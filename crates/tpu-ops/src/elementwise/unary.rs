//! Unary math. Integer inputs of float functions are computed in f32, as
//! PyTorch does.

use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::special::erf;
use crate::support::*;

/// The complex numbers references compute in.
pub(super) type C64 = tpu_core::Complex<f64>;

fn one_type(inputs: &[TensorType]) -> OpResult<&TensorType> {
    inputs.first().ok_or_else(|| "missing input".into())
}

/// Float functions: numeric input, float output (complex in, complex out
/// for the functions that list complex dtypes; dispatch refuses the rest).
pub(super) fn infer_float(inputs: &[TensorType], _: &Attrs) -> OpResult<Vec<TensorType>> {
    let x = one_type(inputs)?;
    require_dtype(x.dtype, NUMERIC_OR_COMPLEX, "input")?;
    Ok(vec![TensorType::new(to_float(x.dtype), x.shape.clone())])
}

/// Same-dtype functions over `allowed`.
fn infer_same(inputs: &[TensorType], allowed: &[DType]) -> OpResult<Vec<TensorType>> {
    let x = one_type(inputs)?;
    require_dtype(x.dtype, allowed, "input")?;
    Ok(vec![x.clone()])
}

/// Predicates: any allowed dtype in, bool out.
fn infer_predicate(inputs: &[TensorType], allowed: &[DType]) -> OpResult<Vec<TensorType>> {
    let x = one_type(inputs)?;
    require_dtype(x.dtype, allowed, "input")?;
    Ok(vec![TensorType::new(DType::Bool, x.shape.clone())])
}

/// Lowers a float function: convert to float, then `op`.
pub(super) fn lower_float(b: &mut Builder, x: &Value, op: &str) -> Value {
    let x = b.convert(x, to_float(x.dtype()));
    b.unary(op, &x)
}

pub(super) fn float_ref(inputs: &[HostTensor], f: fn(f64) -> f64) -> OpResult<Vec<HostTensor>> {
    let x = one(inputs)?;
    if x.dtype().is_complex() {
        return Err(complex_unsupported());
    }
    let out = to_float(x.dtype());
    Ok(vec![map_float(&x.cast(out), out, f)])
}

/// [`float_ref`], with `fc` for complex inputs.
pub(super) fn float_or_complex_ref(
    inputs: &[HostTensor],
    f: fn(f64) -> f64,
    fc: fn(C64) -> C64,
) -> OpResult<Vec<HostTensor>> {
    let x = one(inputs)?;
    if !x.dtype().is_complex() {
        return float_ref(inputs, f);
    }
    Ok(vec![HostTensor::complex(
        x.dtype(),
        x.to_complex().mapv(fc),
    )])
}

/// Transcendental functions get a few more ulps than arithmetic.
pub(super) fn transcendental(d: DType) -> Tolerance {
    let t = Tolerance::for_dtype(d);
    if d.real_part() == DType::F32 {
        t.scaled(10.0)
    } else {
        t.scaled(2.0)
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn gelu_exact(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// `g * conj(f'(x))` where `f'` is built on the tape from `x` and
/// `y = f(x)`: for a holomorphic `f` the conjugate is PyTorch's convention
/// for complex gradients, and a no-op for real ones.
pub(super) fn chain(
    t: &mut dyn Tape,
    a: &VjpArgs<'_>,
    derivative: impl FnOnce(&mut dyn Tape, Var, Var) -> OpResult<Var>,
) -> OpResult<Vec<Option<Var>>> {
    let d = derivative(t, a.inputs[0], a.outputs[0])?;
    let d = t.conj(d)?;
    let g = t.mul(a.grads[0], d)?;
    Ok(vec![Some(g)])
}

fn zero_grad(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    Ok(vec![Some(t.full_like(a.inputs[0], 0.0)?)])
}

/// A unary float function's record. With `complex: fc` it also takes
/// complex inputs (`fc` their reference; the lowering must accept them).
macro_rules! float_op {
    ($name:literal, lower: $lower:expr, reference: $f:expr, vjp: $vjp:expr, range: ($lo:expr, $hi:expr), tolerance: $tol:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::ELEMENTWISE,
                dtypes: NUMERIC,
                infer: infer_float,
                lower: |b, x, _| Ok(vec![$lower(b, &x[0])]),
                reference: |x, _| float_ref(x, $f),
                vjp: Some($vjp),
                tolerance: $tol,
                samples: || unary_samples(FLOATS, $lo, $hi),
                arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC, $lo, $hi),
                torch: Torch::Expr($torch),
            }
        }
    };
    ($name:literal, lower: $lower:expr, reference: $f:expr, complex: $fc:expr, vjp: $vjp:expr, range: ($lo:expr, $hi:expr), tolerance: $tol:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::ELEMENTWISE,
                dtypes: NUMERIC_OR_COMPLEX,
                infer: infer_float,
                lower: |b, x, _| Ok(vec![$lower(b, &x[0])]),
                reference: |x, _| float_or_complex_ref(x, $f, $fc),
                vjp: Some($vjp),
                tolerance: $tol,
                samples: || {
                    let mut s = unary_samples(FLOATS, $lo, $hi);
                    s.extend(unary_samples(COMPLEX, $lo, $hi));
                    s
                },
                arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC_OR_COMPLEX, $lo, $hi),
                torch: Torch::Expr($torch),
            }
        }
    };
}
pub(super) use float_op;

float_op!("exp",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.exponential"),
    reference: f64::exp,
    complex: |z: C64| z.exp(),
    vjp: |t, a| chain(t, a, |_, _, y| Ok(y)),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.exp(x[0])");

float_op!("expm1",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.exponential_minus_one"),
    reference: f64::exp_m1,
    complex: |z: C64| z.exp() - 1.0,
    vjp: |t, a| chain(t, a, |t, x, _| t.unary("exp", x)),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.expm1(x[0])");

float_op!("log",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.log"),
    reference: f64::ln,
    complex: |z: C64| z.ln(),
    vjp: |t, a| {
        let x = t.conj(a.inputs[0])?;
        Ok(vec![Some(t.div(a.grads[0], x)?)])
    },
    range: (0.1, 5.0), tolerance: transcendental,
    torch: "torch.log(x[0])");

float_op!("log1p",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.log_plus_one"),
    reference: f64::ln_1p,
    complex: |z: C64| (z + 1.0).ln(),
    vjp: |t, a| {
        let one = t.full_like(a.inputs[0], 1.0)?;
        let d = t.add(a.inputs[0], one)?;
        let d = t.conj(d)?;
        Ok(vec![Some(t.div(a.grads[0], d)?)])
    },
    range: (-0.5, 5.0), tolerance: transcendental,
    torch: "torch.log1p(x[0])");

float_op!("sqrt",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.sqrt"),
    reference: f64::sqrt,
    complex: |z: C64| z.sqrt(),
    vjp: |t, a| {
        let two_y = t.scale(a.outputs[0], 2.0)?;
        let two_y = t.conj(two_y)?;
        Ok(vec![Some(t.div(a.grads[0], two_y)?)])
    },
    range: (0.1, 5.0), tolerance: transcendental,
    torch: "torch.sqrt(x[0])");

float_op!("rsqrt",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.rsqrt"),
    reference: |x| 1.0 / x.sqrt(),
    complex: |z: C64| z.sqrt().inv(),
    vjp: |t, a| chain(t, a, |t, _, y| {
        let y2 = t.mul(y, y)?;
        let y3 = t.mul(y2, y)?;
        t.scale(y3, -0.5)
    }),
    range: (0.1, 5.0), tolerance: transcendental,
    torch: "torch.rsqrt(x[0])");

float_op!("reciprocal",
    lower: |b: &mut Builder, x: &Value| {
        let x = b.convert(x, to_float(x.dtype()));
        let one = b.constant(x.dtype(), x.dims(), 1.0);
        b.binary("stablehlo.divide", &one, &x)
    },
    reference: |x| 1.0 / x,
    complex: |z: C64| z.inv(),
    vjp: |t, a| chain(t, a, |t, _, y| {
        let y2 = t.mul(y, y)?;
        t.neg(y2)
    }),
    range: (0.2, 3.0), tolerance: Tolerance::for_dtype,
    torch: "torch.reciprocal(x[0])");

float_op!("sin",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.sine"),
    reference: f64::sin,
    complex: |z: C64| z.sin(),
    vjp: |t, a| chain(t, a, |t, x, _| t.unary("cos", x)),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.sin(x[0])");

float_op!("cos",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.cosine"),
    reference: f64::cos,
    complex: |z: C64| z.cos(),
    vjp: |t, a| chain(t, a, |t, x, _| {
        let s = t.unary("sin", x)?;
        t.neg(s)
    }),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.cos(x[0])");

float_op!("tan",
    lower: |b: &mut Builder, x: &Value| {
        let x = b.convert(x, to_float(x.dtype()));
        let s = b.unary("stablehlo.sine", &x);
        let c = b.unary("stablehlo.cosine", &x);
        b.binary("stablehlo.divide", &s, &c)
    },
    reference: f64::tan,
    complex: |z: C64| z.tan(),
    vjp: |t, a| chain(t, a, |t, _, y| {
        let y2 = t.mul(y, y)?;
        let one = t.full_like(y, 1.0)?;
        t.add(one, y2)
    }),
    range: (-1.2, 1.2), tolerance: transcendental,
    torch: "torch.tan(x[0])");

float_op!("tanh",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.tanh"),
    reference: f64::tanh,
    complex: |z: C64| z.tanh(),
    vjp: |t, a| chain(t, a, |t, _, y| {
        let y2 = t.mul(y, y)?;
        let one = t.full_like(y, 1.0)?;
        t.sub(one, y2)
    }),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.tanh(x[0])");

float_op!("sigmoid",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "stablehlo.logistic"),
    reference: sigmoid,
    complex: |z: C64| (C64::new(1.0, 0.0) + (-z).exp()).inv(),
    vjp: |t, a| chain(t, a, |t, _, y| {
        let one = t.full_like(y, 1.0)?;
        let rest = t.sub(one, y)?;
        t.mul(y, rest)
    }),
    range: (-4.0, 4.0), tolerance: transcendental,
    torch: "torch.sigmoid(x[0])");

float_op!("silu",
    lower: |b: &mut Builder, x: &Value| {
        let x = b.convert(x, to_float(x.dtype()));
        let s = b.unary("stablehlo.logistic", &x);
        b.binary("stablehlo.multiply", &x, &s)
    },
    reference: |x| x * sigmoid(x),
    vjp: |t, a| chain(t, a, |t, x, _| {
        // d/dx x s(x) = s (1 + x (1 - s))
        let s = t.unary("sigmoid", x)?;
        let one = t.full_like(x, 1.0)?;
        let rest = t.sub(one, s)?;
        let xr = t.mul(x, rest)?;
        let inner = t.add(one, xr)?;
        t.mul(s, inner)
    }),
    range: (-4.0, 4.0), tolerance: transcendental,
    // F.silu has no integer kernel: integers go to f32 first, as here.
    torch: "F.silu(x[0] if x[0].is_floating_point() else x[0].float())");

float_op!("erf",
    lower: |b: &mut Builder, x: &Value| lower_float(b, x, "chlo.erf"),
    reference: erf,
    vjp: |t, a| chain(t, a, |t, x, _| {
        let x2 = t.mul(x, x)?;
        let n = t.neg(x2)?;
        let e = t.unary("exp", n)?;
        t.scale(e, 2.0 / std::f64::consts::PI.sqrt())
    }),
    range: (-3.0, 3.0), tolerance: transcendental,
    torch: "torch.erf(x[0])");

/// GELU: `approximate = "none"` (erf) or `"tanh"`, as in PyTorch.
fn gelu_mode(attrs: &Attrs) -> OpResult<bool> {
    match attrs.str_or("approximate", "none")? {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => Err(invalid!(
            "approximate must be \"none\" or \"tanh\", got {other:?}"
        )),
    }
}

fn lower_gelu(b: &mut Builder, x: &Value, tanh: bool) -> Value {
    let x = b.convert(x, to_float(x.dtype()));
    let (dt, dims) = (x.dtype(), x.dims().to_vec());
    let half = b.constant(dt, &dims[..], 0.5);
    let one = b.constant(dt, &dims[..], 1.0);
    let inner = if tanh {
        let c = b.constant(dt, &dims[..], (2.0 / std::f64::consts::PI).sqrt());
        let k = b.constant(dt, &dims[..], 0.044715);
        let x2 = b.binary("stablehlo.multiply", &x, &x);
        let x3 = b.binary("stablehlo.multiply", &x2, &x);
        let kx3 = b.binary("stablehlo.multiply", &k, &x3);
        let s = b.binary("stablehlo.add", &x, &kx3);
        let cs = b.binary("stablehlo.multiply", &c, &s);
        b.unary("stablehlo.tanh", &cs)
    } else {
        let r = b.constant(dt, &dims[..], std::f64::consts::FRAC_1_SQRT_2);
        let xr = b.binary("stablehlo.multiply", &x, &r);
        b.unary("chlo.erf", &xr)
    };
    let onep = b.binary("stablehlo.add", &one, &inner);
    let hx = b.binary("stablehlo.multiply", &half, &x);
    b.binary("stablehlo.multiply", &hx, &onep)
}

fn gelu_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = a.inputs[0];
    let d = if gelu_mode(a.attrs)? {
        // y = 0.5 x (1 + tanh(u)), u = c (x + k x^3)
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let x2 = t.mul(x, x)?;
        let x3 = t.mul(x2, x)?;
        let kx3 = t.scale(x3, 0.044715)?;
        let s = t.add(x, kx3)?;
        let u = t.scale(s, c)?;
        let th = t.unary("tanh", u)?;
        let one = t.full_like(x, 1.0)?;
        let left = t.add(one, th)?;
        let left = t.scale(left, 0.5)?;
        let th2 = t.mul(th, th)?;
        let sech2 = t.sub(one, th2)?;
        let k3x2 = t.scale(x2, 3.0 * 0.044715)?;
        let du = t.add(one, k3x2)?;
        let du = t.scale(du, c)?;
        let right = t.mul(sech2, du)?;
        let right = t.mul(x, right)?;
        let right = t.scale(right, 0.5)?;
        t.add(left, right)?
    } else {
        // Phi(x) + x phi(x)
        let xs = t.scale(x, std::f64::consts::FRAC_1_SQRT_2)?;
        let e = t.unary("erf", xs)?;
        let one = t.full_like(x, 1.0)?;
        let cdf = t.add(one, e)?;
        let cdf = t.scale(cdf, 0.5)?;
        let x2 = t.mul(x, x)?;
        let h = t.scale(x2, -0.5)?;
        let pdf = t.unary("exp", h)?;
        let pdf = t.scale(pdf, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let xpdf = t.mul(x, pdf)?;
        t.add(cdf, xpdf)?
    };
    Ok(vec![Some(t.mul(a.grads[0], d)?)])
}

inventory::submit! {
    op_def! {
        name: "gelu",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: FLOATS,
        infer: |x, attrs| {
            gelu_mode(attrs)?;
            infer_float(x, attrs)
        },
        lower: |b, x, attrs| Ok(vec![lower_gelu(b, &x[0], gelu_mode(attrs)?)]),
        reference: |x, attrs| {
            let f = if gelu_mode(attrs)? { gelu_tanh } else { gelu_exact };
            float_ref(x, f)
        },
        vjp: Some(gelu_vjp),
        tolerance: transcendental,
        samples: || {
            let mut s = unary_samples(FLOATS, -4.0, 4.0);
            for sample in s.iter_mut().skip(1).step_by(2) {
                sample.attrs.set("approximate", "tanh");
            }
            s
        },
        arbitrary: |g: &mut Gen| {
            let mut s = unary_arbitrary(g, FLOATS, -4.0, 4.0);
            s.attrs.set("approximate", g.pick(&["none", "tanh"]));
            s
        },
        torch: Torch::Expr(r#"F.gelu(x[0], approximate=a.get("approximate", "none"))"#),
    }
}

// ---- Same-dtype ops. ----

macro_rules! same_op {
    ($name:literal, dtypes: $dtypes:expr, lower: $lower:expr, reference: ($ff:expr, $fi:expr), vjp: $vjp:expr, range: ($lo:expr, $hi:expr), torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::ELEMENTWISE,
                dtypes: $dtypes,
                infer: |x, _| infer_same(x, $dtypes),
                lower: |b, x, _| Ok(vec![$lower(b, &x[0])]),
                reference: |x, _| Ok(vec![map_same(one(x)?, $ff, $fi)]),
                vjp: $vjp,
                samples: || unary_samples($dtypes, $lo, $hi),
                arbitrary: |g: &mut Gen| unary_arbitrary(g, $dtypes, $lo, $hi),
                torch: Torch::Expr($torch),
            }
        }
    };
}

same_op!("sign", dtypes: SIGNED,
    lower: |b: &mut Builder, x: &Value| b.unary("stablehlo.sign", x),
    reference: (|x: f64| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x }, i64::signum),
    vjp: Some(zero_grad),
    range: (-3.0, 3.0),
    torch: "torch.sign(x[0])");

same_op!("floor", dtypes: FLOATS,
    lower: |b: &mut Builder, x: &Value| b.unary("stablehlo.floor", x),
    reference: (f64::floor, |x| x),
    vjp: Some(zero_grad),
    range: (-5.0, 5.0),
    torch: "torch.floor(x[0])");

same_op!("ceil", dtypes: FLOATS,
    lower: |b: &mut Builder, x: &Value| b.unary("stablehlo.ceil", x),
    reference: (f64::ceil, |x| x),
    vjp: Some(zero_grad),
    range: (-5.0, 5.0),
    torch: "torch.ceil(x[0])");

same_op!("round", dtypes: FLOATS,
    lower: |b: &mut Builder, x: &Value| b.unary("stablehlo.round_nearest_even", x),
    reference: (f64::round_ties_even, |x| x),
    vjp: Some(zero_grad),
    range: (-5.0, 5.0),
    torch: "torch.round(x[0])");

same_op!("relu", dtypes: NUMERIC,
    lower: |b: &mut Builder, x: &Value| {
        let zero = b.constant(x.dtype(), x.dims(), 0.0);
        b.binary("stablehlo.maximum", x, &zero)
    },
    reference: (|x: f64| x.max(0.0), |x: i64| x.max(0)),
    vjp: Some(|t, a| chain(t, a, |t, x, _| {
        let zero = t.full_like(x, 0.0)?;
        let mask = t.call1("gt", &[x, zero], Attrs::new())?;
        let dt = t.ty(x)?.dtype;
        t.cast(mask, dt)
    })),
    range: (-3.0, 3.0),
    torch: "torch.relu(x[0])");

// ---- Predicates. ----

/// Float samples with NaN, infinities and signed zeros mixed in.
#[cfg(feature = "conformance")]
fn special_samples() -> Vec<Sample> {
    let values = vec![
        0.0,
        -0.0,
        1.5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -2.0,
        1e30,
    ];
    FLOATS
        .iter()
        .map(|&d| {
            Sample::new(
                vec![
                    tensor_f64(d, &[8], values.clone())
                        .unwrap_or_else(|_| HostTensor::scalar(d, 0.0)),
                ],
                Attrs::new(),
            )
        })
        .collect()
}

#[cfg(feature = "conformance")]
fn special_arbitrary(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let shape = g.shape(0, 3);
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
    let values: Vec<f64> = (0..shape.numel())
        .map(|_| {
            if g.below(3) == 0 {
                g.pick(&specials)
            } else {
                g.uniform(-3.0, 3.0)
            }
        })
        .collect();
    let x = HostTensor::from_f64(dtype, shape, values)
        .unwrap_or_else(|| HostTensor::scalar(dtype, 0.0));
    Sample::new(vec![x], Attrs::new())
}

inventory::submit! {
    op_def! {
        name: "isnan",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: FLOATS,
        infer: |x, _| infer_predicate(x, FLOATS),
        lower: |b, x, _| Ok(vec![b.compare(Compare::Ne, &x[0], &x[0])]),
        reference: |x, _| Ok(vec![map_predicate(one(x)?, f64::is_nan, |_| false)]),
        samples: special_samples,
        arbitrary: special_arbitrary,
        torch: Torch::Expr("torch.isnan(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "isinf",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: FLOATS,
        infer: |x, _| infer_predicate(x, FLOATS),
        lower: |b, x, _| {
            let x = &x[0];
            let a = b.unary("stablehlo.abs", x);
            let inf = b.constant(x.dtype(), x.dims(), f64::INFINITY);
            Ok(vec![b.compare(Compare::Eq, &a, &inf)])
        },
        reference: |x, _| Ok(vec![map_predicate(one(x)?, f64::is_infinite, |_| false)]),
        samples: special_samples,
        arbitrary: special_arbitrary,
        torch: Torch::Expr("torch.isinf(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "logical_not",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        infer: |x, _| infer_predicate(x, REAL),
        lower: |b, x, _| {
            let x = &x[0];
            let zero = b.constant(x.dtype(), x.dims(), 0.0);
            Ok(vec![b.compare(Compare::Eq, x, &zero)])
        },
        reference: |x, _| Ok(vec![map_predicate(one(x)?, |v| v == 0.0, |v| v == 0)]),
        samples: || unary_samples(REAL, -2.0, 2.0),
        arbitrary: |g: &mut Gen| unary_arbitrary(g, REAL, -2.0, 2.0),
        torch: Torch::Expr("torch.logical_not(x[0])"),
    }
}
