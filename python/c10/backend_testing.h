// python/c10/backend_testing.h: what python/tests/c10_backend_test.cpp reaches in the backend (install.cpp)
// when it is compiled with CACHET_C10_TESTING (never in libcachet_c10.so).
#pragma once

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDACachingAllocator.h>

namespace cachet::c10_testing {
c10::cuda::CUDACachingAllocator::CUDAAllocator& allocator();  // cachet's CUDAAllocator
// Its allocation path on `device` and `stream` without asking CUDA for the current device.
void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream);
c10::DeleterFnPtr deleter();  // the deleter of every DataPtr it hands out
// emptyCache(mempool_id) without asking CUDA for the current stream.
void empty_cache(c10::MempoolId_t mempool_id = {0, 0});
}  // namespace cachet::c10_testing
