// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): construction, rounding (§1.2, §1.3) and
// allocation (§2.2-2.4, §3.1, §3.2). Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <cstdint>
#include <bit>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "mutant.h"
#include "cachet/rule_flip.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

PytorchPolicy::PytorchPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config)
    : Shell(std::move(memory), config) {
  read_total_memory();
  check_expandable_usable(config_);
  if (config_.per_process_memory_fraction) set_memory_fraction(*config_.per_process_memory_fraction);
}

void PytorchPolicy::check_expandable_usable(const Config& c) const {
  if (!c.expandable_segments) return;
  if (!caps_.reserve_va)
    throw UsageError(
        "expandable_segments:True needs a backend that can reserve and map address space (CUDA VMM or "
        "the host simulation); this backend cannot. Use expandable_segments:False or another backend.");
  // §7: the reservation is 1.125 x the device's total memory; of 0 bytes it has no page to map.
  if (total_memory_ == 0)
    throw UsageError("expandable_segments:True reserves address space for 1.125 x the device's total memory, and "
                     "device " + std::to_string(device_) +
                     " reports 0 bytes (cudaMemGetInfo's total): nothing could be mapped. Give the device its "
                     "memory (the host backend: HostOptions::capacity or total_memory) or use "
                     "expandable_segments:False.");
}

PytorchPolicy::~PytorchPolicy() {
  // Give everything back to the device; errors cannot be reported from a destructor.
  for (auto& [s, q] : cuda_events_)
    for (auto& [e, b] : q) mem_->event_destroy(e);
  event_pool_.destroy_all(*mem_);
  for (auto& [buffer, ranges] : backup_buffers_) mem_->host_free(buffer);
  for (auto& [base, seg] : segments_) {
    if (seg->vmm) {  // cachet_sleep: unmap what is awake, then give the addresses back
      (void)vmm_segment_free(base, seg->size, seg->sleeping_runs == 0);
      continue;
    }
    if (!seg->expandable) {
      if (SegmentSource* source = seg->pool->owner != nullptr ? seg->pool->owner->source.get() : nullptr) {
        try {
          source->release(reinterpret_cast<void*>(static_cast<std::uintptr_t>(base)), seg->size, device_, seg->stream);
        } catch (...) {  // a destructor reports nothing
        }
      } else {
        (void)mem_->free(base);
      }
      continue;
    }
    for (Bytes i = 0; i < seg->page_mapped.size(); ++i)
      if (seg->page_mapped[i] && (seg->sleeping_runs == 0 || sleeping_range_at(base + i * seg->page_size) == nullptr))
        (void)mem_->unmap(base + i * seg->page_size, seg->page_size);
    (void)mem_->unreserve(base, seg->size);
  }
  for (auto& [p, n] : uncached_) (void)mem_->free(p);
  for_each_block_pool([](const BlockPool& pool) {
    auto& p = const_cast<BlockPool&>(pool);
    p.blocks.clear();
    p.unmapped.clear();
  });
  // Blocks still in segments (allocated, pending or cached) own heap memory of their own (a
  // stream_uses list that outgrew its inline capacity): destroy them, not just their storage.
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg->head; b != nullptr;) {
      Block* next = b->next;
      arena_.discard(b);
      b = next;
    }
    seg->head = nullptr;
  }
}

// ===================================================================== Rounding (§1.2, §1.3)

namespace {
std::uint32_t roundup_divisions(const Config& c, Bytes size) {
  const int log_size = 63 - std::countl_zero(size);
  // 1 MiB (rule flip divisions_entry_shifted: 2 MiB, one entry lower)
  const int interval_start = flipped(RuleFlip::DivisionsEntryShifted) ? 21 : 20;
  int index = log_size > interval_start ? log_size - interval_start : 0;
  index = std::min(index, kRoundUpPowerOfTwoIntervals - 1);
  return c.roundup_power2_divisions[static_cast<std::size_t>(index)];
}

Bytes roundup_power2_next_division(Bytes size, std::uint32_t divisions) {
  if (std::has_single_bit(size)) return size;
  const Bytes power2_floor = std::bit_floor(size);
  const Bytes power2_division = power2_floor >> (63 - std::countl_zero(static_cast<Bytes>(divisions)));
  if (power2_division == 0) return power2_floor << 1;
  const Bytes round_size_floor = size & ~(power2_division - 1);
  return round_size_floor == size ? size : round_size_floor + power2_division;
}
}  // namespace

