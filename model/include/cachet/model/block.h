// cachet/model/block.h: blocks, segments and pools (docs/pytorch-allocator.md §2.1), and the
// block states both models use (model::Allocator and model::CachetPolicy).
//
// A segment is a chain of blocks linked by prev/next, tiling one device allocation (or one
// reservation of an expandable segment) in address order. Every block is in exactly one
// BlockState, the only record of what it is (no boolean says it again):
//   Allocated       handed out by malloc; in Allocator::active_blocks. record_stream() adds
//                   to stream_uses only in this state.
//   AwaitingEvents  freed after other streams used it: one event per stream was recorded and
//                   event_count of them are outstanding (> 0); still in active_blocks, in no
//                   pool, reused by nobody. The snapshot's active_pending_free (§2.5, §6).
//   Deferred        freed while a capture or use_mem_pool was under way after other streams
//                   used it: no event could be recorded; it keeps its stream_uses and waits,
//                   in Allocator::deferred_blocks and active_blocks, until no capture is under
//                   way (§14.7). The snapshot's active_pending_free too.
//   Free            mapped and reusable: in its pool's `blocks` (best-fit order); out of it
//                   only between the search that found it and alloc_found_block.
//   Unmapped        expandable segments only: reserved addresses with no memory behind them,
//                   in its pool's `unmapped` (address order) (§7).
// The legal transitions, [INV-STATE-1] (check_transition throws on any other):
//   created as Free        a new cudaMalloc segment (§3.2), the pieces unmap_block leaves (§7)
//   created as Unmapped    a new reservation, the unmapped rest of map_block (§7)
//   Free -> Allocated               alloc_found_block (§2.4)
//   Allocated -> Free               free() with no stream uses: free_block at once (§2.5)
//   Allocated -> AwaitingEvents     free() with stream uses: insert_events (§2.5, §6)
//   Allocated -> Deferred           free() with stream uses while a capture is under way (§14.7)
//   Deferred -> AwaitingEvents      insert_events_deferred_until_no_capture (§14.7)
//   Deferred -> Free                the same, when every stream use was made during the capture
//   AwaitingEvents -> Free          its last event completed: process_events or
//                                   synchronize_and_free_events call free_block (§6)
//   Free -> Unmapped                unmap_block, from release_cached_blocks (§3.4, §7)
//   Unmapped -> Free                map_block (§7)
//   Free or Unmapped -> deleted     merged into a neighbour in the same state (§2.5), given
//                                   back by release_block (§3.4) or release_expandable_segment
// Invariants: Allocator::check_invariants and CachetPolicy::check_invariants check the rules of
// docs/invariants.md ([INV-POOL-1]: the state names the one container a block is in;
// [INV-EVENT-1], [INV-EVENT-3]: events and stream uses only in their states, stream uses kept in
// Allocated and Deferred; and the rest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>

#include "cachet/tags.h"
#include "cachet/types.h"

namespace cachet::model {

// Not the snapshot's cachet::BlockState (active_allocated, active_pending_free, inactive),
// which shows only mapped blocks and has no Unmapped; see the table above.
enum class BlockState : std::uint8_t { Allocated, AwaitingEvents, Free, Unmapped, Deferred };

// The states' names, in the enum's order.
inline constexpr const char* kStateNames[] = {"Allocated", "AwaitingEvents", "Free", "Unmapped", "Deferred"};
static_assert(std::size(kStateNames) == static_cast<std::size_t>(BlockState::Deferred) + 1);

inline const char* state_name(BlockState s) {
  const auto i = static_cast<std::size_t>(s);
  return i < std::size(kStateNames) ? kStateNames[i] : "?";
}

// [INV-STATE-1]: the transitions of the table above.
constexpr bool legal_transition(BlockState from, BlockState to) {
  switch (from) {
    case BlockState::Allocated:
      return to == BlockState::Free || to == BlockState::AwaitingEvents || to == BlockState::Deferred;
    case BlockState::AwaitingEvents: return to == BlockState::Free;
    case BlockState::Deferred: return to == BlockState::AwaitingEvents || to == BlockState::Free;
    case BlockState::Free: return to == BlockState::Allocated || to == BlockState::Unmapped;
    case BlockState::Unmapped: return to == BlockState::Free;
  }
  return false;
}

[[noreturn]] inline void state_error(const std::string& what, std::uint64_t ptr) {
  char at[32];
  std::snprintf(at, sizeof at, "0x%llx", static_cast<unsigned long long>(ptr));
  throw std::logic_error("[INV-STATE-1] model: block at " + std::string(at) + ": " + what);
}
inline void check_transition(BlockState from, BlockState to, std::uint64_t ptr) {
  if (!legal_transition(from, to))
    state_error(std::string(state_name(from)) + " -> " + state_name(to) +
                    " is not a legal transition",
                ptr);
}
// Blocks are born Free or Unmapped; only those two states may be deleted.
inline void check_born_or_deleted(BlockState s, const char* what, std::uint64_t ptr) {
  if (s != BlockState::Free && s != BlockState::Unmapped)
    state_error(std::string(what) + " in state " + state_name(s), ptr);
}

struct BlockPool;
struct ExpandableSegment;
struct PrivatePool;

struct Block {
  explicit Block(BlockState born = BlockState::Free) : state_(born) {
    check_born_or_deleted(born, "created", 0);
  }

