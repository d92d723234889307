//! Op arguments from Python: tensors (tpu views, CPU tensors, Python
//! numbers) and attribute dictionaries.

use std::collections::HashSet;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use tpu_core::op::{Attr, Attrs};
use tpu_core::{DType, Tensor};

use crate::error::{BridgeError, Result};
use crate::kernels::{cast, number, scalar};
use crate::torch::{View, dtype_of, upload};

/// Attribute names are `&'static str` in tpu-rs; names from Python are
/// interned once (the set is the small, fixed set of attribute names).
fn intern_name(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let names = names.get_or_insert_with(HashSet::new);
    if let Some(n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// An attribute dictionary as tpu-rs [`Attrs`].
pub fn attrs(dict: Option<&Bound<'_, PyDict>>) -> Result<Attrs> {
    let mut out = Attrs::new();
    let Some(dict) = dict else {
        return Ok(out);
    };
    for (k, v) in dict.iter() {
        let key = intern_name(&k.extract::<String>()?);
        out.set(key, attr(key, &v)?);
    }
    Ok(out)
}

fn attr(key: &str, v: &Bound<'_, PyAny>) -> Result<Attr> {
    // bool before int: Python's bool is an int.
    if v.is_instance_of::<PyBool>() {
        return Ok(Attr::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(Attr::Int(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Attr::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Attr::Str(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        return Ok(Attr::Ints(v.extract()?));
    }
    if let Ok(d) = dtype_of(v) {
        return Ok(Attr::DType(d));
    }
    Err(BridgeError::internal(format!(
        "attribute `{key}` has an unsupported value {v}"
    )))
}

/// Whether `v` is a Python number (bool, int, float or complex).
pub fn is_number(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyBool>()
        || v.is_instance_of::<PyInt>()
        || v.is_instance_of::<PyFloat>()
        || v.is_instance_of::<PyComplex>()
}

/// Where op inputs may come from.
#[derive(Clone, Copy)]
pub enum Inputs<'a> {
    /// Inputs of op `.0`: tpu tensors, numbers and 0-dim CPU tensors (as
    /// PyTorch passes wrapped numbers); any other CPU tensor is an error,
    /// as on every accelerator.
    Op(&'a str),
    /// A copy's source, which may be any CPU tensor.
    Copy,
}

/// A Python number or CPU tensor as a tpu-rs value on `device`; `dtype`
/// types Python numbers (else float32, int64 or bool by their kind).
pub fn host_value(
    v: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    device: usize,
    from: Inputs<'_>,
) -> Result<Tensor> {
    if v.is_instance_of::<PyBool>() {
        let b: bool = v.extract()?;
        return scalar(dtype.unwrap_or(DType::Bool), f64::from(u8::from(b)), device);
    }
    if v.is_instance_of::<PyInt>() {
        let i: i64 = v.extract()?;
        return scalar(dtype.unwrap_or(DType::I64), i as f64, device);
    }
    if v.is_instance_of::<PyFloat>() {
        let f: f64 = v.extract()?;
        return scalar(dtype.unwrap_or(DType::F32), f, device);
    }
    if let Ok(z) = v.cast::<PyComplex>() {
        return number(dtype.unwrap_or(DType::C64), z.real(), z.imag(), device);
    }
    // A CPU tensor: PyTorch passes wrapped numbers and 0-dim tensors so.
    let py = v.py();
    let ndim: usize = v.getattr(pyo3::intern!(py, "ndim"))?.extract()?;
    let complex = dtype_of(&v.getattr(pyo3::intern!(py, "dtype"))?).is_ok_and(|d| d.is_complex());
    if ndim == 0 && complex {
        // Its value is not one real number: uploaded as it is.
        let value = upload(v, device)?;
        return match dtype {
            Some(d) => cast(value, d),
            None => Ok(value),
        };
    }
    if ndim == 0 {
        // Made directly in the promoted dtype: a cast would be one more op.
        let d = match dtype {
            Some(d) => d,
            None => dtype_of(&v.getattr(pyo3::intern!(py, "dtype"))?)?,
        };
        let x: f64 = v.call_method0(pyo3::intern!(py, "item"))?.extract()?;
        return scalar(d, x, device);
    }
    if let Inputs::Op(op) = from {
        let shape: Vec<usize> = v.getattr(pyo3::intern!(py, "shape"))?.extract()?;
        return Err(BridgeError::Device(format!(
            "op `{op}`: expected all tensors to be on the same device, but found tpu:{device} and \
             cpu (a CPU tensor of shape {shape:?}); move it with .to(\"tpu\")"
        )));
    }
    upload(v, device)
}

/// Op inputs as tpu-rs values, and the device they run on: that of the
/// tpu tensors among them (0 when none), where numbers and CPU tensors are
/// placed too. Numbers from index `typed_from` on take `dtype`.
pub fn tensors(
    values: &[Bound<'_, PyAny>],
    dtype: Option<DType>,
    typed_from: usize,
    from: Inputs<'_>,
) -> Result<(Vec<Tensor>, usize)> {
    let mut out: Vec<Option<Tensor>> = Vec::with_capacity(values.len());
    let mut device = None;
    for v in values {
        if is_number(v) {
            out.push(None);
            continue;
        }
        match View::of(v)? {
            Some(view) => {
                device.get_or_insert(view.storage.device());
                out.push(Some(view.read()?));
            }
            None => out.push(None),
        }
    }
    let device = device.unwrap_or(0);
    let tensors = out
        .into_iter()
        .zip(values)
        .enumerate()
        .map(|(i, (t, v))| match t {
            Some(t) => Ok(t),
            None => host_value(v, dtype.filter(|_| i >= typed_from), device, from),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((tensors, device))
}
