// The cachet policy model: its invariants, recounted from the blocks and the mapped pages.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "cachet/model/cachet_policy.h"

namespace cachet::model {

void CachetPolicy::check_invariants() const {
  // The rules of docs/invariants.md whose policy is cachet or both; a violation's message starts
  // with its ID.
  auto fail = [](const char* id, const std::string& what) {
    throw std::logic_error(std::string(id) + " cachet model: " + what);
  };
  if (reservation_size_ == 0) {
    if (!blocks_.empty() || !mapped_pages_.empty())
      fail("[INV-SEG-1]", "blocks or pages before the reservation");
    return;
  }
  DeviceStats re;
  std::map<PoolId, Bytes> pool_bytes;  // [INV-PRIV-4] recount
  std::map<PoolId, int> pool_live;     // live blocks per private pool
  std::uint64_t expect = base_;
  const Block* prev = nullptr;
  Bytes unmapped_pages = 0;  // the pages of the unmapped blocks
  std::int64_t runs = 0;     // runs of consecutive mapped blocks
  for (const auto& [ptr, b] : blocks_) {
    const auto at = [&, ptr = ptr] { return " at block " + std::to_string(ptr - base_); };  // named only on failure
    if (ptr != b.ptr || ptr != expect)
      fail("[INV-SEG-1]", "blocks do not tile the reservation" + at());
    expect = b.end();
    if (b.size == 0 || b.size % kCachetBlockAlign != 0 || b.ptr % kCachetBlockAlign != 0)
      fail("[INV-SIZE-1]", "size or alignment" + at());
    if (b.mapped()) {
      if (prev == nullptr || prev->unmapped()) ++runs;  // a run of mapped blocks starts here
    } else if (auto m = mapped_pages_.lower_bound(page_of(b.ptr));
               m != mapped_pages_.end() && *m <= page_of(b.end() - 1)) {
      fail("[INV-MAP-4]", "a mapped page inside an unmapped block" + at());
    }
    if (b.unmapped()) {
      if ((b.ptr - base_) % kCachetPage != 0 || b.size % kCachetPage != 0)
        fail("[INV-MAP-3]", "unmapped block not page aligned" + at());
      unmapped_pages += b.size / kCachetPage;
      if (prev != nullptr && prev->unmapped())
        fail("[INV-MERGE-1]", "adjacent unmapped blocks" + at());
    }  // (a live block is mapped by its state: Allocated and AwaitingEvents are mapped states)
    if (!b.uses.empty() && b.state() != BlockState::Allocated && b.state() != BlockState::Deferred)
      fail("[INV-EVENT-3]",
           std::string("stream uses on a block in state ") + state_name(b.state()) + at());
    if (b.mapped_free() && prev != nullptr && prev->mapped_free() && prev->stream == b.stream &&
        prev->pool == b.pool && asleep(*prev) == asleep(b))  // (docs/sleep-wake.md: never across)
      fail("[INV-MERGE-1]", "adjacent free blocks of one stream and pool" + at());
    if ((b.state() == BlockState::AwaitingEvents) != (events_.count(ptr) == 1))
      fail("[INV-EVENT-1]", "pending block without events (or events without one)" + at());
    if ((b.state() == BlockState::Deferred) !=
        (std::find(deferred_.begin(), deferred_.end(), ptr) != deferred_.end()))
      fail("[INV-EVENT-1]", "deferred block not in the deferred list (or the reverse)" + at());
    if (b.state() == BlockState::Deferred && b.uses.empty())
      fail("[INV-EVENT-1]", "deferred block without stream uses" + at());
    // [INV-PRIV-3]: which pool a block may belong to (R10, R11).
    if (b.unmapped() && !b.pool.is_default()) fail("[INV-PRIV-3]", "unmapped block with a pool" + at());
    if (b.mapped_free() && !b.pool.is_default() && !live_pool(b.pool))
      fail("[INV-PRIV-3]", "free block of a pool with no user" + at());
    if (b.live() && !b.pool.is_default() && !pools_.count(b.pool))
      fail("[INV-PRIV-3]", "live block of an unknown pool" + at());
    if (!b.pool.is_default()) {
      pool_bytes[b.pool] += b.size;
      if (b.live()) ++pool_live[b.pool];
    }
    if (b.live()) {
      if (b.size != (b.requested + kCachetBlockAlign - 1) / kCachetBlockAlign * kCachetBlockAlign)
        fail("[INV-SIZE-4]", "size is not the rounded request" + at());
      const StatType pool = b.size <= kSmallSize ? StatType::SmallPool : StatType::LargePool;
      auto add = [pool](StatArray& a, std::int64_t n) {
        DeviceStats::for_all_and(a, pool, [n](Stat& s) { s.current += n; });
      };
      add(re.active, 1);
      add(re.active_bytes, static_cast<std::int64_t>(b.size));
      add(re.requested_bytes, static_cast<std::int64_t>(b.requested));
      if (b.state() == BlockState::Allocated) {
        add(re.allocation, 1);
        add(re.allocated_bytes, static_cast<std::int64_t>(b.size));
      }
    }
    prev = &b;
  }
  if (expect != base_ + reservation_size_)
    fail("[INV-SEG-1]", "blocks do not reach the reservation's end");
  // [INV-MAP-4], the mapped blocks' side: the unmapped blocks are whole pages ([INV-MAP-3]) and
  // hold no mapped page (above), so the mapped pages are among the other pages, those of the
  // mapped blocks; they are all of them exactly when there are as many. On failure, the first
  // mapped block with an unmapped page is named.
  const Bytes pages = reservation_size_ / kCachetPage;
  if (mapped_pages_.size() != pages - unmapped_pages || (!mapped_pages_.empty() && *mapped_pages_.rbegin() >= pages)) {
    for (const auto& [ptr, b] : blocks_)
      for (std::uint64_t p = page_of(b.ptr); b.mapped() && p <= page_of(b.end() - 1); ++p)
        if (!mapped_pages_.count(p))
          fail("[INV-MAP-4]", "a mapped block on an unmapped page at block " + std::to_string(ptr - base_));
    fail("[INV-MAP-4]", "mapped pages outside the reservation");
  }
  for (const auto& [id, p] : pools_) {
    const std::string which = " of pool {" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
    if (p.use_count < 0) fail("[INV-PRIV-3]", "negative use count" + which);
    if (p.use_count == 0 && pool_live[id] == 0) fail("[INV-PRIV-3]", "no user and no live block" + which);
    if (p.bytes != pool_bytes[id])
      fail("[INV-PRIV-4]", std::to_string(p.bytes) + " bytes counted, blocks hold " +
                               std::to_string(pool_bytes[id]) + which);
  }
  for (const auto& [id, n] : pool_bytes)
    if (!pools_.count(id)) fail("[INV-PRIV-3]", "blocks of an unknown pool");
  auto same = [&](const char* name, const StatArray& got, const StatArray& want) {
    for (int i = 0; i < kNumStatTypes; ++i)
      if (got[i].current != want[i].current)
        fail("[INV-STATS-1]", std::string(name) + "[" + std::to_string(i) +
                                  "] = " + std::to_string(got[i].current) + ", recount " +
                                  std::to_string(want[i].current));
  };
  same("allocation", stats_.allocation, re.allocation);
  same("active", stats_.active, re.active);
  same("allocated_bytes", stats_.allocated_bytes, re.allocated_bytes);
  same("active_bytes", stats_.active_bytes, re.active_bytes);
  same("requested_bytes", stats_.requested_bytes, re.requested_bytes);
  const auto mapped = static_cast<std::int64_t>(mapped_bytes());
  if (stats_.reserved_bytes[0].current != mapped || stats_.reserved_bytes[2].current != mapped ||
      stats_.reserved_bytes[1].current != 0)
    fail("[INV-STATS-1]", "reserved_bytes is not the mapped bytes");
  // The runs of mapped pages are the runs of mapped blocks: unmapped blocks are whole pages
  // between them ([INV-MAP-3], [INV-MAP-4]).
  if (stats_.segment[0].current != runs || stats_.segment[2].current != runs)
    fail("[INV-STATS-1]", "segment is not the number of runs of mapped pages");
  if (touched_pages() > peak_touched_)
    fail("[INV-PAGE-2]", "touched pages above their high-water mark");
  // [INV-BUDGET-1]: mapped pages <= budget(T) + free pages split between free blocks of different
  // streams, or held by private pools with a user (not whole free pages, R10). Not while a pool
  // is active (R12).
  // Sleeping pages count in neither (docs/sleep-wake.md): only the awake ones.
  if (!pool_active()) {
    // Awake pages touched by live blocks: the blocks in address order, so each block's pages
    // from the first one the blocks before it did not touch.
    Bytes touched_awake = 0;
    std::uint64_t next = 0;  // the first page no block before touched
    for (const auto& [ptr, b] : blocks_)
      if (b.live() && !asleep(b)) {
        const std::uint64_t first = std::max(page_of(b.ptr), next), last = page_of(b.end() - 1);
        if (last + 1 > first) touched_awake += last + 1 - first;
        next = std::max(next, last + 1);
      }
    const Bytes idle = awake_pages() - touched_awake;  // live blocks touch mapped pages only
    const Bytes whole = count_whole_free_pages(0, 0);
    const Bytes split = idle - whole;
    const Bytes budget = peak_touched_ + peak_touched_ / kCachetSlack;
    if (awake_pages() > budget + split)
      fail("[INV-BUDGET-1]", std::to_string(awake_pages()) + " awake pages mapped, budget " +
                                 std::to_string(budget) + " + " + std::to_string(split) +
                                 " split free pages");
  }
  // Sleep (docs/sleep-wake.md). [INV-SLEEP-1]: a sleeping page stays reserved, and no block spans
  // an awake and a sleeping page (the searches skip the blocks of sleeping pages: none can reach
  // sleeping memory through an awake block). [INV-SLEEP-3]: the live blocks touching one page carry
  // one tag. [INV-SLEEP-2]: the sleep stats equal a recount.
  for (const auto& [p, sp] : sleeping_pages_)
    if (mapped_pages_.count(p) == 0) fail("[INV-SLEEP-1]", "sleeping page " + std::to_string(p) + " is not reserved");
  std::map<std::uint64_t, const Block*> page_live;
  std::int64_t sl_allocated = 0, sl_backup = 0;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.mapped()) continue;
    const bool a = asleep(b);
    const std::uint64_t first = page_of(b.ptr), last = page_of(b.end() - 1);
    if (!sleeping_pages_.empty())  // (with none asleep, every page is awake as the block is)
      for (std::uint64_t p = first; p <= last; ++p)
        if ((sleeping_pages_.count(p) != 0) != a)
          fail("[INV-SLEEP-1]", "the block at " + std::to_string(ptr - base_) + " spans an awake and a sleeping page");
    // Blocks do not overlap: a page inside a block is touched by that block only, so two live
    // blocks share a page only at their first or last one.
    if (b.live())
      for (const std::uint64_t p : {first, last}) {
        const auto [it, fresh] = page_live.emplace(p, &b);
        if (!fresh && it->second != &b && it->second->tag != b.tag)
          fail("[INV-SLEEP-3]", "page " + std::to_string(p) + " is touched by live blocks of '" + it->second->tag +
                                    "' and '" + b.tag + "'");
      }
    if (a && b.state() == BlockState::Allocated) sl_allocated += static_cast<std::int64_t>(b.size);
    if (a && b.live() && sleeping_pages_.at(page_of(b.ptr)).backed_up) sl_backup += static_cast<std::int64_t>(b.size);
  }
  auto check_sleep = [&](const char* name, std::int64_t counted, std::int64_t stat) {
    if (counted != stat)
      fail("[INV-SLEEP-2]", std::string(name) + ": the sleeping pages have " + std::to_string(counted) +
                                ", the sleep stats say " + std::to_string(stat));
  };
  check_sleep("sleeping_segments", sleeping_runs(), sleep_stats_.sleeping_segments.current);
  check_sleep("sleeping_bytes", static_cast<std::int64_t>(sleeping_pages_.size() * kCachetPage),
              sleep_stats_.sleeping_bytes.current);
  check_sleep("sleeping_allocated_bytes", sl_allocated, sleep_stats_.sleeping_allocated_bytes.current);
  check_sleep("backup_bytes", sl_backup, sleep_stats_.backup_bytes.current);
  // [INV-CAP-1]: the cap; above it (a lowered cap) only while no whole free page is left to unmap.
  if (allowed_max_ && !pool_active() && awake_pages() * kCachetPage > *allowed_max_ &&
      count_whole_free_pages(0, 0) > 0)
    fail("[INV-CAP-1]", "mapped bytes above the cap with whole free pages still mapped");
}

}  // namespace cachet::model
