// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): what PyTorch's CUDAAllocator interface
// asks beyond malloc, free and the pools (docs/pytorch-allocator.md §15): cacheInfo and
// getBaseAllocation (§15.4), the checkpoints of CUDA graph trees (getCheckpointState,
// setCheckpointPoolState, checkPoolLiveAllocations: §15.3).
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "cachet/errors.h"
#include "check.h"
#include "messages.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

namespace {
std::string describe(PoolId id) { return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}"; }
void* to_host(DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
DevicePtr to_dev(const void* p) { return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
}  // namespace

// ===================================================================== cacheInfo, getBaseAllocation (§15.4)

// cache_info_aux over the default pools and every known private pool: the largest free block.
Bytes PytorchPolicy::largest_cached_block() const {
  Bytes largest = 0;
  auto scan = [&](const BlockPool& pool) {
    for (const Block& b : pool.blocks) largest = std::max(largest, b.size);
  };
  scan(large_blocks_);
  scan(small_blocks_);
  for (const auto& [id, pp] : graph_pools_) {
    scan(pp->large);
    scan(pp->small);
  }
  return largest;
}

// getBaseAllocation: only a block that is allocated now (PyTorch looks it up among its
// allocated blocks), never one of an expandable segment.
DevicePtr PytorchPolicy::base_allocation(DevicePtr ptr, Bytes* size) const {
  const Block* b = config_.no_caching ? nullptr : active_.find(ptr);
  if (b == nullptr || !b->is_allocated())
    throw UsageError("base_allocation(" + hex(ptr) + "): invalid device pointer (PyTorch: \"invalid device pointer\"): "
                     "not an allocation this allocator handed out, or one already freed; pass a pointer allocate() "
                     "returned and has not freed");
  if (b->expandable())
    throw UsageError("base_allocation(" + hex(ptr) + "): Tensors allocated with expandable_segments:True cannot be "
                     "shared between processes. Consider using expandable_segments:False in data loading workers via "
                     "torch.cuda.memory._set_allocator_settings('expandable_segments:False')");
  while (b->prev != nullptr) b = b->prev;
  const DevicePtr base = b->ptr;
  if (size != nullptr) {
    Bytes sum = 0;
    for (; b != nullptr; b = b->next) sum += b->size;
    *size = sum;
  }
  return base;
}

// ===================================================================== Graph trees (§15.3)

// checkPoolLiveAllocations: the pool's allocated blocks are exactly the expected set.
bool PytorchPolicy::pool_live_allocations_are(PoolId id, const std::vector<DevicePtr>& expected) const {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end())
    throw UsageError("pool_live_allocations_are(" + describe(id) + "): no such private pool (PyTorch: \"Could not "
                     "find pool of id\")");
  const std::set<DevicePtr> want(expected.begin(), expected.end());
  std::size_t allocated = 0;
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != it->second.get()) continue;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      if (!b->is_allocated()) continue;
      if (!want.contains(b->ptr)) return false;
      ++allocated;
    }
  }
  return allocated == want.size();
}

namespace {
// PyTorch's get_private_pool_head_blocks finds a segment by its first block among the active
// blocks and the pool's free blocks: a segment whose first block is unmapped is not seen.
bool seen_by_pytorch(const Segment& seg) { return seg.head->is_mapped(); }
}  // namespace

// getCheckpointState: the deferred frees get their events first (PyTorch does so even while a
// capture is under way); every block of the checkpointed segments must then be without events.
std::shared_ptr<const PoolCheckpoint> PytorchPolicy::checkpoint_pool(PoolId id) {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end())
    throw UsageError("checkpoint_pool(" + describe(id) + "): no such private pool (PyTorch: \"Could not find pool of "
                     "id\")");
  const PrivatePool* pp = it->second.get();
  // Before anything changes: a block that will wait for events when the deferred frees get theirs.
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != pp || !seen_by_pytorch(*seg)) continue;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      bool events = b->state() == BlockState::AwaitingEvents;
      if (b->state() == BlockState::Deferred)
        for (StreamId s : b->stream_uses)
          events = events || std::find(b->capture_stream_uses.begin(), b->capture_stream_uses.end(), s) ==
                                 b->capture_stream_uses.end();
      if (events)
        throw PyTorchFailsHere("checkpoint_pool(" + describe(id) + "): PyTorch 2.11 fails here (\"Events should have "
                               "synchronized when checkpointing block\"): the block at " + hex(b->ptr) +
                               " waits for stream-use events; cachet refuses and changes nothing. Synchronize and "
                               "allocate once (the events complete) before checkpointing (docs/pytorch-allocator.md "
                               "§15.3)");
    }
  }
  insert_events_deferred_until_no_capture();
  auto cp = std::make_shared<PoolCheckpoint>();
  cp->id = id;
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != pp || !seen_by_pytorch(*seg)) continue;
    PoolCheckpoint::SegmentState s;
    s.is_small = seg->is_small;
    s.expandable = seg->expandable;
    for (const Block* b = seg->head; b != nullptr; b = b->next)
      s.blocks.push_back(PoolCheckpoint::BlockState{to_host(b->ptr), b->size, b->is_allocated(), b->is_mapped()});
    cp->segments.push_back(std::move(s));
  }
  return cp;
}

