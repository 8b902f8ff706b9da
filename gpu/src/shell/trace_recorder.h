// gpu/src/shell/trace_recorder.h: the trace both policies keep (PyTorch's
// _record_memory_history(enabled="all")): on or off, and the events recorded while on, each
// stamped with the wall clock in microseconds and the recording thread's TraceCallScope id
// (cachet/trace.h); and the listener told of each event as it is made (PyTorch's trace trackers,
// cachet/trace.h TraceListener), on or off.
//
// record() keeps the event and tells the listener at once. Where the listener must hear of an
// event on the other side of a device call than the trace keeps it (a segment's free: trackers
// before the device free, as native's record_trace comes before cudaFree; the trace after, so
// that a failing free keeps no event), the policy calls tell() before and keep() after.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "cachet/trace.h"

namespace cachet::gpu::detail {

class TraceRecorder {
 public:
  bool on() const { return on_; }
  void set_on(bool on) {
    on_ = on;
    active_ = on_ || listener_;
  }
  bool listening() const { return static_cast<bool>(listener_); }
  bool active() const { return active_; }  // record() keeps or tells anything
  void set_listener(TraceListener l) {
    listener_ = std::move(l);
    active_ = on_ || listener_;
  }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear() { events_.clear(); }
  // Appends one event when on; nothing when off (the hot path's cost: one test).
  // The append is out of line, off the pages of the common allocate and free
  // (gpu/src/policy_pytorch/malloc.cpp, "The hot path's layout").
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool = {}) {
    if (active_) [[unlikely]]
      append(a, addr, size, stream, pool, on_, true);
  }
  // The listener only (see above): the trace keeps the event at keep(), or never.
  void tell(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool = {}) {
    if (listener_) [[unlikely]]
      append(a, addr, size, stream, pool, false, true);
  }
  // The trace only: the listener was told at tell(), or is never told.
  void keep(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool = {}) {
    if (on_) [[unlikely]]
      append(a, addr, size, stream, pool, true, false);
  }

 private:
  [[gnu::noinline]] void append(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool,
                                bool keep_it, bool tell_it) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    TraceEvent e{a, addr, size, stream, std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
                 current_trace_call(), pool};
    if (tell_it && listener_) {
      try {
        listener_(e);
      } catch (...) {  // the listener's contract (cachet/trace.h): never through the policy's state
      }
    }
    if (keep_it) events_.push_back(e);
  }

  bool on_ = false;
  bool active_ = false;  // on_ or a listener: the hot path's one test
  TraceListener listener_;
  std::vector<TraceEvent> events_;
};

}  // namespace cachet::gpu::detail
