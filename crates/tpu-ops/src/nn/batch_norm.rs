//! `batch_norm(x, weight, bias, running_mean, running_var; training=false,
//! momentum=0.1, eps=1e-5) -> (y, new_running_mean, new_running_var)` over
//! `x` of shape `(N, C, ...)` with per-channel parameters of shape `(C)`, all
//! of one float dtype. Training normalises with the batch statistics (biased
//! variance) and updates the running ones with the unbiased variance, as
//! PyTorch; one value per channel is an error, and an empty batch leaves the
//! running statistics unchanged. Evaluation normalises with the running
//! statistics and returns them unchanged. f16 and bf16 compute in f32.

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

struct BnArgs {
    /// The dims statistics reduce over: all but 1.
    dims: Vec<usize>,
    /// Values per channel.
    count: usize,
    training: bool,
    momentum: f64,
    eps: f64,
}

fn bn_args(inputs: &[TensorType], attrs: &Attrs) -> OpResult<BnArgs> {
    let [x, params @ ..] = inputs else {
        return Err("missing input".into());
    };
    if params.len() != 4 {
        return Err("takes (x, weight, bias, running_mean, running_var)".into());
    }
    require_dtype(x.dtype, FLOATS, "input")?;
    let rank = x.shape.rank();
    if rank < 2 {
        return Err(invalid!("input must be (N, C, ...), got {}", x.shape));
    }
    let c = x.shape.dims()[1];
    let names = ["weight", "bias", "running_mean", "running_var"];
    for (p, what) in params.iter().zip(names) {
        if p.shape != Shape::from([c]) {
            return Err(invalid!("{what} must have shape [{c}], got {}", p.shape));
        }
        if p.dtype != x.dtype {
            return Err(invalid!(
                "{what} dtype {} must match the input dtype {}",
                p.dtype,
                x.dtype
            ));
        }
    }
    let dims: Vec<usize> = (0..rank).filter(|&d| d != 1).collect();
    let count = count(x.shape.dims(), &dims);
    let training = attrs.bool_or("training", false)?;
    if training && count == 1 {
        return Err(invalid!(
            "expected more than 1 value per channel when training, got input {}",
            x.shape
        ));
    }
    let momentum = attrs.float_or("momentum", 0.1)?;
    let eps = attrs.float_or("eps", 1e-5)?;
    if !momentum.is_finite() || !eps.is_finite() || eps < 0.0 {
        return Err(invalid!(
            "momentum must be finite and eps finite and >= 0, got {momentum} and {eps}"
        ));
    }
    Ok(BnArgs {
        dims,
        count,
        training,
        momentum,
        eps,
    })
}

fn lower_bn(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Vec<Value>> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let a = bn_args(&types, attrs)?;
    let dt = x[0].dtype();
    let acc = accumulator(dt);
    let full = x[0].dims().to_vec();
    let c: Vec<Value> = x.iter().map(|v| b.convert(v, acc)).collect();
    let (xc, w, bias, rm, rv) = (&c[0], &c[1], &c[2], &c[3], &c[4]);
    let chan = |b: &mut Builder, v: &Value| b.broadcast_in_dim(v, &full, &[1]);
    let n = a.count as f64;
    let (centred, r, new_rm, new_rv) = if a.training {
        let (xm, mean) = centre(b, xc, &a.dims);
        let sq = bin(b, "multiply", &xm, &xm);
        let ss = sum_in(b, &sq, &a.dims);
        let var = scale_by(b, &ss, 1.0 / n);
        let e = splat(b, &var, a.eps);
        let ve = bin(b, "add", &var, &e);
        let r = b.unary("stablehlo.rsqrt", &ve);
        let (new_rm, new_rv) = if a.count == 0 {
            (rm.clone(), rv.clone())
        } else {
            let m = a.momentum;
            let old_m = scale_by(b, rm, 1.0 - m);
            let new_m = scale_by(b, &mean, m);
            let old_v = scale_by(b, rv, 1.0 - m);
            let unbiased = scale_by(b, &ss, m / (n - 1.0));
            (
                bin(b, "add", &old_m, &new_m),
                bin(b, "add", &old_v, &unbiased),
            )
        };
        (xm, r, new_rm, new_rv)
    } else {
        let mb = chan(b, rm);
        let xm = bin(b, "subtract", xc, &mb);
        let e = splat(b, rv, a.eps);
        let ve = bin(b, "add", rv, &e);
        let r = b.unary("stablehlo.rsqrt", &ve);
        (xm, r, rm.clone(), rv.clone())
    };
    let rb = chan(b, &r);
    let y = bin(b, "multiply", &centred, &rb);
    let wb = chan(b, w);
    let y = bin(b, "multiply", &y, &wb);
    let bb = chan(b, bias);
    let y = bin(b, "add", &y, &bb);
    Ok(vec![
        b.convert(&y, dt),
        b.convert(&new_rm, dt),
        b.convert(&new_rv, dt),
    ])
}

