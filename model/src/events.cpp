// Stream uses and simulated events (docs/pytorch-allocator.md §6).
//
// An event is identified by a sequence number; complete_events(s) marks every event recorded on
// s so far as completed (what cudaEventQuery would then report). process_events() at the start
// of malloc walks each stream's FIFO and stops at its first incomplete event (head-of-line,
// issue #71616). synchronize_and_free_events() waits for all of them.
#include "cachet/model/allocator.h"

namespace cachet::model {

// Allocated -> AwaitingEvents: one event per stream that used the block (§2.5, §6).
void Allocator::insert_events(Block* block) {
  std::set<StreamId> streams = std::move(block->stream_uses);
  block->stream_uses.clear();
  for (StreamId s : streams) {
    ++block->event_count;
    cuda_events_[s].push_back(Event{next_event_seq_++, block});
  }
  block->set_state(BlockState::AwaitingEvents);
}

void Allocator::complete_events(StreamId stream) { completed_upto_[stream] = next_event_seq_; }

void Allocator::complete_all_events() {
  for (auto& [stream, events] : cuda_events_) completed_upto_[stream] = next_event_seq_;
}

void Allocator::process_events() {
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

void Allocator::synchronize_and_free_events() {
  // Counted on every call, even with no events (§11.5).
  ++stats_.num_sync_all_streams;
  for (auto& [stream, events] : cuda_events_) {
    for (const Event& e : events)
      if (--e.block->event_count == 0) free_block(e.block);
    completed_upto_[stream] = next_event_seq_;
  }
  cuda_events_.clear();
}

}  // namespace cachet::model
