//! Reverse-mode differentiation over tensors: a tape that runs every op
//! through the current execution policy, records it, and sweeps the
//! records backwards calling each op's backward rule. The backward ops run
//! through the same tape, so they too are dispatched (and fused) like any
//! other op.

use crate::Device;
use crate::error::{Error, Result};
use crate::op::{Attrs, OpDef, OpResult, Tape, TapeValues, Var, VjpArgs, registry};
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
    values: TapeValues<Tensor>,
    records: Vec<Record>,
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

    /// Calls an op on tape values and records it.
    #[track_caller]
    pub fn op(&mut self, name: &str, inputs: &[Var], attrs: Attrs) -> Result<Vec<Var>> {
        let op = registry()?.get(name)?;
        let tensors = inputs
            .iter()
            .map(|&v| self.value(v).cloned())
            .collect::<Result<Vec<Tensor>>>()?;
        let device = tensors
            .first()
            .map(Tensor::device)
            .or_else(|| self.values.iter().next().map(Tensor::device));
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
        for &v in [output].iter().chain(&seed).chain(wrt) {
            self.value(v)?;
        }
        let seed = match seed {
            Some(s) => s,
            None => {
                let ty = self.value(output)?.ty().clone();
                self.full_var(&ty, 1.0)?
            }
        };
        let mut grads: Vec<Option<Var>> = vec![None; self.values.len()];
        grads[output.index()] = Some(seed);
        let recorded = std::mem::take(&mut self.records);
        for record in recorded.iter().rev() {
            if record
                .outputs
                .iter()
                .all(|o| grads.get(o.index()).copied().flatten().is_none())
            {
                continue;
            }
            if record.op.vjp.is_none() {
                continue;
            }
            let mut output_grads = Vec::with_capacity(record.outputs.len());
            for &o in &record.outputs {
                let g = match grads.get(o.index()).copied().flatten() {
                    Some(g) => g,
                    None => {
                        let ty = self.value(o)?.ty().clone();
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
                grads[input.index()] = Some(match grads[input.index()] {
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
                    .get(v.index())
                    .copied()
                    .flatten()
                    .and_then(|g| self.value(g).ok().cloned())
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
                .filter_map(|&v| self.value(v).ok())
                .map(|t| t.ty().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            device: inputs
                .first()
                .and_then(|&v| self.value(v).ok())
                .map(|t| t.device().to_string())
                .unwrap_or_default(),
            reason: format!("backward rule failed: {reason}"),
        })
    }

    fn full_var(&mut self, ty: &TensorType, value: f64) -> Result<Var> {
        let device = self
            .values
            .iter()
            .next()
            .map_or(Device::Cpu, Tensor::device);
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
            let device = self
                .values
                .iter()
                .next()
                .map_or(Device::Cpu, Tensor::device);
            let outs = call(op, &[], &attrs, Some(device)).map_err(|e| e.to_string())?;
            return Ok(outs.into_iter().map(|t| self.input(t)).collect());
        }
        self.op(op, inputs, attrs).map_err(|e| e.to_string())
    }

    fn ty(&self, v: Var) -> OpResult<TensorType> {
        Ok(self.values.get(v)?.ty().clone())
    }
}

/// A [`Var`] that is not on the tape it was given to.
fn foreign_var(reason: String) -> Error {
    Error::InvalidInput {
        op: "grad tape".to_string(),
        inputs: String::new(),
        device: String::new(),
        reason,
    }
}