  StreamId stream = 0;       // the stream that allocated the segment; the pool key (§2.1)
  Bytes size = 0;            // rounded bytes
  Bytes requested_size = 0;  // what the caller asked for; kept (stale) after free (§13.1)
  std::uint64_t ptr = 0;
  BlockPool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  int event_count = 0;              // outstanding stream-use events (§6): AwaitingEvents only
  std::set<StreamId> stream_uses;   // record_stream()s since allocation: Allocated, Deferred
  // The record_stream()s made while a capture was under way (PyTorch's
  // block_to_cudagraph_stream_uses, §14.7): they need no event once the capture has ended.
  // Cleared only when the block's deferred free is processed, as in PyTorch.
  std::set<StreamId> capture_stream_uses;
  std::int64_t gc_count_base = 0;   // pool's free-block search count when it entered the pool
  ExpandableSegment* expandable = nullptr;
  // The current tag of the thread that allocated it (docs/sleep-wake.md); meaningful while the
  // block is live, stale once it is free.
  Tag tag{kDefaultTag};

  bool is_split() const { return prev != nullptr || next != nullptr; }

  BlockState state() const { return state_; }
  // The one writer of the state. Throws std::logic_error on a transition the table above does
  // not allow, or when event_count disagrees with AwaitingEvents.
  void set_state(BlockState to) {
    check_transition(state_, to, ptr);
    if ((to == BlockState::AwaitingEvents) != (event_count > 0))
      state_error(std::string("enters ") + state_name(to) + " with " +
                      std::to_string(event_count) + " outstanding events",
                  ptr);
    state_ = to;
  }
  bool is_allocated() const { return state_ == BlockState::Allocated; }
  // Handed out, or freed and waiting (events or the end of a capture): in active_blocks.
  bool is_active() const {
    return state_ == BlockState::Allocated || state_ == BlockState::AwaitingEvents ||
           state_ == BlockState::Deferred;
  }
  bool is_free() const { return state_ == BlockState::Free; }
  bool is_unmapped() const { return state_ == BlockState::Unmapped; }
  bool is_mapped() const { return state_ != BlockState::Unmapped; }
  // Neither handed out nor waiting for events: may merge, be mapped, or be given back.
  bool is_free_or_unmapped() const { return is_free() || is_unmapped(); }

 private:
  BlockState state_;
};

// BlockComparatorSize: stream, then size, then address. A search key with ptr 0 finds the
// smallest fitting block of the stream, lowest address among equal sizes (§2.2).
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

// BlockComparatorAddress: stream, then address.
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->ptr < b->ptr;
  }
};

struct BlockPool {
  explicit BlockPool(bool small, PrivatePool* owner_pool = nullptr)
      : is_small(small), owner(owner_pool) {}
  std::set<Block*, BySize> blocks;       // Free blocks
  std::set<Block*, ByAddress> unmapped;  // Unmapped blocks (expandable segments)
  const bool is_small;
  PrivatePool* const owner;  // the private pool this pool belongs to; null: a default pool (§14.1)
  // Ticks once per free-block search while garbage collection is on (§3.5, §13.3).
  std::int64_t get_free_blocks_call_count = 0;

  // insert_into_blocks: entering the pool resets the block's GC age (§3.5).
  void insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(b);
  }
  std::int64_t gc_age(const Block* b) const { return get_free_blocks_call_count - b->gc_count_base; }
};

// One virtual reservation of an expandable segment (§7): `pages` pages of `page_size` bytes
// from `base`, one per (stream, pool). mapped_pages: the indices of the backed pages.
struct ExpandableSegment {
  std::uint64_t base = 0;
  Bytes page_size = 0;
  Bytes pages = 0;
  StreamId stream = 0;
  std::set<Bytes> mapped_pages;
  Bytes size() const { return page_size * pages; }
};

}  // namespace cachet::model
