//! Helpers shared by op families: dtype sets and promotion, shape rules,
//! reference building blocks and sample generators.

pub mod dtypes;
pub mod reference;
#[cfg(feature = "conformance")]
pub mod samples;
pub mod shapes;

pub use dtypes::*;
pub use reference::*;
#[cfg(feature = "conformance")]
pub use samples::*;
pub use shapes::*;
