//! Tensor shapes.

use std::fmt;

/// The dimensions of a dense, row-major tensor. A rank-0 shape is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar, 0 if any dimension is 0);
    /// saturates at `usize::MAX` for shapes too large to address.
    pub fn numel(&self) -> usize {
        self.0
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(if self.0.contains(&0) { 0 } else { usize::MAX })
    }

    /// The dimensions as PJRT wants them.
    pub fn dims_i64(&self) -> Vec<i64> {
        self.0.iter().map(|&d| d as i64).collect()
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(dims)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numel_and_display() {
        assert_eq!(Shape::scalar().numel(), 1);
        assert_eq!(Shape::from([2, 0, 3]).numel(), 0);
        assert_eq!(Shape::from([2, 3]).to_string(), "[2, 3]");
        assert_eq!(Shape::scalar().to_string(), "[]");
        assert_eq!(Shape::from([usize::MAX, 2]).numel(), usize::MAX);
        assert_eq!(Shape::from([usize::MAX, 2, 0]).numel(), 0);
    }
}
