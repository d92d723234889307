//! The `_foreach_*` kernels that optimizers' default (`foreach`) paths and
//! `clip_grad_norm_` call on lists of float tensors: each call runs as one
//! deferred graph even under Strict ([`crate::kernels::fused`]), so an
//! AdamW step is a handful of programs instead of one per op and
//! parameter. Each tensor's result is computed exactly as the per-tensor
//! native kernel PyTorch's composite would call computes it, so values do
//! not change. Calls these do not cover (integer tensors, shapes that
//! differ within a pair, tensor scalars for `addcmul`/`addcdiv`) decline to
//! that composite.

use tpu_core::op::OpName;
use tpu_core::{DType, Tensor};

use super::elementwise::{Weight, lerp_in, opmath};
use super::{Call, Done, NativeOp, Value, apply, dtype, error, op, read, store_into};
use crate::error::Result;
use crate::ffi;
use crate::kernels::{cast, fused};

/// Where a foreach op's second operand comes from, by overload.
#[derive(Clone, Copy, PartialEq)]
enum Other {
    /// `.Scalar`: one number for every tensor.
    Scalar,
    /// `.ScalarList`: a number per tensor.
    ScalarList,
    /// `.List`: a tensor per tensor.
    List,
    /// `.Tensor`: one 0-dim tensor (or number) for every tensor.
    Tensor,
}

impl Other {
    fn suffix(self) -> &'static str {
        match self {
            Other::Scalar => "Scalar",
            Other::ScalarList => "ScalarList",
            Other::List => "List",
            Other::Tensor => "Tensor",
        }
    }
}

const ALL: [Other; 4] = [Other::Scalar, Other::ScalarList, Other::List, Other::Tensor];

