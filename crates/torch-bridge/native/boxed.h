// The native kernels written in Rust (src/native_ops/), registered for
// PrivateUse1 through one boxed kernel that converts arguments and results.
#pragma once

namespace tpu_bridge {

// Registers every op the Rust side lists.
void install_boxed_kernels();

}  // namespace tpu_bridge
