// python/c10/history.h: the contexts the c10 backend keeps for _record_memory_history
// (docs/pytorch-allocator.md section 8, "Which stack each trace entry carries"; python/README.md,
// "The c10 backend").
//
// cachet's trace (gpu/) records the events; PyTorch's context recorder gives each one its stack.
// The backend gathers the context of each call it makes while the history is on before calling
// cachet (outside its lock), names the call with a TraceCallScope (cachet/trace.h), so that every
// event the call records carries the call's id, and keeps the call's contexts here under that
// id. Converting the trace to PyTorch's entries (history.cpp) then gives each event the context
// native's record_trace gets for it in DeviceCachingAllocator:
//
//   alloc, oom, segment_alloc, segment_map   the allocating call's (malloc's, gathered at STATE)
//   free_requested, free_completed           the call's (free's at ALL; a malloc's, whose
//                                            process_events completes deferred frees; emptyCache's
//                                            at ALL); without one, the block's allocation context
//   segment_free, segment_unmap              the call's (a malloc's retry or garbage collection,
//                                            emptyCache's at ALL, a pool's release); without one,
//                                            the segment's allocation context
//   snapshot                                 none
//
// and none at all for a call made while the recording level was below ALLOC (record_trace keeps
// contexts only from there). The newest calls are kept, as many as the history's max_entries (and
// a few more); an event of a call no longer kept, or of no call of the backend's (the
// cachet_torch_* API), has no context.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <c10/core/Allocator.h>

namespace cachet::c10_backend {

using Ctx = std::shared_ptr<c10::GatheredContext>;

// One call made while the history was on: the contexts native's record_trace takes for the
// events it makes (see above).
struct CallContexts {
  Ctx made;    // for alloc, oom, segment_alloc, segment_map (and the allocation's own context)
  Ctx freed;   // for the frees and segment frees; null: the block's or the segment's own
  bool keep = false;  // the recording level was ALLOC or ALL at the call
};

struct History {
  std::mutex mu;
  std::unordered_map<std::uint64_t, Ctx> live;  // context of each live allocation (snapshot blocks)
  std::unordered_map<std::uint32_t, CallContexts> calls;  // by TraceCallScope id
  std::deque<std::uint32_t> order;                        // the ids in calls, oldest first

  void clear() {
    live.clear();
    calls.clear();
    order.clear();
  }
  // Keeps the newest max_entries calls (each makes an entry or more), and a few more for the
  // calls that make none (an emptyCache with nothing cached).
  void add(std::uint32_t id, CallContexts c, size_t max_entries) {
    calls[id] = std::move(c);
    order.push_back(id);
    while (order.size() > std::max<size_t>(max_entries, 1) + 64) {
      calls.erase(order.front());
      order.pop_front();
    }
  }
  const CallContexts* find(std::uint32_t id) const {
    if (id == 0) return nullptr;
    auto it = calls.find(id);
    return it == calls.end() ? nullptr : &it->second;
  }
};

// A fresh id for a call's TraceCallScope (never 0).
std::uint32_t next_call_id();

}  // namespace cachet::c10_backend
