//! Strict: one single-op program per call, compiled once per (op,
//! attributes, input types, device) and executed asynchronously. A reshape
//! runs no program: its output shares its input's buffer, and the next
//! program to read it reshapes it inside.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use tpu_core::metrics::CutReason;
use tpu_core::op::{Attrs, OpId, single_op_program_over};
use tpu_core::pjrt::{Buffer, CompileOptions, Executable};
use tpu_core::policy::{EagerMode, ExecutionPolicy, OpCall};
use tpu_core::recompile::{self, OpSignature};
use tpu_core::stablehlo::TensorType;
use tpu_core::{Result, Runtime, Shape, Tensor};

use crate::lru::{KEPT, Lru};

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
    executable: Arc<Executable>,
}

impl Entry {
    fn matches(&self, call: &OpCall<'_>, buffers: &[Arc<Buffer>]) -> bool {
        self.op == call.id
            && self.device == call.device
            && self.attrs == *call.attrs
            && self.inputs.len() == call.inputs.len()
            && self
                .inputs
                .iter()
                .zip(call.inputs)
                .all(|(t, x)| t == x.ty())
            && self.stored.iter().zip(buffers).all(|(s, b)| s == b.shape())
    }
}

/// The Strict policy.
pub struct Strict {
    /// Executables by a hash of the call's key; entries are compared in
    /// full. The least recently used go once [`KEPT`] hashes are held.
    executables: Mutex<Lru<u64, Vec<Entry>>>,
}

impl Default for Strict {
    fn default() -> Strict {
        Strict {
            executables: Mutex::new(Lru::new(KEPT)),
        }
    }
}

fn call_hash(call: &OpCall<'_>, buffers: &[Arc<Buffer>]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    call.id.hash(&mut h);
    call.device.hash(&mut h);
    call.attrs.hash(&mut h);
    for (x, b) in call.inputs.iter().zip(buffers) {
        x.ty().hash(&mut h);
        b.shape().hash(&mut h);
    }
    h.finish()
}

impl Strict {
    /// A Strict policy with an empty executable table.
    pub fn new() -> Strict {
        Strict::default()
    }

    /// The executable for `call` on `buffers` (its inputs' elements),
    /// compiled on first use.
    fn executable(&self, call: &OpCall<'_>, buffers: &[Arc<Buffer>]) -> Result<Arc<Executable>> {
        let hash = call_hash(call, buffers);
        {
            let mut table = self.executables.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = table
                .get_mut(&hash)
                .and_then(|es| es.iter().find(|e| e.matches(call, buffers)))
            {
                return Ok(e.executable.clone());
            }
        }
        let types: Vec<TensorType> = call.inputs.iter().map(|x| x.ty().clone()).collect();
        let stored: Vec<Shape> = buffers.iter().map(|b| b.shape().clone()).collect();
        let shapes: Vec<&Shape> = stored.iter().collect();
        let program = single_op_program_over(call.op, &types, &shapes, call.attrs)?;
        let executable =
            Runtime::global()?.compile(&program, &CompileOptions::on_device(call.device))?;
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
            stored,
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

    /// Runs `call` now; outputs are enqueued, not waited for.
    pub(crate) fn run(&self, call: &OpCall<'_>) -> Result<Vec<Tensor>> {
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
        let executable = self.executable(call, &buffers)?;
        let args: Vec<&Buffer> = buffers.iter().map(Arc::as_ref).collect();
        let outputs = executable.run(&args)?;
        Ok(outputs.into_iter().map(Tensor::from_buffer).collect())
    }
}

impl ExecutionPolicy for Strict {
    fn name(&self) -> &'static str {
        EagerMode::Strict.name()
    }

    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>> {
        self.run(&call)
    }

    fn materialize(&self, _tensor: &Tensor) -> Result<()> {
        // Strict never leaves values pending.
        Ok(())
    }

    fn flush(&self, _reason: CutReason) -> Result<()> {
        Ok(())
    }
}