/// A table name built once at registration.
fn name(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// Registers `_foreach_{base}.{overload}` (new tensors) and
/// `_foreach_{base}_.{overload}` (in place); `overload` empty for the
/// default one.
fn both(
    ops: &mut Vec<NativeOp>,
    base: &str,
    overload: &str,
    f: impl Fn(&Call<'_>, usize) -> Result<Option<Tensor>> + Copy + Send + Sync + 'static,
) {
    let dot = if overload.is_empty() { "" } else { "." };
    ops.push(op(
        name(format!("_foreach_{base}{dot}{overload}")),
        &[],
        move |c| fused(|| each(c, f, false)),
    ));
    ops.push(op(
        name(format!("_foreach_{base}_{dot}{overload}")),
        &[],
        move |c| fused(|| each(c, f, true)),
    ));
}

pub fn register(ops: &mut Vec<NativeOp>) {
    for (base, core, overloads) in [
        ("add", op!("add"), &ALL[..]),
        ("sub", op!("sub"), &ALL[..3]),
        ("mul", op!("mul"), &ALL[..]),
        ("div", op!("div"), &ALL[..]),
    ] {
        for &other in overloads {
            both(ops, base, other.suffix(), move |c, i| {
                binary(c, i, core, other)
            });
        }
    }
    for other in [Other::Scalar, Other::ScalarList, Other::List] {
        both(ops, "lerp", other.suffix(), move |c, i| lerp(c, i, other));
    }
    for (base, core) in [("addcmul", op!("mul")), ("addcdiv", op!("div"))] {
        for other in [Other::Scalar, Other::ScalarList] {
            both(ops, base, other.suffix(), move |c, i| {
                pointwise(c, i, core, other)
            });
        }
    }
    for (base, core) in [("sqrt", op!("sqrt")), ("neg", op!("neg"))] {
        both(ops, base, "", move |c, i| {
            let (x, _) = first(c, i, &[])?;
            x.map(|x| apply(core, &[x])).transpose()
        });
    }
}

/// Runs `f` for every tensor of list argument 0 and writes each result
/// into it (`in_place`) or returns them as new tensors. `f` answering
/// `None` for any tensor declines the whole call before anything is
/// written (PyTorch's per-tensor composite then runs it).
fn each(
    c: &Call<'_>,
    f: impl Fn(&Call<'_>, usize) -> Result<Option<Tensor>>,
    in_place: bool,
) -> Result<Done> {
    let targets = c.tensors(0)?;
    let mut results = Vec::with_capacity(targets.len());
    for i in 0..targets.len() {
        match f(c, i)? {
            Some(value) => results.push(value),
            None => return Ok(Done::Declined),
        }
    }
    if in_place {
        for (target, value) in targets.iter().zip(results) {
            store_into(target, value)?;
        }
        return Ok(Done::Written);
    }
    Ok(Done::Values(
        results.into_iter().map(|t| Some(Value::Plain(t))).collect(),
    ))
}

/// Tensor `i` of list argument 0 and the result type over it and the
/// lists at `others` (tensor `i` of each): `None` unless all are float
/// tensors of its shape.
fn first(c: &Call<'_>, i: usize, others: &[usize]) -> Result<(Option<Tensor>, DType)> {
    let own = &c.tensors(0)?[i];
    let d = dtype(own.dtype)?;
    let mut result = d;
    for &k in others {
        let other = list_item(c, k, i)?;
        let od = dtype(other.dtype)?;
        if other.sizes != own.sizes || !od.is_float() {
            return Ok((None, d));
        }
        result = promote_floats(result, od);
    }
    if !d.is_float() {
        return Ok((None, d));
    }
    Ok((Some(read(own)?), result))
}

/// PyTorch's result type of two float dtypes.
fn promote_floats(a: DType, b: DType) -> DType {
    match (a, b) {
        _ if a == b => a,
        (DType::F64, _) | (_, DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

/// Tensor `i` of list argument `k`, checking the lists match in length.
fn list_item<'a>(c: &Call<'a>, k: usize, i: usize) -> Result<&'a ffi::TensorRef<'a>> {
    let (list, n) = (c.tensors(k)?, c.tensors(0)?.len());
    if list.len() != n {
        return Err(error(format!(
            "Tensor lists must have the same number of tensors, got {n} and {}",
            list.len()
        )));
    }
    Ok(&list[i])
}

/// Number `i` of `Scalar[]` argument `k`, checking its length.
fn list_number(c: &Call<'_>, k: usize, i: usize) -> Result<f64> {
    let (numbers, n) = (c.numbers(k)?, c.tensors(0)?.len());
    if numbers.len() != n {
        return Err(error(format!(
            "Tensor list must have same number of elements as scalar list, got {n} and {}",
            numbers.len()
        )));
    }
    Ok(numbers[i])
}

/// `x <op> y * alpha` (alpha, argument 2, for add and sub with tensors),
/// as PyTorch's CPU computes each tensor's op: half types in float32,
/// rounded once, with numbers rounded to the half type first (a divisor or
/// a 0-dim tensor to float32).
fn binary(c: &Call<'_>, i: usize, core: &OpName, other: Other) -> Result<Option<Tensor>> {
    let lists: &[usize] = if other == Other::List { &[1] } else { &[] };
    let (Some(x), d) = first(c, i, lists)? else {
        return Ok(None);
    };
    if other == Other::Tensor && c.is_tensor(1) {
        // PyTorch's own checks (a 0-dim tensor) and its integer promotion.
        let scalar = c.tensor_ref(1)?;
        if !scalar.sizes.is_empty() || !dtype(scalar.dtype)?.is_float() {
            return Ok(None);
        }
    }
    let m = opmath(d);
    // A number as PyTorch holds it: in `d`, or in `m` for a divisor.
    let number = |v: f64| -> Result<Tensor> {
        if core.name() == "div" {
            c.constant(m, v)
        } else {
            cast(c.constant(d, v)?, m)
        }
    };
    let mut y = match other {
        Other::Scalar => number(c.number(1)?)?,
        Other::ScalarList => number(list_number(c, 1, i)?)?,
        Other::List => cast(read(list_item(c, 1, i)?)?, m)?,
        // A 0-dim tensor keeps its own precision (PyTorch reads it as an
        // opmath scalar).
        Other::Tensor => c.operand(1, m)?,
    };
    let alpha = if matches!(other, Other::List | Other::Tensor) && c.has(2) {
        c.number(2)?
    } else {
        1.0
    };
    if alpha != 1.0 {
        y = apply(op!("mul"), &[y, cast(c.constant(d, alpha)?, m)?])?;
    }
    Ok(Some(cast(apply(core, &[cast(x, m)?, y])?, d)?))
}

/// `x + w * (end - x)`, from `end` when `|w| >= 0.5` as PyTorch computes
/// it: arguments self, end (a list), weight (argument 2 per `other`).
fn lerp(c: &Call<'_>, i: usize, other: Other) -> Result<Option<Tensor>> {
    let lists: &[usize] = if other == Other::List { &[1, 2] } else { &[1] };
    let (Some(x), d) = first(c, i, lists)? else {
        return Ok(None);
    };
    let m = opmath(d);
    let weight = match other {
        Other::List => Weight::Tensor(cast(read(list_item(c, 2, i)?)?, m)?),
        Other::ScalarList => Weight::Number(list_number(c, 2, i)?),
        _ => Weight::Number(c.number(2)?),
    };
    let end = cast(read(list_item(c, 1, i)?)?, m)?;
    Ok(Some(cast(lerp_in(c, cast(x, m)?, end, weight, m)?, d)?))
}

/// `x + value * t1 <op> t2` left to right, as PyTorch's CPU kernel:
/// arguments self, tensor1, tensor2 (lists), value (argument 3).
fn pointwise(c: &Call<'_>, i: usize, core: &OpName, other: Other) -> Result<Option<Tensor>> {
    let (Some(x), d) = first(c, i, &[1, 2])? else {
        return Ok(None);
    };
    let m = opmath(d);
    let x = cast(x, m)?;
    let value = match other {
        Other::ScalarList => list_number(c, 3, i)?,
        _ if c.has(3) => c.number(3)?,
        _ => 1.0,
    };
    let mut t1 = cast(read(list_item(c, 1, i)?)?, m)?;
    if value != 1.0 {
        t1 = apply(op!("mul"), &[c.constant(m, value)?, t1])?;
    }
    let term = apply(core, &[t1, cast(read(list_item(c, 2, i)?)?, m)?])?;
    Ok(Some(cast(apply(op!("add"), &[x, term])?, d)?))
}
