// gpu/src/shell/accounting.h: Accounting, the one writer of a policy's stats (cachet/stats.h's
// DeviceStats: the 122 memory_stats() keys, docs/pytorch-allocator.md §5). Both policies change
// their stats only through these named events; nothing else holds a writable DeviceStats. Each
// event updates the aggregate stat and its pool's (PyTorch's for_each_selected_stat_type), as
// PyTorch does at the same point of the same operation, so the peaks come out the same.
// The recount invariant (INV-STATS-1, docs/invariants.md) checks the result against the blocks
// after every operation in validate mode. Inline and branch-light: the hot path (one
// block_allocated, one free_requested, one free_completed per cached alloc+free) costs what the
// hand-written updates did.
//
// Layout: the seven stats that allocate and free change are kept per pool, side by side
// (HotStats), so a cached alloc + free writes 3 cache lines of its pool instead of one line of
// each of 5-7 separate StatArrays (gpu/README.md "The hot path"); stats() copies them into the
// DeviceStats record, which holds the rest. Every event changes the aggregate and one pool by the
// same amount (PyTorch's for_each_selected_stat_type), so the aggregate's allocated and freed are
// the sums of the two pools' and are not kept: of the aggregate, only current and peak are
// (AggStats, 2 lines), the peak taken after each increase as PyTorch takes it.
#pragma once

