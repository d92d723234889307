//! A tape that evaluates every call immediately with the op references: the
//! oracle against which backward rules are checked.

use super::{Attrs, OpResult, Tape, TapeValues, Var, registry, run_reference};
use crate::host::HostTensor;
use crate::stablehlo::TensorType;

/// Evaluates op calls on host tensors.
#[derive(Default)]
pub struct HostTape {
    values: TapeValues<HostTensor>,
}

impl HostTape {
    /// An empty tape.
    pub fn new() -> HostTape {
        HostTape::default()
    }

    /// Puts a value on the tape.
    pub fn push(&mut self, value: HostTensor) -> Var {
        self.values.push(value)
    }

    /// The value of `v`, or an error if `v` is from another tape.
    pub fn value(&self, v: Var) -> OpResult<&HostTensor> {
        self.values.get(v)
    }
}

impl Tape for HostTape {
    fn call(&mut self, op: &str, inputs: &[Var], attrs: Attrs) -> OpResult<Vec<Var>> {
        let def = registry()
            .and_then(|r| r.get(op))
            .map_err(|e| e.to_string())?;
        let args = inputs
            .iter()
            .map(|&v| self.values.get(v).cloned())
            .collect::<OpResult<Vec<HostTensor>>>()?;
        let outs = run_reference(def, &args, &attrs).map_err(|e| e.to_string())?;
        Ok(outs.into_iter().map(|t| self.push(t)).collect())
    }

    fn ty(&self, v: Var) -> OpResult<TensorType> {
        Ok(self.values.get(v)?.ty())
    }
}
