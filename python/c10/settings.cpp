// python/c10/settings.cpp: the allocator's settings through the c10 backend (docs/configuration.md;
// python/README.md, "The c10 backend"): torch.cuda.memory._set_allocator_settings at run time,
// followed through PyTorch's settings hook, and the snapshot's allocator_settings (PyTorch's
// AllocatorConfigInfo) from cachet's configuration.
//
// PyTorch applies a settings string at run time (c10::CachingAllocator::setAllocatorSettings):
// its generic parse, then the one device hook AcceleratorAllocatorConfig keeps (CUDA's). cachet
// follows by chaining onto that hook: the previous hook first (PyTorch's own parse, which refuses
// what PyTorch refuses), then the string parsed over cachet's configuration for the allocators
// created later and applied to each existing one (CachingAllocator::configure); cachet's refusal
// (it is stricter) raises in Python as RuntimeError. The hook is a function-local static of an
// inline function: libc10 exports it (a unique symbol), found by name in the loaded libc10.
#include <dlfcn.h>

#include <functional>
#include <mutex>
#include <string>

#include "c10/backend.h"
#include "cachet/config.h"

namespace cachet::c10_backend {
namespace {

void apply_allocator_settings(const std::string& env) {
  tc::State& s = tc::state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  try {
    cachet::ParseResult r = cachet::parse_config(env, cachet::ConfigSource::PyTorch, s.config);
    for (auto& slot : s.allocators)
      if (auto* a = slot.load(std::memory_order_acquire)) (void)a->configure(env);
    s.config = r.config;
    s.text = env;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cachet: _set_allocator_settings(\"", env, "\"): ", e.what());
  }
}

}  // namespace

bool follow_allocator_settings() {
  static const bool done = [] {
    using Hook = std::function<void(const std::string&)>;
    void* h = dlopen("libc10.so", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    auto* hook = static_cast<Hook*>(
        dlsym(h, "_ZZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11EvE4hook"));
    auto* guard = static_cast<const char*>(
        dlsym(h, "_ZGVZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11EvE4hook"));
    dlclose(h);
    if (!hook || !guard || *guard == 0) return false;  // absent, or not constructed yet
    Hook previous = *hook;
    *hook = [previous](const std::string& env) {
      if (previous) previous(env);
      apply_allocator_settings(env);
    };
    return true;
  }();
  return done;
}

// The snapshot's allocator_settings: cachet's configuration in PyTorch's record.
void CachetCUDAAllocator::load_settings(cc::AllocatorConfigInfo& md) {
  tc::load_config();
  const tc::State& s = tc::state();
  const cachet::Config& c = s.config;
  md.garbage_collection_threshold = c.garbage_collection_threshold;
  md.max_split_size = static_cast<size_t>(c.max_split_size);
  md.pinned_num_register_threads = static_cast<size_t>(c.pinned_num_register_threads);
  md.expandable_segments = c.expandable_segments;
  md.release_lock_on_malloc = c.release_lock_on_cudamalloc;
  md.pinned_use_host_register = c.pinned_use_cuda_host_register;
  md.graph_capture_record_stream_reuse = c.graph_capture_record_stream_reuse;
  md.last_allocator_settings = s.text;
  md.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(), c.roundup_power2_divisions.end());
}

}  // namespace cachet::c10_backend
