// python/c10/ipc.cpp: CUDA tensors between processes (torch.multiprocessing) through the c10
// backend, the seam of PyTorch's shareIpcHandle and getIpcDevPtr (python/README.md, "The c10
// backend"): native's handle format on the sending side (a version byte, 'c', the
// cudaIpcMemHandle_t of the segment's base; offset = ptr - base), and on the receiving side each
// handle opened once per process and kept open while any storage uses it. Memory in expandable
// segments is refused both ways, as native refuses to send it.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "c10/backend.h"

namespace cachet::c10_backend {
namespace {

constexpr char kShareableHandleVersion = 2;  // native's SHAREABLE_HANDLE_VERSION (torch <= 2.12)
constexpr char kShareableCudaMalloc = 'c';   // native's SHAREABLE_CUDA_MALLOC
constexpr char kShareableExpandable = 'e';   // native's SHAREABLE_CUDA_EXPANDABLE_SEGMENT

}  // namespace

// torch.multiprocessing: native's handle format (version byte, 'c', the cudaIpcMemHandle_t of
// the segment's base), offset = ptr - base.
cc::ShareableHandle CachetCUDAAllocator::shareIpcHandle(void* ptr) {
  auto [a, device] = owner(ptr);
  (void)a;
  size_t base_size = 0;
  void* base = getBaseAllocation(ptr, &base_size);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaIpcMemHandle_t handle;
  C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
  std::string s;
  s.push_back(kShareableHandleVersion);
  s.push_back(kShareableCudaMalloc);
  s.append(reinterpret_cast<const char*>(&handle), CUDA_IPC_HANDLE_SIZE);
  return cc::ShareableHandle{static_cast<char*>(ptr) - static_cast<char*>(base), std::move(s)};
}

// The receiving side: opens a handle once per process and keeps it open while any storage
// uses it (native's ipcMemHandle_to_devptr).
std::shared_ptr<void> CachetCUDAAllocator::getIpcDevPtr(std::string handle) {
  std::lock_guard<std::mutex> lock(ipc_mu_);
  auto it = ipc_.find(handle);
  if (it != ipc_.end()) {
    if (auto sp = it->second.wp.lock()) return sp;
  }
  int type = kShareableCudaMalloc;
  size_t at = 0;
  if (handle.size() != CUDA_IPC_HANDLE_SIZE) {  // else: a raw handle from an old torch
    TORCH_CHECK(handle.size() >= 2, "cachet: ill-formed shareable handle (", handle.size(), " bytes)");
    TORCH_CHECK(handle[0] <= kShareableHandleVersion,
                "received sharable handle from a future version of torch that this version does not know how to handle");
    type = handle[1];
    at = 2;
  }
  TORCH_CHECK(type != kShareableExpandable,
              "cachet: this tensor was allocated in an expandable segment by the sending process; cachet cannot "
              "import expandable segments: send it from a process with expandable_segments:False");
  TORCH_CHECK(type == kShareableCudaMalloc && handle.size() >= at + CUDA_IPC_HANDLE_SIZE,
              "unexpected or illformed shareable handle type");
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data() + at, CUDA_IPC_HANDLE_SIZE);
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  void* p = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  std::shared_ptr<void> sp(p, [this, handle, device](void* q) {
    {
      std::lock_guard<std::mutex> l(ipc_mu_);
      auto e = ipc_.find(handle);
      if (e != ipc_.end() && e->second.wp.expired()) ipc_.erase(e);  // not a newer opening's
    }
    c10::cuda::CUDAGuard g(device);
    C10_CUDA_CHECK(cudaIpcCloseMemHandle(q));
  });
  ipc_[handle].wp = sp;
  return sp;
}

}  // namespace cachet::c10_backend
