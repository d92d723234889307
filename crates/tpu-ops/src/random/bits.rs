//! The counter-based generator every random op draws from, written twice
//! with the same integer arithmetic: once on the host (the reference) and
//! once in StableHLO (`ui32` multiply / xor / shift), so a device gives
//! exactly the reference's bits.
//!
//! A key is a `u32[2]` tensor `(k0, k1)`. It is first mixed into two seeds
//! with a bijection, so different keys give different seeds:
//! `s0 = fmix(k0 ^ C0)`, `s1 = fmix(k1 ^ s0 ^ C1)`. Element `i` (row-major
//! index) of stream `j` then gets
//! `fmix(fmix(fmix(i ^ s1) + (s0 ^ STREAM[j])) ^ s1)`, where `fmix` is
//! MurmurHash3's 32-bit finaliser (itself a bijection). For two different
//! keys every element differs.

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::OpResult;
use tpu_core::stablehlo::{Builder, TensorType, Value};

/// Constants mixed into the key words.
const C0: u32 = 0x9E37_79B9;
const C1: u32 = 0x7F4A_7C15;
/// Per-stream constants (uniform draws use stream 0; `normal` also stream 1).
pub(crate) const STREAM: [u32; 2] = [0, 0x68E3_1DA4];
/// MurmurHash3 finaliser multipliers.
const M1: u32 = 0x85EB_CA6B;
const M2: u32 = 0xC2B2_AE35;

/// MurmurHash3's 32-bit finaliser.
pub(crate) fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(M1);
    h ^= h >> 13;
    h = h.wrapping_mul(M2);
    h ^= h >> 16;
    h
}

/// The two seeds of a key.
pub(crate) fn seeds(k0: u32, k1: u32) -> (u32, u32) {
    let s0 = fmix(k0 ^ C0);
    let s1 = fmix(k1 ^ s0 ^ C1);
    (s0, s1)
}

/// The bits of element `i` of stream `stream`.
pub(crate) fn bits(seeds: (u32, u32), i: u32, stream: usize) -> u32 {
    let (s0, s1) = seeds;
    let x = fmix(i ^ s1);
    let x = fmix(x.wrapping_add(s0 ^ STREAM[stream]));
    fmix(x ^ s1)
}

/// The top 24 bits of a draw: `u = mantissa * 2^-24` is exact in f32.
pub(crate) fn mantissa(bits: u32) -> u32 {
    bits >> 8
}

/// `2^-24`, the spacing of uniform draws.
pub(crate) const UNIT: f64 = 1.0 / 16_777_216.0;

/// The key words of a key tensor (already checked to be `u32[2]`).
pub(crate) fn key_words(key: &HostTensor) -> OpResult<(u32, u32)> {
    let k = key.to_i64();
    let words: Vec<i64> = k.iter().copied().collect();
    match words[..] {
        [a, b] => Ok((a as u32, b as u32)),
        _ => Err(invalid!("a key must hold 2 values, got {}", words.len())),
    }
}

/// Every element's bits of stream `stream`, row-major.
pub(crate) fn host_bits(key: &HostTensor, n: usize, stream: usize) -> OpResult<Vec<u32>> {
    let (k0, k1) = key_words(key)?;
    let s = seeds(k0, k1);
    Ok((0..n).map(|i| bits(s, i as u32, stream)).collect())
}

/// Checks that `key` is a `u32[2]` key.
pub(crate) fn check_key(key: &TensorType) -> OpResult<()> {
    if key.dtype != DType::U32 || key.shape.dims() != [2] {
        return Err(invalid!(
            "a key must be a u32 tensor of shape [2], got {key}"
        ));
    }
    Ok(())
}

// ---- The same arithmetic in StableHLO. ----

fn u32_const(b: &mut Builder, dims: &[usize], v: u32) -> Value {
    b.constant(DType::U32, dims.to_vec(), f64::from(v))
}

fn xor_const(b: &mut Builder, x: &Value, v: u32) -> Value {
    let c = u32_const(b, x.dims(), v);
    b.binary("stablehlo.xor", x, &c)
}

