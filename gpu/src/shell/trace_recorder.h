// gpu/src/shell/trace_recorder.h: the trace both policies keep (PyTorch's
// _record_memory_history(enabled="all")): on or off, and the events recorded while on, each
// stamped with the wall clock in microseconds and the recording thread's TraceCallScope id
// (cachet/trace.h).
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
  // The append is out of line, off the pages of the common allocate and free
  // (gpu/src/policy_pytorch/malloc.cpp, "The hot path's layout").
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) {
    if (on_) [[unlikely]]
      append(a, addr, size, stream);
  }

 private:
  [[gnu::noinline]] void append(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    events_.push_back(TraceEvent{a, addr, size, stream,
                                 std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
                                 current_trace_call()});
  }

  bool on_ = false;
  std::vector<TraceEvent> events_;
};

}  // namespace cachet::gpu::detail
