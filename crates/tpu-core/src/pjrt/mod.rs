//! The PJRT runtime: plugins, clients, buffers, compilation and execution.
//!
//! All `unsafe` code of tpu-rs lives in this module, and every call into a
//! plugin goes through the padded-argument helper of the `ffi` module.

mod buffer;
mod client;
pub mod discovery;
mod event;
mod executable;
pub(crate) mod exit;
pub(crate) mod ffi;
mod kv;
mod options;
mod plugin;

pub use buffer::Buffer;
pub use client::{Client, ClientOptions, DeviceDescription, MemoryStats};
pub use event::Event;
pub use executable::{Arg, Executable};
pub use kv::{KeyValueStore, KeyValueStoreHandle};
pub use options::CompileOptions;
pub use plugin::{AttributeValue, Plugin};
