// bench/cuda_peers.cpp: the CUDA peers (built only with CACHET_HAVE_CUDA): cachet on the CUDA
// runtime backend, and cudaMallocAsync/cudaFreeAsync on the default pool with an unlimited
// release threshold. Both allocate on the legacy default stream (0), as PyTorch's raw_alloc
// does when no stream is set.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"
#include "peers.h"

namespace cachet::bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

void require_device() {
  if (gpu::cuda_device_count() == 0) throw std::runtime_error("no CUDA device");
}

class CachetCudaPeer final : public Peer {
 public:
  CachetCudaPeer() : a_((require_device(), CachingAllocator::for_cuda_device(0, Config{}))) {}
  void* alloc(std::size_t n) override { return a_->allocate(n, 0); }
  void free(void* p) override { a_->free(p); }
  void trim() override { a_->empty_cache(); }

 private:
  std::unique_ptr<CachingAllocator> a_;
};

class CudaMallocAsyncPeer final : public Peer {
 public:
  CudaMallocAsyncPeer() {
    require_device();
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
    std::uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  void* alloc(std::size_t n) override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, n, cudaStream_t{}), "cudaMallocAsync");
    return p;
  }
  void free(void* p) override { check(cudaFreeAsync(p, cudaStream_t{}), "cudaFreeAsync"); }
  void trim() override {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
  }

 private:
  cudaMemPool_t pool_{};
};

}  // namespace

Peer* cachet_cuda_peer(std::string* why) {
  static const Made made = make_peer([] { return new CachetCudaPeer(); });
  return made.get(why);
}

Peer* cuda_malloc_async_peer(std::string* why) {
  static const Made made = make_peer([] { return new CudaMallocAsyncPeer(); });
  return made.get(why);
}

std::string cuda_device_name() {
  try {
    if (gpu::cuda_device_count() == 0) return "";
  } catch (const std::exception&) {
    return "";
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace cachet::bench
