// The fake device as libcuda.so.1 (the library's soname): PyTorch and the CUDA libraries open the
// driver with dlopen("libcuda.so.1") and look functions up by name, or ask cuGetProcAddress. Each
// name exported here forwards to driver_entry's function of that name (memory.cpp), so there is one
// implementation per driver call. This file includes no CUDA header: the names must be the plain
// ones, not the _v2 spellings cuda.h maps them to.
#include "fakecuda.h"

#include <cstdint>
#include <map>
#include <string>

using cachet::fakecuda::driver_entry;

namespace {
template <class F>
F entry(const char* name) { return reinterpret_cast<F>(driver_entry(name)); }
}  // namespace

extern "C" {
int cuInit(unsigned int) { return 0; }
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuGetProcAddress(const char* symbol, void** fn, int, std::uint64_t, int* status);
// The functions this file defines, as a statically linked runtime asks for them by name.
void* own_entry(const char* symbol) {
  static const std::map<std::string, void*> own = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
  };
  auto it = own.find(symbol);
  return it == own.end() ? nullptr : it->second;
}
int cuGetProcAddress(const char* symbol, void** fn, int, std::uint64_t, int* status) {
  *fn = own_entry(symbol);
  if (!*fn) *fn = driver_entry(symbol);
  if (status) *status = 0;
  return 0;
}
int cuGetProcAddress_v2(const char* symbol, void** fn, int, std::uint64_t, int* status) {
  return cuGetProcAddress(symbol, fn, 0, 0, status);
}
int cuDeviceGet(int* d, int ordinal) { return entry<int (*)(int*, int)>("cuDeviceGet")(d, ordinal); }
int cuDeviceGetAttribute(int* v, int attr, int dev) {
  return entry<int (*)(int*, int, int)>("cuDeviceGetAttribute")(v, attr, dev);
}
int cuDevicePrimaryCtxGetState(int dev, unsigned int* flags, int* active) {
  return entry<int (*)(int, unsigned int*, int*)>("cuDevicePrimaryCtxGetState")(dev, flags, active);
}
int cuCtxGetCurrent(void** c) { return entry<int (*)(void**)>("cuCtxGetCurrent")(c); }
int cuCtxSetCurrent(void* c) { return entry<int (*)(void*)>("cuCtxSetCurrent")(c); }
int cuGetErrorString(int e, const char** s) { return entry<int (*)(int, const char**)>("cuGetErrorString")(e, s); }
int cuGetErrorName(int e, const char** s) { return entry<int (*)(int, const char**)>("cuGetErrorString")(e, s); }
int cuMemGetAllocationGranularity(std::size_t* g, const void* prop, int flags) {
  return entry<int (*)(std::size_t*, const void*, int)>("cuMemGetAllocationGranularity")(g, prop, flags);
}
int cuMemCreate(unsigned long long* h, std::size_t size, const void* prop, unsigned long long flags) {
  return entry<int (*)(unsigned long long*, std::size_t, const void*, unsigned long long)>("cuMemCreate")(h, size, prop, flags);
}
int cuMemRelease(unsigned long long h) { return entry<int (*)(unsigned long long)>("cuMemRelease")(h); }
int cuMemAddressReserve(std::uintptr_t* p, std::size_t size, std::size_t align, std::uintptr_t addr, unsigned long long flags) {
  return entry<int (*)(std::uintptr_t*, std::size_t, std::size_t, std::uintptr_t, unsigned long long)>("cuMemAddressReserve")(
      p, size, align, addr, flags);
}
int cuMemAddressFree(std::uintptr_t p, std::size_t size) {
  return entry<int (*)(std::uintptr_t, std::size_t)>("cuMemAddressFree")(p, size);
}
// Driver functions other libraries (cuDNN's runtime-compiled engines, cuBLASLt) look up by name
// with dlsym: each forwards its arguments, whatever they are, to driver_entry's function of the
// name without its _v2 suffix (they are integers and pointers, passed in registers and on the
// stack as the caller put them).
#define CACHET_FORWARD(name, entry_name)                                                          \
  int name(std::uintptr_t a, std::uintptr_t b, std::uintptr_t c, std::uintptr_t d, std::uintptr_t e, \
           std::uintptr_t f, std::uintptr_t g, std::uintptr_t h, std::uintptr_t i, std::uintptr_t j, \
           std::uintptr_t k, std::uintptr_t l) {                                                  \
    return entry<int (*)(std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, \
                         std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, \
                         std::uintptr_t, std::uintptr_t)>(entry_name)(a, b, c, d, e, f, g, h, i, j, k, l); \
  }
