//! The fused optimizer and AMP kernels CUDA recipes call: `_fused_adam_`,
//! `_fused_adamw_` (the default optimizer of Hugging Face's `Trainer`),
//! `_fused_sgd_`, and the loss-scale kernels behind `torch.amp.GradScaler`. Each runs as
//! one deferred graph even under Strict ([`crate::kernels::fused`]).

use tpu_core::{DType, Tensor};

use super::elementwise::opmath;
use super::{Call, Done, NativeOp, apply, error, op, read, store_into};
use crate::error::Result;
use crate::ffi;
use crate::kernels::{cast, fused};

pub fn register(ops: &mut Vec<NativeOp>) {
    for (name, decoupled) in [
        ("_fused_adam_", false),
        ("_fused_adam_.tensor_lr", false),
        ("_fused_adamw_", true),
        ("_fused_adamw_.tensor_lr", true),
    ] {
        ops.push(op(name, &[], move |c| fused(|| adam(c, decoupled))));
    }
    for name in ["_fused_sgd_", "_fused_sgd_.tensor_lr"] {
        ops.push(op(name, &[], |c| fused(|| sgd(c))));
    }
    ops.push(op("_amp_foreach_non_finite_check_and_unscale_", &[], |c| {
        fused(|| unscale(c))
    }));
    ops.push(op("_amp_update_scale_", &[], |c| fused(|| update_scale(c))));
}

/// Adam's hyperparameters, as `_fused_adam(w)_` takes them.
struct Adam {
    beta1: f64,
    beta2: f64,
    weight_decay: f64,
    eps: f64,
    amsgrad: bool,
    maximize: bool,
}

/// One Adam step over every parameter: arguments params, grads, exp_avgs,
/// exp_avg_sqs, max_exp_avg_sqs, state_steps (already counted), lr (a
/// number or a tensor), beta1, beta2, weight_decay, eps, amsgrad,
/// maximize, grad_scale, found_inf. AdamW (`decoupled`) decays the
/// parameter; Adam adds the decay to the gradient. With `grad_scale` the
/// gradients are unscaled (and written back so); with `found_inf` set
/// nothing changes, as on the CPU.
fn adam(c: &Call<'_>, decoupled: bool) -> Result<Done> {
    let hp = Adam {
        beta1: c.number(7)?,
        beta2: c.number(8)?,
        weight_decay: c.number(9)?,
        eps: c.number(10)?,
        amsgrad: c.flag_or(11, false)?,
        maximize: c.flag_or(12, false)?,
    };
    let (params, grads, avgs, sqs, maxes, steps) = (
        c.tensors(0)?,
        c.tensors(1)?,
        c.tensors(2)?,
        c.tensors(3)?,
        c.tensors(4)?,
        c.tensors(5)?,
    );
    let n = params.len();
    if [grads.len(), avgs.len(), sqs.len(), steps.len()]
        .iter()
        .any(|&m| m != n)
        || (hp.amsgrad && maxes.len() != n)
    {
        return Err(error(format!(
            "{}: expected as many grads, exp_avgs, exp_avg_sqs and state_steps as params ({n})",
            c.op
        )));
    }
    let grad_scale = c.tensor_opt(13)?;
    let skip = found_inf(c, 14)?;
    for i in 0..n {
        let m = opmath(super::dtype(params[i].dtype)?);
        let lr = learning_rate(c, 6, m)?;
        let k = |v: f64| c.constant(m, v);
        let mut updates = Vec::new();
        let (param, mut grad) = param_and_grad(
            (&params[i], &grads[i]),
            m,
            grad_scale.as_ref(),
            hp.maximize,
            &mut updates,
        )?;
        let mut p = param.clone();
        if hp.weight_decay != 0.0 {
            if decoupled {
                let decay = apply(op!("mul"), &[lr.clone(), k(hp.weight_decay)?])?;
                p = apply(op!("mul"), &[p, apply(op!("sub"), &[k(1.0)?, decay])?])?;
            } else {
                grad = apply(
                    op!("add"),
                    &[
                        grad,
                        apply(op!("mul"), &[param.clone(), k(hp.weight_decay)?])?,
                    ],
                )?;
            }
        }
        let avg = cast(read(&avgs[i])?, m)?;
        let avg = apply(
            op!("add"),
            &[
                apply(op!("mul"), &[avg, k(hp.beta1)?])?,
                apply(op!("mul"), &[grad.clone(), k(1.0 - hp.beta1)?])?,
            ],
        )?;
        let sq = cast(read(&sqs[i])?, m)?;
        let grad_sq = apply(op!("mul"), &[grad.clone(), grad])?;
        let sq = apply(
            op!("add"),
            &[
                apply(op!("mul"), &[sq, k(hp.beta2)?])?,
                apply(op!("mul"), &[grad_sq, k(1.0 - hp.beta2)?])?,
            ],
        )?;
        let step = cast(read(&steps[i])?, m)?;
        let correction = |beta: f64| -> Result<Tensor> {
            apply(
                op!("sub"),
                &[k(1.0)?, apply(op!("pow"), &[k(beta)?, step.clone()])?],
            )
        };
        let step_size = apply(op!("div"), &[lr, correction(hp.beta1)?])?;
        let correction2_sqrt = apply(op!("sqrt"), &[correction(hp.beta2)?])?;
        let mut second = sq.clone();
        if hp.amsgrad {
            second = apply(op!("maximum"), &[cast(read(&maxes[i])?, m)?, sq.clone()])?;
            updates.push((&maxes[i], second.clone()));
        }
        let denom = apply(
            op!("add"),
            &[
                apply(
                    op!("div"),
                    &[apply(op!("sqrt"), &[second])?, correction2_sqrt],
                )?,
                k(hp.eps)?,
            ],
        )?;
        let delta = apply(
            op!("div"),
            &[apply(op!("mul"), &[step_size, avg.clone()])?, denom],
        )?;
        p = apply(op!("sub"), &[p, delta])?;
        updates.push((&params[i], p));
        updates.push((&avgs[i], avg));
        updates.push((&sqs[i], sq));
        write_unless_skipped(updates, skip.as_ref(), m)?;
    }
    Ok(Done::Written)
}

