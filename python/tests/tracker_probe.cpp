// libcachet_test_tracker.so: a trace tracker for python/tests/test_nccl_register.py, attached with
// c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker beside ProcessGroupNCCL's register
// hook (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1), so that it sees what the hook sees, as
// the hook sees it: the entry's action, address, size and pool id (TraceEntry::mempool_, which the
// hook matches against the pools registered with a communicator) and whether the device still has
// memory at the address when the tracker is called (cudaPointerGetAttributes: a device pointer, or
// not any more). Under native and under cachet's c10 backend alike, whichever allocator PyTorch
// has; the test compares the two runs entry by entry.
//
//   int   cachet_test_tracker_attach(void)    attaches it (once); 0, or -1 with the reason on stderr
//   char* cachet_test_tracker_take(void)      the entries since the last take, as a JSON list
//                                             [[action, addr, size, pool0, pool1, memory_there], ...]
//                                             (malloc'd: free it with cachet_test_tracker_free)
//   void  cachet_test_tracker_free(char*)
//   int   cachet_test_tracker_expandable(void)  PyTorch's own expandable_segments setting, as the hook
//                                               reads it to turn itself off (see below)
//
// Like NCCL's hooks, the tracker calls no allocator: it runs under the allocator's lock.
#include <cuda_runtime_api.h>

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace {

namespace cc = c10::cuda::CUDACachingAllocator;

struct Entry {
  int action;
  unsigned long long addr, size, pool0, pool1;
  bool memory_there;
};

std::mutex g_mu;
std::vector<Entry> g_entries;

bool memory_there(unsigned long long addr) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, reinterpret_cast<void*>(addr));
  (void)cudaGetLastError();
  return e == cudaSuccess && a.type == cudaMemoryTypeDevice;
}

void track(const cc::TraceEntry& te) {
  Entry e{static_cast<int>(te.action_), te.addr_, te.size_, te.mempool_.first, te.mempool_.second, false};
  if (te.action_ != cc::TraceEntry::SNAPSHOT && te.action_ != cc::TraceEntry::OOM) e.memory_there = memory_there(te.addr_);
  std::lock_guard<std::mutex> lock(g_mu);
  g_entries.push_back(e);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int cachet_test_tracker_attach(void) {
  static int rc = [] {
    try {
      cc::attachAllocatorTraceTracker(&track);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cachet_test_tracker_attach: %s\n", e.what());
      return -1;
    }
  }();
  return rc;
}

extern "C" __attribute__((visibility("default"))) char* cachet_test_tracker_take(void) {
  std::vector<Entry> got;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    got.swap(g_entries);
  }
  std::string out = "[";
  char buf[160];
  for (size_t i = 0; i < got.size(); ++i) {
    const Entry& e = got[i];
    std::snprintf(buf, sizeof buf, "%s[%d,%llu,%llu,%llu,%llu,%d]", i ? "," : "", e.action, e.addr, e.size, e.pool0,
                  e.pool1, e.memory_there ? 1 : 0);
    out += buf;
  }
  out += "]";
  char* p = static_cast<char*>(std::malloc(out.size() + 1));
  if (p != nullptr) std::memcpy(p, out.c_str(), out.size() + 1);
  return p;
}

extern "C" __attribute__((visibility("default"))) void cachet_test_tracker_free(char* p) { std::free(p); }

// ProcessGroupNCCL (shouldAllCommunicatorsRegisterAllTensors, once, at the first group) calls the
// inline CUDAAllocatorConfig::expandable_segments(), which in 2.11 returns
// AcceleratorAllocatorConfig::use_expandable_segments() only where PYTORCH_C10_DRIVER_API_SUPPORTED
// was defined when it was compiled (libtorch_cuda on Linux: yes) and false otherwise. No installed
// header defines it, so compiled here that inline function says false whatever the configuration
// (the first GPU run's "expandable_segments=False" under native too). This reads what it returns in
// libtorch_cuda: libc10's AcceleratorAllocatorConfig singleton (out of line, one per process), which
// parses the environment at its first use (the first of PYTORCH_CUDA_ALLOC_CONF,
// PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF that is set: the child's environment), and later
// setAllocatorSettings strings (torch.cuda.memory._set_allocator_settings). cachet's own
// configuration (CACHET_ALLOC_CONF first) is not in it.
extern "C" __attribute__((visibility("default"))) int cachet_test_tracker_expandable(void) {
  return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments() ? 1 : 0;
}
