// The cachet policy model: pages. The reservation (R1), pages touched by live blocks (R4),
// whole free pages and their unmapping (R6), mapping new pages (R5), and the segment count
// (runs of mapped pages).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"

namespace cachet::model {

// R1: one reservation of 2 x total memory (rounded up to a page), tiled by one unmapped block.
void CachetPolicy::ensure_reserved() {
  if (reservation_size_ != 0) return;
  const Bytes total = std::max<Bytes>(source_.total_memory(), kCachetPage);
  reservation_size_ = (total * kCachetReserveTimes + kCachetPage - 1) / kCachetPage * kCachetPage;
  base_ = source_.reserve(reservation_size_);
  if (base_ % kCachetPage != 0)
    throw std::logic_error("cachet model: reservation is not page aligned");
  Block u(BlockState::Unmapped);
  u.ptr = base_;
  u.size = reservation_size_;
  blocks_[base_] = u;
}

Bytes CachetPolicy::touched_pages(std::uint64_t lo, std::uint64_t hi) const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [first, last] page of each
  for (const auto& [ptr, b] : blocks_)
    if (b.live()) spans.emplace_back(page_of(b.ptr), page_of(b.end() - 1));
  if (hi > lo) spans.emplace_back(page_of(lo), page_of(hi - 1));
  std::sort(spans.begin(), spans.end());
  Bytes pages = 0;
  std::uint64_t next = 0;  // the first page not counted yet
  for (const auto& [first, last] : spans) {
    const std::uint64_t from = std::max(first, next);
    if (last + 1 > from) pages += last + 1 - from;
    next = std::max(next, last + 1);
  }
  return pages;
}

// R6: the pages lying inside mapped free block b, outside [ex_lo, ex_hi); ascending.
std::vector<std::uint64_t> CachetPolicy::whole_free_pages(const Block& b, std::uint64_t ex_lo,
                                                          std::uint64_t ex_hi) const {
  std::vector<std::uint64_t> pages;
  for (std::uint64_t p = page_of(b.ptr); p <= page_of(b.end() - 1); ++p) {
    const std::uint64_t a = page_addr(p);
    if (a < b.ptr || a + kCachetPage > b.end()) continue;  // shared with a neighbour
    if (a >= ex_lo && a < ex_hi) continue;                 // the new block's pages
    pages.push_back(p);
  }
  return pages;
}

// R10: only the default pool's free blocks hold whole free pages (a private pool's free blocks
// belong to a pool with a user: R11 moves a released pool's to the default pool).
Bytes CachetPolicy::count_whole_free_pages(std::uint64_t ex_lo, std::uint64_t ex_hi) const {
  Bytes n = 0;
  for (const auto& [ptr, b] : blocks_)
    if (b.mapped_free() && b.pool.is_default() && !asleep(b)) n += whole_free_pages(b, ex_lo, ex_hi).size();
  return n;
}

// R6: up to `pages` whole free pages: blocks by their count, largest first (ties: lowest
// address); from each its highest pages, one unmap call per block.
void CachetPolicy::unmap_whole_free_pages(Bytes pages, std::uint64_t ex_lo, std::uint64_t ex_hi) {
  if (pages == 0 || reservation_size_ == 0 || pool_active()) return;  // R12
  std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>> blocks;  // (block, its pages)
  for (const auto& [ptr, b] : blocks_)
    if (b.mapped_free() && b.pool.is_default() && !asleep(b))  // R10; a sleeping page is not unmapped
      if (auto w = whole_free_pages(b, ex_lo, ex_hi); !w.empty())
        blocks.emplace_back(ptr, std::move(w));
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  Bytes done = 0;
  for (const auto& [ptr, w] : blocks) {
    if (done == pages) break;
    const Bytes take = std::min<Bytes>(w.size(), pages - done);
    const std::uint64_t first = w[w.size() - take];
    const std::uint64_t last = w.back();
    if (last - first + 1 != take)
      throw std::logic_error("cachet model: a block's whole free pages are not one range");
    const std::uint64_t lo = page_addr(first), hi = page_addr(last) + kCachetPage;
    const std::int64_t runs = mapped_runs();
    source_.unmap(lo, hi - lo);
    ++stats_.num_device_free;
    DeviceStats::for_all_and(stats_.reserved_bytes, StatType::LargePool,
                             [n = static_cast<std::int64_t>(hi - lo)](Stat& s) { s.decrease(n); });
    for (std::uint64_t p = first; p <= last; ++p) mapped_pages_.erase(p);
    apply_run_change(runs);
    record(TraceAction::SegmentUnmap, lo, hi - lo, blocks_.at(ptr).stream);
    Block& gone = carve(ptr, lo, hi - lo);
    gone.set_state(BlockState::Unmapped);  // Free -> Unmapped
    gone.stream = 0;
    gone.pool = PoolId{};
    merge(lo);
    done += take;
  }
}

// R5: map [lo, hi) (unmapped pages of one unmapped block) as a free block of `stream` and
// `pool` (R10), merged with its free neighbours of both. false: the device refused.
bool CachetPolicy::map_pages(std::uint64_t lo, std::uint64_t hi, StreamId stream, PoolId pool) {
  auto it = std::prev(blocks_.upper_bound(lo));
  if (!it->second.unmapped() || it->second.end() < hi)
    throw std::logic_error("cachet model: mapping pages that are not unmapped");
  const std::int64_t runs = mapped_runs();
  if (!source_.map(lo, hi - lo)) return false;
  ++stats_.num_device_alloc;
  DeviceStats::for_all_and(stats_.reserved_bytes, StatType::LargePool,
                           [n = static_cast<std::int64_t>(hi - lo)](Stat& s) { s.increase(n); });
  for (std::uint64_t p = page_of(lo); p < page_of(hi); ++p) mapped_pages_.insert(p);
  apply_run_change(runs);
  record(TraceAction::SegmentMap, lo, hi - lo, stream);
  Block& fresh = carve(it->first, lo, hi - lo);
  fresh.set_state(BlockState::Free);  // Unmapped -> Free
  fresh.stream = stream;
  fresh.pool = pool;
  if (!pool.is_default()) pools_.at(pool).bytes += hi - lo;  // [INV-PRIV-4]
  merge(lo);
  return true;
}

// Segments are maximal runs of mapped pages.
std::int64_t CachetPolicy::mapped_runs() const {
  std::int64_t runs = 0;
  std::optional<std::uint64_t> prev;  // the page before p in the (ordered) set
  for (std::uint64_t p : mapped_pages_) {
    if (!prev || *prev + 1 != p) ++runs;
    prev = p;
  }
  return runs;
}

void CachetPolicy::apply_run_change(std::int64_t before) {
  const std::int64_t d = mapped_runs() - before;
  DeviceStats::for_all_and(stats_.segment, StatType::LargePool, [d](Stat& s) {
    if (d > 0) s.increase(d);
    if (d < 0) s.decrease(-d);
  });
}

}  // namespace cachet::model
