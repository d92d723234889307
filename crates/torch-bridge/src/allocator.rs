//! Storages whose torch storage was made in C++: by PyTorch's core through
//! the tpu allocator (`native/allocator.cc`), as
//! `torch.UntypedStorage(n, device="tpu")` does (untyped bytes), or by a
//! native kernel for its result. Each is kept here until the allocator's
//! deleter releases its address. Storages the Python side makes carry
//! their [`Storage`] on the torch storage object instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tpu_core::DType;

use crate::error::{BridgeError, Result};
use crate::storage::Storage;

static OWNED: Mutex<Option<HashMap<u64, Arc<Storage>>>> = Mutex::new(None);

fn owned_map() -> std::sync::MutexGuard<'static, Option<HashMap<u64, Arc<Storage>>>> {
    OWNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A storage of `nbytes` untyped bytes on `tpu:device`, unwritten; its
/// address.
pub fn allocate(nbytes: usize, device: usize) -> Result<u64> {
    check_device(device)?;
    let storage = Storage::empty(DType::U8, nbytes, device)?;
    let address = storage.address();
    adopt(storage);
    Ok(address)
}

/// An error unless `tpu:device` exists: the plugin's reason when the
/// runtime cannot start, else the index against the device count.
pub fn check_device(device: usize) -> Result<()> {
    tpu_core::Runtime::global()?;
    let count = crate::device::device_count();
    if device >= count {
        return Err(BridgeError::Device(format!(
            "tpu:{device} does not exist (device index {device} is out of range: this process sees {count} tpu device(s))"
        )));
    }
    Ok(())
}

/// Drops the allocator's hold on the storage at `address`.
pub fn release(address: u64) {
    let storage = owned_map().as_mut().and_then(|m| m.remove(&address));
    drop(storage);
}

/// Keeps `storage` alive until the allocator's deleter releases its
/// address: a storage made for a tensor the C++ layer creates.
pub fn adopt(storage: Arc<Storage>) {
    owned_map()
        .get_or_insert_with(HashMap::new)
        .insert(storage.address(), storage);
}
