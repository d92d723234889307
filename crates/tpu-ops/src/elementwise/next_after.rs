//! `nextafter(x, y)`: the representable value of the dtype next to `x` in
//! the direction of `y` (`y` where they are equal). Floats only, and not
//! differentiable, as in PyTorch.

use tpu_core::DType;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;

use super::binary::{infer_binary, lower_arith};
use crate::support::*;

/// Exponent and fraction widths of a float dtype.
fn format(dtype: DType) -> (i32, i32) {
    match dtype {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        _ => (11, 52),
    }
}

/// `nextafter` in the float format of `dtype`, for `x` and `y` that the
/// format represents exactly.
pub(crate) fn next_after(x: f64, y: f64, dtype: DType) -> f64 {
    if x.is_nan() || y.is_nan() {
        return f64::NAN;
    }
    if x == y {
        return y;
    }
    let toward = if y > x { 1.0 } else { -1.0 };
    if dtype == DType::F64 {
        if x == 0.0 {
            return toward * f64::from_bits(1);
        }
        let bits = x.to_bits();
        let away = (toward > 0.0) == (x > 0.0);
        return f64::from_bits(if away { bits + 1 } else { bits - 1 });
    }
    let (exp_bits, frac_bits) = format(dtype);
    let emax = (1 << (exp_bits - 1)) - 1;
    let emin = 1 - emax;
    let largest = (2.0 - 2f64.powi(-frac_bits)) * 2f64.powi(emax);
    if x == 0.0 {
        return toward * 2f64.powi(emin - frac_bits);
    }
    if x.is_infinite() {
        return x.signum() * largest;
    }
    let e = (((x.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let mut step = 2f64.powi(e - frac_bits);
    let away = (toward > 0.0) == (x > 0.0);
    if !away && x.abs() == 2f64.powi(e) && e > emin {
        step /= 2.0;
    }
    let r = x + toward * step;
    if r.abs() > largest {
        r.signum() * f64::INFINITY
    } else {
        r
    }
}

fn next_after_ref(x: &[HostTensor]) -> OpResult<Vec<HostTensor>> {
    let dtype = promote(&x[0].ty(), &x[1].ty());
    let f = move |a, b| next_after(a, b, dtype);
    Ok(vec![binary(&x[0], &x[1], dtype, dtype, f, |_, _| 0)?])
}

/// Broadcasting pairs plus the edges: equal operands, zeros, infinities
/// and NaN.
#[cfg(feature = "conformance")]
fn next_after_samples() -> Vec<Sample> {
    let mut samples = binary_samples(FLOATS);
    for (i, &dtype) in FLOATS.iter().enumerate() {
        let x = [
            0.0,
            0.0,
            1.0,
            1.0,
            -1.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2.0,
            f64::NAN,
            0.5,
        ];
        let y = [1.0, -1.0, 1.0, 0.0, -2.0, 0.0, 0.0, 1.0, 0.0, f64::NAN];
        let mut g = Gen::new(1500 + i as u64);
        let t = |v: &[f64]| HostTensor::from_f64(dtype, [v.len()], v.to_vec());
        if let (Some(x), Some(y)) = (t(&x), t(&y)) {
            samples.push(Sample::new(vec![x, y], Default::default()));
        }
        samples.push(binary_arbitrary(&mut g, &[dtype]));
    }
    samples
}

inventory::submit! {
    op_def! {
        name: "nextafter",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE.union(Flags::NOT_DIFFERENTIABLE),
        dtypes: FLOATS,
        infer: |x, _| Ok(vec![infer_binary(x, FLOATS, true)?]),
        lower: |b, x, _| Ok(lower_arith(b, x, true, |b, l, r| b.binary("chlo.next_after", l, r))),
        reference: |x, _| next_after_ref(x),
        // One step of the format is the whole answer: compare exactly.
        tolerance: |_| Tolerance::EXACT,
        samples: next_after_samples,
        arbitrary: |g: &mut Gen| binary_arbitrary(g, FLOATS),
        torch: Torch::Expr("torch.nextafter(x[0], x[1])"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_match_the_native_formats() {
        let f32_next = |x: f32, up: bool| {
            let b = x.to_bits();
            f32::from_bits(if (x > 0.0) == up { b + 1 } else { b - 1 }) as f64
        };
        for x in [1.0f32, -1.0, 3.5, 1e-38, 6e-39, f32::MAX, 0.1] {
            assert_eq!(
                next_after(x as f64, 10.0 * x.abs() as f64 + 1.0, DType::F32),
                f32_next(x, true)
            );
            assert_eq!(
                next_after(x as f64, -10.0 * x.abs() as f64 - 1.0, DType::F32),
                f32_next(x, false)
            );
        }
        assert_eq!(next_after(0.0, 1.0, DType::F32), f32::from_bits(1) as f64);
        assert_eq!(
            next_after(f32::MAX as f64, f64::INFINITY, DType::F32),
            f64::INFINITY
        );
        assert_eq!(next_after(1.0, 2.0, DType::BF16), 1.0 + 2f64.powi(-7));
        assert_eq!(next_after(1.0, 0.0, DType::F16), 1.0 - 2f64.powi(-11));
        assert_eq!(next_after(1.0, 2.0, DType::F64), 1.0 + f64::EPSILON);
    }
}
