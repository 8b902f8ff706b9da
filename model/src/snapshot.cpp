// memory_snapshot() (docs/pytorch-allocator.md §8) and check_invariants() (docs/invariants.md).
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "cachet/model/allocator.h"
#include "cachet/model/sizes.h"
#include "cachet/snapshot_digest.h"

namespace cachet::model {

namespace {
// The snapshot's three states (cachet::BlockState, common/snapshot.h) for a mapped block.
using SnapshotState = cachet::BlockState;
SnapshotState state_of(const Block* b) {
  switch (b->state()) {
    case BlockState::Allocated: return SnapshotState::ActiveAllocated;
    case BlockState::AwaitingEvents: return SnapshotState::ActivePendingFree;
    case BlockState::Deferred: return SnapshotState::ActivePendingFree;  // §14.7
    case BlockState::Free: return SnapshotState::Inactive;
    case BlockState::Unmapped: break;
  }
  throw std::logic_error("model: an unmapped block in a snapshot");
}

}  // namespace

Snapshot Allocator::snapshot() const { return snapshot_of(false); }

std::vector<const Block*> Allocator::run_heads(bool orphaned) const {
  // Every mapped block: the default and private pools and the active set (PyTorch's
  // get_all_blocks). An orphaned pool's free blocks are in none of them (§14.8.1): a run of
  // it shows only from an active block on, unless `orphaned` asks for every run.
  std::vector<const Block*> all;
  for_each_block_pool([&](const BlockPool& pool) { all.insert(all.end(), pool.blocks.begin(), pool.blocks.end()); },
                      orphaned);
  for (const auto& [ptr, b] : active_blocks_) all.push_back(b);
  // Sleeping runs with no live block are in no pool (docs/sleep-wake.md): their heads.
  for (const auto& [key, owned] : owned_)
    if (owned->is_mapped() && run_head(owned.get()) == owned.get() && sleeping_.contains(owned->ptr))
      all.push_back(owned.get());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  // One segment per contiguous mapped run (a whole cudaMalloc, or a mapped range of an
  // expandable segment), from its first block.
  std::erase_if(all, [](const Block* b) { return b->prev != nullptr && b->prev->is_mapped(); });
  std::sort(all.begin(), all.end(), [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  return all;
}

Snapshot Allocator::snapshot_of(bool orphaned) const {
  Snapshot out;
  for (const Block* head : run_heads(orphaned)) {
    SegmentSnapshot seg;
    seg.address = head->ptr;
    seg.stream = head->stream;
    seg.is_large = !head->pool->is_small;
    seg.is_expandable = head->expandable != nullptr;
    // segment_pool_id: the owner of the head block's pool (§14.1).
    if (head->pool->owner != nullptr) seg.pool_id = head->pool->owner->id;
    if (auto it = sleeping_.find(head->ptr); it != sleeping_.end()) {
      seg.is_sleeping = true;
      if (it->second.backed_up)
        for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next)  // this run only
          if (b->is_active()) seg.backup_size += b->size;
    }
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) {
      seg.total_size += b->size;
      seg.blocks.push_back(BlockSnapshot{b->ptr, b->size, b->requested_size, state_of(b)});
    }
    out.push_back(std::move(seg));
  }
  return out;
}

std::uint64_t Allocator::snapshot_digest() const {
  // snapshot()'s segments and blocks, fed to the digest without building them.
  SnapshotDigest d;
  for (const Block* head : run_heads(false)) {
    Bytes total = 0, backup = 0;
    const auto asleep = sleeping_.find(head->ptr);
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) {
      total += b->size;
      if (asleep != sleeping_.end() && asleep->second.backed_up && b->is_active()) backup += b->size;
      d.block(b->ptr, b->size, b->requested_size, state_of(b));
    }
    d.segment(head->ptr, total, head->stream, !head->pool->is_small, head->expandable != nullptr,
              head->pool->owner != nullptr ? head->pool->owner->id : PoolId{}, asleep != sleeping_.end(), backup);
  }
  return d.value();
}

