//! Recording the tpu-rs calls a compiled aten graph makes, and replaying
//! them without going back through PyTorch's dispatcher.
//!
//! A `torch.compile`d graph runs its aten ops one by one through Python
//! kernels, at every call, though the graph and its input layouts are the
//! same each time (dynamo guards them). The first run is recorded: each op
//! call, with each input traced to a graph input, an earlier call's output
//! or a constant the graph holds. Later runs replay the calls from Rust on
//! the new inputs. A run that reads values back to the host, draws random
//! numbers, writes into a graph input or takes the gradient of an op is
//! not recorded (its result could depend on more than the inputs).

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyList;
use tpu_core::op::{Attrs, OpDef, OpId, registry};
use tpu_core::policy::{EagerModeGuard, OpCall};
use tpu_core::stablehlo::TensorType;
use tpu_core::{Tensor, profile};

use crate::error::{BridgeError, Result};
use crate::kernels::call;
use crate::storage::Layout;
use crate::torch::{View, wrap};

/// Where a recorded call's input comes from.
#[derive(Clone)]
enum Source {
    /// Graph input `i`'s stored value.
    Input(usize),
    /// Output `j` of recorded call `i`.
    Output(usize, usize),
    /// A value the graph holds (a scalar, a constant tensor).
    Constant(Tensor),
}

struct Call {
    op: &'static OpDef,
    id: OpId,
    attrs: Attrs,
    device: usize,
    inputs: Vec<Source>,
    /// The recorded inputs' types: a replay over the same types skips
    /// shape inference and dispatches with the recorded output types.
    input_types: Vec<TensorType>,
    outputs: Vec<TensorType>,
}

struct Recording {
    /// The thread running the graph: calls from other threads (a backward
    /// pass elsewhere) are not the graph's.
    thread: std::thread::ThreadId,
    /// Graph inputs' stored values, by tensor id.
    inputs: HashMap<u64, usize>,
    /// Outputs of recorded calls, by tensor id.
    outputs: HashMap<u64, (usize, usize)>,
    calls: Vec<Call>,
    /// Why the run cannot be replayed, once something says so.
    broken: Option<String>,
}

impl Recording {
    fn new() -> Recording {
        Recording {
            thread: std::thread::current().id(),
            inputs: HashMap::new(),
            outputs: HashMap::new(),
            calls: Vec::new(),
            broken: None,
        }
    }

    /// The recording, when this thread is the one recording.
    fn here(slot: &mut Option<Recording>) -> Option<&mut Recording> {
        slot.as_mut()
            .filter(|r| r.thread == std::thread::current().id())
    }

    fn source(&self, t: &Tensor) -> Source {
        if let Some(&i) = self.inputs.get(&t.id()) {
            Source::Input(i)
        } else if let Some(&(c, j)) = self.outputs.get(&t.id()) {
            Source::Output(c, j)
        } else {
            Source::Constant(t.clone())
        }
    }
}

static RECORDING: Mutex<Option<Recording>> = Mutex::new(None);

fn recording() -> std::sync::MutexGuard<'static, Option<Recording>> {
    RECORDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Notes op call `op` on `inputs` giving `outputs`, while recording.
pub fn note_call(op: &str, inputs: &[Tensor], attrs: &Attrs, device: usize, outputs: &[Tensor]) {
    let mut slot = recording();
    let Some(rec) = Recording::here(&mut slot).filter(|r| r.broken.is_none()) else {
        return;
    };
    let Ok((id, def)) = registry().and_then(|r| r.id(op).map(|id| (id, r.op(id)))) else {
        rec.broken = Some(format!("`{op}` is not a registered op"));
        return;
    };
    let sources = inputs.iter().map(|t| rec.source(t)).collect();
    let index = rec.calls.len();
    for (j, t) in outputs.iter().enumerate() {
        rec.outputs.insert(t.id(), (index, j));
    }
    rec.calls.push(Call {
        op: def,
        id,
        attrs: attrs.clone(),
        device,
        inputs: sources,
        input_types: inputs.iter().map(|t| t.ty().clone()).collect(),
        outputs: outputs.iter().map(|t| t.ty().clone()).collect(),
    });
}

/// Marks the run being recorded as not replayable, for `why`.
pub fn note_unreplayable(why: &str) {
    if let Some(rec) = Recording::here(&mut recording()) {
        rec.broken.get_or_insert_with(|| why.to_string());
    }
}

/// Notes that a storage holding `old` is written, while recording: a graph
/// input written in place cannot be replayed.
pub fn note_write(old: Option<&Tensor>) {
    if let (Some(rec), Some(old)) = (Recording::here(&mut recording()), old)
        && rec.inputs.contains_key(&old.id())
    {
        rec.broken
            .get_or_insert_with(|| "a graph input is written in place".to_string());
    }
}

/// A replayed output: a contiguous tensor over its storage, and the view's
/// size, stride and offset.
type Placed<'py> = (Bound<'py, PyAny>, Vec<usize>, Vec<usize>, usize);

