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
//! (DeferAndFuse adds it to its pending graph at once). Writes into a graph
//! input (a KV cache updated in place) are recorded too: a replay binds the
//! written values to the new inputs' storages. A run that reads values back
//! to the host, draws random numbers or takes the gradient of an op is not
//! recorded (its result could depend on more than the inputs).

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyList;
use tpu_core::block::{Block, BlockCall, BlockSrc};
use tpu_core::policy::EagerModeGuard;
use tpu_core::{Tensor, profile};

use crate::error::Result;
use crate::kernels::call;
use crate::layout::Layout;
use crate::recording::{self, Recording, Source};
use crate::torch::{View, wrap_as};

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
    /// The value each written graph input's storage ends with.
    writes: Vec<(usize, Out)>,
}

impl Replay {
    /// The replay of a finished recording whose outputs are `outputs` and
    /// whose graph inputs `writes` name end holding the given values.
    fn new(
        rec: Recording,
        outputs: Vec<(Source, Layout)>,
        writes: Vec<(usize, Source)>,
    ) -> Result<Option<Replay>> {
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
                attrs: Arc::new(c.attrs),
                inputs,
                outputs: c.outputs,
            });
        }
        let mut results: Vec<(usize, usize)> = Vec::new();
        let mut out = |source: &Source| -> Option<Out> {
            Some(match input(source)? {
                BlockSrc::Input(i) => Out::Input(i),
                BlockSrc::Output(c, j) => {
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
            })
        };
        let mut placed = Vec::with_capacity(outputs.len());
        for (source, layout) in outputs {
            let Some(o) = out(&source) else {
                return Ok(None);
            };
            placed.push((o, layout));
        }
        let mut written = Vec::with_capacity(writes.len());
        for (i, source) in writes {
            let Some(o) = out(&source) else {
                return Ok(None);
            };
            written.push((i, o));
        }
        Ok(Some(Replay {
            block: Block::new(types, calls, results)?,
            device,
            inputs: rec.input_layouts,
            constants,
            outputs: placed,
            writes: written,
        }))
    }

    /// The block's outputs for `values`, call by call through the Python
    /// kernels' path (with inference, and noted in a recording under way).
    fn run_each(&self, values: &[Tensor]) -> Result<Vec<Tensor>> {
        self.block
            .run_with(values, |c, xs| call(&c.id, xs, &c.attrs, self.device))
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
        let storage = &view.storage;
        if storage.padded().is_some() {
            // Its windows read the padded value, which is not traced.
            rec.broken = Some(format!("graph input {i} is held padded"));
            break;
        }
        // A value two inputs share, or one the graph may also use as a
        // constant (a shared scalar), cannot be traced to one input: the
        // storage gets a handle of its own over the same elements.
        let mut value = storage.value()?;
        if tpu_core::scalars::is_shared(&value) || rec.inputs.contains_key(&value.id()) {
            value = own_handle(&value)?;
            storage.set(value.clone())?;
        }
        rec.inputs.insert(value.id(), i);
        rec.input_types.push(value.ty().clone());
        rec.input_layouts.push((storage.device(), view.layout));
    }
    recording::start(rec);
    Ok(())
}

/// A new handle over `value`'s elements, told apart from `value` by id.
fn own_handle(value: &Tensor) -> Result<Tensor> {
    Ok(Tensor::reshaped(value.elements()?, value.ty().clone())?)
}

/// Stops recording; the replay of the run that gave `outputs`, or `None`
/// when it cannot be replayed (or `outputs` is `None`: the run failed or
/// returned something other than tensors).
#[pyfunction]
pub fn record_stop(outputs: Option<&Bound<'_, PyList>>) -> PyResult<Option<Replay>> {
    let (Some(rec), Some(outputs)) = (recording::stop(), outputs) else {
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
        let storage = &view.storage;
        // Outputs that share a storage alias each other: replayed outputs
        // would not.
        if storage.padded().is_some() || storages.contains(&storage.address()) {
            return Ok(None);
        }
        storages.push(storage.address());
        let value = storage.value()?;
        placed.push((rec.source(&value), view.layout));
    }
    let writes = rec
        .writes
        .iter()
        .map(|(i, v)| (*i, rec.source(v)))
        .collect();
    Ok(Replay::new(rec, placed, writes)?)
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
        let mut storages = Vec::with_capacity(inputs.len());
        for (t, (device, layout)) in inputs.iter().zip(&self.inputs) {
            let Some(view) = View::of(&t)? else {
                return Ok(None);
            };
            let storage = &view.storage;
            if storage.device() != *device || view.layout != *layout {
                return Ok(None);
            }
            values.push(storage.value()?);
            storages.push(view.storage);
        }
        values.extend(self.constants.iter().cloned());
        if !self.block.accepts(&values) {
            return Ok(None);
        }
        // Inside another graph's recording, each call must be noted there.
        let results = if recording::here() {
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
        let value = |source: &Out| match *source {
            Out::Input(i) => values[i].clone(),
            Out::Result(k) => results[k].clone(),
        };
        for (i, source) in &self.writes {
            storages[*i].set(value(source))?;
        }
        let mut out = Vec::with_capacity(self.outputs.len());
        for (source, layout) in &self.outputs {
            out.push(wrap_as(py, value(source), layout)?);
        }
        Ok(Some(out))
    }

    /// Recorded calls.
    fn __len__(&self) -> usize {
        self.block.calls().len()
    }
}
