// The host leg of tpu-dist's cross-process collectives: a thin layer over
// Gloo's TCP transport. Rust owns the rendezvous store, the checks and the
// layout of every buffer; this file only hands bytes to Gloo.
#pragma once

#include <cstdint>
#include <memory>

#include "rust/cxx.h"

namespace gloo {
class Context;
}

namespace tpu_dist {

struct StoreAdapter;

// One Gloo context: a full mesh of TCP pairs to every other process.
class GlooContext {
 public:
  explicit GlooContext(std::shared_ptr<gloo::Context> context);

  void all_reduce(rust::Slice<uint8_t> data, uint8_t dtype, uint8_t op,
                  uint32_t tag, uint64_t timeout_ms) const;
  void reduce_scatter(rust::Slice<const uint8_t> input,
                      rust::Slice<uint8_t> output, uint8_t dtype, uint8_t op,
                      uint32_t tag, uint64_t timeout_ms) const;
  void all_gather(rust::Slice<const uint8_t> input, rust::Slice<uint8_t> output,
                  uint32_t tag, uint64_t timeout_ms) const;
  void broadcast(rust::Slice<uint8_t> data, int32_t root, uint32_t tag,
                 uint64_t timeout_ms) const;
  void all_to_all(rust::Slice<const uint8_t> input, rust::Slice<uint8_t> output,
                  uint32_t tag, uint64_t timeout_ms) const;
  void send(rust::Slice<const uint8_t> data, int32_t peer, uint32_t tag,
            uint64_t timeout_ms) const;
  void recv(rust::Slice<uint8_t> data, int32_t peer, uint32_t tag,
            uint64_t timeout_ms) const;
  void barrier(uint32_t tag, uint64_t timeout_ms) const;

 private:
  std::shared_ptr<gloo::Context> context_;
};

// Connects `rank` of `size` processes: each publishes its address under
// `store` and opens a TCP pair to every other one, listening on `hostname`.
std::unique_ptr<GlooContext> connect(int32_t rank, int32_t size,
                                     rust::Str hostname,
                                     const StoreAdapter& store,
                                     uint64_t timeout_ms);

}  // namespace tpu_dist
