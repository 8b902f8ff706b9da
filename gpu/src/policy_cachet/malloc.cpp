// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises: cachet/gpu/policy_cachet.h):
// allocation: the hot path (R2) and the slow path (R3-R7).
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

// ===================================================================== allocate

DevicePtr CachetPolicy::malloc(Bytes orig_size, StreamId stream) {
  if (orig_size >= kMaxRequest) throw_request_too_large(orig_size);
  if (orig_size == 0) return 0;
  check_stream(stream, "allocate");
  // R8; R12: no event is queried while a pool is active.
  if (active_pools_.empty() && (!events_.empty() || !deferred_.empty())) process_events();
  const Bytes size = align_up(orig_size, kCachetAlign);
  const PoolId to = active_pools_.empty() ? PoolId{} : route(stream);  // R10
  // SLEEP-R1: the searches skip what this tag may not take (docs/sleep-wake.md section 2).
  placing_tag_ = current_tag_id();

  CBlock* b = take_best_fit(stream, to, size);  // hot path (R2)
  if (b == nullptr) b = alloc_slow(stream, to, size);
  b->set_state(BlockState::Allocated);
  b->pool = to;  // already its pool: R2 and R3 take only the pool's blocks ([INV-PRIV-4] checks)
  b->requested = orig_size;
  b->stream = stream;
  b->tag = placing_tag_;
  active_.insert(b->ptr, b);
  touch(b, true);
  peak_touched_pages_ = std::max(peak_touched_pages_, touched_pages_);
  accounting_.block_allocated(pool_of(size), size, orig_size, false);  // no oversize blocks here
  record(TraceAction::Alloc, b->ptr, orig_size, stream);
  return b->ptr;
}

CBlock* CachetPolicy::take_best_fit(StreamId stream, PoolId pool, Bytes size) {
  CFreeSet* set = &free_set(pool);  // R10: the pool's own free blocks
  auto it = set->lower_bound(SizeKey{stream, size, 0}, SizeOrder{});
  if (mutant(kMutantCachetPoolBlockToDefault))
    if ((it == set->end() || it->stream != stream) && pool.is_default() && !pools_.empty()) {
      set = &pools_.begin()->second.free;
      it = set->lower_bound(SizeKey{stream, size, 0}, SizeOrder{});
    }
  CFreeSet& fs = *set;
  if (it == fs.end() || it->stream != stream) return nullptr;
  // Size-class-aware split: small requests take the high end of the block, large ones the low
  // end, so that small and large blocks collect at opposite ends of free stretches.
  const bool high = size <= kSmallSize && !mutant(kMutantCachetLowEndSmall);
  // SLEEP-R1: a best fit whose carve would share a page with a live block of another tag is
  // skipped for the next candidate in R2's order (none is skipped while no tag was ever set).
  while (!tag_fits(high ? it->end() - size : it->ptr, high ? it->end() : it->ptr + size, placing_tag_))
    if (++it == fs.end() || it->stream != stream) return nullptr;
  CBlock* f = &*it;
  if (f->size > size) {
    // The new block m is carved at its end of f; f keeps the rest and, when its predecessor in
    // the size order is still smaller, its place in free_ (a shrunk key that keeps the order
    // needs no re-insertion).
    CBlock* m = nullptr;
    if (high) {
      m = split_at(f, f->end() - size);
    } else {
      m = make_block();
      m->size = size;
      m->stream = f->stream;
      m->pool = f->pool;
      m->ptr = f->ptr;
      m->prev = f->prev;
      m->next = f;
      if (f->prev)
        f->prev->next = m;
      else
        head_ = m;
      f->prev = m;
      f->ptr += size;
      f->size -= size;
    }
    if (it != fs.begin() && !SizeOrder{}(*std::prev(it), *f)) {
      fs.erase(it);
      fs.insert(*f);
    }
    return m;
  }
  fs.erase(it);
  return carve(f, high ? f->end() - size : f->ptr, size);
}

CBlock* CachetPolicy::split_at(CBlock* f, DevicePtr at) {
  CBlock* m = make_block(f->state());  // Free or Unmapped, as f
  m->ptr = at;
  m->size = f->end() - at;
  m->stream = f->stream;
  m->pool = f->pool;
  m->asleep = f->asleep;
  m->prev = f;
  m->next = f->next;
  if (f->next) f->next->prev = m;
  f->next = m;
  f->size = at - f->ptr;
  return m;
}

