//! Host-side addresses for tpu storages.
//!
//! PyTorch tells storages apart by their data pointer (`data_ptr()`,
//! `untyped_storage().data_ptr()`): checkpoint writers find shared
//! tensors by it, and model code detects tied weights with it. A tpu
//! storage's bytes live on the device, so each live storage gets a range of
//! fake addresses of its own instead. The ranges lie above the 47-bit user
//! address space of every 64-bit host, so they can never equal a real
//! allocation; nothing dereferences them (tpu data is read through the
//! bridge, never through the pointer).

use std::sync::Mutex;

use crate::error::{BridgeError, Result};

/// The first fake address.
const BASE: u64 = 1 << 62;
/// Each storage owns a slot of this many bytes, so storages never overlap.
const SLOT_BYTES: u64 = 1 << 40;
/// Slots between `BASE` and `2^63`.
const SLOTS: u64 = (1 << 62) / SLOT_BYTES;

struct Slots {
    next: u64,
    free: Vec<u64>,
}

static SLOTS_IN_USE: Mutex<Slots> = Mutex::new(Slots {
    next: 0,
    free: Vec::new(),
});

/// A fake address range owned by one storage; released when dropped.
#[derive(Debug)]
pub struct Address {
    slot: u64,
}

impl Address {
    /// A range for a storage of `nbytes` on `tpu:device`.
    pub fn allocate(nbytes: usize, device: usize) -> Result<Address> {
        check_size(nbytes, device)?;
        let mut slots = SLOTS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.free.pop() {
            Some(slot) => slot,
            None if slots.next < SLOTS => {
                slots.next += 1;
                slots.next - 1
            }
            None => {
                return Err(BridgeError::internal(format!(
                    "more than {SLOTS} tpu storages are alive at once"
                )));
            }
        };
        Ok(Address { slot })
    }

    /// The first byte's address.
    pub fn get(&self) -> u64 {
        BASE + self.slot * SLOT_BYTES
    }
}

/// Whether one storage may hold `nbytes` (its range is that large); else
/// out of memory, naming the device and the bytes.
pub fn check_size(nbytes: usize, device: usize) -> Result<()> {
    if nbytes as u64 > SLOT_BYTES {
        return Err(BridgeError::OutOfMemory(format!(
            "tpu:{device} out of memory: tried to allocate {} ({nbytes} bytes); \
             one tpu storage holds at most {}",
            human_bytes(nbytes as u64),
            human_bytes(SLOT_BYTES)
        )));
    }
    Ok(())
}

/// `bytes` as CUDA's messages write it (`3.64 TiB`).
fn human_bytes(bytes: u64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.2} {}", units[unit])
    }
}

impl Drop for Address {
    fn drop(&mut self) {
        SLOTS_IN_USE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(self.slot);
    }
}
