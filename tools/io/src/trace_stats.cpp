// TraceStats: one pass over a trace with two address maps (live blocks, pending frees) and a
// set of live segments.
#include "cachet/io/trace_stats.h"

#include "cachet/summary.h"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

namespace cachet::io {

TraceStats analyze_trace(std::span<const TraceEvent> events) {
  TraceStats s;
  s.events = events.size();
  std::unordered_map<std::uint64_t, Bytes> live;  // addr -> requested bytes
  std::unordered_map<std::uint64_t, std::uint64_t> pending;  // addr -> pending free count
  std::unordered_set<std::uint64_t> segments;
  live.reserve(1024);
  Bytes live_bytes = 0;
  std::int64_t prev_time = 0;
  for (const TraceEvent& e : events) {
    const auto a = static_cast<std::size_t>(e.action);
    if (a < kNumTraceActions) ++s.per_action[a];
    if (e.time_us != 0) {
      if (s.first_time_us == 0) s.first_time_us = e.time_us;
      if (prev_time != 0 && e.time_us < prev_time) ++s.time_reversals;
      prev_time = e.time_us;
      s.last_time_us = e.time_us;
    }
    switch (e.action) {
      case TraceAction::Alloc: {
        auto [it, inserted] = live.try_emplace(e.addr, e.size);
        if (!inserted) {
          ++s.allocs_over_live;
          live_bytes -= it->second;
          it->second = e.size;
        }
        live_bytes += e.size;
        if (live_bytes > s.peak_live_requested) s.peak_live_requested = live_bytes;
        break;
      }
      case TraceAction::FreeRequested: {
        auto it = live.find(e.addr);
        if (it == live.end()) {
          ++s.frees_without_alloc;
        } else {
          live_bytes -= it->second;
          live.erase(it);
        }
        ++pending[e.addr];
        break;
      }
      case TraceAction::FreeCompleted: {
        auto it = pending.find(e.addr);
        if (it == pending.end()) {
          ++s.completions_without_request;
        } else if (--it->second == 0) {
          pending.erase(it);
        }
        break;
      }
      case TraceAction::SegmentAlloc: segments.insert(e.addr); break;
      case TraceAction::SegmentFree:
        if (segments.erase(e.addr) == 0) ++s.segment_frees_without_alloc;
        break;
      default: break;
    }
  }
  s.allocs_never_freed = live.size();
  s.segments_at_end = segments.size();
  s.bytes_never_freed = live_bytes;
  for (const auto& [addr, n] : pending) s.frees_pending_at_end += n;
  return s;
}

std::string TraceStats::one_line() const {
  std::string out = fmt::format("{} events:", events);
  bool first = true;
  for (std::size_t a = 0; a < kNumTraceActions; ++a) {
    if (per_action[a] == 0) continue;
    out += fmt::format("{} {} {}", first ? "" : ",", to_string(static_cast<TraceAction>(a)),
                       per_action[a]);
    first = false;
  }
  std::string anomalies;
  auto add = [&](std::uint64_t n, const char* what) {
    if (n == 0) return;
    anomalies += fmt::format("{}{} {}", anomalies.empty() ? "" : ", ", n, what);
  };
  add(frees_without_alloc, "frees without alloc");
  add(completions_without_request, "free_completed without free_requested");
  add(allocs_over_live, "allocs over a live block");
  add(segment_frees_without_alloc, "segment frees without segment_alloc");
  add(time_reversals, "time reversals");
  // The unit style of the commands: "137.07 MiB = 143728640 bytes".
  const std::string live = bytes_never_freed < KiB ? format_size(bytes_never_freed)
                                                   : fmt::format("{} = {} bytes", format_size(bytes_never_freed),
                                                                 bytes_never_freed);
  // The trace's alloc entries record what the program asked for: requested bytes, not the blocks'.
  out += fmt::format("; live at end: {} blocks ({} requested), {} frees pending", allocs_never_freed, live,
                     frees_pending_at_end);
  out += fmt::format("; anomalies: {}", anomalies.empty() ? "none" : anomalies);
  if (starts_mid_run()) out += " (trace starts mid-run or its ring buffer dropped events)";
  return out;
}

}  // namespace cachet::io
