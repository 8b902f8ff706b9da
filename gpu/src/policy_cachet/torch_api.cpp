// policy:cachet (CachetPolicy, policy_cachet/policy.h): PyTorch's CUDAAllocator calls beyond
// malloc, free and the pools (docs/pytorch-allocator.md §15). What policy:cachet can keep to
// PyTorch's contract it does (cacheInfo, checkPoolLiveAllocations); what its design excludes it
// refuses with a UsageError that says so and what to use instead, changing nothing.
#include <set>
#include <string>

#include "cachet/errors.h"
#include "messages.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

namespace {
std::string describe(PoolId id) {
  return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
}
}  // namespace

void CachetPolicy::create_or_incref_pool(PoolId id, std::shared_ptr<SegmentSource> source) {
  if (source == nullptr) return create_or_incref_pool(id);
  throw UsageError("create_or_incref_pool(" + describe(id) + ", allocator): policy:cachet places every block in its "
                   "one address reservation and cannot take a MemPool's segments from another allocator; use "
                   "policy:pytorch for a MemPool with its own allocator (docs/pytorch-allocator.md §15.1)");
}

void CachetPolicy::set_use_on_oom(PoolId id, bool on) {
  if (id.is_default())
    throw UsageError("set_use_on_oom: {0, 0} names the default pool, not a private pool; pass a MemPool's id");
  if (!on) return;  // nothing is marked under policy:cachet: unmarking (a MemPool's destructor) holds
  throw UsageError("set_use_on_oom(" + describe(id) + ", true): policy:cachet does not lend a private pool's free "
                   "blocks to the default pool; use policy:pytorch for MemPool(use_on_oom=True) "
                   "(docs/pytorch-allocator.md §15.2)");
}

void CachetPolicy::set_no_split(PoolId id) {
  if (id.is_default())
    throw UsageError("set_no_split: {0, 0} names the default pool, not a private pool; pass a MemPool's id");
  throw UsageError("set_no_split(" + describe(id) + "): policy:cachet carves every allocation from free pages and has "
                   "no segments to keep whole; use policy:pytorch for MemPool(no_split=True) "
                   "(docs/pytorch-allocator.md §15.2)");
}

// cacheInfo's scan (§15.4): the largest mapped free block of the default pool and of every pool.
Bytes CachetPolicy::largest_cached_block() const {
  Bytes largest = 0;
  for (const CBlock& b : free_) largest = std::max(largest, b.size);
  for (const auto& [id, pool] : pools_)
    for (const CBlock& b : pool.free) largest = std::max(largest, b.size);
  return largest;
}

DevicePtr CachetPolicy::base_allocation(DevicePtr ptr, Bytes* /*size*/) const {
  const CBlock* b = active_.find(ptr);
  if (b == nullptr || !b->is_allocated())
    throw UsageError("base_allocation(" + hex(ptr) + "): invalid device pointer (PyTorch: \"invalid device pointer\"): "
                     "not an allocation this allocator handed out, or one already freed; pass a pointer allocate() "
                     "returned and has not freed");
  throw UsageError("base_allocation(" + hex(ptr) + "): policy:cachet maps its memory page by page (CUDA VMM, as "
                   "expandable segments), which cannot be shared between processes; use policy:pytorch with "
                   "expandable_segments:False for tensors sent to other processes (docs/pytorch-allocator.md §15.4)");
}

std::shared_ptr<const PoolCheckpoint> CachetPolicy::checkpoint_pool(PoolId id) {
  throw UsageError("checkpoint_pool(" + describe(id) + "): policy:cachet has no checkpoints of a private pool (CUDA "
                   "graph trees); use policy:pytorch for torch.compile(mode=\"reduce-overhead\") with graph trees "
                   "(docs/pytorch-allocator.md §15.3)");
}

CheckpointDelta CachetPolicy::restore_pool(const PoolCheckpoint& cp, const std::vector<DevicePtr>& /*stale_live*/) {
  throw UsageError("restore_pool(" + describe(cp.id) + "): policy:cachet has no checkpoints of a private pool (CUDA "
                   "graph trees); use policy:pytorch (docs/pytorch-allocator.md §15.3)");
}

// checkPoolLiveAllocations (§15.3): the allocated blocks carrying the pool's id.
bool CachetPolicy::pool_live_allocations_are(PoolId id, const std::vector<DevicePtr>& expected) const {
  if (!pools_.contains(id))
    throw UsageError("pool_live_allocations_are(" + describe(id) + "): no such private pool (PyTorch: \"Could not "
                     "find pool of id\")");
  const std::set<DevicePtr> want(expected.begin(), expected.end());
  std::size_t allocated = 0;
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_allocated() || b->pool != id) continue;
    if (!want.contains(b->ptr)) return false;
    ++allocated;
  }
  return allocated == want.size();
}

}  // namespace cachet::gpu::detail
