// cachet/front_end/pool_front_end.h: what PyTorch 2.11's Python and ATen layers do around the
// allocator for the pool and capture ops of the op vocabulary (cachet/ops.h;
// docs/pytorch-allocator.md §14.9), as calls on an allocator (AllocatorCalls):
//   torch.cuda.MemPool()        a new id {0, n} (n counts from 1), createOrIncrefPool
//   use_mem_pool enter / exit   beginAllocateToPool(id, the op's thread) / endAllocateToPool +
//                               releasePool
//   del MemPool                 releasePool, then emptyCache(id)
//   CUDAGraph.capture_begin     the default CUDA generator registers the graph: when no graph
//                               is registered yet it allocates its seed and offset (two 8-byte
//                               tensors, default pool, current = capture stream); then a new id
//                               {n, 0} (or the shared graph's), beginAllocateToPool(id, stream);
//                               then (after cudaStreamBeginCapture) the generator's
//                               capture_prologue fills seed and offset: two kernels on the
//                               capture stream, the first nodes of the graph (§14.10.1)
//   capture_end                 endAllocateToPool
//   reset                       releasePool (if the capture ended); the generator unregisters
//                               the graph and frees seed and offset (seed first) when none is left
//
// One interpretation for every runner: `cachet conform` drives one engine with it; the lockstep
// harness (cachet/lockstep.h) drives the model and gpu/ side by side with it (each allocator call
// applied to both and compared), so the two sides can never disagree about what an op means.
//
// Ops that make no sense to PyTorch's Python layer (leaving a pool never entered, ending a
// capture never begun, sharing the pool of an unknown graph) or that PyTorch refuses before its
// first allocator call (a capture on the default stream, or on a stream already capturing) throw
// UsageError naming the op and make no allocator call. An allocator call that throws propagates; the front end is then as
// PyTorch's objects are after that exception:
//   - the generator's seed or offset allocation fails (out of memory): the graph is not
//     registered and no pool is entered; a seed allocated before the offset failed stays held by
//     the generator (PyTorch's seed_extragraph_) and is freed when the next registration
//     allocates its own (at::empty first, then the assignment drops the old tensor);
//   - beginAllocateToPool fails (a shared pool already active): the graph is unregistered again
//     (its object is gone), freeing seed and offset if it was the only one;
//   - any other failing call leaves the MemPool or graph as the ops before it made it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cachet/ops.h"
#include "cachet/types.h"

namespace cachet::front_end {

// The allocator calls PyTorch's front end makes (c10::cuda::CUDACachingAllocator's): malloc and
// free of the generator's tensors, createOrIncrefPool, beginAllocateToPool, endAllocateToPool,
// releasePool, emptyCache(id), getPoolUseCount.
class AllocatorCalls {
 public:
  virtual ~AllocatorCalls() = default;
  virtual std::uint64_t malloc(Bytes size, StreamId stream) = 0;
  virtual void free(std::uint64_t ptr) = 0;
  virtual void create_or_incref_pool(PoolId id) = 0;
  virtual void begin_allocate_to_pool(PoolId id, PoolRoute route) = 0;
  virtual void end_allocate_to_pool(PoolId id) = 0;
  virtual void release_pool(PoolId id) = 0;
  virtual void empty_cache_of(PoolId id) = 0;
  virtual int pool_use_count(PoolId id) const = 0;
  // One kernel on `stream` (a captured node while it captures, docs/pytorch-allocator.md
  // §14.10.1). A runner without a capture graph ignores it (the default).
  virtual void kernel(StreamId /*stream*/) {}
};

// A pool the ops made, as a recording's pool_ids names it: "<k>" for MemPool k (at its
// creation), "g<k>" for graph k's pool (at its capture_end).
struct MadePool {
  std::string name;
  PoolId id;
};
// A MemPool alive now: its k, id and the allocator's use count.
struct AlivePool {
  std::uint64_t k = 0;
  PoolId id;
  int use_count = 0;
};

// at::empty({1}, kLong): 8 bytes (§14.9).
inline constexpr Bytes kGeneratorTensorBytes = 8;

class PoolFrontEnd {
 public:
  // `streams`: a recording's stream table (an op's stream is an index into it); nullptr: ops
  // carry raw stream ids (props, fuzz, case files). Both must outlive the front end.
  explicit PoolFrontEnd(AllocatorCalls& calls, const std::vector<StreamId>* streams = nullptr)
      : calls_(calls), streams_(streams) {}

  // One of the pool or capture ops (ops::is_pool_op); anything else is a logic_error.
  void apply(const ops::Op& op);

  // Every pool made, in order, as a recording's pool_ids lists them.
  const std::vector<MadePool>& pool_ids() const { return pool_ids_; }
  // The MemPools alive now, by k, with the allocator's use counts (a recording's live_pools).
  std::vector<AlivePool> live_pools() const;
  // Every pool id handed to the allocator so far (MemPools and graph pools), alive or not.
  const std::set<PoolId>& ids_used() const { return ids_used_; }

  // What generators need to make valid sequences.
  enum class GraphState : std::uint8_t { None, Capturing, Captured };
  bool mempool_alive(std::uint64_t k) const { return mempools_.contains(k); }
  bool mempool_in_use(std::uint64_t k) const { return in_use_.contains(k); }
  std::vector<std::uint64_t> mempools_alive() const;
  std::vector<std::uint64_t> mempools_in_use() const { return {in_use_.begin(), in_use_.end()}; }
  GraphState graph(std::uint64_t k) const;
  std::vector<std::uint64_t> graphs(GraphState state) const;
  std::optional<StreamId> capture_stream(std::uint64_t graph) const;
  // Any use_mem_pool entered or capture begun and not ended (PyTorch's captures_underway).
  bool underway() const;

 private:
  struct Graph {
    PoolId pool;
    StreamId stream = 0;
    bool capture_ended = false;
  };
  StreamId stream(std::uint64_t index) const;
  PoolId mempool(std::uint64_t k, const char* op) const;
  void use_pool(std::uint64_t k, ThreadIndex thread);
  void end_pool(std::uint64_t k);
  void release(std::uint64_t k);
  void capture_begin(const ops::CaptureBegin& op);
  void capture_end(std::uint64_t k);
  void reset(std::uint64_t k);
  void register_graph(std::uint64_t k, StreamId s);
  void unregister_graph(std::uint64_t k);

  AllocatorCalls& calls_;
  const std::vector<StreamId>* streams_;
  std::uint64_t next_user_id_ = 1;   // MemPool ids {0, n}
  std::uint64_t next_graph_id_ = 1;  // graph ids {n, 0}
  std::map<std::uint64_t, PoolId> mempools_;  // alive MemPool objects by k
  std::set<std::uint64_t> in_use_;            // k whose use_mem_pool is entered
  std::map<std::uint64_t, Graph> graphs_;     // CUDAGraph objects by k
  // The default CUDA generator: the graphs registered with it and its seed and offset tensors
  // (held from the first registration to the last unregistration).
  std::set<std::uint64_t> registered_;
  std::optional<std::uint64_t> seed_, offset_;
  std::vector<MadePool> pool_ids_;
  std::set<PoolId> ids_used_;
};

}  // namespace cachet::front_end
