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
