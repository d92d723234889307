//! Layer norm, dropout and the embedding's backward.

use tpu_core::op::Attrs;
use tpu_core::{DType, Tensor};

use super::{Call, Done, NativeOp, apply, apply_with, error, op};
use crate::error::{BridgeError, Result};
use crate::kernels::{cast, full};

pub fn register(ops: &mut Vec<NativeOp>) {
    ops.push(op("native_layer_norm", &[], layer_norm));
    ops.push(op("native_layer_norm_backward", &[], layer_norm_backward));
    ops.push(op("native_dropout", &[], dropout));
    ops.push(op("native_dropout_backward", &[], |c| {
        let d = c.dtype(0)?;
        let masked = apply("mul", &[c.tensor(0)?, cast(c.tensor(1)?, d)?])?;
        Ok(Done::one(apply(
            "mul",
            &[masked, c.constant(d, c.number(2)?)?],
        )?))
    }));
    ops.push(op("embedding_dense_backward", &[], embedding_backward));
    // Attention takes PyTorch's math path (SDPBackend.math), in ops the
    // device has.
    ops.push(op("_fused_sdp_choice", &[], |_| Ok(Done::Integer(0))));
}

/// The dtype statistics are computed in: f64 for f64, else f32.
fn stats_dtype(d: DType) -> DType {
    if d == DType::F64 { d } else { DType::F32 }
}

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
    let out = cast(apply_with("layer_norm", &inputs, attrs)?, input.dtype())?;
    let rank = sizes.len() as i64;
    let dims: Vec<i64> = (rank - k as i64..rank).collect();
    let x = cast(input, stats_dtype(c.dtype(0)?))?;
    let mean = reduce("mean", x.clone(), &dims, true)?;
    let var = apply_with(
        "var",
        &[x],
        Attrs::new()
            .with("dims", dims.as_slice())
            .with("keepdim", true)
            .with("correction", 0.0),
    )?;
    let eps = c.constant(var.dtype(), eps)?;
    let rstd = apply("rsqrt", &[apply("add", &[var, eps])?])?;
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
    let centered = apply("sub", &[x, cast(c.tensor(3)?, compute)?])?;
    let xhat = apply("mul", &[centered, cast(c.tensor(4)?, compute)?])?;
    let weight = c.tensor_opt(5)?;
    let gy = match &weight {
        Some(w) => apply("mul", &[g.clone(), cast(w.clone(), compute)?])?,
        None => g.clone(),
    };
    let grad_input = if wanted(0) {
        let m1 = reduce("mean", gy.clone(), &norm_dims, true)?;
        let m2 = reduce(
            "mean",
            apply("mul", &[gy.clone(), xhat.clone()])?,
            &norm_dims,
            true,
        )?;
        let inner = apply(
            "sub",
            &[apply("sub", &[gy, m1])?, apply("mul", &[xhat.clone(), m2])?],
        )?;
        let scaled = apply("mul", &[inner, cast(c.tensor(4)?, compute)?])?;
        Some(cast(scaled, input_dtype)?.into())
    } else {
        None
    };
    let grad_weight = match &weight {
        Some(w) if wanted(1) => {
            let gw = reduce("sum", apply("mul", &[g.clone(), xhat])?, &batch_dims, false)?;
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
    let kept = apply("mul", &[input, cast(mask.clone(), d)?])?;
    let out = apply("mul", &[kept, c.constant(d, scale)?])?;
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
    let reshape =
        |x: Tensor, shape: &[usize]| apply_with("reshape", &[x], Attrs::new().with("shape", shape));
    let flat = reshape(indices, &[n])?;
    let mut rows = reshape(grad.clone(), &[n, width])?;
    let padding = c.int(3)?;
    if padding >= 0 {
        let keep = apply(
            "ne",
            &[flat.clone(), c.constant(flat.dtype(), padding as f64)?],
        )?;
        let keep = reshape(cast(keep, rows.dtype())?, &[n, 1])?;
        rows = apply("mul", &[rows, keep])?;
    }
    let zeros = full(grad.dtype(), &[c.int(2)? as usize, width], 0.0, c.device()?)?;
    let out = apply_with(
        "index_add",
        &[zeros, flat, rows],
        Attrs::new().with("dim", 0i64),
    )?;
    Ok(Done::one(out))
}
