// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): free and merge (§2.5). Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "mutant.h"
#include "cachet/rule_flip.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

// ===================================================================== Free and merge (§2.5)

[[gnu::hot, gnu::flatten]] void PytorchPolicy::free(DevicePtr ptr) {
  if (ptr == 0) return;
  if (config_.no_caching) [[unlikely]] {
    free_uncached(ptr);
    return;
  }
  const std::size_t slot = active_.slot_of(ptr);  // one probe: the free below erases this slot
  if (slot == PtrMap<Block>::npos) [[unlikely]]
    throw_bad_pointer("free", ptr, device_, holder_of(ptr));  // no live block at ptr: says what is there
  Block* b = active_.value_at(slot);
  if (!b->is_allocated()) [[unlikely]]
    throw_double_free(b);
  if (b->segment->sleeping_runs != 0 && asleep(b)) [[unlikely]] {  // docs/sleep-wake.md section 4
    free_while_asleep(b);
    return;
  }
  if (!b->stream_uses.empty() && !mutant(kMutantIgnorePendingEvent)) [[unlikely]] {
    free_with_stream_uses(b);
    return;
  }
  accounting_.free_requested(stat_type(pool_for(b)), b->size, is_oversize(b->size));
  record_block(TraceAction::FreeRequested, b, b->requested_size);
  b->stream_uses.clear();
  active_.erase_slot(slot);
  free_unlisted_block(b);
}

// §4.1 PYTORCH_NO_CUDA_MEMORY_CACHING: the device's free, no stats.
void PytorchPolicy::free_uncached(DevicePtr ptr) {
  auto it = uncached_.find(ptr);
  if (it == uncached_.end())
    throw UsageError("free(" + hex(ptr) + "): not an allocation of this allocator (device " +
                     std::to_string(device_) + ", caching disabled); pass a pointer allocate() returned");
  auto st = mem_->free(ptr);
  if (!st.is_ok()) throw DeviceError(device_error("cudaFree", it->second, device_, st));
  uncached_.erase(it);
}

void PytorchPolicy::throw_double_free(const Block* b) const {
  throw UsageError("free(" + hex(b->ptr) + "): double free: the block was already freed and is waiting for " +
                   (b->state() == BlockState::Deferred ? std::string("the end of a capture (§14.7)")
                                                       : std::to_string(b->event_count) + " stream-use event(s)") +
                   "; free each pointer once");
}

// A free of a block that other streams used (§6): it waits for their events, or during a capture
// for the capture's end.
void PytorchPolicy::free_with_stream_uses(Block* b) {
  if (capture_underway()) {
    // graph_capture_record_stream_reuse: where PyTorch's record_free_markers would assert, refuse
    // before anything changes (§14.8, §14.10.1).
    std::vector<GraphNode> markers;
    if (config_.graph_capture_record_stream_reuse) {
      refuse_free_markers_across_graphs(b);
      markers = record_free_markers(b);  // may throw DeviceError: nothing changed yet
    }
    // No event may be recorded during a capture: the free waits for its end (§14.7), or with
    // markers until a malloc on its stream finds them ordered before it (§14.10.1).
    accounting_.free_requested(stat_type(pool_for(b)), b->size, is_oversize(b->size));
    record_block(TraceAction::FreeRequested, b, b->requested_size);
    deferred_blocks_.push_back(b);
    b->set_state(BlockState::Deferred);
    if (!markers.empty()) free_markers_[b] = std::move(markers);
    return;
  }
  insert_events(b, [&] {
    accounting_.free_requested(stat_type(pool_for(b)), b->size, is_oversize(b->size));
    record_block(TraceAction::FreeRequested, b, b->requested_size);
  });
}

// One event per using stream, recorded before anything changes, so a failing event call leaves
// the block as it was and the stats untouched (§6); then `before` (free's accounting), and the
// block waits for them (Allocated or Deferred -> AwaitingEvents).
template <class Before>
void PytorchPolicy::insert_events(Block* b, Before&& before) {
  std::vector<std::pair<EventHandle, StreamId>> events;
  events.reserve(b->stream_uses.size());
  event_pool_.record_on(*mem_, device_, b->stream_uses, events,
                        [](EventHandle e, StreamId s) { return std::pair{e, s}; });
  before();
  b->stream_uses.clear();
  for (auto& [e, s] : events) {
    b->event_count += mutant(kMutantDoubleCountEvent) ? 2 : 1;
    if (!cuda_events_.contains(s)) std::erase(event_stream_order_, s);  // a new queue: back to its value's place
    cuda_events_[s].emplace_back(e, b);
    ++pending_events_;
  }
  b->set_state(BlockState::AwaitingEvents);  // its events recorded and counted (§6)
}

void PytorchPolicy::insert_events(Block* b) {
  insert_events(b, [] {});
}

void PytorchPolicy::free_block(Block* b) {
  active_.erase(b->ptr);
  free_unlisted_block(b);
}

void PytorchPolicy::free_unlisted_block(Block* b) {
  CACHET_ASSERT(b->event_count == 0 && b->stream_uses.empty());
  b->set_state(BlockState::Free);  // from Allocated, or AwaitingEvents once its last event completed
  record_block(TraceAction::FreeCompleted, b, b->requested_size);
  const Bytes original_size = b->size;
  // Rule flip requested_bytes_rounded: requested_bytes went up by the block size.
  const Bytes requested = flipped(RuleFlip::RequestedBytesRounded) ? b->size : b->requested_size;
  BlockPool& pool = pool_for(b);

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
    // Rule flip merge_keeps_neighbour_requested: the previous neighbour keeps its own value.
    if (!flipped(RuleFlip::MergeKeepsNeighbourRequested)) prev->requested_size = b->requested_size;
    take_capture_stream_uses(prev, b);  // PyTorch keeps the freed block (§14.7)
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
      pool.erase_free(*next);
      b->size += next->size;
      b->next = next->next;
      if (b->next) b->next->prev = b;
      arena_.release(next);
    } else {
      next->ptr = b->ptr;
      next->size += b->size;
      next->requested_size = b->requested_size;
      take_capture_stream_uses(next, b);
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
      pool.erase_free(*b);
      pool.insert_free(*b);
    }
  } else {
    pool.insert_into_blocks(b);
  }
  const std::int64_t result_blocks = b->is_split() ? 1 : 0;
  const std::int64_t result_bytes = b->is_split() ? static_cast<std::int64_t>(b->size) : 0;

  const StatType st = stat_type(pool);
  // inactive_split excludes expandable segments; it moves once, by the net (§13.2). (Rule flips
  // inactive_split_counts_expandable, inactive_split_two_steps.)
  if (!b->expandable() || flipped(RuleFlip::InactiveSplitCountsExpandable)) {
    if (flipped(RuleFlip::InactiveSplitTwoSteps)) {
      accounting_.inactive_split_changed(st, net_blocks, net_bytes);
      accounting_.inactive_split_changed(st, result_blocks, result_bytes);
    } else {
      accounting_.inactive_split_changed(st, net_blocks + result_blocks, net_bytes + result_bytes);
    }
  }
  accounting_.free_completed(st, original_size, mutant(kMutantForgetRequested) ? 0 : requested);
}

Bytes PytorchPolicy::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  if (!mergeable(dst, src)) return 0;
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
  if (src->is_mapped()) pool.blocks.erase(pool.blocks.iterator_to(*src));
  else pool.unmapped.erase(pool.unmapped.iterator_to(*src));
  arena_.release(src);
  return subsumed;
}

}  // namespace cachet::gpu::detail
