//! DeferAndFuse: ops on each device are recorded into a pending graph and
//! compiled as one program when a value is needed.
//!
//! Cut points: a host read or any other materialisation, an explicit
//! `sync()`, the end of a backward pass, a collective (which joins the
//! graphs of its members when they match), a non-fusible or host-sync op, a cap
//! on pending ops or bytes, and a repeated-sequence heuristic that cuts a
//! training loop into one identical graph per step. A graph that repeats the
//! previous one's ops but for a few whose shapes or attributes changed (a
//! decode loop appending a token) runs in phases: the changed ops in
//! programs of their own, the unchanged ones in programs that recur, so a
//! growing sequence recompiles only the ops that grow. Graphs are canonical by
//! construction (parameters and values numbered in recording order, scalars
//! passed as tensors), so changing values never recompiles. Dead
//! intermediates are never materialised, and inputs that no tensor holds any
//! more are donated to the program.
//!
//! A cut whose program is still compiling (on the compile pool) is queued
//! in the launch queue and recording goes on: a later graph takes the
//! queued values as inputs and queues behind them, so the next graph is
//! traced, and compiled, while the previous one compiles.

mod dump;
mod fused_collective;
mod graph;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use graph::{External, Graph, Node, Output, Plan, Src, lower, node_error, plan};
use tpu_core::block::{Block, BlockSrc};
use tpu_core::compile_pool::{self, Compiling};
use tpu_core::metrics::{CutReason, record_cache_hit, record_graph_cut};
use tpu_core::op::{Flags, single_op_program};
use tpu_core::pjrt::{Arg, Buffer, CompileOptions};
use tpu_core::policy::{CollectiveCall, EagerMode, ExecutionPolicy, OpCall};
use tpu_core::profile::{self, CallSite, Detail};
use tpu_core::recompile::{self, OpSignature};
use tpu_core::settings::{self, Lookup};
use tpu_core::stablehlo::TensorType;
use tpu_core::{Device, Error, Pending, Result, Runtime, Tensor, TensorValue, WeakTensor};

use crate::Strict;
use crate::launch_queue::{self, BufferKey, GraphLaunch, Launch, Until, Work};
use crate::lru::{KEPT, Lru};

/// Limits on a pending graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeferConfig {
    /// Cut when this many ops are pending (`TPU_RS_DEFER_MAX_OPS`).
    pub max_ops: usize,
    /// Cut when pending outputs reach this many bytes (`TPU_RS_DEFER_MAX_BYTES`).
    pub max_bytes: usize,
    /// Shortest op sequence the repeat detector looks for.
    pub min_period: usize,
    /// Where each compiled graph is written (`TPU_RS_DUMP_GRAPHS`).
    pub dump_dir: Option<std::path::PathBuf>,
}

impl Default for DeferConfig {
    fn default() -> DeferConfig {
        DeferConfig {
            max_ops: 4096,
            max_bytes: 1 << 32,
            min_period: 4,
            dump_dir: None,
        }
    }
}

impl DeferConfig {
    /// Defaults overridden by `TPU_RS_DEFER_MAX_OPS` and `TPU_RS_DEFER_MAX_BYTES`.
    pub fn from_env() -> Result<DeferConfig> {
        DeferConfig::from_lookup(&settings::env)
    }

    /// [`DeferConfig::from_env`] with the variables `get` gives; a
    /// malformed one is an error naming it.
    pub fn from_lookup(get: Lookup<'_>) -> Result<DeferConfig> {
        let d = DeferConfig::default();
        let max_bytes = settings::bytes(get, "TPU_RS_DEFER_MAX_BYTES")?
            .map(|b| usize::try_from(b).unwrap_or(usize::MAX));
        Ok(DeferConfig {
            max_ops: settings::count(get, "TPU_RS_DEFER_MAX_OPS")?.unwrap_or(d.max_ops),
            max_bytes: max_bytes.unwrap_or(d.max_bytes),
            dump_dir: get("TPU_RS_DUMP_GRAPHS")?
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from),
            ..d
        })
    }
}

