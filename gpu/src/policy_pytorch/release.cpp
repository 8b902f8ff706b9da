// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): release, garbage collection, the cap and
// settings (§3.3-3.7). Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "mutant.h"
#include "cachet/rule_flip.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

// ===================================================================== Release and GC (§3.3-3.6)

void PytorchPolicy::empty_cache() {
  if (config_.no_caching) return;
  release_cached_blocks();
  // Not the pinned buffers a backend keeps between sleeps: empty_cache is about device memory
  // (docs/sleep-wake.md section 6; release_backup_buffers gives them back).
}

void PytorchPolicy::release_cached_blocks(PoolId id) {
  refuse_release_where_pytorch_fails(id);  // §14.8, before anything changes
  if (mutant(kMutantReleaseFreesLiveBlock)) {  // planted: a freeable pool's live blocks are freed with it
    std::vector<DevicePtr> live;
    for (const auto& [base, seg] : segments_)
      if (const PrivatePool* owner = seg->pool->owner;
          owner != nullptr && graph_pools_freeable_.contains(owner->id) && (id.is_default() || owner->id == id))
        for (Block* b = seg->head; b != nullptr; b = b->next)
          if (b->is_allocated()) live.push_back(b->ptr);
    for (DevicePtr ptr : live) free(ptr);
  }
  // The default pools only for the default id and only when no capture or use_mem_pool is under
  // way (§3.4, §14.6); then the freeable private pools (§14.5).
  // (Rule flip empty_cache_ignores_active_pools: the default pools also while pools are active,
  // without the synchronization PyTorch asserts against then.)
  if (id.is_default() && (!capture_underway() || flipped(RuleFlip::EmptyCacheIgnoresActivePools))) {
    if (!capture_underway()) synchronize_and_free_events();
    // large pool first, then small (§3.4, §13.6; rule flip empty_cache_small_first)
    const bool small_first = flipped(RuleFlip::EmptyCacheSmallFirst);
    release_blocks(small_first ? small_blocks_ : large_blocks_);
    release_blocks(small_first ? large_blocks_ : small_blocks_);
  }
  if (graph_pools_freeable_.size() != 0) release_private_pools(id);
}

void PytorchPolicy::release_blocks(BlockPool& pool) {
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = &*it;
    ++it;
    if (b->expandable()) to_unmap.push_back(b);
    else if (!b->is_split()) release_block(b);
  }
  for (Block* b : to_unmap) {
    unmap_block(b);
    if (!b->is_mapped() && !b->is_split()) release_expandable_segment(b);
  }
  // Then the pool's sleeping ranges with no live block (docs/sleep-wake.md section 4): wherever
  // the pool's free segments go back, empty_cache and the last retry of a malloc alike.
  if (!sleeping_.empty()) release_sleeping_ranges(pool);
}

void PytorchPolicy::release_block(Block* b) {
  CACHET_ASSERT(!b->expandable() && !b->is_split() && b->is_free());
  BlockPool& pool = pool_for(b);
  // PyTorch's trackers hear of the free before the memory goes, as native's record_trace comes
  // before its cudaFree (NCCL's register hook deregisters the segment there); the trace keeps the
  // event once the device call succeeded. A failing call keeps the segment, and the listener hears
  // that it is still there (shell.h).
  const PoolId owner = trace_pool(pool);
  tell_listener(TraceAction::SegmentFree, b->ptr, b->size, b->stream, owner);
  try {
    if (SegmentSource* source = pool.owner != nullptr ? pool.owner->source.get() : nullptr) {
      // The MemPool's own allocator takes its segment back (§15.1); first: an exception changes nothing.
      source->release(reinterpret_cast<void*>(static_cast<std::uintptr_t>(b->ptr)), b->size, device_, b->stream);
    } else if (b->segment->vmm) {
      auto st = vmm_segment_free(b->ptr, b->size, true);  // device first: a failure changes nothing
      if (!st.is_ok()) throw DeviceError(device_error("cuMemUnmap/cuMemAddressFree", b->size, device_, st));
    } else {
      auto st = mem_->free(b->ptr);  // device first: a failure changes nothing
      if (!st.is_ok()) throw DeviceError(device_error("cudaFree", b->size, device_, st));
    }
  } catch (...) {
    tell_still_there(b->ptr, b->size, b->stream, owner);
    throw;
  }
  count_device_free(pool);  // §14.5
  if (pool.owner != nullptr) --pool.owner->segments;
  accounting_.segment_freed(stat_type(pool), b->size, is_oversize(b->size));
  keep_in_trace(TraceAction::SegmentFree, b->ptr, b->size, b->stream, owner);
  if (!mutant(kMutantReleaseKeepsReserved)) total_allocated_memory_ -= b->size;
  pool.blocks.erase(pool.blocks.iterator_to(*b));
  segments_.erase(b->segment->base);
  arena_.release(b);
}

