//! Execution policies: how ops on `tpu` tensors run. The trait lives here;
//! the policies (Strict, Debug, DeferAndFuse) are submitted by the
//! `tpu-eager` crate as [`PolicyFactory`] records and chosen by
//! `TPU_RS_EAGER` or by a per-thread, nesting scope.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use crate::Device;
use crate::error::{Error, Result};
use crate::metrics::CutReason;
use crate::op::{Attrs, OpDef, OpId, check_inputs, registry, run_reference};
use crate::profile::{self, CallSite};
use crate::stablehlo::{Builder, TensorType, Value};
use crate::tensor::Tensor;

/// The eager modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EagerMode {
    /// One compiled op at a time, asynchronous.
    Strict,
    /// Strict, blocking on every op, with optional checks.
    Debug,
    /// Ops recorded and compiled as fused graphs when a value is needed.
    DeferAndFuse,
}

impl EagerMode {
    /// The name `TPU_RS_EAGER` takes.
    pub fn name(self) -> &'static str {
        match self {
            EagerMode::Strict => "strict",
            EagerMode::Debug => "debug",
            EagerMode::DeferAndFuse => "defer_and_fuse",
        }
    }

    /// The mode `TPU_RS_EAGER` selects (`strict` when unset), read once per
    /// process: every op outside a scope asks for it.
    pub fn from_env() -> Result<EagerMode> {
        static MODE: OnceLock<Result<EagerMode>> = OnceLock::new();
        MODE.get_or_init(EagerMode::read_env).clone()
    }

    fn read_env() -> Result<EagerMode> {
        EagerMode::from_lookup(&crate::settings::env)
    }

    /// The mode `TPU_RS_EAGER` names in `get` (`strict` when unset).
    pub fn from_lookup(get: crate::settings::Lookup<'_>) -> Result<EagerMode> {
        get("TPU_RS_EAGER")?.map_or(Ok(EagerMode::Strict), |v| v.parse())
    }
}

impl fmt::Display for EagerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EagerMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<EagerMode> {
        match s.to_ascii_lowercase().as_str() {
            "strict" => Ok(EagerMode::Strict),
            "debug" => Ok(EagerMode::Debug),
            "defer_and_fuse" | "defer-and-fuse" | "deferandfuse" => Ok(EagerMode::DeferAndFuse),
            _ => Err(crate::settings::invalid(
                "TPU_RS_EAGER",
                s,
                "is not an eager mode; use strict, debug or defer_and_fuse",
            )),
        }
    }
}

/// One op call, already checked: inference has run and `outputs` holds the
/// inferred types.
pub struct OpCall<'a> {
    /// The op.
    pub op: &'static OpDef,
    /// Its interned id.
    pub id: OpId,
    /// The inputs, all on `device`.
    pub inputs: &'a [Tensor],
    /// The attributes.
    pub attrs: &'a Attrs,
    /// The `tpu` device the call runs on.
    pub device: usize,
    /// The inferred output types.
    pub outputs: Vec<TensorType>,
    /// The user's call site.
    pub location: CallSite,
}

/// Lowers a collective's body for one member: its input, its output.
pub type LowerCollective<'a> =
    &'a dyn Fn(&mut Builder, &Value) -> std::result::Result<Value, String>;

/// A collective over several devices, one input per member, offered to
/// the policy holding its pending inputs so it can run in the same
/// program as their pending work.
pub struct CollectiveCall<'a> {
    /// The collective, e.g. `all_reduce`.
    pub name: &'a str,
    /// The member devices, in rank order (the replicas of the program).
    pub devices: &'a [usize],
    /// One input per member, on its device.
    pub inputs: &'a [Tensor],
    /// The body, written for one member of `devices.len()` replicas.
    pub lower: LowerCollective<'a>,
}

/// How ops on `tpu` tensors run.
pub trait ExecutionPolicy: Send + Sync {
    /// Which mode this is.
    fn mode(&self) -> EagerMode;
    /// Runs (or records) one op call, returning its outputs.
    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>>;
    /// Computes `tensor`'s pending value (set with [`Tensor::set_value`]).
    fn materialize(&self, tensor: &Tensor) -> Result<()>;
    /// Runs everything pending; `reason` says why (for metrics).
    fn flush(&self, reason: CutReason) -> Result<()>;
    /// Runs `call` together with the pending work its inputs wait on, as
    /// one program replicated over its devices, and returns each member's
    /// output; `None` when this policy cannot (the caller then runs the
    /// collective on its own).
    fn fuse_collective(&self, call: &CollectiveCall<'_>) -> Result<Option<Vec<Tensor>>> {
        let _ = call;
        Ok(None)
    }
}

/// A policy constructor submitted by a policy crate.
pub struct PolicyFactory {
    /// The mode it implements.
    pub mode: EagerMode,
    /// Creates a fresh instance (one per thread), or says which of its
    /// settings is malformed.
    pub create: fn() -> Result<Arc<dyn ExecutionPolicy>>,
}

inventory::collect!(PolicyFactory);

thread_local! {
    static INSTANCES: RefCell<HashMap<EagerMode, Arc<dyn ExecutionPolicy>>> = RefCell::new(HashMap::new());
    static SCOPES: RefCell<Vec<Arc<dyn ExecutionPolicy>>> = const { RefCell::new(Vec::new()) };
}

