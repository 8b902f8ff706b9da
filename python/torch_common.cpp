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

}  // namespace cachet::torch_common

namespace {
std::string num(std::uint64_t v) { return std::to_string(v); }
}  // namespace

using cachet::torch_common::allocator_for;
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

// `"key": value` for each pair, after a ", " unless `first` (which it clears).
static void append_json_fields(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& kv, bool& first) {
  for (const auto& [k, v] : kv) {
    if (!first) out += ", ";
    first = false;
    append_json_string(out, k);
    out += ": " + std::to_string(v);
  }
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

// ---- sleep and wake (docs/sleep-wake.md; cachet_torch.tag/sleep/wake/sleeping) ----------------
// Tag lists travel as comma-separated text; NULL or "" is the empty list (sleep's and wake's
// `tags`: every tag; sleep's `backup_tags`: none). Each name is checked (cachet::check_tag).

namespace {

cachet::TagList parse_tags(const char* csv) {
  cachet::TagList out;
  if (csv == nullptr || *csv == '\0') return out;
  const std::string s = csv;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = s.find(',', start);
    std::string t = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    cachet::check_tag(t);  // an empty name between commas is refused here, by name
    if (std::find(out.begin(), out.end(), t) != out.end())
      throw cachet::UsageError("the tag '" + t + "' is named twice; name each tag once");
    out.push_back(std::move(t));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// The allocators a sleep or wake applies to: `device`'s (created if need be) or, with -1, every
// allocator that exists, in device order.
std::vector<std::pair<int, cachet::CachingAllocator*>> targets(int device) {
  std::vector<std::pair<int, cachet::CachingAllocator*>> out;
  if (device >= 0) {
    if (cachet::CachingAllocator* a = allocator_for(device, false)) out.emplace_back(device, a);
    return out;
  }
  for (int d = 0; d < kMaxDevices; ++d)
    if (cachet::CachingAllocator* a = state().allocators[d].load(std::memory_order_acquire)) out.emplace_back(d, a);
  return out;
}

// -1 with last_error for a refusal (UsageError and the like), -2 for out of memory.
template <class F>
long long sleep_call(const char* what, F&& f) {
  try {
    // Each allocator refuses by itself when it was built without cachet_sleep; with none built
    // yet, the configuration that will build them answers.
    load_config();
    const State& s = state();
    if (s.created.load() == 0 && !(s.config_ok && s.config.sleep))
      throw cachet::UsageError(
          s.config_ok ? "sleep needs CACHET_ALLOC_CONF cachet_sleep:True set before the first allocation "
                        "(the segments are then mapped with the CUDA VMM calls, so their addresses "
                        "outlive their memory)"
                      : "the configuration was refused: " + s.config_error);
    return f();
  } catch (const cachet::OutOfMemory& e) {
    set_error(e.what(), false);
    return -2;
  } catch (const std::exception& e) {
    set_error(std::string(what) + ": " + e.what(), false);
    return -1;
  }
}

}  // namespace

// Sets the calling thread's current tag: 0, or 1 with last_error naming what is wrong.
CACHET_TORCH_API int cachet_torch_set_tag(const char* tag) {
  return guarded([&] { cachet::set_current_tag(tag ? tag : ""); }, false) ? 0 : 1;
}

// The calling thread's current tag ("default" unless set).
CACHET_TORCH_API char* cachet_torch_current_tag(void) { return dup(cachet::current_tag()); }

// sleep(tags, backup_tags) on `device` (-1: every device with an allocator): the bytes given back,
// or -1 (refused: last_error says why, nothing changed) or -2 (out of memory for the host backup:
// nothing changed). With several devices, those before the failing one stay asleep; the error
// names them.
CACHET_TORCH_API long long cachet_torch_sleep(const char* tags, const char* backup_tags, int device) {
  return sleep_call("sleep", [&]() -> long long {
    const cachet::TagList t = parse_tags(tags), b = parse_tags(backup_tags);
    long long total = 0;
    std::string done;
    for (auto [d, a] : targets(device)) {
      try {
        total += static_cast<long long>(a->sleep(t, b));
      } catch (const cachet::OutOfMemory& e) {
        if (done.empty()) throw;
        throw cachet::OutOfMemory(std::string(e.what()) + " (device " + std::to_string(d) +
                                  "; devices " + done + " are asleep: wake them or retry)");
      }
      done += (done.empty() ? "" : ", ") + std::to_string(d);
    }
    return total;
  });
}

// wake(tags) on `device` (-1: every device with an allocator): 0, -1 (refused) or -2 (out of
// memory: that device stays asleep with its backups; last_error says how many bytes it needed).
CACHET_TORCH_API int cachet_torch_wake(const char* tags, int device) {
  return static_cast<int>(sleep_call("wake", [&]() -> long long {
    const cachet::TagList t = parse_tags(tags);
    for (auto [d, a] : targets(device)) a->wake(t);
    return 0;
  }));
}

// ["tag", ...]: the tags with sleeping blocks on `device` (-1: on any device), sorted, each once.
CACHET_TORCH_API char* cachet_torch_sleeping_json(int device) {
  std::string out;
  if (!guarded([&] {
        std::vector<std::string> all;
        for (auto [d, a] : targets(device))
          for (const auto& t : a->sleeping()) all.push_back(t);
        std::sort(all.begin(), all.end());
        all.erase(std::unique(all.begin(), all.end()), all.end());
        out = "[";
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (i) out += ", ";
          append_json_string(out, all[i]);
        }
        out += "]";
      },
               false))
    return nullptr;
  return dup(out);
}

// {"sleep.backup_bytes.allocated": n, ...}: the 21 sleep keys of `device`.
CACHET_TORCH_API char* cachet_torch_sleep_stats_json(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return nullptr;
  std::string out;
  if (!guarded([&] {
        out = "{";
        bool first = true;
        append_json_fields(out, cachet::flatten(a->sleep_stats()), first);
        out += "}";
      },
               false))
    return nullptr;
  return dup(out);
}

// cachet's sleep lines for memory_summary() ("" when nothing ever slept on `device`).
CACHET_TORCH_API char* cachet_torch_sleep_summary(int device) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return nullptr;
  std::string out;
  if (!guarded([&] { out = cachet::sleep_summary(a->sleep_stats()); }, false)) return nullptr;
  return dup(out);
}

