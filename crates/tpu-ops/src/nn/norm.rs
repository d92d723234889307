//! `layer_norm(x[, weight[, bias]]; normalized_dims, eps=1e-5)` and
//! `rms_norm(x[, weight]; normalized_dims, eps=1e-6)`: normalisation over
//! the trailing `normalized_dims` dims (default: the weight's rank, else 1);
//! weight and bias have exactly those trailing dims and `x`'s dtype.
//! f16 and bf16 compute in f32.

#[cfg(feature = "conformance")]
use tpu_core::DType;
use tpu_core::Shape;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use crate::reduce::kit::*;
use crate::support::*;

/// Which normalisation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Layer,
    Rms,
}

impl Kind {
    fn max_inputs(self) -> usize {
        match self {
            Kind::Layer => 3,
            Kind::Rms => 2,
        }
    }

    fn default_eps(self) -> f64 {
        match self {
            Kind::Layer => 1e-5,
            Kind::Rms => 1e-6,
        }
    }
}

/// The normalised (trailing) dims and `eps`, after checking the inputs.
fn norm_args(kind: Kind, inputs: &[TensorType], attrs: &Attrs) -> OpResult<(Vec<usize>, f64)> {
    let x = first(inputs)?;
    if inputs.len() > kind.max_inputs() {
        return Err(invalid!(
            "takes at most {} inputs, got {}",
            kind.max_inputs(),
            inputs.len()
        ));
    }
    require_dtype(x.dtype, FLOATS, "input")?;
    let rank = x.shape.rank();
    let nd = match attrs.int_opt("normalized_dims")? {
        Some(n) => n,
        None => inputs.get(1).map_or(1, |w| w.shape.rank() as i64),
    };
    if nd < 1 || nd > rank as i64 {
        return Err(invalid!(
            "normalized_dims must be in 1..={rank} for an input of rank {rank}, got {nd}"
        ));
    }
    let dims: Vec<usize> = (rank - nd as usize..rank).collect();
    let trailing = &x.shape.dims()[rank - nd as usize..];
    for (i, p) in inputs.iter().enumerate().skip(1) {
        let what = if i == 1 { "weight" } else { "bias" };
        if p.shape.dims() != trailing {
            return Err(invalid!(
                "{what} shape {} must equal the normalized shape {}",
                p.shape,
                Shape::from(trailing)
            ));
        }
        if p.dtype != x.dtype {
            return Err(invalid!(
                "{what} dtype {} must match the input dtype {}",
                p.dtype,
                x.dtype
            ));
        }
    }
    let eps = attrs.float_or("eps", kind.default_eps())?;
    // Any finite eps, as in PyTorch (a negative one can make the variance
    // term negative, which gives NaN there as it does on CPU).
    if !eps.is_finite() {
        return Err(invalid!("eps must be finite, got {eps}"));
    }
    Ok((dims, eps))
}

fn lower_norm(kind: Kind, b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Value> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let (dims, eps) = norm_args(kind, &types, attrs)?;
    let dt = x[0].dtype();
    let acc = accumulator(dt);
    let xc = b.convert(&x[0], acc);
    let n = count(xc.dims(), &dims) as f64;
    let centred = if kind == Kind::Layer {
        centre(b, &xc, &dims).0
    } else {
        xc.clone()
    };
    let sq = bin(b, "multiply", &centred, &centred);
    let ss = sum_in(b, &sq, &dims);
    let ms = scale_by(b, &ss, 1.0 / n);
    let e = splat(b, &ms, eps);
    let ms = bin(b, "add", &ms, &e);
    let r = b.unary("stablehlo.rsqrt", &ms);
    let rb = expand(b, &r, xc.dims(), &dims);
    let mut y = bin(b, "multiply", &centred, &rb);
    if let Some(w) = x.get(1) {
        let w = b.convert(w, acc);
        let wb = b.broadcast_to(&w, xc.dims());
        y = bin(b, "multiply", &y, &wb);
    }
    if let Some(bias) = x.get(2) {
        let bias = b.convert(bias, acc);
        let bb = b.broadcast_to(&bias, xc.dims());
        y = bin(b, "add", &y, &bb);
    }
    Ok(b.convert(&y, dt))
}

fn norm_ref(kind: Kind, x: &[HostTensor], attrs: &Attrs) -> OpResult<HostTensor> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let (dims, eps) = norm_args(kind, &types, attrs)?;
    let xt = one(x)?;
    let n = count(xt.dims(), &dims);
    let w: Option<Vec<f64>> = x.get(1).map(|w| w.to_f64().iter().copied().collect());
    let bias: Option<Vec<f64>> = x.get(2).map(|b| b.to_f64().iter().copied().collect());
    let values: Vec<f64> = xt.to_f64().iter().copied().collect();
    let mut out = Vec::with_capacity(values.len());
    if n > 0 {
        for group in values.chunks(n) {
            let mean = if kind == Kind::Layer {
                group.iter().sum::<f64>() / n as f64
            } else {
                0.0
            };
            let ms = group.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            let r = 1.0 / (ms + eps).sqrt();
            for (j, v) in group.iter().enumerate() {
                let mut y = (v - mean) * r;
                if let Some(w) = &w {
                    y *= w[j];
                }
                if let Some(b) = &bias {
                    y += b[j];
                }
                out.push(y);
            }
        }
    }
    tensor_f64(xt.dtype(), xt.dims(), out)
}

