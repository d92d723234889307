//! Layer norm, dropout, the embedding's backward and the negative
//! log-likelihood loss.

use tpu_core::op::Attrs;
use tpu_core::{DType, Tensor};

use super::{Call, Done, NativeOp, apply, apply_with, error, op, reshape};
use crate::error::{BridgeError, Result};
use crate::kernels::{cast, full};

pub fn register(ops: &mut Vec<NativeOp>) {
    ops.push(op("native_layer_norm", &[], layer_norm));
    ops.push(op("native_layer_norm_backward", &[], layer_norm_backward));
    ops.push(op("native_dropout", &[], dropout));
    ops.push(op("native_dropout_backward", &[], |c| {
        let d = c.dtype(0)?;
        let masked = apply(op!("mul"), &[c.tensor(0)?, cast(c.tensor(1)?, d)?])?;
        Ok(Done::one(apply(
            op!("mul"),
            &[masked, c.constant(d, c.number(2)?)?],
        )?))
    }));
    ops.push(op("embedding_dense_backward", &[], embedding_backward));
    for name in ["nll_loss_forward", "nll_loss2d_forward"] {
        ops.push(op(name, &[], nll_loss));
    }
    for name in ["nll_loss_backward", "nll_loss2d_backward"] {
        ops.push(op(name, &[], nll_loss_backward));
    }
    // Attention takes PyTorch's math path (SDPBackend.math), in ops the
    // device has.
    ops.push(op("_fused_sdp_choice", &[], |_| Ok(Done::Integer(0))));
}

/// The dtype statistics are computed in: f64 for f64, else f32.
fn stats_dtype(d: DType) -> DType {
    if d == DType::F64 { d } else { DType::F32 }
}

/// `core` over exactly `dims` (an empty list reduces nothing, unlike the
/// aten reductions' "all dims").
fn reduce(core: &str, x: Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    apply_with(
        core,
        &[x],
        Attrs::new().with("dims", dims).with("keepdim", keepdim),
    )
}

/// `native_layer_norm(input, normalized_shape, weight, bias, eps)`: the
/// output and the mean and 1/std of each normalized row (kept dims).
fn layer_norm(c: &Call<'_>) -> Result<Done> {
    let sizes = c.sizes(0)?;
    let shape = c.ints(1)?.unwrap_or(&[]);
    let k = shape.len();
    let matches = k <= sizes.len()
        && sizes[sizes.len() - k..]
            .iter()
            .zip(shape)
            .all(|(&s, &n)| s as i64 == n);
    if !matches {
        let listed: Vec<String> = shape.iter().map(i64::to_string).collect();
        return Err(error(format!(
            "Given normalized_shape={shape:?}, expected input with shape [*, {}], but got input of size{sizes:?}",
            listed.join(", ")
        )));
    }
    let eps = c.number(4)?;
    let input = c.tensor(0)?;
    let mut inputs = vec![input.clone()];
    let bias = c.tensor_opt(3)?;
    match (c.tensor_opt(2)?, &bias) {
        (Some(w), _) => inputs.push(w),
        (None, Some(b)) => inputs.push(full(b.dtype(), b.shape().dims(), 1.0, c.device()?)?),
        (None, None) => {}
    }
    inputs.extend(bias);
    // In f32 for the half types, rounded once, as the CPU does.
    let compute = super::elementwise::opmath(input.dtype());
    let inputs = inputs
        .into_iter()
        .map(|t| cast(t, compute))
        .collect::<Result<Vec<_>>>()?;
    let attrs = Attrs::new().with("normalized_dims", k).with("eps", eps);
    let out = cast(
        apply_with(op!("layer_norm"), &inputs, attrs)?,
        input.dtype(),
    )?;
    let rank = sizes.len() as i64;
    let dims: Vec<i64> = (rank - k as i64..rank).collect();
    let x = cast(input, stats_dtype(c.dtype(0)?))?;
    let mean = reduce("mean", x.clone(), &dims, true)?;
    let var = apply_with(
        op!("var"),
        &[x],
        Attrs::new()
            .with("dims", dims.as_slice())
            .with("keepdim", true)
            .with("correction", 0.0),
    )?;
    let eps = c.constant(var.dtype(), eps)?;
    let rstd = apply(op!("rsqrt"), &[apply(op!("add"), &[var, eps])?])?;
    Ok(Done::Values(vec![
        Some(out.into()),
        Some(mean.into()),
        Some(rstd.into()),
    ]))
}

