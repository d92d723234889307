//! Comparisons: broadcasting, computed in the promoted dtype, giving bool.

use tpu_core::DType;
#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::OpResult;
use tpu_core::op::{Arity, Flags, Torch};
use tpu_core::stablehlo::{Compare, TensorType};

use super::binary::{infer_binary, operands};
use crate::support::*;

fn infer_compare(inputs: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let t = infer_binary(inputs, REAL, false)?;
    Ok(vec![TensorType::new(DType::Bool, t.shape)])
}

macro_rules! compare_op {
    ($name:literal, $dir:expr, $ff:expr, $fi:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE,
                infer: |x, _| infer_compare(x),
                lower: |b, x, _| {
                    let dtype = promote(x[0].ty(), x[1].ty());
                    let shape = broadcast_shapes(x[0].shape(), x[1].shape())?;
                    let (l, r) = operands(b, x, dtype, shape.dims());
                    Ok(vec![b.compare($dir, &l, &r)])
                },
                reference: |x, _| {
                    let dtype = promote(&x[0].ty(), &x[1].ty());
                    Ok(vec![compare(&x[0], &x[1], dtype, $ff, $fi)?])
                },
                samples: || {
                    // Small integers make ties, where comparisons differ.
                    let mut s = binary_samples(NUMERIC);
                    for sample in &mut s {
                        for x in &mut sample.inputs {
                            *x = map_same(x, f64::round, |v| v / 4);
                        }
                    }
                    s
                },
                arbitrary: |g: &mut Gen| binary_arbitrary(g, REAL),
                torch: Torch::Expr($torch),
            }
        }
    };
}

compare_op!("eq", Compare::Eq, |x, y| x == y, |x, y| x == y, torch: "torch.eq(x[0], x[1])");
compare_op!("ne", Compare::Ne, |x, y| x != y, |x, y| x != y, torch: "torch.ne(x[0], x[1])");
compare_op!("lt", Compare::Lt, |x, y| x < y, |x, y| x < y, torch: "torch.lt(x[0], x[1])");
compare_op!("le", Compare::Le, |x, y| x <= y, |x, y| x <= y, torch: "torch.le(x[0], x[1])");
compare_op!("gt", Compare::Gt, |x, y| x > y, |x, y| x > y, torch: "torch.gt(x[0], x[1])");
compare_op!("ge", Compare::Ge, |x, y| x >= y, |x, y| x >= y, torch: "torch.ge(x[0], x[1])");
