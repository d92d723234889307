//! Thin calls into the tpu-rs dispatcher, with the bridge's execution
//! policy in force.
//!
//! The bridge's policy is the core's process-wide choice, not a per-thread
//! one: PyTorch runs backward passes on its own threads, and they must
//! record into the same deferred graph as the forward pass.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use tpu_core::op::{AsOp, Attrs};
use tpu_core::policy::{self, EagerMode, EagerModeGuard, ExecutionPolicy};
use tpu_core::{DType, Device, Tensor};

use crate::error::{BridgeError, Result};

/// The policy in force (chosen by the environment on first use).
pub fn current() -> Result<Arc<dyn ExecutionPolicy>> {
    static CHOSEN: OnceLock<tpu_core::Result<()>> = OnceLock::new();
    if let Some(policy) = policy::process_policy() {
        return Ok(policy);
    }
    tpu_eager::link();
    CHOSEN
        .get_or_init(|| policy::set_process_policy(policy::shared_policy(name_from_env()?)?))
        .clone()?;
    policy::process_policy().ok_or_else(|| BridgeError::internal("no eager mode was chosen"))
}

/// The policy backward rules run under: the one in force, except that
/// under Strict a rule runs deferred and fused (flushed by the caller), so
/// the forward values it recomputes but does not read cost nothing.
pub fn vjp_policy() -> Result<Arc<dyn ExecutionPolicy>> {
    let policy = current()?;
    if policy.name() != EagerMode::Strict.name() {
        return Ok(policy);
    }
    Ok(policy::shared_policy(EagerMode::DeferAndFuse.name())?)
}

/// The policy TorchTPU users select by environment: `TORCH_TPU_LAUNCH_BLOCKING=1`
/// is Debug, `TORCH_TPU_DEFER_AND_FUSE=1` is DeferAndFuse, else `TPU_RS_EAGER`.
fn name_from_env() -> tpu_core::Result<&'static str> {
    let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    if on("TORCH_TPU_LAUNCH_BLOCKING") {
        Ok(EagerMode::Debug.name())
    } else if on("TORCH_TPU_DEFER_AND_FUSE") {
        Ok(EagerMode::DeferAndFuse.name())
    } else {
        policy::policy_name_from_env()
    }
}

/// The name of the policy in force.
pub fn policy_name() -> Result<&'static str> {
    Ok(current()?.name())
}

/// Switches policy: pending work of the old one runs first.
pub fn set_policy(name: &str) -> Result<()> {
    // The environment's choice first, so a bad one is still reported.
    current()?;
    Ok(policy::set_process_policy(policy::shared_policy(name)?)?)
}

/// Starts everything pending, without waiting for it (or for the
/// compiles its launches wait on).
pub fn start() -> Result<()> {
    Ok(current()?.start(tpu_core::metrics::CutReason::Sync)?)
}

/// Launches everything pending, waiting for the compiles that takes, but
/// not for the device to finish.
pub fn flush() -> Result<()> {
    Ok(current()?.flush(tpu_core::metrics::CutReason::Sync)?)
}

/// Runs everything pending and waits until every value written to a tpu
/// storage exists.
pub fn synchronize() -> Result<()> {
    flush()?;
    crate::writes::wait_for_all()
}

thread_local! {
    /// Whether this thread is inside [`fused`].
    static FUSING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`'s ops as one deferred graph under Strict too (the policy
/// backward rules run under, [`vjp_policy`]), started when `f` returns: a
/// native kernel made of many ops (a fused optimizer step) costs one
/// program, not one per op. Other modes run `f` as they run any op.
pub fn fused<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let policy = vjp_policy()?;
    if FUSING.get() || Arc::ptr_eq(&policy, &current()?) {
        // Deferred already (or Debug, which runs each op as it comes).
        return f();
    }
    FUSING.set(true);
    let result = f();
    FUSING.set(false);
    // A kernel's own end, as an explicit sync is the user's.
    policy.start(tpu_core::metrics::CutReason::Sync)?;
    result
}

/// Calls `op` (an interned name, `op!("add")`, or an id) under the
/// bridge's policy.
pub fn call<O: AsOp + ?Sized>(
    op: &O,
    inputs: &[Tensor],
    attrs: &Attrs,
    device: usize,
) -> Result<Vec<Tensor>> {
    let id = op.op_id()?;
    let policy = if FUSING.get() {
        vjp_policy()?
    } else {
        current()?
    };
    let _scope = EagerModeGuard::with_policy(policy);
    let outputs = crate::profile::from_python(|| {
        policy::call_op(&id, inputs, attrs, Some(Device::Tpu(device)))
    })?;
    crate::recording::note_call(id, inputs, attrs, device, &outputs);
    Ok(outputs)
}

/// [`call`] of an op with one output, on its inputs' device.
pub fn call1<O: AsOp + ?Sized>(op: &O, inputs: &[Tensor], attrs: &Attrs) -> Result<Tensor> {
    let device = match inputs.first().map(Tensor::device) {
        Some(Device::Tpu(d)) => d,
        _ => 0,
    };
    let id = op.op_id()?;
    call(&id, inputs, attrs, device)?
        .into_iter()
        .next()
        .ok_or_else(|| {
            let name = tpu_core::op::registry().map_or("?", |r| r.op(id).name);
            BridgeError::internal(format!("`{name}` returned nothing"))
        })
}

/// A 0-dim tensor of `value` in `dtype` on `device` (device-resident and
/// shared: see [`tpu_core::scalars`]).
pub fn scalar(dtype: DType, value: f64, device: usize) -> Result<Tensor> {
    Ok(tpu_core::scalars::scalar(
        dtype,
        value,
        tpu_core::Device::Tpu(device),
    )?)
}

/// A rank-0 tensor of `re + i im` in `dtype` on `tpu:device` (shared, as
/// [`scalar`]'s are): a complex dtype holds both parts; a real one only a
/// number whose `im` is 0.
pub fn number(dtype: DType, re: f64, im: f64, device: usize) -> Result<Tensor> {
    if !dtype.is_complex() {
        if im != 0.0 {
            return Err(BridgeError::Unsupported(format!(
                "the complex number {re}{im:+}j cannot be a {dtype} value"
            )));
        }
        return scalar(dtype, re, device);
    }
    let value = tpu_core::Complex::new(re, im);
    Ok(tpu_core::scalars::complex_scalar(
        dtype,
        value,
        Device::Tpu(device),
    )?)
}

/// A tensor of `shape` filled with `value`.
pub fn full(dtype: DType, shape: &[usize], value: f64, device: usize) -> Result<Tensor> {
    let attrs = Attrs::new()
        .with("shape", shape)
        .with("dtype", dtype)
        .with("value", value);
    call(op!("full"), &[], &attrs, device)?
        .into_iter()
        .next()
        .ok_or_else(|| BridgeError::internal("`full` returned nothing"))
}

/// `x` in `dtype` (itself when it already is).
pub fn cast(x: Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return Ok(x);
    }
    call1(op!("cast"), &[x], &Attrs::new().with("dtype", dtype))
}

/// `x` broadcast to `shape` (itself when it already has it).
pub fn broadcast(x: Tensor, shape: &[usize]) -> Result<Tensor> {
    if x.shape().dims() == shape {
        return Ok(x);
    }
    call1(
        op!("broadcast_to"),
        &[x],
        &Attrs::new().with("shape", shape),
    )
}
