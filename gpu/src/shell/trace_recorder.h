// gpu/src/shell/trace_recorder.h: the trace both policies keep (PyTorch's
// _record_memory_history(enabled="all")): on or off, and the events recorded while on, each
// stamped with the wall clock in microseconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "cachet/trace.h"

namespace cachet::gpu::detail {

class TraceRecorder {
 public:
  bool on() const { return on_; }
  void set_on(bool on) { on_ = on; }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear() { events_.clear(); }
  // Appends one event when on; nothing when off (the hot path's cost: one test).
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) {
    if (!on_) return;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    events_.push_back(TraceEvent{a, addr, size, stream,
                                 std::chrono::duration_cast<std::chrono::microseconds>(now).count()});
  }

 private:
  bool on_ = false;
  std::vector<TraceEvent> events_;
};

}  // namespace cachet::gpu::detail
