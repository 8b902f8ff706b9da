// libcachet_torch.so: cachet as a PyTorch plug-in allocator
// (torch.cuda.memory.CUDAPluggableAllocator(path, "cachet_malloc", "cachet_free")).
//
// The per-device allocators, the configuration and the cachet_torch_* functions that
// python/cachet_torch/ calls are shared with the c10 backend (torch_common.h). A bad
// configuration is printed once on stderr and every allocation then returns NULL (cachet_torch.
// install() refuses it before that can happen).
//
// Running out of memory is never a NULL: cachet_malloc throws CudaOutOfMemory (a
// std::runtime_error whose what() is PyTorch's "CUDA out of memory. Tried to allocate ..."
// text). CUDAPluggableAllocator calls cachet_malloc through a std::function from C++ code, so
// the exception reaches PyTorch's Python boundary, which raises it as RuntimeError with that
// text. (Only the c10 backend can raise torch.OutOfMemoryError: that type lives in libc10, which
// this library, built for every torch version, does not link.) Any other failure of an
// allocation (a device that fails, no such device) is thrown the same way, as
// std::runtime_error("cachet: ..."); errors of cachet_free are printed and kept for
// cachet_torch_last_error (PyTorch calls it from destructors).
//
// PyTorch's private-pool callbacks (CUDA graph capture, use_mem_pool) are C++ functions of the
// types CUDAPluggableAllocator's set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
// set_release_pool take; see "Private pools" below and python/README.md for the ABI requirement.
#include <cuda_runtime_api.h>  // cudaStream_t, as in PyTorch's callback types
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"
#include "torch_common.h"

using cachet::torch_common::allocator_for;
using cachet::torch_common::guarded;
using cachet::torch_common::last_error_copy;
using cachet::torch_common::set_error;

// ---- PyTorch's CUDAPluggableAllocator entry points ----------------------------------------

// What cachet_malloc throws when the device is out of memory: PyTorch's message, as a
// std::runtime_error (PyTorch raises it as RuntimeError; see the file comment).
class CudaOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

CACHET_TORCH_API void* cachet_malloc(ssize_t size, int device, void* stream) {
  if (size <= 0) return nullptr;
  cachet::CachingAllocator* a = allocator_for(device);
  if (!a) {
    // A refused configuration: printed once, NULL (file comment). Any other reason (no such
    // device, no driver) is raised: PyTorch would build a tensor on a NULL pointer.
    cachet::torch_common::load_config();
    if (!cachet::torch_common::state().config_ok) return nullptr;
    throw std::runtime_error("cachet: " + last_error_copy());
  }
  // PyTorch passes its current stream: device calls during a capture follow its capture status
  // (cachet/gpu/cuda_backend.h, docs/pytorch-allocator.md §14.7).
  const auto s = reinterpret_cast<cachet::StreamId>(stream);
  cachet::gpu::CurrentStream current(s);
  void* p = nullptr;
  try {
    p = a->allocate(static_cast<cachet::Bytes>(size), s);
  } catch (const cachet::OutOfMemory& e) {
    set_error(e.what(), false);
    throw CudaOutOfMemory(e.what());  // never a silent NULL (file comment)
  } catch (const std::exception& e) {
    set_error(e.what(), false);
    throw std::runtime_error(std::string("cachet: ") + e.what());
  }
  return p;
}

CACHET_TORCH_API void cachet_free(void* ptr, ssize_t /*size*/, int device, void* /*stream*/) {
  if (!ptr) return;
  cachet::CachingAllocator* a = allocator_for(device);
  if (!a) return;
  guarded([&] { a->free(ptr); }, true);
}

// ---- Private pools: PyTorch's beginAllocateToPool, endAllocateToPool, releasePool -----------
//
// C++ linkage, of exactly the types CUDAPluggableAllocator's setters take (torch/csrc/cuda/
// CUDAPluggableAllocator.h): PyTorch casts the address it is given to
// void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) and calls it with a
// std::function built by libtorch, so this library must use the same libstdc++ and
// _GLIBCXX_USE_CXX11_ABI as the torch build. MempoolId_t is std::pair<unsigned long long,
// unsigned long long>. Begin and end report a refusal as std::runtime_error("cachet: ..."), which
// PyTorch raises as RuntimeError, as its own TORCH_CHECKs there do; release never throws (PyTorch
// calls it from ~CUDAGraph): it prints the message and keeps it for cachet_torch_last_error.

using MempoolId = std::pair<unsigned long long, unsigned long long>;  // c10::cuda::MempoolId_t

namespace {

cachet::PoolId pool_id(MempoolId id) { return cachet::PoolId{id.first, id.second}; }

std::string pool_text(MempoolId id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

[[noreturn]] void refuse(const std::string& what) {
  set_error(what, false);
  throw std::runtime_error("cachet: " + what);
}

cachet::CachingAllocator* pool_allocator(int device, const char* call, MempoolId id) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) refuse(std::string(call) + " of pool " + pool_text(id) + " on device " + std::to_string(device) + ": " +
                last_error_copy());
  return a;
}

}  // namespace

// Allocations whose stream `filter` takes go to pool `id` (created, or one user added) until
// cachet_end_allocate_to_pool. The plug-in cannot tell a capture from use_mem_pool: capture=false.
CACHET_TORCH_CXX_API void cachet_begin_allocate_to_pool(int device, MempoolId id,
                                                        std::function<bool(cudaStream_t)> filter) {
  cachet::CachingAllocator* a = pool_allocator(device, "beginAllocateToPool", id);
  try {
    a->begin_allocate_to_pool(
        pool_id(id),
        [f = std::move(filter)](cachet::StreamId s) {
          return f(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s)));
        },
        false);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
}

CACHET_TORCH_CXX_API void cachet_end_allocate_to_pool(int device, MempoolId id) {
  cachet::CachingAllocator* a = pool_allocator(device, "endAllocateToPool", id);
  try {
    a->end_allocate_to_pool(pool_id(id));
  } catch (const std::exception& e) {
    refuse(e.what());
  }
}

CACHET_TORCH_CXX_API void cachet_release_pool(int device, MempoolId id) {
  try {
    cachet::CachingAllocator* a = allocator_for(device);
    if (a) guarded([&] { a->release_pool(pool_id(id)); }, true);
  } catch (...) {  // allocator_for only reports; nothing may leave a destructor's call
  }
}

// The addresses python/cachet_torch/ hands to CUDAPluggableAllocator's setters, by setter name;
// NULL for another name.
CACHET_TORCH_API void* cachet_torch_pool_callback(const char* setter) {
  const std::string_view n = setter ? setter : "";
  if (n == "set_begin_allocate_to_pool") return reinterpret_cast<void*>(&cachet_begin_allocate_to_pool);
  if (n == "set_end_allocate_to_pool_fn") return reinterpret_cast<void*>(&cachet_end_allocate_to_pool);
  if (n == "set_release_pool") return reinterpret_cast<void*>(&cachet_release_pool);
  return nullptr;
}
