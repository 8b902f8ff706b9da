// cachet/stats.h: PyTorch's DeviceStats (c10/core/CachingDeviceAllocator.h) and its 122
// memory_stats() keys. Both model/ and gpu/ report their counters in this record; how they
// keep them is their own business.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cachet {

// One counter. increase(n): current += n, peak = max(peak, current), allocated += n.
// decrease(n): current -= n, freed += n (peak unchanged).
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t n) {
    current += n;
    if (current > peak) peak = current;
    allocated += n;
  }
  void decrease(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_accumulated() { allocated = freed = 0; }
  void reset_peak() { peak = current; }
  friend bool operator==(const Stat&, const Stat&) = default;
};

// Index into a StatArray: "all", then the pool the block belongs to.
enum class StatType : std::uint8_t { Aggregate = 0, SmallPool = 1, LargePool = 2 };
inline constexpr int kNumStatTypes = 3;
using StatArray = std::array<Stat, kNumStatTypes>;

struct DeviceStats {
  StatArray allocation;            // blocks handed out and not yet freed
  StatArray segment;               // device allocations (cudaMalloc); never expandable
  StatArray active;                // allocated or waiting for stream-use events
  StatArray inactive_split;        // free blocks inside split segments (non-expandable)
  StatArray allocated_bytes;       // bytes of allocated blocks (rounded sizes)
  StatArray reserved_bytes;        // bytes obtained from the device
  StatArray active_bytes;          // bytes of active blocks
  StatArray inactive_split_bytes;  // bytes of inactive split blocks
  StatArray requested_bytes;       // bytes the caller asked for, of active blocks

  std::int64_t num_alloc_retries = 0;     // alloc_block retries after release_cached_blocks
  std::int64_t num_ooms = 0;              // OOMs thrown
  std::int64_t num_sync_all_streams = 0;  // synchronize_and_free_events calls
  std::int64_t num_device_alloc = 0;      // cudaMalloc calls and page-map calls
  std::int64_t num_device_free = 0;       // cudaFree calls and page-unmap calls

  Stat oversize_allocations;  // allocated blocks of max_split_size or more
  Stat oversize_segments;     // segments of max_split_size or more

  std::int64_t max_split_size = -1;  // bytes, as configured at construction; -1 = unlimited

  // Applies `f` to the {all, pool} pair PyTorch updates together.
  template <class F>
  static void for_all_and(StatArray& a, StatType pool, F&& f) {
    f(a[static_cast<int>(StatType::Aggregate)]);
    f(a[static_cast<int>(pool)]);
  }

  void reset_accumulated();  // PyTorch's reset_accumulated_memory_stats
  void reset_peak();         // PyTorch's reset_peak_memory_stats

  friend bool operator==(const DeviceStats&, const DeviceStats&) = default;
};

// The 122 memory_stats() keys ("allocated_bytes.all.current", ...) with their values,
// sorted by key as torch.cuda.memory_stats() returns them.
std::vector<std::pair<std::string, std::int64_t>> flatten(const DeviceStats& s);

// The inverse of flatten(). Unknown keys are reported in `unknown` (if given); missing keys
// stay 0.
DeviceStats unflatten(const std::map<std::string, std::int64_t>& kv,
                      std::vector<std::string>* unknown = nullptr);

// What is asleep (issue 24, docs/sleep-wake.md, section 5): kept beside DeviceStats, whose 122 keys
// keep PyTorch's meaning (a sleeping segment stays in segment and reserved_bytes: its addresses
// are still the allocator's; its blocks stay in allocation, active and allocated_bytes).
struct SleepStats {
  Stat sleeping_segments;          // segments asleep (no physical memory behind them)
  Stat sleeping_bytes;             // their bytes: part of reserved_bytes, none of it on the device
  Stat sleeping_allocated_bytes;   // bytes of allocated blocks in sleeping segments
  Stat backup_bytes;               // host bytes holding backups of sleeping blocks
  std::int64_t num_sleeps = 0;          // sleep() calls that returned
  std::int64_t num_wakes = 0;           // wake() calls that returned
  std::int64_t num_wake_ooms = 0;       // wakes that raised out-of-memory (and stayed asleep)
  std::int64_t num_backup_failures = 0; // sleeps refused because a host backup could not be had
  std::int64_t num_frees_while_asleep = 0;  // frees of sleeping blocks, applied at wake

  void reset_accumulated();  // as DeviceStats: allocated/freed of every Stat, and the counts
  void reset_peak();
  friend bool operator==(const SleepStats&, const SleepStats&) = default;
};

// The 21 sleep keys, sorted: "sleep.backup_bytes.allocated", ..., "sleep.num_wakes",
// "sleep.sleeping_segments.peak" (docs/sleep-wake.md, section 5 lists them). memory_stats() of the
// Python bindings returns them after PyTorch's 122.
std::vector<std::pair<std::string, std::int64_t>> flatten(const SleepStats& s);

// The six stats recorded after every op in an oracle recording, in stat_keys order:
// allocated_bytes.all.current, reserved_bytes.all.current, active_bytes.all.current,
// inactive_split_bytes.all.current, segment.all.current, requested_bytes.all.current.
std::array<std::int64_t, 6> step_stats(const DeviceStats& s);

}  // namespace cachet