/// A parameter's writes: each target and its new value.
type Updates<'a> = Vec<(&'a ffi::TensorRef<'a>, Tensor)>;

/// A parameter and its gradient in `m`, as both fused optimizers start:
/// the gradient unscaled by `grad_scale` (and written back so, as on the
/// CPU), then negated to maximize.
fn param_and_grad<'a>(
    (param, grad): (&'a ffi::TensorRef<'a>, &'a ffi::TensorRef<'a>),
    m: DType,
    grad_scale: Option<&Tensor>,
    maximize: bool,
    updates: &mut Updates<'a>,
) -> Result<(Tensor, Tensor)> {
    let mut g = cast(read(grad)?, m)?;
    if let Some(scale) = grad_scale {
        g = apply(op!("div"), &[g, cast(scale.clone(), m)?])?;
        updates.push((grad, g.clone()));
    }
    if maximize {
        g = apply(op!("neg"), &[g])?;
    }
    Ok((cast(read(param)?, m)?, g))
}

/// Writes `updates`, each unless skipped (see [`unless_skipped`]).
fn write_unless_skipped(updates: Updates<'_>, skip: Option<&Tensor>, m: DType) -> Result<()> {
    for (target, value) in updates {
        store_into(target, unless_skipped(value, target, skip, m)?)?;
    }
    Ok(())
}

/// The learning rate at argument `index` (a number or a tensor) in `m`.
fn learning_rate(c: &Call<'_>, index: usize, m: DType) -> Result<Tensor> {
    if c.is_tensor(index) {
        cast(c.tensor(index)?, m)
    } else {
        c.constant(m, c.number(index)?)
    }
}

/// `skip`: where `found_inf` (argument `index`), when given, is nonzero.
fn found_inf(c: &Call<'_>, index: usize) -> Result<Option<Tensor>> {
    c.tensor_opt(index)?
        .map(|found| apply(op!("ne"), &[found.clone(), c.constant(found.dtype(), 0.0)?]))
        .transpose()
}

