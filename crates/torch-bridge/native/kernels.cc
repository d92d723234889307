// Native aten kernels: the ops models dispatch most, run without Python.
// Each checks its arguments as PyTorch does (type promotion, broadcasting,
// devices), hands the operands to the Rust core (src/native_kernels.rs),
// which runs the op under the bridge's eager mode, and wraps the storage
// it returns in a new tensor.

#include "torch-bridge/native/kernels.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DefaultDtype.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "torch-bridge/native/tensors.h"

namespace tpu_bridge {
namespace {

// A kernel's operands, checked: tpu tensors of one device, and numbers
// (Scalars and 0-dim CPU tensors, which PyTorch lets mix with any device).
class Operands {
 public:
  explicit Operands(const char* op) : op_(op) {}

  void tensor(const at::Tensor& t) {
    if (t.device().type() == kTpu) {
      const c10::DeviceIndex index = t.device().index();
      TORCH_CHECK(!device_ || *device_ == index,
                  "Expected all tensors to be on the same device, but found "
                  "at least two devices, tpu:", static_cast<int>(*device_),
                  " and tpu:", static_cast<int>(index), "!");
      device_ = index;
      Operand o{};
      o.is_number = false;
      o.tensor = tensor_ref(t, op_);
      items_.push_back(o);
      return;
    }
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 0,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, tpu:",
                static_cast<int>(device_.value_or(0)), " and ", t.device(),
                "!");
    number(t.item());
  }

  void number(const c10::Scalar& s) {
    Operand o{};
    o.is_number = true;
    if (s.isComplex()) {
      const c10::complex<double> z = s.toComplexDouble();
      o.number = z.real();
      o.imag = z.imag();
    } else {
      o.number = s.toDouble();
    }
    items_.push_back(o);
  }

  const Operand& operator[](std::size_t i) const { return items_[i]; }
  c10::DeviceIndex device() const { return device_.value_or(0); }

 private:
  const char* op_;
  std::optional<c10::DeviceIndex> device_;
  std::vector<Operand> items_;
};

// Raises what the Rust side reports, with the class PyTorch uses for it.
void check(const Output& out) { raise(out.failure, out.error); }

at::Tensor wrap(const Output& out, c10::ScalarType dtype, c10::IntArrayRef sizes,
                c10::DeviceIndex device) {
  check(out);
  return adopt(out.address, out.nbytes, dtype, sizes, device);
}

c10::ScalarType promoted(const at::Tensor& a, const at::Tensor& b) {
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(a, state);
  state = at::native::update_result_type_state(b, state);
  return at::native::result_type(state);
}

c10::ScalarType promoted(const at::Tensor& a, const c10::Scalar& b) {
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(a, state);
  state = at::native::update_result_type_state(b, state);
  return at::native::result_type(state);
}

template <typename Other>
Operands operands(const char* op, const at::Tensor& self, const Other& other) {
  Operands x(op);
  x.tensor(self);
  if constexpr (std::is_same_v<Other, at::Tensor>) {
    x.tensor(other);
  } else {
    x.number(other);
  }
  return x;
}

// The broadcast of two shapes; PyTorch's error, naming the op and device.
c10::DimVector broadcast(const char* op, c10::IntArrayRef a, c10::IntArrayRef b,
                         const at::Tensor& on) {
  try {
    return at::infer_size_dimvector(a, b);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "op `", op, "` on ", on.device(), ": ",
                e.what_without_backtrace());
  }
}

// The result's sizes: the operands' broadcast (a number takes self's).
template <typename Other>
c10::DimVector result_sizes(const char* op, const at::Tensor& self,
                            const Other& other) {
  if constexpr (std::is_same_v<Other, at::Tensor>) {
    return broadcast(op, self.sizes(), other.sizes(), self);
  } else {
    return c10::DimVector(self.sizes());
  }
}

// The elementwise ops with native kernels (`Binary`, shared with the Rust
// side): each is the tpu-rs op of the same name.
constexpr const char* name(Binary op) {
  switch (op) {
    case Binary::Add: return "add";
    case Binary::Sub: return "sub";
    case Binary::Mul: return "mul";
    case Binary::Div: return "div";
  }
  return "";
}

