// policy:cachet (CachetPolicy; design and promises: cachet/gpu/policy_cachet.h). It satisfies the
// Policy concept (shell/policy.h) as PytorchPolicy does; the API layer reaches it through
// PolicyCore::with_policy (api/policy_core.h). No locking here: every member runs with the API
// layer's mutex held.
//
// Structure: one VA reservation [base_, base_ + va_size_) tiled by CBlocks in address order
// (prev/next), each in one BlockState (shell/block_state.h): a Free block is mapped (every page
// it touches is mapped; it belongs to a stream and sits in free_, ordered by stream, size,
// address); an Unmapped one is page aligned, has no stream and sits in unmapped_, ordered by
// address. Allocated and AwaitingEvents blocks are in active_. Private pools (R10-R12): every
// block carries its pool (PoolId{} = the default pool); a free block of the default pool is in
// free_, one of a private pool in that pool's own free set (pools_), so the hot path of the
// default pool is unchanged. A block freed with stream uses while a pool is active waits in
// deferred_ (Deferred, its stream uses kept, no event yet) until no pool is active.
//
// Invariants: CachetPolicy::invariants() (policy_cachet/check.cpp) checks the rules of
// docs/invariants.md whose policy is cachet or both; each violation line starts with its ID.
#pragma once

#include <boost/container/small_vector.hpp>
#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/backend.h"
#include "cachet/gpu/policy_cachet.h"
#include "cachet/snapshot.h"
#include "cachet/snapshot_digest.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "ptr_map.h"
#include "shell/block_state.h"
#include "shell/shell.h"
#include "size_order.h"

namespace cachet::gpu::detail {

namespace cbi = boost::intrusive;


// Cache-line aligned: a tree walk reads the hook and the size-order key (stream, size, ptr),
// which then share one line (the wide random bench window: 241 -> 233 ns per op).
struct alignas(64) CBlock : cbi::set_base_hook<cbi::link_mode<cbi::normal_link>> {
  DevicePtr ptr = 0;
  Bytes size = 0;
  Bytes requested = 0;  // stale on free blocks
  StreamId stream = 0;  // allocation stream; 0 on unmapped blocks
  PoolId pool{};        // R10: its pool; PoolId{} = the default pool (unmapped blocks: always)
  CBlock* prev = nullptr;
  CBlock* next = nullptr;
  std::int32_t event_count = 0;  // outstanding stream-use events: AwaitingEvents only
  std::uint32_t tag = 0;  // the tag id (Shell::tag_name) it was allocated under; meaningful while live
  // Its pages sleep (docs/sleep-wake.md; policy_cachet/sleep.cpp): mapped state kept, no memory
  // behind it, in no free set; a block is wholly awake or wholly asleep.
  bool asleep = false;

 private:
  BlockState state_ = BlockState::Free;  // shell/block_state.h

 public:
  boost::container::small_vector<StreamId, 2> stream_uses;  // Allocated only

  DevicePtr end() const { return ptr + size; }
  BlockState state() const { return state_; }
  // The one writer of the state; aborts on a transition shell/block_state.h does not allow.
  void set_state(BlockState to) {
    check_transition(state_, to, ptr);
    state_ = to;
  }
  // A block (new, or reused by make_block) starts Free or Unmapped.
  void born(BlockState s) {
    check_born_or_gone("born", s, ptr);
    state_ = s;
  }
  bool is_allocated() const { return state_ == BlockState::Allocated; }
  bool is_mapped() const { return state_ != BlockState::Unmapped; }
  bool is_mapped_free() const { return state_ == BlockState::Free; }
  bool is_awake_free() const { return state_ == BlockState::Free && !asleep; }
  bool is_unmapped() const { return state_ == BlockState::Unmapped; }
  // Free or Unmapped: may merge with a neighbour in the same state, or be removed.
  bool is_reusable() const { return state_ == BlockState::Free || state_ == BlockState::Unmapped; }
  // Allocated or AwaitingEvents: in active_, its pages live.
  bool is_live() const { return !is_reusable(); }
};

struct CAddrOrder {
  bool operator()(const CBlock& a, const CBlock& b) const { return a.ptr < b.ptr; }
  bool operator()(const CBlock& a, DevicePtr b) const { return a.ptr < b; }
  bool operator()(DevicePtr a, const CBlock& b) const { return a < b.ptr; }
};
using CFreeSet = cbi::set<CBlock, cbi::compare<SizeOrder>, cbi::constant_time_size<true>>;
using CUnmappedSet = cbi::set<CBlock, cbi::compare<CAddrOrder>, cbi::constant_time_size<true>>;

// policy:cachet. The shell (shell/shell.h) holds the device, config, stats, cap, stream check,
// event pool and trace; this class holds the cachet rules over them.
class CachetPolicy : public Shell {
 public:
  CachetPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config);
  ~CachetPolicy();
  CachetPolicy(const CachetPolicy&) = delete;
  CachetPolicy& operator=(const CachetPolicy&) = delete;

