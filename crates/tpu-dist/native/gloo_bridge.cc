#include "tpu-dist/native/gloo_bridge.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"
#include "tpu-dist/src/gloo/bridge.rs.h"

namespace tpu_dist {
namespace {

using Millis = std::chrono::milliseconds;

// Gloo's rendezvous store, answered by the Rust store.
class RustStore : public gloo::rendezvous::Store {
 public:
  RustStore(const StoreAdapter& store, uint64_t timeout_ms)
      : store_(store), timeout_ms_(timeout_ms) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, rust::Slice<const uint8_t>(
                        reinterpret_cast<const uint8_t*>(data.data()),
                        data.size()));
  }

  std::vector<char> get(const std::string& key) override {
    rust::Vec<uint8_t> value = store_.get(key, timeout_ms_);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, Millis(timeout_ms_));
  }

  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    for (const auto& key : keys) {
      store_.get(key, static_cast<uint64_t>(timeout.count()));
    }
  }

 private:
  const StoreAdapter& store_;
  uint64_t timeout_ms_;
};

// bfloat16 as its bits: the top half of an f32.
struct Bf16 {
  uint16_t bits;
};

float to_float(Bf16 x) {
  uint32_t wide = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

Bf16 from_float(float f) {
  uint32_t wide;
  std::memcpy(&wide, &f, sizeof wide);
  if ((wide & 0x7fffffffu) > 0x7f800000u) {
    return Bf16{static_cast<uint16_t>((wide >> 16) | 0x40u)};  // quiet NaN
  }
  wide += 0x7fffu + ((wide >> 16) & 1u);  // round to nearest even
  return Bf16{static_cast<uint16_t>(wide >> 16)};
}

float to_float(gloo::float16 x) { return gloo::cpu_half2float(x); }

template <typename T>
T narrow(float f);
template <>
Bf16 narrow<Bf16>(float f) { return from_float(f); }
template <>
gloo::float16 narrow<gloo::float16>(float f) {
  return gloo::cpu_float2half_rn(f);
}

// Elementwise c = a (op) b for the 16-bit floats, computed in f32 and
// rounded once, as the devices do.
template <typename T, typename F>
void combine16(void* c, const void* a, const void* b, size_t n, F f) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; i++) {
    out[i] = narrow<T>(f(to_float(x[i]), to_float(y[i])));
  }
}

// The Gloo reduction for `op` (0 sum, 1 product, 2 max, 3 min) on T; 4,
// a mean, is a sum followed by `divide`.
using Combine = void (*)(void*, const void*, const void*, size_t);

template <typename T>
gloo::AllreduceOptions::Func reducer(uint8_t op) {
  switch (op) {
    case 0:
      return static_cast<Combine>(&gloo::sum<T>);
    case 1:
      return static_cast<Combine>(&gloo::product<T>);
    case 2:
      return static_cast<Combine>(&gloo::max<T>);
    case 3:
      return static_cast<Combine>(&gloo::min<T>);
  }
  throw std::invalid_argument("unknown reduction " + std::to_string(op));
}

template <>
gloo::AllreduceOptions::Func reducer<Bf16>(uint8_t op) {
  switch (op) {
    case 0:
      return [](void* c, const void* a, const void* b, size_t n) {
        combine16<Bf16>(c, a, b, n, [](float x, float y) { return x + y; });
      };
    case 1:
      return [](void* c, const void* a, const void* b, size_t n) {
        combine16<Bf16>(c, a, b, n, [](float x, float y) { return x * y; });
      };
    case 2:
      return [](void* c, const void* a, const void* b, size_t n) {
        combine16<Bf16>(c, a, b, n,
                        [](float x, float y) { return x != x || x > y ? x : y; });
      };
    case 3:
      return [](void* c, const void* a, const void* b, size_t n) {
        combine16<Bf16>(c, a, b, n,
                        [](float x, float y) { return x != x || x < y ? x : y; });
      };
  }
  throw std::invalid_argument("unknown reduction " + std::to_string(op));
}

// Divides every element by `count` (op 4, a mean); floating types only.
template <typename T>
void divide(T* data, size_t n, int count) {
  if constexpr (std::is_floating_point_v<T>) {
    for (size_t i = 0; i < n; i++) data[i] /= static_cast<T>(count);
  } else if constexpr (std::is_same_v<T, Bf16> ||
                       std::is_same_v<T, gloo::float16>) {
    for (size_t i = 0; i < n; i++) {
      data[i] = narrow<T>(to_float(data[i]) / static_cast<float>(count));
    }
  } else {
    throw std::invalid_argument("a mean needs a floating dtype");
  }
}

template <typename T>
void all_reduce_as(const std::shared_ptr<gloo::Context>& context,
                   rust::Slice<uint8_t> data, uint8_t op, uint32_t tag,
                   Millis timeout) {
  const bool mean = op == 4;
  T* elements = reinterpret_cast<T*>(data.data());
  const size_t n = data.size() / sizeof(T);
  if (mean) divide(elements, 0, 1);  // rejects integer means before any I/O
  gloo::AllreduceOptions opts(context);
  opts.setOutput(elements, n);
  opts.setReduceFunction(reducer<T>(mean ? 0 : op));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
  if (mean) divide(elements, n, context->size);
}

template <typename T>
struct Type {
  using type = T;
};

