//! Elementwise kernels: unary math, powers, comparisons, selection and the
//! fused multiply-adds optimizers run per parameter, each with PyTorch's
//! type promotion and its in-place form.

use tpu_core::op::{Attrs, OpName};
use tpu_core::{DType, Tensor};

use super::{Call, Done, NativeOp, apply, apply_with, error, op};
use crate::error::{BridgeError, Result};
use crate::kernels::{cast, full, fused, number};

/// Registers `name`, whose kernel `f` computes a new tensor.
fn functional(
    ops: &mut Vec<NativeOp>,
    name: &'static str,
    promote: &'static [usize],
    f: impl Fn(&Call<'_>) -> Result<Tensor> + Send + Sync + 'static,
) {
    ops.push(op(name, promote, move |c| Ok(Done::one(f(c)?))));
}

/// Registers `name` (a new tensor) and `inplace` (written into `self`).
fn both(
    ops: &mut Vec<NativeOp>,
    name: &'static str,
    inplace: &'static str,
    promote: &'static [usize],
    f: impl Fn(&Call<'_>) -> Result<Tensor> + Clone + Send + Sync + 'static,
) {
    functional(ops, name, promote, f.clone());
    ops.push(op(inplace, promote, move |c| c.write(0, f(c)?)));
}

/// Unary ops with a float result (integers compute in the default dtype):
/// aten name, its in-place name, the tpu-rs op.
const FLOAT_UNARY: &[(&str, &str, &str)] = &[
    ("exp", "exp_", "exp"),
    ("log", "log_", "log"),
    ("sqrt", "sqrt_", "sqrt"),
    ("rsqrt", "rsqrt_", "rsqrt"),
    ("sin", "sin_", "sin"),
    ("cos", "cos_", "cos"),
    ("tanh", "tanh_", "tanh"),
    ("sigmoid", "sigmoid_", "sigmoid"),
    ("erf", "erf_", "erf"),
    ("reciprocal", "reciprocal_", "reciprocal"),
    ("log1p", "log1p_", "log1p"),
    ("expm1", "expm1_", "expm1"),
];

/// Unary ops that keep the dtype.
const SAME_UNARY: &[(&str, &str, &str)] = &[
    ("neg", "neg_", "neg"),
    ("abs", "abs_", "abs"),
    ("relu", "relu_", "relu"),
];

pub fn register(ops: &mut Vec<NativeOp>) {
    for &(name, inplace, core) in FLOAT_UNARY {
        let core = OpName::new(core);
        let f = move |c: &Call<'_>| {
            let d = float_or(c.dtype(0)?, c.default_float);
            apply(&core, &[cast(c.tensor(0)?, d)?])
        };
        both(ops, name, inplace, &[], f);
    }
    for &(name, inplace, core) in SAME_UNARY {
        let core = OpName::new(core);
        let f = move |c: &Call<'_>| {
            let x = c.tensor(0)?;
            match (core.name(), x.dtype()) {
                // Unsigned: abs is the value itself, neg wraps around.
                ("abs", DType::U8 | DType::U32) => Ok(x),
                ("neg", d @ (DType::U8 | DType::U32)) => {
                    apply(op!("sub"), &[c.constant(d, 0.0)?, x])
                }
                _ => apply(&core, &[x]),
            }
        };
        both(ops, name, inplace, &[], f);
    }
    both(ops, "silu", "silu_", &[], |c| {
        let x = float_input(c, "silu")?;
        let d = x.dtype();
        cast(apply(op!("silu"), &[cast(x, opmath(d))?])?, d)
    });
    both(ops, "pow.Tensor_Scalar", "pow_.Scalar", &[0, 1], pow_scalar);
    functional(ops, "rsub.Tensor", &[0, 1], rsub);
    functional(ops, "rsub.Scalar", &[0, 1], rsub);
    for (name, inplace) in [
        ("eq.Tensor", "eq_.Tensor"),
        ("eq.Scalar", "eq_.Scalar"),
        ("ne.Tensor", "ne_.Tensor"),
        ("ne.Scalar", "ne_.Scalar"),
        ("lt.Tensor", "lt_.Tensor"),
        ("lt.Scalar", "lt_.Scalar"),
        ("le.Tensor", "le_.Tensor"),
        ("le.Scalar", "le_.Scalar"),
        ("gt.Tensor", "gt_.Tensor"),
        ("gt.Scalar", "gt_.Scalar"),
        ("ge.Tensor", "ge_.Tensor"),
        ("ge.Scalar", "ge_.Scalar"),
        ("bitwise_and.Tensor", "bitwise_and_.Tensor"),
        ("bitwise_and.Scalar", "bitwise_and_.Scalar"),
        ("bitwise_or.Tensor", "bitwise_or_.Tensor"),
        ("bitwise_or.Scalar", "bitwise_or_.Scalar"),
        ("bitwise_xor.Tensor", "bitwise_xor_.Tensor"),
        ("bitwise_xor.Scalar", "bitwise_xor_.Scalar"),
    ] {
        both(ops, name, inplace, &[0, 1], promoted_binary(name));
    }
    // No in-place forms in aten.
    functional(ops, "maximum", &[0, 1], promoted_binary("maximum"));
    functional(ops, "minimum", &[0, 1], promoted_binary("minimum"));
    for (name, inplace) in [
        ("logical_and", "logical_and_"),
        ("logical_or", "logical_or_"),
        ("logical_xor", "logical_xor_"),
    ] {
        let f = move |c: &Call<'_>| {
            apply(
                name,
                &[c.operand(0, DType::Bool)?, c.operand(1, DType::Bool)?],
            )
        };
        both(ops, name, inplace, &[], f);
    }
    functional(ops, "logical_not", &[], |c| {
        let x = c.tensor(0)?;
        // A complex number is true where either part is nonzero.
        let x = if x.dtype().is_complex() {
            cast(x, DType::Bool)?
        } else {
            x
        };
        apply(op!("logical_not"), &[x])
    });
    for (name, core) in [("isnan", op!("isnan")), ("isinf", op!("isinf"))] {
        functional(ops, name, &[], move |c| {
            let x = c.tensor(0)?;
            if x.dtype().is_float() {
                return apply(core, &[x]);
            }
            if x.dtype().is_complex() {
                // A complex number is NaN (infinite) where either part is.
                let re = apply(core, &[apply(op!("real"), std::slice::from_ref(&x))?])?;
                let im = apply(core, &[apply(op!("imag"), &[x])?])?;
                return apply(op!("logical_or"), &[re, im]);
            }
            // Integers are never NaN or infinite.
            full(DType::Bool, x.shape().dims(), 0.0, c.device()?)
        });
    }
    both(ops, "bitwise_not", "bitwise_not_", &[], bitwise_not);
    functional(ops, "where.self", &[1, 2], select);
    both(
        ops,
        "masked_fill.Scalar",
        "masked_fill_.Scalar",
        &[],
        masked_fill,
    );
    both(
        ops,
        "masked_fill.Tensor",
        "masked_fill_.Tensor",
        &[],
        masked_fill,
    );
    // One program each, even under Strict: PyTorch's CPU kernels compute
    // these with fused multiply-adds, which XLA forms only within a program
    // (as single-op programs they were an ulp off on 10-25% of elements).
    both(ops, "lerp.Scalar", "lerp_.Scalar", &[], |c| {
        fused(|| lerp(c))
    });
    both(ops, "lerp.Tensor", "lerp_.Tensor", &[], |c| {
        fused(|| lerp(c))
    });
    both(ops, "addcmul", "addcmul_", &[0, 1, 2], |c| {
        fused(|| addcmul(c))
    });
    both(ops, "addcdiv", "addcdiv_", &[0, 1, 2], |c| {
        fused(|| addcdiv(c))
    });
    functional(ops, "tanh_backward", &[], tanh_backward);
    functional(ops, "sigmoid_backward", &[], sigmoid_backward);
    functional(ops, "threshold_backward", &[], threshold_backward);
    both(ops, "gelu", "gelu_", &[], gelu);
    functional(ops, "gelu_backward", &[], gelu_backward);
}

