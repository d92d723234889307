//! The C++ layer (native/device.cc): PrivateUse1's device guard and hooks,
//! registered with PyTorch's C++ core when the module loads. It calls back
//! only into the Rust below, never into Python, so torch may use it where
//! an exception must not escape (a stream lookup while autograd records a
//! node) and from its own threads (the autograd engine's per-device
//! workers).

use pyo3::prelude::*;

use crate::error::{BridgeError, Result};

#[cxx::bridge(namespace = "tpu_bridge")]
mod ffi {
    extern "Rust" {
        fn device_count() -> usize;
        fn synchronize() -> Result<()>;
        fn resize_storage(address: usize, nbytes: usize) -> Result<()>;
    }

    unsafe extern "C++" {
        include!("torch-bridge/native/device.h");

        fn install() -> Result<()>;
        fn current_device() -> i8;
        fn set_current_device(index: i8) -> Result<()>;
    }
}

fn device_count() -> usize {
    crate::device::device_count()
}

fn synchronize() -> Result<()> {
    crate::kernels::synchronize()
}

fn resize_storage(address: usize, nbytes: usize) -> Result<()> {
    crate::storage::resize(address as u64, nbytes)
}

/// Registers the `tpu` device with PyTorch's C++ core.
pub fn install() -> Result<()> {
    ffi::install().map_err(|e| BridgeError::Device(e.what().to_string()))
}

/// The calling thread's current tpu device.
#[pyfunction]
pub fn current_device() -> usize {
    ffi::current_device().max(0) as usize
}

/// Makes `index` the calling thread's current tpu device.
#[pyfunction]
pub fn set_device(index: usize) -> PyResult<()> {
    let index = i8::try_from(index).unwrap_or(i8::MAX);
    ffi::set_current_device(index).map_err(|e| BridgeError::Device(e.what().to_string()))?;
    Ok(())
}
