//! Copies, fills, reading one value, and joining and selecting along a
//! dim.

use tpu_core::op::Attrs;
use tpu_core::policy::EagerMode;

use super::{Call, Done, NativeOp, Value, apply, apply_with, error, op, read, view};
use crate::error::{BridgeError, Result};
use crate::ffi;
use crate::kernels::cast;
use crate::storage;

/// c10::MemoryFormat's codes.
const CONTIGUOUS_FORMAT: i64 = 0;
const PRESERVE_FORMAT: i64 = 1;
/// c10::Layout::Strided.
const STRIDED: i64 = 0;

pub fn register(ops: &mut Vec<NativeOp>) {
    ops.push(op("clone", &[], |c| {
        if !c.is_tensor(0) || !dense(c, 0, 1)? {
            return Ok(Done::Declined);
        }
        same_values(c, c.dtype(0)?)
    }));
    ops.push(op("_to_copy", &[], to_copy));
    ops.push(NativeOp {
        any_devices: true,
        ..op("copy_", &[], copy)
    });
    ops.push(op("fill_.Scalar", &[], fill));
    ops.push(op("fill_.Tensor", &[], fill));
    ops.push(op("zero_", &[], |c| {
        let d = c.dtype(0)?;
        store(c, c.constant(d, 0.0)?)
    }));
    ops.push(op("_local_scalar_dense", &[], |c| {
        let n: usize = c.sizes(0)?.iter().product();
        if n != 1 {
            return Err(error(format!(
                "a Tensor with {n} elements cannot be converted to Scalar"
            )));
        }
        Ok(Done::Number(c.tensor(0)?))
    }));
    ops.push(op("index_select", &[], |c| {
        let dim = c.int(1)?;
        let (x, index) = (c.tensor(0)?, c.tensor(2)?);
        check_bounds(c, &x, dim, &index)?;
        let attrs = Attrs::new().with("dim", dim);
        Ok(Done::one(apply_with(
            op!("index_select"),
            &[x, index],
            attrs,
        )?))
    }));
    ops.push(op("cat", &[0], cat));
    ops.push(op("empty.memory_format", &[], |c| {
        let sizes = sizes_arg(c, 0)?;
        let strides = crate::layout::contiguous_strides(&sizes);
        unwritten(c, sizes, strides, 1, 3)
    }));
    ops.push(op("empty_strided", &[], |c| {
        let sizes = sizes_arg(c, 0)?;
        let strides = c.ints(1)?.unwrap_or(&[]);
        if strides.len() != sizes.len() || strides.iter().any(|&s| s < 0) {
            return Err(error(format!(
                "empty_strided: strides {strides:?} do not fit sizes {sizes:?}"
            )));
        }
        let strides = strides.iter().map(|&s| s as usize).collect();
        unwritten(c, sizes, strides, 2, 4)
    }));
    // (overload, where start, end and step sit, where dtype and device sit)
    for (name, range, dtype, device) in [
        ("arange", (None, 0, None), 1, 3),
        ("arange.start", (Some(0), 1, None), 2, 4),
        ("arange.start_step", (Some(0), 1, Some(2)), 3, 5),
    ] {
        let promote: &'static [usize] = match range {
            (None, ..) => &[0],
            (_, _, None) => &[0, 1],
            _ => &[0, 1, 2],
        };
        ops.push(op(name, promote, move |c| arange(c, range, dtype, device)));
    }
    ops.push(op("constant_pad_nd", &[], |c| {
        let pad = c.ints(1)?.unwrap_or(&[]);
        let (value, imag) = if c.has(2) {
            c.complex_number(2)?
        } else {
            (0.0, 0.0)
        };
        if imag != 0.0 {
            // A complex fill: each part padded with its own value.
            let x = c.tensor(0)?;
            let part = |name: &str, fill: f64| -> Result<tpu_core::Tensor> {
                let attrs = Attrs::new().with("pad", pad.to_vec()).with("value", fill);
                apply_with(op!("pad"), &[apply(name, std::slice::from_ref(&x))?], attrs)
            };
            let joined = apply(op!("complex"), &[part("real", value)?, part("imag", imag)?])?;
            return Ok(Done::one(cast(joined, x.dtype())?));
        }
        if let Some(out) = crate::buckets::padded_pad(&view(c.tensor_ref(0)?)?, pad, value)? {
            return Ok(Done::one(out));
        }
        let attrs = Attrs::new().with("pad", pad.to_vec()).with("value", value);
        Ok(Done::one(apply_with(op!("pad"), &[c.tensor(0)?], attrs)?))
    }));
    for (name, core) in [("tril", op!("tril")), ("triu", op!("triu"))] {
        ops.push(op(name, &[], move |c| {
            let attrs = Attrs::new().with("diagonal", c.int_or(1, 0)?);
            Ok(Done::one(apply_with(core, &[c.tensor(0)?], attrs)?))
        }));
    }
}

