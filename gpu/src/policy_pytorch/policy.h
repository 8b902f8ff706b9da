// policy:pytorch (PytorchPolicy): blocks, segments, pools and the per-device state, with PyTorch 2.11's
// rules (docs/pytorch-allocator.md §1-3, §5-7, §13, §14) on fast structures. No locking here: every member
// function of PytorchPolicy runs with the API layer's mutex held (style note 11).
//
// Glossary (cachet/types.h): a Segment is one device allocation (cudaMalloc) or one VA
// reservation of an expandable segment; its Blocks tile it exactly, in address order, linked
// by prev/next. Each Block is in one BlockState (shell/block_state.h): a Free Block sits in its
// pool's size-ordered set (stream, size, address); an Unmapped Block of an expandable segment in
// its pool's address-ordered `unmapped` set; an Allocated, AwaitingEvents or Deferred Block in
// `active_` (address -> Block). A segment belongs to one BlockPool, the default small or large
// pool or a half of a private pool (§14.1), and all its blocks with it ([INV-SEG-3]).
//
// Invariants: PytorchPolicy::invariants() (policy_pytorch/invariants.cpp) checks the rules of
// docs/invariants.md whose policy is pytorch or both; each violation line starts with its ID.
#pragma once

#include <boost/container/small_vector.hpp>
#include <boost/intrusive/set.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/backend.h"
#include "cachet/rule_flip.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "policy_pytorch/freeable_order.h"
#include "ptr_map.h"
#include "shell/block_state.h"
#include "shell/shell.h"
#include "size_order.h"

namespace cachet::gpu::detail {

namespace bi = boost::intrusive;

struct Segment;

struct Block : bi::set_base_hook<bi::link_mode<bi::normal_link>> {
  // Born Free (a new segment, a split, the mapped pieces of an unmap) or Unmapped (a new
  // reservation, the unmapped rest of a map): shell/block_state.h.
  explicit Block(BlockState born = BlockState::Free) : state_(born) { check_born_or_gone("born", born, 0); }

  DevicePtr ptr = 0;
  Bytes size = 0;
  Bytes requested_size = 0;  // stale on free blocks; follows the block object (§13.1)
  StreamId stream = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* segment = nullptr;
  std::int64_t gc_count_base = 0;
  std::int32_t event_count = 0;  // outstanding stream-use events: AwaitingEvents only
  std::uint32_t tag = 0;  // the tag id (Shell::tag_name) it was allocated under; meaningful while active

 private:
  BlockState state_;

 public:
  bool is_small = false;
  boost::container::small_vector<StreamId, 2> stream_uses;  // Allocated and Deferred only
  // The stream uses recorded while a capture was under way (PyTorch's
  // block_to_cudagraph_stream_uses, §14.7): they need no event once the captures are over.
  // Follows the block object (a merge keeps the freed block's), cleared when its deferred free
  // is processed.
  std::vector<StreamId> capture_stream_uses;

