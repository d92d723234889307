//! Execution policies: how ops on `tpu` tensors run. The trait lives here;
//! policies register by name as [`PolicyFactory`] records (the `tpu-eager`
//! crate submits the built-in `strict`, `debug` and `defer_and_fuse`, the
//! [`EagerMode`]s) and are chosen by `TPU_RS_EAGER`, by a process-wide
//! choice (an embedder whose work spans threads), or by a per-thread,
//! nesting scope. A new policy needs no change here: submit a factory.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::Device;
use crate::block::Block;
use crate::error::{Error, Result};
use crate::metrics::CutReason;
use crate::op::{
    AsOp, Attrs, OpDef, OpErrorKind, OpId, OpResult, check_indices, check_inputs, registry,
    run_reference,
};
use crate::profile::{self, CallSite};
use crate::stablehlo::{Builder, TensorType, Value};
use crate::tensor::Tensor;

/// The built-in eager modes: the policies `tpu-eager` registers.
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
    /// The name its policy registers, which `TPU_RS_EAGER` takes.
    pub fn name(self) -> &'static str {
        match self {
            EagerMode::Strict => "strict",
            EagerMode::Debug => "debug",
            EagerMode::DeferAndFuse => "defer_and_fuse",
        }
    }

    /// The built-in mode `TPU_RS_EAGER` selects (`strict` when unset); an
    /// error when it names another registered policy or none.
    pub fn from_env() -> Result<EagerMode> {
        let name = policy_name_from_env()?;
        EagerMode::builtin(name).ok_or_else(|| not_builtin(Some("TPU_RS_EAGER"), name))
    }

    /// The built-in mode `TPU_RS_EAGER` names in `get` (`strict` when unset).
    pub fn from_lookup(get: crate::settings::Lookup<'_>) -> Result<EagerMode> {
        get("TPU_RS_EAGER")?.map_or(Ok(EagerMode::Strict), |v| {
            EagerMode::builtin(&v).ok_or_else(|| not_builtin(Some("TPU_RS_EAGER"), &v))
        })
    }

    /// The built-in mode `s` spells, if any.
    fn builtin(s: &str) -> Option<EagerMode> {
        let name = builtin_name(s)?;
        [EagerMode::Strict, EagerMode::Debug, EagerMode::DeferAndFuse]
            .into_iter()
            .find(|mode| mode.name() == name)
    }
}

/// The error for `s`, which names no built-in mode; read from `variable`
/// when it comes from the environment.
fn not_builtin(variable: Option<&'static str>, s: &str) -> Error {
    const WHY: &str = "is not a built-in eager mode; use strict, debug or defer_and_fuse";
    match variable {
        Some(variable) => crate::settings::invalid(variable, s, WHY),
        None => Error::InvalidOption {
            option: "eager mode",
            reason: format!("{s:?} {WHY}"),
        },
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
        EagerMode::builtin(s).ok_or_else(|| not_builtin(None, s))
    }
}

/// The built-in name `s` spells (any case; `defer-and-fuse` too).
fn builtin_name(s: &str) -> Option<&'static str> {
    match s.to_ascii_lowercase().as_str() {
        "strict" => Some("strict"),
        "debug" => Some("debug"),
        "defer_and_fuse" | "defer-and-fuse" | "deferandfuse" => Some("defer_and_fuse"),
        _ => None,
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
pub type LowerCollective<'a> = &'a dyn Fn(&mut Builder, &Value) -> OpResult<Value>;

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
    /// The name it registers under (`strict`, ...).
    fn name(&self) -> &'static str;
    /// Runs (or records) one op call, returning its outputs.
    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>>;
    /// Runs (or records) a recorded block on `inputs` (of the block's
    /// input types) on `device`, returning the block's outputs. By default
    /// call by call through [`ExecutionPolicy::dispatch`].
    fn dispatch_block(
        &self,
        block: &Block,
        inputs: &[Tensor],
        device: usize,
        location: CallSite,
    ) -> Result<Vec<Tensor>> {
        block.run_each(self, inputs, device, location)
    }
    /// Computes `tensor`'s pending value (set with [`Tensor::set_value`]).
    fn materialize(&self, tensor: &Tensor) -> Result<()>;
    /// Runs everything pending; `reason` says why (for metrics).
    fn flush(&self, reason: CutReason) -> Result<()>;
    /// Starts everything pending without waiting for programs still
    /// compiling (their launches follow when they are built); by default
    /// [`ExecutionPolicy::flush`].
    fn start(&self, reason: CutReason) -> Result<()> {
        self.flush(reason)
    }
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
    /// The name `TPU_RS_EAGER` and [`with_policy_named`] select it by.
    pub name: &'static str,
    /// Creates a fresh instance (one per thread), or says which of its
    /// settings is malformed.
    pub create: fn() -> Result<Arc<dyn ExecutionPolicy>>,
}

