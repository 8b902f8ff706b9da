// The malloc order (docs/pytorch-allocator.md §3.1), best fit with the oversize rules (§2.2), new
// segments (§3.2) and splitting (§2.3, §2.4). § numbers refer to docs/pytorch-allocator.md.
#include <algorithm>
#include <stdexcept>
#include <limits>

#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/model/sizes.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

std::uint64_t Allocator::malloc(Bytes orig_size, StreamId stream, ThreadIndex thread) {
  // Size 0: NativeCachingAllocator never calls malloc (§1.2).
  if (orig_size == 0) return 0;
  // Checked before anything else, nothing changes (§1.2).
  if (orig_size >= kMaxRequest)
    throw OutOfMemory("CUDA out of memory. Tried to allocate more than 1EB memory.");
  if (config_.no_caching) {
    // PYTORCH_NO_CUDA_MEMORY_CACHING: a raw cudaMalloc, no stats (§4.1).
    const auto addr = source_.allocate(orig_size);
    // A failed raw cudaMalloc is C10_CUDA_CHECK's error, not the caching allocator's message.
    if (!addr) throw OutOfMemory("CUDA error: out of memory");
    raw_allocations_.emplace(*addr, orig_size);
    return *addr;
  }

  // 1. Blocks whose stream-use events completed return to their pools first; not while a
  //    capture or use_mem_pool is under way (§14.7).
  if (captures_underway_.empty()) process_events();
  // During a capture, with graph_capture_record_stream_reuse, the deferred frees of this stream
  // that the graph orders before it are free again (§14.10.1).
  else if (config_.graph_capture_record_stream_reuse) free_safe_blocks_in_capture(stream);

  // 2. Size, pool, segment size (§1).
  AllocParams p;
  p.stream = stream;
  p.size = round_size(config_, orig_size);
  // The default pools, or the private pool of an active capture or use_mem_pool (§14.2).
  p.thread = thread;
  p.pool = &get_pool(p.size, stream, thread);
  p.alloc_size = allocation_size(config_, p.size);
  p.expandable = config_.expandable_segments;
  // From the first allocation under a tag other than "default" on, placement keeps segments
  // tag-homogeneous (docs/sleep-wake.md, SLEEP-R1); until then every decision is PyTorch's.
  if (current_tag() != kDefaultTag) tags_seen_ = true;

  // 3. Best fit in the pool; then the ladder of ways to get memory (§3.1 step 5).
  bool found = get_free_block_for_tag(p);
  if (!found) {
    // Rule flip alloc_before_gc: a new segment is tried first.
    if (flipped(RuleFlip::AllocBeforeGc)) found = alloc_block(p, false);
    if (!found) {
      if (gc_enabled()) garbage_collect_cached_blocks();
      found = alloc_block(p, false) ||
              // The pools marked use_on_oom lend a free block before any cached memory goes (§15.2).
              try_mempool_fallback(p) ||
              (!flipped(RuleFlip::NoReleaseAvailable) &&  // rule flip
               release_available_cached_blocks(p) && alloc_block(p, false));
    }
    // The last retry frees the cache; never while a capture is under way (§14.7). Rule flip
    // retry_inside_pool: only a graph capture stops it.
    const bool retry_allowed =
        flipped(RuleFlip::RetryInsidePool)
            ? std::none_of(captures_underway_.begin(), captures_underway_.end(),
                           [](const auto& c) { return c.second.is_capture(); })
            : captures_underway_.empty();
    if (!found && retry_allowed) {
      release_cached_blocks();
      found = alloc_block(p, true);
    }
  }
  if (!found) raise_oom(p);

  const bool split = should_split(p.block, p.size, p.expandable);
  const Block* block = alloc_found_block(p, orig_size, split);
  if (!sleeping_.empty() && sleeping_range_of(block) != nullptr)  // docs/sleep-wake.md, SLEEP-R2
    throw std::logic_error("[INV-SLEEP-1] model: malloc placed the block at " + std::to_string(block->ptr) +
                           " in a sleeping range");
  return block->ptr;
}

