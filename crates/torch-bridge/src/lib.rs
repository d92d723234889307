//! The PyTorch bridge of tpu-rs: a Python extension that gives PyTorch a `tpu` device and a `tpu_dist` distributed backend.
#![warn(missing_docs)]
