// tools/pool_front_end.h: the shared front end of private pools (tools/front_end,
// cachet/front_end/pool_front_end.h: what PyTorch's Python and ATen layers call around the
// allocator, docs/pytorch-allocator.md §14.9) driving a ReplayEngine, for `cachet conform`. Streams
// are the recording's stream indices; pool_ids() and live_pools() in the recording's terms.
#pragma once

#include <vector>

#include "cachet/front_end/pool_front_end.h"
#include "cachet/io/recording.h"
#include "cachet/ops.h"
#include "cachet/types.h"
#include "engine.h"

namespace cachet::cli {

// A ReplayEngine as the front end's allocator.
class EngineCalls final : public front_end::AllocatorCalls {
 public:
  explicit EngineCalls(ReplayEngine& engine) : engine_(engine) {}
  // The generator's tensors: allocated by the thread that begins a capture, the main thread.
  std::uint64_t malloc(Bytes size, StreamId stream) override { return engine_.malloc(size, stream, 0); }
  void free(std::uint64_t ptr) override { engine_.free(ptr); }
  void create_or_incref_pool(PoolId id) override { engine_.create_or_incref_pool(id); }
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { engine_.begin_allocate_to_pool(id, route); }
  void end_allocate_to_pool(PoolId id) override { engine_.end_allocate_to_pool(id); }
  void release_pool(PoolId id) override { engine_.release_pool(id); }
  void empty_cache_of(PoolId id) override { engine_.empty_cache_of(id); }
  int pool_use_count(PoolId id) const override { return engine_.pool_use_count(id); }
  void kernel(StreamId stream) override {
    if (engine_.has_capture_graph()) engine_.kernel(stream);
  }

 private:
  ReplayEngine& engine_;
};

class PoolFrontEnd {
 public:
  PoolFrontEnd(ReplayEngine& engine, const std::vector<StreamId>& streams) : calls_(engine), front_(calls_, &streams) {}

  // One of the pool or capture ops (ops::is_pool_op); stream indices into the recording's streams.
  void apply(const ops::Op& op) { front_.apply(op); }
  // Every pool made, in order, as the recording's pool_ids lists them.
  std::vector<io::RecordedPool> pool_ids() const {
    std::vector<io::RecordedPool> out;
    for (const auto& p : front_.pool_ids()) out.push_back(io::RecordedPool{p.name, p.id});
    return out;
  }
  // The MemPools alive now, by k, with the engine's use counts (the recording's live_pools).
  std::vector<io::LivePool> live_pools() const {
    std::vector<io::LivePool> out;
    for (const auto& p : front_.live_pools()) out.push_back(io::LivePool{p.k, p.id, p.use_count});
    return out;
  }

 private:
  EngineCalls calls_;
  front_end::PoolFrontEnd front_;
};

}  // namespace cachet::cli
