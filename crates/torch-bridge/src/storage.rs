//! The device memory behind one torch storage, and the strided views torch
//! tensors take of it.
//!
//! A storage holds one tensor whose row-major elements are the storage's
//! elements (its shape is whatever op produced it). Reading a view that
//! covers the storage in order is free; any other view is an `as_strided`
//! op. Writes are functional: a new tensor is bound to the storage, so
//! every torch tensor aliasing it sees the write.
//!
//! With shape buckets on (see [`crate::buckets`]), a storage may hold its
//! value [`Padded`] along one dim: views that are windows of it read
//! through a run-time start, so their programs see the bucket's shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use pyo3::prelude::*;
use tpu_core::op::Attrs;
use tpu_core::{DType, Device, Tensor};

use crate::address::Address;
use crate::error::{BridgeError, Result};
use crate::kernels::{call1, full};
use crate::layout::{Layout, contiguous_strides};

/// The tpu-rs side of a torch storage on the `tpu` device.
pub struct Storage {
    dtype: DType,
    device: usize,
    address: Address,
    value: Mutex<Slot>,
}

/// What a storage holds: its element count, and its value in order,
/// padded, or both (the compact form made from the padded one on first
/// need). No value until first written: `torch.empty` allocates nothing,
/// and an unwritten storage reads as zeros.
struct Slot {
    numel: usize,
    compact: Option<Tensor>,
    padded: Option<Padded>,
}

/// Live storages by address: torch's C++ core knows a storage by its data
/// pointer only.
static LIVE: Mutex<Option<HashMap<u64, Weak<Storage>>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashMap<u64, Weak<Storage>>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live storage at `address`, if there is one.
pub fn find(address: u64) -> Option<Arc<Storage>> {
    live().as_ref()?.get(&address)?.upgrade()
}

/// A value held padded along one dim: the storage's elements are, in
/// row-major order, the first `len` entries of `value` along `dim`. The
/// padding holds zeros.
#[derive(Clone)]
pub struct Padded {
    /// The padded value; `value.shape()[dim]` is the capacity.
    pub value: Tensor,
    /// The padded dim.
    pub dim: usize,
    /// How much of `dim` is the storage's.
    pub len: usize,
}

impl Padded {
    /// The shape of the elements it holds (`len` along `dim`).
    pub fn shape(&self) -> Vec<usize> {
        let mut dims = self.value.shape().dims().to_vec();
        dims[self.dim] = self.len;
        dims
    }

    /// The capacity along `dim`.
    pub fn capacity(&self) -> usize {
        self.value.shape().dims()[self.dim]
    }

    /// The held elements without the padding.
    fn compact(&self) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("dim", self.dim)
            .with("start", 0)
            .with("end", self.len);
        call1(op!("slice"), std::slice::from_ref(&self.value), &attrs)
    }

    /// The window of the held elements that `layout` views, read with a
    /// run-time start along the padded dim; `None` unless `layout` is a
    /// box (an in-order, unit-step window) that stops short of `len`.
    fn window(&self, layout: &Layout) -> Result<Option<Tensor>> {
        let shape = self.shape();
        let Some(window) = as_box(layout, &shape) else {
            return Ok(None);
        };
        let (start, len) = window[self.dim];
        if len == self.len {
            return Ok(None);
        }
        let Device::Tpu(device) = self.value.device() else {
            return Ok(None);
        };
        let at = crate::kernels::scalar(DType::I64, start as f64, device)?;
        let attrs = Attrs::new().with("dim", self.dim).with("length", len);
        let mut x = call1(op!("dynamic_slice"), &[self.value.clone(), at], &attrs)?;
        for (dim, &(start, len)) in window.iter().enumerate() {
            if dim != self.dim && len != shape[dim] {
                let attrs = Attrs::new()
                    .with("dim", dim)
                    .with("start", start)
                    .with("end", start + len);
                x = call1(op!("slice"), &[x], &attrs)?;
            }
        }
        if x.shape().dims() != layout.size.as_slice() {
            x = call1(
                op!("reshape"),
                &[x],
                &Attrs::new().with("shape", layout.size.as_slice()),
            )?;
        }
        Ok(Some(x))
    }
}

