// Device memory of the target (fakecuda.h F1, F2): cudaMalloc and its kin, the driver's virtual
// memory calls that expandable segments make, pinned host memory (real host memory, since the
// program writes into it), pointer attributes, and copies (a copy from the device writes the
// placeholder: zero bytes).
#include "fakecuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace cachet::fakecuda {
namespace {
constexpr std::uint64_t kPage = 2ULL << 20;  // the driver's granularity for device memory
std::mutex mu;
std::uint64_t in_use = 0;
std::uintptr_t va_base = 0, va_size = 0;
std::map<std::uintptr_t, std::uint64_t> va_free;   // start -> size, coalesced
std::map<std::uintptr_t, std::uint64_t> va_live;   // start -> size
std::map<std::uintptr_t, std::uint64_t> mallocs;   // cudaMalloc bases -> size
std::map<std::uintptr_t, std::uint64_t> pinned;    // host memory known to CUDA -> size
std::map<unsigned long long, std::uint64_t> vmm;   // cuMemCreate handles -> size
unsigned long long next_vmm = 1;

void init_va() {
  if (va_base) return;
  // Four times the target's memory, at least 1 TiB: expandable segments reserve address space
  // well past what they map. PROT_NONE + NORESERVE costs no memory.
  std::uint64_t want = std::max<std::uint64_t>(4 * target().total_memory, 1ULL << 40);
  void* p = mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) std::abort();
  std::uintptr_t b = (reinterpret_cast<std::uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  va_base = b;
  va_size = want - (b - reinterpret_cast<std::uintptr_t>(p)) - kPage;
  va_free[va_base] = va_size;
}
std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }
}  // namespace

bool take_device_bytes(std::uint64_t n) {
  std::lock_guard<std::mutex> g(mu);
  const Target& t = target();
  if (in_use + n + t.outside_allocator > t.total_memory) return false;
  in_use += n;
  return true;
}
void give_device_bytes(std::uint64_t n) {
  std::lock_guard<std::mutex> g(mu);
  in_use -= n;
}
std::uint64_t device_bytes_in_use() {
  std::lock_guard<std::mutex> g(mu);
  return in_use;
}
std::uintptr_t reserve_va(std::uint64_t n, std::uint64_t align) {
  std::lock_guard<std::mutex> g(mu);
  init_va();
  n = round_up(n ? n : 1, kPage);
  align = std::max(align, kPage);
  for (auto it = va_free.begin(); it != va_free.end(); ++it) {
    std::uintptr_t start = round_up(it->first, align);
    std::uint64_t lead = start - it->first;
    if (it->second < lead + n) continue;
    std::uintptr_t fs = it->first;
    std::uint64_t fsz = it->second;
    va_free.erase(it);
    if (lead) va_free[fs] = lead;
    if (fsz > lead + n) va_free[start + n] = fsz - lead - n;
    va_live[start] = n;
    return start;
  }
  return 0;
}
void release_va(std::uintptr_t p) {
  std::lock_guard<std::mutex> g(mu);
  auto it = va_live.find(p);
  if (it == va_live.end()) return;
  std::uintptr_t s = it->first;
  std::uint64_t n = it->second;
  va_live.erase(it);
  auto next = va_free.lower_bound(s);
  if (next != va_free.end() && s + n == next->first) { n += next->second; va_free.erase(next); }
  auto prev = va_free.lower_bound(s);
  if (prev != va_free.begin()) {
    --prev;
    if (prev->first + prev->second == s) { prev->second += n; return; }
  }
  va_free[s] = n;
}
bool is_device_pointer(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return va_base && a >= va_base && a < va_base + va_size;
}
std::uint64_t device_allocation_size(const void* p) {
  std::lock_guard<std::mutex> g(mu);
  auto it = mallocs.find(reinterpret_cast<std::uintptr_t>(p));
  return it == mallocs.end() ? 0 : it->second;
}

namespace {
bool is_pinned(const void* p) {
  std::lock_guard<std::mutex> g(mu);
  auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned.upper_bound(a);
  if (it == pinned.begin()) return false;
  --it;
  return a < it->first + it->second;
}
cudaError_t device_malloc(void** ptr, size_t size) {
  if (!take_device_bytes(round_up(size ? size : 1, 512))) return cudaErrorMemoryAllocation;
  std::uintptr_t p = reserve_va(size, kPage);
  if (!p) { give_device_bytes(round_up(size ? size : 1, 512)); return cudaErrorMemoryAllocation; }
  {
    std::lock_guard<std::mutex> g(mu);
    mallocs[p] = round_up(size ? size : 1, 512);
  }
  *ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}
cudaError_t device_free(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::uint64_t n;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = mallocs.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == mallocs.end()) return cudaErrorInvalidValue;
    n = it->second;
    mallocs.erase(it);
  }
  give_device_bytes(n);
  release_va(reinterpret_cast<std::uintptr_t>(ptr));
  return cudaSuccess;
}
// Where a copy lands on the host, the placeholder; host to host copies are real.
void copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (!n || !dst) return;
  bool dst_dev = is_device_pointer(dst), src_dev = is_device_pointer(src);
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice || dst_dev) return;
  if (kind == cudaMemcpyDeviceToHost || src_dev) {
    std::memset(dst, 0, n);
    return;
  }
  std::memmove(dst, src, n);
}
}  // namespace
}  // namespace cachet::fakecuda

