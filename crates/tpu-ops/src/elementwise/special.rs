//! Special functions in f64 for the references: the error function family
//! and the log-gamma family. Rust's `f64` has none of them, and the
//! references must not borrow the device's approximations.

use std::f64::consts::PI;

/// The Euler-Mascheroni constant γ.
pub const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;

/// Harmonic numbers `H_0 … H_n`.
pub fn harmonic(n: usize) -> Vec<f64> {
    let mut h = vec![0.0];
    for k in 1..=n {
        h.push(h[k - 1] + 1.0 / k as f64);
    }
    h
}

/// Where `erfc` switches from `1 - erf(x)` to its continued fraction.
const FRACTION_FROM: f64 = 1.0;

/// `erfc(x)` by its continued fraction, for `x >= 1` where 200 levels
/// reach f64 rounding and `1 - erf(x)` would lose the digits that matter.
fn erfc_fraction(x: f64) -> f64 {
    // erfc(x) = exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
    let mut f = 0.0;
    for k in (1..200).rev() {
        f = (k as f64 / 2.0) / (x + f);
    }
    (-x * x).exp() / PI.sqrt() / (x + f)
}

/// The error function.
pub fn erf(x: f64) -> f64 {
    if x.abs() >= FRACTION_FROM {
        return (1.0 - erfc_fraction(x.abs())).copysign(x);
    }
    // The Maclaurin series converges fast for |x| < 1; A&S 7.1.26 is too
    // coarse for a reference.
    let (mut sum, mut term, x2) = (x, x, x * x);
    for n in 1..200 {
        term *= -x2 / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    sum * 2.0 / PI.sqrt()
}

/// The complementary error function, `1 - erf(x)`, accurate in the tail.
pub fn erfc(x: f64) -> f64 {
    if x >= FRACTION_FROM {
        erfc_fraction(x)
    } else {
        1.0 - erf(x)
    }
}

/// The inverse error function: `erf(erfinv(y)) = y` on (-1, 1), ±∞ at ±1,
/// NaN outside.
pub fn erfinv(y: f64) -> f64 {
    if y.is_nan() || y.abs() > 1.0 {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return f64::INFINITY.copysign(y);
    }
    // Giles' single-precision approximation as the start, then Newton on
    // erf(x) - y (its derivative is 2/√π e^{-x²}).
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let mut x = if w < 5.0 {
        let w = w - 2.5;
        let p = [
            2.81022636e-08,
            3.43273939e-07,
            -3.5233877e-06,
            -4.39150654e-06,
            0.00021858087,
            -0.00125372503,
            -0.00417768164,
            0.246640727,
            1.50140941,
        ];
        p.iter().fold(0.0, |acc, c| acc * w + c) * y
    } else {
        let w = w.sqrt() - 3.0;
        let p = [
            -0.000200214257,
            0.000100950558,
            0.00134934322,
            -0.00367342844,
            0.00573950773,
            -0.0076224613,
            0.00943887047,
            1.00167406,
            2.83297682,
        ];
        p.iter().fold(0.0, |acc, c| acc * w + c) * y
    };
    for _ in 0..3 {
        // Near ±1 the residual is better measured through erfc.
        let residual = if x.abs() >= 3.0 {
            (1.0 - y.abs() - erfc(x.abs())).copysign(-y)
        } else {
            erf(x) - y
        };
        x -= residual / (2.0 / PI.sqrt() * (-x * x).exp());
    }
    x
}

/// Lanczos coefficients for g = 7, n = 9 (about 15 significant digits).
const LANCZOS: [f64; 9] = [
    0.999_999_999_999_809_9,
    676.520_368_121_885_1,
    -1_259.139_216_722_402_8,
    771.323_428_777_653_1,
    -176.615_029_162_140_6,
    12.507_343_278_686_905,
    -0.138_571_095_265_720_12,
    9.984_369_578_019_572e-6,
    1.505_632_735_149_311_6e-7,
];

/// `ln |Γ(x)|`; +∞ at the poles (zero and the negative integers), as in
/// PyTorch.
pub fn lgamma(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.is_infinite() {
        return f64::INFINITY;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::INFINITY;
    }
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        return (PI / (PI * x).sin().abs()).ln() - lgamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let series = LANCZOS[1..]
        .iter()
        .enumerate()
        .fold(LANCZOS[0], |acc, (i, c)| acc + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// The digamma function `ψ(x) = d/dx ln Γ(x)`; -∞ at zero and NaN at the
/// negative integers, as in PyTorch.
pub fn digamma(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY.copysign(-x.signum());
    }
    if x < 0.0 && x == x.floor() {
        return f64::NAN;
    }
    if x < 0.5 {
        // Reflection: ψ(1 - x) - ψ(x) = π cot(πx).
        return digamma(1.0 - x) - PI / (PI * x).tan();
    }
    // Recurrence ψ(x) = ψ(x + 1) - 1/x up to x ≥ 20, then the asymptotic
    // series in 1/x².
    let (mut x, mut shift) = (x, 0.0);
    while x < 20.0 {
        shift -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    let tail = r
        * (1.0 / 12.0
            - r * (1.0 / 120.0 - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r * (1.0 / 132.0)))));
    shift + x.ln() - 0.5 / x - tail
}

/// Bernoulli numbers B₂, B₄, …, B₁₄ for the Euler–Maclaurin tail.
const BERNOULLI: [f64; 7] = [
    1.0 / 6.0,
    -1.0 / 30.0,
    1.0 / 42.0,
    -1.0 / 30.0,
    5.0 / 66.0,
    -691.0 / 2730.0,
    7.0 / 6.0,
];

/// The Hurwitz zeta function `ζ(s, q) = Σₖ (q + k)^-s` for `s > 1`; +∞ at
/// the poles `q = 0, -1, ...`, NaN at negative `q` with a fractional `s`
/// (as in PyTorch and Cephes).
pub fn zeta(s: f64, q: f64) -> f64 {
    if s.is_nan() || q.is_nan() || s < 1.0 {
        return f64::NAN;
    }
    if s == 1.0 {
        return f64::INFINITY;
    }
    if q <= 0.0 {
        if q == q.floor() {
            return f64::INFINITY;
        }
        if s != s.floor() {
            return f64::NAN;
        }
    }
    // Sum the first terms directly until q + n ≥ 20, then the
    // Euler–Maclaurin tail.
    let n = (20.0 - q.min(0.0)).ceil();
    let mut sum: f64 = (0..n as usize).map(|k| (q + k as f64).powf(-s)).sum();
    let a = q + n;
    sum += a.powf(1.0 - s) / (s - 1.0) + 0.5 * a.powf(-s);
    let (mut rising, mut factorial, mut power) = (s, 2.0, a.powf(-s - 1.0));
    for (j, b) in BERNOULLI.iter().enumerate() {
        sum += b / factorial * rising * power;
        let k = 2.0 * (j as f64 + 1.0);
        rising *= (s + k - 1.0) * (s + k);
        factorial *= (k + 1.0) * (k + 2.0);
        power /= a * a;
    }
    sum
}

/// The polygamma function `ψ⁽ⁿ⁾(x)`, the n-th derivative of digamma:
/// `(-1)^(n+1) n! ζ(n + 1, x)` for `n ≥ 1`.
pub fn polygamma(n: u32, x: f64) -> f64 {
    if n == 0 {
        return digamma(x);
    }
    let factorial: f64 = (1..=n).map(f64::from).product();
    let sign = if n % 2 == 1 { 1.0 } else { -1.0 };
    sign * factorial * zeta(f64::from(n) + 1.0, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn known_values() {
        // Values from Abramowitz & Stegun and the DLMF.
        assert!(close(erf(0.5), 0.520_499_877_813_046_5, 1e-15));
        assert!(close(erfc(4.0), 1.541_725_790_028_002e-8, 1e-13));
        assert!(close(erfinv(0.5), 0.476_936_276_204_469_9, 1e-14));
        assert!(close(erfinv(-0.999_999), -3.458_910_737_275_499, 1e-12));
        assert!(close(lgamma(0.5), 0.572_364_942_924_700_1, 1e-14));
        assert!(close(lgamma(10.0), 12.801_827_480_081_469, 1e-14));
        assert!(close(lgamma(-2.5), -0.056_243_716_497_674_05, 1e-13));
        assert!(close(digamma(1.0), -0.577_215_664_901_532_9, 1e-14));
        assert!(close(digamma(0.25), -4.227_453_533_376_265, 1e-13));
        assert!(close(digamma(-0.5), 0.036_489_973_978_576_52, 1e-13));
        // ζ(2, 1) = π²/6; ψ'(1/2) = π²/2; ψ''(1) = -2 ζ(3).
        assert!(close(zeta(2.0, 1.0), PI * PI / 6.0, 1e-15));
        assert!(close(polygamma(1, 0.5), PI * PI / 2.0, 1e-14));
        assert!(close(polygamma(2, 1.0), -2.404_113_806_319_188_5, 1e-14));
    }

    #[test]
    fn round_trips_and_poles() {
        for i in -99..100 {
            let y = i as f64 / 100.0;
            assert!(close(erf(erfinv(y)), y, 1e-14), "{y}");
        }
        assert_eq!(lgamma(-3.0), f64::INFINITY);
        assert_eq!(digamma(0.0), f64::NEG_INFINITY);
        assert!(digamma(-2.0).is_nan());
        assert!(erfinv(1.5).is_nan());
    }
}
