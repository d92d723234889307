//! `logsumexp` over dims (integers promote to f32, as in PyTorch), and
//! `softmax` / `log_softmax` along one dim (float inputs). All subtract the
//! maximum first; f16 and bf16 compute in f32.

use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::kit::*;
use crate::support::*;

fn lower_logsumexp(b: &mut Builder, x: &Value, attrs: &Attrs) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let out = to_float(x.dtype());
    let xc = b.convert(x, accumulator(out));
    let m = max_in(b, &xc, &dims);
    // An infinite maximum shifts by 0 instead (PyTorch), so -inf rows give
    // -inf rather than NaN.
    let am = b.unary("stablehlo.abs", &m);
    let inf = splat(b, &m, f64::INFINITY);
    let is_inf = b.compare(Compare::Eq, &am, &inf);
    let zero = splat(b, &m, 0.0);
    let m = b.select(&is_inf, &zero, &m);
    let mb = expand(b, &m, xc.dims(), &dims);
    let z = bin(b, "subtract", &xc, &mb);
    let e = b.unary("stablehlo.exponential", &z);
    let s = sum_in(b, &e, &dims);
    let l = b.unary("stablehlo.log", &s);
    let r = bin(b, "add", &l, &m);
    let r = b.convert(&r, out);
    Ok(b.reshape(&r, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn logsumexp_ref(x: &HostTensor, attrs: &Attrs) -> OpResult<HostTensor> {
    reduce_f64(x, attrs, to_float(x.dtype()), logsumexp_of)
}

fn logsumexp_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let Some(Unreduced { x, y, g, .. }) = unreduced(t, a)? else {
        return Ok(vec![None]);
    };
    let z = t.sub(x, y)?;
    let p = t.unary("exp", z)?;
    Ok(vec![Some(t.mul(g, p)?)])
}

inventory::submit! {
    op_def! {
        name: "logsumexp",
        arity: Arity::Exactly(1),
        flags: Flags::REDUCTION,
        dtypes: NUMERIC,
        infer: |x, attrs| {
            let t = first(x)?;
            require_dtype(t.dtype, NUMERIC, "input")?;
            let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
            Ok(vec![TensorType::new(to_float(t.dtype), reduced_shape(&t.shape, &dims, keepdim))])
        },
        lower: |b, x, attrs| Ok(vec![lower_logsumexp(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![logsumexp_ref(one(x)?, attrs)?]),
        vjp: Some(logsumexp_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || {
            let mut s: Vec<Sample> =
                (0..10).map(|i| reduce_sample(&mut Gen::new(700 + i), NUMERIC)).collect();
            // Large values that overflow without the shift.
            let mut g = Gen::new(707);
            let big = g.tensor_in(tpu_core::DType::F32, &tpu_core::Shape::from([3, 5]), 80.0, 120.0);
            s.push(Sample::new(vec![big], Attrs::new().with("dims", vec![1i64])));
            s
        },
        arbitrary: |g: &mut Gen| reduce_sample(g, NUMERIC),
        // PyTorch reduces every dim when `dims` is empty, where this op reduces
        // none: that case reduces a new trailing dim of size 1 instead.
        torch: Torch::Expr(r#"(lambda d, k: torch.logsumexp(x[0], d, keepdim=k) if d else torch.logsumexp(x[0].unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#),
    }
}

/// The one dim of a softmax (empty for a rank-0 input).
fn softmax_dims(rank: usize, attrs: &Attrs) -> OpResult<Vec<usize>> {
    let d = normalize_dim_scalar_ok(attrs.int("dim")?, rank)?;
    Ok(if rank == 0 { vec![] } else { vec![d] })
}

fn infer_softmax(inputs: &[TensorType], attrs: &Attrs) -> OpResult<Vec<TensorType>> {
    let t = first(inputs)?;
    require_dtype(t.dtype, FLOATS, "input (softmax needs a float dtype)")?;
    softmax_dims(t.shape.rank(), attrs)?;
    Ok(vec![t.clone()])
}

fn lower_softmax(b: &mut Builder, x: &Value, attrs: &Attrs, log: bool) -> OpResult<Value> {
    let dims = softmax_dims(x.rank(), attrs)?;
    let xc = b.convert(x, accumulator(x.dtype()));
    let y = if log {
        log_softmax_in(b, &xc, &dims)
    } else {
        softmax_in(b, &xc, &dims)
    };
    Ok(b.convert(&y, x.dtype()))
}

fn softmax_ref(x: &HostTensor, attrs: &Attrs, log: bool) -> OpResult<HostTensor> {
    let dims = softmax_dims(x.shape().rank(), attrs)?;
    let d = dims.first().copied().unwrap_or(0);
    let f = if log { log_softmax_of } else { softmax_of };
    Ok(HostTensor::float(x.dtype(), along(&x.to_f64(), d, f)))
}

/// softmax: `y * (g - sum(g * y))`; log_softmax: `g - exp(y) * sum(g)`.
fn softmax_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, log: bool) -> OpResult<Vec<Option<Var>>> {
    let x = t.ty(a.inputs[0])?;
    let dims = softmax_dims(x.shape.rank(), a.attrs)?;
    let (y, g) = (a.outputs[0], a.grads[0]);
    let grad = if log {
        let s = reduce_call(t, "sum", g, &dims, true)?;
        let p = t.unary("exp", y)?;
        let ps = t.mul(p, s)?;
        t.sub(g, ps)?
    } else {
        let gy = t.mul(g, y)?;
        let s = reduce_call(t, "sum", gy, &dims, true)?;
        let ys = t.mul(y, s)?;
        t.sub(gy, ys)?
    };
    Ok(vec![Some(grad)])
}

#[cfg(feature = "conformance")]
fn softmax_samples() -> Vec<Sample> {
    let mut s: Vec<Sample> = (0..10)
        .map(|i| dim_sample(&mut Gen::new(800 + i), FLOATS, -3.0, 3.0))
        .collect();
    let mut g = Gen::new(808);
    let big = g.tensor_in(
        tpu_core::DType::F32,
        &tpu_core::Shape::from([4, 7]),
        50.0,
        200.0,
    );
    s.push(Sample::new(vec![big], Attrs::new().with("dim", -1i64)));
    let long = g.tensor(tpu_core::DType::BF16, &tpu_core::Shape::from([2, 127]));
    s.push(Sample::new(vec![long], Attrs::new().with("dim", 1i64)));
    s
}

macro_rules! softmax_op {
    ($name:literal, $log:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                dtypes: FLOATS,
                infer: infer_softmax,
                lower: |b, x, attrs| Ok(vec![lower_softmax(b, &x[0], attrs, $log)?]),
                reference: |x, attrs| Ok(vec![softmax_ref(one(x)?, attrs, $log)?]),
                vjp: Some(|t, a| softmax_vjp(t, a, $log)),
                tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
                samples: softmax_samples,
                arbitrary: |g: &mut Gen| dim_sample(g, FLOATS, -3.0, 3.0),
                torch: Torch::Expr($torch),
            }
        }
    };
}

softmax_op!("softmax", false, torch: r#"torch.softmax(x[0], a["dim"])"#);
softmax_op!("log_softmax", true, torch: r#"torch.log_softmax(x[0], a["dim"])"#);