/// Per device: the pending graph and the shape of the last one cut.
#[derive(Default)]
struct DeviceState {
    graph: Graph,
    /// Length and fingerprint of the previously cut graph.
    previous: Option<(usize, u64)>,
    /// A repetition was completed by the last op: cut before the next one,
    /// once the caller has let go of the step's inputs (so they can be
    /// donated).
    repeat_cut: bool,
    /// Outlines and kinds of the previously cut graph's nodes, to tell
    /// which ops of the next one changed shape.
    last_cut: Option<(Vec<u64>, Vec<u64>)>,
}

/// What identifies a cut's program without lowering it.
#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    device: usize,
    len: usize,
    fingerprint: u64,
    plan: Plan,
}

/// The DeferAndFuse policy.
pub struct DeferAndFuse {
    me: Weak<DeferAndFuse>,
    config: DeferConfig,
    devices: Mutex<HashMap<usize, DeviceState>>,
    /// Executables of graphs already cut, by structure; the least
    /// recently used go once [`KEPT`] are held.
    plans: Mutex<Lru<PlanKey, Arc<Compiling>>>,
    strict: Strict,
}

/// A new pending output of type `ty` on `device`, and its node record.
fn pending(me: &Arc<dyn ExecutionPolicy>, ty: &TensorType, device: usize) -> (Tensor, Output) {
    let token = crate::next_token();
    let t = Tensor::pending(
        ty.clone(),
        Device::Tpu(device),
        Pending {
            policy: me.clone(),
            token,
        },
    );
    let out = Output {
        ty: ty.clone(),
        tensor: t.downgrade(),
        token,
    };
    (t, out)
}

enum Resolved {
    Ready(Vec<Src>),
    /// These inputs must be materialised first (outside the lock).
    Materialize(Vec<Tensor>),
}