/// The box `layout` views in a row-major tensor of `shape`: each dim's
/// start and length. `None` when the view is not one (a transpose, a
/// step, a broadcast).
fn as_box(layout: &Layout, shape: &[usize]) -> Option<Vec<(usize, usize)>> {
    let strides = contiguous_strides(shape);
    let mut rest = layout.offset;
    let mut starts = Vec::with_capacity(shape.len());
    for &s in &strides {
        starts.push(rest / s);
        rest %= s;
    }
    let mut lens = vec![1; shape.len()];
    let mut next = 0;
    for (&n, &s) in layout.size.iter().zip(&layout.stride) {
        if n == 1 {
            continue;
        }
        let dim = (next..shape.len()).find(|&d| strides[d] == s && shape[d] > 1)?;
        lens[dim] = n;
        next = dim + 1;
    }
    let inside = (0..shape.len()).all(|d| starts[d] + lens[d] <= shape[d]);
    inside.then(|| starts.into_iter().zip(lens).collect())
}

impl Storage {
    /// A storage of `numel` elements of `dtype`, not yet written.
    pub fn empty(dtype: DType, numel: usize, device: usize) -> Result<Arc<Storage>> {
        let storage = Arc::new(Storage {
            dtype,
            device,
            address: Address::allocate(bytes_of(dtype, numel), device)?,
            value: Mutex::new(Slot {
                numel,
                compact: None,
                padded: None,
            }),
        });
        live()
            .get_or_insert_with(HashMap::new)
            .insert(storage.address(), Arc::downgrade(&storage));
        Ok(storage)
    }

    /// A storage holding `padded`'s elements.
    pub fn holding_padded(padded: Padded) -> Result<Arc<Storage>> {
        let Device::Tpu(device) = padded.value.device() else {
            return Err(BridgeError::internal(
                "a tpu storage cannot hold a cpu tensor",
            ));
        };
        let numel = padded.shape().iter().product();
        let storage = Storage::empty(padded.value.dtype(), numel, device)?;
        crate::writes::note(&padded.value);
        storage.lock().padded = Some(padded);
        Ok(storage)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.value.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The padded value, when the storage holds one.
    pub fn padded(&self) -> Option<Padded> {
        self.lock().padded.clone()
    }

    /// The padded value, when the storage holds one and `layout` views all
    /// of its elements in their shape.
    pub fn padded_as(&self, layout: &Layout) -> Option<Padded> {
        self.padded()
            .filter(|p| p.shape() == layout.size && layout.covers(self.numel()))
    }

    /// A storage holding `value`'s elements.
    pub fn holding(value: Tensor) -> Result<Arc<Storage>> {
        let Device::Tpu(device) = value.device() else {
            return Err(BridgeError::internal(
                "a tpu storage cannot hold a cpu tensor",
            ));
        };
        let storage = Storage::empty(value.dtype(), value.shape().numel(), device)?;
        crate::writes::note(&value);
        storage.lock().compact = Some(value);
        Ok(storage)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.lock().numel
    }

    /// The `tpu` device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes the storage holds.
    pub fn nbytes(&self) -> usize {
        bytes_of(self.dtype, self.numel())
    }

    /// The fake host address torch sees as the storage's data pointer.
    pub fn address(&self) -> u64 {
        self.address.get()
    }

    /// The current value (zeros when never written).
    pub fn value(&self) -> Result<Tensor> {
        let mut slot = self.lock();
        if let Some(v) = slot.compact.as_ref() {
            return Ok(v.clone());
        }
        let value = match slot.padded.as_ref() {
            Some(padded) => padded.compact()?,
            None => full(self.dtype, &[slot.numel], 0.0, self.device)?,
        };
        slot.compact = Some(value.clone());
        Ok(value)
    }

    /// Binds a new value (same element count and type).
    pub fn set(&self, value: Tensor) -> Result<()> {
        let mut slot = self.lock();
        if value.shape().numel() != slot.numel || value.dtype() != self.dtype {
            return Err(BridgeError::internal(format!(
                "storage of {} x {} cannot hold {}",
                slot.numel,
                self.dtype,
                value.ty()
            )));
        }
        crate::writes::note(&value);
        crate::recording::note_write(slot.compact.as_ref(), &value);
        slot.compact = Some(value);
        slot.padded = None;
        Ok(())
    }

    /// True once written.
    pub fn is_written(&self) -> bool {
        let slot = self.lock();
        slot.compact.is_some() || slot.padded.is_some()
    }
}

/// What a torch storage object carries: its [`Storage`], shared with the
/// views read from it.
#[pyclass(name = "Storage", module = "torch_tpu_rs._C", frozen)]
pub struct Handle(pub Arc<Storage>);

#[pymethods]
impl Handle {
    /// Element count (for debugging from Python).
    #[getter(numel)]
    fn py_numel(&self) -> usize {
        self.0.numel()
    }

