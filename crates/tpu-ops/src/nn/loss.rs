//! `cross_entropy(logits, target; ignore_index=-100, label_smoothing=0,
//! reduction="mean")` and `nll_loss(log_probs, target; ignore_index=-100,
//! reduction="mean")` with class-index targets (i64 or i32), as in PyTorch:
//! logits are `(C)` with a scalar target or `(N, C, d...)` with target
//! `(N, d...)`; targets equal to `ignore_index` contribute nothing and
//! "mean" divides by the number of the others (NaN when there are none).
//! A target outside `[0, C)` that is not ignored (PyTorch raises) picks
//! nothing: its negative log-likelihood term is 0.

use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, IndexBound, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};
use tpu_core::{DType, Shape};

use crate::reduce::kit::*;
use crate::support::*;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

/// Everything a loss call needs, checked.
struct LossArgs {
    /// The class dimension of the input (0 or 1).
    class_dim: usize,
    /// Number of classes.
    classes: usize,
    /// Shape of the target (the input without the class dim).
    target: Shape,
    ignore_index: i64,
    smoothing: f64,
    reduction: Reduction,
}

fn loss_args(inputs: &[TensorType], attrs: &Attrs, smoothing_ok: bool) -> OpResult<LossArgs> {
    let [x, t] = inputs else {
        return Err("takes (input, target)".into());
    };
    require_dtype(x.dtype, FLOATS, "input")?;
    require_index_dtype(t.dtype, &[DType::I64, DType::I32], "target (class indices)")?;
    let rank = x.shape.rank();
    if rank == 0 {
        return Err("input must have a class dimension: (C) or (N, C, ...)".into());
    }
    let class_dim = usize::from(rank >= 2);
    let classes = x.shape.dims()[class_dim];
    if classes == 0 {
        return Err("input has no classes (class dimension of size 0)".into());
    }
    let target = reduced_shape(&x.shape, &[class_dim], false);
    if t.shape != target {
        return Err(invalid!(
            "target shape {} must be the input shape {} without the class dim, {target}",
            t.shape,
            x.shape
        ));
    }
    let smoothing = if smoothing_ok {
        attrs.float_or("label_smoothing", 0.0)?
    } else {
        0.0
    };
    if !(0.0..=1.0).contains(&smoothing) {
        return Err(invalid!(
            "label_smoothing must be in [0, 1], got {smoothing}"
        ));
    }
    let reduction = match attrs.str_or("reduction", "mean")? {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        other => {
            return Err(invalid!(
                "reduction must be \"none\", \"sum\" or \"mean\", got {other:?}"
            ));
        }
    };
    Ok(LossArgs {
        class_dim,
        classes,
        target,
        ignore_index: attrs.int_or("ignore_index", -100)?,
        smoothing,
        reduction,
    })
}

/// The target's class indices: `0..classes`, or `ignore_index`.
fn target_classes(inputs: &[TensorType], attrs: &Attrs) -> Vec<IndexBound> {
    loss_args(inputs, attrs, true)
        .map(|a| {
            vec![IndexBound {
                ignore: Some(a.ignore_index),
                ..IndexBound::new(1, a.classes, "classes")
            }]
        })
        .unwrap_or_default()
}

fn infer_loss(
    inputs: &[TensorType],
    attrs: &Attrs,
    smoothing_ok: bool,
) -> OpResult<Vec<TensorType>> {
    let a = loss_args(inputs, attrs, smoothing_ok)?;
    let shape = match a.reduction {
        Reduction::None => a.target,
        _ => Shape::scalar(),
    };
    Ok(vec![TensorType::new(inputs[0].dtype, shape)])
}

