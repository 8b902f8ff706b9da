// cachet/model/cachet_policy.h: the `cachet` policy (policy:cachet, issue 9) as a model.
//
// The rules R1-R12 and the promises are written in gpu/include/cachet/gpu/policy_cachet.h;
// this is an independent implementation of the same text with plain structures, so that the
// production policy (gpu/src/policy_cachet/) can be checked against it in lockstep
// (tests/policy_cachet_model). Nothing here is fast: every decision is a linear scan over all
// blocks, and the mapped pages are a set of page indices that is recounted when asked.
//
// State:
//   blocks_        every block of the reservation, by address; they tile [base_, base_ + size).
//                  Each is in one BlockState (cachet/model/block.h, the same four states and
//                  transitions as model::Allocator's): Allocated or AwaitingEvents ("live"),
//                  Free (mapped, of one stream) or Unmapped (page aligned, no stream).
//                  Transitions: created Unmapped (the reservation, R1); Free -> Allocated
//                  (malloc, R2/R5); Allocated -> Free or -> AwaitingEvents (free, R8);
//                  AwaitingEvents -> Free (events completed, R8); Free -> Unmapped (R6, R7,
//                  R9); Unmapped -> Free (R5). carve() splits a Free or Unmapped block into
//                  pieces in its state; merge() joins Free (same stream) or Unmapped
//                  neighbours. Block::set_state checks each change ([INV-STATE-1]).
//   mapped_pages_  the indices of the mapped 2 MiB pages (the record of map/unmap calls).
//   events_        per pending block, the (stream, sequence) of each event recorded at free().
//   pools_         the known private pools (R10, R11): use count and byte count; every block
//                  carries its pool (PoolId{} = the default pool; unmapped blocks too).
//   active_        the active pools, newest last (begin_allocate_to_pool, §14.2).
//   deferred_      blocks freed with stream uses while a pool was active (state Deferred, R12),
//                  in the order they were freed; their events are recorded once no pool is.
//
// § numbers refer to docs/pytorch-allocator.md.
//
// The same public surface as model::Allocator where it applies. Bad input throws UsageError;
// running out of memory throws OutOfMemory after counting num_ooms.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/model/block.h"
#include "cachet/model/segment_source.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/tags.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::model {

// The policy's constants (the header's kCachet*; repeated here: model/ never includes gpu/).
inline constexpr Bytes kCachetPage = 2 * MiB;    // mapping granularity
inline constexpr Bytes kCachetBlockAlign = 512;  // block sizes and addresses (R1)
inline constexpr Bytes kCachetSlack = 64;        // budget(T) = T + floor(T / 64) (R4)
inline constexpr Bytes kCachetReserveTimes = 2;  // reservation = 2 x total memory (R1)

class CachetPolicy {
 public:
  CachetPolicy(const Config& config, SegmentSource& source, DeviceIndex device = 0);
  CachetPolicy(const CachetPolicy&) = delete;
  CachetPolicy& operator=(const CachetPolicy&) = delete;

  // allocate(n, s): 0 for n == 0; OutOfMemory for n >= 1 EiB (no state change) or per R7.
  // `thread`: the allocating thread of the op list (R10 routes a use_mem_pool's thread only).
  std::uint64_t malloc(Bytes size, StreamId stream = 0, ThreadIndex thread = 0);
  void free(std::uint64_t ptr);
  void record_stream(std::uint64_t ptr, StreamId stream);
  // Every event recorded so far on `stream` (all streams) has completed; the blocks they hold
  // become free at the next malloc (R8) or at a synchronizing call (R7, R9).
  void complete_events(StreamId stream);
  void complete_all_events();
  // Every event completes as soon as it is recorded (a real device running no kernels; see
  // model::Allocator::set_events_complete_when_recorded): deferred frees whose events are
  // recorded at a malloc's process_events are free in that same malloc.
  void set_events_complete_when_recorded(bool on) { events_when_recorded_ = on; }
  void empty_cache();
  // Private pools (R10-R12), the members and refusals of model::Allocator (§14.2, §14.4).
  void create_or_incref_pool(PoolId id);
  void begin_allocate_to_pool(PoolId id, PoolRoute route);
  void end_allocate_to_pool(PoolId id);
  void release_pool(PoolId id);
  // The default id: empty_cache(); a pool with a user: nothing; else empty_cache() (R11).
  void empty_cache(PoolId id);
  int pool_use_count(PoolId id) const;
  bool has_pool(PoolId id) const { return pools_.contains(id); }
  bool capture_underway() const { return !active_.empty(); }
  void set_memory_fraction(double fraction);
  double memory_fraction() const;