using namespace cachet::fakecuda;

extern "C" {

cudaError_t cudaMalloc(void** ptr, size_t size) { return device_malloc(ptr, size); }
cudaError_t cudaFree(void* ptr) { return device_free(ptr); }
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) { return device_malloc(ptr, size); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return device_free(ptr); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  const Target& t = target();
  std::uint64_t used = device_bytes_in_use() + t.outside_allocator;
  *total = t.total_memory;
  *free_bytes = used >= t.total_memory ? 0 : t.total_memory - used;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) return cudaErrorMemoryAllocation;
  {
    std::lock_guard<std::mutex> g(mu);
    pinned[reinterpret_cast<std::uintptr_t>(p)] = size ? size : 1;
  }
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> g(mu);
    pinned.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  std::lock_guard<std::mutex> g(mu);
  pinned[reinterpret_cast<std::uintptr_t>(ptr)] = size;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> g(mu);
  pinned.erase(reinterpret_cast<std::uintptr_t>(ptr));
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  if (is_device_pointer(p)) {
    a->type = cudaMemoryTypeDevice;
    a->device = 0;
    a->devicePointer = const_cast<void*>(p);
  } else if (is_pinned(p)) {
    a->type = cudaMemoryTypeHost;
    a->device = 0;
    a->hostPointer = const_cast<void*>(p);
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  copy(dst, src, n, kind);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
  copy(dst, src, n, kind);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void*, int, const void*, int, size_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaMemset(void*, int, size_t) { return cudaSuccess; }
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGetSymbolAddress(void** dev, const void*) {
  static void* sym = nullptr;
  if (!sym) device_malloc(&sym, 1 << 20);
  *dev = sym;
  return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void*, const void*, size_t, size_t, cudaMemcpyKind) { return cudaSuccess; }
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*) { return cudaErrorNotSupported; }
cudaError_t cudaIpcOpenMemHandle(void**, cudaIpcMemHandle_t, unsigned int) { return cudaErrorNotSupported; }
cudaError_t cudaIpcCloseMemHandle(void*) { return cudaErrorNotSupported; }

}  // extern "C"

// ---- Driver entry points PyTorch fetches through cudaGetDriverEntryPointByVersion ----
namespace cachet::fakecuda {
namespace {
CUresult d_primary_ctx_state(CUdevice, unsigned int* flags, int* active) {
  if (flags) *flags = 0;
  if (active) *active = 1;
  return CUDA_SUCCESS;
}
CUresult d_ctx_get_current(CUcontext* c) { *c = static_cast<CUcontext>(primary_context()); return CUDA_SUCCESS; }
CUresult d_ctx_set_current(CUcontext) { return CUDA_SUCCESS; }
CUresult d_device_get(CUdevice* d, int ordinal) { *d = ordinal; return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
CUresult d_device_get_attribute(int* v, CUdevice_attribute a, CUdevice dev) {
  // The driver's and the runtime's attribute numbers coincide.
  return cudaDeviceGetAttribute(v, static_cast<cudaDeviceAttr>(a), dev) == cudaSuccess ? CUDA_SUCCESS
                                                                                     : CUDA_ERROR_INVALID_DEVICE;
}
CUresult d_granularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = kPage;
  return CUDA_SUCCESS;
}
CUresult d_mem_create(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp*, unsigned long long) {
  if (!take_device_bytes(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> g(mu);
  *h = next_vmm++;
  vmm[*h] = size;
  return CUDA_SUCCESS;
}
CUresult d_mem_release(CUmemGenericAllocationHandle h) {
  std::uint64_t n = 0;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = vmm.find(h);
    if (it == vmm.end()) return CUDA_ERROR_INVALID_VALUE;
    n = it->second;
    vmm.erase(it);
  }
  give_device_bytes(n);
  return CUDA_SUCCESS;
}
CUresult d_addr_reserve(CUdeviceptr* p, size_t size, size_t align, CUdeviceptr, unsigned long long) {
  std::uintptr_t a = reserve_va(size, align);
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = a;
  return CUDA_SUCCESS;
}
CUresult d_addr_free(CUdeviceptr p, size_t) { release_va(p); return CUDA_SUCCESS; }
CUresult d_ok() { return CUDA_SUCCESS; }
CUresult d_not_supported() { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult d_error_string(CUresult, const char** s) { *s = "error reported by cachet's fake CUDA device"; return CUDA_SUCCESS; }
// The device memory a statically linked runtime asks the driver for (cuDNN's own, driver_static.cpp):
// the same device bytes as cudaMalloc's (F1, F2).
CUresult d_mem_alloc(CUdeviceptr* p, size_t size) {
  void* v = nullptr;
  if (device_malloc(&v, size) != cudaSuccess) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(v);
  return CUDA_SUCCESS;
}
CUresult d_mem_alloc_async(CUdeviceptr* p, size_t size, CUstream) { return d_mem_alloc(p, size); }
CUresult d_mem_free(CUdeviceptr p) {
  return device_free(reinterpret_cast<void*>(p)) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult d_mem_free_async(CUdeviceptr p, CUstream) { return d_mem_free(p); }
CUresult d_mem_get_info(size_t* free_bytes, size_t* total) {
  cudaMemGetInfo(free_bytes, total);
  return CUDA_SUCCESS;
}
CUresult d_host_alloc(void** p, size_t size, unsigned int flags) {
  return cudaHostAlloc(p, size, flags) == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult d_host_alloc_default(void** p, size_t size) { return d_host_alloc(p, size, 0); }
CUresult d_host_free(void* p) { cudaFreeHost(p); return CUDA_SUCCESS; }
// cuPointerGetAttributes as cudaPointerGetAttributes answers it.
CUresult d_pointer_attributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  const void* p = reinterpret_cast<const void*>(ptr);
  const bool dev = is_device_pointer(p), host = !dev && is_pinned(p);
  for (unsigned int i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = (dev || host) ? static_cast<CUcontext>(primary_context()) : nullptr; break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned int*>(data[i]) = dev ? CU_MEMORYTYPE_DEVICE : host ? CU_MEMORYTYPE_HOST : 0; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data[i]) = (dev || host) ? ptr : 0; break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = host ? const_cast<void*>(p) : nullptr; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = (dev || host) ? 0 : -2; break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned int*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<unsigned int*>(data[i]) = (dev || host) ? 1 : 0; break;
      default: break;
    }
  }
  return CUDA_SUCCESS;
}
CUresult d_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  std::uint64_t n = device_allocation_size(reinterpret_cast<void*>(p));
  if (!n) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = p;
  if (size) *size = n;
  return CUDA_SUCCESS;
}
}  // namespace
}  // namespace cachet::fakecuda

