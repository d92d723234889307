//! The host: dense tensors in RAM. [`HostBuffer`] is raw bytes, the staging
//! form of every transfer; [`HostTensor`] is the `ndarray` form that the
//! `cpu` reference device computes on.

mod buffer;
mod compare;
mod tensor;

pub use buffer::HostBuffer;
pub(crate) use buffer::check_len;
pub use compare::{Tolerance, assert_close};
pub use tensor::{HostData, HostTensor};

/// Bytes of memory the system reports available for new allocations
/// (`MemAvailable` in `/proc/meminfo`); `None` where it cannot tell.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
