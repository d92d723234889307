//! Host memory: dense tensors in RAM, the storage of the `cpu` reference
//! device and the staging form of every transfer to and from `tpu`.

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::pjrt::{Buffer, Client};
use crate::{DType, Shape};

/// A dense, row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostBuffer {
    dtype: DType,
    shape: Shape,
    bytes: Vec<u8>,
}

/// An error unless `len` bytes are exactly a dense `dtype` tensor of `shape`.
pub(crate) fn check_len(len: usize, dtype: DType, shape: &Shape) -> Result<()> {
    let expected = shape.numel().saturating_mul(dtype.size_in_bytes());
    if len == expected {
        Ok(())
    } else {
        Err(Error::BufferSize {
            dtype,
            shape: shape.clone(),
            expected,
            actual: len,
        })
    }
}

impl HostBuffer {
    /// Wraps raw bytes, checking their length against dtype and shape.
    pub fn from_bytes(bytes: Vec<u8>, dtype: DType, shape: impl Into<Shape>) -> Result<HostBuffer> {
        let shape = shape.into();
        check_len(bytes.len(), dtype, &shape)?;
        Ok(HostBuffer {
            dtype,
            shape,
            bytes,
        })
    }

    /// The same bytes under another shape of as many elements.
    pub fn reshaped(self, shape: impl Into<Shape>) -> Result<HostBuffer> {
        HostBuffer::from_bytes(self.bytes, self.dtype, shape)
    }

    /// Copies a typed slice.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<HostBuffer> {
        HostBuffer::from_bytes(T::as_bytes(data).to_vec(), T::DTYPE, shape)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The raw bytes, without a copy.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The contents as a typed vector; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                expected: T::DTYPE,
                actual: self.dtype,
            });
        }
        Ok(T::from_bytes(&self.bytes))
    }

    /// Copies the contents to device `device` of `client`.
    pub fn upload(&self, client: &Client, device: usize) -> Result<Buffer> {
        client.buffer_from_bytes(&self.bytes, self.dtype, self.shape.clone(), device)
    }

    /// Copies a device buffer into host memory.
    pub fn download(buffer: &Buffer) -> Result<HostBuffer> {
        Ok(HostBuffer {
            dtype: buffer.dtype(),
            shape: buffer.shape().clone(),
            bytes: buffer.to_bytes()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_lengths_are_typed_errors() {
        let err = HostBuffer::from_bytes(vec![0; 7], DType::F32, [2]).unwrap_err();
        assert!(matches!(
            err,
            Error::BufferSize {
                expected: 8,
                actual: 7,
                ..
            }
        ));
    }

    #[test]
    fn typed_reads_check_the_dtype() {
        let h = HostBuffer::from_slice(&[1i32, 2, 3], [3]).unwrap();
        assert_eq!(h.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
        assert!(h.to_vec::<f32>().is_err());
        assert_eq!(h.bytes().len(), 12);
    }
}
