//! Modified Bessel functions of integer order ν ∈ {0, 1}: `I_ν` (`i0`,
//! `i1`) and `K_ν` (`modified_bessel_k0`, `modified_bessel_k1`), their
//! exponentially scaled forms (`i0e`, `i1e`: `e^{-|x|} I_ν`;
//! `scaled_modified_bessel_k0`, `_k1`: `e^x K_ν`), and the spherical
//! `j₀(x) = sin(x) / x`.
//!
//! One method for every dtype, on the device (f16 and bf16 in f32) and in
//! the f64 reference alike, accurate to about 1e-15 in f64:
//!
//! - `e^{-x} I_ν(x) = (1/π) ∫₀^π e^{x(cos θ - 1)} cos νθ dθ` for
//!   `x <= 30`, by the trapezoidal rule on [`I_NODES`] intervals, which for
//!   this periodic integrand converges geometrically (ν = 1 integrates
//!   `e^{-x} expm1(x cos θ) cos θ`, the same integral without the
//!   cancellation at small `x`); beyond, the asymptotic series
//!   `(2πx)^{-1/2} Σ c_k x^{-k}`.
//! - `e^x K_ν(x)` for `x <= 2` from the ascending series (A&S 9.6.11 and
//!   9.6.13) over `I_ν`; up to 30 the trapezoidal rule on
//!   `∫₀^∞ e^{-x(cosh t - 1)} cosh νt dt`; beyond, the asymptotic series
//!   `(π/2x)^{1/2} Σ c_k x^{-k}`.
//!
//! `i0(±∞)` is `+∞` and `i1(±∞)` is `±∞`, their limits, where PyTorch's CPU
//! kernels give NaN.

use std::f64::consts::PI;
use tpu_core::op_def;

use tpu_core::DType;
use tpu_core::host::Tolerance;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, Value};

use super::lanes::Lanes;
use super::special::{EULER_GAMMA, harmonic};
use super::unary::{chain, float_ref, infer_float, transcendental};
use crate::support::*;

/// Intervals of the trapezoidal rule for `I_ν` on `[0, π]`.
const I_NODES: usize = 64;
/// Steps of the trapezoidal rule for `K_ν` on `[0, K_SPAN]`.
const K_STEPS: usize = 128;
/// Where `e^{-x(cosh t - 1)}` is below 1e-17 for every `x >= 2`.
const K_SPAN: f64 = 4.0;
/// Past this, the asymptotic series (16 terms) is exact to f64 rounding.
const LARGE: f64 = 30.0;
/// Up to this, `K_ν` comes from its ascending series (15 terms).
const SMALL: f64 = 2.0;
const ASYMPTOTIC_TERMS: usize = 16;
const SERIES_TERMS: usize = 15;

/// The first `n` coefficients `a_k(ν) = Π_{j≤k} (4ν² - (2j-1)²) / (k! 8^k)`
/// of the Bessel functions' asymptotic expansions (Hankel's for `J`, `Y`).
pub(super) fn asymptotic_terms(nu: u32, n: usize) -> Vec<f64> {
    let mut a = vec![1.0];
    for k in 1..n {
        let j = (2 * k - 1) as f64;
        a.push(a[k - 1] * (4.0 * f64::from(nu * nu) - j * j) / (8.0 * k as f64));
    }
    a
}

/// `c_k` of the asymptotic series: `a_k(ν)`, times `(-1)^k` for `I`.
fn asymptotic_coefficients(nu: u32, alternate: bool) -> Vec<f64> {
    let a = asymptotic_terms(nu, ASYMPTOTIC_TERMS);
    let sign = |k: usize| if alternate && k % 2 == 1 { -1.0 } else { 1.0 };
    a.iter().enumerate().map(|(k, ak)| sign(k) * ak).collect()
}

/// The trapezoidal rule on `[0, π]` over [`I_NODES`] intervals, for the
/// periodic integrands of `I_ν` and `J_ν`: `(θ_j, w_j)` with `Σ w_j = 1`,
/// so the sum is the integral divided by `π`.
pub(super) fn half_period_nodes() -> impl Iterator<Item = (f64, f64)> {
    (0..=I_NODES).map(|j| {
        let end = j == 0 || j == I_NODES;
        let w = if end { 0.5 } else { 1.0 } / I_NODES as f64;
        (j as f64 * PI / I_NODES as f64, w)
    })
}

