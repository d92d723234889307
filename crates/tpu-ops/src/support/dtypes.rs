//! Dtype sets and PyTorch's type promotion.

use tpu_core::DType;
use tpu_core::op::{OpError, OpResult};
use tpu_core::stablehlo::TensorType;
use tpu_core::unsupported;

/// Float dtypes.
pub const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
/// Signed and unsigned integer dtypes.
pub const INTS: &[DType] = &[
    DType::I32,
    DType::I64,
    DType::I8,
    DType::I16,
    DType::U8,
    DType::U32,
];
/// Floats and integers.
pub const NUMERIC: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::I8,
    DType::I16,
    DType::U8,
    DType::U32,
];
/// Integers and bool (what bitwise ops take).
pub const INTS_AND_BOOL: &[DType] = &[
    DType::I32,
    DType::I64,
    DType::I8,
    DType::I16,
    DType::U8,
    DType::U32,
    DType::Bool,
];
/// Every real (not complex) dtype.
pub const REAL: &[DType] = &DType::REAL;
/// The complex dtypes.
pub const COMPLEX: &[DType] = &[DType::C64, DType::C128];
/// Every dtype, complex ones included (what data movement takes).
pub const ANY: &[DType] = &DType::ALL;
/// Signed numeric dtypes (what `neg` and `sign` take).
pub const SIGNED: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::I8,
    DType::I16,
];

/// `real` followed by the complex dtypes; `N` is its length plus two.
const fn with_complex<const N: usize>(real: &[DType]) -> [DType; N] {
    let mut out = [DType::C128; N];
    let mut i = 0;
    while i < real.len() {
        out[i] = real[i];
        i += 1;
    }
    out[N - 2] = DType::C64;
    out
}

/// Floats, integers and the complex dtypes (what arithmetic takes).
pub const NUMERIC_OR_COMPLEX: &[DType] = &with_complex::<12>(NUMERIC);
/// Signed numbers and the complex dtypes (what `abs` and `neg` take).
pub const SIGNED_OR_COMPLEX: &[DType] = &with_complex::<10>(SIGNED);

/// Floats and the complex dtypes (what `mean` takes).
pub const INEXACT: &[DType] = &with_complex::<6>(FLOATS);

/// 0 for bool, 1 for integers, 2 for floats, 3 for complex.
fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_complex() {
        3
    } else if d.is_float() {
        2
    } else {
        1
    }
}

/// Promotes two dtypes as PyTorch does for tensors of equal standing.
pub fn promote_dtypes(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (category(a), category(b)) {
        // A complex type with a real one: complex, with parts as wide as
        // the wider float involved (`c64` with `f64` is `c128`).
        (3, _) | (_, 3) => {
            let part = promote_dtypes(a.real_part(), b.real_part());
            part.complex_of()
                .unwrap_or(if category(a) == 3 { a } else { b })
        }
        (ca, cb) if ca != cb => {
            if ca > cb {
                a
            } else {
                b
            }
        }
        (2, _) => match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => {
                if a.size_in_bytes() >= b.size_in_bytes() {
                    a
                } else {
                    b
                }
            }
        },
        _ => {
            let unsigned = |d: DType| matches!(d, U8 | U32);
            let bits = |d: DType| d.size_in_bytes() * 8;
            match (unsigned(a), unsigned(b)) {
                (false, false) | (true, true) => {
                    if bits(a) >= bits(b) {
                        a
                    } else {
                        b
                    }
                }
                _ => {
                    let (u, s) = if unsigned(a) { (a, b) } else { (b, a) };
                    // The signed type must hold every unsigned value.
                    if bits(s) > bits(u) {
                        s
                    } else if bits(u) == 8 {
                        I16
                    } else {
                        I64
                    }
                }
            }
        }
    }
}

/// PyTorch's promotion for two operands: a rank-0 operand does not raise the
/// dtype of a ranked operand of the same category (`f16 tensor * f32 scalar`
/// stays f16).
pub fn promote(a: &TensorType, b: &TensorType) -> DType {
    let (ra, rb) = (a.shape.rank() == 0, b.shape.rank() == 0);
    if ra != rb && category(a.dtype) == category(b.dtype) {
        return if ra { b.dtype } else { a.dtype };
    }
    promote_dtypes(a.dtype, b.dtype)
}

/// The float dtype an integer computation is carried out in (PyTorch's
/// default dtype), or `d` itself when it is already a float or complex.
pub fn to_float(d: DType) -> DType {
    if d.is_inexact() { d } else { DType::F32 }
}

/// An error unless `d` is in `allowed`: the op does not implement other
/// dtypes ([`OpErrorKind::Unsupported`](tpu_core::op::OpErrorKind)).
pub fn require_dtype(d: DType, allowed: &[DType], what: &str) -> OpResult<()> {
    if allowed.contains(&d) {
        Ok(())
    } else {
        let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
        Err(unsupported!(
            "{what} must be one of [{}], got {d}",
            names.join(", ")
        ))
    }
}

/// An error unless `d` is in `allowed`, for inputs that hold indices
/// (targets, pivots): another dtype is a mistake in the call.
pub fn require_index_dtype(d: DType, allowed: &[DType], what: &str) -> OpResult<()> {
    require_dtype(d, allowed, what).map_err(|e| OpError::invalid(e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_matches_pytorch() {
        use DType::*;
        assert_eq!(promote_dtypes(I32, F16), F16);
        assert_eq!(promote_dtypes(F16, BF16), F32);
        assert_eq!(promote_dtypes(U8, I8), I16);
        assert_eq!(promote_dtypes(U32, I32), I64);
        assert_eq!(promote_dtypes(U8, I32), I32);
        assert_eq!(promote_dtypes(Bool, U8), U8);
        assert_eq!(promote_dtypes(F32, F64), F64);
        assert_eq!(promote_dtypes(C64, F64), C128);
        assert_eq!(promote_dtypes(I64, C64), C64);
        assert_eq!(promote_dtypes(C64, C128), C128);
        assert_eq!(promote_dtypes(BF16, C64), C64);
        let vector = TensorType::new(F16, [3]);
        let scalar = TensorType::new(F32, []);
        assert_eq!(promote(&vector, &scalar), F16);
        assert_eq!(promote(&TensorType::new(I32, [3]), &scalar), F32);
    }
}
