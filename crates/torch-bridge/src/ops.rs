//! The op entry points Python's aten kernels call: run an op, write results
//! through views (in-place and `out=` forms), copy, and backward rules.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tpu_core::autograd::GradTape;
use tpu_core::{Device, Tensor};
use tpu_ops::registry;

use crate::args::{Inputs, attrs, host_value, is_number, tensors};
use crate::error::{BridgeError, Result};
use crate::kernels::{call, cast};
use crate::torch::{View, cpu_tensor, dtype_of, host_copy, wrap};

fn inputs<'py>(
    op: &str,
    values: &Bound<'py, PyList>,
    dtype: Option<&Bound<'py, PyAny>>,
    cast_from: usize,
) -> Result<(Vec<Tensor>, usize)> {
    let dtype = dtype.map(dtype_of).transpose()?;
    let values: Vec<Bound<'py, PyAny>> = values.iter().collect();
    let (mut xs, device) = tensors(&values, dtype, cast_from, Inputs::Op(op))?;
    if let Some(d) = dtype {
        for x in xs.iter_mut().skip(cast_from) {
            // A kernel's type promotion that lands on a real dtype was
            // written for real inputs: the cast would drop imaginary parts.
            if x.dtype().is_complex() && !d.is_complex() {
                return Err(BridgeError::Unsupported(format!(
                    "op `{op}` on tpu: {} tensors are not supported yet",
                    x.dtype()
                )));
            }
            *x = cast(x.clone(), d)?;
        }
    }
    Ok((xs, device))
}

/// Runs op `op` on `inputs` (tpu tensors, CPU tensors, numbers) and returns
/// its outputs as new tpu tensors; other Python threads run meanwhile (the
/// op may compile, or wait under Debug). With `dtype`, inputs from `cast_from`
/// on are cast to it first (type promotion).
#[pyfunction]
#[pyo3(signature = (op, inputs, attrs=None, dtype=None, cast_from=0))]
pub fn run<'py>(
    py: Python<'py>,
    op: &str,
    inputs: &Bound<'py, PyList>,
    attrs: Option<&Bound<'py, PyDict>>,
    dtype: Option<&Bound<'py, PyAny>>,
    cast_from: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let (xs, device) = self::inputs(op, inputs, dtype, cast_from)?;
    let attrs = self::attrs(attrs)?;
    let outs = py.detach(|| call(op, &xs, &attrs, device))?;
    Ok(outs
        .into_iter()
        .map(|t| wrap(py, t))
        .collect::<Result<Vec<_>>>()?)
}

/// [`run`], writing output `i` into tpu tensor `outs[i]` (cast to its dtype
/// and broadcast to its shape): the in-place and `out=` forms.
#[pyfunction]
#[pyo3(signature = (op, inputs, outs, attrs=None, dtype=None, cast_from=0))]
pub fn run_into<'py>(
    op: &str,
    inputs: &Bound<'py, PyList>,
    outs: &Bound<'py, PyList>,
    attrs: Option<&Bound<'py, PyDict>>,
    dtype: Option<&Bound<'py, PyAny>>,
    cast_from: usize,
) -> PyResult<()> {
    let (xs, device) = self::inputs(op, inputs, dtype, cast_from)?;
    let attrs = self::attrs(attrs)?;
    let results = inputs.py().detach(|| call(op, &xs, &attrs, device))?;
    if results.len() < outs.len() {
        return Err(BridgeError::internal(format!(
            "`{op}` gave {} outputs for {} out tensors",
            results.len(),
            outs.len()
        ))
        .into());
    }
    for (out, value) in outs.iter().zip(results) {
        store(&out, value)?;
    }
    Ok(())
}

/// Writes `value` into tpu tensor `dst` with copy semantics.
pub(crate) fn store(dst: &Bound<'_, PyAny>, value: Tensor) -> Result<()> {
    let view = View::of(dst)?
        .ok_or_else(|| BridgeError::internal("an out tensor is not on the tpu device"))?;
    view.write(value)
}

