//! A block: a fixed sequence of op calls over numbered inputs, recorded
//! once (a compiled graph's first run) and run again on new inputs of the
//! same types. Every call's output types are known in advance, so a run
//! skips shape inference, and a policy may take the whole block at once
//! (DeferAndFuse records it into its pending graph in one step).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::op::{Attrs, Flags, OpDef, OpErrorKind, OpId};
use crate::policy::{ExecutionPolicy, OpCall};
use crate::profile::{self, CallSite};
use crate::stablehlo::TensorType;
use crate::tensor::Tensor;

/// Where a call's input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockSrc {
    /// The block's input `i`.
    Input(usize),
    /// Output `j` of the block's call `c`.
    Output(usize, usize),
}

/// One recorded call.
pub struct BlockCall {
    /// The op.
    pub op: &'static OpDef,
    /// Its interned id.
    pub id: OpId,
    /// The attributes (shared with the graph nodes a policy makes of it).
    pub attrs: Arc<Attrs>,
    /// Where each input comes from.
    pub inputs: Vec<BlockSrc>,
    /// The output types the call had when recorded.
    pub outputs: Vec<TensorType>,
}

/// A checked sequence of calls; see the module docs.
pub struct Block {
    inputs: Vec<TensorType>,
    calls: Vec<BlockCall>,
    /// Per call: [`kind`] of the call over its recorded input types.
    kinds: Vec<u64>,
    /// Per call, per output: its index among the block's outputs.
    slots: Vec<Vec<Option<usize>>>,
    outputs: Vec<(usize, usize)>,
    fusible: bool,
}

/// Op, attributes and input types: what makes two calls "the same op" to
/// a policy that caches by structure.
pub fn kind(id: OpId, attrs: &Attrs, input_types: &[TensorType]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    attrs.hash(&mut h);
    input_types.hash(&mut h);
    h.finish()
}

impl Block {
    /// A block over inputs of types `inputs` whose results are the call
    /// outputs `outputs` (call, output). An error when a call reads an
    /// input or output that does not exist before it, or reads a type
    /// other than the one its source gives.
    pub fn new(
        inputs: Vec<TensorType>,
        calls: Vec<BlockCall>,
        outputs: Vec<(usize, usize)>,
    ) -> Result<Block> {
        let bad = |why: String| invalid(types(&mut inputs.iter()), "tpu".into(), why);
        let mut kinds = Vec::with_capacity(calls.len());
        for (c, call) in calls.iter().enumerate() {
            let types = call
                .inputs
                .iter()
                .map(|&src| match src {
                    BlockSrc::Input(i) => inputs.get(i),
                    BlockSrc::Output(d, j) if d < c => calls[d].outputs.get(j),
                    BlockSrc::Output(..) => None,
                })
                .collect::<Option<Vec<&TensorType>>>()
                .ok_or_else(|| {
                    bad(format!(
                        "call {c} (`{}`) reads a value no earlier call gives",
                        call.op.name
                    ))
                })?;
            let types: Vec<TensorType> = types.into_iter().cloned().collect();
            kinds.push(kind(call.id, &call.attrs, &types));
        }
        let mut slots: Vec<Vec<Option<usize>>> =
            calls.iter().map(|c| vec![None; c.outputs.len()]).collect();
        for (k, &(c, j)) in outputs.iter().enumerate() {
            let slot = slots
                .get_mut(c)
                .and_then(|s| s.get_mut(j))
                .ok_or_else(|| bad(format!("has no output {j} of call {c}")))?;
            if slot.is_some() {
                return Err(bad(format!("returns output {j} of call {c} twice")));
            }
            *slot = Some(k);
        }
        let fusible = calls.iter().all(|c| {
            !c.op.flags.contains(Flags::NOT_FUSIBLE) && !c.op.flags.contains(Flags::HOST_SYNC)
        });
        Ok(Block {
            inputs,
            calls,
            kinds,
            slots,
            outputs,
            fusible,
        })
    }

