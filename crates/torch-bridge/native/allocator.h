// The tpu allocator PyTorch's C++ core sees: storages it allocates itself
// (`torch.UntypedStorage(n, device="tpu")`), and the device memory counters
// behind `torch.accelerator.memory_stats` and friends.
#pragma once

namespace tpu_bridge {

// Registers the allocator for PrivateUse1.
void install_allocator();

}  // namespace tpu_bridge