bool Allocator::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  // The GC age clock ticks only here, and only with a cap and a threshold (§13.3).
  if (gc_enabled()) ++pool.get_free_blocks_call_count;
  Block key;
  key.stream = p.stream;
  key.size = p.size;
  key.ptr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (flipped(RuleFlip::BestFitAnyStream)) {
    // Rule flip: the smallest fit (lowest address among equals) of any stream.
    it = pool.blocks.end();
    for (auto c = pool.blocks.begin(); c != pool.blocks.end(); ++c)
      if ((*c)->size >= p.size && (it == pool.blocks.end() || (*c)->size < (*it)->size ||
                                   ((*c)->size == (*it)->size && (*c)->ptr < (*it)->ptr)))
        it = c;
    if (it == pool.blocks.end()) return false;
  } else if (it == pool.blocks.end() || (*it)->stream != p.stream) {
    return false;
  }
  if (flipped(RuleFlip::BestFitHighestAddress))  // rule flip: the last of the equal sizes
    for (auto next = std::next(it); next != pool.blocks.end() && (*next)->stream == (*it)->stream &&
                                    (*next)->size == (*it)->size;
         ++next)
      it = next;

  if ((*it)->expandable != nullptr) {
    if (p.expandable && flipped(RuleFlip::ExpandableFirstFit)) {
      // Rule flip: the first expandable block as it is.
    } else if (p.expandable) {
      // Best fit counts an expandable block as the size it can grow to: its size plus an
      // unmapped block right after it (§2.2 step 3).
      auto expandable_size = [](const Block* b) {
        return b->size + (b->next != nullptr && b->next->is_unmapped() ? b->next->size : 0);
      };
      auto next = std::next(it);
      while ((*it)->expandable != nullptr && next != pool.blocks.end() &&
             (*next)->stream == p.stream && expandable_size(*next) < expandable_size(*it)) {
        it = next++;
      }
    } else {
      // Expandable segments were turned off: only non-expandable blocks qualify.
      do {
        ++it;
      } while (it != pool.blocks.end() && (*it)->expandable != nullptr &&
               (*it)->stream == p.stream);
      if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
    }
  }

  const Bytes max_split = config_.max_split_size;
  // A normal request never takes an oversize block (§2.2 step 4; rule flip oversize_for_all).
  if (!flipped(RuleFlip::OversizeForAll) && p.size < max_split && (*it)->size >= max_split) return false;
  // An oversize request takes a cached block only below request + max_non_split_rounding (rule
  // flips: non_split_rounding_1mib, non_split_rounding_inclusive).
  const Bytes allowance = flipped(RuleFlip::NonSplitRounding1MiB) ? MiB : config_.max_non_split_rounding;
  if (p.size >= max_split && (flipped(RuleFlip::NonSplitRoundingInclusive) ? (*it)->size > p.size + allowance
                                                                            : (*it)->size >= p.size + allowance))
    return false;
  p.block = *it;
  pool.blocks.erase(it);
  return true;
}

bool Allocator::alloc_block(AllocParams& p, bool is_retry) {
  // Counted before the attempt, even when the cap refuses it (§13.6).
  if (is_retry && !flipped(RuleFlip::RetryCountedIfAllowed)) ++stats_.num_alloc_retries;
  const Bytes size = p.alloc_size;
  // The cap is inclusive (§13.4; rule flip cap_exclusive); expandable segments check the segment
  // size too (§13.5). Sleeping bytes do not count against the cap (docs/sleep-wake.md, section 4).
  const Bytes counted = total_allocated_ - static_cast<Bytes>(sleep_stats_.sleeping_bytes.current);
  if (allowed_max_ && (flipped(RuleFlip::CapExclusive) ? counted + size >= *allowed_max_
                                                       : counted + size > *allowed_max_))
    return false;
  if (is_retry && flipped(RuleFlip::RetryCountedIfAllowed)) ++stats_.num_alloc_retries;  // rule flip
  if (config_.expandable_segments) {
    p.block = try_allocate_expandable_block(p);
    if (p.block != nullptr) count_device_alloc(*p.pool);  // §14.5
    return p.block != nullptr;
  }
  const auto addr = source_.allocate(size);
  if (!addr) return false;
  total_allocated_ += size;
  count_device_alloc(*p.pool);  // §14.5
  Block* b = new_block();
  b->stream = p.stream;
  b->size = size;
  b->ptr = *addr;
  b->pool = p.pool;
  DeviceStats::for_all_and(stats_.segment, stat_type(*p.pool), [](Stat& s) { s.increase(1); });
  DeviceStats::for_all_and(stats_.reserved_bytes, stat_type(*p.pool),
                           [&](Stat& s) { s.increase(static_cast<std::int64_t>(size)); });
  if (is_oversize(size)) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  record(TraceAction::SegmentAlloc, b->ptr, size, p.stream);
  p.block = b;
  return true;
}

bool Allocator::is_oversize(Bytes size) const {
  return flipped(RuleFlip::OversizeAboveMaxSplit) ? size > config_.max_split_size : size >= config_.max_split_size;
}