/// `(cos θ_j, w_j)` of [`half_period_nodes`], for `I_ν`.
fn i_nodes() -> impl Iterator<Item = (f64, f64)> {
    half_period_nodes().map(|(theta, w)| (theta.cos(), w))
}

/// Trapezoid nodes and weights for `K_ν`: `(cosh t_j - 1, cosh νt_j · w_j)`.
fn k_nodes(nu: u32) -> impl Iterator<Item = (f64, f64)> {
    let h = K_SPAN / K_STEPS as f64;
    (0..=K_STEPS).map(move |j| {
        let t = j as f64 * h;
        let w = if j == 0 { 0.5 } else { 1.0 } * h;
        (t.cosh() - 1.0, (f64::from(nu) * t).cosh() * w)
    })
}

// ---- f64 reference ----

/// `e^{-x} I_ν(x)` for `x >= 0`.
fn i_scaled(nu: u32, x: f64) -> f64 {
    if x > LARGE {
        let c = asymptotic_coefficients(nu, true);
        let sum: f64 = c.iter().rev().fold(0.0, |acc, &ck| acc / x + ck);
        return sum / (2.0 * PI * x).sqrt();
    }
    let sum: f64 = i_nodes()
        .map(|(c, w)| {
            w * if nu == 0 {
                (x * (c - 1.0)).exp()
            } else {
                (x * c).exp_m1() * c
            }
        })
        .sum();
    if nu == 0 { sum } else { sum * (-x).exp() }
}

/// `e^x K_ν(x)` for `x > 0`.
fn k_scaled(nu: u32, x: f64) -> f64 {
    if x > LARGE {
        let c = asymptotic_coefficients(nu, false);
        let sum: f64 = c.iter().rev().fold(0.0, |acc, &ck| acc / x + ck);
        return sum * (PI / (2.0 * x)).sqrt();
    }
    if x > SMALL {
        return k_nodes(nu).map(|(c, w)| (-x * c).exp() * w).sum();
    }
    let q = x * x / 4.0;
    let h = harmonic(SERIES_TERMS + 1);
    let i = i_scaled(nu, x) * x.exp();
    let k = if nu == 0 {
        let mut term = 1.0;
        let mut sum = 0.0;
        for (k, hk) in h.iter().enumerate().take(SERIES_TERMS + 1).skip(1) {
            term *= q / (k * k) as f64;
            sum += hk * term;
        }
        -((x / 2.0).ln() + EULER_GAMMA) * i + sum
    } else {
        // ψ(k + 1) + ψ(k + 2) = H_k + H_{k+1} - 2γ.
        let mut term = 1.0;
        let mut sum = 0.0;
        for k in 0..=SERIES_TERMS {
            if k > 0 {
                term *= q / (k * (k + 1)) as f64;
            }
            sum += (h[k] + h[k + 1] - 2.0 * EULER_GAMMA) * term;
        }
        1.0 / x + (x / 2.0).ln() * i - x / 4.0 * sum
    };
    k * x.exp()
}

/// Which function of the family, as the reference and lowering need it.
#[derive(Clone, Copy)]
enum Kind {
    /// `I_ν`, scaled by `e^{-|x|}` or not.
    I { nu: u32, scaled: bool },
    /// `K_ν`, scaled by `e^x` or not.
    K { nu: u32, scaled: bool },
}

fn reference(kind: Kind, x: f64) -> f64 {
    match kind {
        Kind::I { nu, scaled } => {
            let sign = if nu == 1 && x < 0.0 { -1.0 } else { 1.0 };
            let a = x.abs();
            if a.is_infinite() {
                return if scaled { 0.0 } else { sign * f64::INFINITY };
            }
            let s = i_scaled(nu, a);
            sign * if scaled {
                s
            } else {
                s * (a / 2.0).exp() * (a / 2.0).exp()
            }
        }
        Kind::K { nu, scaled } => {
            if x.is_nan() || x < 0.0 {
                return f64::NAN;
            }
            if x == 0.0 {
                return f64::INFINITY;
            }
            if x.is_infinite() {
                return 0.0;
            }
            let s = k_scaled(nu, x);
            if scaled { s } else { s * (-x).exp() }
        }
    }
}

// ---- lowering ----

