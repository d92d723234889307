//! `var` and `std` over dims with `correction` (default 1, Bessel's): the
//! sum of squared deviations divided by `max(n - correction, 0)`, as in
//! PyTorch (so one value with correction 1 gives NaN). Float inputs only.

use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::kit::*;
use crate::support::*;

fn correction(attrs: &Attrs) -> OpResult<f64> {
    let c = attrs.float_or("correction", 1.0)?;
    if c.is_finite() {
        Ok(c)
    } else {
        Err(invalid!("correction must be finite, got {c}"))
    }
}

fn divisor(n: usize, c: f64) -> f64 {
    (n as f64 - c).max(0.0)
}

fn infer_moment(inputs: &[TensorType], attrs: &Attrs) -> OpResult<Vec<TensorType>> {
    let t = first(inputs)?;
    require_dtype(t.dtype, FLOATS, "input (var and std need a float dtype)")?;
    correction(attrs)?;
    let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
    Ok(vec![TensorType::new(
        t.dtype,
        reduced_shape(&t.shape, &dims, keepdim),
    )])
}

/// Variance of deviations from [`centre`] in the accumulator dtype,
/// reduced (no keepdim).
pub(crate) fn lower_var(b: &mut Builder, xc: &Value, dims: &[usize], c: f64) -> Value {
    let n = count(xc.dims(), dims);
    let (d, _) = centre(b, xc, dims);
    let d2 = bin(b, "multiply", &d, &d);
    let ss = sum_in(b, &d2, dims);
    let dv = splat(b, &ss, divisor(n, c));
    bin(b, "divide", &ss, &dv)
}

fn lower_moment(b: &mut Builder, x: &Value, attrs: &Attrs, sqrt: bool) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let xc = b.convert(x, accumulator(x.dtype()));
    let mut v = lower_var(b, &xc, &dims, correction(attrs)?);
    if sqrt {
        v = b.unary("stablehlo.sqrt", &v);
    }
    let v = b.convert(&v, x.dtype());
    Ok(b.reshape(&v, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

/// Variance of one group.
pub(crate) fn var_of(g: &[f64], c: f64) -> f64 {
    let n = g.len() as f64;
    let mean = g.iter().sum::<f64>() / n;
    let ss: f64 = if g.is_empty() {
        0.0
    } else {
        g.iter().map(|v| (v - mean) * (v - mean)).sum()
    };
    ss / divisor(g.len(), c)
}

fn moment_ref(x: &HostTensor, attrs: &Attrs, sqrt: bool) -> OpResult<HostTensor> {
    let c = correction(attrs)?;
    reduce_f64(x, attrs, x.dtype(), |g| {
        let v = var_of(g, c);
        if sqrt { v.sqrt() } else { v }
    })
}

/// d var / dx = 2 (x - mean) / divisor; d std = d var / (2 std), 0 where
/// std is 0.
fn moment_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>, sqrt: bool) -> OpResult<Vec<Option<Var>>> {
    let xv = a.inputs[0];
    let x = t.ty(xv)?;
    let (dims, _) = reduce_args(&x.shape, a.attrs)?;
    let dv = divisor(count(x.shape.dims(), &dims), correction(a.attrs)?);
    let mean = reduce_call(t, "mean", xv, &dims, true)?;
    let xm = t.sub(xv, mean)?;
    let g = unreduce(t, a.grads[0], &x.shape, &dims)?;
    let gx = t.mul(g, xm)?;
    let grad = if sqrt {
        // Where std is 0 every deviation is 0 too: divide by 1 there, so
        // the gradient is 0 (as in PyTorch) rather than 0/0.
        let y = unreduce(t, a.outputs[0], &x.shape, &dims)?;
        let zero = t.full_like(y, 0.0)?;
        let one = t.full_like(y, 1.0)?;
        let is_zero = t.call1("eq", &[y, zero], Attrs::new())?;
        let y = t.call1("where", &[is_zero, one, y], Attrs::new())?;
        let q = t.div(gx, y)?;
        t.scale(q, 1.0 / dv)?
    } else {
        t.scale(gx, 2.0 / dv)?
    };
    Ok(vec![Some(grad)])
}

#[cfg(feature = "conformance")]
fn moment_sample(g: &mut Gen) -> Sample {
    let mut s = reduce_sample(g, FLOATS);
    match g.below(4) {
        0 => s.attrs.set("correction", 0i64),
        1 => s.attrs.set("correction", 2.0),
        _ => {}
    }
    s
}

macro_rules! moment_op {
    ($name:literal, $sqrt:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::REDUCTION,
                dtypes: FLOATS,
                infer: infer_moment,
                lower: |b, x, attrs| Ok(vec![lower_moment(b, &x[0], attrs, $sqrt)?]),
                reference: |x, attrs| Ok(vec![moment_ref(one(x)?, attrs, $sqrt)?]),
                vjp: Some(|t, a| moment_vjp(t, a, $sqrt)),
                tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
                samples: || (0..12).map(|i| moment_sample(&mut Gen::new(600 + i))).collect(),
                arbitrary: moment_sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

// PyTorch reduces every dim when `dims` is empty, where this op reduces
// none: that case reduces a new trailing dim of size 1 instead.
moment_op!("var", false,
    torch: r#"(lambda d, k: torch.var(x[0], d, correction=a.get("correction", 1), keepdim=k) if d else torch.var(x[0].unsqueeze(-1), -1, correction=a.get("correction", 1)))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);
moment_op!("std", true,
    torch: r#"(lambda d, k: torch.std(x[0], d, correction=a.get("correction", 1), keepdim=k) if d else torch.std(x[0].unsqueeze(-1), -1, correction=a.get("correction", 1)))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);
