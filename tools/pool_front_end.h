// tools/pool_front_end.h: what PyTorch 2.11's Python and ATen layers do around the allocator for
// the pool and graph ops of a recording (docs/pytorch-allocator.md §14.9), driven through a
// ReplayEngine:
//   torch.cuda.MemPool()        a new id {0, n} (n counts from 1), createOrIncrefPool
//   use_mem_pool enter / exit   beginAllocateToPool(id, this thread) / endAllocateToPool +
//                               releasePool
//   del MemPool                 releasePool, then emptyCache(id)
//   CUDAGraph.capture_begin     the default CUDA generator registers the graph: when no graph
//                               is registered yet it allocates its seed and offset (two 8-byte
//                               tensors, default pool, current = capture stream); then a new id
//                               {n, 0} (or the shared graph's), beginAllocateToPool(id, stream)
//   capture_end                 endAllocateToPool
//   reset                       releasePool (if the capture ended); the generator unregisters
//                               the graph and frees seed and offset when none is left
// Ops that make no sense (leaving a pool never entered, ending a capture never begun, sharing
// the pool of an unknown graph) throw UsageError naming the op.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "cachet/io/recording.h"
#include "cachet/ops.h"
#include "cachet/types.h"
#include "engine.h"

namespace cachet::cli {

class PoolFrontEnd {
 public:
  PoolFrontEnd(ReplayEngine& engine, const std::vector<StreamId>& streams) : engine_(engine), streams_(streams) {}

  // One of the pool or capture ops (ops::is_pool_op); stream indices into the recording's streams.
  void apply(const ops::Op& op);
  // Every pool made, in order, as the recording's pool_ids lists them.
  const std::vector<io::RecordedPool>& pool_ids() const { return pool_ids_; }
  // The MemPools alive now, by k, with the engine's use counts (the recording's live_pools).
  std::vector<io::LivePool> live_pools() const;

 private:
  struct Graph {
    PoolId pool;
    bool capture_ended = false;
  };
  StreamId stream(std::uint32_t index) const;
  PoolId mempool(std::uint64_t k, const char* op) const;

  ReplayEngine& engine_;
  const std::vector<StreamId>& streams_;
  std::uint64_t next_user_id_ = 1;   // MemPool ids {0, n}
  std::uint64_t next_graph_id_ = 1;  // graph ids {n, 0}
  std::map<std::uint64_t, PoolId> mempools_;  // alive MemPool objects by k
  std::set<std::uint64_t> in_use_;            // k whose use_mem_pool is entered
  std::map<std::uint64_t, Graph> graphs_;     // CUDAGraph objects by k
  // The default CUDA generator's graph seed and offset tensors, while a graph is registered.
  std::set<std::uint64_t> registered_;
  std::optional<std::uint64_t> seed_, offset_;
  std::vector<io::RecordedPool> pool_ids_;
};

}  // namespace cachet::cli