/// layer_norm: `dx = rstd (gy - mean(gy) - xhat mean(gy xhat))`;
/// rms_norm: `dx = r gy - x r^3 mean(gy x)`; with `gy = g * weight`.
fn norm_vjp(kind: Kind, t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let types = a
        .inputs
        .iter()
        .map(|&v| t.ty(v))
        .collect::<OpResult<Vec<TensorType>>>()?;
    let (dims, eps) = norm_args(kind, &types, a.attrs)?;
    let (x, g) = (a.inputs[0], a.grads[0]);
    let centred = if kind == Kind::Layer {
        let mean = reduce_call(t, "mean", x, &dims, true)?;
        t.sub(x, mean)?
    } else {
        x
    };
    let sq = t.mul(centred, centred)?;
    let ms = reduce_call(t, "mean", sq, &dims, true)?;
    let e = t.full_like(ms, eps)?;
    let ms = t.add(ms, e)?;
    let r = t.unary("rsqrt", ms)?;
    let xhat = t.mul(centred, r)?;
    let gy = match a.inputs.get(1) {
        Some(&w) => t.mul(g, w)?,
        None => g,
    };
    let gyx = t.mul(gy, xhat)?;
    let m2 = reduce_call(t, "mean", gyx, &dims, true)?;
    let xm2 = t.mul(xhat, m2)?;
    let inner = if kind == Kind::Layer {
        let m1 = reduce_call(t, "mean", gy, &dims, true)?;
        let d = t.sub(gy, m1)?;
        t.sub(d, xm2)?
    } else {
        t.sub(gy, xm2)?
    };
    let dx = t.mul(inner, r)?;
    let mut grads = vec![Some(dx)];
    if let Some(&w) = a.inputs.get(1) {
        let shape = t.ty(w)?.shape;
        let gx = t.mul(g, xhat)?;
        grads.push(Some(t.sum_to(gx, &shape)?));
    }
    if let Some(&bias) = a.inputs.get(2) {
        let shape = t.ty(bias)?.shape;
        grads.push(Some(t.sum_to(g, &shape)?));
    }
    Ok(grads)
}

#[cfg(feature = "conformance")]
fn norm_sample(kind: Kind, g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let shape = g.shape(1, 4);
    let rank = shape.rank();
    let nd = 1 + g.below(rank);
    let x = g.tensor(dtype, &shape);
    let trailing = Shape::from(&shape.dims()[rank - nd..]);
    let mut inputs = vec![x];
    let params = g.below(kind.max_inputs());
    for _ in 0..params {
        inputs.push(g.tensor_in(dtype, &trailing, -2.0, 2.0));
    }
    let mut attrs = Attrs::new();
    if params == 0 || g.bool() {
        attrs.set("normalized_dims", nd as i64);
    }
    if g.below(3) == 0 {
        attrs.set("eps", 1e-3);
    }
    Sample::new(inputs, attrs)
}

#[cfg(feature = "conformance")]
fn norm_samples(kind: Kind) -> Vec<Sample> {
    let mut s: Vec<Sample> = (0..12)
        .map(|i| norm_sample(kind, &mut Gen::new(1000 + i)))
        .collect();
    let mut g = Gen::new(1099);
    let x = g.tensor(DType::BF16, &Shape::from([3, 127]));
    let w = g.tensor(DType::BF16, &Shape::from([127]));
    s.push(Sample::new(vec![x, w], Attrs::new()));
    let x = g.tensor(DType::F32, &Shape::from([0, 4]));
    s.push(Sample::new(
        vec![x],
        Attrs::new().with("normalized_dims", 1i64),
    ));
    s
}

inventory::submit! {
    op_def! {
        name: "layer_norm",
        arity: Arity::AtLeast(1),
        dtypes: FLOATS,
        infer: |x, attrs| {
            norm_args(Kind::Layer, x, attrs)?;
            Ok(vec![first(x)?.clone()])
        },
        lower: |b, x, attrs| Ok(vec![lower_norm(Kind::Layer, b, x, attrs)?]),
        reference: |x, attrs| Ok(vec![norm_ref(Kind::Layer, x, attrs)?]),
        vjp: Some(|t, a| norm_vjp(Kind::Layer, t, a)),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || norm_samples(Kind::Layer),
        arbitrary: |g: &mut Gen| norm_sample(Kind::Layer, g),
        torch: Torch::Expr(r#"F.layer_norm(x[0], x[0].shape[x[0].dim() - a.get("normalized_dims", x[1].dim() if len(x) > 1 else 1):], *x[1:], eps=a.get("eps", 1e-5))"#),
    }
}

inventory::submit! {
    op_def! {
        name: "rms_norm",
        arity: Arity::AtLeast(1),
        dtypes: FLOATS,
        infer: |x, attrs| {
            norm_args(Kind::Rms, x, attrs)?;
            Ok(vec![first(x)?.clone()])
        },
        lower: |b, x, attrs| Ok(vec![lower_norm(Kind::Rms, b, x, attrs)?]),
        reference: |x, attrs| Ok(vec![norm_ref(Kind::Rms, x, attrs)?]),
        vjp: Some(|t, a| norm_vjp(Kind::Rms, t, a)),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || norm_samples(Kind::Rms),
        arbitrary: |g: &mut Gen| norm_sample(Kind::Rms, g),
        torch: Torch::Expr(r#"F.rms_norm(x[0], x[0].shape[x[0].dim() - a.get("normalized_dims", x[1].dim() if len(x) > 1 else 1):], *x[1:], eps=a.get("eps", 1e-6))"#),
    }
}