// Calls `fn(Type<T>{})` with the element type of dtype code `dtype` (the
// codes of `codes` in src/gloo/mod.rs).
template <typename Fn>
void with_dtype(uint8_t dtype, Fn&& fn) {
  switch (dtype) {
    case 0:
      return fn(Type<uint8_t>{});
    case 1:
      return fn(Type<int8_t>{});
    case 2:
      return fn(Type<int16_t>{});
    case 3:
      return fn(Type<int32_t>{});
    case 4:
      return fn(Type<int64_t>{});
    case 5:
      return fn(Type<uint32_t>{});
    case 6:
      return fn(Type<gloo::float16>{});
    case 7:
      return fn(Type<Bf16>{});
    case 8:
      return fn(Type<float>{});
    case 9:
      return fn(Type<double>{});
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
}

// Each rank's block `r` of `input` goes to rank `r`, which reduces the
// blocks it receives in rank order: the same bytes on the wire as a ring
// reduce-scatter, and the same result on every rank.
template <typename T>
void reduce_scatter_as(const std::shared_ptr<gloo::Context>& context,
                       rust::Slice<const uint8_t> input,
                       rust::Slice<uint8_t> output, uint8_t op, uint32_t tag,
                       Millis timeout) {
  const bool mean = op == 4;
  if (mean) divide(static_cast<T*>(nullptr), 0, 1);  // integer means fail early
  std::vector<uint8_t> received(input.size());
  gloo::AlltoallOptions opts(context);
  opts.setInput(const_cast<uint8_t*>(input.data()), input.size());
  opts.setOutput(received.data(), received.size());
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::alltoall(opts);
  const size_t block = output.size();
  const size_t n = block / sizeof(T);
  auto combine = reducer<T>(mean ? 0 : op);
  std::memcpy(output.data(), received.data(), block);
  for (int r = 1; r < context->size; r++) {
    combine(output.data(), output.data(), received.data() + r * block, n);
  }
  if (mean) divide(reinterpret_cast<T*>(output.data()), n, context->size);
}

}  // namespace

GlooContext::GlooContext(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)) {}

void GlooContext::all_reduce(rust::Slice<uint8_t> data, uint8_t dtype,
                             uint8_t op, uint32_t tag,
                             uint64_t timeout_ms) const {
  with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    all_reduce_as<T>(context_, data, op, tag, Millis(timeout_ms));
  });
}

void GlooContext::reduce_scatter(rust::Slice<const uint8_t> input,
                                 rust::Slice<uint8_t> output, uint8_t dtype,
                                 uint8_t op, uint32_t tag,
                                 uint64_t timeout_ms) const {
  with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    reduce_scatter_as<T>(context_, input, output, op, tag, Millis(timeout_ms));
  });
}

void GlooContext::all_gather(rust::Slice<const uint8_t> input,
                             rust::Slice<uint8_t> output, uint32_t tag,
                             uint64_t timeout_ms) const {
  gloo::AllgatherOptions opts(context_);
  opts.setInput(const_cast<uint8_t*>(input.data()), input.size());
  opts.setOutput(output.data(), output.size());
  opts.setTag(tag);
  opts.setTimeout(Millis(timeout_ms));
  gloo::allgather(opts);
}

void GlooContext::broadcast(rust::Slice<uint8_t> data, int32_t root,
                            uint32_t tag, uint64_t timeout_ms) const {
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(data.data(), data.size());
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(Millis(timeout_ms));
  gloo::broadcast(opts);
}

void GlooContext::all_to_all(rust::Slice<const uint8_t> input,
                             rust::Slice<uint8_t> output, uint32_t tag,
                             uint64_t timeout_ms) const {
  gloo::AlltoallOptions opts(context_);
  opts.setInput(const_cast<uint8_t*>(input.data()), input.size());
  opts.setOutput(output.data(), output.size());
  opts.setTag(tag);
  opts.setTimeout(Millis(timeout_ms));
  gloo::alltoall(opts);
}

void GlooContext::send(rust::Slice<const uint8_t> data, int32_t peer,
                       uint32_t tag, uint64_t timeout_ms) const {
  auto buffer = context_->createUnboundBuffer(
      const_cast<uint8_t*>(data.data()), data.size());
  buffer->send(peer, tag);
  if (!buffer->waitSend(Millis(timeout_ms))) {
    throw std::runtime_error("send to rank " + std::to_string(peer) +
                             " timed out");
  }
}

void GlooContext::recv(rust::Slice<uint8_t> data, int32_t peer, uint32_t tag,
                       uint64_t timeout_ms) const {
  auto buffer = context_->createUnboundBuffer(data.data(), data.size());
  buffer->recv(peer, tag);
  if (!buffer->waitRecv(Millis(timeout_ms))) {
    throw std::runtime_error("receive from rank " + std::to_string(peer) +
                             " timed out");
  }
}

void GlooContext::barrier(uint32_t tag, uint64_t timeout_ms) const {
  gloo::BarrierOptions opts(context_);
  opts.setTag(tag);
  opts.setTimeout(Millis(timeout_ms));
  gloo::barrier(opts);
}

std::unique_ptr<GlooContext> connect(int32_t rank, int32_t size,
                                     rust::Str hostname,
                                     const StoreAdapter& store,
                                     uint64_t timeout_ms) {
  gloo::transport::tcp::attr attr;
  attr.hostname = std::string(hostname);
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(Millis(timeout_ms));
  RustStore rendezvous(store, timeout_ms);
  context->connectFullMesh(rendezvous, device);
  return std::make_unique<GlooContext>(std::move(context));
}

}  // namespace tpu_dist