/// Tensor argument 0, which must be a float tensor (activations PyTorch
/// does not define for integers).
fn float_input(c: &Call<'_>, op: &str) -> Result<Tensor> {
    let d = c.dtype(0)?;
    if !d.is_float() {
        return Err(BridgeError::Unsupported(format!(
            "\"{op}\" is not implemented for {d} tensors"
        )));
    }
    c.tensor(0)
}

/// The tpu-rs op of the overload `name` (`eq.Scalar` -> `eq`) on both
/// operands in their promoted dtype.
fn promoted_binary(
    name: &'static str,
) -> impl Fn(&Call<'_>) -> Result<Tensor> + Clone + Send + Sync {
    let core = OpName::new(name.split('.').next().unwrap_or(name));
    move |c| {
        let d = c.promoted()?;
        apply(&core, &[c.operand(0, d)?, c.operand(1, d)?])
    }
}

/// `d`, or `default` when `d` is not a float (true division, `exp` of an
/// integer).
pub fn float_or(d: DType, default: DType) -> DType {
    if d.is_inexact() { d } else { default }
}

/// `x ** e` by products, square roots and reciprocals for the exponents
/// PyTorch's CPU kernel computes so (bit for bit as it does), else `pow`.
fn pow_scalar(c: &Call<'_>) -> Result<Tensor> {
    let d = c.promoted()?;
    let e = c.number(1)?;
    let integer_exponent = c.dtype(1)? == DType::I64;
    if integer_exponent && e < 0.0 && !d.is_inexact() && d != DType::Bool {
        return Err(error(
            "Integers to negative integer powers are not allowed.",
        ));
    }
    let x = cast(c.tensor(0)?, d)?;
    let mul = |a: &Tensor, b: &Tensor| apply(op!("mul"), &[a.clone(), b.clone()]);
    let by_value = if c.dtype(1)? == DType::Bool {
        None
    } else if e == 2.0 {
        Some(mul(&x, &x)?)
    } else if e == 3.0 {
        Some(mul(&mul(&x, &x)?, &x)?)
    } else if !d.is_float() {
        None
    } else if e == 0.5 {
        Some(apply(op!("sqrt"), std::slice::from_ref(&x))?)
    } else if e == -0.5 {
        Some(apply(
            op!("reciprocal"),
            &[apply(op!("sqrt"), std::slice::from_ref(&x))?],
        )?)
    } else if e == -1.0 {
        Some(apply(op!("reciprocal"), std::slice::from_ref(&x))?)
    } else if e == -2.0 {
        Some(apply(op!("reciprocal"), &[mul(&x, &x)?])?)
    } else {
        None
    };
    match by_value {
        Some(v) => Ok(v),
        None => apply(op!("pow"), &[x, c.operand(1, d)?]),
    }
}

