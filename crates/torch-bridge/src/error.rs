//! Errors crossing into Python: tpu-rs errors keep their text (which names
//! the op, shapes and device) and become `torch_tpu_rs.TpuError`, a
//! `RuntimeError`.

use pyo3::create_exception;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;

create_exception!(
    _C,
    TpuError,
    PyRuntimeError,
    "An op or transfer on the tpu device failed."
);

/// Why a bridge call failed.
#[derive(Debug)]
pub enum BridgeError {
    /// tpu-rs rejected or failed the call.
    Core(tpu_core::Error),
    /// The bridge cannot do this (dtype, layout) yet.
    Unsupported(String),
    /// Tensors on different devices.
    Device(String),
    /// A Python call failed.
    Python(PyErr),
    /// A broken invariant of the bridge itself.
    Internal(String),
}

impl BridgeError {
    /// A broken invariant.
    pub fn internal(msg: impl Into<String>) -> BridgeError {
        BridgeError::Internal(msg.into())
    }
}

/// Result of a bridge call.
pub type Result<T> = std::result::Result<T, BridgeError>;

impl From<tpu_core::Error> for BridgeError {
    fn from(e: tpu_core::Error) -> BridgeError {
        BridgeError::Core(e)
    }
}

impl From<PyErr> for BridgeError {
    fn from(e: PyErr) -> BridgeError {
        BridgeError::Python(e)
    }
}

impl From<BridgeError> for PyErr {
    fn from(e: BridgeError) -> PyErr {
        match e {
            BridgeError::Core(e) => TpuError::new_err(e.to_string()),
            BridgeError::Unsupported(msg) => PyNotImplementedError::new_err(msg),
            BridgeError::Device(msg) => PyRuntimeError::new_err(msg),
            BridgeError::Python(e) => e,
            BridgeError::Internal(msg) => {
                TpuError::new_err(format!("torch_tpu_rs internal error: {msg}"))
            }
        }
    }
}
