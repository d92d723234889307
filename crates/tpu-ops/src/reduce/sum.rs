//! `sum`: integers and bool sum to i64, as in PyTorch; f16 and bf16
//! accumulate in f32.

use ndarray::Axis;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{DType, Shape};

use crate::support::*;

/// The dims (`dims` attribute, all when absent) and `keepdim` of a reduction.
pub(crate) fn reduce_args(shape: &Shape, attrs: &Attrs) -> OpResult<(Vec<usize>, bool)> {
    let dims = attrs.ints_opt("dims")?;
    Ok((
        normalize_dims(dims.as_deref(), shape.rank())?,
        attrs.bool_or("keepdim", false)?,
    ))
}

fn sum_dtype(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        DType::I64
    }
}

/// The dtype f16 and bf16 accumulate in.
pub(crate) fn accumulator(d: DType) -> DType {
    if matches!(d, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        d
    }
}

fn lower_sum(b: &mut Builder, x: &Value, attrs: &Attrs) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let out = sum_dtype(x.dtype());
    let acc = accumulator(out);
    let xc = b.convert(x, acc);
    let r = b.reduce(&xc, 0.0, &dims, "stablehlo.add");
    let r = b.convert(&r, out);
    Ok(b.reshape(&r, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn sum_ref(x: &HostTensor, attrs: &Attrs) -> OpResult<HostTensor> {
    let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
    let out_shape = reduced_shape(&x.shape(), &dims, keepdim);
    let out = sum_dtype(x.dtype());
    let t = if out.is_complex() {
        let mut a = x.to_complex();
        for &d in dims.iter().rev() {
            a = a.sum_axis(Axis(d));
        }
        HostTensor::complex(out, a)
    } else if out.is_float() {
        let mut a = x.to_f64();
        for &d in dims.iter().rev() {
            a = a.sum_axis(Axis(d));
        }
        HostTensor::float(out, a)
    } else {
        let mut a = x.to_i64();
        for &d in dims.iter().rev() {
            a = a.map_axis(Axis(d), |lane| {
                lane.iter().fold(0i64, |s, &v| s.wrapping_add(v))
            });
        }
        HostTensor::int(out, a)
    };
    reshape_to(&t, &out_shape)
}

/// A reduction sample: random dims (sometimes none given, meaning all),
/// random `keepdim`.
#[cfg(feature = "conformance")]
pub(crate) fn reduce_sample(g: &mut Gen, dtypes: &[DType]) -> Sample {
    let dtype = g.pick(dtypes);
    let shape = g.shape(0, 4);
    let x = g.tensor(dtype, &shape);
    let mut attrs = Attrs::new().with("keepdim", g.bool());
    if shape.rank() > 0 && g.below(4) != 0 {
        let rank = shape.rank() as i64;
        let mut dims = Vec::new();
        for d in 0..rank {
            match g.below(3) {
                0 => dims.push(d),
                1 => dims.push(d - rank),
                _ => {}
            }
        }
        attrs.set("dims", dims);
    }
    Sample::new(vec![x], attrs)
}

inventory::submit! {
    op_def! {
        name: "sum",
        arity: Arity::Exactly(1),
        flags: Flags::REDUCTION,
        dtypes: ANY,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
            Ok(vec![TensorType::new(sum_dtype(t.dtype), reduced_shape(&t.shape, &dims, keepdim))])
        },
        lower: |b, x, attrs| Ok(vec![lower_sum(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![sum_ref(one(x)?, attrs)?]),
        vjp: Some(|t, a| {
            let x = t.ty(a.inputs[0])?;
            let (dims, _) = reduce_args(&x.shape, a.attrs)?;
            let kept = reduced_shape(&x.shape, &dims, true);
            let g = t.reshape(a.grads[0], &kept)?;
            Ok(vec![Some(t.broadcast_to(g, &x.shape)?)])
        }),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..8).map(|i| reduce_sample(&mut Gen::new(i), NUMERIC)).chain((0..4).map(|i| reduce_sample(&mut Gen::new(40 + i), COMPLEX))).collect(),
        arbitrary: |g: &mut Gen| reduce_sample(g, ANY),
        // PyTorch reduces every dim when `dims` is empty, where this op reduces
        // none: that case reduces a new trailing dim of size 1 instead.
        torch: Torch::Expr(r#"(lambda d, k: torch.sum(x[0], d, keepdim=k) if d else torch.sum(x[0].unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#),
    }
}