/// `e^{-x} I_ν(x)` for `x >= 0` (both regimes, selected).
fn lower_i_scaled(o: &mut Lanes<'_>, nu: u32, x: &Value) -> Value {
    let mut sum = o.c(0.0);
    for (c, w) in i_nodes() {
        let term = if nu == 0 {
            let t = o.scale(x, c - 1.0);
            o.un("stablehlo.exponential", &t)
        } else {
            let t = o.scale(x, c);
            let t = o.un("stablehlo.exponential_minus_one", &t);
            o.scale(&t, c)
        };
        let term = o.scale(&term, w);
        sum = o.add(&sum, &term);
    }
    let near = if nu == 0 {
        sum
    } else {
        let minus = o.un("stablehlo.negate", x);
        let e = o.un("stablehlo.exponential", &minus);
        o.mul(&sum, &e)
    };
    let series = o.series_in_inverse(x, &asymptotic_coefficients(nu, true));
    let two_pi_x = o.scale(x, 2.0 * PI);
    let root = o.un("stablehlo.rsqrt", &two_pi_x);
    let far = o.mul(&series, &root);
    o.select_if(Compare::Gt, x, LARGE, &far, &near)
}

/// `e^x K_ν(x)` for `x > 0` (all three regimes, selected).
fn lower_k_scaled(o: &mut Lanes<'_>, nu: u32, x: &Value) -> Value {
    // Ascending series, for x <= 2.
    let half = o.scale(x, 0.5);
    let log_half = o.un("stablehlo.log", &half);
    let i = lower_i_scaled(o, nu, x);
    let ex = o.un("stablehlo.exponential", x);
    let i = o.mul(&i, &ex);
    let x2 = o.mul(x, x);
    let q = o.scale(&x2, 0.25);
    let h = harmonic(SERIES_TERMS + 1);
    let mut term = o.c(1.0);
    let mut sum = o.c(0.0);
    let small = if nu == 0 {
        for (k, &hk) in h.iter().enumerate().take(SERIES_TERMS + 1).skip(1) {
            let t = o.scale(&q, 1.0 / (k * k) as f64);
            term = o.mul(&term, &t);
            let s = o.scale(&term, hk);
            sum = o.add(&sum, &s);
        }
        let g = o.c(EULER_GAMMA);
        let lg = o.add(&log_half, &g);
        let li = o.mul(&lg, &i);
        o.bin("stablehlo.subtract", &sum, &li)
    } else {
        for k in 0..=SERIES_TERMS {
            if k > 0 {
                let t = o.scale(&q, 1.0 / (k * (k + 1)) as f64);
                term = o.mul(&term, &t);
            }
            let s = o.scale(&term, h[k] + h[k + 1] - 2.0 * EULER_GAMMA);
            sum = o.add(&sum, &s);
        }
        let one = o.c(1.0);
        let inv = o.bin("stablehlo.divide", &one, x);
        let li = o.mul(&log_half, &i);
        let xs = o.scale(x, 0.25);
        let xs = o.mul(&xs, &sum);
        let k = o.add(&inv, &li);
        o.bin("stablehlo.subtract", &k, &xs)
    };
    let small = o.mul(&small, &ex);
    // Trapezoidal rule, for 2 < x <= 30.
    let mut mid = o.c(0.0);
    for (c, w) in k_nodes(nu) {
        let t = o.scale(x, -c);
        let t = o.un("stablehlo.exponential", &t);
        let t = o.scale(&t, w);
        mid = o.add(&mid, &t);
    }
    // Asymptotic series, beyond.
    let series = o.series_in_inverse(x, &asymptotic_coefficients(nu, false));
    let inv_x = {
        let one = o.c(1.0);
        o.bin("stablehlo.divide", &one, x)
    };
    let root = o.scale(&inv_x, PI / 2.0);
    let root = o.un("stablehlo.sqrt", &root);
    let far = o.mul(&series, &root);
    let upper = o.select_if(Compare::Gt, x, LARGE, &far, &mid);
    o.select_if(Compare::Gt, x, SMALL, &upper, &small)
}

