// cachet/gpu/cuda_backend.h: the CUDA backends (only when built with CACHET_HAVE_CUDA).
//   CudaRuntimeBackend  cudaMalloc/cudaFree, cudaMemGetInfo, real events
//                       (cudaEventRecord/Query/Synchronize) for stream uses.
//   CudaVmmBackend      the same plus address reservation and mapping for expandable
//                       segments (cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess and
//                       their inverses). Driver entry points are fetched at run time with
//                       cudaGetDriverEntryPointByVersion: nothing links libcuda, so binaries
//                       start on machines without a driver.
// Every call selects the backend's device for its duration and restores the caller's.
#pragma once

#include <map>
#include <memory>

#include "cachet/gpu/backend.h"

namespace cachet::gpu {

// How many CUDA devices this process sees: 0 when there is no driver (cudaErrorInsufficientDriver,
// 35) or no device (cudaErrorNoDevice, 100). Any other error throws DeviceError. Always 0 when
// built without CUDA.
int cuda_device_count();

#ifdef CACHET_HAVE_CUDA

class CudaRuntimeBackend {
 public:
  static constexpr BackendCaps caps{.reserve_va = false, .real_events = true, .granularity = 0};
  explicit CudaRuntimeBackend(DeviceIndex device);

  DeviceIndex device() const { return device_; }
  Result<DevicePtr> malloc(Bytes n);
  Status free(DevicePtr p);
  Result<MemInfo> mem_get_info();
  bool stream_valid(StreamId s);
  Result<EventHandle> event_create();
  Status event_record(EventHandle e, StreamId s);
  Result<bool> event_query(EventHandle e);
  Status event_synchronize(EventHandle e);
  void event_destroy(EventHandle e);

 protected:
  DeviceIndex device_;
};
static_assert(Backend<CudaRuntimeBackend>);

class CudaVmmBackend : public CudaRuntimeBackend {
 public:
  static constexpr BackendCaps caps{.reserve_va = true, .real_events = true, .granularity = 2 * MiB};
  explicit CudaVmmBackend(DeviceIndex device);  // throws DeviceError without the driver API

  Result<DevicePtr> reserve(Bytes n);
  Status unreserve(DevicePtr p, Bytes n);
  Status map(DevicePtr p, Bytes n);    // n a multiple of the granularity; one handle per granule
  Status unmap(DevicePtr p, Bytes n);  // synchronizes the device first (work may still use it)

 private:
  struct Driver;
  std::shared_ptr<Driver> drv_;
  Bytes granularity_ = 2 * MiB;
  std::map<DevicePtr, unsigned long long> handles_;  // granule address -> CUmemGenericAllocationHandle
};
static_assert(Backend<CudaVmmBackend>);

#endif  // CACHET_HAVE_CUDA

// A DeviceMemory for CUDA device `device` (VMM when `expandable`). Throws DeviceError when
// CUDA is unavailable.
std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool expandable);

}  // namespace cachet::gpu
