#include "torch-bridge/native/tensors.h"

#include <c10/core/TensorImpl.h>

#include <string>
#include <string_view>
#include <unordered_set>

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
    case c10::ScalarType::ComplexFloat: return Dtype::C64;
    case c10::ScalarType::ComplexDouble: return Dtype::C128;
    default: return std::nullopt;
  }
}

// The native kernels written for complex tensors too. Every other one
// refuses them, so a complex value never meets a kernel that would read it
// as real (a cast to a float type keeps only the real part).
bool takes_complex(std::string_view op) {
  static const std::unordered_set<std::string_view> ops = {
      "add", "sub", "mul", "div", "neg", "neg_", "abs", "mm", "bmm", "sum", "sum.dim_IntList",
      "clone", "_to_copy", "copy_", "empty.memory_format", "empty_strided",
      "cat", "zero_", "fill_.Scalar", "fill_.Tensor", "constant_pad_nd", "mean", "mean.dim",
      "exp", "exp_", "log", "log_", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "sin", "sin_", "cos",
      "cos_", "tanh", "tanh_", "sigmoid", "sigmoid_", "reciprocal", "reciprocal_", "log1p",
      "log1p_", "expm1", "expm1_", "pow.Tensor_Scalar", "pow_.Scalar", "tanh_backward",
      "sigmoid_backward", "where.self", "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar",
      "eq_.Tensor", "eq_.Scalar", "ne_.Tensor", "ne_.Scalar", "masked_fill.Scalar",
      "masked_fill_.Scalar", "masked_fill.Tensor", "masked_fill_.Tensor", "index_select", "addmm",
      "baddbmm", "rsub.Tensor", "rsub.Scalar", "cumsum", "tril", "triu", "isnan", "isinf",
      "_local_scalar_dense", "logical_and", "logical_and_", "logical_or", "logical_or_",
      "logical_xor", "logical_xor_", "logical_not", "all", "all.dim", "all.dims", "any", "any.dim",
      "any.dims", "addcmul", "addcmul_", "addcdiv", "addcdiv_"};
  return ops.count(op) != 0;
}

Dtype code(c10::ScalarType t, const char* op) {
  const std::optional<Dtype> c = dtype_code(t);
  TORCH_CHECK_NOT_IMPLEMENTED(c.has_value(), "op `", op, "` on tpu: ", t,
                              " tensors are not supported");
  TORCH_CHECK_NOT_IMPLEMENTED(
      (*c != Dtype::C64 && *c != Dtype::C128) || takes_complex(op), "op `", op,
      "` on tpu: ", t, " tensors are not supported yet");
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
    case Dtype::C64: return c10::ScalarType::ComplexFloat;
    case Dtype::C128: return c10::ScalarType::ComplexDouble;
  }
  TORCH_CHECK(false, "internal error: an unknown dtype code");
}

TensorRef tensor_ref(const at::Tensor& t, const char* op) {
  // Its storage holds the values before the lazy conjugation or negation.
  TORCH_CHECK_NOT_IMPLEMENTED(!t.is_conj() && !t.is_neg(), "op `", op,
                              "` on tpu: a conjugated or negated view; call "
                              "resolve_conj() or resolve_neg() first");
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