fn lower(b: &mut Builder, x: &Value, kind: Kind) -> Value {
    let (mut o, x, out) = Lanes::for_input(b, x);
    let result = match kind {
        Kind::I { nu, scaled } => {
            let a = o.un("stablehlo.abs", &x);
            let s = lower_i_scaled(&mut o, nu, &a);
            // e^{|x|} in two halves, so I_ν overflows only where it must.
            let v = if scaled {
                s
            } else {
                let h = o.scale(&a, 0.5);
                let e = o.un("stablehlo.exponential", &h);
                let t = o.mul(&s, &e);
                o.mul(&t, &e)
            };
            let v = if nu == 1 {
                let sign = o.un("stablehlo.sign", &x);
                o.mul(&v, &sign)
            } else {
                v
            };
            // At ±∞: 0 scaled, else ±∞ (the series would give 0 · ∞).
            let inf = o.c(f64::INFINITY);
            let at_inf = o.b.compare(Compare::Eq, &a, &inf);
            let limit = if scaled {
                o.c(0.0)
            } else if nu == 1 {
                let sign = o.un("stablehlo.sign", &x);
                o.mul(&inf, &sign)
            } else {
                inf
            };
            o.b.select(&at_inf, &limit, &v)
        }
        Kind::K { nu, scaled } => {
            let s = lower_k_scaled(&mut o, nu, &x);
            let v = if scaled {
                s
            } else {
                let minus = o.un("stablehlo.negate", &x);
                let e = o.un("stablehlo.exponential", &minus);
                o.mul(&s, &e)
            };
            // 0 at +∞, +∞ at 0, NaN below.
            let inf = o.c(f64::INFINITY);
            let zero = o.c(0.0);
            let nan = o.c(f64::NAN);
            let at_inf = o.b.compare(Compare::Eq, &x, &inf);
            let v = o.b.select(&at_inf, &zero, &v);
            let at_zero = o.b.compare(Compare::Eq, &x, &zero);
            let v = o.b.select(&at_zero, &inf, &v);
            let negative = o.b.compare(Compare::Lt, &x, &zero);
            o.b.select(&negative, &nan, &v)
        }
    };
    o.b.convert(&result, out)
}

// ---- backward rules ----

pub(super) fn call(t: &mut dyn Tape, op: &str, x: Var) -> OpResult<Var> {
    t.call1(op, &[x], Attrs::new())
}

/// `a - b / x`, with `limit` where `x` is 0 (the derivatives of the order-1
/// Bessel functions).
pub(super) fn minus_over_x(t: &mut dyn Tape, a: Var, b: Var, x: Var, limit: f64) -> OpResult<Var> {
    let zero = t.full_like(x, 0.0)?;
    let at_zero = t.call1("eq", &[x, zero], Attrs::new())?;
    let one = t.full_like(x, 1.0)?;
    let safe = t.call1("where", &[at_zero, one, x], Attrs::new())?;
    let q = t.div(b, safe)?;
    let d = t.sub(a, q)?;
    let l = t.full_like(x, limit)?;
    t.call1("where", &[at_zero, l, d], Attrs::new())
}

fn i1_derivative(t: &mut dyn Tape, x: Var, y: Var, scaled: bool) -> OpResult<Var> {
    if !scaled {
        let i0 = call(t, "i0", x)?;
        return minus_over_x(t, i0, y, x, 0.5);
    }
    // i1e' = i0e - i1e (sign(x) + 1/x).
    let i0e = call(t, "i0e", x)?;
    let sign = t.unary("sign", x)?;
    let ys = t.mul(y, sign)?;
    let d = t.sub(i0e, ys)?;
    minus_over_x(t, d, y, x, 0.5)
}

fn k_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, nu: u32, scaled: bool) -> OpResult<Vec<Option<Var>>> {
    chain(t, a, |t, x, y| {
        let (k0, k1) = if scaled {
            ("scaled_modified_bessel_k0", "scaled_modified_bessel_k1")
        } else {
            ("modified_bessel_k0", "modified_bessel_k1")
        };
        let d = if nu == 0 {
            let other = call(t, k1, x)?;
            t.neg(other)?
        } else {
            let other = call(t, k0, x)?;
            let neg = t.neg(other)?;
            minus_over_x(t, neg, y, x, f64::NEG_INFINITY)?
        };
        // The scaled forms add their own value: (e^x K)' = e^x K + e^x K'.
        if scaled { t.add(d, y) } else { Ok(d) }
    })
}

// ---- records ----

#[cfg(feature = "conformance")]
fn sample(g: &mut Gen, lo: f64, hi: f64) -> Sample {
    unary_arbitrary(g, FLOATS, lo, hi)
}

