//! Recording the tpu-rs calls a compiled aten graph makes, and replaying
//! them without going back through PyTorch's dispatcher.
//!
//! A `torch.compile`d graph runs its aten ops one by one through Python
//! kernels, at every call, though the graph and its input layouts are the
//! same each time (dynamo guards them). The first run is recorded: each op
//! call, with each input traced to a graph input, an earlier call's output
//! or a constant the graph holds. The recording becomes a
//! [`Block`](tpu_core::block::Block) over the graph's inputs and constants,
//! and later runs hand it to the policy on the new inputs in one call
//! (DeferAndFuse adds it to its pending graph at once). A run that reads
//! values back to the host, draws random numbers, writes into a graph
//! input or takes the gradient of an op is not recorded (its result could
//! depend on more than the inputs).

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyList;
use tpu_core::block::{Block, BlockCall, BlockSrc};
use tpu_core::op::{Attrs, OpDef, OpId, registry};
use tpu_core::policy::EagerModeGuard;
use tpu_core::stablehlo::TensorType;
use tpu_core::{Tensor, profile};

use crate::error::Result;
use crate::kernels::call;
use crate::storage::Layout;
use crate::torch::{View, wrap_as};

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
    outputs: Vec<TensorType>,
}

struct Recording {
    /// The thread running the graph: calls from other threads (a backward
    /// pass elsewhere) are not the graph's.
    thread: std::thread::ThreadId,
    /// Graph inputs' stored values, by tensor id.
    inputs: HashMap<u64, usize>,
    /// Their types, in input order.
    input_types: Vec<TensorType>,
    /// Each input's device and layout: a replay needs the same.
    input_layouts: Vec<(usize, Layout)>,
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
            input_types: Vec::new(),
            input_layouts: Vec::new(),
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

/// Whether a recording is under way: every op asks, and mostly none is.
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn recording() -> std::sync::MutexGuard<'static, Option<Recording>> {
    RECORDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The recording slot, when a recording may be under way.
fn while_recording() -> Option<std::sync::MutexGuard<'static, Option<Recording>>> {
    ACTIVE.load(Ordering::Acquire).then(recording)
}

/// Notes op call `op` on `inputs` giving `outputs`, while recording.
pub fn note_call(op: &str, inputs: &[Tensor], attrs: &Attrs, device: usize, outputs: &[Tensor]) {
    let Some(mut slot) = while_recording() else {
        return;
    };
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
        outputs: outputs.iter().map(|t| t.ty().clone()).collect(),
    });
}

/// Marks the run being recorded as not replayable, for `why`.
pub fn note_unreplayable(why: &str) {
    let Some(mut slot) = while_recording() else {
        return;
    };
    if let Some(rec) = Recording::here(&mut slot) {
        rec.broken.get_or_insert_with(|| why.to_string());
    }
}

/// Notes that a storage holding `old` is written, while recording: a graph
/// input written in place cannot be replayed.
pub fn note_write(old: Option<&Tensor>) {
    let Some(mut slot) = while_recording() else {
        return;
    };
    if let (Some(rec), Some(old)) = (Recording::here(&mut slot), old)
        && rec.inputs.contains_key(&old.id())
    {
        rec.broken
            .get_or_insert_with(|| "a graph input is written in place".to_string());
    }
}

/// Where a graph output's value comes from in a replay.
enum Out {
    /// Block input `i` (a graph input, or a constant).
    Input(usize),
    /// Block output `k`.
    Result(usize),
}

/// A recorded graph: a block over the graph's inputs and the constants it
/// holds, and where each output's elements are.
#[pyclass(module = "torch_tpu_rs._C", frozen)]
pub struct Replay {
    block: Block,
    device: usize,
    /// Each graph input's device and layout.
    inputs: Vec<(usize, Layout)>,
    constants: Vec<Tensor>,
    outputs: Vec<(Out, Layout)>,
}

