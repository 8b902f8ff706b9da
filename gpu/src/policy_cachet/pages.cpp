// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises: cachet/gpu/policy_cachet.h):
// placement of new pages, mapping, unmapping (R6) and merging.
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "mutant.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

CachetPolicy::Placement CachetPolicy::find_placement(StreamId stream, PoolId pool, Bytes size) const {
  Placement best;
  // R3's neighbours: mapped free blocks of the request's stream and pool (R10), awake, touching no
  // page with a live block of another tag (docs/sleep-wake.md section 2, SLEEP-R1).
  auto ours = [this, stream, pool](const CBlock* n) {
    return n != nullptr && n->is_awake_free() && n->stream == stream && n->pool == pool &&
           tag_fits(n->ptr, n->end(), placing_tag_);
  };
  // SLEEP-R1: a candidate that would share a page with a live block of another tag is skipped.
  auto fits = [this, size](DevicePtr at) { return tag_fits(at, at + size, placing_tag_); };
  for (const CBlock& u : unmapped_) {
    const CBlock* l = ours(u.prev) ? u.prev : nullptr;
    const CBlock* r = ours(u.next) ? u.next : nullptr;
    const DevicePtr ws = l ? l->ptr : u.ptr;
    const DevicePtr we = r ? r->end() : u.end();
    if (we - ws < size) continue;
    // Left aligned at the window's start.
    {
      const DevicePtr hi = std::min<DevicePtr>(u.end(), page_ceil(ws + size));
      const DevicePtr lo = u.ptr;
      const Bytes k = hi > lo ? (hi - lo) / kPage : 0;
      if (k > 0 && (!best.found || k < best.new_pages) && fits(ws)) best = Placement{ws, k, true};
    }
    if (r != nullptr) {  // right aligned at the window's end
      const DevicePtr at = we - size;
      const DevicePtr lo = std::max<DevicePtr>(u.ptr, page_floor(at));
      const DevicePtr hi = u.end();
      const Bytes k = hi > lo ? (hi - lo) / kPage : 0;
      if (k > 0 && (!best.found || k < best.new_pages) && fits(at)) best = Placement{at, k, true};
    }
    if (best.found && best.new_pages == 1) break;
  }
  return best;
}


// free_ holds the default pool's free blocks only: a private pool's are never whole free pages (R10).
Bytes CachetPolicy::collect_free_pages(DevicePtr ex_lo, DevicePtr ex_hi) {
  cands_.clear();
  Bytes pages = 0;
  // Only blocks of at least a page can hold a whole page: per stream, from its first such block.
  for (auto it = free_.lower_bound(SizeKey{0, kPage, 0}, SizeOrder{}); it != free_.end();) {
    CBlock& b = *it;
    if (b.size < kPage) {  // a smaller block of the next stream: skip to its first page-sized one
      it = free_.lower_bound(SizeKey{b.stream, kPage, 0}, SizeOrder{});
      continue;
    }
    ++it;
    DevicePtr lo = page_ceil(b.ptr);
    DevicePtr hi = page_floor(b.end());
    if (hi <= lo) continue;
    // A free block never straddles the excluded range (that range is one placement's window).
    if (lo < ex_hi && hi > ex_lo) {
      if (hi > ex_hi)
        lo = ex_hi;
      else
        hi = std::min(hi, ex_lo);
      if (hi <= lo) continue;
    }
    cands_.push_back({&b, lo, hi});
    pages += (hi - lo) / kPage;
  }
  return pages;
}

Bytes CachetPolicy::unmap_collected(Bytes pages) {
  // R6 order: most whole free pages first (fewest unmap calls), ties by the lowest address; a
  // heap, since usually one or two blocks are taken.
  auto lower = [](const FreeRun& a, const FreeRun& b) {
    return a.hi - a.lo != b.hi - b.lo ? a.hi - a.lo < b.hi - b.lo : a.lo > b.lo;
  };
  std::make_heap(cands_.begin(), cands_.end(), lower);
  Bytes done = 0;
  while (done < pages && !cands_.empty()) {
    std::pop_heap(cands_.begin(), cands_.end(), lower);
    const FreeRun c = cands_.back();
    cands_.pop_back();
    const Bytes take = std::min((c.hi - c.lo) / kPage, pages - done);
    free_.erase(free_.iterator_to(*c.b));
    unmap_range(c.b, c.hi - take * kPage, c.hi);
    done += take;
  }
  cands_.clear();
  return done;
}

