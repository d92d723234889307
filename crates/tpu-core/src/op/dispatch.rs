//! Running one op: inference first (typed errors before any work), then the
//! host reference, or the single-op StableHLO program the policies compile.

use std::fmt::Display;

use super::{Attrs, OpDef, OpError};
use crate::Shape;
use crate::error::{Error, Result};
use crate::host::{HostData, HostTensor};
use crate::stablehlo::{Builder, TensorType};

fn describe(types: &[TensorType]) -> String {
    types
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn invalid(
    op: &OpDef,
    inputs: &[TensorType],
    device: impl Display,
    error: impl Into<OpError>,
) -> Error {
    let OpError { kind, message } = error.into();
    Error::InvalidInput {
        kind,
        op: op.name.to_string(),
        inputs: describe(inputs),
        device: device.to_string(),
        reason: message,
    }
}

/// Checks arity and runs inference: the output types of `op` on `inputs`,
/// or an error naming the op, the inputs and `device` (formatted only for
/// the error: this runs on every op).
pub fn check_inputs(
    op: &OpDef,
    inputs: &[TensorType],
    attrs: &Attrs,
    device: impl Display,
) -> Result<Vec<TensorType>> {
    if !op.arity.accepts(inputs.len()) {
        return Err(invalid(
            op,
            inputs,
            device,
            format!("takes {}, got {}", op.arity, inputs.len()),
        ));
    }
    if let Some(ty) = inputs.iter().find(|t| refuses_complex(op, t)) {
        let reason = OpError::unsupported(format!("takes no {} tensors", ty.dtype));
        return Err(invalid(op, inputs, device, reason));
    }
    let outputs =
        (op.infer)(inputs, attrs).map_err(|reason| invalid(op, inputs, &device, reason))?;
    if let Some(ty) = outputs.iter().find(|t| refuses_complex(op, t)) {
        let reason = OpError::unsupported(format!("makes no {} tensors", ty.dtype));
        return Err(invalid(op, inputs, device, reason));
    }
    let sizes = inputs.iter().map(|t| ("input", t));
    for (what, ty) in sizes.chain(outputs.iter().map(|t| ("output", t))) {
        if tensor_bytes(ty).is_none() {
            let reason = format!(
                "{what} {ty} is larger than any device can hold ({MAX_TENSOR_BYTES} bytes)"
            );
            return Err(invalid(op, inputs, device, reason));
        }
    }
    Ok(outputs)
}

/// True when `ty` is complex and `op` does not list its dtype: the op's
/// reference and lowering were written for real numbers only.
fn refuses_complex(op: &OpDef, ty: &TensorType) -> bool {
    ty.dtype.is_complex() && !op.dtypes.contains(&ty.dtype)
}

/// Checks `op`'s index inputs ([`OpDef::indices`]) on `inputs`, reading
/// each with `read` (only those inputs are read): an index out of range is
/// an `OutOfRange` error naming the op, the index and the size. PyTorch's
/// CPU ops and Debug run this; the device itself clamps or drops such
/// indices.
pub fn check_indices(
    op: &OpDef,
    inputs: &[TensorType],
    attrs: &Attrs,
    device: impl Display,
    mut read: impl FnMut(usize) -> Result<HostTensor>,
) -> Result<()> {
    for bound in (op.indices)(inputs, attrs) {
        if bound.input >= inputs.len() {
            continue;
        }
        let host = read(bound.input)?;
        let HostData::Int(values) = host.data() else {
            continue; // not indices (class probabilities): inference's concern
        };
        if let Some(bad) = bound.first_outside(values.iter().copied()) {
            let reason = format!(
                "index {bad} (input {}) is out of range for {} of size {}",
                bound.input, bound.what, bound.size
            );
            return Err(invalid(op, inputs, device, OpError::out_of_range(reason)));
        }
    }
    Ok(())
}

/// The largest tensor any device holds, in bytes: far above real memories,
/// and low enough that every size a plugin computes from it fits in an i64
/// (an overflow there aborts the process).
pub const MAX_TENSOR_BYTES: u64 = 1 << 48;

/// The bytes of a tensor of type `ty`, if it is at most [`MAX_TENSOR_BYTES`]
/// (every dimension too, so an empty tensor cannot hide a huge one).
pub fn tensor_bytes(ty: &TensorType) -> Option<u64> {
    let dims = ty.shape.dims();
    if dims.iter().any(|&d| d as u64 > MAX_TENSOR_BYTES) {
        return None;
    }
    dims.iter()
        .try_fold(ty.dtype.size_in_bytes() as u64, |n, &d| {
            n.checked_mul(d as u64)
        })
        .filter(|&n| n <= MAX_TENSOR_BYTES)
}

/// Fails unless the host can hold `op`'s `outputs` as reference tensors
/// (8 bytes an element), so a huge creation on `cpu` is an error rather
/// than an allocation failure that aborts the process.
fn check_host_memory(op: &OpDef, outputs: &[TensorType]) -> Result<()> {
    // Small outputs skip the system query: this runs on every `cpu` op.
    const ALWAYS_FITS: u64 = 64 << 20;
    let requested: u64 = outputs
        .iter()
        .map(|t| (t.shape.numel() as u64).saturating_mul(8))
        .fold(0, u64::saturating_add);
    if requested <= ALWAYS_FITS {
        return Ok(());
    }
    match crate::host::available_memory() {
        Some(available) if requested > available => Err(Error::HostOutOfMemory {
            op: op.name.to_string(),
            requested,
            available,
        }),
        _ => Ok(()),
    }
}

/// Runs the op's CPU reference, checking its outputs against inference.
pub fn run_reference(op: &OpDef, inputs: &[HostTensor], attrs: &Attrs) -> Result<Vec<HostTensor>> {
    let types: Vec<TensorType> = inputs.iter().map(HostTensor::ty).collect();
    let expected = check_inputs(op, &types, attrs, "cpu")?;
    check_host_memory(op, &expected)?;
    let outputs =
        (op.reference)(inputs, attrs).map_err(|reason| invalid(op, &types, "cpu", reason))?;
    let actual: Vec<TensorType> = outputs.iter().map(HostTensor::ty).collect();
    if actual != expected {
        return Err(invalid(
            op,
            &types,
            "cpu",
            format!(
                "reference returned ({}) but inference says ({})",
                describe(&actual),
                describe(&expected)
            ),
        ));
    }
    Ok(outputs)
}

/// The StableHLO module computing `op` alone on inputs of `types`.
pub fn single_op_program(op: &OpDef, types: &[TensorType], attrs: &Attrs) -> Result<String> {
    let stored: Vec<&Shape> = types.iter().map(|t| &t.shape).collect();
    single_op_program_over(op, types, &stored, attrs)
}

/// [`single_op_program`], with input `i` passed as a buffer of shape
/// `stored[i]` that holds its elements in row-major order: the program
/// reshapes it first (a free bitcast in XLA), so a reshape never needs a
/// program of its own.
pub fn single_op_program_over(
    op: &OpDef,
    types: &[TensorType],
    stored: &[&Shape],
    attrs: &Attrs,
) -> Result<String> {
    let expected = check_inputs(op, types, attrs, "tpu")?;
    let mut builder = Builder::new(op.name);
    let params: Vec<_> = types
        .iter()
        .zip(stored)
        .map(|(t, &shape)| {
            let param = builder.parameter(TensorType::new(t.dtype, shape.clone()));
            builder.reshape(&param, t.shape.dims())
        })
        .collect();
    let outputs = (op.lower)(&mut builder, &params, attrs)
        .map_err(|reason| invalid(op, types, "tpu", reason))?;
    let actual: Vec<TensorType> = outputs.iter().map(|v| v.ty().clone()).collect();
    if actual != expected {
        return Err(invalid(
            op,
            types,
            "tpu",
            format!(
                "lowering produced ({}) but inference says ({})",
                describe(&actual),
                describe(&expected)
            ),
        ));
    }
    Ok(builder.finish(&outputs))
}