fn bn_ref(x: &[HostTensor], attrs: &Attrs) -> OpResult<Vec<HostTensor>> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let a = bn_args(&types, attrs)?;
    let dt = x[0].dtype();
    let vec = |t: &HostTensor| -> Vec<f64> { t.to_f64().iter().copied().collect() };
    let (w, bias, rm, rv) = (vec(&x[1]), vec(&x[2]), vec(&x[3]), vec(&x[4]));
    let xs = x[0].to_f64();
    // One group per channel, in the channel's row-major order.
    let (_, chans) = groups(&xs, &a.dims);
    let n = a.count as f64;
    let mut mean = rm.clone();
    let mut var = rv.clone();
    let (mut new_rm, mut new_rv) = (rm.clone(), rv.clone());
    if a.training {
        for (ch, g) in chans.iter().enumerate() {
            let m = g.iter().sum::<f64>() / n;
            let ss: f64 = g.iter().map(|v| (v - m) * (v - m)).sum();
            mean[ch] = m;
            var[ch] = ss / n;
            if a.count > 0 {
                new_rm[ch] = (1.0 - a.momentum) * rm[ch] + a.momentum * m;
                new_rv[ch] = (1.0 - a.momentum) * rv[ch] + a.momentum * ss / (n - 1.0);
            }
        }
    }
    let mut y = xs.clone();
    for (ix, v) in y.indexed_iter_mut() {
        let ch = ix[1];
        *v = (*v - mean[ch]) / (var[ch] + a.eps).sqrt() * w[ch] + bias[ch];
    }
    let c = x[1].dims().to_vec();
    Ok(vec![
        HostTensor::float(dt, y),
        tensor_f64(dt, &c, new_rm)?,
        tensor_f64(dt, &c, new_rv)?,
    ])
}

/// Training: the layer-norm-like backward over each channel plus the
/// running-statistics terms (`momentum / count` for the mean, `2 momentum
/// (x - mean) / (count - 1)` for the variance). Evaluation: an affine map
/// of `x` per channel.
fn bn_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let types = a
        .inputs
        .iter()
        .map(|&v| t.ty(v))
        .collect::<OpResult<Vec<TensorType>>>()?;
    let args = bn_args(&types, a.attrs)?;
    let [x, w, _bias, rm, rv] = a.inputs else {
        return Err("takes five inputs".into());
    };
    let [gy, grm, grv] = a.grads else {
        return Err("expected three output gradients".into());
    };
    let (x, w, rm, rv, gy, grm, grv) = (*x, *w, *rm, *rv, *gy, *grm, *grv);
    let rank = types[0].shape.rank();
    let c = types[1].shape.dims()[0];
    let mut cshape = vec![1; rank];
    cshape[1] = c;
    let cshape = Shape::new(cshape);
    let dims = &args.dims;
    let m = args.momentum;
    let wc = t.reshape(w, &cshape)?;
    let db = reduce_call(t, "sum", gy, dims, false)?;
    if args.training {
        if args.count == 0 {
            let dx = t.full_like(x, 0.0)?;
            let dw = t.full_like(w, 0.0)?;
            return Ok(vec![Some(dx), Some(dw), Some(db), Some(grm), Some(grv)]);
        }
        let n = args.count as f64;
        let mean = reduce_call(t, "mean", x, dims, true)?;
        let xm = t.sub(x, mean)?;
        let sq = t.mul(xm, xm)?;
        let var = reduce_call(t, "mean", sq, dims, true)?;
        let e = t.full_like(var, args.eps)?;
        let ve = t.add(var, e)?;
        let r = t.unary("rsqrt", ve)?;
        let xhat = t.mul(xm, r)?;
        let g = t.mul(gy, wc)?;
        let m1 = reduce_call(t, "mean", g, dims, true)?;
        let gx = t.mul(g, xhat)?;
        let m2 = reduce_call(t, "mean", gx, dims, true)?;
        let d = t.sub(g, m1)?;
        let xm2 = t.mul(xhat, m2)?;
        let d = t.sub(d, xm2)?;
        let mut dx = t.mul(d, r)?;
        let grm_c = t.reshape(grm, &cshape)?;
        let from_mean = t.scale(grm_c, m / n)?;
        dx = t.add(dx, from_mean)?;
        let grv_c = t.reshape(grv, &cshape)?;
        let from_var = t.mul(grv_c, xm)?;
        let from_var = t.scale(from_var, 2.0 * m / (n - 1.0))?;
        dx = t.add(dx, from_var)?;
        let dx = t.broadcast_to(dx, &types[0].shape)?;
        let gyx = t.mul(gy, xhat)?;
        let dw = reduce_call(t, "sum", gyx, dims, false)?;
        let drm = t.scale(grm, 1.0 - m)?;
        let drv = t.scale(grv, 1.0 - m)?;
        Ok(vec![Some(dx), Some(dw), Some(db), Some(drm), Some(drv)])
    } else {
        let e = t.full_like(rv, args.eps)?;
        let ve = t.add(rv, e)?;
        let r = t.unary("rsqrt", ve)?;
        let wr = t.mul(w, r)?;
        let wr_c = t.reshape(wr, &cshape)?;
        let dx = t.mul(gy, wr_c)?;
        let rm_c = t.reshape(rm, &cshape)?;
        let xm = t.sub(x, rm_c)?;
        let r_c = t.reshape(r, &cshape)?;
        let xhat = t.mul(xm, r_c)?;
        let gyx = t.mul(gy, xhat)?;
        let dw = reduce_call(t, "sum", gyx, dims, false)?;
        // d/d rm = -sum(gy) w r; d/d rv = -sum(gy (x - rm)) w r^3 / 2.
        let neg = t.mul(db, wr)?;
        let neg = t.neg(neg)?;
        let drm = t.add(neg, grm)?;
        let gxm = t.mul(gy, xm)?;
        let sxm = reduce_call(t, "sum", gxm, dims, false)?;
        let r2 = t.mul(r, r)?;
        let r3w = t.mul(r2, wr)?;
        let v = t.mul(sxm, r3w)?;
        let v = t.scale(v, -0.5)?;
        let drv = t.add(v, grv)?;
        Ok(vec![Some(dx), Some(dw), Some(db), Some(drm), Some(drv)])
    }
}

