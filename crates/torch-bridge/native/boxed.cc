// One boxed kernel serves every op the Rust side implements: it reads the
// arguments off the dispatcher's stack by their schema, checks the devices,
// computes PyTorch's result type over the arguments the op promotes, calls
// the op by its index in the Rust table and pushes the results: new
// tensors, numbers, or the arguments an in-place or out= op returns.

#include "torch-bridge/native/boxed.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DefaultDtype.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torch-bridge/native/tensors.h"

namespace tpu_bridge {
namespace {

bool names_scalar_type(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::ScalarTypeType;
}

// Whether an argument is a `Scalar[]`.
bool is_scalar_list(const c10::Argument& a) {
  auto list = a.real_type()->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::NumberType;
}

// One call's arguments as the Rust side reads them. Owns the lists the
// `Arg`s point into; the tensors stay on the caller's stack meanwhile.
class Arguments {
 public:
  Arguments(const char* op, bool any_devices, const c10::FunctionSchema& schema,
            c10::ArrayRef<c10::IValue> values)
      : op_(op), any_devices_(any_devices) {
    args_.reserve(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      args_.push_back(convert(schema.arguments()[i], values[i]));
    }
  }

  rust::Slice<const Arg> slice() const { return {args_.data(), args_.size()}; }

 private:
  Arg convert(const c10::Argument& schema, const c10::IValue& v) {
    Arg a{};
    a.kind = ArgKind::Absent;
    if (v.isNone()) return a;
    if (names_scalar_type(schema)) {
      a.kind = ArgKind::ScalarType;
      a.dtype = code(v.toScalarType(), op_);
      return a;
    }
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) return a;
      if (t.device().type() == kTpu) {
        a.kind = ArgKind::Tensor;
        a.tensor = tensor(resolved(schema, t));
        return a;
      }
      if (t.device().is_cpu() && (t.dim() > 0 || t.is_complex())) {
        // Its bytes, in order: the kernel uploads them (copy_) or reports
        // PyTorch's device error. (A 0-dim CPU tensor is a number, unless
        // complex: numbers are real.)
        host_tensors_.push_back(t.resolve_conj().resolve_neg().contiguous());
        const at::Tensor& dense = host_tensors_.back();
        a.kind = ArgKind::HostTensor;
        a.tensor.dtype = code(dense.scalar_type(), op_);
        a.tensor.sizes = {dense.sizes().data(), dense.sizes().size()};
        // The original's strides: whether it was contiguous decides the
        // layout of a copy that preserves it.
        a.tensor.strides = {t.strides().data(), t.strides().size()};
        a.bytes = {static_cast<const uint8_t*>(dense.const_data_ptr()), dense.nbytes()};
        return a;
      }
      if (!t.device().is_cpu()) {
        a.kind = ArgKind::OtherTensor;
        return a;
      }
      return number(t.item(), code(t.scalar_type(), op_));
    }
    if (v.isBool()) return number(v.toBool(), Dtype::Bool);
    if (v.isInt()) return number(v.toInt(), Dtype::I64);
    if (v.isSymInt()) return number(v.toSymInt().expect_int(), Dtype::I64);
    if (v.isDouble()) return number(v.toDouble(), Dtype::F64);
    if (v.isComplexDouble()) return number(v.toComplexDouble(), Dtype::C128);
    if (v.isIntList()) return ints(v.toIntVector());
    if (v.isList() && is_scalar_list(schema)) {
      std::vector<double> values;
      for (const c10::IValue& x : v.toList()) {
        TORCH_CHECK_NOT_IMPLEMENTED(!x.isComplexDouble(), "op `", op_,
                                    "` on tpu: complex numbers are not supported");
        values.push_back(x.toScalar().toDouble());
      }
      number_lists_.push_back(std::move(values));
      a.kind = ArgKind::Numbers;
      a.numbers = {number_lists_.back().data(), number_lists_.back().size()};
      return a;
    }
    if (v.isBoolList()) {
      std::vector<int64_t> flags;
      for (bool b : v.toBoolList()) flags.push_back(b ? 1 : 0);
      return ints(std::move(flags));
    }
    if (v.isList() && schema.real_type()->kind() == c10::TypeKind::ListType &&
        !v.toList().empty() && v.toList().get(0).isSymInt()) {
      std::vector<int64_t> values;
      for (const c10::IValue& x : v.toList()) {
        values.push_back(x.toSymInt().expect_int());
      }
      return ints(std::move(values));
    }
    if (v.isTensorList()) {
      std::vector<TensorRef> refs;
      for (const at::Tensor& t : v.toTensorList()) {
        TORCH_CHECK(t.device().type() == kTpu,
                    "Expected all tensors to be on the same device, but found "
                    "at least two devices, tpu:",
                    static_cast<int>(device_.value_or(0)), " and ", t.device(),
                    "! (op `", op_, "`)");
        refs.push_back(tensor(t));
      }
      tensor_lists_.push_back(std::move(refs));
      a.kind = ArgKind::Tensors;
      a.tensors = {tensor_lists_.back().data(), tensor_lists_.back().size()};
      return a;
    }
    if (v.isString()) {
      const std::string& s = v.toStringRef();
      a.kind = ArgKind::Text;
      a.text = rust::Str(s.data(), s.size());
      return a;
    }
    if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      a.kind = d.type() == kTpu ? ArgKind::TpuDevice : ArgKind::OtherDevice;
      a.integer = d.has_index() ? d.index() : -1;
      return a;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(false, "op `", op_,
                                "` on tpu: an argument of type ", v.tagKind(),
                                " is not supported natively");
  }

