//! `where`, `clamp` and `cast`.

use ndarray::Zip;
use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::binary::grad_for;
use crate::support::*;

fn infer_where(inputs: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let [c, a, b] = inputs else {
        return Err("takes (condition, on_true, on_false)".into());
    };
    if c.dtype != DType::Bool {
        return Err(invalid!("condition must be bool, got {}", c.dtype));
    }
    let shape = broadcast_all([&c.shape, &a.shape, &b.shape])?;
    Ok(vec![TensorType::new(promote(a, b), shape)])
}

fn lower_where(b: &mut Builder, x: &[Value]) -> OpResult<Vec<Value>> {
    let shape = broadcast_all([x[0].shape(), x[1].shape(), x[2].shape()])?;
    let dtype = promote(x[1].ty(), x[2].ty());
    let c = b.broadcast_to(&x[0], shape.dims());
    let t = b.convert(&x[1], dtype);
    let f = b.convert(&x[2], dtype);
    let t = b.broadcast_to(&t, shape.dims());
    let f = b.broadcast_to(&f, shape.dims());
    Ok(vec![b.select(&c, &t, &f)])
}

/// `t` where `c` is nonzero, else `f`, all broadcast to `shape`.
fn pick<T: Copy>(
    c: &ndarray::ArrayD<i64>,
    t: &ndarray::ArrayD<T>,
    f: &ndarray::ArrayD<T>,
    shape: &[usize],
) -> OpResult<ndarray::ArrayD<T>> {
    let (t, f) = (broadcast_array(t, shape)?, broadcast_array(f, shape)?);
    Ok(Zip::from(c)
        .and(&t)
        .and(&f)
        .map_collect(|&c, &t, &f| if c != 0 { t } else { f }))
}

fn where_ref(x: &[HostTensor]) -> OpResult<Vec<HostTensor>> {
    let shape = broadcast_all([&x[0].shape(), &x[1].shape(), &x[2].shape()])?;
    let dtype = promote(&x[1].ty(), &x[2].ty());
    let c = broadcast_array(&x[0].to_i64(), shape.dims())?;
    let (t, f) = (x[1].cast(dtype), x[2].cast(dtype));
    let dims = shape.dims();
    Ok(vec![if dtype.is_complex() {
        HostTensor::complex(dtype, pick(&c, &t.to_complex(), &f.to_complex(), dims)?)
    } else if dtype.is_float() {
        HostTensor::float(dtype, pick(&c, &t.to_f64(), &f.to_f64(), dims)?)
    } else {
        HostTensor::int(dtype, pick(&c, &t.to_i64(), &f.to_i64(), dims)?)
    }])
}

#[cfg(feature = "conformance")]
fn where_sample(g: &mut Gen) -> Sample {
    let shape = g.shape(0, 3);
    let dtype = g.pick(NUMERIC_OR_COMPLEX);
    let (cs, bs) = (g.broadcastable(&shape), g.broadcastable(&shape));
    // Mixed real and complex operands are left to `add` and `mul`.
    let other = if g.below(4) == 0 && !dtype.is_complex() {
        g.pick(NUMERIC)
    } else {
        dtype
    };
    let c = g.tensor(DType::Bool, &cs);
    let a = g.tensor(dtype, &shape);
    let b = g.tensor(other, &bs);
    Sample::new(vec![c, a, b], Attrs::new())
}

inventory::submit! {
    op_def! {
        name: "where",
        arity: Arity::Exactly(3),
        flags: Flags::ELEMENTWISE,
        dtypes: ANY,
        infer: |x, _| infer_where(x),
        lower: |b, x, _| lower_where(b, x),
        reference: |x, _| where_ref(x),
        vjp: Some(|t, a| {
            let zero = t.full_like(a.grads[0], 0.0)?;
            let c = a.inputs[0];
            let gt = t.call1("where", &[c, a.grads[0], zero], Attrs::new())?;
            let gf = t.call1("where", &[c, zero, a.grads[0]], Attrs::new())?;
            Ok(vec![None, grad_for(t, gt, a.inputs[1])?, grad_for(t, gf, a.inputs[2])?])
        }),
        samples: || (0..10).map(|i| where_sample(&mut Gen::new(i))).collect(),
        arbitrary: where_sample,
        torch: Torch::Expr("torch.where(x[0], x[1], x[2])"),
    }
}

/// Optional `min` / `max` bounds (numbers) of `clamp`.
fn bounds(attrs: &Attrs) -> OpResult<(Option<f64>, Option<f64>)> {
    let (lo, hi) = (attrs.float_opt("min")?, attrs.float_opt("max")?);
    if lo.is_none() && hi.is_none() {
        return Err("clamp needs `min`, `max` or both".into());
    }
    Ok((lo, hi))
}

fn lower_clamp(b: &mut Builder, x: &Value, attrs: &Attrs) -> OpResult<Value> {
    let (lo, hi) = bounds(attrs)?;
    let mut y = x.clone();
    if let Some(lo) = lo {
        let c = b.constant(x.dtype(), x.dims(), lo);
        y = b.binary("stablehlo.maximum", &y, &c);
    }
    if let Some(hi) = hi {
        let c = b.constant(x.dtype(), x.dims(), hi);
        y = b.binary("stablehlo.minimum", &y, &c);
    }
    Ok(y)
}