  DevicePtr malloc(Bytes orig_size, StreamId stream);
  void free(DevicePtr ptr);
  void record_stream(DevicePtr ptr, StreamId stream);
  void empty_cache();
  // Private pools (R10-R12; policy_cachet/pools.cpp): PyTorch's members and refusals (§14.2,
  // §14.4 of docs/pytorch-allocator.md). `takes`: which streams' allocations go to the pool;
  // `capture` is not used (R12: no page is unmapped while any pool is active).
  void create_or_incref_pool(PoolId id);
  void begin_allocate_to_pool(PoolId id, const PoolFilter& takes, bool capture);
  void end_allocate_to_pool(PoolId id);
  void release_pool(PoolId id);
  void empty_cache(PoolId id);
  int pool_use_count(PoolId id) const;
  bool has_pool(PoolId id) const { return pools_.find(id) != pools_.end(); }
  std::vector<DevicePtr> deferred_frees() const;  // R12's deferred_, in the order they were freed
  // PyTorch's CUDAAllocator calls beyond the pools (§15; policy_cachet/torch_api.cpp).
  void create_or_incref_pool(PoolId id, std::shared_ptr<SegmentSource> source);
  void set_use_on_oom(PoolId id, bool on);
  void set_no_split(PoolId id);
  Bytes largest_cached_block() const;
  DevicePtr base_allocation(DevicePtr ptr, Bytes* size) const;
  std::shared_ptr<const PoolCheckpoint> checkpoint_pool(PoolId id);
  CheckpointDelta restore_pool(const PoolCheckpoint& cp, const std::vector<DevicePtr>& stale_live);
  bool pool_live_allocations_are(PoolId id, const std::vector<DevicePtr>& expected) const;
  void set_memory_fraction(double fraction);
  Snapshot snapshot();
  Snapshot block_table() const;  // snapshot() without its trace event
  std::uint64_t snapshot_digest() const;  // digest(snapshot()), walking the blocks; no trace event
  void apply_config(const Config& c);
  std::vector<std::string> invariants() const;
  // Sleep and wake (docs/sleep-wake.md; policy_cachet/sleep.cpp).
  Bytes sleep(const TagList& tags, const TagList& backup_tags);
  void wake(const TagList& tags);
  TagList sleeping() const;
  // The pinned bytes a sleep of every tag would need now, per tag of `backup_tags` (its
  // allocated blocks not asleep already).
  std::map<std::uint32_t, Bytes> backup_need(const TagList& backup_tags) const;