impl DeferAndFuse {
    /// A policy with `config`.
    pub fn new(config: DeferConfig) -> Arc<DeferAndFuse> {
        if config.dump_dir.is_some() {
            // The pictures name the user's source lines.
            profile::want_sites();
        }
        Arc::new_cyclic(|me| DeferAndFuse {
            me: me.clone(),
            config,
            devices: Mutex::new(HashMap::new()),
            plans: Mutex::new(Lru::new(KEPT)),
            strict: Strict::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, DeviceState>> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of ops pending on `device`.
    pub fn pending_ops(&self, device: usize) -> usize {
        self.lock().get(&device).map_or(0, |d| d.graph.nodes.len())
    }

    fn resolve(graph: &mut Graph, inputs: &[Tensor]) -> Resolved {
        let mut srcs = Vec::with_capacity(inputs.len());
        let mut foreign = Vec::new();
        for t in inputs {
            match t.value() {
                TensorValue::Pending(p) => match graph.tokens.get(&p.token) {
                    Some(&(n, o)) => srcs.push(Src::Node(n, o)),
                    None => match queued(graph, t, p.token) {
                        Some(src) => srcs.push(src),
                        None => foreign.push(t.clone()),
                    },
                },
                TensorValue::Device(b) => {
                    srcs.push(Src::External(graph.external(External::Ready(b))))
                }
                // A reshape Strict made without a program, or a host value:
                // given a buffer of its own shape first.
                TensorValue::Reshaped(_) | TensorValue::Host(_) => foreign.push(t.clone()),
            }
        }
        if foreign.is_empty() {
            Resolved::Ready(srcs)
        } else {
            Resolved::Materialize(foreign)
        }
    }

    fn record(&self, call: &OpCall<'_>) -> Result<Vec<Tensor>> {
        let me: Arc<dyn ExecutionPolicy> = match self.me.upgrade() {
            Some(me) => me,
            None => return self.strict.run(call),
        };
        self.append(call.device, call.inputs, 1, |graph, srcs| {
            let mut tensors = Vec::with_capacity(call.outputs.len());
            let mut outputs = Vec::with_capacity(call.outputs.len());
            for ty in &call.outputs {
                let (t, out) = pending(&me, ty, call.device);
                outputs.push(out);
                tensors.push(t);
            }
            graph.push(Node {
                op: call.op,
                id: call.id,
                attrs: Arc::new(call.attrs.clone()),
                inputs: srcs,
                outputs,
                location: call.location,
            });
            tensors
        })
    }

    /// Appends `ops` nodes reading `inputs` to `device`'s pending graph:
    /// once the inputs resolve to sources in it (those that cannot are
    /// materialised first), `push` adds the nodes; then the graph is cut if
    /// it should be.
    fn append<R>(
        &self,
        device: usize,
        inputs: &[Tensor],
        ops: usize,
        mut push: impl FnMut(&mut Graph, Vec<Src>) -> R,
    ) -> Result<R> {
        loop {
            let mut devices = self.lock();
            let state = devices.entry(device).or_default();
            if std::mem::take(&mut state.repeat_cut) {
                self.cut(state, device, CutReason::RepeatedSequence)?;
            }
            if state.graph.nodes.len() + ops > self.config.max_ops {
                self.cut(state, device, CutReason::PendingCap)?;
            }
            let srcs = match Self::resolve(&mut state.graph, inputs) {
                Resolved::Ready(srcs) => srcs,
                Resolved::Materialize(tensors) => {
                    drop(devices);
                    for t in tensors {
                        t.buffer()?;
                    }
                    continue;
                }
            };
            let pushed = push(&mut state.graph, srcs);
            match self.cut_now(state) {
                Some(CutReason::RepeatedSequence) => state.repeat_cut = true,
                Some(reason) => self.cut_split(state, device, reason)?,
                None => {}
            }
            return Ok(pushed);
        }
    }

    /// Whether the graph should be cut after its newest node, and why.
    fn cut_now(&self, state: &DeviceState) -> Option<CutReason> {
        let g = &state.graph;
        let n = g.nodes.len();
        if n >= self.config.max_ops || g.pending_bytes >= self.config.max_bytes {
            return Some(CutReason::PendingCap);
        }
        if state.previous == Some((n, g.fingerprints[n - 1])) {
            return Some(CutReason::RepeatedSequence);
        }
        None
    }

    /// Cuts the graph. At the op cap, if the pending ops are one sequence
    /// repeated (a training loop with no cut of its own), the graph is
    /// replayed so that each repetition becomes its own, identical graph.
    fn cut_split(&self, state: &mut DeviceState, device: usize, reason: CutReason) -> Result<()> {
        if reason == CutReason::PendingCap
            && let Some(period) = period(&state.graph.kinds, self.config.min_period)
        {
            let graph = std::mem::take(&mut state.graph);
            state.previous = Some((period, graph.fingerprints[period - 1]));
            let cuts = self.replay(state, device, graph, None)?;
            if cuts > 0 {
                return Ok(());
            }
        }
        self.cut(state, device, reason)
    }

    /// Records `old`'s nodes again into `state` and returns how many cuts
    /// that made. With `phases` (one per node, never below its inputs'),
    /// the nodes go phase by phase with a cut between phases; without,
    /// in order, cutting whenever the pending graph repeats the previous one.
    fn replay(
        &self,
        state: &mut DeviceState,
        device: usize,
        old: Graph,
        phases: Option<&[usize]>,
    ) -> Result<usize> {
        let me: Arc<dyn ExecutionPolicy> = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Signature("the policy is being dropped".into()))?;
        let Graph {
            nodes, externals, ..
        } = old;
        // Outputs read by later nodes get a tensor that lives through the
        // replay, so a cut materialises them and later graphs read buffers.
        let mut used = vec![Vec::new(); nodes.len()];
        for node in &nodes {
            for src in &node.inputs {
                if let Src::Node(n, o) = *src {
                    used[n].push(o);
                }
            }
        }
        let mut ordered: Vec<(usize, Node)> = nodes.into_iter().enumerate().collect();
        if let Some(phases) = phases {
            ordered.sort_by_key(|&(n, _)| phases[n]);
        }
        let mut bridges: HashMap<(usize, usize), Tensor> = HashMap::new();
        let mut cuts = 0;
        let mut phase = None;
        for (n, mut node) in ordered {
            // Before resolving inputs: a cut turns earlier outputs into buffers.
            if let Some(phases) = phases {
                if phase.is_some_and(|p| p != phases[n]) {
                    self.cut_graph(state, device, CutReason::VaryingShapes, false)?;
                    cuts += 1;
                }
                phase = Some(phases[n]);
            }
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for &src in &node.inputs {
                let resolved = match src {
                    Src::External(i) => Src::External(state.graph.external(externals[i].clone())),
                    Src::Node(m, o) => {
                        let bridge = bridges.get(&(m, o)).ok_or_else(|| {
                            Error::Signature("a deferred op lost its input".into())
                        })?;
                        match bridge.value() {
                            TensorValue::Pending(p) => match state.graph.tokens.get(&p.token) {
                                Some(&(k, q)) => Src::Node(k, q),
                                None => cut_before(&mut state.graph, bridge, p.token)?,
                            },
                            TensorValue::Device(b) => {
                                Src::External(state.graph.external(External::Ready(b)))
                            }
                            TensorValue::Reshaped(_) | TensorValue::Host(_) => {
                                return Err(Error::Signature(
                                    "a deferred input left the device graph".into(),
                                ));
                            }
                        }
                    }
                };
                inputs.push(resolved);
            }
            node.inputs = inputs;
            for &o in &used[n] {
                let out = &mut node.outputs[o];
                let tensor = out.tensor.upgrade().unwrap_or_else(|| {
                    let t = Tensor::pending(
                        out.ty.clone(),
                        Device::Tpu(device),
                        Pending {
                            policy: me.clone(),
                            token: out.token,
                        },
                    );
                    out.tensor = t.downgrade();
                    t
                });
                bridges.insert((n, o), tensor);
            }
            state.graph.push(node);
            let len = state.graph.nodes.len();
            if phases.is_none() && state.previous == Some((len, state.graph.fingerprints[len - 1]))
            {
                self.cut(state, device, CutReason::RepeatedSequence)?;
                cuts += 1;
            }
        }
        Ok(cuts)
    }

    /// Compiles and runs the live part of `state`'s graph.
    fn cut(&self, state: &mut DeviceState, device: usize, reason: CutReason) -> Result<()> {
        self.cut_graph(state, device, reason, true)
    }

    /// [`DeferAndFuse::cut`]; with `split`, a graph that repeats the
    /// previous one except for some ops' shapes runs in segments, so that
    /// only the changing ops compile again.
    fn cut_graph(
        &self,
        state: &mut DeviceState,
        device: usize,
        reason: CutReason,
        split: bool,
    ) -> Result<()> {
        let mut graph = std::mem::take(&mut state.graph);
        if graph.is_empty() {
            return Ok(());
        }
        state.repeat_cut = false;
        let (results, needed) = graph.live(None);
        let n = graph.nodes.len();
        let previous = Some((n, graph.fingerprints[n - 1]));
        state.previous = previous;
        if results.is_empty() {
            return Ok(());
        }
        let plan = plan(&graph, results, &needed, true);
        if split
            && let Some(changed) = changed_ops(state, &mut graph)
            && self
                .cached(&Self::plan_key(&graph, &plan, device))
                .is_none()
        {
            let phases = phases(&graph, &changed);
            self.replay(state, device, graph, Some(&phases))?;
            self.cut_graph(state, device, reason, false)?;
            state.previous = previous;
            return Ok(());
        }
        record_graph_cut(reason);
        let site = cut_site(&graph, &needed);
        profile::instant("cut", reason.name(), || {
            vec![
                ("ops", Detail::from(needed.iter().filter(|&&x| x).count())),
                ("at", Detail::from(site.to_string())),
            ]
        });
        let compiling = self.executable(&graph, &plan, &needed, device, reason)?;
        let behind_queue = graph.reads_queued() || graph.donates_held(&plan);
        let executable = match compiling.try_get() {
            Some(Err(e)) => return Err(blame(&graph, &needed, device, e)),
            Some(Ok(executable)) if !behind_queue => executable,
            // Compiling, or reading (or donating) values queued launches
            // need: queued behind them.
            _ => {
                enqueue(graph, plan, needed, device, site, compiling);
                return Ok(());
            }
        };
        let Graph {
            nodes, externals, ..
        } = graph;
        let mut params = Parameters::new(ready(externals)?, &plan)?;
        let args = params.args();
        let outputs = executable.execute(args)?;
        for (&(n, o), buffer) in plan.results.iter().zip(outputs) {
            if let Some(t) = nodes[n].outputs[o].tensor.upgrade() {
                t.set_value(TensorValue::Device(Arc::new(buffer)));
            }
        }
        Ok(())
    }

    /// The key of a cut's program: a graph seen before (same structure,
    /// same results, same donations) reuses its executable.
    fn plan_key(graph: &Graph, plan: &Plan, device: usize) -> PlanKey {
        let n = graph.nodes.len();
        PlanKey {
            device,
            len: n,
            fingerprint: graph.fingerprints[n - 1],
            plan: plan.clone(),
        }
    }

    fn cached(&self, key: &PlanKey) -> Option<Arc<Compiling>> {
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)
            .map(|exe| exe.clone())
    }

    /// The executable of a cut, compiled unless [`DeferAndFuse::cached`].
    fn executable(
        &self,
        graph: &Graph,
        plan: &Plan,
        needed: &[bool],
        device: usize,
        reason: CutReason,
    ) -> Result<Arc<Compiling>> {
        let key = Self::plan_key(graph, plan, device);
        if let Some(exe) = self.cached(&key) {
            record_cache_hit();
            return Ok(exe);
        }
        let program = lower(graph, plan, needed, None)?;
        if let Some(dir) = &self.config.dump_dir
            && let Err(e) = dump::write(dir, graph, plan, needed, reason, &program)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "TPU_RS_DUMP_GRAPHS: cannot write the graph");
        }
        let exe = compile_pool::compile(program, CompileOptions::on_device(device))?;
        note_build(graph, needed, device);
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, exe.clone());
        Ok(exe)
    }

    fn cut_device(&self, device: usize, reason: CutReason) -> Result<()> {
        let mut devices = self.lock();
        match devices.get_mut(&device) {
            Some(state) => self.cut(state, device, reason),
            None => Ok(()),
        }
    }
}

