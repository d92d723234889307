//! Device buffers: owned handles to device memory.

use std::sync::Arc;

use pjrt_sys as sys;

use super::client::ClientInner;
use super::event::Event;
use super::ffi::{Padded, pjrt_call};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::{DType, Shape};

/// The PJRT element type of a dtype.
pub(crate) fn pjrt_type(dtype: DType) -> sys::PJRT_Buffer_Type {
    match dtype {
        DType::Bool => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
        DType::I8 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
        DType::I16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S16,
        DType::I32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
        DType::I64 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S64,
        DType::U8 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U8,
        DType::U32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U32,
        DType::F16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
        DType::BF16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
        DType::F32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
        DType::F64 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F64,
        DType::C64 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C64,
        DType::C128 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C128,
    }
}

/// A buffer on one device. Dropping it frees the device memory (once any
/// computation using it has finished).
pub struct Buffer {
    raw: *mut sys::PJRT_Buffer,
    pub(crate) client: Arc<ClientInner>,
    dtype: DType,
    shape: Shape,
    device: usize,
}

// SAFETY: PJRT buffers are thread-safe handles.
unsafe impl Send for Buffer {}
// SAFETY: as above; `&Buffer` only reads or enqueues transfers.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn from_raw(
        client: Arc<ClientInner>,
        raw: *mut sys::PJRT_Buffer,
        dtype: DType,
        shape: Shape,
        device: usize,
    ) -> Buffer {
        let bytes = (shape.numel() * dtype.size_in_bytes()) as u64;
        crate::metrics::device_alloc(bytes);
        crate::memory::alloc(device, bytes);
        Buffer {
            raw,
            client,
            dtype,
            shape,
            device,
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::PJRT_Buffer {
        self.raw
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Index of the device holding the buffer.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes of the dense host copy.
    pub fn size_in_bytes(&self) -> usize {
        self.shape
            .numel()
            .saturating_mul(self.dtype.size_in_bytes())
    }

    /// Bytes the buffer occupies on the device.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = Padded::<sys::PJRT_Buffer_OnDeviceSizeInBytes_Args>::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api, PJRT_Buffer_OnDeviceSizeInBytes, &mut args)?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The buffer's address in device memory: equal addresses mean shared
    /// memory (how donation is observed). Never dereference it.
    pub fn device_address(&self) -> Result<usize> {
        let mut args = Padded::<sys::PJRT_Buffer_UnsafePointer_Args>::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api, PJRT_Buffer_UnsafePointer, &mut args)?;
        Ok(args.buffer_pointer)
    }

    /// True once the buffer has been donated to an execution or deleted.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = Padded::<sys::PJRT_Buffer_IsDeleted_Args>::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api, PJRT_Buffer_IsDeleted, &mut args)?;
        Ok(args.is_deleted)
    }

    /// An event that fires when the buffer's contents are computed.
    pub fn ready_event(&self) -> Result<Event> {
        let mut args = Padded::<sys::PJRT_Buffer_ReadyEvent_Args>::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api, PJRT_Buffer_ReadyEvent, &mut args)?;
        Event::from_raw(self.client.api, args.event).ok_or_else(|| Error::Pjrt {
            call: "PJRT_Buffer_ReadyEvent",
            plugin: self.client.api.plugin.to_string(),
            code: crate::ErrorCode::Internal,
            message: "the plugin returned no event".into(),
        })
    }

    /// Blocks until the contents are computed; returns the computation's error.
    pub fn block_until_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }

    /// Copies the contents into `dst`, which must be exactly
    /// [`Buffer::size_in_bytes`] long.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        crate::host::check_len(dst.len(), self.dtype, &self.shape)?;
        if dst.is_empty() {
            return Ok(());
        }
        // Includes waiting for the computation that produces the buffer.
        let mut span = crate::profile::span("transfer", "device_to_host");
        span.arg("bytes", dst.len());
        crate::metrics::record_to_host(dst.len() as u64);
        let mut args = Padded::<sys::PJRT_Buffer_ToHostBuffer_Args>::new();
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        pjrt_call!(self.client.api, PJRT_Buffer_ToHostBuffer, &mut args)?;
        match Event::from_raw(self.client.api, args.event) {
            Some(done) => done.wait(),
            None => Ok(()),
        }
    }

    /// The contents as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.size_in_bytes()];
        self.copy_to_host(&mut bytes)?;
        Ok(bytes)
    }

    /// The contents as a typed vector; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                expected: T::DTYPE,
                actual: self.dtype,
            });
        }
        Ok(T::from_bytes(&self.to_bytes()?))
    }

    /// Copies the buffer to device `device` of the same client.
    pub fn copy_to_device(&self, device: usize) -> Result<Buffer> {
        let dst = self.client.device(device)?;
        let mut span = crate::profile::span("transfer", "device_to_device");
        span.arg("bytes", self.size_in_bytes());
        let mut args = Padded::<sys::PJRT_Buffer_CopyToDevice_Args>::new();
        args.buffer = self.raw;
        args.dst_device = dst;
        pjrt_call!(self.client.api, PJRT_Buffer_CopyToDevice, &mut args)?;
        Ok(Buffer::from_raw(
            self.client.clone(),
            args.dst_buffer,
            self.dtype,
            self.shape.clone(),
            device,
        ))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        crate::metrics::device_free(self.size_in_bytes() as u64);
        crate::memory::free(self.device, self.size_in_bytes() as u64);
        let mut args = Padded::<sys::PJRT_Buffer_Destroy_Args>::new();
        args.buffer = self.raw;
        if let Err(e) = pjrt_call!(self.client.api, PJRT_Buffer_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT buffer failed: {e}");
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({}{} on {}:{})",
            self.dtype, self.shape, self.client.platform_name, self.device
        )
    }
}
