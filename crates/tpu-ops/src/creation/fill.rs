//! `full`: a tensor of one value.

use ndarray::{ArrayD, IxDyn};
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::TensorType;
use tpu_core::{DType, Shape};

use crate::support::ANY;
#[cfg(feature = "conformance")]
use crate::support::*;

/// The `shape` attribute as a shape (every dim >= 0).
pub(crate) fn shape_attr(attrs: &Attrs) -> OpResult<Shape> {
    let dims = attrs.ints("shape")?;
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(invalid!("shape {dims:?} has a negative dimension {d}"));
    }
    Ok(Shape::new(
        dims.iter().map(|&d| d as usize).collect::<Vec<_>>(),
    ))
}

/// The type of a filled tensor: `shape`, and `dtype` (f32 when absent).
pub(crate) fn filled_type(attrs: &Attrs) -> OpResult<TensorType> {
    let dtype = attrs.dtype_opt("dtype")?.unwrap_or(DType::F32);
    Ok(TensorType::new(dtype, shape_attr(attrs)?))
}

/// A tensor of [`filled_type`] holding `value` everywhere.
pub(crate) fn filled_ref(attrs: &Attrs, value: f64) -> OpResult<Vec<HostTensor>> {
    let t = filled_type(attrs)?;
    let values = ArrayD::from_elem(IxDyn(t.shape.dims()), value);
    Ok(vec![HostTensor::float(t.dtype, values)])
}

fn full_type(attrs: &Attrs) -> OpResult<TensorType> {
    attrs.float("value")?;
    filled_type(attrs)
}

#[cfg(feature = "conformance")]
fn full_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(REAL);
    let shape = g.shape(0, 3);
    let value = if dtype.is_float() {
        g.uniform(-3.0, 3.0)
    } else {
        g.below(10) as f64
    };
    Sample::new(
        vec![],
        Attrs::new()
            .with("shape", shape.dims())
            .with("dtype", dtype)
            .with("value", value),
    )
}

inventory::submit! {
    op_def! {
        name: "full",
        arity: Arity::Exactly(0),
        dtypes: ANY,
        infer: |_, attrs| Ok(vec![full_type(attrs)?]),
        lower: |b, _, attrs| {
            let t = full_type(attrs)?;
            Ok(vec![b.constant(t.dtype, t.shape, attrs.float("value")?)])
        },
        reference: |_, attrs| filled_ref(attrs, attrs.float("value")?),
        samples: || (0..6).map(|i| full_sample(&mut Gen::new(i))).collect(),
        arbitrary: full_sample,
        torch: Torch::Expr(r#"torch.full(a["shape"], a["value"], dtype=a.get("dtype", torch.float32))"#),
    }
}