/// The buffers a cut passes to its program: donated ones move into the
/// call, the rest are borrowed from `shared`, which outlives it.
struct Parameters {
    slots: Vec<Slot>,
    shared: Vec<Arc<Buffer>>,
}

enum Slot {
    Donated(Buffer),
    Shared(usize),
}

impl Parameters {
    /// `plan`'s parameters out of a graph's `externals`.
    fn new(externals: Vec<Arc<Buffer>>, plan: &Plan) -> Result<Parameters> {
        let mut externals: Vec<Option<Arc<Buffer>>> = externals.into_iter().map(Some).collect();
        let mut params = Parameters {
            slots: Vec::with_capacity(plan.params.len()),
            shared: Vec::new(),
        };
        for (&i, donation) in plan.params.iter().zip(&plan.donations) {
            let buffer = externals[i]
                .take()
                .ok_or_else(|| Error::Signature("a deferred graph lists an input twice".into()))?;
            let buffer = match donation {
                Some(_) => match Arc::try_unwrap(buffer) {
                    Ok(b) => {
                        params.slots.push(Slot::Donated(b));
                        continue;
                    }
                    Err(b) => b,
                },
                None => buffer,
            };
            params.shared.push(buffer);
            params.slots.push(Slot::Shared(params.shared.len() - 1));
        }
        Ok(params)
    }

