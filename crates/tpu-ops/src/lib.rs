//! Op kernels of tpu-rs. Each op is one [`tpu_core::op::OpDef`] record —
//! shape/dtype inference, StableHLO lowering, a CPU reference on `ndarray`,
//! a backward rule, flags, tolerance and samples — written with
//! [`tpu_core::op_def!`] (which states only what differs from
//! [`tpu_core::op::OpDef::DEFAULT`]) and submitted with `inventory` into
//! tpu-core's registry.
//!
//! Families live in one folder each. Linking this crate is what registers
//! the ops: a binary must reference it (see [`link`]).
//!
//! ```
//! let registry = tpu_ops::registry().unwrap();
//! assert!(registry.get("add").is_ok());
//! ```
#![warn(missing_docs)]

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod creation;
pub mod elementwise;
pub mod linalg;
pub mod movement;
pub mod nn;
pub mod random;
pub mod reduce;
pub mod support;

/// The op registry with this crate's ops in it. Calling it (or [`link`])
/// keeps the linker from dropping the crate's records.
pub fn registry() -> tpu_core::Result<&'static tpu_core::op::Registry> {
    link();
    tpu_core::op::registry()
}

/// References this crate so its `inventory` records are linked in.
#[inline(never)]
pub fn link() {
    std::hint::black_box(());
}
