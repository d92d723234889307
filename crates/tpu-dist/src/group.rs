//! A group of a client's devices and the collectives over it.

use std::sync::Arc;
use tpu_core::op::OpError;

use tpu_core::stablehlo::TensorType;
use tpu_core::{Device, Error, Result, Runtime, Tensor};

use crate::ReduceOp;
use crate::collective::{Collective, run};

/// Distinct devices of the runtime's client, in rank order: rank `r` is
/// device [`DeviceGroup::device`]`(r)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceGroup {
    devices: Arc<[usize]>,
}

impl DeviceGroup {
    /// Every device of the client (`tpu:0` .. `tpu:N-1`).
    pub fn all() -> Result<DeviceGroup> {
        let count = Runtime::global()?.client().device_count();
        DeviceGroup::new((0..count).collect())
    }

    /// The devices with these indices, in this order.
    pub fn new(devices: Vec<usize>) -> Result<DeviceGroup> {
        let runtime = Runtime::global()?;
        let count = runtime.client().device_count();
        let invalid = |reason: String| Error::InvalidOption {
            option: "device group",
            reason,
        };
        if devices.is_empty() {
            return Err(invalid("a group needs at least one device".into()));
        }
        if let Some(&d) = devices.iter().find(|&&d| d >= count) {
            return Err(Error::DeviceOutOfRange {
                index: d,
                count,
                platform: runtime.client().platform_name().to_string(),
            });
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(invalid(format!("tpu:{d} appears twice in {devices:?}")));
            }
        }
        Ok(DeviceGroup {
            devices: devices.into(),
        })
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false: a group has at least one member.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device of rank `rank`.
    pub fn device(&self, rank: usize) -> Device {
        Device::Tpu(self.devices[rank])
    }

    /// Device indices in rank order.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Every member gets the elementwise `op` of all members' tensors.
    pub fn all_reduce(&self, xs: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        run(self, Collective::AllReduce(op), xs)
    }

    /// Every member gets all members' tensors concatenated along `dim`, in
    /// rank order.
    pub fn all_gather(&self, xs: &[Tensor], dim: usize) -> Result<Vec<Tensor>> {
        run(self, Collective::AllGather { dim }, xs)
    }

    /// The elementwise `op` of all members' tensors, split along `dim`
    /// into one equal block per member: rank `r` gets block `r`.
    pub fn reduce_scatter(&self, xs: &[Tensor], op: ReduceOp, dim: usize) -> Result<Vec<Tensor>> {
        run(self, Collective::ReduceScatter { op, dim }, xs)
    }

    /// Every member gets rank `root`'s tensor.
    pub fn broadcast(&self, xs: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        run(self, Collective::Broadcast { root }, xs)
    }

    /// Each member splits its tensor along `split_dim` into one block per
    /// member and sends block `r` to rank `r`, which concatenates what it
    /// receives along `concat_dim` in rank order (expert-parallel dispatch).
    pub fn all_to_all(
        &self,
        xs: &[Tensor],
        split_dim: usize,
        concat_dim: usize,
    ) -> Result<Vec<Tensor>> {
        run(
            self,
            Collective::AllToAll {
                split_dim,
                concat_dim,
            },
            xs,
        )
    }

    /// Point to point: for each `(source, target)` pair of ranks, `target`
    /// gets `source`'s tensor; a rank no pair targets gets zeros. Each rank
    /// sends and receives at most once.
    pub fn permute(&self, xs: &[Tensor], pairs: &[(usize, usize)]) -> Result<Vec<Tensor>> {
        run(
            self,
            Collective::Permute {
                pairs: pairs.to_vec(),
            },
            xs,
        )
    }

    /// Returns once every member has reached it and all work issued before
    /// it on the members' devices is done.
    pub fn barrier(&self) -> Result<()> {
        let tokens = (0..self.len())
            .map(|r| tpu_core::scalars::scalar(tpu_core::DType::I32, 1.0, self.device(r)))
            .collect::<Result<Vec<_>>>()?;
        for t in self.all_reduce(&tokens, ReduceOp::Sum)? {
            t.buffer()?.block_until_ready()?;
        }
        Ok(())
    }

    /// The type every member's input must have, or an error naming `op`.
    pub(crate) fn common_type(&self, op: &str, xs: &[Tensor]) -> Result<TensorType> {
        let invalid = |reason: String| self.invalid(op, xs, reason);
        if xs.len() != self.len() {
            return Err(invalid(format!(
                "takes one tensor per member ({}), got {}",
                self.len(),
                xs.len()
            )));
        }
        for (r, x) in xs.iter().enumerate() {
            if x.device() != self.device(r) {
                return Err(invalid(format!(
                    "rank {r}'s tensor must live on {}, not {}",
                    self.device(r),
                    x.device()
                )));
            }
            if x.ty() != xs[0].ty() {
                return Err(invalid(format!(
                    "every member needs the same dtype and shape: rank 0 has {}, rank {r} has {}",
                    xs[0].ty(),
                    x.ty()
                )));
            }
        }
        Ok(xs[0].ty().clone())
    }

    /// The error of collective `op` on `xs` over this group.
    pub(crate) fn invalid(&self, op: &str, xs: &[Tensor], reason: impl Into<OpError>) -> Error {
        let OpError { kind, message } = reason.into();
        Error::InvalidInput {
            kind,
            op: op.to_string(),
            inputs: describe(xs),
            device: self.name(),
            reason: message,
        }
    }

    /// The group as errors name it: `tpu:{0, 1}`.
    fn name(&self) -> String {
        let list: Vec<String> = self.devices.iter().map(ToString::to_string).collect();
        format!("tpu:{{{}}}", list.join(", "))
    }
}

/// Tensors as errors name them: `f32[2, 3] on tpu:0, f32[2, 3] on tpu:1`.
pub(crate) fn describe(xs: &[Tensor]) -> String {
    xs.iter()
        .map(|x| format!("{} on {}", x.ty(), x.device()))
        .collect::<Vec<_>>()
        .join(", ")
}