/// With `xhat = (x - mean) * rstd` and `gy = g * weight`: `dx = rstd * (gy
/// - mean(gy) - xhat * mean(gy * xhat))` over the normalized dims;
/// `dweight = sum(g * xhat)` and `dbias = sum(g)` over the rest.
fn layer_norm_backward(c: &Call<'_>) -> Result<Done> {
    let sizes = c.sizes(1)?;
    let k = c.ints(2)?.unwrap_or(&[]).len();
    let rank = sizes.len() as i64;
    let norm_dims: Vec<i64> = (rank - k as i64..rank).collect();
    let batch_dims: Vec<i64> = (0..rank - k as i64).collect();
    let input_dtype = c.dtype(1)?;
    let compute = stats_dtype(input_dtype);
    let mask = c.ints(7)?.unwrap_or(&[1, 1, 1]);
    let wanted = |i: usize| mask.get(i).is_some_and(|&m| m != 0);
    let x = cast(c.tensor(1)?, compute)?;
    let g = cast(c.tensor(0)?, compute)?;
    let centered = apply(op!("sub"), &[x, cast(c.tensor(3)?, compute)?])?;
    let xhat = apply(op!("mul"), &[centered, cast(c.tensor(4)?, compute)?])?;
    let weight = c.tensor_opt(5)?;
    let gy = match &weight {
        Some(w) => apply(op!("mul"), &[g.clone(), cast(w.clone(), compute)?])?,
        None => g.clone(),
    };
    let grad_input = if wanted(0) {
        let m1 = reduce("mean", gy.clone(), &norm_dims, true)?;
        let m2 = reduce(
            "mean",
            apply(op!("mul"), &[gy.clone(), xhat.clone()])?,
            &norm_dims,
            true,
        )?;
        let inner = apply(
            op!("sub"),
            &[
                apply(op!("sub"), &[gy, m1])?,
                apply(op!("mul"), &[xhat.clone(), m2])?,
            ],
        )?;
        let scaled = apply(op!("mul"), &[inner, cast(c.tensor(4)?, compute)?])?;
        Some(cast(scaled, input_dtype)?.into())
    } else {
        None
    };
    let grad_weight = match &weight {
        Some(w) if wanted(1) => {
            let gw = reduce(
                "sum",
                apply(op!("mul"), &[g.clone(), xhat])?,
                &batch_dims,
                false,
            )?;
            Some(cast(gw, w.dtype())?.into())
        }
        _ => None,
    };
    let grad_bias = match c.tensor_opt(6)? {
        Some(b) if wanted(2) => {
            Some(cast(reduce("sum", g, &batch_dims, false)?, b.dtype())?.into())
        }
        _ => None,
    };
    Ok(Done::Values(vec![grad_input, grad_weight, grad_bias]))
}

/// `native_dropout(input, p, train)`: the output and the keep mask.
fn dropout(c: &Call<'_>) -> Result<Done> {
    let input = c.tensor(0)?;
    let p = c.number(1)?;
    let shape = input.shape().dims().to_vec();
    let device = c.device()?;
    // `train=None` trains, as PyTorch's kernels read it.
    if !c.flag_or(2, true)? || p == 0.0 {
        let ones = full(DType::Bool, &shape, 1.0, device)?;
        return Ok(Done::Values(vec![Some(input.into()), Some(ones.into())]));
    }
    let attrs = Attrs::new().with("p", 1.0 - p);
    let mask = crate::random::draw("bernoulli", &shape, DType::Bool, attrs, device)?;
    let d = input.dtype();
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let kept = apply(op!("mul"), &[input, cast(mask.clone(), d)?])?;
    let out = apply(op!("mul"), &[kept, c.constant(d, scale)?])?;
    Ok(Done::Values(vec![Some(out.into()), Some(mask.into())]))
}

