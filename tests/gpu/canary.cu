// Canary kernels for gpu_device_test: fill a block with a pattern derived from its
// allocation id, and count the words that no longer hold it.
#include <cuda_runtime.h>

#include <cstdint>

namespace {
__global__ void fill_kernel(std::uint32_t* p, std::size_t words, std::uint32_t pattern) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    p[i] = pattern ^ static_cast<std::uint32_t>(i * 2654435761u);
}
__global__ void check_kernel(const std::uint32_t* p, std::size_t words, std::uint32_t pattern,
                             unsigned long long* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    if (p[i] != (pattern ^ static_cast<std::uint32_t>(i * 2654435761u))) atomicAdd(bad, 1ULL);
}
}  // namespace

extern "C" int cachet_test_fill(void* p, std::size_t bytes, std::uint32_t pattern, cudaStream_t s) {
  const std::size_t words = bytes / 4;
  if (words == 0) return 0;
  fill_kernel<<<256, 256, 0, s>>>(static_cast<std::uint32_t*>(p), words, pattern);
  return static_cast<int>(cudaGetLastError());
}

// Returns the number of words that lost their pattern, or -1 on a CUDA error.
extern "C" long long cachet_test_check(const void* p, std::size_t bytes, std::uint32_t pattern, cudaStream_t s) {
  const std::size_t words = bytes / 4;
  if (words == 0) return 0;
  unsigned long long* bad = nullptr;
  if (cudaMalloc(&bad, sizeof *bad) != cudaSuccess) return -1;
  cudaMemsetAsync(bad, 0, sizeof *bad, s);
  check_kernel<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(p), words, pattern, bad);
  unsigned long long host = 0;
  cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s);
  const bool ok = cudaStreamSynchronize(s) == cudaSuccess;
  cudaFree(bad);
  return ok ? static_cast<long long>(host) : -1;
}