  BlockState state() const { return state_; }
  // The one writer of the state; aborts on a transition shell/block_state.h does not allow.
  void set_state(BlockState to) {
    check_transition(state_, to, ptr);
    state_ = to;
  }
  bool is_allocated() const { return state_ == BlockState::Allocated; }
  bool is_free() const { return state_ == BlockState::Free; }
  bool is_mapped() const { return state_ != BlockState::Unmapped; }
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool expandable() const;
  // PyTorch's "allocatable": neither handed out nor waiting for events (Free or Unmapped), so it
  // may merge, be mapped, or be given back.
  bool is_reusable() const { return state_ == BlockState::Free || state_ == BlockState::Unmapped; }
  // Allocated, AwaitingEvents or Deferred: in active_, counted in the active stats.
  bool is_active() const { return !is_reusable(); }
};

struct BlockPool;

struct Segment {
  BlockPool* pool = nullptr;  // the pool all its blocks belong to (§14.1)
  DevicePtr base = 0;
  Bytes size = 0;  // cudaMalloc size, or the whole VA reservation of an expandable segment
  StreamId stream = 0;
  bool is_small = false;
  bool expandable = false;
  Block* head = nullptr;  // lowest-address block
  // expandable segments (§7)
  Bytes page_size = 0;
  std::vector<bool> page_mapped;
  // Sleep (docs/sleep-wake.md): the tag of its live blocks, or of its last live block (SLEEP-R1,
  // expandable segments too: one with no live block takes the tag of its next allocation); reserved
  // and mapped through the VMM calls instead of cudaMalloc (cachet_sleep:True); how many of its
  // runs sleep (PytorchPolicy::sleeping_).
  std::uint32_t tag = 0;
  bool vmm = false;
  int sleeping_runs = 0;
};

inline bool Block::expandable() const { return segment->expandable; }

// Size order (BlockComparatorSize, §2.1): SizeOrder and SizeKey, size_order.h.
// Address order (BlockComparatorAddress): stream, address.
struct AddrKey {
  StreamId stream;
  DevicePtr ptr;
};
struct AddrOrder {
  static bool less(StreamId as, DevicePtr ap, StreamId bs, DevicePtr bp) { return as != bs ? as < bs : ap < bp; }
  bool operator()(const Block& a, const Block& b) const { return less(a.stream, a.ptr, b.stream, b.ptr); }
  bool operator()(const Block& a, const AddrKey& b) const { return less(a.stream, a.ptr, b.stream, b.ptr); }
  bool operator()(const AddrKey& a, const Block& b) const { return less(a.stream, a.ptr, b.stream, b.ptr); }
};

using FreeSet = bi::set<Block, bi::compare<SizeOrder>, bi::constant_time_size<true>>;
using UnmappedSet = bi::set<Block, bi::compare<AddrOrder>, bi::constant_time_size<true>>;

struct PrivatePool;

struct BlockPool {
  explicit BlockPool(bool small, PrivatePool* owner_pool = nullptr) : is_small(small), owner(owner_pool) {}
  ~BlockPool() {
    blocks.clear();
    unmapped.clear();
  }
  FreeSet blocks;
  UnmappedSet unmapped;
  const bool is_small;
  PrivatePool* const owner;  // the private pool this is a half of; null: a default pool (§14.1)
  std::int64_t get_free_blocks_call_count = 0;  // GC age clock (§3.5, §13.3)

  void insert_into_blocks(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    insert_free(*b);
  }
  // The free set's insert and erase for the hot path, out of line and among the hot functions
  // (malloc.cpp): one copy each, on the pages that allocate and free run from.
  void insert_free(Block& b);
  void erase_free(Block& b);
};

// A private pool (§14.1): a small and a large BlockPool of its own, named by a PoolId.
struct PrivatePool {
  explicit PrivatePool(PoolId pool_id) : id(pool_id) {}
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;
  PoolId id;
  int use_count = 1;  // its users (§14.4); freeable at 0 [INV-PRIV-1]
  // PyTorch's cudaMalloc_count (§14.5): +1 per cudaMalloc or expandable growth into the pool, -1
  // per release_block or unmap_block. Without expandable segments it equals `segments`
  // [INV-PRIV-2].
  int device_allocs = 0;
  int segments = 0;  // Segment objects (cudaMalloc segments and reservations) of this pool
  bool had_expandable = false;  // it ever reserved an expandable segment: [INV-PRIV-2] no longer holds
  bool orphaned = false;  // erased by PyTorch with blocks still in it (private_pool.cpp forget_pool)
  // A MemPool's own allocator (§15.1): its segments come from it and go back to it; expandable
  // segments never apply to this pool. Null: cudaMalloc, as every other pool.
  std::shared_ptr<SegmentSource> source;
  BlockPool large{false, this};
  BlockPool small{true, this};
};

// Block objects are pooled: a free list over chunks, so the hot path never calls new. The list
// is intrusive (a released block's storage holds the next free one), so make and release are a
// few instructions with no growth path (malloc.cpp, "The hot path's layout"); last released,
// first made.

class BlockArena {
 public:
  BlockArena() = default;
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;
  Block* make(BlockState born = BlockState::Free) {
    if (free_ == nullptr) [[unlikely]]
      refill();
    FreeSlot* slot = free_;
    free_ = slot->next;
    slot->~FreeSlot();
    return new (static_cast<void*>(slot)) Block(born);  // members have initializers; no zeroing of padding
  }
  // A block leaves (merged into a neighbour, or given back) only Free or Unmapped.
  void release(Block* b) {
    check_born_or_gone("removed", b->state(), b->ptr);
    discard(b);
  }
  // Teardown only (~PytorchPolicy): any state.
  void discard(Block* b) {
    b->~Block();
    free_ = new (static_cast<void*>(b)) FreeSlot{free_};
  }