// The dtype `op` computes in, after PyTorch's checks of its operands.
template <typename Other>
c10::ScalarType compute_dtype(Binary op, const at::Tensor& self,
                              const Other& other, const c10::Scalar& alpha) {
  if (op == Binary::Sub) at::native::sub_check(self, other);
  c10::ScalarType dtype = promoted(self, other);
  // True division gives a float for integer operands.
  if (op == Binary::Div && c10::isIntegralType(dtype, /*includeBool=*/true)) {
    dtype = c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  if (op == Binary::Add || op == Binary::Sub) {
    at::native::alpha_check(dtype, alpha);
  }
  return dtype;
}

// `self <op> alpha * other`, a new tensor.
template <Binary op, typename Other>
at::Tensor functional(const at::Tensor& self, const Other& other,
                      const c10::Scalar& alpha) {
  const c10::ScalarType dtype = compute_dtype(op, self, other, alpha);
  const auto sizes = result_sizes(name(op), self, other);
  const Operands x = operands(name(op), self, other);
  const Output out = binary(op, x[0], x[1], alpha.toDouble(),
                            code(dtype, name(op)));
  return wrap(out, dtype, sizes, x.device());
}

// `self <op>= alpha * other`: computed in the promoted dtype and written
// into self, which must hold the broadcast shape and a dtype the result
// casts to, as PyTorch requires of an in-place op.
template <Binary op, typename Other>
at::Tensor& in_place(at::Tensor& self, const Other& other,
                     const c10::Scalar& alpha) {
  const char* n = name(op);
  TORCH_CHECK(self.device().type() == kTpu,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", self.device(), " and tpu!");
  const c10::ScalarType dtype = compute_dtype(op, self, other, alpha);
  TORCH_CHECK(c10::canCast(dtype, self.scalar_type()), "op `", n, "_` on ",
              self.device(), ": result type ", dtype,
              " can't be cast to the desired output type ", self.scalar_type());
  const auto shape = result_sizes(n, self, other);
  TORCH_CHECK(c10::IntArrayRef(shape) == self.sizes(), "op `", n, "_` on ",
              self.device(), ": output with shape ", self.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  at::assert_no_internal_overlap(self);
  const Operands x = operands(n, self, other);
  check(binary_into(op, x[0], x[1], alpha.toDouble(), code(dtype, n),
                    tensor_ref(self, n)));
  return self;
}

// The schemas' signatures: add and sub take `alpha`, mul and div do not.
template <Binary op, typename Other>
at::Tensor with_alpha(const at::Tensor& self, const Other& other,
                      const c10::Scalar& alpha) {
  return functional<op>(self, other, alpha);
}

template <Binary op, typename Other>
at::Tensor without_alpha(const at::Tensor& self, const Other& other) {
  return functional<op>(self, other, 1);
}

template <Binary op, typename Other>
at::Tensor& with_alpha_(at::Tensor& self, const Other& other,
                        const c10::Scalar& alpha) {
  return in_place<op>(self, other, alpha);
}

template <Binary op, typename Other>
at::Tensor& without_alpha_(at::Tensor& self, const Other& other) {
  return in_place<op>(self, other, 1);
}

// `beta * bias + alpha * (a @ b)`, sized `sizes` (the bias broadcast).
at::Tensor product(const char* op, const at::Tensor& a, const at::Tensor& b,
                   const at::Tensor* bias, double alpha, double beta,
                   c10::IntArrayRef sizes) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "op `", op, "` on ",
              a.device(), ": expected both operands to have the same dtype, "
              "but got: ", a.scalar_type(), " != ", b.scalar_type());
  Operands x(op);
  x.tensor(a);
  x.tensor(b);
  if (bias != nullptr) {
    TORCH_CHECK(bias->scalar_type() == a.scalar_type(), "op `", op, "` on ",
                a.device(), ": self and mat2 must have the same dtype, but "
                "got ", bias->scalar_type(), " and ", a.scalar_type());
    broadcast(op, bias->sizes(), sizes, a);
    x.tensor(*bias);
  }
  const c10::ScalarType dtype = a.scalar_type();
  const Output out = matmul(x[0], x[1], bias != nullptr ? x[2] : x[0],
                            bias != nullptr, alpha, beta, code(dtype, op));
  return wrap(out, dtype, sizes, x.device());
}

// PyTorch's shape checks, naming the op and device.
void check_mm(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2, "op `", op, "` on ", a.device(),
              ": self must be a matrix, got ", a.dim(), "-D tensor");
  TORCH_CHECK(b.dim() == 2, "op `", op, "` on ", a.device(),
              ": mat2 must be a matrix, got ", b.dim(), "-D tensor");
  TORCH_CHECK(a.size(1) == b.size(0), "op `", op, "` on ", a.device(),
              ": mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x",
              a.size(1), " and ", b.size(0), "x", b.size(1), ")");
}

