// gpu/src/shell/known_streams.h: the "stream of another device" check both policies make on allocate
// and record_stream. Asking the backend can be a driver call (cudaStreamGetDevice), so streams it
// accepted are remembered (up to 64, and the last one; more are simply asked again).
#pragma once

#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/backend.h"

namespace cachet::gpu::detail {

class KnownStreams {
 public:
  // Throws UsageError (changing nothing) when `stream` belongs to another device.
  // The stream of the last call is asked first, inline (the hot path allocates on one stream).
  [[gnu::always_inline]] void check(DeviceMemory& mem, DeviceIndex device, StreamId stream, const char* op) {
    if (stream == last_ && has_last_) [[likely]]
      return;
    check_slow(mem, device, stream, op);
  }

 private:
  [[gnu::noinline]] void check_slow(DeviceMemory& mem, DeviceIndex device, StreamId stream, const char* op) {
    for (StreamId s : streams_)
      if (s == stream) {
        last_ = stream;
        has_last_ = true;
        return;
      }
    if (mem.stream_valid(stream)) {
      if (streams_.size() < 64) streams_.push_back(stream);
      last_ = stream;
      has_last_ = true;
      return;
    }
    throw UsageError(std::string(op) + ": stream " + std::to_string(stream) +
                     " belongs to another device; this allocator serves device " + std::to_string(device) +
                     ". Use a stream of device " + std::to_string(device) + " or that device's allocator");
  }

  std::vector<StreamId> streams_;
  StreamId last_ = 0;
  bool has_last_ = false;  // last_ is a stream stream_valid accepted
};

}  // namespace cachet::gpu::detail