/// `log_softmax` first (cross_entropy) or not (nll_loss).
fn lower_loss(b: &mut Builder, x: &[Value], attrs: &Attrs, softmax: bool) -> OpResult<Value> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let a = loss_args(&types, attrs, softmax)?;
    let cd = [a.class_dim];
    let dt = x[0].dtype();
    let xc = b.convert(&x[0], accumulator(dt));
    let lp = if softmax {
        log_softmax_in(b, &xc, &cd)
    } else {
        xc
    };
    let tgt = b.convert(&x[1], DType::I64);
    let idx = b.iota(DType::I64, lp.dims(), a.class_dim);
    let tb = expand(b, &tgt, lp.dims(), &cd);
    let hit = b.compare(Compare::Eq, &idx, &tb);
    let zero = splat(b, &lp, 0.0);
    let picked = b.select(&hit, &lp, &zero);
    let picked = sum_in(b, &picked, &cd);
    let mut loss = b.unary("stablehlo.negate", &picked);
    if a.smoothing > 0.0 {
        let total = sum_in(b, &lp, &cd);
        let smooth = scale_by(b, &total, -a.smoothing / a.classes as f64);
        let nll = scale_by(b, &loss, 1.0 - a.smoothing);
        loss = bin(b, "add", &nll, &smooth);
    }
    let ignore = b.constant(DType::I64, tgt.dims(), a.ignore_index as f64);
    let valid = b.compare(Compare::Ne, &tgt, &ignore);
    let zero = splat(b, &loss, 0.0);
    let loss = b.select(&valid, &loss, &zero);
    let all: Vec<usize> = (0..loss.rank()).collect();
    let out = match a.reduction {
        Reduction::None => loss,
        Reduction::Sum => sum_in(b, &loss, &all),
        Reduction::Mean => {
            let s = sum_in(b, &loss, &all);
            let v = b.convert(&valid, s.dtype());
            let n = sum_in(b, &v, &all);
            bin(b, "divide", &s, &n)
        }
    };
    Ok(b.convert(&out, dt))
}

fn loss_ref(x: &[HostTensor], attrs: &Attrs, softmax: bool) -> OpResult<HostTensor> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let a = loss_args(&types, attrs, softmax)?;
    let (_, rows) = groups(&x[0].to_f64(), &[a.class_dim]);
    let targets: Vec<i64> = x[1].to_i64().iter().copied().collect();
    let c = a.classes as f64;
    let mut losses = Vec::with_capacity(targets.len());
    let mut valid = 0usize;
    for (row, &t) in rows.iter().zip(&targets) {
        if t == a.ignore_index {
            losses.push(0.0);
            continue;
        }
        valid += 1;
        let lp = if softmax {
            log_softmax_of(row)
        } else {
            row.clone()
        };
        let picked = usize::try_from(t)
            .ok()
            .and_then(|i| lp.get(i).copied())
            .unwrap_or(0.0);
        let mut loss = -picked;
        if a.smoothing > 0.0 {
            loss = (1.0 - a.smoothing) * loss - a.smoothing / c * lp.iter().sum::<f64>();
        }
        losses.push(loss);
    }
    let dtype = x[0].dtype();
    match a.reduction {
        Reduction::None => tensor_f64(dtype, a.target.dims(), losses),
        Reduction::Sum => Ok(HostTensor::scalar(dtype, losses.iter().sum())),
        Reduction::Mean => Ok(HostTensor::scalar(
            dtype,
            losses.iter().sum::<f64>() / valid as f64,
        )),
    }
}

/// The one-hot encoding of `target` along the class dim of `like`'s shape,
/// as floats of `like`'s dtype.
fn one_hot(t: &mut dyn Tape, target: Var, like: Var, class_dim: usize) -> OpResult<Var> {
    let ty = t.ty(like)?;
    let kept = reduced_shape(&ty.shape, &[class_dim], true);
    let idx = t.call1(
        "iota",
        &[],
        Attrs::new()
            .with("shape", ty.shape.dims())
            .with("dim", class_dim)
            .with("dtype", DType::I64),
    )?;
    let tgt = t.cast(target, DType::I64)?;
    let tgt = t.reshape(tgt, &kept)?;
    let hit = call2(t, "eq", idx, tgt)?;
    t.cast(hit, ty.dtype)
}