bool Allocator::should_split(const Block* b, Bytes size, bool expandable) const {
  // A MemPool made with no_split=True keeps every block whole (§15.2).
  if (never_splits(*b->pool)) return false;
  const Bytes remaining = b->size - size;
  // Small pool and expandable segments: any remainder of 512 B or more (§2.3; rule flips
  // small_split_rest_above_512, expandable_splits_like_large).
  const bool like_large = flipped(RuleFlip::ExpandableSplitsLikeLarge) && !b->pool->is_small;
  if ((b->pool->is_small || expandable) && !like_large)
    return flipped(RuleFlip::SmallSplitRestAbove512) ? remaining > kMinBlockSize : remaining >= kMinBlockSize;
  // Large pool: only below max_split_size, and only a remainder of more than 1 MiB (rule flips
  // oversize_splits, large_split_rest_at_least_1mib).
  const bool below_max = flipped(RuleFlip::OversizeSplits) || size < config_.max_split_size;
  return below_max && (flipped(RuleFlip::LargeSplitRestAtLeast1MiB) ? remaining >= kSmallSize : remaining > kSmallSize);
}

Block* Allocator::alloc_found_block(AllocParams& p, Bytes orig_size, bool split_remainder) {
  Block* block = p.block;
  BlockPool& pool = *p.pool;
  const StatType type = stat_type(pool);
  const bool already_split = block->is_split();
  if (split_remainder) {
    // The allocation is a new block at the low address; the original block object becomes
    // the remainder and keeps its stale requested_size (§2.4, §13.1).
    Block* remaining = block;
    block = new_block();
    block->stream = remaining->stream;  // the segment's stream (p.stream but under best_fit_any_stream)
    block->size = p.size;
    block->ptr = remaining->ptr;
    block->pool = &pool;
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += p.size;
    remaining->size -= p.size;
    if (flipped(RuleFlip::SplitRestForgetsRequested)) remaining->requested_size = 0;  // rule flip
    const std::int64_t age_base = remaining->gc_count_base;
    pool.insert(remaining);  // GC age of the remainder restarts (§13.7)
    if (flipped(RuleFlip::GcAgeKeptOnSplit)) remaining->gc_count_base = age_base;  // rule flip
    if (block->expandable == nullptr || flipped(RuleFlip::InactiveSplitCountsExpandable)) {
      if (already_split) {
        // An inactive split block shrank by the allocation.
        DeviceStats::for_all_and(stats_.inactive_split_bytes, type,
                                 [&](Stat& s) { s.decrease(static_cast<std::int64_t>(block->size)); });
      } else {
        // A new inactive split block: the remainder.
        DeviceStats::for_all_and(stats_.inactive_split_bytes, type, [&](Stat& s) {
          s.increase(static_cast<std::int64_t>(remaining->size));
        });
        DeviceStats::for_all_and(stats_.inactive_split, type, [](Stat& s) { s.increase(1); });
      }
    }
  } else if (already_split && (block->expandable == nullptr || flipped(RuleFlip::InactiveSplitCountsExpandable))) {
    // A whole inactive split block becomes active.
    DeviceStats::for_all_and(stats_.inactive_split_bytes, type,
                             [&](Stat& s) { s.decrease(static_cast<std::int64_t>(block->size)); });
    DeviceStats::for_all_and(stats_.inactive_split, type, [](Stat& s) { s.decrease(1); });
  }

  block->set_state(BlockState::Allocated);  // Free -> Allocated
  block->requested_size = orig_size;
  block->tag = current_tag();
  record(TraceAction::Alloc, block->ptr, orig_size, block->stream);
  active_blocks_.emplace(block->ptr, block);
  const auto size = static_cast<std::int64_t>(block->size);
  // Rule flip requested_bytes_rounded: the block size.
  const auto requested = static_cast<std::int64_t>(flipped(RuleFlip::RequestedBytesRounded) ? block->size : orig_size);
  DeviceStats::for_all_and(stats_.allocation, type, [](Stat& s) { s.increase(1); });
  DeviceStats::for_all_and(stats_.allocated_bytes, type, [&](Stat& s) { s.increase(size); });
  DeviceStats::for_all_and(stats_.active, type, [](Stat& s) { s.increase(1); });
  DeviceStats::for_all_and(stats_.active_bytes, type, [&](Stat& s) { s.increase(size); });
  DeviceStats::for_all_and(stats_.requested_bytes, type, [&](Stat& s) { s.increase(requested); });
  if (is_oversize(block->size)) stats_.oversize_allocations.increase(1);
  return block;
}

}  // namespace cachet::model
