//! A pending graph of one device: recorded op calls, their external input
//! buffers, and how to lower the live part of it into one program.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use tpu_core::op::{Attrs, OpDef, OpId};
use tpu_core::pjrt::Buffer;
use tpu_core::policy::LowerCollective;
use tpu_core::profile::CallSite;
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{Error, Result, Tensor, TensorValue, WeakTensor};

use crate::launch_queue;

/// A value that existed before the graph: a buffer, or the output of a
/// launch still waiting in the launch queue (the graph's own launch queues
/// behind it and reads its buffer then).
#[derive(Clone)]
pub(crate) enum External {
    Ready(Arc<Buffer>),
    Queued { tensor: Tensor, token: u64 },
}

impl External {
    /// Whether both are the same value: one buffer, or one queued launch's
    /// output.
    fn same(&self, other: &External) -> bool {
        match (self, other) {
            (External::Ready(a), External::Ready(b)) => Arc::ptr_eq(a, b),
            (External::Queued { token: a, .. }, External::Queued { token: b, .. }) => a == b,
            _ => false,
        }
    }

    fn ty(&self) -> TensorType {
        match self {
            External::Ready(b) => TensorType::new(b.dtype(), b.shape().clone()),
            External::Queued { tensor, .. } => tensor.ty().clone(),
        }
    }

    /// The buffer, waiting for a queued value's launch (from the queue
    /// itself: the caller may hold the policy's lock).
    pub fn buffer(&self) -> Result<Arc<Buffer>> {
        match self {
            External::Ready(b) => Ok(b.clone()),
            External::Queued { tensor, token } => {
                crate::launch_queue::global().materialize(*token)?;
                match tensor.value() {
                    TensorValue::Device(b) => Ok(b),
                    _ => Err(Error::Signature(
                        "a queued value left no buffer of its shape".into(),
                    )),
                }
            }
        }
    }
}

/// Where a node input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Src {
    /// A buffer that existed before the graph (a parameter of the program).
    External(usize),
    /// Output `1` of node `0`.
    Node(usize, usize),
}

pub(crate) struct Output {
    pub ty: TensorType,
    pub tensor: WeakTensor,
    pub token: u64,
}

pub(crate) struct Node {
    pub op: &'static OpDef,
    pub id: OpId,
    pub attrs: Arc<Attrs>,
    pub inputs: Vec<Src>,
    pub outputs: Vec<Output>,
    pub location: CallSite,
}

/// Hashes tokens: unique counters need no keyed hash, only their bits
/// spread (Fibonacci hashing).
#[derive(Default)]
pub(crate) struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Chains 64-bit words into a fingerprint with a folded 128-bit multiply
/// per word (as wyhash and foldhash mix): every output bit depends on every
/// input bit, at a fraction of SipHash's cost on the few words a node
/// hashes. Fingerprints key compiled programs, so the mix must not be a
/// weak one (a plain multiply or xor-rotate lets structured inputs collide).
struct Fingerprint(u64);

impl Fingerprint {
    const SEED: u64 = 0x243f_6a88_85a3_08d3;
    const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

    fn new() -> Fingerprint {
        Fingerprint(Self::SEED)
    }

