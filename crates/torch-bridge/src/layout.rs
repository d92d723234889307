//! Where a torch tensor's elements sit in its storage: sizes, strides and
//! an offset, as plain data.

use tpu_core::op::Attrs;

/// Where a torch tensor's elements sit in its storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Sizes.
    pub size: Vec<usize>,
    /// Strides, in elements.
    pub stride: Vec<usize>,
    /// Offset of the first element, in elements.
    pub offset: usize,
}

impl Layout {
    /// A dense row-major layout of `size` at offset 0.
    pub fn contiguous(size: &[usize]) -> Layout {
        Layout {
            size: size.to_vec(),
            stride: contiguous_strides(size),
            offset: 0,
        }
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.size.iter().product()
    }

    /// True when the view walks `numel` storage elements in order from
    /// `offset` (strides of size-1 dims do not matter).
    pub fn is_dense(&self) -> bool {
        let mut expected = 1;
        for (&n, &s) in self.size.iter().zip(&self.stride).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// True when the view is the whole storage, in order.
    pub fn covers(&self, numel: usize) -> bool {
        self.offset == 0 && self.numel() == numel && self.is_dense()
    }

    /// One past the last storage element the view reaches (a view with
    /// elements; an empty one reaches none).
    pub fn extent(&self) -> usize {
        self.offset
            + self
                .size
                .iter()
                .zip(&self.stride)
                .map(|(&n, &s)| n.saturating_sub(1) * s)
                .sum::<usize>()
            + 1
    }

    /// The `as_strided` attributes of this view.
    pub fn attrs(&self) -> Attrs {
        Attrs::new()
            .with("size", self.size.as_slice())
            .with("stride", self.stride.as_slice())
            .with("offset", self.offset)
    }
}

/// Row-major strides of `size`.
pub fn contiguous_strides(size: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; size.len()];
    for i in (0..size.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * size[i + 1].max(1);
    }
    strides
}