 private:
  // sleep.cpp: a backup copy of a run of adjacent live blocks, and the sleep's own state.
  struct BackupCopy {
    DevicePtr ptr;
    Bytes size;
    unsigned char* host;
  };
  void free_while_asleep(CBlock* b);
  void release_sleeping_free_pages();  // R9 for sleeping pages with no live block (empty_cache)
  void free_unused_backup_buffers();   // the pinned buffers no backup copy lies in any more
  void forget_sleeping_pages(DevicePtr lo, DevicePtr hi);  // [lo, hi) is no longer asleep
  // A sleeping page (docs/sleep-wake.md section 3): the tag of the live blocks touching it when it
  // went to sleep (none: it held no live block; it then wakes with any wake), and whether that
  // tag was backed up. Kept until it wakes or empty_cache gives it back.
  struct SleepingPage {
    std::uint32_t tag = 0;
    bool has_tag = false;
    bool backed_up = false;
  };
  Bytes sleeping_bytes_ = 0;               // bytes of sleeping pages (mapped_ excludes them)
  std::vector<BackupCopy> backups_;        // every backup copy of the sleeping blocks
  std::map<void*, Bytes> backup_buffers_;  // pinned buffers (one per backed-up tag per sleep)
  std::map<std::size_t, SleepingPage> sleeping_pages_;  // by page index from base_
  int sleeping_runs() const;               // runs of adjacent sleeping blocks (recount)
  // The index of the page holding `p`, from the reservation's base.
  std::size_t page_index(DevicePtr p) const { return static_cast<std::size_t>((p - base_) / kCachetPageSize); }
  // SLEEP-R1 (docs/sleep-wake.md section 2): [lo, hi), which lies in free or unmapped blocks, may
  // take a block of `tag`: no live block of another tag touches its pages. Only its first and
  // last pages can be touched (by the live blocks beside it), and those are a live block's end
  // pages, whose tag page_tag_ keeps. Always true while no thread ever set a tag.
  bool tag_fits(DevicePtr lo, DevicePtr hi, std::uint32_t tag) const {
    if (!tags_seen()) [[likely]]
      return true;
    const std::size_t first = page_index(lo), last = page_index(hi - 1);
    return (page_live_[first] == 0 || page_tag_[first] == tag) && (page_live_[last] == 0 || page_tag_[last] == tag);
  }
  struct CPool {
    int use_count = 1;  // users (§14.4); 0: released, kept while it has live blocks (R11)
    Bytes bytes = 0;    // the sizes of the blocks carrying its id ([INV-PRIV-4])
    CFreeSet free;      // its mapped free blocks, in (stream, size, address) order
  };
  struct ActivePool {
    PoolId id;
    PoolFilter takes;
  };
  struct Placement {
    DevicePtr at = 0;  // the new block's address
    Bytes new_pages = 0;
    bool found = false;
  };

  void ensure_reserved();
  CBlock* alloc_slow(StreamId stream, PoolId pool, Bytes size);
  // R2: the best fit among the mapped free blocks of `stream` and `pool`, carved; nullptr when
  // none holds `size`.
  CBlock* take_best_fit(StreamId stream, PoolId pool, Bytes size);
  // pools.cpp: R10's routing and free sets, R11's release, R12's trim and deferred events.
  PoolId route(StreamId stream) const;
  CFreeSet& free_set(PoolId pool) { return pool.is_default() ? free_ : pools_.at(pool).free; }
  CFreeSet& free_set_of(const CBlock* b) { return free_set(b->pool); }
  bool pool_active() const { return !active_pools_.empty(); }
  bool live_pool(PoolId id) const;
  void leave_released_pool(CBlock* b);  // b free, not in a set
  void trim_to_budget();
  void record_deferred_events();
  // R7: while mapped bytes are above the cap, unmap whole free pages down to it (R6 order).
  void trim_to_cap();
  Placement find_placement(StreamId stream, PoolId pool, Bytes size) const;
  // Unmaps up to `pages` whole free pages outside [ex_lo, ex_hi); returns how many it unmapped.
  Bytes unmap_free_pages(Bytes pages, DevicePtr ex_lo, DevicePtr ex_hi);
  // R6 in two steps: collect the whole free pages of every mapped free block outside
  // [ex_lo, ex_hi) into cands_ (returns their count), then unmap `pages` of them in R6's order.
  Bytes collect_free_pages(DevicePtr ex_lo, DevicePtr ex_hi);
  Bytes unmap_collected(Bytes pages);
  Bytes whole_free_pages(DevicePtr ex_lo, DevicePtr ex_hi) const;
  void unmap_range(CBlock* b, DevicePtr lo, DevicePtr hi);  // b mapped free, not in free_
  // Maps [lo, hi) of unmapped u as a free block of `stream`, merged with its neighbours (*merged).
  Status map_range(CBlock* u, DevicePtr lo, DevicePtr hi, StreamId stream, PoolId pool,
                   CBlock** merged);
  CBlock* carve(CBlock* f, DevicePtr at, Bytes size);  // f mapped free, not in free_
  CBlock* merge_free(CBlock* b);  // b free, not in a set: merges neighbours, inserts
  void free_block(CBlock* b);
  void process_events();
  void synchronize_events();
  [[noreturn]] void throw_oom(Bytes size);
  CBlock* find_active(DevicePtr ptr, const char* op) const;
  std::optional<BlockAt> holder_of(DevicePtr ptr) const;  // for find_active's diagnostics
  // The change in the runs of mapped pages (the `segment` stat) when [lo, hi) is mapped or
  // unmapped, given whether the pages on its left and right are mapped.
  static int run_delta(bool left_mapped, bool right_mapped, bool mapping);
  Bytes touched_bytes() const;  // recount from the blocks, for invariants()
  // Adds (live) or removes b's pages from the live-page counts.
  void touch(const CBlock* b, bool live);  // inline, below the class
  // Pages of [lo, hi) that no live block touches yet.
  Bytes untouched_pages(DevicePtr lo, DevicePtr hi) const;
  CBlock* make_block(BlockState born = BlockState::Free);
  // Splits f at `at` (f->ptr < at < f->end()): f keeps [ptr, at); the returned new block holds
  // [at, end), free, with f's stream and mapping. Neither goes into a tree here.
  CBlock* split_at(CBlock* f, DevicePtr at);
  void release_block(CBlock* b);