fn shift_xor(b: &mut Builder, x: &Value, shift: u32) -> Value {
    let c = u32_const(b, x.dims(), shift);
    let s = b.binary("stablehlo.shift_right_logical", x, &c);
    b.binary("stablehlo.xor", x, &s)
}

fn mul_const(b: &mut Builder, x: &Value, v: u32) -> Value {
    let c = u32_const(b, x.dims(), v);
    b.binary("stablehlo.multiply", x, &c)
}

/// [`fmix`] on a `ui32` tensor.
fn lower_fmix(b: &mut Builder, x: &Value) -> Value {
    let h = shift_xor(b, x, 16);
    let h = mul_const(b, &h, M1);
    let h = shift_xor(b, &h, 13);
    let h = mul_const(b, &h, M2);
    shift_xor(b, &h, 16)
}

/// The seeds of a `ui32[2]` key value, as scalars.
fn lower_seeds(b: &mut Builder, key: &Value) -> (Value, Value) {
    let k0 = b.slice(key, &[0], &[1], &[1]);
    let k1 = b.slice(key, &[1], &[2], &[1]);
    let k0 = b.reshape(&k0, &[]);
    let k1 = b.reshape(&k1, &[]);
    let s0 = xor_const(b, &k0, C0);
    let s0 = lower_fmix(b, &s0);
    let s1 = b.binary("stablehlo.xor", &k1, &s0);
    let s1 = xor_const(b, &s1, C1);
    let s1 = lower_fmix(b, &s1);
    (s0, s1)
}

/// The bits of every element of `dims` for the given streams, as `ui32`
/// tensors of shape `dims`.
pub(crate) fn lower_bits(
    b: &mut Builder,
    key: &Value,
    dims: &[usize],
    streams: &[usize],
) -> Vec<Value> {
    let (s0, s1) = lower_seeds(b, key);
    let n: usize = dims.iter().product();
    let i = b.iota(DType::U32, &[n], 0);
    let i = b.reshape(&i, dims);
    let s0 = b.broadcast_in_dim(&s0, dims, &[]);
    let s1 = b.broadcast_in_dim(&s1, dims, &[]);
    let x = b.binary("stablehlo.xor", &i, &s1);
    let x1 = lower_fmix(b, &x);
    streams
        .iter()
        .map(|&j| {
            let salt = xor_const(b, &s0, STREAM[j]);
            let x = b.binary("stablehlo.add", &x1, &salt);
            let x = lower_fmix(b, &x);
            let x = b.binary("stablehlo.xor", &x, &s1);
            lower_fmix(b, &x)
        })
        .collect()
}

/// The 24-bit mantissas (`bits >> 8`) of `bits`.
pub(crate) fn lower_mantissa(b: &mut Builder, bits: &Value) -> Value {
    let c = u32_const(b, bits.dims(), 8);
    b.binary("stablehlo.shift_right_logical", bits, &c)
}

/// Uniform draws in `[0, 1)` of float dtype `dtype` (exact: `m * 2^-24`).
pub(crate) fn lower_unit(b: &mut Builder, bits: &Value, dtype: DType) -> Value {
    let m = lower_mantissa(b, bits);
    let m = b.convert(&m, dtype);
    let unit = b.constant(dtype, bits.dims().to_vec(), UNIT);
    b.binary("stablehlo.multiply", &m, &unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix_matches_murmur3() {
        // Known values of MurmurHash3's fmix32.
        assert_eq!(fmix(0), 0);
        assert_eq!(fmix(1), 0x514E_28B7);
    }

    #[test]
    fn every_element_differs_between_keys() {
        let a = seeds(1, 2);
        let b = seeds(1, 3);
        let c = seeds(2, 2);
        for i in 0..1000 {
            let x = bits(a, i, 0);
            assert_ne!(x, bits(b, i, 0));
            assert_ne!(x, bits(c, i, 0));
            assert_ne!(x, bits(a, i, 1));
        }
    }
}
