//! Distributed tpu-rs: collectives across the devices of one client.
//!
//! A [`DeviceGroup`] names some of the client's devices; each collective
//! takes one tensor per member (on that member's device, in group order)
//! and runs as one StableHLO program replicated over the group, the path
//! libtpu takes over the chip interconnect. Programs are compiled once per
//! (collective, dtype, shape, group) through the runtime's compile cache.
//!
//! For tensor parallelism, a [`Mesh`] arranges devices in a grid with named
//! axes, [`shard`] splits a tensor over it by a [`ShardingSpec`], and
//! [`Mesh::run`] runs a program written for global shapes with one SPMD
//! partition per device: XLA inserts the collectives the shardings imply.
//!
//! ```no_run
//! use tpu_core::{Device, HostTensor, DType, Tensor};
//! use tpu_dist::{DeviceGroup, ReduceOp};
//!
//! let group = DeviceGroup::all()?;
//! let xs = (0..group.len())
//!     .map(|r| Tensor::from_host(HostTensor::scalar(DType::F32, r as f64), group.device(r)))
//!     .collect::<tpu_core::Result<Vec<_>>>()?;
//! let sums = group.all_reduce(&xs, ReduceOp::Sum)?; // every member holds 0 + 1 + ...
//! # Ok::<(), tpu_core::Error>(())
//! ```
#![warn(missing_docs)]

mod collective;
mod env;
mod gloo;
mod group;
mod layout;
mod mesh;
mod process;
mod reduce;
mod store;
mod world;

pub use env::{DEFAULT_TIMEOUT, JobOptions, timeout_from_env};
pub use group::DeviceGroup;
pub use mesh::{Mesh, ShardedTensor, ShardingSpec, shard};
pub use process::ProcessGroup;
pub use reduce::ReduceOp;
pub use store::Store;
pub use world::World;
