//! `permute`, `transpose`, `unsqueeze`, `squeeze`, `flip` and `roll`.

use tpu_core::Shape;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::common::*;
use crate::support::*;

/// The permutation of `permute`: every dim exactly once.
fn permutation(rank: usize, attrs: &Attrs) -> OpResult<Vec<usize>> {
    let dims = attrs.ints("dims")?;
    if dims.len() != rank {
        return Err(invalid!(
            "dims {dims:?} must list each of the {rank} dimensions once"
        ));
    }
    let perm = dims
        .iter()
        .map(|&d| normalize_dim(d, rank))
        .collect::<OpResult<Vec<_>>>()?;
    let mut seen = vec![false; rank];
    for &p in &perm {
        if std::mem::replace(&mut seen[p], true) {
            return Err(invalid!("dims {dims:?} repeats a dimension"));
        }
    }
    Ok(perm)
}

fn permuted(shape: &Shape, perm: &[usize]) -> Shape {
    Shape::new(perm.iter().map(|&p| shape.dims()[p]).collect::<Vec<_>>())
}

fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Reference of a permutation: output dim `i` is input dim `perm[i]`.
fn permute_ref(x: &HostTensor, perm: &[usize]) -> HostTensor {
    let out = permuted(&x.shape(), perm);
    remap_tensor(x, out.dims(), 0.0, &|ix, src| {
        for (i, &p) in perm.iter().enumerate() {
            src[p] = ix[i];
        }
        true
    })
}

#[cfg(feature = "conformance")]
fn permute_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let rank = shape.rank();
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    for i in (1..rank).rev() {
        let j = g.below(i + 1);
        perm.swap(i, j);
    }
    for p in perm.iter_mut() {
        if g.below(3) == 0 {
            *p -= rank as i64;
        }
    }
    Sample::new(
        vec![g.tensor(dtype, &shape)],
        Attrs::new().with("dims", perm),
    )
}

inventory::submit! {
    op_def! {
        name: "permute",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let perm = permutation(t.shape.rank(), attrs)?;
            Ok(vec![TensorType::new(t.dtype, permuted(&t.shape, &perm))])
        },
        lower: |b, x, attrs| {
            let perm = permutation(x[0].rank(), attrs)?;
            Ok(vec![b.transpose(&x[0], &perm)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let perm = permutation(x.shape().rank(), attrs)?;
            Ok(vec![permute_ref(x, &perm)])
        },
        vjp: Some(|t, a| {
            let perm = permutation(t.ty(a.inputs[0])?.shape.rank(), a.attrs)?;
            let inv: Vec<i64> = inverse(&perm).iter().map(|&p| p as i64).collect();
            Ok(vec![Some(t.call1("permute", &[a.grads[0]], Attrs::new().with("dims", inv))?)])
        }),
        samples: || (0..8).map(|i| permute_sample(&mut Gen::new(i))).collect(),
        arbitrary: permute_sample,
        torch: Torch::Expr(r#"torch.permute(x[0], a["dims"])"#),
    }
}

/// The permutation swapping `dim0` and `dim1` (identity for rank 0).
fn swap_perm(rank: usize, attrs: &Attrs) -> OpResult<Vec<usize>> {
    let d0 = normalize_dim_scalar_ok(attrs.int("dim0")?, rank)?;
    let d1 = normalize_dim_scalar_ok(attrs.int("dim1")?, rank)?;
    let mut perm: Vec<usize> = (0..rank).collect();
    if rank > 0 {
        perm.swap(d0, d1);
    }
    Ok(perm)
}

#[cfg(feature = "conformance")]
fn transpose_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let d0 = random_dim(g, shape.rank());
    let d1 = random_dim(g, shape.rank());
    Sample::new(
        vec![g.tensor(dtype, &shape)],
        Attrs::new().with("dim0", d0).with("dim1", d1),
    )
}

inventory::submit! {
    op_def! {
        name: "transpose",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let perm = swap_perm(t.shape.rank(), attrs)?;
            Ok(vec![TensorType::new(t.dtype, permuted(&t.shape, &perm))])
        },
        lower: |b, x, attrs| {
            let perm = swap_perm(x[0].rank(), attrs)?;
            Ok(vec![b.transpose(&x[0], &perm)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let perm = swap_perm(x.shape().rank(), attrs)?;
            Ok(vec![permute_ref(x, &perm)])
        },
        vjp: Some(|t, a| {
            Ok(vec![Some(t.call1("transpose", &[a.grads[0]], a.attrs.clone())?)])
        }),
        samples: || (0..8).map(|i| transpose_sample(&mut Gen::new(i))).collect(),
        arbitrary: transpose_sample,
        torch: Torch::Expr(r#"torch.transpose(x[0], a["dim0"], a["dim1"])"#),
    }
}

/// The shape after `unsqueeze(dim)`: `dim` in `[-rank-1, rank]`.
fn unsqueezed(shape: &Shape, attrs: &Attrs) -> OpResult<Shape> {
    let d = normalize_dim(attrs.int("dim")?, shape.rank() + 1)?;
    let mut dims = shape.dims().to_vec();
    dims.insert(d, 1);
    Ok(Shape::new(dims))
}

#[cfg(feature = "conformance")]
fn unsqueeze_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let r = shape.rank() as i64 + 1;
    let d = g.below(r as usize) as i64 - if g.bool() { r } else { 0 };
    Sample::new(vec![g.tensor(dtype, &shape)], Attrs::new().with("dim", d))
}

inventory::submit! {
    op_def! {
        name: "unsqueeze",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, unsqueezed(&t.shape, attrs)?)])
        },
        lower: |b, x, attrs| {
            let s = unsqueezed(x[0].shape(), attrs)?;
            Ok(vec![b.reshape(&x[0], s.dims())])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![reshape_to(x, &unsqueezed(&x.shape(), attrs)?)?])
        },
        vjp: Some(|t, a| {
            let shape = t.ty(a.inputs[0])?.shape;
            Ok(vec![Some(t.reshape(a.grads[0], &shape)?)])
        }),
        samples: || (0..8).map(|i| unsqueeze_sample(&mut Gen::new(i))).collect(),
        arbitrary: unsqueeze_sample,
        torch: Torch::Expr(r#"torch.unsqueeze(x[0], a["dim"])"#),
    }
}

