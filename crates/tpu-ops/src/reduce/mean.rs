//! `mean` (float and complex inputs only, as in PyTorch; f16 and bf16 accumulate in f32;
//! the mean of nothing is NaN) and `prod` (integers and bool multiply to
//! i64, as in PyTorch).

use tpu_core::DType;
use tpu_core::host::{HostData, HostTensor, Tolerance};
use tpu_core::op::{Arity, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::kit::*;
use crate::support::*;

fn infer_mean(inputs: &[TensorType], attrs: &tpu_core::op::Attrs) -> OpResult<Vec<TensorType>> {
    let t = first(inputs)?;
    require_dtype(t.dtype, INEXACT, "input of mean (a float or complex dtype)")?;
    let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
    Ok(vec![TensorType::new(
        t.dtype,
        reduced_shape(&t.shape, &dims, keepdim),
    )])
}

fn lower_mean(b: &mut Builder, x: &Value, attrs: &tpu_core::op::Attrs) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let xc = b.convert(x, accumulator(x.dtype()));
    let s = sum_in(b, &xc, &dims);
    let n = b.constant(s.dtype(), s.dims(), count(x.dims(), &dims) as f64);
    let m = bin(b, "divide", &s, &n);
    let m = b.convert(&m, x.dtype());
    Ok(b.reshape(&m, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn mean_ref(x: &HostTensor, attrs: &tpu_core::op::Attrs) -> OpResult<HostTensor> {
    if x.dtype().is_complex() {
        let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
        let mut a = x.to_complex();
        for &d in dims.iter().rev() {
            a = a.sum_axis(ndarray::Axis(d));
        }
        let n = count(x.dims(), &dims) as f64;
        let mean = HostTensor::complex(x.dtype(), a.mapv(|v| v / n));
        return reshape_to(&mean, &reduced_shape(&x.shape(), &dims, keepdim));
    }
    reduce_f64(x, attrs, x.dtype(), |g| {
        g.iter().sum::<f64>() / g.len() as f64
    })
}

fn mean_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = t.ty(a.inputs[0])?;
    let (dims, _) = reduce_args(&x.shape, a.attrs)?;
    let g = unreduce(t, a.grads[0], &x.shape, &dims)?;
    let n = count(x.shape.dims(), &dims) as f64;
    Ok(vec![Some(t.scale(g, 1.0 / n)?)])
}

inventory::submit! {
    op_def! {
        name: "mean",
        arity: Arity::Exactly(1),
        flags: Flags::REDUCTION,
        dtypes: INEXACT,
        infer: infer_mean,
        lower: |b, x, attrs| Ok(vec![lower_mean(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![mean_ref(one(x)?, attrs)?]),
        vjp: Some(mean_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..10).map(|i| reduce_sample(&mut Gen::new(100 + i), FLOATS)).chain((0..4).map(|i| reduce_sample(&mut Gen::new(140 + i), COMPLEX))).collect(),
        arbitrary: |g: &mut Gen| reduce_sample(g, INEXACT),
        // PyTorch reduces every dim when `dims` is empty, where this op reduces
        // none: that case reduces a new trailing dim of size 1 instead.
        torch: Torch::Expr(r#"(lambda d, k: torch.mean(x[0], d, keepdim=k) if d else torch.mean(x[0].unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#),
    }
}

fn prod_dtype(d: DType) -> DType {
    if d.is_inexact() { d } else { DType::I64 }
}

fn lower_prod(b: &mut Builder, x: &Value, attrs: &tpu_core::op::Attrs) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let out = prod_dtype(x.dtype());
    let xc = b.convert(x, accumulator(out));
    let r = b.reduce(&xc, 1.0, &dims, "stablehlo.multiply");
    let r = b.convert(&r, out);
    Ok(b.reshape(&r, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn prod_ref(x: &HostTensor, attrs: &tpu_core::op::Attrs) -> OpResult<HostTensor> {
    let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
    let out = reduced_shape(&x.shape(), &dims, keepdim);
    match x.data() {
        HostData::Float(a) => {
            let (kept, gs) = groups(a, &dims);
            let values = gs.iter().map(|g| g.iter().product()).collect();
            float_result(x.dtype(), &kept, values, &out)
        }
        HostData::Complex(_) => {
            let mut a = x.to_complex();
            for &d in dims.iter().rev() {
                a = a.map_axis(ndarray::Axis(d), |lane| lane.iter().product());
            }
            reshape_to(&HostTensor::complex(x.dtype(), a), &out)
        }
        HostData::Int(a) => {
            let (kept, gs) = groups(a, &dims);
            let values = gs
                .iter()
                .map(|g| g.iter().fold(1i64, |p, &v| p.wrapping_mul(v)))
                .collect();
            int_result(DType::I64, &kept, values, &out)
        }
    }
}

/// d prod / d x_i is the product of the other values: `prod / x_i` when no
/// value is zero, the product of the non-zero values at the single zero,
/// and 0 everywhere else (conjugated for complex values).
fn prod_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let xv = a.inputs[0];
    let x = t.ty(xv)?;
    if !x.dtype.is_inexact() {
        return Ok(vec![None]);
    }
    let (dims, _) = reduce_args(&x.shape, a.attrs)?;
    let zero = t.full_like(xv, 0.0)?;
    let one = t.full_like(xv, 1.0)?;
    let is0 = call2(t, "eq", xv, zero)?;
    let nz = select(t, is0, one, xv)?;
    let pnz = reduce_call(t, "prod", nz, &dims, true)?;
    let pnz = t.broadcast_to(pnz, &x.shape)?;
    let zeros_f = t.cast(is0, x.dtype)?;
    let nzeros = reduce_call(t, "sum", zeros_f, &dims, true)?;
    let nzeros = t.broadcast_to(nzeros, &x.shape)?;
    let no_zero = call2(t, "eq", nzeros, zero)?;
    let one_zero = call2(t, "eq", nzeros, one)?;
    let here_zero = call2(t, "logical_and", one_zero, is0)?;
    let others = t.div(pnz, nz)?;
    let d = select(t, here_zero, pnz, zero)?;
    let d = select(t, no_zero, others, d)?;
    let d = t.conj(d)?;
    let g = unreduce(t, a.grads[0], &x.shape, &dims)?;
    Ok(vec![Some(t.mul(g, d)?)])
}

/// Values whose products stay in range: magnitudes in [0.55, 1.55) with
/// random signs, small integers, sometimes an exact zero.
#[cfg(feature = "conformance")]
fn prod_sample(g: &mut Gen, dtypes: &[DType]) -> Sample {
    let mut s = reduce_sample(g, dtypes);
    let x = &s.inputs[0];
    let dtype = x.dtype();
    // At most 512 values, so no partial product leaves f32's range.
    let mut dims = x.dims().to_vec();
    while dims.iter().product::<usize>() > 512 {
        if let Some(d) = dims.iter_mut().max() {
            *d = (*d / 2).max(1);
        }
    }
    let shape = tpu_core::Shape::new(dims);
    let t = if dtype.is_complex() {
        // Magnitudes as for floats, at random angles.
        let mag = g.tensor_in(DType::F64, &shape, 0.55, 1.55).to_f64();
        let angle = g.tensor_in(DType::F64, &shape, -3.1, 3.1).to_f64();
        let z = ndarray::Zip::from(&mag)
            .and(&angle)
            .map_collect(|&m, &a| tpu_core::Complex::from_polar(m, a));
        Some(HostTensor::complex(dtype, z))
    } else if dtype.is_float() {
        // E[ln |x|] is about 0 for |x| uniform in [0.55, 1.55).
        let mag = g.tensor_in(DType::F64, &shape, 0.55, 1.55).to_f64();
        let mut v: Vec<f64> = mag.iter().map(|&m| if g.bool() { m } else { -m }).collect();
        if !v.is_empty() && g.below(4) == 0 {
            let i = g.below(v.len());
            v[i] = 0.0;
        }
        HostTensor::from_f64(dtype, shape, v)
    } else {
        let v = g
            .tensor_in(dtype, &shape, -3.0, 4.0)
            .to_i64()
            .iter()
            .copied()
            .collect();
        HostTensor::from_i64(dtype, shape, v)
    };
    if let Some(t) = t {
        s.inputs[0] = t;
    }
    s
}

inventory::submit! {
    op_def! {
        name: "prod",
        arity: Arity::Exactly(1),
        flags: Flags::REDUCTION,
        dtypes: ANY,
        infer: |x, attrs| {
            let t = first(x)?;
            let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
            Ok(vec![TensorType::new(prod_dtype(t.dtype), reduced_shape(&t.shape, &dims, keepdim))])
        },
        lower: |b, x, attrs| Ok(vec![lower_prod(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![prod_ref(one(x)?, attrs)?]),
        vjp: Some(prod_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..10).map(|i| prod_sample(&mut Gen::new(200 + i), NUMERIC)).chain((0..4).map(|i| prod_sample(&mut Gen::new(240 + i), COMPLEX))).collect(),
        arbitrary: |g: &mut Gen| prod_sample(g, ANY),
        // PyTorch reduces every dim when `dims` is empty, where this op reduces
        // none: that case reduces a new trailing dim of size 1 instead.
        // `torch.prod` takes one dim, so the dims are reduced one at a time.
        torch: Torch::Expr(r#"(lambda d, k: (lambda y: y if k else y.squeeze(d))(__import__("functools").reduce(lambda y, i: y.prod(i, keepdim=True), d, x[0].unsqueeze(-1).prod(-1))))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#),
    }
}
