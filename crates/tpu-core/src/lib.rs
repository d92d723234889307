//! The core of tpu-rs: dtypes, shapes, devices, and the PJRT runtime that
//! drives TPUs (or any PJRT plugin) from Rust.
//!
//! ```no_run
//! use tpu_core::{CompileOptions, Runtime};
//!
//! let runtime = Runtime::global()?; // plugin from TPU_RS_PLUGIN or discovery
//! let client = runtime.client();
//! let x = client.buffer_from_slice(&[1.0f32, 2.0, 3.0], [3], 0)?;
//! let program = r#"
//! func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
//!   %y = stablehlo.add %x, %x : tensor<3xf32>
//!   return %y : tensor<3xf32>
//! }"#;
//! let exe = runtime.compile(program, &CompileOptions::default())?;
//! let y = exe.run(&[&x])?;
//! assert_eq!(y[0].to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), tpu_core::Error>(())
//! ```
#![warn(missing_docs)]

pub mod autograd;
pub mod block;
mod cache;
pub mod compile_pool;
mod device;
mod dtype;
mod error;
pub mod host;
pub mod memory;
pub mod metrics;
pub mod op;
pub mod pjrt;
pub mod policy;
pub mod profile;
pub mod recompile;
mod runtime;
pub mod scalars;
pub mod settings;
mod shape;
pub mod stablehlo;
mod tensor;

pub use cache::record as program_record;
pub use cache::{CacheStats, CompileCache, DiskCache};
pub use device::{Device, ParseDeviceError};
pub use dtype::{DType, Element};
pub use error::{Error, ErrorCode, Result};
pub use host::{HostBuffer, HostTensor};
pub use num_complex::Complex;
pub use pjrt::{
    Arg, Buffer, Client, ClientOptions, CompileOptions, DeviceDescription, Event, Executable,
    MemoryStats, Plugin,
};
pub use runtime::Runtime;
pub use shape::Shape;
pub use tensor::{Pending, Tensor, TensorValue, WeakTensor};
