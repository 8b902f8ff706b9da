// python/torch_common.cpp: the per-device allocators, the configuration and the cachet_torch_*
// C functions that both PyTorch libraries export (torch_common.h says what is shared and why).
#include "torch_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/tags.h"
#include "cachet/trace.h"

namespace cachet::torch_common {

State& state() {
  static State* s = new State;  // never destroyed: see torch_common.h
  return *s;
}

void set_error(std::string msg, bool print) {
  State& s = state();
  if (print) std::fprintf(stderr, "cachet: %s\n", msg.c_str());
  std::lock_guard<std::mutex> lock(s.create_mu);
  s.last_error = std::move(msg);
}

std::string last_error_copy() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  return s.last_error;
}

void load_config() {
  State& s = state();
  std::call_once(s.config_once, [&s] {
    try {
      cachet::EnvConfig env = cachet::config_from_environment();
      s.config = env.parsed.config;
      s.variable = env.variable;
      s.text = env.text;
      for (const auto& w : env.parsed.warnings)
        std::fprintf(stderr, "cachet: warning: %s: %s\n", env.variable.c_str(), w.message.c_str());
      s.config_ok = true;
    } catch (const std::exception& e) {
      s.config_error = e.what();
      s.config_ok = false;
    }
  });
}

void register_allocator(int device, cachet::CachingAllocator* a) {
  State& s = state();
  if (auto f = s.trace_listener.load()) a->set_trace_listener([f, device](const cachet::TraceEvent& e) { f(device, e); });
  s.allocators[device].store(a, std::memory_order_release);
  // The sole allocator: this one if it is the first, none once there is a second. The device is
  // written once, before the pointer that publishes it (a reader that saw the pointer reads it).
  if (s.created.fetch_add(1, std::memory_order_acq_rel) == 0) {
    g_sole_device.store(device, std::memory_order_relaxed);
    g_sole_allocator.store(a, std::memory_order_release);
  } else {
    g_sole_allocator.store(nullptr, std::memory_order_release);
  }
}