/// d loss_i / d logits = c_i (s_i p - q) for cross_entropy (q the smoothed
/// one-hot, s_i its sum) and -c_i onehot for nll_loss, where c_i is the
/// incoming gradient of row i (0 for ignored rows, divided by the count of
/// the others for "mean").
fn loss_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, softmax: bool) -> OpResult<Vec<Option<Var>>> {
    let (x, target) = (a.inputs[0], a.inputs[1]);
    let types = [t.ty(x)?, t.ty(target)?];
    let args = loss_args(&types, a.attrs, softmax)?;
    let dtype = types[0].dtype;
    let tgt = t.cast(target, DType::I64)?;
    let ignore = t.full(DType::I64, &args.target, args.ignore_index as f64)?;
    let valid = call2(t, "ne", tgt, ignore)?;
    let g = t.broadcast_to(a.grads[0], &args.target)?;
    let zero = t.full_like(g, 0.0)?;
    let mut c = select(t, valid, g, zero)?;
    if args.reduction == Reduction::Mean {
        let all: Vec<usize> = (0..args.target.rank()).collect();
        let v = t.cast(valid, dtype)?;
        let n = reduce_call(t, "sum", v, &all, false)?;
        c = t.div(c, n)?;
    }
    let kept = reduced_shape(&types[0].shape, &[args.class_dim], true);
    let c = t.reshape(c, &kept)?;
    let hot = one_hot(t, target, x, args.class_dim)?;
    let grad = if softmax {
        let p = t.call1("softmax", &[x], Attrs::new().with("dim", args.class_dim))?;
        let q = if args.smoothing > 0.0 {
            let h = t.scale(hot, 1.0 - args.smoothing)?;
            let u = t.full_like(h, args.smoothing / args.classes as f64)?;
            t.add(h, u)?
        } else {
            hot
        };
        let s = reduce_call(t, "sum", q, &[args.class_dim], true)?;
        let sp = t.mul(s, p)?;
        let d = t.sub(sp, q)?;
        t.mul(c, d)?
    } else {
        let d = t.neg(hot)?;
        t.mul(c, d)?
    };
    Ok(vec![Some(grad), None])
}

#[cfg(feature = "conformance")]
fn loss_sample(g: &mut Gen, softmax: bool) -> Sample {
    let dtype = g.pick(FLOATS);
    let rank = 1 + g.below(4);
    let mut dims: Vec<usize> = g.shape(rank, rank).dims().to_vec();
    let cd = usize::from(rank >= 2);
    dims[cd] = dims[cd].max(1);
    let shape = Shape::new(dims);
    let classes = shape.dims()[cd];
    let x = if softmax {
        g.tensor(dtype, &shape)
    } else {
        // Log-probabilities: negative values.
        g.tensor_in(dtype, &shape, -5.0, 0.0)
    };
    let target_shape = reduced_shape(&shape, &[cd], false);
    let tdtype = if g.below(4) == 0 {
        DType::I32
    } else {
        DType::I64
    };
    let mut attrs = Attrs::new();
    let ignore = match g.below(3) {
        0 => None,
        2 if classes > 1 => Some(g.below(classes) as i64),
        _ => Some(-100i64),
    };
    if let Some(i) = ignore {
        if i != -100 || g.bool() {
            attrs.set("ignore_index", i);
        }
    }
    // Ignore about one target in four, but keep the first one valid.
    let mut values: Vec<i64> = (0..target_shape.numel())
        .map(|_| g.below(classes) as i64)
        .collect();
    if let Some(i) = ignore {
        for (k, v) in values.iter_mut().enumerate() {
            if k > 0 && g.below(4) == 0 {
                *v = i;
            } else if *v == i {
                *v = (i + 1).rem_euclid(classes as i64);
            }
        }
    }
    let target = HostTensor::from_i64(tdtype, target_shape, values)
        .unwrap_or_else(|| HostTensor::scalar(tdtype, 0.0));
    match g.below(3) {
        0 => attrs.set("reduction", "none"),
        1 => attrs.set("reduction", "sum"),
        _ => {
            if g.bool() {
                attrs.set("reduction", "mean");
            }
        }
    }
    if softmax && g.bool() {
        attrs.set("label_smoothing", g.pick(&[0.1, 0.25, 1.0]));
    }
    Sample::new(vec![x, target], attrs)
}