/// `embedding_dense_backward(grad, indices, num_weights, padding_idx,
/// scale_grad_by_freq)`: each row's gradient added into its index's row.
fn embedding_backward(c: &Call<'_>) -> Result<Done> {
    if c.flag_or(4, false)? {
        return Err(BridgeError::Unsupported(
            "aten::embedding_dense_backward with scale_grad_by_freq=True is not implemented for the tpu device"
                .into(),
        ));
    }
    let grad = c.tensor(0)?;
    let indices = c.tensor(1)?;
    let n = indices.shape().dims().iter().product::<usize>();
    let width = grad.shape().dims().last().copied().unwrap_or(1);
    let flat = reshape(indices, &[n])?;
    let mut rows = reshape(grad.clone(), &[n, width])?;
    let padding = c.int(3)?;
    if padding >= 0 {
        let keep = apply(
            op!("ne"),
            &[flat.clone(), c.constant(flat.dtype(), padding as f64)?],
        )?;
        let keep = reshape(cast(keep, rows.dtype())?, &[n, 1])?;
        rows = apply(op!("mul"), &[rows, keep])?;
    }
    let zeros = full(grad.dtype(), &[c.int(2)? as usize, width], 0.0, c.device()?)?;
    let out = apply_with(
        op!("index_add"),
        &[zeros, flat, rows],
        Attrs::new().with("dim", 0i64),
    )?;
    Ok(Done::one(out))
}

/// PyTorch's reduction codes, as tpu-rs names them.
fn reduction(code: i64) -> Result<&'static str> {
    match code {
        0 => Ok("none"),
        1 => Ok("mean"),
        2 => Ok("sum"),
        other => Err(error(format!("{other} is not a valid value for reduction"))),
    }
}

fn nll_attrs(c: &Call<'_>, reduction_at: usize) -> Result<Attrs> {
    Ok(Attrs::new()
        .with("reduction", reduction(c.int(reduction_at)?)?)
        .with("ignore_index", c.int(reduction_at + 1)?))
}

/// The class dim, the targets with ignored ones at class 0 (as `dim`
/// shaped for a gather), and each target's weight (0 where ignored).
struct Picked {
    dim: i64,
    index: Tensor,
    weights: Tensor,
}

fn picked(
    c: &Call<'_>,
    input: usize,
    target: usize,
    weight: usize,
    ignore_index: i64,
) -> Result<Picked> {
    let rank = c.sizes(input)?.len();
    let dim: i64 = if rank >= 2 { 1 } else { 0 };
    let target = c.tensor(target)?;
    let tshape = target.shape().dims().to_vec();
    let t = target.dtype();
    let keep = apply(
        op!("ne"),
        &[target.clone(), c.constant(t, ignore_index as f64)?],
    )?;
    let safe = apply(op!("where"), &[keep.clone(), target, c.constant(t, 0.0)?])?;
    let n: usize = tshape.iter().product();
    let weight = c.tensor(weight)?;
    let per_target = apply_with(
        op!("index_select"),
        &[weight.clone(), reshape(safe.clone(), &[n])?],
        Attrs::new().with("dim", 0i64),
    )?;
    let per_target = reshape(per_target, &tshape)?;
    let weights = apply(op!("mul"), &[per_target, cast(keep, weight.dtype())?])?;
    let mut index_shape = tshape.clone();
    index_shape.insert(dim as usize, 1);
    Ok(Picked {
        dim,
        index: reshape(safe, &index_shape)?,
        weights,
    })
}

