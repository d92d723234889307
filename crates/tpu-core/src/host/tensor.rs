//! `HostTensor`: values of any dtype held as `ndarray` arrays of f64 (float
//! dtypes), i64 (integers and bool) or complex f64 (complex dtypes), always
//! rounded or wrapped to what the dtype can represent. References compute in
//! this wide form, which is what "accumulate in f64" means for them.

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use num_complex::Complex;

use super::HostBuffer;
use crate::stablehlo::TensorType;
use crate::{DType, Element, Shape};

/// The values of a [`HostTensor`].
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// Float dtypes, each value exactly representable in the dtype.
    Float(ArrayD<f64>),
    /// Integer dtypes and bool (0 or 1), each value in the dtype's range.
    Int(ArrayD<i64>),
    /// Complex dtypes, each part exactly representable in the part's dtype.
    Complex(ArrayD<Complex<f64>>),
}

/// A tensor in host memory, in the form op references compute on.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    dtype: DType,
    data: HostData,
}

/// Rounds `v` to the nearest value of float dtype `dtype`.
pub(crate) fn round_float(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Wraps `v` into the range of integer dtype `dtype` (two's complement).
pub(crate) fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::Bool => i64::from(v != 0),
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// Rounds both parts of `v` to the part type of complex dtype `dtype`.
fn round_complex(dtype: DType, v: Complex<f64>) -> Complex<f64> {
    let part = dtype.real_part();
    Complex::new(round_float(part, v.re), round_float(part, v.im))
}

impl HostTensor {
    /// A complex tensor; both parts are rounded to `dtype`'s part type. A
    /// real `dtype` keeps the real parts (as a cast does).
    pub fn complex(dtype: DType, values: ArrayD<Complex<f64>>) -> HostTensor {
        if dtype.is_complex() {
            HostTensor {
                dtype,
                data: HostData::Complex(values.mapv(|v| round_complex(dtype, v))),
            }
        } else {
            HostTensor::float(dtype, values.mapv(|v| v.re))
        }
    }

    /// A float tensor; values are rounded to `dtype`. An integer `dtype`
    /// truncates toward zero and saturates, and bool takes any nonzero
    /// value (NaN too) as true, like a cast.
    pub fn float(dtype: DType, values: ArrayD<f64>) -> HostTensor {
        if dtype.is_complex() {
            HostTensor::complex(dtype, values.mapv(|v| Complex::new(v, 0.0)))
        } else if dtype.is_float() {
            HostTensor {
                dtype,
                data: HostData::Float(values.mapv(|v| round_float(dtype, v))),
            }
        } else if dtype == DType::Bool {
            HostTensor::int(dtype, values.mapv(|v| i64::from(v != 0.0)))
        } else {
            HostTensor::int(dtype, values.mapv(|v| v as i64))
        }
    }

    /// An integer or bool tensor; values are wrapped to `dtype`. A float
    /// `dtype` converts them.
    pub fn int(dtype: DType, values: ArrayD<i64>) -> HostTensor {
        if dtype.is_float() || dtype.is_complex() {
            HostTensor::float(dtype, values.mapv(|v| v as f64))
        } else {
            HostTensor {
                dtype,
                data: HostData::Int(values.mapv(|v| wrap_int(dtype, v))),
            }
        }
    }

    /// A tensor from row-major f64 values (rounded or cast to `dtype`).
    /// `None` if the count does not match the shape.
    pub fn from_f64(dtype: DType, shape: impl Into<Shape>, values: Vec<f64>) -> Option<HostTensor> {
        let shape = shape.into();
        ArrayD::from_shape_vec(IxDyn(shape.dims()), values)
            .ok()
            .map(|a| HostTensor::float(dtype, a))
    }

    /// A tensor from row-major i64 values (wrapped or converted to `dtype`).
    pub fn from_i64(dtype: DType, shape: impl Into<Shape>, values: Vec<i64>) -> Option<HostTensor> {
        let shape = shape.into();
        ArrayD::from_shape_vec(IxDyn(shape.dims()), values)
            .ok()
            .map(|a| HostTensor::int(dtype, a))
    }

    /// A rank-0 tensor.
    pub fn scalar(dtype: DType, value: f64) -> HostTensor {
        let a = ArrayD::from_elem(IxDyn(&[]), value);
        HostTensor::float(dtype, a)
    }

    /// A rank-0 tensor of complex `dtype`.
    pub fn complex_scalar(dtype: DType, value: Complex<f64>) -> HostTensor {
        HostTensor::complex(dtype, ArrayD::from_elem(IxDyn(&[]), value))
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> Shape {
        Shape::new(self.dims())
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        match &self.data {
            HostData::Float(a) => a.shape(),
            HostData::Int(a) => a.shape(),
            HostData::Complex(a) => a.shape(),
        }
    }

    /// Dtype and shape.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape())
    }

    /// The values.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// The values as f64 (integers converted, complex values' real parts).
    pub fn to_f64(&self) -> ArrayD<f64> {
        match &self.data {
            HostData::Float(a) => a.clone(),
            HostData::Int(a) => a.mapv(|v| v as f64),
            HostData::Complex(a) => a.mapv(|v| v.re),
        }
    }

    /// The values as i64 (floats truncated toward zero, saturating; complex
    /// values' real parts).
    pub fn to_i64(&self) -> ArrayD<i64> {
        match &self.data {
            HostData::Float(a) => a.mapv(|v| v as i64),
            HostData::Int(a) => a.clone(),
            HostData::Complex(a) => a.mapv(|v| v.re as i64),
        }
    }

    /// The values as complex numbers (real values with imaginary part 0).
    pub fn to_complex(&self) -> ArrayD<Complex<f64>> {
        match &self.data {
            HostData::Complex(a) => a.clone(),
            _ => self.to_f64().mapv(|v| Complex::new(v, 0.0)),
        }
    }

    /// Converts to `dtype` as StableHLO's `convert` does: floats round to
    /// nearest, float to integer truncates (saturating, NaN to 0), anything
    /// to bool is `!= 0`; a real value becomes a complex one with imaginary
    /// part 0, and a complex value keeps its real part (PyTorch's cast).
    pub fn cast(&self, dtype: DType) -> HostTensor {
        match (&self.data, dtype) {
            (HostData::Complex(a), DType::Bool) => {
                HostTensor::int(dtype, a.mapv(|v| i64::from(v.re != 0.0 || v.im != 0.0)))
            }
            (HostData::Complex(a), _) => HostTensor::complex(dtype, a.clone()),
            (HostData::Float(a), DType::Bool) => {
                HostTensor::int(dtype, a.mapv(|v| i64::from(v != 0.0)))
            }
            (HostData::Float(a), _) => HostTensor::float(dtype, a.clone()),
            (HostData::Int(a), _) => HostTensor::int(dtype, a.clone()),
        }
    }

    /// The raw bytes of the dtype, for upload.
    pub fn to_buffer(&self) -> HostBuffer {
        fn pack<T: Element>(values: impl Iterator<Item = T>) -> Vec<u8> {
            let v: Vec<T> = values.collect();
            T::as_bytes(&v).to_vec()
        }
        let f = || self.to_f64().into_iter().collect::<Vec<f64>>().into_iter();
        let i = || self.to_i64().into_iter().collect::<Vec<i64>>().into_iter();
        let c = || {
            self.to_complex()
                .into_iter()
                .collect::<Vec<_>>()
                .into_iter()
        };
        let bytes = match self.dtype {
            DType::C128 => pack(c()),
            DType::C64 => pack(c().map(|v| Complex::new(v.re as f32, v.im as f32))),
            DType::F64 => pack(f()),
            DType::F32 => pack(f().map(|v| v as f32)),
            DType::F16 => pack(f().map(f16::from_f64)),
            DType::BF16 => pack(f().map(bf16::from_f64)),
            DType::Bool => pack(i().map(|v| v != 0)),
            DType::I8 => pack(i().map(|v| v as i8)),
            DType::I16 => pack(i().map(|v| v as i16)),
            DType::I32 => pack(i().map(|v| v as i32)),
            DType::I64 => pack(i()),
            DType::U8 => pack(i().map(|v| v as u8)),
            DType::U32 => pack(i().map(|v| v as u32)),
        };
        HostBuffer::from_bytes(bytes, self.dtype, self.shape())
            .unwrap_or_else(|_| unreachable!("packed bytes always match dtype and shape"))
    }

    /// Reads a host buffer.
    pub fn from_buffer(buffer: &HostBuffer) -> HostTensor {
        let dims = buffer.shape().dims().to_vec();
        let float = |v: Vec<f64>| HostData::Float(array(&dims, v));
        let int = |v: Vec<i64>| HostData::Int(array(&dims, v));
        let complex = |v: Vec<Complex<f64>>| HostData::Complex(array(&dims, v));
        let b = buffer.bytes();
        let dtype = buffer.dtype();
        let data = match dtype {
            DType::F64 => float(f64::from_bytes(b)),
            DType::F32 => float(f32::from_bytes(b).into_iter().map(f64::from).collect()),
            DType::F16 => float(f16::from_bytes(b).into_iter().map(f16::to_f64).collect()),
            DType::BF16 => float(bf16::from_bytes(b).into_iter().map(bf16::to_f64).collect()),
            DType::Bool => int(bool::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::I8 => int(i8::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::I16 => int(i16::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::I32 => int(i32::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::I64 => int(i64::from_bytes(b)),
            DType::U8 => int(u8::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::U32 => int(u32::from_bytes(b).into_iter().map(i64::from).collect()),
            DType::C64 => complex(
                Complex::<f32>::from_bytes(b)
                    .into_iter()
                    .map(|v| Complex::new(v.re.into(), v.im.into()))
                    .collect(),
            ),
            DType::C128 => complex(Complex::<f64>::from_bytes(b)),
        };
        HostTensor { dtype, data }
    }
}

/// An array of `dims` from exactly `numel(dims)` values, as a host buffer
/// guarantees.
fn array<T>(dims: &[usize], values: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(dims), values)
        .unwrap_or_else(|_| unreachable!("a HostBuffer's byte count matches its shape"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_is_true_as_a_bool() {
        for v in [0.3, -0.2, f64::NAN, 2.0] {
            assert_eq!(HostTensor::scalar(DType::Bool, v).to_i64().sum(), 1, "{v}");
        }
        assert_eq!(HostTensor::scalar(DType::Bool, 0.0).to_i64().sum(), 0);
        assert_eq!(HostTensor::scalar(DType::I32, -2.7).to_i64().sum(), -2);
    }
}
