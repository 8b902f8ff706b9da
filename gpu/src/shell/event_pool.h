// gpu/src/shell/event_pool.h: the events both policies record for stream uses (PyTorch's
// record_stream, docs/pytorch-allocator.md §6), and the pool of spare ones (last released, first
// reused). Each policy keeps its own queue of pending events, in its own order; what is shared is
// how they are taken and recorded: every event of a free() is recorded before the policy changes
// anything, so a failing device call leaves the block, the stats and the trace as they were.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/backend.h"
#include "messages.h"

namespace cachet::gpu::detail {

class EventPool {
 public:
  void release(EventHandle e) { spare_.push_back(e); }
  // Destroys the spare events (a policy's destructor; errors cannot be reported there).
  void destroy_all(DeviceMemory& mem) {
    for (EventHandle e : spare_) mem.event_destroy(e);
    spare_.clear();
  }

  // One event per stream of `streams`, recorded on it, appended to `out` as make(event, stream).
  // On a failing cudaEventCreate or cudaEventRecord the events taken here go back to the pool
  // (the one that failed to record first, then the others in order), `out` is as it was, and
  // DeviceError is thrown.
  template <class Streams, class Out, class Make>
  void record_on(DeviceMemory& mem, DeviceIndex device, const Streams& streams, std::vector<Out>& out,
                 Make&& make) {
    const std::size_t first = out.size();
    auto give_back = [&] {
      for (std::size_t i = first; i < out.size(); ++i) spare_.push_back(out[i].first);
      out.resize(first);
    };
    for (StreamId s : streams) {
      EventHandle e;
      if (!spare_.empty()) {
        e = spare_.back();
        spare_.pop_back();
      } else {
        auto r = mem.event_create();
        if (!r.is_ok()) {
          give_back();
          throw DeviceError(device_error("cudaEventCreate", 0, device, r.status));
        }
        e = r.value;
      }
      auto st = mem.event_record(e, s);
      if (!st.is_ok()) {
        spare_.push_back(e);
        give_back();
        throw DeviceError(device_error("cudaEventRecord", 0, device, st));
      }
      out.push_back(make(e, s));
    }
  }

 private:
  std::vector<EventHandle> spare_;
};

}  // namespace cachet::gpu::detail
