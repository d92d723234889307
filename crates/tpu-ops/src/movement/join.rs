//! `concat`, `stack`, `split` and `chunk`.

use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attr, Attrs, Flags, OpResult, Tape, Torch, Var};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{DType, Shape};

use super::common::*;
use crate::support::*;

/// PyTorch's promotion over every input of a join.
fn joined_dtype(types: &[TensorType]) -> OpResult<DType> {
    let first = types.first().ok_or("needs at least one input")?.dtype;
    Ok(types.iter().fold(first, |d, t| promote_dtypes(d, t.dtype)))
}

/// What `concat` does: which inputs take part (1-D empty tensors are
/// skipped, as in PyTorch, unless all inputs are), the dim, the output.
struct ConcatPlan {
    used: Vec<bool>,
    dim: usize,
    out: TensorType,
}

fn concat_plan(types: &[TensorType], attrs: &Attrs) -> OpResult<ConcatPlan> {
    let dtype = joined_dtype(types)?;
    let skip = |t: &TensorType| t.shape.dims() == [0];
    let mut used: Vec<bool> = types.iter().map(|t| !skip(t)).collect();
    if !used.iter().any(|&u| u) {
        used = vec![true; types.len()];
    }
    let parts: Vec<&TensorType> = types
        .iter()
        .zip(&used)
        .filter(|(_, u)| **u)
        .map(|(t, _)| t)
        .collect();
    let first = parts[0];
    if let Some(i) = types.iter().position(|t| t.shape.rank() == 0) {
        return Err(invalid!(
            "zero-dimensional input {i} cannot be concatenated"
        ));
    }
    let rank = first.shape.rank();
    let dim = normalize_dim(attrs.int_or("dim", 0)?, rank)?;
    let mut dims = first.shape.dims().to_vec();
    dims[dim] = 0;
    for (i, t) in parts.iter().enumerate() {
        let ok = t.shape.rank() == rank
            && (0..rank).all(|d| d == dim || t.shape.dims()[d] == first.shape.dims()[d]);
        if !ok {
            return Err(invalid!(
                "input shapes {} and {} differ outside dimension {dim} (input {i})",
                first.shape,
                t.shape
            ));
        }
        dims[dim] += t.shape.dims()[dim];
    }
    Ok(ConcatPlan {
        used,
        dim,
        out: TensorType::new(dtype, dims),
    })
}

fn concat_lower(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Value> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let plan = concat_plan(&types, attrs)?;
    let parts: Vec<Value> = x
        .iter()
        .zip(&plan.used)
        .filter(|(_, u)| **u)
        .map(|(v, _)| b.convert(v, plan.out.dtype))
        .collect();
    let refs: Vec<&Value> = parts.iter().collect();
    Ok(b.concatenate(&refs, plan.dim))
}

fn concat_ref(x: &[HostTensor], attrs: &Attrs) -> OpResult<HostTensor> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let plan = concat_plan(&types, attrs)?;
    let parts: Vec<HostTensor> = x
        .iter()
        .zip(&plan.used)
        .filter(|(_, u)| **u)
        .map(|(t, _)| t.clone())
        .collect();
    concat_tensors(&parts, plan.dim, plan.out.dtype)
}

fn concat_vjp(
    t: &mut dyn Tape,
    inputs: &[Var],
    g: Var,
    attrs: &Attrs,
) -> OpResult<Vec<Option<Var>>> {
    let types = inputs
        .iter()
        .map(|&v| t.ty(v))
        .collect::<OpResult<Vec<TensorType>>>()?;
    let plan = concat_plan(&types, attrs)?;
    let mut offset = 0i64;
    let mut out = Vec::with_capacity(inputs.len());
    for (i, ty) in types.iter().enumerate() {
        if !ty.dtype.is_inexact() {
            if plan.used[i] {
                offset += ty.shape.dims()[plan.dim] as i64;
            }
            out.push(None);
            continue;
        }
        if !plan.used[i] {
            out.push(Some(t.full(ty.dtype, &ty.shape, 0.0)?));
            continue;
        }
        let n = ty.shape.dims()[plan.dim] as i64;
        let sattrs = Attrs::new()
            .with("dim", plan.dim as i64)
            .with("start", offset)
            .with("end", offset + n)
            .with("step", 1i64);
        let s = t.call1("slice", &[g], sattrs)?;
        out.push(Some(t.cast(s, ty.dtype)?));
        offset += n;
    }
    Ok(out)
}

