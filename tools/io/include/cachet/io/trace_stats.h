// cachet/io/trace_stats.h: what a trace looks like before it is replayed. Traces are often
// recorded mid-run (_record_memory_history turned on after the model was built) or come from a
// ring buffer that dropped its oldest events (max_entries), so a replay must expect frees of
// blocks it never saw allocated. TraceStats counts such anomalies; replay prints one_line().
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::io {

inline constexpr std::size_t kNumTraceActions = 9;  // TraceAction::Alloc .. TraceAction::Oom

struct TraceStats {
  std::uint64_t events = 0;
  std::array<std::uint64_t, kNumTraceActions> per_action{};  // indexed by TraceAction

  // free_requested of an address with no live alloc before it in the trace (the alloc happened
  // before recording started or fell out of the ring buffer).
  std::uint64_t frees_without_alloc = 0;
  // free_completed with no free_requested of that address pending.
  std::uint64_t completions_without_request = 0;
  // alloc at an address that is already live in the trace (its free was not recorded).
  std::uint64_t allocs_over_live = 0;
  // segment_free of an address no segment_alloc in the trace returned.
  std::uint64_t segment_frees_without_alloc = 0;
  // Blocks allocated in the trace and not freed (free_requested) by its end, and their bytes.
  std::uint64_t allocs_never_freed = 0;
  Bytes bytes_never_freed = 0;
  // Segments the trace allocated (segment_alloc) and did not free by its end.
  std::uint64_t segments_at_end = 0;
  // Blocks whose free_requested has no free_completed by the end of the trace.
  std::uint64_t frees_pending_at_end = 0;
  // Events whose time_us is earlier than the previous event's (0 times are ignored).
  std::uint64_t time_reversals = 0;
  // Largest sum of requested bytes live at once, counting only allocs seen in the trace.
  Bytes peak_live_requested = 0;
  std::int64_t first_time_us = 0;  // first and last nonzero time_us (0 when none)
  std::int64_t last_time_us = 0;

  std::uint64_t count(TraceAction a) const { return per_action[static_cast<std::size_t>(a)]; }
  // True when the trace looks recorded mid-run or truncated at its start.
  bool starts_mid_run() const {
    return frees_without_alloc > 0 || completions_without_request > 0 ||
           segment_frees_without_alloc > 0;
  }
  // Allocations (or out-of-memory requests) but no segment_alloc or segment_map: the segments
  // were reserved before recording started, and PyTorch's segment addresses are unknown.
  bool lacks_segment_events() const {
    return (count(TraceAction::Alloc) > 0 || count(TraceAction::Oom) > 0) &&
           count(TraceAction::SegmentAlloc) == 0 && count(TraceAction::SegmentMap) == 0;
  }
  // "18685 events: alloc 6179, free_requested 6176, ...; anomalies: none" (actions with a zero
  // count are left out).
  std::string one_line() const;
};

// What lacks_segment_events() means for the user, and what to do (trace-info, replay).
inline constexpr std::string_view kNoSegmentEvents =
    "the trace has no segment_alloc or segment_map events: its segments were reserved before "
    "torch.cuda.memory._record_memory_history() was called, or the max_entries ring buffer dropped "
    "those events, so PyTorch's segment addresses are unknown and the replay uses its own (as with "
    "--addresses synthetic); to record them, call _record_memory_history() before the first CUDA "
    "allocation";

TraceStats analyze_trace(std::span<const TraceEvent> events);

}  // namespace cachet::io
