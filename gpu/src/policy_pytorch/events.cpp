// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): stream uses and their events (§6). Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "cachet/rule_flip.h"
#include "check.h"
#include "messages.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

// ===================================================================== Events (§6)

void PytorchPolicy::record_stream(DevicePtr ptr, StreamId stream) {
  check_stream(stream, "record_stream");
  if (config_.no_caching) return;
  Block* b = find_active(ptr, "record_stream");
  if (!b->is_allocated())
    throw UsageError("record_stream(" + hex(ptr) + ", stream " + std::to_string(stream) +
                     "): the block was already freed; record stream uses before freeing");
  if (stream == b->stream) return;  // uses on the allocation stream need no event
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
  // A use made while a capture is under way needs no event after the capture (§14.7).
  if (capture_underway() &&
      std::find(b->capture_stream_uses.begin(), b->capture_stream_uses.end(), stream) == b->capture_stream_uses.end())
    b->capture_stream_uses.push_back(stream);
}

// §14.10.3: the streams of set_event_stream_order first (those with events), the others by value.
std::vector<StreamId> PytorchPolicy::event_walk_order() const {
  std::vector<StreamId> out;
  out.reserve(cuda_events_.size());
  for (StreamId s : event_stream_order_)
    if (cuda_events_.contains(s)) out.push_back(s);
  for (const auto& [s, q] : cuda_events_)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

std::vector<std::pair<StreamId, std::vector<DevicePtr>>> PytorchPolicy::event_queues() const {
  std::vector<std::pair<StreamId, std::vector<DevicePtr>>> out;
  for (StreamId s : event_walk_order()) {
    std::vector<DevicePtr> blocks;
    for (const auto& [e, b] : cuda_events_.at(s)) blocks.push_back(b->ptr);
    out.emplace_back(s, std::move(blocks));
  }
  return out;
}

// Checked whole before the order changes.
void PytorchPolicy::set_event_stream_order(const std::vector<StreamId>& order) {
  std::vector<StreamId> first;
  for (StreamId s : order) {
    if (!cuda_events_.contains(s))
      throw UsageError("set_event_stream_order: stream " + std::to_string(s) +
                       " has no pending events (event_queues() lists the streams that have; "
                       "docs/pytorch-allocator.md §14.10.3)");
    if (std::find(first.begin(), first.end(), s) != first.end())
      throw UsageError("set_event_stream_order: stream " + std::to_string(s) +
                       " is named twice; name each stream once");
    first.push_back(s);
  }
  for (StreamId s : event_walk_order())
    if (std::find(first.begin(), first.end(), s) == first.end()) first.push_back(s);
  event_stream_order_ = std::move(first);
}

void PytorchPolicy::process_events() {
  insert_events_deferred_until_no_capture();  // callers make sure no capture is under way (§14.7)
  // Per stream FIFO; stop at the first event not yet complete on that stream (§6). Whether the
  // queue is now empty.
  auto drain = [this](std::deque<std::pair<EventHandle, Block*>>& q) {
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
    return q.empty();
  };
  // The streams by value (the hot path: no order given); PyTorch: its hash map's order, which a
  // replay gives from its recording (§14.10.3).
  if (event_stream_order_.empty()) {
    for (auto it = cuda_events_.begin(); it != cuda_events_.end();)
      it = drain(it->second) ? cuda_events_.erase(it) : std::next(it);
    return;
  }
  for (StreamId s : event_walk_order()) {
    const auto it = cuda_events_.find(s);
    if (drain(it->second)) {
      cuda_events_.erase(it);
      std::erase(event_stream_order_, s);
    }
  }
}

void PytorchPolicy::synchronize_and_free_events(const PrivatePool* pool) {
  // Callers make sure no capture is under way (PyTorch asserts it, §14.8.3).
  // Counted on every call, with a pool too (§14.6; rule flip empty_cache_sync_only_with_events).
  if (!flipped(RuleFlip::EmptyCacheSyncOnlyWithEvents) || pending_events_ != 0 || !deferred_blocks_.empty())
    accounting_.synchronized_all_streams();
  insert_events_deferred_until_no_capture();
  for (StreamId s : event_walk_order()) {  // PyTorch: its hash map's order (§14.10.3)
    const auto it = cuda_events_.find(s);
    auto& q = it->second;
    // With a pool, only the events of that private pool's blocks, the others keep their order.
    for (auto e = q.begin(); e != q.end();) {
      Block* b = e->second;
      if (pool != nullptr && pool_for(b).owner != pool) {
        ++e;
        continue;
      }
      auto st = mem_->event_synchronize(e->first);
      if (!st.is_ok()) throw DeviceError(device_error("cudaEventSynchronize", 0, device_, st));
      event_pool_.release(e->first);
      e = q.erase(e);
      --pending_events_;
      if (--b->event_count == 0) free_block(b);
    }
    if (q.empty()) {
      cuda_events_.erase(it);
      std::erase(event_stream_order_, s);
    }
  }
}

}  // namespace cachet::gpu::detail
