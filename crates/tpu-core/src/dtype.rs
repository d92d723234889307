//! Element types.

use std::fmt;

use half::{bf16, f16};

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
}

impl DType {
    /// Every dtype, in promotion-friendly order.
    pub const ALL: [DType; 11] = [
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

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
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
        }
    }

    /// The element type as StableHLO spells it (`i1` for bool, `ui8` for u8).
    pub const fn mlir_name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::U8 => "ui8",
            DType::U32 => "ui32",
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
    fn element_sizes_match_rust_types() {
        assert_eq!(DType::BF16.size_in_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(<f64 as Element>::DTYPE.size_in_bytes(), 8);
        assert_eq!(bool::from_bytes(&[0, 1, 2]), vec![false, true, true]);
    }
}
