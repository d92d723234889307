//! Reductions and softmax, forward and backward.

use tpu_core::op::Attrs;
use tpu_core::{DType, Tensor};

use super::{Call, Done, NativeOp, apply, apply_with, op, reshape};
use crate::error::{BridgeError, Result};
use crate::kernels::{cast, full};

pub fn register(ops: &mut Vec<NativeOp>) {
    // (overload, tpu-rs op, where its dims, keepdim and dtype arguments sit)
    for (name, core, dims, keepdim, dtype) in [
        ("sum.dim_IntList", "sum", Some(1), Some(2), Some(3)),
        ("sum", "sum", None, None, Some(1)),
        ("mean.dim", "mean", Some(1), Some(2), Some(3)),
        ("mean", "mean", None, None, Some(1)),
        ("amax", "max", Some(1), Some(2), None),
        ("amin", "min", Some(1), Some(2), None),
        ("max", "max", None, None, None),
        ("min", "min", None, None, None),
        ("all", "all", None, None, None),
        ("all.dim", "all", Some(1), Some(2), None),
        ("all.dims", "all", Some(1), Some(2), None),
        ("any", "any", None, None, None),
        ("any.dim", "any", Some(1), Some(2), None),
        ("any.dims", "any", Some(1), Some(2), None),
    ] {
        ops.push(op(name, &[], move |c| {
            let mut x = c.tensor(0)?;
            if let Some(d) = dtype.map(|i| c.scalar_type(i)).transpose()?.flatten() {
                if x.dtype().is_complex() && !d.is_complex() {
                    return Err(super::error(format!(
                        "{name}(): dtype must be complex for complex input, got {d}"
                    )));
                }
                x = cast(x, d)?;
            }
            if matches!(core, "all" | "any") && x.dtype().is_complex() {
                // A complex number is true where either part is nonzero.
                x = cast(x, DType::Bool)?;
            }
            let listed = dims.map(|i| c.dims(i)).transpose()?.flatten();
            let keep = keepdim.map_or(Ok(false), |i| c.flag_or(i, false))?;
            Ok(Done::one(reduce(core, x, listed, keep)?))
        }));
    }
    ops.push(op("isin.Tensor_Tensor", &[0, 1], isin));
    ops.push(op("isin.Tensor_Scalar", &[0, 1], isin));
    // Integers and bools add up in int64, as on the CPU.
    ops.push(op("cumsum", &[], |c| {
        let x = c.tensor(0)?;
        let dtype = match c.scalar_type(2)? {
            Some(d) => d,
            None if x.dtype().is_inexact() => x.dtype(),
            None => DType::I64,
        };
        let attrs = Attrs::new().with("dim", c.int(1)?);
        let sums = apply_with(op!("cumsum"), &[cast(x, dtype)?], attrs)?;
        Ok(Done::one(cast(sums, dtype)?))
    }));
    for (name, core) in [("argmax", op!("argmax")), ("argmin", op!("argmin"))] {
        ops.push(op(name, &[], move |c| {
            let mut attrs = Attrs::new().with("keepdim", c.flag_or(2, false)?);
            if c.has(1) {
                attrs.set("dim", c.int(1)?);
            }
            Ok(Done::one(apply_with(core, &[c.tensor(0)?], attrs)?))
        }));
    }
    for (name, core) in [
        ("_softmax", op!("softmax")),
        ("_log_softmax", op!("log_softmax")),
    ] {
        ops.push(op(name, &[], move |c| {
            let attrs = Attrs::new().with("dim", c.int(1)?);
            let mut out = apply_with(core, &[c.tensor(0)?], attrs)?;
            if c.flag_or(2, false)? && out.dtype().size_in_bytes() == 2 && out.dtype().is_float() {
                out = cast(out, tpu_core::DType::F32)?;
            }
            Ok(Done::one(out))
        }));
    }
    ops.push(op("_safe_softmax", &[], |c| {
        // softmax, with rows that are entirely -inf giving 0, not NaN.
        let mut x = c.tensor(0)?;
        if let Some(d) = c.scalar_type(2)? {
            x = cast(x, d)?;
        }
        let dim = c.int(1)?;
        let out = apply_with(
            op!("softmax"),
            std::slice::from_ref(&x),
            Attrs::new().with("dim", dim),
        )?;
        let minus_inf = c.constant(x.dtype(), f64::NEG_INFINITY)?;
        let masked = reduce(
            "all",
            apply(op!("eq"), &[x, minus_inf])?,
            Some(vec![dim]),
            true,
        )?;
        let zero = c.constant(out.dtype(), 0.0)?;
        Ok(Done::one(apply(op!("where"), &[masked, zero, out])?))
    }));
    ops.push(op("_softmax_backward_data", &[], |c| {
        // g * y - y * sum(g * y)
        let (g, y) = in_opmath(c)?;
        let gy = apply(op!("mul"), &[g, y.clone()])?;
        let s = sum_keep(gy.clone(), c.int(2)?)?;
        let out = apply(op!("sub"), &[gy, apply(op!("mul"), &[y, s])?])?;
        Ok(Done::one(as_input_dtype(c, out)?))
    }));
    ops.push(op("_log_softmax_backward_data", &[], |c| {
        // g - exp(y) * sum(g)
        let (g, y) = in_opmath(c)?;
        let s = sum_keep(g.clone(), c.int(2)?)?;
        let out = apply(
            op!("sub"),
            &[g, apply(op!("mul"), &[apply(op!("exp"), &[y])?, s])?],
        )?;
        Ok(Done::one(as_input_dtype(c, out)?))
    }));
}

