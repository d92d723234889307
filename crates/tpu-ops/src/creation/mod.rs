//! Creation ops: tensors from attributes alone.

mod fill;
mod ranges;
