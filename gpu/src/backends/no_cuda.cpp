// The CUDA backend entry points when cachet is built without CUDA (CACHET_CUDA=OFF or no CUDA
// Toolkit): gpu/CMakeLists.txt builds this file instead of cuda_runtime_backend.cpp and
// cuda_vmm_backend.cpp. No device is found, and asking for one says why.
#include <memory>
#include <string>

#include "cachet/errors.h"
#include "cachet/gpu/cuda_backend.h"

namespace cachet::gpu {
int cuda_device_count() { return 0; }
std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool) {
  throw DeviceError("CUDA device " + std::to_string(device) +
                    ": cachet was built without CUDA (CACHET_CUDA=OFF or no CUDA Toolkit); use the host backend");
}
}  // namespace cachet::gpu
