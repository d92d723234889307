//! The Gaussian tail functions of `torch.special`, accurate far into the
//! tails, where the plain compositions underflow:
//!
//! - `erfcx(x) = e^{x²} erfc(x)`: the product up to [`CF_FROM`], beyond it
//!   the continued fraction `1 / (√π (x + ½/(x + 1/(x + (3/2)/(x + …)))))`
//!   evaluated from [`CF_DEPTH`] levels down.
//! - `log_ndtr(x) = log Φ(x)`: `log(erfcx(-x/√2) / 2) - x²/2` below -1,
//!   `log1p(-erfc(x/√2) / 2)` above.
//! - `ndtri(p) = Φ⁻¹(p)`: Abramowitz & Stegun 26.2.23's rational start in
//!   the nearer tail, then three Newton steps on `Φ(x) = p` (each squares
//!   the relative error: 4.5e-4, then f64 rounding).

use std::f64::consts::{FRAC_1_SQRT_2, PI};
use tpu_core::op_def;

use tpu_core::DType;
use tpu_core::host::Tolerance;
use tpu_core::op::{Arity, Attrs, Flags, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, Value};

use super::lanes::Lanes;
use super::special::erfc;
use super::unary::{chain, float_ref, infer_float, transcendental};
use crate::support::*;

/// Where `erfcx` switches to its continued fraction.
const CF_FROM: f64 = 5.0;
/// Levels of the continued fraction (enough for f64 from `CF_FROM` on).
const CF_DEPTH: usize = 60;
/// A&S 26.2.23: `t - (c0 + c1 t + c2 t²) / (1 + d1 t + d2 t² + d3 t³)`.
const AS_C: [f64; 3] = [2.515_517, 0.802_853, 0.010_328];
const AS_D: [f64; 3] = [1.432_788, 0.189_269, 0.001_308];
const NEWTON_STEPS: usize = 3;

// ---- f64 references ----

fn erfcx(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x <= CF_FROM {
        return (x * x).exp() * erfc(x);
    }
    let f = (1..=CF_DEPTH)
        .rev()
        .fold(x, |f, k| x + (k as f64 / 2.0) / f);
    1.0 / (PI.sqrt() * f)
}

fn log_ndtr(x: f64) -> f64 {
    let t = x * FRAC_1_SQRT_2;
    if x < -1.0 {
        (erfcx(-t) / 2.0).ln() - t * t
    } else {
        (-erfc(t) / 2.0).ln_1p()
    }
}

