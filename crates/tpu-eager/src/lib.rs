//! Eager execution policies of tpu-rs, selected by `TPU_RS_EAGER` or
//! [`tpu_core::policy::with_eager_mode`]:
//!
//! - [`Strict`]: each op is a single-op program, compiled once per op,
//!   attributes, input types and device, then executed asynchronously.
//! - [`Debug`](struct@Debug): Strict, blocking on every op so errors surface at the
//!   faulting call, with optional NaN/Inf and reference-parity checks.
//! - [`DeferAndFuse`]: ops are recorded per device and compiled as one fused
//!   program when a value is needed.
//!
//! Linking this crate registers the policies (see [`link`]).
#![warn(missing_docs)]

mod debug;
mod defer;
mod launch_queue;
mod lru;
mod strict;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use debug::{Debug, DebugChecks};
pub use defer::{DeferAndFuse, DeferConfig};
pub use strict::Strict;
use tpu_core::policy::{ExecutionPolicy, PolicyFactory};
use tpu_core::profile::CallSite;
use tpu_core::{Error, Tensor};

inventory::submit! {
    PolicyFactory {
        name: "strict",
        create: || Ok(Strict::compiling_ahead()? as Arc<dyn ExecutionPolicy>),
    }
}
inventory::submit! {
    PolicyFactory {
        name: "debug",
        create: || Ok(Arc::new(Debug::from_env()?) as Arc<dyn ExecutionPolicy>),
    }
}
inventory::submit! {
    PolicyFactory {
        name: "defer_and_fuse",
        create: || Ok(DeferAndFuse::new(DeferConfig::from_env()?) as Arc<dyn ExecutionPolicy>),
    }
}

/// A token for a pending value, unique across every policy instance, so a
/// token names the graph or launch that will compute it.
pub(crate) fn next_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The input types of a call, as errors and traces name them.
pub(crate) fn describe(inputs: &[Tensor]) -> String {
    inputs
        .iter()
        .map(|x| x.ty().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error of call `op` at `location` on `inputs` failing with `source`.
pub(crate) fn op_failed(op: &str, location: CallSite, inputs: &[Tensor], source: Error) -> Error {
    Error::OpFailed {
        op: op.to_string(),
        location: location.to_string(),
        inputs: describe(inputs),
        source: Box::new(source),
    }
}

/// Launches every call still queued behind a compile, waiting for those
/// compiles: afterwards the device holds every value issued so far (as a
/// CUDA allocator has allocated every output of the calls made so far).
pub fn launch_queued() {
    launch_queue::global().pump(launch_queue::Until::Empty);
}

/// References this crate (and the op kernels) so their records are linked.
#[inline(never)]
pub fn link() {
    tpu_ops::link();
    std::hint::black_box(());
}