/// `core` over `dims` (every dim when none are listed, as PyTorch reads an
/// empty list for these ops).
fn reduce(core: &str, x: Tensor, dims: Option<Vec<i64>>, keepdim: bool) -> Result<Tensor> {
    let all: Vec<i64> = (0..x.shape().rank() as i64).collect();
    let dims = match dims {
        Some(d) if !d.is_empty() => d,
        _ => all,
    };
    apply_with(
        core,
        &[x],
        Attrs::new().with("dims", dims).with("keepdim", keepdim),
    )
}

/// Whether every element of `x` is true (a 0-dim bool).
pub fn all_of(x: Tensor) -> Result<Tensor> {
    reduce("all", x, None, false)
}

fn sum_keep(x: Tensor, dim: i64) -> Result<Tensor> {
    reduce("sum", x, Some(vec![dim]), true)
}

/// A softmax backward's gradient and output, in the dtype the CPU computes
/// them in (f32 for the half types).
fn in_opmath(c: &Call<'_>) -> Result<(Tensor, Tensor)> {
    let m = super::elementwise::opmath(c.dtype(1)?);
    Ok((cast(c.tensor(0)?, m)?, cast(c.tensor(1)?, m)?))
}

/// A backward's result in its input's dtype (argument 3).
fn as_input_dtype(c: &Call<'_>, out: Tensor) -> Result<Tensor> {
    match c.scalar_type(3)? {
        Some(d) => cast(out, d),
        None => Ok(out),
    }
}

/// Most comparisons one `isin` program makes (elements x test elements);
/// past it the elements are compared a block at a time.
const ISIN_PAIRS: usize = 1 << 22;

/// `isin(elements, test_elements or a number, *, assume_unique, invert)`:
/// each element compared with every test element in PyTorch's result
/// type, reduced over the test elements — one program per shape, which a
/// stopping check (`isin(last_tokens, eos_ids)`) keeps the same each step.
fn isin(c: &Call<'_>) -> Result<Done> {
    let d = c.promoted()?;
    let elements = c.tensor(0)?;
    if elements.dtype() == DType::Bool || (c.is_tensor(1) && c.dtype(1)? == DType::Bool) {
        return Err(BridgeError::Unsupported(
            "Unsupported input type encountered for isin(): Bool".into(),
        ));
    }
    let invert = c.flag_or(3, false)?;
    let (compare, reduce_by) = if invert {
        (op!("ne"), "all")
    } else {
        (op!("eq"), "any")
    };
    let shape = elements.shape().dims().to_vec();
    let tests = c.operand(1, d)?;
    let m = tests.shape().numel();
    if m == 0 {
        // Nothing to find: every element is absent.
        let absent = if invert { 1.0 } else { 0.0 };
        return Ok(Done::one(full(DType::Bool, &shape, absent, c.device()?)?));
    }
    let tests = reshape(tests, &[1, m])?;
    let n = elements.shape().numel();
    let flat = reshape(cast(elements, d)?, &[n, 1])?;
    let block = (ISIN_PAIRS / m).max(1);
    let mut parts = Vec::new();
    for start in (0..n.max(1)).step_by(block) {
        let rows = if n <= block {
            flat.clone()
        } else {
            let end = (start + block).min(n) as i64;
            let at = Attrs::new()
                .with("dim", 0i64)
                .with("start", start as i64)
                .with("end", end);
            apply_with(op!("slice"), std::slice::from_ref(&flat), at)?
        };
        let pairs = apply(compare, &[rows, tests.clone()])?;
        parts.push(reduce(reduce_by, pairs, Some(vec![1]), false)?);
    }
    let found = if parts.len() == 1 {
        parts.swap_remove(0)
    } else {
        apply_with(op!("concat"), &parts, Attrs::new().with("dim", 0i64))?
    };
    Ok(Done::one(reshape(found, &shape)?))
}