 private:
  struct FreeSlot {
    FreeSlot* next;
  };
  struct alignas(Block) Storage {
    unsigned char bytes[sizeof(Block)];
  };
  static_assert(sizeof(Storage) >= sizeof(FreeSlot) && alignof(Storage) >= alignof(FreeSlot));
  [[gnu::noinline]] void refill() {
    constexpr std::size_t n = 256;
    chunks_.push_back(std::make_unique_for_overwrite<Storage[]>(n));  // no zeroing: blocks are built in place
    for (std::size_t i = n; i-- > 0;) free_ = new (static_cast<void*>(&chunks_.back()[i])) FreeSlot{free_};
  }
  std::vector<std::unique_ptr<Storage[]>> chunks_;
  FreeSlot* free_ = nullptr;
};

// policy:pytorch. The shell (shell/shell.h) holds the device, config, stats, cap, stream check,
// event pool and trace; this class holds PyTorch's rules over them.
class PytorchPolicy : public Shell {
 public:
  PytorchPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config);
  ~PytorchPolicy();

  DevicePtr malloc(Bytes orig_size, StreamId stream);
  void free(DevicePtr ptr);
  void record_stream(DevicePtr ptr, StreamId stream);
  void empty_cache();
  // Private pools (§14; private_pool.cpp).
  void empty_cache(PoolId id);
  void create_or_incref_pool(PoolId id);
  void begin_allocate_to_pool(PoolId id, const PoolFilter& filter, bool capture);
  void end_allocate_to_pool(PoolId id);
  void release_pool(PoolId id);
  int pool_use_count(PoolId id) const;
  bool has_pool(PoolId id) const { return graph_pools_.find(id) != graph_pools_.end(); }
  // The frees a capture deferred (§14.7), pending, in the order the next batch takes them; and
  // that order set from a replay's recording (§14.10.3; CachingAllocator::set_deferred_free_order).
  std::vector<DevicePtr> deferred_frees() const;
  void set_deferred_free_order(const std::vector<DevicePtr>& order);
  // The streams with pending events (§6), in the order the next process_events walks them, each
  // with its events' blocks in FIFO order; and the order of streams set from a replay's recording
  // (PyTorch: its cuda_events hash map's order, §14.10.3; CachingAllocator::set_event_stream_order).
  std::vector<std::pair<StreamId, std::vector<DevicePtr>>> event_queues() const;
  void set_event_stream_order(const std::vector<StreamId>& order);
  // PyTorch's CUDAAllocator calls beyond the pools (§15; torch_api.cpp, checkpoint.cpp).
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
  // Every mapped run, also an orphaned pool's runs that begin with a free block, which
  // snapshot() cannot show (§14.8); no trace event.
  Snapshot block_table() const;
  std::uint64_t snapshot_digest() const;  // digest(snapshot()), built from the segments; no trace event
  void apply_config(const Config& c);  // runtime configure (§4.1)
  std::vector<std::string> invariants() const;
  Bytes round_size(Bytes size) const;
  Bytes allocation_size(Bytes rounded) const;
  // §1.3: the small pool takes rounded sizes up to 1 MiB. (Inline, with is_oversize: on the hot
  // path; in the production build flipped() is a constant false.)
  bool is_small_size(Bytes rounded) const {
    return flipped(RuleFlip::SmallBelow1MiB) ? rounded < kSmallSize : rounded <= kSmallSize;  // rule flip
  }

 private:
  // UsageError (changing nothing) when `c` turns on expandable segments and this device cannot
  // serve them: a backend without address-space reservation, or 0 bytes of device memory (§7).
  void check_expandable_usable(const Config& c) const;
  struct AllocParams {
    StreamId stream;
    Bytes size;        // rounded
    Bytes alloc_size;  // segment size for a new device allocation
    BlockPool* pool;
    Block* block = nullptr;
    bool in_pool = false;  // block is still in pool->blocks (found by get_free_block)
    // PyTorch's is_expandable_segments_active: expandable_segments, and the pool has no source
    // of its own (§15.1); false in the use_on_oom fallback's search (§15.2).
    bool expandable_active = false;
    std::uint32_t tag = 0;  // the allocating thread's tag (Shell::current_tag_id)
  };

