//! Strict: one single-op program per call, compiled once per (op,
//! attributes, input types, device) and executed asynchronously. A reshape
//! runs no program: its output shares its input's buffer, and the next
//! program to read it reshapes it inside.
//!
//! The policy instances `TPU_RS_EAGER` selects compile ahead: a call whose
//! program is not built yet is queued while the compile pool builds it,
//! and returns pending outputs, as a CUDA launch returns before the kernel
//! runs; so a first step traces on while its programs compile in parallel.
//! Calls on values still queued queue behind them. Reading a value waits
//! for the launches it needs; a failed launch raises its error there.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use tpu_core::compile_pool::{self, Compiling};
use tpu_core::metrics::CutReason;
use tpu_core::op::{Attrs, OpId, single_op_program_over};
use tpu_core::pjrt::{Buffer, CompileOptions};
use tpu_core::policy::{EagerMode, ExecutionPolicy, OpCall};
use tpu_core::recompile::{self, OpSignature};
use tpu_core::stablehlo::TensorType;
use tpu_core::{Device, Error, Pending, Result, Runtime, Shape, Tensor, TensorValue};

use crate::launch_queue::{self, Launch, Output, Until, Work};
use crate::lru::{KEPT, Lru};
use crate::op_failed;

/// The op whose output is its input's elements under a new shape.
const RESHAPE: &str = "reshape";

struct Entry {
    op: OpId,
    attrs: Attrs,
    inputs: Vec<TensorType>,
    /// Shapes of the buffers passed for the inputs (see
    /// [`tpu_core::TensorValue::Reshaped`]).
    stored: Vec<Shape>,
    device: usize,
    executable: Arc<Compiling>,
}

impl Entry {
    fn matches(&self, call: &OpCall<'_>, stored: &[Shape]) -> bool {
        self.op == call.id
            && self.device == call.device
            && self.attrs == *call.attrs
            && self.inputs.len() == call.inputs.len()
            && self
                .inputs
                .iter()
                .zip(call.inputs)
                .all(|(t, x)| t == x.ty())
            && self.stored == stored
    }
}

/// The Strict policy.
pub struct Strict {
    /// Executables by a hash of the call's key; entries are compared in
    /// full. The least recently used go once [`KEPT`] hashes are held.
    executables: Mutex<Lru<u64, Vec<Entry>>>,
    /// Set when this instance compiles ahead: itself, which the pending
    /// outputs of its queued calls name.
    ahead: Option<Weak<Strict>>,
}

impl Default for Strict {
    fn default() -> Strict {
        Strict {
            executables: Mutex::new(Lru::new(KEPT)),
            ahead: None,
        }
    }
}

fn call_hash(call: &OpCall<'_>, stored: &[Shape]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    call.id.hash(&mut h);
    call.device.hash(&mut h);
    call.attrs.hash(&mut h);
    for (x, s) in call.inputs.iter().zip(stored) {
        x.ty().hash(&mut h);
        s.hash(&mut h);
    }
    h.finish()
}

impl Strict {
    /// A Strict policy that compiles each program on the calling thread,
    /// so every call has launched when it returns.
    pub fn new() -> Strict {
        Strict::default()
    }

    /// A Strict policy that compiles ahead on the compile pool (see the
    /// module docs); one that compiles on the calling thread when
    /// `TPU_RS_COMPILE_THREADS` turns the pool off.
    pub fn compiling_ahead() -> Result<Arc<Strict>> {
        if !compile_pool::enabled()? {
            return Ok(Arc::new(Strict::new()));
        }
        Ok(Arc::new_cyclic(|me| Strict {
            ahead: Some(me.clone()),
            ..Strict::default()
        }))
    }

    /// The program for `call` on inputs whose elements sit in buffers of
    /// the `stored` shapes, compiled (or compiling) on first use.
    fn executable(&self, call: &OpCall<'_>, stored: &[Shape]) -> Result<Arc<Compiling>> {
        let hash = call_hash(call, stored);
        {
            let mut table = self.executables.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = table
                .get_mut(&hash)
                .and_then(|es| es.iter().find(|e| e.matches(call, stored)))
            {
                return Ok(e.executable.clone());
            }
        }
        let types: Vec<TensorType> = call.inputs.iter().map(|x| x.ty().clone()).collect();
        let shapes: Vec<&Shape> = stored.iter().collect();
        let program = single_op_program_over(call.op, &types, &shapes, call.attrs)?;
        let options = CompileOptions::on_device(call.device);
        let executable = match self.ahead {
            Some(_) => compile_pool::compile(program, options)?,
            None => Compiling::finished(Ok(Runtime::global()?
                .compile(&program, &options)
                .map_err(|e| op_failed(call.op.name, call.location, call.inputs, e))?)),
        };
        let mut identity = std::collections::hash_map::DefaultHasher::new();
        (call.id, call.device).hash(&mut identity);
        let signature = OpSignature {
            op: call.op.name,
            inputs: &types,
            attrs: call.attrs,
        };
        recompile::built(
            identity.finish(),
            || format!("op `{}`", call.op.name),
            &[signature],
            call.location,
        );
        let entry = Entry {
            op: call.id,
            attrs: call.attrs.clone(),
            inputs: types,
            stored: stored.to_vec(),
            device: call.device,
            executable: executable.clone(),
        };
        let mut table = self.executables.lock().unwrap_or_else(|e| e.into_inner());
        match table.get_mut(&hash) {
            Some(entries) => entries.push(entry),
            None => table.insert(hash, vec![entry]),
        }
        Ok(executable)
    }