#[cfg(feature = "conformance")]
fn bn_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let mut shape = g.shape(2, 4).dims().to_vec();
    let training = g.bool();
    if training {
        // More than one value per channel.
        let others: usize = shape
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != 1)
            .map(|(_, &d)| d)
            .product();
        if others == 1 {
            shape[0] = 2;
        }
    }
    let shape = Shape::new(shape);
    let c = Shape::from([shape.dims()[1]]);
    let x = g.tensor(dtype, &shape);
    let w = g.tensor_in(dtype, &c, -2.0, 2.0);
    let bias = g.tensor(dtype, &c);
    let rm = g.tensor_in(dtype, &c, -1.0, 1.0);
    let rv = g.tensor_in(dtype, &c, 0.5, 2.0);
    let mut attrs = Attrs::new().with("training", training);
    if g.bool() {
        attrs.set("momentum", g.pick(&[0.0, 0.3, 1.0]));
    }
    if g.below(3) == 0 {
        attrs.set("eps", 1e-3);
    }
    Sample::new(vec![x, w, bias, rm, rv], attrs)
}

#[cfg(feature = "conformance")]
fn bn_samples() -> Vec<Sample> {
    let mut s: Vec<Sample> = (0..14)
        .map(|i| bn_sample(&mut Gen::new(1400 + i)))
        .collect();
    let mut g = Gen::new(1499);
    let f = DType::F32;
    let c = Shape::from([3]);
    let params = |g: &mut Gen| {
        vec![
            g.tensor(f, &c),
            g.tensor(f, &c),
            g.tensor(f, &c),
            g.tensor_in(f, &c, 0.5, 2.0),
        ]
    };
    for (dims, training) in [
        (vec![0, 3, 4], true),
        (vec![0, 3], false),
        (vec![8, 3, 127], true),
    ] {
        let mut inputs = vec![g.tensor(f, &Shape::new(dims))];
        inputs.extend(params(&mut g));
        s.push(Sample::new(inputs, Attrs::new().with("training", training)));
    }
    s
}

inventory::submit! {
    op_def! {
        name: "batch_norm",
        arity: Arity::Exactly(5),
        dtypes: FLOATS,
        infer: |x, attrs| {
            bn_args(x, attrs)?;
            Ok(vec![x[0].clone(), x[3].clone(), x[4].clone()])
        },
        lower: lower_bn,
        reference: bn_ref,
        vjp: Some(bn_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: bn_samples,
        arbitrary: bn_sample,
        // F.batch_norm updates the running statistics in place, outside
        // autograd; here they are computed as outputs.
        torch: Torch::Expr(r#"(lambda c, dims, m, eps: (F.batch_norm(x[0], None, None, x[1], x[2], True, 0.0, eps), (1 - m) * x[3] + m * x[0].mean(dims), (1 - m) * x[4] + m * x[0].var(dims)) if a.get("training", False) and x[0].numel() else ((x[0] - x[3].reshape(c)) * torch.rsqrt(x[4].reshape(c) + eps) * x[1].reshape(c) + x[2].reshape(c), x[3], x[4]))([1, -1] + [1] * (x[0].dim() - 2), [0, *range(2, x[0].dim())], a.get("momentum", 0.1), a.get("eps", 1e-5))"#),
    }
}
