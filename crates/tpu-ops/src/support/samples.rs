//! Sample inputs shared by op families: fixed awkward cases and random ones.

use tpu_core::op::{Attrs, Gen, Sample};
use tpu_core::{DType, Shape};

/// Fixed shapes every elementwise op is tried on: scalar, single, primes,
/// empty, and a long row.
pub const FIXED_SHAPES: &[&[usize]] = &[&[], &[1], &[3], &[2, 3], &[0, 4], &[3, 1, 7], &[1, 127]];

/// Unary samples on every fixed shape, first dtype of `dtypes` plus one
/// random other dtype.
pub fn unary_samples(dtypes: &[DType], lo: f64, hi: f64) -> Vec<Sample> {
    let mut g = Gen::new(0x5eed);
    let mut out = Vec::new();
    for (i, dims) in FIXED_SHAPES.iter().enumerate() {
        let dtype = if i % 2 == 0 {
            dtypes[0]
        } else {
            g.pick(dtypes)
        };
        let x = g.tensor_in(dtype, &Shape::from(*dims), lo, hi);
        out.push(Sample::new(vec![x], Attrs::new()));
    }
    out
}

/// A random unary sample with values in `[lo, hi)`.
pub fn unary_arbitrary(g: &mut Gen, dtypes: &[DType], lo: f64, hi: f64) -> Sample {
    let dtype = g.pick(dtypes);
    let shape = g.shape(0, 4);
    Sample::new(vec![g.tensor_in(dtype, &shape, lo, hi)], Attrs::new())
}

/// Binary samples: equal shapes, broadcasting both ways, rank-0 operands,
/// empty tensors.
pub fn binary_samples(dtypes: &[DType]) -> Vec<Sample> {
    let mut g = Gen::new(0xb1a5);
    let pairs: &[(&[usize], &[usize])] = &[
        (&[], &[]),
        (&[3], &[3]),
        (&[2, 3], &[3]),
        (&[2, 1], &[1, 3]),
        (&[4, 1, 7], &[3, 1]),
        (&[0, 3], &[1, 3]),
        (&[5], &[]),
        (&[1, 127], &[2, 1]),
    ];
    pairs
        .iter()
        .enumerate()
        .map(|(i, (a, b))| {
            let da = dtypes[i % dtypes.len()];
            let x = g.tensor(da, &Shape::from(*a));
            let y = g.tensor(da, &Shape::from(*b));
            Sample::new(vec![x, y], Attrs::new())
        })
        .collect()
}

/// A random binary sample: broadcastable shapes, usually one dtype,
/// sometimes two (to exercise promotion).
pub fn binary_arbitrary(g: &mut Gen, dtypes: &[DType]) -> Sample {
    let shape = g.shape(0, 4);
    let other = g.broadcastable(&shape);
    let (sa, sb) = if g.bool() {
        (shape, other)
    } else {
        (other, shape)
    };
    let da = g.pick(dtypes);
    let db = if g.below(4) == 0 { g.pick(dtypes) } else { da };
    Sample::new(vec![g.tensor(da, &sa), g.tensor(db, &sb)], Attrs::new())
}
