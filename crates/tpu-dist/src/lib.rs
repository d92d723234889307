//! Distributed tpu-rs: collectives over a client's devices and multi-process execution.
#![warn(missing_docs)]
