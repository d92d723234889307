//! The classical orthogonal polynomials `p_n(x)` of PyTorch's
//! `torch.special`: Chebyshev `T`, `U`, `V`, `W` (and their shifted forms
//! on `[0, 1]`), Hermite `H` and `He`, Laguerre `L` and Legendre `P`.
//!
//! Each op takes `x` and the degree `n` (a float tensor, broadcast with
//! `x`, truncated to an integer as PyTorch does); a negative degree gives
//! 0. Each is its three-term recurrence: on the device one
//! `stablehlo.while` that runs to the largest degree in `n`, every element
//! keeping the term of its own degree. Not differentiable, as in PyTorch.
//! Degrees above [`MAX_DEGREE`] give NaN: the recurrence would take that
//! many steps (a degree of 1e30 would never finish).

use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, Value};

use super::binary::{infer_binary, operands};
use crate::support::*;

/// A family: its first-degree term and the step from `p_{k-1}`, `p_k` to
/// `p_{k+1}`, written once over [`Arith`] so the lowering and the f64
/// reference share it.
#[derive(Clone, Copy)]
enum Family {
    ChebyshevT,
    ChebyshevU,
    ChebyshevV,
    ChebyshevW,
    HermiteH,
    HermiteHe,
    Laguerre,
    Legendre,
}

