//! Linear algebra: matmul with batching and broadcasting, dot_general,
//! convolutions, pooling, triangular solves, the Cholesky factorization,
//! LU with partial pivoting, QR and the symmetric eigendecomposition; the
//! discrete Fourier transform.

mod conv;
mod decomp;
mod dot;
mod factor;
mod fft;
mod lu;
mod pool;
#[cfg(test)]
mod tests;

use tpu_core::DType;
use tpu_core::op::{Attrs, OpResult, Tape, Var};

/// The dtype a product accumulates in on the device: f32 for f16 and bf16;
/// other floats and complex types in themselves;
/// integers exactly, wrapping, in i32 (i64 for i64), which gives the same
/// bits as exact accumulation wrapped to the output dtype.
pub(crate) fn accumulator(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        DType::I64 => DType::I64,
        d if d.is_inexact() => d,
        _ => DType::I32,
    }
}

/// `x` with its dims reordered: result dim `i` is `x`'s dim `perm[i]`.
pub(crate) fn permute(t: &mut dyn Tape, x: Var, perm: &[usize]) -> OpResult<Var> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x);
    }
    t.call1("permute", &[x], Attrs::new().with("dims", perm))
}

/// `x` reversed along `dims`.
pub(crate) fn flip(t: &mut dyn Tape, x: Var, dims: &[usize]) -> OpResult<Var> {
    let shape = t.ty(x)?.shape;
    if dims.iter().all(|&d| shape.dims()[d] <= 1) {
        return Ok(x);
    }
    t.call1("flip", &[x], Attrs::new().with("dims", dims))
}

/// `x` with its last two dims swapped.
pub(crate) fn transpose_last(t: &mut dyn Tape, x: Var) -> OpResult<Var> {
    t.call1(
        "transpose",
        &[x],
        Attrs::new().with("dim0", -2i64).with("dim1", -1i64),
    )
}

/// The batched, broadcasting matrix product `x @ y`.
pub(crate) fn matmul(t: &mut dyn Tape, x: Var, y: Var) -> OpResult<Var> {
    t.call1("matmul", &[x, y], Attrs::new())
}