/// A new instance of `mode`, shared by no one (embedders that keep one
/// policy across threads hold it; see [`EagerModeGuard::with_policy`]).
pub fn new_policy(mode: EagerMode) -> Result<Arc<dyn ExecutionPolicy>> {
    let factory = inventory::iter::<PolicyFactory>
        .into_iter()
        .find(|f| f.mode == mode)
        .ok_or_else(|| Error::InvalidOption {
            option: "TPU_RS_EAGER",
            reason: format!("no `{mode}` policy is linked in (the tpu-eager crate provides them)"),
        })?;
    (factory.create)()
}

/// This thread's instance of `mode`.
pub fn policy_for(mode: EagerMode) -> Result<Arc<dyn ExecutionPolicy>> {
    INSTANCES.with(|instances| {
        if let Some(p) = instances.borrow().get(&mode) {
            return Ok(p.clone());
        }
        let policy = new_policy(mode)?;
        instances.borrow_mut().insert(mode, policy.clone());
        Ok(policy)
    })
}

/// The policy in force on this thread: the innermost scope's, else this
/// thread's instance of the `TPU_RS_EAGER` mode.
pub fn current_policy() -> Result<Arc<dyn ExecutionPolicy>> {
    match SCOPES.with(|s| s.borrow().last().cloned()) {
        Some(policy) => Ok(policy),
        None => policy_for(EagerMode::from_env()?),
    }
}

/// The mode in force on this thread.
pub fn current_mode() -> Result<EagerMode> {
    Ok(current_policy()?.mode())
}

/// Runs `f` with `mode` in force on this thread; scopes nest.
pub fn with_eager_mode<R>(mode: EagerMode, f: impl FnOnce() -> R) -> Result<R> {
    let _guard = EagerModeGuard::new(mode)?;
    Ok(f())
}

/// Runs `f` with a specific policy instance in force on this thread.
pub fn with_policy<R>(policy: Arc<dyn ExecutionPolicy>, f: impl FnOnce() -> R) -> R {
    let _guard = EagerModeGuard::with_policy(policy);
    f()
}

/// Keeps a mode in force on this thread until dropped.
pub struct EagerModeGuard {
    // Scopes are per thread: the guard must drop on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl EagerModeGuard {
    /// Enters `mode` (this thread's instance of it).
    pub fn new(mode: EagerMode) -> Result<EagerModeGuard> {
        Ok(EagerModeGuard::with_policy(policy_for(mode)?))
    }

    /// Enters a specific policy instance.
    pub fn with_policy(policy: Arc<dyn ExecutionPolicy>) -> EagerModeGuard {
        SCOPES.with(|s| s.borrow_mut().push(policy));
        EagerModeGuard {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for EagerModeGuard {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().pop());
    }
}

/// Runs everything the current policy has pending.
#[track_caller]
pub fn sync() -> Result<()> {
    profile::at(Location::caller(), || {
        current_policy()?.flush(CutReason::Sync)
    })
}

/// Marks the end of a backward pass: deferred work is cut here.
pub fn end_of_backward() -> Result<()> {
    current_policy()?.flush(CutReason::Backward)
}

fn device_of(op: &OpDef, inputs: &[Tensor], device: Option<Device>) -> Result<Device> {
    let mut found = device;
    for t in inputs {
        match found {
            None => found = Some(t.device()),
            Some(d) if d != t.device() => {
                return Err(Error::InvalidInput {
                    op: op.name.to_string(),
                    inputs: inputs
                        .iter()
                        .map(|t| format!("{} on {}", t.ty(), t.device()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    device: d.to_string(),
                    reason: "inputs live on different devices; move them with to_device first"
                        .into(),
                });
            }
            _ => {}
        }
    }
    Ok(found.unwrap_or(Device::Cpu))
}

/// Calls op `name` on `inputs`: inference first (typed errors, in every
/// mode), then the host reference for `cpu` tensors or the current policy
/// for `tpu` tensors. `device` places ops without inputs (creation ops).
#[track_caller]
pub fn call(
    name: &str,
    inputs: &[Tensor],
    attrs: &Attrs,
    device: Option<Device>,
) -> Result<Vec<Tensor>> {
    let location = profile::call_site(Location::caller());
    let registry = registry()?;
    let id = registry.id(name)?;
    let op = registry.op(id);
    let mut span = profile::span("op", op.name);
    if span.recording() {
        span.arg("at", location.to_string());
    }
    let device = device_of(op, inputs, device)?;
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let outputs = check_inputs(op, &types, attrs, device)?;
    match device {
        Device::Cpu => {
            let values = inputs
                .iter()
                .map(Tensor::to_host)
                .collect::<Result<Vec<_>>>()?;
            run_reference(op, &values, attrs)?
                .into_iter()
                .map(|v| Tensor::from_host(v, Device::Cpu))
                .collect()
        }
        Device::Tpu(index) => current_policy()?.dispatch(OpCall {
            op,
            id,
            inputs,
            attrs,
            device: index,
            outputs,
            location,
        }),
    }
}
