//! The device memory behind one torch storage, and the strided views torch
//! tensors take of it.
//!
//! A storage holds one tensor whose row-major elements are the storage's
//! elements (its shape is whatever op produced it). Reading a view that
//! covers the storage in order is free; any other view is an `as_strided`
//! op. Writes are functional: a new tensor is bound to the storage, so
//! every torch tensor aliasing it sees the write.

use std::sync::Mutex;

use pyo3::prelude::*;
use tpu_core::op::Attrs;
use tpu_core::{DType, Device, Tensor};

use crate::address::Address;
use crate::error::{BridgeError, Result};
use crate::kernels::{call1, full};

/// The tpu-rs side of a torch storage on the `tpu` device.
#[pyclass(module = "torch_tpu_rs._C", frozen)]
pub struct Storage {
    dtype: DType,
    numel: usize,
    device: usize,
    address: Address,
    // `None` until first written: `torch.empty` allocates nothing, and an
    // unwritten storage reads as zeros.
    value: Mutex<Option<Tensor>>,
}

impl Storage {
    /// A storage of `numel` elements of `dtype`, not yet written.
    pub fn empty(dtype: DType, numel: usize, device: usize) -> Result<Storage> {
        Ok(Storage {
            dtype,
            numel,
            device,
            address: Address::allocate(bytes_of(dtype, numel))?,
            value: Mutex::new(None),
        })
    }

    /// A storage holding `value`'s elements.
    pub fn holding(value: Tensor) -> Result<Storage> {
        let Device::Tpu(device) = value.device() else {
            return Err(BridgeError::internal(
                "a tpu storage cannot hold a cpu tensor",
            ));
        };
        let storage = Storage::empty(value.dtype(), value.shape().numel(), device)?;
        crate::writes::note(&value);
        *storage.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        Ok(storage)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The `tpu` device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes the storage holds.
    pub fn nbytes(&self) -> usize {
        bytes_of(self.dtype, self.numel)
    }

    /// The fake host address torch sees as the storage's data pointer.
    pub fn address(&self) -> u64 {
        self.address.get()
    }

    /// The current value (zeros when never written).
    pub fn value(&self) -> Result<Tensor> {
        let mut slot = self.value.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slot.as_ref() {
            return Ok(v.clone());
        }
        let zeros = full(self.dtype, &[self.numel], 0.0, self.device)?;
        *slot = Some(zeros.clone());
        Ok(zeros)
    }

    /// Binds a new value (same element count and type).
    pub fn set(&self, value: Tensor) -> Result<()> {
        if value.shape().numel() != self.numel || value.dtype() != self.dtype {
            return Err(BridgeError::internal(format!(
                "storage of {} x {} cannot hold {}",
                self.numel,
                self.dtype,
                value.ty()
            )));
        }
        crate::writes::note(&value);
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        Ok(())
    }

    /// True once written.
    pub fn is_written(&self) -> bool {
        self.value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

#[pymethods]
impl Storage {
    /// Element count (for debugging from Python).
    #[getter(numel)]
    fn py_numel(&self) -> usize {
        self.numel
    }

    fn __repr__(&self) -> String {
        format!(
            "Storage({} x {}, tpu:{}, {})",
            self.numel,
            self.dtype,
            self.device,
            if self.is_written() {
                "written"
            } else {
                "unwritten"
            }
        )
    }
}

/// Bytes of `numel` elements of `dtype`.
fn bytes_of(dtype: DType, numel: usize) -> usize {
    numel.saturating_mul(dtype.size_in_bytes())
}

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

    fn attrs(&self) -> Attrs {
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

/// The value a view of `storage` sees, shaped `layout.size`.
pub fn read(storage: &Storage, layout: &Layout) -> Result<Tensor> {
    if layout.numel() == 0 {
        return full(storage.dtype, &layout.size, 0.0, storage.device);
    }
    let value = storage.value()?;
    if layout.covers(storage.numel) {
        if value.shape().dims() == layout.size.as_slice() {
            return Ok(value);
        }
        let attrs = Attrs::new().with("shape", layout.size.as_slice());
        return call1("reshape", &[value], &attrs);
    }
    call1("as_strided", &[value], &layout.attrs())
}

/// Writes `src` (shaped `layout.size`, the storage's dtype) through a view.
pub fn write(storage: &Storage, layout: &Layout, src: Tensor) -> Result<()> {
    if layout.numel() == 0 {
        return Ok(());
    }
    if layout.covers(storage.numel) {
        return storage.set(src);
    }
    let base = storage.value()?;
    let out = call1("as_strided_scatter", &[base, src], &layout.attrs())?;
    storage.set(out)
}
