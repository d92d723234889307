//! How a tensor is laid out over a mesh, and its `mhlo.sharding` text.

use std::fmt;
use tpu_core::op::OpErrorKind;

use super::Mesh;

/// How each dimension of a tensor is split over a [`Mesh`]: along one or
/// more named mesh axes (major to minor), or not at all. Along the mesh
/// axes that no dimension names, the tensor is replicated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardingSpec {
    /// Mesh axes per tensor dimension; `None`: every device holds it all.
    dims: Option<Vec<Vec<String>>>,
}

impl ShardingSpec {
    /// Every device holds the whole tensor (any rank).
    pub fn replicated() -> ShardingSpec {
        ShardingSpec { dims: None }
    }

    /// One entry per tensor dimension: split along that mesh axis, or
    /// `None` to keep the dimension whole.
    pub fn new(dims: &[Option<&str>]) -> ShardingSpec {
        let dims = dims
            .iter()
            .map(|axis| axis.iter().map(|a| a.to_string()).collect())
            .collect();
        ShardingSpec { dims: Some(dims) }
    }

    /// One entry per tensor dimension: split along all these mesh axes
    /// (major to minor; empty keeps the dimension whole).
    pub fn from_axes(dims: &[&[&str]]) -> ShardingSpec {
        let dims = dims
            .iter()
            .map(|axes| axes.iter().map(|a| a.to_string()).collect())
            .collect();
        ShardingSpec { dims: Some(dims) }
    }

    /// The mesh axes of each dimension, or `None` when fully replicated.
    pub fn dims(&self) -> Option<&[Vec<String>]> {
        self.dims.as_deref()
    }

    /// The `mhlo.sharding` text XLA reads for a tensor of `dims` laid out
    /// so on `mesh` (partition ids are positions in [`Mesh::devices`]):
    /// `{replicated}`, `{devices=[2,1]0,1}`, or with
    /// `last_tile_dim_replicate` when some mesh axes hold copies. Errors
    /// name the spec, the shape and the mesh.
    pub fn hlo_sharding(&self, mesh: &Mesh, dims: &[usize]) -> tpu_core::Result<String> {
        self.tiling(mesh, dims)
            .map(|t| t.hlo())
            .map_err(|reason| tpu_core::Error::InvalidInput {
                kind: OpErrorKind::Invalid,
                op: "sharding".into(),
                inputs: format!("{dims:?} as {self}"),
                device: mesh.to_string(),
                reason,
            })
    }

    /// Blocks per dimension of a rank-`rank` tensor, or why the spec does
    /// not fit `mesh`.
    pub(crate) fn tiles(&self, mesh: &Mesh, rank: usize) -> Result<Vec<usize>, String> {
        Ok(self
            .axis_indices(mesh, rank)?
            .iter()
            .map(|axes| axes.iter().map(|&a| mesh.axes()[a].1).product())
            .collect())
    }

    /// Mesh axis indices per dimension, checked against `mesh` and `rank`.
    fn axis_indices(&self, mesh: &Mesh, rank: usize) -> Result<Vec<Vec<usize>>, String> {
        let Some(dims) = &self.dims else {
            return Ok(vec![Vec::new(); rank]);
        };
        if dims.len() != rank {
            return Err(format!(
                "the spec {self} has {} entries, the tensor has rank {rank}",
                dims.len()
            ));
        }
        let mut used: Vec<usize> = Vec::new();
        let mut out = Vec::with_capacity(rank);
        for names in dims {
            let mut axes = Vec::with_capacity(names.len());
            for name in names {
                let a = mesh.axis_index(name).ok_or_else(|| {
                    let known: Vec<&str> = mesh.axes().iter().map(|(n, _)| n.as_str()).collect();
                    format!(
                        "the spec {self} names mesh axis `{name}`, which the mesh lacks (axes: {})",
                        known.join(", ")
                    )
                })?;
                if used.contains(&a) {
                    return Err(format!(
                        "the spec {self} splits along mesh axis `{name}` twice"
                    ));
                }
                used.push(a);
                axes.push(a);
            }
            out.push(axes);
        }
        Ok(out)
    }

    /// The layout of a tensor of `dims` on `mesh`, or why it has none.
    pub(crate) fn tiling(&self, mesh: &Mesh, dims: &[usize]) -> Result<Tiling, String> {
        let axes = self.axis_indices(mesh, dims.len())?;
        let sizes: Vec<usize> = mesh.axes().iter().map(|(_, s)| *s).collect();
        let mut tiles = Vec::with_capacity(dims.len());
        for (d, (size, names)) in dims.iter().zip(&axes).enumerate() {
            let t: usize = names.iter().map(|&a| sizes[a]).product();
            if size % t != 0 {
                let names: Vec<&str> = names.iter().map(|&a| mesh.axes()[a].0.as_str()).collect();
                return Err(format!(
                    "dim {d} of size {size} does not split into {t} equal blocks along mesh axis `{}`",
                    names.join("`, `")
                ));
            }
            tiles.push(t);
        }
        // Tile-assignment order: the axes splitting dim 0, dim 1, ..., then
        // the axes holding copies; each tile's partition in that order.
        let mut perm: Vec<usize> = axes.iter().flatten().copied().collect();
        let replicating: Vec<usize> = (0..sizes.len()).filter(|a| !perm.contains(a)).collect();
        perm.extend(replicating);
        let order = (0..mesh.len())
            .map(|k| {
                let mut coords = vec![0; sizes.len()];
                let mut rest = k;
                for &a in perm.iter().rev() {
                    coords[a] = rest % sizes[a];
                    rest /= sizes[a];
                }
                coords.iter().zip(&sizes).fold(0, |p, (c, s)| p * s + c)
            })
            .collect();
        let blocks = (0..mesh.len())
            .map(|p| {
                let coords = mesh.grid_coords(p);
                axes.iter()
                    .map(|names| names.iter().fold(0, |b, &a| b * sizes[a] + coords[a]))
                    .collect()
            })
            .collect();
        Ok(Tiling {
            copies: mesh.len() / tiles.iter().product::<usize>(),
            tiles,
            order,
            blocks,
        })
    }
}