/// `n` shapes that join along `dim` of `shape`.
#[cfg(feature = "conformance")]
fn join_shapes(g: &mut Gen, shape: &Shape, dim: usize, n: usize) -> Vec<Shape> {
    (0..n)
        .map(|_| {
            let mut dims = shape.dims().to_vec();
            dims[dim] = match g.below(6) {
                0 => 0,
                k => k,
            };
            Shape::new(dims)
        })
        .collect()
}

#[cfg(feature = "conformance")]
fn concat_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape_nonempty(1, 3);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let n = 1 + g.below(4);
    let inputs: Vec<HostTensor> = join_shapes(g, &shape, d, n)
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let dt = if g.below(4) == 0 { g.pick(ANY) } else { dtype };
            if i > 0 && g.below(8) == 0 {
                g.tensor(dt, &Shape::new(vec![0]))
            } else {
                g.tensor(dt, s)
            }
        })
        .collect();
    Sample::new(inputs, Attrs::new().with("dim", dim))
}

inventory::submit! {
    op_def! {
        name: "concat",
        arity: Arity::AtLeast(1),
        dtypes: ANY,
        infer: |x, attrs| Ok(vec![concat_plan(x, attrs)?.out]),
        lower: |b, x, attrs| Ok(vec![concat_lower(b, x, attrs)?]),
        reference: |x, attrs| Ok(vec![concat_ref(x, attrs)?]),
        vjp: Some(|t, a| concat_vjp(t, a.inputs, a.grads[0], a.attrs)),
        samples: || (0..12).map(|i| concat_sample(&mut Gen::new(i))).collect(),
        arbitrary: concat_sample,
        torch: Torch::Expr(r#"torch.cat(x, a.get("dim", 0))"#),
    }
}

/// `stack(dim)`: equal shapes; `dim` in `[-rank-1, rank]`.
fn stack_plan(types: &[TensorType], attrs: &Attrs) -> OpResult<(usize, TensorType)> {
    let dtype = joined_dtype(types)?;
    let first = &types[0].shape;
    if let Some(t) = types.iter().find(|t| t.shape != *first) {
        return Err(invalid!(
            "stack needs equal shapes, got {first} and {}",
            t.shape
        ));
    }
    let dim = normalize_dim(attrs.int_or("dim", 0)?, first.rank() + 1)?;
    let mut dims = first.dims().to_vec();
    dims.insert(dim, types.len());
    Ok((dim, TensorType::new(dtype, dims)))
}

#[cfg(feature = "conformance")]
fn stack_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 3);
    let rank = shape.rank() + 1;
    let dim = random_dim(g, rank);
    let n = 1 + g.below(4);
    let inputs: Vec<HostTensor> = (0..n)
        .map(|_| {
            let dt = if g.below(4) == 0 { g.pick(ANY) } else { dtype };
            g.tensor(dt, &shape)
        })
        .collect();
    Sample::new(inputs, Attrs::new().with("dim", dim))
}

