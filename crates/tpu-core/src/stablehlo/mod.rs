//! StableHLO programs: reading the entry signature of a module.

mod signature;

pub use signature::{Parameter, Signature, TensorType};