/// `other - alpha * self`.
fn rsub(c: &Call<'_>) -> Result<Tensor> {
    if c.dtype(0)? == DType::Bool || c.dtype(1)? == DType::Bool {
        return Err(BridgeError::Unsupported(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying \
             to invert a mask, use the `~` or `logical_not()` operator instead."
                .into(),
        ));
    }
    let d = c.promoted()?;
    let alpha = if c.has(2) { c.number(2)? } else { 1.0 };
    let mut x = c.operand(0, d)?;
    if alpha != 1.0 {
        x = apply(op!("mul"), &[x, c.constant(d, alpha)?])?;
    }
    apply(op!("sub"), &[c.operand(1, d)?, x])
}

/// `where(condition, self, other)` in their promoted dtype.
fn select(c: &Call<'_>) -> Result<Tensor> {
    let d = c.promoted()?;
    let condition = c.tensor(0)?;
    apply(
        op!("where"),
        &[condition, c.operand(1, d)?, c.operand(2, d)?],
    )
}

/// `self` with `value` where `mask` is set.
fn masked_fill(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(0)?;
    let mask = c.dtype(1)?;
    if mask != DType::Bool {
        return Err(error(format!(
            "masked_fill_ only supports boolean masks, but got mask with dtype {mask}"
        )));
    }
    if c.is_tensor(2) && !c.sizes(2)?.is_empty() {
        return Err(error(format!(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
            c.sizes(2)?.len()
        )));
    }
    apply(
        op!("where"),
        &[c.tensor(1)?, c.operand(2, d)?, c.tensor(0)?],
    )
}

