//! Storages PyTorch's C++ core allocates itself through the tpu allocator
//! (`native/allocator.cc`), as `torch.UntypedStorage(n, device="tpu")`
//! does: untyped bytes, kept here until the allocator's deleter releases
//! them. Storages the bridge makes for tensors carry their [`Storage`] on
//! the torch storage object instead.

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
    let count = crate::device::device_count();
    if device >= count {
        return Err(BridgeError::Device(format!(
            "tpu:{device} does not exist: this process sees {count} tpu device(s)"
        )));
    }
    let storage = Storage::empty(DType::U8, nbytes, device)?;
    let address = storage.address();
    owned_map()
        .get_or_insert_with(HashMap::new)
        .insert(address, storage);
    Ok(address)
}

/// Drops the allocator's hold on the storage at `address`.
pub fn release(address: u64) {
    let storage = owned_map().as_mut().and_then(|m| m.remove(&address));
    drop(storage);
}
