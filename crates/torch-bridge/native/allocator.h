// The tpu allocator PyTorch's C++ core sees: storages it allocates itself
// (`torch.UntypedStorage(n, device="tpu")`), and the device memory counters
// behind `torch.accelerator.memory_stats` and friends.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>

namespace tpu_bridge {

// Registers the allocator for PrivateUse1.
void install_allocator();

// The allocator (what a storage made outside it names as its own).
c10::Allocator* tpu_allocator();

// The DataPtr of a storage the Rust side made and keeps until the pointer's
// deleter releases `address`.
c10::DataPtr adopted_data(std::uintptr_t address, c10::DeviceIndex device);

}  // namespace tpu_bridge