/// `self + weight * (end - self)`, as PyTorch's CPU kernel computes it:
/// from `end` when `|weight| >= 0.5`, which keeps `weight = 1` exact.
fn lerp(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(0)?;
    if !d.is_float() {
        return Err(BridgeError::Unsupported(format!(
            "lerp is not implemented for {d} tensors"
        )));
    }
    for (i, what) in [(1, "end"), (2, "weight")] {
        if c.is_tensor(i) && c.dtype(i)? != d {
            return Err(error(format!(
                "expected dtype {d} for `{what}` but got dtype {}",
                c.dtype(i)?
            )));
        }
    }
    let m = opmath(d);
    let weight = if c.is_tensor(2) {
        Weight::Tensor(cast(c.tensor(2)?, m)?)
    } else {
        Weight::Number(c.number(2)?)
    };
    let x = cast(c.tensor(0)?, m)?;
    cast(lerp_in(c, x, cast(c.tensor(1)?, m)?, weight, m)?, d)
}

/// A lerp weight: a number, or a tensor in the compute dtype.
pub enum Weight {
    /// One number for every element.
    Number(f64),
    /// A weight per element.
    Tensor(Tensor),
}

/// `x + w * (end - x)` in `m` (`x` and `end` in it already), from `end`
/// when `|w| >= 0.5`, as PyTorch's CPU kernel computes it: that keeps
/// `w = 1` exact.
pub fn lerp_in(c: &Call<'_>, x: Tensor, end: Tensor, weight: Weight, m: DType) -> Result<Tensor> {
    let diff = apply(op!("sub"), &[end.clone(), x.clone()])?;
    match weight {
        Weight::Number(w) if w.abs() < 0.5 => apply(
            op!("add"),
            &[x, apply(op!("mul"), &[c.constant(m, w)?, diff])?],
        ),
        Weight::Number(w) => apply(
            op!("sub"),
            &[
                end,
                apply(op!("mul"), &[diff, c.constant(m, one_minus(w, m))?])?,
            ],
        ),
        Weight::Tensor(w) => {
            let small = apply(
                op!("lt"),
                &[
                    apply(op!("abs"), std::slice::from_ref(&w))?,
                    c.constant(m, 0.5)?,
                ],
            )?;
            let near_self = apply(
                op!("add"),
                &[x, apply(op!("mul"), &[w.clone(), diff.clone()])?],
            )?;
            let one_minus = apply(op!("sub"), &[c.constant(m, 1.0)?, w])?;
            let near_end = apply(op!("sub"), &[end, apply(op!("mul"), &[diff, one_minus])?])?;
            apply(op!("where"), &[small, near_self, near_end])
        }
    }
}

/// `1 - w` as PyTorch's lerp computes it: in `m`, from `w` rounded to `m`.
fn one_minus(w: f64, m: DType) -> f64 {
    if m == DType::F32 {
        f64::from(1.0f32 - w as f32)
    } else {
        1.0 - w
    }
}

/// The dtype PyTorch's CPU kernels compute a dtype's arithmetic in: f32
/// for the half types (rounded once at the end), else the dtype itself.
pub fn opmath(d: DType) -> DType {
    if matches!(d, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        d
    }
}

/// `self + value * t1 <op> t2`, evaluated left to right as the CPU does.
fn pointwise(c: &Call<'_>, op: &OpName) -> Result<Tensor> {
    let d = c.promoted()?;
    let m = opmath(d);
    let operand = |i: usize| cast(c.operand(i, d)?, m);
    let (re, im) = if c.has(3) {
        c.complex_number(3)?
    } else {
        (1.0, 0.0)
    };
    let mut t1 = operand(1)?;
    if (re, im) != (1.0, 0.0) {
        t1 = apply(op!("mul"), &[number(m, re, im, c.device()?)?, t1])?;
    }
    let term = apply(op, &[t1, operand(2)?])?;
    cast(apply(op!("add"), &[operand(0)?, term])?, d)
}

fn addcmul(c: &Call<'_>) -> Result<Tensor> {
    pointwise(c, op!("mul"))
}

