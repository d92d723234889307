//! Element types.

use std::fmt;

use half::{bf16, f16};
use num_complex::Complex;

/// The element type of a tensor or device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE half precision.
    F16,
    /// bfloat16: f32's exponent range with a 7-bit mantissa.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// A complex number of two f32 parts (real, then imaginary).
    C64,
    /// A complex number of two f64 parts (real, then imaginary).
    C128,
}

impl DType {
    /// Every real (not complex) dtype, in promotion-friendly order.
    pub const REAL: [DType; 11] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Every dtype: the real ones, then the complex ones.
    pub const ALL: [DType; 13] = {
        let mut all = [DType::C128; 13];
        let mut i = 0;
        while i < DType::REAL.len() {
            all[i] = DType::REAL[i];
            i += 1;
        }
        all[11] = DType::C64;
        all
    };

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The PyTorch-style name (`"f32"`, `"bf16"`, `"bool"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "c64",
            DType::C128 => "c128",
        }
    }

    /// The element type as StableHLO spells it (`i1` for bool, `ui8` for u8).
    pub const fn mlir_name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::U8 => "ui8",
            DType::U32 => "ui32",
            DType::C64 => "complex<f32>",
            DType::C128 => "complex<f64>",
            other => other.name(),
        }
    }

    /// Parses a StableHLO element type (`f32`, `i1`, `ui8`, ...).
    pub fn from_mlir_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.mlir_name() == name)
    }

    /// True for floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for float and complex types: the types gradients flow through.
    pub const fn is_inexact(self) -> bool {
        self.is_float() || self.is_complex()
    }

    /// True for the complex types.
    pub const fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// The type of a complex type's parts (`c64` -> `f32`); any other type
    /// itself.
    pub const fn real_part(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            other => other,
        }
    }

    /// The complex type with parts of float type `self` (`f64` -> `c128`;
    /// the narrower floats widen to `c64`, as PyTorch's `complex` has no
    /// half-precision form it runs); a complex type itself; `None` for
    /// integers and bool.
    pub const fn complex_of(self) -> Option<DType> {
        match self {
            DType::F16 | DType::BF16 | DType::F32 | DType::C64 => Some(DType::C64),
            DType::F64 | DType::C128 => Some(DType::C128),
            _ => None,
        }
    }

    /// True for integer types (signed or unsigned), excluding bool.
    pub const fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U32
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of a tensor: its dtype and its bytes.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// The elements as raw little-endian bytes.
    fn as_bytes(values: &[Self]) -> &[u8];
    /// Elements from raw bytes; `bytes.len()` is a multiple of the element size.
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! pod_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn as_bytes(values: &[Self]) -> &[u8] {
                bytemuck::cast_slice(values)
            }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(bytemuck::pod_read_unaligned)
                    .collect()
            }
        }
    )*};
}

pod_element!(
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u32 => U32,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
    Complex<f32> => C64, Complex<f64> => C128,
);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn as_bytes(values: &[Self]) -> &[u8] {
        bytemuck::cast_slice(values)
    }
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlir_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_mlir_name(d.mlir_name()), Some(d));
        }
        assert_eq!(DType::from_mlir_name("f8E5M2"), None);
    }

    #[test]
    fn every_dtype_is_the_real_ones_then_the_complex_ones() {
        assert_eq!(DType::ALL[..11], DType::REAL);
        assert_eq!(DType::ALL[11..], [DType::C64, DType::C128]);
        assert!(DType::REAL.iter().all(|d| !d.is_complex()));
        assert_eq!(DType::BF16.complex_of(), Some(DType::C64));
        assert_eq!(DType::C128.real_part(), DType::F64);
    }

    #[test]
    fn element_sizes_match_rust_types() {
        assert_eq!(DType::BF16.size_in_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(<f64 as Element>::DTYPE.size_in_bytes(), 8);
        assert_eq!(bool::from_bytes(&[0, 1, 2]), vec![false, true, true]);
        let z = [Complex::new(1.5f32, -2.0)];
        assert_eq!(DType::C64.size_in_bytes(), 8);
        assert_eq!(Complex::<f32>::from_bytes(Complex::as_bytes(&z)), z);
    }
}
