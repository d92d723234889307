//! Data-parallel training over the devices of one client, or of every
//! process of a job.
//!
//! [`DataParallel`] keeps one replica of a model per device of a
//! [`DeviceGroup`] (or of a [`World`]: the same local devices in every
//! process torchrun or `tpu-rs launch` started), all starting from rank
//! 0's parameter values. Each step
//! splits a global batch by rows into one equal shard per replica, runs
//! forward and backward on every replica, and replaces every replica's
//! gradients by their mean over the replicas (flattened into buckets, one
//! `all_reduce` per bucket, as PyTorch's DDP does). One optimizer per
//! replica then applies the same update everywhere, so the replicas stay
//! identical and train as one model on the whole batch would.
//!
//! ```no_run
//! use tpu_rs::dist::{DataParallel, DeviceGroup};
//! use tpu_rs::models::{Gpt, GptConfig};
//! use tpu_rs::nn::ParamStore;
//! use tpu_rs::optim::AdamW;
//! use tpu_rs::prelude::*;
//!
//! let config = GptConfig { vocab_size: 256, block_size: 64, n_layer: 2, n_head: 4, n_embd: 64 };
//! let dp = DataParallel::new(DeviceGroup::new(vec![0, 1])?, |device| {
//!     let store = ParamStore::new(device, DType::F32, 1337);
//!     Ok((Gpt::new(&store, config)?, store))
//! })?;
//! let mut optimizers = dp.optimizers(|params| AdamW::new(params, 3e-3, 0.01));
//! let x = Tensor::zeros([8, 64], DType::I64, Device::Tpu(0))?;
//! let y = Tensor::zeros([8, 64], DType::I64, Device::Tpu(0))?;
//! // Rows 0..4 train on tpu:0, rows 4..8 on tpu:1.
//! let loss = dp.step(&x, &y, |model, x, y| model.loss(x, y), &mut optimizers)?;
//! println!("loss {:.3}", loss.item()?);
//! # Ok::<(), tpu_rs::Error>(())
//! ```
//!
//! The rest of tpu-dist is re-exported here: the collectives of a
//! [`DeviceGroup`], a [`ProcessGroup`] and a [`World`] across processes,
//! and a [`Mesh`] for tensor parallelism. They take core tensors: pass
//! [`Tensor::value`] and wrap the results with [`Tensor::from_core`].

use std::ops::Range;

use tpu_core::stablehlo::TensorType;
pub use tpu_dist::{
    DeviceGroup, JobOptions, Mesh, ProcessGroup, ReduceOp, ShardedTensor, ShardingSpec, Store,
    World, shard,
};

use crate::Device;
use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::nn::{ParamStore, Parameter};
use crate::optim::Optimizer;
use crate::tensor::Tensor;

/// Tensors of every rank: `[rank][i]` is rank's tensor `i`, on its device.
type PerRank = Vec<Vec<Tensor>>;

/// PyTorch DDP's default gradient bucket size: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// One model and its parameters on one device of a [`DataParallel`] group.
pub struct Replica<M> {
    model: M,
    store: ParamStore,
    params: Vec<Parameter>,
}

impl<M> Replica<M> {
    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The parameter store the model's layers live in.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// The device this replica runs on.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// The parameters, sorted by name (as [`ParamStore::parameters`]).
    pub fn parameters(&self) -> &[Parameter] {
        &self.params
    }
}

/// One replica of a model per device of a group, trained as one model on
/// the whole batch.
pub struct DataParallel<M> {
    world: World,
    replicas: Vec<Replica<M>>,
    bucket_bytes: usize,
    /// Each process passes its own batch rather than the global one.
    process_batches: bool,
}

