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

void PytorchPolicy::process_events() {
  insert_events_deferred_until_no_capture();  // callers make sure no capture is under way (§14.7)
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

void PytorchPolicy::synchronize_and_free_events(const PrivatePool* pool) {
  // Callers make sure no capture is under way (PyTorch asserts it, §14.8.3).
  // Counted on every call, with a pool too (§14.6; rule flip empty_cache_sync_only_with_events).
  if (!flipped(RuleFlip::EmptyCacheSyncOnlyWithEvents) || pending_events_ != 0 || !deferred_blocks_.empty())
    accounting_.synchronized_all_streams();
  insert_events_deferred_until_no_capture();
  for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
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
    it = q.empty() ? cuda_events_.erase(it) : std::next(it);
  }
}

}  // namespace cachet::gpu::detail