  // `t`, or for a lazily conjugated view (`z.conj()`, which reaches the
  // ops PyTorch lets handle the bit themselves: copies and clones) the
  // values it stands for, made real by the device's conjugation of its
  // storage's values (not `resolve_conj()`, which copies through here).
  const at::Tensor& resolved(const c10::Argument& schema, const at::Tensor& t) {
    if (!t.is_conj() && !t.is_neg()) return t;
    const bool written = schema.alias_info() != nullptr && schema.alias_info()->isWrite();
    TORCH_CHECK_NOT_IMPLEMENTED(!written && !t.is_neg(), "op `", op_,
                                "` on tpu: a negated view, or writing into a conjugated "
                                "one, is not supported; call resolve_conj() and "
                                "resolve_neg() first");
    resolved_.push_back(at::_ops::_conj_physical::call(t.conj()));
    return resolved_.back();
  }

  TensorRef tensor(const at::Tensor& t) {
    const c10::DeviceIndex index = t.device().index();
    TORCH_CHECK(any_devices_ || !device_ || *device_ == index,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, tpu:", static_cast<int>(*device_),
                " and tpu:", static_cast<int>(index), "! (op `", op_, "`)");
    device_ = index;
    return tensor_ref(t, op_);
  }

  static Arg number(const c10::Scalar& s, Dtype type) {
    Arg a{};
    a.kind = ArgKind::Number;
    a.dtype = type;
    if (s.isComplex()) {
      const c10::complex<double> z = s.toComplexDouble();
      a.number = z.real();
      a.imag = z.imag();
      return a;
    }
    a.number = s.toDouble();
    a.integer = s.isFloatingPoint() ? 0 : s.toLong();
    return a;
  }

  Arg ints(std::vector<int64_t> values) {
    lists_.push_back(std::move(values));
    Arg a{};
    a.kind = ArgKind::Ints;
    a.ints = {lists_.back().data(), lists_.back().size()};
    return a;
  }

  const char* op_;
  bool any_devices_;
  std::optional<c10::DeviceIndex> device_;
  std::vector<Arg> args_;
  // Deques would do as well: a moved vector keeps its buffer, so the
  // slices stay valid as these grow.
  std::vector<std::vector<int64_t>> lists_;
  std::vector<std::vector<double>> number_lists_;
  std::vector<std::vector<TensorRef>> tensor_lists_;
  std::vector<at::Tensor> host_tensors_;
  std::vector<at::Tensor> resolved_;
};

// PyTorch's result type over the arguments at `indices` (tensors and
// numbers; absent ones are skipped).
c10::ScalarType result_type(c10::ArrayRef<c10::IValue> values,
                            const rust::Vec<std::size_t>& indices) {
  at::native::ResultTypeState state;
  for (std::size_t i : indices) {
    const c10::IValue& v = values[i];
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        state = at::native::update_result_type_state(t, state);
      }
    } else if (v.isTensor() && v.toTensor().defined()) {
      state = at::native::update_result_type_state(v.toTensor(), state);
    } else if (v.isScalar()) {
      state = at::native::update_result_type_state(v.toScalar(), state);
    }
  }
  return at::native::result_type(state);
}

// The argument a returned alias (`Tensor(a!)`) names.
const c10::IValue& aliased(const c10::FunctionSchema& schema,
                           c10::ArrayRef<c10::IValue> values,
                           const c10::AliasInfo& alias) {
  for (std::size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a != nullptr && a->beforeSets() == alias.beforeSets()) return values[i];
  }
  TORCH_CHECK(false, "internal error: ", schema.name(),
              " returns an alias of no argument");
}

c10::IValue number_value(const Outcome& out) {
  if (out.number_type == Dtype::Bool) return c10::IValue(out.integer != 0);
  if (out.number_type == Dtype::C64 || out.number_type == Dtype::C128) {
    return c10::IValue(c10::complex<double>(out.number, out.imag));
  }
  if (c10::isFloatingType(scalar_type(out.number_type))) {
    return c10::IValue(out.number);
  }
  return c10::IValue(out.integer);
}