/// The regimes' edges and far points, besides the random values; the
/// infinities where PyTorch's answer is the limit (its `i0(±∞)` and
/// `i1(±∞)` are NaN; ours are `±∞`, tested in `tests` below).
#[cfg(feature = "conformance")]
fn samples(kind: Kind) -> Vec<Sample> {
    let mut points = vec![
        0.5,
        1.0,
        SMALL,
        SMALL + 1e-3,
        7.5,
        LARGE - 1e-3,
        LARGE + 1e-3,
        60.0,
        0.0,
    ];
    let (lo, hi) = match kind {
        Kind::I { scaled, .. } => {
            points.extend([-0.5, -3.0, -35.0]);
            if scaled {
                points.extend([f64::INFINITY, f64::NEG_INFINITY]);
            }
            (-12.0, 12.0)
        }
        Kind::K { scaled, .. } => {
            points.extend([1e-3, -1.0]);
            if !scaled {
                points.push(f64::INFINITY);
            }
            (0.05, 12.0)
        }
    };
    let mut out = vec![];
    for (i, &d) in FLOATS.iter().enumerate() {
        if let Ok(x) = tensor_f64(d, &[points.len()], points.clone()) {
            out.push(Sample::new(vec![x], Attrs::new()));
        }
        out.push(sample(&mut Gen::new(3300 + i as u64), lo, hi));
    }
    out
}

fn bessel_tolerance(d: DType) -> Tolerance {
    transcendental(d).scaled(10.0)
}

macro_rules! bessel_op {
    ($name:literal, $kind:expr, vjp: $vjp:expr, range: ($lo:expr, $hi:expr), torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::ELEMENTWISE,
                dtypes: NUMERIC,
                infer: infer_float,
                lower: |b, x, _| Ok(vec![lower(b, &x[0], $kind)]),
                reference: |x, _| float_ref(x, |v| reference($kind, v)),
                vjp: Some($vjp),
                tolerance: bessel_tolerance,
                samples: || samples($kind),
                arbitrary: |g: &mut Gen| sample(g, $lo, $hi),
                torch: Torch::Expr($torch),
            }
        }
    };
}

bessel_op!("i0", Kind::I { nu: 0, scaled: false },
    vjp: |t, a| chain(t, a, |t, x, _| call(t, "i1", x)),
    range: (-12.0, 12.0), torch: "torch.special.i0(x[0])");
bessel_op!("i0e", Kind::I { nu: 0, scaled: true },
    vjp: |t, a| chain(t, a, |t, x, y| {
        let i1e = call(t, "i1e", x)?;
        let sign = t.unary("sign", x)?;
        let ys = t.mul(y, sign)?;
        t.sub(i1e, ys)
    }),
    range: (-12.0, 12.0), torch: "torch.special.i0e(x[0])");
bessel_op!("i1", Kind::I { nu: 1, scaled: false },
    vjp: |t, a| chain(t, a, |t, x, y| i1_derivative(t, x, y, false)),
    range: (-12.0, 12.0), torch: "torch.special.i1(x[0])");
bessel_op!("i1e", Kind::I { nu: 1, scaled: true },
    vjp: |t, a| chain(t, a, |t, x, y| i1_derivative(t, x, y, true)),
    range: (-12.0, 12.0), torch: "torch.special.i1e(x[0])");
bessel_op!("modified_bessel_k0", Kind::K { nu: 0, scaled: false },
    vjp: |t, a| k_vjp(t, a, 0, false),
    range: (0.05, 12.0), torch: "torch.special.modified_bessel_k0(x[0])");
bessel_op!("modified_bessel_k1", Kind::K { nu: 1, scaled: false },
    vjp: |t, a| k_vjp(t, a, 1, false),
    range: (0.05, 12.0), torch: "torch.special.modified_bessel_k1(x[0])");
// PyTorch has no derivative for the scaled forms: the expression scales
// the unscaled one, which it differentiates.
bessel_op!("scaled_modified_bessel_k0", Kind::K { nu: 0, scaled: true },
    vjp: |t, a| k_vjp(t, a, 0, true),
    range: (0.05, 12.0), torch: "torch.special.modified_bessel_k0(x[0]) * torch.exp(x[0])");
bessel_op!("scaled_modified_bessel_k1", Kind::K { nu: 1, scaled: true },
    vjp: |t, a| k_vjp(t, a, 1, true),
    range: (0.05, 12.0), torch: "torch.special.modified_bessel_k1(x[0]) * torch.exp(x[0])");

// ---- spherical j₀ ----

