//! Process-wide counters: compiles, cache hits, executions, graph cuts,
//! recompiles, transfers and device memory. Always on; reading them costs a
//! few atomic loads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::profile;
pub use crate::recompile::RecompileReason;

/// Why a deferred graph was cut (compiled and run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CutReason {
    /// A value was read on the host (`to_vec`, `item`, printing).
    HostRead,
    /// An explicit `sync()`.
    Sync,
    /// The end of a backward pass.
    Backward,
    /// A collective needed its inputs.
    Collective,
    /// An op that cannot be fused, or needs host values.
    NotFusible,
    /// The pending graph reached its op or byte cap.
    PendingCap,
    /// The op sequence repeated the previous graph's (a training step).
    RepeatedSequence,
    /// The graph repeats the previous one's ops but some change shapes or
    /// attributes (a sequence growing by a token): the changing ops run as
    /// programs of their own, so the rest keeps its compiled program.
    VaryingShapes,
}

impl CutReason {
    /// Every reason, in display order.
    pub const ALL: [CutReason; 8] = [
        CutReason::HostRead,
        CutReason::Sync,
        CutReason::Backward,
        CutReason::Collective,
        CutReason::NotFusible,
        CutReason::PendingCap,
        CutReason::RepeatedSequence,
        CutReason::VaryingShapes,
    ];

    /// A short name (`host_read`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CutReason::HostRead => "host_read",
            CutReason::Sync => "sync",
            CutReason::Backward => "backward",
            CutReason::Collective => "collective",
            CutReason::NotFusible => "not_fusible",
            CutReason::PendingCap => "pending_cap",
            CutReason::RepeatedSequence => "repeated_sequence",
            CutReason::VaryingShapes => "varying_shapes",
        }
    }
}

static COMPILES: AtomicU64 = AtomicU64::new(0);
static CACHE_HITS: AtomicU64 = AtomicU64::new(0);
static DISK_HITS: AtomicU64 = AtomicU64::new(0);
static COMPILE_NANOS: AtomicU64 = AtomicU64::new(0);
static EXECUTIONS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static CUTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
static RECOMPILES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static TO_DEVICE_BYTES: AtomicU64 = AtomicU64::new(0);
static TO_HOST_BYTES: AtomicU64 = AtomicU64::new(0);
/// Reads of device values by the host: the rounds of a program's work
/// (never reset).
static HOST_READS: AtomicU64 = AtomicU64::new(0);

/// The trace counter of live device bytes.
const LIVE_BYTES_COUNTER: &str = "live device bytes";

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Programs compiled.
    pub compiles: u64,
    /// Compilations avoided by the in-memory cache.
    pub cache_hits: u64,
    /// Compilations avoided by loading a serialized executable from disk.
    pub disk_hits: u64,
    /// Time spent compiling.
    pub compile_time: Duration,
    /// Programs executed.
    pub executions: u64,
    /// Deferred graphs cut, by reason.
    pub graphs_cut: Vec<(CutReason, u64)>,
    /// Programs built again for an op or graph that had one, by what
    /// changed (see [`crate::recompile`]).
    pub recompiles_by_reason: Vec<(RecompileReason, u64)>,
    /// Bytes copied from the host to devices.
    pub host_to_device_bytes: u64,
    /// Bytes copied from devices to the host.
    pub device_to_host_bytes: u64,
    /// Bytes held in device buffers now.
    pub live_device_bytes: u64,
    /// The most bytes held at once since start (or the last reset).
    pub peak_device_bytes: u64,
}

impl Metrics {
    /// Total graphs cut.
    pub fn total_cuts(&self) -> u64 {
        self.graphs_cut.iter().map(|(_, n)| n).sum()
    }

    /// Graphs cut for `reason`.
    pub fn cuts(&self, reason: CutReason) -> u64 {
        count_for(&self.graphs_cut, reason)
    }

    /// Total recompiles.
    pub fn total_recompiles(&self) -> u64 {
        self.recompiles_by_reason.iter().map(|(_, n)| n).sum()
    }

    /// Recompiles for `reason`.
    pub fn recompiles(&self, reason: RecompileReason) -> u64 {
        count_for(&self.recompiles_by_reason, reason)
    }
}

fn count_for<K: PartialEq>(counts: &[(K, u64)], key: K) -> u64 {
    counts
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, n)| *n)
}

