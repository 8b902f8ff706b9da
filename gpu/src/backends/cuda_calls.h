// gpu/src/backends/cuda_calls.h (private to the CUDA backends): what the runtime backend
// (cuda_runtime_backend.cpp) and the VMM backend (cuda_vmm_backend.cpp) both need around a CUDA
// call: its error as a Status (an out-of-memory as Status::oom, the sticky error cleared), the
// device selected for the call's scope, the handles as CUDA's types, and the capture rules of
// device calls: whether the calling thread's stream is capturing a CUDA graph (as PyTorch reads
// it), why a call is refused then (giving memory back, events: docs/pytorch-allocator.md §14.7,
// §14.8.2), and PyTorch's relaxed capture mode for the allocations it lets through.
#pragma once

#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cachet/gpu/cuda_backend.h"

namespace cachet::gpu::cuda_detail {

inline std::string cuda_msg(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

inline Status status_of(const char* call, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  (void)cudaGetLastError();  // clear the sticky-free error state
  if (e == cudaErrorMemoryAllocation) return Status::oom(cuda_msg(call, e));
  return Status::error(cuda_msg(call, e));
}

// Selects `device` for the scope, restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

inline cudaStream_t stream_of(StreamId s) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s)); }
inline cudaEvent_t event_of(EventHandle e) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(e)); }
inline void* ptr_of(DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

inline std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// ------------------------------------------------- CUDA graph capture (docs §14.7, §14.8.2)

// The capture status of a stream as PyTorch reads it (currentStreamCaptureStatusMayInitCtx):
// capturing unless cudaStreamCaptureStatusNone (an invalidated capture counts as capturing).
struct Capture {
  bool known = false;      // a stream was asked about
  bool capturing = false;
  StreamId stream = 0;
  std::string error;       // cudaStreamIsCapturing failed: the call is refused with this
};

inline Capture capture_of(StreamId s) {
  Capture c;
  c.known = true;
  c.stream = s;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream_of(s), &st); e != cudaSuccess) {
    (void)cudaGetLastError();
    c.error = cuda_msg("cudaStreamIsCapturing", e);
    return c;
  }
  c.capturing = st != cudaStreamCaptureStatusNone;
  return c;
}

// The thread's current stream (CurrentStream, else its provider's); neither: treated as not
// capturing. Device calls only.
inline Capture current_capture() {
  if (CurrentStream::is_set()) return capture_of(CurrentStream::get());
  if (CurrentStream::Provider p = CurrentStream::provider()) return capture_of(p());
  return Capture{};
}

// Why `call` is refused for capture `c`, or "" when it may go ahead. `what` says what PyTorch
// does instead.
inline std::string refusal(const char* call, const Capture& c, const char* subject, const char* what) {
  if (!c.known || (!c.capturing && c.error.empty())) return "";
  std::string m = std::string(call) + " refused: ";
  if (!c.error.empty())
    return m + "cannot tell whether " + subject + " " + hex(c.stream) + " is capturing a CUDA graph (" + c.error + ")";
  return m + subject + " " + hex(c.stream) + " is capturing a CUDA graph; " + what;
}

inline constexpr const char* kGiveBack =
    "the driver forbids giving memory back during a capture and would invalidate the capture (PyTorch 2.11 "
    "fails here too, docs/pytorch-allocator.md §14.8.2); nothing was changed";
inline constexpr const char* kNoEvents =
    "PyTorch records, queries and waits for no event during a capture (docs/pytorch-allocator.md §14.7); "
    "nothing was done";

// PyTorch's CUDAStreamCaptureModeGuard{cudaStreamCaptureModeRelaxed}, applied only when `on`:
// device allocations on a capturing stream (cudaMallocMaybeCapturing) may then run without
// invalidating the capture.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(bool on) {
    if (!on) return;
    if (cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) active_ = true;
    else (void)cudaGetLastError();
  }
  ~RelaxedCaptureMode() {
    if (active_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);  // back to the caller's mode
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool active_ = false;
};

}  // namespace cachet::gpu::cuda_detail
