// Native aten kernels for PrivateUse1 over the Rust core (see kernels.cc).
#pragma once

namespace tpu_bridge {

// Registers the native kernels for PrivateUse1.
void install_kernels();

}  // namespace tpu_bridge
