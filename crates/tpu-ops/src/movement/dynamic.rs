//! `dynamic_slice` and `dynamic_update_slice`: a window along one dim
//! whose start is a tensor, known only when the program runs. A program
//! built once serves every start, which is what lets a sequence grow
//! inside a fixed-size buffer without a compile per length.
//!
//! The start is clamped so the window fits (XLA's rule): `[0, size - len]`.

use ndarray::{Axis, Slice};
use tpu_core::host::{HostData, HostTensor};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value, i64_array};
use tpu_core::{DType, Shape};

use super::common::*;
use crate::support::*;

/// The dim of a window into a tensor of `shape`, and its checked start's
/// dtype.
fn window_dim(shape: &Shape, start: &TensorType, attrs: &Attrs, op: &str) -> OpResult<usize> {
    if shape.rank() == 0 {
        return Err(invalid!("{op} cannot be applied to a 0-dim tensor"));
    }
    require_index(start.dtype, &format!("{op}'s start"))?;
    if start.shape.rank() != 0 {
        return Err(invalid!(
            "{op}'s start must be a 0-dim tensor, got shape {}",
            start.shape
        ));
    }
    normalize_dim(attrs.int("dim")?, shape.rank())
}

/// The start operands of a window along `dim` of a rank-`rank` value:
/// `start` (as i64) there, 0 elsewhere.
fn starts(b: &mut Builder, start: &Value, dim: usize, rank: usize) -> Vec<Value> {
    let start = b.convert(start, DType::I64);
    let zero = b.constant(DType::I64, Shape::scalar(), 0.0);
    (0..rank)
        .map(|d| {
            if d == dim {
                start.clone()
            } else {
                zero.clone()
            }
        })
        .collect()
}

/// The start a window of `len` along a dim of `size` really takes.
fn clamped(start: &HostTensor, size: usize, len: usize) -> usize {
    let s = start.to_i64().iter().next().copied().unwrap_or(0);
    s.clamp(0, (size - len) as i64) as usize
}

// ---- dynamic_slice(x, start; dim, length) ----

fn slice_type(x: &[TensorType], attrs: &Attrs) -> OpResult<(usize, TensorType)> {
    let [t, start] = x else {
        return Err("dynamic_slice takes a tensor and a start".into());
    };
    let dim = window_dim(&t.shape, start, attrs, "dynamic_slice")?;
    let length = attrs.int("length")?;
    let size = t.shape.dims()[dim];
    if length < 0 || length as usize > size {
        return Err(invalid!(
            "dynamic_slice length {length} does not fit dimension {dim} of size {size}"
        ));
    }
    let mut dims = t.shape.dims().to_vec();
    dims[dim] = length as usize;
    Ok((dim, TensorType::new(t.dtype, dims)))
}

fn slice_lower(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Vec<Value>> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let (dim, out) = slice_type(&types, attrs)?;
    let mut operands = vec![x[0].clone()];
    operands.extend(starts(b, &x[1], dim, x[0].rank()));
    let refs: Vec<&Value> = operands.iter().collect();
    let sizes = format!(
        "slice_sizes = {}",
        i64_array(out.shape.dims().iter().map(|&d| d as i64))
    );
    Ok(vec![b.op1("stablehlo.dynamic_slice", &refs, &sizes, out)])
}

fn slice_reference(x: &[HostTensor], attrs: &Attrs) -> OpResult<Vec<HostTensor>> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let (dim, out) = slice_type(&types, attrs)?;
    let len = out.shape.dims()[dim];
    let start = clamped(&x[1], x[0].dims()[dim], len);
    let window = Slice::from(start..start + len);
    Ok(vec![match x[0].data() {
        HostData::Float(a) => {
            HostTensor::float(x[0].dtype(), a.slice_axis(Axis(dim), window).to_owned())
        }
        HostData::Int(a) => {
            HostTensor::int(x[0].dtype(), a.slice_axis(Axis(dim), window).to_owned())
        }
        HostData::Complex(a) => {
            HostTensor::complex(x[0].dtype(), a.slice_axis(Axis(dim), window).to_owned())
        }
    }])
}

#[cfg(feature = "conformance")]
fn slice_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 4);
    let dim = random_dim(g, shape.rank());
    let size = shape.dims()[normalize_dim(dim, shape.rank()).unwrap_or(0)];
    let length = g.below(size + 1);
    let start = random_indices(g, &Shape::scalar(), 0, (size - length + 1) as i64);
    let attrs = Attrs::new().with("dim", dim).with("length", length as i64);
    Sample::new(vec![g.tensor(dtype, &shape), start], attrs)
}