  // --- free-block search and growth (§2.2, §3.1-3.5) ---
  // PyTorch's get_free_block: the GC clock's tick, then find_free_block, which skips the
  // candidates in segments whose live blocks carry another tag (docs/sleep-wake.md section 2).
  bool get_free_block(AllocParams& p);
  bool find_free_block(AllocParams& p);
  // `b`'s segment holds live blocks of a tag other than `tag` (an expandable segment too: one with
  // no live block may be taken by any tag, SLEEP-R1).
  static bool foreign(const Block& b, std::uint32_t tag);
  // A block p's search may not take: foreign to p's tag, once any thread set a tag.
  bool taboo(const Block& b, const AllocParams& p) const { return tags_seen() && foreign(b, p.tag); }
  // From `it` on: the first block of p's stream not in such a segment (`it` itself when no
  // thread ever set a tag).
  FreeSet::iterator skip_foreign(BlockPool& pool, FreeSet::iterator it, const AllocParams& p) const {
    if (!tags_seen()) [[likely]]
      return it;
    return skip_foreign_slow(pool, it, p);
  }
  [[gnu::noinline]] FreeSet::iterator skip_foreign_slow(BlockPool& pool, FreeSet::iterator it,
                                                         const AllocParams& p) const;
  bool alloc_block(AllocParams& p, bool is_retry);
  // malloc's rare cases, out of line (malloc.cpp, "The hot path's layout").
  [[gnu::noinline]] bool grow_or_release(AllocParams& p);
  [[gnu::cold, gnu::noinline]] DevicePtr malloc_uncached(Bytes orig_size);
  bool release_available_cached_blocks(const AllocParams& p);
  void release_cached_blocks(PoolId id = PoolId{});
  void release_blocks(BlockPool& pool);
  void release_block(Block* b);
  void garbage_collect_cached_blocks();
  bool should_split(const Block* b, Bytes size, bool expandable_active) const;
  bool try_mempool_fallback(AllocParams& p);  // §15.2 (private_pool.cpp)
  // The pool is a half of a private pool marked no_split (§15.2).
  bool no_split(const BlockPool& pool) const {
    return !no_split_pools_.empty() && pool.owner != nullptr &&
           std::find(no_split_pools_.begin(), no_split_pools_.end(), pool.owner->id) != no_split_pools_.end();
  }
  // oversize_allocations / oversize_segments count sizes of max_split_size or more (§5.3).
  bool is_oversize(Bytes size) const {
    return flipped(RuleFlip::OversizeAboveMaxSplit) ? size > config_.max_split_size : size >= config_.max_split_size;
  }
  Block* alloc_found_block(AllocParams& p, Bytes orig_size, bool split);
  [[noreturn]] void throw_oom(const AllocParams& p);

  // --- free and events (§2.5, §6) ---
  // free()'s rare cases, out of line (malloc.cpp, "The hot path's layout").
  [[gnu::cold, gnu::noinline]] void free_uncached(DevicePtr ptr);
  [[noreturn, gnu::cold, gnu::noinline]] void throw_double_free(const Block* b) const;
  [[gnu::noinline]] void free_with_stream_uses(Block* b);
  // §2.5: a block whose free completed goes back to its pool, merged with free neighbours; first
  // out of active_ (keyed by address, which a merge with prev changes). free_unlisted_block: the
  // same for a block already out of active_ (free's common path erases the slot it found).
  void free_block(Block* b);
  void free_unlisted_block(Block* b);
  Bytes try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  // try_merge_blocks' rule: dst (Free or Unmapped) absorbs a neighbour in the same state, never
  // across the edge of a sleeping range (docs/sleep-wake.md: a range sleeps and wakes whole).
  bool mergeable(const Block* dst, const Block* src) const {
    return src != nullptr && src->state() == dst->state() &&
           (sleeping_.empty() || sleeping_range_of(src) == sleeping_range_of(dst));
  }
  // A merge's survivor `dst` takes the freed block `src`'s capture stream uses (PyTorch keeps the
  // freed block object, §14.7); nothing to move when both are empty, as on the hot path.
  static void take_capture_stream_uses(Block* dst, Block* src) {
    if (!src->capture_stream_uses.empty() || !dst->capture_stream_uses.empty()) [[unlikely]]
      dst->capture_stream_uses = std::move(src->capture_stream_uses);
  }
  void insert_events(Block* b);
  template <class Before>
  void insert_events(Block* b, Before&& before);
  void process_events();
  // With a pool: only the events of that private pool's blocks (§14.6).
  void synchronize_and_free_events(const PrivatePool* pool = nullptr);

