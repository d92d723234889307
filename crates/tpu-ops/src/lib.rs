//! Op kernels of tpu-rs: each op one record (shape inference, StableHLO lowering, CPU reference, backward rule) submitted with `inventory` into tpu-core's dispatcher.
#![warn(missing_docs)]