inventory::submit! {
    op_def! {
        name: "stack",
        arity: Arity::AtLeast(1),
        dtypes: ANY,
        infer: |x, attrs| Ok(vec![stack_plan(x, attrs)?.1]),
        lower: |b, x, attrs| {
            let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
            let (dim, out) = stack_plan(&types, attrs)?;
            let mut one = out.shape.dims().to_vec();
            one[dim] = 1;
            let parts: Vec<Value> = x
                .iter()
                .map(|v| {
                    let c = b.convert(v, out.dtype);
                    b.reshape(&c, &one)
                })
                .collect();
            let refs: Vec<&Value> = parts.iter().collect();
            Ok(vec![b.concatenate(&refs, dim)])
        },
        reference: |x, attrs| {
            let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
            let (dim, out) = stack_plan(&types, attrs)?;
            let mut one = out.shape.dims().to_vec();
            one[dim] = 1;
            let parts = x.iter().map(|t| with_shape(t, &one)).collect::<OpResult<Vec<_>>>()?;
            Ok(vec![concat_tensors(&parts, dim, out.dtype)?])
        },
        vjp: Some(|t, a| {
            let types = a.inputs.iter().map(|&v| t.ty(v)).collect::<OpResult<Vec<TensorType>>>()?;
            let (dim, _) = stack_plan(&types, a.attrs)?;
            let mut out = Vec::with_capacity(a.inputs.len());
            for (i, &x) in a.inputs.iter().enumerate() {
                if !types[i].dtype.is_inexact() {
                    out.push(None);
                    continue;
                }
                let attrs = Attrs::new().with("dim", dim as i64).with("index", i as i64);
                let s = t.call1("select", &[a.grads[0]], attrs)?;
                out.push(grad_as(t, s, x)?);
            }
            Ok(out)
        }),
        samples: || (0..10).map(|i| stack_sample(&mut Gen::new(i))).collect(),
        arbitrary: stack_sample,
        torch: Torch::Expr(r#"torch.stack(x, a.get("dim", 0))"#),
    }
}

/// Most outputs a split may have (keeps inference bounded).
const MAX_PARTS: usize = 1 << 16;

/// Sizes of `split(dim, sizes)` along the dim: a list (must add up to the
/// dim's size) or one integer split size (as `torch.split(x, n)`: chunks of
/// `n`, the last smaller).
fn split_plan(shape: &Shape, attrs: &Attrs) -> OpResult<(usize, Vec<usize>)> {
    if shape.rank() == 0 {
        return Err("split cannot be applied to a 0-dim tensor".into());
    }
    let dim = normalize_dim(attrs.int_or("dim", 0)?, shape.rank())?;
    let size = shape.dims()[dim];
    let sizes = match attrs.get("sizes") {
        Some(Attr::Int(n)) => {
            let n = *n;
            if n < 0 || (n == 0 && size > 0) {
                return Err(invalid!("split size must be positive, got {n}"));
            }
            if n == 0 {
                vec![0]
            } else {
                even_parts(size, n as usize)?
            }
        }
        _ => {
            let sizes = attrs.ints("sizes")?;
            if sizes.is_empty() || sizes.len() > MAX_PARTS {
                return Err(invalid!("split needs 1 to {MAX_PARTS} sizes"));
            }
            if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != size as i64 {
                return Err(invalid!(
                    "split sizes {sizes:?} must be non-negative and add up to {size}, the size of dimension {dim}"
                ));
            }
            sizes.iter().map(|&s| s as usize).collect()
        }
    };
    Ok((dim, sizes))
}

/// `size` cut into parts of `n` (the last smaller).
fn even_parts(size: usize, n: usize) -> OpResult<Vec<usize>> {
    let count = size.div_ceil(n).max(1);
    if count > MAX_PARTS {
        return Err(invalid!("split would give more than {MAX_PARTS} outputs"));
    }
    Ok((0..count)
        .map(|i| n.min(size - (i * n).min(size)))
        .collect())
}

fn split_types(t: &TensorType, dim: usize, sizes: &[usize]) -> Vec<TensorType> {
    sizes
        .iter()
        .map(|&s| {
            let mut dims = t.shape.dims().to_vec();
            dims[dim] = s;
            TensorType::new(t.dtype, dims)
        })
        .collect()
}

fn split_lower(b: &mut Builder, x: &Value, dim: usize, sizes: &[usize]) -> Vec<Value> {
    let r = x.rank();
    let mut offset = 0;
    sizes
        .iter()
        .map(|&s| {
            let mut start = vec![0; r];
            let mut limit = x.dims().to_vec();
            start[dim] = offset;
            limit[dim] = offset + s;
            offset += s;
            b.slice(x, &start, &limit, &vec![1; r])
        })
        .collect()
}

fn split_ref(x: &HostTensor, dim: usize, sizes: &[usize]) -> Vec<HostTensor> {
    let mut offset = 0;
    let ty = x.ty();
    split_types(&ty, dim, sizes)
        .into_iter()
        .map(|t| {
            let off = offset;
            offset += t.shape.dims()[dim];
            remap_tensor(x, t.shape.dims(), 0.0, &|ix, src| {
                src.copy_from_slice(ix);
                src[dim] += off;
                true
            })
        })
        .collect()
}

/// The gradient of a split: the output gradients joined back.
fn split_vjp(t: &mut dyn Tape, grads: &[Var], dim: usize) -> OpResult<Vec<Option<Var>>> {
    let g = t.call1("concat", grads, Attrs::new().with("dim", dim as i64))?;
    Ok(vec![Some(g)])
}

#[cfg(feature = "conformance")]
fn split_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 3);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let size = shape.dims()[d];
    let attrs = Attrs::new().with("dim", dim);
    let attrs = if g.below(4) == 0 {
        attrs.with("sizes", g.below(size) as i64 + 1)
    } else {
        let mut left = size;
        let mut sizes = Vec::new();
        while left > 0 || sizes.is_empty() {
            let s = if g.below(4) == 0 {
                0
            } else {
                1 + g.below(left.max(1))
            }
            .min(left);
            sizes.push(s as i64);
            left -= s;
        }
        attrs.with("sizes", sizes)
    };
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "split",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let (dim, sizes) = split_plan(&t.shape, attrs)?;
            Ok(split_types(t, dim, &sizes))
        },
        lower: |b, x, attrs| {
            let (dim, sizes) = split_plan(x[0].shape(), attrs)?;
            Ok(split_lower(b, &x[0], dim, &sizes))
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let (dim, sizes) = split_plan(&x.shape(), attrs)?;
            Ok(split_ref(x, dim, &sizes))
        },
        vjp: Some(|t, a| {
            let (dim, _) = split_plan(&t.ty(a.inputs[0])?.shape, a.attrs)?;
            split_vjp(t, a.grads, dim)
        }),
        samples: || (0..10).map(|i| split_sample(&mut Gen::new(i))).collect(),
        arbitrary: split_sample,
        torch: Torch::Expr(r#"torch.split(x[0], a["sizes"], a.get("dim", 0))"#),
    }
}

