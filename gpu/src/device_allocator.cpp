// PytorchPolicy: PyTorch 2.11's caching rules for one device (§1-3, §5-7, §13). Section
// numbers (§) in comments refer to docs/pytorch-allocator.md.
//
// Banners: Rounding | Allocation | Free and merge | Events | Release and GC |
// Expandable segments | Snapshot and trace | Errors.
#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "core.h"
#include "messages.h"
#include "mutant.h"

namespace cachet::gpu::detail {

namespace {

template <class F>
void for_all_and(StatArray& a, StatType pool, F&& f) {
  DeviceStats::for_all_and(a, pool, std::forward<F>(f));
}

}  // namespace

PytorchPolicy::PytorchPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config)
    : Shell(std::move(memory), config) {
  read_total_memory();
  if (config_.expandable_segments && !caps_.reserve_va)
    throw UsageError(
        "expandable_segments:True needs a backend that can reserve and map address space (CUDA VMM or "
        "the host simulation); this backend cannot. Use expandable_segments:False or another backend.");
  stats_.max_split_size = config_.max_split_size_stat();  // set once, at construction (§4.1)
  if (config_.per_process_memory_fraction) set_memory_fraction(*config_.per_process_memory_fraction);
}

PytorchPolicy::~PytorchPolicy() {
  // Give everything back to the device; errors cannot be reported from a destructor.
  for (auto& [s, q] : cuda_events_)
    for (auto& [e, b] : q) mem_->event_destroy(e);
  event_pool_.destroy_all(*mem_);
  for (auto& [base, seg] : segments_) {
    if (!seg->expandable) {
      (void)mem_->free(base);
      continue;
    }
    for (Bytes i = 0; i < seg->page_mapped.size(); ++i)
      if (seg->page_mapped[i]) (void)mem_->unmap(base + i * seg->page_size, seg->page_size);
    (void)mem_->unreserve(base, seg->size);
  }
  for (auto& [p, n] : uncached_) (void)mem_->free(p);
  large_blocks_.blocks.clear();
  large_blocks_.unmapped.clear();
  small_blocks_.blocks.clear();
  small_blocks_.unmapped.clear();
  // Blocks still in segments (allocated, pending or cached) own heap memory of their own (a
  // stream_uses list that outgrew its inline capacity): destroy them, not just their storage.
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg->head; b != nullptr;) {
      Block* next = b->next;
      arena_.release(b);
      b = next;
    }
    seg->head = nullptr;
  }
}

// ===================================================================== Rounding (§1.2, §1.3)

