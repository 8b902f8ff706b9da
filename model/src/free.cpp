// free, free completion and merging with free neighbours (docs/pytorch-allocator.md §2.5).
#include <string>

#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

namespace {
std::string describe(std::uint64_t ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(ptr));
  return buf;
}
}  // namespace

Block* Allocator::find_active(std::uint64_t ptr) const {
  const auto it = active_blocks_.find(ptr);
  return it == active_blocks_.end() ? nullptr : it->second;
}

void Allocator::free(std::uint64_t ptr) {
  if (ptr == 0) return;  // freeing the null result of malloc(0) is a no-op, as in PyTorch
  if (config_.no_caching) {
    auto it = raw_allocations_.find(ptr);
    if (it == raw_allocations_.end())
      throw UsageError("free(" + describe(ptr) +
                       "): not an address this allocator returned (or already freed); pass the "
                       "pointer malloc returned, once");
    source_.free(it->first, it->second);
    raw_allocations_.erase(it);
    return;
  }
  Block* block = find_active(ptr);
  if (block == nullptr || !block->is_allocated()) {
    throw UsageError(
        "free(" + describe(ptr) + "): " +
        (block != nullptr ? std::string("the block is already freed and waiting for stream-use events")
                          : std::string("not the start of an allocated block (unknown, interior or "
                                        "already freed pointer)")) +
        "; pass the pointer malloc returned, exactly once");
  }
  const StatType type = stat_type(*block->pool);
  const auto size = static_cast<std::int64_t>(block->size);
  // allocation and allocated_bytes drop now; active* and requested_bytes at completion (§5.3).
  DeviceStats::for_all_and(stats_.allocation, type, [](Stat& s) { s.decrease(1); });
  DeviceStats::for_all_and(stats_.allocated_bytes, type, [&](Stat& s) { s.decrease(size); });
  record(TraceAction::FreeRequested, block->ptr, block->requested_size, block->stream);
  if (is_oversize(block->size)) stats_.oversize_allocations.decrease(1);
  if (!sleeping_.empty() && sleeping_range_of(block) != nullptr) {
    free_while_asleep(block);  // docs/sleep-wake.md, section 4: no event, free at wake
  } else if (!block->stream_uses.empty() && !captures_underway_.empty()) {
    // graph_capture_record_stream_reuse: record_free_markers first (§14.10.1); PyTorch's state at
    // its assertion is this one (the free requested, nothing deferred).
    if (config_.graph_capture_record_stream_reuse) refuse_free_markers_across_graphs(*block);
    // No event may be recorded during a capture: the free waits for its end (§14.7), or with
    // graph_capture_record_stream_reuse until the graph orders it before a malloc (§14.10.1).
    block->set_state(BlockState::Deferred);  // Allocated -> Deferred
    deferred_blocks_.push_back(block);
    if (config_.graph_capture_record_stream_reuse) {
      if (auto markers = record_free_markers(*block); !markers.empty()) free_markers_[block] = std::move(markers);
    }
  } else if (!block->stream_uses.empty()) {
    insert_events(block);  // Allocated -> AwaitingEvents; completes when its events have (§6)
  } else {
    free_block(block);  // Allocated -> Free
  }
}

