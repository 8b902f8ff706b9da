// The CUDA runtime backend (cachet/gpu/cuda_backend.h: CudaRuntimeBackend): segments from
// cudaMalloc, events, and the capture graph queries (docs/pytorch-allocator.md §14.10.1); and
// make_cuda_memory, which picks it or the VMM backend (cuda_vmm_backend.cpp). Built only when
// CACHET_HAVE_CUDA.
#include "cachet/gpu/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cuda_calls.h"

namespace cachet::gpu {

using namespace cuda_detail;

int cuda_device_count() {
  int n = 0;  // left unwritten on error 35
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
    (void)cudaGetLastError();
    return 0;
  }
  if (e != cudaSuccess) throw DeviceError(cuda_msg("cudaGetDeviceCount", e));
  return n;
}

CudaRuntimeBackend::CudaRuntimeBackend(DeviceIndex device) : device_(device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n)
    throw DeviceError("CUDA device " + std::to_string(device) + " does not exist (this process sees " +
                      std::to_string(n) + " device(s))");
}

Result<DevicePtr> CudaRuntimeBackend::malloc(Bytes n) {
  DeviceGuard g(device_);
  const Capture c = current_capture();
  if (!c.error.empty()) return {Status::error(refusal("cudaMalloc", c, "the current stream", "")), 0};
  RelaxedCaptureMode relaxed(c.capturing);
  void* p = nullptr;
  Status st = status_of("cudaMalloc", cudaMalloc(&p, n));
  return {st, st.is_ok() ? static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)) : 0};
}

Status CudaRuntimeBackend::free(DevicePtr p) {
  if (auto why = refusal("cudaFree", current_capture(), "the current stream", kGiveBack); !why.empty())
    return Status::error(why);
  DeviceGuard g(device_);
  return status_of("cudaFree", cudaFree(ptr_of(p)));
}

Result<MemInfo> CudaRuntimeBackend::mem_get_info() {
  DeviceGuard g(device_);
  std::size_t free = 0, total = 0;
  Status st = status_of("cudaMemGetInfo", cudaMemGetInfo(&free, &total));
  return {st, MemInfo{free, total, std::nullopt}};  // no NVML: the process figure is omitted
}

