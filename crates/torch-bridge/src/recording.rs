//! The recording of the tpu-rs calls a compiled aten graph makes (see
//! [`crate::replay`]): while one is under way, every op call, write into a
//! storage and host read is noted here. The op layer and the storages
//! report to it; nothing here calls back into them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tpu_core::Tensor;
use tpu_core::op::{Attrs, OpDef, OpId, registry};
use tpu_core::stablehlo::TensorType;

use crate::layout::Layout;

/// Where a recorded call's input comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// Graph input `i`'s stored value.
    Input(usize),
    /// Output `j` of recorded call `i`.
    Output(usize, usize),
    /// A value the graph holds (a scalar, a constant tensor).
    Constant(Tensor),
}

pub(crate) struct Call {
    pub op: &'static OpDef,
    pub id: OpId,
    pub attrs: Attrs,
    pub device: usize,
    pub inputs: Vec<Source>,
    pub outputs: Vec<TensorType>,
}

pub(crate) struct Recording {
    /// The thread running the graph: calls from other threads (a backward
    /// pass elsewhere) are not the graph's.
    pub thread: std::thread::ThreadId,
    /// Graph inputs' stored values, by tensor id.
    pub inputs: HashMap<u64, usize>,
    /// Their types, in input order.
    pub input_types: Vec<TensorType>,
    /// Each input's device and layout: a replay needs the same.
    pub input_layouts: Vec<(usize, Layout)>,
    /// Outputs of recorded calls, by tensor id.
    pub outputs: HashMap<u64, (usize, usize)>,
    pub calls: Vec<Call>,
    /// The last value written into each written graph input's storage.
    pub writes: Vec<(usize, Tensor)>,
    /// The input whose storage holds a written value, by tensor id.
    pub written: HashMap<u64, usize>,
    /// Why the run cannot be replayed, once something says so.
    pub broken: Option<String>,
}

impl Recording {
    pub fn new() -> Recording {
        Recording {
            thread: std::thread::current().id(),
            inputs: HashMap::new(),
            input_types: Vec::new(),
            input_layouts: Vec::new(),
            outputs: HashMap::new(),
            calls: Vec::new(),
            writes: Vec::new(),
            written: HashMap::new(),
            broken: None,
        }
    }

    /// The recording, when this thread is the one recording.
    pub fn here(slot: &mut Option<Recording>) -> Option<&mut Recording> {
        slot.as_mut()
            .filter(|r| r.thread == std::thread::current().id())
    }

    pub fn source(&self, t: &Tensor) -> Source {
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
pub fn note_call(id: OpId, inputs: &[Tensor], attrs: &Attrs, device: usize, outputs: &[Tensor]) {
    let Some(mut slot) = while_recording() else {
        return;
    };
    let Some(rec) = Recording::here(&mut slot).filter(|r| r.broken.is_none()) else {
        return;
    };
    let Ok(def) = registry().map(|r| r.op(id)) else {
        rec.broken = Some("the op registry failed to build".into());
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

/// Notes that a storage holding `old` now holds `new`, while recording:
/// when it is a graph input's storage, a replay writes `new` there too.
pub fn note_write(old: Option<&Tensor>, new: &Tensor) {
    let Some(mut slot) = while_recording() else {
        return;
    };
    let (Some(rec), Some(old)) = (Recording::here(&mut slot), old) else {
        return;
    };
    let input = rec
        .inputs
        .get(&old.id())
        .or_else(|| rec.written.get(&old.id()));
    if let Some(&i) = input {
        match rec.writes.iter_mut().find(|(j, _)| *j == i) {
            Some(last) => last.1 = new.clone(),
            None => rec.writes.push((i, new.clone())),
        }
        rec.written.insert(new.id(), i);
    }
}

/// Starts recording `rec` on this thread.
pub(crate) fn start(rec: Recording) {
    *recording() = Some(rec);
    ACTIVE.store(true, Ordering::Release);
}

/// Stops recording; what was recorded.
pub(crate) fn stop() -> Option<Recording> {
    let taken = recording().take();
    ACTIVE.store(false, Ordering::Release);
    taken
}

/// Whether this thread is recording.
pub(crate) fn here() -> bool {
    while_recording().is_some_and(|mut slot| Recording::here(&mut slot).is_some())
}
