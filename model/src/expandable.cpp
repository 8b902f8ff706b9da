// Expandable segments (docs/pytorch-allocator.md §7): one virtual reservation per (stream, pool)
// of 1.125x device memory, mapped page by page (2 MiB small pool, large_segment_size large pool), lowest address first.
// The `segment` and `inactive_split` stats never move for them; reserved_bytes follows the
// mapped pages; each contiguous map or unmap counts one num_device_alloc / num_device_free.
#include <algorithm>

#include "cachet/model/allocator.h"
#include "cachet/model/sizes.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

namespace {
// Page indices [first, last) of a segment that lie wholly inside [ptr, ptr + size) (unmap), or
// that cover it (map).
Bytes page_left(const ExpandableSegment& es, std::uint64_t p) { return (p - es.base) / es.page_size; }
Bytes page_right(const ExpandableSegment& es, std::uint64_t p) {
  return (p - es.base + es.page_size - 1) / es.page_size;
}
}  // namespace

Block* Allocator::try_allocate_expandable_block(AllocParams& p) {
  Block* candidate = find_expandable_block(p.stream, *p.pool, p.size);
  // candidate starts a run of free/unmapped blocks with room for p.size:
  //   unmapped -> null | unmapped -> free -> ... | free -> unmapped -> ...
  if (candidate->is_unmapped() && !map_block(candidate, std::min(candidate->size, p.size)))
    return nullptr;
  while (candidate->size < p.size) {
    // free -> unmapped: map part of the unmapped block, which merges into the free one.
    const Bytes remaining = p.size - candidate->size;
    Block* next = candidate->next;
    if (!map_block(next, std::min(remaining, next->size))) return nullptr;
    candidate = next;
  }
  p.pool->blocks.erase(candidate);
  return candidate;
}

