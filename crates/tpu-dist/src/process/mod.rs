//! Collectives across the processes of a job: the host leg.
//!
//! Rank 0 serves the rendezvous store; every rank connects a Gloo context
//! through it. Each collective first exchanges a small signature (op,
//! dtype, shape) so ranks that disagree fail with an error instead of
//! reading each other's bytes as garbage, then moves the payload over
//! Gloo. Each rank publishes how many collectives it has entered, so a
//! timeout can name the ranks that never arrived.

mod progress;
mod signature;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tpu_core::op::OpError;

use tpu_core::pjrt::KeyValueStoreHandle;
use tpu_core::{DType, Device, Error, HostBuffer, HostTensor, Result, Runtime, Shape, Tensor};

use crate::ReduceOp;
use crate::collective::{check_dim, flush_pending, split};
use crate::env::JobOptions;
use crate::gloo::Gloo;
use crate::layout;
use crate::store::{PjrtKeys, Store, seconds};
use progress::Progress;
use signature::{Kind, Signature};

/// Groups created by this process so far: each meets under its own store
/// prefix, so every rank must create its groups in the same order.
static GROUPS: AtomicU64 = AtomicU64::new(0);

/// Whether the runtime has been offered a group's store for PJRT's own
/// key-value traffic.
static KEYS_GIVEN: AtomicBool = AtomicBool::new(false);

/// The Gloo tag of the barrier that ends joining; collectives use tags
/// from 0 up.
const INIT_TAG: u32 = u32::MAX;

/// The processes of a job, connected by Gloo. Cheap to clone; collectives
/// on one group run one at a time, in the order every rank issues them.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Inner>,
}

struct Inner {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    timeout: Duration,
    prefix: String,
    store: Store,
    progress: Progress,
    state: Mutex<State>,
}

struct State {
    gloo: Gloo,
    /// Collectives issued so far.
    seq: u64,
    /// Messages sent to and received from each peer so far.
    sent: HashMap<usize, u32>,
    received: HashMap<usize, u32>,
    /// Why the group is unusable, once a collective failed.
    failed: Option<String>,
}

impl ProcessGroup {
    /// Joins the job described by torchrun's or `tpu-rs launch`'s
    /// environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...).
    pub fn from_env() -> Result<ProcessGroup> {
        ProcessGroup::new(&JobOptions::from_env()?)
    }

    /// Joins the job `options` describe; returns once every rank has.
    pub fn new(options: &JobOptions) -> Result<ProcessGroup> {
        let store = if options.rank == 0 {
            Store::serve(&format!("0.0.0.0:{}", options.master_port), options.timeout)?
        } else {
            Store::connect(&options.store_address(), options.timeout)?
        };
        // Groups of one job share its store: each meets under a prefix of
        // its own.
        let generation = GROUPS.fetch_add(1, Ordering::Relaxed);
        ProcessGroup::join(options, store, format!("tpu_dist/{generation}/"))
    }

    /// Joins a group whose ranks meet in `store`, served by the group's
    /// rank 0 for this group alone (found another way, as PyTorch's
    /// backend finds it through torch's store); `options.master_addr` is
    /// the host rank 0 listens on, `options.master_port` is not used.
    /// Returns once every rank has joined.
    pub fn with_store(options: &JobOptions, store: Store) -> Result<ProcessGroup> {
        ProcessGroup::join(options, store, "tpu_dist/".to_string())
    }

