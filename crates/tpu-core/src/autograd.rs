//! Reverse-mode differentiation over tensors: a tape that runs every op
//! through the current execution policy, records it, and sweeps the
//! records backwards calling each op's backward rule. The backward ops run
//! through the same tape, so they too are dispatched (and fused) like any
//! other op.

use crate::Device;
use crate::error::{Error, Result};
use crate::op::{Attrs, OpDef, OpResult, Tape, Var, VjpArgs, registry};
use crate::policy::{call, end_of_backward};
use crate::stablehlo::TensorType;
use crate::tensor::Tensor;

struct Record {
    op: &'static OpDef,
    inputs: Vec<Var>,
    outputs: Vec<Var>,
    attrs: Attrs,
}

/// A recording of op calls on tensors, differentiable with [`GradTape::grad`].
#[derive(Default)]
pub struct GradTape {
    values: Vec<Tensor>,
    records: Vec<Record>,
}

impl GradTape {
    /// An empty tape.
    pub fn new() -> GradTape {
        GradTape::default()
    }

    /// Puts a tensor on the tape (a leaf).
    pub fn input(&mut self, tensor: Tensor) -> Var {
        self.values.push(tensor);
        Var(self.values.len() - 1)
    }

    /// The tensor behind `v`.
    pub fn value(&self, v: Var) -> &Tensor {
        &self.values[v.0]
    }

    /// Calls an op on tape values and records it.
    #[track_caller]
    pub fn op(&mut self, name: &str, inputs: &[Var], attrs: Attrs) -> Result<Vec<Var>> {
        let op = registry()?.get(name)?;
        let tensors: Vec<Tensor> = inputs.iter().map(|v| self.values[v.0].clone()).collect();
        let device = tensors
            .first()
            .map(Tensor::device)
            .or_else(|| self.values.first().map(Tensor::device));
        let outs = call(name, &tensors, &attrs, device)?;
        let outputs: Vec<Var> = outs.into_iter().map(|t| self.input(t)).collect();
        self.records.push(Record {
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
            attrs,
        });
        Ok(outputs)
    }

    /// [`GradTape::op`] for single-output ops.
    #[track_caller]
    pub fn op1(&mut self, name: &str, inputs: &[Var], attrs: Attrs) -> Result<Var> {
        let mut outs = self.op(name, inputs, attrs)?;
        match outs.len() {
            1 => Ok(outs.remove(0)),
            n => Err(Error::InvalidInput {
                op: name.to_string(),
                inputs: String::new(),
                device: String::new(),
                reason: format!("returned {n} outputs where one was expected"),
            }),
        }
    }

    /// Gradients of `output` (with incoming gradient `seed`, ones when
    /// `None`) with respect to `wrt`. `None` for inputs `output` does not
    /// depend on. Ends with a backward cut for deferred policies.
    pub fn grad(
        &mut self,
        output: Var,
        seed: Option<Var>,
        wrt: &[Var],
    ) -> Result<Vec<Option<Tensor>>> {
        let seed = match seed {
            Some(s) => s,
            None => {
                let ty = self.ty(output);
                self.full_var(&ty, 1.0)?
            }
        };
        let mut grads: Vec<Option<Var>> = vec![None; self.values.len()];
        grads[output.0] = Some(seed);
        let recorded = std::mem::take(&mut self.records);
        for record in recorded.iter().rev() {
            if record
                .outputs
                .iter()
                .all(|o| grads.get(o.0).copied().flatten().is_none())
            {
                continue;
            }
            if record.op.vjp.is_none() {
                continue;
            }
            let mut output_grads = Vec::with_capacity(record.outputs.len());
            for &o in &record.outputs {
                let g = match grads.get(o.0).copied().flatten() {
                    Some(g) => g,
                    None => {
                        let ty = self.ty(o);
                        self.full_var(&ty, 0.0)?
                    }
                };
                output_grads.push(g);
            }
            let input_grads = self.backward_rule(
                record.op,
                &record.attrs,
                &record.inputs,
                &record.outputs,
                &output_grads,
            )?;
            if grads.len() < self.values.len() {
                grads.resize(self.values.len(), None);
            }
            for (input, g) in record.inputs.iter().zip(input_grads) {
                let Some(g) = g else { continue };
                grads[input.0] = Some(match grads[input.0] {
                    Some(acc) => self.op1("add", &[acc, g], Attrs::new())?,
                    None => g,
                });
            }
        }
        self.records = recorded;
        let result = wrt
            .iter()
            .map(|v| {
                grads
                    .get(v.0)
                    .copied()
                    .flatten()
                    .map(|g| self.values[g.0].clone())
            })
            .collect();
        end_of_backward()?;
        Ok(result)
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
        vjp(self as &mut dyn Tape, &args).map_err(|reason| Error::InvalidInput {
            op: op.name.to_string(),
            inputs: inputs
                .iter()
                .map(|v| self.ty(*v).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            device: inputs
                .first()
                .map(|v| self.values[v.0].device().to_string())
                .unwrap_or_default(),
            reason: format!("backward rule failed: {reason}"),
        })
    }

    fn full_var(&mut self, ty: &TensorType, value: f64) -> Result<Var> {
        let device = self.values.first().map_or(Device::Cpu, Tensor::device);
        let attrs = Attrs::new()
            .with("shape", ty.shape.dims())
            .with("dtype", ty.dtype)
            .with("value", value);
        let out = call("full", &[], &attrs, Some(device))?;
        out.into_iter()
            .next()
            .map(|t| self.input(t))
            .ok_or_else(|| Error::UnknownOp {
                name: "full".into(),
                known: String::new(),
            })
    }
}

impl Tape for GradTape {
    fn call(&mut self, op: &str, inputs: &[Var], attrs: Attrs) -> OpResult<Vec<Var>> {
        if inputs.is_empty() {
            // Creation ops (`full`) run where the tape's tensors live.
            let device = self.values.first().map_or(Device::Cpu, Tensor::device);
            let outs = call(op, &[], &attrs, Some(device)).map_err(|e| e.to_string())?;
            return Ok(outs.into_iter().map(|t| self.input(t)).collect());
        }
        self.op(op, inputs, attrs).map_err(|e| e.to_string())
    }

    fn ty(&self, v: Var) -> TensorType {
        self.values[v.0].ty().clone()
    }
}
