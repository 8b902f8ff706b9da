// python/c10/private_pools.cpp: private pools through the c10 backend, the seam of PyTorch's
// beginAllocateToPool, endAllocateToPool, releasePool, createOrIncrefPool and graph trees'
// checkpoints (docs/pytorch-allocator.md sections 14 and 15): torch.cuda.MemPool and
// use_mem_pool, CUDA graph capture pools, a MemPool with its own allocator (its segments from
// that allocator), use_on_oom, no_split, checkPoolLiveAllocations, getCheckpointState and
// setCheckpointPoolState. Each is one call of cachet's allocator.
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/cuda/CUDAGuard.h>

#include "c10/backend.h"
#include "cachet/gpu/cuda_backend.h"

namespace cachet::c10_backend {
namespace {

// A private pool's checkpoint, as PyTorch's graph trees hold it (AllocatorState).
struct PoolState final : cc::AllocatorState {
  c10::DeviceIndex device = 0;
  std::shared_ptr<const cachet::PoolCheckpoint> checkpoint;
};

// torch.cuda.MemPool(allocator=...): the pool's segments come from that allocator
// (raw_alloc_with_stream on the allocation's device and stream, raw_delete; native calls
// raw_alloc, the same on the current stream). Its nullptr is out of memory for cachet; its
// exceptions pass through.
class AllocatorSource final : public cachet::gpu::SegmentSource {
 public:
  explicit AllocatorSource(std::shared_ptr<cc::CUDAAllocator> a) : a_(std::move(a)) {}
  void* allocate(cachet::Bytes size, cachet::DeviceIndex device, cachet::StreamId stream) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return a_->raw_alloc_with_stream(size, reinterpret_cast<cudaStream_t>(stream));
  }
  void release(void* ptr, cachet::Bytes, cachet::DeviceIndex device, cachet::StreamId) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    a_->raw_delete(ptr);
  }

 private:
  std::shared_ptr<cc::CUDAAllocator> a_;
};

}  // namespace

void CachetCUDAAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                              std::function<bool(cudaStream_t)> filter) {
  cachet::CachingAllocator* a = allocator(device);
  // PyTorch calls this before a capture begins (CUDAGraph::capture_begin) as for use_mem_pool:
  // nothing tells the two apart here, so capture = false, as for the plug-in (allocator.h).
  call("beginAllocateToPool", [&] {
    a->begin_allocate_to_pool(
        pool_id(mempool_id),
        [f = std::move(filter)](cachet::StreamId s) {
          return f(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s)));
        },
        false);
  });
}

void CachetCUDAAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  cachet::CachingAllocator* a = allocator(device);
  if (has_trackers_.load()) refuse_call_from_tracker("endAllocateToPool");
  as_traced_call(device, [&] { call("endAllocateToPool", [&] { a->end_allocate_to_pool(pool_id(mempool_id)); }); });
  if (has_trackers_.load()) raise_tracker_error();
}

// Native's releasePool only counts a user fewer (its segments go at the next emptyCache or
// retry); under policy:cachet it may give pages back (as_traced_call, backend.h).
void CachetCUDAAllocator::releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) {
  cachet::CachingAllocator* a = allocator(device);
  cachet::gpu::CurrentStream cs(current_stream(device));
  if (has_trackers_.load()) refuse_call_from_tracker("releasePool");
  as_traced_call(device, [&] { call("releasePool", [&] { a->release_pool(pool_id(mempool_id)); }); });
  if (has_trackers_.load()) raise_tracker_error();
}

int CachetCUDAAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) {
  return call("getPoolUseCount", [&] { return allocator(device)->pool_use_count(pool_id(mempool_id)); });
}

void CachetCUDAAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                             std::shared_ptr<cc::CUDAAllocator> pool_allocator) {
  cachet::CachingAllocator* a = allocator(device);
  // A MemPool with its own allocator: the pool's segments come from it (raw_alloc / raw_delete,
  // as native calls it) instead of cudaMalloc.
  std::shared_ptr<cachet::gpu::SegmentSource> source;
  if (pool_allocator) source = std::make_shared<AllocatorSource>(std::move(pool_allocator));
  call("createOrIncrefPool", [&] { a->create_or_incref_pool(pool_id(mempool_id), std::move(source)); });
}

void CachetCUDAAllocator::setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) {
  cachet::CachingAllocator* a = allocator(device);
  // Turning it off is what every MemPool's destructor does (ATen's ~MemPool): native never
  // refuses that (it erases the id from a set), and a destructor must not throw.
  if (!use_on_oom) {
    try {
      a->set_use_on_oom(pool_id(mempool_id), false);
    } catch (const cachet::UsageError&) {  // an unknown pool: nothing was on
    }
    return;
  }
  call("setUseOnOOM", [&] { a->set_use_on_oom(pool_id(mempool_id), true); });
}

void CachetCUDAAllocator::setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) {
  cachet::CachingAllocator* a = allocator(device);
  call("setNoSplit", [&] { a->set_no_split(pool_id(mempool_id)); });
}

// Graph trees: the pool's allocated blocks are exactly `expected` (native's
// checkPoolLiveAllocations: the count matches and each is expected).
bool CachetCUDAAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                                   const std::unordered_set<void*>& expected) {
  const cachet::PoolId id = pool_id(mempool_id);
  cachet::CachingAllocator* a = allocator(device);
  const std::vector<void*> want(expected.begin(), expected.end());
  return call("checkPoolLiveAllocations", [&] { return a->pool_live_allocations_are(id, want); });
}

// Graph trees (torch.compile mode="reduce-overhead"): a private pool's state, and its
// restoration; the restored allocations come back as DataPtrs with cachet's deleter.
// With the history on, each a call of its own, as native's: getCheckpointState gathers its
// context at ALL (the frees it completes take it), setCheckpointPoolState at STATE (its
// allocations take it; its frees go through native's free(), which gathers at ALL).
std::shared_ptr<cc::AllocatorState> CachetCUDAAllocator::getCheckpointState(c10::DeviceIndex device,
                                                                           MempoolId_t id) {
  cachet::CachingAllocator* a = allocator(device);
  auto st = std::make_shared<PoolState>();
  st->device = device;
  st->checkpoint = as_traced_call(
      device, [&] { return call("getCheckpointState", [&] { return a->checkpoint_pool(pool_id(id)); }); });
  return st;
}

cc::CheckpointDelta CachetCUDAAllocator::setCheckpointPoolState(c10::DeviceIndex device,
                                                                std::shared_ptr<cc::AllocatorState> as) {
  cachet::CachingAllocator* a = allocator(device);
  auto st = std::dynamic_pointer_cast<PoolState>(as);
  TORCH_CHECK(st && st->checkpoint, "Expected PrivatePoolState");
  auto run = [&] { return call("setCheckpointPoolState", [&] { return a->restore_pool(*st->checkpoint, {}); }); };
  const bool traced = history_on_.load();
  TracedCall c;
  if (traced) c = begin_call(device, cc::RecordContext::STATE, cc::RecordContext::ALL);
  cachet::CheckpointDelta d;
  {
    cachet::TraceCallScope scope(c.id);  // 0 without the history: the events name no call
    d = run();
  }
  cc::CheckpointDelta out;
  out.ptrs_freed = d.freed;
  for (const auto& [ptr, size] : d.allocated) {
    (void)size;
    out.dataptrs_allocd.emplace_back(ptr, ptr, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
  }
  if (traced) {  // the freed allocations' stacks go; the restored ones take the call's, as native's
    for (void* p : d.freed) set_live(device, p, nullptr);
    for (const auto& [ptr, size] : d.allocated) set_live(device, ptr, c.made);
  }
  return out;
}

}  // namespace cachet::c10_backend
