// bench/torch_peer.cpp: PyTorch's own caching allocator, from the installed torch
// (libc10_cuda.so), through c10::cuda::CUDACachingAllocator::raw_alloc/raw_delete: the calls
// C++ extensions use. Built only when CACHET_TORCH_DIR names a torch package whose headers
// compiled in bench/CMakeLists.txt's configure-time check (CACHET_HAVE_TORCH).
//
// Without ATen's CUDA hooks nobody calls init(device_count) for us, and the native allocator
// asserts "Allocator not initialized" on its first malloc: call it once here (it only grows its
// per-device table, so a second call is harmless).
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "peers.h"

namespace cachet::bench {
namespace {

namespace tca = c10::cuda::CUDACachingAllocator;

class TorchPeer final : public Peer {
 public:
  TorchPeer() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw std::runtime_error("no CUDA device");
    if (tca::get() == nullptr) throw std::runtime_error("c10 CUDA allocator not set");
    name_ = tca::name();
    if (name_ != "native") {
      throw std::runtime_error("PyTorch allocator backend is '" + name_ +
                               "', not native (unset PYTORCH_CUDA_ALLOC_CONF backend)");
    }
    tca::init(n);
  }
  void* alloc(std::size_t n) override { return tca::raw_alloc(n); }
  void free(void* p) override { tca::raw_delete(p); }
  void trim() override { tca::emptyCache(); }

 private:
  std::string name_;
};

}  // namespace

Peer* torch_peer(std::string* why) {
  static const Made made = make_peer([] { return new TorchPeer(); });
  return made.get(why);
}

}  // namespace cachet::bench