#include <array>
#include <cstddef>
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

  // The record, current as of the last event (the hot stats copied in); valid until the next event.
  const DeviceStats& stats() const {
    const HotStats& small = hot_[0];
    const HotStats& large = hot_[1];
    auto copy = [&](StatArray& out, Stat HotStats::*m, CurPeak AggStats::*a) {
      const Stat& sm = small.*m;
      const Stat& lg = large.*m;
      out[static_cast<std::size_t>(StatType::Aggregate)] =
          Stat{(agg_.*a).current, (agg_.*a).peak, sm.allocated + lg.allocated, sm.freed + lg.freed};
      out[static_cast<std::size_t>(StatType::SmallPool)] = sm;
      out[static_cast<std::size_t>(StatType::LargePool)] = lg;
    };
    copy(s_.allocation, &HotStats::allocation, &AggStats::allocation);
    copy(s_.allocated_bytes, &HotStats::allocated_bytes, &AggStats::allocated_bytes);
    copy(s_.active, &HotStats::active, &AggStats::active);
    copy(s_.active_bytes, &HotStats::active_bytes, &AggStats::active_bytes);
    copy(s_.requested_bytes, &HotStats::requested_bytes, &AggStats::requested_bytes);
    copy(s_.inactive_split, &HotStats::inactive_split, &AggStats::inactive_split);
    copy(s_.inactive_split_bytes, &HotStats::inactive_split_bytes, &AggStats::inactive_split_bytes);
    return s_;
  }

  // --- blocks (§2.4, §2.5, §6) ---
  // A block handed out: allocated and active, `requested` bytes asked for; `oversize` (a block of
  // max_split_size or more, policy:pytorch) counts it in oversize_allocations.
  void block_allocated(StatType pool, Bytes size, Bytes requested, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    const auto req = static_cast<std::int64_t>(requested);
    HotStats& h = of(pool);
    h.allocation.increase(1);
    agg_.allocation.increase(1);
    h.allocated_bytes.increase(n);
    agg_.allocated_bytes.increase(n);
    h.active.increase(1);
    agg_.active.increase(1);
    h.active_bytes.increase(n);
    agg_.active_bytes.increase(n);
    h.requested_bytes.increase(req);
    agg_.requested_bytes.increase(req);
    if (oversize) s_.oversize_allocations.increase(1);
  }
  // free() of an allocated block: no longer allocated; still active until free_completed (at
  // once, or when its stream-use events complete).
  void free_requested(StatType pool, Bytes size, bool oversize) {
    const auto n = static_cast<std::int64_t>(size);
    HotStats& h = of(pool);
    h.allocation.decrease(1);
    agg_.allocation.decrease(1);
    h.allocated_bytes.decrease(n);
    agg_.allocated_bytes.decrease(n);
    if (oversize) s_.oversize_allocations.decrease(1);
  }
  // The freed block became free: no longer active; `requested` is what it was asked for.
  void free_completed(StatType pool, Bytes size, Bytes requested) {
    const auto n = static_cast<std::int64_t>(size);
    const auto req = static_cast<std::int64_t>(requested);
    HotStats& h = of(pool);
    h.active.decrease(1);
    agg_.active.decrease(1);
    h.active_bytes.decrease(n);
    agg_.active_bytes.decrease(n);
    h.requested_bytes.decrease(req);
    agg_.requested_bytes.decrease(req);
  }
  // Inactive split blocks (free blocks of a split cudaMalloc segment) changed by `blocks` and
  // `bytes`, either sign: a split became inactive or active (§2.4), a free merged (§2.5, §13.2:
  // moved once, by the net). A zero change leaves its stat alone.
  void inactive_split_changed(StatType pool, std::int64_t blocks, std::int64_t bytes) {
    HotStats& h = of(pool);
    change(h.inactive_split, agg_.inactive_split, blocks);
    change(h.inactive_split_bytes, agg_.inactive_split_bytes, bytes);
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
  void reset_accumulated() {
    s_.reset_accumulated();
    for (HotStats& h : hot_) h.for_each([](Stat& st) { st.reset_accumulated(); });  // the aggregate's: their sums
  }
  void reset_peak() {
    s_.reset_peak();
    for (HotStats& h : hot_) h.for_each([](Stat& st) { st.reset_peak(); });
    agg_.for_each([](CurPeak& st) { st.peak = st.current; });
  }

 private:
  // The stats of one pool that allocate and free change; a cached alloc + free that splits
  // nothing changes only the first 192 bytes (3 cache lines). The order keeps two stats that one
  // event decreases apart: side by side, the compiler pairs one's `freed` with the next one's
  // `current` in vector registers, which costs more instructions than it saves.
  struct alignas(64) HotStats {
    Stat allocation;
    Stat active;
    Stat allocated_bytes;
    Stat active_bytes;
    Stat inactive_split;
    Stat requested_bytes;
    Stat inactive_split_bytes;
    template <class F>
    void for_each(F&& f) {
      for (Stat* st : {&allocation, &allocated_bytes, &active, &active_bytes, &requested_bytes, &inactive_split,
                       &inactive_split_bytes})
        f(*st);
    }
  };
  // The aggregate's current and peak of the same stats (its allocated and freed: the pools' sums).
  struct CurPeak {
    std::int64_t current = 0;
    std::int64_t peak = 0;
    void increase(std::int64_t n) {
      current += n;
      if (current > peak) peak = current;
    }
    void decrease(std::int64_t n) { current -= n; }
  };
  struct alignas(64) AggStats {
    CurPeak allocation;
    CurPeak active;
    CurPeak allocated_bytes;
    CurPeak active_bytes;
    CurPeak inactive_split;
    CurPeak requested_bytes;
    CurPeak inactive_split_bytes;
    template <class F>
    void for_each(F&& f) {
      for (CurPeak* st : {&allocation, &allocated_bytes, &active, &active_bytes, &requested_bytes, &inactive_split,
                          &inactive_split_bytes})
        f(*st);
    }
  };

  // A pool's hot stats (SmallPool or LargePool: every event names the pool of its block).
  HotStats& of(StatType pool) { return hot_[static_cast<std::size_t>(pool) - 1]; }
  static void change(Stat& st, CurPeak& agg, std::int64_t d) {
    if (d > 0) {
      st.increase(d);
      agg.increase(d);
    } else if (d < 0) {
      st.decrease(-d);
      agg.decrease(-d);
    }
  }
  static void change(StatArray& a, StatType pool, std::int64_t d) {
    if (d > 0) DeviceStats::for_all_and(a, pool, [d](Stat& st) { st.increase(d); });
    else if (d < 0) DeviceStats::for_all_and(a, pool, [d](Stat& st) { st.decrease(-d); });
  }

  std::array<HotStats, kNumStatTypes - 1> hot_{};  // SmallPool, LargePool
  AggStats agg_{};
  mutable DeviceStats s_;  // the rest; stats() copies hot_ in
};

}  // namespace cachet::gpu::detail