    /// The call's arguments (once).
    fn args(&mut self) -> Vec<Arg<'_>> {
        let slots = std::mem::take(&mut self.slots);
        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Donated(b) => Arg::Donate(b),
                Slot::Shared(k) => Arg::Borrow(self.shared[k].as_ref()),
            })
            .collect()
    }
}

/// Splitting pays while the changed ops are at most this fraction (1/N)
/// of the graph: a decode step whose growing sequence touches a few ops.
/// Where more change (a dynamic KV cache changes every attention op), the
/// pieces between them would be compiled again anyway.
const SPLIT_AT_MOST: usize = 8;

/// When `graph` has the previous cut's ops in the same order and wiring but
/// some of them changed shape or attributes (a decode loop's growing
/// sequence), which ones did; `None` when there is nothing to split off.
/// Moves `graph`'s outlines and kinds into `state` for the next cut (no
/// later step of a cut reads them).
fn changed_ops(state: &mut DeviceState, graph: &mut Graph) -> Option<Vec<bool>> {
    let current = (
        std::mem::take(&mut graph.outlines),
        std::mem::take(&mut graph.kinds),
    );
    let (old_outlines, old_kinds) = state.last_cut.replace(current)?;
    let (outlines, kinds) = state.last_cut.as_ref()?;
    if old_outlines != *outlines {
        return None;
    }
    let changed: Vec<bool> = old_kinds.iter().zip(kinds).map(|(a, b)| a != b).collect();
    let count = changed.iter().filter(|&&c| c).count();
    (count > 0 && count * SPLIT_AT_MOST <= changed.len()).then_some(changed)
}

