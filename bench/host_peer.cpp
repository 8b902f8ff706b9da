// bench/host_peer.cpp: cachet on the host simulation backend (policy:pytorch, the default
// Config, and policy:cachet), and the stubs of the peers that were not built.
#include <exception>
#include <memory>

#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "peers.h"

namespace cachet::bench {
namespace {

class HostPeer final : public Peer {
 public:
  explicit HostPeer(const Config& config) : a_(gpu::make_host_memory(gpu::HostOptions{}), config) {}
  void* alloc(std::size_t n) override { return a_.allocate(n, 0); }
  void free(void* p) override { a_.free(p); }
  void trim() override { a_.empty_cache(); }

 private:
  CachingAllocator a_;
};

}  // namespace

Peer* host_peer(std::string* why) {
  static const Made made = make_peer([] { return new HostPeer(Config{}); });
  return made.get(why);
}

Peer* host_cachet_policy_peer(std::string* why) {
  static const Made made = make_peer([] {
    Config c;
    c.policy = Policy::Cachet;
    return new HostPeer(c);
  });
  return made.get(why);
}

#ifndef CACHET_HAVE_CUDA
Peer* cachet_cuda_peer(std::string* why) {
  *why = "built without CUDA";
  return nullptr;
}
Peer* cuda_malloc_async_peer(std::string* why) {
  *why = "built without CUDA";
  return nullptr;
}
std::string cuda_device_name() { return ""; }
#endif

#ifndef CACHET_HAVE_TORCH
Peer* torch_peer(std::string* why) {
  *why = "built without torch (configure with -DCACHET_TORCH_DIR=<torch package dir>)";
  return nullptr;
}
#endif

}  // namespace cachet::bench