fn ndtri(p: f64) -> f64 {
    if p.is_nan() || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 || p == 1.0 {
        return if p == 0.0 {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    let q = p.min(1.0 - p);
    let t = (-2.0 * q.ln()).sqrt();
    let num = AS_C[0] + t * (AS_C[1] + t * AS_C[2]);
    let den = 1.0 + t * (AS_D[0] + t * (AS_D[1] + t * AS_D[2]));
    let mut x = num / den - t;
    for _ in 0..NEWTON_STEPS {
        let cdf = erfc(-x * FRAC_1_SQRT_2) / 2.0;
        let density = (-x * x / 2.0).exp() / (2.0 * PI).sqrt();
        x -= (cdf - q) / density;
    }
    if p < 0.5 { x } else { -x }
}

// ---- lowering ----

/// The three functions' lowerings.
trait Gaussian {
    fn erfcx(&mut self, x: &Value) -> Value;
    fn log_ndtr(&mut self, x: &Value) -> Value;
    fn ndtri(&mut self, p: &Value) -> Value;
}

impl Gaussian for Lanes<'_> {
    fn erfcx(&mut self, x: &Value) -> Value {
        let x2 = self.bin("stablehlo.multiply", x, x);
        let e = self.un("stablehlo.exponential", &x2);
        let erfc = self.un("chlo.erfc", x);
        let near = self.bin("stablehlo.multiply", &e, &erfc);
        let mut f = x.clone();
        for k in (1..=CF_DEPTH).rev() {
            let half_k = self.c(k as f64 / 2.0);
            let q = self.bin("stablehlo.divide", &half_k, &f);
            f = self.bin("stablehlo.add", x, &q);
        }
        let one = self.c(1.0 / PI.sqrt());
        let far = self.bin("stablehlo.divide", &one, &f);
        self.select_if(Compare::Gt, x, CF_FROM, &far, &near)
    }

    fn log_ndtr(&mut self, x: &Value) -> Value {
        let t = self.scale(x, FRAC_1_SQRT_2);
        let minus_t = self.un("stablehlo.negate", &t);
        let cx = self.erfcx(&minus_t);
        let half = self.scale(&cx, 0.5);
        let log = self.un("stablehlo.log", &half);
        let t2 = self.bin("stablehlo.multiply", &t, &t);
        let low = self.bin("stablehlo.subtract", &log, &t2);
        let erfc = self.un("chlo.erfc", &t);
        let half = self.scale(&erfc, -0.5);
        let high = self.un("stablehlo.log_plus_one", &half);
        self.select_if(Compare::Lt, x, -1.0, &low, &high)
    }

    fn ndtri(&mut self, p: &Value) -> Value {
        let one = self.c(1.0);
        let flipped = self.bin("stablehlo.subtract", &one, p);
        let q = self.bin("stablehlo.minimum", p, &flipped);
        let log = self.un("stablehlo.log", &q);
        let t = self.scale(&log, -2.0);
        let t = self.un("stablehlo.sqrt", &t);
        let horner = |o: &mut Lanes<'_>, c: [f64; 3], lead: Option<f64>| {
            // lead + t (c0 + t (c1 + t c2)) or c0 + t (c1 + t c2)
            let mut acc = o.c(c[2]);
            for &ck in c[..2].iter().rev() {
                let m = o.bin("stablehlo.multiply", &acc, &t);
                let ck = o.c(ck);
                acc = o.bin("stablehlo.add", &m, &ck);
            }
            match lead {
                Some(l) => {
                    let m = o.bin("stablehlo.multiply", &acc, &t);
                    let l = o.c(l);
                    o.bin("stablehlo.add", &m, &l)
                }
                None => acc,
            }
        };
        let num = horner(self, AS_C, None);
        let den = horner(self, AS_D, Some(1.0));
        let r = self.bin("stablehlo.divide", &num, &den);
        let mut x = self.bin("stablehlo.subtract", &r, &t);
        for _ in 0..NEWTON_STEPS {
            let s = self.scale(&x, -FRAC_1_SQRT_2);
            let erfc = self.un("chlo.erfc", &s);
            let cdf = self.scale(&erfc, 0.5);
            let x2 = self.bin("stablehlo.multiply", &x, &x);
            let e = self.scale(&x2, -0.5);
            let e = self.un("stablehlo.exponential", &e);
            let density = self.scale(&e, 1.0 / (2.0 * PI).sqrt());
            let diff = self.bin("stablehlo.subtract", &cdf, &q);
            let step = self.bin("stablehlo.divide", &diff, &density);
            x = self.bin("stablehlo.subtract", &x, &step);
        }
        let minus = self.un("stablehlo.negate", &x);
        let x = self.select_if(Compare::Lt, p, 0.5, &x, &minus);
        // The ends and outside [0, 1].
        let inf = self.c(f64::INFINITY);
        let ninf = self.c(f64::NEG_INFINITY);
        let x = self.select_if(Compare::Eq, p, 0.0, &ninf, &x);
        let x = self.select_if(Compare::Eq, p, 1.0, &inf, &x);
        let nan = self.c(f64::NAN);
        let x = self.select_if(Compare::Lt, p, 0.0, &nan, &x);
        self.select_if(Compare::Gt, p, 1.0, &nan, &x)
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Erfcx,
    LogNdtr,
    Ndtri,
}

fn lower(b: &mut Builder, x: &Value, kind: Kind) -> Value {
    let (mut o, x, out) = Lanes::for_input(b, x);
    let y = match kind {
        Kind::Erfcx => o.erfcx(&x),
        Kind::LogNdtr => o.log_ndtr(&x),
        Kind::Ndtri => o.ndtri(&x),
    };
    o.b.convert(&y, out)
}

#[cfg(feature = "conformance")]
fn samples(lo: f64, hi: f64, edges: &[f64]) -> Vec<Sample> {
    let mut s = unary_samples(FLOATS, lo, hi);
    for &d in FLOATS {
        if let Ok(x) = tensor_f64(d, &[edges.len()], edges.to_vec()) {
            s.push(Sample::new(vec![x], Attrs::new()));
        }
    }
    s
}

fn tolerance(d: DType) -> Tolerance {
    transcendental(d).scaled(10.0)
}

inventory::submit! {
    op_def! {
        name: "erfcx",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: infer_float,
        lower: |b, x, _| Ok(vec![lower(b, &x[0], Kind::Erfcx)]),
        reference: |x, _| float_ref(x, erfcx),
        // 2x erfcx(x) - 2/√π.
        vjp: Some(|t, a| chain(t, a, |t, x, y| {
            let xy = t.mul(x, y)?;
            let two_xy = t.scale(xy, 2.0)?;
            let c = t.full_like(x, 2.0 / PI.sqrt())?;
            t.sub(two_xy, c)
        })),
        tolerance,
        samples: || samples(-4.0, 12.0, &[-9.0, -1.0, 0.0, 4.99, 5.01, 30.0, 1e3, f64::INFINITY]),
        arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC, -4.0, 12.0),
        torch: Torch::Expr("torch.special.erfcx(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "log_ndtr",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: infer_float,
        lower: |b, x, _| Ok(vec![lower(b, &x[0], Kind::LogNdtr)]),
        reference: |x, _| float_ref(x, log_ndtr),
        // φ(x) / Φ(x) = √(2/π) / erfcx(-x/√2).
        vjp: Some(|t, a| chain(t, a, |t, x, _| {
            let s = t.scale(x, -FRAC_1_SQRT_2)?;
            let cx = t.call1("erfcx", &[s], Attrs::new())?;
            let c = t.full_like(x, (2.0 / PI).sqrt())?;
            t.div(c, cx)
        })),
        tolerance,
        samples: || samples(-12.0, 6.0, &[-40.0, -1.0, -0.99, 0.0, 8.0]),
        arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC, -12.0, 6.0),
        torch: Torch::Expr("torch.special.log_ndtr(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "ndtri",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: infer_float,
        lower: |b, x, _| Ok(vec![lower(b, &x[0], Kind::Ndtri)]),
        reference: |x, _| float_ref(x, ndtri),
        // √(2π) e^{y²/2}.
        vjp: Some(|t, a| chain(t, a, |t, _, y| {
            let y2 = t.mul(y, y)?;
            let h = t.scale(y2, 0.5)?;
            let e = t.unary("exp", h)?;
            t.scale(e, (2.0 * PI).sqrt())
        })),
        tolerance,
        samples: || samples(0.02, 0.98, &[0.0, 1.0, 0.5, 1e-4, 0.999, -0.5, 1.5]),
        arbitrary: |g: &mut Gen| unary_arbitrary(g, NUMERIC, 0.02, 0.98),
        torch: Torch::Expr("torch.special.ndtri(x[0])"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_invert_and_match_known_values() {
        // Φ⁻¹(0.975) = 1.959963984540054 (the 95% two-sided quantile).
        assert!((ndtri(0.975) - 1.959_963_984_540_054).abs() < 1e-13);
        for p in [1e-300, 1e-20, 0.01, 0.3, 0.5, 0.8] {
            let x = ndtri(p);
            assert!((log_ndtr(x).exp() - p).abs() <= 1e-11 * p, "{p}");
        }
        // erfcx(x) → 1/(x√π) for large x; erfcx(0) = 1.
        assert_eq!(erfcx(0.0), 1.0);
        assert!((erfcx(1e8) * 1e8 * PI.sqrt() - 1.0).abs() < 1e-15);
    }
}
