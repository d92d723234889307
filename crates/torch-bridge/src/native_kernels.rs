//! The Rust half of the C++ aten kernels (`native/kernels.cc`): tpu
//! tensors arrive as their storage's address and view, numbers as values;
//! the op runs under the bridge's policy, exactly as a Python kernel's
//! would; the result comes back as a new storage the C++ tensor owns.

use std::sync::Arc;

use tpu_core::op::Attrs;
use tpu_core::{DType, Tensor};

use crate::error::{BridgeError, Result};
use crate::ffi;
use crate::kernels::{call1, cast};
use crate::kernels::{number, scalar};
use crate::native_ops::{dtype, failure, read, storage_of, store_into};
use crate::storage::Storage;

/// An operand in `dtype` on `device`: a tensor cast to it, or a number made
/// in it.
fn operand(x: &ffi::Operand<'_>, dtype: DType, device: usize) -> Result<Tensor> {
    if x.is_number {
        return number(dtype, x.number, x.imag, device);
    }
    cast(read(&x.tensor)?, dtype)
}

/// The device of the first tensor operand (its storage's; nothing is read).
fn device_of(operands: &[&ffi::Operand<'_>]) -> Result<usize> {
    match operands.iter().find(|x| !x.is_number) {
        Some(x) => Ok(storage_of(&x.tensor)?.device()),
        None => Err(BridgeError::internal("an op without tensor operands")),
    }
}

/// `x * factor` in `dtype` (itself when `factor` is 1).
fn scaled(x: Tensor, factor: f64, dtype: DType, device: usize) -> Result<Tensor> {
    if factor == 1.0 {
        return Ok(x);
    }
    let factor = scalar(dtype, factor, device)?;
    call1(op!("mul"), &[x, factor], &Attrs::new())
}

/// A result as the storage a new C++ tensor owns.
fn hand_over(value: Tensor) -> Result<Arc<Storage>> {
    let storage = Storage::holding(value)?;
    crate::native_ops::hand_over(&storage);
    Ok(storage)
}

/// A kernel's result for C++: the storage (none for an in-place kernel),
/// or the error with the class PyTorch raises for its kind.
pub fn output(result: Result<Option<Arc<Storage>>>) -> ffi::Output {
    match result {
        Ok(storage) => ffi::Output {
            address: storage.as_ref().map_or(0, |s| s.address() as usize),
            nbytes: storage.as_ref().map_or(0, |s| s.nbytes()),
            failure: ffi::Failure::None,
            error: String::new(),
        },
        Err(e) => ffi::Output {
            address: 0,
            nbytes: 0,
            failure: failure(&e),
            error: e.to_string(),
        },
    }
}

/// `a <op> (alpha * b)` computed in `dtype` (elementwise, broadcasting);
/// `alpha` is applied when it is not 1 (add and sub).
fn compute(
    op: ffi::Binary,
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    alpha: f64,
    dtype: DType,
) -> Result<Tensor> {
    let device = device_of(&[a, b])?;
    let x = operand(a, dtype, device)?;
    let y = scaled(operand(b, dtype, device)?, alpha, dtype, device)?;
    let op = match op {
        ffi::Binary::Add => op!("add"),
        ffi::Binary::Sub => op!("sub"),
        ffi::Binary::Mul => op!("mul"),
        ffi::Binary::Div => op!("div"),
        _ => return Err(BridgeError::internal("an unknown binary op code")),
    };
    call1(op, &[x, y], &Attrs::new())
}

/// [`compute`] as a new tensor's storage.
pub fn binary(
    op: ffi::Binary,
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    alpha: f64,
    out_dtype: ffi::Dtype,
) -> Result<Arc<Storage>> {
    hand_over(compute(op, a, b, alpha, dtype(out_dtype)?)?)
}

/// [`compute`] written through the tpu tensor `out` (cast to its dtype,
/// broadcast to its shape): the in-place forms.
pub fn binary_into(
    op: ffi::Binary,
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    alpha: f64,
    compute_dtype: ffi::Dtype,
    out: &ffi::TensorRef<'_>,
) -> Result<()> {
    let value = compute(op, a, b, alpha, dtype(compute_dtype)?)?;
    store_into(out, value)
}

/// `beta * bias + alpha * (a @ b)` in `dtype` (mm, bmm, addmm, baddbmm):
/// the bias only when there is one and `beta` is not 0 (then even its NaNs
/// are ignored, as PyTorch does).
pub fn matmul(
    a: &ffi::Operand<'_>,
    b: &ffi::Operand<'_>,
    bias: Option<&ffi::Operand<'_>>,
    alpha: f64,
    beta: f64,
    out_dtype: ffi::Dtype,
) -> Result<Arc<Storage>> {
    let dtype = dtype(out_dtype)?;
    let device = device_of(&[a, b])?;
    let x = operand(a, dtype, device)?;
    let y = operand(b, dtype, device)?;
    let product = call1(op!("matmul"), &[x, y], &Attrs::new())?;
    let product = scaled(product, alpha, dtype, device)?;
    let value = match bias {
        Some(bias) if beta != 0.0 => {
            let bias = scaled(operand(bias, dtype, device)?, beta, dtype, device)?;
            call1(op!("add"), &[bias, product], &Attrs::new())?
        }
        _ => product,
    };
    hand_over(value)
}