/// The counters now.
pub fn metrics() -> Metrics {
    Metrics {
        compiles: COMPILES.load(Ordering::Relaxed),
        cache_hits: CACHE_HITS.load(Ordering::Relaxed),
        disk_hits: DISK_HITS.load(Ordering::Relaxed),
        compile_time: Duration::from_nanos(COMPILE_NANOS.load(Ordering::Relaxed)),
        executions: EXECUTIONS.load(Ordering::Relaxed),
        graphs_cut: by_reason(&CutReason::ALL, &CUTS),
        recompiles_by_reason: by_reason(&RecompileReason::ALL, &RECOMPILES),
        host_to_device_bytes: TO_DEVICE_BYTES.load(Ordering::Relaxed),
        device_to_host_bytes: TO_HOST_BYTES.load(Ordering::Relaxed),
        live_device_bytes: LIVE_BYTES.load(Ordering::Relaxed),
        peak_device_bytes: PEAK_BYTES.load(Ordering::Relaxed),
    }
}

/// Restarts the peak at the current live bytes.
pub fn reset_peak_device_bytes() {
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}

pub(crate) fn record_compile(time: Duration) {
    COMPILES.fetch_add(1, Ordering::Relaxed);
    COMPILE_NANOS.fetch_add(
        time.as_nanos().min(u128::from(u64::MAX)) as u64,
        Ordering::Relaxed,
    );
}

/// Counts a compilation avoided by a cache (the runtime's, or a policy's own).
pub fn record_cache_hit() {
    CACHE_HITS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_disk_hit() {
    DISK_HITS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_execution() {
    EXECUTIONS.fetch_add(1, Ordering::Relaxed);
}

/// Each of `reasons` with its counter (`counters[i]` counts `reasons[i]`).
fn by_reason<R: Copy>(reasons: &[R], counters: &[AtomicU64]) -> Vec<(R, u64)> {
    reasons
        .iter()
        .zip(counters)
        .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
        .collect()
}

/// Adds one to the counter of `reason` among `reasons`.
fn count<R: PartialEq>(reasons: &[R], counters: &[AtomicU64], reason: R) {
    let i = reasons.iter().position(|r| *r == reason).unwrap_or(0);
    counters[i].fetch_add(1, Ordering::Relaxed);
}

/// Counts a cut of a deferred graph.
pub fn record_graph_cut(reason: CutReason) {
    count(&CutReason::ALL, &CUTS, reason);
}

pub(crate) fn record_recompile(reason: RecompileReason) {
    count(&RecompileReason::ALL, &RECOMPILES, reason);
}

pub(crate) fn record_to_device(bytes: u64) {
    TO_DEVICE_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn record_to_host(bytes: u64) {
    TO_HOST_BYTES.fetch_add(bytes, Ordering::Relaxed);
    HOST_READS.fetch_add(1, Ordering::Relaxed);
}

/// How many times the host has read a device value so far.
pub(crate) fn host_reads() -> u64 {
    HOST_READS.load(Ordering::Relaxed)
}

pub(crate) fn device_alloc(bytes: u64) {
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
    profile::counter(LIVE_BYTES_COUNTER, live);
}

pub(crate) fn device_free(bytes: u64) {
    let live = LIVE_BYTES
        .fetch_sub(bytes, Ordering::Relaxed)
        .saturating_sub(bytes);
    profile::counter(LIVE_BYTES_COUNTER, live);
}

/// Puts the live bytes in the trace (when one starts).
pub(crate) fn note_live_bytes() {
    profile::counter(LIVE_BYTES_COUNTER, LIVE_BYTES.load(Ordering::Relaxed));
}

/// The process's activity as a report: the summary of the trace being (or
/// last) recorded, whose op table needs one, and the counters.
pub fn report() -> String {
    let m = metrics();
    let mut out = String::new();
    match profile::recorded_summary() {
        Some(summary) => out.push_str(&format!("{summary}\n")),
        None => out.push_str(
            "top ops by time: no trace recorded (TPU_RS_PROFILE=FILE or a profile scope)\n",
        ),
    }
    out.push_str(&format!(
        "process totals: {} compiles ({:.2} s), {} in-memory and {} disk cache hits, {} launches\n",
        m.compiles,
        m.compile_time.as_secs_f64(),
        m.cache_hits,
        m.disk_hits,
        m.executions
    ));
    out.push_str(&format!(
        "  graph cuts: {}\n",
        profile::summary::by_count(m.graphs_cut.iter().map(|(r, n)| (r.name(), *n)))
    ));
    out.push_str(&format!(
        "  recompiles: {}\n",
        profile::summary::by_count(m.recompiles_by_reason.iter().map(|(r, n)| (r.name(), *n)))
    ));
    out.push_str(&format!(
        "  transfers: {} to devices, {} to the host\n",
        profile::summary::bytes(m.host_to_device_bytes),
        profile::summary::bytes(m.device_to_host_bytes)
    ));
    out.push_str(&format!(
        "  device memory: {} live, peak {}",
        profile::summary::bytes(m.live_device_bytes),
        profile::summary::bytes(m.peak_device_bytes)
    ));
    out
}
