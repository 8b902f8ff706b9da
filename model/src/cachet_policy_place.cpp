// The cachet policy model: where a block goes. R2 (best fit among the stream's mapped free
// blocks), R3 (windows around unmapped blocks), R4 and R5 (budget, then map and carve), and the
// two block operations everything else is made of: carve (split) and merge.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cachet/model/cachet_policy.h"

namespace cachet::model {

namespace {

std::uint64_t floor_to(std::uint64_t base, std::uint64_t a) {
  return base + (a - base) / kCachetPage * kCachetPage;
}
std::uint64_t ceil_to(std::uint64_t base, std::uint64_t a) {
  return base + (a - base + kCachetPage - 1) / kCachetPage * kCachetPage;
}

}  // namespace

CachetPolicy::Block* CachetPolicy::block_before(std::uint64_t ptr) {
  auto it = blocks_.find(ptr);
  return it == blocks_.begin() ? nullptr : &std::prev(it)->second;
}
CachetPolicy::Block* CachetPolicy::block_after(std::uint64_t ptr) {
  auto it = std::next(blocks_.find(ptr));
  return it == blocks_.end() ? nullptr : &it->second;
}
const CachetPolicy::Block* CachetPolicy::block_before(std::uint64_t ptr) const {
  auto it = blocks_.find(ptr);
  return it == blocks_.begin() ? nullptr : &std::prev(it)->second;
}
const CachetPolicy::Block* CachetPolicy::block_after(std::uint64_t ptr) const {
  auto it = std::next(blocks_.find(ptr));
  return it == blocks_.end() ? nullptr : &it->second;
}

// R2: the smallest mapped free block of `stream` and `pool` (R10) holding `size` bytes; ties:
// lowest address.
std::optional<std::uint64_t> CachetPolicy::best_fit(StreamId stream, PoolId pool, Bytes size) const {
  const Block* best = nullptr;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.mapped_free() || b.stream != stream || b.pool != pool || b.size < size) continue;
    // Not a sleeping page's block, nor one whose carve would share a page with a live block of
    // another tag (docs/sleep-wake.md, SLEEP-R1, SLEEP-R2): the next candidate in R2's order.
    const std::uint64_t at = size <= kSmallSize ? b.end() - size : b.ptr;
    if (!placeable(at, at + size)) continue;
    if (best == nullptr || b.size < best->size) best = &b;  // address order: first of a size wins
  }
  if (best == nullptr) return std::nullopt;
  return best->ptr;
}

std::optional<std::uint64_t> CachetPolicy::take_best_fit(StreamId stream, PoolId pool, Bytes size) {
  const auto fit = best_fit(stream, pool, size);
  if (!fit) return std::nullopt;
  // R2: small requests take the high end of the best fit, large ones the low end.
  const Block& f = blocks_.at(*fit);
  const std::uint64_t at = size <= kSmallSize ? f.end() - size : f.ptr;
  return carve(*fit, at, size).ptr;
}

// R3: windows around unmapped blocks, in address order; the first candidate with the fewest
// new pages; the scan stops at a 1-page candidate.
std::optional<CachetPolicy::Placement> CachetPolicy::find_window(StreamId stream, PoolId pool,
                                                                 Bytes size) const {
  std::optional<Placement> best;
  auto consider = [&](std::uint64_t at, Bytes pages) {
    // SLEEP-R1: not where it would share a page with a live block of another tag.
    if (!placeable(at, at + size)) return false;
    // A 0-page candidate would lie inside one mapped free block of `stream`, which R2 (run
    // before every R3, also on R7's retry) would have taken: there is none. With tags, R2's one
    // carve position may have been refused where this one is not: then it is a candidate.
    if (pages == 0 && !tags_seen_)
      throw std::logic_error("cachet model: a window candidate with no new page (R2 missed it)");
    if (!best || pages < best->new_pages) best = Placement{at, pages};
    return best->new_pages <= 1;  // nothing can beat it: stop
  };
  for (const auto& [ptr, u] : blocks_) {
    if (!u.unmapped()) continue;
    const Block* l = block_before(ptr);
    const Block* r = block_after(ptr);
    // (docs/sleep-wake.md: a neighbour on a sleeping page, or sharing a page with a live block of
    // another tag, is not part of a window)
    auto ours = [&](const Block* n) {
      return n->mapped_free() && n->stream == stream && n->pool == pool && placeable(n->ptr, n->end());
    };
    if (l != nullptr && !ours(l)) l = nullptr;
    if (r != nullptr && !ours(r)) r = nullptr;
    const std::uint64_t start = l ? l->ptr : u.ptr;
    const std::uint64_t end = r ? r->end() : u.end();
    if (end - start < size) continue;
    {  // left aligned: new pages [u.start, min(u.end, page_ceil(start + size)))
      const std::uint64_t hi = std::min(u.end(), ceil_to(base_, start + size));
      if (consider(start, hi > u.ptr ? (hi - u.ptr) / kCachetPage : 0)) return best;
    }
    if (r != nullptr) {  // right aligned: new pages [max(u.start, page_floor(end - size)), u.end)
      const std::uint64_t at = end - size;
      const std::uint64_t lo = std::max(u.ptr, floor_to(base_, at));
      if (consider(at, u.end() > lo ? (u.end() - lo) / kCachetPage : 0)) return best;
    }
  }
  return best;
}

