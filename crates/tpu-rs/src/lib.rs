//! tpu-rs: run tensor programs on TPUs — or any PJRT device — from Rust.
//!
//! Today the facade exposes the runtime of [`tpu_core`]: plugins, devices,
//! buffers, compilation of StableHLO and execution.
//!
//! ```no_run
//! use tpu_rs::{CompileOptions, Runtime};
//!
//! let runtime = Runtime::global()?;
//! println!("{}", runtime.describe(0)?);
//! # Ok::<(), tpu_rs::Error>(())
//! ```
#![warn(missing_docs)]

pub use tpu_core::pjrt::discovery;
pub use tpu_core::{
    Arg, Buffer, CacheStats, Client, ClientOptions, CompileCache, CompileOptions, DType, Device,
    DeviceDescription, Element, Error, ErrorCode, Executable, HostBuffer, MemoryStats, Plugin,
    Result, Runtime, Shape,
};
