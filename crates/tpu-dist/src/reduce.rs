//! How a reducing collective combines its members' values.

use std::fmt;
use tpu_core::op::OpResult;
use tpu_core::unsupported;

use tpu_core::DType;

/// The reduction of [`crate::DeviceGroup::all_reduce`] and
/// [`crate::DeviceGroup::reduce_scatter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum (`or` on booleans).
    Sum,
    /// Elementwise sum divided by the group size (floating dtypes only).
    Mean,
    /// Elementwise maximum (`or` on booleans).
    Max,
    /// Elementwise minimum (`and` on booleans).
    Min,
    /// Elementwise product (`and` on booleans).
    Prod,
}

impl ReduceOp {
    /// The StableHLO op combining two scalars of `dtype`, or why `dtype`
    /// cannot be reduced so.
    pub(crate) fn combiner(self, dtype: DType) -> OpResult<&'static str> {
        if dtype == DType::Bool {
            return Ok(match self {
                ReduceOp::Sum | ReduceOp::Max => "stablehlo.or",
                ReduceOp::Min | ReduceOp::Prod => "stablehlo.and",
                ReduceOp::Mean => return Err("a mean of booleans is not defined".into()),
            });
        }
        if dtype.is_complex() && !matches!(self, ReduceOp::Sum | ReduceOp::Mean) {
            // No order; and a product the host leg would take part by part.
            return Err(unsupported!(
                "{dtype} tensors reduce only by sum or mean, not {self}"
            ));
        }
        Ok(match self {
            ReduceOp::Sum => "stablehlo.add",
            ReduceOp::Mean if dtype.is_inexact() => "stablehlo.add",
            ReduceOp::Mean => {
                return Err(unsupported!("a mean needs a floating dtype, got {dtype}"));
            }
            ReduceOp::Max => "stablehlo.maximum",
            ReduceOp::Min => "stablehlo.minimum",
            ReduceOp::Prod => "stablehlo.multiply",
        })
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        })
    }
}