/// The arithmetic a recurrence needs, on f64 values or on device values.
trait Arith {
    type V: Clone;
    fn c(&mut self, value: f64) -> Self::V;
    fn add(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    fn sub(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    fn mul(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    fn div(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
}

impl Family {
    /// `p_1(x)` (`p_0` is 1).
    fn first<A: Arith>(self, a: &mut A, x: &A::V) -> A::V {
        let (one, two) = (a.c(1.0), a.c(2.0));
        match self {
            Family::ChebyshevT | Family::HermiteHe | Family::Legendre => x.clone(),
            Family::ChebyshevU | Family::HermiteH => a.mul(&two, x),
            Family::ChebyshevV => {
                let t = a.mul(&two, x);
                a.sub(&t, &one)
            }
            Family::ChebyshevW => {
                let t = a.mul(&two, x);
                a.add(&t, &one)
            }
            Family::Laguerre => a.sub(&one, x),
        }
    }

    /// `p_{k+1}` from `p = p_{k-1}` and `q = p_k`; `k` is the degree of `q`.
    fn next<A: Arith>(self, a: &mut A, x: &A::V, k: &A::V, p: &A::V, q: &A::V) -> A::V {
        let (one, two) = (a.c(1.0), a.c(2.0));
        match self {
            Family::ChebyshevT | Family::ChebyshevU | Family::ChebyshevV | Family::ChebyshevW => {
                let t = a.mul(&two, x);
                let t = a.mul(&t, q);
                a.sub(&t, p)
            }
            Family::HermiteH => {
                let t = a.mul(&two, x);
                let t = a.mul(&t, q);
                let u = a.mul(&two, k);
                let u = a.mul(&u, p);
                a.sub(&t, &u)
            }
            Family::HermiteHe => {
                let t = a.mul(x, q);
                let u = a.mul(k, p);
                a.sub(&t, &u)
            }
            Family::Laguerre => {
                // ((2k + 1 - x) q - k p) / (k + 1)
                let t = a.mul(&two, k);
                let t = a.add(&t, &one);
                let t = a.sub(&t, x);
                let t = a.mul(&t, q);
                let u = a.mul(k, p);
                let t = a.sub(&t, &u);
                let k1 = a.add(k, &one);
                a.div(&t, &k1)
            }
            Family::Legendre => {
                // ((2k + 1) x q - k p) / (k + 1)
                let t = a.mul(&two, k);
                let t = a.add(&t, &one);
                let t = a.mul(&t, x);
                let t = a.mul(&t, q);
                let u = a.mul(k, p);
                let t = a.sub(&t, &u);
                let k1 = a.add(k, &one);
                a.div(&t, &k1)
            }
        }
    }
}

/// f64 arithmetic, for the reference.
struct Host;

impl Arith for Host {
    type V = f64;
    fn c(&mut self, value: f64) -> f64 {
        value
    }
    fn add(&mut self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    fn sub(&mut self, a: &f64, b: &f64) -> f64 {
        a - b
    }
    fn mul(&mut self, a: &f64, b: &f64) -> f64 {
        a * b
    }
    fn div(&mut self, a: &f64, b: &f64) -> f64 {
        a / b
    }
}

/// Device arithmetic on tensors of one shape and dtype.
struct Device<'b> {
    b: &'b mut Builder,
    like: Value,
}

impl Arith for Device<'_> {
    type V = Value;
    fn c(&mut self, value: f64) -> Value {
        self.b
            .constant(self.like.dtype(), self.like.shape().clone(), value)
    }
    fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.b.binary("stablehlo.add", a, b)
    }
    fn sub(&mut self, a: &Value, b: &Value) -> Value {
        self.b.binary("stablehlo.subtract", a, b)
    }
    fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.b.binary("stablehlo.multiply", a, b)
    }
    fn div(&mut self, a: &Value, b: &Value) -> Value {
        self.b.binary("stablehlo.divide", a, b)
    }
}

/// The highest degree computed; higher ones give NaN.
const MAX_DEGREE: i64 = 1 << 16;

/// `p_n(x)` in f64 (`n` already truncated).
fn evaluate(family: Family, shifted: bool, x: f64, n: f64) -> f64 {
    let x = if shifted { 2.0 * x - 1.0 } else { x };
    if n.is_nan() || n < 0.0 {
        return 0.0;
    }
    if n > MAX_DEGREE as f64 {
        return f64::NAN;
    }
    if n == 0.0 {
        return 1.0;
    }
    let (mut p, mut q) = (1.0, family.first(&mut Host, &x));
    let mut k = 1.0;
    while k < n {
        let r = family.next(&mut Host, &x, &k, &p, &q);
        (p, q) = (q, r);
        k += 1.0;
    }
    q
}

fn lower(b: &mut Builder, x: &[Value], family: Family, shifted: bool) -> OpResult<Vec<Value>> {
    let out = infer_binary(&[x[0].ty().clone(), x[1].ty().clone()], FLOATS, true)?;
    let compute = accumulate(out.dtype);
    let (x, n) = operands(b, x, compute, out.shape.dims());
    let dims = out.shape.dims().to_vec();
    let x = if shifted {
        let two = b.constant(compute, dims.as_slice(), 2.0);
        let one = b.constant(compute, dims.as_slice(), 1.0);
        let t = b.binary("stablehlo.multiply", &two, &x);
        b.binary("stablehlo.subtract", &t, &one)
    } else {
        x
    };
    // Degrees as integers (truncated toward zero), the loop's end the largest.
    let degree = b.convert(&n, DType::I64);
    let all: Vec<usize> = (0..dims.len()).collect();
    let end = b.reduce(&degree, 0.0, &all, "stablehlo.maximum");
    let cap = b.int_constant(DType::I64, [], MAX_DEGREE);
    let end = b.binary("stablehlo.minimum", &end, &cap);
    let mut arith = Device { b, like: x.clone() };
    let one = arith.c(1.0);
    let first = family.first(&mut arith, &x);
    let b = arith.b;
    let ones = b.int_constant(DType::I64, dims.as_slice(), 1);
    let is_first = b.compare(Compare::Eq, &degree, &ones);
    let result = b.select(&is_first, &first, &one);
    let kf = b.constant(compute, dims.as_slice(), 1.0);
    // x and the degrees ride along: the loop body reads only its own values.
    let carried = [&one, &first, &result, &kf, &x, &degree];
    let out_values = b.fori_loop(1, &end, &carried, |b, k, v| {
        let (p, q, result, kf, x, degree) = (&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
        let mut arith = Device { b, like: x.clone() };
        let r = family.next(&mut arith, x, kf, p, q);
        let one = arith.c(1.0);
        let k_next = arith.add(kf, &one);
        let b = arith.b;
        // The term of degree k + 1 lands where n == k + 1.
        let k1 = b.int_constant(DType::I64, [], 1);
        let k1 = b.binary("stablehlo.add", k, &k1);
        let k1 = b.broadcast_in_dim(&k1, x.dims(), &[]);
        let here = b.compare(Compare::Eq, degree, &k1);
        let result = b.select(&here, &r, result);
        vec![q.clone(), r, result, k_next, x.clone(), degree.clone()]
    });
    let zeros = b.int_constant(DType::I64, dims.as_slice(), 0);
    let negative = b.compare(Compare::Lt, &degree, &zeros);
    let zero = b.constant(compute, dims.as_slice(), 0.0);
    let result = b.select(&negative, &zero, &out_values[2]);
    // NaN degrees give 0, as a negative one does.
    let nan_degree = b.compare(Compare::Ne, &n, &n);
    let result = b.select(&nan_degree, &zero, &result);
    let max = b.constant(compute, dims.as_slice(), MAX_DEGREE as f64);
    let too_high = b.compare(Compare::Gt, &n, &max);
    let nan = b.constant(compute, dims.as_slice(), f64::NAN);
    let result = b.select(&too_high, &nan, &result);
    Ok(vec![b.convert(&result, out.dtype)])
}

/// f16 and bf16 run the recurrence in f32.
fn accumulate(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

fn reference(x: &[HostTensor], family: Family, shifted: bool) -> OpResult<Vec<HostTensor>> {
    let out = infer_binary(&[x[0].ty(), x[1].ty()], FLOATS, true)?;
    let f = move |v: f64, n: f64| evaluate(family, shifted, v, n.trunc());
    Ok(vec![binary(
        &x[0],
        &x[1],
        out.dtype,
        out.dtype,
        f,
        |_, _| 0,
    )?])
}

/// `x` in `[-1.2, 1.2]` (`[-0.1, 1.1]` shifted), where the terms stay
/// small enough for f32, and integer degrees from -2 to 10, broadcast.
#[cfg(feature = "conformance")]
fn sample(g: &mut Gen, shifted: bool) -> Sample {
    let dtype = g.pick(FLOATS);
    let shape = g.shape(0, 3);
    let other = g.broadcastable(&shape);
    let (lo, hi) = if shifted { (-0.1, 1.1) } else { (-1.2, 1.2) };
    let x = g.tensor_in(dtype, &shape, lo, hi);
    let count = other.numel();
    let degrees: Vec<f64> = (0..count).map(|_| g.below(13) as f64 - 2.0).collect();
    let n = HostTensor::from_f64(dtype, other, degrees)
        .unwrap_or_else(|| unreachable!("value count matches the shape"));
    Sample::new(vec![x, n], Default::default())
}

/// Rounding grows with the degree: a few hundred ulps at degree 10.
fn tolerance(d: DType) -> Tolerance {
    Tolerance::for_dtype(d).scaled(100.0)
}

macro_rules! polynomial_op {
    ($name:literal, $family:expr, $shifted:expr, $seed:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE.union(Flags::NOT_DIFFERENTIABLE),
                dtypes: FLOATS,
                infer: |x, _| Ok(vec![infer_binary(x, FLOATS, true)?]),
                lower: |b, x, _| lower(b, x, $family, $shifted),
                reference: |x, _| reference(x, $family, $shifted),
                tolerance,
                samples: || (0..12).map(|i| sample(&mut Gen::new($seed + i), $shifted)).collect(),
                arbitrary: |g: &mut Gen| sample(g, $shifted),
                torch: Torch::Expr(concat!("torch.special.", $name, "(x[0], x[1])")),
            }
        }
    };
}

polynomial_op!("chebyshev_polynomial_t", Family::ChebyshevT, false, 3000);
polynomial_op!("chebyshev_polynomial_u", Family::ChebyshevU, false, 3020);
polynomial_op!("chebyshev_polynomial_v", Family::ChebyshevV, false, 3040);
polynomial_op!("chebyshev_polynomial_w", Family::ChebyshevW, false, 3060);
polynomial_op!(
    "shifted_chebyshev_polynomial_t",
    Family::ChebyshevT,
    true,
    3080
);
polynomial_op!(
    "shifted_chebyshev_polynomial_u",
    Family::ChebyshevU,
    true,
    3100
);
polynomial_op!(
    "shifted_chebyshev_polynomial_v",
    Family::ChebyshevV,
    true,
    3120
);
polynomial_op!(
    "shifted_chebyshev_polynomial_w",
    Family::ChebyshevW,
    true,
    3140
);
polynomial_op!("hermite_polynomial_h", Family::HermiteH, false, 3160);
polynomial_op!("hermite_polynomial_he", Family::HermiteHe, false, 3180);
polynomial_op!("laguerre_polynomial_l", Family::Laguerre, false, 3200);
polynomial_op!("legendre_polynomial_p", Family::Legendre, false, 3220);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_degrees_match_closed_forms() {
        let x: f64 = 0.3;
        let cases = [
            (Family::ChebyshevT, 3.0, 4.0 * x.powi(3) - 3.0 * x),
            (Family::ChebyshevU, 2.0, 4.0 * x * x - 1.0),
            (Family::ChebyshevV, 2.0, 4.0 * x * x - 2.0 * x - 1.0),
            (Family::ChebyshevW, 2.0, 4.0 * x * x + 2.0 * x - 1.0),
            (Family::HermiteH, 3.0, 8.0 * x.powi(3) - 12.0 * x),
            (Family::HermiteHe, 3.0, x.powi(3) - 3.0 * x),
            (Family::Laguerre, 2.0, (x * x - 4.0 * x + 2.0) / 2.0),
            (Family::Legendre, 3.0, (5.0 * x.powi(3) - 3.0 * x) / 2.0),
        ];
        for (family, n, want) in cases {
            assert!((evaluate(family, false, x, n) - want).abs() < 1e-12);
        }
        // Shifted: T*_2(x) = T_2(2x - 1); negative degrees give 0.
        let t = 2.0 * x - 1.0;
        assert!((evaluate(Family::ChebyshevT, true, x, 2.0) - (2.0 * t * t - 1.0)).abs() < 1e-12);
        assert_eq!(evaluate(Family::Legendre, false, x, -1.0), 0.0);
        assert_eq!(evaluate(Family::HermiteH, false, x, 0.0), 1.0);
        assert!(evaluate(Family::Laguerre, false, x, 1e30).is_nan());
    }
}