inventory::collect!(PolicyFactory);

thread_local! {
    static INSTANCES: RefCell<HashMap<&'static str, Arc<dyn ExecutionPolicy>>> = RefCell::new(HashMap::new());
    static SCOPES: RefCell<Vec<Arc<dyn ExecutionPolicy>>> = const { RefCell::new(Vec::new()) };
}

/// The names of the registered policies, sorted.
pub fn policy_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = inventory::iter::<PolicyFactory>
        .into_iter()
        .map(|f| f.name)
        .collect();
    names.sort_unstable();
    names
}

/// The registered factory `name` selects (built-in names in any spelling).
fn factory(name: &str) -> Result<&'static PolicyFactory> {
    let wanted = builtin_name(name).unwrap_or(name);
    inventory::iter::<PolicyFactory>
        .into_iter()
        .find(|f| f.name == wanted)
        .ok_or_else(|| {
            let known = policy_names().join(", ");
            let hint = if known.is_empty() {
                "none is linked in (the tpu-eager crate provides strict, debug and defer_and_fuse)"
                    .to_string()
            } else {
                format!("registered: {known}")
            };
            crate::settings::invalid("TPU_RS_EAGER", name, &format!("names no policy; {hint}"))
        })
}

/// The name of the policy `TPU_RS_EAGER` selects (`strict` when unset),
/// read once per process: every op outside a scope asks for it.
pub fn policy_name_from_env() -> Result<&'static str> {
    static NAME: OnceLock<Result<&'static str>> = OnceLock::new();
    NAME.get_or_init(|| match crate::settings::env("TPU_RS_EAGER")? {
        Some(name) => registered_name(&name),
        None => Ok(EagerMode::Strict.name()),
    })
    .clone()
}

/// A new instance of policy `name`, shared by no one ([`shared_policy`]
/// is the process's own).
pub fn new_policy(name: &str) -> Result<Arc<dyn ExecutionPolicy>> {
    (factory(name)?.create)()
}

/// The name policy `name` registered under (`defer-and-fuse` is
/// `defer_and_fuse`), or an error naming the registered ones.
pub fn registered_name(name: &str) -> Result<&'static str> {
    Ok(factory(name)?.name)
}

/// This thread's instance of policy `name`.
pub fn policy_for(name: &str) -> Result<Arc<dyn ExecutionPolicy>> {
    INSTANCES.with(|instances| {
        // Every op outside a scope comes here: a registered name is found
        // without resolving it.
        if let Some(p) = instances.borrow().get(name) {
            return Ok(p.clone());
        }
        let name = registered_name(name)?;
        if let Some(p) = instances.borrow().get(name) {
            return Ok(p.clone());
        }
        let policy = new_policy(name)?;
        instances.borrow_mut().insert(name, policy.clone());
        Ok(policy)
    })
}

/// The policy chosen for the whole process ([`set_process_policy`]).
static PROCESS: RwLock<Option<Arc<dyn ExecutionPolicy>>> = RwLock::new(None);

