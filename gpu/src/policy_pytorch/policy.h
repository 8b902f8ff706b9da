// policy:pytorch (PytorchPolicy): blocks, segments, pools and the per-device state, with PyTorch 2.11's
// rules (docs/pytorch-allocator.md §1-3, §5-7, §13) on fast structures. No locking here: every member
// function of PytorchPolicy runs with the API layer's mutex held (style note 11).
//
// Glossary (cachet/types.h): a Segment is one device allocation (cudaMalloc) or one VA
// reservation of an expandable segment; its Blocks tile it exactly, in address order, linked
// by prev/next. Each Block is in one BlockState (shell/block_state.h): a Free Block sits in its
// pool's size-ordered set (stream, size, address); an Unmapped Block of an expandable segment in
// its pool's address-ordered `unmapped` set; an Allocated or AwaitingEvents Block in `active_`
// (address -> Block).
//
// Invariants: PytorchPolicy::invariants() (policy_pytorch/invariants.cpp) checks the rules of
// docs/invariants.md whose policy is pytorch or both; each violation line starts with its ID.
#pragma once

#include <boost/container/small_vector.hpp>
#include <boost/intrusive/set.hpp>
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
#include "cachet/gpu/backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
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

 private:
  BlockState state_;

 public:
  bool is_small = false;
  boost::container::small_vector<StreamId, 2> stream_uses;  // Allocated only

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
  // Allocated or AwaitingEvents: in active_, counted in the active stats.
  bool is_active() const { return !is_reusable(); }
};

struct Segment {
  DevicePtr base = 0;
  Bytes size = 0;  // cudaMalloc size, or the whole VA reservation of an expandable segment
  StreamId stream = 0;
  bool is_small = false;
  bool expandable = false;
  Block* head = nullptr;  // lowest-address block
  // expandable segments (§7)
  Bytes page_size = 0;
  std::vector<bool> page_mapped;
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

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  ~BlockPool() {
    blocks.clear();
    unmapped.clear();
  }
  FreeSet blocks;
  UnmappedSet unmapped;
  const bool is_small;
  std::int64_t get_free_blocks_call_count = 0;  // GC age clock (§3.5, §13.3)

  void insert_into_blocks(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(*b);
  }
};

// Block objects are pooled: a free list over chunks, so the hot path never calls new.

class BlockArena {
 public:
  BlockArena() = default;
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;
  Block* make(BlockState born = BlockState::Free) {
    if (free_.empty()) refill();
    Block* b = free_.back();
    free_.pop_back();
    return new (b) Block(born);  // members have initializers; no zeroing of padding
  }
  // A block leaves (merged into a neighbour, or given back) only Free or Unmapped.
  void release(Block* b) {
    check_born_or_gone("removed", b->state(), b->ptr);
    discard(b);
  }
  // Teardown only (~PytorchPolicy): any state.
  void discard(Block* b) {
    b->~Block();
    free_.push_back(b);
  }

 private:
  void refill() {
    constexpr std::size_t n = 256;
    chunks_.push_back(std::make_unique<Storage[]>(n));
    free_.reserve(free_.size() + n);
    for (std::size_t i = n; i-- > 0;) free_.push_back(reinterpret_cast<Block*>(&chunks_.back()[i]));
  }
  struct alignas(Block) Storage {
    unsigned char bytes[sizeof(Block)];
  };
  std::vector<std::unique_ptr<Storage[]>> chunks_;
  std::vector<Block*> free_;
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
  void set_memory_fraction(double fraction);
  Snapshot snapshot();
  void apply_config(const Config& c);  // runtime configure (§4.1)
  std::vector<std::string> invariants() const;
  Bytes round_size(Bytes size) const;
  Bytes allocation_size(Bytes rounded) const;

 private:
  struct AllocParams {
    StreamId stream;
    Bytes size;        // rounded
    Bytes alloc_size;  // segment size for a new device allocation
    BlockPool* pool;
    Block* block = nullptr;
    Status err;
    bool in_pool = false;  // block is still in pool->blocks (found by get_free_block)
  };

  // --- free-block search and growth (§2.2, §3.1-3.5) ---
  bool get_free_block(AllocParams& p);
  bool alloc_block(AllocParams& p, bool is_retry);
  bool release_available_cached_blocks(const AllocParams& p);
  void release_cached_blocks();
  void release_blocks(BlockPool& pool);
  void release_block(Block* b);
  void garbage_collect_cached_blocks();
  bool should_split(const Block* b, Bytes size) const;
  Block* alloc_found_block(AllocParams& p, Bytes orig_size, bool split);
  [[noreturn]] void throw_oom(const AllocParams& p);

  // --- free and events (§2.5, §6) ---
  void free_block(Block* b);
  Bytes try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  // try_merge_blocks' rule: dst (Free or Unmapped) absorbs a neighbour in the same state.
  static bool mergeable(const Block* dst, const Block* src) { return src != nullptr && src->state() == dst->state(); }
  void insert_events(Block* b);
  void process_events();
  void synchronize_and_free_events();

  // --- expandable segments (§7) ---
  Block* try_allocate_expandable_block(StreamId stream, BlockPool* pool, Bytes size);
  Block* find_expandable_block(StreamId stream, BlockPool* pool, Bytes size);
  bool map_block(Block* to_map, Bytes size);
  void unmap_block(Block* b);
  void release_expandable_segment(Block* b);

  // --- plumbing ---
  BlockPool& pool_for(const Block* b) { return b->is_small ? small_blocks_ : large_blocks_; }
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
  std::size_t pending_events_ = 0;

  // PYTORCH_NO_CUDA_MEMORY_CACHING: raw allocations, by address.
  std::map<DevicePtr, Bytes> uncached_;
};

}  // namespace cachet::gpu::detail
