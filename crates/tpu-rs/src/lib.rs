//! tpu-rs: run tensor programs on TPUs — or any PJRT device — from Rust.
//!
//! ```no_run
//! use tpu_rs::prelude::*;
//!
//! let device = Device::default(); // tpu:0 when a PJRT plugin is available
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], device)?.with_requires_grad(true);
//! let y = (&x * &x)?.sum_all()?;
//! y.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), tpu_rs::Error>(())
//! ```
//!
//! [`dist::DataParallel`] trains one model replica per local device on
//! equal shards of each batch, averaging gradients over the replicas.
#![warn(missing_docs)]

pub mod amp;
mod autograd;
pub mod checkpoint;
mod complex;
pub mod data;
#[doc = include_str!("../../../docs/rust-guide.md")]
pub mod guide {}
mod dims;
mod display;
pub mod dist;
mod error;
mod fft;
mod functional;
pub mod models;
pub mod nn;
mod ops;
pub mod optim;
mod random;
mod stft;
mod tensor;

pub use autograd::{is_grad_enabled, no_grad};
pub use dims::Dims;
pub use error::{Error, Result};
pub use fft::FftNorm;
pub use functional::Window;
pub use random::{Generator, manual_seed};
pub use stft::Stft;
pub use tensor::Tensor;
pub use tpu_core::metrics::{Metrics, RecompileReason, metrics};
pub use tpu_core::op::{Attrs, OpErrorKind};
pub use tpu_core::pjrt::discovery;
pub use tpu_core::policy::{EagerMode, sync, with_policy_named};
pub use tpu_core::profile;
pub use tpu_core::program_record;
pub use tpu_core::{
    Arg, Buffer, CacheStats, Client, ClientOptions, CompileCache, CompileOptions, Complex, DType,
    Device, DeviceDescription, Element, ErrorCode, Executable, HostBuffer, HostTensor, MemoryStats,
    Plugin, Runtime, Shape,
};

/// The names most programs need.
pub mod prelude {
    pub use crate::{DType, Device, EagerMode, FftNorm, Stft, Tensor, no_grad, with_eager_mode};
}

/// Runs `f` under eager mode `mode` on this thread; `f`'s error and the
/// mode's own (an unknown setting, a failed flush) come back as one
/// `Result`.
pub fn with_eager_mode<T>(mode: EagerMode, f: impl FnOnce() -> Result<T>) -> Result<T> {
    tpu_core::policy::with_eager_mode(mode, f)?
}

/// References the op and policy crates so their records are linked in.
pub fn link() {
    tpu_eager::link();
}
