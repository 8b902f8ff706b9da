// cachet/trace.h: allocator trace events, as PyTorch's _snapshot()["device_traces"] names them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "cachet/types.h"

namespace cachet {

enum class TraceAction : std::uint8_t {
  Alloc,          // addr = block, size = requested bytes
  FreeRequested,  // free() called; size = requested bytes
  FreeCompleted,  // block returned to its pool (after stream-use events); size = requested bytes
  SegmentAlloc,   // cudaMalloc; size = segment bytes
  SegmentFree,    // cudaFree; size = segment bytes
  SegmentMap,     // expandable segment pages mapped; size = mapped bytes
  SegmentUnmap,   // expandable segment pages unmapped; size = unmapped bytes
  Snapshot,       // addr 0, size = total active bytes
  Oom,            // addr = device free bytes (driver figure), size = rounded request
};

struct TraceEvent {
  TraceAction action{};
  std::uint64_t addr = 0;
  Bytes size = 0;
  StreamId stream = 0;
  std::int64_t time_us = 0;  // 0 when not recorded
  // Which of the caller's calls recorded it: the id of the TraceCallScope open on the recording
  // thread then, 0 when none was. The caller's bookkeeping, not part of what the event says, so
  // == leaves it out.
  std::uint32_t call = 0;
  // The private pool the block or segment belongs to (a MemPool's or a CUDA graph's id), the
  // default {0, 0} outside every private pool: PyTorch's TraceEntry::mempool_, which its NCCL
  // register hook matches against the pools registered with a communicator. policy:pytorch names
  // it on every block and segment event; policy:cachet and model/ leave it default. == leaves it
  // out (model/'s trace names no pools).
  PoolId pool{};
  friend bool operator==(const TraceEvent& a, const TraceEvent& b) {
    return a.action == b.action && a.addr == b.addr && a.size == b.size && a.stream == b.stream &&
           a.time_us == b.time_us;
  }
};

// Told of each trace event as the allocator makes it (CachingAllocator::set_trace_listener), on
// the calling thread with the allocator's lock held, whether or not the trace is on: PyTorch's
// trace trackers (attachAllocatorTraceTracker), which native calls from record_trace under its
// lock. A segment's free is told before the device gives its memory back, its allocation after
// the device allocated it (docs/pytorch-allocator.md §8, "Trace trackers"). It must not call back
// into the allocator (the lock is not recursive) and must not throw (an exception is dropped).
using TraceListener = std::function<void(const TraceEvent&)>;

// The calling thread's name for the allocator calls it makes: while a scope is open, every trace
// event an allocator records on this thread carries its id (TraceEvent::call). The c10 backend
// opens one around each call it makes with the memory history on, to give each event of
// PyTorch's device trace the stack of the call that made it (python/c10/history.h). Scopes nest:
// the innermost one names the events; closing it restores the one around it.
class TraceCallScope {
 public:
  explicit TraceCallScope(std::uint32_t id) noexcept;
  ~TraceCallScope();
  TraceCallScope(const TraceCallScope&) = delete;
  TraceCallScope& operator=(const TraceCallScope&) = delete;

 private:
  std::uint32_t previous_;
};

// The id of the innermost TraceCallScope open on the calling thread, 0 when none is.
std::uint32_t current_trace_call() noexcept;

// "alloc", "free_requested", ... exactly as PyTorch writes them.
std::string_view to_string(TraceAction a);
std::optional<TraceAction> trace_action_from_string(std::string_view s);

}  // namespace cachet