namespace {
std::uint32_t roundup_divisions(const Config& c, Bytes size) {
  const int log_size = 63 - std::countl_zero(size);
  constexpr int interval_start = 20;  // 1 MiB
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

Bytes PytorchPolicy::round_size(Bytes size) const {
  constexpr Bytes min_block = mutant(kMutantRound256) ? 256 : kMinBlockSize;  // §1.1
  if (size < min_block) return min_block;
  const std::uint32_t divisions = roundup_divisions(config_, size);
  if (divisions > 1 && size > min_block * divisions) return roundup_power2_next_division(size, divisions);
  return min_block * ((size + min_block - 1) / min_block);
}

Bytes PytorchPolicy::allocation_size(Bytes size) const {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return config_.large_segment_size;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

// ===================================================================== Allocation (§2.2-2.4, §3.1, §3.2)

DevicePtr PytorchPolicy::malloc(Bytes orig_size, StreamId stream) {
  if (orig_size >= kMaxRequest) throw_request_too_large(orig_size);  // §1.2: before anything else
  if (orig_size == 0) return 0;
  check_stream(stream, "allocate");
  if (config_.no_caching) {  // §4.1 PYTORCH_NO_CUDA_MEMORY_CACHING: raw device calls, no stats
    auto r = mem_->malloc(orig_size);
    if (r.status.is_oom()) {
      OomFacts f;
      f.alloc_size = orig_size;
      f.device = device_;
      if (auto info = mem_->mem_get_info(); info.is_ok()) {
        f.device_free = info.value.free;
        f.device_total = info.value.total;
      }
      throw OutOfMemory(oom_message(f));
    }
    if (!r.is_ok()) throw DeviceError(device_error("cudaMalloc", orig_size, device_, r.status));
    uncached_[r.value] = orig_size;
    return r.value;
  }
  if (pending_events_ != 0) process_events();  // §3.1 step 2

  const Bytes size = round_size(orig_size);
  BlockPool& pool = size <= kSmallSize ? small_blocks_ : large_blocks_;
  AllocParams p{stream, size, allocation_size(size), &pool, nullptr, Status::ok()};

  bool found = get_free_block(p);  // (no free-memory callbacks are registered: §3.1 step 4)
  if (!found) {
    if (cap_.allowed() && config_.garbage_collection_threshold > 0.0) garbage_collect_cached_blocks();
    found = alloc_block(p, false) || (release_available_cached_blocks(p) && alloc_block(p, false));
    if (!found) {
      release_cached_blocks();
      found = alloc_block(p, true);  // counted as a retry even if the cap refuses it (§13.6)
    }
  }
  if (!found) throw_oom(p);
  const bool split = should_split(p.block, p.size);
  Block* b = alloc_found_block(p, orig_size, split);
  return b->ptr;
}

bool PytorchPolicy::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (cap_.allowed() && config_.garbage_collection_threshold > 0.0) ++pool.get_free_blocks_call_count;  // §13.3
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, p.size, 0}, SizeOrder{});  // equal sizes: lowest address
  if constexpr (mutant(kMutantCrossStreamReuse)) {
    if (it == pool.blocks.end() || it->stream != p.stream) {
      it = pool.blocks.begin();
      while (it != pool.blocks.end() && it->size < p.size) ++it;
    }
    if (it == pool.blocks.end()) return false;
  } else {
    if (it == pool.blocks.end() || it->stream != p.stream) return false;  // blocks stay on their stream
  }

  if (it->expandable()) {  // §2.2 step 3
    if (config_.expandable_segments) {
      auto expandable_size = [](const Block& b) {
        return b.size + (b.next && !b.next->mapped ? b.next->size : 0);
      };
      auto next = std::next(it);
      while (it->expandable() && next != pool.blocks.end() && next->stream == p.stream &&
             expandable_size(*next) < expandable_size(*it)) {
        it = next++;
      }
    } else {
      do {
        ++it;
      } while (it != pool.blocks.end() && it->expandable() && it->stream == p.stream);
      if (it == pool.blocks.end() || it->stream != p.stream) return false;
    }
  }

  const Bytes max_split = config_.max_split_size;
  // §2.2 step 4: a normal request never takes an oversize block ...
  if (!mutant(kMutantOversizeToSmall) && p.size < max_split && it->size >= max_split) return false;
  // ... and an oversize request takes one only within the non-split rounding allowance.
  if (p.size >= max_split && it->size >= p.size + config_.max_non_split_rounding) return false;
  // The block stays in the tree: alloc_found_block shrinks it in place when it splits (the
  // remainder keeps the node), or erases it.
  p.block = &*it;
  p.in_pool = true;
  return true;
}

bool PytorchPolicy::should_split(const Block* b, Bytes size) const {
  const Bytes remaining = b->size - size;
  if (b->is_small || config_.expandable_segments) return remaining >= kMinBlockSize;  // §2.3
  if constexpr (mutant(kMutantSplitBelowLimit)) return size < config_.max_split_size && remaining >= kMinBlockSize;
  return size < config_.max_split_size && remaining > kSmallSize;
}

