//! Errors crossing into Python: tpu-rs errors keep their text (which names
//! the op, shapes and device) and become `torch_tpu_rs.TpuError`, a
//! `RuntimeError`, or the subclass that is also the exception PyTorch raises
//! for that kind of mistake: `TpuIndexError` (an `IndexError`) for a
//! dimension or index out of range, `TpuNotImplementedError` (a
//! `NotImplementedError`) for a call an op does not implement.

use pyo3::create_exception;
use pyo3::exceptions::{PyIndexError, PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use tpu_core::op::OpErrorKind;

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
    /// Tensors on different devices, or a device that does not exist.
    Device(String),
    /// Arguments an op rejects, as PyTorch does (a `RuntimeError`).
    Invalid(String),
    /// An index outside its dimension (an `IndexError`).
    Index(String),
    /// The device cannot hold what was asked for.
    OutOfMemory(String),
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

impl std::fmt::Display for BridgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BridgeError::Core(e) if e.is_out_of_memory() => write!(f, "tpu out of memory: {e}"),
            BridgeError::Core(e) => e.fmt(f),
            BridgeError::Python(e) => e.fmt(f),
            BridgeError::Unsupported(msg)
            | BridgeError::Device(msg)
            | BridgeError::Invalid(msg)
            | BridgeError::Index(msg)
            | BridgeError::OutOfMemory(msg) => f.write_str(msg),
            BridgeError::Internal(msg) => write!(f, "torch_tpu_rs internal error: {msg}"),
        }
    }
}

/// Result of a bridge call.
pub type Result<T> = std::result::Result<T, BridgeError>;

impl BridgeError {
    /// True when the device (or host) could not hold what was asked for.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            BridgeError::OutOfMemory(_) => true,
            BridgeError::Core(e) => e.is_out_of_memory(),
            _ => false,
        }
    }
}

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
            e @ BridgeError::Core(_) if e.is_out_of_memory() => {
                Python::attach(|py| out_of_memory(py, e.to_string()))
            }
            BridgeError::Core(e) => Python::attach(|py| core_error(py, &e)),
            BridgeError::OutOfMemory(msg) => Python::attach(|py| out_of_memory(py, msg)),
            BridgeError::Unsupported(msg) => PyNotImplementedError::new_err(msg),
            BridgeError::Device(msg) | BridgeError::Invalid(msg) => PyRuntimeError::new_err(msg),
            BridgeError::Index(msg) => Python::attach(|py| match index_error(py) {
                Ok(class) => PyErr::from_type(class.clone(), msg),
                Err(e) => e,
            }),
            BridgeError::Python(e) => e,
            BridgeError::Internal(msg) => {
                TpuError::new_err(format!("torch_tpu_rs internal error: {msg}"))
            }
        }
    }
}

static INDEX_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static NOT_IMPLEMENTED_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `TpuIndexError`: a `TpuError` that is also an `IndexError`.
pub fn index_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let doc = "A dimension or index out of range on the tpu device.";
    tpu_error_subclass(
        py,
        &INDEX_ERROR,
        "TpuIndexError",
        py.get_type::<PyIndexError>(),
        doc,
    )
}

/// `TpuNotImplementedError`: a `TpuError` that is also a `NotImplementedError`.
pub fn not_implemented_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let doc = "A call an op on the tpu device does not implement (a dtype, a mode).";
    tpu_error_subclass(
        py,
        &NOT_IMPLEMENTED_ERROR,
        "TpuNotImplementedError",
        py.get_type::<PyNotImplementedError>(),
        doc,
    )
}

/// A subclass of both `TpuError` and `base`, made once: `except TpuError`
/// and PyTorch users' `except IndexError` both catch it.
fn tpu_error_subclass<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    base: Bound<'py, PyType>,
    doc: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    let class = cell.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let dict = PyDict::new(py);
        dict.set_item("__module__", "torch_tpu_rs")?;
        dict.set_item("__doc__", doc)?;
        let bases = (py.get_type::<TpuError>(), base);
        let class = py.get_type::<PyType>().call1((name, bases, dict))?;
        Ok(class.cast_into::<PyType>()?.unbind())
    })?;
    Ok(class.bind(py))
}

/// `torch.OutOfMemoryError` (what CUDA raises), saying `msg`.
fn out_of_memory(py: Python<'_>, msg: String) -> PyErr {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let class = CLASS.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let class = py.import("torch")?.getattr("OutOfMemoryError")?;
        Ok(class.cast_into::<PyType>()?.unbind())
    });
    match class {
        Ok(class) => PyErr::from_type(class.bind(py).clone(), msg),
        Err(failed) => failed,
    }
}

/// The Python exception for a tpu-rs error: its kind picks the class.
fn core_error(py: Python<'_>, e: &tpu_core::Error) -> PyErr {
    let class = match e.op_error_kind() {
        Some(OpErrorKind::OutOfRange) => index_error(py),
        Some(OpErrorKind::Unsupported) => not_implemented_error(py),
        Some(OpErrorKind::Invalid) | None => return TpuError::new_err(e.to_string()),
    };
    match class {
        Ok(class) => PyErr::from_type(class.clone(), e.to_string()),
        Err(failed) => failed,
    }
}
