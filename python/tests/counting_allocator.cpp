// libcachet_test_counting.so: a small CUDAPluggableAllocator for tests/test_c10.py's mempool
// scenario. torch.cuda.MemPool(CUDAPluggableAllocator(path, "counting_malloc",
// "counting_free").allocator()) takes its segments from here; the counters say how many segments
// were asked for, given back, and are still live, so the test can tell that a MemPool with its own
// allocator gets its memory from that allocator and returns all of it when the pool goes.
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <atomic>

namespace {
std::atomic<long long> g_mallocs{0}, g_frees{0}, g_live{0};
std::atomic<void*> g_last{nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) void* counting_malloc(ssize_t size, int device,
                                                                       cudaStream_t /*stream*/) {
  int prev = 0;
  cudaGetDevice(&prev);
  if (prev != device) cudaSetDevice(device);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, static_cast<size_t>(size));
  if (prev != device) cudaSetDevice(prev);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller sees NULL
    return nullptr;
  }
  ++g_mallocs;
  ++g_live;
  g_last = p;
  return p;
}

extern "C" __attribute__((visibility("default"))) void counting_free(void* ptr, ssize_t /*size*/,
                                                                    int /*device*/,
                                                                    cudaStream_t /*stream*/) {
  if (ptr == nullptr) return;
  cudaFree(ptr);
  ++g_frees;
  --g_live;
}

extern "C" __attribute__((visibility("default"))) void counting_calls(long long* mallocs,
                                                                     long long* frees,
                                                                     long long* live) {
  *mallocs = g_mallocs;
  *frees = g_frees;
  *live = g_live;
}

extern "C" __attribute__((visibility("default"))) void* counting_last(void) { return g_last; }
