//! Shape rules: broadcasting and dimension arguments.

use tpu_core::Shape;
use tpu_core::invalid;
use tpu_core::op::OpResult;
use tpu_core::out_of_range;

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> OpResult<Shape> {
    let rank = a.rank().max(b.rank());
    let dim = |s: &Shape, i: usize| {
        let offset = rank - s.rank();
        if i < offset { 1 } else { s.dims()[i - offset] }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(invalid!("shapes {a} and {b} cannot be broadcast together")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Shape::new)
}

/// Broadcasts any number of shapes.
pub fn broadcast_all<'a>(shapes: impl IntoIterator<Item = &'a Shape>) -> OpResult<Shape> {
    shapes
        .into_iter()
        .try_fold(Shape::scalar(), |acc, s| broadcast_shapes(&acc, s))
}

/// A possibly negative dimension index, checked against `rank`.
pub fn normalize_dim(dim: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if (0..r).contains(&d) {
        Ok(d as usize)
    } else {
        Err(out_of_range!(
            "dimension {dim} is out of range for rank {rank}"
        ))
    }
}

/// Like [`normalize_dim`], but a rank-0 tensor accepts dims 0 and -1 (as in
/// PyTorch).
pub fn normalize_dim_scalar_ok(dim: i64, rank: usize) -> OpResult<usize> {
    normalize_dim(dim, rank.max(1))
}

/// Normalizes a list of dims; sorted, no duplicates. `None` means all dims.
pub fn normalize_dims(dims: Option<&[i64]>, rank: usize) -> OpResult<Vec<usize>> {
    let mut out = match dims {
        None => (0..rank).collect::<Vec<_>>(),
        Some(ds) => ds
            .iter()
            .map(|&d| normalize_dim_scalar_ok(d, rank))
            .collect::<Result<Vec<_>, _>>()?,
    };
    out.retain(|&d| d < rank.max(1));
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid!("dimension list {dims:?} repeats a dimension"));
    }
    if rank == 0 {
        out.clear();
    }
    Ok(out)
}

/// The shape after reducing `dims`, keeping them as 1 when `keepdim`.
pub fn reduced_shape(shape: &Shape, dims: &[usize], keepdim: bool) -> Shape {
    let out: Vec<usize> = (0..shape.rank())
        .filter_map(|d| match (dims.contains(&d), keepdim) {
            (false, _) => Some(shape.dims()[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Shape::new(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        let s = |d: &[usize]| Shape::from(d);
        assert_eq!(
            broadcast_shapes(&s(&[2, 1, 3]), &s(&[4, 1])).unwrap(),
            s(&[2, 4, 3])
        );
        assert_eq!(broadcast_shapes(&s(&[]), &s(&[0, 2])).unwrap(), s(&[0, 2]));
        assert!(
            broadcast_shapes(&s(&[2, 3]), &s(&[4]))
                .unwrap_err()
                .message
                .contains("[2, 3]")
        );
    }

    #[test]
    fn dims() {
        assert_eq!(normalize_dim(-1, 3), Ok(2));
        assert!(normalize_dim(3, 3).is_err());
        assert_eq!(normalize_dims(Some(&[-1, 0]), 3), Ok(vec![0, 2]));
        assert!(normalize_dims(Some(&[1, -2]), 3).is_err());
        assert_eq!(normalize_dims(None, 2), Ok(vec![0, 1]));
        assert_eq!(
            reduced_shape(&Shape::from([2, 3, 4]), &[1], true),
            Shape::from([2, 1, 4])
        );
    }
}
