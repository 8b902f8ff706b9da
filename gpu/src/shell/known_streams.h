// gpu/src/shell/known_streams.h: the "stream of another device" check both policies make on allocate
// and record_stream. Asking the backend can be a driver call (cudaStreamGetDevice), so streams it
// accepted are remembered (up to 64; more are simply asked again).
#pragma once

#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/backend.h"

namespace cachet::gpu::detail {

class KnownStreams {
 public:
  // Throws UsageError (changing nothing) when `stream` belongs to another device.
  void check(DeviceMemory& mem, DeviceIndex device, StreamId stream, const char* op) {
    for (StreamId s : streams_)
      if (s == stream) return;
    if (mem.stream_valid(stream)) {
      if (streams_.size() < 64) streams_.push_back(stream);
      return;
    }
    throw UsageError(std::string(op) + ": stream " + std::to_string(stream) +
                     " belongs to another device; this allocator serves device " + std::to_string(device) +
                     ". Use a stream of device " + std::to_string(device) + " or that device's allocator");
  }

 private:
  std::vector<StreamId> streams_;
};

}  // namespace cachet::gpu::detail