    fn join(options: &JobOptions, store: Store, prefix: String) -> Result<ProcessGroup> {
        let timeout = options.timeout;
        if !KEYS_GIVEN.swap(true, Ordering::Relaxed) {
            // Plugins that run multi-host collectives themselves (libtpu on
            // a pod slice) meet through the first group's store.
            let keys = KeyValueStoreHandle(Arc::new(PjrtKeys(store.reconnect()?)));
            if !Runtime::set_key_value_store(keys) {
                tracing::debug!(
                    "the runtime was created before the job's store; its plugin gets none"
                );
            }
        }
        let progress = Progress::start(store.reconnect()?, &prefix, options.rank)?;
        let hostname = if options.rank == 0 {
            options.master_addr.clone()
        } else {
            store.local_ip()?
        };
        let started = Instant::now();
        let gloo = Gloo::connect(
            options.rank,
            options.world_size,
            &hostname,
            store.reconnect()?,
            format!("{prefix}gloo/"),
            timeout,
        );
        let inner = Inner {
            rank: options.rank,
            world_size: options.world_size,
            local_rank: options.local_rank,
            timeout,
            prefix,
            store,
            progress,
            state: Mutex::new(State {
                gloo: match gloo {
                    Ok(gloo) => gloo,
                    Err(reason) => {
                        return Err(Error::Collective {
                            op: "init".into(),
                            seq: 0,
                            rank: options.rank,
                            world_size: options.world_size,
                            missing: Vec::new(),
                            reason: format!(
                                "connecting to the other ranks failed after {}: {reason}",
                                seconds(started.elapsed())
                            ),
                        });
                    }
                },
                seq: 0,
                sent: HashMap::new(),
                received: HashMap::new(),
                failed: None,
            }),
        };
        let group = ProcessGroup {
            inner: Arc::new(inner),
        };
        group.meet(started)?;
        Ok(group)
    }

    /// The end of joining: a barrier, so that every rank has finished
    /// connecting before any returns (a rank that then dies fails the
    /// others' next collective, not their connection set-up).
    fn meet(&self, started: Instant) -> Result<()> {
        let state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .gloo
            .barrier(INIT_TAG, self.inner.timeout)
            .map_err(|reason| Error::Collective {
                op: "init".into(),
                seq: 0,
                rank: self.rank(),
                world_size: self.world_size(),
                missing: Vec::new(),
                reason: format!(
                    "the ranks did not all finish connecting within {}: {reason}",
                    seconds(started.elapsed())
                ),
            })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of processes.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// This process's rank among those of its host.
    pub fn local_rank(&self) -> usize {
        self.inner.local_rank
    }

    /// How long a collective waits for the other ranks.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The job's key-value store (keys under `user/` are the caller's).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Every rank gets the elementwise `op` of all ranks' `x`.
    pub fn all_reduce(&self, x: &Tensor, op: ReduceOp) -> Result<Tensor> {
        on_host(x, |b| self.all_reduce_host(b, op))
    }

    /// [`ProcessGroup::all_reduce`] on host memory.
    pub fn all_reduce_host(&self, x: HostBuffer, op: ReduceOp) -> Result<HostBuffer> {
        let sig = Signature::new(Kind::AllReduce(op), &x);
        if let Err(reason) = op.combiner(x.dtype()) {
            return Err(self.invalid(&sig, reason));
        }
        let (dtype, shape) = (x.dtype(), x.shape().clone());
        let mut bytes = x.into_bytes();
        self.run(&sig, |gloo, tag, timeout| {
            gloo.all_reduce(&mut bytes, dtype, op, tag, timeout)
        })?;
        HostBuffer::from_bytes(bytes, dtype, shape)
    }

    /// Every rank gets all ranks' `x` concatenated along `dim`, in rank
    /// order.
    pub fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        on_host(x, |b| self.all_gather_host(b, dim))
    }

    /// [`ProcessGroup::all_gather`] on host memory.
    pub fn all_gather_host(&self, x: HostBuffer, dim: usize) -> Result<HostBuffer> {
        let sig = Signature::new(Kind::AllGather { dim }, &x);
        let dims = x.shape().dims().to_vec();
        check_dim("dim", dim, dims.len()).map_err(|reason| self.invalid(&sig, reason))?;
        let n = self.world_size();
        let mut gathered = vec![0; x.bytes().len() * n];
        self.run(&sig, |gloo, tag, timeout| {
            gloo.all_gather(x.bytes(), &mut gathered, tag, timeout)
        })?;
        let elem = x.dtype().size_in_bytes();
        let mut out_dims = dims.clone();
        out_dims[dim] *= n;
        let bytes = layout::concat(&gathered, &dims, dim, n, elem);
        HostBuffer::from_bytes(bytes, x.dtype(), out_dims)
    }