/// The shape after `squeeze(dims?)`: size-1 dims among `dims` (all when
/// absent) are removed; other listed dims are kept, as in PyTorch.
fn squeezed(shape: &Shape, attrs: &Attrs) -> OpResult<Shape> {
    let dims = normalize_dims(attrs.ints_opt("dims")?.as_deref(), shape.rank())?;
    let out: Vec<usize> = shape
        .dims()
        .iter()
        .enumerate()
        .filter(|&(i, &s)| !(s == 1 && dims.contains(&i)))
        .map(|(_, &s)| s)
        .collect();
    Ok(Shape::new(out))
}

#[cfg(feature = "conformance")]
fn squeeze_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    // Put some size-1 dims in.
    let dims: Vec<usize> = shape
        .dims()
        .iter()
        .map(|&d| if g.below(3) == 0 { 1 } else { d })
        .collect();
    let shape = Shape::new(dims);
    let mut attrs = Attrs::new();
    if g.below(3) != 0 {
        attrs.set("dims", random_dims(g, shape.rank()));
    }
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "squeeze",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, squeezed(&t.shape, attrs)?)])
        },
        lower: |b, x, attrs| {
            let s = squeezed(x[0].shape(), attrs)?;
            Ok(vec![b.reshape(&x[0], s.dims())])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![reshape_to(x, &squeezed(&x.shape(), attrs)?)?])
        },
        vjp: Some(|t, a| {
            let shape = t.ty(a.inputs[0])?.shape;
            Ok(vec![Some(t.reshape(a.grads[0], &shape)?)])
        }),
        samples: || (0..10).map(|i| squeeze_sample(&mut Gen::new(i))).collect(),
        arbitrary: squeeze_sample,
        torch: Torch::Expr(r#"torch.squeeze(x[0], a["dims"]) if "dims" in a else torch.squeeze(x[0])"#),
    }
}

/// The dims `flip` reverses.
fn flip_dims(rank: usize, attrs: &Attrs) -> OpResult<Vec<usize>> {
    normalize_dims(Some(&attrs.ints("dims")?), rank)
}

fn flip_ref(x: &HostTensor, dims: &[usize]) -> HostTensor {
    let shape = x.shape();
    let sizes = shape.dims();
    remap_tensor(x, sizes, 0.0, &|ix, src| {
        for (d, (&i, &n)) in ix.iter().zip(sizes).enumerate() {
            src[d] = if dims.contains(&d) { n - 1 - i } else { i };
        }
        true
    })
}

#[cfg(feature = "conformance")]
fn flip_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let dims = random_dims(g, shape.rank());
    Sample::new(
        vec![g.tensor(dtype, &shape)],
        Attrs::new().with("dims", dims),
    )
}

