// Native view kernels for PrivateUse1 (see views.cc).
#pragma once

namespace tpu_bridge {

// Registers PyTorch's device-generic view kernels for PrivateUse1.
void install_views();

}  // namespace tpu_bridge