// ===================================================================== The hot path's layout
//
// Inside PyTorch, 1-2 us of other code run between two allocator calls and evict the allocator's
// code from the CPU's instruction caches and TLB; what an allocate + free then costs grows with
// the number of code pages and lines it runs on (bench/RESULTS.md, "The c10 backend"). malloc
// and free are therefore hot and flattened ([[gnu::hot, gnu::flatten]]: their helpers inlined,
// in one section), their rare branches are out of line ([[gnu::noinline]], [[gnu::cold]]), and
// the free set's tree operations are compiled once, here, among them (gpu/README.md "The hot
// path").

[[gnu::hot, gnu::noinline, gnu::flatten]] void BlockPool::insert_free(Block& b) { blocks.insert(b); }
[[gnu::hot, gnu::noinline, gnu::flatten]] void BlockPool::erase_free(Block& b) { blocks.erase(blocks.iterator_to(b)); }

Bytes PytorchPolicy::round_size(Bytes size) const {
  const Bytes min_block = mutant(kMutantRound256) ? 256 : kMinBlockSize;  // §1.1
  const Bytes quantum = flipped(RuleFlip::Round1024) ? 2 * min_block : min_block;  // rule flip round_1024
  if (size < quantum) return quantum;
  const std::uint32_t divisions = roundup_divisions(config_, size);
  // Rule flips divisions_one_rounds (a value of 1 rounds too), divisions_inclusive (>=).
  const std::uint32_t min_divisions = flipped(RuleFlip::DivisionsOneRounds) ? 1 : 2;
  const bool above = flipped(RuleFlip::DivisionsInclusive) ? size >= min_block * divisions : size > min_block * divisions;
  if (divisions >= min_divisions && above) return roundup_power2_next_division(size, divisions);
  return quantum * ((size + quantum - 1) / quantum);
}

Bytes PytorchPolicy::allocation_size(Bytes size) const {
  if (is_small_size(size)) return flipped(RuleFlip::SmallSegment4MiB) ? 2 * kSmallBuffer : kSmallBuffer;
  if (size < kMinLargeAlloc || (flipped(RuleFlip::MidSegmentTo10MiB) && size == kMinLargeAlloc))
    return config_.large_segment_size;
  const Bytes round = flipped(RuleFlip::SegmentRound1MiB) ? kRoundLarge / 2 : kRoundLarge;  // rule flip
  return round * ((size + round - 1) / round);
}

// ===================================================================== Allocation (§2.2-2.4, §3.1, §3.2)

