// Giving memory back: empty_cache / the last retry (docs/pytorch-allocator.md §3.4), release of
// oversize blocks (§3.3) and garbage collection (§3.5).
#include <algorithm>
#include <limits>
#include <vector>

#include "cachet/model/allocator.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

void Allocator::empty_cache() {
  if (config_.no_caching) return;
  release_cached_blocks();
}

void Allocator::empty_cache(PoolId id) {
  if (config_.no_caching) return;
  release_cached_blocks(id);
}

void Allocator::release_cached_blocks(PoolId id) {
  // The default pools only for the default id and only when no capture or use_mem_pool is
  // under way (§3.4, §14.6).
  // (Rule flip empty_cache_ignores_active_pools: the default pools also while pools are active,
  // without the synchronization PyTorch asserts against then.)
  const bool flip_active = flipped(RuleFlip::EmptyCacheIgnoresActivePools);
  if (id.is_default() && (captures_underway_.empty() || flip_active)) {
    if (captures_underway_.empty()) synchronize_and_free_events();
    // Large pool before small pool (§13.6, visible in the trace; rule flip empty_cache_small_first).
    const bool small_first = flipped(RuleFlip::EmptyCacheSmallFirst);
    release_blocks(small_first ? small_blocks_ : large_blocks_);
    release_blocks(small_first ? large_blocks_ : small_blocks_);
  }
  release_private_pools(id);
}

// The freeable private pools (all of them for the default id, else only that one), in PyTorch's
// order (FreeableOrder): small pool before large; a pool with no device allocation left is
// forgotten (§14.5, §14.6).
void Allocator::release_private_pools(PoolId id) {
  std::vector<PrivatePool*> order = graph_pools_freeable_.in_order();
  if (flipped(RuleFlip::FreeableInIdOrder))  // rule flip: in id order
    std::sort(order.begin(), order.end(), [](const PrivatePool* a, const PrivatePool* b) {
      return std::pair(a->id.first, a->id.second) < std::pair(b->id.first, b->id.second);
    });
  for (PrivatePool* pp : order) {
    if (!id.is_default()) {
      if (pp->id != id) continue;
      synchronize_and_free_events(pp);
    }
    const bool large_first = flipped(RuleFlip::PrivateReleaseLargeFirst);  // rule flip
    release_blocks(large_first ? pp->large : pp->small);
    release_blocks(large_first ? pp->small : pp->large);
    if (pp->device_allocs == 0) forget_pool(pp);
  }
}

// PyTorch erases a pool at a device allocation count of 0 (§14.5); its whole unmapped
// reservations go back with it (unobservable: no stats, no trace). With expandable segments the
// count can reach 0 while the pool still holds mapped pages (§14.8.1): PyTorch then erases a pool
// its blocks still point to. The model erases it the same way (unknown by its id, never released
// again, its free blocks no longer found by snapshot()) but keeps the object, orphaned, so that
// its blocks stay valid and are freed into it.
void Allocator::forget_pool(PrivatePool* pp) {
  std::vector<Block*> reservations;
  bool holds_memory = false;
  for (const auto& [key, b] : owned_) {
    if (b->pool->owner != pp) continue;
    if (b->is_unmapped() && !b->is_split()) reservations.push_back(b.get());
    else holds_memory = true;
  }
  graph_pools_freeable_.erase(pp);
  auto it = graph_pools_.find(pp->id);
  if (holds_memory) {
    orphaned_pools_.push_back(std::move(it->second));
    graph_pools_.erase(it);
    return;
  }
  for (Block* b : reservations) release_expandable_segment(b);
  graph_pools_.erase(it);
}

void Allocator::release_blocks(BlockPool& pool) {
  // Unsplit blocks are cudaFree'd; free expandable blocks are unmapped (whole pages only) after
  // the walk, since unmapping changes the pool.
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it++;
    if (b->expandable != nullptr)
      to_unmap.push_back(b);
    else if (!b->is_split())
      release_block(b);
  }
  for (Block* b : to_unmap) {
    unmap_block(b);
    if (b->is_unmapped() && !b->is_split()) release_expandable_segment(b);
  }
  if (!sleeping_.empty()) release_sleeping_blocks(pool);
}

