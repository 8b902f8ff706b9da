// cachet/model/block.h: blocks, segments and pools (docs/pytorch-allocator.md §2.1).
//
// A segment is a chain of blocks linked by prev/next, tiling one device allocation (or one
// reservation of an expandable segment) in address order. A block is in exactly one of:
//   allocated          handed out (allocated == true), in Allocator::active_blocks
//   pending free       freed but waiting for stream-use events (event_count > 0), also active
//   free, mapped       in its pool's `blocks` (best-fit order)
//   free, unmapped     in its pool's `unmapped` (address order); expandable segments only
// Invariants (checked by Allocator::check_invariants):
//   [INV-SEG-1] next->ptr == ptr + size and next->prev == this for every linked pair.
//   [INV-SEG-2] two free neighbours with the same `mapped` never both sit in the pool: free
//               completion merges them (§2.5).
//   [INV-POOL-1] every block in a pool has allocated == false and event_count == 0.
#pragma once

#include <cstdint>
#include <set>

#include "cachet/types.h"

namespace cachet::model {

struct BlockPool;
struct ExpandableSegment;

struct Block {
  StreamId stream = 0;       // the stream that allocated the segment; the pool key (§2.1)
  Bytes size = 0;            // rounded bytes
  Bytes requested_size = 0;  // what the caller asked for; kept (stale) after free (§13.1)
  std::uint64_t ptr = 0;
  BlockPool* pool = nullptr;
  bool allocated = false;
  bool mapped = true;  // false only for the unmapped pieces of an expandable segment
  Block* prev = nullptr;
  Block* next = nullptr;
  int event_count = 0;              // outstanding stream-use events (§6)
  std::set<StreamId> stream_uses;   // record_stream()s since allocation
  std::int64_t gc_count_base = 0;   // pool's free-block search count when it entered the pool
  ExpandableSegment* expandable = nullptr;

  bool is_split() const { return prev != nullptr || next != nullptr; }
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
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BySize> blocks;       // free mapped blocks
  std::set<Block*, ByAddress> unmapped;  // free unmapped blocks (expandable segments)
  const bool is_small;
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
// from `base`, one per (stream, pool). mapped[i] says whether page i is backed.
struct ExpandableSegment {
  std::uint64_t base = 0;
  Bytes page_size = 0;
  Bytes pages = 0;
  StreamId stream = 0;
  std::set<Bytes> mapped_pages;
  Bytes size() const { return page_size * pages; }
};

}  // namespace cachet::model