/// Sizes of `chunk(dim, chunks)` as `torch.chunk`: parts of
/// `ceil(size / chunks)`, possibly fewer than `chunks`; an empty dim gives
/// `chunks` empty parts.
fn chunk_plan(shape: &Shape, attrs: &Attrs) -> OpResult<(usize, Vec<usize>)> {
    if shape.rank() == 0 {
        return Err("chunk expects at least a 1-dimensional tensor".into());
    }
    let dim = normalize_dim(attrs.int_or("dim", 0)?, shape.rank())?;
    let chunks = attrs.int("chunks")?;
    if chunks <= 0 {
        return Err(invalid!("chunks must be greater than 0, got {chunks}"));
    }
    let size = shape.dims()[dim];
    if size == 0 {
        if chunks as usize > MAX_PARTS {
            return Err(invalid!("chunk would give more than {MAX_PARTS} outputs"));
        }
        return Ok((dim, vec![0; chunks as usize]));
    }
    let part = size.div_ceil(chunks as usize);
    Ok((dim, even_parts(size, part)?))
}

#[cfg(feature = "conformance")]
fn chunk_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 3);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let chunks = 1 + g.below(8) as i64;
    let attrs = Attrs::new().with("dim", dim).with("chunks", chunks);
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "chunk",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let (dim, sizes) = chunk_plan(&t.shape, attrs)?;
            Ok(split_types(t, dim, &sizes))
        },
        lower: |b, x, attrs| {
            let (dim, sizes) = chunk_plan(x[0].shape(), attrs)?;
            Ok(split_lower(b, &x[0], dim, &sizes))
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let (dim, sizes) = chunk_plan(&x.shape(), attrs)?;
            Ok(split_ref(x, dim, &sizes))
        },
        vjp: Some(|t, a| {
            let (dim, _) = chunk_plan(&t.ty(a.inputs[0])?.shape, a.attrs)?;
            split_vjp(t, a.grads, dim)
        }),
        samples: || (0..10).map(|i| chunk_sample(&mut Gen::new(i))).collect(),
        arbitrary: chunk_sample,
        torch: Torch::Expr(r#"torch.chunk(x[0], a["chunks"], a.get("dim", 0))"#),
    }
}
