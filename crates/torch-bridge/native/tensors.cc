#include "torch-bridge/native/tensors.h"

#include <c10/core/TensorImpl.h>

#include <string>

#include "torch-bridge/native/allocator.h"

namespace tpu_bridge {

std::optional<Dtype> dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Bool: return Dtype::Bool;
    case c10::ScalarType::Char: return Dtype::I8;
    case c10::ScalarType::Short: return Dtype::I16;
    case c10::ScalarType::Int: return Dtype::I32;
    case c10::ScalarType::Long: return Dtype::I64;
    case c10::ScalarType::Byte: return Dtype::U8;
    case c10::ScalarType::UInt32: return Dtype::U32;
    case c10::ScalarType::Half: return Dtype::F16;
    case c10::ScalarType::BFloat16: return Dtype::Bf16;
    case c10::ScalarType::Float: return Dtype::F32;
    case c10::ScalarType::Double: return Dtype::F64;
    default: return std::nullopt;
  }
}

Dtype code(c10::ScalarType t, const char* op) {
  const std::optional<Dtype> c = dtype_code(t);
  TORCH_CHECK_NOT_IMPLEMENTED(c.has_value(), "op `", op, "` on tpu: ", t,
                              " tensors are not supported");
  return *c;
}

c10::ScalarType scalar_type(Dtype d) {
  switch (d) {
    case Dtype::Bool: return c10::ScalarType::Bool;
    case Dtype::I8: return c10::ScalarType::Char;
    case Dtype::I16: return c10::ScalarType::Short;
    case Dtype::I32: return c10::ScalarType::Int;
    case Dtype::I64: return c10::ScalarType::Long;
    case Dtype::U8: return c10::ScalarType::Byte;
    case Dtype::U32: return c10::ScalarType::UInt32;
    case Dtype::F16: return c10::ScalarType::Half;
    case Dtype::Bf16: return c10::ScalarType::BFloat16;
    case Dtype::F32: return c10::ScalarType::Float;
    case Dtype::F64: return c10::ScalarType::Double;
  }
  TORCH_CHECK(false, "internal error: an unknown dtype code");
}

TensorRef tensor_ref(const at::Tensor& t, const char* op) {
  TensorRef r{};
  r.address = reinterpret_cast<std::uintptr_t>(t.storage().data());
  r.dtype = code(t.scalar_type(), op);
  r.sizes = {t.sizes().data(), t.sizes().size()};
  r.strides = {t.strides().data(), t.strides().size()};
  r.offset = t.storage_offset();
  return r;
}

void raise(Failure failure, const rust::String& error) {
  if (failure == Failure::None) return;
  const std::string message(error);
  switch (failure) {
    case Failure::NotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    case Failure::Index: TORCH_CHECK_INDEX(false, message);
    case Failure::OutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    default: TORCH_CHECK(false, message);
  }
}

at::Tensor adopt(std::uintptr_t address, std::size_t nbytes,
                 c10::ScalarType dtype, c10::IntArrayRef sizes,
                 c10::DeviceIndex device, c10::IntArrayRef strides) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       adopted_data(address, device), tpu_allocator(),
                       /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  if (strides.empty()) {
    t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  } else {
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  }
  return t;
}

}  // namespace tpu_bridge