  // --- private pools (§14; private_pool.cpp) ---
  BlockPool& get_pool(Bytes size, StreamId stream);
  bool capture_underway() const { return !captures_underway_.empty(); }
  bool graph_capture_underway() const;
  void insert_events_deferred_until_no_capture();
  void release_private_pools(PoolId id);
  void forget_pool(PrivatePool* pp);
  static void count_device_alloc(BlockPool& pool);
  static void count_device_free(BlockPool& pool);
  Bytes private_pool_free_bytes() const;
  // §14.8, checked before anything changes: each throws PyTorchFailsHere where PyTorch fails.
  void refuse_release_where_pytorch_fails(PoolId id) const;
  void refuse_giving_back_in_capture(const AllocParams& p, bool gc, bool releasing);
  void refuse_free_markers_across_graphs(const Block* b) const;  // §14.8 case 4, §14.10.1
  // graph_capture_record_stream_reuse (§14.10.1; capture_reuse.cpp), from the backend's capture
  // graph (caps_.capture_graph; without it every such free waits for the end of the captures).
  // record_free_markers: the union of the terminals of the block's stream and use streams, none
  // when one of them does not capture. free_safe_blocks_in_capture: malloc's step during a capture.
  // Both throw DeviceError, nothing changed, when the backend cannot answer.
  std::vector<GraphNode> record_free_markers(const Block* b);
  void free_safe_blocks_in_capture(StreamId stream);
  CaptureInfo capture_info(StreamId stream);
  int device_frees_to_release(const PrivatePool& pp, bool synced) const;
  bool gc_would_release() const;
  bool release_available_would_release(const AllocParams& p) const;
  void check_private_pools(std::vector<std::string>& out) const;  // invariants.cpp
  template <class F>
  void for_each_block_pool(F&& f) const {
    f(large_blocks_);
    f(small_blocks_);
    for (const auto& [id, pp] : graph_pools_) {
      f(pp->small);
      f(pp->large);
    }
    for (const auto& pp : orphaned_pools_) {
      f(pp->small);
      f(pp->large);
    }
  }

  // --- expandable segments (§7) ---
  Block* try_allocate_expandable_block(StreamId stream, BlockPool* pool, Bytes size, std::uint32_t tag);
  Block* find_expandable_block(StreamId stream, BlockPool* pool, Bytes size, std::uint32_t tag);
  bool map_block(Block* to_map, Bytes size);
  void unmap_block(Block* b);
  void release_expandable_segment(Block* b);

  // --- sleep and wake (docs/sleep-wake.md; sleep.cpp) ---
 public:
  Bytes sleep(const TagList& tags, const TagList& backup_tags);
  void wake(const TagList& tags);
  TagList sleeping() const;
  // The pinned bytes a sleep of every tag would need now, per tag of `backup_tags`: the live
  // blocks of that tag in sleepable (VMM or expandable) segments, not asleep already.
  std::map<std::uint32_t, Bytes> backup_need(const TagList& backup_tags) const;

 private:
  // A sleeping range: a cudaMalloc-style (VMM) segment, or a run of mapped pages of an
  // expandable segment, whose memory went back to the driver. Its blocks stay as they were; its
  // free blocks are in no free set. `copies`: the backups, one per run of adjacent live blocks.
  struct BackupCopy {
    DevicePtr ptr;
    Bytes size;
    unsigned char* host;
  };
  struct SleepingRange {
    Segment* segment = nullptr;
    Bytes size = 0;
    std::uint32_t tag = 0;
    bool had_live = false;  // it held a live block when it went to sleep: woken by its tag only
    bool backed_up = false;
    void* buffer = nullptr;  // the pinned buffer its copies lie in (shared by the ranges of one tag)
    std::vector<BackupCopy> copies;
  };
  const SleepingRange* sleeping_range_at(DevicePtr addr) const;  // the sleeping range holding addr
  // snapshot.cpp: one snapshot segment per mapped run (a sleeping range is one of its own); with
  // `hidden`, also the runs of orphaned pools that PyTorch's snapshot does not show.
  Snapshot mapped_runs(bool hidden) const;
  const SleepingRange* sleeping_range_of(const Block* b) const { return sleeping_range_at(b->ptr); }
  bool asleep(const Block* b) const { return b->segment->sleeping_runs != 0 && sleeping_range_of(b) != nullptr; }
  void free_while_asleep(Block* b);
  void release_sleeping_ranges(BlockPool& pool);  // release_blocks: its sleeping ranges with no live block
  Block* run_head(Block* b) const;
  void check_sleep(std::vector<std::string>& out) const;  // invariants.cpp
  std::map<DevicePtr, SleepingRange> sleeping_;  // by base address
  std::map<void*, int> backup_buffers_;          // pinned buffer -> ranges whose copies lie in it
  Bytes sleeping_bytes_ = 0;                      // sleep_stats_.sleeping_bytes.current
  // A cachet_sleep segment: reserve + map_pieces instead of cudaMalloc; release_block's inverse.
  Result<DevicePtr> vmm_segment_alloc(Bytes size);
  Status vmm_segment_free(DevicePtr base, Bytes size, bool mapped);

