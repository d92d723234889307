//! `reshape` and `broadcast_to`.

use tpu_core::Shape;
use tpu_core::host::{HostData, HostTensor};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::TensorType;

use crate::support::*;

/// The target of `reshape`: one `-1` may stand for the remaining size.
fn reshape_target(from: &Shape, attrs: &Attrs) -> OpResult<Shape> {
    let dims = attrs.ints("shape")?;
    let known: i64 = dims.iter().filter(|&&d| d >= 0).product();
    let wildcards = dims.iter().filter(|&&d| d == -1).count();
    if wildcards > 1 || dims.iter().any(|&d| d < -1) {
        return Err(invalid!(
            "shape {dims:?} may hold at most one -1 and no other negative size"
        ));
    }
    let numel = from.numel() as i64;
    let out: Vec<usize> = dims
        .iter()
        .map(|&d| {
            if d == -1 {
                if known == 0 {
                    0
                } else {
                    (numel / known) as usize
                }
            } else {
                d as usize
            }
        })
        .collect();
    let target = Shape::new(out);
    if target.numel() != from.numel() {
        return Err(invalid!(
            "cannot reshape {from} ({} elements) to {dims:?}",
            from.numel()
        ));
    }
    Ok(target)
}

#[cfg(feature = "conformance")]
fn reshape_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let x = g.tensor(dtype, &shape);
    // Regroup the same elements: flatten, split a factor out, or use -1.
    let n = shape.numel() as i64;
    let target: Vec<i64> = match g.below(4) {
        0 => vec![n],
        1 => vec![-1],
        2 if n % 2 == 0 && n > 0 => vec![2, -1],
        _ => shape.dims().iter().rev().map(|&d| d as i64).collect(),
    };
    Sample::new(vec![x], Attrs::new().with("shape", target))
}

inventory::submit! {
    op_def! {
        name: "reshape",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, reshape_target(&t.shape, attrs)?)])
        },
        lower: |b, x, attrs| {
            let target = reshape_target(x[0].shape(), attrs)?;
            Ok(vec![b.reshape(&x[0], target.dims())])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![reshape_to(x, &reshape_target(&x.shape(), attrs)?)?])
        },
        vjp: Some(|t, a| {
            let shape = t.ty(a.inputs[0])?.shape;
            Ok(vec![Some(t.reshape(a.grads[0], &shape)?)])
        }),
        samples: || (0..8).map(|i| reshape_sample(&mut Gen::new(i))).collect(),
        arbitrary: reshape_sample,
        torch: Torch::Expr(r#"torch.reshape(x[0], a["shape"])"#),
    }
}

/// The target of `broadcast_to`: NumPy rules; `-1` keeps a dimension.
fn broadcast_target(from: &Shape, attrs: &Attrs) -> OpResult<Shape> {
    let dims = attrs.ints("shape")?;
    if dims.len() < from.rank() {
        return Err(invalid!(
            "cannot broadcast {from} to the lower-rank shape {dims:?}"
        ));
    }
    let offset = dims.len() - from.rank();
    let out: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(
            |(i, &d)| match (d, i.checked_sub(offset).map(|j| from.dims()[j])) {
                (-1, Some(s)) => Ok(s),
                (d, _) if d < 0 => Err(invalid!("shape {dims:?} has an invalid size {d}")),
                (d, Some(s)) if s != 1 && s as i64 != d => {
                    Err(invalid!("cannot broadcast {from} to {dims:?}"))
                }
                (d, _) => Ok(d as usize),
            },
        )
        .collect::<OpResult<Vec<_>>>()?;
    Ok(Shape::new(out))
}

#[cfg(feature = "conformance")]
fn broadcast_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let target = g.shape(0, 4);
    let from = g.broadcastable(&target);
    let x = g.tensor(dtype, &from);
    Sample::new(vec![x], Attrs::new().with("shape", target.dims()))
}

inventory::submit! {
    op_def! {
        name: "broadcast_to",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, broadcast_target(&t.shape, attrs)?)])
        },
        lower: |b, x, attrs| {
            let target = broadcast_target(x[0].shape(), attrs)?;
            Ok(vec![b.broadcast_to(&x[0], target.dims())])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let target = broadcast_target(&x.shape(), attrs)?;
            Ok(vec![match x.data() {
                HostData::Float(a) => HostTensor::float(x.dtype(), broadcast_array(a, target.dims())?),
                HostData::Int(a) => HostTensor::int(x.dtype(), broadcast_array(a, target.dims())?),
                HostData::Complex(a) => HostTensor::complex(x.dtype(), broadcast_array(a, target.dims())?),
            }])
        },
        vjp: Some(|t, a| {
            let shape = t.ty(a.inputs[0])?.shape;
            Ok(vec![Some(t.sum_to(a.grads[0], &shape)?)])
        }),
        samples: || (0..8).map(|i| broadcast_sample(&mut Gen::new(i))).collect(),
        arbitrary: broadcast_sample,
        torch: Torch::Expr(r#"torch.broadcast_to(x[0], a["shape"])"#),
    }
}