/// `dst.copy_(src)`: `src` is a tpu tensor on any device, a CPU tensor or
/// a number, cast to `dst`'s dtype and broadcast to its shape.
#[pyfunction]
pub fn copy_into(dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<()> {
    let view = View::of(dst)?
        .ok_or_else(|| BridgeError::internal("a copy's destination is not on the tpu device"))?;
    let device = view.storage.device();
    let source = if is_number(src) { None } else { View::of(src)? };
    let value = match source {
        Some(source) => on_device(source.read()?, device)?,
        None => {
            let dtype = dtype_of(&dst.getattr("dtype")?)?;
            host_value(src, Some(dtype), device, Inputs::Copy)?
        }
    };
    Ok(store(dst, value)?)
}

/// `value` on `tpu:device`, copied there from another device if need be.
pub fn on_device(value: Tensor, device: usize) -> Result<Tensor> {
    if value.device() == Device::Tpu(device) {
        return Ok(value);
    }
    crate::recording::note_unreplayable("a value moves between devices");
    Ok(Tensor::from_buffer(
        value.elements()?.copy_to_device(device)?,
    ))
}

/// A CPU copy of tpu tensor `t` (contiguous).
#[pyfunction]
pub fn to_cpu<'py>(py: Python<'py>, t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let view = View::of(t)?.ok_or_else(|| BridgeError::internal("not a tpu tensor"))?;
    let value = view.read()?;
    // The wait for the value (and the run of a deferred graph it needs)
    // lets other Python threads go on.
    let host = py.detach(|| crate::profile::from_python(|| host_copy(&value)))?;
    Ok(cpu_tensor(py, &host)?)
}

/// A tpu copy of CPU tensor `t` on device `device`.
#[pyfunction]
#[pyo3(signature = (t, device=0))]
pub fn from_cpu<'py>(
    py: Python<'py>,
    t: &Bound<'py, PyAny>,
    device: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(wrap(py, crate::torch::upload(t, device)?)?)
}

/// The gradients of op `op`'s inputs given its output gradients `grads`
/// (one per output; `None` is zero), by the op's own backward rule. The
/// forward is recomputed on the tape; `None` where an input gets none.
///
/// Under Strict the rule runs as one fused program: the parts of the
/// forward it does not read are never computed (a convolution's backward
/// does not run the convolution again).
#[pyfunction]
#[pyo3(signature = (op, inputs, grads, attrs=None))]
pub fn vjp<'py>(
    py: Python<'py>,
    op: &str,
    inputs: &Bound<'py, PyList>,
    grads: &Bound<'py, PyList>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    vjp_here(py, op, inputs, grads, attrs)
}

fn vjp_here<'py>(
    py: Python<'py>,
    op: &str,
    inputs: &Bound<'py, PyList>,
    grads: &Bound<'py, PyList>,
    attrs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let attrs = self::attrs(attrs)?;
    let (xs, device) = self::inputs(op, inputs, None, 0)?;
    let mut gs = Vec::with_capacity(grads.len());
    for g in grads.iter() {
        gs.push(if g.is_none() {
            None
        } else {
            Some(
                tensors(std::slice::from_ref(&g), None, 0, Inputs::Op(op))?
                    .0
                    .remove(0),
            )
        });
    }
    vjp_values(op, xs, gs, attrs, device)?
        .into_iter()
        .map(|g| g.map(|v| wrap(py, v)).transpose())
        .collect::<Result<Vec<_>>>()
        .map_err(PyErr::from)
}

/// The gradients of op `op`'s inputs `xs` given its output gradients
/// (`None` is zero), by the op's backward rule under the backward policy.
pub fn vjp_values(
    op: &str,
    xs: Vec<Tensor>,
    grads: Vec<Option<Tensor>>,
    attrs: tpu_core::op::Attrs,
    device: usize,
) -> Result<Vec<Option<Tensor>>> {
    // The rule's ops and its graph's cut are the calling Python line's.
    crate::profile::from_python(|| {
        crate::recording::note_unreplayable("a backward rule runs");
        let def = registry().and_then(|r| r.get(op))?;
        let policy = crate::kernels::vjp_policy()?;
        let _scope = tpu_core::policy::EagerModeGuard::with_policy(policy.clone());
        let mut tape = GradTape::new();
        let vars: Vec<_> = xs.into_iter().map(|x| tape.input(x)).collect();
        let outputs = tape.op(op, &vars, attrs.clone())?;
        let mut gs = Vec::with_capacity(outputs.len());
        for (i, &o) in outputs.iter().enumerate() {
            let ty = tape.value(o)?.ty().clone();
            let g = match grads.get(i).cloned().flatten() {
                Some(g) => g,
                None => crate::kernels::full(ty.dtype, ty.shape.dims(), 0.0, device)?,
            };
            gs.push(tape.input(g));
        }
        let result = tape.backward_rule(def, &attrs, &vars, &outputs, &gs)?;
        policy.start(tpu_core::metrics::CutReason::Backward)?;
        result
            .into_iter()
            .map(|g| g.map(|v| Ok(tape.value(v)?.clone())).transpose())
            .collect()
    })
}