[[gnu::hot, gnu::flatten]] DevicePtr PytorchPolicy::malloc(Bytes orig_size, StreamId stream) {
  if (orig_size >= kMaxRequest) throw_request_too_large(orig_size);  // §1.2: before anything else
  if (orig_size == 0) return 0;
  check_stream(stream, "allocate");
  if (config_.no_caching) [[unlikely]]  // §4.1 PYTORCH_NO_CUDA_MEMORY_CACHING: raw device calls, no stats
    return malloc_uncached(orig_size);
  // §3.1 step 2; not while a capture or use_mem_pool is under way (§14.7).
  if ((pending_events_ != 0 || !deferred_blocks_.empty()) && !capture_underway()) process_events();
  // During a capture, with graph_capture_record_stream_reuse: the deferred frees of this stream that
  // the capture's graph orders before it (§14.10.1).
  if (capture_underway() && config_.graph_capture_record_stream_reuse && caps_.capture_graph)
    free_safe_blocks_in_capture(stream);

  const Bytes size = round_size(orig_size);
  // The default pools, or the private pool of an active capture or use_mem_pool (§14.2).
  BlockPool& pool = captures_underway_.empty() ? (is_small_size(size) ? small_blocks_ : large_blocks_)
                                               : get_pool(size, stream);
  AllocParams p{stream, size, allocation_size(size), &pool, nullptr};
  p.tag = current_tag_id();  // docs/sleep-wake.md section 1: "default" (0) unless the thread set a tag
  // Expandable segments apply to every pool but one with its own source (§15.1).
  p.expandable_active = config_.expandable_segments && (pool.owner == nullptr || pool.owner->source == nullptr);

  bool found = get_free_block(p);  // (no free-memory callbacks are registered: §3.1 step 4)
  if (mutant(kMutantPrivateBlockToDefault))  // planted: the default pools borrow a private pool's free block
    for (auto it = graph_pools_.begin(); !found && pool.owner == nullptr && it != graph_pools_.end(); ++it) {
      AllocParams q = p;
      q.pool = size <= kSmallSize ? &it->second->small : &it->second->large;
      if ((found = get_free_block(q))) p = q;
    }
  if (!found) [[unlikely]]
    found = grow_or_release(p);
  if (!found) throw_oom(p);
  const bool split = should_split(p.block, p.size, p.expandable_active);
  Block* b = alloc_found_block(p, orig_size, split);
  return b->ptr;
}

// malloc's slow path (§3.1 steps 3-6): no cached block fits; a new segment, after the GC, from a
// use_on_oom pool, after giving back free segments, after freeing the cache.
bool PytorchPolicy::grow_or_release(AllocParams& p) {
  BlockPool& pool = *p.pool;
  bool found = false;
  const bool gc = cap_.allowed() && config_.garbage_collection_threshold > 0.0;
  // Rule flip alloc_before_gc: a new segment is tried first.
  if (flipped(RuleFlip::AllocBeforeGc)) found = alloc_block(p, false);
  if (!found) {
    refuse_giving_back_in_capture(p, gc, false);  // §14.8.2
    if (gc) garbage_collect_cached_blocks();
    found = alloc_block(p, false);
  }
  // The pools marked use_on_oom lend a free block before any cached memory goes back (§15.2).
  if (!found && use_on_oom_pools_.size() != 0 && pool.owner == nullptr) found = try_mempool_fallback(p);
  if (!found && !flipped(RuleFlip::NoReleaseAvailable)) {  // rule flip no_release_available
    refuse_giving_back_in_capture(p, false, true);  // §14.8.2
    found = release_available_cached_blocks(p) && alloc_block(p, false);
  }
  // The last retry frees the cache; never while a capture or use_mem_pool is under way (§14.6).
  // Rule flip retry_inside_pool: only a graph capture stops it.
  const bool retry_allowed = flipped(RuleFlip::RetryInsidePool) ? !graph_capture_underway() : !capture_underway();
  if (!found && retry_allowed) {
    release_cached_blocks();
    found = alloc_block(p, true);  // counted as a retry even if the cap refuses it (§13.6)
  }
  return found;
}

// §4.1 PYTORCH_NO_CUDA_MEMORY_CACHING: raw device calls, no stats.
DevicePtr PytorchPolicy::malloc_uncached(Bytes orig_size) {
  auto r = mem_->malloc(orig_size);
  if (r.status.is_oom()) {
    OomFacts f;
    f.alloc_size = orig_size;
    f.device = device_;
    if (auto info = mem_->mem_get_info(); info.is_ok()) {
      f.device_free = info.value.free;
      f.device_total = info.value.total;
    }
    throw OutOfMemory(f);
  }
  if (!r.is_ok()) throw DeviceError(device_error("cudaMalloc", orig_size, device_, r.status));
  uncached_[r.value] = orig_size;
  return r.value;
}

bool PytorchPolicy::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (cap_.allowed() && config_.garbage_collection_threshold > 0.0) ++pool.get_free_blocks_call_count;  // §13.3
  return find_free_block(p);
}

FreeSet::iterator PytorchPolicy::skip_foreign_slow(BlockPool& pool, FreeSet::iterator it, const AllocParams& p) const {
  while (it != pool.blocks.end() && it->stream == p.stream && foreign(*it, p.tag)) ++it;
  return it;
}