void check_bmm(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3, "op `", op, "` on ", a.device(),
              ": batch1 must be a 3D tensor");
  TORCH_CHECK(b.dim() == 3, "op `", op, "` on ", a.device(),
              ": batch2 must be a 3D tensor");
  TORCH_CHECK(b.size(0) == a.size(0) && b.size(1) == a.size(2), "op `", op,
              "` on ", a.device(),
              ": expected size for first two dimensions of batch2 tensor to "
              "be: [", a.size(0), ", ", a.size(2), "] but got: [", b.size(0),
              ", ", b.size(1), "].");
}

// PyTorch hands products lazily conjugated operands (`a @ b.mH`): their
// values are made real first (a copy, which conjugates on the device).
at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  check_mm("mm", self, mat2);
  return product("mm", self.resolve_conj(), mat2.resolve_conj(), nullptr, 1, 0,
                 {self.size(0), mat2.size(1)});
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2) {
  check_bmm("bmm", self, mat2);
  return product("bmm", self.resolve_conj(), mat2.resolve_conj(), nullptr, 1, 0,
                 {self.size(0), self.size(1), mat2.size(2)});
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1,
                 const at::Tensor& mat2, const c10::Scalar& beta,
                 const c10::Scalar& alpha) {
  check_mm("addmm", mat1, mat2);
  if (alpha.isComplex() || beta.isComplex()) {
    // Complex factors: the product and the sums as separate ops.
    return at::add(at::mul(self, beta), at::mul(at::mm(mat1, mat2), alpha));
  }
  const at::Tensor bias = self.resolve_conj();
  return product("addmm", mat1.resolve_conj(), mat2.resolve_conj(), &bias, alpha.toDouble(),
                 beta.toDouble(), {mat1.size(0), mat2.size(1)});
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& batch1,
                   const at::Tensor& batch2, const c10::Scalar& beta,
                   const c10::Scalar& alpha) {
  check_bmm("baddbmm", batch1, batch2);
  if (alpha.isComplex() || beta.isComplex()) {
    return at::add(at::mul(self, beta), at::mul(at::bmm(batch1, batch2), alpha));
  }
  const at::Tensor bias = self.resolve_conj();
  return product("baddbmm", batch1.resolve_conj(), batch2.resolve_conj(), &bias, alpha.toDouble(),
                 beta.toDouble(),
                 {batch1.size(0), batch1.size(1), batch2.size(2)});
}

}  // namespace

void install_kernels() {
  // Registered when the module loads, not by a static registrar (which the
  // linker drops from a static library).
  static auto* m = new torch::Library(torch::Library::IMPL, "aten",
                                      c10::DispatchKey::PrivateUse1, __FILE__,
                                      __LINE__);
  using at::Tensor;
  using c10::Scalar;
  m->impl("add.Tensor", TORCH_FN((with_alpha<Binary::Add, Tensor>)));
  m->impl("add.Scalar", TORCH_FN((with_alpha<Binary::Add, Scalar>)));
  m->impl("sub.Tensor", TORCH_FN((with_alpha<Binary::Sub, Tensor>)));
  m->impl("sub.Scalar", TORCH_FN((with_alpha<Binary::Sub, Scalar>)));
  m->impl("mul.Tensor", TORCH_FN((without_alpha<Binary::Mul, Tensor>)));
  m->impl("mul.Scalar", TORCH_FN((without_alpha<Binary::Mul, Scalar>)));
  m->impl("div.Tensor", TORCH_FN((without_alpha<Binary::Div, Tensor>)));
  m->impl("div.Scalar", TORCH_FN((without_alpha<Binary::Div, Scalar>)));
  m->impl("add_.Tensor", TORCH_FN((with_alpha_<Binary::Add, Tensor>)));
  m->impl("add_.Scalar", TORCH_FN((with_alpha_<Binary::Add, Scalar>)));
  m->impl("sub_.Tensor", TORCH_FN((with_alpha_<Binary::Sub, Tensor>)));
  m->impl("sub_.Scalar", TORCH_FN((with_alpha_<Binary::Sub, Scalar>)));
  m->impl("mul_.Tensor", TORCH_FN((without_alpha_<Binary::Mul, Tensor>)));
  m->impl("mul_.Scalar", TORCH_FN((without_alpha_<Binary::Mul, Scalar>)));
  m->impl("div_.Tensor", TORCH_FN((without_alpha_<Binary::Div, Tensor>)));
  m->impl("div_.Scalar", TORCH_FN((without_alpha_<Binary::Div, Scalar>)));
  m->impl("mm", TORCH_FN(mm));
  m->impl("bmm", TORCH_FN(bmm));
  m->impl("addmm", TORCH_FN(addmm));
  m->impl("baddbmm", TORCH_FN(baddbmm));
}

}  // namespace tpu_bridge
