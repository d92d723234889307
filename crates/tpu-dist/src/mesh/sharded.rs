//! A tensor split over a mesh: one block per device.

use tpu_core::op::OpErrorKind;
use tpu_core::stablehlo::TensorType;
use tpu_core::{Device, Error, HostBuffer, HostTensor, Result, Runtime, Tensor, TensorValue};

use super::{Mesh, ShardingSpec};
use crate::group::describe;

/// A tensor of a global type laid out over a [`Mesh`] by a
/// [`ShardingSpec`]: shard `p` is partition `p`'s block, on device
/// [`Mesh::devices`]`[p]`. Devices that the spec replicates a block over
/// hold equal copies.
#[derive(Clone, Debug)]
pub struct ShardedTensor {
    mesh: Mesh,
    spec: ShardingSpec,
    ty: TensorType,
    shards: Vec<Tensor>,
}

/// Splits `tensor` (on the host or any device) over `mesh` as `spec` says
/// and places each block on its device. The blocks are cut in host memory:
/// a device tensor is read back once.
pub fn shard(tensor: &Tensor, mesh: &Mesh, spec: &ShardingSpec) -> Result<ShardedTensor> {
    let ty = tensor.ty().clone();
    let dims = ty.shape.dims();
    let invalid = |reason: String| Error::InvalidInput {
        kind: OpErrorKind::Invalid,
        op: "shard".into(),
        inputs: format!("{ty} on {} as {spec}", tensor.device()),
        device: mesh.to_string(),
        reason,
    };
    let tiling = spec.tiling(mesh, dims).map_err(invalid)?;
    let host = match tensor.value() {
        TensorValue::Host(h) => h.to_buffer(),
        _ => HostBuffer::download(&*tensor.elements()?)?.reshaped(ty.shape.clone())?,
    };
    let local = tiling.local_dims(dims);
    let client = Runtime::global()?.client();
    let shards = mesh
        .devices()
        .iter()
        .enumerate()
        .map(|(p, &device)| {
            let start = tiling.start(p, dims);
            let bytes = block(host.bytes(), dims, ty.dtype.size_in_bytes(), &start, &local);
            let buffer = HostBuffer::from_bytes(bytes, ty.dtype, local.clone())?;
            Ok(Tensor::from_buffer(buffer.upload(client, device)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ShardedTensor {
        mesh: mesh.clone(),
        spec: spec.clone(),
        ty,
        shards,
    })
}

/// The row-major bytes of the block of `size` at `start` of a dense tensor
/// of `dims` with `elem`-byte elements (the caller keeps it in bounds).
fn block(bytes: &[u8], dims: &[usize], elem: usize, start: &[usize], size: &[usize]) -> Vec<u8> {
    let rank = dims.len();
    let total: usize = size.iter().product();
    if rank == 0 || total == 0 {
        return if rank == 0 {
            bytes.to_vec()
        } else {
            Vec::new()
        };
    }
    let mut strides = vec![1; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let run = size[rank - 1] * elem;
    let mut out = Vec::with_capacity(total * elem);
    // Index within the block over all but the last dim, odometer style.
    let mut index = vec![0; rank - 1];
    loop {
        let row: usize = (0..rank - 1)
            .map(|d| (start[d] + index[d]) * strides[d])
            .sum();
        let at = (row + start[rank - 1]) * elem;
        out.extend_from_slice(&bytes[at..at + run]);
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < size[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

impl ShardedTensor {
    /// Wraps existing shards (one per mesh device, in partition order, each
    /// on its device, all of one type) as blocks laid out by `spec`; the
    /// global shape follows from the shard shape. Copies that `spec`
    /// replicates must hold equal values (not checked).
    pub fn from_shards(
        mesh: &Mesh,
        spec: &ShardingSpec,
        shards: Vec<Tensor>,
    ) -> Result<ShardedTensor> {
        let invalid = |reason: String| Error::InvalidInput {
            kind: OpErrorKind::Invalid,
            op: "from_shards".into(),
            inputs: describe(&shards),
            device: mesh.to_string(),
            reason,
        };
        if shards.len() != mesh.len() {
            return Err(invalid(format!(
                "takes one shard per mesh device ({}), got {}",
                mesh.len(),
                shards.len()
            )));
        }
        for (p, (s, &device)) in shards.iter().zip(mesh.devices()).enumerate() {
            if s.device() != Device::Tpu(device) {
                return Err(invalid(format!("shard {p} must live on tpu:{device}")));
            }
            if s.ty() != shards[0].ty() {
                return Err(invalid(format!(
                    "every shard needs one type: shard 0 is {}, shard {p} is {}",
                    shards[0].ty(),
                    s.ty()
                )));
            }
        }
        let local = shards[0].ty().clone();
        let tiles = spec.tiles(mesh, local.shape.rank()).map_err(invalid)?;
        let dims: Vec<usize> = local
            .shape
            .dims()
            .iter()
            .zip(&tiles)
            .map(|(l, t)| l * t)
            .collect();
        Ok(ShardedTensor {
            mesh: mesh.clone(),
            spec: spec.clone(),
            ty: TensorType::new(local.dtype, dims),
            shards,
        })
    }

    /// Shards that [`Mesh::run`] produced for a global type `ty`.
    pub(crate) fn from_parts(
        mesh: &Mesh,
        spec: ShardingSpec,
        ty: TensorType,
        shards: Vec<Tensor>,
    ) -> ShardedTensor {
        ShardedTensor {
            mesh: mesh.clone(),
            spec,
            ty,
            shards,
        }
    }

    /// The mesh it is laid out over.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// How it is laid out.
    pub fn spec(&self) -> &ShardingSpec {
        &self.spec
    }

    /// The global (unsplit) type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The shards in partition order.
    pub fn shards(&self) -> &[Tensor] {
        &self.shards
    }

    /// The shards in partition order, by value.
    pub fn into_shards(self) -> Vec<Tensor> {
        self.shards
    }

    /// The same tensor laid out by `spec`, moved between devices by the
    /// collectives XLA picks (all-gather, all-to-all, slicing).
    pub fn reshard(&self, spec: &ShardingSpec) -> Result<ShardedTensor> {
        if &self.spec == spec {
            return Ok(self.clone());
        }
        let mut outputs =
            self.mesh
                .run("reshard", &[self], std::slice::from_ref(spec), |_, xs| {
                    Ok(xs.to_vec())
                })?;
        outputs
            .pop()
            .ok_or_else(|| Error::Signature("`reshard` returned nothing".into()))
    }

    /// The whole tensor on `device`: gathered over the mesh on the devices,
    /// then copied to `device` if it is not a mesh device (`cpu` included).
    pub fn gather(&self, device: Device) -> Result<Tensor> {
        let full = self.reshard(&ShardingSpec::replicated())?;
        let partition = match device {
            Device::Tpu(d) => self.mesh.partition_of(d),
            Device::Cpu => None,
        };
        let copy = &full.shards[partition.unwrap_or(0)];
        match (device, partition) {
            (_, Some(_)) => Ok(copy.clone()),
            (Device::Tpu(d), None) => Ok(Tensor::from_buffer(copy.buffer()?.copy_to_device(d)?)),
            (Device::Cpu, None) => Tensor::from_host(copy.to_host()?, Device::Cpu),
        }
    }

    /// The whole tensor in host memory.
    pub fn to_host(&self) -> Result<HostTensor> {
        self.gather(Device::Cpu)?.to_host()
    }
}

#[cfg(test)]
mod tests {
    use super::block;

    #[test]
    fn blocks_are_cut_row_major() {
        // A 3x4 tensor of one-byte elements 0..12.
        let bytes: Vec<u8> = (0..12).collect();
        assert_eq!(
            block(&bytes, &[3, 4], 1, &[1, 2], &[2, 2]),
            vec![6, 7, 10, 11]
        );
        assert_eq!(block(&bytes, &[3, 4], 1, &[0, 0], &[3, 4]), bytes);
        assert_eq!(block(&bytes, &[12], 1, &[4], &[4]), vec![4, 5, 6, 7]);
        assert_eq!(block(&bytes[..2], &[], 2, &[], &[]), vec![0, 1]);
        assert!(block(&bytes, &[3, 4], 1, &[0, 0], &[0, 4]).is_empty());
        // Two-byte elements keep their bytes together.
        assert_eq!(
            block(&bytes, &[2, 3], 2, &[1, 1], &[1, 2]),
            vec![8, 9, 10, 11]
        );
    }
}