impl<M> DataParallel<M> {
    /// Builds one replica per local device of `world` (a [`DeviceGroup`],
    /// or a [`World`] spanning the processes of a job) with
    /// `build(device)`, which returns the model and the store its
    /// parameters live in (on `device`), then copies global rank 0's
    /// parameter values to every replica of every process.
    ///
    /// Fails with [`Error::Replicas`] when a replica's parameters live on
    /// another device than its rank's, or differ from rank 0's in names,
    /// dtypes or shapes.
    pub fn new(
        world: impl Into<World>,
        mut build: impl FnMut(Device) -> Result<(M, ParamStore)>,
    ) -> Result<DataParallel<M>> {
        let world = world.into();
        let group = world.local();
        let mut replicas = Vec::with_capacity(group.len());
        for rank in 0..group.len() {
            let (model, store) = build(group.device(rank))?;
            replicas.push(Replica {
                params: store.parameters(),
                model,
                store,
            });
        }
        let dp = DataParallel {
            world,
            replicas,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            process_batches: false,
        };
        dp.check_replicas()?;
        dp.sync_parameters()?;
        Ok(dp)
    }

    /// Reduces gradients in buckets of at most `bytes` (a larger gradient
    /// travels alone; 0 sends every gradient alone).
    pub fn with_bucket_bytes(mut self, bytes: usize) -> DataParallel<M> {
        self.bucket_bytes = bytes;
        self
    }

