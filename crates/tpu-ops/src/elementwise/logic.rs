//! Logical ops (any dtype, nonzero is true) and bitwise ops (integers and
//! bool only).

use tpu_core::DType;
#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::{Arity, Flags, Torch};
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::binary::{infer_binary, operands};
use crate::support::*;

/// `x != 0` as bool.
fn truthy(b: &mut Builder, x: &Value) -> Value {
    if x.dtype() == DType::Bool {
        return x.clone();
    }
    let zero = b.constant(x.dtype(), x.dims(), 0.0);
    b.compare(Compare::Ne, x, &zero)
}

macro_rules! logical_op {
    ($name:literal, $hlo:literal, $f:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE,
                infer: |x, _| {
                    let t = infer_binary(x, REAL, false)?;
                    Ok(vec![TensorType::new(DType::Bool, t.shape)])
                },
                lower: |b, x, _| {
                    let shape = broadcast_shapes(x[0].shape(), x[1].shape())?;
                    let l = truthy(b, &x[0]);
                    let r = truthy(b, &x[1]);
                    let l = b.broadcast_to(&l, shape.dims());
                    let r = b.broadcast_to(&r, shape.dims());
                    Ok(vec![b.binary($hlo, &l, &r)])
                },
                reference: |x, _| {
                    let l = x[0].cast(DType::Bool);
                    let r = x[1].cast(DType::Bool);
                    Ok(vec![binary(&l, &r, DType::Bool, DType::Bool, |_, _| 0.0, $f)?])
                },
                samples: || binary_samples(&[DType::Bool, DType::I32, DType::F32]),
                arbitrary: |g: &mut Gen| binary_arbitrary(g, REAL),
                torch: Torch::Expr($torch),
            }
        }
    };
}

logical_op!("logical_and", "stablehlo.and", |x, y| x & y,
    torch: "torch.logical_and(x[0], x[1])");
logical_op!("logical_or", "stablehlo.or", |x, y| x | y,
    torch: "torch.logical_or(x[0], x[1])");
logical_op!("logical_xor", "stablehlo.xor", |x, y| x ^ y,
    torch: "torch.logical_xor(x[0], x[1])");

macro_rules! bitwise_op {
    ($name:literal, $hlo:literal, $f:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(2),
                flags: Flags::ELEMENTWISE,
                dtypes: INTS_AND_BOOL,
                infer: |x, _| Ok(vec![infer_binary(x, INTS_AND_BOOL, false)?]),
                lower: |b, x, _| {
                    let dtype = promote(x[0].ty(), x[1].ty());
                    let shape = broadcast_shapes(x[0].shape(), x[1].shape())?;
                    let (l, r) = operands(b, x, dtype, shape.dims());
                    Ok(vec![b.binary($hlo, &l, &r)])
                },
                reference: |x, _| {
                    let dtype = promote(&x[0].ty(), &x[1].ty());
                    Ok(vec![binary(&x[0], &x[1], dtype, dtype, |_, _| 0.0, $f)?])
                },
                samples: || binary_samples(INTS_AND_BOOL),
                arbitrary: |g: &mut Gen| binary_arbitrary(g, INTS_AND_BOOL),
                torch: Torch::Expr($torch),
            }
        }
    };
}

bitwise_op!("bitwise_and", "stablehlo.and", |x, y| x & y,
    torch: "torch.bitwise_and(x[0], x[1])");
bitwise_op!("bitwise_or", "stablehlo.or", |x, y| x | y,
    torch: "torch.bitwise_or(x[0], x[1])");
bitwise_op!("bitwise_xor", "stablehlo.xor", |x, y| x ^ y,
    torch: "torch.bitwise_xor(x[0], x[1])");
