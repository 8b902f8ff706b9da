// python/torch_sleep.cpp: the cachet_torch_* C functions of sleep and wake that both PyTorch
// libraries export (tags, sleep, wake, backup buffers), over torch_common's per-device allocators.
#include "torch_common.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/tags.h"

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
