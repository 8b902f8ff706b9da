// The CUDA backends (see cachet/gpu/cuda_backend.h). Built only when CACHET_HAVE_CUDA.
#include "cachet/gpu/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cachet/errors.h"

namespace cachet::gpu {

namespace {

std::string cuda_msg(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

Status status_of(const char* call, cudaError_t e) {
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

cudaStream_t stream_of(StreamId s) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s)); }
cudaEvent_t event_of(EventHandle e) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(e)); }
void* ptr_of(DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

std::string hex(std::uint64_t v) {
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

Capture capture_of(StreamId s) {
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
Capture current_capture() {
  if (CurrentStream::is_set()) return capture_of(CurrentStream::get());
  if (CurrentStream::Provider p = CurrentStream::provider()) return capture_of(p());
  return Capture{};
}

// Why `call` is refused for capture `c`, or "" when it may go ahead. `what` says what PyTorch
// does instead.
std::string refusal(const char* call, const Capture& c, const char* subject, const char* what) {
  if (!c.known || (!c.capturing && c.error.empty())) return "";
  std::string m = std::string(call) + " refused: ";
  if (!c.error.empty())
    return m + "cannot tell whether " + subject + " " + hex(c.stream) + " is capturing a CUDA graph (" + c.error + ")";
  return m + subject + " " + hex(c.stream) + " is capturing a CUDA graph; " + what;
}

constexpr const char* kGiveBack =
    "the driver forbids giving memory back during a capture and would invalidate the capture (PyTorch 2.11 "
    "fails here too, docs/pytorch-allocator.md §14.8.2); nothing was changed";
constexpr const char* kNoEvents =
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

}  // namespace

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

// ------------------------------------------------------------------------------ VMM

struct CudaVmmBackend::Driver {
  using AddressReserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using AddressFree = CUresult (*)(CUdeviceptr, size_t);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using Unmap = CUresult (*)(CUdeviceptr, size_t);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  AddressReserve address_reserve = nullptr;
  AddressFree address_free = nullptr;
  Create create = nullptr;
  Release release = nullptr;
  Map map = nullptr;
  Unmap unmap = nullptr;
  SetAccess set_access = nullptr;
  Granularity granularity = nullptr;
};

namespace {
template <class F>
void fetch(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    throw DeviceError(std::string("CUDA driver entry point ") + name +
                      " is unavailable (expandable segments need a CUDA 12+ driver); use expandable_segments:False");
  }
  fn = reinterpret_cast<F>(p);
}

Status cu_status(const char* call, CUresult r) {
  if (r == CUDA_SUCCESS) return Status::ok();
  std::string m = std::string(call) + " failed with CUresult " + std::to_string(static_cast<int>(r));
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return Status::oom(m);
  return Status::error(m);
}

CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
}  // namespace

CudaVmmBackend::CudaVmmBackend(DeviceIndex device) : CudaRuntimeBackend(device), drv_(std::make_shared<Driver>()) {
  fetch("cuMemAddressReserve", drv_->address_reserve);
  fetch("cuMemAddressFree", drv_->address_free);
  fetch("cuMemCreate", drv_->create);
  fetch("cuMemRelease", drv_->release);
  fetch("cuMemMap", drv_->map);
  fetch("cuMemUnmap", drv_->unmap);
  fetch("cuMemSetAccess", drv_->set_access);
  fetch("cuMemGetAllocationGranularity", drv_->granularity);
  CUmemAllocationProp prop = prop_for(device);
  std::size_t g = 0;
  if (drv_->granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g > 0) granularity_ = g;
  if ((2 * MiB) % granularity_ != 0)
    throw DeviceError("CUDA VMM granularity " + std::to_string(granularity_) + " does not divide 2 MiB pages");
}

Result<DevicePtr> CudaVmmBackend::reserve(Bytes n) {
  DeviceGuard g(device_);
  const Capture c = current_capture();  // a new expandable segment is a growth: relaxed as map
  if (!c.error.empty()) return {Status::error(refusal("cuMemAddressReserve", c, "the current stream", "")), 0};
  RelaxedCaptureMode relaxed(c.capturing);
  CUdeviceptr p = 0;
  Status st = cu_status("cuMemAddressReserve", drv_->address_reserve(&p, n, 0, 0, 0));
  return {st, static_cast<DevicePtr>(p)};
}

Status CudaVmmBackend::unreserve(DevicePtr p, Bytes n) {
  if (auto why = refusal("cuMemAddressFree", current_capture(), "the current stream", kGiveBack); !why.empty())
    return Status::error(why);
  DeviceGuard g(device_);
  return cu_status("cuMemAddressFree", drv_->address_free(static_cast<CUdeviceptr>(p), n));
}

CudaVmmBackend::~CudaVmmBackend() {
  if (copy_stream_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
  DeviceGuard g(device_);
  for (auto& [h, n] : pinned_size_) (void)cudaFreeHost(h);  // kept ones and any still lent
}

Status CudaVmmBackend::map_handle(DevicePtr at, Bytes size, unsigned long long handle) {
  Status st = cu_status("cuMemMap", drv_->map(static_cast<CUdeviceptr>(at), size, 0, handle, 0));
  if (!st.is_ok()) return st;
  mappings_[at] = Mapping{handle, size};
  ++handle_uses_[handle];
  return st;
}

void CudaVmmBackend::drop_handle(unsigned long long handle) {
  auto it = handle_uses_.find(handle);
  if (it == handle_uses_.end() || --it->second > 0) return;
  drv_->release(handle);
  handle_uses_.erase(it);
}

Status CudaVmmBackend::map(DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  const Capture c = current_capture();
  if (!c.error.empty()) return Status::error(refusal("cuMemCreate/cuMemMap", c, "the current stream", ""));
  RelaxedCaptureMode relaxed(c.capturing);  // cuMemCreate, cuMemMap, cuMemSetAccess (and the undo)
  CUmemAllocationProp prop = prop_for(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Bytes done = 0;
  Status st;
  for (; done < n; done += granularity_) {  // one handle per granule: any granule can be unmapped
    CUmemGenericAllocationHandle h = 0;
    st = cu_status("cuMemCreate", drv_->create(&h, granularity_, &prop, 0));
    if (!st.is_ok()) break;
    st = map_handle(p + done, granularity_, h);
    if (!st.is_ok()) {
      drv_->release(h);
      break;
    }
  }
  if (st.is_ok()) st = cu_status("cuMemSetAccess", drv_->set_access(static_cast<CUdeviceptr>(p), n, &access, 1));
  if (!st.is_ok()) {  // nothing stays mapped
    for (Bytes off = 0; off < done; off += granularity_) {
      auto it = mappings_.find(p + off);
      if (it == mappings_.end()) continue;
      drv_->unmap(static_cast<CUdeviceptr>(p + off), it->second.size);
      const unsigned long long h = it->second.handle;
      mappings_.erase(it);
      drop_handle(h);
    }
  }
  return st;
}

Status CudaVmmBackend::map_pieces(DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  const Capture c = current_capture();
  if (!c.error.empty()) return Status::error(refusal("cuMemCreate/cuMemMap", c, "the current stream", ""));
  RelaxedCaptureMode relaxed(c.capturing);
  CUmemAllocationProp prop = prop_for(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Bytes done = 0;
  Status st;
  while (done < n) {  // pieces of up to 512 MiB: 170x faster to create and map than 2 MiB ones
    const Bytes piece = std::min(n - done, kMaxMapPiece);
    CUmemGenericAllocationHandle h = 0;
    st = cu_status("cuMemCreate", drv_->create(&h, piece, &prop, 0));
    if (!st.is_ok()) break;
    st = map_handle(p + done, piece, h);
    if (!st.is_ok()) {
      drv_->release(h);
      break;
    }
    done += piece;
  }
  if (st.is_ok()) st = cu_status("cuMemSetAccess", drv_->set_access(static_cast<CUdeviceptr>(p), n, &access, 1));
  if (!st.is_ok()) {  // nothing stays mapped
    for (auto it = mappings_.lower_bound(p); it != mappings_.end() && it->first < p + done;) {
      drv_->unmap(static_cast<CUdeviceptr>(it->first), it->second.size);
      const unsigned long long h = it->second.handle;
      it = mappings_.erase(it);
      drop_handle(h);
    }
  }
  return st;
}

Status CudaVmmBackend::unmap(DevicePtr p, Bytes n) {
  if (auto why = refusal("cuMemUnmap", current_capture(), "the current stream", kGiveBack); !why.empty())
    return Status::error(why);
  DeviceGuard g(device_);
  // Work queued on any stream may still use these pages (PyTorch synchronizes the segment's stream).
  if (Status st = status_of("cudaDeviceSynchronize", cudaDeviceSynchronize()); !st.is_ok()) return st;
  const DevicePtr end = p + n;
  for (DevicePtr at = p; at < end;) {
    auto it = mappings_.upper_bound(at);
    if (it == mappings_.begin() || std::prev(it)->first + std::prev(it)->second.size <= at)
      return Status::error("cuMemUnmap: " + hex(at) + " (offset " + std::to_string(at - p) + ") is not mapped");
    --it;
    const DevicePtr base = it->first;
    const Mapping m = it->second;
    // A mapping only partly in [p, p+n) (a piece of map_pieces): its other parts keep their
    // contents, through new physical allocations of their own. The driver may refuse to map a
    // physical allocation from an offset (CUDA_ERROR_NOT_SUPPORTED, 801, on an H200 with driver
    // 580), so every mapping maps a whole allocation from offset 0: the parts are copied to the
    // host, the piece is unmapped and released, the parts mapped anew (map_pieces) and copied back.
    struct Kept {
      DevicePtr at;
      Bytes size;
      std::unique_ptr<unsigned char[]> host;
    };
    std::vector<Kept> kept;
    if (base < p) kept.push_back({base, p - base, nullptr});
    if (base + m.size > end) kept.push_back({end, base + m.size - end, nullptr});
    for (Kept& k : kept) {
      k.host.reset(new (std::nothrow) unsigned char[k.size]);
      if (!k.host)
        return Status::error("cuMemUnmap of part of a mapping: no host memory for the " + std::to_string(k.size) +
                             " bytes of its other part at " + hex(k.at) + " (nothing was unmapped)");
      if (Status st = status_of("cudaMemcpy", cudaMemcpy(k.host.get(), ptr_of(k.at), k.size, cudaMemcpyDeviceToHost));
          !st.is_ok())
        return st;
    }
    if (Status st = cu_status("cuMemUnmap", drv_->unmap(static_cast<CUdeviceptr>(base), m.size)); !st.is_ok())
      return st;
    mappings_.erase(it);
    drop_handle(m.handle);
    for (const Kept& k : kept) {
      Status st = map_pieces(k.at, k.size);
      if (st.is_ok())
        st = status_of("cudaMemcpy", cudaMemcpy(ptr_of(k.at), k.host.get(), k.size, cudaMemcpyHostToDevice));
      if (!st.is_ok())
        return Status::error("cuMemUnmap of part of a mapping: the other part at " + hex(k.at) + " (" +
                             std::to_string(k.size) + " bytes) could not be mapped again: " + st.message);
    }
    at = base + m.size;
  }
  return Status::ok();
}

// ------------------------------------------------------------------ sleep calls

Result<void*> CudaVmmBackend::host_alloc(Bytes n) {
  if (auto it = pinned_kept_.lower_bound(n); it != pinned_kept_.end()) {
    void* h = it->second;
    pinned_kept_.erase(it);
    return {Status::ok(), h};
  }
  DeviceGuard g(device_);
  void* h = nullptr;
  Status st = status_of("cudaHostAlloc", cudaHostAlloc(&h, n, cudaHostAllocDefault));
  if (!st.is_ok() && !pinned_kept_.empty()) {  // the kept buffers may be what host memory lacks
    (void)cudaGetLastError();
    host_trim();
    st = status_of("cudaHostAlloc", cudaHostAlloc(&h, n, cudaHostAllocDefault));
  }
  if (!st.is_ok()) return {st, nullptr};
  pinned_size_[h] = n;
  return {st, h};
}

void CudaVmmBackend::host_free(void* h) {
  auto it = pinned_size_.find(h);
  if (it == pinned_size_.end()) return;
  pinned_kept_.emplace(it->second, h);
}

void CudaVmmBackend::host_trim() {
  DeviceGuard g(device_);
  for (auto& [n, h] : pinned_kept_) {
    (void)cudaFreeHost(h);
    pinned_size_.erase(h);
  }
  pinned_kept_.clear();
}

Status CudaVmmBackend::copy_prepare() {
  if (copy_stream_ == nullptr) {
    cudaStream_t s = nullptr;
    if (Status st = status_of("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        !st.is_ok())
      return st;
    copy_stream_ = s;
  }
  if (!copies_pending_) {  // the first copy of a batch: everything queued before has finished
    if (Status st = status_of("cudaDeviceSynchronize", cudaDeviceSynchronize()); !st.is_ok()) return st;
    copies_pending_ = true;
  }
  return Status::ok();
}

Status CudaVmmBackend::copy_to_host(void* h, DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  if (Status st = copy_prepare(); !st.is_ok()) return st;
  return status_of("cudaMemcpyAsync",
                   cudaMemcpyAsync(h, ptr_of(p), n, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(copy_stream_)));
}

Status CudaVmmBackend::copy_to_device(DevicePtr p, const void* h, Bytes n) {
  DeviceGuard g(device_);
  if (Status st = copy_prepare(); !st.is_ok()) return st;
  return status_of("cudaMemcpyAsync",
                   cudaMemcpyAsync(ptr_of(p), h, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(copy_stream_)));
}

Status CudaVmmBackend::copy_synchronize() {
  DeviceGuard g(device_);
  copies_pending_ = false;
  if (copy_stream_ == nullptr) return Status::ok();
  return status_of("cudaStreamSynchronize", cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_)));
}

std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool expandable) {
  if (expandable) return make_device_memory<CudaVmmBackend>(device);
  return make_device_memory<CudaRuntimeBackend>(device);
}

}  // namespace cachet::gpu
