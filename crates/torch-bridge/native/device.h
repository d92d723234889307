// The tpu device as PyTorch's C++ core sees it: PrivateUse1's device guard
// (current device per thread, one in-order stream per device), its hooks
// (device count, pinned host memory) and the pinned host allocator.
#pragma once

#include <cstdint>

namespace tpu_bridge {

// Registers the guard and the hooks for PrivateUse1. Throws when another
// backend holds PrivateUse1 already.
void install();

// The calling thread's current tpu device.
int8_t current_device();

// Makes `index` the calling thread's current tpu device; throws when there
// is no such device.
void set_current_device(int8_t index);

// Makes `index` the current device of this thread and of every thread that
// has not chosen one yet; throws when there is no such device.
void set_default_device(int8_t index);

}  // namespace tpu_bridge
