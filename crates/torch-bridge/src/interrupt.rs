//! Ctrl-C at the next op: the Python SIGINT handler (`_interrupt.py`) asks
//! for a KeyboardInterrupt here when it cannot raise where the signal
//! landed, and the next op entry raises it, from the bridge's own call,
//! where torch propagates Python errors.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Raises KeyboardInterrupt at the next op.
#[pyfunction]
pub fn request_interrupt() {
    REQUESTED.store(true, Ordering::Relaxed);
}

/// Withdraws a request (the handler raised it itself); returns whether one
/// was still waiting.
#[pyfunction]
pub fn withdraw_interrupt() -> bool {
    REQUESTED.swap(false, Ordering::Relaxed)
}

/// Whether a request waits.
#[pyfunction]
pub fn interrupt_requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// The KeyboardInterrupt asked for, once.
pub fn check() -> PyResult<()> {
    if REQUESTED.load(Ordering::Relaxed) && REQUESTED.swap(false, Ordering::Relaxed) {
        return Err(PyKeyboardInterrupt::new_err(()));
    }
    Ok(())
}