  // --- plumbing ---
  static BlockPool& pool_for(const Block* b) { return *b->segment->pool; }
  // The id trace events name the pool by (TraceEvent::pool, PyTorch's owner_MempoolId()): the
  // owning private pool's, {0, 0} for the default pools.
  // Inline, so that the compiler computes it only inside record()'s rare branch (the trace on).
  static PoolId trace_pool(const BlockPool& p) { return p.owner != nullptr ? p.owner->id : PoolId{}; }
  static PoolId trace_pool(const Block* b) { return trace_pool(pool_for(b)); }
  // record() of an event at block `b` (its address and stream, its pool's id), the pool looked up
  // only when recording().
  void record_block(TraceAction a, const Block* b, Bytes size) {
    if (recording()) [[unlikely]]
      record(a, b->ptr, size, b->stream, trace_pool(b));
  }
  StatType stat_type(const BlockPool& pool) const { return pool.is_small ? StatType::SmallPool : StatType::LargePool; }
  Block* find_active(DevicePtr ptr, const char* op) const;
  std::optional<BlockAt> holder_of(DevicePtr ptr) const;  // for find_active's diagnostics
  void validate_if_enabled(const char* op) const;
  static void link_after(Block* nb, Block* b);  // nb goes right after b

  Bytes total_allocated_memory_ = 0;  // reserved bytes (cudaMalloc + mapped)

  BlockArena arena_;
  BlockPool large_blocks_{false};
  BlockPool small_blocks_{true};
  PtrMap<Block> active_;
  std::map<DevicePtr, std::unique_ptr<Segment>> segments_;  // by base address

  // Per-stream FIFO of (event, block) (§6), ordered by stream value.
  std::map<StreamId, std::deque<std::pair<EventHandle, Block*>>> cuda_events_;
  // Streams walked first, in this order (set_event_stream_order, §14.10.3); the others after, by value.
  std::vector<StreamId> event_stream_order_;
  std::vector<StreamId> event_walk_order() const;
  std::size_t pending_events_ = 0;

  // PYTORCH_NO_CUDA_MEMORY_CACHING: raw allocations, by address.
  std::map<DevicePtr, Bytes> uncached_;

  // Private pools (§14): every known pool by id; the freeable ones (use count 0) in PyTorch's
  // release order; the active ones, newest last (get_pool searches newest first); the frees that
  // wait for the end of the captures (Deferred blocks, in the order they were freed, §14.7).
  // Declared after arena_ so they are destroyed first.
  struct Underway {
    PoolId id;
    PoolFilter filter;
    bool capture;  // a CUDA graph capture (true) or use_mem_pool (false)
  };
  std::map<PoolId, std::unique_ptr<PrivatePool>> graph_pools_;
  FreeableOrder graph_pools_freeable_;
  std::vector<Underway> captures_underway_;
  std::vector<Block*> deferred_blocks_;
  // graph_capture_record_stream_reuse (§14.10.1): the free markers of deferred blocks that have
  // some (the others wait for the end of the captures); PyTorch's graph_reuse_context (per capture
  // id, per stream, the visited nodes) and mempool_to_capture_id, dropped at endAllocateToPool.
  std::map<const Block*, std::vector<GraphNode>> free_markers_;
  std::map<std::uint64_t, std::map<StreamId, std::vector<GraphNode>>> reuse_visited_;
  std::map<PoolId, std::uint64_t> mempool_to_capture_;
  std::vector<std::unique_ptr<PrivatePool>> orphaned_pools_;  // forget_pool (§14.8.1)
  // setUseOnOOM's pools, in PyTorch's iteration order (a ska::flat_hash_set keyed as
  // graph_pools_freeable); setNoSplit's pools (§15.2). Ids, as PyTorch keeps them: they outlive
  // their pools.
  FreeableOrder use_on_oom_pools_;
  std::vector<PoolId> no_split_pools_;
};

}  // namespace cachet::gpu::detail
