//! The one door into a PJRT plugin: padded argument structs, a checked
//! function table, and PJRT errors turned into [`Error`]s.
//!
//! pjrt-sys 0.2.0 was generated from PJRT header 0.54, and every current
//! plugin expects larger argument structs. Every call therefore goes through
//! [`Padded`]: the args sit in zeroed memory with a tail of spare bytes, and
//! `struct_size` claims the padded size, so a newer plugin reads zeros (its
//! defaults) for fields we do not know and may write past our end safely.

use std::ops::{Deref, DerefMut};

use pjrt_sys as sys;

use crate::error::{Error, ErrorCode, Result};

/// Spare zeroed bytes after every argument struct.
const TAIL_BYTES: usize = 256;

/// A PJRT argument struct: `struct_size` first, valid when all-zero.
///
/// # Safety
/// Implementors must be plain C structs for which the all-zero bit pattern
/// is a valid value (null pointers, zero integers, `None` callbacks).
pub(crate) unsafe trait Args: Sized {
    fn set_struct_size(&mut self, size: usize);
}

macro_rules! impl_args {
    ($($t:ident),* $(,)?) => {$(
        // SAFETY: bindgen C structs of pointers, integers, bools and optional
        // function pointers; all-zero is valid for each of them.
        unsafe impl Args for sys::$t {
            fn set_struct_size(&mut self, size: usize) {
                self.struct_size = size;
            }
        }
    )*};
}

impl_args!(
    PJRT_Error_Destroy_Args,
    PJRT_Error_Message_Args,
    PJRT_Error_GetCode_Args,
    PJRT_Plugin_Initialize_Args,
    PJRT_Plugin_Attributes_Args,
    PJRT_Client_Create_Args,
    PJRT_Client_Destroy_Args,
    PJRT_Client_PlatformName_Args,
    PJRT_Client_PlatformVersion_Args,
    PJRT_Client_AddressableDevices_Args,
    PJRT_Client_BufferFromHostBuffer_Args,
    PJRT_Client_Compile_Args,
    PJRT_Program,
    PJRT_Device_GetDescription_Args,
    PJRT_Device_MemoryStats_Args,
    PJRT_DeviceDescription_Id_Args,
    PJRT_DeviceDescription_ProcessIndex_Args,
    PJRT_DeviceDescription_Kind_Args,
    PJRT_DeviceDescription_DebugString_Args,
    PJRT_Event_Destroy_Args,
    PJRT_Event_Await_Args,
    PJRT_Event_IsReady_Args,
    PJRT_Event_OnReady_Args,
    PJRT_Buffer_Destroy_Args,
    PJRT_Buffer_ToHostBuffer_Args,
    PJRT_Buffer_CopyToDevice_Args,
    PJRT_Buffer_ReadyEvent_Args,
    PJRT_Buffer_IsDeleted_Args,
    PJRT_Buffer_OnDeviceSizeInBytes_Args,
    PJRT_Buffer_ElementType_Args,
    PJRT_Buffer_UnsafePointer_Args,
    PJRT_Buffer_Dimensions_Args,
    PJRT_LoadedExecutable_GetExecutable_Args,
    PJRT_Executable_NumOutputs_Args,
    PJRT_Executable_Destroy_Args,
    PJRT_Executable_Serialize_Args,
    PJRT_Executable_DeserializeAndLoad_Args,
    PJRT_LoadedExecutable_Destroy_Args,
    PJRT_LoadedExecutable_AddressableDevices_Args,
    PJRT_LoadedExecutable_Execute_Args,
    PJRT_ExecuteOptions,
);

/// Argument struct `T` in zeroed memory with a spare tail; `struct_size`
/// covers the tail.
#[repr(C)]
pub(crate) struct Padded<T: Args> {
    args: T,
    tail: [u8; TAIL_BYTES],
}

impl<T: Args> Padded<T> {
    /// Zeroed args, `struct_size` set to the padded size.
    pub(crate) fn new() -> Padded<T> {
        // SAFETY: `T: Args` promises all-zero is a valid `T`; the tail is bytes.
        let mut padded: Padded<T> = unsafe { std::mem::zeroed() };
        padded
            .args
            .set_struct_size(std::mem::size_of::<Padded<T>>());
        padded
    }

    /// A raw pointer to the args, as the plugin takes it.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        &mut self.args
    }
}

impl<T: Args> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.args
    }
}

impl<T: Args> DerefMut for Padded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.args
    }
}

/// A loaded plugin's function table. Copyable: the table lives as long as the
/// process, because plugins are never unloaded.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    raw: &'static sys::PJRT_Api,
    /// File name of the plugin, for messages.
    pub(crate) plugin: &'static str,
}

