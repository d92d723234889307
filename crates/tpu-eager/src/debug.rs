//! Debug: Strict, but every op blocks until its outputs exist, so an error
//! surfaces at the call that caused it, named with its inputs and the
//! caller's source location. Optional checks: NaN/Inf in outputs, and parity
//! of every op against its CPU reference (the first diverging op is named).

use tpu_core::host::{HostData, assert_close};
use tpu_core::metrics::CutReason;
use tpu_core::op::{check_indices, run_reference};
use tpu_core::policy::{EagerMode, ExecutionPolicy, OpCall};
use tpu_core::settings::{self, Lookup};
use tpu_core::stablehlo::TensorType;
use tpu_core::{Error, Result, Tensor};

use crate::{Strict, describe, op_failed};

/// Which extra checks Debug runs after each op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DebugChecks {
    /// Fail on NaN or infinity in a float output.
    pub nan: bool,
    /// Compare every output with the op's reference on the same inputs.
    pub parity: bool,
}

impl DebugChecks {
    /// From `TPU_RS_DEBUG_CHECKS`: a comma-separated list of `nan`, `parity`.
    pub fn from_env() -> Result<DebugChecks> {
        DebugChecks::from_lookup(&settings::env)
    }

    /// From `TPU_RS_DEBUG_CHECKS` as `get` gives it; an unknown check is an
    /// error naming the variable.
    pub fn from_lookup(get: Lookup<'_>) -> Result<DebugChecks> {
        let checks = settings::list(get, "TPU_RS_DEBUG_CHECKS", &["nan", "parity"])?;
        Ok(DebugChecks {
            nan: checks.contains(&"nan"),
            parity: checks.contains(&"parity"),
        })
    }
}

/// The Debug policy.
#[derive(Default)]
pub struct Debug {
    strict: Strict,
    checks: DebugChecks,
}

impl Debug {
    /// Debug with the given checks.
    pub fn new(checks: DebugChecks) -> Debug {
        Debug {
            strict: Strict::new(),
            checks,
        }
    }

    /// Debug with the checks `TPU_RS_DEBUG_CHECKS` names.
    pub fn from_env() -> Result<Debug> {
        Ok(Debug::new(DebugChecks::from_env()?))
    }

    fn check(&self, call: &OpCall<'_>, outputs: &[Tensor]) -> Result<()> {
        let location = call.location.to_string();
        if self.checks.nan {
            for (i, out) in outputs.iter().enumerate() {
                let host = out.to_host()?;
                let values: Vec<f64> = match host.data() {
                    HostData::Float(values) => values.iter().copied().collect(),
                    HostData::Complex(z) => z.iter().flat_map(|v| [v.re, v.im]).collect(),
                    HostData::Int(_) => Vec::new(),
                };
                let what = if values.iter().any(|v| v.is_nan()) {
                    Some("NaN")
                } else if values.iter().any(|v| v.is_infinite()) {
                    Some("infinity")
                } else {
                    None
                };
                if let Some(what) = what {
                    return Err(Error::NonFinite {
                        op: call.op.name.to_string(),
                        location,
                        output: i,
                        what,
                    });
                }
            }
        }
        if self.checks.parity {
            let inputs = call
                .inputs
                .iter()
                .map(Tensor::to_host)
                .collect::<Result<Vec<_>>>()?;
            let expected = run_reference(call.op, &inputs, call.attrs)?;
            for (i, (out, want)) in outputs.iter().zip(&expected).enumerate() {
                let got = out.to_host()?;
                if let Err(detail) = assert_close(&got, want, (call.op.tolerance)(want.dtype())) {
                    return Err(Error::Divergence {
                        op: call.op.name.to_string(),
                        location,
                        output: i,
                        detail,
                    });
                }
            }
        }
        Ok(())
    }
}

impl ExecutionPolicy for Debug {
    fn name(&self) -> &'static str {
        EagerMode::Debug.name()
    }

    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>> {
        tracing::debug!(op = call.op.name, inputs = %describe(call.inputs), at = %call.location, "dispatch");
        // Strict names the op in the errors of its compile and launch.
        let fail = |source: Error| match source {
            named @ Error::OpFailed { .. } => named,
            source => op_failed(call.op.name, call.location, call.inputs, source),
        };
        // Index inputs, read back: out of range, the device would clamp or
        // drop them silently.
        let types: Vec<TensorType> = call.inputs.iter().map(|t| t.ty().clone()).collect();
        let device = tpu_core::Device::Tpu(call.device);
        check_indices(call.op, &types, call.attrs, device, |i| {
            call.inputs[i].to_host()
        })?;
        let outputs = self.strict.run(&call).map_err(fail)?;
        for out in &outputs {
            out.elements()
                .and_then(|b| b.block_until_ready())
                .map_err(fail)?;
        }
        self.check(&call, &outputs)?;
        Ok(outputs)
    }

    fn materialize(&self, _tensor: &Tensor) -> Result<()> {
        Ok(())
    }

    fn flush(&self, _reason: CutReason) -> Result<()> {
        Ok(())
    }
}