/// `nll_loss_forward(self, target, weight, reduction, ignore_index)`: the
/// loss and the total weight of the targets counted.
fn nll_loss(c: &Call<'_>) -> Result<Done> {
    let input = c.tensor(0)?;
    let d = input.dtype();
    let ignore_index = c.int(4)?;
    if !c.has(2) {
        let target = c.tensor(1)?;
        let out = apply_with(op!("nll_loss"), &[input, target.clone()], nll_attrs(c, 3)?)?;
        let t = target.dtype();
        let counted = apply(
            op!("ne"),
            &[target.clone(), c.constant(t, ignore_index as f64)?],
        )?;
        let dims: Vec<i64> = (0..target.shape().rank() as i64).collect();
        let total = reduce("sum", cast(counted, d)?, &dims, false)?;
        return Ok(Done::Values(vec![Some(out.into()), Some(total.into())]));
    }
    let sizes = c.sizes(0)?;
    let classes = if sizes.len() > 1 {
        sizes[1]
    } else {
        sizes.first().copied().unwrap_or(1)
    };
    let weight_len: usize = c.sizes(2)?.iter().product();
    if weight_len != classes {
        return Err(error(format!(
            "weight tensor should be defined either for all {classes} classes or no classes but got weight \
             tensor of shape: {:?}",
            c.sizes(2)?
        )));
    }
    let p = picked(c, 0, 1, 2, ignore_index)?;
    let gathered = apply_with(
        op!("gather"),
        &[input, p.index],
        Attrs::new().with("dim", p.dim),
    )?;
    let tshape = p.weights.shape().dims().to_vec();
    let gathered = reshape(gathered, &tshape)?;
    let losses = apply(
        op!("neg"),
        &[apply(op!("mul"), &[gathered, cast(p.weights.clone(), d)?])?],
    )?;
    let all: Vec<i64> = (0..tshape.len() as i64).collect();
    let total = reduce("sum", cast(p.weights, d)?, &all, false)?;
    let out = match reduction(c.int(3)?)? {
        "none" => losses,
        "sum" => reduce("sum", losses, &all, false)?,
        _ => apply(
            op!("div"),
            &[reduce("sum", losses, &all, false)?, total.clone()],
        )?,
    };
    Ok(Done::Values(vec![Some(out.into()), Some(total.into())]))
}

/// `nll_loss_backward(grad, self, target, weight, reduction, ignore_index,
/// total_weight)`: minus the (weighted, scaled) gradient at each target's
/// class, zero elsewhere.
fn nll_loss_backward(c: &Call<'_>) -> Result<Done> {
    let input = c.tensor(1)?;
    let d = input.dtype();
    if !c.has(3) {
        let grads = crate::ops::vjp_values(
            "nll_loss",
            vec![input, c.tensor(2)?],
            vec![Some(c.tensor(0)?)],
            nll_attrs(c, 4)?,
            c.device()?,
        )?;
        return Ok(Done::Values(vec![
            grads.into_iter().next().flatten().map(Into::into),
        ]));
    }
    let p = picked(c, 1, 2, 3, c.int(5)?)?;
    let mut g = cast(c.tensor(0)?, d)?;
    if reduction(c.int(4)?)? == "mean" {
        g = apply(op!("div"), &[g, cast(c.tensor(6)?, d)?])?;
    }
    let scaled = apply(op!("neg"), &[apply(op!("mul"), &[cast(p.weights, d)?, g])?])?;
    let index_shape = p.index.shape().dims().to_vec();
    let scaled = reshape(scaled, &index_shape)?;
    let zeros = full(d, input.shape().dims(), 0.0, c.device()?)?;
    let out = apply_with(
        op!("scatter_add"),
        &[zeros, p.index, scaled],
        Attrs::new().with("dim", p.dim),
    )?;
    Ok(Done::one(out))
}