// setCheckpointPoolState. PyTorch frees every allocated block of the pool, then, per checkpointed
// segment, allocates its blocks one by one from the segment's (now whole) free block, splitting
// where the checkpoint has a boundary, and frees those the checkpoint has free. Where that would
// fail in PyTorch (a TORCH_CHECK half-way, or worse), it is refused here before anything changes.
CheckpointDelta PytorchPolicy::restore_pool(const PoolCheckpoint& cp, const std::vector<DevicePtr>& stale_live) {
  const std::string what = "restore_pool(" + describe(cp.id) + ")";
  auto it = graph_pools_.find(cp.id);
  if (it == graph_pools_.end())
    throw UsageError(what + ": no such private pool (PyTorch: \"Could not find private pool id\")");
  PrivatePool* pp = it->second.get();
  if (graph_pools_freeable_.contains(cp.id))
    throw PyTorchFailsHere(what + ": PyTorch 2.11 fails here (\"Not expected to checkpoint freeable graph\"): every "
                           "user has released the pool; cachet refuses and changes nothing (docs/pytorch-allocator.md "
                           "§15.3)");
  auto fails = [&](const std::string& why) {
    throw PyTorchFailsHere(what + ": PyTorch 2.11 fails here: " + why +
                           "; cachet refuses and changes nothing (docs/pytorch-allocator.md §15.3)");
  };
  for (DevicePtr p : stale_live) {
    const Block* b = active_.find(p);
    if (b == nullptr || !b->is_allocated() || b->segment->pool->owner != pp)
      throw UsageError(what + ": stale_live " + hex(p) + " is not an allocation of this pool; pass only pointers "
                       "allocated in the pool and not freed");
  }
  // The segments PyTorch walks, and the allocations it frees: none may wait for events, none may
  // have stream uses (its free would record events, and the segment would not come back whole).
  std::vector<DevicePtr> to_free(stale_live.begin(), stale_live.end());
  std::vector<DevicePtr> others;
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != pp || !seen_by_pytorch(*seg)) continue;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      if (b->state() == BlockState::AwaitingEvents || b->state() == BlockState::Deferred)
        fails("the block at " + hex(b->ptr) + " waits for stream-use events (\"Events should have synchronized when "
              "setting checkpointed block\")");
      if (!b->is_allocated()) continue;
      if (!b->stream_uses.empty())
        fails("freeing the allocation at " + hex(b->ptr) + ", used on other streams, would leave it waiting for events");
      if (std::find(stale_live.begin(), stale_live.end(), b->ptr) == stale_live.end()) others.push_back(b->ptr);
    }
  }
  // Each checkpointed segment must still be there, with the shape PyTorch's walk needs.
  std::set<DevicePtr> seen;
  for (const PoolCheckpoint::SegmentState& s : cp.segments) {
    if (s.blocks.empty()) fails("a checkpointed segment has no blocks");
    const DevicePtr base = to_dev(s.blocks.front().ptr);
    auto sit = segments_.find(base);
    if (sit == segments_.end() || sit->second->pool->owner != pp || !seen_by_pytorch(*sit->second) ||
        !seen.insert(base).second)
      fails("\" could not find " + hex(base) + "\": no segment of the pool starts there");
    const Segment& seg = *sit->second;
    if (seg.expandable != s.expandable) fails("the segment at " + hex(base) + " changed kind");
    DevicePtr at = base;
    Bytes mapped = 0;
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const auto& bs = s.blocks[i];
      const bool last_unmapped = s.expandable && i + 1 == s.blocks.size();
      if (to_dev(bs.ptr) != at || bs.size == 0 || bs.mapped == last_unmapped || (last_unmapped && bs.allocated))
        fails("the checkpoint's segment at " + hex(base) + " is not a chain of mapped blocks" +
              (s.expandable ? " ending in one unmapped block" : ""));
      at += bs.size;
      if (!last_unmapped) mapped += bs.size;
    }
    if (!s.expandable) {
      if (at - base != seg.size) fails("the segment at " + hex(base) + " has another size than checkpointed");
      continue;
    }
    // After the frees, the segment is one free mapped block of the checkpoint's mapped bytes and
    // one unmapped block to the end of the reservation.
    const Block* first = seg.head;
    Bytes run = 0;
    const Block* b = first;
    for (; b != nullptr && b->is_mapped(); b = b->next) run += b->size;
    if (run != mapped || b == nullptr || b->next != nullptr || b->ptr + b->size != seg.base + seg.size)
      fails("the expandable segment at " + hex(base) + " has " + std::to_string(run) + " mapped bytes, checkpointed " +
            std::to_string(mapped) + " (TORCH_CHECK in setSegmentStateToCheckpoint)");
  }

  // freeBlocksAllocatedToPool: the stale allocations first, then the others by address.
  CheckpointDelta delta;
  to_free.insert(to_free.end(), others.begin(), others.end());
  for (DevicePtr p : to_free) {
    free(p);
    delta.freed.push_back(to_host(p));
  }
  // setSegmentStateToCheckpoint, per checkpointed segment.
  for (const PoolCheckpoint::SegmentState& s : cp.segments) {
    const std::size_t n = s.expandable ? s.blocks.size() - 1 : s.blocks.size();
    Block* curr = segments_.at(to_dev(s.blocks.front().ptr))->head;
    std::vector<Block*> made;
    for (std::size_t i = 0; i < n; ++i) {
      const Bytes size = s.blocks[i].size;
      CACHET_CHECK(curr != nullptr && curr->is_free() && curr->ptr == to_dev(s.blocks[i].ptr) && curr->size >= size);
      AllocParams q{curr->stream, size, size, &pool_for(curr), curr};
      q.in_pool = true;
      q.expandable_active = curr->expandable();
      Block* b = alloc_found_block(q, size, curr->size > size);  // requested size = block size
      made.push_back(b);
      curr = b->next;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (s.blocks[i].allocated) delta.allocated.emplace_back(to_host(made[i]->ptr), made[i]->size);
      else free(made[i]->ptr);
    }
  }
  return delta;
}

}  // namespace cachet::gpu::detail