bool PytorchPolicy::release_available_cached_blocks(const AllocParams& p) {
  const Bytes max_split = config_.max_split_size;
  if (max_split == kNoMaxSplit) return false;
  BlockPool& pool = *p.pool;
  // Rule flip release_available_searches_request: the request's size.
  const Bytes key_size = flipped(RuleFlip::ReleaseAvailableSearchesRequest) ? p.size : std::max(p.size, max_split);
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, key_size, 0}, SizeOrder{});
  if (flipped(RuleFlip::ReleaseAvailableSmallestFirst) &&
      (it == pool.blocks.end() || it->stream != p.stream || it->expandable())) {
    // Rule flip: the oversize blocks of this stream from the smallest up.
    Bytes released = 0;
    for (auto c = pool.blocks.lower_bound(SizeKey{p.stream, max_split, 0}, SizeOrder{});
         released < key_size && c != pool.blocks.end() && c->stream == p.stream;) {
      Block* b = &*c++;
      if (!b->expandable()) {
        released += b->size;
        release_block(b);
      }
    }
    return released >= key_size;
  }
  if (it == pool.blocks.end() || it->stream != p.stream || it->expandable()) {
    // No single block is large enough: release oversize blocks of this stream, largest first.
    if (it == pool.blocks.begin()) return false;
    Bytes released = 0;
    --it;
    while (released < key_size && it->size >= max_split && it->stream == p.stream) {
      auto cur = it;
      const bool is_first = cur == pool.blocks.begin();
      if (!is_first) --it;
      if (!cur->expandable()) {
        const Bytes n = cur->size;
        release_block(&*cur);
        released += n;
      }
      if (is_first) break;
    }
    if (released < key_size) return false;  // what was released stays released
  } else {
    release_block(&*it);
  }
  return true;
}

void PytorchPolicy::garbage_collect_cached_blocks() {
  // §3.5: only the default large pool, only unsplit non-expandable blocks, oldest first by
  // rounds of "age >= average age"; never syncs.
  const auto gc_threshold =
      static_cast<Bytes>(config_.garbage_collection_threshold * static_cast<double>(*cap_.allowed()));
  if (flipped(RuleFlip::GcThresholdStrict) ? total_allocated_memory_ < gc_threshold
                                            : total_allocated_memory_ <= gc_threshold)
    return;  // rule flip gc_threshold_strict
  const Bytes target = total_allocated_memory_ - gc_threshold;
  Bytes reclaimed = 0;
  const std::int64_t clock = large_blocks_.get_free_blocks_call_count;
  Bytes total_age = 0;
  int freeable = 0;
  for (const Block& b : large_blocks_.blocks) {
    if (!b.is_split()) {
      total_age += static_cast<Bytes>(clock - b.gc_count_base);
      ++freeable;
    }
  }
  if (freeable == 0) return;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / freeable;
    freed = false;
    if (mutant(kMutantGcLargestFirst)) {  // the same blocks, released largest first
      std::vector<Block*> round;
      for (Block& b : large_blocks_.blocks)
        if (!b.is_split() && !b.expandable() &&
            static_cast<double>(clock - b.gc_count_base) >= age_threshold)
          round.push_back(&b);
      for (auto r = round.rbegin(); r != round.rend(); ++r) {
        freed = true;
        reclaimed += (*r)->size;
        total_age -= static_cast<Bytes>(clock - (*r)->gc_count_base);
        --freeable;
        release_block(*r);
      }
      continue;
    }
    for (auto it = large_blocks_.blocks.begin(); it != large_blocks_.blocks.end();) {
      Block* b = &*it;
      ++it;
      const auto age = static_cast<Bytes>(clock - b->gc_count_base);
      if (flipped(RuleFlip::GcStopsAtGoal) && reclaimed >= target) break;  // rule flip
      const bool old = flipped(RuleFlip::GcOlderThanAverage) ? static_cast<double>(age) > age_threshold
                                                             : static_cast<double>(age) >= age_threshold;
      if (!b->is_split() && !b->expandable() && old) {
        freed = true;
        reclaimed += b->size;
        total_age -= age;
        --freeable;
        release_block(b);
      }
    }
  }
}

void PytorchPolicy::set_memory_fraction(double fraction) {
  if (mutant(kMutantFractionOneKeepsCap) && MemoryCap::valid(fraction) && fraction >= 1.0) return;
  cap_.set(fraction, total_memory_);  // §13.4
}

void PytorchPolicy::apply_config(const Config& c) {
  check_expandable_usable(c);
  const auto fraction = c.per_process_memory_fraction;
  config_ = c;
  (void)fraction;  // per_process_memory_fraction applies only at construction (§3.6)
}

[[noreturn]] void PytorchPolicy::throw_oom(const AllocParams& p) {
  auto info = mem_->mem_get_info();
  if (!info.is_ok()) throw DeviceError(device_error("cudaMemGetInfo", 0, device_, info.status));
  record(TraceAction::Oom, info.value.free, flipped(RuleFlip::OomTraceSegmentSize) ? p.alloc_size : p.size,
         p.stream);  // rule flip oom_trace_segment_size
  accounting_.out_of_memory();
  OomFacts f = oom_facts(p.alloc_size, info);  // the segment size (§3.7)
  f.private_pool_free = private_pool_free_bytes();  // free blocks of every private pool (§14.6)
  throw OutOfMemory(f);
}

}  // namespace cachet::gpu::detail