CACHET_FORWARD(cuModuleLoadData, "cuModuleLoadData")
CACHET_FORWARD(cuModuleLoadDataEx, "cuModuleLoadDataEx")
CACHET_FORWARD(cuModuleLoadFatBinary, "cuModuleLoadFatBinary")
CACHET_FORWARD(cuModuleUnload, "cuModuleUnload")
CACHET_FORWARD(cuModuleGetFunction, "cuModuleGetFunction")
CACHET_FORWARD(cuModuleGetGlobal_v2, "cuModuleGetGlobal")
CACHET_FORWARD(cuLibraryLoadData, "cuLibraryLoadData")
CACHET_FORWARD(cuLibraryUnload, "cuLibraryUnload")
CACHET_FORWARD(cuLibraryGetKernel, "cuLibraryGetKernel")
CACHET_FORWARD(cuKernelGetFunction, "cuKernelGetFunction")
CACHET_FORWARD(cuLaunchKernel, "cuLaunchKernel")
CACHET_FORWARD(cuLaunchKernelEx, "cuLaunchKernelEx")
CACHET_FORWARD(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel")
CACHET_FORWARD(cuFuncGetAttribute, "cuFuncGetAttribute")
CACHET_FORWARD(cuFuncSetAttribute, "cuFuncSetAttribute")
CACHET_FORWARD(cuFuncSetCacheConfig, "cuFuncSetCacheConfig")
CACHET_FORWARD(cuLinkCreate_v2, "cuLinkCreate")
CACHET_FORWARD(cuLinkAddData_v2, "cuLinkAddData")
CACHET_FORWARD(cuLinkComplete, "cuLinkComplete")
CACHET_FORWARD(cuLinkDestroy, "cuLinkDestroy")
CACHET_FORWARD(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
CACHET_FORWARD(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags")
CACHET_FORWARD(cuCtxGetDevice, "cuCtxGetDevice")
CACHET_FORWARD(cuCtxSynchronize, "cuCtxSynchronize")
CACHET_FORWARD(cuCtxPushCurrent_v2, "cuCtxPushCurrent")
CACHET_FORWARD(cuCtxPopCurrent_v2, "cuCtxPopCurrent")
CACHET_FORWARD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
CACHET_FORWARD(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease")
CACHET_FORWARD(cuDeviceGetName, "cuDeviceGetName")
CACHET_FORWARD(cuDeviceTotalMem_v2, "cuDeviceTotalMem")
CACHET_FORWARD(cuDeviceComputeCapability, "cuDeviceComputeCapability")
CACHET_FORWARD(cuDeviceGetUuid, "cuDeviceGetUuid")
CACHET_FORWARD(cuMemAlloc_v2, "cuMemAlloc")
CACHET_FORWARD(cuMemFree_v2, "cuMemFree")
CACHET_FORWARD(cuMemGetInfo_v2, "cuMemGetInfo")
CACHET_FORWARD(cuMemcpyHtoD_v2, "cuMemcpyHtoD")
CACHET_FORWARD(cuMemcpyDtoH_v2, "cuMemcpyDtoH")
CACHET_FORWARD(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync")
CACHET_FORWARD(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync")
CACHET_FORWARD(cuMemsetD8_v2, "cuMemsetD8")
CACHET_FORWARD(cuMemsetD8Async, "cuMemsetD8Async")
CACHET_FORWARD(cuMemsetD32_v2, "cuMemsetD32")
CACHET_FORWARD(cuPointerGetAttributes, "cuPointerGetAttributes")
CACHET_FORWARD(cuStreamCreate, "cuStreamCreate")
CACHET_FORWARD(cuStreamDestroy_v2, "cuStreamDestroy")
CACHET_FORWARD(cuStreamSynchronize, "cuStreamSynchronize")
CACHET_FORWARD(cuStreamWaitEvent, "cuStreamWaitEvent")
CACHET_FORWARD(cuEventCreate, "cuEventCreate")
CACHET_FORWARD(cuEventDestroy_v2, "cuEventDestroy")
CACHET_FORWARD(cuEventRecord, "cuEventRecord")
CACHET_FORWARD(cuEventSynchronize, "cuEventSynchronize")
CACHET_FORWARD(cuOccupancyAvailableDynamicSMemPerBlock, "cuOccupancyAvailableDynamicSMemPerBlock")
CACHET_FORWARD(cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters")
CACHET_FORWARD(cuOccupancyMaxPotentialClusterSize, "cuOccupancyMaxPotentialClusterSize")
CACHET_FORWARD(cuCtxGetLimit, "cuCtxGetLimit")
CACHET_FORWARD(cuCtxPopCurrent, "cuCtxPopCurrent")
CACHET_FORWARD(cuCtxPushCurrent, "cuCtxPushCurrent")
CACHET_FORWARD(cuStreamGetCtx, "cuStreamGetCtx")
CACHET_FORWARD(cuLinkCreate, "cuLinkCreate")
CACHET_FORWARD(cuLinkAddData, "cuLinkAddData")
CACHET_FORWARD(cuLibraryLoadFromFile, "cuLibraryLoadFromFile")
CACHET_FORWARD(cuKernelSetAttribute, "cuKernelSetAttribute")
CACHET_FORWARD(cuKernelGetAttribute, "cuKernelGetAttribute")
CACHET_FORWARD(cuGetExportTable, "cuGetExportTable")
// cuBLASLt's driver loader (cuDNN's GEMM-based convolution engines create a cuBLASLt handle)
// fails unless every one of these resolves.
CACHET_FORWARD(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess")
CACHET_FORWARD(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")
CACHET_FORWARD(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")
CACHET_FORWARD(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease")
CACHET_FORWARD(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset")
CACHET_FORWARD(cuEventElapsedTime, "cuEventElapsedTime")
CACHET_FORWARD(cuEventQuery, "cuEventQuery")
CACHET_FORWARD(cuGraphDestroy, "cuGraphDestroy")
CACHET_FORWARD(cuGraphExecDestroy, "cuGraphExecDestroy")
CACHET_FORWARD(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams")
CACHET_FORWARD(cuGraphGetNodes, "cuGraphGetNodes")
CACHET_FORWARD(cuGraphInstantiate, "cuGraphInstantiate")
CACHET_FORWARD(cuGraphKernelNodeGetParams, "cuGraphKernelNodeGetParams")
CACHET_FORWARD(cuGraphLaunch, "cuGraphLaunch")
CACHET_FORWARD(cuGraphNodeGetType, "cuGraphNodeGetType")
CACHET_FORWARD(cuKernelGetLibrary, "cuKernelGetLibrary")
CACHET_FORWARD(cuLinkAddFile_v2, "cuLinkAddFile")
CACHET_FORWARD(cuMemPrefetchAsync, "cuMemPrefetchAsync")
CACHET_FORWARD(cuMemcpy, "cuMemcpy")
CACHET_FORWARD(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync")
CACHET_FORWARD(cuMemcpyAsync, "cuMemcpyAsync")
CACHET_FORWARD(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync")
CACHET_FORWARD(cuPointerGetAttribute, "cuPointerGetAttribute")
CACHET_FORWARD(cuStreamBatchMemOp, "cuStreamBatchMemOp")
CACHET_FORWARD(cuStreamBeginCapture_v2, "cuStreamBeginCapture")
CACHET_FORWARD(cuStreamEndCapture, "cuStreamEndCapture")
CACHET_FORWARD(cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo")
CACHET_FORWARD(cuStreamIsCapturing, "cuStreamIsCapturing")
CACHET_FORWARD(cuStreamWaitValue32, "cuStreamWaitValue32")
CACHET_FORWARD(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")
CACHET_FORWARD(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode")
#undef CACHET_FORWARD
int cuMemMap(std::uintptr_t, std::size_t, std::size_t, unsigned long long, unsigned long long) { return 0; }
int cuMemUnmap(std::uintptr_t, std::size_t) { return 0; }
int cuMemSetAccess(std::uintptr_t, std::size_t, const void*, std::size_t) { return 0; }
}  // extern "C"