/// Each node's phase: the first at or after its inputs' phases whose
/// parity matches the node (even for unchanged ops, odd for changed ones).
/// Running the phases in order keeps the unchanged ops together in as few
/// programs as the dependencies allow, and those programs recur.
fn phases(graph: &Graph, changed: &[bool]) -> Vec<usize> {
    let mut phase = vec![0; graph.nodes.len()];
    for (n, node) in graph.nodes.iter().enumerate() {
        let floor = node
            .inputs
            .iter()
            .filter_map(|src| match *src {
                Src::Node(m, _) => Some(phase[m]),
                Src::External(_) => None,
            })
            .max()
            .unwrap_or(0);
        let parity = usize::from(changed[n]);
        phase[n] = if floor % 2 == parity {
            floor
        } else {
            floor + 1
        };
    }
    phase
}

/// The shortest period `p >= min` of `kinds` with at least two full
/// repetitions: `kinds[i] == kinds[i + p]` for every `i`.
fn period(kinds: &[u64], min: usize) -> Option<usize> {
    let n = kinds.len();
    (min.max(1)..=n / 2).find(|&p| (0..n - p).all(|i| kinds[i] == kinds[i + p]))
}

/// Where a cut came from: the user's read or sync that asked for values,
/// else the last op recorded.
fn cut_site(graph: &Graph, needed: &[bool]) -> CallSite {
    profile::current_site().unwrap_or_else(|| {
        let last = needed.iter().rposition(|&x| x).unwrap_or(0);
        graph.nodes[last].location
    })
}

/// Reports a new program for `graph` to [`recompile`]: graphs of the same
/// structure (ops and how they connect) are the same graph.
fn note_build(graph: &Graph, needed: &[bool], device: usize) {
    let live: Vec<usize> = (0..graph.nodes.len()).filter(|&n| needed[n]).collect();
    let mut identity = std::collections::hash_map::DefaultHasher::new();
    device.hash(&mut identity);
    for &n in &live {
        graph.nodes[n].id.hash(&mut identity);
        graph.nodes[n].inputs.hash(&mut identity);
    }
    let inputs: Vec<Vec<_>> = live
        .iter()
        .map(|&n| {
            graph.nodes[n]
                .inputs
                .iter()
                .map(|&s| graph.src_type(s))
                .collect()
        })
        .collect();
    let ops: Vec<OpSignature<'_>> = live
        .iter()
        .zip(&inputs)
        .map(|(&n, inputs)| OpSignature {
            op: graph.nodes[n].op.name,
            inputs,
            attrs: &graph.nodes[n].attrs,
        })
        .collect();
    let what = || match ops.as_slice() {
        [one] => format!("op `{}` (in a fused graph)", one.op),
        many => format!("a fused graph of {} ops", many.len()),
    };
    recompile::built(identity.finish(), what, &ops, cut_site(graph, needed));
}