inventory::submit! {
    op_def! {
        name: "dynamic_slice",
        arity: Arity::Exactly(2),
        dtypes: ANY,
        infer: |x, attrs| Ok(vec![slice_type(x, attrs)?.1]),
        lower: slice_lower,
        reference: slice_reference,
        // The gradient lands back in the window: zeros elsewhere.
        vjp: Some(|t, a| {
            let dim = a.attrs.int("dim")?;
            let zeros = t.full_like(a.inputs[0], 0.0)?;
            let g = t.call1(
                "dynamic_update_slice",
                &[zeros, a.grads[0], a.inputs[1]],
                Attrs::new().with("dim", dim),
            )?;
            Ok(vec![Some(g), None])
        }),
        samples: || (0..12).map(|i| slice_sample(&mut Gen::new(0xd5 + i))).collect(),
        arbitrary: slice_sample,
        torch: Torch::Expr(r#"torch.narrow(x[0], a["dim"], int(x[1]), a["length"])"#),
    }
}

// ---- dynamic_update_slice(x, update, start; dim) ----

fn update_type(x: &[TensorType], attrs: &Attrs) -> OpResult<(usize, TensorType)> {
    let [t, update, start] = x else {
        return Err("dynamic_update_slice takes a tensor, an update and a start".into());
    };
    let dim = window_dim(&t.shape, start, attrs, "dynamic_update_slice")?;
    if update.dtype != t.dtype {
        return Err(invalid!(
            "dynamic_update_slice: the update is {}, the tensor {}",
            update.dtype,
            t.dtype
        ));
    }
    let fits = update.shape.rank() == t.shape.rank()
        && (0..t.shape.rank()).all(|d| {
            let (u, s) = (update.shape.dims()[d], t.shape.dims()[d]);
            if d == dim { u <= s } else { u == s }
        });
    if !fits {
        return Err(invalid!(
            "dynamic_update_slice: an update of shape {} does not fit a tensor of shape {} along dim {dim}",
            update.shape,
            t.shape
        ));
    }
    Ok((dim, t.clone()))
}

fn update_lower(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Vec<Value>> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let (dim, out) = update_type(&types, attrs)?;
    let mut operands = vec![x[0].clone(), x[1].clone()];
    operands.extend(starts(b, &x[2], dim, x[0].rank()));
    let refs: Vec<&Value> = operands.iter().collect();
    Ok(vec![b.op1(
        "stablehlo.dynamic_update_slice",
        &refs,
        "",
        out,
    )])
}

fn update_reference(x: &[HostTensor], attrs: &Attrs) -> OpResult<Vec<HostTensor>> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let (dim, _) = update_type(&types, attrs)?;
    let len = x[1].dims()[dim];
    let start = clamped(&x[2], x[0].dims()[dim], len);
    let window = Slice::from(start..start + len);
    Ok(vec![match (x[0].data(), x[1].data()) {
        (HostData::Float(a), HostData::Float(u)) => {
            let mut out = a.clone();
            out.slice_axis_mut(Axis(dim), window).assign(u);
            HostTensor::float(x[0].dtype(), out)
        }
        (HostData::Int(a), HostData::Int(u)) => {
            let mut out = a.clone();
            out.slice_axis_mut(Axis(dim), window).assign(u);
            HostTensor::int(x[0].dtype(), out)
        }
        (HostData::Complex(a), HostData::Complex(u)) => {
            let mut out = a.clone();
            out.slice_axis_mut(Axis(dim), window).assign(u);
            HostTensor::complex(x[0].dtype(), out)
        }
        _ => return Err(invalid!("dynamic_update_slice: the update's dtype differs")),
    }])
}

#[cfg(feature = "conformance")]
fn update_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 4);
    let dim = random_dim(g, shape.rank());
    let d = normalize_dim(dim, shape.rank()).unwrap_or(0);
    let size = shape.dims()[d];
    let len = g.below(size + 1);
    let mut update = shape.dims().to_vec();
    update[d] = len;
    let start = random_indices(g, &Shape::scalar(), 0, (size - len + 1) as i64);
    Sample::new(
        vec![
            g.tensor(dtype, &shape),
            g.tensor(dtype, &Shape::new(update)),
            start,
        ],
        Attrs::new().with("dim", dim),
    )
}

inventory::submit! {
    op_def! {
        name: "dynamic_update_slice",
        arity: Arity::Exactly(3),
        dtypes: ANY,
        infer: |x, attrs| Ok(vec![update_type(x, attrs)?.1]),
        lower: update_lower,
        reference: update_reference,
        // The window's gradient goes to the update; the rest to the tensor.
        vjp: Some(|t, a| {
            let dim = a.attrs.int("dim")?;
            let d = normalize_dim(dim, t.ty(a.inputs[0])?.shape.rank())?;
            let len = t.ty(a.inputs[1])?.shape.dims()[d];
            let zeros = t.full_like(a.inputs[1], 0.0)?;
            let start = a.inputs[2];
            let attrs = Attrs::new().with("dim", dim);
            let gx = t.call1("dynamic_update_slice", &[a.grads[0], zeros, start], attrs)?;
            let attrs = Attrs::new().with("dim", dim).with("length", len as i64);
            let gu = t.call1("dynamic_slice", &[a.grads[0], start], attrs)?;
            Ok(vec![Some(gx), Some(gu), None])
        }),
        samples: || (0..12).map(|i| update_sample(&mut Gen::new(0xd05 + i))).collect(),
        arbitrary: update_sample,
        torch: Torch::Expr(r#"torch.slice_scatter(x[0], x[1], a["dim"], int(x[2]), int(x[2]) + x[1].shape[a["dim"]])"#),
    }
}
