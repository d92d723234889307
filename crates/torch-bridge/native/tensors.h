// What every native kernel needs to hand tensors to the Rust core and take
// results back: dtype codes, tensor references, errors with PyTorch's
// classes, and new tensors over storages the Rust side made.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "rust/cxx.h"
#include "torch-bridge/src/native.rs.h"

namespace tpu_bridge {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// The bridge's code for a torch dtype, when tpu tensors can hold it.
std::optional<Dtype> dtype_code(c10::ScalarType t);

// The code for `t`; NotImplementedError naming `op` when there is none.
Dtype code(c10::ScalarType t, const char* op);

// The torch dtype of a code.
c10::ScalarType scalar_type(Dtype d);

// A tpu tensor as the Rust side reads it: its storage's address and view.
TensorRef tensor_ref(const at::Tensor& t, const char* op);

// Raises `message` with PyTorch's class for `failure` (nothing for None).
void raise(Failure failure, const rust::String& message);

// A new tpu tensor of `sizes` (contiguous, or with `strides` when given)
// owning the storage the Rust side made at `address`.
at::Tensor adopt(std::uintptr_t address, std::size_t nbytes,
                 c10::ScalarType dtype, c10::IntArrayRef sizes,
                 c10::DeviceIndex device, c10::IntArrayRef strides = {});

}  // namespace tpu_bridge
