//! Comparisons: broadcasting, computed in the promoted dtype, giving bool.
//! `eq` and `ne` compare complex numbers too (both parts); the orderings
//! take real numbers only.

use tpu_core::host::HostTensor;
use tpu_core::op::{Arity, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Compare, TensorType};
use tpu_core::{Complex, DType};

use super::binary::{infer_binary, operands};
use crate::support::*;

fn infer_compare(inputs: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let t = infer_binary(inputs, ANY, false)?;
    Ok(vec![TensorType::new(DType::Bool, t.shape)])
}

/// A comparison of two complex numbers.
type ComplexCompare = fn(Complex<f64>, Complex<f64>) -> bool;

/// A comparison's reference: complex inputs through `fc`, others through
/// `ff` (floats) or `fi` (integers and bool).
fn compare_ref(
    x: &[HostTensor],
    ff: fn(f64, f64) -> bool,
    fi: fn(i64, i64) -> bool,
    fc: Option<ComplexCompare>,
) -> OpResult<Vec<HostTensor>> {
    let dtype = promote(&x[0].ty(), &x[1].ty());
    if !dtype.is_complex() {
        return Ok(vec![compare(&x[0], &x[1], dtype, ff, fi)?]);
    }
    let fc = fc.ok_or_else(complex_unsupported)?;
    let shape = broadcast_shapes(&x[0].shape(), &x[1].shape())?;
    let (a, b) = (x[0].cast(dtype).to_complex(), x[1].cast(dtype).to_complex());
    let same = zip_complex(&a, &b, shape.dims(), |p, q| {
        Complex::new(f64::from(u8::from(fc(p, q))), 0.0)
    })?;
    Ok(vec![HostTensor::float(DType::Bool, same.mapv(|v| v.re))])
}

/// Samples with ties: small integers, rounded floats and complex numbers
/// with rounded parts.
#[cfg(feature = "conformance")]
fn tied_samples(dtypes: &[DType]) -> Vec<Sample> {
    let mut s = binary_samples(dtypes);
    for sample in &mut s {
        for x in &mut sample.inputs {
            *x = if x.dtype().is_complex() {
                HostTensor::complex(
                    x.dtype(),
                    x.to_complex()
                        .mapv(|v| Complex::new(v.re.round(), v.im.round())),
                )
            } else {
                map_same(x, f64::round, |v| v / 4)
            };
        }
    }
    s
}

macro_rules! compare_op {
    ($name:literal, $dir:expr, $ff:expr, $fi:expr, torch: $torch:literal) => {
        compare_op!($name, $dir, $ff, $fi, None, REAL, torch: $torch);
    };
    ($name:literal, $dir:expr, $ff:expr, $fi:expr, $fc:expr, $dtypes:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE,
                dtypes: $dtypes,
                infer: |x, _| infer_compare(x),
                lower: |b, x, _| {
                    let dtype = promote(x[0].ty(), x[1].ty());
                    let shape = broadcast_shapes(x[0].shape(), x[1].shape())?;
                    let (l, r) = operands(b, x, dtype, shape.dims());
                    Ok(vec![b.compare($dir, &l, &r)])
                },
                reference: |x, _| compare_ref(x, $ff, $fi, $fc),
                samples: || {
                    // Ties are where comparisons differ.
                    let mut s = tied_samples(NUMERIC);
                    if $dtypes.contains(&DType::C64) {
                        s.extend(tied_samples(COMPLEX));
                    }
                    s
                },
                arbitrary: |g: &mut Gen| binary_arbitrary(g, $dtypes),
                torch: Torch::Expr($torch),
            }
        }
    };
}

compare_op!("eq", Compare::Eq, |x, y| x == y, |x, y| x == y, Some(|x, y| x == y), ANY, torch: "torch.eq(x[0], x[1])");
compare_op!("ne", Compare::Ne, |x, y| x != y, |x, y| x != y, Some(|x, y| x != y), ANY, torch: "torch.ne(x[0], x[1])");
compare_op!("lt", Compare::Lt, |x, y| x < y, |x, y| x < y, torch: "torch.lt(x[0], x[1])");
compare_op!("le", Compare::Le, |x, y| x <= y, |x, y| x <= y, torch: "torch.le(x[0], x[1])");
compare_op!("gt", Compare::Gt, |x, y| x > y, |x, y| x > y, torch: "torch.gt(x[0], x[1])");
compare_op!("ge", Compare::Ge, |x, y| x >= y, |x, y| x >= y, torch: "torch.ge(x[0], x[1])");