/// A compile error of a fused graph, blamed on the first op that fails on
/// its own (or on the graph's last op).
fn blame(graph: &Graph, needed: &[bool], device: usize, error: Error) -> Error {
    let runtime = Runtime::global();
    for (n, node) in graph.nodes.iter().enumerate() {
        if !needed[n] {
            continue;
        }
        let types: Vec<_> = node.inputs.iter().map(|&s| graph.src_type(s)).collect();
        let single = single_op_program(node.op, &types, &node.attrs).and_then(|program| {
            runtime
                .as_ref()
                .map_err(Clone::clone)?
                .compile(&program, &CompileOptions::on_device(device))
        });
        if let Err(e) = single {
            return node_error(graph, node, e);
        }
    }
    match graph.nodes.last() {
        Some(node) => node_error(graph, node, error),
        None => error,
    }
}

impl ExecutionPolicy for DeferAndFuse {
    fn name(&self) -> &'static str {
        EagerMode::DeferAndFuse.name()
    }

    fn dispatch(&self, call: OpCall<'_>) -> Result<Vec<Tensor>> {
        if call.op.flags.contains(Flags::NOT_FUSIBLE) || call.op.flags.contains(Flags::HOST_SYNC) {
            self.cut_device(call.device, CutReason::NotFusible)?;
            return self.strict.run(&call);
        }
        self.record(&call)
    }

    /// Records `block` into the pending graph of `device` in one step: no
    /// inference and no lock per call, and tensors only for the block's
    /// outputs. An empty block, or one larger than the op cap, runs call by
    /// call.
    fn dispatch_block(
        &self,
        block: &Block,
        inputs: &[Tensor],
        device: usize,
        location: CallSite,
    ) -> Result<Vec<Tensor>> {
        let calls = block.calls().len();
        let me: Arc<dyn ExecutionPolicy> = match self.me.upgrade() {
            Some(me) if block.fusible() && (1..=self.config.max_ops).contains(&calls) => me,
            _ => return block.run_each(self, inputs, device, location),
        };
        block.check(inputs, device)?;
        let results = self.append(device, inputs, calls, |graph, srcs| {
            let base = graph.nodes.len();
            graph.reserve(calls);
            let mut results: Vec<Option<Tensor>> = vec![None; block.outputs().len()];
            for (c, call) in block.calls().iter().enumerate() {
                let node_inputs = call
                    .inputs
                    .iter()
                    .map(|&src| match src {
                        BlockSrc::Input(i) => srcs[i],
                        BlockSrc::Output(d, j) => Src::Node(base + d, j),
                    })
                    .collect();
                let mut outputs = Vec::with_capacity(call.outputs.len());
                for (j, ty) in call.outputs.iter().enumerate() {
                    // Values only the block reads stay inside the program.
                    let out = match block.slot(c, j) {
                        Some(k) => {
                            let (t, out) = pending(&me, ty, device);
                            results[k] = Some(t);
                            out
                        }
                        None => Output {
                            ty: ty.clone(),
                            tensor: WeakTensor::default(),
                            token: crate::next_token(),
                        },
                    };
                    outputs.push(out);
                }
                let node = Node {
                    op: call.op,
                    id: call.id,
                    attrs: call.attrs.clone(),
                    inputs: node_inputs,
                    outputs,
                    location,
                };
                graph.push_kind(node, block.kind(c));
            }
            results
        })?;
        results
            .into_iter()
            .collect::<Option<Vec<Tensor>>>()
            .ok_or_else(|| Error::Signature("a recorded block lost an output".into()))
    }

    fn materialize(&self, tensor: &Tensor) -> Result<()> {
        let TensorValue::Pending(p) = tensor.value() else {
            return Ok(());
        };
        {
            let mut devices = self.lock();
            let device = devices
                .iter()
                .find(|(_, s)| s.graph.tokens.contains_key(&p.token))
                .map(|(d, _)| *d);
            if let Some(d) = device
                && let Some(state) = devices.get_mut(&d)
            {
                self.cut(state, d, CutReason::HostRead)?;
            }
        }
        // Cut now or before: its launch may wait in the queue.
        launch_queue::global().materialize(p.token)
    }

    fn fuse_collective(&self, call: &CollectiveCall<'_>) -> Result<Option<Vec<Tensor>>> {
        self.fused_collective(call)
    }

    fn start(&self, reason: CutReason) -> Result<()> {
        let mut devices = self.lock();
        let keys: Vec<usize> = devices.keys().copied().collect();
        for d in keys {
            if let Some(state) = devices.get_mut(&d) {
                self.cut(state, d, reason)?;
            }
        }
        Ok(())
    }

    fn flush(&self, reason: CutReason) -> Result<()> {
        self.start(reason)?;
        launch_queue::global().pump(Until::Empty);
        Ok(())
    }
}