bool PytorchPolicy::foreign(const Block& b, std::uint32_t tag) {
  const Segment& seg = *b.segment;
  if (seg.tag == tag) return false;
  // An expandable segment as any other: the tag of its live blocks, if it has any.
  for (const Block* x = seg.head; x != nullptr; x = x->next)
    if (x->is_active()) return true;
  return false;  // no live block: any tag may take it (SLEEP-R1)
}

// PyTorch's find_free_block (§2.2). With tags, the blocks of segments holding live blocks of
// another tag take no part in the search, as if they were not in the pool (docs/sleep-wake.md
// section 2): every step of it skips them (skip_foreign, taboo); with none ever set, nothing is
// skipped.
bool PytorchPolicy::find_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, p.size, 0}, SizeOrder{});  // equal sizes: lowest address
  if (mutant(kMutantCrossStreamReuse)) {
    it = skip_foreign(pool, it, p);
    if (it == pool.blocks.end() || it->stream != p.stream) {
      it = pool.blocks.begin();
      while (it != pool.blocks.end() && (it->size < p.size || taboo(*it, p))) ++it;
    }
    if (it == pool.blocks.end()) return false;
  } else if (flipped(RuleFlip::BestFitAnyStream)) {
    // Rule flip: the smallest fit (lowest address among equals) of any stream.
    it = pool.blocks.end();
    for (auto c = pool.blocks.begin(); c != pool.blocks.end(); ++c)
      if (c->size >= p.size && !taboo(*c, p) &&
          (it == pool.blocks.end() || c->size < it->size || (c->size == it->size && c->ptr < it->ptr)))
        it = c;
    if (it == pool.blocks.end()) return false;
  } else {
    it = skip_foreign(pool, it, p);
    if (it == pool.blocks.end() || it->stream != p.stream) return false;  // blocks stay on their stream
  }
  if (flipped(RuleFlip::BestFitHighestAddress))  // rule flip: the last of the equal sizes
    for (auto next = std::next(it); next != pool.blocks.end() && next->stream == it->stream && next->size == it->size;
         ++next)
      if (!taboo(*next, p)) it = next;

  if (it->expandable()) {  // §2.2 step 3
    if (p.expandable_active && flipped(RuleFlip::ExpandableFirstFit)) {
      // Rule flip: the first expandable block as it is.
    } else if (p.expandable_active) {
      auto expandable_size = [](const Block& b) {
        return b.size + (b.next && !b.next->is_mapped() ? b.next->size : 0);
      };
      auto next = skip_foreign(pool, std::next(it), p);
      while (it->expandable() && next != pool.blocks.end() && next->stream == p.stream &&
             expandable_size(*next) < expandable_size(*it)) {
        it = next;
        next = skip_foreign(pool, std::next(it), p);
      }
    } else {
      do {
        it = skip_foreign(pool, std::next(it), p);
      } while (it != pool.blocks.end() && it->expandable() && it->stream == p.stream);
      if (it == pool.blocks.end() || it->stream != p.stream) return false;
    }
  }
  CACHET_ASSERT(!taboo(*it, p));

  const Bytes max_split = config_.max_split_size;
  // §2.2 step 4: a normal request never takes an oversize block ...
  if (!mutant(kMutantOversizeToSmall) && !flipped(RuleFlip::OversizeForAll) && p.size < max_split &&
      it->size >= max_split)
    return false;
  // ... and an oversize request takes one only within the non-split rounding allowance (rule
  // flips non_split_rounding_1mib, non_split_rounding_inclusive).
  const Bytes allowance = flipped(RuleFlip::NonSplitRounding1MiB) ? MiB : config_.max_non_split_rounding;
  if (p.size >= max_split && (flipped(RuleFlip::NonSplitRoundingInclusive) ? it->size > p.size + allowance
                                                                            : it->size >= p.size + allowance))
    return false;
  // The block stays in the tree: alloc_found_block shrinks it in place when it splits (the
  // remainder keeps the node), or erases it.
  p.block = &*it;
  p.in_pool = true;
  return true;
}

