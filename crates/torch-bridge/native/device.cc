#include "torch-bridge/native/device.h"

#include "torch-bridge/native/allocator.h"
#include "torch-bridge/native/boxed.h"
#include "torch-bridge/native/kernels.h"
#include "torch-bridge/native/views.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "torch-bridge/src/native.rs.h"

namespace tpu_bridge {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Never throws: torch asks for the count where it must not (deviceCount is
// noexcept), and a runtime that cannot start has no devices.
c10::DeviceIndex count() noexcept {
  return static_cast<c10::DeviceIndex>(
      std::min<std::size_t>(device_count(), INT8_MAX));
}

// The device `tpu` means in a thread that has not chosen one: tpu:0, or a
// process's own device (`tpu:LOCAL_RANK` under torchrun).
std::atomic<c10::DeviceIndex> process_default{0};

thread_local c10::DeviceIndex current = process_default.load();

void check_index(c10::DeviceIndex index) {
  const c10::DeviceIndex n = count();
  TORCH_CHECK(index >= 0 && index < n, "tpu:", static_cast<int>(index),
              " does not exist (device index ", static_cast<int>(index),
              " is out of range: this process sees ", static_cast<int>(n),
              " tpu device(s))");
}

// Work runs in order per device, so each device has one stream and a
// synchronize drains everything (a superset of any one stream or event).
// Nothing here calls into Python: torch calls some of these where an
// exception must not escape.
struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device old = getDevice();
    if (device.index() != old.index()) setDevice(device);
    return old;
  }
  c10::Device getDevice() const override { return {kTpu, current}; }
  void setDevice(c10::Device device) const override {
    check_index(device.index());
    current = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    current = device.index();
  }

  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return getStream(device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return getStream(device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return getStream(stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return count(); }

  // A recorded event is a `DeviceEvent` (events.rs): the completion of a
  // mark launched after all work issued so far on its device. A timing
  // event (`enable_timing=True`) also notes when that mark completed.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    rust::Box<DeviceEvent> recorded = record_event(
        stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT);
    destroyEvent(*event, stream.device_index());
    *event = recorded.into_raw();
  }
  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    return static_cast<const DeviceEvent*>(start)->elapsed_ms(
        *static_cast<const DeviceEvent*>(end));
  }
  // Every stream is the device's one queue: nothing to order.
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    return event == nullptr || static_cast<const DeviceEvent*>(event)->query();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<const DeviceEvent*>(event)->wait();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) {
      rust::Box<DeviceEvent>::from_raw(static_cast<DeviceEvent*>(event));
    }
  }
  bool queryStream(const c10::Stream& stream) const override {
    return record_event(stream.device_index(), false)->query();
  }
  void synchronizeStream(const c10::Stream&) const override { synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    synchronize();
  }
};

const Guard& guard() {
  static const Guard* instance = new Guard();
  return *instance;
}

// Page-locked host memory on a TPU host; on the CPU plugin, host memory the
// allocator tracks so `is_pinned` can tell its blocks from others.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    void* data = bytes == 0 ? nullptr : c10::alloc_cpu(bytes);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<std::uintptr_t>(data)] = bytes;
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool owns(const void* ptr) const {
    const auto at = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = blocks_.upper_bound(at);
    if (next == blocks_.begin()) return false;
    auto block = std::prev(next);
    return at < block->first + block->second;
  }

  static PinnedAllocator& get() {
    static PinnedAllocator* instance = new PinnedAllocator();
    return *instance;
  }

 private:
  static void release(void* data) {
    {
      PinnedAllocator& self = get();
      std::lock_guard<std::mutex> lock(self.mutex_);
      self.blocks_.erase(reinterpret_cast<std::uintptr_t>(data));
    }
    c10::free_cpu(data);
  }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> blocks_;
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return count() > 0; }
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return index >= 0 && index < count();
  }
  c10::DeviceIndex deviceCount() const override { return count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    guard().setDevice({kTpu, index});
  }
  c10::DeviceIndex getCurrentDevice() const override { return current; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return guard().exchangeDevice({kTpu, index}).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  bool isPinnedPtr(const void* data) const override {
    return PinnedAllocator::get().owns(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &PinnedAllocator::get();
  }
  // `untyped_storage().resize_(n)`: the storage keeps its address (each
  // owns a range as large as a storage may grow); the bridge resizes the
  // value behind it.
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              std::size_t bytes) const override {
    resize_storage(reinterpret_cast<std::uintptr_t>(storage.data()), bytes);
    storage.unsafeGetStorageImpl()->set_nbytes(bytes);
  }
};

}  // namespace

void install() {
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered() &&
                  !c10::impl::hasDeviceGuardImpl(kTpu),
              "PyTorch's PrivateUse1 device is taken by another backend: "
              "torch_tpu_rs cannot register tpu");
  c10::impl::registerDeviceGuard(kTpu, &guard());
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  install_allocator();
  install_views();
  install_kernels();
  install_boxed_kernels();
}

int8_t current_device() { return current; }

void set_current_device(int8_t index) { guard().setDevice({kTpu, index}); }

void set_default_device(int8_t index) {
  set_current_device(index);
  process_default.store(index);
}

}  // namespace tpu_bridge
