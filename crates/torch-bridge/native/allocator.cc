#include "torch-bridge/native/allocator.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "torch-bridge/native/device.h"
#include "torch-bridge/src/native.rs.h"

namespace tpu_bridge {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

void set(StatArray& stats, uint64_t current, uint64_t peak, uint64_t allocated,
         uint64_t freed) {
  Stat& all = stats[static_cast<std::size_t>(StatType::AGGREGATE)];
  all.current = static_cast<int64_t>(current);
  all.peak = static_cast<int64_t>(peak);
  all.allocated = static_cast<int64_t>(allocated);
  all.freed = static_cast<int64_t>(freed);
}

// A storage is a value the Rust core holds, at a fake address of its own
// (nothing dereferences it). Device memory is taken when a value is
// written and given back when it dies, so nothing is cached: reserved,
// active and requested bytes all equal allocated bytes.
class Allocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    const c10::DeviceIndex device = current_device();
    const Allocation made = allocate_storage(bytes, device);
    if (!made.error.empty()) {
      const std::string message(made.error);
      TORCH_CHECK_WITH(OutOfMemoryError, !made.out_of_memory, message);
      TORCH_CHECK(false, message);
    }
    void* data = reinterpret_cast<void*>(made.address);
    return {data, data, &release, c10::Device(kTpu, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  // Bytes on tpu are read through the bridge, never through a pointer.
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false,
        "tpu storages cannot be copied byte by byte; copy tensors instead");
  }

  bool initialized() override { return true; }

  // Nothing is cached: memory goes back when its last tensor dies.
  void emptyCache(c10::MempoolId_t) override {}

  // One in-order stream per device: a block is free once its tensors are.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override {
    const MemoryCounters m = device_memory(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (StatArray* bytes : {&stats.allocated_bytes, &stats.reserved_bytes,
                             &stats.active_bytes, &stats.requested_bytes}) {
      set(*bytes, m.bytes, m.peak_bytes, m.allocated_bytes, m.freed_bytes);
    }
    for (StatArray* count :
         {&stats.allocation, &stats.segment, &stats.active}) {
      set(*count, m.buffers, m.peak_buffers, m.allocations, m.frees);
    }
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    reset_memory_totals(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    reset_memory_peaks(device);
  }

  std::pair<std::size_t, std::size_t> getMemoryInfo(
      c10::DeviceIndex device) override {
    const MemoryInfo info = memory_info(device);
    TORCH_CHECK_NOT_IMPLEMENTED(
        info.known, "tpu:", static_cast<int>(device),
        " does not report its memory size (the PJRT plugin gives no limit)");
    return {info.free_bytes, info.total_bytes};
  }

 private:
  static void release(void* data) {
    release_storage(reinterpret_cast<std::uintptr_t>(data));
  }
};

Allocator* instance() {
  static Allocator* allocator = new Allocator();
  return allocator;
}

}  // namespace

void install_allocator() { c10::SetAllocator(kTpu, instance()); }

c10::Allocator* tpu_allocator() { return instance(); }

c10::DataPtr adopted_data(std::uintptr_t address, c10::DeviceIndex device) {
  void* data = reinterpret_cast<void*>(address);
  return {data, data, instance()->raw_deleter(), c10::Device(kTpu, device)};
}

}  // namespace tpu_bridge
