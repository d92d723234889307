// Views on tpu are metadata: a new TensorImpl over the same storage with
// other sizes, strides and offset. PyTorch's own device-generic view
// kernels do exactly that, so they are registered for PrivateUse1 as they
// are (the CompositeExplicitAutograd views — transpose, expand, slice,
// select, permute, unsqueeze, ... — reach `as_strided` here too).

#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_unsafe_view_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include "torch-bridge/native/views.h"

namespace tpu_bridge {

void install_views() {
  // Registered when the module loads (a static registrar in a static
  // library would be dropped by the linker); the library lives as long as
  // the process.
  static auto* m = new torch::Library(torch::Library::IMPL, "aten",
                                      c10::DispatchKey::PrivateUse1, __FILE__,
                                      __LINE__);
  m->impl("view", TORCH_FN(at::native::view));
  m->impl("_unsafe_view", TORCH_FN(at::native::_unsafe_view));
  m->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m->impl("unfold", TORCH_FN(at::native::unfold));
  m->impl("alias", TORCH_FN(at::native::alias));
}

}  // namespace tpu_bridge