/// A recorded graph: its calls, and where each output's elements are.
#[pyclass(module = "torch_tpu_rs._C", frozen)]
pub struct Replay {
    calls: Vec<Call>,
    outputs: Vec<(Source, Layout)>,
}

/// Starts recording a run of a graph over tpu tensors `inputs`.
#[pyfunction]
pub fn record_start(inputs: &Bound<'_, PyList>) -> PyResult<()> {
    let mut rec = Recording::new();
    for (i, t) in inputs.iter().enumerate() {
        let Some(view) = View::of(&t)? else {
            rec.broken = Some(format!("graph input {i} is not a tpu tensor"));
            break;
        };
        let storage = view.storage.get();
        if storage.padded().is_some() {
            // Its windows read the padded value, which is not traced.
            rec.broken = Some(format!("graph input {i} is held padded"));
            break;
        }
        // A value two inputs share, or one the graph may also use as a
        // constant (a shared scalar), cannot be traced to one input.
        let value = storage.value()?;
        if tpu_core::scalars::is_shared(&value) || rec.inputs.insert(value.id(), i).is_some() {
            rec.broken = Some(format!("graph input {i}'s value is shared"));
            break;
        }
    }
    *recording() = Some(rec);
    Ok(())
}

/// Stops recording; the replay of the run that gave `outputs`, or `None`
/// when it cannot be replayed (or `outputs` is `None`: the run failed or
/// returned something other than tensors).
#[pyfunction]
pub fn record_stop(outputs: Option<&Bound<'_, PyList>>) -> PyResult<Option<Replay>> {
    let (Some(rec), Some(outputs)) = (recording().take(), outputs) else {
        return Ok(None);
    };
    if rec.broken.is_some() {
        return Ok(None);
    }
    let mut placed = Vec::with_capacity(outputs.len());
    let mut storages = Vec::with_capacity(outputs.len());
    for t in outputs.iter() {
        let Some(view) = View::of(&t)? else {
            return Ok(None);
        };
        let storage = view.storage.get();
        // Outputs that share a storage alias each other: replayed outputs
        // would not.
        if storage.padded().is_some() || storages.contains(&storage.address()) {
            return Ok(None);
        }
        storages.push(storage.address());
        let value = storage.value()?;
        placed.push((rec.source(&value), view.layout));
    }
    Ok(Some(Replay {
        calls: rec.calls,
        outputs: placed,
    }))
}

#[pymethods]
impl Replay {
    /// The graph's outputs for tpu tensors `inputs` (laid out as the
    /// recorded run's), each as `(tensor, size, stride, offset)`: a
    /// contiguous tensor holding the output's storage and the view of it.
    fn run<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyList>) -> PyResult<Vec<Placed<'py>>> {
        let mut values = Vec::with_capacity(inputs.len());
        for t in inputs.iter() {
            let view = View::of(&t)?
                .ok_or_else(|| BridgeError::internal("a replayed graph's input is not on tpu"))?;
            values.push(view.storage.get().value()?);
        }
        let resolve = |s: &Source, results: &[Vec<Tensor>]| -> Result<Tensor> {
            match s {
                Source::Input(i) => Ok(values[*i].clone()),
                Source::Output(c, j) => Ok(results[*c][*j].clone()),
                Source::Constant(t) => Ok(t.clone()),
            }
        };
        crate::interrupt::check()?;
        // Inside another graph's recording, each call must be noted there.
        let direct = Recording::here(&mut recording()).is_none();
        let policy = crate::kernels::current()?;
        let _scope = EagerModeGuard::with_policy(policy.clone());
        let results = crate::profile::from_python(|| -> Result<Vec<Vec<Tensor>>> {
            let location = profile::call_site(Location::caller());
            let mut results: Vec<Vec<Tensor>> = Vec::with_capacity(self.calls.len());
            for c in &self.calls {
                let xs = c
                    .inputs
                    .iter()
                    .map(|s| resolve(s, &results))
                    .collect::<Result<Vec<_>>>()?;
                let same = xs.iter().map(Tensor::ty).eq(c.input_types.iter());
                let outs = if direct && same {
                    let _span = profile::span("op", c.op.name);
                    policy.dispatch(OpCall {
                        op: c.op,
                        id: c.id,
                        inputs: &xs,
                        attrs: &c.attrs,
                        device: c.device,
                        outputs: c.outputs.clone(),
                        location,
                    })?
                } else {
                    call(c.op.name, &xs, &c.attrs, c.device)?
                };
                if outs.len() != c.outputs.len() {
                    return Err(BridgeError::internal(format!(
                        "replayed `{}` changed its outputs",
                        c.op.name
                    )));
                }
                results.push(outs);
            }
            Ok(results)
        })?;
        let mut out = Vec::with_capacity(self.outputs.len());
        for (source, layout) in &self.outputs {
            let value = resolve(source, &results)?;
            out.push((
                wrap(py, value)?,
                layout.size.clone(),
                layout.stride.clone(),
                layout.offset,
            ));
        }
        Ok(out)
    }

    /// Recorded calls.
    fn __len__(&self) -> usize {
        self.calls.len()
    }
}