void Allocator::release_block(Block* b, bool asleep) {
  refuse_device_free_in_capture("cudaFree");  // §14.8
  count_device_free(*b->pool, "release_block");  // §14.5
  ++stats_.num_device_free;
  record(TraceAction::SegmentFree, b->ptr, b->size, b->stream);
  if (asleep)
    source_.release_reservation(b->ptr, b->size);  // its memory went back at the sleep
  else
    source_.free(b->ptr, b->size);
  total_allocated_ -= b->size;
  const StatType type = stat_type(*b->pool);
  DeviceStats::for_all_and(stats_.segment, type, [](Stat& s) { s.decrease(1); });
  DeviceStats::for_all_and(stats_.reserved_bytes, type,
                           [&](Stat& s) { s.decrease(static_cast<std::int64_t>(b->size)); });
  if (is_oversize(b->size)) stats_.oversize_segments.decrease(1);
  b->pool->blocks.erase(b);
  delete_block(b);
}

bool Allocator::release_available_cached_blocks(const AllocParams& p) {
  const Bytes max_split = config_.max_split_size;
  if (max_split == kNoMaxSplit) return false;
  BlockPool& pool = *p.pool;
  // Search with max(request, max_split_size) (§3.3).
  Block key;
  key.stream = p.stream;
  key.size = p.size < max_split && !flipped(RuleFlip::ReleaseAvailableSearchesRequest) ? max_split : p.size;
  key.ptr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (flipped(RuleFlip::ReleaseAvailableSmallestFirst) &&
      (it == pool.blocks.end() || (*it)->stream != p.stream || (*it)->expandable != nullptr)) {
    // Rule flip: the oversize blocks of this stream from the smallest up.
    Block low;
    low.stream = p.stream;
    low.size = max_split;
    low.ptr = 0;
    Bytes released = 0;
    for (auto c = pool.blocks.lower_bound(&low); released < key.size && c != pool.blocks.end() &&
                                                 (*c)->stream == p.stream;) {
      Block* b = *c++;
      if (b->expandable == nullptr) {
        released += b->size;
        release_block(b);
      }
    }
    return released >= key.size;
  }
  if (it == pool.blocks.end() || (*it)->stream != p.stream || (*it)->expandable != nullptr) {
    // No single block is large enough: release oversize blocks of this stream from the
    // largest down until enough is released. Released blocks stay released on failure.
    if (it == pool.blocks.begin()) return false;
    Bytes released = 0;
    --it;
    while (released < key.size && (*it)->size >= max_split && (*it)->stream == p.stream) {
      auto cur = it;
      const bool is_first = cur == pool.blocks.begin();
      if (!is_first) --it;
      if ((*cur)->expandable == nullptr) {
        released += (*cur)->size;
        release_block(*cur);
      }
      if (is_first) break;
    }
    if (released < key.size) return false;
  } else {
    release_block(*it);
  }
  return true;
}

void Allocator::garbage_collect_cached_blocks() {
  // Only with a cap (gc_enabled), only on the not-found path, never syncs (§3.5).
  const auto threshold = static_cast<Bytes>(config_.garbage_collection_threshold *
                                            static_cast<double>(*allowed_max_));
  if (flipped(RuleFlip::GcThresholdStrict) ? total_allocated_ < threshold : total_allocated_ <= threshold) return;
  const Bytes target = total_allocated_ - threshold;
  Bytes reclaimed = 0;
  // Ages of the unsplit blocks of the large pool (the small pool is never collected).
  std::int64_t total_age = 0;
  std::int64_t freeable = 0;
  for (const Block* b : large_blocks_.blocks) {
    if (!b->is_split()) {
      total_age += large_blocks_.gc_age(b);
      ++freeable;
    }
  }
  if (freeable == 0) return;
  bool block_freed = true;
  while (reclaimed < target && block_freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    block_freed = false;
    // Release every block at least as old as the average; does not stop at the target.
    for (auto it = large_blocks_.blocks.begin(); it != large_blocks_.blocks.end();) {
      Block* b = *it++;
      const std::int64_t age = large_blocks_.gc_age(b);
      if (flipped(RuleFlip::GcStopsAtGoal) && reclaimed >= target) break;  // rule flip
      const bool old = flipped(RuleFlip::GcOlderThanAverage) ? static_cast<double>(age) > age_threshold
                                                             : static_cast<double>(age) >= age_threshold;
      if (!b->is_split() && b->expandable == nullptr && old) {
        block_freed = true;
        reclaimed += b->size;
        total_age -= age;
        --freeable;
        release_block(b);
      }
    }
  }
}

}  // namespace cachet::model