Block* Allocator::find_expandable_block(StreamId stream, BlockPool& pool, Bytes size) {
  // Never through a sleeping run nor an unmapped block touching one (docs/sleep-wake.md, SLEEP-R2).
  auto allocatable = [this](const Block* b) {
    return b != nullptr && b->is_free_or_unmapped() && !touches_sleeping(b);
  };
  auto has_room = [&](const Block* b) {
    Bytes bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  key.ptr = 0;
  // The lowest-address unmapped block of this stream that, with a free block just before it,
  // has room.
  for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream;
       ++it) {
    Block* c = *it;
    // SLEEP-R1: not a segment holding live blocks of another tag.
    if (!allocatable(c) || !reservation_takes_current_tag(c->expandable)) continue;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  // A new reservation: one unmapped block spanning it.
  auto es = std::make_unique<ExpandableSegment>();
  // (rule flip expandable_small_page_large: the small pool's page is the large one too)
  es->page_size = expandable_page_size(config_, pool.is_small && !flipped(RuleFlip::ExpandableSmallPageLarge));
  es->pages = expandable_page_count(source_.total_memory(), es->page_size);
  es->stream = stream;
  es->base = source_.reserve(es->size());
  Block* c = new_block(BlockState::Unmapped);
  c->stream = stream;
  c->size = es->size();
  c->ptr = es->base;
  c->pool = &pool;
  c->expandable = es.get();
  expandable_segments_.push_back(std::move(es));
  pool.unmapped.insert(c);
  if (pool.owner != nullptr) pool.owner->had_expandable = true;  // [INV-PRIV-2] stops applying
  return c;
}

bool Allocator::map_block(Block* to_map, Bytes size) {
  ExpandableSegment& es = *to_map->expandable;
  const Bytes first = page_left(es, to_map->ptr);
  const Bytes last = page_right(es, to_map->ptr + size);
  const std::uint64_t addr = es.base + first * es.page_size;
  const Bytes mapped = (last - first) * es.page_size;
  if (mapped == 0) return true;
  if (!source_.map(addr, mapped)) return false;
  for (Bytes i = first; i < last; ++i) es.mapped_pages.insert(i);

  BlockPool& pool = *to_map->pool;
  pool.unmapped.erase(to_map);
  to_map->set_state(BlockState::Free);  // Unmapped -> Free
  if (mapped < to_map->size) {
    // to_map -> remaining (unmapped, a fresh block: requested_size 0, §13.1) -> next
    Block* remaining = new_block(BlockState::Unmapped);
    remaining->stream = to_map->stream;
    remaining->size = to_map->size - mapped;
    remaining->ptr = to_map->ptr + mapped;
    remaining->pool = &pool;
    remaining->expandable = to_map->expandable;
    remaining->prev = to_map;
    remaining->next = to_map->next;
    if (remaining->next != nullptr) remaining->next->prev = remaining;
    to_map->next = remaining;
    pool.unmapped.insert(remaining);
    to_map->size = mapped;
  }
  try_merge_blocks(to_map, to_map->prev, pool);
  try_merge_blocks(to_map, to_map->next, pool);
  pool.insert(to_map);

  total_allocated_ += mapped;
  DeviceStats::for_all_and(stats_.reserved_bytes, stat_type(pool),
                           [&](Stat& s) { s.increase(static_cast<std::int64_t>(mapped)); });
  ++stats_.num_device_alloc;
  record(TraceAction::SegmentMap, addr, mapped, to_map->stream);
  return true;
}

void Allocator::unmap_block(Block* block, bool asleep) {
  ExpandableSegment& es = *block->expandable;
  // Only pages wholly inside the block are unmapped.
  const Bytes first = page_right(es, block->ptr);
  const Bytes last = page_left(es, block->ptr + block->size);
  if (first >= last) return;
  const std::uint64_t addr = es.base + first * es.page_size;
  const Bytes unmapped = (last - first) * es.page_size;
  refuse_device_free_in_capture("unmapping an expandable segment");  // §14.8
  if (!asleep) source_.unmap(addr, unmapped);  // a sleeping run's pages went back at the sleep
  for (Bytes i = first; i < last; ++i) es.mapped_pages.erase(i);

  BlockPool& pool = *block->pool;
  pool.blocks.erase(block);
  auto splice_free = [&](std::uint64_t ptr, Bytes size, Block* prev, Block* next) {
    // A fresh free block (requested_size 0, §13.1) between prev and next.
    Block* b = new_block();
    b->stream = block->stream;
    b->size = size;
    b->ptr = ptr;
    b->pool = &pool;
    b->expandable = block->expandable;
    b->prev = prev;
    b->next = next;
    if (prev != nullptr) prev->next = b;
    if (next != nullptr) next->prev = b;
    pool.insert(b);
  };
  const Bytes before = addr - block->ptr;
  if (before > 0) splice_free(block->ptr, before, block->prev, block);
  const Bytes after = block->size - (before + unmapped);
  if (after > 0) splice_free(addr + unmapped, after, block, block->next);
  block->ptr = addr;
  block->size = unmapped;
  block->set_state(BlockState::Unmapped);  // Free -> Unmapped
  try_merge_blocks(block, block->prev, pool);
  try_merge_blocks(block, block->next, pool);
  pool.unmapped.insert(block);

  total_allocated_ -= unmapped;
  DeviceStats::for_all_and(stats_.reserved_bytes, stat_type(pool),
                           [&](Stat& s) { s.decrease(static_cast<std::int64_t>(unmapped)); });
  count_device_free(pool, "unmap_block");  // §14.5, §14.8
  ++stats_.num_device_free;
  record(TraceAction::SegmentUnmap, addr, unmapped, block->stream);
}

void Allocator::release_expandable_segment(Block* block) {
  // The block is the whole, fully unmapped reservation: give the address range back.
  ExpandableSegment* es = block->expandable;
  source_.release_reservation(es->base, es->size());
  block->pool->unmapped.erase(block);
  delete_block(block);
  std::erase_if(expandable_segments_, [es](const auto& p) { return p.get() == es; });
}

}  // namespace cachet::model
