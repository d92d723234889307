//! Values written to tpu storages since the last `torch.tpu.synchronize()`,
//! so that it returns only once every one of them exists: PJRT runs
//! programs asynchronously, and CUDA's `synchronize` waits for the device.

use std::sync::Mutex;

use tpu_core::{Tensor, WeakTensor};

use crate::error::Result;

/// Written values, held weakly: a value nobody holds needs no wait.
static WRITTEN: Mutex<Written> = Mutex::new(Written {
    values: Vec::new(),
    prune_at: MIN_PRUNE_AT,
});

/// The fewest entries at which the ones no storage holds are dropped.
const MIN_PRUNE_AT: usize = 4096;

struct Written {
    values: Vec<WeakTensor>,
    /// The length at which to prune next: twice what the last pruning
    /// kept, so that pruning costs O(1) per note however many values live.
    prune_at: usize,
}

/// Notes that a storage now holds `value`.
pub fn note(value: &Tensor) {
    let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    if written.values.len() >= written.prune_at {
        written.values.retain(|w| w.is_alive());
        written.prune_at = MIN_PRUNE_AT.max(2 * written.values.len());
    }
    written.values.push(value.downgrade());
}

/// Blocks until every value noted since the last call exists on its device
/// (pending work must be flushed first).
pub fn wait_for_all() -> Result<()> {
    let written = std::mem::take(&mut WRITTEN.lock().unwrap_or_else(|e| e.into_inner()).values);
    for value in written.iter().filter_map(WeakTensor::upgrade) {
        value.elements()?.block_until_ready()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tpu_core::host::HostTensor;
    use tpu_core::{DType, Device, Tensor};

    use super::*;

    #[test]
    fn pruning_keeps_live_values_and_backs_off_as_they_grow() {
        let value = || Tensor::from_host(HostTensor::scalar(DType::F32, 1.0), Device::Cpu).unwrap();
        // More live values than the first pruning point: each pruning keeps
        // them all, and the next waits until the list has doubled.
        let live: Vec<Tensor> = (0..MIN_PRUNE_AT + 100).map(|_| value()).collect();
        for v in &live {
            note(v);
        }
        for _ in 0..live.len() {
            note(&value());
        }
        let written = WRITTEN.lock().unwrap();
        let alive = written.values.iter().filter(|w| w.is_alive()).count();
        assert!(alive >= live.len(), "{alive}");
        assert!(written.prune_at >= 2 * live.len(), "{}", written.prune_at);
        // Dropped values were pruned, so the list is not every note made.
        assert!(
            written.values.len() < 2 * live.len(),
            "{}",
            written.values.len()
        );
    }
}
