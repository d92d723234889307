//! Device memory per device: the bytes and buffers each device holds now,
//! their peaks, and the totals allocated and freed (what PyTorch's
//! `torch.accelerator.memory_stats` reports for a device).

use std::sync::atomic::{AtomicU64, Ordering};

/// Devices counted one by one; buffers on higher indices count only in the
/// process-wide totals of [`crate::metrics`].
const TRACKED: usize = 64;

struct Counters {
    bytes: AtomicU64,
    peak_bytes: AtomicU64,
    buffers: AtomicU64,
    peak_buffers: AtomicU64,
    allocated_bytes: AtomicU64,
    freed_bytes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
}

impl Counters {
    const fn new() -> Counters {
        Counters {
            bytes: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
            buffers: AtomicU64::new(0),
            peak_buffers: AtomicU64::new(0),
            allocated_bytes: AtomicU64::new(0),
            freed_bytes: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }
}

static DEVICES: [Counters; TRACKED] = [const { Counters::new() }; TRACKED];

/// One device's memory counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes in live buffers.
    pub bytes: u64,
    /// The most bytes live at once since start (or the last peak reset).
    pub peak_bytes: u64,
    /// Live buffers.
    pub buffers: u64,
    /// The most buffers live at once since start (or the last peak reset).
    pub peak_buffers: u64,
    /// Bytes allocated since start (or the last reset of the totals).
    pub allocated_bytes: u64,
    /// Bytes freed since start (or the last reset of the totals).
    pub freed_bytes: u64,
    /// Buffers allocated since start (or the last reset of the totals).
    pub allocations: u64,
    /// Buffers freed since start (or the last reset of the totals).
    pub frees: u64,
}

/// `device`'s counters now (zeros for a device never used).
pub fn device_memory(device: usize) -> DeviceMemory {
    let Some(c) = DEVICES.get(device) else {
        return DeviceMemory::default();
    };
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    DeviceMemory {
        bytes: load(&c.bytes),
        peak_bytes: load(&c.peak_bytes),
        buffers: load(&c.buffers),
        peak_buffers: load(&c.peak_buffers),
        allocated_bytes: load(&c.allocated_bytes),
        freed_bytes: load(&c.freed_bytes),
        allocations: load(&c.allocations),
        frees: load(&c.frees),
    }
}

/// Restarts `device`'s peaks at the current values.
pub fn reset_peaks(device: usize) {
    if let Some(c) = DEVICES.get(device) {
        let store = |peak: &AtomicU64, now: &AtomicU64| {
            peak.store(now.load(Ordering::Relaxed), Ordering::Relaxed)
        };
        store(&c.peak_bytes, &c.bytes);
        store(&c.peak_buffers, &c.buffers);
    }
}

/// Zeroes `device`'s totals allocated and freed.
pub fn reset_totals(device: usize) {
    if let Some(c) = DEVICES.get(device) {
        for total in [&c.allocated_bytes, &c.freed_bytes, &c.allocations, &c.frees] {
            total.store(0, Ordering::Relaxed);
        }
    }
}

pub(crate) fn alloc(device: usize, bytes: u64) {
    if let Some(c) = DEVICES.get(device) {
        let now = c.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        c.peak_bytes.fetch_max(now, Ordering::Relaxed);
        let buffers = c.buffers.fetch_add(1, Ordering::Relaxed) + 1;
        c.peak_buffers.fetch_max(buffers, Ordering::Relaxed);
        c.allocated_bytes.fetch_add(bytes, Ordering::Relaxed);
        c.allocations.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) fn free(device: usize, bytes: u64) {
    if let Some(c) = DEVICES.get(device) {
        let sub = |a: &AtomicU64, n: u64| {
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        };
        sub(&c.bytes, bytes);
        sub(&c.buffers, 1);
        c.freed_bytes.fetch_add(bytes, Ordering::Relaxed);
        c.frees.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_live_peak_and_totals_per_device() {
        // A device index no other test in this process touches.
        let d = TRACKED - 1;
        alloc(d, 100);
        alloc(d, 50);
        free(d, 100);
        let m = device_memory(d);
        assert_eq!(
            (m.bytes, m.peak_bytes, m.buffers, m.peak_buffers),
            (50, 150, 1, 2)
        );
        assert_eq!(
            (m.allocated_bytes, m.freed_bytes, m.allocations, m.frees),
            (150, 100, 2, 1)
        );
        reset_peaks(d);
        reset_totals(d);
        let m = device_memory(d);
        assert_eq!(
            (m.bytes, m.peak_bytes, m.buffers, m.peak_buffers),
            (50, 50, 1, 1)
        );
        assert_eq!(
            (m.allocated_bytes, m.freed_bytes, m.allocations, m.frees),
            (0, 0, 0, 0)
        );
        free(d, 50);
        assert_eq!(device_memory(d).bytes, 0);
        assert_eq!(device_memory(TRACKED + 5), DeviceMemory::default());
    }
}