namespace cachet::fakecuda {
void* driver_entry(const char* symbol) {
  static const std::map<std::string, void*> table = {
      {"cuDevicePrimaryCtxGetState", reinterpret_cast<void*>(&d_primary_ctx_state)},
      {"cuCtxGetCurrent", reinterpret_cast<void*>(&d_ctx_get_current)},
      {"cuCtxSetCurrent", reinterpret_cast<void*>(&d_ctx_set_current)},
      {"cuDeviceGet", reinterpret_cast<void*>(&d_device_get)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&d_device_get_attribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&d_granularity)},
      {"cuMemCreate", reinterpret_cast<void*>(&d_mem_create)},
      {"cuMemRelease", reinterpret_cast<void*>(&d_mem_release)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&d_addr_reserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&d_addr_free)},
      {"cuMemMap", reinterpret_cast<void*>(&d_ok)},
      {"cuMemUnmap", reinterpret_cast<void*>(&d_ok)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&d_ok)},
      {"cuMemsetD32Async", reinterpret_cast<void*>(&d_ok)},
      {"cuStreamWriteValue32", reinterpret_cast<void*>(&d_ok)},
      {"cuGetErrorString", reinterpret_cast<void*>(&d_error_string)},
      {"cuMemGetAddressRange", reinterpret_cast<void*>(&d_get_address_range)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&d_not_supported)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&d_not_supported)},
      {"cuMulticastCreate", reinterpret_cast<void*>(&d_not_supported)},
      {"cuMulticastGetGranularity", reinterpret_cast<void*>(&d_not_supported)},
      {"cuMulticastAddDevice", reinterpret_cast<void*>(&d_not_supported)},
      {"cuMulticastBindMem", reinterpret_cast<void*>(&d_not_supported)},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&d_not_supported)},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&d_pointer_attributes)},
      {"cuMemAlloc", reinterpret_cast<void*>(&d_mem_alloc)},
      {"cuMemAllocAsync", reinterpret_cast<void*>(&d_mem_alloc_async)},
      {"cuMemFree", reinterpret_cast<void*>(&d_mem_free)},
      {"cuMemFreeAsync", reinterpret_cast<void*>(&d_mem_free_async)},
      {"cuMemGetInfo", reinterpret_cast<void*>(&d_mem_get_info)},
      {"cuMemHostAlloc", reinterpret_cast<void*>(&d_host_alloc)},
      {"cuMemAllocHost", reinterpret_cast<void*>(&d_host_alloc_default)},
      {"cuMemFreeHost", reinterpret_cast<void*>(&d_host_free)},
  };
  auto it = table.find(symbol);
  if (it != table.end()) return it->second;
  if (void* f = static_runtime_entry(symbol)) return f;
  ledger_once(std::string("drv:") + symbol, std::string("default\tdriver entry point ") + symbol + " answers CUDA_SUCCESS");
  return reinterpret_cast<void*>(&d_ok);
}
}  // namespace cachet::fakecuda

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int,
                                                        unsigned long long,
                                                        cudaDriverEntryPointQueryResult* status) {
  *fn = driver_entry(symbol);
  if (status) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
