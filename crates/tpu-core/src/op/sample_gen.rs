//! Random valid inputs for property tests: awkward sizes, every dtype, and
//! values away from the edges where references and devices may differ.

use crate::host::HostTensor;
use crate::{DType, Shape};

/// A seeded generator (SplitMix64): the same seed gives the same sample.
#[derive(Clone, Debug)]
pub struct Gen {
    state: u64,
}

/// Dimension sizes tests favour: 1 and primes catch broadcasting and tiling
/// bugs, 0 catches empty-tensor bugs.
const AWKWARD: [usize; 8] = [1, 2, 3, 4, 5, 7, 8, 0];

/// Total elements a generated tensor stays under, to keep tests fast.
const MAX_ELEMENTS: usize = 4096;

impl Gen {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Gen {
        Gen { state: seed }
    }

    /// 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// A fair coin.
    pub fn bool(&mut self) -> bool {
        self.u64() & 1 == 1
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A dimension size: mostly small awkward sizes, sometimes 0 or 127.
    pub fn dim(&mut self) -> usize {
        match self.below(16) {
            0 => 127,
            1 => 0,
            _ => AWKWARD[self.below(AWKWARD.len() - 1)],
        }
    }

    /// A dimension size of at least 1.
    pub fn dim_nonzero(&mut self) -> usize {
        match self.dim() {
            0 => 1,
            d => d,
        }
    }

    /// A shape with rank in `min_rank..=max_rank`, under the element cap.
    pub fn shape(&mut self, min_rank: usize, max_rank: usize) -> Shape {
        let rank = min_rank + self.below(max_rank.saturating_sub(min_rank) + 1);
        let mut dims: Vec<usize> = (0..rank).map(|_| self.dim()).collect();
        while dims.iter().product::<usize>() > MAX_ELEMENTS {
            let largest = (0..dims.len()).max_by_key(|&i| dims[i]).unwrap_or(0);
            dims[largest] = (dims[largest] / 4).max(1);
        }
        Shape::new(dims)
    }

    /// Like [`Gen::shape`] with every dimension at least 1.
    pub fn shape_nonempty(&mut self, min_rank: usize, max_rank: usize) -> Shape {
        let s = self.shape(min_rank, max_rank);
        Shape::new(s.dims().iter().map(|&d| d.max(1)).collect::<Vec<_>>())
    }

    /// A shape that broadcasts with `shape`: some dims set to 1, some leading
    /// dims dropped.
    pub fn broadcastable(&mut self, shape: &Shape) -> Shape {
        let drop = self.below(shape.rank() + 1);
        let dims: Vec<usize> = shape.dims()[drop..]
            .iter()
            .map(|&d| if self.below(3) == 0 { 1 } else { d })
            .collect();
        Shape::new(dims)
    }

    /// Values typical for `dtype`: floats in [-3, 3), signed ints in
    /// [-20, 20], unsigned in [0, 40], bools either way.
    pub fn tensor(&mut self, dtype: DType, shape: &Shape) -> HostTensor {
        match dtype {
            d if d.is_float() || d.is_complex() => self.tensor_in(dtype, shape, -3.0, 3.0),
            DType::Bool => self.tensor_in(dtype, shape, 0.0, 2.0),
            DType::U8 | DType::U32 => self.tensor_in(dtype, shape, 0.0, 41.0),
            _ => self.tensor_in(dtype, shape, -20.0, 21.0),
        }
    }

    /// Values uniform in `[lo, hi)` (integers: floored; unsigned: from 0;
    /// complex: both parts).
    pub fn tensor_in(&mut self, dtype: DType, shape: &Shape, lo: f64, hi: f64) -> HostTensor {
        let n = shape.numel();
        if dtype.is_complex() {
            let values = (0..n)
                .map(|_| crate::Complex::new(self.uniform(lo, hi), self.uniform(lo, hi)))
                .collect();
            let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape.dims()), values)
                .unwrap_or_else(|_| unreachable!("value count matches the shape"));
            return HostTensor::complex(dtype, array);
        }
        let (lo, hi) = match dtype {
            DType::U8 | DType::U32 | DType::Bool => (lo.max(0.0), hi.max(lo.max(0.0) + 1.0)),
            _ => (lo, hi),
        };
        if dtype.is_float() {
            let values = (0..n).map(|_| self.uniform(lo, hi)).collect();
            HostTensor::from_f64(dtype, shape.clone(), values)
        } else {
            let values = (0..n)
                .map(|_| self.uniform(lo, hi).floor() as i64)
                .collect();
            HostTensor::from_i64(dtype, shape.clone(), values)
        }
        .unwrap_or_else(|| unreachable!("value count matches the shape"))
    }

    /// Integers uniform in `lo..hi` (for indices).
    pub fn indices(&mut self, dtype: DType, shape: &Shape, lo: i64, hi: i64) -> HostTensor {
        let values = (0..shape.numel())
            .map(|_| lo + self.below((hi - lo).max(1) as usize) as i64)
            .collect();
        HostTensor::from_i64(dtype, shape.clone(), values)
            .unwrap_or_else(|| unreachable!("value count matches the shape"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_values_and_bounded_sizes() {
        let (mut a, mut b) = (Gen::new(7), Gen::new(7));
        for _ in 0..100 {
            assert_eq!(a.u64(), b.u64());
            assert!(a.shape(0, 4).numel() <= MAX_ELEMENTS);
            b.shape(0, 4);
        }
        let s = Shape::from([3, 4]);
        for _ in 0..20 {
            let t = a.broadcastable(&s);
            assert!(t.rank() <= 2);
        }
    }
}