inventory::submit! {
    op_def! {
        name: "flip",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            flip_dims(t.shape.rank(), attrs)?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, attrs| {
            let dims = flip_dims(x[0].rank(), attrs)?;
            Ok(vec![b.reverse(&x[0], &dims)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let dims = flip_dims(x.shape().rank(), attrs)?;
            Ok(vec![flip_ref(x, &dims)])
        },
        vjp: Some(|t, a| Ok(vec![Some(t.call1("flip", &[a.grads[0]], a.attrs.clone())?)])),
        samples: || (0..8).map(|i| flip_sample(&mut Gen::new(i))).collect(),
        arbitrary: flip_sample,
        torch: Torch::Expr(r#"torch.flip(x[0], a["dims"])"#),
    }
}

// ---- roll ----

/// `roll(shifts, dims)`: each `(shift, dim)` pair moves elements `shift`
/// places along `dim`, wrapping around. Without `dims` the flattened input
/// rolls by the one shift, as in PyTorch. Returns the pairs with shifts
/// reduced modulo the size (`None` dims: the flattened case).
fn roll_plan(x: &TensorType, attrs: &Attrs) -> OpResult<Vec<(usize, usize)>> {
    let shifts = attrs.ints("shifts")?;
    let (dims, sizes) = match attrs.ints_opt("dims")? {
        Some(dims) if !dims.is_empty() => {
            if dims.len() != shifts.len() {
                return Err(invalid!(
                    "shifts ({} values) and dims ({} values) must have the same length",
                    shifts.len(),
                    dims.len()
                ));
            }
            let dims: Vec<usize> = dims
                .iter()
                .map(|&d| normalize_dim_scalar_ok(d, x.shape.rank()))
                .collect::<OpResult<_>>()?;
            let sizes = dims.iter().map(|&d| lift(&x.shape).dims()[d]).collect();
            (dims, sizes)
        }
        _ => {
            if shifts.len() != 1 {
                return Err(invalid!(
                    "without dims, roll takes one shift, not {}",
                    shifts.len()
                ));
            }
            (vec![0], vec![x.shape.numel()])
        }
    };
    Ok(dims
        .into_iter()
        .zip(sizes)
        .zip(shifts)
        .map(|((d, n), s)| {
            (
                d,
                if n == 0 {
                    0
                } else {
                    s.rem_euclid(n as i64) as usize
                },
            )
        })
        .collect())
}

fn roll_flat(attrs: &Attrs) -> OpResult<bool> {
    Ok(attrs.ints_opt("dims")?.is_none_or(|d| d.is_empty()))
}

fn lower_roll(b: &mut Builder, x: &Value, attrs: &Attrs) -> OpResult<Value> {
    let plan = roll_plan(x.ty(), attrs)?;
    let flat = roll_flat(attrs)?;
    let mut y = if flat || x.rank() == 0 {
        b.reshape(x, &[x.shape().numel()])
    } else {
        x.clone()
    };
    for (dim, shift) in plan {
        if shift == 0 {
            continue;
        }
        let n = y.dims()[dim];
        let cut = |b: &mut Builder, lo: usize, hi: usize| {
            let mut start = vec![0; y.rank()];
            let mut limit = y.dims().to_vec();
            start[dim] = lo;
            limit[dim] = hi;
            b.slice(&y, &start, &limit, &vec![1; y.rank()])
        };
        let tail = cut(b, n - shift, n);
        let head = cut(b, 0, n - shift);
        y = b.concatenate(&[&tail, &head], dim);
    }
    Ok(b.reshape(&y, x.dims()))
}

fn roll_ref(x: &HostTensor, attrs: &Attrs) -> OpResult<HostTensor> {
    let plan = roll_plan(&x.ty(), attrs)?;
    let flat = roll_flat(attrs)? || x.shape().rank() == 0;
    let y = if flat {
        reshape_to(x, &Shape::from(vec![x.shape().numel()]))?
    } else {
        x.clone()
    };
    let shape = y.shape();
    let sizes = shape.dims();
    let rolled = remap_tensor(&y, sizes, 0.0, &|ix, src| {
        src.copy_from_slice(ix);
        for &(d, s) in &plan {
            src[d] = (ix[d] + sizes[d] - s) % sizes[d];
        }
        true
    });
    reshape_to(&rolled, &x.shape())
}

#[cfg(feature = "conformance")]
fn roll_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let mut attrs = Attrs::new();
    let shift = |g: &mut Gen| g.below(13) as i64 - 6;
    if shape.rank() == 0 || g.below(4) == 0 {
        attrs.set("shifts", vec![shift(g)]);
    } else {
        let dims = random_dims(g, shape.rank());
        let dims = if dims.is_empty() {
            vec![random_dim(g, shape.rank())]
        } else {
            dims
        };
        attrs.set("shifts", dims.iter().map(|_| shift(g)).collect::<Vec<_>>());
        attrs.set("dims", dims);
    }
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "roll",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            roll_plan(t, attrs)?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, attrs| Ok(vec![lower_roll(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![roll_ref(one(x)?, attrs)?]),
        vjp: Some(|t, a| {
            let back: Vec<i64> = a.attrs.ints("shifts")?.iter().map(|s| -s).collect();
            let mut attrs = a.attrs.clone();
            attrs.set("shifts", back);
            Ok(vec![Some(t.call1("roll", &[a.grads[0]], attrs)?)])
        }),
        samples: || (0..12).map(|i| roll_sample(&mut Gen::new(1400 + i))).collect(),
        arbitrary: roll_sample,
        torch: Torch::Expr(r#"torch.roll(x[0], a["shifts"], a.get("dims", ()))"#),
    }
}