/// One SGD step over every parameter: arguments params, grads,
/// momentum_buffer_list (empty without momentum), weight_decay, momentum,
/// lr (a number or a tensor), dampening, nesterov, maximize,
/// is_first_step (the buffers start as the gradient), grad_scale,
/// found_inf — the CPU kernel's order of operations, in float32 for half
/// types with one rounding per stored value.
fn sgd(c: &Call<'_>) -> Result<Done> {
    let (params, grads, buffers) = (c.tensors(0)?, c.tensors(1)?, c.tensors(2)?);
    let weight_decay = c.number(3)?;
    let momentum = c.number(4)?;
    let dampening = c.number(6)?;
    let nesterov = c.flag_or(7, false)?;
    let maximize = c.flag_or(8, false)?;
    let first_step = c.flag_or(9, false)?;
    let n = params.len();
    if grads.len() != n || (momentum != 0.0 && buffers.len() != n) {
        return Err(error(format!(
            "{}: expected as many grads (and momentum buffers, with momentum) as params ({n})",
            c.op
        )));
    }
    let grad_scale = c.tensor_opt(10)?;
    let skip = found_inf(c, 11)?;
    for i in 0..n {
        let m = opmath(super::dtype(params[i].dtype)?);
        let k = |v: f64| c.constant(m, v);
        let mut updates = Vec::new();
        let (param, mut grad) = param_and_grad(
            (&params[i], &grads[i]),
            m,
            grad_scale.as_ref(),
            maximize,
            &mut updates,
        )?;
        if weight_decay != 0.0 {
            let decay = apply(op!("mul"), &[param.clone(), k(weight_decay)?])?;
            grad = apply(op!("add"), &[grad, decay])?;
        }
        if momentum != 0.0 {
            let buffer = if first_step {
                grad.clone()
            } else {
                let kept = apply(op!("mul"), &[cast(read(&buffers[i])?, m)?, k(momentum)?])?;
                let added = apply(op!("mul"), &[grad.clone(), k(1.0 - dampening)?])?;
                apply(op!("add"), &[kept, added])?
            };
            grad = if nesterov {
                apply(
                    op!("add"),
                    &[grad, apply(op!("mul"), &[buffer.clone(), k(momentum)?])?],
                )?
            } else {
                buffer.clone()
            };
            updates.push((&buffers[i], buffer));
        }
        let lr = learning_rate(c, 5, m)?;
        let stepped = apply(op!("sub"), &[param, apply(op!("mul"), &[lr, grad])?])?;
        updates.push((&params[i], stepped));
        write_unless_skipped(updates, skip.as_ref(), m)?;
    }
    Ok(Done::Written)
}

/// `value`, or the target's current value where `skip` (found_inf != 0)
/// holds: a step with an overflowed gradient changes nothing.
fn unless_skipped(
    value: Tensor,
    target: &ffi::TensorRef<'_>,
    skip: Option<&Tensor>,
    m: DType,
) -> Result<Tensor> {
    match skip {
        Some(skip) => apply(
            op!("where"),
            &[skip.clone(), cast(read(target)?, m)?, value],
        ),
        None => Ok(value),
    }
}

/// `_amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
/// inv_scale)`: each gradient times `inv_scale`, and `found_inf` set to 1
/// when any gradient holds an inf or a NaN.
fn unscale(c: &Call<'_>) -> Result<Done> {
    let grads = c.tensors(0)?;
    let found = c.tensor_ref(1)?;
    let inv_scale = c.tensor(2)?;
    let mut any = cast(read(found)?, DType::Bool)?;
    for g in grads {
        let value = read(g)?;
        let m = opmath(value.dtype());
        let scaled = apply(
            op!("mul"),
            &[cast(value.clone(), m)?, cast(inv_scale.clone(), m)?],
        )?;
        let nan = apply(op!("isnan"), std::slice::from_ref(&value))?;
        let bad = apply(op!("logical_or"), &[nan, apply(op!("isinf"), &[value])?])?;
        let all_finite = super::reductions::all_of(apply(op!("logical_not"), &[bad])?)?;
        any = apply(
            op!("logical_or"),
            &[any, apply(op!("logical_not"), &[all_finite])?],
        )?;
        store_into(g, scaled)?;
    }
    store_into(found, any)?;
    Ok(Done::Written)
}

/// `_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor,
/// backoff_factor, growth_interval)`: after an overflow the scale backs off
/// and the tracker restarts; otherwise the tracker counts, and at the
/// interval the scale grows and the tracker restarts.
fn update_scale(c: &Call<'_>) -> Result<Done> {
    let scale_ref = c.tensor_ref(0)?;
    let tracker_ref = c.tensor_ref(1)?;
    let scale = read(scale_ref)?;
    let tracker = read(tracker_ref)?;
    let found = c.tensor(2)?;
    let (growth, backoff, interval) = (c.number(3)?, c.number(4)?, c.int(5)?);
    let d = scale.dtype();
    let t = tracker.dtype();
    let overflow = apply(op!("ne"), &[found, c.constant(DType::F32, 0.0)?])?;
    let counted = apply(op!("add"), &[tracker.clone(), c.constant(t, 1.0)?])?;
    let grow = apply(
        op!("ge"),
        &[counted.clone(), c.constant(t, interval as f64)?],
    )?;
    let grown = apply(op!("mul"), &[scale.clone(), c.constant(d, growth)?])?;
    let backed_off = apply(op!("mul"), &[scale.clone(), c.constant(d, backoff)?])?;
    let kept_or_grown = apply(op!("where"), &[grow.clone(), grown, scale])?;
    let new_scale = apply(op!("where"), &[overflow.clone(), backed_off, kept_or_grown])?;
    let zero = c.constant(t, 0.0)?;
    let restarted = apply(op!("where"), &[grow, zero.clone(), counted])?;
    let new_tracker = apply(op!("where"), &[overflow, zero, restarted])?;
    store_into(scale_ref, new_scale)?;
    store_into(tracker_ref, new_tracker)?;
    Ok(Done::Written)
}