bool PytorchPolicy::alloc_block(AllocParams& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;  // §3.2: counted before the attempt
  const Bytes size = p.alloc_size;
  // The cap is inclusive (§13.4); with expandable segments it is checked against the segment
  // size of the request, not the pages that will be mapped (§13.5).
  if (!mutant(kMutantIgnoreCap) && cap_.allowed() && total_allocated_memory_ + size > *cap_.allowed()) {
    p.err = Status::oom();
    return false;
  }
  if (config_.expandable_segments) {
    p.block = try_allocate_expandable_block(p.stream, p.pool, p.size);
    return p.block != nullptr;
  }
  auto r = mem_->malloc(size);
  if (r.status.is_oom()) {
    p.err = r.status;
    return false;
  }
  if (!r.is_ok()) throw DeviceError(device_error("cudaMalloc", size, device_, r.status));

  auto seg = std::make_unique<Segment>();
  seg->base = r.value;
  seg->size = mutant(kMutantSegmentSizeShort) ? size - kMinBlockSize : size;
  seg->stream = p.stream;
  seg->is_small = p.pool->is_small;
  Block* b = arena_.make();
  b->ptr = r.value;
  b->size = size;
  b->stream = p.stream;
  b->segment = seg.get();
  b->is_small = p.pool->is_small;
  seg->head = b;
  segments_.emplace(r.value, std::move(seg));

  total_allocated_memory_ += size;
  const StatType st = stat_type(*p.pool);
  for_all_and(stats_.segment, st, [](Stat& s) { s.increase(1); });
  for_all_and(stats_.reserved_bytes, st, [&](Stat& s) { s.increase(static_cast<std::int64_t>(size)); });
  if (size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  record(TraceAction::SegmentAlloc, r.value, size, p.stream);
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
      else pool.blocks.erase(it);
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
    if (reinsert) pool.insert_into_blocks(remaining);  // resets its GC age
    else remaining->gc_count_base = pool.get_free_blocks_call_count;
    if (already_split && !expandable) {
      for_all_and(stats_.inactive_split_bytes, st, [&](Stat& s) { s.decrease(static_cast<std::int64_t>(block->size)); });
    } else if (!expandable) {
      for_all_and(stats_.inactive_split_bytes, st, [&](Stat& s) { s.increase(static_cast<std::int64_t>(remaining->size)); });
      for_all_and(stats_.inactive_split, st, [](Stat& s) { s.increase(1); });
    }
  } else {
    if (p.in_pool) pool.blocks.erase(pool.blocks.iterator_to(*block));
  }
  if (!split && already_split && !expandable) {
    for_all_and(stats_.inactive_split_bytes, st, [&](Stat& s) { s.decrease(static_cast<std::int64_t>(block->size)); });
    for_all_and(stats_.inactive_split, st, [](Stat& s) { s.decrease(1); });
  }

  block->allocated = true;
  block->requested_size = mutant(kMutantRequestedIsSegment) ? p.alloc_size : orig_size;
  active_.insert(block->ptr, block);
  const auto bsize = static_cast<std::int64_t>(block->size);
  for_all_and(stats_.allocation, st, [](Stat& s) { s.increase(1); });
  for_all_and(stats_.allocated_bytes, st, [&](Stat& s) { s.increase(bsize); });
  for_all_and(stats_.active, st, [](Stat& s) { s.increase(1); });
  for_all_and(stats_.active_bytes, st, [&](Stat& s) { s.increase(bsize); });
  for_all_and(stats_.requested_bytes, st, [&](Stat& s) { s.increase(static_cast<std::int64_t>(orig_size)); });
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
  record(TraceAction::Alloc, block->ptr, orig_size, block->stream);
  return block;
}

// ===================================================================== Free and merge (§2.5)

