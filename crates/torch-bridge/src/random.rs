//! The `tpu` random generator: a seed and a counter. Each random op draws
//! a fresh `u32[2]` key (seed word, counter), so `torch.manual_seed`
//! replays the same stream of draws.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tpu_core::{DType, Device, HostTensor, Tensor};

use crate::args::attrs;
use crate::error::{BridgeError, Result};
use crate::kernels::{broadcast, call, cast};
use crate::storage::write;
use crate::torch::View;

struct Generator {
    seed: u64,
    counter: u64,
}

static GENERATOR: Mutex<Generator> = Mutex::new(Generator {
    seed: 67280421310721,
    counter: 0,
});

fn next_key(device: usize) -> Result<Tensor> {
    let (seed, counter) = {
        let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
        g.counter += 1;
        (g.seed, g.counter)
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

/// Restarts the generator at `seed` (`torch.manual_seed`).
#[pyfunction]
pub fn manual_seed(seed: u64) {
    let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    g.seed = seed;
    g.counter = 0;
}

/// The seed the generator started from.
#[pyfunction]
pub fn initial_seed() -> u64 {
    GENERATOR.lock().unwrap_or_else(|e| e.into_inner()).seed
}

/// The generator's whole state: its seed and how many keys it has drawn.
#[pyfunction]
pub fn rng_state() -> (u64, u64) {
    let g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    (g.seed, g.counter)
}

/// Restores a state from [`rng_state`].
#[pyfunction]
pub fn set_rng_state(seed: u64, counter: u64) {
    *GENERATOR.lock().unwrap_or_else(|e| e.into_inner()) = Generator { seed, counter };
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
    crate::replay::note_unreplayable("random numbers are drawn");
    let view = View::of(out)?.ok_or_else(|| BridgeError::internal("not a tpu tensor"))?;
    let storage = view.storage.get();
    let mut attrs = self::attrs(attrs)?;
    attrs.set("shape", view.layout.size.as_slice());
    if op != "bernoulli" && storage.dtype().is_float() {
        attrs.set("dtype", storage.dtype());
    }
    let key = next_key(storage.device())?;
    let value = call(op, &[key], &attrs, storage.device())?
        .into_iter()
        .next()
        .ok_or_else(|| BridgeError::internal(format!("`{op}` returned nothing")))?;
    let value = broadcast(cast(value, storage.dtype())?, &view.layout.size)?;
    Ok(write(storage, &view.layout, value)?)
}
