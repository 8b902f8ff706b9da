// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): expandable segments (§7). Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "policy_pytorch/policy.h"
#include "cachet/rule_flip.h"

namespace cachet::gpu::detail {

// ===================================================================== Expandable segments (7)

Block* PytorchPolicy::find_expandable_block(StreamId stream, BlockPool* pool, Bytes size, std::uint32_t tag) {
  // A block of a sleeping run is never grown into, nor an unmapped block touching one, so a
  // sleeping run never joins an awake one (docs/sleep-wake.md section 4, SLEEP-R2).
  auto asleep_mapped = [this](const Block* b) { return b != nullptr && b->is_mapped() && asleep(b); };
  auto allocatable = [&](const Block* b) {
    return b != nullptr && b->is_reusable() &&
           (b->is_mapped() ? !asleep(b) : !asleep_mapped(b->prev) && !asleep_mapped(b->next));
  };
  auto has_available_address_space = [&](const Block* b) {
    Bytes bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  for (auto it = pool->unmapped.lower_bound(AddrKey{stream, 0}, AddrOrder{});
       it != pool->unmapped.end() && it->stream == stream; ++it) {
    Block* c = &*it;
    if (!allocatable(c)) continue;
    // SLEEP-R1 (docs/sleep-wake.md section 2): not a segment with live blocks of another tag; one
    // with none takes this tag.
    if (c->segment->tag != tag && foreign(*c, tag)) continue;
    if (allocatable(c->prev)) c = c->prev;  // a free block just before the unmapped run
    if (has_available_address_space(c)) return c;
  }
  // A new segment: page = 2 MiB (small pool) or large_segment_size (large pool); address space
  // for 1.125 x device memory.
  // (rule flip expandable_small_page_large: the small pool's page is the large one too)
  const Bytes page = pool->is_small && !flipped(RuleFlip::ExpandableSmallPageLarge) ? kSmallBuffer
                                                                                    : config_.large_segment_size;
  const Bytes want = total_memory_ + total_memory_ / 8;
  const Bytes max_handles = (want + page - 1) / page;
  const Bytes va = page * max_handles;
  auto r = mem_->reserve(va);
  if (r.status.is_oom()) return nullptr;
  if (!r.is_ok()) throw DeviceError(device_error("cuMemAddressReserve", va, device_, r.status));
  auto seg = std::make_unique<Segment>();
  seg->pool = pool;
  seg->base = r.value;
  seg->size = va;
  seg->stream = stream;
  seg->is_small = pool->is_small;
  seg->expandable = true;
  seg->tag = tag;
  seg->page_size = page;
  seg->page_mapped.assign(max_handles, false);
  Block* c = arena_.make(BlockState::Unmapped);
  c->ptr = r.value;
  c->size = va;
  c->stream = stream;
  c->segment = seg.get();
  c->is_small = pool->is_small;
  seg->head = c;
  segments_.emplace(r.value, std::move(seg));
  if (pool->owner != nullptr) ++pool->owner->segments, pool->owner->had_expandable = true;
  pool->unmapped.insert(*c);
  return c;
}

Block* PytorchPolicy::try_allocate_expandable_block(StreamId stream, BlockPool* pool, Bytes size, std::uint32_t tag) {
  Block* c = find_expandable_block(stream, pool, size, tag);
  if (!c) return nullptr;
  // c starts a run with room for `size`: unmapped, or free followed by unmapped.
  if (!c->is_mapped() && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    const Bytes remaining = size - c->size;
    Block* nc = c->next;  // unmapped; mapping it merges c into it
    // The end of the reservation (1.125 x the reported total): only a device that maps more than
    // it reports gets here (the host simulation; cuMemCreate fails first on a GPU). Out of memory.
    if (nc == nullptr) return nullptr;
    if (!map_block(nc, std::min(remaining, nc->size))) return nullptr;
    c = nc;
  }
  pool->blocks.erase(pool->blocks.iterator_to(*c));
  return c;
}

bool PytorchPolicy::map_block(Block* to_map, Bytes size) {
  CACHET_CHECK(!to_map->is_mapped() && size <= to_map->size);
  Segment* seg = to_map->segment;
  const Bytes page = seg->page_size;
  const Bytes begin = (to_map->ptr - seg->base) / page;
  const Bytes end = (to_map->ptr + size - seg->base + page - 1) / page;
  CACHET_CHECK(seg->base + begin * page == to_map->ptr && end > begin);
  const DevicePtr at = seg->base + begin * page;
  const Bytes mapped = (end - begin) * page;
  auto st = mem_->map(at, mapped);
  if (st.is_oom()) return false;
  if (!st.is_ok()) throw DeviceError(device_error("cuMemCreate/cuMemMap", mapped, device_, st));
  for (Bytes i = begin; i < end; ++i) seg->page_mapped[i] = true;

  BlockPool& pool = pool_for(to_map);
  pool.unmapped.erase(pool.unmapped.iterator_to(*to_map));
  to_map->set_state(BlockState::Free);
  if (mapped < to_map->size) {
    Block* rest = arena_.make(BlockState::Unmapped);  // fresh: requested_size 0 (§13.1)
    rest->ptr = to_map->ptr + mapped;
    rest->size = to_map->size - mapped;
    rest->stream = to_map->stream;
    rest->segment = seg;
    rest->is_small = to_map->is_small;
    link_after(rest, to_map);
    pool.unmapped.insert(*rest);
    to_map->size = mapped;
  }
  // Never with a free block of a sleeping run (docs/sleep-wake.md SLEEP-R2).
  if (to_map->prev == nullptr || !asleep(to_map->prev)) try_merge_blocks(to_map, to_map->prev, pool);
  if (to_map->next == nullptr || !asleep(to_map->next)) try_merge_blocks(to_map, to_map->next, pool);
  pool.insert_into_blocks(to_map);

  total_allocated_memory_ += mapped;
  accounting_.pages_mapped(stat_type(pool), mapped, 0);  // expandable segments are not counted in `segment`
  record(TraceAction::SegmentMap, at, mapped, to_map->stream, trace_pool(pool));
  return true;
}

void PytorchPolicy::unmap_block(Block* b) {
  Segment* seg = b->segment;
  const Bytes page = seg->page_size;
  const Bytes begin = (b->ptr - seg->base + page - 1) / page;  // whole pages only
  const Bytes end = (b->ptr + b->size - seg->base) / page;
  if (begin >= end) return;
  const DevicePtr at = seg->base + begin * page;
  const Bytes n = (end - begin) * page;
  auto st = mem_->unmap(at, n);  // device first: a failure changes nothing
  if (!st.is_ok()) throw DeviceError(device_error("cuMemUnmap/cuMemRelease", n, device_, st));
  for (Bytes i = begin; i < end; ++i) seg->page_mapped[i] = false;

  BlockPool& pool = pool_for(b);
  pool.blocks.erase(pool.blocks.iterator_to(*b));
  const Bytes before = at - b->ptr;
  if (before > 0) {
    Block* bf = arena_.make();
    bf->ptr = b->ptr;
    bf->size = before;
    bf->stream = b->stream;
    bf->segment = seg;
    bf->is_small = b->is_small;
    bf->prev = b->prev;
    if (bf->prev) bf->prev->next = bf;
    else seg->head = bf;
    bf->next = b;
    b->prev = bf;
    pool.insert_into_blocks(bf);
  }
  const Bytes after = b->size - (before + n);
  if (after > 0) {
    Block* af = arena_.make();
    af->ptr = at + n;
    af->size = after;
    af->stream = b->stream;
    af->segment = seg;
    af->is_small = b->is_small;
    link_after(af, b);
    pool.insert_into_blocks(af);
  }
  b->ptr = at;
  b->size = n;
  b->set_state(BlockState::Unmapped);
  try_merge_blocks(b, b->prev, pool);
  try_merge_blocks(b, b->next, pool);
  pool.unmapped.insert(*b);

  total_allocated_memory_ -= n;
  count_device_free(pool);  // §14.5
  accounting_.pages_unmapped(stat_type(pool), n, 0);
  record(TraceAction::SegmentUnmap, at, n, b->stream, trace_pool(pool));
}

void PytorchPolicy::release_expandable_segment(Block* b) {
  Segment* seg = b->segment;
  CACHET_CHECK(!b->is_mapped() && !b->is_split() && b->ptr == seg->base && b->size == seg->size);
  auto st = mem_->unreserve(seg->base, seg->size);
  if (!st.is_ok()) throw DeviceError(device_error("cuMemAddressFree", seg->size, device_, st));
  BlockPool& pool = pool_for(b);
  pool.unmapped.erase(pool.unmapped.iterator_to(*b));
  if (pool.owner != nullptr) --pool.owner->segments;
  segments_.erase(seg->base);
  arena_.release(b);
}

}  // namespace cachet::gpu::detail