CBlock* CachetPolicy::carve(CBlock* f, DevicePtr at, Bytes size) {
  if (at > f->ptr) {  // f keeps the low part
    CBlock* m = split_at(f, at);
    free_set_of(f).insert(*f);
    f = m;
  }
  if (f->size > size) free_set_of(f).insert(*split_at(f, f->ptr + size));  // the high remainder stays free
  return f;
}


CBlock* CachetPolicy::alloc_slow(StreamId stream, PoolId pool, Bytes size) {
  ensure_reserved();
  bool retried = false;
  for (;;) {
    Placement p = find_placement(stream, pool, size);
    bool fits = p.found;
    Bytes give_back = 0;
    const DevicePtr ex_lo = page_floor(p.at);
    const DevicePtr ex_hi = page_ceil(p.at + size);
    if (fits) {
      // [INV-BUDGET-1]: keep mapped pages within the budget of the touched high-water mark (counting this
      // block's pages): beyond it, move whole free pages here instead of growing.
      const Bytes after = mapped_ / kPage + p.new_pages;
      const Bytes touched_after = touched_pages_ + untouched_pages(p.at, p.at + size);
      const Bytes t = std::max(peak_touched_pages_, touched_after);
      const Bytes budget = mutant(kMutantCachetSlackEighth) ? t + t / 8 : budget_pages(t);
      Bytes need = after > budget ? after - budget : 0;
      const bool capped = cap_.allowed() && !mutant(kMutantCachetIgnoreCap);
      const Bytes cap_pages = capped ? *cap_.allowed() / kPage : 0;
      if (capped && after > cap_pages) need = std::max(need, after - cap_pages);
      // R12: no page is unmapped while a pool is active.
      const Bytes avail = need > 0 && !pool_active() ? collect_free_pages(ex_lo, ex_hi) : 0;
      if (capped && after > cap_pages && after - cap_pages > avail) fits = false;
      give_back = std::min(need, avail);
    }
    if (fits) {
      if (give_back > 0) unmap_collected(give_back);
      // The new block's range now lies in one unmapped block plus, at its ends, mapped free
      // blocks of `stream`: map the unmapped part.
      auto it = unmapped_.upper_bound(p.at, CAddrOrder{});
      CBlock* u = nullptr;
      if (it != unmapped_.begin()) {
        auto prev = std::prev(it);
        if (prev->end() > p.at) u = &*prev;
      }
      if (u == nullptr) u = &*it;
      const DevicePtr lo = std::max<DevicePtr>(u->ptr, page_floor(p.at));
      const DevicePtr hi = std::min<DevicePtr>(u->end(), page_ceil(p.at + size));
      CBlock* f = nullptr;
      Status st = map_range(u, lo, hi, stream, pool, &f);
      if (st.is_ok()) {
        // The new mapping was merged with the mapped free blocks of `stream` and `pool` beside
        // it: f holds the whole placement.
        if (f->ptr > p.at || f->end() < p.at + size || !f->is_mapped_free() || f->pool != pool)
          throw std::logic_error("cachet policy: placement not covered after mapping");
        free_set_of(f).erase(free_set_of(f).iterator_to(*f));
        CBlock* b = carve(f, p.at, size);
        return b;
      }
      if (!st.is_oom()) throw DeviceError(device_error("cuMemMap", hi - lo, device_, st));
    }
    if (retried) throw_oom(size);
    // R7: once: wait for pending events; a block that freed may hold the request (R2); else
    // give every whole free page back and try the windows once more. R12: no wait while a
    // pool is active, and no unmapping then either (unmap_free_pages).
    retried = true;
    accounting_.alloc_retried();
    if (active_pools_.empty() && (!events_.empty() || !deferred_.empty())) synchronize_events();
    if (!mutant(kMutantCachetRetrySkipsBestFit))
      if (CBlock* b = take_best_fit(stream, pool, size)) return b;
    unmap_free_pages(static_cast<Bytes>(-1) / kPage, 0, 0);
    release_sleeping_free_pages();  // docs/sleep-wake.md section 4: as empty_cache
  }
}

void CachetPolicy::throw_oom(Bytes size) {
  accounting_.out_of_memory();
  const OomFacts f = oom_facts(size, mem_->mem_get_info());
  record(TraceAction::Oom, f.device_free, size, 0);
  throw OutOfMemory(f);
}

}  // namespace cachet::gpu::detail