  const DeviceStats& stats() const { return stats_; }
  // Runs of mapped pages, each one expandable "large" segment with its blocks in address order.
  Snapshot snapshot() const;
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const Config& config() const { return config_; }
  std::uint64_t reservation_base() const { return base_; }
  Bytes mapped_bytes() const { return mapped_pages_.size() * kCachetPage; }
  // The high-water mark of pages touched by live blocks (T of R4 after the last allocation).
  Bytes peak_touched_pages() const { return peak_touched_; }

  // Throws std::logic_error naming the first broken rule or promise.
  void check_invariants() const;

  // Sleep and wake (issue 24; docs/sleep-wake.md), the 2 MiB page as the unit:
  // cachet_policy_sleep.cpp. The same calls as model::Allocator's.
  // sleep: every awake mapped page touched by a live block of a tag in `tags` (every tag when
  // empty), and every awake mapped page touched by none, gives its memory back (the source's
  // unmap, one call per run of such pages) and stays mapped in the stats (reserved_bytes,
  // segment); the live blocks of tags in `backup_tags` are backed up. Returns the bytes given
  // back. UsageError, nothing changed: a pool active (a capture or use_mem_pool under way).
  Bytes sleep(const TagList& tags, const TagList& backup_tags);
  // wake: every sleeping page of a tag in `tags` (every tag when empty), and every sleeping page
  // no live block touched at its sleep, maps memory again (the source's map, one call per run).
  // OutOfMemory when the source or the cap refuses any of it: everything stays asleep.
  void wake(const TagList& tags);
  // The tags with sleeping pages, sorted.
  TagList sleeping() const;
  const SleepStats& sleep_stats() const { return sleep_stats_; }

  struct Block {
    // Created Unmapped (the reservation) or as a copy of a Free or Unmapped block (carve).
    explicit Block(BlockState born = BlockState::Unmapped) : state_(born) {
      check_born_or_deleted(born, "created", 0);
    }
    std::uint64_t ptr = 0;
    Bytes size = 0;
    StreamId stream = 0;      // allocation stream; the owning stream of a Free block
    PoolId pool;              // R10: its pool; PoolId{} = the default pool (Unmapped: always)
    Bytes requested = 0;      // live blocks: the caller's size
    std::set<StreamId> uses;  // record_stream() since allocation: Allocated only
    Tag tag{kDefaultTag};     // live blocks: the allocating thread's current tag (docs/sleep-wake.md)
    std::uint64_t end() const { return ptr + size; }
    BlockState state() const { return state_; }
    // The one writer of the state: throws std::logic_error on an illegal transition.
    void set_state(BlockState to) {
      check_transition(state_, to, ptr);
      state_ = to;
    }
    bool live() const {
      return state_ == BlockState::Allocated || state_ == BlockState::AwaitingEvents ||
             state_ == BlockState::Deferred;
    }
    bool mapped() const { return state_ != BlockState::Unmapped; }
    bool mapped_free() const { return state_ == BlockState::Free; }
    bool unmapped() const { return state_ == BlockState::Unmapped; }

   private:
    BlockState state_;
  };

 private:
  struct Pool {
    int use_count = 1;  // users (§14.4); 0: released, kept while it has live blocks
    Bytes bytes = 0;    // the sizes of the blocks carrying its id ([INV-PRIV-4])
  };
  struct Placement {
    std::uint64_t at = 0;
    Bytes new_pages = 0;
  };

