//! Random ops: counter-based, from an explicit key, so the same key gives the same numbers on every device.

mod bits;
mod ops;
