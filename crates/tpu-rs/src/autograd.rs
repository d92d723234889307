//! Reverse-mode autograd: ops on tensors that require gradients record a
//! node; `backward()` walks the nodes in reverse topological order, calling
//! each op's backward rule through the execution policy in force, and
//! accumulates gradients into the leaves.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tpu_core::autograd::GradTape;
use tpu_core::op::{Attrs, OpDef, Var};
use tpu_core::policy::end_of_backward;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One recorded op call.
pub(crate) struct Node {
    pub op: &'static OpDef,
    pub attrs: Attrs,
    pub num_outputs: usize,
    /// What the backward rule needs; released once the rule has run, as
    /// PyTorch does, so a deferred graph need not keep activations alive.
    pub saved: Mutex<Option<Saved>>,
}

/// The values a node's backward rule reads.
pub(crate) struct Saved {
    /// The inputs (keeping their graphs alive).
    pub inputs: Vec<Tensor>,
    /// The output values.
    pub outputs: Vec<tpu_core::Tensor>,
}

impl Node {
    fn saved(&self) -> std::sync::MutexGuard<'_, Option<Saved>> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner())
    }
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True unless inside [`no_grad`].
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` without recording ops for autograd.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

fn node_key(node: &Arc<Node>) -> usize {
    Arc::as_ptr(node) as usize
}

/// Nodes reachable from `root`, inputs before the nodes that use them.
fn topological(root: &Arc<Node>) -> Result<Vec<Arc<Node>>> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    // Iterative post-order: (node, children pushed?)
    let mut stack = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            order.push(node);
            continue;
        }
        if !seen.insert(node_key(&node)) {
            continue;
        }
        stack.push((node.clone(), true));
        let saved = node.saved();
        let saved = saved.as_ref().ok_or(Error::GraphFreed)?;
        for input in &saved.inputs {
            if let Some((child, _)) = input.grad_fn()
                && !seen.contains(&node_key(&child))
            {
                stack.push((child, false));
            }
        }
    }
    Ok(order)
}

/// Backpropagates from `root` with incoming gradient `seed`.
pub(crate) fn backward(root: &Tensor, seed: Option<&Tensor>) -> Result<()> {
    let seed = match seed {
        Some(s) => s.value().clone(),
        None if root.shape().numel() == 1 && root.shape().rank() == 0 => {
            root.ones_like()?.value().clone()
        }
        None => {
            return Err(Error::NonScalarBackward {
                shape: root.shape().to_string(),
            });
        }
    };
    let Some((root_node, root_output)) = root.grad_fn() else {
        if root.requires_grad() {
            root.accumulate_grad(seed)?;
            return Ok(());
        }
        return Err(Error::NoGradient);
    };
    let order = topological(&root_node)?;
    // Gradients per node output.
    let mut pending: HashMap<usize, Vec<Option<tpu_core::Tensor>>> = HashMap::new();
    pending
        .entry(node_key(&root_node))
        .or_insert_with(|| vec![None; root_node.num_outputs])[root_output] = Some(seed);
    for node in order.iter().rev() {
        // Taking the saved values frees them once this node is done.
        let saved = node.saved().take().ok_or(Error::GraphFreed)?;
        let Some(grads) = pending.remove(&node_key(node)) else {
            continue;
        };
        if node.op.vjp.is_none() {
            continue;
        }
        // A tape per node, so nothing of this step outlives it.
        let mut tape = GradTape::new();
        let inputs: Vec<Var> = saved
            .inputs
            .iter()
            .map(|t| tape.input(t.value().clone()))
            .collect();
        let outputs: Vec<Var> = saved
            .outputs
            .iter()
            .map(|t| tape.input(t.clone()))
            .collect();
        let mut grad_vars = Vec::with_capacity(grads.len());
        for (g, out) in grads.into_iter().zip(&saved.outputs) {
            let g = match g {
                Some(g) => g,
                None => Tensor::zeros_of(out)?.value().clone(),
            };
            grad_vars.push(tape.input(g));
        }
        let input_grads =
            tape.backward_rule(node.op, &node.attrs, &inputs, &outputs, &grad_vars)?;
        for (input, g) in saved.inputs.iter().zip(input_grads) {
            let Some(g) = g else { continue };
            let g = tape.value(g)?.clone();
            if !input.requires_grad() {
                continue;
            }
            match input.grad_fn() {
                Some((child, index)) => {
                    let slot = &mut pending
                        .entry(node_key(&child))
                        .or_insert_with(|| vec![None; child.num_outputs])[index];
                    *slot = Some(match slot.take() {
                        Some(acc) => add(&acc, &g)?,
                        None => g,
                    });
                }
                None => input.accumulate_grad(g)?,
            }
        }
    }
    end_of_backward()?;
    Ok(())
}

/// `a + b` on raw values (no recording).
pub(crate) fn add(a: &tpu_core::Tensor, b: &tpu_core::Tensor) -> Result<tpu_core::Tensor> {
    let mut out = tpu_core::policy::call("add", &[a.clone(), b.clone()], &Attrs::new(), None)?;
    Ok(out.remove(0))
}
