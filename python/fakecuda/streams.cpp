// Streams, events, CUDA graph capture and kernels of the target (fakecuda.h F3). No work is ever
// pending: every stream and event is complete when asked, a host callback runs when enqueued, a
// kernel launch does nothing. Graph capture keeps the state PyTorch's allocator and CUDAGraph ask
// for (status, id per capturing stream).
#include "fakecuda.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>

namespace cachet::fakecuda {
namespace {
struct Capture {
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
};
std::mutex mu;
std::map<cudaStream_t, Capture> capturing;
std::map<cudaStream_t, int> priorities;
std::atomic<unsigned long long> next_capture_id{1};
thread_local cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;
bool is_capturing(cudaStream_t s) {
  std::lock_guard<std::mutex> g(mu);
  return capturing.count(s) != 0;
}
}  // namespace
}  // namespace cachet::fakecuda

using namespace cachet::fakecuda;

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = static_cast<cudaStream_t>(new_handle()); return cudaSuccess; }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int priority) {
  *s = static_cast<cudaStream_t>(new_handle());
  std::lock_guard<std::mutex> g(mu);
  priorities[*s] = priority;
  return cudaSuccess;
}
cudaError_t cudaStreamGetPriority(cudaStream_t s, int* priority) {
  std::lock_guard<std::mutex> g(mu);
  auto it = priorities.find(s);
  *priority = it == priorities.end() ? 0 : it->second;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void* user, unsigned int) {
  cb(s, cudaSuccess, user);
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user) {
  if (!is_capturing(s)) fn(user);  // under capture it belongs to the graph, run at replay
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = static_cast<cudaEvent_t>(new_handle()); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { *e = static_cast<cudaEvent_t>(new_handle()); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t, cudaStream_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t*, cudaEvent_t) { return cudaErrorNotSupported; }
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t*, cudaIpcEventHandle_t) { return cudaErrorNotSupported; }

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  std::lock_guard<std::mutex> g(mu);
  if (capturing.count(s)) return cudaErrorIllegalState;
  capturing[s] = Capture{next_capture_id.fetch_add(1), static_cast<cudaGraph_t>(new_handle())};
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> g(mu);
  auto it = capturing.find(s);
  if (it == capturing.end()) return cudaErrorIllegalState;
  *graph = it->second.graph;
  capturing.erase(it);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = is_capturing(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps,
                                     const cudaGraphEdgeData** edges, size_t* num_deps) {
  std::lock_guard<std::mutex> g(mu);
  auto it = capturing.find(s);
  if (status) *status = it == capturing.end() ? cudaStreamCaptureStatusNone : cudaStreamCaptureStatusActive;
  if (id) *id = it == capturing.end() ? 0 : it->second.id;
  if (graph) *graph = it == capturing.end() ? nullptr : it->second.graph;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (num_deps) *num_deps = 0;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  cudaStreamCaptureMode old = thread_capture_mode;
  thread_capture_mode = *mode;
  *mode = old;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t, cudaGraphNode_t* nodes, size_t* n) {
  // One node: PyTorch warns of an empty capture otherwise, and kernels were launched into it.
  if (nodes && *n >= 1) nodes[0] = static_cast<cudaGraphNode_t>(new_handle());
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t* n) {
  *n = 0;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t, unsigned long long) {
  *exec = static_cast<cudaGraphExec_t>(new_handle());
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphDebugDotPrint(cudaGraph_t, const char*, unsigned int) { return cudaSuccess; }

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) {
  *a = cudaFuncAttributes{};
  a->maxThreadsPerBlock = 1024;
  a->numRegs = 32;
  a->maxDynamicSharedSizeBytes = 49152;
  a->ptxVersion = target().major * 10 + target().minor;
  a->binaryVersion = a->ptxVersion;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int block, size_t, unsigned int) {
  int b = block > 0 ? target().max_threads_per_sm / block : 1;
  *n = b < 1 ? 1 : (b > target().max_blocks_per_sm ? target().max_blocks_per_sm : b);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) { return cudaSuccess; }

}  // extern "C"
