//! Gloo, the engine of the host leg: a full mesh of TCP pairs between the
//! processes, set up through the rendezvous [`Store`], carrying
//! collectives over host bytes.

mod bridge;

use std::time::Duration;

use tpu_core::DType;

use crate::ReduceOp;
use crate::store::Store;

/// The rendezvous store as Gloo's C++ side sees it: keys under a prefix
/// unique to one group.
pub(crate) struct StoreAdapter {
    store: Store,
    prefix: String,
}

impl StoreAdapter {
    fn set(&self, key: &str, value: &[u8]) -> tpu_core::Result<()> {
        self.store.set(&format!("{}{key}", self.prefix), value)
    }

    fn get(&self, key: &str, timeout_ms: u64) -> tpu_core::Result<Vec<u8>> {
        self.store.get_within(
            &format!("{}{key}", self.prefix),
            Duration::from_millis(timeout_ms),
        )
    }
}

/// A connected Gloo context. Collectives on it must be issued in the same
/// order by every process; each returns Gloo's error text on failure.
pub(crate) struct Gloo {
    context: cxx::UniquePtr<bridge::ffi::GlooContext>,
}

/// What a failed Gloo call says.
pub(crate) type GlooResult<T> = std::result::Result<T, String>;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn reason(e: cxx::Exception) -> String {
    e.what().to_string()
}

impl Gloo {
    /// Connects `rank` of `size` processes, meeting under `prefix` in
    /// `store`; this process listens on `hostname`.
    pub(crate) fn connect(
        rank: usize,
        size: usize,
        hostname: &str,
        store: Store,
        prefix: String,
        timeout: Duration,
    ) -> GlooResult<Gloo> {
        let adapter = StoreAdapter { store, prefix };
        let context = bridge::ffi::connect(
            rank as i32,
            size as i32,
            hostname,
            &adapter,
            millis(timeout),
        )
        .map_err(reason)?;
        Ok(Gloo { context })
    }

    fn context(&self) -> &bridge::ffi::GlooContext {
        self.context.as_ref().expect("connect returns a context")
    }

    /// Reduces `data` (elements of `dtype`) in place across all processes.
    pub(crate) fn all_reduce(
        &self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        let (dtype, op) = codes(dtype, op)?;
        self.context()
            .all_reduce(data, dtype, op, tag, millis(timeout))
            .map_err(reason)
    }

    /// Reduces every process's `input` (one block per rank, in rank order)
    /// and leaves block `rank` of the result in `output`.
    pub(crate) fn reduce_scatter(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        let (dtype, op) = codes(dtype, op)?;
        self.context()
            .reduce_scatter(input, output, dtype, op, tag, millis(timeout))
            .map_err(reason)
    }

    /// Concatenates every process's `input` into `output`, in rank order.
    pub(crate) fn all_gather(
        &self,
        input: &[u8],
        output: &mut [u8],
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        self.context()
            .all_gather(input, output, tag, millis(timeout))
            .map_err(reason)
    }

    /// Overwrites `data` with rank `root`'s.
    pub(crate) fn broadcast(
        &self,
        data: &mut [u8],
        root: usize,
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        self.context()
            .broadcast(data, root as i32, tag, millis(timeout))
            .map_err(reason)
    }

    /// Block `r` of `input` goes to rank `r`; `output` gets every rank's
    /// block for this process, in rank order.
    pub(crate) fn all_to_all(
        &self,
        input: &[u8],
        output: &mut [u8],
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        self.context()
            .all_to_all(input, output, tag, millis(timeout))
            .map_err(reason)
    }

    /// Sends `data` to `peer`, returning once it has been handed over.
    pub(crate) fn send(
        &self,
        data: &[u8],
        peer: usize,
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        self.context()
            .send(data, peer as i32, tag, millis(timeout))
            .map_err(reason)
    }

    /// Receives `data.len()` bytes from `peer`.
    pub(crate) fn recv(
        &self,
        data: &mut [u8],
        peer: usize,
        tag: u32,
        timeout: Duration,
    ) -> GlooResult<()> {
        self.context()
            .recv(data, peer as i32, tag, millis(timeout))
            .map_err(reason)
    }

    /// Returns once every process has called it.
    pub(crate) fn barrier(&self, tag: u32, timeout: Duration) -> GlooResult<()> {
        self.context().barrier(tag, millis(timeout)).map_err(reason)
    }
}

/// The C++ side's dtype and reduction codes (see native/gloo_bridge.cc).
/// Booleans reduce as bytes: sum and max are `or`, min and product `and`.
/// Complex values sum (and average) part by part, as pairs of floats; they
/// have no order and their product mixes parts, so nothing else reduces them.
fn codes(dtype: DType, op: ReduceOp) -> GlooResult<(u8, u8)> {
    if dtype.is_complex() && !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        return Err(format!(
            "{dtype} tensors reduce only by sum or mean, not {op:?}"
        ));
    }
    let dtype_code = match dtype {
        DType::Bool | DType::U8 => 0,
        DType::I8 => 1,
        DType::I16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
        DType::U32 => 5,
        DType::F16 => 6,
        DType::BF16 => 7,
        DType::F32 | DType::C64 => 8,
        DType::F64 | DType::C128 => 9,
    };
    let op_code = match (dtype, op) {
        (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => 2,
        (DType::Bool, _) => 3,
        (_, ReduceOp::Sum) => 0,
        (_, ReduceOp::Mean) => 4,
        (_, ReduceOp::Prod) => 1,
        (_, ReduceOp::Max) => 2,
        (_, ReduceOp::Min) => 3,
    };
    Ok((dtype_code, op_code))
}