// A tensor over a storage the Rust side made (undefined when it made none).
at::Tensor adopt_new(const NewTensor& t) {
  if (!t.defined) return at::Tensor();
  const std::vector<int64_t> sizes(t.sizes.begin(), t.sizes.end());
  const std::vector<int64_t> strides(t.strides.begin(), t.strides.end());
  return adopt(t.address, t.nbytes, scalar_type(t.dtype), sizes,
               static_cast<c10::DeviceIndex>(t.device), strides);
}

class NativeOp final : public c10::OperatorKernel {
 public:
  NativeOp(std::size_t index, std::string name, const NativeOpSpec& spec)
      : index_(index),
        name_(std::move(name)),
        promote_(spec.promote),
        any_devices_(spec.any_devices) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet,
                  torch::jit::Stack* stack) {
    const c10::FunctionSchema& schema = op.schema();
    const std::size_t n = schema.arguments().size();
    const c10::ArrayRef<c10::IValue> values = torch::jit::last(*stack, n);
    const Arguments args(name_.c_str(), any_devices_, schema, values);
    const Dtype promoted = promote_.empty()
                               ? Dtype::Bool
                               : code(result_type(values, promote_), name_.c_str());
    const Dtype default_float = code(
        c10::typeMetaToScalarType(c10::get_default_dtype()), name_.c_str());
    const Outcome out = run_native_op(index_, args.slice(), promoted, default_float);
    raise(out.failure, out.error);
    if (out.declined) {
      // The op's device-generic composite (a clone to another memory
      // format, a copy to another device).
      op.redispatchBoxed(
          c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
      return;
    }
    if (out.download) {
      // A tpu value copied into CPU tensor argument 0 (`cpu.copy_(tpu)`).
      const NewTensor& t = out.tensors[0];
      const std::vector<int64_t> sizes(t.sizes.begin(), t.sizes.end());
      at::Tensor host = at::empty(sizes, at::TensorOptions().dtype(scalar_type(t.dtype)));
      TORCH_CHECK(host.nbytes() == out.bytes.size(), "internal error: op `", name_,
                  "` downloaded ", out.bytes.size(), " bytes for ", host.nbytes());
      std::memcpy(host.mutable_data_ptr(), out.bytes.data(), out.bytes.size());
      at::Tensor dst = values[0].toTensor();
      dst.copy_(host);
      torch::jit::drop(*stack, n);
      stack->emplace_back(dst);
      return;
    }
    std::vector<c10::IValue> results;
    std::size_t next = 0;
    for (const c10::Argument& r : schema.returns()) {
      if (r.alias_info() != nullptr && r.alias_info()->isWrite()) {
        results.push_back(aliased(schema, values, *r.alias_info()));
      } else if (r.type()->kind() == c10::TypeKind::TensorType) {
        TORCH_CHECK(next < out.tensors.size(), "internal error: op `", name_,
                    "` returned too few tensors");
        results.emplace_back(adopt_new(out.tensors[next++]));
      } else if (r.type()->kind() == c10::TypeKind::ListType) {
        // A `Tensor[]` (a foreach op): every tensor returned.
        std::vector<at::Tensor> list;
        while (next < out.tensors.size()) list.push_back(adopt_new(out.tensors[next++]));
        results.emplace_back(std::move(list));
      } else {
        TORCH_CHECK(out.has_number, "internal error: op `", name_,
                    "` returned no number");
        results.push_back(number_value(out));
      }
    }
    torch::jit::drop(*stack, n);
    for (c10::IValue& v : results) stack->push_back(std::move(v));
  }

 private:
  std::size_t index_;
  std::string name_;
  rust::Vec<std::size_t> promote_;
  bool any_devices_;
};

}  // namespace

void install_boxed_kernels() {
  static auto* m = new torch::Library(torch::Library::IMPL, "aten",
                                      c10::DispatchKey::PrivateUse1, __FILE__,
                                      __LINE__);
  rust::Vec<NativeOpSpec> specs = native_ops();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string name(specs[i].name);
    // PyTorch differentiates a CompositeImplicitAutograd op through its
    // parts; a backend kernel would take its place and bypass autograd.
    const auto dot = name.find('.');
    const auto handle = c10::Dispatcher::singleton().findOp(
        {"aten::" + name.substr(0, dot),
         dot == std::string::npos ? "" : name.substr(dot + 1)});
    if (handle && handle->hasKernelForDispatchKey(
                      c10::DispatchKey::CompositeImplicitAutograd)) {
      continue;
    }
    m->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                              std::make_unique<NativeOp>(i, name, specs[i])));
  }
}

}  // namespace tpu_bridge