fn spherical_j0(x: f64) -> f64 {
    if x.is_infinite() {
        0.0
    } else if x == 0.0 {
        1.0
    } else {
        x.sin() / x
    }
}

fn lower_spherical_j0(b: &mut Builder, x: &Value) -> Value {
    let out = to_float(x.dtype());
    let x = b.convert(x, out);
    let s = b.unary("stablehlo.sine", &x);
    let q = b.binary("stablehlo.divide", &s, &x);
    let zero = b.constant(out, x.dims(), 0.0);
    let one = b.constant(out, x.dims(), 1.0);
    let at_zero = b.compare(Compare::Eq, &x, &zero);
    let q = b.select(&at_zero, &one, &q);
    let a = b.unary("stablehlo.abs", &x);
    let inf = b.constant(out, x.dims(), f64::INFINITY);
    let at_inf = b.compare(Compare::Eq, &a, &inf);
    b.select(&at_inf, &zero, &q)
}

inventory::submit! {
    op_def! {
        name: "spherical_bessel_j0",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: infer_float,
        lower: |b, x, _| Ok(vec![lower_spherical_j0(b, &x[0])]),
        reference: |x, _| float_ref(x, spherical_j0),
        // (cos x - j₀(x)) / x, 0 at 0.
        vjp: Some(|t, a| chain(t, a, |t, x, y| {
            let c = t.unary("cos", x)?;
            let zero = t.full_like(x, 0.0)?;
            let yc = t.sub(y, c)?;
            minus_over_x(t, zero, yc, x, 0.0)
        })),
        tolerance: transcendental,
        samples: || {
            let mut s = unary_samples(FLOATS, -10.0, 10.0);
            for d in FLOATS {
                if let Ok(x) = tensor_f64(*d, &[4], vec![0.0, 1e-4, -3.0, 20.0]) {
                    s.push(Sample::new(vec![x], Attrs::new()));
                }
            }
            s
        },
        arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC, -10.0, 10.0),
        // PyTorch has no derivative for it: sinc is the same function with one.
        torch: Torch::Expr("torch.sinc(x[0] / math.pi)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from DLMF / A&S tables.
    #[test]
    fn reference_matches_tabulated_values() {
        let cases = [
            (
                Kind::I {
                    nu: 0,
                    scaled: false,
                },
                1.0,
                1.266_065_877_752_008_4,
            ),
            (
                Kind::I {
                    nu: 1,
                    scaled: false,
                },
                1.0,
                0.565_159_103_992_485,
            ),
            (
                Kind::I {
                    nu: 0,
                    scaled: false,
                },
                50.0,
                2.932_553_783_849_336e20,
            ),
            (
                Kind::K {
                    nu: 0,
                    scaled: false,
                },
                1.0,
                0.421_024_438_240_708_3,
            ),
            (
                Kind::K {
                    nu: 1,
                    scaled: false,
                },
                1.0,
                0.601_907_230_197_234_6,
            ),
            (
                Kind::K {
                    nu: 0,
                    scaled: false,
                },
                5.0,
                0.003_691_098_334_042_594,
            ),
        ];
        for (kind, x, want) in cases {
            let got = reference(kind, x);
            assert!(
                ((got - want) / want).abs() < 1e-13,
                "{x}: got {got}, want {want}"
            );
        }
        // The limits.
        let i0 = Kind::I {
            nu: 0,
            scaled: false,
        };
        let i1 = Kind::I {
            nu: 1,
            scaled: false,
        };
        assert_eq!(reference(i0, f64::NEG_INFINITY), f64::INFINITY);
        assert_eq!(reference(i1, f64::NEG_INFINITY), f64::NEG_INFINITY);
        assert_eq!(
            reference(
                Kind::K {
                    nu: 1,
                    scaled: true
                },
                f64::INFINITY
            ),
            0.0
        );
        assert_eq!(
            reference(
                Kind::K {
                    nu: 0,
                    scaled: true
                },
                0.0
            ),
            f64::INFINITY
        );
        // A&S table 9.8, to its ten digits.
        let k0 = reference(
            Kind::K {
                nu: 0,
                scaled: false,
            },
            2.0,
        );
        let k1 = reference(
            Kind::K {
                nu: 1,
                scaled: false,
            },
            2.0,
        );
        assert!((k0 - 0.113_893_872_7).abs() < 1e-10 && (k1 - 0.139_865_881_8).abs() < 1e-10);
    }
}