impl fmt::Display for ShardingSpec {
    /// `replicated`, or per dimension its axes: `[model, _]`,
    /// `[(data, model), _]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(dims) = &self.dims else {
            return f.write_str("replicated");
        };
        let items: Vec<String> = dims
            .iter()
            .map(|axes| match axes.len() {
                0 => "_".to_string(),
                1 => axes[0].clone(),
                _ => format!("({})", axes.join(", ")),
            })
            .collect();
        write!(f, "[{}]", items.join(", "))
    }
}

/// A tensor's layout on a mesh: blocks per dimension, copies of each
/// block, and which block each partition holds.
#[derive(Clone, Debug)]
pub(crate) struct Tiling {
    /// Blocks along each dimension.
    tiles: Vec<usize>,
    /// Partitions holding each block.
    copies: usize,
    /// Partition ids in XLA's tile-assignment order.
    order: Vec<usize>,
    /// Per partition, its block index along each dimension.
    blocks: Vec<Vec<usize>>,
}

impl Tiling {
    /// The shape of one block of a tensor of `dims`.
    pub(crate) fn local_dims(&self, dims: &[usize]) -> Vec<usize> {
        dims.iter().zip(&self.tiles).map(|(d, t)| d / t).collect()
    }

    /// Where partition `p`'s block of a tensor of `dims` starts.
    pub(crate) fn start(&self, p: usize, dims: &[usize]) -> Vec<usize> {
        self.blocks[p]
            .iter()
            .zip(self.local_dims(dims))
            .map(|(b, l)| b * l)
            .collect()
    }

    /// The `mhlo.sharding` text.
    pub(crate) fn hlo(&self) -> String {
        if self.tiles.iter().all(|&t| t == 1) {
            return "{replicated}".into();
        }
        let mut shape: Vec<String> = self.tiles.iter().map(ToString::to_string).collect();
        let ids: Vec<String> = self.order.iter().map(ToString::to_string).collect();
        let suffix = if self.copies > 1 {
            shape.push(self.copies.to_string());
            " last_tile_dim_replicate"
        } else {
            ""
        };
        format!("{{devices=[{}]{}{suffix}}}", shape.join(","), ids.join(","))
    }
}

/// The `{manual}` sharding: each partition's value is its own (shapes are
/// per-partition), which is how buffers enter and leave a program run by
/// [`Mesh::run`].
pub(crate) const MANUAL: &str = "{manual}";

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, usize)]) -> Mesh {
        let n = axes.iter().map(|a| a.1).product();
        Mesh::new(axes, (0..n).collect()).unwrap()
    }

    #[test]
    fn lowers_to_xla_sharding_text() {
        let m = mesh(&[("model", 4)]);
        let col = ShardingSpec::new(&[None, Some("model")]);
        assert_eq!(
            col.hlo_sharding(&m, &[8, 16]).unwrap(),
            "{devices=[1,4]0,1,2,3}"
        );
        let rep = ShardingSpec::replicated();
        assert_eq!(rep.hlo_sharding(&m, &[8, 16]).unwrap(), "{replicated}");
        let m = mesh(&[("data", 2), ("model", 2)]);
        let row = ShardingSpec::new(&[Some("model"), None]);
        assert_eq!(
            row.hlo_sharding(&m, &[4, 4]).unwrap(),
            "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
        );
        let both = ShardingSpec::new(&[Some("model"), Some("data")]);
        assert_eq!(
            both.hlo_sharding(&m, &[4, 4]).unwrap(),
            "{devices=[2,2]0,2,1,3}"
        );
        let flat = ShardingSpec::from_axes(&[&["data", "model"], &[]]);
        assert_eq!(
            flat.hlo_sharding(&m, &[4, 4]).unwrap(),
            "{devices=[4,1]0,1,2,3}"
        );
        let t = row.tiling(&m, &[4, 4]).unwrap();
        // Partition 1 is (data 0, model 1): the second row block.
        assert_eq!(t.start(1, &[4, 4]), vec![2, 0]);
        assert_eq!(format!("{flat}"), "[(data, model), _]");
    }

    #[test]
    fn bad_specs_are_errors() {
        let m = mesh(&[("model", 4)]);
        let e = ShardingSpec::new(&[Some("expert")]).hlo_sharding(&m, &[8]);
        assert!(e.unwrap_err().to_string().contains("`expert`"));
        let e = ShardingSpec::new(&[Some("model")]).hlo_sharding(&m, &[6]);
        assert!(e.unwrap_err().to_string().contains("size 6"));
        let e = ShardingSpec::new(&[Some("model"), Some("model")]).hlo_sharding(&m, &[4, 4]);
        assert!(e.unwrap_err().to_string().contains("twice"));
        let e = ShardingSpec::new(&[None]).hlo_sharding(&m, &[4, 4]);
        assert!(e.unwrap_err().to_string().contains("rank 2"));
    }
}