/// `torch.arange` in one op (PyTorch's own path makes an empty tensor,
/// resizes it and copies into it): the numbers at `range` (start, end,
/// step; start 0 and step 1 where absent), in the dtype argument or else
/// PyTorch's result type of the numbers, on the device argument or the
/// current one. Integer bounds stay integers (past 2**53 a float would lose
/// them).
fn arange(
    c: &Call<'_>,
    (start, end, step): (Option<usize>, usize, Option<usize>),
    dtype: usize,
    device: usize,
) -> Result<Done> {
    let dtype = c.scalar_type(dtype)?.unwrap_or(c.promoted()?);
    let device = factory_device(c, device)?;
    let integral = |i: Option<usize>| i.is_none_or(|i| c.int(i).is_ok());
    let mut attrs = Attrs::new().with("dtype", dtype);
    let n = if integral(start) && integral(Some(end)) && integral(step) {
        let int_at = |i: Option<usize>, default| i.map_or(Ok(default), |i| c.int(i));
        let (a, b, s) = (int_at(start, 0)?, c.int(end)?, int_at(step, 1)?);
        arange_bounds(b as f64 - a as f64, s as f64)?;
        attrs = attrs.with("start", a).with("end", b).with("step", s);
        // ceil((b - a) / s) in integers.
        (-((a as i128 - b as i128).div_euclid(s as i128))).max(0) as usize
    } else {
        let number_at = |i: Option<usize>, default| i.map_or(Ok(default), |i| c.number(i));
        let (a, b, s) = (
            number_at(start, 0.0)?,
            c.number(end)?,
            number_at(step, 1.0)?,
        );
        arange_bounds(b - a, s)?;
        attrs = attrs.with("start", a).with("end", b).with("step", s);
        ((b - a) / s).ceil().max(0.0) as usize
    };
    if n == 0 {
        return unwritten_on(device, dtype, vec![0], vec![1]);
    }
    let out = crate::kernels::call(op!("arange"), &[], &attrs, device)?.remove(0);
    Ok(Done::one(out))
}

/// PyTorch's checks of an arange's span and step.
fn arange_bounds(span: f64, step: f64) -> Result<()> {
    if step == 0.0 {
        return Err(error("step must be nonzero"));
    }
    if !(span.is_finite() && step.is_finite()) {
        return Err(error(format!(
            "unsupported range: the span {span} and step {step} must be finite"
        )));
    }
    if span * step < 0.0 {
        return Err(error(
            "upper bound and lower bound inconsistent with step sign",
        ));
    }
    Ok(())
}

/// Whether tensor argument `i` with memory format argument `format` makes a
/// dense copy: PyTorch's contiguous format, or preserving an already
/// contiguous tensor.
fn dense(c: &Call<'_>, i: usize, format: usize) -> Result<bool> {
    let format = c.int_or(format, PRESERVE_FORMAT)?;
    Ok(format == CONTIGUOUS_FORMAT || (format == PRESERVE_FORMAT && contiguous(c.layout_of(i)?)))
}

