// cachet/trace.h: allocator trace events, as PyTorch's _snapshot()["device_traces"] names them.
#pragma once

#include <cstdint>
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
  friend bool operator==(const TraceEvent&, const TraceEvent&) = default;
};

// "alloc", "free_requested", ... exactly as PyTorch writes them.
std::string_view to_string(TraceAction a);
std::optional<TraceAction> trace_action_from_string(std::string_view s);

}  // namespace cachet
