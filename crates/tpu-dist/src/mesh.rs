//! Tensor parallelism: devices in a grid with named axes ([`Mesh`]),
//! tensors split over it ([`ShardedTensor`], by a [`ShardingSpec`]), and
//! programs written for global shapes that XLA partitions over it
//! ([`Mesh::run`]), inserting the collectives the shardings need.

mod sharded;
mod spec;
mod spmd;

use std::fmt;
use std::sync::Arc;

use tpu_core::{Error, Result, Runtime};

use crate::DeviceGroup;

pub use sharded::{ShardedTensor, shard};
pub use spec::ShardingSpec;

/// Distinct devices of the runtime's client arranged in an n-d grid whose
/// axes have names (`("data", 2), ("model", 2)`). Devices are listed in
/// row-major grid order, the last axis fastest; a device's position in that
/// list is its partition id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Arc<[(String, usize)]>,
    group: DeviceGroup,
}

impl Mesh {
    /// A mesh with `axes` (name and size, major to minor) over `devices`
    /// (device indices in row-major grid order). The axis sizes must
    /// multiply to the number of devices; names must be distinct and
    /// non-empty; devices must exist and be distinct.
    pub fn new(axes: &[(&str, usize)], devices: Vec<usize>) -> Result<Mesh> {
        let shape = axes
            .iter()
            .map(|(name, size)| format!("{name}={size}"))
            .collect::<Vec<_>>()
            .join(", ");
        let list = devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let invalid = |reason: String| Error::InvalidOption {
            option: "mesh",
            reason: format!("mesh({shape}) on tpu:{{{list}}}: {reason}"),
        };
        for (i, &(name, size)) in axes.iter().enumerate() {
            if name.is_empty() {
                return Err(invalid(format!("axis {i} has an empty name")));
            }
            if axes[..i].iter().any(|&(other, _)| other == name) {
                return Err(invalid(format!("axis name `{name}` appears twice")));
            }
            if size == 0 {
                return Err(invalid(format!("axis `{name}` has size 0")));
            }
        }
        let cells = axes
            .iter()
            .try_fold(1usize, |n, &(_, size)| n.checked_mul(size));
        if cells != Some(devices.len()) {
            let cells = cells.map_or_else(|| "too many".to_string(), |c| c.to_string());
            return Err(invalid(format!(
                "the axis sizes multiply to {cells} device(s), but {} are given",
                devices.len()
            )));
        }
        let runtime = Runtime::global()?;
        let count = runtime.client().device_count();
        if let Some(&d) = devices.iter().find(|&&d| d >= count) {
            return Err(Error::DeviceOutOfRange {
                index: d,
                count,
                platform: runtime.client().platform_name().to_string(),
            });
        }
        if let Some((i, d)) = devices
            .iter()
            .enumerate()
            .find(|(i, d)| devices[..*i].contains(d))
        {
            return Err(invalid(format!("tpu:{d} appears twice (position {i})")));
        }
        Ok(Mesh {
            axes: axes.iter().map(|&(n, s)| (n.to_string(), s)).collect(),
            group: DeviceGroup::new(devices)?,
        })
    }

    /// A mesh with `axes` over every device of the client (`tpu:0` ..
    /// `tpu:N-1` in order); the axis sizes must multiply to N.
    pub fn all(axes: &[(&str, usize)]) -> Result<Mesh> {
        let count = Runtime::global()?.client().device_count();
        Mesh::new(axes, (0..count).collect())
    }

    /// The axes, major to minor: name and size.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// The size of axis `name`, if the mesh has one.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axis_index(name).map(|a| self.axes[a].1)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.group.len()
    }

    /// Always false: a mesh has at least one device.
    pub fn is_empty(&self) -> bool {
        self.group.is_empty()
    }

    /// Device indices in row-major grid order (partition order).
    pub fn devices(&self) -> &[usize] {
        self.group.devices()
    }

    /// The mesh's devices as a group in partition order, for explicit
    /// collectives on the shards of a [`ShardedTensor`].
    pub fn group(&self) -> &DeviceGroup {
        &self.group
    }

    /// The grid coordinates of `partition` (a position in
    /// [`Mesh::devices`]), one per axis; `None` past the last partition.
    pub fn coords(&self, partition: usize) -> Option<Vec<usize>> {
        (partition < self.len()).then(|| self.grid_coords(partition))
    }

    /// The grid coordinates of `partition`, which is below `len()`.
    pub(crate) fn grid_coords(&self, partition: usize) -> Vec<usize> {
        let mut rest = partition;
        let mut coords = vec![0; self.axes.len()];
        for (c, (_, size)) in coords.iter_mut().zip(self.axes.iter()).rev() {
            *c = rest % size;
            rest /= size;
        }
        coords
    }

    /// The position of an axis by name.
    pub(crate) fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|(n, _)| n == name)
    }

    /// The partition running on device `device`, if it is in the mesh.
    pub(crate) fn partition_of(&self, device: usize) -> Option<usize> {
        self.devices().iter().position(|&d| d == device)
    }
}

impl fmt::Display for Mesh {
    /// `mesh(data=2, model=2) on tpu:{0, 1, 2, 3}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
        let devices: Vec<String> = self.devices().iter().map(ToString::to_string).collect();
        write!(
            f,
            "mesh({}) on tpu:{{{}}}",
            axes.join(", "),
            devices.join(", ")
        )
    }
}
