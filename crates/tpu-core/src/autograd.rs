//! A tape of tensors on which ops and their backward rules run, each op
//! through the current execution policy (so backward ops are dispatched and
//! fused like any other). It computes one op's vector-Jacobian product (the
//! PyTorch bridge's `vjp`); walking a whole graph backwards is the facade's
//! autograd (`tpu_rs::Tensor::backward`).

use crate::Device;
use crate::error::{Error, Result};
use crate::op::{Attrs, OpDef, OpError, OpErrorKind, OpResult, Tape, TapeValues, Var, VjpArgs};
use crate::policy::call;
use crate::stablehlo::TensorType;
use crate::tensor::Tensor;

/// Tensors, and the ops and backward rules run on them.
#[derive(Default)]
pub struct GradTape {
    values: TapeValues<Tensor>,
}

impl GradTape {
    /// An empty tape.
    pub fn new() -> GradTape {
        GradTape::default()
    }

    /// Puts a tensor on the tape (a leaf).
    pub fn input(&mut self, tensor: Tensor) -> Var {
        self.values.push(tensor)
    }

    /// The tensor behind `v`, or an error if `v` is from another tape.
    pub fn value(&self, v: Var) -> Result<&Tensor> {
        self.values.get(v).map_err(foreign_var)
    }

    /// Calls an op on tape values.
    #[track_caller]
    pub fn op(&mut self, name: &str, inputs: &[Var], attrs: Attrs) -> Result<Vec<Var>> {
        let tensors = inputs
            .iter()
            .map(|&v| self.value(v).cloned())
            .collect::<Result<Vec<Tensor>>>()?;
        let device = tensors
            .first()
            .map(Tensor::device)
            .or_else(|| self.values.iter().next().map(Tensor::device));
        let outs = call(name, &tensors, &attrs, device)?;
        Ok(outs.into_iter().map(|t| self.input(t)).collect())
    }

    /// [`GradTape::op`] for single-output ops.
    #[track_caller]
    pub fn op1(&mut self, name: &str, inputs: &[Var], attrs: Attrs) -> Result<Var> {
        let mut outs = self.op(name, inputs, attrs)?;
        match outs.len() {
            1 => Ok(outs.remove(0)),
            n => Err(Error::InvalidInput {
                kind: OpErrorKind::Invalid,
                op: name.to_string(),
                inputs: String::new(),
                device: String::new(),
                reason: format!("returned {n} outputs where one was expected"),
            }),
        }
    }

    /// Runs `op`'s backward rule on this tape: one gradient (or `None`) per
    /// input. An op without a rule gives no gradients.
    pub fn backward_rule(
        &mut self,
        op: &'static OpDef,
        attrs: &Attrs,
        inputs: &[Var],
        outputs: &[Var],
        grads: &[Var],
    ) -> Result<Vec<Option<Var>>> {
        let Some(vjp) = op.vjp else {
            return Ok(vec![None; inputs.len()]);
        };
        let args = VjpArgs {
            inputs,
            outputs,
            grads,
            attrs,
        };
        vjp(self as &mut dyn Tape, &args).map_err(|e| Error::InvalidInput {
            kind: e.kind,
            op: op.name.to_string(),
            inputs: inputs
                .iter()
                .filter_map(|&v| self.value(v).ok())
                .map(|t| t.ty().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            device: inputs
                .first()
                .and_then(|&v| self.value(v).ok())
                .map(|t| t.device().to_string())
                .unwrap_or_default(),
            reason: format!("backward rule failed: {}", e.message),
        })
    }
}

impl Tape for GradTape {
    fn call(&mut self, op: &str, inputs: &[Var], attrs: Attrs) -> OpResult<Vec<Var>> {
        if inputs.is_empty() {
            // Creation ops (`full`) run where the tape's tensors live.
            let device = self
                .values
                .iter()
                .next()
                .map_or(Device::Cpu, Tensor::device);
            let outs = call(op, &[], &attrs, Some(device))?;
            return Ok(outs.into_iter().map(|t| self.input(t)).collect());
        }
        Ok(self.op(op, inputs, attrs)?)
    }

    fn ty(&self, v: Var) -> OpResult<TensorType> {
        Ok(self.values.get(v)?.ty().clone())
    }
}

/// A [`Var`] that is not on the tape it was given to.
fn foreign_var(e: OpError) -> Error {
    Error::InvalidInput {
        kind: e.kind,
        op: "grad tape".to_string(),
        inputs: String::new(),
        device: String::new(),
        reason: e.message,
    }
}