void PytorchPolicy::free(DevicePtr ptr) {
  if (ptr == 0) return;
  if (config_.no_caching) {
    auto it = uncached_.find(ptr);
    if (it == uncached_.end())
      throw UsageError("free(" + hex(ptr) + "): not an allocation of this allocator (device " +
                       std::to_string(device_) + ", caching disabled); pass a pointer allocate() returned");
    auto st = mem_->free(ptr);
    if (!st.is_ok()) throw DeviceError(device_error("cudaFree", it->second, device_, st));
    uncached_.erase(it);
    return;
  }
  Block* b = find_active(ptr, "free");
  if (!b->allocated)
    throw UsageError("free(" + hex(ptr) + "): double free: the block was already freed and is waiting for " +
                     std::to_string(b->event_count) + " stream-use event(s); free each pointer once");

  // Stream uses: record one event per using stream before changing anything, so a failing
  // event call leaves the block allocated and the stats untouched (§6).
  std::vector<std::pair<EventHandle, StreamId>> events;
  const bool wait_for_uses = !b->stream_uses.empty() && !mutant(kMutantIgnorePendingEvent);
  if (wait_for_uses) {
    events.reserve(b->stream_uses.size());
    event_pool_.record_on(*mem_, device_, b->stream_uses, events,
                          [](EventHandle e, StreamId s) { return std::pair{e, s}; });
  }

  b->allocated = false;
  const StatType st = stat_type(pool_for(b));
  const auto bsize = static_cast<std::int64_t>(b->size);
  for_all_and(stats_.allocation, st, [](Stat& s) { s.decrease(1); });
  for_all_and(stats_.allocated_bytes, st, [&](Stat& s) { s.decrease(bsize); });
  record(TraceAction::FreeRequested, b->ptr, b->requested_size, b->stream);
  if (b->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);

  if (wait_for_uses) {
    b->stream_uses.clear();
    for (auto& [e, s] : events) {
      b->event_count += mutant(kMutantDoubleCountEvent) ? 2 : 1;
      cuda_events_[s].emplace_back(e, b);
      ++pending_events_;
    }
  } else {
    b->stream_uses.clear();
    free_block(b);
  }
}

void PytorchPolicy::free_block(Block* b) {
  CACHET_ASSERT(!b->allocated && b->event_count == 0 && b->stream_uses.empty());
  record(TraceAction::FreeCompleted, b->ptr, b->requested_size, b->stream);
  const Bytes original_size = b->size;
  const Bytes requested = b->requested_size;
  BlockPool& pool = pool_for(b);
  active_.erase(b->ptr);  // keyed by address, which a merge with prev changes

  std::int64_t net_blocks = 0;
  std::int64_t net_bytes = 0;
  // Merge with the free neighbours (try_merge_blocks' rule). PyTorch keeps the freed block
  // object and deletes the neighbours; here a neighbour already in the tree keeps its node and
  // takes on the freed block's requested_size, which is observably the same and saves a tree
  // erase and insert on the hot path.
  bool in_tree = false;
  if (Block* prev = b->prev; mergeable(b, prev)) {
    net_blocks -= 1;
    net_bytes -= static_cast<std::int64_t>(prev->size);
    prev->size += b->size;
    prev->requested_size = b->requested_size;
    prev->next = b->next;
    if (prev->next) prev->next->prev = prev;
    arena_.release(b);
    b = prev;
    in_tree = true;
  }
  if (Block* next = mutant(kMutantSkipMergeNext) ? nullptr : b->next; mergeable(b, next)) {
    net_blocks -= 1;
    net_bytes -= static_cast<std::int64_t>(next->size);
    if (in_tree) {
      pool.blocks.erase(pool.blocks.iterator_to(*next));
      b->size += next->size;
      b->next = next->next;
      if (b->next) b->next->prev = b;
      arena_.release(next);
    } else {
      next->ptr = b->ptr;
      next->size += b->size;
      next->requested_size = b->requested_size;
      next->prev = b->prev;
      if (next->prev) next->prev->next = next;
      else next->segment->head = next;
      arena_.release(b);
      b = next;
      in_tree = true;
    }
  }
  if (in_tree) {
    // The key grew (size up): the order holds unless the successor now sorts before it.
    b->gc_count_base = pool.get_free_blocks_call_count;
    auto it = pool.blocks.iterator_to(*b);
    if (auto nx = std::next(it); !mutant(kMutantMergeKeepsTreePlace) && nx != pool.blocks.end() && !SizeOrder{}(*b, *nx)) {
      pool.blocks.erase(it);
      pool.blocks.insert(*b);
    }
  } else {
    pool.insert_into_blocks(b);
  }
  if (b->is_split()) {
    net_blocks += 1;
    net_bytes += static_cast<std::int64_t>(b->size);
  }

  const StatType st = stat_type(pool);
  if (!b->expandable()) {  // inactive_split excludes expandable segments; moves once, by the net (§13.2)
    if (net_blocks > 0) for_all_and(stats_.inactive_split, st, [&](Stat& s) { s.increase(net_blocks); });
    else if (net_blocks < 0) for_all_and(stats_.inactive_split, st, [&](Stat& s) { s.decrease(-net_blocks); });
    if (net_bytes > 0) for_all_and(stats_.inactive_split_bytes, st, [&](Stat& s) { s.increase(net_bytes); });
    else if (net_bytes < 0) for_all_and(stats_.inactive_split_bytes, st, [&](Stat& s) { s.decrease(-net_bytes); });
  }
  for_all_and(stats_.active, st, [](Stat& s) { s.decrease(1); });
  for_all_and(stats_.active_bytes, st, [&](Stat& s) { s.decrease(static_cast<std::int64_t>(original_size)); });
  if constexpr (!mutant(kMutantForgetRequested))
    for_all_and(stats_.requested_bytes, st, [&](Stat& s) { s.decrease(static_cast<std::int64_t>(requested)); });
}