    /// The bucket size of the gradient reduction, in bytes.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes
    }

    /// The devices, in rank order.
    pub fn group(&self) -> &DeviceGroup {
        self.world.local()
    }

    /// The devices of every process this trains over.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// Number of replicas in this process (one per local device).
    pub fn num_replicas(&self) -> usize {
        self.replicas.len()
    }

    /// The replicas, in rank order.
    pub fn replicas(&self) -> &[Replica<M>] {
        &self.replicas
    }

    /// Rank 0's model (every replica holds the same values), e.g. for
    /// evaluation or sampling.
    pub fn model(&self) -> &M {
        &self.replicas[0].model
    }

    /// Rank 0's parameter store, e.g. for saving a checkpoint.
    pub fn store(&self) -> &ParamStore {
        &self.replicas[0].store
    }

    /// Training or evaluation mode on every replica.
    pub fn set_training(&self, training: bool) {
        for r in &self.replicas {
            r.store.set_training(training);
        }
    }

    /// One optimizer per replica over that replica's parameters, in rank
    /// order: the `optimizers` argument of [`DataParallel::step`].
    pub fn optimizers<O>(&self, mut make: impl FnMut(Vec<Parameter>) -> O) -> Vec<O> {
        self.replicas
            .iter()
            .map(|r| make(r.params.clone()))
            .collect()
    }

    /// Copies rank 0's parameter values to every other replica (done by
    /// [`DataParallel::new`]; call it again after loading a checkpoint into
    /// rank 0's store).
    pub fn sync_parameters(&self) -> Result<()> {
        if self.world.size() == 1 || self.replicas[0].params.is_empty() {
            return Ok(());
        }
        no_grad(|| {
            let values = self
                .replicas
                .iter()
                .map(|r| r.params.iter().map(Parameter::get).collect())
                .collect();
            let synced = self.in_buckets(values, broadcast_from_rank0)?;
            // Global rank 0 keeps its values; every other replica, here and
            // in the other processes, takes them.
            let source = usize::from(self.world.first_rank() == 0);
            for (replica, values) in self.replicas.iter().zip(synced).skip(source) {
                for (p, v) in replica.params.iter().zip(values) {
                    p.set(&v);
                }
            }
            symmetric_cut()
        })
    }

    /// Each process passes its own batch (as a distributed sampler gives
    /// it; the same size in every process), split over its local devices,
    /// instead of the global batch. The gradients and the loss are still
    /// means over every process's rows.
    pub fn with_process_batches(mut self) -> DataParallel<M> {
        self.process_batches = true;
        self
    }

    /// This process's shards of a batch, one per local device. By default
    /// every process passes the same global batch and global rank `g` gets
    /// rows `g * k .. (g + 1) * k` with `k = rows / world size`; with
    /// [`DataParallel::with_process_batches`] the batch is this process's
    /// own and local device `d` gets rows `d * k ..` with
    /// `k = rows / local devices`.
    ///
    /// Fails with [`Error::UnevenBatch`] when the rows do not divide.
    pub fn scatter(&self, batch: &Tensor) -> Result<Vec<Tensor>> {
        let (n, first) = if self.process_batches {
            (self.world.local().len(), 0)
        } else {
            (self.world.size(), self.world.first_rank())
        };
        let Some(&rows) = batch.dims().first() else {
            return Err(Error::shape(
                "DataParallel",
                format!(
                    "a batch needs rows (a leading dimension) to split, got shape {}",
                    batch.shape()
                ),
            ));
        };
        if rows % n != 0 {
            return Err(Error::UnevenBatch {
                shape: batch.shape().to_string(),
                rows,
                replicas: n,
            });
        }
        let group = self.world.local();
        if n == 1 {
            return Ok(vec![batch.to_device(group.device(0))?]);
        }
        let k = rows / n;
        (0..group.len())
            .map(|r| {
                let shard = batch
                    .narrow(0, ((first + r) * k) as i64, k as i64)?
                    .to_device(group.device(r))?;
                // Every shard a device value (rank 0's would otherwise stay
                // a deferred slice), so every replica records the same graph.
                shard.value().buffer()?;
                Ok(shard)
            })
            .collect()
    }

    /// Splits `inputs` and `targets` by rows into one shard per replica,
    /// runs `loss(model, inputs, targets)` and backward on every replica,
    /// then averages the gradients over the replicas
    /// ([`DataParallel::all_reduce_gradients`]). Returns the mean of the
    /// replicas' losses (detached, on rank 0's device).
    ///
    /// With a loss that is a mean over rows (as [`crate::nn::mse`],
    /// [`crate::nn::cross_entropy`] and [`crate::models::Gpt::loss`] are),
    /// the gradients and the loss are those of one model on the whole batch.
    pub fn forward_backward(
        &self,
        inputs: &Tensor,
        targets: &Tensor,
        mut loss: impl FnMut(&M, &Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let xs = self.scatter(inputs)?;
        let ys = self.scatter(targets)?;
        let mut losses = Vec::with_capacity(self.replicas.len());
        for ((replica, x), y) in self.replicas.iter().zip(&xs).zip(&ys) {
            let l = loss(&replica.model, x, y)?;
            l.backward()?;
            losses.push(l.detach());
        }
        self.all_reduce_gradients()?;
        if self.world.size() == 1 {
            return Ok(losses.remove(0));
        }
        let mut mean = all_reduce_mean(&self.world, losses.into_iter().map(|l| vec![l]).collect())?;
        Ok(mean.swap_remove(0).swap_remove(0))
    }

    /// [`DataParallel::forward_backward`], then `step()` and `zero_grad()`
    /// on each replica's optimizer (`optimizers[r]` must own replica `r`'s
    /// parameters, as [`DataParallel::optimizers`] builds them). Returns the
    /// mean loss.
    pub fn step<O: Optimizer>(
        &self,
        inputs: &Tensor,
        targets: &Tensor,
        loss: impl FnMut(&M, &Tensor, &Tensor) -> Result<Tensor>,
        optimizers: &mut [O],
    ) -> Result<Tensor> {
        if optimizers.len() != self.replicas.len() {
            return Err(self.mismatch(format!(
                "takes one optimizer per replica ({}), got {}",
                self.replicas.len(),
                optimizers.len()
            )));
        }
        let l = self.forward_backward(inputs, targets, loss)?;
        for o in optimizers.iter_mut() {
            o.step()?;
            o.zero_grad();
        }
        Ok(l)
    }

    /// Replaces every replica's gradients by their mean over the replicas,
    /// in buckets of [`DataParallel::bucket_bytes`]. A parameter with a
    /// gradient on some replicas only counts zeros for the others; one with
    /// none anywhere is left alone.
    pub fn all_reduce_gradients(&self) -> Result<()> {
        if self.world.size() == 1 {
            // The mean over one replica is its own gradient.
            return Ok(());
        }
        no_grad(|| {
            let grads: Vec<Vec<Option<Tensor>>> = self
                .replicas
                .iter()
                .map(|r| r.params.iter().map(|p| p.get().grad()).collect())
                .collect();
            let used: Vec<usize> = (0..self.replicas[0].params.len())
                .filter(|&i| grads.iter().any(|g| g[i].is_some()))
                .collect();
            if used.is_empty() {
                return Ok(());
            }
            let per_rank = self
                .replicas
                .iter()
                .zip(grads)
                .map(|(replica, mut grads)| {
                    used.iter()
                        .map(|&i| match grads[i].take() {
                            Some(g) => Ok(g),
                            None => replica.params[i].get().zeros_like(),
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            let reduced = self.in_buckets(per_rank, all_reduce_mean)?;
            for (replica, grads) in self.replicas.iter().zip(reduced) {
                for (&i, g) in used.iter().zip(grads) {
                    replica.params[i].get().set_grad(g);
                }
            }
            symmetric_cut()
        })
    }

    /// Runs `collective` on `per_rank` (rank `r`'s tensors, the same types
    /// on every rank) flattened into buckets, and splits the results back.
    fn in_buckets(
        &self,
        per_rank: PerRank,
        collective: fn(&World, PerRank) -> Result<PerRank>,
    ) -> Result<PerRank> {
        let tys: Vec<TensorType> = per_rank[0].iter().map(|t| t.ty().clone()).collect();
        let ranges = buckets(&tys, self.bucket_bytes);
        let flat = per_rank
            .iter()
            .map(|ts| ranges.iter().map(|r| flatten(&ts[r.clone()])).collect())
            .collect::<Result<PerRank>>()?;
        collective(&self.world, flat)?
            .into_iter()
            .map(|flat| {
                let mut out = Vec::with_capacity(tys.len());
                for (bucket, r) in flat.iter().zip(&ranges) {
                    out.extend(unflatten(bucket, &tys[r.clone()])?);
                }
                Ok(out)
            })
            .collect()
    }

    /// Every replica must live on its rank's device and hold rank 0's
    /// parameter names, dtypes and shapes.
    fn check_replicas(&self) -> Result<()> {
        let first = &self.replicas[0].params;
        for (rank, replica) in self.replicas.iter().enumerate() {
            let device = self.world.local().device(rank);
            if replica.store.device() != device {
                return Err(self.mismatch(format!(
                    "rank {rank}'s parameter store lives on {}, not on {device}",
                    replica.store.device()
                )));
            }
            for p in &replica.params {
                let value = p.get();
                if value.device() != device {
                    return Err(self.mismatch(format!(
                        "rank {rank}'s parameter `{}` lives on {}, not on {device}",
                        p.name(),
                        value.device()
                    )));
                }
            }
            if let Some(name) = missing(first, &replica.params) {
                return Err(self.mismatch(format!("rank {rank} lacks rank 0's parameter `{name}`")));
            }
            if let Some(name) = missing(&replica.params, first) {
                return Err(self.mismatch(format!(
                    "rank {rank} has a parameter `{name}` that rank 0 lacks"
                )));
            }
            for (p, q) in replica.params.iter().zip(first) {
                let (a, b) = (p.get(), q.get());
                if a.ty() != b.ty() {
                    return Err(self.mismatch(format!(
                        "parameter `{}` is {} on rank {rank} but {} on rank 0",
                        p.name(),
                        a.ty(),
                        b.ty()
                    )));
                }
            }
        }
        Ok(())
    }

    fn mismatch(&self, reason: String) -> Error {
        let list: Vec<String> = self
            .world
            .local()
            .devices()
            .iter()
            .map(ToString::to_string)
            .collect();
        Error::Replicas {
            group: format!("tpu:{{{}}}", list.join(", ")),
            reason,
        }
    }
}

/// Runs what is deferred on every device. Called after splitting buckets
/// back, so each replica's next graph starts from device values: otherwise
/// the first replica's next cut (its optimizer step) would flush the other
/// replicas' pending splits apart from their own step, and the replicas'
/// fused programs, hence their rounding, would differ.
fn symmetric_cut() -> Result<()> {
    Ok(crate::sync()?)
}

/// A name in `a` that `b` lacks.
fn missing<'a>(a: &'a [Parameter], b: &[Parameter]) -> Option<&'a str> {
    a.iter()
        .map(Parameter::name)
        .find(|name| !b.iter().any(|q| q.name() == *name))
}

/// The mean over the group of each bucket: `buckets[rank][i]` is rank's
/// bucket `i` (on its device); the result has the same layout, every rank
/// holding the same means. Every cross-replica reduction of a step goes
/// through here, so a cross-process leg belongs here alone (together with
/// dropping the shortcuts that skip this for a single local replica).
fn all_reduce_mean(world: &World, buckets: PerRank) -> Result<PerRank> {
    per_bucket(world, buckets, |xs| world.all_reduce(xs, ReduceOp::Mean))
}

/// Rank 0's buckets on every rank (same layout as [`all_reduce_mean`]).
fn broadcast_from_rank0(world: &World, buckets: PerRank) -> Result<PerRank> {
    per_bucket(world, buckets, |xs| world.broadcast(xs, 0))
}

/// Runs `collective` once per bucket over all ranks' copies of it.
fn per_bucket(
    world: &World,
    buckets: PerRank,
    collective: impl Fn(&[tpu_core::Tensor]) -> tpu_core::Result<Vec<tpu_core::Tensor>>,
) -> Result<PerRank> {
    let count = buckets.first().map_or(0, Vec::len);
    let mut out: PerRank = vec![Vec::with_capacity(count); world.local().len()];
    for i in 0..count {
        let xs: Vec<tpu_core::Tensor> = buckets.iter().map(|b| b[i].value().clone()).collect();
        for (rank, y) in collective(&xs)?.into_iter().enumerate() {
            out[rank].push(Tensor::from_core(y));
        }
    }
    Ok(out)
}

/// Consecutive runs of `tys` of one dtype, each at most `bytes` (a tensor
/// larger than that alone).
fn buckets(tys: &[TensorType], bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, ty) in tys.iter().enumerate() {
        let len = ty.shape.numel() * ty.dtype.size_in_bytes();
        if i > start && (ty.dtype != tys[start].dtype || size + len > bytes) {
            out.push(start..i);
            (start, size) = (i, 0);
        }
        size += len;
    }
    if start < tys.len() {
        out.push(start..tys.len());
    }
    out
}

/// The tensors' elements, one after another, as one vector.
fn flatten(ts: &[Tensor]) -> Result<Tensor> {
    let flat = ts
        .iter()
        .map(|t| t.reshape([-1]))
        .collect::<Result<Vec<_>>>()?;
    match flat.as_slice() {
        [one] => Ok(one.clone()),
        many => Tensor::cat(&many.iter().collect::<Vec<_>>(), 0),
    }
}

/// [`flatten`] undone: `flat` split and reshaped into `tys`.
fn unflatten(flat: &Tensor, tys: &[TensorType]) -> Result<Vec<Tensor>> {
    let dims =
        |ty: &TensorType| -> Vec<i64> { ty.shape.dims().iter().map(|&d| d as i64).collect() };
    if let [ty] = tys {
        return Ok(vec![flat.reshape(dims(ty))?]);
    }
    let sizes: Vec<i64> = tys.iter().map(|ty| ty.shape.numel() as i64).collect();
    flat.split(0, &sizes)?
        .iter()
        .zip(tys)
        .map(|(piece, ty)| piece.reshape(dims(ty)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }

    #[test]
    fn buckets_split_by_size_and_dtype() {
        let tys = [
            f32s(&[4]),
            f32s(&[4]),
            f32s(&[16]),
            TensorType::new(DType::BF16, vec![2]),
            f32s(&[1]),
        ];
        assert_eq!(buckets(&tys, 32), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(buckets(&tys, 1 << 20), vec![0..3, 3..4, 4..5]);
        assert_eq!(buckets(&tys, 0), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        assert!(buckets(&[], 8).is_empty());
    }
}