fn addcdiv(c: &Call<'_>) -> Result<Tensor> {
    if !c.dtype(1)?.is_inexact() && !c.dtype(2)?.is_inexact() {
        return Err(error(
            "Integer division with addcdiv is no longer supported, and in a future release \
             addcdiv will perform a true division of tensor1 and tensor2. Use \
             torch.floor_divide instead.",
        ));
    }
    pointwise(c, op!("div"))
}

/// `~x`: logical for bool, else `x ^ all-ones` (-1 in signed types, the
/// maximum in unsigned ones).
fn bitwise_not(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(0)?;
    let x = c.tensor(0)?;
    let ones = match d {
        DType::Bool => return apply(op!("logical_not"), &[x]),
        DType::U8 => f64::from(u8::MAX),
        DType::U32 => f64::from(u32::MAX),
        d if d.is_float() => {
            return Err(BridgeError::Unsupported(format!(
                "bitwise_not is not implemented for {d} tensors"
            )));
        }
        _ => -1.0,
    };
    apply(op!("bitwise_xor"), &[x, c.constant(d, ones)?])
}

/// `y` itself, or its conjugate when complex: the derivative factors of
/// complex gradients are conjugated.
fn conj(y: Tensor) -> Result<Tensor> {
    if y.dtype().is_complex() {
        apply(op!("conj"), &[y])
    } else {
        Ok(y)
    }
}

/// `grad * (1 - y * y)`.
fn tanh_backward(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(1)?;
    let m = opmath(d);
    let y = conj(cast(c.tensor(1)?, m)?)?;
    let one_minus = apply(
        op!("sub"),
        &[c.constant(m, 1.0)?, apply(op!("mul"), &[y.clone(), y])?],
    )?;
    cast(apply(op!("mul"), &[c.operand(0, m)?, one_minus])?, d)
}

/// `grad * (1 - y) * y`, in the CPU's order.
fn sigmoid_backward(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(1)?;
    let m = opmath(d);
    let y = conj(cast(c.tensor(1)?, m)?)?;
    let one_minus = apply(op!("sub"), &[c.constant(m, 1.0)?, y.clone()])?;
    cast(
        apply(
            op!("mul"),
            &[apply(op!("mul"), &[c.operand(0, m)?, one_minus])?, y],
        )?,
        d,
    )
}

/// `grad` where `self > threshold`, else 0.
fn threshold_backward(c: &Call<'_>) -> Result<Tensor> {
    let d = c.dtype(1)?;
    let g = c.dtype(0)?;
    let keep = apply(op!("gt"), &[c.tensor(1)?, c.operand(2, d)?])?;
    apply(op!("where"), &[keep, c.tensor(0)?, c.constant(g, 0.0)?])
}

fn approximate(c: &Call<'_>, i: usize) -> Result<&'static str> {
    match c.text(i)?.unwrap_or("none") {
        "none" => Ok("none"),
        "tanh" => Ok("tanh"),
        other => Err(error(format!(
            "approximate argument must be either none or tanh, got {other}"
        ))),
    }
}

/// GELU, computed in f32 for the half types as the CPU does.
fn gelu(c: &Call<'_>) -> Result<Tensor> {
    let how = approximate(c, 1)?;
    let x = float_input(c, "gelu")?;
    let d = x.dtype();
    let out = apply_with(
        op!("gelu"),
        &[cast(x, opmath(d))?],
        Attrs::new().with("approximate", how),
    )?;
    cast(out, d)
}

/// GELU's backward rule, in f32 for the half types as the CPU does.
fn gelu_backward(c: &Call<'_>) -> Result<Tensor> {
    let how = approximate(c, 2)?;
    let attrs = Attrs::new().with("approximate", how);
    let d = c.dtype(1)?;
    let m = opmath(d);
    let (x, g) = (cast(c.tensor(1)?, m)?, cast(c.tensor(0)?, m)?);
    let grads = crate::ops::vjp_values("gelu", vec![x], vec![Some(g)], attrs, c.device()?)?;
    let grad = grads
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| BridgeError::internal("gelu's backward rule gave no gradient"))?;
    cast(grad, d)
}
