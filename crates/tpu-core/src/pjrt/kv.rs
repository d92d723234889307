//! A key-value store handed to a plugin at client creation. Plugins that
//! run multi-host collectives themselves (libtpu on a pod slice, the CUDA
//! plugin) exchange their topology through it; tpu-dist's rendezvous
//! store is the usual one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use pjrt_sys as sys;

/// What PJRT's key-value callbacks need.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to
    /// set it.
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String>;
    /// Sets `key` to `value`.
    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), String>;
}

/// A shared store, as [`super::ClientOptions`] carries it.
#[derive(Clone)]
pub struct KeyValueStoreHandle(pub Arc<dyn KeyValueStore>);

impl fmt::Debug for KeyValueStoreHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyValueStore")
    }
}

impl PartialEq for KeyValueStoreHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for KeyValueStoreHandle {}

/// The user argument of both callbacks: a thin pointer to the store,
/// owned by the client for its whole life.
pub(crate) type UserArg = Box<Arc<dyn KeyValueStore>>;

/// Reads a `(pointer, length)` string from the plugin.
///
/// # Safety
/// `ptr` must point to `len` readable bytes (or be anything when `len` is 0).
unsafe fn bytes<'a>(ptr: *const std::os::raw::c_char, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller guarantees `len` readable bytes at `ptr`.
    unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
}

/// An error the plugin owns, made with its own constructor.
///
/// # Safety
/// `make` must be the `callback_error` the plugin passed in its arguments.
unsafe fn plugin_error(make: *mut sys::PJRT_CallbackError, message: &str) -> *mut sys::PJRT_Error {
    // SAFETY: `make` is null or points to the plugin's constructor.
    let Some(make) = (unsafe { make.as_ref() }).and_then(|f| *f) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the constructor copies the message before returning.
    unsafe {
        make(
            sys::PJRT_Error_Code_PJRT_Error_Code_UNAVAILABLE,
            message.as_ptr().cast(),
            message.len(),
        )
    }
}

/// Values handed to the plugin carry their length in a prefix, so the
/// deleter (which gets only the pointer) can free them.
const PREFIX: usize = std::mem::size_of::<usize>();

unsafe extern "C" fn delete_value(value: *mut std::os::raw::c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `get` below: PREFIX bytes after the start
    // of a leaked boxed slice whose total length is stored in the prefix.
    unsafe {
        let start = value.cast::<u8>().sub(PREFIX);
        let total = start.cast::<usize>().read_unaligned();
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            start, total,
        )));
    }
}

/// PJRT's get callback over a [`KeyValueStore`].
pub(crate) unsafe extern "C" fn get(
    args: *mut sys::PJRT_KeyValueGetCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes valid, exclusive arguments.
    let args = unsafe { &mut *args };
    // SAFETY: user_arg is the `UserArg` the client registered and keeps
    // alive as long as the plugin may call back.
    let store = unsafe { &*(args.user_arg as *const Arc<dyn KeyValueStore>) };
    // SAFETY: key and key_size describe the plugin's key.
    let key = String::from_utf8_lossy(unsafe { bytes(args.key, args.key_size) }).into_owned();
    let timeout = Duration::from_millis(u64::try_from(args.timeout_in_ms).unwrap_or(0));
    match store.get(&key, timeout) {
        Ok(value) => {
            let total = PREFIX + value.len();
            let mut owned = vec![0u8; total].into_boxed_slice();
            owned[..PREFIX].copy_from_slice(&total.to_ne_bytes());
            owned[PREFIX..].copy_from_slice(&value);
            let start = Box::into_raw(owned).cast::<u8>();
            // SAFETY: PREFIX is within the allocation of `total` bytes.
            args.value = unsafe { start.add(PREFIX) }.cast();
            args.value_size = value.len();
            args.value_deleter_callback = Some(delete_value);
            std::ptr::null_mut()
        }
        // SAFETY: callback_error is the plugin's constructor.
        Err(e) => unsafe { plugin_error(args.callback_error, &format!("key `{key}`: {e}")) },
    }
}

/// PJRT's put callback over a [`KeyValueStore`].
pub(crate) unsafe extern "C" fn put(
    args: *mut sys::PJRT_KeyValuePutCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes valid, exclusive arguments.
    let args = unsafe { &mut *args };
    // SAFETY: as in `get`, user_arg is the client's live `UserArg`.
    let store = unsafe { &*(args.user_arg as *const Arc<dyn KeyValueStore>) };
    // SAFETY: key and key_size describe the plugin's key.
    let key = String::from_utf8_lossy(unsafe { bytes(args.key, args.key_size) }).into_owned();
    // SAFETY: value and value_size describe the plugin's value.
    let value = unsafe { bytes(args.value, args.value_size) };
    match store.put(&key, value) {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: callback_error is the plugin's constructor.
        Err(e) => unsafe { plugin_error(args.callback_error, &format!("key `{key}`: {e}")) },
    }
}