// Allocated (no stream uses) or AwaitingEvents (its last event completed) -> Free.
void Allocator::free_block(Block* block) {
  block->set_state(BlockState::Free);
  record(TraceAction::FreeCompleted, block->ptr, block->requested_size, block->stream);
  const auto original_size = static_cast<std::int64_t>(block->size);
  // Rule flip requested_bytes_rounded: requested_bytes went up by the block size.
  const auto requested = flipped(RuleFlip::RequestedBytesRounded) ? original_size
                                                                  : static_cast<std::int64_t>(block->requested_size);
  BlockPool& pool = *block->pool;
  active_blocks_.erase(block->ptr);  // keyed by address: before a merge moves it
  // inactive_split moves once, by the net amount (§13.2).
  std::int64_t net_blocks = 0;
  std::int64_t net_bytes = 0;
  for (Block* candidate : {block->prev, block->next}) {
    const bool is_prev = candidate == block->prev;
    const Bytes neighbour_requested = candidate != nullptr ? candidate->requested_size : 0;
    const Bytes subsumed = try_merge_blocks(block, candidate, pool);
    if (subsumed > 0) {
      net_blocks -= 1;
      net_bytes -= static_cast<std::int64_t>(subsumed);
      // Rule flip merge_keeps_neighbour_requested: the previous neighbour's value, not the freed block's.
      if (is_prev && flipped(RuleFlip::MergeKeepsNeighbourRequested)) block->requested_size = neighbour_requested;
    }
  }
  pool.insert(block);
  std::int64_t result_blocks = 0;
  std::int64_t result_bytes = 0;
  if (block->is_split()) {
    result_blocks = 1;
    result_bytes = static_cast<std::int64_t>(block->size);
  }
  const StatType type = stat_type(pool);
  if (block->expandable == nullptr || flipped(RuleFlip::InactiveSplitCountsExpandable)) {
    auto apply = [&](StatArray& a, std::int64_t n) {
      if (n > 0) DeviceStats::for_all_and(a, type, [&](Stat& s) { s.increase(n); });
      if (n < 0) DeviceStats::for_all_and(a, type, [&](Stat& s) { s.decrease(-n); });
    };
    if (flipped(RuleFlip::InactiveSplitTwoSteps)) {  // rule flip: the merges, then the result
      apply(stats_.inactive_split, net_blocks);
      apply(stats_.inactive_split_bytes, net_bytes);
      apply(stats_.inactive_split, result_blocks);
      apply(stats_.inactive_split_bytes, result_bytes);
    } else {
      apply(stats_.inactive_split, net_blocks + result_blocks);
      apply(stats_.inactive_split_bytes, net_bytes + result_bytes);
    }
  }
  DeviceStats::for_all_and(stats_.active, type, [](Stat& s) { s.decrease(1); });
  DeviceStats::for_all_and(stats_.active_bytes, type, [&](Stat& s) { s.decrease(original_size); });
  DeviceStats::for_all_and(stats_.requested_bytes, type, [&](Stat& s) { s.decrease(requested); });
}

Bytes Allocator::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  // Only a neighbour in dst's state merges, Free with Free or Unmapped with Unmapped (§2.5):
  // not an allocated one, nor one waiting for events. Neighbours share segment, stream and
  // pool by construction.
  if (!dst->is_free_or_unmapped())
    state_error(std::string("merging into a block in state ") + state_name(dst->state()), dst->ptr);
  if (src == nullptr || src->state() != dst->state()) return 0;
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const Bytes subsumed = src->size;
  dst->size += subsumed;
  if (src->is_free())
    pool.blocks.erase(src);
  else
    pool.unmapped.erase(src);
  delete_block(src);
  return subsumed;
}

void Allocator::record_stream(std::uint64_t ptr, StreamId stream) {
  if (config_.no_caching) {
    if (!raw_allocations_.contains(ptr))
      throw UsageError("record_stream(" + describe(ptr) + "): not an allocated block");
    return;
  }
  Block* block = find_active(ptr);
  if (block == nullptr || !block->is_allocated())
    throw UsageError("record_stream(" + describe(ptr) + ", " + std::to_string(stream) +
                     "): not the start of an allocated block; record_stream needs a live "
                     "allocation, before it is freed");
  // A use on the allocating stream needs no event (§6).
  if (stream == block->stream) return;
  block->stream_uses.insert(stream);
  // A use made while a capture is under way needs no event after the capture (§14.7).
  if (!captures_underway_.empty()) block->capture_stream_uses.insert(stream);
}

}  // namespace cachet::model
