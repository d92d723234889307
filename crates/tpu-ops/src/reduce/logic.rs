//! `any` and `all` over dims, on any dtype, giving bool (`x != 0`; NaN
//! counts as true). Empty reductions give false and true.

use tpu_core::DType;
use tpu_core::host::{HostData, HostTensor};
#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::kit::*;
use crate::support::*;

fn lower_logic(b: &mut Builder, x: &Value, attrs: &Attrs, any: bool) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let p = nonzero(b, x);
    let r = if any {
        b.reduce(&p, 0.0, &dims, "stablehlo.or")
    } else {
        b.reduce(&p, 1.0, &dims, "stablehlo.and")
    };
    Ok(b.reshape(&r, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn logic_ref(x: &HostTensor, attrs: &Attrs, any: bool) -> OpResult<HostTensor> {
    let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
    let truth = match x.data() {
        HostData::Float(a) => a.mapv(|v| v != 0.0),
        HostData::Int(a) => a.mapv(|v| v != 0),
        HostData::Complex(a) => a.mapv(|v| v.re != 0.0 || v.im != 0.0),
    };
    let (kept, gs) = groups(&truth, &dims);
    let values = gs
        .iter()
        .map(|g| {
            i64::from(if any {
                g.iter().any(|&v| v)
            } else {
                g.iter().all(|&v| v)
            })
        })
        .collect();
    int_result(
        DType::Bool,
        &kept,
        values,
        &reduced_shape(&x.shape(), &dims, keepdim),
    )
}

/// Samples with many zeros, so both answers occur.
#[cfg(feature = "conformance")]
fn logic_sample(g: &mut Gen) -> tpu_core::op::Sample {
    let mut s = reduce_sample(g, REAL);
    let x = &s.inputs[0];
    let (dtype, shape) = (x.dtype(), x.shape());
    let keep = g.below(3);
    let v: Vec<f64> = x
        .to_f64()
        .iter()
        .map(|&v| if g.below(3) < keep { v } else { 0.0 })
        .collect();
    if let Some(t) = HostTensor::from_f64(DType::F64, shape, v) {
        s.inputs[0] = t.cast(dtype);
    }
    s
}

macro_rules! logic_op {
    ($name:literal, $any:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::REDUCTION,
                infer: |x, attrs| {
                    let t = first(x)?;
                    let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
                    Ok(vec![TensorType::new(DType::Bool, reduced_shape(&t.shape, &dims, keepdim))])
                },
                lower: |b, x, attrs| Ok(vec![lower_logic(b, &x[0], attrs, $any)?]),
                reference: |x, attrs| Ok(vec![logic_ref(one(x)?, attrs, $any)?]),
                samples: || (0..12).map(|i| logic_sample(&mut Gen::new(500 + i))).collect(),
                arbitrary: logic_sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

// PyTorch reduces every dim when `dims` is empty, where this op reduces
// none: that case reduces a new trailing dim of size 1 instead.
logic_op!("any", true,
    torch: r#"(lambda d, k: torch.any(x[0] != 0, d, keepdim=k) if d else torch.any((x[0] != 0).unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);
logic_op!("all", false,
    torch: r#"(lambda d, k: torch.all(x[0] != 0, d, keepdim=k) if d else torch.all((x[0] != 0).unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);
