// python/c10/install.cpp: the C entry points of libcachet_c10.so that python/cachet_torch/ calls
// (python/README.md, "The c10 backend"): the torch version it was built for, installing cachet as
// PyTorch's CUDA allocator through native's door (c10::cuda::CUDACachingAllocator::allocator and
// c10::SetAllocator(kCUDA), before CUDA is used), and the benchmarks' switch between the two.
//
// The torch version is a build-time fact (TORCH_VERSION_MAJOR/MINOR of the torch headers this
// was compiled against): cachet_c10_install refuses another minor version.
#include <atomic>
#include <exception>
#include <string>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/headeronly/version.h>

#include "c10/backend.h"
#include "cachet/gpu/cuda_backend.h"

#if !defined(TORCH_VERSION_MAJOR) || !defined(TORCH_VERSION_MINOR)
#error "torch/headeronly/version.h did not define TORCH_VERSION_MAJOR/MINOR"
#endif
#define CACHET_C10_STR2(x) #x
#define CACHET_C10_STR(x) CACHET_C10_STR2(x)
#define CACHET_C10_TORCH_VERSION CACHET_C10_STR(TORCH_VERSION_MAJOR) "." CACHET_C10_STR(TORCH_VERSION_MINOR)

using namespace cachet::c10_backend;

namespace {

// "2.11.0+cu130" -> "2.11"
std::string major_minor(const char* v) {
  std::string s = v ? v : "";
  const size_t dot = s.find('.');
  if (dot == std::string::npos) return s;
  size_t end = dot + 1;
  while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
  return s.substr(0, end);
}

// The allocator install() took PyTorch's atomic from (native's, uninitialised), for
// cachet_c10_bench_select; native_ready: it has been initialised.
std::atomic<cc::CUDAAllocator*> replaced_allocator{nullptr};
std::atomic<bool> native_ready{false};

}  // namespace

// The torch major.minor this library was built against, e.g. "2.11".
CACHET_TORCH_API const char* cachet_c10_torch_version(void) { return CACHET_C10_TORCH_VERSION; }

// 1 when cachet is PyTorch's CUDA allocator.
CACHET_TORCH_API int cachet_c10_installed(void) {
  return c10::cuda::CUDACachingAllocator::allocator.load() == &the_allocator() ? 1 : 0;
}

// Makes cachet PyTorch's CUDA allocator. `running_torch_version`: torch.__version__. 0 on success
// (and when already installed); otherwise 1 with the reason in cachet_torch_last_error: another
// torch minor version than the one built against, a refused configuration (the parser's
// message), or a CUDA allocator already initialised (CUDA was used before install).
CACHET_TORCH_API int cachet_c10_install(const char* running_torch_version) {
  try {
    const std::string running = major_minor(running_torch_version);
    if (running != CACHET_C10_TORCH_VERSION) {
      tc::set_error(std::string("libcachet_c10.so was built for PyTorch ") + CACHET_C10_TORCH_VERSION +
                        " but PyTorch " + (running_torch_version ? running_torch_version : "(unknown)") +
                        " is running: rebuild cachet against this torch (CACHET_TORCH_DIR), or use the "
                        "plug-in path (libcachet_torch.so)",
                    false);
      return 1;
    }
    tc::load_config();
    if (!tc::state().config_ok) {
      tc::state().config_reported.store(true);
      tc::set_error(tc::state().config_error, false);
      return 1;
    }
    CachetCUDAAllocator* ours = &the_allocator();
    cc::CUDAAllocator* current = c10::cuda::CUDACachingAllocator::allocator.load();
    if (current == ours) return 0;
    // As torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator: only before CUDA was used.
    if (current && current->initialized()) {
      tc::set_error("PyTorch's CUDA allocator (" + current->name() +
                        ") is already initialised: install cachet before the first CUDA call "
                        "(call cachet_torch.install() right after importing torch)",
                    false);
      return 1;
    }
    cachet::gpu::CurrentStream::set_provider(&current_stream_for_device_calls);
    replaced_allocator.store(current);
    c10::cuda::CUDACachingAllocator::allocator.store(ours);
    c10::SetAllocator(c10::DeviceType::CUDA, ours);
    (void)follow_allocator_settings();
    return 0;
  } catch (const std::exception& e) {
    tc::set_error(std::string("install: ") + e.what(), false);
    return 1;
  }
}

// For benchmarks only (bench/c10_empty.py --in-process): points PyTorch's allocator atomic at the
// allocator install() replaced (use_native = 1; initialised for every device on first use) or back
// at cachet (0), so that one process can time torch.empty under both (at::empty_cuda asks the
// atomic). Memory keeps the deleter of the allocator that made it, so each block goes back to its
// own allocator whichever is current; c10::GetAllocator(kCUDA), the memory stats and everything
// else still speak of the one current at the call. 0 on success; 1 with the reason in
// cachet_torch_last_error when cachet is not installed or replaced nothing.
CACHET_TORCH_API int cachet_c10_bench_select(int use_native) {
  try {
    cc::CUDAAllocator* native = replaced_allocator.load();
    if (c10::cuda::CUDACachingAllocator::allocator.load() != &the_allocator() &&
        c10::cuda::CUDACachingAllocator::allocator.load() != native) {
      tc::set_error("cachet_c10_bench_select: cachet is not PyTorch's CUDA allocator (install it first)", false);
      return 1;
    }
    if (native == nullptr) {
      tc::set_error("cachet_c10_bench_select: install() replaced no allocator, so there is none to select", false);
      return 1;
    }
    if (use_native == 0) {
      c10::cuda::CUDACachingAllocator::allocator.store(&the_allocator());
      return 0;
    }
    if (!native_ready.exchange(true)) native->init(c10::cuda::device_count());
    c10::cuda::CUDACachingAllocator::allocator.store(native);
    return 0;
  } catch (const std::exception& e) {
    tc::set_error(std::string("cachet_c10_bench_select: ") + e.what(), false);
    return 1;
  }
}

#ifdef CACHET_C10_TESTING
// python/tests/c10_backend_test.cpp reaches the allocator through these (backend_testing.h).
namespace cachet::c10_testing {
c10::cuda::CUDACachingAllocator::CUDAAllocator& allocator() { return the_allocator(); }
void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
  return the_allocator().malloc_for_testing(device, size, stream);
}
c10::DeleterFnPtr deleter() { return &raw_delete_fn; }
void empty_cache(c10::MempoolId_t mempool_id) { the_allocator().empty_cache_for_testing(mempool_id); }
}  // namespace cachet::c10_testing
#endif