Bytes PytorchPolicy::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  if (!src || src->allocated || src->event_count > 0 || !src->stream_uses.empty() || dst->mapped != src->mapped)
    return 0;
  if (dst->prev == src) {  // [src dst]: dst takes src's address and place
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    else dst->segment->head = dst;
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const Bytes subsumed = src->size;
  dst->size += subsumed;
  if (src->mapped) pool.blocks.erase(pool.blocks.iterator_to(*src));
  else pool.unmapped.erase(pool.unmapped.iterator_to(*src));
  arena_.release(src);
  return subsumed;
}

// ===================================================================== Events (§6)

void PytorchPolicy::record_stream(DevicePtr ptr, StreamId stream) {
  check_stream(stream, "record_stream");
  if (config_.no_caching) return;
  Block* b = find_active(ptr, "record_stream");
  if (!b->allocated)
    throw UsageError("record_stream(" + hex(ptr) + ", stream " + std::to_string(stream) +
                     "): the block was already freed; record stream uses before freeing");
  if (stream == b->stream) return;  // uses on the allocation stream need no event
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void PytorchPolicy::process_events() {
  // Per stream FIFO; stop at the first event not yet complete on that stream (§6).
  for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
    auto& q = it->second;
    while (!q.empty()) {
      auto [e, b] = q.front();
      auto r = mem_->event_query(e);
      if (!r.is_ok()) throw DeviceError(device_error("cudaEventQuery", 0, device_, r.status));
      if (!r.value) break;
      q.pop_front();
      --pending_events_;
      event_pool_.release(e);
      if (--b->event_count == 0) free_block(b);
    }
    if (q.empty()) it = cuda_events_.erase(it);
    else ++it;
  }
}

void PytorchPolicy::synchronize_and_free_events() {
  ++stats_.num_sync_all_streams;
  for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
    auto& q = it->second;
    while (!q.empty()) {
      auto [e, b] = q.front();
      auto st = mem_->event_synchronize(e);
      if (!st.is_ok()) throw DeviceError(device_error("cudaEventSynchronize", 0, device_, st));
      q.pop_front();
      --pending_events_;
      event_pool_.release(e);
      if (--b->event_count == 0) free_block(b);
    }
    it = cuda_events_.erase(it);
  }
}

// ===================================================================== Release and GC (§3.3-3.6)

void PytorchPolicy::empty_cache() {
  if (config_.no_caching) return;
  release_cached_blocks();
}

void PytorchPolicy::release_cached_blocks() {
  synchronize_and_free_events();
  release_blocks(large_blocks_);  // large pool first, then small (§3.4, §13.6)
  release_blocks(small_blocks_);
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
    if (!b->mapped && !b->is_split()) release_expandable_segment(b);
  }
}