bool PytorchPolicy::should_split(const Block* b, Bytes size, bool expandable_active) const {
  // A pool marked no_split never splits (§15.2).
  if (no_split(*b->segment->pool)) return false;
  const Bytes remaining = b->size - size;
  // §2.3 (rule flips small_split_rest_above_512, expandable_splits_like_large)
  const bool like_large = flipped(RuleFlip::ExpandableSplitsLikeLarge) && !b->is_small;
  if ((b->is_small || expandable_active) && !like_large)
    return flipped(RuleFlip::SmallSplitRestAbove512) ? remaining > kMinBlockSize : remaining >= kMinBlockSize;
  if (mutant(kMutantSplitBelowLimit)) return size < config_.max_split_size && remaining >= kMinBlockSize;
  // Rule flips oversize_splits, large_split_rest_at_least_1mib.
  const bool below_max = flipped(RuleFlip::OversizeSplits) || size < config_.max_split_size;
  return below_max && (flipped(RuleFlip::LargeSplitRestAtLeast1MiB) ? remaining >= kSmallSize : remaining > kSmallSize);
}

bool PytorchPolicy::alloc_block(AllocParams& p, bool is_retry) {
  // §3.2: counted before the attempt (rule flip retry_counted_if_allowed: after the cap check)
  if (is_retry && !flipped(RuleFlip::RetryCountedIfAllowed)) accounting_.alloc_retried();
  const Bytes size = p.alloc_size;
  // The cap is inclusive (§13.4; rule flip cap_exclusive); with expandable segments it is checked
  // against the segment size of the request, not the pages that will be mapped (§13.5).
  if (!mutant(kMutantIgnoreCap) && cap_.allowed() &&
      (flipped(RuleFlip::CapExclusive) ? total_allocated_memory_ - sleeping_bytes_ + size >= *cap_.allowed()
                                       : total_allocated_memory_ - sleeping_bytes_ + size > *cap_.allowed())) {
    // (Sleeping bytes stay reserved but not against the cap: docs/sleep-wake.md section 4, SLEEP-R5.)
    return false;
  }
  if (is_retry && flipped(RuleFlip::RetryCountedIfAllowed)) accounting_.alloc_retried();
  if (p.expandable_active) {
    p.block = try_allocate_expandable_block(p.stream, p.pool, p.size, p.tag);
    if (p.block != nullptr) count_device_alloc(*p.pool);  // one per growth (§14.5)
    return p.block != nullptr;
  }
  Result<DevicePtr> r;
  if (SegmentSource* source = p.pool->owner != nullptr ? p.pool->owner->source.get() : nullptr) {
    // A MemPool's own allocator (§15.1): nullptr is its out of memory.
    void* got = source->allocate(size, device_, p.stream);
    r = got != nullptr ? Result<DevicePtr>{Status::ok(), static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(got))}
                       : Result<DevicePtr>{Status::oom("the MemPool's allocator returned no memory"), 0};
  } else if (config_.sleep) {
    r = vmm_segment_alloc(size);  // reserve + map: its addresses can outlive its memory (docs/sleep-wake.md section 6)
  } else {
    r = mem_->malloc(size);
  }
  if (r.status.is_oom()) {
    return false;
  }
  if (!r.is_ok()) throw DeviceError(device_error("cudaMalloc", size, device_, r.status));

  auto seg = std::make_unique<Segment>();
  seg->pool = p.pool;
  seg->base = r.value;
  seg->size = mutant(kMutantSegmentSizeShort) ? size - kMinBlockSize : size;
  seg->stream = p.stream;
  seg->is_small = p.pool->is_small;
  seg->tag = p.tag;
  seg->vmm = config_.sleep && (p.pool->owner == nullptr || p.pool->owner->source == nullptr);
  Block* b = arena_.make();
  b->ptr = r.value;
  b->size = size;
  b->stream = p.stream;
  b->segment = seg.get();
  b->is_small = p.pool->is_small;
  seg->head = b;
  segments_.emplace(r.value, std::move(seg));
  if (p.pool->owner != nullptr) ++p.pool->owner->segments;
  count_device_alloc(*p.pool);  // §14.5

  total_allocated_memory_ += size;
  accounting_.segment_allocated(stat_type(*p.pool), size, is_oversize(size));
  record(TraceAction::SegmentAlloc, r.value, size, p.stream, trace_pool(*p.pool));
  p.block = b;
  return true;
}