    /// The input types the block runs on.
    pub fn inputs(&self) -> &[TensorType] {
        &self.inputs
    }

    /// The calls, in order.
    pub fn calls(&self) -> &[BlockCall] {
        &self.calls
    }

    /// [`kind`] of call `c`.
    pub fn kind(&self, c: usize) -> u64 {
        self.kinds[c]
    }

    /// The index among the block's outputs of output `j` of call `c`, if
    /// it is one.
    pub fn slot(&self, c: usize, j: usize) -> Option<usize> {
        self.slots[c][j]
    }

    /// The block's outputs, as (call, output).
    pub fn outputs(&self) -> &[(usize, usize)] {
        &self.outputs
    }

    /// True when every op may join a fused program (none reads the host or
    /// must run on its own).
    pub fn fusible(&self) -> bool {
        self.fusible
    }

    /// Whether `inputs` have the block's input types.
    pub fn accepts(&self, inputs: &[Tensor]) -> bool {
        inputs.iter().map(Tensor::ty).eq(self.inputs.iter())
    }

    /// An error naming the types unless [`Block::accepts`] `inputs` (to
    /// run on `device`).
    pub fn check(&self, inputs: &[Tensor], device: usize) -> Result<()> {
        if self.accepts(inputs) {
            return Ok(());
        }
        Err(invalid(
            types(&mut inputs.iter().map(Tensor::ty)),
            format!("tpu:{device}"),
            format!(
                "the block of {} calls was recorded for inputs ({})",
                self.calls.len(),
                types(&mut self.inputs.iter())
            ),
        ))
    }

    /// Runs the calls one by one through `policy` on `device`; what a
    /// policy without a way to take the block at once does.
    pub fn run_each<P: ExecutionPolicy + ?Sized>(
        &self,
        policy: &P,
        inputs: &[Tensor],
        device: usize,
        location: CallSite,
    ) -> Result<Vec<Tensor>> {
        self.check(inputs, device)?;
        self.run_with(inputs, |call, xs| {
            let _span = profile::span("op", call.op.name);
            policy.dispatch(OpCall {
                op: call.op,
                id: call.id,
                inputs: xs,
                attrs: &call.attrs,
                device,
                outputs: call.outputs.clone(),
                location,
            })
        })
    }

    /// The block's outputs when `run` gives each call's outputs from its
    /// inputs (resolved against `inputs` and earlier calls' outputs).
    pub fn run_with<E: From<Error>>(
        &self,
        inputs: &[Tensor],
        mut run: impl FnMut(&BlockCall, &[Tensor]) -> std::result::Result<Vec<Tensor>, E>,
    ) -> std::result::Result<Vec<Tensor>, E> {
        let mut results: Vec<Vec<Tensor>> = Vec::with_capacity(self.calls.len());
        for call in &self.calls {
            let xs: Vec<Tensor> = call
                .inputs
                .iter()
                .map(|&src| match src {
                    BlockSrc::Input(i) => inputs[i].clone(),
                    BlockSrc::Output(c, j) => results[c][j].clone(),
                })
                .collect();
            let outs = run(call, &xs)?;
            if outs.len() != call.outputs.len() {
                return Err(Error::Signature(format!(
                    "`{}` in a recorded block gave {} outputs, not {}",
                    call.op.name,
                    outs.len(),
                    call.outputs.len()
                ))
                .into());
            }
            results.push(outs);
        }
        Ok(self
            .outputs
            .iter()
            .map(|&(c, j)| results[c][j].clone())
            .collect())
    }
}

/// `f32[2, 3], i64[]`.
fn types(types: &mut dyn Iterator<Item = &TensorType>) -> String {
    types
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A block that cannot run on `inputs`, for `reason`.
fn invalid(inputs: String, device: String, reason: String) -> Error {
    Error::InvalidInput {
        kind: OpErrorKind::Invalid,
        op: "block".into(),
        inputs,
        device,
        reason,
    }
}