fn contiguous(t: &ffi::TensorRef<'_>) -> bool {
    let mut expected = 1;
    for (&size, &stride) in t.sizes.iter().zip(t.strides).rev() {
        if size != 1 && stride != expected {
            return false;
        }
        expected *= size;
    }
    true
}

/// A new contiguous tensor with argument 0's values in `dtype`: the value
/// itself (values are immutable), padded alike when its storage is held
/// padded to a shape bucket.
fn same_values(c: &Call<'_>, dtype: tpu_core::DType) -> Result<Done> {
    let v = view(c.tensor_ref(0)?)?;
    if let Some(padded) = crate::buckets::padded_copy_of(&v, dtype)? {
        return Ok(Done::one(Value::Padded(padded)));
    }
    Ok(Done::one(cast(c.tensor(0)?, dtype)?))
}

/// `_to_copy(self, dtype, layout, device, pin_memory, non_blocking,
/// memory_format)`: a dense copy on the same device is one cast; anything
/// else (another device, a memory format) runs PyTorch's composite.
fn to_copy(c: &Call<'_>) -> Result<Done> {
    let strided = c.int_or(2, STRIDED)? == STRIDED;
    if !strided
        || c.flag_or(4, false)?
        || !(c.is_tensor(0) || c.is_host_tensor(0))
        || !dense(c, 0, 6)?
    {
        return Ok(Done::Declined);
    }
    let to = match c.device_arg(3)? {
        None if c.is_tensor(0) => c.device()?,
        Some(Some(index)) if index < 0 => ffi::current_device().max(0) as usize,
        Some(Some(index)) => index as usize,
        _ => return Ok(Done::Declined),
    };
    let dtype = c.scalar_type(1)?.map_or_else(|| c.dtype(0), Ok)?;
    if c.is_host_tensor(0) {
        // An upload. Without a usable device the composite reports why, as
        // `torch.empty` does.
        if tpu_core::Runtime::global().is_err() || to >= crate::device::device_count() {
            return Ok(Done::Declined);
        }
        return Ok(Done::one(cast(c.upload(0, to)?, dtype)?));
    }
    if to != c.device()? {
        return Ok(Done::Declined);
    }
    same_values(c, dtype)
}

/// A size list argument, checked as PyTorch's factories check it.
fn sizes_arg(c: &Call<'_>, i: usize) -> Result<Vec<usize>> {
    let sizes = c.ints(i)?.unwrap_or(&[]);
    if let Some(&n) = sizes.iter().find(|&&n| n < 0) {
        return Err(error(format!(
            "Trying to create tensor with negative dimension {n}: {sizes:?}"
        )));
    }
    Ok(sizes.iter().map(|&n| n as usize).collect())
}

/// `torch.empty`: a new storage, allocated when first written, viewed with
/// `sizes` and `strides`; its dtype and device from arguments `dtype` and
/// `device` (the default dtype, the current device).
fn unwritten(
    c: &Call<'_>,
    sizes: Vec<usize>,
    strides: Vec<usize>,
    dtype: usize,
    device: usize,
) -> Result<Done> {
    let dtype = c.scalar_type(dtype)?.unwrap_or(c.default_float);
    unwritten_on(factory_device(c, device)?, dtype, sizes, strides)
}

/// The device a factory makes its tensor on: its device argument `i`, or
/// the current device; checked to exist.
fn factory_device(c: &Call<'_>, i: usize) -> Result<usize> {
    let device = match c.device_arg(i)? {
        Some(Some(index)) if index >= 0 => index as usize,
        _ => ffi::current_device().max(0) as usize,
    };
    crate::allocator::check_device(device)?;
    Ok(device)
}

/// A new `dtype` storage on `device`, allocated when first written, viewed
/// with `sizes` and `strides`.
fn unwritten_on(
    device: usize,
    dtype: tpu_core::DType,
    sizes: Vec<usize>,
    strides: Vec<usize>,
) -> Result<Done> {
    let numel = if sizes.contains(&0) {
        0
    } else {
        1 + sizes
            .iter()
            .zip(&strides)
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
    };
    let storage = storage::Storage::empty(dtype, numel, device)?;
    Ok(Done::one(Value::Unwritten {
        storage,
        sizes,
        strides,
    }))
}