// One try of the slow path (R3, R4, R5; R7's cap). nullopt: no window, the cap cannot be kept,
// or the device refused the mapping.
std::optional<std::uint64_t> CachetPolicy::try_place(StreamId stream, PoolId pool, Bytes size) {
  const std::optional<Placement> p = find_window(stream, pool, size);
  if (!p) return std::nullopt;
  const std::uint64_t ex_lo = floor_to(base_, p->at);
  const std::uint64_t ex_hi = ceil_to(base_, p->at + size);

  // R4: T counts the new block's pages.
  const Bytes t = std::max<Bytes>(peak_touched_, touched_pages(ex_lo, ex_hi));
  const Bytes budget = t + t / kCachetSlack;
  const Bytes after = awake_pages() + p->new_pages;  // sleeping pages count in neither R4 nor R7
  Bytes excess = after > budget ? after - budget : 0;
  // R12: no page is unmapped while a pool is active.
  const Bytes available = pool_active() ? 0 : count_whole_free_pages(ex_lo, ex_hi);
  // R7: the cap is a hard limit: its excess must be unmapped in full, or this try fails.
  if (allowed_max_) {
    const Bytes cap_pages = *allowed_max_ / kCachetPage;
    if (after > cap_pages) {
      if (after - cap_pages > available) return std::nullopt;
      excess = std::max(excess, after - cap_pages);
    }
  }
  unmap_whole_free_pages(std::min(excess, available), ex_lo, ex_hi);

  // R5: the unmapped pages of the new block's page range, in one call.
  std::uint64_t lo = 0, hi = 0;
  Bytes count = 0;
  for (std::uint64_t a = ex_lo; a < ex_hi; a += kCachetPage) {
    if (mapped_pages_.count(page_of(a))) continue;
    if (count > 0 && a != hi) throw std::logic_error("cachet model: new pages are not one range");
    if (count == 0) lo = a;
    hi = a + kCachetPage;
    ++count;
  }
  if (count != p->new_pages)
    throw std::logic_error("cachet model: new pages differ from the window's count");
  if (count > 0 && !map_pages(lo, hi, stream, pool)) return std::nullopt;

  // The placement now lies in one mapped free block of `stream`: carve it there.
  auto it = std::prev(blocks_.upper_bound(p->at));
  const Block& f = it->second;
  if (!f.mapped_free() || f.stream != stream || f.pool != pool || f.end() < p->at + size)
    throw std::logic_error("cachet model: placement not inside one free block of its stream and pool");
  return carve(f.ptr, p->at, size).ptr;
}

// Splits the Free or Unmapped block at `free_ptr` into [ptr, at), [at, at + size),
// [at + size, end); every piece keeps its state and stream. Returns the middle piece.
CachetPolicy::Block& CachetPolicy::carve(std::uint64_t free_ptr, std::uint64_t at, Bytes size) {
  Block whole = blocks_.at(free_ptr);
  check_born_or_deleted(whole.state(), "carved", whole.ptr);
  if (at < whole.ptr || at + size > whole.end())
    throw std::logic_error("cachet model: carve outside the block");
  blocks_.erase(free_ptr);
  auto piece = [&](std::uint64_t lo, std::uint64_t hi) -> Block& {
    Block b = whole;
    b.ptr = lo;
    b.size = hi - lo;
    return blocks_[lo] = b;
  };
  if (at > whole.ptr) piece(whole.ptr, at);
  if (at + size < whole.end()) piece(at + size, whole.end());
  return piece(at, at + size);
}

// R1: a Free block joins its Free neighbours of the same stream and pool (R10); an Unmapped
// block its Unmapped neighbours.
std::uint64_t CachetPolicy::merge(std::uint64_t ptr) {
  check_born_or_deleted(blocks_.at(ptr).state(), "merged", ptr);
  // (docs/sleep-wake.md: a free block on a sleeping page joins only free blocks on sleeping pages)
  auto joins = [this](const Block& a, const Block* o) {
    return o != nullptr && o->state() == a.state() &&
           (a.unmapped() || (o->stream == a.stream && o->pool == a.pool && asleep(*o) == asleep(a)));
  };
  if (Block* after = block_after(ptr); joins(blocks_.at(ptr), after)) {
    blocks_.at(ptr).size += after->size;
    blocks_.erase(after->ptr);
  }
  if (Block* before = block_before(ptr); joins(blocks_.at(ptr), before)) {
    before->size += blocks_.at(ptr).size;
    const std::uint64_t keep = before->ptr;
    blocks_.erase(ptr);
    ptr = keep;
  }
  return ptr;
}

}  // namespace cachet::model
