// gpu/src/shell/accounting.h: Accounting, the one writer of a policy's stats (cachet/stats.h's
// DeviceStats: the 122 memory_stats() keys, docs/pytorch-allocator.md §5). Both policies change
// their stats only through these named events; nothing else holds a writable DeviceStats. Each
// event updates the aggregate stat and its pool's (PyTorch's for_each_selected_stat_type), as
// PyTorch does at the same point of the same operation, so the peaks come out the same.
// The recount invariant (INV-STATS-1, docs/invariants.md) checks the result against the blocks
// after every operation in validate mode. Inline and branch-light: the hot path (one
// block_allocated, one free_requested, one free_completed per cached alloc+free) costs what the
// hand-written updates did.
#pragma once

#include <cstdint>

#include "cachet/stats.h"
#include "cachet/types.h"

namespace cachet::gpu::detail {

class Accounting {
 public:
  // max_split_size: the value memory_stats() reports, fixed at construction (§4.1).
  explicit Accounting(std::int64_t max_split_size) { s_.max_split_size = max_split_size; }
  Accounting(const Accounting&) = delete;
  Accounting& operator=(const Accounting&) = delete;

  const DeviceStats& stats() const { return s_; }

  // --- blocks (§2.4, §2.5, §6) ---
  // A block handed out: allocated and active, `requested` bytes asked for; `oversize` (a block of
  // max_split_size or more, policy:pytorch) counts it in oversize_allocations.
  void block_allocated(StatType pool, Bytes size, Bytes requested, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    const auto req = static_cast<std::int64_t>(requested);
    DeviceStats::for_all_and(s_.allocation, pool, [](Stat& s) { s.increase(1); });
    DeviceStats::for_all_and(s_.allocated_bytes, pool, [n](Stat& s) { s.increase(n); });
    DeviceStats::for_all_and(s_.active, pool, [](Stat& s) { s.increase(1); });
    DeviceStats::for_all_and(s_.active_bytes, pool, [n](Stat& s) { s.increase(n); });
    DeviceStats::for_all_and(s_.requested_bytes, pool, [req](Stat& s) { s.increase(req); });
    if (oversize) s_.oversize_allocations.increase(1);
  }
  // free() of an allocated block: no longer allocated; still active until free_completed (at
  // once, or when its stream-use events complete).
  void free_requested(StatType pool, Bytes size, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    DeviceStats::for_all_and(s_.allocation, pool, [](Stat& s) { s.decrease(1); });
    DeviceStats::for_all_and(s_.allocated_bytes, pool, [n](Stat& s) { s.decrease(n); });
    if (oversize) s_.oversize_allocations.decrease(1);
  }
  // The freed block became free: no longer active; `requested` is what it was asked for.
  void free_completed(StatType pool, Bytes size, Bytes requested) {
    const auto n = static_cast<std::int64_t>(size);
    const auto req = static_cast<std::int64_t>(requested);
    DeviceStats::for_all_and(s_.active, pool, [](Stat& s) { s.decrease(1); });
    DeviceStats::for_all_and(s_.active_bytes, pool, [n](Stat& s) { s.decrease(n); });
    DeviceStats::for_all_and(s_.requested_bytes, pool, [req](Stat& s) { s.decrease(req); });
  }
  // Inactive split blocks (free blocks of a split cudaMalloc segment) changed by `blocks` and
  // `bytes`, either sign: a split became inactive or active (§2.4), a free merged (§2.5, §13.2:
  // moved once, by the net). A zero change leaves its stat alone.
  void inactive_split_changed(StatType pool, std::int64_t blocks, std::int64_t bytes) {
    change(s_.inactive_split, pool, blocks);
    change(s_.inactive_split_bytes, pool, bytes);
  }

  // --- device memory (§3.2, §3.4, §7) ---
  // A device allocation (cudaMalloc) became a segment; `oversize`: max_split_size or more.
  void segment_allocated(StatType pool, Bytes size, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    DeviceStats::for_all_and(s_.segment, pool, [](Stat& s) { s.increase(1); });
    DeviceStats::for_all_and(s_.reserved_bytes, pool, [n](Stat& s) { s.increase(n); });
    if (oversize) s_.oversize_segments.increase(1);
    ++s_.num_device_alloc;
  }
  // A segment given back to the device (cudaFree).
  void segment_freed(StatType pool, Bytes size, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    ++s_.num_device_free;
    DeviceStats::for_all_and(s_.segment, pool, [](Stat& s) { s.decrease(1); });
    DeviceStats::for_all_and(s_.reserved_bytes, pool, [n](Stat& s) { s.decrease(n); });
    if (oversize) s_.oversize_segments.decrease(1);
  }
  // Pages mapped or unmapped by one device call: reserved bytes, and `segments`, the change in the
  // segment count (policy:cachet counts runs of mapped pages as segments; policy:pytorch's
  // expandable segments are never counted: 0).
  void pages_mapped(StatType pool, Bytes bytes, int segments) {
    const auto n = static_cast<std::int64_t>(bytes);
    ++s_.num_device_alloc;
    DeviceStats::for_all_and(s_.reserved_bytes, pool, [n](Stat& s) { s.increase(n); });
    change(s_.segment, pool, segments);
  }
  void pages_unmapped(StatType pool, Bytes bytes, int segments) {
    const auto n = static_cast<std::int64_t>(bytes);
    ++s_.num_device_free;
    DeviceStats::for_all_and(s_.reserved_bytes, pool, [n](Stat& s) { s.decrease(n); });
    change(s_.segment, pool, segments);
  }

  // --- the slow paths (§3.2, §3.7, §6) ---
  void alloc_retried() { ++s_.num_alloc_retries; }        // counted before the attempt
  void out_of_memory() { ++s_.num_ooms; }                 // before the OutOfMemory is thrown
  void synchronized_all_streams() { ++s_.num_sync_all_streams; }

  // --- the API's resets (torch.cuda.reset_accumulated_memory_stats / reset_peak_memory_stats) ---
  void reset_accumulated() { s_.reset_accumulated(); }
  void reset_peak() { s_.reset_peak(); }

 private:
  static void change(StatArray& a, StatType pool, std::int64_t d) {
    if (d > 0) DeviceStats::for_all_and(a, pool, [d](Stat& s) { s.increase(d); });
    else if (d < 0) DeviceStats::for_all_and(a, pool, [d](Stat& s) { s.decrease(-d); });
  }

  DeviceStats s_;
};

}  // namespace cachet::gpu::detail
