//! Why a program compiled again. Each new program an op or a fused graph
//! needs is compared with the last one built for the same op (or the same
//! graph structure): the first input shape, dtype or attribute that
//! differs is the reason. It goes to [`crate::metrics`], to the trace, and,
//! to a warning that names the source line once programs of the same op or
//! graph that differ from each other only in the same dimensions or
//! attributes have been built in [`WARN_AFTER`] rounds (between host
//! reads): a length that keeps changing from step to step. Many shapes
//! within one round (an optimizer's step over parameters of many sizes)
//! are each built once and warn about nothing.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::op::Attrs;
use crate::profile::{self, CallSite, Detail};
use crate::stablehlo::TensorType;

/// What changed between two programs of one op or graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecompileReason {
    /// An input's shape.
    InputShape,
    /// An input's element type.
    InputDType,
    /// An attribute.
    Attribute,
    /// Neither: which results the graph returns or which buffers it
    /// donates (or the program was evicted from the cache).
    Outputs,
}

impl RecompileReason {
    /// Every reason, in display order.
    pub const ALL: [RecompileReason; 4] = [
        RecompileReason::InputShape,
        RecompileReason::InputDType,
        RecompileReason::Attribute,
        RecompileReason::Outputs,
    ];

    /// A short name (`input_shape`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RecompileReason::InputShape => "input_shape",
            RecompileReason::InputDType => "input_dtype",
            RecompileReason::Attribute => "attribute",
            RecompileReason::Outputs => "outputs",
        }
    }
}

/// One op of a program: what its compiled code depends on.
#[derive(Clone, Copy, Debug)]
pub struct OpSignature<'a> {
    /// The op's name.
    pub op: &'static str,
    /// Its input types.
    pub inputs: &'a [TensorType],
    /// Its attributes.
    pub attrs: &'a Attrs,
}

/// A program built again, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recompile {
    /// The kind of change.
    pub reason: RecompileReason,
    /// The change, e.g. "`matmul` input 0 dim 0: 4 -> 8".
    pub detail: String,
    /// Programs built so far for this op or graph.
    pub builds: u64,
    /// Rounds (stretches between host reads) in which programs were built
    /// that differ from the one before them in the same places as this one
    /// (counting the first program's round).
    pub varying: u64,
    /// Whether this recompile is the one to warn about: the first of this
    /// op or graph to reach [`WARN_AFTER`] rounds.
    pub warn: bool,
}

/// Rounds with programs of one op or graph differing only in the same
/// places, after which a warning is printed (once per op or graph).
pub const WARN_AFTER: u64 = 8;