bool CudaRuntimeBackend::stream_valid(StreamId s) {
  if (s == 0 || s == reinterpret_cast<std::uintptr_t>(cudaStreamLegacy) ||
      s == reinterpret_cast<std::uintptr_t>(cudaStreamPerThread))
    return true;
#if CUDART_VERSION >= 12080
  // cudaStreamGetDevice on a stream that is capturing fails (cudaErrorStreamCaptureUnsupported,
  // relaxed mode or not) and invalidates the capture (seen on an H100, CUDA 13.0), so a capturing
  // stream is not asked: a stream first used while it captures (torch.cuda.graph's own capture
  // stream) is taken as this device's when it is a live capturing stream; PyTorch checks no
  // stream's device at all.
  const Capture c = capture_of(s);
  if (!c.error.empty()) return false;  // no stream
  if (c.capturing) return true;
  int dev = -1;
  cudaError_t e = cudaSuccess;
  {
    RelaxedCaptureMode relaxed(true);  // a query: never refused for another thread's capture
    e = cudaStreamGetDevice(stream_of(s), &dev);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return dev == device_;
#else
  return true;
#endif
}

// ------------------------------------------------- the capture graph (docs §14.10.1)

// cudaStreamGetCaptureInfo as PyTorch's stream_get_capture_info calls it (CUDA 13: the edge data
// argument, left null; before: the _v2 entry point). An invalidated capture is an error (PyTorch
// asserts). A query: allowed during any capture, on any thread.
Result<CaptureInfo> CudaRuntimeBackend::capture_info(StreamId s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t n = 0;
#if CUDART_VERSION >= 13000
  const cudaError_t e = cudaStreamGetCaptureInfo(stream_of(s), &st, &id, &graph, &deps, nullptr, &n);
#else
  const cudaError_t e = cudaStreamGetCaptureInfo_v2(stream_of(s), &st, &id, &graph, &deps, &n);
#endif
  if (e != cudaSuccess) return {status_of("cudaStreamGetCaptureInfo", e), {}};
  if (st == cudaStreamCaptureStatusInvalidated)
    return {Status::error("cudaStreamGetCaptureInfo: the capture of stream " + hex(s) +
                          " was invalidated (PyTorch asserts \"Invalid stream capture status\")"),
            {}};
  CaptureInfo info;
  if (st != cudaStreamCaptureStatusActive) return {Status::ok(), info};
  info.capturing = true;
  info.capture_id = id;
  info.terminals.reserve(n);
  for (std::size_t i = 0; i < n; ++i) info.terminals.push_back(reinterpret_cast<std::uintptr_t>(deps[i]));
  return {Status::ok(), std::move(info)};
}

// cudaGraphNodeGetDependencies: the count first, then the nodes (CUDA 13: with edge data).
Result<std::vector<GraphNode>> CudaRuntimeBackend::node_dependencies(GraphNode n) {
  const auto node = reinterpret_cast<cudaGraphNode_t>(static_cast<std::uintptr_t>(n));
  std::size_t count = 0;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count);
#else
  cudaError_t e = cudaGraphNodeGetDependencies(node, nullptr, &count);
#endif
  if (e != cudaSuccess) return {status_of("cudaGraphNodeGetDependencies", e), {}};
  std::vector<cudaGraphNode_t> deps(count);
  if (count > 0) {
#if CUDART_VERSION >= 13000
    std::vector<cudaGraphEdgeData> edges(count);
    e = cudaGraphNodeGetDependencies(node, deps.data(), edges.data(), &count);
#else
    e = cudaGraphNodeGetDependencies(node, deps.data(), &count);
#endif
    if (e != cudaSuccess) return {status_of("cudaGraphNodeGetDependencies", e), {}};
    deps.resize(count);
  }
  std::vector<GraphNode> out;
  out.reserve(deps.size());
  for (cudaGraphNode_t d : deps) out.push_back(reinterpret_cast<std::uintptr_t>(d));
  return {Status::ok(), std::move(out)};
}

Result<EventHandle> CudaRuntimeBackend::event_create() {
  DeviceGuard g(device_);
  cudaEvent_t e = nullptr;
  Status st = status_of("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return {st, static_cast<EventHandle>(reinterpret_cast<std::uintptr_t>(e))};
}

Status CudaRuntimeBackend::event_record(EventHandle e, StreamId s) {
  // An event recorded on a capturing stream would become a node of the graph, never complete.
  if (auto why = refusal("cudaEventRecord", capture_of(s), "stream", kNoEvents); !why.empty())
    return Status::error(why);
  DeviceGuard g(device_);
  return status_of("cudaEventRecord", cudaEventRecord(event_of(e), stream_of(s)));
}

Result<bool> CudaRuntimeBackend::event_query(EventHandle e) {
  if (auto why = refusal("cudaEventQuery", current_capture(), "the current stream", kNoEvents); !why.empty())
    return {Status::error(why), false};
  cudaError_t r = cudaEventQuery(event_of(e));
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return {Status::ok(), false};
  }
  Status st = status_of("cudaEventQuery", r);
  return {st, st.is_ok()};
}

Status CudaRuntimeBackend::event_synchronize(EventHandle e) {
  if (auto why = refusal("cudaEventSynchronize", current_capture(), "the current stream", kNoEvents); !why.empty())
    return Status::error(why);
  return status_of("cudaEventSynchronize", cudaEventSynchronize(event_of(e)));
}

void CudaRuntimeBackend::event_destroy(EventHandle e) { (void)cudaEventDestroy(event_of(e)); }

std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool expandable) {
  if (expandable) return make_device_memory<CudaVmmBackend>(device);
  return make_device_memory<CudaRuntimeBackend>(device);
}

}  // namespace cachet::gpu