  // cachet_policy_place.cpp: R2, R3, R5 and the carving of blocks.
  std::optional<std::uint64_t> best_fit(StreamId stream, PoolId pool, Bytes size) const;
  // R2 applied: the best fit carved at its high end (small) or low end (large); nullopt: none.
  std::optional<std::uint64_t> take_best_fit(StreamId stream, PoolId pool, Bytes size);
  std::optional<Placement> find_window(StreamId stream, PoolId pool, Bytes size) const;
  std::uint64_t allocate_slow(StreamId stream, PoolId pool, Bytes size);
  std::optional<std::uint64_t> try_place(StreamId stream, PoolId pool, Bytes size);  // nullopt: R7 failure
  Block& carve(std::uint64_t free_ptr, std::uint64_t at, Bytes size);
  std::uint64_t merge(std::uint64_t ptr);
  Block* block_before(std::uint64_t ptr);
  Block* block_after(std::uint64_t ptr);
  const Block* block_before(std::uint64_t ptr) const;
  const Block* block_after(std::uint64_t ptr) const;
  // cachet_policy_pages.cpp: pages, the budget (R4), map and unmap (R5, R6).
  void ensure_reserved();
  // Pages touched by live blocks or by [lo, hi) (R4's touched, counting a new block).
  Bytes touched_pages(std::uint64_t lo = 0, std::uint64_t hi = 0) const;
  std::uint64_t page_of(std::uint64_t addr) const { return (addr - base_) / kCachetPage; }
  std::uint64_t page_addr(std::uint64_t page) const { return base_ + page * kCachetPage; }
  std::vector<std::uint64_t> whole_free_pages(const Block& b, std::uint64_t ex_lo,
                                              std::uint64_t ex_hi) const;
  Bytes count_whole_free_pages(std::uint64_t ex_lo, std::uint64_t ex_hi) const;
  void unmap_whole_free_pages(Bytes pages, std::uint64_t ex_lo, std::uint64_t ex_hi);
  // R7: while mapped bytes are above the cap, unmap whole free pages (R6 order) down to it.
  void trim_to_cap();
  bool map_pages(std::uint64_t lo, std::uint64_t hi, StreamId stream, PoolId pool);
  std::int64_t mapped_runs() const;
  void apply_run_change(std::int64_t before);
  // cachet_policy_pools.cpp: routing, use counts, release (R10, R11), deferral (R12).
  PoolId route(StreamId stream, ThreadIndex thread) const;
  bool pool_active() const { return !active_.empty(); }
  bool live_pool(PoolId id) const;
  // R11: a block of a released pool joins the default pool (the pool is forgotten with its last).
  void leave_released_pool(Block& b);
  // R12: when the last active pool ends, unmap whole free pages down to budget(T) and the cap.
  void trim_to_budget();
  // R12: the deferred frees get their events (no pool active).
  void record_deferred_events();
  void record_event(std::uint64_t ptr, StreamId s);
  // cachet_policy_free.cpp: free, events, empty_cache (R8, R9).
  void free_completed(Block& b);
  void process_events();
  void synchronize_events();
  Block& live_block(std::uint64_t ptr, const char* op);
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) {
    trace_.push_back(TraceEvent{a, addr, size, stream, 0});
  }
  // cachet_policy_sleep.cpp (docs/sleep-wake.md). A sleeping page stays in mapped_pages_ (it is
  // reserved, in reserved_bytes and in the runs `segment` counts) and is also in sleeping_pages_:
  // no device memory behind it. Its blocks keep their states; no search takes its free blocks,
  // none merges with an awake block, R6 does not unmap it, and R4/R7 count only awake pages.
  struct SleepingPage {
    Tag tag;                 // the tag of the live blocks touching it at its sleep; "" for none
    bool backed_up = false;  // tag in sleep's backup_tags
  };
  bool asleep(const Block& b) const {
    return !sleeping_pages_.empty() && sleeping_pages_.count(page_of(b.ptr)) != 0;
  }
  Bytes awake_pages() const { return mapped_pages_.size() - sleeping_pages_.size(); }
  // SLEEP-R1, SLEEP-R2: [lo, hi) may take a block of the current tag: none of its pages sleeps or
  // is touched by a live block of another tag.
  bool placeable(std::uint64_t lo, std::uint64_t hi) const;
  // Carves free blocks so that none spans an awake and a sleeping page.
  void split_at_sleep_edges();
  std::int64_t sleeping_runs() const;
  void apply_sleeping_run_change(std::int64_t before);
  // free() of a block on a sleeping page: no event, free at once, found again at its wake.
  void free_while_asleep(Block& b);
  // empty_cache (R9): the sleeping pages of the default pool that no live block touches go back
  // entirely (reserved_bytes, segment, num_device_free and the trace as for R6's unmapping).
  void release_sleeping_free_pages();
  std::map<std::uint64_t, SleepingPage> sleeping_pages_;  // by page index
  SleepStats sleep_stats_;
  bool tags_seen_ = false;  // malloc was ever called under a tag other than "default"

  Config config_;
  SegmentSource& source_;
  DeviceIndex device_;
  DeviceStats stats_;
  std::optional<Bytes> allowed_max_;
  std::uint64_t base_ = 0;
  Bytes reservation_size_ = 0;
  std::map<std::uint64_t, Block> blocks_;
  std::set<std::uint64_t> mapped_pages_;
  Bytes peak_touched_ = 0;
  // Simulated events: per stream, events recorded so far and events completed so far.
  std::map<StreamId, std::uint64_t> recorded_;
  std::map<StreamId, std::uint64_t> completed_;
  bool events_when_recorded_ = false;
  std::map<std::uint64_t, std::vector<std::pair<StreamId, std::uint64_t>>> events_;  // by block
  std::vector<TraceEvent> trace_;
  std::map<PoolId, Pool> pools_;
  std::vector<std::pair<PoolId, PoolRoute>> active_;
  std::vector<std::uint64_t> deferred_;
};

}  // namespace cachet::model