// Pins now the host buffers the next sleep backing up `backup_tags` would pin for the live blocks
// of those tags on `device` (-1: every device with an allocator), kept for that sleep: their bytes,
// -1 (refused) or -2 (host memory short) with last_error (docs/sleep-wake.md section 6).
CACHET_TORCH_API long long cachet_torch_prepare_backup_buffers(const char* backup_tags, int device) {
  return sleep_call("prepare_backup_buffers", [&]() -> long long {
    const cachet::TagList b = parse_tags(backup_tags);
    long long total = 0;
    for (auto [d, a] : targets(device)) total += static_cast<long long>(a->prepare_backup_buffers(b));
    return total;
  });
}

// Gives back the pinned host buffers kept between sleeps on `device` (-1: every device with an
// allocator; none is created): the bytes given back, or -1 with last_error. Buffers holding the
// backups of sleeping memory stay; empty_cache() keeps the others (docs/sleep-wake.md section 6).
CACHET_TORCH_API long long cachet_torch_release_backup_buffers(int device) {
  long long total = 0;
  const bool ok = guarded(
      [&] {
        if (device >= 0) {
          if (cachet::CachingAllocator* a = cachet::torch_common::existing_allocator(device))
            total += static_cast<long long>(a->release_backup_buffers());
          return;
        }
        for (int d = 0; d < kMaxDevices; ++d)
          if (cachet::CachingAllocator* a = state().allocators[d].load(std::memory_order_acquire))
            total += static_cast<long long>(a->release_backup_buffers());
      },
      false);
  return ok ? total : -1;
}

// ---- A private pool of the calling thread (torch_memory_saver's disable() over the plug-in) -----
//
// torch_memory_saver's disable() allocates inside torch.cuda.MemPool() + use_mem_pool(pool) and
// drops the pool after, so that only what was allocated inside goes back (python/cachet_torch/
// memory_saver.py). PyTorch 2.11 refuses MemPool for the plug-in (createOrIncrefPool), so these
// two do the same calls on cachet's allocator directly (docs/pytorch-allocator.md §14.9): begin is
// MemPool() and entering use_mem_pool (create_or_incref_pool, then begin_allocate_to_pool with the
// route of the calling OS thread: its allocations go to the pool, whatever their stream); end is
// leaving it and dropping the pool (end_allocate_to_pool, release_pool for each of the two users,
// empty_cache(id)). The ids are (0, 2^63 + n): PyTorch's own count up from 1 ((0, n) for MemPool
// and graph_pool_handle, (n, 0) for captures), so the two never meet.

namespace {
std::atomic<unsigned long long> g_thread_pools{0};
}  // namespace

// Begins a private pool taking the calling thread's allocations on `device` (its allocator
// created if need be): 0 and *id_out (the pool id's second half; the first is 0), or -1 with
// last_error saying why (nothing changed).
CACHET_TORCH_API int cachet_torch_begin_thread_pool(int device, unsigned long long* id_out) {
  cachet::CachingAllocator* a = allocator_for(device, false);
  if (!a) return -1;
  const cachet::PoolId id{0, (1ULL << 63) + g_thread_pools.fetch_add(1)};
  const bool ok = guarded(
      [&] {
        a->create_or_incref_pool(id);
        try {
          a->begin_allocate_to_pool(id, cachet::PoolRoute{});
        } catch (...) {
          a->release_pool(id);  // the pool made above, forgotten again
          throw;
        }
      },
      false);
  if (!ok) return -1;
  if (id_out) *id_out = id.second;
  return 0;
}

// Ends the pool cachet_torch_begin_thread_pool began (`id` its *id_out) and gives back its free
// memory: what was allocated inside and is free by now; blocks still allocated return to the pool
// when freed and go at a later empty_cache (PyTorch's freeable pool, §14.5). Nothing else goes: a
// sleeping range of the default pool stays asleep (policy:pytorch; under policy:cachet a released
// pool's memory is the default pool's, R11, so this is a whole empty_cache). 0, or -1 with
// last_error.
CACHET_TORCH_API int cachet_torch_end_thread_pool(int device, unsigned long long id) {
  cachet::CachingAllocator* a = cachet::torch_common::existing_allocator(device);
  if (!a) {
    set_error("end_thread_pool: device " + std::to_string(device) + " has no allocator", false);
    return -1;
  }
  const cachet::PoolId pool{0, id};
  return guarded(
             [&] {
               a->end_allocate_to_pool(pool);
               a->release_pool(pool);  // use_mem_pool's user
               a->release_pool(pool);  // the MemPool's
               a->empty_cache(pool);
             },
             false)
             ? 0
             : -1;
}