void PytorchPolicy::release_block(Block* b) {
  CACHET_ASSERT(!b->expandable() && !b->is_split() && !b->allocated);
  auto st = mem_->free(b->ptr);  // device first: a failure changes nothing
  if (!st.is_ok()) throw DeviceError(device_error("cudaFree", b->size, device_, st));
  BlockPool& pool = pool_for(b);
  ++stats_.num_device_free;
  record(TraceAction::SegmentFree, b->ptr, b->size, b->stream);
  if constexpr (!mutant(kMutantReleaseKeepsReserved)) total_allocated_memory_ -= b->size;
  const StatType t = stat_type(pool);
  for_all_and(stats_.segment, t, [](Stat& s) { s.decrease(1); });
  for_all_and(stats_.reserved_bytes, t, [&](Stat& s) { s.decrease(static_cast<std::int64_t>(b->size)); });
  if (b->size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
  pool.blocks.erase(pool.blocks.iterator_to(*b));
  segments_.erase(b->segment->base);
  arena_.release(b);
}

bool PytorchPolicy::release_available_cached_blocks(const AllocParams& p) {
  const Bytes max_split = config_.max_split_size;
  if (max_split == kNoMaxSplit) return false;
  BlockPool& pool = *p.pool;
  const Bytes key_size = std::max(p.size, max_split);
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, key_size, 0}, SizeOrder{});
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
  if (total_allocated_memory_ <= gc_threshold) return;
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
    if constexpr (mutant(kMutantGcLargestFirst)) {  // the same blocks, released largest first
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
      if (!b->is_split() && !b->expandable() && static_cast<double>(age) >= age_threshold) {
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
  if (c.expandable_segments && !caps_.reserve_va)
    throw UsageError("expandable_segments:True needs a backend that can reserve and map address space; this "
                     "backend cannot. Use expandable_segments:False.");
  const auto fraction = c.per_process_memory_fraction;
  config_ = c;
  (void)fraction;  // per_process_memory_fraction applies only at construction (§3.6)
}

[[noreturn]] void PytorchPolicy::throw_oom(const AllocParams& p) {
  auto info = mem_->mem_get_info();
  if (!info.is_ok()) throw DeviceError(device_error("cudaMemGetInfo", 0, device_, info.status));
  record(TraceAction::Oom, info.value.free, p.size, p.stream);
  ++stats_.num_ooms;
  OomFacts f;
  f.alloc_size = p.alloc_size;  // the segment size (§3.7)
  f.device = device_;
  f.device_total = info.value.total;
  f.device_free = info.value.free;
  f.process_in_use = info.value.process_used;
  f.allowed = cap_.allowed();
  f.allocated = static_cast<Bytes>(stats_.allocated_bytes[0].current);
  f.reserved = static_cast<Bytes>(stats_.reserved_bytes[0].current);
  throw OutOfMemory(oom_message(f));
}

// ===================================================================== Expandable segments (7)

Block* PytorchPolicy::find_expandable_block(StreamId stream, BlockPool* pool, Bytes size) {
  auto allocatable = [](const Block* b) { return b != nullptr && b->is_reusable(); };
  auto has_available_address_space = [&](const Block* b) {
    Bytes bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  for (auto it = pool->unmapped.lower_bound(AddrKey{stream, 0}, AddrOrder{});
       it != pool->unmapped.end() && it->stream == stream; ++it) {
    Block* c = &*it;
    if (allocatable(c->prev)) c = c->prev;  // a free block just before the unmapped run
    if (has_available_address_space(c)) return c;
  }
  // A new segment: page = 2 MiB (small pool) or large_segment_size (large pool); address space
  // for 1.125 x device memory.
  const Bytes page = pool->is_small ? kSmallBuffer : config_.large_segment_size;
  const Bytes want = total_memory_ + total_memory_ / 8;
  const Bytes max_handles = (want + page - 1) / page;
  const Bytes va = page * max_handles;
  auto r = mem_->reserve(va);
  if (r.status.is_oom()) return nullptr;
  if (!r.is_ok()) throw DeviceError(device_error("cuMemAddressReserve", va, device_, r.status));
  auto seg = std::make_unique<Segment>();
  seg->base = r.value;
  seg->size = va;
  seg->stream = stream;
  seg->is_small = pool->is_small;
  seg->expandable = true;
  seg->page_size = page;
  seg->page_mapped.assign(max_handles, false);
  Block* c = arena_.make();
  c->ptr = r.value;
  c->size = va;
  c->stream = stream;
  c->mapped = false;
  c->segment = seg.get();
  c->is_small = pool->is_small;
  seg->head = c;
  segments_.emplace(r.value, std::move(seg));
  pool->unmapped.insert(*c);
  return c;
}

Block* PytorchPolicy::try_allocate_expandable_block(StreamId stream, BlockPool* pool, Bytes size) {
  Block* c = find_expandable_block(stream, pool, size);
  if (!c) return nullptr;
  // c starts a run with room for `size`: unmapped, or free followed by unmapped.
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    const Bytes remaining = size - c->size;
    Block* nc = c->next;  // unmapped; mapping it merges c into it
    if (!map_block(nc, std::min(remaining, nc->size))) return nullptr;
    c = nc;
  }
  pool->blocks.erase(pool->blocks.iterator_to(*c));
  return c;
}

bool PytorchPolicy::map_block(Block* to_map, Bytes size) {
  CACHET_CHECK(!to_map->mapped && size <= to_map->size);
  Segment* seg = to_map->segment;
  const Bytes page = seg->page_size;
  const Bytes begin = (to_map->ptr - seg->base) / page;
  const Bytes end = (to_map->ptr + size - seg->base + page - 1) / page;
  CACHET_CHECK(seg->base + begin * page == to_map->ptr && end > begin);
  const DevicePtr at = seg->base + begin * page;
  const Bytes mapped = (end - begin) * page;
  auto st = mem_->map(at, mapped);
  if (st.is_oom()) return false;
  if (!st.is_ok()) throw DeviceError(device_error("cuMemCreate/cuMemMap", mapped, device_, st));
  for (Bytes i = begin; i < end; ++i) seg->page_mapped[i] = true;

  BlockPool& pool = pool_for(to_map);
  pool.unmapped.erase(pool.unmapped.iterator_to(*to_map));
  to_map->mapped = true;
  if (mapped < to_map->size) {
    Block* rest = arena_.make();  // fresh: requested_size 0 (§13.1)
    rest->ptr = to_map->ptr + mapped;
    rest->size = to_map->size - mapped;
    rest->stream = to_map->stream;
    rest->segment = seg;
    rest->is_small = to_map->is_small;
    rest->mapped = false;
    link_after(rest, to_map);
    pool.unmapped.insert(*rest);
    to_map->size = mapped;
  }
  try_merge_blocks(to_map, to_map->prev, pool);
  try_merge_blocks(to_map, to_map->next, pool);
  pool.insert_into_blocks(to_map);

  total_allocated_memory_ += mapped;
  for_all_and(stats_.reserved_bytes, stat_type(pool), [&](Stat& s) { s.increase(static_cast<std::int64_t>(mapped)); });
  ++stats_.num_device_alloc;
  record(TraceAction::SegmentMap, at, mapped, to_map->stream);
  return true;
}

void PytorchPolicy::unmap_block(Block* b) {
  Segment* seg = b->segment;
  const Bytes page = seg->page_size;
  const Bytes begin = (b->ptr - seg->base + page - 1) / page;  // whole pages only
  const Bytes end = (b->ptr + b->size - seg->base) / page;
  if (begin >= end) return;
  const DevicePtr at = seg->base + begin * page;
  const Bytes n = (end - begin) * page;
  auto st = mem_->unmap(at, n);  // device first: a failure changes nothing
  if (!st.is_ok()) throw DeviceError(device_error("cuMemUnmap/cuMemRelease", n, device_, st));
  for (Bytes i = begin; i < end; ++i) seg->page_mapped[i] = false;

  BlockPool& pool = pool_for(b);
  pool.blocks.erase(pool.blocks.iterator_to(*b));
  const Bytes before = at - b->ptr;
  if (before > 0) {
    Block* bf = arena_.make();
    bf->ptr = b->ptr;
    bf->size = before;
    bf->stream = b->stream;
    bf->segment = seg;
    bf->is_small = b->is_small;
    bf->prev = b->prev;
    if (bf->prev) bf->prev->next = bf;
    else seg->head = bf;
    bf->next = b;
    b->prev = bf;
    pool.insert_into_blocks(bf);
  }
  const Bytes after = b->size - (before + n);
  if (after > 0) {
    Block* af = arena_.make();
    af->ptr = at + n;
    af->size = after;
    af->stream = b->stream;
    af->segment = seg;
    af->is_small = b->is_small;
    link_after(af, b);
    pool.insert_into_blocks(af);
  }
  b->ptr = at;
  b->size = n;
  b->mapped = false;
  try_merge_blocks(b, b->prev, pool);
  try_merge_blocks(b, b->next, pool);
  pool.unmapped.insert(*b);

  total_allocated_memory_ -= n;
  for_all_and(stats_.reserved_bytes, stat_type(pool), [&](Stat& s) { s.decrease(static_cast<std::int64_t>(n)); });
  ++stats_.num_device_free;
  record(TraceAction::SegmentUnmap, at, n, b->stream);
}

void PytorchPolicy::release_expandable_segment(Block* b) {
  Segment* seg = b->segment;
  CACHET_CHECK(!b->mapped && !b->is_split() && b->ptr == seg->base && b->size == seg->size);
  auto st = mem_->unreserve(seg->base, seg->size);
  if (!st.is_ok()) throw DeviceError(device_error("cuMemAddressFree", seg->size, device_, st));
  BlockPool& pool = pool_for(b);
  pool.unmapped.erase(pool.unmapped.iterator_to(*b));
  segments_.erase(seg->base);
  arena_.release(b);
}

// ===================================================================== Snapshot and trace (8)

Snapshot PytorchPolicy::snapshot() {
  Snapshot out;
  Bytes total_active = 0;
  for (const auto& [base, seg] : segments_) {
    // One snapshot segment per contiguous mapped run (a whole cudaMalloc segment is one run).
    for (const Block* b = seg->head; b != nullptr;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      SegmentSnapshot s;
      s.address = b->ptr;
      s.stream = b->stream;
      s.is_large = !b->is_small;
      s.is_expandable = seg->expandable;
      for (; b != nullptr && b->mapped; b = b->next) {
        BlockSnapshot bs;
        bs.address = b->ptr;
        bs.size = b->size;
        bs.requested_size = b->requested_size;
        bs.state = b->allocated ? BlockState::ActiveAllocated
                   : b->is_active() ? BlockState::ActivePendingFree
                                    : BlockState::Inactive;
        if (b->is_active()) total_active += b->size;
        s.total_size += b->size;
        s.blocks.push_back(bs);
      }
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  record(TraceAction::Snapshot, 0, total_active, 0);
  return out;
}

// ===================================================================== Errors

Block* PytorchPolicy::find_active(DevicePtr ptr, const char* op) const {
  return find_active_in(active_, ptr, op, [this](DevicePtr p) { return holder_of(p); });
}

std::optional<BlockAt> PytorchPolicy::holder_of(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return std::nullopt;
  --it;
  const Segment& seg = *it->second;
  if (ptr >= seg.base + seg.size) return std::nullopt;
  for (const Block* b = seg.head; b != nullptr; b = b->next)
    if (ptr >= b->ptr && ptr < b->ptr + b->size) return BlockAt{b->ptr, b->size, !b->is_active()};
  return std::nullopt;
}

}  // namespace cachet::gpu::detail