    /// The elementwise `op` of all ranks' `x`, split along `dim` into one
    /// equal block per rank: rank `r` gets block `r`.
    pub fn reduce_scatter(&self, x: &Tensor, op: ReduceOp, dim: usize) -> Result<Tensor> {
        on_host(x, |b| self.reduce_scatter_host(b, op, dim))
    }

    /// [`ProcessGroup::reduce_scatter`] on host memory.
    pub fn reduce_scatter_host(
        &self,
        x: HostBuffer,
        op: ReduceOp,
        dim: usize,
    ) -> Result<HostBuffer> {
        let sig = Signature::new(Kind::ReduceScatter { op, dim }, &x);
        let dims = x.shape().dims().to_vec();
        let n = self.world_size();
        self.check_split(&sig, &dims, dim)?;
        if let Err(reason) = op.combiner(x.dtype()) {
            return Err(self.invalid(&sig, reason));
        }
        let (dtype, elem) = (x.dtype(), x.dtype().size_in_bytes());
        let blocks = layout::split(x.bytes(), &dims, dim, n, elem);
        let mut mine = vec![0; blocks.len() / n];
        self.run(&sig, |gloo, tag, timeout| {
            gloo.reduce_scatter(&blocks, &mut mine, dtype, op, tag, timeout)
        })?;
        let mut out_dims = dims;
        out_dims[dim] /= n;
        HostBuffer::from_bytes(mine, dtype, out_dims)
    }