    fn word(&mut self, w: u64) {
        let m = u128::from(self.0 ^ w ^ Self::SEED) * u128::from(Self::MUL);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn srcs(&mut self, srcs: &[Src]) {
        self.word(srcs.len() as u64);
        for src in srcs {
            match *src {
                Src::External(i) => self.word(i as u64),
                // The top bit tells a node from an external index.
                Src::Node(n, o) => {
                    self.word((1 << 63) | n as u64);
                    self.word(o as u64);
                }
            }
        }
    }
}

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        for chunk in bytes.chunks(8) {
            let mut w = [0; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.word(u64::from_le_bytes(w));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.word(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.word(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.word(n as u64);
    }
}

/// The recorded, not yet executed ops of one device.
#[derive(Default)]
pub(crate) struct Graph {
    pub nodes: Vec<Node>,
    pub externals: Vec<External>,
    /// Token of a pending tensor -> (node, output); outputs no tensor
    /// holds (a block's inner values) are not listed.
    pub tokens: HashMap<u64, (usize, usize), BuildHasherDefault<TokenHasher>>,
    /// Per node: its kind (see [`Node::kind`]).
    pub kinds: Vec<u64>,
    /// Per node: its op and where its inputs come from, but not their
    /// shapes or the attributes (what stays put as a sequence grows).
    pub outlines: Vec<u64>,
    /// Per node: the structural fingerprint of the graph up to and including it.
    pub fingerprints: Vec<u64>,
    pub pending_bytes: usize,
}

impl Graph {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Room for `n` more nodes.
    pub fn reserve(&mut self, n: usize) {
        self.nodes.reserve(n);
        self.kinds.reserve(n);
        self.outlines.reserve(n);
        self.fingerprints.reserve(n);
    }

    /// The index of `external` among the externals, adding it if new.
    pub fn external(&mut self, external: External) -> usize {
        let known = self.externals.iter().position(|e| e.same(&external));
        known.unwrap_or_else(|| {
            self.externals.push(external);
            self.externals.len() - 1
        })
    }

    /// Whether `plan` donates a buffer that queued launches still read:
    /// the graph must then launch behind them.
    pub fn donates_held(&self, plan: &Plan) -> bool {
        let queue = launch_queue::global();
        plan.params.iter().zip(&plan.donations).any(|(&i, d)| {
            d.is_some() && matches!(&self.externals[i], External::Ready(b) if queue.holders(b) > 0)
        })
    }

    /// Whether some external is still waiting in the launch queue.
    pub fn reads_queued(&self) -> bool {
        self.externals
            .iter()
            .any(|e| matches!(e, External::Queued { .. }))
    }

    pub fn src_type(&self, src: Src) -> TensorType {
        match src {
            Src::External(i) => self.externals[i].ty(),
            Src::Node(n, o) => self.nodes[n].outputs[o].ty.clone(),
        }
    }

    /// Appends a node, updating kinds and fingerprints.
    pub fn push(&mut self, node: Node) {
        let input_types: Vec<TensorType> = node.inputs.iter().map(|&s| self.src_type(s)).collect();
        let kind = tpu_core::block::kind(node.id, &node.attrs, &input_types);
        self.push_kind(node, kind);
    }

    /// [`Graph::push`] of a node whose [`tpu_core::block::kind`] is known.
    pub fn push_kind(&mut self, node: Node, kind: u64) {
        let mut outline = Fingerprint::new();
        node.id.hash(&mut outline);
        outline.srcs(&node.inputs);
        let mut h = Fingerprint::new();
        h.word(self.fingerprints.last().copied().unwrap_or(0));
        h.word(kind);
        h.srcs(&node.inputs);
        let index = self.nodes.len();
        for (o, out) in node.outputs.iter().enumerate() {
            if out.tensor.is_alive() {
                self.tokens.insert(out.token, (index, o));
            }
            self.pending_bytes += out.ty.shape.numel() * out.ty.dtype.size_in_bytes();
        }
        self.kinds.push(kind);
        self.outlines.push(outline.finish());
        self.fingerprints.push(h.finish());
        self.nodes.push(node);
    }

    /// True when the tensor behind `out` is alive and still waits for this
    /// graph.
    fn is_live(out: &Output) -> bool {
        out.tensor
            .upgrade()
            .is_some_and(|t| matches!(t.value(), TensorValue::Pending(p) if p.token == out.token))
    }

    /// Outputs still wanted, and the nodes needed to compute them and
    /// `extra` (the input of a fused collective).
    pub fn live(&self, extra: Option<Src>) -> (Vec<(usize, usize)>, Vec<bool>) {
        let mut results = Vec::new();
        let mut needed = vec![false; self.nodes.len()];
        if let Some(Src::Node(n, _)) = extra {
            needed[n] = true;
        }
        for (n, node) in self.nodes.iter().enumerate() {
            for (o, out) in node.outputs.iter().enumerate() {
                if Self::is_live(out) {
                    results.push((n, o));
                    needed[n] = true;
                }
            }
        }
        for n in (0..self.nodes.len()).rev() {
            if needed[n] {
                for src in &self.nodes[n].inputs {
                    if let Src::Node(m, _) = src {
                        needed[*m] = true;
                    }
                }
            }
        }
        (results, needed)
    }
}

/// What a cut computes, before any program text: which externals become
/// parameters (in first-use order), which result each donates its buffer
/// to, and which node outputs are results.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Plan {
    pub params: Vec<usize>,
    pub donations: Vec<Option<usize>>,
    pub results: Vec<(usize, usize)>,
}

/// Plans the live part of `graph`. An external held only by this graph can
/// never be read again, so it is donated to the first free result of its
/// type. With `behind_queue` the graph launches behind the launch queue
/// (see [`Graph::donates_held`]), so buffers that queued launches also
/// hold count as held only here: those launches read them first. The
/// first steps, whose launches wait on compiles, then plan the same
/// donations, and so build the same programs, as the steps after them.
pub(crate) fn plan(
    graph: &Graph,
    results: Vec<(usize, usize)>,
    needed: &[bool],
    behind_queue: bool,
) -> Plan {
    let mut params: Vec<usize> = Vec::new();
    for (n, node) in graph.nodes.iter().enumerate() {
        if !needed[n] {
            continue;
        }
        for src in &node.inputs {
            if let Src::External(i) = *src
                && !params.contains(&i)
            {
                params.push(i);
            }
        }
    }
    let result_types: Vec<TensorType> = results
        .iter()
        .map(|&(n, o)| graph.src_type(Src::Node(n, o)))
        .collect();
    let mut taken = vec![false; results.len()];
    let donations = params
        .iter()
        .map(|&i| {
            // Held by this graph alone (a queued value too: its program is
            // the one the same graph gets once its inputs are buffers).
            let only_here = match &graph.externals[i] {
                External::Ready(buffer) => {
                    let queued = if behind_queue {
                        launch_queue::global().holders(buffer)
                    } else {
                        0
                    };
                    Arc::strong_count(buffer) == 1 + queued
                }
                External::Queued { tensor, .. } => tensor.is_unique(),
            };
            if !only_here {
                return None;
            }
            let ty = graph.src_type(Src::External(i));
            let r = (0..results.len()).find(|&r| !taken[r] && result_types[r] == ty)?;
            taken[r] = true;
            Some(r)
        })
        .collect();
    Plan {
        params,
        donations,
        results,
    }
}

fn describe_inputs(graph: &Graph, node: &Node) -> String {
    node.inputs
        .iter()
        .map(|&s| graph.src_type(s).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error for node `node` failing with `source`.
pub(crate) fn node_error(graph: &Graph, node: &Node, source: Error) -> Error {
    Error::OpFailed {
        op: node.op.name.to_string(),
        location: node.location.to_string(),
        inputs: describe_inputs(graph, node),
        source: Box::new(source),
    }
}

/// A collective appended to a graph: its input and its body for one of
/// `replicas` members.
pub(crate) struct Tail<'a> {
    pub input: Src,
    pub lower: LowerCollective<'a>,
    pub replicas: usize,
    pub name: &'a str,
}

/// The program text of `plan`: dead nodes are skipped; a `tail`
/// collective's output is the last result.
pub(crate) fn lower(
    graph: &Graph,
    plan: &Plan,
    needed: &[bool],
    tail: Option<&Tail<'_>>,
) -> Result<String> {
    let mut b = Builder::new("fused");
    let params: HashMap<usize, Value> = plan
        .params
        .iter()
        .map(|&i| (i, b.parameter(graph.src_type(Src::External(i)))))
        .collect();
    let mut node_values: Vec<Vec<Value>> = Vec::with_capacity(graph.nodes.len());
    for (n, node) in graph.nodes.iter().enumerate() {
        if !needed[n] {
            node_values.push(Vec::new());
            continue;
        }
        let inputs: Vec<Value> = node
            .inputs
            .iter()
            .map(|&src| match src {
                Src::Node(m, o) => node_values[m][o].clone(),
                Src::External(i) => params[&i].clone(),
            })
            .collect();
        let outs = (node.op.lower)(&mut b, &inputs, &node.attrs).map_err(|e| {
            node_error(
                graph,
                node,
                Error::InvalidInput {
                    kind: e.kind,
                    op: node.op.name.to_string(),
                    inputs: describe_inputs(graph, node),
                    device: "tpu".into(),
                    reason: e.message,
                },
            )
        })?;
        node_values.push(outs);
    }
    let mut values: Vec<Value> = plan
        .results
        .iter()
        .map(|&(n, o)| node_values[n][o].clone())
        .collect();
    if let Some(tail) = tail {
        let input = match tail.input {
            Src::Node(m, o) => node_values[m][o].clone(),
            Src::External(i) => params[&i].clone(),
        };
        b.set_replicas(tail.replicas);
        let out = (tail.lower)(&mut b, &input).map_err(|e| Error::InvalidInput {
            kind: e.kind,
            op: tail.name.to_string(),
            inputs: input.ty().to_string(),
            device: "tpu".into(),
            reason: e.message,
        })?;
        values.push(out);
    }
    for (i, donation) in plan.params.iter().zip(&plan.donations) {
        if let Some(r) = donation {
            b.donate(&params[i], *r);
        }
    }
    Ok(b.finish(&values))
}
