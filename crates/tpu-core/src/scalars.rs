//! Device-resident scalars, shared by every caller: the Python-style numbers
//! of `x * 0.5`, optimizer constants and wrapped numbers repeat every step,
//! and an upload per op would dominate small ops.
//!
//! The least recently used value goes first, so scalars that change every
//! step (Adam's bias corrections) cycle through a fixed number of slots and
//! steady-state training holds constant device memory.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Result;
use crate::host::HostTensor;
use crate::{Complex, DType, Device, Tensor};

/// A scalar's dtype, the bits of its real and imaginary parts, and device
/// index.
type Key = (DType, u64, u64, usize);

/// Scalars kept per process: more than one training step uses.
const CAPACITY: usize = 64;

#[derive(Default)]
struct Cache {
    slots: HashMap<Key, (Tensor, u64)>,
    clock: u64,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// A rank-0 tensor of `value` in `dtype` on `device` (on `tpu:N`, shared
/// with every other request for the same value).
pub fn scalar(dtype: DType, value: f64, device: Device) -> Result<Tensor> {
    shared(dtype, Complex::new(value, 0.0), device)
}

/// A rank-0 tensor of `value` in complex `dtype` on `device`, shared as
/// [`scalar`]'s are.
pub fn complex_scalar(dtype: DType, value: Complex<f64>, device: Device) -> Result<Tensor> {
    shared(dtype, value, device)
}

fn host(dtype: DType, value: Complex<f64>) -> HostTensor {
    if dtype.is_complex() {
        HostTensor::complex_scalar(dtype, value)
    } else {
        HostTensor::scalar(dtype, value.re)
    }
}

fn shared(dtype: DType, value: Complex<f64>, device: Device) -> Result<Tensor> {
    let Device::Tpu(index) = device else {
        return Tensor::from_host(host(dtype, value), device);
    };
    let key = (dtype, value.re.to_bits(), value.im.to_bits(), index);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(Cache::default);
    cache.clock += 1;
    let now = cache.clock;
    if let Some((t, used)) = cache.slots.get_mut(&key) {
        *used = now;
        return Ok(t.clone());
    }
    let t = Tensor::from_host(host(dtype, value), device)?;
    if cache.slots.len() >= CAPACITY
        && let Some(oldest) = cache
            .slots
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| *k)
    {
        cache.slots.remove(&oldest);
    }
    cache.slots.insert(key, (t.clone(), now));
    Ok(t)
}

/// Whether `t` is one of the shared scalars (other holders of it are not
/// its only users).
pub fn is_shared(t: &Tensor) -> bool {
    let cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .as_ref()
        .is_some_and(|c| c.slots.values().any(|(s, _)| s.same(t)))
}