// SAFETY: the PJRT C API is thread-safe; the table itself is immutable.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

impl Api {
    /// Wraps a function table returned by `GetPjrtApi`.
    ///
    /// # Safety
    /// `raw` must point to a PJRT_Api that stays valid for the whole process.
    pub(crate) unsafe fn new(raw: *const sys::PJRT_Api, plugin: &'static str) -> Api {
        // SAFETY: the caller guarantees `raw` is valid for 'static.
        Api {
            raw: unsafe { &*raw },
            plugin,
        }
    }

    /// Size of the plugin's function table in bytes.
    pub(crate) fn table_size(&self) -> usize {
        self.raw.struct_size
    }

    /// The plugin's PJRT API version (major, minor).
    pub(crate) fn version(&self) -> (i32, i32) {
        let v = &self.raw.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    fn version_string(&self) -> String {
        let (major, minor) = self.version();
        format!("{major}.{minor}")
    }

    /// The function at `offset` in the table, if the table reaches it and the
    /// plugin filled it in.
    pub(crate) fn function<F: Copy>(
        &self,
        offset: usize,
        name: &'static str,
        get: impl FnOnce(&sys::PJRT_Api) -> Option<F>,
    ) -> Result<F> {
        let in_table = offset + std::mem::size_of::<usize>() <= self.table_size();
        in_table
            .then(|| get(self.raw))
            .flatten()
            .ok_or_else(|| Error::MissingFunction {
                function: name,
                plugin: self.plugin.to_string(),
                api: self.version_string(),
            })
    }

    /// Turns a returned `PJRT_Error*` into a `Result`, freeing the error.
    pub(crate) fn check(&self, call: &'static str, err: *mut sys::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let (code, message) = self.take_error(err);
        Err(Error::Pjrt {
            call,
            plugin: self.plugin.to_string(),
            code,
            message,
        })
    }

    fn take_error(&self, err: *mut sys::PJRT_Error) -> (ErrorCode, String) {
        let mut message = Padded::<sys::PJRT_Error_Message_Args>::new();
        message.error = err;
        // SAFETY: `err` is a live error returned by this plugin; the message
        // pointer stays valid until the error is destroyed below.
        let text = unsafe {
            if let Some(f) = self.raw.PJRT_Error_Message {
                f(message.as_mut_ptr());
                str_from_raw(message.message, message.message_size)
            } else {
                String::from("(plugin gave no message)")
            }
        };
        let mut code = Padded::<sys::PJRT_Error_GetCode_Args>::new();
        code.error = err;
        // SAFETY: as above; GetCode returns an error only for a bad `err`.
        let code = unsafe {
            match self.raw.PJRT_Error_GetCode {
                Some(f) if f(code.as_mut_ptr()).is_null() => ErrorCode::from_raw(code.code),
                _ => ErrorCode::Unknown,
            }
        };
        let mut destroy = Padded::<sys::PJRT_Error_Destroy_Args>::new();
        destroy.error = err;
        if let Some(f) = self.raw.PJRT_Error_Destroy {
            // SAFETY: `err` is destroyed exactly once, here.
            unsafe { f(destroy.as_mut_ptr()) };
        }
        (code, text)
    }
}

/// Calls a PJRT function by name through its table entry, checking the table
/// covers it and mapping the returned error.
///
/// `pjrt_call!(api, PJRT_Client_Create, &mut args)` evaluates to `Result<()>`.
macro_rules! pjrt_call {
    ($api:expr, $func:ident, $args:expr) => {{
        let api: $crate::pjrt::ffi::Api = $api;
        match api.function(
            ::std::mem::offset_of!(::pjrt_sys::PJRT_Api, $func),
            stringify!($func),
            |table| table.$func,
        ) {
            Ok(f) => {
                let args: &mut $crate::pjrt::ffi::Padded<_> = $args;
                // SAFETY: `args` is a zeroed, padded struct of the type this
                // entry takes, filled in by the caller with live handles.
                let err = unsafe { f(args.as_mut_ptr()) };
                api.check(stringify!($func), err)
            }
            Err(e) => Err(e),
        }
    }};
}
pub(crate) use pjrt_call;

/// Copies a (pointer, length) string owned by the plugin.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn str_from_raw(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the caller guarantees `len` readable bytes at `ptr`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies a (pointer, length) array owned by the plugin.
///
/// # Safety
/// `ptr` must be null or point to `len` valid elements.
pub(crate) unsafe fn slice_from_raw<T: Copy>(ptr: *const T, len: usize) -> Vec<T> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller guarantees `len` valid elements at `ptr`.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}
