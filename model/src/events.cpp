// Stream uses and simulated events (docs/pytorch-allocator.md §6).
//
// An event is identified by a sequence number; complete_events(s) marks every event recorded on
// s so far as completed (what cudaEventQuery would then report). process_events() at the start
// of malloc walks each stream's FIFO and stops at its first incomplete event (head-of-line,
// issue #71616). synchronize_and_free_events() waits for all of them.
#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

// Allocated -> AwaitingEvents: one event per stream that used the block (§2.5, §6).
void Allocator::insert_events(Block* block) {
  std::set<StreamId> streams = std::move(block->stream_uses);
  block->stream_uses.clear();
  for (StreamId s : streams) {
    ++block->event_count;
    cuda_events_[s].push_back(Event{next_event_seq_++, block});
    if (events_when_recorded_) completed_upto_[s] = next_event_seq_;
  }
  block->set_state(BlockState::AwaitingEvents);
}

void Allocator::complete_events(StreamId stream) { completed_upto_[stream] = next_event_seq_; }

void Allocator::complete_all_events() {
  for (auto& [stream, events] : cuda_events_) completed_upto_[stream] = next_event_seq_;
}

void Allocator::process_events() {
  insert_events_deferred_until_no_capture();
  for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
    auto& events = it->second;
    const auto done = completed_upto_.find(it->first);
    const std::uint64_t upto = done == completed_upto_.end() ? 0 : done->second;
    while (!events.empty() && events.front().seq < upto) {
      Block* block = events.front().block;
      events.pop_front();
      if (--block->event_count == 0) free_block(block);
    }
    it = events.empty() ? cuda_events_.erase(it) : std::next(it);
  }
}

void Allocator::synchronize_and_free_events(const PrivatePool* pool) {
  // Counted on every call, even with no events (§11.5; rule flip empty_cache_sync_only_with_events).
  if (!flipped(RuleFlip::EmptyCacheSyncOnlyWithEvents) || !cuda_events_.empty() || !deferred_blocks_.empty())
    ++stats_.num_sync_all_streams;
  // PyTorch asserts that no capture is under way: it would synchronize inside one (§14.8).
  if (!captures_underway_.empty())
    throw PyTorchFailure(
        "PyTorch 2.11 fails here: synchronize_and_free_events while a capture or use_mem_pool is "
        "under way (\"captures_underway.empty() INTERNAL ASSERT FAILED\"): a MemPool was destroyed "
        "while another pool was active (docs/pytorch-allocator.md §14.8)");
  insert_events_deferred_until_no_capture();
  for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
    auto& events = it->second;
    // With a pool, only the events of that pool's blocks (§14.6).
    for (auto e = events.begin(); e != events.end();) {
      if (pool != nullptr && e->block->pool->owner != pool) {
        ++e;
        continue;
      }
      Block* block = e->block;
      e = events.erase(e);
      if (--block->event_count == 0) free_block(block);
    }
    if (pool == nullptr) completed_upto_[it->first] = next_event_seq_;
    it = events.empty() ? cuda_events_.erase(it) : std::next(it);
  }
}

}  // namespace cachet::model