    /// Launches `call` (or queues it behind its program's compile or its
    /// inputs' launches); outputs are enqueued, not waited for.
    pub(crate) fn run(&self, call: &OpCall<'_>) -> Result<Vec<Tensor>> {
        let queued: Vec<Option<Shape>> = match self.ahead {
            Some(_) => call.inputs.iter().map(queued_shape).collect(),
            None => Vec::new(),
        };
        if let Some(me) = &self.ahead
            && queued.iter().any(Option::is_some)
        {
            // The others: launched, or pending elsewhere (computed now), or
            // failed (raising that error).
            let stored: Vec<Shape> = queued
                .into_iter()
                .zip(call.inputs)
                .map(|(shape, x)| shape.map_or_else(|| Ok(x.elements()?.shape().clone()), Ok))
                .collect::<Result<_>>()?;
            let work = match (call.op.name, stored.as_slice()) {
                (RESHAPE, [_]) => Work::Reshape,
                _ => Work::Program(self.executable(call, &stored)?),
            };
            return self.enqueue(me, call, work, &stored);
        }
        let buffers: Vec<Arc<Buffer>> = call
            .inputs
            .iter()
            .map(Tensor::elements)
            .collect::<Result<_>>()?;
        if call.op.name == RESHAPE
            && let ([buffer], [ty]) = (buffers.as_slice(), call.outputs.as_slice())
        {
            return Ok(vec![Tensor::reshaped(buffer.clone(), ty.clone())?]);
        }
        let stored: Vec<Shape> = buffers.iter().map(|b| b.shape().clone()).collect();
        let executable = self.executable(call, &stored)?;
        let program = match (executable.try_get(), &self.ahead) {
            (Some(program), _) => program,
            (None, Some(me)) => {
                return self.enqueue(me, call, Work::Program(executable), &stored);
            }
            (None, None) => executable.wait(),
        };
        let args: Vec<&Buffer> = buffers.iter().map(Arc::as_ref).collect();
        let outputs = program
            .and_then(|p| p.run(&args))
            .map_err(|e| op_failed(call.op.name, call.location, call.inputs, e))?;
        Ok(outputs.into_iter().map(Tensor::from_buffer).collect())
    }

    /// Queues `call` to run `work` on inputs stored in `stored` shapes, and
    /// returns its pending outputs.
    fn enqueue(
        &self,
        me: &Weak<Strict>,
        call: &OpCall<'_>,
        work: Work,
        stored: &[Shape],
    ) -> Result<Vec<Tensor>> {
        let me: Arc<dyn tpu_core::policy::ExecutionPolicy> = me.upgrade().ok_or_else(|| {
            Error::Signature("a Strict policy queued a call while dropped".into())
        })?;
        let mut tensors = Vec::with_capacity(call.outputs.len());
        let mut outputs = Vec::with_capacity(call.outputs.len());
        for ty in &call.outputs {
            let token = crate::next_token();
            let pending = Pending {
                policy: me.clone(),
                token,
            };
            let tensor = Tensor::pending(ty.clone(), Device::Tpu(call.device), pending);
            let stored = match work {
                Work::Reshape => stored[0].clone(),
                _ => ty.shape.clone(),
            };
            outputs.push(Output {
                token,
                tensor: tensor.downgrade(),
                stored,
            });
            tensors.push(tensor);
        }
        launch_queue::global().push(Launch {
            op: call.op.name,
            location: call.location,
            work,
            inputs: call.inputs.to_vec(),
            outputs,
        });
        Ok(tensors)
    }
}

/// The shape of the buffer that will hold `x`'s elements, if its launch
/// waits in the queue.
fn queued_shape(x: &Tensor) -> Option<Shape> {
    match x.value() {
        TensorValue::Pending(p) => launch_queue::global().stored_shape(p.token),
        _ => None,
    }
}

impl ExecutionPolicy for Strict {
    fn name(&self) -> &'static str {
        EagerMode::Strict.name()
    }

    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>> {
        self.run(&call)
    }

    fn materialize(&self, tensor: &Tensor) -> Result<()> {
        match (&self.ahead, tensor.value()) {
            (Some(_), TensorValue::Pending(p)) => launch_queue::global().materialize(p.token),
            _ => Ok(()),
        }
    }

    fn flush(&self, _reason: CutReason) -> Result<()> {
        if self.ahead.is_some() {
            launch_queue::global().pump(Until::Empty);
        }
        Ok(())
    }

    fn start(&self, _reason: CutReason) -> Result<()> {
        // Every call has started: launched, or queued behind a compile.
        Ok(())
    }
}
