//! Values written to tpu storages since the last `torch.tpu.synchronize()`,
//! so that it returns only once every one of them exists: PJRT runs
//! programs asynchronously, and CUDA's `synchronize` waits for the device.

use std::sync::Mutex;

use tpu_core::{Tensor, WeakTensor};

use crate::error::Result;

/// Written values, held weakly: a value nobody holds needs no wait.
static WRITTEN: Mutex<Vec<WeakTensor>> = Mutex::new(Vec::new());

/// Past this many entries, the ones no storage holds any more are dropped.
const PRUNE_AT: usize = 4096;

/// Notes that a storage now holds `value`.
pub fn note(value: &Tensor) {
    let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    if written.len() >= PRUNE_AT {
        written.retain(|w| w.upgrade().is_some());
    }
    written.push(value.downgrade());
}

/// Blocks until every value noted since the last call exists on its device
/// (pending work must be flushed first).
pub fn wait_for_all() -> Result<()> {
    let written = std::mem::take(&mut *WRITTEN.lock().unwrap_or_else(|e| e.into_inner()));
    for value in written.iter().filter_map(WeakTensor::upgrade) {
        value.elements()?.block_until_ready()?;
    }
    Ok(())
}