/// Writes `value` through argument 0 (cast to its dtype, broadcast to its
/// shape), as `copy_` does.
fn store(c: &Call<'_>, value: tpu_core::Tensor) -> Result<Done> {
    super::store_into(c.tensor_ref(0)?, value)?;
    Ok(Done::Written)
}

/// `self.copy_(src)`: into a tpu tensor from a tpu tensor (any device), a
/// CPU tensor or a number; into a CPU tensor from a tpu one.
fn copy(c: &Call<'_>) -> Result<Done> {
    if !c.is_tensor(0) {
        return Ok(Done::Download(c.tensor(1)?));
    }
    let device = super::storage_of(c.tensor_ref(0)?)?.device();
    let value = if c.is_host_tensor(1) {
        c.upload(1, device)?
    } else if c.is_tensor(1) {
        crate::ops::on_device(c.tensor(1)?, device)?
    } else {
        c.operand(1, c.dtype(0)?)?
    };
    store(c, value)
}

fn fill(c: &Call<'_>) -> Result<Done> {
    if c.is_tensor(1) && !c.sizes(1)?.is_empty() {
        return Err(error(format!(
            "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.",
            c.sizes(1)?.len()
        )));
    }
    let d = c.dtype(0)?;
    store(c, c.operand(1, d)?)
}

/// `cat(tensors, dim)` in the tensors' promoted dtype; 1-D empty tensors
/// are skipped, as PyTorch does. With shape buckets on, an append may go
/// into a padded storage.
fn cat(c: &Call<'_>) -> Result<Done> {
    let all = c.tensors(0)?;
    if all.is_empty() {
        return Err(error("torch.cat(): expected a non-empty list of Tensors"));
    }
    let skipped = |t: &&ffi::TensorRef<'_>| t.sizes.len() == 1 && t.sizes[0] == 0;
    let mut parts: Vec<&ffi::TensorRef<'_>> = all.iter().filter(|t| !skipped(t)).collect();
    if parts.is_empty() {
        parts.push(&all[0]);
    }
    let dtype = c.promoted()?;
    let dim = c.int(1)?;
    let views = parts.iter().map(|t| view(t)).collect::<Result<Vec<_>>>()?;
    if let Some(padded) = crate::buckets::concat_views(&views, dim, dtype)? {
        return Ok(Done::one(Value::Padded(padded)));
    }
    let values = parts
        .iter()
        .map(|t| cast(read(t)?, dtype))
        .collect::<Result<Vec<_>>>()?;
    Ok(Done::one(apply_with(
        op!("concat"),
        &values,
        Attrs::new().with("dim", dim),
    )?))
}

/// Under Debug, an index outside the dimension is an `IndexError` naming
/// the op, the index and the size. Strict and DeferAndFuse run
/// asynchronously, as CUDA does, and do not read indices back.
fn check_bounds(
    c: &Call<'_>,
    x: &tpu_core::Tensor,
    dim: i64,
    index: &tpu_core::Tensor,
) -> Result<()> {
    if crate::kernels::policy_name()? != EagerMode::Debug.name()
        || index.shape().dims().contains(&0)
    {
        return Ok(());
    }
    let dims = x.shape().dims();
    let d = if dim < 0 {
        dim + dims.len() as i64
    } else {
        dim
    };
    let size = if dims.is_empty() {
        1
    } else {
        dims.get(d as usize).copied().unwrap_or(1)
    } as i64;
    let host = index.to_host()?.to_i64();
    let bad = host.iter().copied().find(|&i| i < 0 || i >= size);
    match bad {
        None => Ok(()),
        Some(i) => Err(BridgeError::Index(format!(
            "aten::{}: index {i} is out of bounds for dimension {dim} with size {size} (tpu:{})",
            c.op,
            c.device()?
        ))),
    }
}
