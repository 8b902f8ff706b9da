// The fake device as libcuda.so.1 (the library's soname): PyTorch and the CUDA libraries open the
// driver with dlopen("libcuda.so.1") and look functions up by name, or ask cuGetProcAddress. Each
// name exported here forwards to driver_entry's function of that name (memory.cpp), so there is one
// implementation per driver call. This file includes no CUDA header: the names must be the plain
// ones, not the _v2 spellings cuda.h maps them to.
#include "fakecuda.h"

#include <cstdint>

using cachet::fakecuda::driver_entry;

namespace {
template <class F>
F entry(const char* name) { return reinterpret_cast<F>(driver_entry(name)); }
}  // namespace

extern "C" {
int cuInit(unsigned int) { return 0; }
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuGetProcAddress(const char* symbol, void** fn, int, std::uint64_t, int* status) {
  *fn = driver_entry(symbol);
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
int cuMemMap(std::uintptr_t, std::size_t, std::size_t, unsigned long long, unsigned long long) { return 0; }
int cuMemUnmap(std::uintptr_t, std::size_t) { return 0; }
int cuMemSetAccess(std::uintptr_t, std::size_t, const void*, std::size_t) { return 0; }
}  // extern "C"