    fn __repr__(&self) -> String {
        let s = &self.0;
        format!(
            "Storage({} x {}, tpu:{}, {})",
            s.numel(),
            s.dtype,
            s.device,
            if s.is_written() {
                "written"
            } else {
                "unwritten"
            }
        )
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(map) = live().as_mut() {
            map.remove(&self.address());
        }
    }
}

/// Resizes the storage at `address` to `nbytes` (torch's
/// `untyped_storage().resize_`, which FSDP uses to free and regrow
/// parameters): the elements both sizes hold keep their values, new ones
/// read as zeros. The address stays: each storage owns a range as large as
/// a storage may grow.
pub fn resize(address: u64, nbytes: usize) -> Result<()> {
    let storage = find(address)
        .ok_or_else(|| BridgeError::internal(format!("no live tpu storage at {address:#x}")))?;
    let (dtype, device) = (storage.dtype, storage.device);
    let size = dtype.size_in_bytes();
    if nbytes % size != 0 {
        return Err(BridgeError::Unsupported(format!(
            "cannot resize a {dtype} tpu storage to {nbytes} bytes: not a whole number of {size}-byte elements"
        )));
    }
    crate::address::check_size(nbytes, device)?;
    let numel = nbytes / size;
    let mut slot = storage.lock();
    if numel == slot.numel {
        return Ok(());
    }
    let old = match (&slot.compact, &slot.padded) {
        (Some(v), _) => Some(v.clone()),
        (None, Some(padded)) => Some(padded.compact()?),
        (None, None) => None,
    };
    let resized = match old {
        // Unwritten (or freed to nothing): reads as zeros at any size.
        None => None,
        Some(_) if numel == 0 => None,
        Some(old) => {
            let flat = call1(
                op!("reshape"),
                &[old],
                &Attrs::new().with("shape", vec![slot.numel]),
            )?;
            Some(if numel < slot.numel {
                let attrs = Attrs::new()
                    .with("dim", 0)
                    .with("start", 0)
                    .with("end", numel);
                call1(op!("slice"), &[flat], &attrs)?
            } else {
                let pad = vec![0i64, (numel - slot.numel) as i64];
                call1(
                    op!("pad"),
                    &[flat],
                    &Attrs::new().with("pad", pad).with("value", 0.0),
                )?
            })
        }
    };
    if let Some(value) = &resized {
        crate::writes::note(value);
        crate::recording::note_write(slot.compact.as_ref(), value);
    }
    slot.numel = numel;
    slot.compact = resized;
    slot.padded = None;
    Ok(())
}

/// Bytes of `numel` elements of `dtype`.
fn bytes_of(dtype: DType, numel: usize) -> usize {
    numel.saturating_mul(dtype.size_in_bytes())
}

/// The value a view of `storage` sees, shaped `layout.size`.
pub fn read(storage: &Storage, layout: &Layout) -> Result<Tensor> {
    if layout.numel() == 0 {
        return full(storage.dtype, &layout.size, 0.0, storage.device);
    }
    if let Some(padded) = storage.padded()
        && let Some(window) = padded.window(layout)?
    {
        return Ok(window);
    }
    let value = storage.value()?;
    if layout.covers(storage.numel()) {
        if value.shape().dims() == layout.size.as_slice() {
            return Ok(value);
        }
        let attrs = Attrs::new().with("shape", layout.size.as_slice());
        return call1(op!("reshape"), &[value], &attrs);
    }
    if layout.offset > 0 {
        return read_window(value, layout);
    }
    call1(op!("as_strided"), &[value], &layout.attrs())
}

/// A view at a nonzero offset, read from the window of the storage that
/// starts there, the start given as a device scalar: its programs serve
/// every offset, where one built per offset would compile again for each
/// slice of a split or a concatenation's backward (hundreds in a DenseNet).
fn read_window(value: Tensor, layout: &Layout) -> Result<Tensor> {
    let Device::Tpu(device) = value.device() else {
        return call1(op!("as_strided"), &[value], &layout.attrs());
    };
    let at_start = Layout {
        offset: 0,
        ..layout.clone()
    };
    let flat = Attrs::new().with("shape", vec![value.shape().numel()]);
    let flat = call1(op!("reshape"), &[value], &flat)?;
    let start = tpu_core::scalars::scalar(DType::I64, layout.offset as f64, Device::Tpu(device))?;
    let window = Attrs::new()
        .with("dim", 0i64)
        .with("length", at_start.extent());
    let window = call1(op!("dynamic_slice"), &[flat, start], &window)?;
    call1(op!("as_strided"), &[window], &at_start.attrs())
}

/// The value of view `layout` of `storage` read as `dtype`: the storage's
/// own dtype, or the other side of a complex dtype and its part type: a
/// complex element is two elements (real, imaginary) of a part-typed view
/// (`view_as_real`, `z.real`), and two part-typed elements one complex
/// element of a complex view (`view_as_complex`).
pub fn read_as(storage: &Storage, layout: &Layout, dtype: DType) -> Result<Tensor> {
    if dtype == storage.dtype() {
        return read(storage, layout);
    }
    let flat = reinterpreted(storage, dtype)?;
    if layout.numel() == 0 {
        return full(dtype, &layout.size, 0.0, storage.device);
    }
    call1(op!("as_strided"), &[flat], &layout.attrs())
}

/// [`write`] through a view read as `dtype` ([`read_as`]).
pub fn write_as(storage: &Storage, layout: &Layout, dtype: DType, src: Tensor) -> Result<()> {
    if dtype == storage.dtype() {
        return write(storage, layout, src);
    }
    let flat = reinterpreted(storage, dtype)?;
    if layout.numel() == 0 {
        return Ok(());
    }
    let written = call1(op!("as_strided_scatter"), &[flat, src], &layout.attrs())?;
    let held = if dtype.is_complex() {
        parts_of(written)?
    } else {
        complex_of(written)?
    };
    let shape = storage.value()?.shape().dims().to_vec();
    storage.set(call1(
        op!("reshape"),
        &[held],
        &Attrs::new().with("shape", shape),
    )?)
}

/// The storage's values as a flat run of `dtype` elements, where `dtype`
/// and the storage's dtype are a complex type and its part type.
fn reinterpreted(storage: &Storage, dtype: DType) -> Result<Tensor> {
    let held = storage.dtype();
    let pair = if held.is_complex() {
        dtype == held.real_part()
    } else {
        dtype.is_complex() && dtype.real_part() == held && storage.numel() % 2 == 0
    };
    if !pair {
        return Err(BridgeError::Unsupported(format!(
            "a {dtype} view of a {held} tpu storage (Tensor.view(dtype)) is not supported"
        )));
    }
    let value = storage.value()?;
    let value = call1(
        op!("reshape"),
        &[value],
        &Attrs::new().with("shape", vec![storage.numel()]),
    )?;
    if held.is_complex() {
        parts_of(value)
    } else {
        complex_of(value)
    }
}

/// Complex values as a flat run of their (real, imaginary) parts.
fn parts_of(z: Tensor) -> Result<Tensor> {
    let n = z.shape().numel();
    let z = call1(op!("reshape"), &[z], &Attrs::new().with("shape", vec![n]))?;
    let re = call1(op!("real"), std::slice::from_ref(&z), &Attrs::new())?;
    let im = call1(op!("imag"), &[z], &Attrs::new())?;
    let pairs = call1(op!("stack"), &[re, im], &Attrs::new().with("dim", 1i64))?;
    call1(
        op!("reshape"),
        &[pairs],
        &Attrs::new().with("shape", vec![2 * n]),
    )
}

/// A flat run of (real, imaginary) parts as complex values.
fn complex_of(parts: Tensor) -> Result<Tensor> {
    let n = parts.shape().numel() / 2;
    let pairs = call1(
        op!("reshape"),
        &[parts],
        &Attrs::new().with("shape", vec![n, 2]),
    )?;
    let part = |k: i64| {
        let attrs = Attrs::new().with("dim", 1i64).with("index", k);
        call1(op!("select"), std::slice::from_ref(&pairs), &attrs)
    };
    call1(op!("complex"), &[part(0)?, part(1)?], &Attrs::new())
}

/// Writes `src` (shaped `layout.size`, the storage's dtype) through a view.
pub fn write(storage: &Storage, layout: &Layout, src: Tensor) -> Result<()> {
    if layout.numel() == 0 {
        return Ok(());
    }
    if layout.covers(storage.numel()) {
        return storage.set(src);
    }
    let base = storage.value()?;
    let out = call1(op!("as_strided_scatter"), &[base, src], &layout.attrs())?;
    storage.set(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(size: &[usize], stride: &[usize], offset: usize) -> Layout {
        Layout {
            size: size.to_vec(),
            stride: stride.to_vec(),
            offset,
        }
    }

    #[test]
    fn windows_are_boxes_with_their_starts() {
        let shape = [2, 5, 3];
        // x[:, 4:5] and x[1, 1:4, 2] of a [2, 5, 3] tensor.
        assert_eq!(
            as_box(&view(&[2, 1, 3], &[15, 3, 1], 12), &shape),
            Some(vec![(0, 2), (4, 1), (0, 3)])
        );
        assert_eq!(
            as_box(&view(&[3], &[3], 15 + 3 + 2), &shape),
            Some(vec![(1, 1), (1, 3), (2, 1)])
        );
        // The whole tensor, and a size-1 dim with any stride.
        assert_eq!(
            as_box(&view(&[2, 5, 1, 3], &[15, 3, 7, 1], 0), &shape),
            Some(vec![(0, 2), (0, 5), (0, 3)])
        );
    }

    #[test]
    fn transposes_steps_and_broadcasts_are_not_boxes() {
        let shape = [2, 5, 3];
        assert_eq!(as_box(&view(&[3, 5], &[1, 3], 0), &shape), None);
        assert_eq!(as_box(&view(&[2, 3], &[15, 6], 0), &shape), None);
        assert_eq!(as_box(&view(&[4, 3], &[0, 1], 0), &shape), None);
        // Runs past the end of its dim.
        assert_eq!(as_box(&view(&[4], &[3], 6), &shape), None);
    }
}
