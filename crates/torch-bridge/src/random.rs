//! The `tpu` random generators, one per device: a seed and a counter. Each
//! random op draws a fresh `u32[2]` key (seed word, counter) from its
//! device's generator, so `torch.manual_seed` replays the same stream of
//! draws.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tpu_core::{DType, Device, HostTensor, Tensor};

use crate::args::attrs;
use crate::error::{BridgeError, Result};
use crate::kernels::{broadcast, call, cast};
use crate::torch::View;

/// One device's generator.
#[derive(Clone, Copy)]
struct Generator {
    seed: u64,
    counter: u64,
}

/// Every device's generator, as CUDA keeps one per device: a device not yet
/// seeded on its own starts from `default_seed` (what `manual_seed_all`
/// last set).
struct Generators {
    default_seed: u64,
    devices: BTreeMap<usize, Generator>,
}

impl Generators {
    fn of(&mut self, device: usize) -> &mut Generator {
        let seed = self.default_seed;
        self.devices
            .entry(device)
            .or_insert(Generator { seed, counter: 0 })
    }
}

static GENERATORS: Mutex<Generators> = Mutex::new(Generators {
    default_seed: 67280421310721,
    devices: BTreeMap::new(),
});

fn generators() -> MutexGuard<'static, Generators> {
    GENERATORS.lock().unwrap_or_else(|e| e.into_inner())
}

fn next_key(device: usize) -> Result<Tensor> {
    let Generator { seed, counter } = {
        let mut all = generators();
        let g = all.of(device);
        g.counter += 1;
        *g
    };
    // Fold the 64-bit seed into one word; the counter makes each key new.
    let word = (seed ^ (seed >> 32)) as u32;
    let key = HostTensor::from_i64(
        DType::U32,
        [2],
        vec![i64::from(word), counter as u32 as i64],
    )
    .ok_or_else(|| BridgeError::internal("a key has two words"))?;
    Ok(Tensor::from_host(key, Device::Tpu(device))?)
}

/// Restarts `tpu:device`'s generator at `seed` (`torch.tpu.manual_seed`).
#[pyfunction]
pub fn manual_seed(device: usize, seed: u64) {
    *generators().of(device) = Generator { seed, counter: 0 };
}

/// Restarts every device's generator at `seed` (`torch.manual_seed`).
#[pyfunction]
pub fn manual_seed_all(seed: u64) {
    let mut all = generators();
    all.default_seed = seed;
    all.devices.clear();
}

/// The seed `tpu:device`'s generator started from.
#[pyfunction]
pub fn initial_seed(device: usize) -> u64 {
    generators().of(device).seed
}

/// `tpu:device`'s generator's whole state: its seed and how many keys it
/// has drawn.
#[pyfunction]
pub fn rng_state(device: usize) -> (u64, u64) {
    let Generator { seed, counter } = *generators().of(device);
    (seed, counter)
}

/// Restores a state from [`rng_state`] on `tpu:device`.
#[pyfunction]
pub fn set_rng_state(device: usize, seed: u64, counter: u64) {
    *generators().of(device) = Generator { seed, counter };
}

/// Random op `op` (`uniform`, `normal`, `bernoulli`, with `attrs`) drawn
/// in `shape` from a fresh key of `device`'s generator, in `dtype`.
pub fn draw(
    op: &str,
    shape: &[usize],
    dtype: DType,
    mut attrs: tpu_core::op::Attrs,
    device: usize,
) -> Result<Tensor> {
    crate::recording::note_unreplayable("random numbers are drawn");
    attrs.set("shape", shape);
    if op != "bernoulli" && dtype.is_float() {
        attrs.set("dtype", dtype);
    }
    let key = next_key(device)?;
    let value = call(op, &[key], &attrs, device)?
        .into_iter()
        .next()
        .ok_or_else(|| BridgeError::internal(format!("`{op}` returned nothing")))?;
    broadcast(cast(value, dtype)?, shape)
}

/// Fills tpu tensor `out` with random op `op` (`uniform`, `normal`,
/// `bernoulli`): the op draws `out`'s shape from a fresh key and the result
/// is cast to `out`'s dtype.
#[pyfunction]
#[pyo3(signature = (op, out, attrs=None))]
pub fn fill_random(
    op: &str,
    out: &Bound<'_, PyAny>,
    attrs: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let view = View::of(out)?.ok_or_else(|| BridgeError::internal("not a tpu tensor"))?;
    let value = draw(
        op,
        &view.layout.size,
        view.dtype,
        self::attrs(attrs)?,
        view.storage.device(),
    )?;
    Ok(view.write(value)?)
}