/// The source of `t`, the output of a node a replay has just cut: queued
/// behind its graph's compile, or launched already (possibly between
/// reading its value and looking in the queue).
fn cut_before(graph: &mut Graph, t: &Tensor, token: u64) -> Result<Src> {
    if let Some(src) = queued(graph, t, token) {
        return Ok(src);
    }
    // Raises the error of a failed launch.
    launch_queue::global().materialize(token)?;
    match t.value() {
        TensorValue::Device(b) => Ok(Src::External(graph.external(External::Ready(b)))),
        _ => Err(Error::Signature("a deferred input left its graph".into())),
    }
}

/// `t` (pending as `token`) as an external of `graph` if its launch waits
/// in the queue and will leave a buffer of its own shape.
fn queued(graph: &mut Graph, t: &Tensor, token: u64) -> Option<Src> {
    let stored = launch_queue::global().stored_shape(token)?;
    (&stored == t.shape()).then(|| {
        Src::External(graph.external(External::Queued {
            tensor: t.clone(),
            token,
        }))
    })
}

/// The buffers of `externals`, waiting for queued ones.
fn ready(externals: Vec<External>) -> Result<Vec<Arc<Buffer>>> {
    externals.iter().map(External::buffer).collect()
}

/// Queues the launch of `graph`'s cut behind its compile and the launches
/// of the queued values it reads; its outputs stay pending until then.
fn enqueue(
    graph: Graph,
    plan: Plan,
    needed: Vec<bool>,
    device: usize,
    site: CallSite,
    program: Arc<Compiling>,
) {
    let outputs = plan
        .results
        .iter()
        .map(|&(n, o)| {
            let out = &graph.nodes[n].outputs[o];
            launch_queue::Output {
                token: out.token,
                tensor: out.tensor.clone(),
                stored: out.ty.shape.clone(),
            }
        })
        .collect();
    let inputs: Vec<Tensor> = graph
        .externals
        .iter()
        .filter_map(|e| match e {
            External::Queued { tensor, .. } => Some(tensor.clone()),
            External::Ready(_) => None,
        })
        .collect();
    let holds = graph
        .externals
        .iter()
        .filter_map(|e| match e {
            External::Ready(b) => Some(BufferKey::of(b)),
            External::Queued { .. } => None,
        })
        .collect();
    let launch: GraphLaunch = Box::new(move |program, queued| {
        let program = program.map_err(|e| blame(&graph, &needed, device, e))?;
        let mut queued = queued.into_iter();
        let externals = graph
            .externals
            .into_iter()
            .map(|e| match e {
                External::Ready(b) => Some(b),
                External::Queued { .. } => queued.next(),
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Signature("a queued graph lost an input".into()))?;
        let mut params = Parameters::new(externals, &plan)?;
        program.execute(params.args())
    });
    launch_queue::global().push(Launch {
        op: "fused",
        location: site,
        work: Work::Graph {
            program,
            launch,
            holds,
        },
        inputs,
        outputs,
    });
}