/// The process's shared instance of policy `name`, made on first use and
/// kept: switching back to a mode finds its compiled programs.
pub fn shared_policy(name: &str) -> Result<Arc<dyn ExecutionPolicy>> {
    static SHARED: Mutex<Vec<Arc<dyn ExecutionPolicy>>> = Mutex::new(Vec::new());
    let name = registered_name(name)?;
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = shared.iter().find(|p| p.name() == name) {
        return Ok(p.clone());
    }
    let created = new_policy(name)?;
    shared.push(created.clone());
    Ok(created)
}

/// The policy chosen for the whole process, if one was.
pub fn process_policy() -> Option<Arc<dyn ExecutionPolicy>> {
    PROCESS.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Puts `policy` in force on every thread of the process outside its own
/// scopes (an embedder whose work spans threads: PyTorch runs backward
/// passes on threads of its own, which must record into the forward
/// pass's graph). The previous choice runs its pending work first.
pub fn set_process_policy(policy: Arc<dyn ExecutionPolicy>) -> Result<()> {
    let previous = process_policy();
    if let Some(previous) = previous.filter(|p| !Arc::ptr_eq(p, &policy)) {
        previous.flush(CutReason::Sync)?;
    }
    *PROCESS.write().unwrap_or_else(|e| e.into_inner()) = Some(policy);
    Ok(())
}

/// The policy in force on this thread: the innermost scope's, else the
/// process's choice, else this thread's instance of the policy
/// `TPU_RS_EAGER` names.
pub fn current_policy() -> Result<Arc<dyn ExecutionPolicy>> {
    if let Some(policy) = SCOPES.with(|s| s.borrow().last().cloned()) {
        return Ok(policy);
    }
    match process_policy() {
        Some(policy) => Ok(policy),
        None => policy_for(policy_name_from_env()?),
    }
}

/// The name of the policy in force on this thread.
pub fn current_policy_name() -> Result<&'static str> {
    Ok(current_policy()?.name())
}

/// Runs `f` with `mode` in force on this thread; scopes nest.
pub fn with_eager_mode<R>(mode: EagerMode, f: impl FnOnce() -> R) -> Result<R> {
    with_policy_named(mode.name(), f)
}

/// Runs `f` with this thread's instance of policy `name` in force.
pub fn with_policy_named<R>(name: &str, f: impl FnOnce() -> R) -> Result<R> {
    Ok(with_policy(policy_for(name)?, f))
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
        Ok(EagerModeGuard::with_policy(policy_for(mode.name())?))
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
    current_policy()?.start(CutReason::Backward)
}

fn device_of(op: &OpDef, inputs: &[Tensor], device: Option<Device>) -> Result<Device> {
    let mut found = device;
    for t in inputs {
        match found {
            None => found = Some(t.device()),
            Some(d) if d != t.device() => {
                return Err(Error::InvalidInput {
                    kind: OpErrorKind::Invalid,
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
    let found = found.unwrap_or(Device::Cpu);
    if let (true, Device::Tpu(index)) = (inputs.is_empty(), found) {
        // A creation op names its device: one this process lacks is an
        // error naming it, before any program is built for it.
        let client = crate::Runtime::global()?.client();
        if index >= client.device_count() {
            return Err(Error::DeviceOutOfRange {
                index,
                count: client.device_count(),
                platform: client.platform_name().to_string(),
            });
        }
    }
    Ok(found)
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
    call_op(name, inputs, attrs, device)
}

/// [`call`] of an op named by id or interned name (`call_op(op!("add"), ..)`),
/// with no lookup by name on a hot path.
#[track_caller]
pub fn call_op<O: AsOp + ?Sized>(
    op: &O,
    inputs: &[Tensor],
    attrs: &Attrs,
    device: Option<Device>,
) -> Result<Vec<Tensor>> {
    let location = profile::call_site(Location::caller());
    let id = op.op_id()?;
    let op = registry()?.op(id);
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
            check_indices(op, &types, attrs, device, |i| Ok(values[i].clone()))?;
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
