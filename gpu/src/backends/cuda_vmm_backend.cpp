// The CUDA VMM backend (cachet/gpu/cuda_backend.h: CudaVmmBackend), PyTorch's expandable segments
// (docs/pytorch-allocator.md §7): address ranges reserved with cuMemAddressReserve, physical
// memory created and mapped in granules (cuMemCreate, cuMemMap, cuMemSetAccess) and unmapped
// again, through driver entry points fetched at run time (no binary links libcuda); and the sleep
// calls (pinned host buffers, the copies of backed-up contents). Its cudaMalloc, events and
// capture queries are the runtime backend's (cuda_runtime_backend.cpp). Built only when
// CACHET_HAVE_CUDA.
#include "cachet/gpu/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cuda_calls.h"

namespace cachet::gpu {

using namespace cuda_detail;

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
  for (void* h : pinned_.all()) (void)cudaFreeHost(h);  // kept ones and any still lent
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

// ------------------------------------------------------------------ sleep calls (pinned host
// buffers and the copies of backed-up contents, docs/sleep-wake.md)

Result<void*> CudaVmmBackend::host_alloc(Bytes n) {
  if (void* h = pinned_.take(n)) return {Status::ok(), h};
  DeviceGuard g(device_);
  for (void* h : pinned_.make_room(n)) (void)cudaFreeHost(h);  // kept within the peak (pinned_keep.h)
  void* h = nullptr;
  Status st = status_of("cudaHostAlloc", cudaHostAlloc(&h, n, cudaHostAllocDefault));
  if (!st.is_ok() && pinned_.kept_count() != 0) {  // the kept buffers may be what host memory lacks
    (void)cudaGetLastError();
    host_trim();
    st = status_of("cudaHostAlloc", cudaHostAlloc(&h, n, cudaHostAllocDefault));
  }
  if (!st.is_ok()) return {st, nullptr};
  pinned_.pinned(h, n);
  return {st, h};
}

void CudaVmmBackend::host_free(void* h) { (void)pinned_.give(h); }

Bytes CudaVmmBackend::host_trim() {
  DeviceGuard g(device_);
  Bytes given = 0;
  for (auto& [h, n] : pinned_.release_kept()) {
    (void)cudaFreeHost(h);
    given += n;
  }
  return given;
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

}  // namespace cachet::gpu
