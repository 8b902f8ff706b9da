// Stream uses and simulated events (docs/pytorch-allocator.md §6).
//
// An event is identified by a sequence number; complete_events(s) marks every event recorded on
// s so far as completed (what cudaEventQuery would then report). process_events() at the start
// of malloc walks each stream's FIFO and stops at its first incomplete event (head-of-line,
// issue #71616). synchronize_and_free_events() waits for all of them.
#include <algorithm>
#include <iterator>
#include <set>
#include <string>

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
    if (!cuda_events_.contains(s)) std::erase(event_stream_order_, s);  // a new queue: back to its id's place
    cuda_events_[s].push_back(Event{next_event_seq_++, block});
    if (events_when_recorded_) completed_upto_[s] = next_event_seq_;
  }
  block->set_state(BlockState::AwaitingEvents);
}

void Allocator::complete_events(StreamId stream) { completed_upto_[stream] = next_event_seq_; }

void Allocator::complete_all_events() {
  for (auto& [stream, events] : cuda_events_) completed_upto_[stream] = next_event_seq_;
}

// §14.10.3: the streams with pending events, in the order process_events walks them: those
// set_event_stream_order named, in its order, then every other one by id (cuda_events_ is a map
// ordered by id).
std::vector<StreamId> Allocator::event_walk_order() const {
  std::vector<StreamId> walk;
  std::ranges::copy_if(event_stream_order_, std::back_inserter(walk),
                       [this](StreamId s) { return cuda_events_.contains(s); });
  for (const auto& [s, events] : cuda_events_)
    if (std::ranges::find(walk, s) == walk.end()) walk.push_back(s);
  return walk;
}

// Each stream of the walk with the blocks of its pending events, oldest first.
std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> Allocator::event_queues() const {
  std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> queues;
  for (StreamId s : event_walk_order()) {
    auto& [stream, blocks] = queues.emplace_back(s, std::vector<std::uint64_t>{});
    std::ranges::transform(cuda_events_.at(stream), std::back_inserter(blocks),
                           [](const Event& e) { return e.block->ptr; });
  }
  return queues;
}

// §14.10.3: the streams named walk first, in the order named, the others after them in the order
// they walk now. The order is checked whole before anything changes: every stream named has
// pending events and is named once.
void Allocator::set_event_stream_order(const std::vector<StreamId>& order) {
  std::set<StreamId> named;
  for (StreamId s : order) {
    if (!cuda_events_.contains(s))
      throw UsageError("set_event_stream_order: stream " + std::to_string(s) +
                       " has no pending events (event_queues() lists the streams that have; "
                       "docs/pytorch-allocator.md §14.10.3)");
    if (!named.insert(s).second)
      throw UsageError("set_event_stream_order: stream " + std::to_string(s) +
                       " is named twice; name each stream once");
  }
  std::vector<StreamId> walk = order;
  for (StreamId s : event_walk_order())
    if (!named.contains(s)) walk.push_back(s);
  event_stream_order_ = std::move(walk);
}

void Allocator::process_events() {
  insert_events_deferred_until_no_capture();
  // PyTorch: its hash map's order of streams; by id, or as a replay's recording says (§14.10.3).
  for (StreamId s : event_walk_order()) {
    const auto it = cuda_events_.find(s);
    auto& events = it->second;
    const auto done = completed_upto_.find(it->first);
    const std::uint64_t upto = done == completed_upto_.end() ? 0 : done->second;
    while (!events.empty() && events.front().seq < upto) {
      Block* block = events.front().block;
      events.pop_front();
      if (--block->event_count == 0) free_block(block);
    }
    if (events.empty()) {
      cuda_events_.erase(it);
      std::erase(event_stream_order_, s);
    }
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
  for (StreamId s : event_walk_order()) {  // PyTorch: its hash map's order (§14.10.3)
    const auto it = cuda_events_.find(s);
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
    if (pool == nullptr) completed_upto_[s] = next_event_seq_;
    if (events.empty()) {
      cuda_events_.erase(it);
      std::erase(event_stream_order_, s);
    }
  }
}

}  // namespace cachet::model