type OpTypes = (&'static str, Vec<TensorType>, Attrs);

struct Built {
    ops: Vec<OpTypes>,
    builds: u64,
    warned: bool,
}

/// Identities remembered; beyond this the table starts over (a program
/// that keeps changing structure has no "same graph" to compare with).
const MAX_TRACKED: usize = 4096;

#[derive(Default)]
struct Table {
    built: HashMap<u64, Built>,
    /// The last program of each structure (op or graph, input dtypes and
    /// ranks, attribute names) and the round it was built in: programs of
    /// one structure are compared with each other even when programs of
    /// other structures come between.
    last_of_structure: HashMap<u64, (Vec<OpTypes>, u64)>,
    /// Per kind of change (see [`variation`]): rounds counted, and the last.
    varying: HashMap<u64, (u64, u64)>,
}

impl Table {
    /// Counts `round` for the kind of change from `before` (built in
    /// `round_before`) to `now`; the rounds counted for that kind so far
    /// (1 when it is no kind: see [`variation`]).
    fn count_round(
        &mut self,
        identity: u64,
        before: &[OpTypes],
        round_before: u64,
        now: &[OpSignature<'_>],
        round: u64,
    ) -> u64 {
        let Some(kind) = variation(identity, before, now) else {
            return 1;
        };
        // The round of the program before the first change counts too.
        let first = 1 + u64::from(round_before != round);
        let (rounds, last_round) = self.varying.entry(kind).or_insert((first, round));
        if *last_round != round {
            *rounds += 1;
            *last_round = round;
        }
        *rounds
    }
}

static BUILT: Mutex<Option<Table>> = Mutex::new(None);

/// Notes that `ops` (one op, or a graph's ops in order) needed a new
/// program under `identity` (the op, or the graph's structure). Returns the
/// change from the previous program of the same identity, if there was one.
pub fn note_build(identity: u64, ops: &[OpSignature<'_>]) -> Option<Recompile> {
    let mut table = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(Table::default);
    if table.built.len() >= MAX_TRACKED && !table.built.contains_key(&identity) {
        *table = Table::default();
    }
    if table.last_of_structure.len() >= MAX_TRACKED || table.varying.len() >= MAX_TRACKED {
        table.last_of_structure.clear();
        table.varying.clear();
    }
    let owned: Vec<OpTypes> = ops
        .iter()
        .map(|s| (s.op, s.inputs.to_vec(), s.attrs.clone()))
        .collect();
    let round = crate::metrics::host_reads();
    let last = table
        .last_of_structure
        .insert(structure(identity, ops), (owned.clone(), round));
    let varying = match &last {
        Some((before, round_before)) => {
            table.count_round(identity, before, *round_before, ops, round)
        }
        None => 1,
    };
    match table.built.get_mut(&identity) {
        None => {
            table.built.insert(
                identity,
                Built {
                    ops: owned,
                    builds: 1,
                    warned: false,
                },
            );
            None
        }
        Some(built) => {
            // Named against the last program of the same structure when
            // there is one: "dim 1: 24 -> 25" rather than between unrelated
            // shapes that happened to be built one after the other.
            let before = last
                .as_ref()
                .map_or(&built.ops, |(ops_before, _)| ops_before);
            let (reason, detail) = difference(before, ops);
            built.ops = owned;
            built.builds += 1;
            let warn = varying >= WARN_AFTER && !built.warned;
            built.warned |= warn;
            Some(Recompile {
                reason,
                detail,
                builds: built.builds,
                varying,
                warn,
            })
        }
    }
}

/// What programs must share to be compared: the identity, each op's name,
/// input dtypes and ranks, and attribute names.
fn structure(identity: u64, ops: &[OpSignature<'_>]) -> u64 {
    let mut h = DefaultHasher::new();
    identity.hash(&mut h);
    for s in ops {
        s.op.hash(&mut h);
        for input in s.inputs {
            (input.dtype, input.shape.dims().len()).hash(&mut h);
        }
        for (key, _) in s.attrs.iter() {
            key.hash(&mut h);
        }
    }
    h.finish()
}

/// The kind of change from `before` to `now`, two programs of one
/// [`structure`]: their signature with every dimension and attribute that
/// changed left out, and which ones those were. A length that grows step by
/// step changes the same places each time, so its programs share one kind.
/// `None` when nothing stayed the same (unrelated shapes, such as an
/// optimizer's step over parameters of many sizes, are no "varying length")
/// or nothing changed (the program differs in which results it returns).
fn variation(identity: u64, before: &[OpTypes], now: &[OpSignature<'_>]) -> Option<u64> {
    let mut h = DefaultHasher::new();
    identity.hash(&mut h);
    let (mut kept, mut changed) = (false, false);
    for ((_, inputs, attrs), s) in before.iter().zip(now) {
        s.op.hash(&mut h);
        for (a, b) in inputs.iter().zip(s.inputs) {
            b.dtype.hash(&mut h);
            for (&was, &dim) in a.shape.dims().iter().zip(b.shape.dims()) {
                // A changed dimension hashes as a marker, not as its value.
                let same = was == dim;
                kept |= same;
                changed |= !same;
                same.hash(&mut h);
                if same {
                    dim.hash(&mut h);
                }
            }
        }
        for (key, value) in s.attrs.iter() {
            let same = attrs.get(key) == Some(value);
            kept |= same;
            changed |= !same;
            (key, same).hash(&mut h);
            if same {
                format!("{value:?}").hash(&mut h);
            }
        }
    }
    (kept && changed).then(|| h.finish())
}

/// The first difference between the previous program's ops and `now`.
fn difference(before: &[OpTypes], now: &[OpSignature<'_>]) -> (RecompileReason, String) {
    let many = now.len() > 1;
    for (i, ((op, inputs, attrs), s)) in before.iter().zip(now).enumerate() {
        let who = if many {
            format!("op {i} `{}`", s.op)
        } else {
            format!("`{}`", s.op)
        };
        if *op != s.op || inputs.len() != s.inputs.len() {
            return (RecompileReason::Outputs, format!("{who} changed"));
        }
        for (j, (a, b)) in inputs.iter().zip(s.inputs).enumerate() {
            if a.dtype != b.dtype {
                let detail = format!("{who} input {j} dtype: {} -> {}", a.dtype, b.dtype);
                return (RecompileReason::InputDType, detail);
            }
            if a.shape != b.shape {
                let (da, db) = (a.shape.dims(), b.shape.dims());
                let detail = match (0..da.len()).find(|&d| da.len() == db.len() && da[d] != db[d]) {
                    Some(d) => format!(
                        "{who} input {j} dim {d}: {} -> {} ({a} -> {b})",
                        da[d], db[d]
                    ),
                    None => format!("{who} input {j} rank: {a} -> {b}"),
                };
                return (RecompileReason::InputShape, detail);
            }
        }
        if *attrs != *s.attrs {
            let key = attrs
                .iter()
                .map(|(k, _)| k)
                .chain(s.attrs.iter().map(|(k, _)| k))
                .find(|k| attrs.get(k) != s.attrs.get(k))
                .unwrap_or("?");
            let show = |a: &Attrs| a.get(key).map_or("unset".into(), |v| format!("{v:?}"));
            let detail = format!(
                "{who} attribute `{key}`: {} -> {}",
                show(attrs),
                show(s.attrs)
            );
            return (RecompileReason::Attribute, detail);
        }
    }
    (
        RecompileReason::Outputs,
        "the same inputs; the results read or the buffers donated changed".into(),
    )
}

/// [`note_build`], then reports a recompile: counted in the metrics, an
/// event in the trace, and a warning once [`WARN_AFTER`] rebuilds are
/// reached. `what` names the op or graph for people ("op `matmul`").
pub fn built(
    identity: u64,
    what: impl FnOnce() -> String,
    ops: &[OpSignature<'_>],
    site: CallSite,
) {
    let Some(recompile) = note_build(identity, ops) else {
        return;
    };
    crate::metrics::record_recompile(recompile.reason);
    let what = what();
    profile::instant("recompile", what.clone(), || {
        vec![
            ("reason", Detail::from(recompile.reason.name())),
            ("detail", Detail::from(recompile.detail.clone())),
            ("at", Detail::from(site.to_string())),
        ]
    });
    if recompile.warn {
        warn(Warning {
            message: format!(
                "{what} has compiled {} programs that differ only where the last one did: \
                 {}. Inputs whose shapes change every call compile every time: pad them to a \
                 few sizes (from PyTorch, `torch.tpu.set_shape_buckets` does it for tensors \
                 grown by `torch.cat`; for generation, a static cache also does)",
                recompile.varying, recompile.detail
            ),
            site,
        });
    }
}

/// A warning about repeated recompiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// What happened and what to do.
    pub message: String,
    /// Where the program was built from.
    pub site: CallSite,
}

static COLLECTING: AtomicBool = AtomicBool::new(false);
static PENDING: AtomicBool = AtomicBool::new(false);
static WARNINGS: Mutex<Vec<Warning>> = Mutex::new(Vec::new());

fn warn(warning: Warning) {
    tracing::warn!(at = %warning.site, "{}", warning.message);
    if COLLECTING.load(Ordering::Relaxed) {
        WARNINGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(warning);
        PENDING.store(true, Ordering::Release);
    } else {
        eprintln!("tpu-rs warning: {} (at {})", warning.message, warning.site);
    }
}

/// Keeps warnings for [`take_warnings`] instead of printing them: an
/// embedder (the PyTorch bridge) shows them its own way.
pub fn collect_warnings() {
    COLLECTING.store(true, Ordering::Relaxed);
}

/// Whether collected warnings wait (one atomic load).
#[inline]
pub fn warnings_pending() -> bool {
    PENDING.load(Ordering::Acquire)
}

/// The collected warnings, oldest first.
pub fn take_warnings() -> Vec<Warning> {
    PENDING.store(false, Ordering::Release);
    std::mem::take(&mut *WARNINGS.lock().unwrap_or_else(|e| e.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// Rounds are counted by the process's host reads: tests that read or
    /// count them run one at a time.
    static ROUNDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn rounds() -> std::sync::MutexGuard<'static, ()> {
        ROUNDS.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sig<'a>(op: &'static str, inputs: &'a [TensorType], attrs: &'a Attrs) -> OpSignature<'a> {
        OpSignature { op, inputs, attrs }
    }

    #[test]
    fn the_first_build_is_not_a_recompile_and_the_next_names_what_changed() {
        let _rounds = rounds();
        let attrs = Attrs::new().with("dim", 1i64);
        let small = [TensorType::new(DType::F32, [4, 7])];
        let large = [TensorType::new(DType::F32, [8, 7])];
        let half = [TensorType::new(DType::BF16, [8, 7])];
        let id = 0x5eed_0001;
        assert_eq!(note_build(id, &[sig("softmax", &small, &attrs)]), None);
        let grown = note_build(id, &[sig("softmax", &large, &attrs)]).unwrap();
        assert_eq!(grown.reason, RecompileReason::InputShape);
        assert_eq!(
            grown.detail,
            "`softmax` input 0 dim 0: 4 -> 8 (f32[4, 7] -> f32[8, 7])"
        );
        assert_eq!(grown.builds, 2);
        let cast = note_build(id, &[sig("softmax", &half, &attrs)]).unwrap();
        assert_eq!(cast.reason, RecompileReason::InputDType);
        assert_eq!(cast.detail, "`softmax` input 0 dtype: f32 -> bf16");
        let other = Attrs::new().with("dim", 0i64);
        let moved = note_build(id, &[sig("softmax", &half, &other)]).unwrap();
        assert_eq!(moved.reason, RecompileReason::Attribute);
        assert!(
            moved.detail.starts_with("`softmax` attribute `dim`"),
            "{}",
            moved.detail
        );
        let again = note_build(id, &[sig("softmax", &half, &other)]).unwrap();
        assert_eq!(again.reason, RecompileReason::Outputs);
    }

    #[test]
    fn a_growing_length_counts_its_programs_even_between_other_shapes() {
        let _rounds = rounds();
        let none = Attrs::new();
        let id = 0x5eed_0003;
        let mut warned_at = Vec::new();
        for len in 1..=12 {
            let cache = [TensorType::new(DType::F32, [1, 4, len, 32])];
            let other = [TensorType::new(DType::F32, [len + 100])];
            let built = note_build(id, &[sig("add", &cache, &none)]);
            if built.as_ref().is_some_and(|r| r.warn) {
                warned_at.push(len);
            }
            note_build(id, &[sig("add", &other, &none)]);
            // One host read per step, as a decode loop's stopping check.
            crate::metrics::record_to_host(0);
        }
        assert_eq!(warned_at.len(), 1, "{warned_at:?}");
        assert!(warned_at[0] <= WARN_AFTER as usize, "{warned_at:?}");
    }

    #[test]
    fn programs_over_the_same_inputs_are_not_a_varying_length() {
        let _rounds = rounds();
        // A graph rebuilt for other results or donations: no shape changed.
        let none = Attrs::new();
        let id = 0x5eed_0006;
        let inputs = [TensorType::new(DType::F32, [4, 8])];
        for _ in 0..12 {
            let built = note_build(id, &[sig("exp", &inputs, &none)]);
            assert!(built.is_none_or(|r| r.varying == 1 && !r.warn));
            crate::metrics::record_to_host(0);
        }
    }

    #[test]
    fn many_lengths_within_one_round_count_once() {
        let _rounds = rounds();
        // Layers of many widths: one kind of change, all before a host read.
        let attrs = Attrs::new().with("dim", 0i64);
        let id = 0x5eed_0005;
        let mut most = 0;
        for width in [48, 40, 32, 24, 20, 16, 12, 8, 6, 4] {
            let weight = [TensorType::new(DType::F32, [width, 7])];
            let built = note_build(id, &[sig("softmax", &weight, &attrs)]);
            most = most.max(built.map_or(1, |r| r.varying));
        }
        assert!(most < WARN_AFTER, "{most}");
    }

    #[test]
    fn programs_over_unrelated_shapes_are_not_a_varying_length() {
        let _rounds = rounds();
        // An optimizer's step over parameters of many sizes: each shape is
        // built once, and no dimension stays while another changes.
        let none = Attrs::new();
        let id = 0x5eed_0004;
        let mut most = 0;
        for (rows, cols) in [(1024, 128), (128, 384), (384, 64), (64, 512), (512, 10)] {
            for shape in [vec![rows, cols], vec![cols]] {
                let param = [
                    TensorType::new(DType::F32, shape),
                    TensorType::new(DType::F32, []),
                ];
                let built = note_build(id, &[sig("mul", &param, &none)]);
                most = most.max(built.map_or(1, |r| r.varying));
            }
        }
        assert_eq!(most, 1);
    }

    #[test]
    fn in_a_graph_the_changed_op_is_named_by_position() {
        let _rounds = rounds();
        let none = Attrs::new();
        let (a, b) = (
            [TensorType::new(DType::F32, [2, 3])],
            [TensorType::new(DType::F32, [2, 3, 1])],
        );
        let id = 0x5eed_0002;
        note_build(id, &[sig("exp", &a, &none), sig("add", &a, &none)]);
        let changed = note_build(id, &[sig("exp", &a, &none), sig("add", &b, &none)]).unwrap();
        assert_eq!(changed.reason, RecompileReason::InputShape);
        assert_eq!(
            changed.detail,
            "op 1 `add` input 0 rank: f32[2, 3] -> f32[2, 3, 1]"
        );
    }
}