Bytes CachetPolicy::unmap_free_pages(Bytes pages, DevicePtr ex_lo, DevicePtr ex_hi) {
  if (pages == 0 || pool_active()) return 0;  // R12
  collect_free_pages(ex_lo, ex_hi);
  return unmap_collected(pages);
}

int CachetPolicy::run_delta(bool left_mapped, bool right_mapped, bool mapping) {
  if (left_mapped && right_mapped) return mapping ? -1 : 1;    // two runs join, or one splits
  if (!left_mapped && !right_mapped) return mapping ? 1 : -1;  // a run appears, or goes
  return 0;                                                    // a run grows or shrinks
}

void CachetPolicy::unmap_range(CBlock* b, DevicePtr lo, DevicePtr hi) {
  Status st = mem_->unmap(lo, hi - lo);
  if (!st.is_ok()) {
    free_.insert(*b);
    throw DeviceError(device_error("cuMemUnmap", hi - lo, device_, st));
  }
  accounting_.pages_unmapped(StatType::LargePool, mutant(kMutantCachetUnmapKeepsReserved) ? 0 : hi - lo,
                             run_delta(lo > b->ptr || mapped_block(b->prev), hi < b->end() || mapped_block(b->next), false));
  mapped_ -= hi - lo;
  record(TraceAction::SegmentUnmap, lo, hi - lo, b->stream);
  // Split b into [b->ptr, lo) mapped, [lo, hi) unmapped, [hi, end) mapped.
  CBlock* mid = carve(b, lo, hi - lo);  // reinserts the mapped pieces into free_
  mid->set_state(BlockState::Unmapped);
  mid->stream = 0;
  mid->pool = PoolId{};
  merge_free(mid);
}

Status CachetPolicy::map_range(CBlock* u, DevicePtr lo, DevicePtr hi, StreamId stream,
                               PoolId pool, CBlock** merged) {
  Status st = mem_->map(lo, hi - lo);
  if (!st.is_ok()) return st;
  accounting_.pages_mapped(StatType::LargePool, hi - lo,
                           run_delta(lo == u->ptr && mapped_block(u->prev), hi == u->end() && mapped_block(u->next), true));
  mapped_ += hi - lo;
  record(TraceAction::SegmentMap, lo, hi - lo, stream);
  unmapped_.erase(unmapped_.iterator_to(*u));
  // Split u into [u->ptr, lo) unmapped, [lo, hi) mapped, [hi, end) unmapped.
  CBlock* mid = u;
  if (lo > u->ptr) {
    mid = split_at(u, lo);
    unmapped_.insert(*u);
  }
  if (mid->end() > hi) unmapped_.insert(*split_at(mid, hi));
  mid->set_state(BlockState::Free);
  mid->stream = stream;
  mid->pool = pool;  // R10: the new pages belong to the allocating pool
  if (!pool.is_default()) pools_.at(pool).bytes += hi - lo;  // [INV-PRIV-4]
  *merged = merge_free(mid);
  return Status::ok();
}

CBlock* CachetPolicy::merge_free(CBlock* b) {
  auto joinable = [b](const CBlock* o) {
    return o != nullptr && o->state() == b->state() &&
           (b->is_unmapped() || o->asleep == b->asleep) &&
           (b->is_unmapped() ||
            ((mutant(kMutantCachetMergeAcrossStreams) || o->stream == b->stream) && o->pool == b->pool));
  };
  auto erase = [this](CBlock* o) {
    if (o->asleep) return;  // a sleeping free block is in no set
    if (o->is_mapped())
      free_set_of(o).erase(free_set_of(o).iterator_to(*o));
    else
      unmapped_.erase(unmapped_.iterator_to(*o));
  };
  if (CBlock* n = b->next; joinable(n)) {
    erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    release_block(n);
  }
  if (CBlock* p = b->prev; joinable(p)) {
    // p grows in place: its place in unmapped_ (address order) holds; in free_ (size order) it
    // holds while its successor is still larger, else p is re-inserted.
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    release_block(b);
    if (p->is_mapped() && !p->asleep) {
      CFreeSet& fs = free_set_of(p);
      auto it = fs.iterator_to(*p);
      if (auto nx = std::next(it); nx != fs.end() && !SizeOrder{}(*p, *nx)) {
        fs.erase(it);
        fs.insert(*p);
      }
    }
    return p;
  }
  if (b->asleep) return b;  // waits in its sleeping pages for the wake
  if (b->is_mapped())
    free_set_of(b).insert(*b);
  else
    unmapped_.insert(*b);
  return b;
}

}  // namespace cachet::gpu::detail
