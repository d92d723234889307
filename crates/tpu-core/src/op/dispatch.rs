//! Running one op: inference first (typed errors before any work), then the
//! host reference or a single-op StableHLO program on a PJRT device.

use std::fmt::Display;

use super::{Attrs, OpDef};
use crate::Runtime;
use crate::Shape;
use crate::error::{Error, Result};
use crate::host::HostTensor;
use crate::pjrt::{Buffer, CompileOptions};
use crate::stablehlo::{Builder, TensorType};

fn describe(types: &[TensorType]) -> String {
    types
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn invalid(op: &OpDef, inputs: &[TensorType], device: impl Display, reason: String) -> Error {
    Error::InvalidInput {
        op: op.name.to_string(),
        inputs: describe(inputs),
        device: device.to_string(),
        reason,
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
            format!("takes {:?} input(s)", op.arity),
        ));
    }
    (op.infer)(inputs, attrs).map_err(|reason| invalid(op, inputs, device, reason))
}

/// Runs the op's CPU reference, checking its outputs against inference.
pub fn run_reference(op: &OpDef, inputs: &[HostTensor], attrs: &Attrs) -> Result<Vec<HostTensor>> {
    let types: Vec<TensorType> = inputs.iter().map(HostTensor::ty).collect();
    let expected = check_inputs(op, &types, attrs, "cpu")?;
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

/// Runs `op` on device `device` of `runtime` as a single-op program
/// (compiled once per op, attributes, input types and device).
pub fn run_on_device(
    runtime: &Runtime,
    device: usize,
    op: &OpDef,
    inputs: &[&Buffer],
    attrs: &Attrs,
) -> Result<Vec<Buffer>> {
    let types: Vec<TensorType> = inputs
        .iter()
        .map(|b| TensorType::new(b.dtype(), b.shape().clone()))
        .collect();
    let name = format!("tpu:{device}");
    if let Some(other) = inputs.iter().find(|b| b.device() != device) {
        return Err(invalid(
            op,
            &types,
            &name,
            format!("an input lives on tpu:{}", other.device()),
        ));
    }
    let program = single_op_program(op, &types, attrs).map_err(|e| match e {
        Error::InvalidInput {
            op, inputs, reason, ..
        } => Error::InvalidInput {
            op,
            inputs,
            device: name.clone(),
            reason,
        },
        other => other,
    })?;
    let exe = runtime.compile(&program, &CompileOptions::on_device(device))?;
    exe.run(inputs)
}