cachet::CachingAllocator* allocator_for(int device, bool print_errors) {
  if (device < 0 || device >= kMaxDevices) {
    set_error("device index " + std::to_string(device) + " out of range", print_errors);
    return nullptr;
  }
  State& s = state();
  if (auto* a = s.allocators[device].load(std::memory_order_acquire)) return a;
  load_config();
  if (!s.config_ok) {
    // The library alone (no cachet_torch.install(), which raises instead) reports a refused
    // configuration exactly once; every allocation then fails.
    if (!s.config_reported.exchange(true))
      std::fprintf(stderr, "cachet: configuration refused, every allocation will fail: %s\n",
                   s.config_error.c_str());
    set_error(s.config_error, false);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(s.create_mu);
  if (auto* a = s.allocators[device].load(std::memory_order_acquire)) return a;
  try {
    auto a = cachet::CachingAllocator::for_cuda_device(device, s.config);
    a->set_trace(s.trace_on.load());
    register_allocator(device, a.get());
    return a.release();
  } catch (const std::exception& e) {
    s.last_error = std::string("cannot create the allocator for device ") + std::to_string(device) +
                   ": " + e.what();
    if (print_errors) std::fprintf(stderr, "cachet: %s\n", s.last_error.c_str());
    return nullptr;
  }
}

int device_count_hint() {
  int n = 0;
  for (int d = 0; d < kMaxDevices; ++d)
    if (existing_allocator(d)) n = d + 1;
  return n;
}

char* dup(const std::string& str) {
  char* p = static_cast<char*>(std::malloc(str.size() + 1));
  if (p) std::memcpy(p, str.c_str(), str.size() + 1);
  return p;
}

void append_json_string(std::string& out, std::string_view str) {
  out += '"';
  for (char c : str) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

// `"key": value` for each pair, after a ", " unless `first` (which it clears).
void append_json_fields(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& kv, bool& first) {
  for (const auto& [k, v] : kv) {
    if (!first) out += ", ";
    first = false;
    append_json_string(out, k);
    out += ": " + std::to_string(v);
  }
}

}  // namespace cachet::torch_common

namespace {
std::string num(std::uint64_t v) { return std::to_string(v); }
}  // namespace

using cachet::torch_common::allocator_for;
using cachet::torch_common::append_json_fields;
using cachet::torch_common::append_json_string;
using cachet::torch_common::dup;
using cachet::torch_common::guarded;
using cachet::torch_common::kMaxDevices;
using cachet::torch_common::load_config;
using cachet::torch_common::set_error;
using cachet::torch_common::state;
using cachet::torch_common::State;

// ---- cachet_torch_*: for python/cachet_torch/ ----------------------------------------------

// Reads the configuration (once). 0 when it is valid, 1 otherwise (see cachet_torch_config_error).
// The caller reports a refusal itself (cachet_torch.install() raises ValueError), so the library
// does not print it again.
CACHET_TORCH_API int cachet_torch_init(void) {
  load_config();
  if (state().config_ok) return 0;
  state().config_reported.store(true);
  return 1;
}

CACHET_TORCH_API const char* cachet_torch_config_error(void) {
  load_config();
  return state().config_error.c_str();
}

// The last error message (any thread), "" when none.
CACHET_TORCH_API char* cachet_torch_last_error(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  return dup(s.last_error);
}

CACHET_TORCH_API void cachet_torch_string_free(char* p) { std::free(p); }

// CUDAPluggableAllocator.set_record_stream_fn: void(void* ptr, cudaStream_t stream). PyTorch does
// not pass the device: the allocator that owns ptr takes it.
CACHET_TORCH_API void cachet_torch_record_stream(void* ptr, void* stream) {
  if (!ptr) return;
  State& s = state();
  std::string first_error;
  for (int d = 0; d < kMaxDevices; ++d) {
    cachet::CachingAllocator* a = s.allocators[d].load(std::memory_order_acquire);
    if (!a) continue;
    try {
      a->record_stream(ptr, reinterpret_cast<cachet::StreamId>(stream));
      return;
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  set_error("record_stream: " + (first_error.empty() ? std::string("no allocator owns the pointer")
                                                       : first_error),
            true);
}

// CUDAPluggableAllocator.set_reset_fn: torch.cuda.empty_cache().
CACHET_TORCH_API void cachet_torch_empty_cache(void) {
  State& s = state();
  for (auto& slot : s.allocators)
    if (auto* a = slot.load(std::memory_order_acquire)) guarded([&] { a->empty_cache(); }, true);
}

// CUDAPluggableAllocator.set_memory_fraction_fn: torch.cuda.set_per_process_memory_fraction.
CACHET_TORCH_API void cachet_torch_set_memory_fraction(double fraction, int device) {
  if (auto* a = allocator_for(device)) guarded([&] { a->set_memory_fraction(fraction); }, true);
}

// Trace recording (the plug-in's _record_memory_history): applies to existing allocators and to
// those created later. Turning it on clears nothing; cachet_torch_clear_trace does.
CACHET_TORCH_API void cachet_torch_record_history(int on) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  s.trace_on.store(on != 0);
  for (auto& slot : s.allocators)
    if (auto* a = slot.load(std::memory_order_acquire)) a->set_trace(on != 0);
}

CACHET_TORCH_API void cachet_torch_clear_trace(void) {
  for (auto& slot : state().allocators)
    if (auto* a = slot.load(std::memory_order_acquire)) a->clear_trace();
  if (auto f = state().on_trace_cleared.load()) f();
}

// 1 + the highest device index with an allocator (0 when none was created).
CACHET_TORCH_API int cachet_torch_device_count(void) {
  return cachet::torch_common::device_count_hint();
}

// Returns 0 with 0 elsewhere than a created allocator (nothing is created to answer).
CACHET_TORCH_API int cachet_torch_has_device(int device) {
  return device >= 0 && device < kMaxDevices &&
         state().allocators[device].load(std::memory_order_acquire) != nullptr;
}

// {"key": value, ...}: the 122 memory_stats() keys of `device` (creating its allocator), and the 21
// sleep keys when sleep is enabled.
CACHET_TORCH_API char* cachet_torch_stats_json(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return nullptr;
  std::string out;
  if (!guarded([&] {
        out = "{";
        bool first = true;
        append_json_fields(out, cachet::flatten(a->stats()), first);
        // With cachet_sleep:True, cachet's 21 sleep keys follow PyTorch's 122 (docs/sleep-wake.md, section 5).
        if (a->config().sleep) append_json_fields(out, cachet::flatten(a->sleep_stats()), first);
        out += "}";
      },
               false))
    return nullptr;
  return dup(out);
}

CACHET_TORCH_API int cachet_torch_reset_peak_stats(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  return a && guarded([&] { a->reset_peak_stats(); }, false) ? 0 : 1;
}

CACHET_TORCH_API int cachet_torch_reset_accumulated_stats(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  return a && guarded([&] { a->reset_accumulated_stats(); }, false) ? 0 : 1;
}

CACHET_TORCH_API char* cachet_torch_summary(int device, int abbreviated) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return nullptr;
  std::string out;
  if (!guarded([&] { out = a->summary(abbreviated != 0); }, false)) return nullptr;
  return dup(out);
}

// [{segment}, ...] as torch.cuda.memory_snapshot() lists them (without frames); records a
// "snapshot" trace event, as PyTorch does.
CACHET_TORCH_API char* cachet_torch_snapshot_json(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return nullptr;
  std::string out;
  if (!guarded([&] {
        const cachet::Snapshot snap = a->snapshot();
        out = "[";
        for (std::size_t i = 0; i < snap.size(); ++i) {
          const auto& seg = snap[i];
          if (i) out += ", ";
          out += "{\"device\": " + std::to_string(device) + ", \"address\": " + num(seg.address) +
                 ", \"total_size\": " + num(seg.total_size) +
                 ", \"allocated_size\": " + num(seg.allocated_size()) +
                 ", \"active_size\": " + num(seg.active_size()) +
                 ", \"requested_size\": " + num(seg.requested_size()) +
                 ", \"stream\": " + num(seg.stream) + ", \"segment_type\": \"" +
                 (seg.is_large ? "large" : "small") +
                 "\", \"is_expandable\": " + (seg.is_expandable ? "true" : "false") +
                 ", \"segment_pool_id\": [" + num(seg.pool_id.first) + ", " + num(seg.pool_id.second) + "]" +
                 ", \"blocks\": [";
          for (std::size_t b = 0; b < seg.blocks.size(); ++b) {
            const auto& bl = seg.blocks[b];
            if (b) out += ", ";
            out += "{\"address\": " + num(bl.address) + ", \"size\": " + num(bl.size) +
                   ", \"requested_size\": " + num(bl.requested_size) + ", \"state\": ";
            append_json_string(out, cachet::to_string(bl.state));
            out += "}";
          }
          out += "]}";
        }
        out += "]";
      },
               false))
    return nullptr;
  return dup(out);
}

// [{"action", "addr", "size", "stream", "time_us"}, ...]: the recorded trace of `device`, in
// order ("oom" events carry the device's free bytes in "addr"). "[]" when no allocator exists.
CACHET_TORCH_API char* cachet_torch_trace_json(int device) {
  if (!cachet_torch_has_device(device)) return dup("[]");
  cachet::CachingAllocator* a = state().allocators[device].load(std::memory_order_acquire);
  std::string out;
  if (!guarded([&] {
        const auto events = a->trace();
        out.reserve(events.size() * 96 + 2);
        out = "[";
        bool first = true;
        for (const auto& e : events) {
          if (!first) out += ", ";
          first = false;
          out += "{\"action\": ";
          append_json_string(out, cachet::to_string(e.action));
          out += ", \"addr\": " + num(e.addr) + ", \"size\": " + num(e.size) +
                 ", \"stream\": " + num(e.stream) + ", \"time_us\": " + std::to_string(e.time_us) +
                 "}";
        }
        out += "]";
      },
               false))
    return nullptr;
  return dup(out);
}

// The configuration in use, for _snapshot()["allocator_settings"]: {"variable", "text",
// "canonical", "max_split_size", "garbage_collection_threshold", "expandable_segments",
// "pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
// "graph_capture_record_stream_reuse", "roundup_power2_divisions": [16 numbers]}.
// NULL when the configuration was refused.
CACHET_TORCH_API char* cachet_torch_settings_json(void) {
  load_config();
  State& s = state();
  if (!s.config_ok) return nullptr;
  const cachet::Config& c = s.config;
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  std::string out = "{\"variable\": ";
  append_json_string(out, s.variable);
  out += ", \"text\": ";
  append_json_string(out, s.text);
  out += ", \"canonical\": ";
  append_json_string(out, cachet::to_string(c));
  char gc[64];
  std::snprintf(gc, sizeof gc, "%.17g", c.garbage_collection_threshold);
  out += ", \"max_split_size\": " + std::to_string(c.max_split_size_stat()) +
         ", \"garbage_collection_threshold\": " + gc +
         ", \"expandable_segments\": " + b(c.expandable_segments) +
         ", \"pinned_num_register_threads\": " + std::to_string(c.pinned_num_register_threads) +
         ", \"release_lock_on_cudamalloc\": " + b(c.release_lock_on_cudamalloc) +
         ", \"pinned_use_cuda_host_register\": " + b(c.pinned_use_cuda_host_register) +
         ", \"graph_capture_record_stream_reuse\": " + b(c.graph_capture_record_stream_reuse) +
         ", \"roundup_power2_divisions\": [";
  for (std::size_t i = 0; i < c.roundup_power2_divisions.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(c.roundup_power2_divisions[i]);
  }
  out += "]}";
  return dup(out);
}