void PytorchPolicy::link_after(Block* nb, Block* b) {
  nb->prev = b;
  nb->next = b->next;
  if (b->next && !mutant(kMutantLinkAfterNoBackLink)) b->next->prev = nb;
  b->next = nb;
}

Block* PytorchPolicy::alloc_found_block(AllocParams& p, Bytes orig_size, bool split) {
  BlockPool& pool = *p.pool;
  const StatType st = stat_type(pool);
  Block* block = p.block;
  const bool already_split = block->is_split();
  const bool expandable = block->expandable();

  if (split) {
    // §2.4: the allocation is a new block at the low address; the original block object is the
    // remainder and keeps its (stale) requested_size (§13.1).
    Block* remaining = block;
    bool reinsert = true;
    if (p.in_pool) {
      // Its key shrinks; the tree order still holds unless the predecessor now sorts after it.
      auto it = pool.blocks.iterator_to(*remaining);
      const SizeKey k{remaining->stream, remaining->size - p.size, remaining->ptr + p.size};
      if (it == pool.blocks.begin() || SizeOrder{}(*std::prev(it), k)) reinsert = false;
      else pool.erase_free(*remaining);
    }
    block = arena_.make();
    block->ptr = remaining->ptr;
    block->size = p.size;
    block->stream = remaining->stream;
    block->segment = remaining->segment;
    block->is_small = remaining->is_small;
    block->prev = remaining->prev;
    if (block->prev) block->prev->next = block;
    else block->segment->head = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += mutant(kMutantSplitRemainderGap) ? p.size + kMinBlockSize : p.size;
    remaining->size -= p.size;
    if (flipped(RuleFlip::SplitRestForgetsRequested)) remaining->requested_size = 0;  // rule flip
    const std::int64_t age_base = remaining->gc_count_base;
    if (reinsert) pool.insert_into_blocks(remaining);  // resets its GC age
    else remaining->gc_count_base = pool.get_free_blocks_call_count;
    if (flipped(RuleFlip::GcAgeKeptOnSplit)) remaining->gc_count_base = age_base;  // rule flip
    // inactive_split excludes expandable segments (§13.2; rule flip inactive_split_counts_expandable).
    // A split block's piece became active; splitting an unsplit block leaves its remainder as a
    // new inactive split.
    const bool counted = !expandable || flipped(RuleFlip::InactiveSplitCountsExpandable);
    if (already_split && counted) accounting_.inactive_split_changed(st, 0, -static_cast<std::int64_t>(block->size));
    else if (counted) accounting_.inactive_split_changed(st, 1, static_cast<std::int64_t>(remaining->size));
  } else {
    if (p.in_pool) pool.erase_free(*block);
  }
  if (!split && already_split && (!expandable || flipped(RuleFlip::InactiveSplitCountsExpandable)))
    accounting_.inactive_split_changed(st, -1, -static_cast<std::int64_t>(block->size));

  block->set_state(BlockState::Allocated);
  block->tag = p.tag;
  block->segment->tag = p.tag;  // SLEEP-R1: the segment takes the tag of its live blocks
  block->requested_size = mutant(kMutantRequestedIsSegment) ? p.alloc_size : orig_size;
  active_.insert(block->ptr, block);
  accounting_.block_allocated(st, block->size, flipped(RuleFlip::RequestedBytesRounded) ? block->size : orig_size,
                              is_oversize(block->size));  // rule flip requested_bytes_rounded
  record_block(TraceAction::Alloc, block, orig_size);
  return block;
}

}  // namespace cachet::gpu::detail