    /// Every rank gets rank `root`'s `x`.
    pub fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        on_host(x, |b| self.broadcast_host(b, root))
    }

    /// [`ProcessGroup::broadcast`] on host memory.
    pub fn broadcast_host(&self, x: HostBuffer, root: usize) -> Result<HostBuffer> {
        let sig = Signature::new(Kind::Broadcast { root }, &x);
        if root >= self.world_size() {
            return Err(self.invalid(
                &sig,
                format!(
                    "root rank {root} is not in a group of {}",
                    self.world_size()
                ),
            ));
        }
        let (dtype, shape) = (x.dtype(), x.shape().clone());
        let mut bytes = x.into_bytes();
        self.run(&sig, |gloo, tag, timeout| {
            gloo.broadcast(&mut bytes, root, tag, timeout)
        })?;
        HostBuffer::from_bytes(bytes, dtype, shape)
    }

    /// Each rank splits `x` along `split_dim` into one block per rank and
    /// sends block `r` to rank `r`, which concatenates what it receives
    /// along `concat_dim` in rank order (expert-parallel dispatch).
    pub fn all_to_all(&self, x: &Tensor, split_dim: usize, concat_dim: usize) -> Result<Tensor> {
        on_host(x, |b| self.all_to_all_host(b, split_dim, concat_dim))
    }

    /// [`ProcessGroup::all_to_all`] on host memory.
    pub fn all_to_all_host(
        &self,
        x: HostBuffer,
        split_dim: usize,
        concat_dim: usize,
    ) -> Result<HostBuffer> {
        let sig = Signature::new(
            Kind::AllToAll {
                split_dim,
                concat_dim,
            },
            &x,
        );
        let dims = x.shape().dims().to_vec();
        let n = self.world_size();
        self.check_split(&sig, &dims, split_dim)?;
        check_dim("concat_dim", concat_dim, dims.len())
            .map_err(|reason| self.invalid(&sig, reason))?;
        let elem = x.dtype().size_in_bytes();
        let blocks = layout::split(x.bytes(), &dims, split_dim, n, elem);
        let mut received = vec![0; blocks.len()];
        self.run(&sig, |gloo, tag, timeout| {
            gloo.all_to_all(&blocks, &mut received, tag, timeout)
        })?;
        let mut block_dims = dims;
        block_dims[split_dim] /= n;
        let mut out_dims = block_dims.clone();
        out_dims[concat_dim] *= n;
        let bytes = layout::concat(&received, &block_dims, concat_dim, n, elem);
        HostBuffer::from_bytes(bytes, x.dtype(), out_dims)
    }

    /// All-to-all with blocks of any size along dimension 0: this rank
    /// sends its next `input_splits[j]` rows to rank `j` and receives
    /// `output_splits[j]` rows from rank `j`, concatenated in rank order
    /// (what `torch.distributed.all_to_all_single` does with splits).
    pub fn all_to_all_v(
        &self,
        x: &Tensor,
        input_splits: &[usize],
        output_splits: &[usize],
    ) -> Result<Tensor> {
        on_host(x, |b| {
            self.all_to_all_v_host(b, input_splits, output_splits)
        })
    }

    /// [`ProcessGroup::all_to_all_v`] on host memory. Every rank first
    /// learns every rank's splits, so a rank that expects other sizes than
    /// its peers send fails on every rank alike; then blocks padded to the
    /// largest move in one equal all-to-all.
    pub fn all_to_all_v_host(
        &self,
        x: HostBuffer,
        input_splits: &[usize],
        output_splits: &[usize],
    ) -> Result<HostBuffer> {
        let n = self.world_size();
        let dims = x.shape().dims().to_vec();
        let sig = Signature::new(Kind::AllToAllSizes, &x);
        let rows_sent: usize = input_splits.iter().sum();
        let invalid = if dims.is_empty() {
            Some("a 0-d tensor has no rows to split".to_string())
        } else if input_splits.len() != n || output_splits.len() != n {
            Some(format!(
                "{} input and {} output splits for a group of {n}",
                input_splits.len(),
                output_splits.len()
            ))
        } else if rows_sent != dims[0] {
            Some(format!(
                "the input splits {input_splits:?} add up to {rows_sent} rows, the input has {}",
                dims[0]
            ))
        } else {
            None
        };
        if let Some(reason) = invalid {
            return Err(self.invalid(&sig, reason));
        }
        let mine: Vec<u8> = input_splits
            .iter()
            .chain(output_splits)
            .flat_map(|&s| (s as u64).to_le_bytes())
            .collect();
        let mut all = vec![0; mine.len() * n];
        let sizes = Signature::of(Kind::AllToAllSizes, DType::I64, &[2 * n]);
        self.run(&sizes, |gloo, tag, timeout| {
            gloo.all_gather(&mine, &mut all, tag, timeout)
        })?;
        let split = |rank: usize, i: usize| {
            let at = (rank * 2 * n + i) * 8;
            u64::from_le_bytes(all[at..at + 8].try_into().expect("8 bytes")) as usize
        };
        // Every block padded to the largest any rank sends.
        let mut block = 0;
        for (r, j) in (0..n).flat_map(|r| (0..n).map(move |j| (r, j))) {
            let (expected, sent) = (split(r, n + j), split(j, r));
            if expected != sent {
                return Err(self.invalid(
                    &sig,
                    format!(
                        "rank {r} expects {expected} rows from rank {j}, which sends it {sent}"
                    ),
                ));
            }
            block = block.max(sent);
        }
        let row = dims[1..].iter().product::<usize>() * x.dtype().size_in_bytes();
        let mut padded = vec![0; n * block * row];
        let mut at = 0;
        for (j, &rows) in input_splits.iter().enumerate() {
            let len = rows * row;
            padded[j * block * row..][..len].copy_from_slice(&x.bytes()[at..at + len]);
            at += len;
        }
        let mut padded_dims = dims.clone();
        padded_dims[0] = n * block;
        let padded = HostBuffer::from_bytes(padded, x.dtype(), padded_dims)?;
        let received = self.all_to_all_host(padded, 0, 0)?;
        let mut out = Vec::with_capacity(output_splits.iter().sum::<usize>() * row);
        for (j, &rows) in output_splits.iter().enumerate() {
            out.extend_from_slice(&received.bytes()[j * block * row..][..rows * row]);
        }
        let mut out_dims = dims;
        out_dims[0] = output_splits.iter().sum();
        HostBuffer::from_bytes(out, x.dtype(), out_dims)
    }

    /// Sends `x` to rank `peer`, which must [`ProcessGroup::recv`] it.
    pub fn send(&self, x: &Tensor, peer: usize) -> Result<()> {
        self.send_host(&download(x)?, peer)
    }

    /// [`ProcessGroup::send`] from host memory.
    pub fn send_host(&self, x: &HostBuffer, peer: usize) -> Result<()> {
        let sig = Signature::new(Kind::SendRecv, x);
        self.check_peer(&sig, peer)?;
        self.point_to_point(&sig, peer, true, |gloo, tag, timeout| {
            gloo.send(&sig.encode(), peer, tag, timeout)?;
            gloo.send(x.bytes(), peer, tag, timeout)
        })
    }

    /// Receives a tensor of `dtype` and `shape` from rank `peer` onto
    /// `device`; an error if the peer sends another dtype or shape.
    pub fn recv(
        &self,
        dtype: DType,
        shape: impl Into<Shape>,
        device: Device,
        peer: usize,
    ) -> Result<Tensor> {
        upload(self.recv_host(dtype, shape, peer)?, device)
    }

    /// [`ProcessGroup::recv`] into host memory.
    pub fn recv_host(
        &self,
        dtype: DType,
        shape: impl Into<Shape>,
        peer: usize,
    ) -> Result<HostBuffer> {
        let shape = shape.into();
        let sig = Signature::of(Kind::SendRecv, dtype, shape.dims());
        self.check_peer(&sig, peer)?;
        let mut bytes = vec![0; shape.numel() * dtype.size_in_bytes()];
        self.point_to_point(&sig, peer, false, |gloo, tag, timeout| {
            let mut header = [0; signature::LEN];
            gloo.recv(&mut header, peer, tag, timeout)?;
            if header != sig.encode() {
                let theirs = signature::describe(&header);
                return Err(format!(
                    "rank {peer} sent {theirs}, this rank expects {sig}"
                ));
            }
            gloo.recv(&mut bytes, peer, tag, timeout)
        })?;
        HostBuffer::from_bytes(bytes, dtype, shape)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        let sig = Signature::of(Kind::Barrier, DType::U8, &[]);
        self.run(&sig, |gloo, tag, timeout| gloo.barrier(tag, timeout))
    }

    /// Runs one collective: the signature exchange, then `body` with the
    /// payload's Gloo tag, turning failures into errors that name the op,
    /// its sequence number and the ranks that did not arrive.
    fn run<T>(
        &self,
        sig: &Signature,
        body: impl FnOnce(&Gloo, u32, Duration) -> std::result::Result<T, String>,
    ) -> Result<T> {
        let mut state = self.usable(sig)?;
        let seq = state.seq;
        state.seq += 1;
        self.inner.progress.entered(state.seq);
        let entered = Instant::now();
        let timeout = self.inner.timeout;
        // Two tags per collective: its signature, then its payload.
        let tag = (seq as u32).wrapping_mul(2);
        let mut signatures = vec![0; signature::LEN * self.world_size()];
        let exchanged = state
            .gloo
            .all_gather(&sig.encode(), &mut signatures, tag, timeout);
        if exchanged.is_ok()
            && let Err(reason) = sig.agree(&signatures, self.rank())
        {
            // Every rank saw every signature and skips the payload alike,
            // so the group stays usable.
            return Err(self.failure(sig, seq, Vec::new(), reason));
        }
        let outcome = exchanged.and_then(|()| body(&state.gloo, tag.wrapping_add(1), timeout));
        outcome.map_err(|reason| {
            state.failed = Some(reason.clone());
            match self.missing(seq, entered) {
                Ok(missing) => self.failure(sig, seq, missing, reason),
                Err(unknown) => self.failure(sig, seq, Vec::new(), format!("{reason}; {unknown}")),
            }
        })
    }

    /// Runs one point-to-point transfer with `peer` under the next tag of
    /// that direction.
    fn point_to_point(
        &self,
        sig: &Signature,
        peer: usize,
        sending: bool,
        body: impl FnOnce(&Gloo, u32, Duration) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let mut state = self.usable(sig)?;
        let seq = state.seq;
        let counter = if sending {
            state.sent.entry(peer).or_default()
        } else {
            state.received.entry(peer).or_default()
        };
        let tag = *counter;
        *counter = counter.wrapping_add(1);
        body(&state.gloo, tag, self.inner.timeout).map_err(|reason| {
            state.failed = Some(reason.clone());
            self.failure(sig, seq, Vec::new(), reason)
        })
    }

    /// The group's state, unless an earlier failure broke it.
    fn usable(&self, sig: &Signature) -> Result<std::sync::MutexGuard<'_, State>> {
        let state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        match &state.failed {
            Some(failed) => Err(self.failure(
                sig,
                state.seq,
                Vec::new(),
                format!("the group failed earlier: {failed}"),
            )),
            None => Ok(state),
        }
    }

    /// Ranks whose published progress shows they never entered collective
    /// `seq`, or why that cannot be known. Waits until their progress had
    /// time to be published.
    fn missing(&self, seq: u64, entered: Instant) -> std::result::Result<Vec<usize>, String> {
        let settle = progress::INTERVAL * 3;
        if let Some(left) = settle.checked_sub(entered.elapsed()) {
            std::thread::sleep(left);
        }
        let mut missing = Vec::new();
        for r in (0..self.world_size()).filter(|&r| r != self.rank()) {
            let key = format!("{}{}", self.inner.prefix, progress::key(r));
            match self.inner.store.try_get(&key) {
                Ok(Some(v)) if progress::decode(&v) > seq => {}
                Ok(_) => missing.push(r),
                Err(_) => {
                    return Err(
                        "the rendezvous store on rank 0 is unreachable: rank 0 exited or died"
                            .into(),
                    );
                }
            }
        }
        Ok(missing)
    }

    fn failure(&self, sig: &Signature, seq: u64, missing: Vec<usize>, reason: String) -> Error {
        Error::Collective {
            op: sig.op_name().to_string(),
            seq,
            rank: self.rank(),
            world_size: self.world_size(),
            missing,
            reason,
        }
    }

    fn invalid(&self, sig: &Signature, reason: impl Into<OpError>) -> Error {
        let OpError { kind, message } = reason.into();
        Error::InvalidInput {
            kind,
            op: sig.op_name().to_string(),
            inputs: sig.input(),
            device: format!("rank {} of {}", self.rank(), self.world_size()),
            reason: message,
        }
    }

    /// An error unless `dims` splits along `dim` into one block per rank.
    fn check_split(&self, sig: &Signature, dims: &[usize], dim: usize) -> Result<()> {
        check_dim("dim", dim, dims.len())
            .and_then(|()| split(dims, dim, self.world_size()))
            .map(drop)
            .map_err(|reason| self.invalid(sig, reason))
    }

    fn check_peer(&self, sig: &Signature, peer: usize) -> Result<()> {
        if peer >= self.world_size() || peer == self.rank() {
            return Err(self.invalid(
                sig,
                format!(
                    "peer rank {peer} is not another rank of {}",
                    self.world_size()
                ),
            ));
        }
        Ok(())
    }
}

/// `x`'s bytes in host memory.
fn download(x: &Tensor) -> Result<HostBuffer> {
    flush_pending(std::slice::from_ref(x))?;
    match x.device() {
        Device::Cpu => Ok(x.to_host()?.to_buffer()),
        Device::Tpu(_) => HostBuffer::download(&*x.buffer()?),
    }
}

/// `b` as a tensor on `device`.
fn upload(b: HostBuffer, device: Device) -> Result<Tensor> {
    match device {
        Device::Cpu => Tensor::from_host(HostTensor::from_buffer(&b), device),
        Device::Tpu(index) => Ok(Tensor::from_buffer(
            b.upload(Runtime::global()?.client(), index)?,
        )),
    }
}

/// Runs a host collective on `x`'s bytes and puts the result where `x` is.
fn on_host(x: &Tensor, f: impl FnOnce(HostBuffer) -> Result<HostBuffer>) -> Result<Tensor> {
    upload(f(download(x)?)?, x.device())
}
