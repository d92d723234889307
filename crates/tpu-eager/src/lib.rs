//! Eager execution policies of tpu-rs: Strict (one compiled op at a time), Debug (blocking, checked) and DeferAndFuse (ops recorded and compiled as fused graphs).
#![warn(missing_docs)]
