// The CUDA backends (see cachet/gpu/cuda_backend.h). Built only when CACHET_HAVE_CUDA.
#include "cachet/gpu/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

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
  void* p = nullptr;
  Status st = status_of("cudaMalloc", cudaMalloc(&p, n));
  return {st, st.is_ok() ? static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)) : 0};
}

Status CudaRuntimeBackend::free(DevicePtr p) {
  DeviceGuard g(device_);
  return status_of("cudaFree", cudaFree(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p))));
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
  int dev = -1;
  if (cudaStreamGetDevice(stream_of(s), &dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return dev == device_;
#else
  return true;
#endif
}

Result<EventHandle> CudaRuntimeBackend::event_create() {
  DeviceGuard g(device_);
  cudaEvent_t e = nullptr;
  Status st = status_of("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return {st, static_cast<EventHandle>(reinterpret_cast<std::uintptr_t>(e))};
}

Status CudaRuntimeBackend::event_record(EventHandle e, StreamId s) {
  DeviceGuard g(device_);
  return status_of("cudaEventRecord", cudaEventRecord(event_of(e), stream_of(s)));
}

Result<bool> CudaRuntimeBackend::event_query(EventHandle e) {
  cudaError_t r = cudaEventQuery(event_of(e));
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return {Status::ok(), false};
  }
  Status st = status_of("cudaEventQuery", r);
  return {st, st.is_ok()};
}

Status CudaRuntimeBackend::event_synchronize(EventHandle e) {
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
  CUdeviceptr p = 0;
  Status st = cu_status("cuMemAddressReserve", drv_->address_reserve(&p, n, 0, 0, 0));
  return {st, static_cast<DevicePtr>(p)};
}

Status CudaVmmBackend::unreserve(DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  return cu_status("cuMemAddressFree", drv_->address_free(static_cast<CUdeviceptr>(p), n));
}

Status CudaVmmBackend::map(DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  CUmemAllocationProp prop = prop_for(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Bytes done = 0;
  Status st;
  for (; done < n; done += granularity_) {
    CUmemGenericAllocationHandle h = 0;
    st = cu_status("cuMemCreate", drv_->create(&h, granularity_, &prop, 0));
    if (!st.is_ok()) break;
    st = cu_status("cuMemMap", drv_->map(static_cast<CUdeviceptr>(p + done), granularity_, 0, h, 0));
    if (!st.is_ok()) {
      drv_->release(h);
      break;
    }
    handles_[p + done] = h;
  }
  if (st.is_ok()) st = cu_status("cuMemSetAccess", drv_->set_access(static_cast<CUdeviceptr>(p), n, &access, 1));
  if (!st.is_ok()) {  // nothing stays mapped
    for (Bytes off = 0; off < done; off += granularity_) {
      auto it = handles_.find(p + off);
      if (it == handles_.end()) continue;
      drv_->unmap(static_cast<CUdeviceptr>(p + off), granularity_);
      drv_->release(it->second);
      handles_.erase(it);
    }
  }
  return st;
}

Status CudaVmmBackend::unmap(DevicePtr p, Bytes n) {
  DeviceGuard g(device_);
  // Work queued on any stream may still use these pages (PyTorch synchronizes the segment's stream).
  if (Status st = status_of("cudaDeviceSynchronize", cudaDeviceSynchronize()); !st.is_ok()) return st;
  for (Bytes off = 0; off < n; off += granularity_) {
    auto it = handles_.find(p + off);
    if (it == handles_.end()) return Status::error("cuMemUnmap: granule at offset " + std::to_string(off) + " is not mapped");
    if (Status st = cu_status("cuMemUnmap", drv_->unmap(static_cast<CUdeviceptr>(p + off), granularity_)); !st.is_ok())
      return st;
    drv_->release(it->second);
    handles_.erase(it);
  }
  return Status::ok();
}

std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool expandable) {
  if (expandable) return make_device_memory<CudaVmmBackend>(device);
  return make_device_memory<CudaRuntimeBackend>(device);
}

}  // namespace cachet::gpu