#[cfg(feature = "conformance")]
fn clamp_sample(g: &mut Gen) -> Sample {
    let mut s = unary_arbitrary(g, NUMERIC, -5.0, 5.0);
    match g.below(3) {
        0 => s.attrs.set("min", -1.0),
        1 => s.attrs.set("max", 2.0),
        _ => {
            s.attrs.set("min", -2.0);
            s.attrs.set("max", 1.0);
        }
    }
    s
}

inventory::submit! {
    op_def! {
        name: "clamp",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: NUMERIC,
        infer: |x, attrs| {
            bounds(attrs)?;
            let t = x.first().ok_or("missing input")?;
            require_dtype(t.dtype, NUMERIC, "input")?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, attrs| Ok(vec![lower_clamp(b, &x[0], attrs)?]),
        reference: |x, attrs| {
            let (lo, hi) = bounds(attrs)?;
            let (flo, fhi) = (lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY));
            // Integer bounds saturate to the dtype's range, as the lowering's
            // constants do.
            let (min, max) = tpu_core::stablehlo::int_range(one(x)?.dtype());
            let (ilo, ihi) = (lo.map_or(min, |v| (v as i64).clamp(min, max)), hi.map_or(max, |v| (v as i64).clamp(min, max)));
            Ok(vec![map_same(one(x)?, |v| v.max(flo).min(fhi), |v| v.max(ilo).min(ihi))])
        },
        vjp: Some(|t, a| {
            let (lo, hi) = bounds(a.attrs)?;
            let x = a.inputs[0];
            let mut g = a.grads[0];
            let zero = t.full_like(g, 0.0)?;
            if let Some(lo) = lo {
                let c = t.full_like(x, lo)?;
                let inside = t.call1("ge", &[x, c], Attrs::new())?;
                g = t.call1("where", &[inside, g, zero], Attrs::new())?;
            }
            if let Some(hi) = hi {
                let c = t.full_like(x, hi)?;
                let inside = t.call1("le", &[x, c], Attrs::new())?;
                g = t.call1("where", &[inside, g, zero], Attrs::new())?;
            }
            Ok(vec![Some(g)])
        }),
        samples: || (0..6).map(|i| clamp_sample(&mut Gen::new(i))).collect(),
        arbitrary: clamp_sample,
        // Float bounds make PyTorch's clamp of integers float; the op keeps the dtype.
        torch: Torch::Expr(r#"torch.clamp(x[0], a.get("min"), a.get("max")).to(x[0].dtype)"#),
    }
}

#[cfg(feature = "conformance")]
fn cast_sample(g: &mut Gen) -> Sample {
    let from = g.pick(ANY);
    let to = g.pick(ANY);
    let shape = g.shape(0, 3);
    // Values every dtype can hold, so casts are exact or well-defined rounding.
    let x = if from.is_complex() && !to.is_inexact() && to != DType::Bool {
        g.tensor_in(from, &shape, 0.0, 100.0)
    } else if from.is_inexact() {
        g.tensor_in(from, &shape, -3.0, 100.0)
    } else {
        g.tensor_in(from, &shape, 0.0, 100.0)
    };
    let x = if from.is_float() && !to.is_float() && to != DType::Bool {
        map_same(&x, |v| v.abs(), |v| v)
    } else if from.is_complex() && to == DType::Bool {
        imaginary_or_zero(&x)
    } else {
        x
    };
    Sample::new(vec![x], Attrs::new().with("dtype", to))
}

/// Zeros and purely imaginary values (from `x`'s): the truth of a complex
/// number takes both parts.
#[cfg(feature = "conformance")]
fn imaginary_or_zero(x: &HostTensor) -> HostTensor {
    let z = x
        .to_complex()
        .mapv(|z| tpu_core::Complex::new(0.0, if z.re < 48.0 { 0.0 } else { z.im }));
    HostTensor::complex(x.dtype(), z)
}

/// Complex values cast to bool.
#[cfg(feature = "conformance")]
fn complex_truth_sample(seed: u64) -> Sample {
    let x = Gen::new(seed).tensor_in(DType::C64, &tpu_core::Shape::new(vec![9]), 0.0, 100.0);
    Sample::new(
        vec![imaginary_or_zero(&x)],
        Attrs::new().with("dtype", DType::Bool),
    )
}

inventory::submit! {
    op_def! {
        name: "cast",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: ANY,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(attrs.dtype("dtype")?, t.shape.clone())])
        },
        lower: |b, x, attrs| Ok(vec![b.convert(&x[0], attrs.dtype("dtype")?)]),
        reference: |x, attrs| Ok(vec![one(x)?.cast(attrs.dtype("dtype")?)]),
        vjp: Some(|t, a| {
            let from = t.ty(a.inputs[0])?.dtype;
            // Complex to real keeps the real part, so its gradient is the
            // real cotangent as a complex one; real to complex the reverse.
            if !from.is_inexact() || !t.ty(a.outputs[0])?.dtype.is_inexact() {
                return Ok(vec![None]);
            }
            Ok(vec![Some(t.cast(a.grads[0], from)?)])
        }),
        samples: || (0..12).map(|i| cast_sample(&mut Gen::new(i))).chain([complex_truth_sample(1), complex_truth_sample(2)]).collect(),
        arbitrary: cast_sample,
        torch: Torch::Expr(r#"x[0].to(a["dtype"])"#),
    }
}
