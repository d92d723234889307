//! A collective joins the pending graphs of its members: when every
//! member device holds the same recorded work (a data-parallel step does),
//! that work and the collective compile into one program replicated over
//! the devices and launched once. Otherwise the caller runs the collective
//! on its own after the graphs are cut.

use std::sync::Arc;

use tpu_core::metrics::{CutReason, record_graph_cut};
use tpu_core::pjrt::CompileOptions;
use tpu_core::policy::CollectiveCall;
use tpu_core::{Error, Result, Runtime, Tensor, TensorValue};

use super::graph::{Graph, Plan, Src, Tail, lower, plan};
use super::{DeferAndFuse, Parameters, Resolved};

impl DeferAndFuse {
    /// [`tpu_core::policy::ExecutionPolicy::fuse_collective`] for
    /// DeferAndFuse.
    pub(super) fn fused_collective(
        &self,
        call: &CollectiveCall<'_>,
    ) -> Result<Option<Vec<Tensor>>> {
        loop {
            let mut devices = self.lock();
            let mut srcs = Vec::with_capacity(call.devices.len());
            let mut foreign = Vec::new();
            for (x, &d) in call.inputs.iter().zip(call.devices) {
                let state = devices.entry(d).or_default();
                match Self::resolve(&mut state.graph, std::slice::from_ref(x)) {
                    Resolved::Ready(mut s) => srcs.push(s.remove(0)),
                    Resolved::Materialize(ts) => foreign.extend(ts),
                }
            }
            if !foreign.is_empty() {
                drop(devices);
                for t in foreign {
                    t.buffer()?;
                }
                continue;
            }
            let graphs: Vec<&Graph> = call.devices.iter().map(|d| &devices[d].graph).collect();
            let Some((plan, needed)) = joint_plan(&graphs, &srcs) else {
                return Ok(None);
            };
            let tail = Tail {
                input: srcs[0],
                lower: call.lower,
                replicas: call.devices.len(),
                name: call.name,
            };
            let program = lower(graphs[0], &plan, &needed, Some(&tail))?;
            let options = CompileOptions {
                num_replicas: call.devices.len(),
                device_assignment: Some(call.devices.to_vec()),
                ..CompileOptions::default()
            };
            let executable = Runtime::global()?.compile(&program, &options)?;
            let mut members = Vec::with_capacity(call.devices.len());
            for d in call.devices {
                let state = devices.get_mut(d).expect("resolved above");
                let graph = std::mem::take(&mut state.graph);
                let n = graph.nodes.len();
                state.previous = Some((n, graph.fingerprints[n - 1]));
                state.repeat_cut = false;
                record_graph_cut(CutReason::Collective);
                let Graph {
                    nodes, externals, ..
                } = graph;
                members.push((nodes, Parameters::new(super::ready(externals)?, &plan)?));
            }
            drop(devices);
            let args = members.iter_mut().map(|(_, p)| p.args()).collect();
            let outputs = executable.execute_on_devices(args)?;
            let mut results = Vec::with_capacity(members.len());
            for ((nodes, _), mut buffers) in members.iter().zip(outputs) {
                let collective = buffers
                    .pop()
                    .ok_or_else(|| Error::Signature(format!("`{}` returned nothing", call.name)))?;
                for (&(n, o), buffer) in plan.results.iter().zip(buffers) {
                    if let Some(t) = nodes[n].outputs[o].tensor.upgrade() {
                        t.set_value(TensorValue::Device(Arc::new(buffer)));
                    }
                }
                results.push(Tensor::from_buffer(collective));
            }
            return Ok(Some(results));
        }
    }
}

/// The one plan every member's graph shares with the collective's input
/// `srcs` appended, and the nodes it needs; `None` when the members differ
/// (or nothing is pending). Donations count only where every member can
/// donate alike.
fn joint_plan(graphs: &[&Graph], srcs: &[Src]) -> Option<(Plan, Vec<bool>)> {
    let first = graphs[0];
    if first.is_empty() {
        return None;
    }
    let same = graphs.iter().zip(srcs).all(|(g, &s)| {
        g.nodes.len() == first.nodes.len()
            && g.fingerprints.last() == first.fingerprints.last()
            && g.externals.len() == first.externals.len()
            && s == srcs[0]
    });
    if !same {
        return None;
    }
    let mut plans = graphs.iter().map(|g| {
        let (results, needed) = g.live(Some(srcs[0]));
        let mut p = plan(g, results, &needed, false);
        if let Src::External(i) = srcs[0]
            && !p.params.contains(&i)
        {
            p.params.push(i);
            p.donations.push(None);
        }
        (p, needed)
    });
    let (mut joint, needed) = plans.next()?;
    let mut donations_agree = true;
    for (p, _) in plans {
        if p.params != joint.params || p.results != joint.results {
            return None;
        }
        donations_agree &= p.donations == joint.donations;
    }
    if !donations_agree {
        joint.donations = vec![None; joint.params.len()];
    }
    Some((joint, needed))
}
