// python/torch_common.h: what the two PyTorch libraries share (compiled into both from
// torch_common.cpp; nothing here is exported but the cachet_torch_* C functions).
//
//   libcachet_torch.so  the plug-in (plugin.cpp): CUDAPluggableAllocator's entry points
//   libcachet_c10.so    the c10 backend (c10/, backend.h): cachet as PyTorch's own CUDAAllocator
//
// Both serve one cachet::CachingAllocator per CUDA device, created on first use and never
// destroyed (PyTorch frees tensors during interpreter teardown, after static destructors would
// have run), with the configuration read once, on first use, from CACHET_ALLOC_CONF, else
// PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (cachet-only keys only in CACHET_ALLOC_CONF).
// python/cachet_torch/ (ctypes) calls the cachet_torch_* functions of whichever library it
// loaded: stats, summary, snapshot and trace as JSON, stream uses, empty_cache, memory fraction.
// Strings they return are malloc'd: cachet_torch_string_free.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"

#define CACHET_TORCH_API extern "C" __attribute__((visibility("default")))
#define CACHET_TORCH_CXX_API __attribute__((visibility("default")))

namespace cachet::torch_common {

inline constexpr int kMaxDevices = 64;

struct State {
  std::once_flag config_once;
  bool config_ok = false;
  std::string config_error;  // the parser's message, "" when config_ok
  cachet::Config config;
  std::string variable;  // the environment variable used ("" = defaults)
  std::string text;      // its value

  std::mutex create_mu;  // creation of allocators; last error
  std::array<std::atomic<cachet::CachingAllocator*>, kMaxDevices> allocators{};
  std::atomic<int> created{0};           // how many allocators exist
  std::atomic<bool> trace_on{false};     // applied to allocators created later
  std::atomic<bool> config_reported{false};  // the refusal was printed or raised in Python
  // Called after cachet_torch_clear_trace cleared the trace (the c10 backend drops the stacks it
  // kept for it); nullptr in the plug-in.
  std::atomic<void (*)()> on_trace_cleared{nullptr};
  // Told of every trace event of every allocator as it is made (cachet/trace.h TraceListener),
  // with its device: the c10 backend's trace trackers; nullptr until one is attached, and in the
  // plug-in. Set under create_mu, and installed on the allocators existing then and on those
  // registered later (register_allocator).
  std::atomic<void (*)(int device, const cachet::TraceEvent&)> trace_listener{nullptr};
  std::string last_error;  // guarded by create_mu
};

State& state();

// Reads the configuration (once).
void load_config();

// Keeps `msg` for cachet_torch_last_error (printed on stderr first when `print`).
void set_error(std::string msg, bool print);
std::string last_error_copy();

// Makes `a` the allocator of `device` (allocator_for's last step, under create_mu; tests give a
// host-simulated one): allocators[device], created and the sole allocator.
void register_allocator(int device, cachet::CachingAllocator* a);

// The allocator of `device`, created on first use; nullptr (and last_error) on failure:
// a device index out of range, a refused configuration, a device that cannot be used.
cachet::CachingAllocator* allocator_for(int device, bool print_errors = true);

// While exactly one allocator exists (the usual case: one device per process), it and its
// device, else nullptr and -1. Written by allocator_for under create_mu; read without a call or a
// lock by the c10 backend's allocate and free (the hot path asks no device of a pointer then).
struct SoleAllocator {
  cachet::CachingAllocator* allocator;
  int device;
};
inline std::atomic<cachet::CachingAllocator*> g_sole_allocator{nullptr};
inline std::atomic<int> g_sole_device{-1};
inline SoleAllocator sole_allocator() {
  cachet::CachingAllocator* a = g_sole_allocator.load(std::memory_order_acquire);
  return {a, a != nullptr ? g_sole_device.load(std::memory_order_relaxed) : -1};
}

// The allocator of `device` if it exists, else nullptr (creates nothing).
inline cachet::CachingAllocator* existing_allocator(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return state().allocators[device].load(std::memory_order_acquire);
}

// 1 + the highest device index with an allocator (0 when none was created).
int device_count_hint();

// Runs f; an exception becomes last_error (printed when `print`). Returns whether f succeeded.
template <class F>
bool guarded(F&& f, bool print) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    set_error(e.what(), print);
  } catch (...) {
    set_error("unknown error", print);
  }
  return false;
}

char* dup(const std::string& str);  // malloc'd copy (cachet_torch_string_free)
void append_json_string(std::string& out, std::string_view str);
// `"key": value` for each pair, after a ", " unless `first` (which it clears).
void append_json_fields(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& kv, bool& first);

}  // namespace cachet::torch_common