void Allocator::check_invariants() const {
  // The rules of docs/invariants.md whose policy is pytorch or both; a violation's message starts
  // with its ID.
  auto fail = [](const char* id, const std::string& what) {
    throw std::logic_error(std::string(id) + " model: " + what);
  };
  std::size_t pooled = 0;
  std::vector<const BlockPool*> pools;
  for_each_block_pool([&](const BlockPool& pool) { pools.push_back(&pool); }, true);
  for (const BlockPool* pool : pools) {
    pooled += pool->blocks.size() + pool->unmapped.size();
    for (const Block* b : pool->blocks) {
      if (!b->is_free())
        fail("[INV-POOL-1]",
             std::string("a block in state ") + state_name(b->state()) + " is in the best-fit set");
      if (b->pool != pool) fail("[INV-POOL-1]", "a block is in the wrong pool");
    }
    for (const Block* b : pool->unmapped) {
      if (!b->is_unmapped())
        fail("[INV-POOL-1]",
             std::string("a block in state ") + state_name(b->state()) + " is in the unmapped set");
      if (b->expandable == nullptr)
        fail("[INV-MAP-2]", "an unmapped block of a cudaMalloc segment");
    }
  }
  std::map<const Block*, int> queued;  // [INV-EVENT-2]
  for (const auto& [stream, events] : cuda_events_)
    for (const Event& e : events) ++queued[e.block];
  for (const auto& [key, owned] : owned_) {
    const Block* b = owned.get();
    const auto at = [b] { return " at " + std::to_string(b->ptr); };  // formatted only on failure
    if (b->size == 0 || b->size % kMinBlockSize != 0)
      fail("[INV-SIZE-1]", "size " + std::to_string(b->size) + " is not a multiple of 512" + at());
    if (b->next != nullptr && b->next->ptr != b->ptr + b->size)
      fail("[INV-SEG-1]", "the next block does not start where this one ends" + at());
    if (b->next != nullptr && b->next->prev != b) fail("[INV-SEG-2]", "broken link" + at());
    if (b->next != nullptr && (b->next->stream != b->stream || b->next->pool != b->pool ||
                               b->next->expandable != b->expandable))
      fail("[INV-SEG-3]", "the next block has another stream, pool or segment" + at());
    if (b->is_free_or_unmapped() && b->next != nullptr && b->next->state() == b->state() &&
        (b->pool->blocks.contains(const_cast<Block*>(b)) || b->is_unmapped()))
      fail("[INV-MERGE-1]", "two free neighbours not merged" + at());
    // The state agrees with the events, the stream uses and the containers.
    const BlockState s = b->state();
    if (s == BlockState::Allocated && b->size < round_size(config_, b->requested_size))
      fail("[INV-SIZE-2]",
           "smaller than round_size(" + std::to_string(b->requested_size) + ")" + at());
    // The split-size limit (§2.3): see docs/invariants.md.
    if (b->expandable == nullptr && !b->pool->is_small && b->size <= kSmallSize)
      fail("[INV-SIZE-3]", "a large-pool block of 1 MiB or less in a cudaMalloc segment" + at());
    if (b->pool->is_small && s == BlockState::Allocated && b->size > kSmallSize && !never_splits(*b->pool))
      fail("[INV-SIZE-3]", "a small-pool allocation larger than 1 MiB" + at());
    if ((s == BlockState::AwaitingEvents) != (b->event_count > 0))
      fail("[INV-EVENT-1]", std::string(state_name(s)) + " with " + std::to_string(b->event_count) +
                                " outstanding events" + at());
    const int q = queued.count(b) ? queued.at(b) : 0;
    if (q != b->event_count)
      fail("[INV-EVENT-2]", "event_count " + std::to_string(b->event_count) + " but " +
                                std::to_string(q) + " queued events" + at());
    // Stream uses stay on an allocated block, and on a free deferred by a capture (§14.7).
    if (s != BlockState::Allocated && s != BlockState::Deferred && !b->stream_uses.empty())
      fail("[INV-EVENT-3]", std::string("stream uses on a block in state ") + state_name(s) + at());
    if (s == BlockState::Deferred && b->stream_uses.empty())
      fail("[INV-EVENT-3]", "a deferred free without stream uses" + at());
    const bool active = b->is_active();
    if (active != (find_active(b->ptr) == b))
      fail("[INV-POOL-1]", std::string("active_blocks disagrees with state ") + state_name(s) + at());
    if (s == BlockState::Free && !b->pool->blocks.contains(const_cast<Block*>(b)) &&
        sleeping_range_of(b) == nullptr)
      fail("[INV-POOL-1]", "a Free block outside its pool" + at());
    if (s == BlockState::Unmapped && !b->pool->unmapped.contains(const_cast<Block*>(b)))
      fail("[INV-POOL-1]", "an Unmapped block outside its pool's unmapped set" + at());
  }
  std::size_t asleep_free = 0;  // the free blocks of sleeping runs are in no container
  for (const auto& [key, owned] : owned_)
    if (owned->is_free() && !sleeping_.empty() && sleeping_range_of(owned.get()) != nullptr) ++asleep_free;
  if (active_blocks_.size() + pooled + asleep_free != owned_.size())
    fail("[INV-POOL-1]", "a block is in no container, or in two");
  // Private pools (§14.4, §14.5, §14.8.1).
  auto is_orphaned = [&](const PrivatePool* pp) {
    return std::any_of(orphaned_pools_.begin(), orphaned_pools_.end(),
                       [&](const auto& o) { return o.get() == pp; });
  };
  std::map<const PrivatePool*, int> segments_of;
  for (const auto& [key, owned] : owned_) {
    const PrivatePool* owner = owned->pool->owner;
    if (owner == nullptr) continue;
    const auto known = graph_pools_.find(owner->id);
    if ((known != graph_pools_.end() && known->second.get() == owner) == is_orphaned(owner))
      fail("[INV-SEG-3]", "a block of a private pool that is neither known nor orphaned at " +
                              std::to_string(owned->ptr));
    if (owned->prev == nullptr && owned->expandable == nullptr) ++segments_of[owner];
  }
  for (const auto& [id, pp] : graph_pools_) {
    if (pp->use_count < 0) fail("[INV-PRIV-1]", "a negative use count");
    if ((pp->use_count == 0) != graph_pools_freeable_.contains(pp.get()))
      fail("[INV-PRIV-1]", "the freeable list disagrees with the use count");
    // Expandable segments break the count (§14.8.1): only a pool that never reserved one.
    if (!pp->had_expandable && pp->device_allocs != segments_of[pp.get()])
      fail("[INV-PRIV-2]", "device allocation count " + std::to_string(pp->device_allocs) +
                               ", segments " + std::to_string(segments_of[pp.get()]) +
                               " in a pool without expandable segments");
  }
  for (const auto& pp : orphaned_pools_)
    if (pp->use_count != 0 || pp->device_allocs != 0 || graph_pools_freeable_.contains(pp.get()))
      fail("[INV-PRIV-1]", "an orphaned pool with users, device allocations or on the freeable list");
  // [INV-STATS-1]: the stats agree with the structure (§5.3).
  std::int64_t segments = 0, reserved = 0, allocated = 0, active_bytes = 0, allocations = 0,
               active = 0, inactive_split = 0, inactive_split_bytes = 0;
  // Every mapped run (orphaned pools' memory is counted too), walked from its first block: the
  // mapped blocks with no mapped block before them.
  for (const auto& [key, owned] : owned_) {
    const Block* head = owned.get();
    if (!head->is_mapped() || (head->prev != nullptr && head->prev->is_mapped())) continue;
    const bool expandable = head->expandable != nullptr;
    if (!expandable) ++segments;
    const bool split = head->next != nullptr && head->next->is_mapped();  // more than one block
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) {
      const auto size = static_cast<std::int64_t>(b->size);
      reserved += size;
      const SnapshotState st = state_of(b);
      if (st == SnapshotState::ActiveAllocated) {
        allocated += size;
        ++allocations;
      }
      if (st != SnapshotState::Inactive) {
        active_bytes += size;
        ++active;
      } else if (!expandable && split) {
        ++inactive_split;
        inactive_split_bytes += size;
      }
    }
  }
  auto check = [&](const char* name, std::int64_t counted, std::int64_t stat) {
    if (counted != stat)
      fail("[INV-STATS-1]", std::string(name) + ": structure has " + std::to_string(counted) +
                                ", stats say " + std::to_string(stat));
  };
  check("segment", segments, stats_.segment[0].current);
  check("reserved_bytes", reserved, stats_.reserved_bytes[0].current);
  check("allocated_bytes", allocated, stats_.allocated_bytes[0].current);
  check("active_bytes", active_bytes, stats_.active_bytes[0].current);
  check("allocation", allocations, stats_.allocation[0].current);
  check("active", active, stats_.active[0].current);
  check("inactive_split", inactive_split, stats_.inactive_split[0].current);
  check("inactive_split_bytes", inactive_split_bytes, stats_.inactive_split_bytes[0].current);
  check("total_allocated_memory", reserved, static_cast<std::int64_t>(total_allocated_));
  // SLEEP-R1 (docs/sleep-wake.md): the live blocks of a cudaMalloc segment, and of an expandable
  // segment (one with no live block is any tag's), all carry one tag.
  {
    std::map<const void*, const Block*> first_live;  // segment (head block or reservation) -> a live block
    for (const auto& [ptr, b] : active_blocks_) {
      const void* seg = b->expandable != nullptr ? static_cast<const void*>(b->expandable)
                                                 : static_cast<const void*>(run_head(b));
      const auto [it, fresh] = first_live.emplace(seg, b);
      if (!fresh && it->second->tag != b->tag)
        fail("[INV-SLEEP-3]", "the segment of the live blocks at " + std::to_string(it->second->ptr) + " ('" +
                                  it->second->tag + "') and " + std::to_string(b->ptr) + " ('" + b->tag +
                                  "') mixes tags");
    }
  }
  // Sleeping segments (docs/sleep-wake.md): no free set holds their blocks, and the sleep stats
  // agree with a recount.
  std::int64_t sl_segments = 0, sl_bytes = 0, sl_allocated = 0, sl_backup = 0;
  for (const auto& [base, r] : sleeping_) {
    ++sl_segments;
    sl_bytes += static_cast<std::int64_t>(r.size);
    for (const auto& [key, owned] : owned_) {
      const Block* b = owned.get();
      if (b->ptr < base || b->ptr >= base + r.size) continue;
      if (b->is_free() && b->pool->blocks.contains(const_cast<Block*>(b)))
        fail("[INV-SLEEP-1]", "a free block at " + std::to_string(b->ptr) + " of the sleeping segment at " +
                                  std::to_string(base) + " is in its pool's free set");
      if (b->is_allocated()) sl_allocated += static_cast<std::int64_t>(b->size);
      if (r.backed_up && b->is_active()) sl_backup += static_cast<std::int64_t>(b->size);
    }
  }
  auto check_sleep = [&](const char* name, std::int64_t counted, std::int64_t stat) {
    if (counted != stat)
      fail("[INV-SLEEP-2]", std::string(name) + ": the sleeping segments have " + std::to_string(counted) +
                                ", the sleep stats say " + std::to_string(stat));
  };
  check_sleep("sleeping_segments", sl_segments, sleep_stats_.sleeping_segments.current);
  check_sleep("sleeping_bytes", sl_bytes, sleep_stats_.sleeping_bytes.current);
  check_sleep("sleeping_allocated_bytes", sl_allocated, sleep_stats_.sleeping_allocated_bytes.current);
  check_sleep("backup_bytes", sl_backup, sleep_stats_.backup_bytes.current);
}

}  // namespace cachet::model