  DevicePtr base_ = 0;
  Bytes va_size_ = 0;
  Bytes mapped_ = 0;
  // Per page of the reservation: how many live (allocated or pending) blocks touch it.
  std::vector<std::uint32_t> page_live_;
  // Per page: the tag of the live blocks touching it where page_live_ counts them (SLEEP-R1: one
  // tag per page), written from the first allocation under another tag than "default" on.
  std::vector<std::uint32_t> page_tag_;
  std::uint32_t placing_tag_ = 0;  // the tag of the allocation being placed (malloc)
  Bytes touched_pages_ = 0;  // pages with page_live_ > 0
  Bytes peak_touched_pages_ =
      0;  // high-water mark of touched_pages_ ([INV-BUDGET-1]; not reset by reset_peak_stats)
  CBlock* head_ = nullptr;
  CFreeSet free_;
  CUnmappedSet unmapped_;
  PtrMap<CBlock> active_;
  std::vector<std::pair<EventHandle, CBlock*>> events_;
  std::map<PoolId, CPool> pools_;          // known private pools (R11)
  std::vector<ActivePool> active_pools_;   // newest last (§14.2)
  std::vector<CBlock*> deferred_;          // R12, in the order they were freed
  // Blocks live in chunks of kChunk (locality for the trees' walks); released ones in spare_.
  static constexpr std::size_t kChunk = 256;
  std::vector<std::unique_ptr<CBlock[]>> storage_;
  std::vector<CBlock*> spare_;
  // Scratch for R6: a mapped free block and the whole free pages [lo, hi) it may give back.
  struct FreeRun {
    CBlock* b;
    DevicePtr lo, hi;
  };
  std::vector<FreeRun> cands_;
};

inline void CachetPolicy::touch(const CBlock* b, bool live) {
  const std::size_t first = (b->ptr - base_) / kCachetPageSize;
  const std::size_t last = (b->end() - 1 - base_) / kCachetPageSize;
  const bool tagged = live && tags_seen();
  auto end_page = [this, live, tagged, b](std::size_t i) {
    if (tagged) page_tag_[i] = b->tag;
    if (live) {
      if (page_live_[i]++ == 0) ++touched_pages_;
    } else {
      if (--page_live_[i] == 0) --touched_pages_;
    }
  };
  end_page(first);
  if (last != first) {
    end_page(last);
    const Bytes interior = last - first - 1;
    if (live)
      touched_pages_ += interior;
    else
      touched_pages_ -= interior;
  }
}

// Page arithmetic of the policy's source files (policy_cachet/*.cpp), and all_and for the recount of
// check.cpp (the stats themselves change only through Accounting, shell/accounting.h).
namespace cachet_pages {
inline constexpr Bytes kPage = kCachetPageSize;

inline constexpr Bytes align_up(Bytes n, Bytes a) {
  return (n + a - 1) / a * a;
}
inline constexpr DevicePtr page_floor(DevicePtr p) {
  return p / kPage * kPage;
}
inline constexpr DevicePtr page_ceil(DevicePtr p) {
  return align_up(p, kPage);
}

inline StatType pool_of(Bytes size) {
  return size <= kSmallSize ? StatType::SmallPool : StatType::LargePool;
}

template <class F>
void all_and(StatArray& a, StatType pool, F&& f) {
  DeviceStats::for_all_and(a, pool, std::forward<F>(f));
}

inline bool mapped_block(const CBlock* b) {
  return b != nullptr && b->is_mapped();
}

// [INV-BUDGET-1] The pages the policy may keep mapped, given the high-water mark of pages touched by live
// blocks: that mark plus 1/kCachetSlackDivisor of it (rounded down), so that a training step
// that moves a few pages finds them still mapped in the next step.
inline Bytes budget_pages(Bytes peak_touched) {
  return peak_touched + peak_touched / kCachetSlackDivisor;
}
}  // namespace cachet_pages

}  // namespace cachet::gpu::detail
