// bench/peers.h: the allocators the benchmarks compare, behind one small interface.
//
//   Host             cachet::CachingAllocator on the host simulation backend, policy:pytorch
//                    (the default Config; always built)
//   HostCachetPolicy the same with policy:cachet (Config::policy = Policy::Cachet; always built)
//   Cachet           cachet::CachingAllocator on the CUDA runtime backend (CACHET_HAVE_CUDA)
//   CudaMallocAsync  cudaMallocAsync/cudaFreeAsync on the device's default pool with an
//                    unlimited release threshold (CACHET_HAVE_CUDA)
//   PyTorch          c10::cuda::CUDACachingAllocator::raw_alloc/raw_delete from the installed
//                    torch (CACHET_HAVE_TORCH)
//
// Every peer is reached through the same virtual calls, so the indirection costs all of them
// the same. Peers are created once per process, on first use, and never destroyed (a CUDA
// allocator torn down during exit can race the runtime's own shutdown).
#pragma once

#include <cstddef>
#include <exception>
#include <string>

namespace cachet::bench {

class Peer {
 public:
  virtual ~Peer() = default;
  // Allocates `n` bytes on the legacy default stream; never returns nullptr (throws).
  virtual void* alloc(std::size_t n) = 0;
  virtual void free(void* p) = 0;
  // Gives cached memory back to the device (empty_cache); called outside timed regions.
  virtual void trim() = 0;
};

// A peer made once: the peer, or why there is none.
struct Made {
  Peer* peer = nullptr;
  std::string why;
  Peer* get(std::string* reason) const {
    if (peer == nullptr && reason != nullptr) *reason = why;
    return peer;
  }
};

// Calls `make` (which returns a new Peer or throws) and keeps the exception's text.
template <class F>
Made make_peer(F make) {
  Made m;
  try {
    m.peer = make();
  } catch (const std::exception& e) {
    m.why = e.what();
  }
  return m;
}

// The peer, or nullptr with *why set (no device, not built, init failed).
Peer* host_peer(std::string* why);
Peer* host_cachet_policy_peer(std::string* why);  // host backend, policy:cachet
Peer* cachet_cuda_peer(std::string* why);      // cuda_peers.cpp, or a stub without CUDA
Peer* cuda_malloc_async_peer(std::string* why);
Peer* torch_peer(std::string* why);            // torch_peer.cpp, or a stub without torch

// "NVIDIA H100 80GB HBM3" or "" (no CUDA, no device).
std::string cuda_device_name();

}  // namespace cachet::bench