#[cfg(feature = "conformance")]
fn loss_samples(softmax: bool, seed: u64) -> Vec<Sample> {
    let mut s: Vec<Sample> = (0..14)
        .map(|i| loss_sample(&mut Gen::new(seed + i), softmax))
        .collect();
    let mut g = Gen::new(seed + 99);
    let f32 = DType::F32;
    let logits = g.tensor_in(f32, &Shape::from([4, 7]), -3.0, 3.0);
    let empty = g.tensor(f32, &Shape::from([0, 5]));
    let none = HostTensor::from_i64(DType::I64, [0], vec![]);
    let some = HostTensor::from_i64(DType::I64, [4], vec![3, -100, 0, 6]);
    let ignored = HostTensor::from_i64(DType::I64, [4], vec![-100; 4]);
    if let (Some(none), Some(some), Some(ignored)) = (none, some, ignored) {
        // Empty batches: mean is NaN, sum is 0.
        s.push(Sample::new(vec![empty.clone(), none.clone()], Attrs::new()));
        s.push(Sample::new(
            vec![empty, none],
            Attrs::new().with("reduction", "sum"),
        ));
        s.push(Sample::new(vec![logits.clone(), some], Attrs::new()));
        // Everything ignored: mean is NaN.
        s.push(Sample::new(vec![logits, ignored], Attrs::new()));
    }
    let wide = g.tensor(DType::BF16, &Shape::from([3, 127]));
    let t = HostTensor::from_i64(DType::I32, [3], vec![0, 126, 64]);
    if let Some(t) = t {
        s.push(Sample::new(
            vec![wide, t],
            Attrs::new().with("reduction", "sum"),
        ));
    }
    s
}

inventory::submit! {
    op_def! {
        name: "cross_entropy",
        arity: Arity::Exactly(2),
        flags: Flags::REDUCTION,
        dtypes: FLOATS,
        infer: |x, attrs| infer_loss(x, attrs, true),
        indices: target_classes,
        lower: |b, x, attrs| Ok(vec![lower_loss(b, x, attrs, true)?]),
        reference: |x, attrs| Ok(vec![loss_ref(x, attrs, true)?]),
        vjp: Some(|t, a| loss_vjp(t, a, true)),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || loss_samples(true, 1100),
        arbitrary: |g: &mut Gen| loss_sample(g, true),
        torch: Torch::Expr(r#"F.cross_entropy(x[0], x[1].long(), ignore_index=a.get("ignore_index", -100), reduction=a.get("reduction", "mean"), label_smoothing=a.get("label_smoothing", 0.0))"#),
    }
}

inventory::submit! {
    op_def! {
        name: "nll_loss",
        arity: Arity::Exactly(2),
        flags: Flags::REDUCTION,
        dtypes: FLOATS,
        infer: |x, attrs| infer_loss(x, attrs, false),
        indices: target_classes,
        lower: |b, x, attrs| Ok(vec![lower_loss(b, x, attrs, false)?]),
        reference: |x, attrs| Ok(vec![loss_ref(x, attrs, false)?]),
        vjp: Some(|t, a| loss_vjp(t, a, false)),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || loss_samples(false, 1200),
        arbitrary: |g: &mut Gen| loss_sample(g, false),
        torch: Torch::Expr(r#"F.nll_loss(x[0], x[1].long(), ignore_index=a.get("ignore_index", -100), reduction=a.get("reduction", "mean"))"#),
    }
}
