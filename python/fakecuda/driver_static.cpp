// The driver as a statically linked CUDA runtime sees it (docs/predict.md section 3). cuDNN links
// its own copy of the runtime, which opens libcuda.so.1 (this library) and asks cuGetProcAddress
// for every driver function it uses: contexts, modules and kernels, occupancy, streams, events,
// device memory. They are answered here as the target would, with fresh handles (fakecuda.h F3),
// so that the real cuDNN runs its host side (descriptors, heuristics, engine plans, workspace
// sizes) on the fake device, and a launch does nothing.
//
// Kernel attributes are the part of this that is a stand-in: no kernel image is read, so every
// kernel reports up to 1,024 threads of 64 registers, no static shared memory, and dynamic shared
// memory up to the target's opt-in limit. The ledger names each attribute asked for.
#include "fakecuda.h"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

namespace cachet::fakecuda {
namespace {
CUcontext the_context() { return static_cast<CUcontext>(primary_context()); }
CUresult handle_out(void** out) {
  if (out) *out = new_handle();
  return CUDA_SUCCESS;
}
CUresult context_out(CUcontext* c) {
  if (c) *c = the_context();
  return CUDA_SUCCESS;
}
CUresult ctx_get_device(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
CUresult ctx_get_api_version(CUcontext, unsigned int* v) { *v = 13000; return CUDA_SUCCESS; }
CUresult ctx_get_flags(unsigned int* f) { *f = 0; return CUDA_SUCCESS; }
CUresult ctx_get_id(CUcontext, unsigned long long* id) { *id = 1; return CUDA_SUCCESS; }
CUresult ctx_get_limit(size_t* v, CUlimit limit) {
  switch (limit) {
    case CU_LIMIT_STACK_SIZE: *v = 1024; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *v = 1 << 20; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *v = 8 << 20; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}
CUresult ctx_get_cache_config(CUfunc_cache* c) { *c = CU_FUNC_CACHE_PREFER_NONE; return CUDA_SUCCESS; }
CUresult ctx_stream_priority_range(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}
CUresult device_get_name(char* name, int len, CUdevice) {
  std::strncpy(name, target().name.c_str(), static_cast<std::size_t>(len));
  if (len > 0) name[len - 1] = '\0';
  return CUDA_SUCCESS;
}
CUresult device_total_mem(size_t* bytes, CUdevice) { *bytes = target().total_memory; return CUDA_SUCCESS; }
CUresult device_get_uuid(CUuuid* u, CUdevice) {
  std::memset(u, 0, sizeof *u);
  std::memcpy(u->bytes, "cachet-fakecuda", 15);
  return CUDA_SUCCESS;
}
CUresult device_compute_capability(int* major, int* minor, CUdevice) {
  *major = target().major;
  *minor = target().minor;
  return CUDA_SUCCESS;
}
CUresult device_p2p_attribute(int* v, CUdevice_P2PAttribute, CUdevice, CUdevice) { *v = 0; return CUDA_SUCCESS; }
CUresult device_can_access_peer(int* v, CUdevice, CUdevice) { *v = 0; return CUDA_SUCCESS; }
CUresult device_pci_bus_id(char* bus, int len, CUdevice) {
  std::strncpy(bus, "0000:00:00.0", static_cast<std::size_t>(len));
  if (len > 0) bus[len - 1] = '\0';
  return CUDA_SUCCESS;
}
CUresult loading_mode(CUmoduleLoadingMode* m) { *m = CU_MODULE_LAZY_LOADING; return CUDA_SUCCESS; }
// A module's or library's global: one shared 1 MiB range of device VA (no kernel reads it).
CUresult module_get_global(CUdeviceptr* dptr, size_t* bytes, void*, const char*) {
  static const std::uintptr_t globals = reserve_va(1 << 20, 0);
  if (dptr) *dptr = globals;
  if (bytes) *bytes = 1 << 20;
  return CUDA_SUCCESS;
}
int function_attribute(CUfunction_attribute a) {
  const Target& t = target();
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return 64;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: case CU_FUNC_ATTRIBUTE_BINARY_VERSION: return t.major * 10 + t.minor;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: return t.shared_per_block_optin;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: return -1;
    default: return 0;
  }
}
CUresult func_get_attribute(int* v, CUfunction_attribute a, CUfunction) {
  ledger_once("func_attr:" + std::to_string(static_cast<int>(a)),
              "default\tkernel attribute " + std::to_string(static_cast<int>(a)) + " answered " +
                  std::to_string(function_attribute(a)) + " for every kernel");
  *v = function_attribute(a);
  return CUDA_SUCCESS;
}
CUresult kernel_get_attribute(int* v, CUfunction_attribute a, CUkernel, CUdevice) {
  return func_get_attribute(v, a, nullptr);
}
CUresult func_get_name(const char** name, CUfunction) { *name = "cachet_fakecuda_kernel"; return CUDA_SUCCESS; }
// Occupancy of a kernel of 64 registers per thread and no static shared memory.
int blocks_per_sm(int block_size, size_t dynamic_smem) {
  const Target& t = target();
  if (block_size <= 0) return 0;
  int by_threads = t.max_threads_per_sm / block_size;
  int by_regs = 65536 / (block_size * 64);
  int by_smem = dynamic_smem ? static_cast<int>(t.shared_per_sm / dynamic_smem) : t.max_blocks_per_sm;
  int n = std::min({by_threads, by_regs, by_smem, t.max_blocks_per_sm});
  return n < 0 ? 0 : n;
}
CUresult occupancy_blocks(int* n, CUfunction, int block_size, size_t dynamic_smem) {
  *n = blocks_per_sm(block_size, dynamic_smem);
  return CUDA_SUCCESS;
}
CUresult occupancy_potential(int* min_grid, int* block, CUfunction, void*, size_t dynamic_smem, int limit) {
  int b = limit > 0 ? std::min(limit, 1024) : 1024;
  while (b > 32 && blocks_per_sm(b, dynamic_smem) == 0) b /= 2;
  if (block) *block = b;
  if (min_grid) *min_grid = blocks_per_sm(b, dynamic_smem) * target().sm_count;
  return CUDA_SUCCESS;
}
CUresult occupancy_dynamic_smem(size_t* bytes, CUfunction, int, int) {
  *bytes = static_cast<size_t>(target().shared_per_block_optin);
  return CUDA_SUCCESS;
}
// Thread-block clusters (sm_90): a kernel may use the portable maximum, 8 blocks a cluster; as
// many clusters run at once as target.cpp's active_clusters() gives for the SMs a cluster spans
// at the kernel's blocks per SM.
struct ClusterShape { int blocks = 1, threads = 1; unsigned smem = 0; };
ClusterShape cluster_shape(const CUlaunchConfig* config) {
  ClusterShape s;
  if (!config) return s;
  s.threads = static_cast<int>(config->blockDimX * config->blockDimY * config->blockDimZ);
  s.smem = config->sharedMemBytes;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& d = config->attrs[i].value.clusterDim;
      s.blocks = static_cast<int>(d.x * d.y * d.z);
    }
  if (s.blocks <= 0) s.blocks = 1;
  return s;
}
CUresult occupancy_cluster_size(int* size, CUfunction, const CUlaunchConfig*) {
  *size = target().major >= 9 ? 8 : 1;
  return CUDA_SUCCESS;
}
CUresult occupancy_active_clusters(int* n, CUfunction, const CUlaunchConfig* config) {
  const ClusterShape s = cluster_shape(config);
  const int per_sm = std::max(1, blocks_per_sm(std::max(1, s.threads), s.smem));
  *n = active_clusters((s.blocks + per_sm - 1) / per_sm);
  return CUDA_SUCCESS;
}
CUresult stream_is_capturing(CUstream, CUstreamCaptureStatus* s) { *s = CU_STREAM_CAPTURE_STATUS_NONE; return CUDA_SUCCESS; }
// Every version of cuStreamGetCaptureInfo begins (stream, status*, id*): not capturing.
CUresult stream_capture_info(CUstream, CUstreamCaptureStatus* s, cuuint64_t* id) {
  if (s) *s = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = 0;
  return CUDA_SUCCESS;
}
CUresult stream_get_priority(CUstream, int* p) { *p = 0; return CUDA_SUCCESS; }
CUresult stream_get_flags(CUstream, unsigned int* f) { *f = 0; return CUDA_SUCCESS; }
CUresult stream_get_ctx(CUstream, CUcontext* c) { return context_out(c); }
CUresult stream_get_id(CUstream, unsigned long long* id) { *id = 1; return CUDA_SUCCESS; }
CUresult event_elapsed(float* ms, CUevent, CUevent) { *ms = 1.0f; return CUDA_SUCCESS; }
CUresult exchange_capture_mode(CUstreamCaptureMode*) { return CUDA_SUCCESS; }
CUresult error_name(CUresult, const char** s) { *s = "CUDA_ERROR_FAKE_DEVICE"; return CUDA_SUCCESS; }
CUresult not_supported() { return CUDA_ERROR_NOT_SUPPORTED; }

template <class F>
void* fn(F f) { return reinterpret_cast<void*>(f); }
}  // namespace

void* static_runtime_entry(const char* symbol) {
  static const std::map<std::string, void*> table = {
      {"cuGetExportTable", export_table_entry()},
      {"cuGetErrorName", fn(&error_name)},
      {"cuDeviceGetName", fn(&device_get_name)},
      {"cuDeviceTotalMem", fn(&device_total_mem)},
      {"cuDeviceGetUuid", fn(&device_get_uuid)},
      {"cuDeviceGetLuid", fn(&not_supported)},
      {"cuDeviceComputeCapability", fn(&device_compute_capability)},
      {"cuDeviceGetP2PAttribute", fn(&device_p2p_attribute)},
      {"cuDeviceCanAccessPeer", fn(&device_can_access_peer)},
      {"cuDeviceGetPCIBusId", fn(&device_pci_bus_id)},
      {"cuDeviceGetDefaultMemPool", fn(&handle_out)},
      {"cuDeviceGetMemPool", fn(&handle_out)},
      {"cuDevicePrimaryCtxRetain", fn(&context_out)},
      {"cuCtxCreate", fn(&context_out)},
      {"cuCtxPopCurrent", fn(&context_out)},
      {"cuCtxGetDevice", fn(&ctx_get_device)},
      {"cuCtxGetApiVersion", fn(&ctx_get_api_version)},
      {"cuCtxGetFlags", fn(&ctx_get_flags)},
      {"cuCtxGetId", fn(&ctx_get_id)},
      {"cuCtxGetLimit", fn(&ctx_get_limit)},
      {"cuCtxGetCacheConfig", fn(&ctx_get_cache_config)},
      {"cuCtxGetStreamPriorityRange", fn(&ctx_stream_priority_range)},
      {"cuCtxGetExecAffinity", fn(&not_supported)},
      {"cuModuleGetLoadingMode", fn(&loading_mode)},
      {"cuModuleLoad", fn(&handle_out)},
      {"cuModuleLoadData", fn(&handle_out)},
      {"cuModuleLoadDataEx", fn(&handle_out)},
      {"cuModuleLoadFatBinary", fn(&handle_out)},
      {"cuModuleGetFunction", fn(&handle_out)},
      {"cuModuleGetGlobal", fn(&module_get_global)},
      {"cuLibraryLoadData", fn(&handle_out)},
      {"cuLibraryLoadFromFile", fn(&handle_out)},
      {"cuLibraryGetKernel", fn(&handle_out)},
      {"cuLibraryGetModule", fn(&handle_out)},
      {"cuLibraryGetGlobal", fn(&module_get_global)},
      {"cuKernelGetFunction", fn(&handle_out)},
      {"cuKernelGetAttribute", fn(&kernel_get_attribute)},
      {"cuFuncGetAttribute", fn(&func_get_attribute)},
      {"cuFuncGetName", fn(&func_get_name)},
      {"cuFuncGetModule", fn(&handle_out)},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessor", fn(&occupancy_blocks)},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", fn(&occupancy_blocks)},
      {"cuOccupancyMaxPotentialBlockSize", fn(&occupancy_potential)},
      {"cuOccupancyMaxPotentialBlockSizeWithFlags", fn(&occupancy_potential)},
      {"cuOccupancyAvailableDynamicSMemPerBlock", fn(&occupancy_dynamic_smem)},
      {"cuOccupancyMaxPotentialClusterSize", fn(&occupancy_cluster_size)},
      {"cuOccupancyMaxActiveClusters", fn(&occupancy_active_clusters)},
      {"cuStreamCreate", fn(&handle_out)},
      {"cuStreamCreateWithPriority", fn(&handle_out)},
      {"cuStreamIsCapturing", fn(&stream_is_capturing)},
      {"cuStreamGetCaptureInfo", fn(&stream_capture_info)},
      {"cuStreamGetPriority", fn(&stream_get_priority)},
      {"cuStreamGetFlags", fn(&stream_get_flags)},
      {"cuStreamGetCtx", fn(&stream_get_ctx)},
      {"cuStreamGetId", fn(&stream_get_id)},
      {"cuEventCreate", fn(&handle_out)},
      {"cuEventElapsedTime", fn(&event_elapsed)},
      {"cuThreadExchangeStreamCaptureMode", fn(&exchange_capture_mode)},
  };
  auto it = table.find(symbol);
  return it == table.end() ? nullptr : it->second;
}
}  // namespace cachet::fakecuda