impl Replay {
    /// The replay of a finished recording whose outputs are `outputs`.
    fn new(rec: Recording, outputs: Vec<(Source, Layout)>) -> Result<Option<Replay>> {
        let mut devices = rec.calls.iter().map(|c| c.device);
        let device = devices.next().unwrap_or(0);
        if devices.any(|d| d != device) {
            // A block runs on one device.
            return Ok(None);
        }
        let mut types = rec.input_types;
        let mut constants: Vec<Tensor> = Vec::new();
        let mut constant_at: HashMap<u64, usize> = HashMap::new();
        let mut input = |s: &Source| -> Option<BlockSrc> {
            Some(match s {
                Source::Input(i) => BlockSrc::Input(*i),
                Source::Output(c, j) => BlockSrc::Output(*c, *j),
                Source::Constant(t) => {
                    BlockSrc::Input(*constant_at.entry(t.id()).or_insert_with(|| {
                        constants.push(t.clone());
                        types.push(t.ty().clone());
                        types.len() - 1
                    }))
                }
            })
        };
        let mut calls = Vec::with_capacity(rec.calls.len());
        for c in rec.calls {
            let inputs = c.inputs.iter().map(&mut input).collect::<Option<Vec<_>>>();
            let Some(inputs) = inputs else {
                return Ok(None);
            };
            calls.push(BlockCall {
                op: c.op,
                id: c.id,
                attrs: c.attrs,
                inputs,
                outputs: c.outputs,
            });
        }
        let mut results: Vec<(usize, usize)> = Vec::new();
        let mut placed = Vec::with_capacity(outputs.len());
        for (source, layout) in outputs {
            let out = match input(&source) {
                Some(BlockSrc::Input(i)) => Out::Input(i),
                Some(BlockSrc::Output(c, j)) => {
                    // Two outputs may share a value (a clone shares it).
                    let k = match results.iter().position(|&r| r == (c, j)) {
                        Some(k) => k,
                        None => {
                            results.push((c, j));
                            results.len() - 1
                        }
                    };
                    Out::Result(k)
                }
                None => return Ok(None),
            };
            placed.push((out, layout));
        }
        Ok(Some(Replay {
            block: Block::new(types, calls, results)?,
            device,
            inputs: rec.input_layouts,
            constants,
            outputs: placed,
        }))
    }

    /// The block's outputs for `values`, call by call through the Python
    /// kernels' path (with inference, and noted in a recording under way).
    fn run_each(&self, values: &[Tensor]) -> Result<Vec<Tensor>> {
        self.block
            .run_with(values, |c, xs| call(c.op.name, xs, &c.attrs, self.device))
    }
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
        rec.input_types.push(value.ty().clone());
        rec.input_layouts.push((storage.device(), view.layout));
    }
    *recording() = Some(rec);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// Stops recording; the replay of the run that gave `outputs`, or `None`
/// when it cannot be replayed (or `outputs` is `None`: the run failed or
/// returned something other than tensors).
#[pyfunction]
pub fn record_stop(outputs: Option<&Bound<'_, PyList>>) -> PyResult<Option<Replay>> {
    let taken = recording().take();
    ACTIVE.store(false, Ordering::Release);
    let (Some(rec), Some(outputs)) = (taken, outputs) else {
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
    Ok(Replay::new(rec, placed)?)
}

#[pymethods]
impl Replay {
    /// The graph's outputs for `inputs`, each laid out as in the recorded
    /// run; `None` when an input is not a tpu tensor laid out (and held) as
    /// the recorded run's were.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyList>,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        if inputs.len() != self.inputs.len() {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(inputs.len() + self.constants.len());
        for (t, (device, layout)) in inputs.iter().zip(&self.inputs) {
            let Some(view) = View::of(&t)? else {
                return Ok(None);
            };
            let storage = view.storage.get();
            if storage.device() != *device || view.layout != *layout {
                return Ok(None);
            }
            values.push(storage.value()?);
        }
        values.extend(self.constants.iter().cloned());
        if !self.block.accepts(&values) {
            return Ok(None);
        }
        crate::interrupt::check()?;
        // Inside another graph's recording, each call must be noted there.
        let nested = while_recording().is_some_and(|mut slot| Recording::here(&mut slot).is_some());
        let results = if nested {
            self.run_each(&values)?
        } else {
            let policy = crate::kernels::current()?;
            let _scope = EagerModeGuard::with_policy(policy.clone());
            crate::profile::from_python(|| -> Result<Vec<Tensor>> {
                let mut span = profile::span("replay", "graph");
                let location = profile::call_site(Location::caller());
                if span.recording() {
                    span.arg("at", location.to_string());
                }
                Ok(policy.dispatch_block(&self.block, &values, self.device, location)?)
            })?
        };
        let mut out = Vec::with_capacity(self.outputs.len());
        for (source, layout) in &self.outputs {
            let value = match *source {
                Out::Input(i) => values[i].clone(),
                Out::Result(k) => results[k].clone(),
            };
            out.push(wrap_as(py, value, layout)?);
        }
        Ok(Some(out))
    }

    /// Recorded calls.
    fn __len__(&self) -> usize {
        self.block.calls().len()
    }
}
