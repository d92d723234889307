//! Torch tensors over tpu storages made through DLPack: `torch.from_dlpack`
//! builds the tensor and its storage in one call, where binding a storage
//! to an empty tensor (`set_`) goes through the dispatcher's boxed path and
//! costs several times more. DLPack's `kDLExtDev` is torch's PrivateUse1
//! device, which is `tpu`.
//!
//! The description's data pointer is the storage's fake address
//! ([`crate::address`]); nothing dereferences it.

use std::ffi::{CStr, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use tpu_core::DType;

use crate::layout::Layout;

/// `DLDeviceType::kDLExtDev`.
const EXT_DEV: i32 = 12;

/// The capsule name DLPack consumers look for; a consumer renames the
/// capsule once it owns the description.
const NAME: &CStr = c"dltensor";

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's (unversioned) `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// A description with the sizes and strides it points to (sizes first).
#[repr(C)]
struct Described {
    managed: DlManagedTensor,
    dims: Vec<i64>,
}

/// DLPack's type code and bit width of `dtype`.
fn dl_dtype(dtype: DType) -> DlDataType {
    // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6.
    let code = match dtype {
        DType::C64 | DType::C128 => 5,
        DType::Bool => 6,
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::U8 | DType::U32 => 1,
        DType::BF16 => 4,
        DType::F16 | DType::F32 | DType::F64 => 2,
    };
    DlDataType {
        code,
        bits: (dtype.size_in_bytes() * 8) as u8,
        lanes: 1,
    }
}

/// Frees a description; torch calls it when the storage made from it dies.
unsafe extern "C" fn free_described(managed: *mut DlManagedTensor) {
    // SAFETY: `managed` is the first field of a `Described` that
    // `capsule` leaked with `Box::into_raw` (both are `repr(C)`), and DLPack
    // calls the deleter once.
    drop(unsafe { Box::from_raw(managed.cast::<Described>()) });
}

/// The capsule's destructor: frees the description unless a consumer took
/// it (and renamed the capsule).
unsafe extern "C" fn free_unconsumed(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls a capsule's destructor with the capsule, holding
    // the GIL; `PyCapsule_IsValid` checks the name without raising.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
            free_described(managed.cast());
        }
    }
}

/// A DLPack capsule describing `layout` over `numel` elements of `dtype` at
/// `address` on `tpu:device`; `None` unless the layout covers the elements
/// densely from the start (the storage torch makes from a description
/// spans exactly what the layout reaches).
pub fn capsule<'py>(
    py: Python<'py>,
    address: u64,
    device: usize,
    dtype: DType,
    numel: usize,
    layout: &Layout,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !layout.covers(numel) {
        return Ok(None);
    }
    let ndim = layout.size.len();
    let dims = layout
        .size
        .iter()
        .chain(&layout.stride)
        .map(|&d| d as i64)
        .collect();
    let mut described = Box::new(Described {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: std::ptr::without_provenance_mut(address as usize),
                device: DlDevice {
                    device_type: EXT_DEV,
                    device_id: device as i32,
                },
                ndim: ndim as i32,
                dtype: dl_dtype(dtype),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(free_described),
        },
        dims,
    });
    let sizes = described.dims.as_mut_ptr();
    described.managed.dl_tensor.shape = sizes;
    // SAFETY: `dims` holds `2 * ndim` entries, so `ndim` is within it (or
    // one past its end when empty, never read then).
    described.managed.dl_tensor.strides = unsafe { sizes.add(ndim) };
    let raw = Box::into_raw(described);
    // SAFETY: `raw` points to a live `Described` whose first field is the
    // `DLManagedTensor`; the capsule owns it until a consumer takes it, and
    // `free_unconsumed` frees it otherwise.
    let capsule = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(free_unconsumed)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so `raw` is still only ours.
        drop(unsafe { Box::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `PyCapsule_New` returned a new reference.
    Ok(Some(unsafe { Bound::from_owned_ptr(py, capsule) }))
}
