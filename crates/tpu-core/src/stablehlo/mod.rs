//! StableHLO programs: a typed builder, and reading the entry signature of a
//! module.

mod builder;
mod signature;

pub use builder::{Builder, Compare, Value, dim_list, i64_array, int_range, literal, mlir_type};
pub use signature::{Parameter, Signature, TensorType};
